"""Report: :class:`~bench.analysis.AnalysisResults` -> tables, plots and one README.

Everything here is rendering: no number of a table is computed here.  Metric cells come
from ``results.summary`` (mean, std, CI, Holm-corrected verdict against
``results.reference``), the severity table from ``results.severity``, corruption errors
from ``results.corruption_errors`` and costs from ``results.efficiency``.  Labels, scales,
units, directions and convention sentences of metrics come from
:data:`bench.metrics.METRIC_INFO` only.  The plots draw curves from the stored predictions
with the functions the metrics use (``calibration_bins``, ``risk_coverage_curve``).

Layout written under ``out_dir`` (:data:`TABLES` lists the tables and their columns)::

    tables/{summary,shift_severity,shift_corruption,shift_other,ood,efficiency}.{md,tex,csv}
    plots/reliability_<dataset>_<method>.png
    plots/risk_coverage_<dataset>.png
    plots/severity_<dataset>_<metric>.png      (accuracy, ece, nll vs. severity, CI band)
    plots/ood_hist_<dataset>_<method>.png
    README.md
    NOTES.md      (optional, written by hand, never by the report: inlined at the top of README.md)

Determinism: rows follow the display orders of the results (datasets, methods, splits,
scores, severities), columns follow :data:`TABLES` (or the ``metrics`` argument); nothing
depends on the row order of the input frames, so the same results give byte-identical
tables and README.  PNGs are written without a software/date stamp from fixed-size
figures.

Imports: numpy, pandas, matplotlib (Agg canvas, no pyplot), tabulate and the stdlib only;
never torch or ``methods/``.  Files are written atomically (``bench.store``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import matplotlib
import matplotlib.style
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tabulate import tabulate

from bench.data import corruption_of
from bench.errors import ConfigError
from bench.metrics import METRIC_INFO, aurc, calibration_bins, ece, risk_coverage_curve
from bench.store import atomic_write_text

if TYPE_CHECKING:
    from bench.analysis import AnalysisResults

__all__ = ["Column", "TableSpec", "TABLES", "FORMATS", "write_report", "sanitize", "tex_escape"]


# --------------------------------------------------------------------------------------
# Columns
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """One value column: raw values are multiplied by ``scale`` and shown with ``decimals``.

    ``higher_is_better`` decides the bold "best" cell in LaTeX (``None``: no best).
    """

    key: str  # metric name, or the raw field name (CE, efficiency)
    label: str
    unit: str  # "%", "x1000", "s", "MiB", ... or "" (then the header is the label alone)
    scale: float
    higher_is_better: bool | None
    convention: str
    decimals: int = 2
    grouping: bool = False  # thousands separators (counts such as parameters)

    @property
    def header(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label

    @property
    def tex_header(self) -> str:
        if not self.unit:
            return tex_escape(self.label)
        unit = r"$\times$" + self.unit[1:] if re.fullmatch(r"x\d+", self.unit) else tex_escape(self.unit)
        return f"{tex_escape(self.label)} ({unit})"

    def text(self, raw: float, decimals: int | None = None) -> str:
        """The raw value, scaled and formatted (``-0.00`` shows as ``0.00``)."""
        d = self.decimals if decimals is None else decimals
        s = f"{raw * self.scale:{',' if self.grouping else ''}.{d}f}"
        return s[1:] if re.fullmatch(r"-[0.,]+", s) else s


def metric_column(name: str) -> Column:
    """The display column of a registered metric, from :data:`METRIC_INFO`."""
    info = METRIC_INFO[name]
    return Column(name, info.label, info.unit_label, float(info.scale), bool(info.higher_is_better),
                  info.convention)


CE_COLUMN = Column(
    "ce", "CE", "%", 100.0, False,
    "Corruption error (Hendrycks & Dietterich): the method's top-1 error summed over the "
    "severities of one corruption, divided by the same sum for the reference method "
    "(100 = as good as the reference); the mCE row averages CE over the corruptions. It "
    "counts every severity, not only the one of the table.",
)
EFFICIENCY_COLUMNS: tuple[Column, ...] = (
    Column("parameters", "Parameters", "", 1.0, False,
           "Model parameters (cell.json); a combinator counts all its members'.", decimals=0,
           grouping=True),
    Column("train_seconds", "Train time", "s", 1.0, False,
           "Wall-clock training time, mean over seeds; a combinator (ensemble) adds up its "
           "members'.", decimals=1),
    Column("predict_seconds_per_1000", "Predict time / 1,000 images", "s", 1.0, False,
           "Wall-clock prediction time per 1,000 images over every evaluated split, mean over "
           "seeds; a combinator adds up its members'.", decimals=3),
    Column("peak_memory_mb", "Peak memory", "MiB", 1.0, False,
           "Peak memory during the cell, from cell.json (GPU: peak CUDA memory allocated; CPU: "
           "peak resident set of the process during the cell, which includes memory its "
           "allocator kept from earlier cells of the same run).", decimals=1),
    Column("passes", "Passes", "", 1.0, None,
           "Forward passes per prediction (Monte-Carlo samples; a combinator adds up its "
           "members').", decimals=0),
)


# --------------------------------------------------------------------------------------
# Tables: the one place that says which tables exist and what their columns are.
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TableSpec:
    """One table.

    Rows are ``(Dataset, Method, *keys)``; value columns are the metric columns (``family``
    of :data:`METRIC_INFO`; ``default`` unless the caller picks metrics), then ``extra``.
    ``source`` names the row builder (:data:`_SOURCES`), ``csv_stats`` the raw statistics
    written per metric column to the CSV, ``marks`` whether Markdown/LaTeX cells show the CI
    and the significance mark (and the reference method is tagged).
    """

    name: str
    title: str  # README heading; "{severity}" is filled in
    source: str
    keys: tuple[tuple[str, str], ...]  # (display header, CSV column) after Dataset, Method
    family: str | None
    default: tuple[str, ...]
    csv_stats: tuple[str, ...] = ("mean", "std")
    extra: tuple[Column, ...] = ()
    marks: bool = False
    empty: str = "No rows."  # what the table says when it has none
    in_readme: bool = True  # False: written to tables/ only (too long to inline), linked from the README


_SUMMARY_STATS = ("mean", "std", "ci_low", "ci_high", "p_holm", "verdict")
_SEVERITY_STATS = ("mean", "std", "ci_low", "ci_high")
_TABLE1 = ("accuracy", "aurc", "failure_auroc", "failure_fpr95", "ece", "nll", "brier", "eaurc")
_SHIFT = ("accuracy", "ece", "nll", "brier", "aurc", "failure_auroc")

TABLES: tuple[TableSpec, ...] = (
    TableSpec("summary", "Summary (test split)", "test", (), "classification", _TABLE1,
              _SUMMARY_STATS, marks=True, empty="No test split was evaluated."),
    TableSpec("shift_severity", "Shift: metric vs. corruption severity (0 = clean test, "
              "all = every corruption split)", "severity", (("Severity", "severity"),),
              "classification", _SHIFT, _SEVERITY_STATS, empty="No corruption split was evaluated."),
    TableSpec("shift_corruption", "Shift: per corruption at severity {severity}", "corruption",
              (("Corruption", "corruption"),), "classification", _SHIFT, _SUMMARY_STATS,
              extra=(CE_COLUMN,), empty="No corruption split at this severity was evaluated."),
    TableSpec("shift_other", "Shift: other shifts (no severity)", "other_shift",
              (("Split", "split"),), "classification", _SHIFT, _SUMMARY_STATS,
              empty="No shift split without a severity was evaluated."),
    TableSpec("shift_splits", "Shift: every shift split (the full corruption x severity grid)", "all_shift",
              (("Split", "split"),), "classification", _SHIFT, ("mean", "std"),
              empty="No shift split was evaluated.", in_readme=False),
    TableSpec("ood", "OOD detection (test split = in-distribution)", "ood",
              (("Split", "split"), ("Score", "score")), "ood",
              ("ood_auroc", "ood_aupr_in", "ood_aupr_out", "ood_fpr95"), _SUMMARY_STATS,
              marks=True, empty="No OOD split was evaluated."),
    TableSpec("efficiency", "Efficiency", "efficiency", (), None, (), (),
              extra=EFFICIENCY_COLUMNS, empty="No efficiency record (cell.json) was found."),
)

FORMATS = ("md", "tex", "csv")
SCORE_ORDER = ("msp", "entropy", "mutual_info")  # OOD scores; others follow, sorted
SEVERITY_PLOT_METRICS = ("accuracy", "ece", "nll")
SEVERITIES = range(1, 6)

NA = "n/a"  # no finite value for any seed
FAILED = "failed"  # every seed of the (dataset, method) failed
REF_TAG = " (ref)"
CI_DECIMALS = 1
MD_MARKS = {"better": " ▲", "worse": " ▼"}
TEX_MARKS = {"better": r"$^\uparrow$", "worse": r"$^\downarrow$"}
CSV_FLOAT_FORMAT = "%.10g"

N_BINS = 15  # reliability diagram, same (lo, hi] bins as the faithful ECE
HIST_BINS = 40
FIGSIZE = (4.8, 4.0)
DPI = 100
_PLOT_RC = {"font.size": 9.0, "axes.titlesize": 9.0, "legend.fontsize": 7.5}


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------
NOTES = "NOTES.md"


def write_report(
    results: AnalysisResults,
    out_dir: Path,
    formats: Sequence[str] = FORMATS,
    methods: Sequence[str] | None = None,
    metrics: Sequence[str] | None = None,
    severity: int = 5,
) -> list[Path]:
    """Write tables, plots and ``README.md`` under ``out_dir``; return the paths written.

    ``formats`` picks the table files (any of ``md``, ``tex``, ``csv``); the README always
    embeds the Markdown tables.  ``methods`` restricts the rendered methods (``None`` = all
    of ``results.methods``); rows keep the results' display order either way.  ``metrics``
    picks the metric columns of every table, in the given order (``None`` = each table's
    paper default); a table none of whose metrics is picked and that has no fixed columns
    is not written.  ``severity`` (1..5) is the severity of the per-corruption table.
    Existing files in ``out_dir`` that this call does not write are left alone.
    """
    out_dir = Path(out_dir)
    unknown_fmt = sorted(set(formats) - set(FORMATS))
    if unknown_fmt:
        raise ConfigError(f"unknown report format(s) {unknown_fmt}; known: {list(FORMATS)}")
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or severity not in SEVERITIES:
        raise ConfigError(f"report severity must be one of {list(SEVERITIES)}, got {severity!r}")
    shown = _select_methods(results, methods)
    picked = _select_metrics(metrics)
    _check_filenames(results.datasets, shown)

    index = _Index.build(results, int(severity))
    written: list[Path] = []
    tables_dir = out_dir / "tables"
    tables_dir.mkdir(parents=True, exist_ok=True)
    built: list[_Table] = []
    for spec in TABLES:
        columns = _columns(spec, picked)
        if not columns:
            continue
        table = _Table(spec, columns, _table_rows(results, shown, spec, index), results.reference)
        built.append(table)
        for fmt in FORMATS:  # fixed order, whatever order `formats` lists them in
            if fmt in formats:
                path = tables_dir / f"{spec.name}.{fmt}"
                atomic_write_text(path, _RENDERERS[fmt](table))
                written.append(path)

    plot_metrics = [m for m in SEVERITY_PLOT_METRICS if picked is None or m in picked]
    plots = _write_plots(results, shown, index, plot_metrics, out_dir / "plots")
    written.extend(path for _, _, path in plots)

    readme = out_dir / "README.md"
    atomic_write_text(readme, _readme(results, shown, built, plots, out_dir, int(severity)))
    written.append(readme)
    return written


def sanitize(name: str) -> str:
    """A name usable in a file name: anything but ``[A-Za-z0-9_.-]`` becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _select_methods(results: AnalysisResults, methods: Sequence[str] | None) -> list[str]:
    if methods is None:
        return list(results.methods)
    unknown = [m for m in methods if m not in results.methods]
    if unknown:
        raise ConfigError(f"unknown method(s) {unknown} for the report; known: {results.methods}")
    wanted = set(methods)
    return [m for m in results.methods if m in wanted]


