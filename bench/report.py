"""Report: :class:`~bench.analysis.AnalysisResults` -> tables, plots and one README.

Everything here is rendering; no metric of a table is computed here (the numbers come
from ``results.metrics``).  The plots draw curves from the stored predictions with the
same functions the metrics use (``bench.metrics.calibration_bins`` and
``risk_coverage_curve``).

Layout written under ``out_dir``::

    tables/{in_distribution,shift,ood}.{md,tex,csv}
    plots/reliability_<dataset>_<method>.png
    plots/risk_coverage_<dataset>.png
    plots/ood_hist_<dataset>_<method>.png
    README.md

Determinism: rows and columns follow the display orders of the results (datasets,
methods, splits) and of :data:`TABLES`; per-seed values are sorted by seed before they
are averaged, so the same results give byte-identical tables and README.  PNGs are
written without a software/date stamp from fixed-size figures.

Imports: numpy, pandas, matplotlib (Agg canvas, no pyplot), tabulate and the stdlib only;
never torch or ``methods/``.  Files are written atomically (``bench.store``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import matplotlib
import matplotlib.style
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tabulate import tabulate

from bench.errors import ConfigError
from bench.metrics import aurc, calibration_bins, ece, risk_coverage_curve
from bench.store import atomic_write_text

if TYPE_CHECKING:
    from bench.analysis import AnalysisResults

__all__ = ["MetricSpec", "TableSpec", "METRICS", "TABLES", "FORMATS", "write_report"]


# --------------------------------------------------------------------------------------
# Display spec: the one place that says how each metric is shown and where.
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricSpec:
    """How a raw metric is displayed: ``label (unit)``, multiplied by ``scale``."""

    label: str
    unit: str  # "%" or "x<factor>"; appears in the column header
    scale: float
    higher_is_better: bool

    @property
    def header(self) -> str:
        return f"{self.label} ({self.unit})"


@dataclass(frozen=True)
class TableSpec:
    """One table: which splits give its rows and which metrics (in order) its columns."""

    name: str
    title: str
    split_prefix: str  # "test" (exact) or "shift/" / "ood/" (prefix)
    metrics: tuple[str, ...]

    def selects(self, split: str) -> bool:
        if self.split_prefix.endswith("/"):
            return split.startswith(self.split_prefix)
        return split == self.split_prefix

    @property
    def per_split(self) -> bool:
        """Whether rows carry a split column (and "best" is judged per split)."""
        return self.split_prefix.endswith("/")


# Scales as in KEP-SVGP Table 1 (reference/metrics.md section 8).
METRICS: dict[str, MetricSpec] = {
    "accuracy": MetricSpec("ACC", "%", 100.0, True),
    "aurc": MetricSpec("AURC", "x1000", 1000.0, False),
    "failure_auroc": MetricSpec("AUROC", "%", 100.0, True),
    "failure_fpr95": MetricSpec("FPR95", "%", 100.0, False),
    "ece": MetricSpec("ECE", "%", 100.0, False),
    "nll": MetricSpec("NLL", "x10", 10.0, False),
    "brier": MetricSpec("Brier", "x100", 100.0, False),
    "eaurc": MetricSpec("E-AURC", "x1000", 1000.0, False),
    "ood_auroc": MetricSpec("AUROC", "%", 100.0, True),
    "ood_aupr_in": MetricSpec("AUPR-In", "%", 100.0, True),
    "ood_aupr_out": MetricSpec("AUPR-Out", "%", 100.0, True),
    "ood_fpr95": MetricSpec("FPR95", "%", 100.0, False),
}

TABLES: tuple[TableSpec, ...] = (
    TableSpec(
        "in_distribution",
        "In-distribution (test split)",
        "test",
        ("accuracy", "aurc", "failure_auroc", "failure_fpr95", "ece", "nll", "brier", "eaurc"),
    ),
    TableSpec(
        "shift",
        "Distribution shift (shift/<corruption>/<severity> splits)",
        "shift/",
        ("accuracy", "ece", "nll", "brier", "aurc", "failure_auroc"),
    ),
    TableSpec(
        "ood",
        "Out-of-distribution detection (test split = in-distribution)",
        "ood/",
        ("ood_auroc", "ood_aupr_in", "ood_aupr_out", "ood_fpr95"),
    ),
)

FORMATS = ("md", "tex", "csv")

NA = "n/a"  # no finite value for any seed
FAILED = "failed"  # every seed of the (dataset, method) failed
CSV_FLOAT_FORMAT = "%.10g"

N_BINS = 15  # reliability diagram, same (lo, hi] bins as the faithful ECE
HIST_BINS = 40
FIGSIZE = (4.8, 4.0)
DPI = 100
_PLOT_RC = {"font.size": 9.0, "axes.titlesize": 9.0, "legend.fontsize": 7.5}


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------
def write_report(
    results: AnalysisResults,
    out_dir: Path,
    formats: tuple[str, ...] = FORMATS,
    methods: list[str] | None = None,
) -> list[Path]:
    """Write tables, plots and ``README.md`` under ``out_dir``; return the paths written.

    ``formats`` picks the table files (any of ``md``, ``tex``, ``csv``); the README always
    embeds the Markdown tables.  ``methods`` restricts the rendered methods (``None`` =
    all of ``results.methods``); rows keep the results' display order either way.
    Existing files in ``out_dir`` that this call does not write are left alone.
    """
    out_dir = Path(out_dir)
    unknown_fmt = sorted(set(formats) - set(FORMATS))
    if unknown_fmt:
        raise ConfigError(f"unknown report format(s) {unknown_fmt}; known: {list(FORMATS)}")
    shown = _select_methods(results, methods)
    _check_filenames(results.datasets, shown)

    values = _seed_values(results.metrics)
    seed_counts = _n_seeds(results.metrics)
    written: list[Path] = []

    tables_dir = out_dir / "tables"
    tables_dir.mkdir(parents=True, exist_ok=True)
    frames: dict[str, pd.DataFrame] = {}
    for spec in TABLES:
        rows = _table_rows(results, shown, spec)
        frame = _table_frame(spec, rows, values)
        frames[spec.name] = frame
        for fmt in FORMATS:  # fixed order, whatever order `formats` lists them in
            if fmt not in formats:
                continue
            if fmt == "md":
                text = _to_markdown(frame, spec)
            elif fmt == "tex":
                text = _to_latex(frame, spec)
            else:
                text = _to_csv(spec, rows, values, seed_counts)
            path = tables_dir / f"{spec.name}.{fmt}"
            atomic_write_text(path, text)
            written.append(path)

    plots = _write_plots(results, shown, out_dir / "plots")
    written.extend(path for _, _, path in plots)

    readme = out_dir / "README.md"
    atomic_write_text(readme, _readme(results, shown, frames, plots, out_dir))
    written.append(readme)
    return written


def sanitize(name: str) -> str:
    """A name usable in a file name: anything but ``[A-Za-z0-9_.-]`` becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


