"""Report: the analysis files -> tables, plots and one README under ``reports/<suite>/``.

The tables, plots and README render only: they read
:class:`~bench.analysis.AnalysisResults` as ``bench.analysis.load`` returns them from the
analysis files (``analysis/`` beside the tables); no number of a table is computed here
(:mod:`bench.run.report` has the analysis write those files first).  The plots read
per-sample predictions through ``results.load_predictions``
(:meth:`bench.store.catalog.Catalog.predictions`), the one documented way back into the store.
One job per module:

* :mod:`bench.report.tables` — which tables exist (:data:`TABLES`), their columns and
  what each cell shows; :mod:`bench.report.rows` — their rows, from the analysis frames
  indexed once; :mod:`bench.report.formats` — their Markdown / LaTeX / CSV texts;
* :mod:`bench.report.plots` — training curves, reliability diagrams, risk-coverage curves,
  metric vs. severity with CI bands, OOD score histograms;
* :mod:`bench.report.readme` — ``README.md`` (the *Incomplete* banner of a partial report,
  the cells still improving when their training
  ended or not learning, hand-written ``NOTES.md`` inlined at the top of a complete one, conventions from the registered
  metrics, tables, failures, plots);
* :mod:`bench.run.report` — the report step of ``run`` and ``report``: the store's
  cells selected, analysed or their analysis files reused (``bench.analysis.analyse_store``),
  the report written (unless it would leave out cells without ``--partial`` or replace a
  report showing more cells), the cells it leaves out and the exit status told.

Layout written under ``out_dir``::

    tables/{summary,seeds_needed,shift_severity,shift_corruption,shift_other,shift_splits,ood,efficiency,
            convergence}.{md,tex,csv}
    plots/training_<dataset>.png               (validation NLL and training accuracy per epoch)
    plots/reliability_<dataset>_<method>.png
    plots/risk_coverage_<dataset>.png
    plots/severity_<dataset>_<metric>.png      (the "severity" selection vs. severity, CI band)
    plots/ood_hist_<dataset>_<method>.png
    README.md
    cells.json    (the cells shown: key, dataset, method row, seed, configuration; bench.run.report)
    NOTES.md      (optional, written by hand, never by the report)

Determinism: the same analysis files give byte-identical tables and README.  Imports:
numpy, pandas, matplotlib (Agg canvas, no pyplot), tabulate and the stdlib only; never
torch or ``methods/``.  Files are written atomically (``bench.store``); :func:`staged`
makes a whole report one swap, so a report that fails half-way leaves the previous one
complete.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from bench.core import progress
from bench.data import SEVERITIES, check_severity
from bench.core.errors import ConfigError
from bench.metrics import selection
from bench.report.formats import FORMATS, render, tex_escape, validate_formats
from bench.report.plots import sanitize, write_plots
from bench.report.readme import NOTES, RunTitle, readme_text
from bench.report.rows import ResultsIndex
from bench.report.tables import TABLES, Column, TableSpec, build_tables, validate_metrics
from bench.store import atomic_write_text

if TYPE_CHECKING:
    from bench.analysis import AnalysisResults

__all__ = ["Column", "TableSpec", "TABLES", "FORMATS", "NOTES", "RunTitle", "write_report", "render_report", "staged",
           "sanitize", "tex_escape", "validate_formats", "validate_metrics"]


def write_report(
    results: AnalysisResults,
    out_dir: Path,
    formats: Sequence[str] = FORMATS,
    methods: Sequence[str] | None = None,
    metrics: Sequence[str] | None = None,
    severity: int = SEVERITIES[-1],
    left_out: Sequence = (),
    complete_with: str = "",
    run: RunTitle | None = None,
) -> list[Path]:
    """Write tables, plots and ``README.md`` under ``out_dir``; return the paths written.

    ``formats`` picks the table files (any of ``md``, ``tex``, ``csv``); the README always
    embeds the Markdown tables.  ``methods`` restricts the rendered methods (``None`` = all
    of ``results.methods``); rows keep the results' display order either way.  ``metrics``
    picks the metric columns of every table, in the given order (``None`` = each table's
    named selection); a table none of whose metrics is picked and that has no fixed
    columns is not written.  ``severity`` (1..5) is the severity of the per-corruption
    table (``--severity``).  ``left_out`` (:class:`bench.store.catalog.LeftOut`) are the cells
    the tables leave out, listed at the top of the README with ``complete_with``, the
    command that completes them.  ``run`` (:class:`~bench.report.readme.RunTitle`) names the
    run in the README's title, the line under it and every plot's title (None: the
    results' suite name in the title alone).  Plots of an earlier report that this call
    does not draw are removed; other files in ``out_dir`` that it does not write are left
    alone.

    The formats, the metric names and the severity are checked here (:func:`validate_formats`,
    :func:`validate_metrics`, :func:`bench.data.check_severity`: a bad one is a ConfigError);
    :func:`render_report` takes them checked.
    """
    picked = None if metrics is None else validate_metrics(metrics)
    severity = check_severity(severity, "report severity", ConfigError)
    return render_report(results, out_dir, validate_formats(formats), methods, picked, severity, left_out,
                         complete_with, run)


def render_report(results: AnalysisResults, out_dir: Path, formats: Sequence[str], methods: Sequence[str] | None,
                  metrics: list[str] | None, severity: int, left_out: Sequence = (), complete_with: str = "",
                  run: RunTitle | None = None) -> list[Path]:
    """:func:`write_report` for arguments checked where they entered, as :func:`validate_formats`,
    :func:`validate_metrics` (``None``: each table's selection) and
    :func:`bench.data.check_severity` return them."""
    out_dir = Path(out_dir)
    shown = _select_methods(results, methods)
    _check_filenames(results.datasets, shown)

    written: list[Path] = []
    tables_dir = out_dir / "tables"
    tables_dir.mkdir(parents=True, exist_ok=True)
    index = ResultsIndex.build(results, severity)  # shared by the tables and the severity plots
    built = build_tables(results, shown, metrics, index)
    for table in built:
        for fmt in FORMATS:  # fixed order, whatever order `formats` lists them in
            if fmt in formats:
                path = tables_dir / f"{table.spec.name}.{fmt}"
                atomic_write_text(path, render(table, fmt))
                written.append(path)

    plot_metrics = [m for m in selection("severity") if metrics is None or m in metrics]
    with progress.task("plots", unit="plot", done="{count} plots"):
        plots = write_plots(results, shown, index, plot_metrics, out_dir / "plots", run.name if run else "")
    written.extend(path for _, _, path in plots)
    fresh = {path for _, _, path in plots}
    for stale in (out_dir / "plots").glob("*.png"):  # an earlier report's plots no longer shown
        if stale not in fresh:
            stale.unlink()

    readme = out_dir / "README.md"
    atomic_write_text(readme, readme_text(results, shown, built, plots, out_dir, severity, left_out,
                                          complete_with, run))
    written.append(readme)
    return written


def _select_methods(results: AnalysisResults, methods: Sequence[str] | None) -> list[str]:
    if methods is None:
        return list(results.methods)
    unknown = [m for m in methods if m not in results.methods]
    if unknown:
        raise ConfigError(f"unknown method(s) {unknown} for the report; known: {results.methods}")
    wanted = set(methods)
    return [m for m in results.methods if m in wanted]


def _check_filenames(datasets: Iterable[str], methods: Iterable[str]) -> None:
    for kind, names in (("dataset", list(datasets)), ("method", list(methods))):
        seen: dict[str, str] = {}
        for name in names:
            other = seen.setdefault(sanitize(name), name)
            if other != name:
                raise ConfigError(
                    f"{kind}s {other!r} and {name!r} map to the same file name {sanitize(name)!r}"
                )


@contextmanager
def staged(out_dir: Path) -> Iterator[Path]:
    """A new directory beside ``out_dir`` to write a report into, swapped in for ``out_dir``
    when the block ends without an error; on an error, Ctrl-C or SIGTERM it is removed and
    ``out_dir`` stays as it was, byte for byte.

    It starts as a copy of ``out_dir`` (hard links where the filesystem allows; every
    report file is replaced by a new file, never rewritten in place), so the hand-written
    ``NOTES.md``, the analysis files the report reuses and any other file are kept; the
    PNG plots are left out, as the report draws every plot it shows anew.  The swap is two
    renames (``out_dir`` to ``.<name>.previous``, the new directory to ``out_dir``); a
    report killed between them leaves ``.<name>.previous``, which the next one puts back.
    While the directory exists, SIGTERM (:class:`_Terminated`) ends the process through an
    exception, so the directory is removed first (during the swap it waits for the swap).
    """
    out_dir = Path(out_dir)
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    previous = parent / f".{out_dir.name}.previous"
    if previous.is_dir() and not out_dir.exists():
        os.rename(previous, out_dir)
    with _Terminated(out_dir) as terminated:
        stage = parent / f".{out_dir.name}.new-{uuid.uuid4().hex[:12]}"
        stage.mkdir()
        try:
            if out_dir.is_dir():
                plots = out_dir / "plots"
                shutil.copytree(out_dir, stage, symlinks=True, dirs_exist_ok=True, copy_function=_link_or_copy,
                                ignore=lambda d, names: [n for n in names if Path(d) == plots and n.endswith(".png")])
            yield stage
            with terminated.deferred():
                if out_dir.exists():
                    shutil.rmtree(previous, ignore_errors=True)
                    os.rename(out_dir, previous)
                    try:
                        os.rename(stage, out_dir)
                    except BaseException:
                        os.rename(previous, out_dir)
                        raise
                    shutil.rmtree(previous, ignore_errors=True)
                else:
                    os.rename(stage, out_dir)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise


class _Terminated:
    """SIGTERM while a report is staged (in the main thread): the handler the program had
    is called when it is a Python function; under the default action (the process ends at
    once, leaving the staging directory) SystemExit(143) is raised instead, with one line
    on stderr.  Inside :meth:`deferred` (the swap) the signal waits for the block's end."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.before = None
        self.waiting: list[tuple[int, object]] = []
        self.holding = False

    def __enter__(self) -> _Terminated:
        if threading.current_thread() is threading.main_thread():
            self.before = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:
        if self.holding:
            self.waiting.append((signum, frame))
            return
        if callable(self.before):
            self.before(signum, frame)
        elif self.before != signal.SIG_IGN:
            print(f"terminated (SIGTERM): the report {self.out_dir} was not written; the previous one there is "
                  "unchanged", file=sys.stderr)
            raise SystemExit(128 + signum)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        for signum, frame in self.waiting:  # the swap is done: the report is whole, and the process ends
            if callable(self.before):
                self.before(signum, frame)
            elif self.before != signal.SIG_IGN:
                print(f"terminated (SIGTERM) after the report {self.out_dir} was written", file=sys.stderr)
                raise SystemExit(128 + signum)

    def __exit__(self, *exc) -> None:
        if self.before is not None:
            signal.signal(signal.SIGTERM, self.before)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # no hard links here (another filesystem, FAT, some network mounts)
        shutil.copy2(src, dst)