def _select_metrics(metrics: Sequence[str] | None) -> list[str] | None:
    if metrics is None:
        return None
    unknown = [m for m in metrics if m not in METRIC_INFO]
    if unknown:
        raise ConfigError(f"unknown metric(s) {unknown} for the report; known: {sorted(METRIC_INFO)}")
    return list(dict.fromkeys(metrics))


def _columns(spec: TableSpec, picked: list[str] | None) -> list[Column]:
    names = spec.default if picked is None else [m for m in picked if METRIC_INFO[m].family == spec.family]
    return [metric_column(m) for m in names] + list(spec.extra)


def _check_filenames(datasets: Iterable[str], methods: Iterable[str]) -> None:
    for kind, names in (("dataset", list(datasets)), ("method", list(methods))):
        seen: dict[str, str] = {}
        for name in names:
            other = seen.setdefault(sanitize(name), name)
            if other != name:
                raise ConfigError(
                    f"{kind}s {other!r} and {name!r} map to the same file name {sanitize(name)!r}"
                )


# --------------------------------------------------------------------------------------
# Rows: the input frames indexed once, then one row builder per table source
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Stat:
    """Raw (unscaled) statistics of one cell; NaN/"" where the source has none."""

    mean: float = math.nan
    std: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    p_holm: float = math.nan
    verdict: str = ""


