"""Report plots, drawn from per-sample predictions read through
:meth:`bench.store.catalog.Catalog.predictions` (``results.load_predictions``) with the
functions the metrics use (``calibration_bins``, ``risk_coverage_curve``), and from the
analysis files for the numbers the tables show: the AURC of the risk-coverage legends
(the summary's mean over seeds), the metric-vs-severity plots (the severity table) and
the training curves (the training logs, ``training``).
Every axis, legend and title names the metric it shows as the tables do
(:func:`bench.report.tables.shown_column`: CoLA's MCC where the accuracy would be).

PNGs are written without a software/date stamp from fixed-size figures on an explicit
Agg canvas (no pyplot, no global backend).
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib
import matplotlib.style
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bench.core import progress
from bench.data import SEVERITIES, is_ood
from bench.metrics import calibration_bins, ece, get_metric, risk_coverage_curve
from bench.report.rows import NO_STAT, VARIES, ResultsIndex, Stat, sample_count
from bench.report.tables import APPROXIMATE, Column, shown_column

if TYPE_CHECKING:
    from bench.analysis import AnalysisResults

N_BINS = 15  # reliability diagram, same (lo, hi] bins as the faithful ECE
HIST_BINS = 40
FIGSIZE = (4.8, 4.0)
RELIABILITY_FIGSIZE = (4.8, 5.8)  # the diagram over its bin-count histogram, the legend under both
SEVERITY_FIGSIZE = (4.8, 4.8)  # room for a two-line title and a severity axis label of up to five lines
TRAINING_FIGSIZE = (9.6, 4.0)  # validation NLL and training accuracy side by side
DPI = 100
_PLOT_RC = {"font.size": 9.0, "axes.titlesize": 9.0, "legend.fontsize": 7.5}


def sanitize(name: str) -> str:
    """A name usable in a file name: anything but ``[A-Za-z0-9_.-]`` becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _new_figure(figsize: tuple[float, float] = FIGSIZE, layout: str | None = None) -> Figure:
    fig = Figure(figsize=figsize, dpi=DPI, layout=layout)
    FigureCanvasAgg(fig)  # Agg canvas attached explicitly: no pyplot, no global backend
    return fig


def _save(fig: Figure, path: Path) -> None:
    if fig.get_layout_engine() is None:  # a figure made with a layout engine keeps its own
        fig.tight_layout()
    fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    fig.clear()
    progress.advance()  # the report's "plots" task


ACCURACY_COLOUR = "#4C72B0"
OVER_COLOUR = "#C44E52"  # confidence above accuracy
UNDER_COLOUR = "#E5AE38"  # accuracy above confidence (drawn over the accuracy bar: a colour apart from it)
SPARSE_SHARE = 0.01  # a reliability bin holding fewer than this share of the images is drawn in outline


