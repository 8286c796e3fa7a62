"""Report tables: which tables exist (:data:`TABLES`), their columns, and what each of
their cells shows (:class:`Table`).

Every number comes from the analysis files (``bench.analysis``): metric cells from
``summary`` (mean, std, CI, Holm-corrected verdict against the reference), the severity
table from ``severity``, corruption errors from ``corruption_errors``, costs from
``efficiency`` and the training logs' last epochs from ``convergence_summary``, through
the rows of :mod:`bench.report.rows`.  A metric's label, unit,
scale, direction and convention come from its registered :class:`bench.metrics.Metric`;
the default columns are named selections of the registry.  The Markdown, LaTeX and CSV
texts of a table are :mod:`bench.report.formats`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

import numpy as np

from bench.analysis import CONVERGENCE_FIELDS, EFFICIENCY_FIELDS
from bench.metrics import get_metric, selection
from bench.core.registry import METRICS
from bench.report.rows import NO_STAT, SEVERITY_STATS, SUMMARY_STATS, ResultsIndex, Row, Stat, table_rows

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
    name: str = ""  # what the CSV calls it where that is not ``key`` (another metric shown in its place)

    @property
    def csv_name(self) -> str:
        """The column's name in the CSV (``<csv_name>_<stat>``): the metric it shows."""
        return self.name or self.key

    @property
    def header(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label

    def text(self, raw: float, decimals: int | None = None, outward: int = 0) -> str:
        """The raw value, scaled and formatted (``-0.00`` shows as ``0.00``); ``outward``
        -1 / +1 rounds down / up instead of to the nearest (an interval's lower / upper
        bound, so the interval shown holds the one computed)."""
        d = self.decimals if decimals is None else decimals
        value = raw * self.scale
        if outward:
            units = round(value * 10**d, 6)  # float noise (99.98 stored as 99.97999...) is no unit
            value = (math.floor(units) if outward < 0 else math.ceil(units)) / 10**d
        s = f"{value:{',' if self.grouping else ''}.{d}f}"
        return s[1:] if re.fullmatch(r"-[0.,]+", s) else s

    def bounds(self, low: float, high: float) -> str:
        """``[lo, hi]`` of raw bounds, at the estimate's precision and rounded outward
        (``≈[lo, hi]`` where the metric's intervals are only approximate: :attr:`interval`)."""
        return f"{APPROXIMATE if self.interval else ''}[{self.text(low, outward=-1)}, {self.text(high, outward=1)}]"


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
                          convention="Wall-clock training time, mean over seeds; a two-stage method (e.g. CGPT "
                                     "fine-tuned from msp, last-layer Laplace on msp's network) includes its stage 1; "
                                     "a combinator (ensemble) adds up its members'."),
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
    "detector_fit_seconds": dict(label="OOD detector fit", unit="s", higher_is_better=False, decimals=3,
                                 convention="Wall-clock time to fit the feature-space OOD scores (every registered "
                                            "score with a fit: Mahalanobis, relative Mahalanobis, KNN, ViM, residual) "
                                            "on the cell's stored training features, summed over them, mean over "
                                            "seeds; measured once by the cell after prediction and kept in "
                                            "cell.json. n/a for methods without stored features."),
    "detector_score_seconds_per_1000": dict(label="OOD detector scoring / 1,000 images", unit="s",
                                            higher_is_better=False, decimals=3,
                                            convention="Wall-clock time of those fitted scores on the test split "
                                                       "per 1,000 images, summed over them, mean over seeds (KNN's "
                                                       "cost is here: its fit only normalises)."),
}
EFFICIENCY_TABLE_COLUMNS: tuple[Column, ...] = tuple(Column(field, scale=1.0, **_EFFICIENCY_LOOK[field])
                                                     for field in EFFICIENCY_FIELDS)
_LAST = ("the last epoch of the training log (of the stage: a two-stage method's stage 1 is its base's cell "
         "of the same seed; a post-hoc or derived method shows its base's), mean over seeds")