_NONE = _Stat()


@dataclass(frozen=True)
class _Row:
    dataset: str
    method: str
    keys: tuple  # raw values of the spec's key columns (severity stays an int, -1 = all)
    stats: dict[str, _Stat]  # column key -> statistics
    n_seeds: int
    failed: bool = False
    partial: bool = False  # only the columns in ``stats`` apply (the mCE row); others are blank


Key = tuple  # (dataset, method)


def _float(x) -> float:
    return math.nan if x is None or pd.isna(x) else float(x)


def _int(x) -> int:
    return 0 if x is None or pd.isna(x) else int(x)


def _records(frame: pd.DataFrame, columns: Sequence[str]) -> Iterable[dict]:
    """Rows of ``frame`` as dicts; nothing when it is empty or lacks a column."""
    if frame is None or not len(frame) or any(c not in frame.columns for c in columns):
        return []
    return frame[list(columns)].to_dict("records")


@dataclass
class _Index:
    """The input frames keyed for lookup; row order of the frames never matters."""

    split_rank: dict[str, dict[str, int]]  # dataset -> split -> display rank
    severity: int
    # (dataset, method) -> (split, score) -> metric -> stat, and the max n_seeds per (split, score)
    summary: dict[Key, dict[tuple[str, str], dict[str, _Stat]]] = field(default_factory=dict)
    summary_n: dict[Key, dict[tuple[str, str], int]] = field(default_factory=dict)
    by_severity: dict[Key, dict[int, dict[str, _Stat]]] = field(default_factory=dict)
    severity_n: dict[Key, dict[int, int]] = field(default_factory=dict)
    ce: dict[Key, dict[str, float]] = field(default_factory=dict)
    efficiency: dict[Key, dict[str, float]] = field(default_factory=dict)
    seeds: dict[Key, int] = field(default_factory=dict)

    @classmethod
    def build(cls, results: AnalysisResults, severity: int) -> _Index:
        ix = cls({d: {s: i for i, s in enumerate(sp)} for d, sp in results.splits.items()}, severity)
        ix.seeds = {k: len(v) for k, v in results.seeds.items()}
        for r in _records(results.summary, ["dataset", "method", "split", "score", "metric", "n_seeds",
                                            *_SUMMARY_STATS]):
            key, rk = (r["dataset"], r["method"]), (r["split"], "" if pd.isna(r["score"]) else str(r["score"]))
            ix.summary.setdefault(key, {}).setdefault(rk, {})[r["metric"]] = _stat(r)
            n = ix.summary_n.setdefault(key, {})
            n[rk] = max(n.get(rk, 0), _int(r["n_seeds"]))
        for r in _records(results.severity, ["dataset", "method", "severity", "metric", "n_seeds",
                                             *_SEVERITY_STATS]):
            key, sev = (r["dataset"], r["method"]), int(r["severity"])
            ix.by_severity.setdefault(key, {}).setdefault(sev, {})[r["metric"]] = _stat(r)
            n = ix.severity_n.setdefault(key, {})
            n[sev] = max(n.get(sev, 0), _int(r["n_seeds"]))
        for r in _records(results.corruption_errors, ["dataset", "method", "corruption", "ce"]):
            ix.ce.setdefault((r["dataset"], r["method"]), {})[r["corruption"]] = _float(r["ce"])
        names = [c.key for c in EFFICIENCY_COLUMNS]
        for r in _records(results.efficiency, ["dataset", "method", *names]):
            ix.efficiency[(r["dataset"], r["method"])] = {k: _float(r[k]) for k in names}
        return ix

    def split_key(self, dataset: str, split: str) -> tuple:
        rank = self.split_rank.get(dataset, {})
        return (rank.get(split, len(rank)), split)


