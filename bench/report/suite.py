"""The suite report: a store analysed and reported in one step, as ``run`` and ``report`` do.

:func:`report_suite` analyses the store (or reuses its analysis files), writes the report
and tells the outcome on stderr: the cells it leaves out, the command that completes
them, the failures it names; it returns the exit status.  :func:`write_suite_report` is
that step without the telling.  :class:`ReportOptions` carries the command line's choices
as plain values.
"""
from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.analysis import ANALYSIS_DIR, SIGNIFICANCE, analyse_store
from bench.catalog import open_store, write_store_description
from bench.data import SEVERITIES, check_severity
from bench.errors import ConfigError, one_line
from bench.plan import make_plan
from bench.report import render_report, staged
from bench.report.formats import FORMATS, validate_formats
from bench.report.readme import left_out_summary
from bench.report.tables import validate_metrics
from bench.runs import RUN_RECORD, implied, resume_flags, write_record
from bench.scores import validate_scores
from bench.spec import Suite, select
from bench.store import STORE_SUITE


@dataclass(frozen=True)
class ReportOptions:
    """What a suite report shows, how its outcome is told, and what the command that
    completes its left-out cells repeats.

    ``methods``: the methods shown (``report --methods``; ``None``: every method of the
    suite or store); ``datasets``: the datasets analysed and shown (``None``: all);
    ``metrics``: the metric columns and the metrics analysed on top of the default
    selection (``None``: each table's selection); ``scores``: the OOD scores analysed and
    shown (``None``: :func:`bench.scores.default_scores`); ``formats``, ``severity``,
    ``significance``: as :func:`bench.report.write_report` and
    :func:`bench.analysis.analyse_store` take them.  The metrics, formats and severity are
    checked when the options are made (:func:`~bench.report.tables.validate_metrics`,
    :func:`~bench.scores.validate_scores`, :func:`~bench.report.formats.validate_formats`, :func:`bench.data.check_severity`): a bad
    one is a ConfigError before any work.  ``strict``: exit 1 when any cell is
    left out; ``quiet``: no line on success; ``debug``: an error that keeps the report
    from being written propagates instead of being told in one line.  ``suite`` (the name
    or path given), ``results``, ``data_root``, ``seeds`` and ``epochs`` are repeated in
    the completing command."""

    suite: str = "default"
    results: Path = Path("results")
    data_root: Path | None = None
    methods: tuple[str, ...] | None = None
    datasets: tuple[str, ...] | None = None
    seeds: tuple[int, ...] | None = None
    epochs: int | None = None
    metrics: tuple[str, ...] | None = None
    scores: tuple[str, ...] | None = None
    formats: tuple[str, ...] = FORMATS
    severity: int = SEVERITIES[-1]
    significance: str = SIGNIFICANCE
    strict: bool = False
    quiet: bool = False
    debug: bool = False
    run: dict | None = None  # the run whose report this is (bench.runs.report_record), kept as run.json in it

    def __post_init__(self) -> None:  # where the choices enter the report: checked once, then passed on
        if self.metrics is not None:
            object.__setattr__(self, "metrics", tuple(validate_metrics(self.metrics)))
        if self.scores is not None:
            object.__setattr__(self, "scores", tuple(validate_scores(self.scores)))
        object.__setattr__(self, "formats", validate_formats(self.formats))
        object.__setattr__(self, "severity", check_severity(self.severity, "--severity", ConfigError))


@dataclass(frozen=True)
class Reported:
    """What :func:`write_suite_report` wrote: the README, whether the analysis files were
    reused, how many failures and damaged cells the report names (``troubles``), the cells
    it leaves out with the command that completes them, and the failures that are no such
    cell (a replicate that cannot be formed, a metric that raised), one line each."""

    readme: Path
    reused: bool
    troubles: int
    left_out: tuple = ()
    complete_with: str = ""
    failures: tuple[str, ...] = ()
    unscored: tuple[str, ...] = ()  # the selected OOD scores a shown method could not get, one line each

    def left_out_lines(self) -> list[str]:
        """The left-out cells for stderr: a count, one line per cell, the command."""
        if not self.left_out:
            return []
        lines = [f"{left_out_summary(self.left_out)}:"]
        lines += [f"  {c.label} ({c.key}): {c.state}{': ' + c.detail if c.detail else ''}" for c in self.left_out]
        if self.complete_with:
            lines.append(f"  to complete them: {self.complete_with}")
        return lines