_CONVERGENCE_LOOK: dict[str, dict] = {  # a field of bench.analysis.CONVERGENCE_FIELDS -> how its column shows it
    "epochs": dict(label="Epochs", unit="", scale=1.0, decimals=0,
                   convention="Epochs in the training log of the stage (train_log.csv of the cell), mean over seeds."),
    "best_epoch": dict(label="Best val. epoch", unit="", scale=1.0, decimals=1,
                       convention="The epoch whose weights the cell kept (highest validation accuracy; cell.json's "
                                  "best_epoch), mean over seeds: out of Epochs."),
    "train_acc": dict(label="Train accuracy", unit="%", scale=100.0, decimals=2,
                      convention=f"Training accuracy of {_LAST}: over the epoch's (augmented) training batches in "
                                 "training mode, as the training loop counts it."),
    "train_loss": dict(label="Train loss", unit="", scale=1.0, decimals=4,
                       convention=f"Training objective per sample of {_LAST}: the cross-entropy plus the method's "
                                  "own terms (KL, KSVD, ...; their scale is the method's)."),
    "val_acc": dict(label="Val accuracy", unit="%", scale=100.0, decimals=2,
                    convention=f"Validation accuracy of {_LAST}."),
    "val_nll": dict(label="Val NLL", unit="nats", scale=1.0, decimals=4,
                    convention=f"Validation NLL (mean negative log-likelihood, nats) of {_LAST}."),
}
CONVERGENCE_TABLE_COLUMNS: tuple[Column, ...] = tuple(Column(field, higher_is_better=None, **_CONVERGENCE_LOOK[field])
                                                      for field in CONVERGENCE_FIELDS)


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
    ``source`` names the row builder (:data:`bench.report.rows.SOURCES`), ``csv_stats`` the raw statistics
    written per metric column to the CSV, ``marks`` whether Markdown/LaTeX cells show the CI
    and the significance mark (and the reference method is tagged).  ``cell`` is what a
    metric cell shows: ``"estimate"`` (mean ± std [CI] mark) or ``"seeds_needed"`` (the
    seeds per method a difference of the observed size to the reference would need).
    ``flags``: the Markdown/LaTeX method names carry :data:`IMPROVING_MARK` where a seed of
    the method (or of its base) was still improving when its training ended, or not learning.
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
    flags: bool = False  # a method still improving at the end of its training, or not learning, has IMPROVING_MARK


TABLES: tuple[TableSpec, ...] = (
    TableSpec("summary", "Summary (test split)", "test", (), False, "default",
              SUMMARY_STATS, marks=True, empty="No test split was evaluated.", flags=True),
    TableSpec("seeds_needed", "Seeds needed for the observed differences to be marked (test split, after Holm)",
              "test", (), False,
              "default", ("seeds_needed",), empty="No test split was evaluated.", cell="seeds_needed"),
    TableSpec("shift_severity", "Shift: metric vs. corruption severity (0 = the corrupted samples before "
              "corruption, all = every corruption split; Samples = samples per split)", "severity",
              (("Severity", "severity"), ("Samples", "n_samples")),
              False, "shift", SEVERITY_STATS, empty="No corruption split was evaluated."),
    TableSpec("shift_corruption", "Shift: per corruption at severity {severity}", "corruption",
              (("Corruption", "corruption"),), False, "shift", SUMMARY_STATS,
              extra=(CE_COLUMN,), empty="No corruption split at this severity was evaluated."),
    TableSpec("shift_other", "Shift: other shifts (no severity)", "other_shift",
              (("Split", "split"),), False, "shift", SUMMARY_STATS,
              empty="No shift split without a severity was evaluated."),
    TableSpec("shift_splits", "Shift: every shift split (the full corruption x severity grid)", "all_shift",
              (("Split", "split"),), False, "shift", ("mean", "std"),
              empty="No shift split was evaluated.", in_readme=False),
    TableSpec("ood", "OOD detection (test split = in-distribution)", "ood",
              (("Split", "split"), ("Score", "score")), True, "default", SUMMARY_STATS,
              marks=True, empty="No OOD split was evaluated."),
    TableSpec("efficiency", "Efficiency", "efficiency", (), None, "", (),
              extra=EFFICIENCY_TABLE_COLUMNS, empty="No efficiency record (cell.json) was found."),
    TableSpec("convergence", "Convergence (training logs: last epoch, mean over seeds)", "convergence",
              (("Stage", "stage"), ("Log", "log"), ("Still improving (seeds)", "still_improving")), None, "", (),
              extra=CONVERGENCE_TABLE_COLUMNS, empty="No training log was found.", flags=True),
)


NA = "n/a"  # no finite value for any seed
FAILED = "failed"  # every seed of the (dataset, method) failed
ERROR = "error"  # the metric raised on this split (analysis verdict "error"; the error is among the failures)
REF_TAG = " (ref)"
IMPROVING_MARK = " †"  # after a method's name: still improving at the end of training, or not learning (TableSpec.flags)
NOT_REACHED = "> 1000"  # seeds_needed: no seed count up to 1,000 reaches significance
APPROXIMATE = "≈"  # before the interval of a metric whose intervals are only approximate (Column.interval)


def validate_metrics(metrics: Sequence[str]) -> list[str]:
    """``metrics`` checked against the registry (:meth:`bench.core.registry.Registry.validate`:
    repeats dropped, order kept; an unknown name is a ConfigError naming the closest
    registered one, a metric's label such as "ACC" read as its name).  Called where names
    enter the report (``--metrics`` through :class:`bench.run.report.ReportOptions`,
    :func:`bench.report.write_report`); what it returns is passed on unchecked."""
    labels = {get_metric(m).label: m for m in METRICS.names()}
    return METRICS.validate(metrics, "--metrics", aliases=labels)