def _stat(record: dict) -> _Stat:
    verdict = record.get("verdict", "")
    return _Stat(*(_float(record.get(s)) for s in ("mean", "std", "ci_low", "ci_high", "p_holm")),
                 verdict="" if verdict is None or pd.isna(verdict) else str(verdict))


def _score_key(score: str) -> tuple:
    return (SCORE_ORDER.index(score) if score in SCORE_ORDER else len(SCORE_ORDER), score)


def _summary_rows(ix: _Index, dataset: str, method: str,
                  select: Callable[[str, str], tuple | None]) -> list[_Row]:
    """Rows from ``results.summary``: ``select(split, score)`` gives the row keys or None."""
    cells = ix.summary.get((dataset, method), {})
    picked = [((split, score), select(split, score)) for split, score in cells]
    picked = [(rk, keys) for rk, keys in picked if keys is not None]
    picked.sort(key=lambda p: (ix.split_key(dataset, p[0][0]), _score_key(p[0][1])))
    return [_Row(dataset, method, keys, cells[rk], ix.summary_n[(dataset, method)][rk])
            for rk, keys in picked]


def _rows_test(ix: _Index, dataset: str, method: str) -> list[_Row]:
    return _summary_rows(ix, dataset, method, lambda split, score: () if split == "test" and not score else None)


def _rows_other_shift(ix: _Index, dataset: str, method: str) -> list[_Row]:
    def select(split: str, score: str) -> tuple | None:
        return (split,) if split.startswith("shift/") and corruption_of(split) is None and not score else None

    return _summary_rows(ix, dataset, method, select)


def _rows_all_shift(ix: _Index, dataset: str, method: str) -> list[_Row]:
    return _summary_rows(ix, dataset, method, lambda split, score: (split,) if split.startswith("shift/") and not score else None)


def _rows_ood(ix: _Index, dataset: str, method: str) -> list[_Row]:
    return _summary_rows(ix, dataset, method, lambda split, score: (split, score) if split.startswith("ood/") else None)


def _rows_corruption(ix: _Index, dataset: str, method: str) -> list[_Row]:
    """Corruptions at the chosen severity (plus CE), then the method's mCE row."""

    def select(split: str, score: str) -> tuple | None:
        cs = corruption_of(split)
        return (cs[0],) if cs and cs[1] == ix.severity and not score else None

    rows = _summary_rows(ix, dataset, method, select)
    ce = ix.ce.get((dataset, method), {})
    seen = {r.keys[0] for r in rows}
    order = {c: ix.split_key(dataset, f"shift/{c}/{ix.severity}") for c in ce}
    n = ix.seeds.get((dataset, method), 0)
    rows += [_Row(dataset, method, (c,), {}, n) for c in sorted(ce, key=lambda c: (order[c], c))
             if c not in seen and c != "mCE"]
    rows = [_Row(r.dataset, r.method, r.keys, {**r.stats, "ce": _Stat(ce.get(r.keys[0], math.nan))}, r.n_seeds)
            for r in rows]
    if "mCE" in ce:
        rows.append(_Row(dataset, method, ("mCE",), {"ce": _Stat(ce["mCE"])}, n, partial=True))
    return rows


def _rows_severity(ix: _Index, dataset: str, method: str) -> list[_Row]:
    cells = ix.by_severity.get((dataset, method), {})
    n = ix.severity_n.get((dataset, method), {})
    return [_Row(dataset, method, (sev,), cells[sev], n[sev]) for sev in sorted(cells, key=lambda s: (s < 0, s))]


def _rows_efficiency(ix: _Index, dataset: str, method: str) -> list[_Row]:
    values = ix.efficiency.get((dataset, method))
    if values is None:
        return []
    return [_Row(dataset, method, (), {k: _Stat(v) for k, v in values.items()}, ix.seeds.get((dataset, method), 0))]


