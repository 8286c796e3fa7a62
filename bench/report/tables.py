"""Report tables: which tables exist, their rows and columns, and their Markdown, LaTeX
(booktabs) and CSV renderings.

Rendering only: every number comes from the analysis files (``bench.analysis``): metric
cells from ``summary`` (mean, std, CI, Holm-corrected verdict against the reference),
the severity table from ``severity``, corruption errors from ``corruption_errors`` and
costs from ``efficiency``.  A metric's label, unit, scale, direction and convention come
from its registered :class:`bench.metrics.Metric`; the default columns are named
selections of the registry.  Rows follow the results' display orders (datasets, methods,
splits, scores, severities); nothing depends on the row order of the input frames.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np
import pandas as pd
from tabulate import tabulate

from bench.analysis import EFFICIENCY_COLUMNS, EFFICIENCY_FIELDS, SCORES
from bench.data import corruption_of, corruption_split, is_ood, is_shift
from bench.errors import ConfigError
from bench.metrics import get_metric, selection
from bench.registry import METRICS

if TYPE_CHECKING:
    from bench.analysis import AnalysisResults

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
    interval: str = ""  # where its intervals are only approximate (Metric.interval): shown "≈[lo, hi]"

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
    """The display column of a registered metric, from its :class:`bench.metrics.Metric`."""
    m = get_metric(name)
    return Column(name, m.label, m.unit, float(m.scale), bool(m.higher_is_better), m.convention,
                  interval=m.interval)


CE_COLUMN = Column(
    "ce", "CE", "%", 100.0, False,
    "Corruption error (Hendrycks & Dietterich): the method's top-1 error summed over the "
    "severities of one corruption, divided by the same sum for the reference method "
    "(100 = as good as the reference); the mCE row averages CE over the corruptions. It "
    "counts every severity, not only the one of the table.",
)
_EFFICIENCY_LOOK: dict[str, dict] = {  # a field of bench.analysis.EFFICIENCY_FIELDS -> how its column shows it
    "parameters": dict(label="Parameters", unit="", higher_is_better=False, decimals=0, grouping=True,
                       convention="Model parameters (cell.json); a combinator counts all its members'."),
    "train_seconds": dict(label="Train time", unit="s", higher_is_better=False, decimals=1,
                          convention="Wall-clock training time, mean over seeds; a combinator (ensemble) adds up "
                                     "its members'."),
    "predict_seconds_per_1000": dict(label="Predict time / 1,000 images", unit="s", higher_is_better=False,
                                     decimals=3,
                                     convention="Wall-clock prediction time per 1,000 images over every evaluated "
                                                "split, mean over seeds; a combinator adds up its members'."),
    "peak_memory_mb": dict(label="Peak memory", unit="MiB", higher_is_better=False, decimals=1,
                           convention="Peak memory during the cell, from cell.json (GPU: peak CUDA memory "
                                      "allocated; CPU: peak resident set of the process during the cell, which "
                                      "includes memory its allocator kept from earlier cells of the same run)."),
    "passes": dict(label="Passes", unit="", higher_is_better=None, decimals=0,
                   convention="Forward passes per prediction (Monte-Carlo samples; a combinator adds up its "
                              "members')."),
}
EFFICIENCY_TABLE_COLUMNS: tuple[Column, ...] = tuple(Column(field, scale=1.0, **_EFFICIENCY_LOOK[field])
                                                     for field in EFFICIENCY_FIELDS)




# --------------------------------------------------------------------------------------
# Tables: the one place that says which tables exist and what their columns are.
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TableSpec:
    """One table.

    Rows are ``(Dataset, Method, *keys)``; value columns are metric columns, then ``extra``.
    Metric columns are the registered metrics whose inputs fit the table (``on_scores``:
    True = OOD metrics, False = labelled-split metrics, None = no metric columns): the
    named ``selection`` (``bench.metrics.selection``) unless the caller picks metrics.
    ``source`` names the row builder (:data:`_SOURCES`), ``csv_stats`` the raw statistics
    written per metric column to the CSV, ``marks`` whether Markdown/LaTeX cells show the CI
    and the significance mark (and the reference method is tagged).  ``cell`` is what a
    metric cell shows: ``"estimate"`` (mean ± std [CI] mark) or ``"seeds_needed"`` (the
    seeds per method a difference of the observed size to the reference would need).
    """

    name: str
    title: str  # README heading; "{severity}" is filled in
    source: str
    keys: tuple[tuple[str, str], ...]  # (display header, CSV column) after Dataset, Method
    on_scores: bool | None
    selection: str
    csv_stats: tuple[str, ...] = ("mean", "std")
    extra: tuple[Column, ...] = ()
    marks: bool = False
    empty: str = "No rows."  # what the table says when it has none
    in_readme: bool = True  # False: written to tables/ only (too long to inline), linked from the README
    cell: str = "estimate"


_SUMMARY_STATS = ("mean", "std", "ci_low", "ci_high", "p_holm", "verdict", "test")
_SEVERITY_STATS = ("mean", "std", "ci_low", "ci_high")

TABLES: tuple[TableSpec, ...] = (
    TableSpec("summary", "Summary (test split)", "test", (), False, "default",
              _SUMMARY_STATS, marks=True, empty="No test split was evaluated."),
    TableSpec("seeds_needed", "Seeds needed for the observed differences (test split)", "test", (), False,
              "default", ("seeds_needed",), empty="No test split was evaluated.", cell="seeds_needed"),
    TableSpec("shift_severity", "Shift: metric vs. corruption severity (0 = clean test, "
              "all = every corruption split)", "severity", (("Severity", "severity"),),
              False, "shift", _SEVERITY_STATS, empty="No corruption split was evaluated."),
    TableSpec("shift_corruption", "Shift: per corruption at severity {severity}", "corruption",
              (("Corruption", "corruption"),), False, "shift", _SUMMARY_STATS,
              extra=(CE_COLUMN,), empty="No corruption split at this severity was evaluated."),
    TableSpec("shift_other", "Shift: other shifts (no severity)", "other_shift",
              (("Split", "split"),), False, "shift", _SUMMARY_STATS,
              empty="No shift split without a severity was evaluated."),
    TableSpec("shift_splits", "Shift: every shift split (the full corruption x severity grid)", "all_shift",
              (("Split", "split"),), False, "shift", ("mean", "std"),
              empty="No shift split was evaluated.", in_readme=False),
    TableSpec("ood", "OOD detection (test split = in-distribution)", "ood",
              (("Split", "split"), ("Score", "score")), True, "default", _SUMMARY_STATS,
              marks=True, empty="No OOD split was evaluated."),
    TableSpec("efficiency", "Efficiency", "efficiency", (), None, "", (),
              extra=EFFICIENCY_TABLE_COLUMNS, empty="No efficiency record (cell.json) was found."),
)

FORMATS = ("md", "tex", "csv")

NA = "n/a"  # no finite value for any seed
FAILED = "failed"  # every seed of the (dataset, method) failed
ERROR = "error"  # the metric raised on this split (analysis verdict "error"; the error is among the failures)
REF_TAG = " (ref)"
CI_DECIMALS = 1
MD_MARKS = {"better": " ▲", "worse": " ▼", "better (one run)": " △", "worse (one run)": " ▽"}
TEX_MARKS = {"better": r"$^\uparrow$", "worse": r"$^\downarrow$",
             "better (one run)": r"$^{(\uparrow)}$", "worse (one run)": r"$^{(\downarrow)}$"}
NOT_REACHED = "> 1000"  # seeds_needed: no seed count up to 1,000 reaches significance
APPROXIMATE = "≈"  # before the interval of a metric whose intervals are only approximate (Column.interval)
CSV_FLOAT_FORMAT = "%.10g"


def validate_metrics(metrics: Sequence[str]) -> list[str]:
    """``metrics`` checked against the registry, repeats dropped, order kept; any unknown
    name is a ConfigError that lists the registered ones.  Called where names enter the
    report (``--metrics`` through :class:`bench.report.suite.ReportOptions`,
    :func:`bench.report.write_report`); what it returns is passed on unchecked."""
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ConfigError(f"unknown metric(s) {unknown} for the report; known: {', '.join(METRICS.names())}")
    return list(dict.fromkeys(metrics))


def validate_formats(formats: Sequence[str]) -> tuple[str, ...]:
    """``formats`` checked against :data:`FORMATS`, repeats dropped, order kept; any unknown
    one is a ConfigError that lists them.  Called where formats enter the report (``--format``
    through :class:`bench.report.suite.ReportOptions`, :func:`bench.report.write_report`)."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ConfigError(f"unknown report format(s) {unknown}; known: {', '.join(FORMATS)}")
    return tuple(dict.fromkeys(formats))


