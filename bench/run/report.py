"""The suite report: a store analysed and reported in one step, as ``run`` and ``report`` do.

:func:`report_suite` analyses the store (or reuses its analysis files), writes the report
and tells the outcome on stderr: the cells it leaves out, the command that completes
them, the failures it names; it returns the exit status.  :func:`write_suite_report` is
that step without the telling.  :class:`ReportOptions` carries the command line's choices
as plain values.

A report is written only when it is no worse than the one it would replace:

* a report that leaves out cells of its run (missing, failed, damaged, interrupted or
  running) is written only when asked for (``--partial``); it then opens with an
  *Incomplete* banner listing them and leaves the hand-written ``NOTES.md`` out;
* a report never replaces one of the same run that shows a cell it lacks, ``--partial``
  or not.  What an earlier report showed is read from its :data:`CELLS_RECORD` (the key,
  dataset, method row, seed and configuration of each cell); a report written before that
  record existed is read from its ``analysis/analysis.json`` (the seeds of each dataset
  and trained method row, no keys, configuration unknown).  Only cells of the run's
  present configuration count: an earlier cell whose resolved config, less the seed,
  differs from what the run plans for its dataset and method (the suite file changed) is
  no loss, and neither is a report of another run (:func:`bench.store.runs.owner`).

Otherwise nothing is written (:class:`Refused`): the cells are named with the command that
completes them, and the exit status is 1.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.analysis import ANALYSIS_DIR, SIGNIFICANCE, analyse_store
from bench.store.catalog import Catalog, LeftOut, open_store, write_store_description
from bench.data import SEVERITIES, check_severity
from bench.core.errors import ConfigError, one_line
from bench.store.plan import make_plan
from bench.report import RunTitle, render_report, staged
from bench.report.formats import FORMATS, validate_formats
from bench.report.readme import left_out_summary
from bench.report.tables import validate_metrics
from bench.store.runs import COMMAND, RUN_RECORD, implied, owner, resume_flags, suite_argument, write_record
from bench.scores import validate_scores
from bench.config.spec import Overrides, RunSpec, Suite, select
from bench.core.registry import Registry
from bench.store import STORE_SUITE, atomic_write_json, read_json_object

#: the cells a report shows (key, dataset, method row, seed, configuration digest), beside
#: its README: what a later report of the same run is compared with
CELLS_RECORD = "cells.json"


@dataclass(frozen=True)
class ReportOptions:
    """What a suite report shows, how its outcome is told, and what the command that
    completes its left-out cells repeats.

    ``run``: the run whose report this is (:class:`~bench.config.spec.RunSpec`; kept as
    ``run.json`` in it; its ``suite_file`` is the suite the completing command names;
    None: a report of no run).  ``selection``: the command line's plan flags
    (:class:`~bench.config.spec.Overrides`): its ``methods`` are the methods shown
    (``report --methods``; ``None``: every method of the suite or store), its ``datasets``
    the datasets analysed and shown (``None``: all), and with its ``seeds`` and ``epochs``
    they are repeated in the completing command.  ``metrics``: the metric columns and the metrics analysed on top of the default
    selection (``None``: each table's selection); ``scores``: the OOD scores analysed and
    shown (``None``: :func:`bench.scores.default_scores`); ``formats``, ``severity``,
    ``significance``: as :func:`bench.report.write_report` and
    :func:`bench.analysis.analyse_store` take them.  The metrics, formats and severity are
    checked when the options are made (:func:`~bench.report.tables.validate_metrics`,
    :func:`~bench.scores.validate_scores`, :func:`~bench.report.formats.validate_formats`, :func:`bench.data.check_severity`): a bad
    one is a ConfigError before any work.  ``partial``: write a report that leaves out
    cells of its run (``--partial``), else refuse it; ``strict``: exit 1 when a report
    leaves out any cell; ``after_run``: the report step of ``run``, which leaves the report
    to the runner still training cells when those are all that is missing (exit 0);
    ``quiet``: no line on success; ``debug``: an error that keeps the report
    from being written propagates instead of being told in one line.  ``results`` and
    ``data_root`` are repeated in the completing command."""

    run: RunSpec | None = None
    selection: Overrides = Overrides()
    results: Path = Path("results")
    data_root: Path | None = None
    metrics: tuple[str, ...] | None = None
    scores: tuple[str, ...] | None = None
    formats: tuple[str, ...] = FORMATS
    severity: int = SEVERITIES[-1]
    significance: str = SIGNIFICANCE
    partial: bool = False
    strict: bool = False
    after_run: bool = False
    quiet: bool = False
    debug: bool = False

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
        return [f"{left_out_summary(self.left_out)}:", *_cell_lines(self.left_out, self.complete_with)]


class Refused(Exception):
    """A report not written because it would leave out cells without ``--partial``, or
    replace a report of the same run that shows cells it lacks.  ``lines``: why, the cells
    (one line each), the command that completes them and what else to do, for stderr;
    ``waiting``: the cells left out are all being trained by a live runner (which writes
    the report when it is done)."""

    def __init__(self, lines: list[str], waiting: bool = False):
        super().__init__(lines[0])
        self.lines = lines
        self.waiting = waiting


def report_suite(suite: Suite | None, store_root: Path, out_dir: Path, options: ReportOptions,
                 started: str = "") -> int:
    """Analyse the store (or reuse its analysis files) and write the report; name on stderr
    the cells it leaves out (``started``: when the run began, its store record's, for the
    report's title).  ``suite`` selects and orders (``None``: the store alone).
    Exit status: 1 when the report is refused (:class:`Refused`; 0 from ``run``'s report
    step when only cells a live runner trains are missing), when failed or damaged cells
    are left out (with ``options.strict``: any cell left out), or when the report could not
    be written (the previous one is kept)."""
    began = time.perf_counter()
    try:
        outcome = write_suite_report(suite, store_root, out_dir, options, started)
    except ConfigError:
        raise
    except Refused as refused:
        for line in refused.lines:
            print(f"report: {line}", file=sys.stderr)
        return 0 if refused.waiting and options.after_run else 1
    except Exception as exc:  # noqa: BLE001  (disk full, permissions, a plot that raises: one line)
        if options.debug:
            raise
        print(f"error: the report {out_dir} was not written: {one_line(exc)}; the previous report there is "
              "unchanged (--debug shows the traceback)", file=sys.stderr)
        return 1
    if not options.quiet:
        how = "reused the analysis files" if outcome.reused else "analysed the store"
        print(f"report: {outcome.readme} ({how}; {time.perf_counter() - began:.1f} s)", file=sys.stderr)
    for line in [*outcome.left_out_lines(), *outcome.failures, *outcome.unscored]:
        print(f"report: {line}", file=sys.stderr)
    if outcome.troubles:
        print(f"report: {outcome.troubles} failed, interrupted or damaged cell(s) or replicate(s) left out, "
              f"named in {outcome.readme}", file=sys.stderr)
        return 1
    return 1 if options.strict and outcome.left_out else 0


def write_suite_report(suite: Suite | None, store_root: Path, out_dir: Path, options: ReportOptions,
                       started: str = "") -> Reported:
    """Analyse the store (``suite`` selects and orders; ``None`` = the store alone) and
    write the analysis files and the report into a copy of ``out_dir`` beside it, swapped
    in when complete (:func:`bench.report.staged`).  Bad input -- a missing or empty store,
    a selection matching no cell, a ``methods`` name with no cell in the store -- is a
    ConfigError before anything is written; a report that would leave out cells without
    ``options.partial``, or replace a report of the same run showing cells it lacks, is
    :class:`Refused` (see the module docstring), with nothing written either."""
    if not Path(store_root).is_dir():
        name = suite.name if suite is not None else Path(store_root).name
        raise ConfigError(f"no results for suite {name!r} under {store_root}; run the suite first "
                          f"(`{' '.join(COMMAND)}{'' if name == 'default' else ' --suite ' + name}`) or pass "
                          "--results DIR")
    methods = list(options.selection.methods) if options.selection.methods else None
    datasets = options.selection.datasets
    planned, wanted, configured = set(), None, None
    if suite is not None:  # the run's configuration: each planned dataset and method's config, whatever is shown
        configured = {(c.dataset.name, c.method.name): _configuration(c.config) for c in make_plan(suite).cells}
        run = options.run.name if options.run is not None else ""
        shown = select(suite, methods, datasets, to_run=False, run=run)  # unknown names: an error here
        reported = select(suite, None, datasets, to_run=False, run=run)  # analysed, whatever is shown
        planned = {c.key for c in make_plan(reported).cells}
        wanted = [(c.key, c.dataset.name, c.method.name, c.seed) for c in make_plan(shown).cells]
        suite = reported
    catalog = open_store(store_root, suite, planned)
    if datasets is not None and suite is None:
        Registry.of("dataset", catalog.datasets, "the store").validate(datasets, "--datasets")
        catalog.datasets = [d for d in catalog.datasets if d in datasets]
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
    shown_rows = set(catalog.rows(methods, bases=True)) if methods else {m.name for m in catalog.methods}
    earlier = _earlier_cells(Path(out_dir), options, catalog)
    _check(catalog, shown_rows, _left_out(catalog, wanted, methods), earlier, configured, Path(out_dir), options,
           suite is None)  # before the analysis: a refusal costs nothing
    with staged(out_dir) as stage:
        results, reused = analyse_store(catalog, stage / ANALYSIS_DIR, picked, significance=options.significance,
                                        scores=_scores(options, suite))
        damaged = dict(zip(results.damaged["cell"], results.damaged["reason"]))
        left_out = _left_out(catalog, wanted, methods, damaged)  # with the cells found damaged while analysing
        command = _check(catalog, shown_rows, left_out, earlier, configured, Path(out_dir), options, suite is None)
        render_report(results, stage, options.formats, rows, picked, options.severity, left_out, command,
                      _run_title(options, started, catalog, shown_rows))
        atomic_write_json(stage / CELLS_RECORD, {"cells": cells_record(catalog, shown_rows)})
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


def _run_title(options: ReportOptions, started: str, catalog: Catalog, rows: set[str]) -> RunTitle | None:
    """The run the report shows (``options.run``; None: a report made without one): its
    overrides, what this report narrows or adds, the day it ``started`` (its store record's)
    or else the day its newest cell of the ``rows`` shown finished."""
    if options.run is None:
        return None
    run, datasets = options.run, options.selection.datasets
    shown = [("--methods", options.selection.methods), ("--metrics", options.metrics), ("--scores", options.scores)]
    if datasets and datasets != run.overrides.datasets:
        shown.insert(1, ("--datasets", datasets))
    finished = [(catalog.record(catalog.cells[cell]).finished or "")[:10] for cell in _shown_cells(catalog, rows)]
    return RunTitle(run.name, run.suite, " ".join(run.overrides.flags()),
                    " ".join(f"{flag} {','.join(map(str, value))}" for flag, value in shown if value), started[:10],
                    max(finished, default=""))


def _left_out(catalog: Catalog, wanted: list | None, methods: list[str] | None,
              damaged: dict[str, str] | None = None) -> list[LeftOut]:
    """The cells the report leaves out (:meth:`bench.store.catalog.Catalog.left_out`); for a
    store reported alone with ``--methods``, only those of the methods shown and their bases."""
    left_out = catalog.left_out(wanted, damaged)
    if wanted is None and methods:
        left_out = [c for c in left_out if c.method in catalog.rows(methods, bases=True)]
    return left_out


def cells_record(catalog: Catalog, rows: set[str]) -> list[dict]:
    """What :data:`CELLS_RECORD` holds: per cell used by the rows ``rows``, its ``key``,
    ``dataset``, ``method`` row, ``seed`` and ``configuration`` (:func:`_configuration`
    of its record, :meth:`~bench.store.catalog.Catalog.record`), sorted by (dataset,
    method row, seed)."""
    record = []
    for cell, key in sorted(_shown_cells(catalog, rows).items()):
        info = catalog.record(catalog.cells[cell])
        record.append({"key": key, "dataset": cell[0], "method": cell[1], "seed": cell[2],
                       "configuration": _configuration(info.config)})
    return record


def read_cells_record(folder: Path) -> list[tuple] | None:
    """The cells the :data:`CELLS_RECORD` of the report ``folder`` names, as ``(key,
    dataset, method row, seed, configuration)``; None when it has none or it is damaged."""
    record = read_json_object(Path(folder) / CELLS_RECORD)
    try:
        return [(str(c["key"]), str(c["dataset"]), str(c["method"]), int(c["seed"]), c.get("configuration"))
                for c in record["cells"]]
    except (KeyError, TypeError, ValueError, AttributeError):  # no record (None), or a damaged one
        return None


def _shown_cells(catalog: Catalog, rows: set[str]) -> dict[tuple[str, str, int], str]:
    """``(dataset, method row, seed) -> cell key`` of the cells used by the rows shown."""
    return {(d, m, s): cd.key for (d, m, s), cd in catalog.cells.items() if m in rows}


def _configuration(config: object) -> str | None:
    """A digest of a cell's resolved config without its seed (what the cells of one
    configuration share; ``cell.json``'s ``config``, or a planned cell's), None for none."""
    if not isinstance(config, dict):
        return None
    text = json.dumps({k: v for k, v in config.items() if k != "seed"}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _earlier_cells(out_dir: Path, options: ReportOptions, catalog: Catalog) -> list[tuple]:
    """The cells the report in ``out_dir`` shows, ``(key, dataset, method row, seed,
    configuration)``, from its :data:`CELLS_RECORD`; for a report written before that
    record, from its ``analysis/analysis.json`` (the seeds of each trained method row; key
    and configuration None).  [] when there is no report there, or it is another run's."""
    if options.run is not None and (theirs := owner(out_dir, "report")) is not None and not options.run.same_plan(theirs):
        return []
    recorded = read_cells_record(out_dir)
    if recorded is not None:
        return recorded
    meta = read_json_object(out_dir / ANALYSIS_DIR / "analysis.json") or {}
    trained = {m.name for m in catalog.methods if m.kind == "trained"}
    try:
        return [(None, str(d), str(m), int(s), None) for d, m, seeds in meta.get("seeds", []) if m in trained
                for s in seeds]
    except (TypeError, ValueError):
        return []


def _check(catalog: Catalog, rows: set[str], left_out: list[LeftOut], earlier: list, configured: dict | None,
           out_dir: Path, options: ReportOptions, store_only: bool) -> str:
    """Refuse (:class:`Refused`) a report that leaves out cells without ``options.partial``,
    or that lacks a cell the earlier report ``earlier`` of the same run shows
    (:func:`_earlier_cells`) of the run's present configuration (``configured``: (dataset,
    method) -> :func:`_configuration` of its planned cells; an earlier cell of unknown
    configuration counts as of the present one; None: the store alone, whose every cell
    counts).  A cell of the same dataset, method row and seed shown now is no loss.  Returns the command
    that completes the left-out cells ("" when none is to run)."""
    command = _completing_command(options, store_only) if any(c.state != "running" for c in left_out) else ""
    now = _shown_cells(catalog, rows)
    keys = set(now.values())
    lost = []
    for key, d, m, s, config in earlier:
        if key in keys or (d, m, s) in now:
            continue  # shown now (or a cell of its dataset, method and seed: the one of the present configuration)
        if configured is None or ((d, m) in configured and config in (None, configured[(d, m)])):
            lost.append((key, d, m, s))
    if not lost and (options.partial or not left_out):
        return command
    if not lost:
        waiting = not command  # every cell left out is being trained by a live runner
        lines = [f"not written: {left_out_summary(left_out, 'are left out')}; "
                 "a report leaves out cells only with --partial:", *_cell_lines(left_out, command)]
        if waiting and options.after_run:
            lines[-1] = "  the runner training them writes the report when they are done"
        lines.append("  or add --partial for a report of the cells there, marked incomplete")
        raise Refused(lines, waiting)
    states = {c.key: c for c in left_out}
    by_cell = {(c.dataset, c.method, c.seed): c for c in left_out}
    lines = [f"not written: the report {out_dir} shows {len(lost)} cell(s) of this run that this one would not; "
             "it is left as it was:"]
    for key, d, m, s in lost:
        cell = states.get(key) or by_cell.get((d, m, s))
        why = _state(cell) if cell is not None else "not selected (--methods, --datasets or --seeds)"
        lines.append(f"  {d} / {m} / seed {s}{f' ({key})' if key else ''}: {why}")
    if command:
        lines.append(f"  to complete them: {command}")
    lines.append(f"  to write this report beside it: add {'--partial ' if left_out else ''}--reports DIR")
    raise Refused(lines)


def _cell_lines(left_out: list[LeftOut] | tuple, command: str) -> list[str]:
    """One line per left-out cell, then the command that completes them (or, when they are
    all running, when to report again)."""
    lines = [f"  {c.label} ({c.key}): {_state(c)}" for c in left_out]
    if command:
        lines.append(f"  to complete them: {command}")
    elif left_out:
        lines.append("  they are being trained by the runner named: report again once it is done")
    return lines


def _state(cell: LeftOut) -> str:
    """``failed: why`` of a left-out cell (a detail that repeats the state is said once)."""
    detail = cell.detail.removeprefix(f"{cell.state}: ")
    return f"{cell.state}: {detail}" if detail else cell.state


def _scores(options: ReportOptions, suite: Suite | None) -> list[str] | None:
    """The OOD scores to analyse: ``--scores``, else the suite's ``scores``, else None
    (the default scores)."""
    if options.scores:
        return list(options.scores)
    return list(suite.scores) if suite is not None and suite.scores else None


def _completing_command(options: ReportOptions, store_only: bool) -> str:
    """The ``run`` command that trains the cells a report leaves out, as the README writes
    commands (``.venv/bin/python run_suite.py ...``; ``make suite`` for the default suite's
    own run): the report's suite (a built-in one by its name), store and selection (a store
    reported alone needs the suite file that made it)."""
    given = options.run.suite_file if options.run is not None and options.run.suite_file else "default"
    suite = "SUITE.toml" if store_only else suite_argument(given)
    flags, selection = [], options.selection
    if options.run is not None and not implied(options.run, options.run.name) and not store_only:
        flags += resume_flags(options.run)  # the run's own command: its overrides (and --name)
        selection = Overrides()
    if options.results != Path("results"):
        flags += ["--results", str(options.results)]
    if options.data_root is not None:
        flags += ["--data-root", str(options.data_root)]
    for flag, value in (("--datasets", selection.datasets), ("--seeds", selection.seeds), ("--methods", selection.methods)):
        if value:
            flags += [flag, ",".join(map(str, value))]
    if selection.epochs is not None:
        flags += ["--epochs", str(selection.epochs)]
    if suite == "default" and not flags:
        return "make suite"
    parts = [*COMMAND, *(["--suite", suite] if suite != "default" else []), *flags]
    command = " ".join(shlex.quote(p) for p in parts)
    return command + (" (SUITE.toml: the suite file that made this store)" if store_only else "")
