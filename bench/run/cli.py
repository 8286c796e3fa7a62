"""Command line: ``python run_suite.py [COMMAND] [options]`` (``COMMAND --help``: its options).

* ``run`` (the default command): name the run (:mod:`bench.store.runs`: ``--name``, else the
  suite's name, with a tag and hash of the plan overrides when there are any), train and
  predict every incomplete cell into its store ``<results>/NAME/``, then write its report
  ``<reports>/NAME/``.  A store or report folder of another plan is refused.  Progress
  (:mod:`bench.core.progress`) shows as bars on a terminal and as lines elsewhere.  Ctrl-C
  (or SIGTERM) stops with one line saying what is done and saved (exit 130; 143); a second
  one at once.
* ``report [NAME]``: rebuild every table and plot from the store alone (no model is built
  and no checkpoint read).  Analysis files under ``<reports>/NAME/analysis/`` are reused
  while the store and the analysis options are unchanged.  The store describes itself: when
  ``--suite NAME`` is no suite file but ``<results>/NAME/`` is a store, that store is
  reported on its own.
* ``status [NAME]``, ``verify [NAME]``: a run's cells (by name, or by ``--suite`` and the
  flags it ran with); ``runs``: the runs of a store root.
* ``compare NAME REFERENCE``: whether the run reproduces a reference report within stated
  tolerances (:mod:`bench.run.compare`): exit 0 with one line, 1 listing what is outside,
  2 for a reference of another plan.
* ``list``: the registered methods, datasets, attention layers, metrics, OOD scores and suites.

A report that leaves out cells of its run is written only with ``--partial``, and never
replaces a report of the run showing more cells (:mod:`bench.run.report`); ``report``
with ``--metrics``, ``--scores`` or a plugin adding metrics or scores writes a view beside
the run's report, ``<reports>/NAME+ADDITION/`` (:func:`_additions`).

Exit status: 0 success, 1 some cells failed (a ``--partial`` report marks them; with
``--strict`` also when it leaves out any cell), a report was not written as it would leave
out cells or replace a report showing more (the cells and the completing command on
stderr), or the report could not be written (the previous one is kept), 2 bad input
(nothing written), 130 interrupted (Ctrl-C), 143 stopped by SIGTERM (a report so ended
leaves no staging folder).
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import math
import os
import re
import signal
import sys
import textwrap
from pathlib import Path

from bench.data import SEVERITIES
from bench.run.commands import (CtrlC, Interrupted, as_tuple, cmd_runs, cmd_suite, cmd_verify, recorded_suite, status,
                            stopped_at, stored_run)
from bench.core.errors import ConfigError, one_line
from bench.config.executor_config import EXECUTORS, ExecutorConfig
from bench.core.registry import did_you_mean, import_plugins
from bench.scores import default_scores
from bench.analysis.bootstrap import SEEDS_AND_SAMPLES as SIGNIFICANCE, SIGNIFICANCE_TESTS


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


_positive_int = int_at_least(1)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


#: the commands, with the one line ``run_suite.py --help`` shows for each
COMMANDS = {
    "run": "train and predict every incomplete cell of a run, then write its report (the default command)",
    "report": "rebuild a run's tables and plots from its store only",
    "status": "done / failed / running / missing cells of a run and the time left",
    "verify": "check every cell of a run's store against its manifest",
    "runs": "list the runs of a store root: name, suite, overrides, cells done/failed/missing, last change",
    "compare": "check that a run reproduces a reference report within stated tolerances",
    "list": "the registered methods, datasets, attention layers, metrics, OOD scores and suites (--suite: a suite's methods)",
}


class _OneLineErrors(argparse.ArgumentParser):
    """A parser whose errors are one line on stderr, exit 2, as every other bad input's:
    the message, a "did you mean" where a name given is close to a valid one (a choice,
    a command, a flag), and where ``--help`` lists the options (no usage block)."""

    def error(self, message: str):
        hint = ""
        if (choice := re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$", message)):
            known = re.findall(r"'([^']*)'", choice.group(3))
            hint = did_you_mean(choice.group(2), known)
        elif message.startswith("unrecognized arguments: "):
            flags = {f for a in self._actions for f in a.option_strings}
            commands = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
            owners: dict[str, list[str]] = {}  # a flag -> the commands that take it
            for command, parser in (commands.choices.items() if commands is not None else ()):
                for f in {f for a in parser._actions for f in a.option_strings}:
                    owners.setdefault(f, []).append(command)
            flags |= set(owners)  # the top-level parser: the flags of every command
            given = [g.split("=")[0] for g in message.split(": ", 1)[1].split() if g.startswith("--")]
            if (known := next((g for g in given if g in owners), None)) is not None:  # a real flag, another command's
                hint = f" ({known} is an option of {', '.join(sorted(owners[known]))} only)"
            else:
                bare = {f.lstrip("-"): f for f in flags if f.startswith("--")}  # compared without the dashes
                hint = next((f" (did you mean {bare[c]!r}?)" for g in given
                             for c in difflib.get_close_matches(g.lstrip("-"), sorted(bare), n=1, cutoff=0.7)), "")
        self.exit(2, f"error: {message}{hint} (`{self.prog} --help` lists the options)\n")



class _CommandLine(_OneLineErrors):
    """The top-level parser: it reads a command line through :func:`_with_command` (the
    command moved to the front, ``run`` when there is none) before parsing it."""

    def parse_known_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(_with_command(self, argv), namespace)


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand each (``run_suite.py COMMAND --help`` shows a
    command's own options); :func:`main` reads a command line without a command as
    ``run``, as the options of today's flat command line keep working."""
    p = _CommandLine(
        prog="run_suite.py",
        description="uqbench: train, evaluate and report uncertainty methods for Transformers.",
        epilog="Without a command, run is meant (run_suite.py --epochs 1 = run_suite.py run --epochs 1). "
               "run_suite.py COMMAND --help shows the options of a command.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands", parser_class=_OneLineErrors)

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
    plan.add_argument("--epochs", type=_positive_int,
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
    shown.add_argument("--severity", type=_positive_int, default=SEVERITIES[-1],
                       help=f"corruption severity of the per-corruption table, {SEVERITIES[0]}..{SEVERITIES[-1]} "
                            f"(default: {SEVERITIES[-1]})")
    shown.add_argument("--partial", action="store_true",
                       help="write the report even when it leaves out cells of the run (missing, running, failed or "
                            "damaged), marked incomplete; without it such a report is not written (exit 1). Never "
                            "replaces a report of the run that shows more cells")
    shown.add_argument("--strict", action="store_true",
                       help="with --partial: exit 1 when the report leaves out any cell of the run, not only failed "
                            "or damaged ones")

    def named(q: argparse.ArgumentParser) -> None:
        q.add_argument("run", nargs="?", metavar="NAME",
                       help="the run (its store <results>/NAME); instead of --suite and the run's flags")

    run = sub.add_parser("run", parents=[plan, results, reports, shown, common], help=COMMANDS["run"],
                         description=COMMANDS["run"] + ".")
    run.add_argument("--name", default=None,
                     help="the run's name: its store <results>/NAME and report <reports>/NAME (default: the suite's "
                          "name; with --methods/--datasets/--seeds/--epochs, the suite's name, a tag of them and a "
                          "hash, e.g. default-epochs1-a3f9)")
    run.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to train (default: auto)")
    run.add_argument("--download", action="store_true",
                     help="fetch missing official archives over HTTPS (md5-verified); never done unless asked")
    run.add_argument("--strict-data", action="store_true",
                     help="a data file whose md5 differs from the official one is an error, not a warning")
    run.add_argument("--log", action="append", default=[], choices=("tensorboard",),
                     help="also write each cell's training log (loss, accuracy, learning rate, the method's own "
                          "terms) as TensorBoard events under <results>/NAME/tensorboard/ (needs the optional "
                          "tensorboard package)")
    # Executor flags default to None: unset, the suite's [executor] table (or its default) applies.
    table = "the suite's [executor] {key}, else {default}"
    defaults = ExecutorConfig()
    run.add_argument("--executor", default=None, choices=EXECUTORS,
                     help="where cells run: one after another here (local), a pool of processes on this machine, "
                          "SLURM through submitit, or submitit's local processes (default: "
                          + table.format(key="kind", default=defaults.kind) + ")")
    run.add_argument("--workers", type=_positive_int, default=None,
                     help="--executor processes: worker processes on CPU (default: "
                          + table.format(key="workers", default=defaults.workers) + ")")
    run.add_argument("--cells-per-gpu", type=_positive_int, default=None,
                     help="--executor processes on CUDA: cells trained at once on each visible GPU (default: "
                          + table.format(key="cells_per_gpu", default=defaults.cells_per_gpu) + ")")
    run.add_argument("--slurm-partition", default=None,
                     help="SLURM partition for each cell's job (default: "
                          + table.format(key="partition", default="the cluster's") + ")")
    run.add_argument("--slurm-gpus", type=int_at_least(0), default=None,
                     help="GPUs per cell (default: " + table.format(key="gpus", default=defaults.gpus) + ")")
    run.add_argument("--slurm-cpus", type=_positive_int, default=None,
                     help="CPUs per cell (default: " + table.format(key="cpus", default=defaults.cpus) + ")")
    run.add_argument("--slurm-mem-gb", type=_positive_float, default=None,
                     help="memory per cell in GB (default: "
                          + table.format(key="mem_gb", default=f"{defaults.mem_gb:g}") + ")")
    run.add_argument("--slurm-time", type=_positive_int, default=None,
                     help="time limit per cell in minutes (default: " + table.format(key="time", default=defaults.time) + ")")
    run.add_argument("--slurm-array-limit", type=_positive_int, default=None,
                     help="at most this many cells at once (default: "
                          + table.format(key="array_limit", default=defaults.array_limit) + ")")
    run.add_argument("--slurm-option", action="append", default=[], metavar="KEY=VALUE",
                     help="a further sbatch option, e.g. account=myproj or qos=high (repeatable; added to the "
                          "suite's [executor.options], replacing an option of the same name)")

    report = sub.add_parser("report", parents=[plan, results, reports, shown, common], help=COMMANDS["report"],
                            description=COMMANDS["report"] + " (no model is built). --suite NAME also reports a "
                                        "store <results>/NAME made by an older version, without its suite file.")
    named(report)
    report.set_defaults(download=False, strict_data=False)
    status = sub.add_parser("status", parents=[plan, results, reports, common], help=COMMANDS["status"],
                            description=COMMANDS["status"] + ".")
    named(status)
    verify = sub.add_parser("verify", parents=[results, reports, common], help=COMMANDS["verify"],
                            description=COMMANDS["verify"] + "; exit 1 when a cell is damaged.")
    named(verify)
    verify.add_argument("--suite", default=None, help="the suite whose store <results>/NAME to check (instead of NAME)")
    compare = sub.add_parser(
        "compare", parents=[results, reports, common], help=COMMANDS["compare"],
        description="Check that the run NAME (its store <results>/NAME) reproduces the reference report REFERENCE: "
                    "the store is analysed afresh as `report` analyses it (the reference's metrics, OOD scores and "
                    "analysis options; in a temporary folder, nothing is written), and every per-seed value and "
                    "mean over seeds is compared with REFERENCE/analysis/ per dataset, method, split, metric and "
                    "OOD score; timings are not compared. The rule: a value is within tolerance when |run - "
                    "reference| <= max(a tenth of the reference's std over seeds, one sample of its split: 1/N for N "
                    "images; for an OOD split the smaller of the OOD set and the test split). Exit 0 with one line "
                    "when every value is within; 1 listing the metrics outside, worst first; 2 when the run and "
                    "the reference are of different plans (cells, configurations, methods, seeds or splits) or "
                    "REFERENCE is no report folder.")
    compare.add_argument("run", metavar="NAME", help="the run to check (its store <results>/NAME)")
    compare.add_argument("reference", metavar="REFERENCE", type=Path,
                         help="the reference's report folder, e.g. a copy of the committed reports/default (the run's "
                              "own report <reports>/NAME is refused: its run rewrites it)")
    compare.add_argument("--details", action="store_true",
                         help="also print, per dataset and metric, the largest difference (in the report's units and "
                              "in seed stds) and where it is")
    compare.set_defaults(suite=None)
    # every command takes --results and --reports (a wrapper script may pass them to all)
    sub.add_parser("runs", parents=[results, reports, common], help=COMMANDS["runs"],
                   description=COMMANDS["runs"] + ".")
    listing = sub.add_parser("list", parents=[results, reports, common], help=COMMANDS["list"],
                             description=COMMANDS["list"] + "; with --suite, a suite's methods.")
    listing.add_argument("--suite", default=None,
                         help="list this suite's data sets, seeds and methods, derived ones included (a built-in "
                              "suite's name or a .toml path)")
    return p


def _with_command(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with its command first: a command given after options moves to the front
    (``--quiet report`` = ``report --quiet``), and ``run`` is put there when there is none."""
    if not argv:
        return ["run"]
    if argv[0] in COMMANDS or argv[0] in ("-h", "--help"):
        return argv
    # the flags that take a value, of any command (argparse keeps its actions in _actions)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    valued = {flag for q in commands.choices.values() for a in q._actions if a.nargs != 0 for flag in a.option_strings}
    flags = {flag for q in commands.choices.values() for a in q._actions for flag in a.option_strings}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-"):  # the first positional: the command (or a misspelt one)
            return [token, *argv[:i], *argv[i + 1:]]
        # a flag taking a value, also abbreviated as argparse allows (--epoch 3)
        takes_value = token in valued or (token not in flags and any(f.startswith(token) for f in valued))
        i += 2 if takes_value else 1
    return ["run", *argv]


def first_sentence(obj) -> str:
    """The first sentence of an object's docstring (else of its module's), whole: the
    first paragraph up to a sentence end followed by two spaces (the docstrings' style),
    its lines joined and its double backquotes single."""
    doc = inspect.cleandoc(obj.__doc__ or sys.modules[obj.__module__].__doc__ or "")
    paragraph = " ".join(doc.split("\n\n", 1)[0].splitlines()).strip().replace("``", "`")
    return re.split(r"(?<=[.!?])\s{2,}", paragraph, maxsplit=1)[0]


def _described(name: str, text: str, width: int = 100) -> str:
    """``  name   text`` wrapped to ``width`` columns, continued under the text."""
    return textwrap.fill(" ".join(text.split()), width=width, initial_indent=f"  {name:<22} ",
                         subsequent_indent=" " * 25, break_on_hyphens=False, break_long_words=False)


def cmd_list() -> int:
    from bench.core.registry import ATTENTIONS, DATASETS, METHODS, METRICS, SCORES
    from bench.config.spec import available_suites

    print("methods:")
    for name in METHODS.names():
        cls = METHODS.get(name)
        print(_described(name, f"[{cls.kind}] {first_sentence(cls)}"))
    print("datasets:")
    for name in DATASETS.names():
        print(_described(name, first_sentence(DATASETS.get(name))))
    print("attention layers:")
    for name in ATTENTIONS.names():
        print(_described(name, first_sentence(ATTENTIONS.get(name))))
    print("metrics (name [kind] label (unit), higher/lower is better; * = a default column):")
    for name in METRICS.names():
        m = METRICS.get(name)
        unit = f" ({m.unit})" if m.unit else ""
        star = "*" if "default" in m.selections else " "
        print(f"  {name:<28}{star} [{m.kind}] {m.label}{unit}, {'higher' if m.higher_is_better else 'lower'} is better")
    print("OOD scores (name, label, needs; * = a default score; higher = more in-distribution):")
    for name in SCORES.names():
        sc = SCORES.get(name)
        star = "*" if sc.default is not None else " "
        print(f"  {name:<28}{star} {sc.label}, needs {', '.join(sc.needs)}")
    print("suites:")
    print("  " + ", ".join(available_suites()))
    return 0


def main(argv: list[str] | None = None) -> int:
    from bench.core import progress
    from bench.config.options import allowing_large

    parser = build_parser()
    args = parser.parse_args(argv)
    before = progress.mode(), progress.verbose()
    progress.configure(progress.auto(args.quiet), verbose=args.verbose)
    stop = CtrlC()
    try:
        with stop, allowing_large(args.allow_large):
            return _main(args)
    except ConfigError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, permissions, ... outside a cell: one line naming the path
        if args.debug:
            raise
        print(f"error: {one_line(exc)}; complete cells in the store are intact "
              "(run again once the problem is fixed; --debug shows the traceback)", file=sys.stderr)
        return 1
    except Interrupted as exc:
        print(f"\n{exc}", file=sys.stderr)
        return stop.code
    except KeyboardInterrupt:
        print("\nterminated (SIGTERM)" if stop.signum == signal.SIGTERM else "\ninterrupted", file=sys.stderr)
        return stop.code
    finally:
        progress.configure(*before)


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


def _main(args: argparse.Namespace) -> int:
    if args.command == "runs":
        return cmd_runs(args)
    if args.command == "list":
        import_plugins(args.plugin)
        return cmd_list() if args.suite is None else cmd_suite(args.suite)
    record = _named_run(args)
    import_plugins(list(dict.fromkeys([*args.plugin, *(record or {}).get("plugins", [])])))
    if args.command == "verify":
        return cmd_verify(args)
    if args.command == "status":
        return status(args, record)
    if args.command == "compare":
        return _compare(args, record)

    from bench.data import configure_data

    configure_data(args.data_root, download=args.download, strict=args.strict_data)
    check_directories(args)

    if args.command == "report":
        return _report(args, record)
    return _run(args)


def _named_run(args: argparse.Namespace) -> dict | None:
    """For ``report``/``status``/``verify NAME``: check the name and the store, return its
    run record (None: a store made before runs had names).  Otherwise ``--suite`` takes
    its default."""
    from bench.store.runs import check_name, list_runs, read_record

    if getattr(args, "run", None) is None:
        if hasattr(args, "suite") and args.suite is None:
            args.suite = "default"
        return None
    check_name(args.run, "NAME")
    if args.suite is not None:
        raise ConfigError(f"{args.command} {args.run}: give a run's NAME or --suite, not both")
    store = args.results / args.run
    if not store.is_dir():
        known = [r.name for r in list_runs(args.results)]
        raise ConfigError(f"no run {args.run!r} under {args.results}" + (
            f"; runs there: {', '.join(known)}" if known else "; run it first, or pass --results DIR"))
    return read_record(store)


def _report(args: argparse.Namespace, record: dict | None) -> int:
    """``report``: a run by NAME (its recorded plan), a store alone (``--suite NAME`` of no
    suite file), or ``--suite`` with the run's flags."""
    from bench.run.report import report_suite
    from bench.store.runs import check_owner, owner, read_record, report_record, view_name
    from bench.config.spec import Overrides, load_suite

    options = _report_options(args)  # unknown --metrics, --format or --severity: an error here, before any work
    suite = None
    if args.run is not None:
        name = args.run
        if record is not None and (suite := recorded_suite(record)) is not None:
            given = record.get("overrides") or {}
            options = dataclasses.replace(options, suite=str(record.get("suite_file", suite.name)),
                                          seeds=as_tuple(given.get("seeds")), epochs=given.get("epochs"),
                                          datasets=args.datasets or as_tuple(given.get("datasets")))
    elif _store_only(args):
        name = args.suite
    else:
        overrides = Overrides(seeds=args.seeds, epochs=args.epochs, methods=args.methods)
        suite = load_suite(args.suite, overrides)
        name = stored_run(args, suite.name)
    store_root, out = args.results / name, args.reports / name
    mine = owner(store_root) or {"suite": suite.name if suite is not None else name, "overrides": {}}
    added = _additions(args, record if args.run is not None else read_record(store_root))
    if added is not None:  # the run's own report stays as it is; the view goes beside it
        out = args.reports / view_name(name, *added)
    check_owner(out, "report", name, mine)
    options = dataclasses.replace(options, run=report_record(name, mine))
    return report_suite(suite, store_root, out, options)


def _compare(args: argparse.Namespace, record: dict | None) -> int:
    """``compare NAME REFERENCE`` (:mod:`bench.run.compare`): exit 0 with one line when
    the run reproduces the reference, 1 listing what is outside its tolerances."""
    from bench.run.compare import compare_run

    comparison = compare_run(args.results / args.run, args.reference, (recorded_suite(record) if record is not None else None),
                             own_report=args.reports / args.run)
    for note in comparison.notes:
        print(f"compare: {note}", file=sys.stderr)
    if args.details:
        print("\n".join(comparison.details()))
    print("\n".join(comparison.verdict()))
    return 0 if comparison.reproduces else 1


def _additions(args: argparse.Namespace, record: dict | None) -> tuple[list, list, list] | None:
    """What ``report`` adds to the run's own report: the ``--plugin`` modules that register
    metrics or OOD scores and that the run (its store ``record``) was not made with, the
    ``--metrics`` and the ``--scores`` given; None when it adds nothing.  Such a report is
    a view, written beside the run's report (:func:`bench.store.runs.view_name`)."""
    from bench.core.registry import METRICS, SCORES

    recorded = (record or {}).get("plugins")
    recorded = set(recorded) if isinstance(recorded, list) and all(isinstance(p, str) for p in recorded) else set()
    plugins = [p for p in dict.fromkeys(args.plugin)
               if p not in recorded and (METRICS.names_from(p) or SCORES.names_from(p))]
    metrics, scores = list(args.metrics or ()), list(args.scores or ())
    return (plugins, metrics, scores) if plugins or metrics or scores else None


def _run(args: argparse.Namespace) -> int:
    """``run``: name the run, refuse another plan's store or report, train and predict its
    incomplete cells, report; Ctrl-C says where it stopped (:class:`Interrupted`)."""
    from bench.train.telemetry import Console, require_tensorboard
    from bench.run.executors import require_executor
    from bench.store.plan import make_plan
    from bench.run.report import report_suite
    from bench.run.runner import run_plan
    from bench.store.runs import (COMMAND, check_name, check_owner, default_name, describe, foreign_cells, plan_overrides,
                            report_record, store_record)
    from bench.config.spec import Overrides, build_suite, resolve_suite_path, select, suite_source, unstored_scores_problem
    from bench.store import Store
    from bench.train.loop import resolve_device

    from bench.train import distributed

    source = suite_source(args.suite)
    suite = build_suite(source, Overrides(seeds=args.seeds, epochs=args.epochs, methods=args.methods))
    given = plan_overrides(args.methods, args.datasets, args.seeds, args.epochs)
    name = args.name if args.name is not None else default_name(suite.name, given)
    check_name(name, "--name" if args.name is not None else "the run's name (give a shorter one with --name)")
    mine = {"suite": suite.name, "overrides": given}
    store_root, out = args.results / name, args.reports / name
    if args.scores and (why := unstored_scores_problem(args.scores, suite.store)) is not None:
        raise ConfigError(f"--scores: {why}")
    selected = select(suite, args.methods, args.datasets)
    plan = make_plan(selected)
    # a damaged run.json is this run's to rewrite when the store holds no cell of another plan
    rewritable = not foreign_cells(store_root, [c.key for c in plan.cells])
    check_owner(store_root, "store", name, mine, rewritable)
    report_damage = check_owner(out, "report", name, mine, rewritable)
    report_options = dataclasses.replace(_report_options(args), run=report_record(name, mine))
    if "tensorboard" in args.log:
        require_tensorboard()
    where = executor_settings(args, suite.executor)
    require_executor(where.kind)  # e.g. slurm without sbatch: refused before anything is written

    # SLURM jobs run on other nodes than this (often GPU-less) login node: each resolves --device where it runs
    job_device = args.device if where.kind == "slurm" else None
    device = distributed.setup(resolve_device("cpu" if job_device else args.device))  # torchrun: join its group
    rank, size = distributed.world()
    console = Console(args.quiet or rank > 0)
    if report_damage is not None and rank == 0:
        console.warn(f"{report_damage}; this run's report rewrites it")
    shown = f"{job_device} (resolved on each job's node)" if job_device else device
    console.log(f"run {name!r}: {describe(mine)}, {len(plan.cells)} cells on {shown}, store {store_root}"
                + (f"; each cell on {size} torchrun processes (DDP)" if size > 1 else ""))
    record = store_record(name, suite.name, str(resolve_suite_path(args.suite).resolve()), given, source,
                          args.plugin, plan)
    try:
        summary = run_plan(plan, Store(store_root), device, console, describe=suite, executor=where.kind,
                           workers=where.workers, cells_per_gpu=where.cells_per_gpu, slurm=where.slurm_options(),
                           plugins=tuple(args.plugin), record=record, tensorboard="tensorboard" in args.log,
                           job_device=job_device)
    except KeyboardInterrupt:
        raise Interrupted(stopped_at(plan, store_root)) from None
    finally:
        distributed.teardown()
    if rank > 0:
        return 0  # rank 0 stores, analyses and reports
    fitted = f", {len(summary.fitted)} fitted on a stored cell (post hoc)" if summary.fitted else ""
    console.log(f"done: {len(summary.done)} trained{fitted}, {len(summary.skipped)} skipped, {len(summary.failed)} failed"
                + (f", {len(summary.elsewhere)} running elsewhere" if summary.elsewhere else ""))
    status = 1 if summary.failed else 0
    try:
        status = max(status, report_suite(selected, store_root, out, report_options))
    except KeyboardInterrupt:
        raise Interrupted(stopped_at(plan, store_root)) from None
    more = f" --results {args.results}" if args.results != Path("results") else ""
    console.log(f"run {name!r}: store {store_root}, report {out / 'README.md'}; "
                f"see it again with `{' '.join(COMMAND)} status {name}{more}`")
    return status


#: executor flag (argparse dest) -> the [executor] key it overrides
EXECUTOR_FLAGS = {"executor": "kind", "workers": "workers", "cells_per_gpu": "cells_per_gpu",
                  "slurm_partition": "partition", "slurm_gpus": "gpus", "slurm_cpus": "cpus",
                  "slurm_mem_gb": "mem_gb", "slurm_time": "time", "slurm_array_limit": "array_limit"}


def executor_settings(args: argparse.Namespace, table: ExecutorConfig) -> ExecutorConfig:
    """The executor to run with: each flag given on the command line, else the suite's
    ``[executor]`` key (``table``, an :class:`~bench.config.executor_config.ExecutorConfig`), else its
    default.  ``--slurm-option`` adds to the table's options, replacing one of the same name.
    A partition or option that would not stay on its own line of the batch script is a
    ConfigError, as in the table."""
    from bench.config.executor_config import sbatch_option_name, sbatch_option_problem, sbatch_text_problem

    given = {key: getattr(args, dest) for dest, key in EXECUTOR_FLAGS.items() if getattr(args, dest) is not None}
    if args.slurm_partition is not None and (problem := sbatch_text_problem(args.slurm_partition)):
        raise ConfigError(f"--slurm-partition: {problem}")
    options = dict(table.options)
    for item in args.slurm_option:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--slurm-option {item!r}: expected KEY=VALUE, e.g. account=myproj")
        if problem := sbatch_option_problem(key, value):
            raise ConfigError(f"--slurm-option {item!r}: {problem}")
        options[sbatch_option_name(key)] = value.strip()
    return dataclasses.replace(table, **given, options=options)


def _store_only(args: argparse.Namespace) -> bool:
    """``report --suite NAME`` where NAME is no suite file but a store folder under --results
    (NAME must be a suite name: one path component)."""
    from bench.config.spec import resolve_suite_path, suite_name_problem

    try:
        resolve_suite_path(args.suite)
        return False
    except ConfigError as exc:
        if (args.results / args.suite).is_dir() and not args.suite.endswith(".toml"):
            if (why := suite_name_problem(args.suite)) is not None:  # e.g. "..": a folder, but no store's name
                raise ConfigError(f"--suite: {why}") from None
            return True
        raise ConfigError(f"{exc}, nor a store folder {args.results / args.suite} (report a store with "
                          "--results DIR --suite NAME)") from None


def _report_options(args: argparse.Namespace):
    """The report's choices from the command line, a :class:`bench.run.report.ReportOptions`
    (``--methods`` picks the methods ``report`` shows; for ``run`` it narrows the suite;
    no ``--format``: every format); an unknown ``--metrics`` name, ``--format`` or
    ``--severity`` is a ConfigError."""
    from bench.report.formats import FORMATS
    from bench.run.report import ReportOptions

    return ReportOptions(suite=args.suite, results=args.results, data_root=args.data_root,
                         methods=args.methods if args.command == "report" else None, datasets=args.datasets,
                         seeds=args.seeds, epochs=args.epochs, metrics=args.metrics, scores=args.scores,
                         formats=args.format or FORMATS,
                         severity=args.severity, significance=args.significance, partial=args.partial,
                         strict=args.strict, after_run=args.command == "run", quiet=args.quiet, debug=args.debug)