def shown_column(name: str, headlines: dict[str, dict[str, str]], datasets: Sequence[str]) -> Column:
    """The display column of metric ``name`` in a table or plot of ``datasets``: the metric's
    own (:func:`metric_column`) unless a data set shows another metric in its place
    (``headlines``: CoLA's MCC for accuracy).  Where every one of ``datasets`` shows the
    same other metric, the column is labelled, scaled, explained and named in the CSV as
    that metric (its key stays ``name``, under which :class:`~bench.report.rows.ResultsIndex`
    files it); where only some do, the joint label "ACC/MCC", the CSV name
    ``accuracy_or_mcc`` and a convention saying which data set shows what."""
    col = metric_column(name)
    swaps = {d: headlines[d][name] for d in datasets if name in headlines.get(d, {})}
    if not swaps:
        return col
    shown = sorted(set(swaps.values()))
    names = ", ".join(sorted(swaps))
    if len(shown) == 1 and len(swaps) == len(datasets):
        other = metric_column(shown[0])
        return replace(other, key=name, name=shown[0],
                       convention=f"{other.convention} For {names} this column takes the place of {col.label} "
                                  "(the data set's headline metric).")
    return replace(col, label="/".join([col.label] + [get_metric(t).label for t in shown]),
                   name="_or_".join([name, *shown]),
                   convention=f"{col.convention} For {names} this column shows "
                              + "; ".join(f"{get_metric(t).label}: {get_metric(t).convention}" for t in shown))


def _columns(spec: TableSpec, picked: list[str] | None, headlines: dict[str, dict[str, str]] | None = None,
             datasets: Sequence[str] = ()) -> list[Column]:
    """The table's metric columns, as :func:`shown_column` labels them for ``datasets``,
    then its fixed columns."""
    if spec.on_scores is None:
        names = []
    elif picked is None:
        names = selection(spec.selection, spec.on_scores)
    else:
        names = [m for m in picked if get_metric(m).on_scores == spec.on_scores]
    return [shown_column(name, headlines or {}, list(datasets)) for name in names] + list(spec.extra)


def dataset_columns(table: Table, headlines: dict[str, dict[str, str]], dataset: str) -> list[Column]:
    """``table``'s columns as labelled for one of its data sets (a README section)."""
    return [shown_column(c.key, headlines, [dataset]) for c in table.metric_columns] + list(table.spec.extra)


# --------------------------------------------------------------------------------------
# Cells
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Table:
    """One table as built for a report: its spec, columns and rows (:mod:`bench.report.rows`)
    and the reference method; what each cell shows (:meth:`value`) and which is best
    (:meth:`best`), whatever the format (:mod:`bench.report.formats`)."""

    spec: TableSpec
    columns: list[Column]
    rows: list[Row]
    reference: str
    flagged: frozenset[tuple[str, str]] = frozenset()  # (dataset, method) still improving or not learning in some seed

    @property
    def key_headers(self) -> list[str]:
        return ["Dataset", "Method"] + [h for h, _ in self.spec.keys]

    @property
    def metric_columns(self) -> list[Column]:
        return self.columns[: len(self.columns) - len(self.spec.extra)]

    def key_texts(self, row: Row) -> list[str]:
        method = row.method + (REF_TAG if self.spec.marks and row.method == self.reference else "")
        method += IMPROVING_MARK if self.spec.flags and (row.dataset, row.method) in self.flagged else ""
        return [row.dataset, method] + [_key_text(k) for k in row.keys]

    def value(self, row: Row, col: Column) -> tuple[str, str]:
        """(cell text, verdict) of one cell; the verdict is "" unless the table has marks.

        Text: ``failed``; ``error`` (the metric raised); ``n/a`` (no finite mean); ``mean``,
        ``mean ± std`` (std finite), then `` [lo, hi]`` (tables with marks, CI finite, at
        the mean's decimals, rounded outward: :meth:`Column.bounds`; ``≈[lo, hi]`` where the
        metric's intervals are only approximate, :attr:`Column.interval`).
        """
        if row.failed:
            return FAILED, ""
        stat = row.stats.get(col.key, NO_STAT)
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
            text += f" {col.bounds(stat.ci_low, stat.ci_high)}"
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
                means = {i: self.rows[i].stats.get(col.key, NO_STAT).mean for i in idx
                         if self.rows[i].stats.get(col.key, NO_STAT).verdict != ERROR}
                finite = [i for i, m in means.items() if math.isfinite(m)]
                if len(finite) < 2:
                    continue
                best = col.text(pick(means[i] for i in finite))
                for i in finite:
                    mask[i, j] = col.text(means[i]) == best
        return mask


def _seeds_text(stat: Stat, is_reference: bool) -> str:
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


def build_tables(results: AnalysisResults, methods: list[str], picked: list[str] | None,
                 index: ResultsIndex) -> list[Table]:
    """Every table that has columns for the picked metrics (``None`` = each table's
    selection), rows in display order; ``index`` = ``ResultsIndex.build(results, severity)``."""
    built = []
    for spec in TABLES:
        columns = _columns(spec, picked, results.headlines, results.datasets)
        if columns:
            rows = table_rows(results, methods, spec.source, len(spec.keys), index)
            built.append(Table(spec, columns, rows, results.reference, frozenset(index.flagged)))
    return built