def _plot_reliability(probs: np.ndarray, labels: np.ndarray, title: str, path: Path) -> None:
    """Accuracy per bin, and the gap between it and the bin's mean confidence coloured by
    its sign: over-confident (confidence above accuracy) and under-confident (accuracy
    above confidence) each in their own colour and legend entry, so neither passes for
    calibration.  A bin holding fewer than :data:`SPARSE_SHARE` of the images is drawn in
    outline only (its accuracy rests on a handful of images); under the diagram, a
    histogram of each bin's image count (as torchmetrics' and netcal's diagrams)."""
    stats = calibration_bins(probs, labels, n_bins=N_BINS)
    edges, width = stats["edges"], 1.0 / N_BINS
    count = stats["count"][:N_BINS]
    filled = count > 0
    left, acc, conf = edges[:-1][filled], stats["acc"][filled], stats["conf"][filled]
    full = count[filled] >= SPARSE_SHARE * len(labels)
    fig = _new_figure(RELIABILITY_FIGSIZE, layout="constrained")  # room for the legend under the axes
    ax, counts = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.bar(left[full], acc[full], width=width, align="edge", color=ACCURACY_COLOUR, edgecolor="black",
           linewidth=0.5, label="accuracy")
    if not full.all():
        ax.bar(left[~full], acc[~full], width=width, align="edge", fill=False, edgecolor=ACCURACY_COLOUR,
               linestyle="--", linewidth=0.8, label=f"accuracy, bin with < {SPARSE_SHARE:.0%} of images")
    for side, colour, hatch, label in ((conf > acc, OVER_COLOUR, "//", "over-confident (confidence > accuracy)"),
                                       (conf < acc, UNDER_COLOUR, "\\\\", "under-confident (accuracy > confidence)")):
        for drawn, alpha in ((side & full, 0.55), (side & ~full, 0.2)):
            if drawn.any():  # the gap, from the lower of accuracy and confidence up to the higher
                ax.bar(left[drawn], np.abs(conf - acc)[drawn], bottom=np.minimum(acc, conf)[drawn], width=width,
                       align="edge", color=colour, alpha=alpha, edgecolor=colour, hatch=hatch, linewidth=0.5,
                       label=label)
                label = "_nolegend_"  # one legend entry per side
    ax.plot([0, 1], [0, 1], "--", color="gray", linewidth=1.0, label="perfect calibration")
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy")
    ax.set_title(f"{title}\nECE = {100 * ece(probs, labels, n_bins=N_BINS):.2f}% ({N_BINS} bins)")
    fig.legend(loc="outside lower center", ncols=2, fontsize=6.5)  # under the axes: never over a bar
    counts.bar(edges[:-1], count, width=width, align="edge", color="#8C8C8C", edgecolor="black", linewidth=0.5)
    counts.set(xlim=(0, 1), xlabel="confidence (max probability)", ylabel=f"samples per bin\n(of {len(labels):,})")
    _save(fig, path)


def _plot_risk_coverage(curves: list[tuple[str, np.ndarray, np.ndarray, str]], title: str,
                        path: Path) -> None:
    """One curve per method, ``(method, coverage, risk, legend value)``."""
    fig = _new_figure()
    ax = fig.add_subplot()
    for method, coverage, risk, value in curves:
        ax.plot(coverage, risk, linewidth=1.2, label=f"{method} ({value})")
    ax.set(xlim=(0, 1), xlabel="coverage", ylabel="selective risk (error rate)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(loc="upper left")
    _save(fig, path)


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")  # one per line of a severity plot, in turn
DODGE = 0.5  # the severity plot's lines spread over this much of a severity step, so equal lines stay apart


def _plot_severity(lines: list[tuple[str, list[int], dict[int, Stat]]], col: Column, title: str, xlabel: str,
                   path: Path) -> None:
    """One line per method over severity (0 = the same samples clean), shaded band = the
    95% CI.  Each line has its own marker and is shifted sideways a little (the lines
    together span :data:`DODGE` of a step), so methods with equal values (msp and its
    temperature scaling in accuracy) do not hide each other."""
    fig = _new_figure(SEVERITY_FIGSIZE)
    ax = fig.add_subplot()
    step = DODGE / max(len(lines), 1)
    for i, (method, sevs, cells) in enumerate(lines):
        x = np.asarray(sevs, dtype=float) + (i - (len(lines) - 1) / 2) * step
        mean = np.array([cells[s].mean for s in sevs]) * col.scale
        lo = np.array([cells[s].ci_low for s in sevs]) * col.scale
        hi = np.array([cells[s].ci_high for s in sevs]) * col.scale
        (line,) = ax.plot(x, mean, marker=MARKERS[i % len(MARKERS)], markersize=4, linewidth=1.2, label=method)
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set(xlabel=xlabel, ylabel=col.header, xticks=[0, *SEVERITIES])
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


def _plot_training(lines: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]], title: str, path: Path) -> None:
    """Two panels against the epoch, one line per ``(label, epochs, val NLL, train accuracy)``:
    the validation NLL (nats) and the training accuracy (%)."""
    fig = _new_figure(TRAINING_FIGSIZE)
    nll, acc = fig.subplots(1, 2)
    for label, epochs, val_nll, train_acc in lines:
        nll.plot(epochs, val_nll, marker="o", markersize=3, linewidth=1.2, label=label)
        acc.plot(epochs, 100 * train_acc, marker="o", markersize=3, linewidth=1.2, label=label)
    nll.set(xlabel="epoch", ylabel="validation NLL (nats)", title="Validation NLL")
    acc.set(xlabel="epoch", ylabel="training accuracy (%)", title="Training accuracy")
    for ax in (nll, acc):
        ax.xaxis.get_major_locator().set_params(integer=True)
    acc.legend(loc="best")
    fig.suptitle(title)
    _save(fig, path)