def report_suite(suite: Suite | None, store_root: Path, out_dir: Path, options: ReportOptions) -> int:
    """Analyse the store (or reuse its analysis files) and write the report; name on stderr
    the cells it leaves out.  ``suite`` selects and orders (``None``: the store alone).
    Exit status: 1 when failed or damaged cells are left out (with ``options.strict``: any
    cell left out), or when the report could not be written (the previous one is kept)."""
    started = time.perf_counter()
    try:
        outcome = write_suite_report(suite, store_root, out_dir, options)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001  (disk full, permissions, a plot that raises: one line)
        if options.debug:
            raise
        print(f"error: the report {out_dir} was not written: {one_line(exc)}; the previous report there is "
              "unchanged (--debug shows the traceback)", file=sys.stderr)
        return 1
    if not options.quiet:
        how = "reused the analysis files" if outcome.reused else "analysed the store"
        print(f"report: {outcome.readme} ({how}; {time.perf_counter() - started:.1f} s)", file=sys.stderr)
    for line in [*outcome.left_out_lines(), *outcome.failures, *outcome.unscored]:
        print(f"report: {line}", file=sys.stderr)
    if outcome.troubles:
        print(f"report: {outcome.troubles} failed, interrupted or damaged cell(s) or replicate(s) left out, "
              f"named in {outcome.readme}", file=sys.stderr)
        return 1
    return 1 if options.strict and outcome.left_out else 0