# --------------------------------------------------------------------------------------
# Rows and cells
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Row:
    dataset: str
    method: str
    split: str
    failed: bool  # no successful seed, at least one failure


def _select_methods(results: AnalysisResults, methods: list[str] | None) -> list[str]:
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


def _seed_values(metrics: pd.DataFrame) -> dict[tuple[str, str, str, str], np.ndarray]:
    """(dataset, method, split, metric) -> float values, sorted by seed."""
    frame = metrics.sort_values(
        ["dataset", "method", "split", "metric", "seed"], kind="stable"
    )
    out: dict[tuple[str, str, str, str], np.ndarray] = {}
    for key, group in frame.groupby(["dataset", "method", "split", "metric"], sort=True):
        out[tuple(str(k) for k in key)] = group["value"].to_numpy(dtype=np.float64)
    return out


def _n_seeds(metrics: pd.DataFrame) -> dict[tuple[str, str, str], int]:
    counts = metrics.groupby(["dataset", "method", "split"], sort=True)["seed"].nunique()
    return {tuple(str(k) for k in key): int(n) for key, n in counts.items()}


def _failure_keys(results: AnalysisResults) -> set[tuple[str, str]]:
    f = results.failures
    return {(str(d), str(m)) for d, m in zip(f["dataset"], f["method"])} if len(f) else set()


def _table_rows(results: AnalysisResults, methods: list[str], spec: TableSpec) -> list[_Row]:
    """Rows in display order: datasets, then methods, then the dataset's splits."""
    failed_pairs = _failure_keys(results)
    with_metrics = set(zip(results.metrics["dataset"], results.metrics["method"]))
    rows = []
    for dataset in results.datasets:
        splits = [s for s in results.splits.get(dataset, []) if spec.selects(s)]
        for method in methods:
            seeds = results.seeds.get((dataset, method), [])
            has_results = bool(seeds) or (dataset, method) in with_metrics
            failed = not has_results and (dataset, method) in failed_pairs
            if not (has_results or failed):
                continue  # this method was not run on this dataset
            rows.extend(_Row(dataset, method, split, failed) for split in splits)
    return rows


