"""The command line's shared parts: its value types (the benchmarks' flags use them too),
the option groups that several commands take (:func:`option_groups`, declared once), and
what those options mean beyond one command: the directories they name
(:func:`check_directories`), the report's choices (:func:`report_options`) and the
plugins a command loads (:func:`load_plugins`)."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import NamedTuple

from bench.analysis.bootstrap import SEEDS_AND_SAMPLES as SIGNIFICANCE, SIGNIFICANCE_TESTS
from bench.config.spec import Overrides
from bench.core.errors import ConfigError
from bench.core.registry import import_plugins
from bench.data import SEVERITIES
from bench.scores import default_scores


def _csv(kind):
    def parse(text: str):
        items = tuple(x.strip() for x in text.split(",") if x.strip())
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind}")
        if kind == "seeds":
            try:
                return tuple(int(x) for x in items)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 0,1,2; got {text!r}") \
                    from None
        return items

    return parse


def int_at_least(minimum: int):
    """An argparse ``type``: an integer >= ``minimum`` (the benchmarks' flags use it too)."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def positive_int_list(distinct: bool = False):
    """An argparse ``type``: comma-separated positive integers, e.g. ``1,2,4,8`` (no
    repeats when ``distinct``; the benchmarks' list flags)."""
    what = "distinct positive integers" if distinct else "positive integers"

    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, e.g. 1,2,4,8; got {text!r}") from None
        if not values or min(values) < 1 or (distinct and len(set(values)) != len(values)):
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, e.g. 1,2,4,8; got {text!r}")
        return values

    return parse


positive_int = int_at_least(1)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


class OptionGroups(NamedTuple):
    """The option groups commands share, as argparse parent parsers: ``common`` (every
    command), ``results`` and ``reports`` (the roots), ``plan`` (a suite and its plan
    flags) and ``shown`` (what a report shows: ``run`` and ``report``)."""

    common: argparse.ArgumentParser
    results: argparse.ArgumentParser
    reports: argparse.ArgumentParser
    plan: argparse.ArgumentParser
    shown: argparse.ArgumentParser


def option_groups() -> OptionGroups:
    """The shared option groups (:class:`OptionGroups`), each option declared once here."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE so its registrations take part (repeatable)")
    common.add_argument("--allow-large", action="store_true",
                        help="lift the sanity limits on sizes (epochs, model size, more than 10,000 cells, image "
                             "pixels, text length, ...), as UQBENCH_ALLOW_LARGE=1 does")
    common.add_argument("--quiet", action="store_true", help="no progress bars, progress lines or per-cell lines")
    common.add_argument("--verbose", action="store_true",
                        help="when stderr is no terminal: a line per epoch and per predicted split (default: a line "
                             "per cell, and a long training's latest epoch once a minute)")
    common.add_argument("--debug", action="store_true", help="show the full traceback of any error")

    results = argparse.ArgumentParser(add_help=False)
    results.add_argument("--results", default="results", type=Path, help="store root (default: results)")
    reports = argparse.ArgumentParser(add_help=False)
    reports.add_argument("--reports", default="reports", type=Path, help="report root (default: reports)")

    plan = argparse.ArgumentParser(add_help=False)
    plan.add_argument("--suite", default=None,
                      help="built-in suite name or path to a suite .toml (default: default)")
    plan.add_argument("--methods", type=_csv("methods"),
                      help="comma-separated method names to run (with report: to show)")
    plan.add_argument("--datasets", type=_csv("datasets"), help="comma-separated dataset names of the suite to use")
    plan.add_argument("--seeds", type=_csv("seeds"), help="comma-separated seeds, replacing the suite's")
    plan.add_argument("--epochs", type=positive_int,
                      help="training epochs for every method, replacing the suite's (warm-up shortened to fit)")

    shown = argparse.ArgumentParser(add_help=False)
    shown.add_argument("--data-root", type=Path, default=None,
                       help="where on-disk data sets live (default: $UQBENCH_DATA_ROOT or ~/.cache/uqbench)")
    shown.add_argument("--format", type=_csv("formats"),
                       help="comma-separated table formats to write (default: every one; an unknown one is an "
                            "error that names them)")
    shown.add_argument("--metrics", type=_csv("metrics"),
                       help="metric names to show in the report (default: the KEP-SVGP paper's set and the "
                            "debiased ECE; any name from `list`)")
    shown.add_argument("--scores", type=_csv("OOD scores"),
                       help=f"OOD scores the OOD table ranks images by (default: {', '.join(default_scores())}; any "
                            "name from `list`)")
    shown.add_argument("--significance", default=SIGNIFICANCE, choices=SIGNIFICANCE_TESTS,
                       help="the test behind the report's marks and intervals: seeds_and_samples (default: "
                            "seed-level and test-sample variation) or samples_seeds_fixed (paired bootstrap over "
                            "test samples, trained seeds held fixed)")
    shown.add_argument("--severity", type=positive_int, default=SEVERITIES[-1],
                       help=f"corruption severity of the per-corruption table, {SEVERITIES[0]}..{SEVERITIES[-1]} "
                            f"(default: {SEVERITIES[-1]})")
    shown.add_argument("--partial", action="store_true",
                       help="write the report even when it leaves out cells of the run (missing, running, failed or "
                            "damaged), marked incomplete; without it such a report is not written (exit 1). Never "
                            "replaces a report of the run that shows more cells")
    shown.add_argument("--strict", action="store_true",
                       help="with --partial: exit 1 when the report leaves out any cell of the run, not only failed "
                            "or damaged ones")
    return OptionGroups(common, results, reports, plan, shown)


def named(q: argparse.ArgumentParser) -> None:
    """The optional run NAME of ``report``, ``status`` and ``verify``."""
    q.add_argument("run", nargs="?", metavar="NAME",
                   help="the run (its store <results>/NAME); instead of --suite and the run's flags")


def overrides(args: argparse.Namespace) -> Overrides:
    """The plan flags given (``--methods``, ``--datasets``, ``--seeds``, ``--epochs``)."""
    return Overrides(seeds=args.seeds, epochs=args.epochs, methods=args.methods, datasets=args.datasets)


def load_plugins(args: argparse.Namespace, recorded=()) -> None:
    """Fill the registries: the built-ins, ``--plugin`` and the plugins a run was made with
    (``recorded``)."""
    import_plugins(list(dict.fromkeys([*args.plugin, *recorded])))


def configure(args: argparse.Namespace) -> None:
    """``run`` and ``report``: the data settings (``--data-root``, ``--download``,
    ``--strict-data``) and the directories they write (:func:`check_directories`)."""
    from bench.data import configure_data

    configure_data(args.data_root, download=args.download, strict=args.strict_data)
    check_directories(args)


def check_directories(args: argparse.Namespace) -> None:
    """``--reports`` (and for ``run`` also ``--results`` and the data root) must be, or be
    creatable as, writable directories; every problem is reported at once, before any work."""
    from bench.data import data_root

    targets = [("--reports", args.reports)]
    if args.command == "run":
        targets += [("--results", args.results), ("--data-root", data_root())]
    elif args.results.exists() and not args.results.is_dir():
        targets.append(("--results", args.results))
    problems = [msg for flag, path in targets if (msg := _directory_problem(flag, Path(path)))]
    if problems:
        raise ConfigError("unusable directories:\n  " + "\n  ".join(problems))


def _directory_problem(flag: str, path: Path) -> str | None:
    if path.exists() and not path.is_dir():
        return f"{flag} {path}: exists and is not a directory; give a directory"
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{flag} {path}: {probe} is a file, so the directory cannot be created there"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{flag} {path}: {probe} is not writable (read-only filesystem or permissions); choose another"
    return None


def report_options(args: argparse.Namespace, run=None):
    """The report's choices from the command line, a :class:`bench.run.report.ReportOptions`
    for the run ``run`` (a :class:`~bench.config.spec.RunSpec`): ``--methods`` picks the
    methods ``report`` shows (for ``run`` it narrows the suite); no ``--format``: every
    format.  An unknown ``--metrics`` name, ``--format`` or ``--severity`` is a ConfigError."""
    from dataclasses import replace

    from bench.report.formats import FORMATS
    from bench.run.report import ReportOptions

    selection = overrides(args) if args.command == "report" else replace(overrides(args), methods=None)
    return ReportOptions(run=run, selection=selection, results=args.results, data_root=args.data_root,
                         metrics=args.metrics, scores=args.scores, formats=args.format or FORMATS,
                         severity=args.severity, significance=args.significance, partial=args.partial,
                         strict=args.strict, after_run=args.command == "run", quiet=args.quiet, debug=args.debug)