_SOURCES: dict[str, Callable[[_Index, str, str], list[_Row]]] = {
    "test": _rows_test,
    "severity": _rows_severity,
    "corruption": _rows_corruption,
    "other_shift": _rows_other_shift,
    "all_shift": _rows_all_shift,
    "ood": _rows_ood,
    "efficiency": _rows_efficiency,
}


def _failure_keys(results: AnalysisResults) -> set[Key]:
    f = results.failures
    return {(str(d), str(m)) for d, m in zip(f["dataset"], f["method"])} if len(f) else set()


def _table_rows(results: AnalysisResults, methods: list[str], spec: TableSpec, ix: _Index) -> list[_Row]:
    """Rows in display order: datasets, then methods, then the source's own order.

    A (dataset, method) with no successful seed and a recorded failure gets one ``failed``
    row (empty keys); one that was not run on the dataset gets none.
    """
    failed_pairs = _failure_keys(results)
    rows: list[_Row] = []
    for dataset in results.datasets:
        for method in methods:
            mine = _SOURCES[spec.source](ix, dataset, method)
            if not mine and not results.seeds.get((dataset, method)) and (dataset, method) in failed_pairs:
                mine = [_Row(dataset, method, ("",) * len(spec.keys), {}, 0, failed=True)]
            rows += mine
    return rows


# --------------------------------------------------------------------------------------
# Cells
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Table:
    spec: TableSpec
    columns: list[Column]
    rows: list[_Row]
    reference: str

    @property
    def key_headers(self) -> list[str]:
        return ["Dataset", "Method"] + [h for h, _ in self.spec.keys]

    @property
    def metric_columns(self) -> list[Column]:
        return self.columns[: len(self.columns) - len(self.spec.extra)]

    def key_texts(self, row: _Row) -> list[str]:
        method = row.method + (REF_TAG if self.spec.marks and row.method == self.reference else "")
        return [row.dataset, method] + [_key_text(k) for k in row.keys]

    def value(self, row: _Row, col: Column) -> tuple[str, str]:
        """(cell text, verdict) of one cell; the verdict is "" unless the table has marks.

        Text: ``failed``; ``n/a`` (no finite mean); ``mean``, ``mean ± std`` (std finite),
        then `` [lo, hi]`` (tables with marks, CI finite, :data:`CI_DECIMALS` decimals).
        """
        if row.failed:
            return FAILED, ""
        stat = row.stats.get(col.key, _NONE)
        if not math.isfinite(stat.mean):
            return ("" if row.partial and col.key not in row.stats else NA), ""
        text = col.text(stat.mean)
        if math.isfinite(stat.std):
            text += f" ± {col.text(stat.std)}"
        if not self.spec.marks:
            return text, ""
        if math.isfinite(stat.ci_low) and math.isfinite(stat.ci_high):
            text += f" [{col.text(stat.ci_low, CI_DECIMALS)}, {col.text(stat.ci_high, CI_DECIMALS)}]"
        return text, stat.verdict

    def best(self) -> np.ndarray:
        """Boolean [rows, columns]: best mean per column within each group of rows.

        A group is the rows sharing dataset and every key but the method (dataset /
        split / score / severity / corruption).  Ties at the displayed precision are all
        marked; a group with fewer than two finite values, or a column without a
        direction, has no best.
        """
        mask = np.zeros((len(self.rows), len(self.columns)), dtype=bool)
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(self.rows):
            if not row.failed:
                groups.setdefault((row.dataset, *row.keys), []).append(i)
        for j, col in enumerate(self.columns):
            if col.higher_is_better is None:
                continue
            pick = max if col.higher_is_better else min
            for idx in groups.values():
                means = {i: self.rows[i].stats.get(col.key, _NONE).mean for i in idx}
                finite = [i for i, m in means.items() if math.isfinite(m)]
                if len(finite) < 2:
                    continue
                best = col.text(pick(means[i] for i in finite))
                for i in finite:
                    mask[i, j] = col.text(means[i]) == best
        return mask


def _key_text(value) -> str:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return "all" if value < 0 else str(int(value))
    return str(value)


# --------------------------------------------------------------------------------------
# Table formats
# --------------------------------------------------------------------------------------
def _md_escape(text: str) -> str:
    return text.replace("|", r"\|").replace("\n", " ")


def _to_markdown(table: _Table, drop_dataset: bool = False) -> str:
    """GitHub pipe table (or the table's "no rows" sentence); the README drops ``Dataset``."""
    if not table.rows:
        return table.spec.empty + "\n"
    skip = 1 if drop_dataset else 0
    headers = table.key_headers[skip:] + [c.header for c in table.columns]
    body = []
    for row in table.rows:
        cells = [_md_escape(k) for k in table.key_texts(row)[skip:]]
        for col in table.columns:
            text, verdict = table.value(row, col)
            cells.append(text + MD_MARKS.get(verdict, ""))
        body.append(cells)
    colalign = ("left",) * (len(table.key_headers) - skip) + ("right",) * len(table.columns)
    return tabulate(body, headers=headers, tablefmt="pipe", disable_numparse=True,
                    colalign=colalign) + "\n"


_TEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def tex_escape(text: str) -> str:
    """Escape LaTeX special characters; ``±`` becomes ``$\\pm$``."""
    out = "".join(_TEX_SPECIAL.get(ch, ch) for ch in text)
    return out.replace("±", r"$\pm$")