def _columns(spec: TableSpec, picked: list[str] | None, headlines: dict[str, dict[str, str]] | None = None) -> list[Column]:
    """The table's columns; a metric that some dataset shows another metric in place of
    (``headlines``: CoLA's MCC in the accuracy column) gets the joint label "ACC/MCC"."""
    if spec.on_scores is None:
        names = []
    elif picked is None:
        names = selection(spec.selection, spec.on_scores)
    else:
        names = [m for m in picked if get_metric(m).on_scores == spec.on_scores]
    columns = []
    for name in names:
        col = metric_column(name)
        shown = sorted({swaps[name] for swaps in (headlines or {}).values() if name in swaps})
        if shown:
            datasets = ", ".join(sorted(d for d, swaps in headlines.items() if name in swaps))
            col = replace(col, label="/".join([col.label] + [get_metric(t).label for t in shown]),
                          convention=f"{col.convention} For {datasets} this column shows "
                                     + "; ".join(f"{get_metric(t).label}: {get_metric(t).convention}" for t in shown))
        columns.append(col)
    return columns + list(spec.extra)



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
    test: str = ""  # what the p-value accounts for (bench.analysis.TESTS)
    seeds_needed: float = math.nan


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
        """Index the result frames; for a dataset with ``headlines`` ({shown: in its place})
        the stats of the replacing metric are filed under the replaced one's column."""
        ix = cls({d: {s: i for i, s in enumerate(sp)} for d, sp in results.splits.items()}, severity)
        swaps = {d: ({v: k for k, v in sw.items()}, set(sw)) for d, sw in results.headlines.items()}

        def columns(dataset: str, metric: str) -> list[str]:
            into, out = swaps.get(dataset, ({}, set()))
            return ([into[metric]] if metric in into else []) + ([] if metric in out else [metric])

        ix.seeds = {k: len(v) for k, v in results.seeds.items()}
        for r in _records(results.summary, ["dataset", "method", "split", "score", "metric", "n_seeds",
                                            *_SUMMARY_STATS, "seeds_needed"]):
            key, rk = (r["dataset"], r["method"]), (r["split"], "" if pd.isna(r["score"]) else str(r["score"]))
            for col in columns(r["dataset"], r["metric"]):
                ix.summary.setdefault(key, {}).setdefault(rk, {})[col] = _stat(r)
            n = ix.summary_n.setdefault(key, {})
            n[rk] = max(n.get(rk, 0), _int(r["n_seeds"]))
        for r in _records(results.severity, ["dataset", "method", "severity", "metric", "n_seeds",
                                             *_SEVERITY_STATS]):
            key, sev = (r["dataset"], r["method"]), int(r["severity"])
            for col in columns(r["dataset"], r["metric"]):
                ix.by_severity.setdefault(key, {}).setdefault(sev, {})[col] = _stat(r)
            n = ix.severity_n.setdefault(key, {})
            n[sev] = max(n.get(sev, 0), _int(r["n_seeds"]))
        for r in _records(results.corruption_errors, ["dataset", "method", "corruption", "ce"]):
            ix.ce.setdefault((r["dataset"], r["method"]), {})[r["corruption"]] = _float(r["ce"])
        for r in _records(results.efficiency, EFFICIENCY_COLUMNS):
            ix.efficiency[(r["dataset"], r["method"])] = {k: _float(r[k]) for k in EFFICIENCY_FIELDS}
        return ix

    def split_key(self, dataset: str, split: str) -> tuple:
        rank = self.split_rank.get(dataset, {})
        return (rank.get(split, len(rank)), split)