def write_suite_report(suite: Suite | None, store_root: Path, out_dir: Path, options: ReportOptions) -> Reported:
    """Analyse the store (``suite`` selects and orders; ``None`` = the store alone) and
    write the analysis files and the report into a copy of ``out_dir`` beside it, swapped
    in when complete (:func:`bench.report.staged`).  Bad input -- a missing or empty store,
    a selection matching no cell, a ``methods`` name with no cell in the store -- is a
    ConfigError before anything is written."""
    if not Path(store_root).is_dir():
        name = suite.name if suite is not None else Path(store_root).name
        raise ConfigError(f"no results for suite {name!r} under {store_root}; run the suite first "
                          f"(python run_suite.py --suite {name}) or pass --results DIR")
    methods = list(options.methods) if options.methods else None
    planned, wanted = set(), None
    if suite is not None:
        shown = select(suite, methods, options.datasets, to_run=False)  # unknown names: an error here
        reported = select(suite, None, options.datasets, to_run=False)  # analysed (its files reused whatever is shown)
        planned = {c.key for c in make_plan(reported).cells}
        wanted = [(c.key, c.dataset.name, c.method.name, c.seed) for c in make_plan(shown).cells]
        suite = reported
    catalog = open_store(store_root, suite, planned)
    if options.datasets is not None and suite is None:
        unknown = [d for d in options.datasets if d not in catalog.datasets]
        if unknown:
            raise ConfigError(f"--datasets: the store has no dataset(s) {unknown}; it has: {', '.join(catalog.datasets)}")
        catalog.datasets = [d for d in catalog.datasets if d in options.datasets]
    if not catalog.cells and not catalog.problems and not catalog.running and not catalog.unnamed:
        raise ConfigError(f"the store {store_root} has no cell for this selection (datasets "
                          f"{catalog.datasets}, methods {[m.name for m in catalog.methods]}, seeds "
                          f"{list(catalog.seeds)}); check --seeds/--datasets/--methods or run the suite first. "
                          "Nothing was written.")
    with_cells = catalog.with_cells()
    empty = [m for m in methods or () if m not in with_cells]
    if empty:
        raise ConfigError(f"no cells of method{'s' if len(empty) > 1 else ''} {', '.join(empty)} in {store_root}; "
                          f"methods with cells: {', '.join(with_cells) or 'none'}. Nothing was written.")
    picked = list(options.metrics) if options.metrics else None
    rows = catalog.rows(methods) if methods else None
    with staged(out_dir) as stage:
        results, reused = analyse_store(catalog, stage / ANALYSIS_DIR, picked, significance=options.significance,
                                        scores=_scores(options, suite))
        damaged = dict(zip(results.damaged["cell"], results.damaged["reason"]))
        left_out = catalog.left_out(wanted, damaged)
        if wanted is None and methods:
            left_out = [c for c in left_out if c.method in catalog.rows(methods, bases=True)]
        command = _completing_command(options, suite is None) if any(c.state != "running" for c in left_out) else ""
        render_report(results, stage, options.formats, rows, picked, options.severity, left_out, command)
        if options.run is not None and not implied(options.run, Path(out_dir).name):
            write_record(stage, options.run)
        elif options.run is not None:  # the plain suite's report keeps none: a damaged one copied here goes
            (stage / RUN_RECORD).unlink(missing_ok=True)
    if suite is not None and not (Path(store_root) / STORE_SUITE).is_file():
        write_store_description(store_root, suite)  # a store without suite.json gets one: it can then be reported without its suite file
    mine = set(catalog.rows(methods, bases=True)) if methods else {m.name for m in catalog.methods}
    failed = [row for row in results.failures[["dataset", "method", "seed", "reason"]].itertuples(index=False, name=None)
              if row[1] in mine]
    damaged = [m for m in results.damaged["method"] if m in mine or not m]  # "": a directory naming no cell
    cells = {(c.dataset, c.method, c.seed) for c in left_out}
    failures = [f"failed: {d} / {m} / seed {s}: {why}" for d, m, s, why in failed if (d, m, s) not in cells]
    grouped: dict[tuple[str, str, str], list[str]] = {}  # one line per method and reason
    for d, m, score, why in results.unscored[["dataset", "method", "score", "reason"]].itertuples(index=False,
                                                                                                    name=None):
        if m in mine:
            grouped.setdefault((d, m, why), []).append(repr(score))
    unscored = [f"OOD score{'s' if len(names) > 1 else ''} {', '.join(names)} not computed for {d} / {m}: {why}"
                for (d, m, why), names in grouped.items()]
    return Reported(Path(out_dir) / "README.md", reused, len(failed) + len(damaged), tuple(left_out), command,
                    tuple(failures), tuple(unscored))


def _scores(options: ReportOptions, suite: Suite | None) -> list[str] | None:
    """The OOD scores to analyse: ``--scores``, else the suite's ``scores``, else None
    (the default scores)."""
    if options.scores:
        return list(options.scores)
    return list(suite.scores) if suite is not None and suite.scores else None


def _completing_command(options: ReportOptions, store_only: bool) -> str:
    """The ``run`` command that trains the cells a report leaves out: the report's suite,
    store and selection (a store reported alone needs the suite file that made it)."""
    suite = "SUITE.toml" if store_only else options.suite
    parts = ["python", "run_suite.py", "--suite", suite]
    if options.run is not None and not implied(options.run, options.run.get("name")) and not store_only:
        parts += resume_flags(options.run)  # the run's own command: its overrides (and --name)
        options = replace(options, datasets=None, seeds=None, methods=None, epochs=None)
    if options.results != Path("results"):
        parts += ["--results", str(options.results)]
    if options.data_root is not None:
        parts += ["--data-root", str(options.data_root)]
    for flag, value in (("--datasets", options.datasets), ("--seeds", options.seeds), ("--methods", options.methods)):
        if value:
            parts += [flag, ",".join(map(str, value))]
    if options.epochs is not None:
        parts += ["--epochs", str(options.epochs)]
    command = " ".join(shlex.quote(p) for p in parts)
    return command + (" (SUITE.toml: the suite file that made this store)" if store_only else "")