def _to_latex(table: _Table) -> str:
    """booktabs tabular; best mean per column and row group in bold, marks as arrows."""
    head = f"% uqbench table '{table.spec.name}'; needs \\usepackage{{booktabs}}"
    if not table.rows:
        return f"{head}\n% {table.spec.empty}\n"
    best = table.best()
    keys = table.key_headers
    lines = [
        head,
        r"\begin{tabular}{" + "l" * len(keys) + "r" * len(table.columns) + "}",
        r"\toprule",
        " & ".join([tex_escape(k) for k in keys] + [c.tex_header for c in table.columns]) + r" \\",
        r"\midrule",
    ]
    previous = None
    for i, row in enumerate(table.rows):
        if previous is not None and row.dataset != previous:
            lines.append(r"\midrule")
        previous = row.dataset
        cells = [tex_escape(k) for k in table.key_texts(row)]
        for j, col in enumerate(table.columns):
            text, verdict = table.value(row, col)
            text = tex_escape(text)
            cells.append((r"\textbf{" + text + "}" if best[i, j] else text) + TEX_MARKS.get(verdict, ""))
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def _to_csv(table: _Table) -> str:
    """Raw (unscaled) values: keys, ``n_seeds``, ``<metric>_<stat>`` per metric column
    (stats: the spec's ``csv_stats``) and one column per fixed column (``ce``, efficiency
    fields).  Undefined numbers are ``nan``; a missing verdict is empty; severity ``-1`` is
    the average over every corruption split.
    """
    spec = table.spec
    keys = ["dataset", "method"] + [k for _, k in spec.keys] + ["n_seeds"]
    values = [f"{c.key}_{s}" for c in table.metric_columns for s in spec.csv_stats]
    values += [c.key for c in spec.extra]
    records = []
    for row in table.rows:
        rec: dict[str, object] = {"dataset": row.dataset, "method": row.method, "n_seeds": row.n_seeds}
        rec.update(zip(keys[2:], row.keys))
        for c in table.metric_columns:
            stat = row.stats.get(c.key, _NONE)
            rec.update({f"{c.key}_{s}": getattr(stat, s) for s in spec.csv_stats})
        for c in spec.extra:
            rec[c.key] = row.stats.get(c.key, _NONE).mean
        records.append(rec)
    frame = pd.DataFrame.from_records(records, columns=keys + values)
    floats = [c for c in values if not c.endswith("_verdict")]
    frame = frame.astype({"n_seeds": "int64"} | {c: "float64" for c in floats})
    return frame.to_csv(index=False, float_format=CSV_FLOAT_FORMAT, na_rep="nan", lineterminator="\n")


_RENDERERS: dict[str, Callable[[_Table], str]] = {"md": _to_markdown, "tex": _to_latex, "csv": _to_csv}


# --------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------
def _new_figure() -> Figure:
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)  # Agg canvas attached explicitly: no pyplot, no global backend
    return fig


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    fig.clear()


def _plot_reliability(probs: np.ndarray, labels: np.ndarray, title: str, path: Path) -> None:
    stats = calibration_bins(probs, labels, n_bins=N_BINS)
    edges, width = stats["edges"], 1.0 / N_BINS
    filled = stats["count"] > 0
    left = edges[:-1][filled]
    acc, conf = stats["acc"][filled], stats["conf"][filled]
    fig = _new_figure()
    ax = fig.add_subplot()
    ax.bar(left, acc, width=width, align="edge", color="#4C72B0", edgecolor="black",
           linewidth=0.5, label="accuracy")
    ax.bar(left, conf - acc, bottom=acc, width=width, align="edge", color="#DD8452",
           alpha=0.45, edgecolor="#C44E52", hatch="//", linewidth=0.5, label="gap to confidence")
    ax.plot([0, 1], [0, 1], "--", color="gray", linewidth=1.0, label="perfect calibration")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence (max probability)", ylabel="accuracy")
    ax.set_title(f"{title}\nECE = {100 * ece(probs, labels, n_bins=N_BINS):.2f}% ({N_BINS} bins)")
    ax.legend(loc="upper left")
    _save(fig, path)