def _training_lines(results: AnalysisResults, methods: list[str],
                    dataset: str) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """Per shown method with a training log of its own (a two-stage method's: its stage 2),
    ``(label, epochs, val NLL, train accuracy)``, each the mean over seeds per epoch."""
    log = results.training
    if not len(log):
        return []
    log = log[log["dataset"] == dataset]
    out = []
    for method in methods:
        mine = log[log["method"] == method]
        for stage, curve in mine.groupby("stage", sort=True):
            mean = curve.groupby("epoch", sort=True)[["val_nll", "train_acc"]].mean()
            label = f"{method} (stage {stage})" if stage > 1 else method
            out.append((label, mean.index.to_numpy(), mean["val_nll"].to_numpy(), mean["train_acc"].to_numpy()))
    return out


def _severity_lines(ix: ResultsIndex, methods: list[str], dataset: str,
                    metric: str) -> list[tuple[str, list[int], dict[int, Stat]]]:
    """(method, severities 0..5 present, severity -> stat) for methods with >= 2 points."""
    out = []
    for method in methods:
        by_sev = ix.by_severity.get((dataset, method), {})
        cells = {sev: stats[metric] for sev, stats in by_sev.items() if sev >= 0 and metric in stats}
        if len(cells) >= 2:
            out.append((method, sorted(cells), cells))
    return out


SMALL_SPLIT = 1000  # fewer samples per split than this: a binned calibration error's upward bias is large
LABEL_WIDTH = 60  # characters per line of an axis label, so it stays inside the figure


def _severity_xlabel(ix: ResultsIndex, methods: list[str], dataset: str, metric: str, col: Column) -> str:
    """The severity axis: what severity 0 is, with the samples per split where one count
    holds; for a calibration error on splits of fewer than :data:`SMALL_SPLIT` samples,
    that its value there is biased upward (a binned estimate), so severity 0 is not the
    summary's test value.  Wrapped to :data:`LABEL_WIDTH` characters a line."""
    counts = {sample_count(n) for m in methods for n in ix.severity_samples.get((dataset, m), {}).values()}
    each = f"; {next(iter(counts)):,} samples each" if len(counts) == 1 and VARIES not in counts else ""
    lines = [f"corruption severity (0 = the same samples, clean{each})"]
    sizes = [n for n in counts if n != VARIES]
    if get_metric(metric).kind == "calibration" and sizes and min(sizes) < SMALL_SPLIT:
        few = f"{next(iter(counts)):,}" if each else f"as few as {min(sizes):,}"
        lines.append(f"{col.label} on {few} samples per split is biased upward (binned): compare the severities "
                     f"with each other, not with the summary's {col.label} on the whole test split")
    return "\n".join(textwrap.fill(line, LABEL_WIDTH) for line in lines)


def _aurc_legend(ix: ResultsIndex, dataset: str, method: str, col: Column) -> str:
    """The risk-coverage legend's value: the summary table's AURC (mean over seeds)."""
    stat = ix.summary.get((dataset, method), {}).get(("test", ""), {}).get(col.key, NO_STAT)
    n = ix.summary_n.get((dataset, method), {}).get(("test", ""), 0)
    value = col.text(stat.mean) if np.isfinite(stat.mean) else "n/a"
    return f"{col.label}{' ' + col.unit if col.unit else ''} = {value}, mean of {n}"