def _stats(vals: np.ndarray | None) -> tuple[float, float, int]:
    """(mean, std ddof=1, n) over the non-NaN per-seed values; NaNs where undefined."""
    if vals is None:
        return math.nan, math.nan, 0
    vals = vals[~np.isnan(vals)]
    n = int(vals.size)
    if n == 0:
        return math.nan, math.nan, 0
    std = float(np.std(vals, ddof=1)) if n > 1 else math.nan
    return float(np.mean(vals)), std, n


def _fmt(x: float) -> str:
    s = f"{x:.2f}"
    return "0.00" if s == "-0.00" else s


@dataclass(frozen=True)
class _Cell:
    text: str  # "mean ± std", "mean", "n/a" or "failed" (scaled, 2 decimals)
    mean: float  # scaled mean, NaN when none


def _cell(vals: np.ndarray | None, metric: MetricSpec, failed: bool) -> _Cell:
    if failed:
        return _Cell(FAILED, math.nan)
    scaled = None if vals is None else vals * metric.scale
    mean, std, n = _stats(scaled)
    if n == 0:
        return _Cell(NA, math.nan)
    if n == 1:
        return _Cell(_fmt(mean), mean)
    return _Cell(f"{_fmt(mean)} ± {_fmt(std)}", mean)


def _table_frame(
    spec: TableSpec, rows: list[_Row], values: dict[tuple[str, str, str, str], np.ndarray]
) -> pd.DataFrame:
    """Display frame: key columns (str) + one object column of :class:`_Cell` per metric."""
    records = []
    for row in rows:
        rec: dict[str, object] = {"Dataset": row.dataset, "Method": row.method}
        if spec.per_split:
            rec["Split"] = row.split
        for name in spec.metrics:
            key = (row.dataset, row.method, row.split, name)
            rec[METRICS[name].header] = _cell(values.get(key), METRICS[name], row.failed)
        records.append(rec)
    columns = ["Dataset", "Method"] + (["Split"] if spec.per_split else [])
    columns += [METRICS[name].header for name in spec.metrics]
    return pd.DataFrame.from_records(records, columns=columns)


def _key_columns(spec: TableSpec) -> list[str]:
    return ["Dataset", "Method"] + (["Split"] if spec.per_split else [])


def _best_mask(frame: pd.DataFrame, spec: TableSpec) -> np.ndarray:
    """Boolean [rows, metrics]: best mean per column within each dataset(/split) group.

    Ties at the displayed precision are all marked; a group with fewer than two finite
    values has no best.
    """
    mask = np.zeros((len(frame), len(spec.metrics)), dtype=bool)
    group_cols = ["Dataset", "Split"] if spec.per_split else ["Dataset"]
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, key in enumerate(zip(*(frame[c] for c in group_cols))):
        groups.setdefault(tuple(key), []).append(i)
    for j, name in enumerate(spec.metrics):
        col = frame[METRICS[name].header]
        pick = max if METRICS[name].higher_is_better else min
        for idx in groups.values():
            finite = [i for i in idx if math.isfinite(col.iloc[i].mean)]
            if len(finite) < 2:
                continue
            best = _fmt(pick(col.iloc[i].mean for i in finite))
            for i in finite:
                mask[i, j] = _fmt(col.iloc[i].mean) == best
    return mask


# --------------------------------------------------------------------------------------
# Table formats
# --------------------------------------------------------------------------------------
def _md_escape(text: str) -> str:
    return text.replace("|", r"\|").replace("\n", " ")


def _to_markdown(frame: pd.DataFrame, spec: TableSpec, drop: tuple[str, ...] = ()) -> str:
    """GitHub pipe table; ``drop`` removes key columns (the README drops ``Dataset``)."""
    keys = [c for c in _key_columns(spec) if c not in drop]
    headers = keys + [METRICS[m].header for m in spec.metrics]
    body = [
        [_md_escape(str(frame[c].iloc[i])) for c in keys]
        + [frame[METRICS[m].header].iloc[i].text for m in spec.metrics]
        for i in range(len(frame))
    ]
    colalign = ("left",) * len(keys) + ("right",) * len(spec.metrics)
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


def _tex_header(metric: MetricSpec) -> str:
    unit = metric.unit
    unit_tex = r"$\times$" + unit[1:] if unit.startswith("x") else tex_escape(unit)
    return f"{tex_escape(metric.label)} ({unit_tex})"