def _plot_risk_coverage(curves: list[tuple[str, np.ndarray, np.ndarray]], title: str,
                        path: Path) -> None:
    fig = _new_figure()
    ax = fig.add_subplot()
    for method, probs, labels in curves:
        coverage, risk = risk_coverage_curve(probs, labels)
        ax.plot(coverage, risk, linewidth=1.2, label=f"{method} (AURC x1000 = {1000 * aurc(probs, labels):.2f})")
    ax.set(xlim=(0, 1), xlabel="coverage", ylabel="selective risk (error rate)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(loc="upper left")
    _save(fig, path)


def _plot_severity(lines: list[tuple[str, list[int], dict[int, _Stat]]], col: Column, title: str,
                   path: Path) -> None:
    """One line per method over severity (0 = clean), shaded band = the 95% CI."""
    fig = _new_figure()
    ax = fig.add_subplot()
    for method, sevs, cells in lines:
        x = np.asarray(sevs, dtype=float)
        mean = np.array([cells[s].mean for s in sevs]) * col.scale
        lo = np.array([cells[s].ci_low for s in sevs]) * col.scale
        hi = np.array([cells[s].ci_high for s in sevs]) * col.scale
        (line,) = ax.plot(x, mean, marker="o", markersize=3, linewidth=1.2, label=method)
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set(xlabel="corruption severity (0 = clean test)", ylabel=col.header, xticks=list(range(0, 6)))
    ax.set_title(title)
    ax.legend(loc="best")
    _save(fig, path)


def _plot_ood_hist(test_conf: np.ndarray, ood: list[tuple[str, np.ndarray]], title: str,
                   path: Path) -> None:
    bins = np.linspace(0.0, 1.0, HIST_BINS + 1)
    fig = _new_figure()
    ax = fig.add_subplot()
    ax.hist(test_conf, bins=bins, density=True, color="#4C72B0", alpha=0.5, label="test (ID)")
    for split, conf in ood:
        ax.hist(conf, bins=bins, density=True, histtype="step", linewidth=1.3, label=split)
    ax.set(xlim=(0, 1), xlabel="max probability (MSP)", ylabel="density")
    ax.set_title(title)
    ax.legend(loc="upper left")
    _save(fig, path)


def _severity_lines(ix: _Index, methods: list[str], dataset: str,
                    metric: str) -> list[tuple[str, list[int], dict[int, _Stat]]]:
    """(method, severities 0..5 present, severity -> stat) for methods with >= 2 points."""
    out = []
    for method in methods:
        by_sev = ix.by_severity.get((dataset, method), {})
        cells = {sev: stats[metric] for sev, stats in by_sev.items() if sev >= 0 and metric in stats}
        if len(cells) >= 2:
            out.append((method, sorted(cells), cells))
    return out


def _write_plots(
    results: AnalysisResults, methods: list[str], ix: _Index, severity_metrics: list[str], plot_dir: Path
) -> list[tuple[str, str, Path]]:
    """Write every plot; return (dataset, caption, path) in display order.

    Per dataset: the reliability diagrams (methods in order), the risk-coverage plot, the
    metric-vs-severity plots, then the OOD histograms.  A (dataset, method) without seeds
    (e.g. every seed failed) is skipped; the first seed is the smallest available one.
    """
    plot_dir.mkdir(parents=True, exist_ok=True)
    out: list[tuple[str, str, Path]] = []
    with matplotlib.style.context("default"), matplotlib.rc_context(_PLOT_RC):
        for dataset in results.datasets:
            splits = results.splits.get(dataset, [])
            ood_splits = [s for s in splits if s.startswith("ood/")]
            reliability, hists, curves = [], [], []
            for method in methods:
                seeds = results.seeds.get((dataset, method), [])
                if not seeds or "test" not in splits:
                    continue
                seed = min(seeds)
                probs, labels = results.load_predictions(dataset, method, seed, "test")
                name = f"{dataset} / {method} (seed {seed}, test)"
                path = plot_dir / f"reliability_{sanitize(dataset)}_{sanitize(method)}.png"
                _plot_reliability(probs, labels, f"Reliability: {name}", path)
                reliability.append((dataset, f"Reliability diagram: {name}", path))
                curves.append((method, probs, labels))
                if ood_splits:
                    ood = [(s, results.load_predictions(dataset, method, seed, s)[0].max(axis=1))
                           for s in ood_splits]
                    path = plot_dir / f"ood_hist_{sanitize(dataset)}_{sanitize(method)}.png"
                    _plot_ood_hist(probs.max(axis=1), ood, f"MSP: {name} vs OOD", path)
                    hists.append((dataset, f"MSP histograms, test vs OOD: {name}", path))
            out += reliability
            if curves:
                path = plot_dir / f"risk_coverage_{sanitize(dataset)}.png"
                _plot_risk_coverage(curves, f"Risk-coverage: {dataset} (test, first seed)", path)
                out.append((dataset, f"Risk-coverage curves: {dataset}", path))
            for metric in severity_metrics:
                lines = _severity_lines(ix, methods, dataset, metric)
                if lines:
                    col = metric_column(metric)
                    path = plot_dir / f"severity_{sanitize(dataset)}_{metric}.png"
                    caption = f"{col.label} vs. corruption severity: {dataset} (mean over corruptions, 95% CI band)"
                    title = f"{col.label} vs. corruption severity: {dataset}\n(mean over corruptions, band = 95% CI)"
                    _plot_severity(lines, col, title, path)
                    out.append((dataset, caption, path))
            out += hists
    return out


# --------------------------------------------------------------------------------------
# README
# --------------------------------------------------------------------------------------
def _note(reference: str) -> str:
    ref = f"`{reference}`" if reference else "(none: no marks)"
    return (
        f"Reference method: {ref}. Cells are mean ± std over seeds (std with ddof=1; a single "
        "seed shows the mean only) at the scale in each column header (see *Conventions*). "
        "For ensembles the \"seeds\" are replicates (independent draws of member seeds). In "
        "the summary and OOD tables, `[lo, hi]` is the 95% confidence interval of the "
        f"seed-mean (paired percentile bootstrap over test samples, {CI_DECIMALS} decimal), "
        "and a mark compares the method with the reference, tagged `(ref)`: `▲` "
        "significantly better, `▼` significantly worse, in the metric's good direction "
        "(higher or lower), no mark = no significant difference. The test is a paired "
        "bootstrap z-test (the difference to the reference over the standard deviation of "
        "its bootstrap distribution on the same resampled samples), Holm-corrected across "
        "all comparisons of one dataset's table, significant when p_holm < 0.05. Percentile "
        "intervals of biased statistics (notably ECE, which resampling inflates) can lie "
        "beside the point estimate. The severity table averages each metric over the corruptions "
        "evaluated at a severity; its CI (`ci_low`/`ci_high` in the CSV, the band of the "
        "severity plots) is the analysis' 95% interval of that seed-mean. `n/a` means the metric is undefined for every "
        "seed (e.g. failure AUROC when all predictions are correct) and `failed` that no "
        "seed of the method finished (see *Failed cells*). LaTeX (`tables/*.tex`, "
        "booktabs): best value per column in bold within each dataset and "
        "split/score/severity/corruption group, marks as `$^\\uparrow$`/`$^\\downarrow$`. "
        "Machine-readable raw (unscaled) values: `tables/*.csv`, with `<metric>_mean`, "
        "`_std`, `_ci_low`, `_ci_high`, `_p_holm`, `_verdict` per metric (severity `-1` = "
        "every corruption split)."
    )


_SCORES_NOTE = (
    "OOD scores (column *Score*; higher = more in-distribution): `msp` = maximum "
    "predictive probability; `entropy` = negative predictive entropy H[p̄]; `mutual_info` "
    "= negative mutual information between prediction and model (epistemic part of the "
    "entropy decomposition), only for methods with several samples or members."
)


def _conventions(tables: list[_Table]) -> list[str]:
    """One line per shown column (metrics first seen order), with its convention."""
    seen: dict[str, tuple[Column, list[str]]] = {}
    for table in tables:
        for col in table.columns:
            seen.setdefault(col.key, (col, []))[1].append(table.spec.name)
    body = [[_md_escape(col.header), f"`{key}`", ", ".join(names), _md_escape(col.convention)]
            for key, (col, names) in seen.items()]
    parts = ["## Conventions", ""]
    if body:
        parts.append(tabulate(body, headers=["Column", "Name", "Tables", "Convention"],
                              tablefmt="pipe", disable_numparse=True) + "\n")
    if any(t.spec.source == "ood" for t in tables):
        parts += [_SCORES_NOTE, ""]
    return parts


def _readme(
    results: AnalysisResults,
    methods: list[str],
    tables: list[_Table],
    plots: list[tuple[str, str, Path]],
    out_dir: Path,
    severity: int,
) -> str:
    parts = [f"# uqbench report: {results.suite}", ""]
    notes = out_dir / NOTES
    if notes.is_file():  # the run's hand-written discussion (e.g. a comparison with a paper)
        parts += [notes.read_text(encoding="utf-8").strip(), ""]
    parts += [_note(results.reference), ""]
    shown = {t.spec.name for t in tables}
    skipped = [s.name for s in TABLES if s.name not in shown]
    if skipped:
        parts += [f"Not shown (none of the selected metrics belongs to them): {', '.join(skipped)}.", ""]
    parts += _conventions(tables)
    for dataset in results.datasets:
        parts += [f"## {dataset}", ""]
        for table in tables:
            parts += [f"### {table.spec.title.format(severity=severity)}", ""]
            if not table.spec.in_readme:
                parts += [f"Too long to show here: see `tables/{table.spec.name}.md` / `.csv` / `.tex`.", ""]
                continue
            mine = _Table(table.spec, table.columns, [r for r in table.rows if r.dataset == dataset],
                          table.reference)
            parts.append(_to_markdown(mine, drop_dataset=True))

    parts += ["## Failed cells", ""]
    failures = _failures_in_order(results, methods)
    if len(failures):
        body = [[_md_escape(str(v)) for v in row] for row in failures.itertuples(index=False)]
        parts.append(tabulate(body, headers=["dataset", "method", "seed", "reason"],
                              tablefmt="pipe", disable_numparse=True) + "\n")
    else:
        parts += ["None.", ""]

    parts += ["## Plots", ""]
    if not plots:
        parts += ["None.", ""]
    for dataset in results.datasets:
        mine = [(caption, path) for d, caption, path in plots if d == dataset]
        if not mine:
            continue
        parts += [f"### {dataset}", ""]
        for caption, path in mine:
            parts += [f"![{caption}]({path.relative_to(out_dir).as_posix()})", ""]
    return "\n".join(parts).rstrip("\n") + "\n"


def _failures_in_order(results: AnalysisResults, methods: list[str]) -> pd.DataFrame:
    """Failures of the shown methods, sorted by dataset/method display order, seed, reason."""
    f = results.failures
    cols = ["dataset", "method", "seed", "reason"]
    if not len(f):
        return pd.DataFrame(columns=cols)
    d_rank = {d: i for i, d in enumerate(results.datasets)}
    m_rank = {m: i for i, m in enumerate(methods)}
    f = f.loc[f["method"].isin(m_rank), cols].copy()
    f["_d"] = f["dataset"].map(lambda d: d_rank.get(d, len(d_rank)))
    f["_m"] = f["method"].map(m_rank)
    f = f.sort_values(["_d", "dataset", "_m", "seed", "reason"], kind="stable")
    return f[cols].reset_index(drop=True)