def write_plots(
    results: AnalysisResults, methods: list[str], ix: ResultsIndex, severity_metrics: list[str], plot_dir: Path,
    run: str = "",
) -> list[tuple[str, str, Path]]:
    """Write every plot; return (dataset, caption, path) in display order.  Every title
    names the run (``run``; "": none) on its second line.

    Per dataset: the training curves (each method's own training log, mean over seeds), the
    reliability diagrams (methods in order, first seed), the risk-coverage
    plot (per method the mean of its seeds' curves, whose mean is the summary's AURC, shown
    in the legend), the metric-vs-severity plots, then the OOD histograms (first seed).  A
    (dataset, method) without seeds (e.g. every seed failed) is skipped; the first seed is
    the smallest available one.
    """
    plot_dir.mkdir(parents=True, exist_ok=True)
    out: list[tuple[str, str, Path]] = []

    def titled(subject: str) -> str:
        return f"{subject}\nrun {run}" if run else subject
    with matplotlib.style.context("default"), matplotlib.rc_context(_PLOT_RC):
        for dataset in results.datasets:
            splits = results.splits.get(dataset, [])
            ood_splits = [s for s in splits if is_ood(s)]
            aurc_col = shown_column("aurc", results.headlines, [dataset])
            reliability, hists, curves = [], [], []
            training = _training_lines(results, methods, dataset)
            if training:
                path = plot_dir / f"training_{sanitize(dataset)}.png"
                _plot_training(training, titled(f"Training: {dataset} (mean over seeds)"), path)
                out.append((dataset, f"Training curves: {dataset} (validation NLL and training accuracy per "
                                     "epoch, mean over seeds)", path))
            for method in methods:
                seeds = results.seeds.get((dataset, method), [])
                if not seeds or "test" not in splits:
                    continue
                seed = min(seeds)
                probs, labels = results.load_predictions(dataset, method, seed, "test")
                name = f"{dataset} / {method} (seed {seed}, test)"
                path = plot_dir / f"reliability_{sanitize(dataset)}_{sanitize(method)}.png"
                _plot_reliability(probs, labels, titled(f"Reliability: {name}"), path)
                reliability.append((dataset, f"Reliability diagram: {name}", path))
                risks = [risk_coverage_curve(*results.load_predictions(dataset, method, s, "test"))[1]
                         if s != seed else risk_coverage_curve(probs, labels)[1] for s in seeds]
                coverage = np.arange(1, len(labels) + 1) / len(labels)
                curves.append((method, coverage, np.mean(risks, axis=0), _aurc_legend(ix, dataset, method, aurc_col)))
                if ood_splits:
                    ood = [(s, results.load_predictions(dataset, method, seed, s)[0].max(axis=1))
                           for s in ood_splits]
                    path = plot_dir / f"ood_hist_{sanitize(dataset)}_{sanitize(method)}.png"
                    _plot_ood_hist(probs.max(axis=1), ood, titled(f"MSP: {name} vs OOD"), path)
                    hists.append((dataset, f"MSP histograms, test vs OOD: {name}", path))
            out += reliability
            if curves:
                path = plot_dir / f"risk_coverage_{sanitize(dataset)}.png"
                subject = f"Risk-coverage: {dataset} (test; curves and AURC: mean over seeds)"
                _plot_risk_coverage(curves, titled(subject), path)
                out.append((dataset, f"Risk-coverage curves: {dataset}", path))
            for metric in severity_metrics:
                lines = _severity_lines(ix, methods, dataset, metric)
                if lines:
                    col = shown_column(metric, results.headlines, [dataset])
                    shown = results.headlines.get(dataset, {}).get(metric, metric)
                    path = plot_dir / f"severity_{sanitize(dataset)}_{shown}.png"
                    band = f"{APPROXIMATE if col.interval else ''}95% CI"  # ≈: the metric's intervals are approximate
                    caption = f"{col.label} vs. corruption severity: {dataset} (mean over corruptions, {band} band)"
                    subject = f"{col.label} vs. corruption severity: {dataset}\n(mean over corruptions, band = {band})"
                    _plot_severity(lines, col, titled(subject), _severity_xlabel(ix, methods, dataset, metric, col),
                                   path)
                    out.append((dataset, caption, path))
            out += hists
    return out