def _to_latex(frame: pd.DataFrame, spec: TableSpec) -> str:
    """booktabs tabular; best mean per column and dataset(/split) group in bold."""
    keys = _key_columns(spec)
    best = _best_mask(frame, spec)
    lines = [
        "% uqbench table '" + spec.name + "'; needs \\usepackage{booktabs}",
        r"\begin{tabular}{" + "l" * len(keys) + "r" * len(spec.metrics) + "}",
        r"\toprule",
        " & ".join([tex_escape(k) for k in keys] + [_tex_header(METRICS[m]) for m in spec.metrics])
        + r" \\",
        r"\midrule",
    ]
    previous = None
    for i in range(len(frame)):
        dataset = frame["Dataset"].iloc[i]
        if previous is not None and dataset != previous:
            lines.append(r"\midrule")
        previous = dataset
        cells = [tex_escape(str(frame[k].iloc[i])) for k in keys]
        for j, m in enumerate(spec.metrics):
            text = tex_escape(frame[METRICS[m].header].iloc[i].text)
            cells.append(r"\textbf{" + text + "}" if best[i, j] else text)
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def _to_csv(
    spec: TableSpec,
    rows: list[_Row],
    values: dict[tuple[str, str, str, str], np.ndarray],
    n_seeds: dict[tuple[str, str, str], int],
) -> str:
    """Raw (unscaled) ``<metric>_mean``/``<metric>_std`` per row, plus ``n_seeds``.

    ``n_seeds`` counts the seeds with metric rows for (dataset, method, split); 0 for a
    failed row.  A mean or std that is undefined (no finite value; std of one seed) is
    written as ``nan``.
    """
    records = []
    for row in rows:
        rec: dict[str, object] = {
            "dataset": row.dataset,
            "method": row.method,
            "split": row.split,
            "n_seeds": n_seeds.get((row.dataset, row.method, row.split), 0),
        }
        for name in spec.metrics:
            mean, std, _ = _stats(values.get((row.dataset, row.method, row.split, name)))
            rec[f"{name}_mean"], rec[f"{name}_std"] = mean, std
        records.append(rec)
    columns = ["dataset", "method", "split", "n_seeds"]
    columns += [f"{name}_{stat}" for name in spec.metrics for stat in ("mean", "std")]
    frame = pd.DataFrame.from_records(records, columns=columns)
    frame = frame.astype({"n_seeds": "int64"} | {c: "float64" for c in columns[4:]})
    return frame.to_csv(index=False, float_format=CSV_FLOAT_FORMAT, na_rep="nan",
                        lineterminator="\n")


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


def _write_plots(
    results: AnalysisResults, methods: list[str], plot_dir: Path
) -> list[tuple[str, str, Path]]:
    """Write every plot; return (dataset, caption, path) in display order.

    Per dataset: the reliability diagrams (methods in order), the risk-coverage plot,
    then the OOD histograms.

    A (dataset, method) without seeds (e.g. every seed failed) is skipped; the first
    seed is the smallest available one.
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
            out += hists
    return out


# --------------------------------------------------------------------------------------
# README
# --------------------------------------------------------------------------------------
_NOTE = (
    "Cells are mean ± std over seeds (std with ddof=1), with the scale in each column "
    "header; a single seed shows the mean only, `n/a` means the metric is undefined for "
    "every seed (e.g. AUROC when all predictions are correct), and `failed` means no seed "
    "of that method finished (see *Failed cells*). For ensembles the \"seeds\" are "
    "replicates (independent draws of member seeds). ACC is top-1 accuracy. ECE is "
    "top-label with 15 equal-width bins (lo, hi]. NLL is in nats, Brier is summed over "
    "classes. AURC is the Riemann mean of the selective risk over coverage i/n (confidence "
    "= max probability, MSP), E-AURC subtracts the analytic optimum. Misclassification "
    "detection (AUROC, FPR95 in the in-distribution and shift tables): correct prediction "
    "= positive, score = MSP, FPR95 = share of errors accepted at the ROC point with TPR "
    "closest to 95%. OOD detection: in-distribution (test split) = positive, score = MSP; "
    "AUPR-In/AUPR-Out are average precision with ID/OOD as the positive class; FPR95 = "
    "share of OOD samples accepted at the threshold that keeps 95% of ID samples. Machine-"
    "readable, unscaled values: `tables/*.csv`; LaTeX (booktabs, best in bold): "
    "`tables/*.tex`."
)


def _readme(
    results: AnalysisResults,
    methods: list[str],
    frames: dict[str, pd.DataFrame],
    plots: list[tuple[str, str, Path]],
    out_dir: Path,
) -> str:
    parts = [f"# uqbench report: {results.suite}", "", _NOTE, ""]
    for dataset in results.datasets:
        parts += [f"## {dataset}", ""]
        for spec in TABLES:
            frame = frames[spec.name]
            frame = frame[frame["Dataset"] == dataset].reset_index(drop=True)
            parts += [f"### {spec.title}", ""]
            if len(frame):
                parts.append(_to_markdown(frame, spec, drop=("Dataset",)))
            else:
                parts += ["Nothing to show (no such split, or no method ran on it).", ""]

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