def _text(x) -> str:
    return "" if x is None or pd.isna(x) else str(x)


def _stat(record: dict) -> _Stat:
    return _Stat(*(_float(record.get(s)) for s in ("mean", "std", "ci_low", "ci_high", "p_holm")),
                 verdict=_text(record.get("verdict")), test=_text(record.get("test")),
                 seeds_needed=_float(record.get("seeds_needed")))


def _score_key(score: str) -> tuple:
    """OOD scores in the analysis' order (:data:`bench.analysis.SCORES`), any other after them, sorted."""
    return (SCORES.index(score) if score in SCORES else len(SCORES), score)


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
        return (split,) if is_shift(split) and corruption_of(split) is None and not score else None

    return _summary_rows(ix, dataset, method, select)


def _rows_all_shift(ix: _Index, dataset: str, method: str) -> list[_Row]:
    return _summary_rows(ix, dataset, method, lambda split, score: (split,) if is_shift(split) and not score else None)


def _rows_ood(ix: _Index, dataset: str, method: str) -> list[_Row]:
    return _summary_rows(ix, dataset, method, lambda split, score: (split, score) if is_ood(split) else None)


def _rows_corruption(ix: _Index, dataset: str, method: str) -> list[_Row]:
    """Corruptions at the chosen severity (plus CE), then the method's mCE row."""

    def select(split: str, score: str) -> tuple | None:
        cs = corruption_of(split)
        return (cs[0],) if cs and cs[1] == ix.severity and not score else None

    rows = _summary_rows(ix, dataset, method, select)
    ce = ix.ce.get((dataset, method), {})
    seen = {r.keys[0] for r in rows}
    order = {c: ix.split_key(dataset, corruption_split(c, ix.severity)) for c in ce}
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

        Text: ``failed``; ``error`` (the metric raised); ``n/a`` (no finite mean); ``mean``,
        ``mean ± std`` (std finite), then `` [lo, hi]`` (tables with marks, CI finite,
        :data:`CI_DECIMALS` decimals; ``≈[lo, hi]`` where the metric's intervals are only
        approximate, :attr:`Column.interval`).
        """
        if row.failed:
            return FAILED, ""
        stat = row.stats.get(col.key, _NONE)
        if stat.verdict == ERROR:
            return ERROR, ""
        if self.spec.cell == "seeds_needed":
            return _seeds_text(stat, row.method == self.reference), ""
        if not math.isfinite(stat.mean):
            return ("" if row.partial and col.key not in row.stats else NA), ""
        text = col.text(stat.mean)
        if math.isfinite(stat.std):
            text += f" ± {col.text(stat.std)}"
        if not self.spec.marks:
            return text, ""
        if math.isfinite(stat.ci_low) and math.isfinite(stat.ci_high):
            text += f" {APPROXIMATE if col.interval else ''}[{col.text(stat.ci_low, CI_DECIMALS)}, " \
                    f"{col.text(stat.ci_high, CI_DECIMALS)}]"
        return text, stat.verdict

    def best(self) -> np.ndarray:
        """Boolean [rows, columns]: best mean per column within each group of rows.

        A group is the rows sharing dataset and every key but the method (dataset /
        split / score / severity / corruption).  Ties at the displayed precision are all
        marked; a group with fewer than two finite values, or a column without a
        direction, has no best.
        """
        mask = np.zeros((len(self.rows), len(self.columns)), dtype=bool)
        if self.spec.cell != "estimate":
            return mask
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(self.rows):
            if not row.failed:
                groups.setdefault((row.dataset, *row.keys), []).append(i)
        for j, col in enumerate(self.columns):
            if col.higher_is_better is None:
                continue
            pick = max if col.higher_is_better else min
            for idx in groups.values():
                means = {i: self.rows[i].stats.get(col.key, _NONE).mean for i in idx
                         if self.rows[i].stats.get(col.key, _NONE).verdict != ERROR}
                finite = [i for i, m in means.items() if math.isfinite(m)]
                if len(finite) < 2:
                    continue
                best = col.text(pick(means[i] for i in finite))
                for i in finite:
                    mask[i, j] = col.text(means[i]) == best
        return mask


def _seeds_text(stat: _Stat, is_reference: bool) -> str:
    """A ``seeds_needed`` cell: ``ref``, ``n/a`` (undefined, or a side with one run), the
    count, or :data:`NOT_REACHED`."""
    if is_reference:
        return "ref"
    if math.isnan(stat.seeds_needed):
        return NA
    return NOT_REACHED if math.isinf(stat.seeds_needed) else str(int(stat.seeds_needed))


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
    """Escape LaTeX special characters; ``±`` and ``≈`` become ``$\\pm$`` and ``$\\approx$``."""
    out = "".join(_TEX_SPECIAL.get(ch, ch) for ch in text)
    return out.replace("±", r"$\pm$").replace("≈", r"$\approx$")


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
    floats = [c for c in values if not c.endswith(("_verdict", "_test"))]
    frame = frame.astype({"n_seeds": "int64"} | {c: "float64" for c in floats})
    return frame.to_csv(index=False, float_format=CSV_FLOAT_FORMAT, na_rep="nan", lineterminator="\n")


_RENDERERS: dict[str, Callable[[_Table], str]] = {"md": _to_markdown, "tex": _to_latex, "csv": _to_csv}


def build_tables(results: AnalysisResults, methods: list[str], picked: list[str] | None,
                 index: _Index) -> list[_Table]:
    """Every table that has columns for the picked metrics (``None`` = each table's
    selection), rows in display order; ``index`` = ``_Index.build(results, severity)``."""
    built = []
    for spec in TABLES:
        columns = _columns(spec, picked, results.headlines)
        if columns:
            built.append(_Table(spec, columns, _table_rows(results, methods, spec, index), results.reference))
    return built


def render(table: _Table, fmt: str) -> str:
    """One table as ``md``, ``tex`` or ``csv`` text."""
    return _RENDERERS[fmt](table)

