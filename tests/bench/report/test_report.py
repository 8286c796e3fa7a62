"""Tests for bench.report on a synthetic AnalysisResults (no store, no model).

The builder fills every field of the analysis contract (``summary`` with CIs and
verdicts, ``severity``, ``corruption_errors``, ``efficiency``); expected cell texts are
computed here from those inputs with the paper's scales written out independently of
``bench.report`` and the metric registry.
"""
from __future__ import annotations

import re
import zlib
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from dataclasses import replace
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes

import bench.report.plots as report_mod  # the drawing functions the fast_plots fixture skips
from bench.analysis import AnalysisResults
from bench.core.errors import ConfigError
from bench.metrics import calibration_bins, ece, get_metric, risk_coverage_curve
from bench.report import sanitize, write_report
from bench.report.rows import Row, Stat
from bench.report.tables import TABLES, Table, metric_column

DATASETS = ["toy_a", "toy b&c"]  # the second name needs escaping / sanitising
METHODS = ["msp", "mc_dropout", "broken"]  # "broken": every seed failed on toy_a
REFERENCE = "msp"
SEEDS = [0, 1, 2]
CORRUPTIONS = ["shift/gaussian_noise/1", "shift/gaussian_noise/5", "shift/contrast/5"]
SPLITS = ["test", *CORRUPTIONS, "shift/digits_box", "ood/svhn"]
CLASSIFICATION = ["accuracy", "ece", "ece_debiased", "nll", "brier", "aurc", "eaurc", "failure_auroc",
                  "failure_fpr95", "failure_aupr_success", "failure_aupr_error"]
OOD = ["ood_auroc", "ood_aupr_in", "ood_aupr_out", "ood_fpr95"]
FAIL_REASON = "NonFiniteLoss: loss became nan at epoch 3"
TABLE_NAMES = ["summary", "seeds_needed", "shift_severity", "shift_corruption", "shift_other", "shift_splits", "ood", "efficiency",
               "convergence"]

# hand-picked values the assertions check against
ACC = {("toy_a", "msp"): [0.80, 0.82, 0.84], ("toy_a", "mc_dropout"): [0.85, 0.86, 0.87]}
CI_BELOW, CI_ABOVE = 0.0123, 0.0234  # synthetic CI: [mean - below, mean + above]
VERDICTS = {  # (dataset, method, split, metric, score) -> verdict; the rest: "" (or "ref")
    ("toy_a", "mc_dropout", "test", "accuracy", ""): "better",
    ("toy_a", "mc_dropout", "test", "ece", ""): "worse",
    ("toy_a", "mc_dropout", "ood/svhn", "ood_auroc", "entropy"): "better",
}
SEEDS_NEEDED = {  # (dataset, method, split, metric, score) -> seeds per method; the rest: NaN
    ("toy_a", "mc_dropout", "test", "accuracy", ""): 4.0,
    ("toy_a", "mc_dropout", "test", "ece", ""): float("inf"),
}
SAMPLES_PER_SPLIT = 50  # the severity table's image count of every split (severity 0: their clean originals)
CE = {"msp": {"gaussian_noise": 1.0, "contrast": 1.0, "mCE": 1.0},
      "mc_dropout": {"gaussian_noise": 0.8, "contrast": 0.9, "mCE": 0.85},
      "broken": {"gaussian_noise": 1.1, "contrast": 1.3, "mCE": 1.2}}
EFFICIENCY = {  # parameters, train_seconds, predict_seconds_per_1000, peak_memory_mb, passes, detector fit, scoring
    "msp": (1234567, 12.34, 0.4567, 512.0, 1, 0.01234, 2.5),
    "mc_dropout": (1234567, 15.0, 4.5678, 600.25, 10, float("nan"), float("nan")),
    "broken": (99, 1.0, 0.001, 10.0, 1, float("nan"), float("nan")),
}
# per (dataset, method): each training stage as the convergence summary gives it, (stage, source,
# n_seeds, n_flagged, n_unjudged, unjudged, epochs, best_epoch, train_acc, train_loss, val_acc, val_nll);
# the first n_flagged seeds are still improving (none not learning unless _convergence is told), the next
# n_unjudged not judged: only toy b&c's mc_dropout is marked
CONVERGENCE = {
    ("toy_a", "msp"): [(1, "msp", 3, 0, 0, "", 4, 3.0, 0.991, 0.05, 0.9, 0.35)],
    ("toy_a", "mc_dropout"): [(1, "mc_dropout", 3, 0, 0, "", 4, 4.0, 0.95, 0.2, 0.88, 0.41)],
    ("toy b&c", "msp"): [(1, "msp", 3, 0, 3, "1 epoch", 1, 1.0, 0.5, 1.4, 0.45, 1.6)],
    ("toy b&c", "mc_dropout"): [(1, "msp", 3, 0, 3, "1 epoch", 1, 1.0, 0.5, 1.4, 0.45, 1.6),  # two stages
                                (2, "mc_dropout", 3, 1, 1, "no training log", 2, 1.5, 0.6, 1.2, 0.5, 1.5)],
    ("toy b&c", "broken"): [(1, "msp", 3, 0, 3, "1 epoch", 1, 1.0, 0.5, 1.4, 0.45, 1.6)],  # derived from msp
}
TRAINING_EPOCHS = {"toy_a": 4, "toy b&c": 2}  # the curves of every own log (toy b&c's mc_dropout: stage 2)

# scales of KEP-SVGP Table 1, written out here independently of bench.report
SCALES = {"accuracy": 100, "aurc": 1000, "failure_auroc": 100, "failure_fpr95": 100,
          "ece": 100, "ece_debiased": 100, "nll": 10, "brier": 100, "eaurc": 1000, "failure_aupr_success": 100,
          "failure_aupr_error": 100,
          "ood_auroc": 100, "ood_aupr_in": 100, "ood_aupr_out": 100, "ood_fpr95": 100}
SUMMARY_HEADERS = [("ACC (%)", "accuracy"), ("AURC (x1000)", "aurc"), ("AUROC (%)", "failure_auroc"),
                   ("FPR95 (%)", "failure_fpr95"), ("ECE (%)", "ece"), ("ECE-debiased (%)", "ece_debiased"),
                   ("NLL (x10)", "nll"),
                   ("Brier (x100)", "brier"), ("E-AURC (x1000)", "eaurc"),
                   ("AUPR-S (%)", "failure_aupr_success"), ("AUPR-E (%)", "failure_aupr_error")]
SHIFT_HEADERS = [("ACC (%)", "accuracy"), ("ECE (%)", "ece"), ("ECE-debiased (%)", "ece_debiased"),
                 ("NLL (x10)", "nll"),
                 ("Brier (x100)", "brier"), ("AURC (x1000)", "aurc"), ("AUROC (%)", "failure_auroc")]
OOD_HEADERS = [("AUROC (%)", "ood_auroc"), ("AUPR-In (%)", "ood_aupr_in"),
               ("AUPR-Out (%)", "ood_aupr_out"), ("FPR95 (%)", "ood_fpr95")]


def ran(dataset: str, method: str) -> bool:
    return (dataset, method) != ("toy_a", "broken")


def scores_of(method: str) -> list[str]:
    return ["msp", "entropy", "mutual_info"] if method == "mc_dropout" else ["msp", "entropy"]


def _metric_value(rng: np.random.Generator, dataset: str, method: str, split: str,
                  metric: str, seed: int) -> float:
    if split == "test" and (dataset, method) in ACC and metric == "accuracy":
        return ACC[(dataset, method)][seed]
    if (dataset, method, split, metric) == ("toy_a", "msp", "test", "failure_auroc"):
        return float("nan")  # undefined for every seed
    return float(rng.uniform(0.01, 0.99))


def _metrics() -> pd.DataFrame:
    rng = np.random.default_rng(1234)
    rows = []
    for dataset in DATASETS:
        for method in METHODS:
            if not ran(dataset, method):
                continue
            for seed in SEEDS:
                for split in SPLITS:
                    if split.startswith("ood/"):
                        for score in scores_of(method):
                            for metric in OOD:
                                rows.append((dataset, method, seed, split, metric, score,
                                             float(rng.uniform(0.01, 0.99))))
                    else:
                        for metric in CLASSIFICATION:
                            value = _metric_value(rng, dataset, method, split, metric, seed)
                            rows.append((dataset, method, seed, split, metric, "", value))
    return pd.DataFrame(rows, columns=["dataset", "method", "seed", "split", "metric", "score", "value"])


def _summary(metrics: pd.DataFrame) -> pd.DataFrame:
    keys = ["dataset", "method", "split", "metric", "score"]
    g = metrics.groupby(keys, sort=False)["value"]
    out = g.agg(n_seeds="count", mean="mean", std=lambda v: v.std(ddof=1)).reset_index()
    out["table"] = out["split"].map(lambda s: "in_distribution" if s == "test" else s.split("/")[0])
    out["ci_low"], out["ci_high"] = out["mean"] - CI_BELOW, out["mean"] + CI_ABOVE
    verdicts = [VERDICTS.get(k, "ref" if k[1] == REFERENCE else "")
                for k in out[keys].itertuples(index=False, name=None)]
    out["verdict"] = verdicts
    out["p_value"] = [np.nan if v == "ref" else 0.001 if v else 0.5 for v in verdicts]
    out["p_holm"] = out["p_value"] * 2
    out["test"] = ["" if v == "ref" else "seeds+samples" for v in verdicts]
    out["seeds_needed"] = [SEEDS_NEEDED.get(k, np.nan) for k in out[keys].itertuples(index=False, name=None)]
    out = out.sample(frac=1.0, random_state=3)  # the report must not rely on the row order
    return out.reset_index(drop=True)


def _severity() -> pd.DataFrame:
    rows = []
    for dataset in DATASETS:
        for method in METHODS:
            if not ran(dataset, method):
                continue
            bonus = {"msp": 0.0, "mc_dropout": 0.05, "broken": -0.1}[method]
            for sev in (0, 1, 5, -1):
                level = 2.5 if sev < 0 else sev
                for metric in ["accuracy", "ece", "ece_debiased", "nll", "brier", "aurc", "failure_auroc"]:
                    mean = 0.9 - 0.08 * level + bonus if metric == "accuracy" else 0.05 + 0.04 * level
                    rows.append((dataset, method, sev, metric, 3, SAMPLES_PER_SPLIT, mean, 0.02, mean - 0.03,
                                 mean + 0.04))
    cols = ["dataset", "method", "severity", "metric", "n_seeds", "n_samples", "mean", "std", "ci_low", "ci_high"]
    return pd.DataFrame(rows[::-1], columns=cols)  # reversed: order must not matter


def _corruption_errors() -> pd.DataFrame:
    rows = [(d, m, c, ce) for d in DATASETS for m in METHODS if ran(d, m) for c, ce in CE[m].items()]
    return pd.DataFrame(rows, columns=["dataset", "method", "corruption", "ce"])


def _efficiency() -> pd.DataFrame:
    rows = [(d, m, *EFFICIENCY[m]) for d in DATASETS for m in METHODS if ran(d, m)]
    return pd.DataFrame(rows, columns=["dataset", "method", "parameters", "train_seconds",
                                       "predict_seconds_per_1000", "peak_memory_mb", "passes",
                                       "detector_fit_seconds", "detector_score_seconds_per_1000"])


def _convergence(given: dict | None = None, not_learning: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per cell and stage, per method and stage) as analysis writes them, from ``given``
    (default :data:`CONVERGENCE`); ``not_learning``: (dataset, method, stage) -> how many of
    its flagged seeds (the first ones) are not learning rather than still improving."""
    fields = ["epochs", "best_epoch", "train_acc", "train_loss", "val_acc", "val_nll"]
    cells, summary = [], []
    for (dataset, method), stages in (CONVERGENCE if given is None else given).items():
        for stage, source, n, flagged, unjudged, why, *values in stages:
            stuck = (not_learning or {}).get((dataset, method, stage), 0)
            summary.append((dataset, method, stage, source, n, flagged, stuck, unjudged, why, *values))
            for seed in SEEDS:
                verdict = ("not learning" if seed < stuck else "improving" if seed < flagged
                           else f"n/a: {why}" if seed < flagged + unjudged else "not improving")
                cells.append((dataset, method, seed, stage, source, *values, 1, 0.0, 0.0, 0.25, verdict))
    return (pd.DataFrame(cells, columns=["dataset", "method", "seed", "stage", "source", *fields, "window",
                                         "train_acc_rise", "val_nll_drop", "majority_share", "verdict"]),
            pd.DataFrame(summary, columns=["dataset", "method", "stage", "source", "n_seeds", "n_flagged",
                                           "n_not_learning", "n_unjudged", "unjudged", *fields]))


def training_value(dataset: str, method: str, seed: int, epoch: int) -> tuple[float, float]:
    """The synthetic training log's (train_acc, val_nll) of one epoch."""
    bonus = 0.05 if method == "mc_dropout" else 0.0
    return 0.5 + 0.1 * epoch + 0.01 * seed + bonus, 1.5 - 0.1 * epoch + 0.02 * seed - bonus


def _training() -> pd.DataFrame:
    rows = []
    for dataset, epochs in TRAINING_EPOCHS.items():
        for method in ("msp", "mc_dropout"):
            stage = 2 if (dataset, method) == ("toy b&c", "mc_dropout") else 1
            for seed in SEEDS:
                for epoch in range(1, epochs + 1):
                    acc, nll = training_value(dataset, method, seed, epoch)
                    rows.append((dataset, method, seed, stage, epoch, 1e-3, 1.0, acc, 0.8, nll, 0.1))
    return pd.DataFrame(rows, columns=["dataset", "method", "seed", "stage", "epoch", "lr", "train_loss", "train_acc",
                                       "val_acc", "val_nll", "seconds"])


def _load_predictions(dataset: str, method: str, seed: int, split: str):
    rng = np.random.default_rng(zlib.crc32(f"{dataset}|{method}|{seed}|{split}".encode()))
    n, k = 120, 4
    logits = rng.normal(size=(n, k)) * 2.0
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    if split.startswith("ood/"):
        return probs, np.full(n, -1, dtype=np.int64)
    labels = np.where(rng.uniform(size=n) < 0.7, probs.argmax(axis=1), rng.integers(0, k, n))
    return probs, labels.astype(np.int64)


def make_results() -> AnalysisResults:
    seeds = {(d, m): list(SEEDS) if ran(d, m) else [] for d in DATASETS for m in METHODS}
    failures = pd.DataFrame(
        [("toy_a", "broken", s, FAIL_REASON) for s in SEEDS],
        columns=["dataset", "method", "seed", "reason"],
    )
    metrics = _metrics()
    cells, convergence = _convergence()
    return AnalysisResults(
        suite="synthetic",
        metrics=metrics,
        datasets=list(DATASETS),
        methods=list(METHODS),
        splits={d: list(SPLITS) for d in DATASETS},
        seeds=seeds,
        failures=failures,
        load_predictions=_load_predictions,
        reference=REFERENCE,
        summary=_summary(metrics),
        severity=_severity(),
        corruption_errors=_corruption_errors(),
        efficiency=_efficiency(),
        training=_training(),
        convergence=cells,
        convergence_summary=convergence,
    )


@pytest.fixture(scope="module")
def results() -> AnalysisResults:
    return make_results()


@pytest.fixture(scope="module")
def report(results, tmp_path_factory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("report")
    return out, write_report(results, out)


DRAWERS = ("_plot_reliability", "_plot_risk_coverage", "_plot_severity", "_plot_ood_hist", "_plot_training")


@pytest.fixture
def fast_plots(monkeypatch) -> list[str]:
    """Skip the drawing (the slow part) in tests about tables; record the plot file names."""
    names: list[str] = []
    for name in DRAWERS:
        monkeypatch.setattr(report_mod, name, lambda *args: names.append(args[-1].name))
    return names


# ------------------------------------------------------------------------------------ helpers
def md_rows(path: Path) -> list[dict[str, str]]:
    """Parse a tabulate pipe table into dicts (header -> cell text)."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.startswith("|")]
    split = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    header, body = split[0], split[2:]
    return [dict(zip(header, row)) for row in body]


def find(rows: list[dict[str, str]], **keys: str) -> dict[str, str]:
    hits = [r for r in rows if all(r[k] == v for k, v in keys.items())]
    assert len(hits) == 1, (keys, hits)
    return hits[0]


def seed_values(results, dataset, method, split, metric, score="") -> list[float]:
    m = results.metrics
    sel = m[(m.dataset == dataset) & (m.method == method) & (m.split == split)
            & (m.metric == metric) & (m.score == score)].sort_values("seed")
    return sel["value"].tolist()


def mean_std(values: list[float], scale: float) -> str:
    v = np.asarray(values) * scale
    return f"{v.mean():.2f} ± {v.std(ddof=1):.2f}"


APPROXIMATE_INTERVALS = {"ece", "ece_debiased"}  # calibration errors: the report writes ≈[lo, hi]


def with_ci(values: list[float], scale: float, metric: str = "") -> str:
    """Expected summary/OOD cell without a mark: mean ± std [lo, hi] (the interval at the
    mean's 2 decimals, rounded outward), prefixed with ≈ for the calibration errors."""
    mean = float(np.mean(values))
    low, high = Decimal(repr((mean - CI_BELOW) * scale)), Decimal(repr((mean + CI_ABOVE) * scale))
    return (f"{mean_std(values, scale)} {'≈' if metric in APPROXIMATE_INTERVALS else ''}"
            f"[{low.quantize(Decimal('0.01'), ROUND_FLOOR)}, {high.quantize(Decimal('0.01'), ROUND_CEILING)}]")


def tex_lines(path: Path, n_keys: int) -> dict[str, list[str]]:
    """Data rows of a booktabs table keyed by their joined key cells -> value cells."""
    out = {}
    for ln in path.read_text(encoding="utf-8").splitlines():
        if " & " in ln and not ln.startswith("Dataset"):
            cells = ln.rstrip(" \\").split(" & ")
            out["/".join(cells[:n_keys])] = cells[n_keys:]
    return out


def tex(name: str) -> str:
    return name.replace("_", r"\_").replace("&", r"\&")


def readme_section(readme: str, heading: str) -> str:
    return readme.split(heading + "\n", 1)[1].split("\n## ", 1)[0]


# ------------------------------------------------------------------------------------ files
def test_every_expected_file_exists(report):
    out, written = report
    expected = {out / "README.md"}
    for table in TABLE_NAMES:
        expected |= {out / "tables" / f"{table}.{fmt}" for fmt in ("md", "tex", "csv")}
    for d in DATASETS:
        expected.add(out / "plots" / f"risk_coverage_{sanitize(d)}.png")
        expected.add(out / "plots" / f"training_{sanitize(d)}.png")
        for metric in ("accuracy", "ece", "ece_debiased", "nll"):
            expected.add(out / "plots" / f"severity_{sanitize(d)}_{metric}.png")
        for m in METHODS:
            if not ran(d, m):
                continue  # no successful seed -> nothing to plot
            expected.add(out / "plots" / f"reliability_{sanitize(d)}_{m}.png")
            expected.add(out / "plots" / f"ood_hist_{sanitize(d)}_{m}.png")
    assert set(written) == expected
    assert len(written) == len(set(written))
    assert all(p.is_file() for p in expected)
    assert not (out / "plots" / "reliability_toy_a_broken.png").exists()
    assert sanitize("toy b&c") == "toy_b_c"


# ------------------------------------------------------------------------------------ summary
def test_summary_cells_show_mean_std_ci_and_marks(report, results):
    out, _ = report
    rows = md_rows(out / "tables" / "summary.md")
    assert list(rows[0]) == ["Dataset", "Method"] + [h for h, _ in SUMMARY_HEADERS]
    acc = seed_values(results, "toy_a", "mc_dropout", "test", "accuracy")
    # ACC 86.00 ± 1.00, CI [86 - 1.23, 86 + 2.34], significantly better than the reference
    assert find(rows, Dataset="toy_a", Method="mc_dropout")["ACC (%)"] == "86.00 ± 1.00 [84.77, 88.34] ▲"
    assert with_ci(acc, 100) == "86.00 ± 1.00 [84.77, 88.34]"
    ece_vals = seed_values(results, "toy_a", "mc_dropout", "test", "ece")
    assert find(rows, Dataset="toy_a", Method="mc_dropout")["ECE (%)"] == with_ci(ece_vals, 100, "ece") + " ▼"
    assert "≈[" in find(rows, Dataset="toy_a", Method="mc_dropout")["ECE (%)"]  # approximate interval
    # no significant difference -> no mark
    nll = seed_values(results, "toy_a", "mc_dropout", "test", "nll")
    assert find(rows, Dataset="toy_a", Method="mc_dropout")["NLL (x10)"] == with_ci(nll, 10)
    # the reference row is tagged and never marked
    ref = find(rows, Dataset="toy_a", Method="msp (ref)")
    assert ref["ACC (%)"] == "82.00 ± 2.00 [80.77, 84.34]"
    assert not any(c.endswith(("▲", "▼")) for c in ref.values())
    assert {r["Method"] for r in rows} == {"msp (ref)", "mc_dropout", "mc_dropout †", "broken"}  # †: convergence


@pytest.mark.parametrize("mean,low,high,shown", [
    (0.99990, 0.99975, 1.0, "99.99 [99.97, 100.00]"),  # was "99.99 [100.0, 100.0]": outside its own interval
    (0.5, 0.4998, 0.5002, "50.00 [49.98, 50.02]"),  # bounds exactly at the precision stay (no float noise)
    (0.5, 0.49981, 0.50019, "50.00 [49.98, 50.02]"),  # else they round away from the estimate
])
def test_an_interval_is_shown_at_the_estimates_precision_rounded_outward(mean, low, high, shown):
    row = Row("d", "m", (), {"accuracy": Stat(mean=mean, ci_low=low, ci_high=high)}, 3)
    table = Table(TABLES[0], [metric_column("accuracy")], [row], reference="other")
    assert table.value(row, table.columns[0])[0] == shown


def test_summary_every_column_has_its_scale(report, results):
    out, _ = report
    rows = md_rows(out / "tables" / "summary.md")
    row = find(rows, Dataset="toy b&c", Method="mc_dropout †")
    for header, metric in SUMMARY_HEADERS:
        vals = seed_values(results, "toy b&c", "mc_dropout", "test", metric)
        assert row[header] == with_ci(vals, SCALES[metric], metric), header


def test_summary_csv_is_raw_with_ci_p_and_verdict(report, results):
    out, _ = report
    df = pd.read_csv(out / "tables" / "summary.csv", keep_default_na=False, na_values=["nan"])
    assert list(df.columns[:3]) == ["dataset", "method", "n_seeds"]
    assert list(df.columns[3:]) == [f"{metric}_{s}" for _, metric in SUMMARY_HEADERS
                                    for s in ("mean", "std", "ci_low", "ci_high", "p_holm", "verdict", "test")]
    row = df[(df.dataset == "toy_a") & (df.method == "mc_dropout")].iloc[0]
    assert row["accuracy_mean"] == pytest.approx(0.86, abs=1e-9)  # unscaled
    assert row["accuracy_std"] == pytest.approx(0.01, abs=1e-9)
    assert row["accuracy_ci_low"] == pytest.approx(0.86 - CI_BELOW, abs=1e-9)
    assert row["accuracy_ci_high"] == pytest.approx(0.86 + CI_ABOVE, abs=1e-9)
    assert row["accuracy_p_holm"] == pytest.approx(0.002)
    assert row["accuracy_verdict"] == "better" and row["ece_verdict"] == "worse"
    assert row["nll_verdict"] == "" and row["n_seeds"] == 3 and row["accuracy_test"] == "seeds+samples"
    ref = df[(df.dataset == "toy_a") & (df.method == "msp")].iloc[0]
    assert ref["accuracy_verdict"] == "ref" and np.isnan(ref["accuracy_p_holm"])
    assert np.isnan(ref["failure_auroc_mean"])
    broken = df[(df.dataset == "toy_a") & (df.method == "broken")].iloc[0]
    assert broken["n_seeds"] == 0 and np.isnan(broken["accuracy_mean"])


def test_seeds_needed_table_shows_counts_unreachable_and_undefined(report):
    out, _ = report
    rows = md_rows(out / "tables" / "seeds_needed.md")
    mc = find(rows, Dataset="toy_a", Method="mc_dropout")
    assert mc["ACC (%)"] == "4" and mc["ECE (%)"] == "> 1000" and mc["NLL (x10)"] == "n/a"
    assert set(list(find(rows, Dataset="toy_a", Method="msp").values())[2:]) == {"ref"}
    df = pd.read_csv(out / "tables" / "seeds_needed.csv", keep_default_na=False, na_values=["nan"])
    row = df[(df.dataset == "toy_a") & (df.method == "mc_dropout")].iloc[0]
    assert row["accuracy_seeds_needed"] == 4 and np.isinf(row["ece_seeds_needed"]) and np.isnan(row["nll_seeds_needed"])
    assert "\\textbf" not in (out / "tables" / "seeds_needed.tex").read_text(encoding="utf-8")  # no "best" count


def test_one_run_marks_are_hollow_and_the_seed_fixed_option_says_so(tmp_path, fast_plots):
    results = make_results()
    summary = results.summary.copy()
    one_run = (summary.dataset == "toy_a") & (summary.method == "mc_dropout") & (summary.split == "test")
    summary.loc[one_run & (summary.metric == "accuracy"), "verdict"] = "better (one run)"
    summary.loc[one_run & (summary.metric == "ece"), "verdict"] = "worse (one run)"
    results.summary = summary
    write_report(results, tmp_path / "a", ("md", "tex"))
    row = find(md_rows(tmp_path / "a" / "tables" / "summary.md"), Dataset="toy_a", Method="mc_dropout")
    assert row["ACC (%)"].endswith(" △") and row["ECE (%)"].endswith(" ▽")
    tex_row = tex_lines(tmp_path / "a" / "tables" / "summary.tex", 2)["toy\\_a/mc\\_dropout"]
    assert tex_row[0].endswith("$^{(\\uparrow)}$") and tex_row[4].endswith("$^{(\\downarrow)}$")
    readme = (tmp_path / "a" / "README.md").read_text(encoding="utf-8")
    assert "re-training both with new seeds" in readme
    results.significance = "samples_seeds_fixed"
    write_report(results, tmp_path / "b", ("md",))
    readme = (tmp_path / "b" / "README.md").read_text(encoding="utf-8")
    assert "trained seeds held fixed" in readme and "re-training both with new seeds" not in readme


def test_all_nan_metric_renders_na_and_failed_method_gets_failed_row(report):
    out, _ = report
    rows = md_rows(out / "tables" / "summary.md")
    assert find(rows, Dataset="toy_a", Method="msp (ref)")["AUROC (%)"] == "n/a"
    broken = find(rows, Dataset="toy_a", Method="broken")
    assert set(list(broken.values())[2:]) == {"failed"}
    assert find(rows, Dataset="toy b&c", Method="broken")["ACC (%)"] not in ("failed", "n/a")
    # rows follow the display order: datasets, then methods
    assert [(r["Dataset"], r["Method"].removesuffix(" †").removesuffix(" (ref)")) for r in rows] == [
        (d, m) for d in DATASETS for m in METHODS]
    tex_rows = tex_lines(out / "tables" / "summary.tex", 2)
    assert tex_rows[r"toy\_a/msp (ref)"][2] == "n/a"
    assert set(tex_rows[r"toy\_a/broken"]) == {"failed"}
    for table in ("shift_severity", "ood", "efficiency"):
        rows = md_rows(out / "tables" / f"{table}.md")
        broken = [r for r in rows if (r["Dataset"], r["Method"]) == ("toy_a", "broken")]
        assert len(broken) == 1 and "failed" in broken[0].values(), table


def test_readme_lists_failures_and_embeds_tables_and_plots(report):
    out, _ = report
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("# uqbench report: synthetic\n")
    assert "Reference method: `msp`" in readme
    for words in ("ddof=1", "paired", "bootstrap", "Holm", "▲", "▼", "△", "▽", "(ref)", "p_holm < 0.05",
                  "re-training both with new seeds and re-drawing the test set", "reports/perf/coverage.md"):
        assert words in readme, words
    failed = readme_section(readme, "## Failed cells")
    for seed in SEEDS:
        assert f"| toy_a     | broken   | {seed}      | {FAIL_REASON} |" in failed
    assert "86.00 ± 1.00 [84.77, 88.34] ▲" in readme
    assert "Shift: per corruption at severity 5" in readme
    images = [ln for ln in readme.splitlines() if ln.startswith("![")]
    assert len(images) == len(list((out / "plots").glob("*.png")))
    for line in images:
        rel = line.rsplit("](", 1)[1].rstrip(")")
        assert rel.startswith("plots/") and (out / rel).is_file()
    # order of the sections: summary, shift tables, OOD, efficiency, convergence, then the plots
    toy_a = readme_section(readme, "## toy_a")
    heads = [ln for ln in toy_a.splitlines() if ln.startswith("### ")]
    assert [h.split(":")[0].split(" (")[0] for h in heads] == [
        "### Summary", "### Seeds needed for the observed differences to be marked", "### Shift", "### Shift",
        "### Shift",
        "### Shift", "### OOD detection", "### Efficiency", "### Convergence"]
    assert readme.index("## Failed cells") < readme.index("## Plots")


def test_conventions_section_lists_each_shown_metric(report):
    out, _ = report
    conventions = readme_section((out / "README.md").read_text(encoding="utf-8"), "## Conventions")
    shown = {m for _, m in SUMMARY_HEADERS + SHIFT_HEADERS + OOD_HEADERS}
    for metric in shown:
        info = get_metric(metric)
        assert f"`{metric}`" in conventions and info.convention.replace("|", r"\|") in conventions, metric
        assert (info.interval in conventions) if info.interval else True, metric
    assert "37-47% for a calibrated one" in conventions  # ECE's measured coverage
    assert "ece_adaptive" not in conventions  # registered, but not in the default selection
    for words in ("CE (%)", "Parameters", "Peak memory (MiB)", "`mutual_info`", "`entropy`",
                  "Degenerate splits"):
        assert words in conventions, words


# ------------------------------------------------------------------------------------ shift
def test_severity_table_rows_and_values(report, results):
    out, _ = report
    rows = md_rows(out / "tables" / "shift_severity.md")
    assert list(rows[0]) == ["Dataset", "Method", "Severity", "Samples"] + [h for h, _ in SHIFT_HEADERS]
    mine = [r for r in rows if (r["Dataset"], r["Method"]) == ("toy_a", "mc_dropout")]
    assert [r["Severity"] for r in mine] == ["0", "1", "5", "all"]
    assert [r["Samples"] for r in mine] == [str(SAMPLES_PER_SPLIT)] * 4  # the clean row counts the same images
    # accuracy at severity 5: 0.9 - 0.4 + 0.05 = 0.55 +- 0.02; ECE at "all": 0.05 + 0.1
    assert mine[2]["ACC (%)"] == "55.00 ± 2.00"
    assert mine[3]["ECE (%)"] == "15.00 ± 2.00"
    assert mine[0]["NLL (x10)"] == "0.50 ± 0.20"
    csv = pd.read_csv(out / "tables" / "shift_severity.csv")
    row = csv[(csv.dataset == "toy_a") & (csv.method == "mc_dropout") & (csv.severity == 5)].iloc[0]
    assert row["accuracy_ci_low"] == pytest.approx(0.52) and row["accuracy_ci_high"] == pytest.approx(0.59)
    assert -1 in set(csv["severity"])  # raw key in CSV: -1 = every corruption split
    assert set(csv["n_samples"].dropna()) == {SAMPLES_PER_SPLIT}  # nan: the failed method's row
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert "0 = the corrupted samples before corruption" in readme and "Samples = samples per split" in readme
    assert "accuracy_verdict" not in csv  # no test on aggregates


def test_severity_plots_have_one_line_and_ci_band_per_method(results, tmp_path, monkeypatch):
    for name in ("_plot_reliability", "_plot_risk_coverage", "_plot_ood_hist"):
        monkeypatch.setattr(report_mod, name, lambda *args: None)
    bands: dict[str, list[tuple]] = {}
    current: list[str] = []
    plot_severity, fill_between = report_mod._plot_severity, Axes.fill_between

    def spy_plot(lines, col, title, xlabel, path):
        current[:] = [path.name]
        bands[path.name] = []
        plot_severity(lines, col, title, xlabel, path)
        current.clear()

    def spy_fill(self, x, y1, y2, **kw):
        if current:
            bands[current[0]].append((np.asarray(x), np.asarray(y1), np.asarray(y2)))
        return fill_between(self, x, y1, y2, **kw)

    monkeypatch.setattr(report_mod, "_plot_severity", spy_plot)
    monkeypatch.setattr(Axes, "fill_between", spy_fill)
    write_report(results, tmp_path, formats=("md",))
    assert sorted(bands) == sorted(f"severity_{sanitize(d)}_{m}.png" for d in DATASETS
                                   for m in ("accuracy", "ece", "ece_debiased", "nll"))
    acc = bands["severity_toy_a_accuracy.png"]
    assert len(acc) == 2  # msp, mc_dropout (broken failed on toy_a)
    x, lo, hi = acc[1]  # mc_dropout: 0.9 - 0.08 s + 0.05, CI [-0.03, +0.04], in %
    severities = np.array([0, 1, 5])
    np.testing.assert_allclose(x - severities, x[0])  # shifted sideways by one offset, to stay apart from msp
    assert 0 < x[0] < 0.5
    np.testing.assert_allclose(lo, (0.95 - 0.08 * severities - 0.03) * 100)
    np.testing.assert_allclose(hi, (0.95 - 0.08 * severities + 0.04) * 100)
    assert len(bands["severity_toy_b_c_nll.png"]) == 3
    png = (tmp_path / "plots" / "severity_toy_a_accuracy.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_corruption_table_with_ce_and_mce_rows(report, results):
    out, _ = report
    rows = md_rows(out / "tables" / "shift_corruption.md")
    assert list(rows[0]) == ["Dataset", "Method", "Corruption"] + [h for h, _ in SHIFT_HEADERS] + ["CE (%)"]
    mine = [r for r in rows if (r["Dataset"], r["Method"]) == ("toy b&c", "mc_dropout")]
    assert [r["Corruption"] for r in mine] == ["gaussian_noise", "contrast", "mCE"]
    brier = seed_values(results, "toy b&c", "mc_dropout", "shift/gaussian_noise/5", "brier")
    assert mine[0]["Brier (x100)"] == mean_std(brier, 100)  # severity 5, not 1
    assert mine[0]["CE (%)"] == "80.00" and mine[1]["CE (%)"] == "90.00"
    assert mine[2]["CE (%)"] == "85.00"
    assert {mine[2][h] for h, _ in SHIFT_HEADERS} == {""}  # mCE row: CE only
    assert find(rows, Dataset="toy_a", Method="msp", Corruption="mCE")["CE (%)"] == "100.00"
    csv = pd.read_csv(out / "tables" / "shift_corruption.csv", keep_default_na=False, na_values=["nan"])
    mce = csv[(csv.dataset == "toy b&c") & (csv.method == "mc_dropout") & (csv.corruption == "mCE")].iloc[0]
    assert mce["ce"] == pytest.approx(0.85) and np.isnan(mce["accuracy_mean"])


def test_corruption_table_at_another_severity(results, tmp_path, fast_plots):
    write_report(results, tmp_path, formats=("md",), methods=["msp"], severity=1)
    rows = md_rows(tmp_path / "tables" / "shift_corruption.md")
    mine = [r for r in rows if r["Dataset"] == "toy_a"]
    # contrast was only evaluated at severity 5: its CE row stays, its metrics are n/a
    assert [r["Corruption"] for r in mine] == ["gaussian_noise", "contrast", "mCE"]
    acc = seed_values(results, "toy_a", "msp", "shift/gaussian_noise/1", "accuracy")
    assert mine[0]["ACC (%)"] == mean_std(acc, 100)
    assert mine[1]["ACC (%)"] == "n/a" and mine[1]["CE (%)"] == "100.00"
    assert "Shift: per corruption at severity 1" in (tmp_path / "README.md").read_text(encoding="utf-8")
    for bad in (0, 6, "5", 2.0):
        with pytest.raises(ConfigError, match="severity"):
            write_report(results, tmp_path, severity=bad)


def test_other_shift_table(report, results):
    out, _ = report
    rows = md_rows(out / "tables" / "shift_other.md")
    assert {r["Split"] for r in rows if r["Method"] != "broken" or r["Dataset"] != "toy_a"} == {"shift/digits_box"}
    acc = seed_values(results, "toy_a", "mc_dropout", "shift/digits_box", "accuracy")
    assert find(rows, Dataset="toy_a", Method="mc_dropout")["ACC (%)"] == mean_std(acc, 100)


# ------------------------------------------------------------------------------------ OOD
def test_ood_rows_for_each_score_with_ci_and_marks(report, results):
    out, _ = report
    rows = md_rows(out / "tables" / "ood.md")
    assert list(rows[0]) == ["Dataset", "Method", "Split", "Score"] + [h for h, _ in OOD_HEADERS]
    for dataset in DATASETS:
        for method in METHODS:
            if not ran(dataset, method):
                continue
            label = method + (" (ref)" if method == REFERENCE else "")
            mine = [r for r in rows if (r["Dataset"], r["Method"]) == (dataset, label)]
            assert [(r["Split"], r["Score"]) for r in mine] == [("ood/svhn", s) for s in scores_of(method)]
    row = find(rows, Dataset="toy_a", Method="mc_dropout", Score="entropy")
    auroc = seed_values(results, "toy_a", "mc_dropout", "ood/svhn", "ood_auroc", "entropy")
    assert row["AUROC (%)"] == with_ci(auroc, 100) + " ▲"
    fpr = seed_values(results, "toy b&c", "mc_dropout", "ood/svhn", "ood_fpr95", "mutual_info")
    assert find(rows, Dataset="toy b&c", Method="mc_dropout", Score="mutual_info")["FPR95 (%)"] == with_ci(fpr, 100)
    csv = pd.read_csv(out / "tables" / "ood.csv")
    assert list(csv.columns[:5]) == ["dataset", "method", "split", "score", "n_seeds"]
    assert set(csv["score"].dropna()) == {"msp", "entropy", "mutual_info"}


# ------------------------------------------------------------------------------------ efficiency
def test_efficiency_numbers_are_formatted_from_the_input(report):
    out, _ = report
    rows = md_rows(out / "tables" / "efficiency.md")
    assert list(rows[0]) == ["Dataset", "Method", "Parameters", "Train time (s)",
                             "Predict time / 1,000 images (s)", "Peak memory (MiB)", "Passes",
                             "OOD detector fit (s)", "OOD detector scoring / 1,000 images (s)"]
    msp = find(rows, Dataset="toy_a", Method="msp")
    assert list(msp.values())[2:] == ["1,234,567", "12.3", "0.457", "512.0", "1", "0.012", "2.500"]
    mc = find(rows, Dataset="toy b&c", Method="mc_dropout")  # no detector measured: n/a, not 0
    assert list(mc.values())[2:7] == ["1,234,567", "15.0", "4.568", "600.2", "10"]
    assert list(mc.values())[7:] == ["n/a", "n/a"]
    csv = pd.read_csv(out / "tables" / "efficiency.csv")
    row = csv[(csv.dataset == "toy_a") & (csv.method == "mc_dropout")].iloc[0]
    assert row["predict_seconds_per_1000"] == pytest.approx(4.5678) and row["parameters"] == 1234567
    tex_rows = tex_lines(out / "tables" / "efficiency.tex", 2)
    # lower time is better; passes have no direction
    assert tex_rows[r"toy\_a/msp"][1] == r"\textbf{12.3}" and tex_rows[r"toy\_a/msp"][4] == "1"


# ------------------------------------------------------------------------------------ convergence
CONVERGENCE_HEADERS = ["Dataset", "Method", "Stage", "Log", "Still improving (seeds)", "Epochs", "Best val. epoch",
                       "Train accuracy (%)", "Train loss", "Val accuracy (%)", "Val NLL (nats)"]


def convergence_texts(values: tuple) -> list[str]:
    """The value cells of a convergence row: epochs, best epoch (1 decimal), accuracies in %
    (2 decimals), loss and NLL in nats (4 decimals)."""
    epochs, best, acc, loss, val_acc, nll = values
    return [f"{epochs:.0f}", f"{best:.1f}", f"{100 * acc:.2f}", f"{loss:.4f}", f"{100 * val_acc:.2f}", f"{nll:.4f}"]


def test_convergence_table_shows_each_stage_whose_log_and_the_seeds_still_improving(report):
    out, _ = report
    rows = md_rows(out / "tables" / "convergence.md")
    assert list(rows[0]) == CONVERGENCE_HEADERS
    expected = {  # (dataset, method as shown, stage) -> (log, still improving); values from CONVERGENCE
        ("toy_a", "msp", ""): ("own", "0 of 3", CONVERGENCE[("toy_a", "msp")][0]),
        ("toy_a", "mc_dropout", ""): ("own", "0 of 3", CONVERGENCE[("toy_a", "mc_dropout")][0]),
        ("toy b&c", "msp", ""): ("own", "n/a: 1 epoch", CONVERGENCE[("toy b&c", "msp")][0]),
        ("toy b&c", "mc_dropout †", "1"): ("base msp", "n/a: 1 epoch", CONVERGENCE[("toy b&c", "mc_dropout")][0]),
        ("toy b&c", "mc_dropout †", "2"): ("own", "1 of 2; n/a for 1: no training log",
                                           CONVERGENCE[("toy b&c", "mc_dropout")][1]),
        ("toy b&c", "broken", ""): ("base msp", "n/a: 1 epoch", CONVERGENCE[("toy b&c", "broken")][0]),
    }
    for (dataset, method, stage), (log, improving, given) in expected.items():
        row = find(rows, Dataset=dataset, Method=method, Stage=stage)
        assert list(row.values())[3:] == [log, improving, *convergence_texts(given[6:])], (dataset, method, stage)
    assert "failed" in find(rows, Dataset="toy_a", Method="broken").values()  # every seed failed: no log
    assert len(rows) == len(expected) + 1


def test_a_method_still_improving_is_marked_in_the_summary_and_convergence_tables_only(report):
    out, _ = report
    summary = md_rows(out / "tables" / "summary.md")
    marked = {(r["Dataset"], r["Method"]) for r in summary}
    assert marked == {("toy_a", "msp (ref)"), ("toy_a", "mc_dropout"), ("toy_a", "broken"),
                      ("toy b&c", "msp (ref)"), ("toy b&c", "mc_dropout †"), ("toy b&c", "broken")}
    assert len(summary) == len(marked)
    assert {r["Method"] for r in md_rows(out / "tables" / "ood.md")} == {"msp (ref)", "mc_dropout", "broken"}
    summary_tex = (out / "tables" / "summary.tex").read_text(encoding="utf-8")
    assert summary_tex.count(r"mc\_dropout $^\dagger$") == 1 and "msp (ref) $^" not in summary_tex
    assert r"mc\_dropout $^\dagger$" in (out / "tables" / "convergence.tex").read_text(encoding="utf-8")
    csv = pd.read_csv(out / "tables" / "convergence.csv")  # raw: names and values unmarked
    row = csv[(csv.dataset == "toy b&c") & (csv.method == "mc_dropout") & (csv.stage == 2)].iloc[0]
    assert row["still_improving"] == "1 of 2; n/a for 1: no training log" and row["train_acc"] == pytest.approx(0.6)
    assert row["val_nll"] == pytest.approx(1.5) and row["n_seeds"] == 3 and row["log"] == "own"
    assert "mc_dropout †" not in (out / "tables" / "summary.csv").read_text(encoding="utf-8")


def test_readme_header_names_the_cells_still_improving_and_those_not_judged(report):
    out, _ = report
    readme = (out / "README.md").read_text(encoding="utf-8")
    header = readme.split("\n\n")[1]
    assert header == (
        "**Still improving when training ended** (the rule is under *Convergence* in the note below): "
        "toy b&c / mc_dropout (stage 2), seed 0. Marked `†` in the summary and convergence tables: "
        "mc_dropout (toy b&c); their numbers come from models that had not converged. Not judged: "
        "toy b&c / msp, seeds 0, 1, 2 (1 epoch); toy b&c / mc_dropout (stage 2), seed 1 (no training log).")
    for words in ("k = max(1, round(0.2 × E))", "more than 1 percentage point or", "more than 15% of the earlier mean",
                  "`n/a: 1 epoch`", "`analysis/training.csv`", "`analysis/convergence.csv`"):
        assert words in readme, words
    footnote = "`†`: still improving when training ended"
    toy_b = readme_section(readme, "## toy b&c")
    assert toy_b.split("### Summary")[1].split("###")[0].count(footnote) == 1
    assert toy_b.split("### Convergence")[1].count(footnote) == 1
    assert footnote not in toy_b.split("### OOD detection")[1].split("###")[0]
    assert footnote not in readme_section(readme, "## toy_a")  # nothing marked there


def test_readme_header_says_when_no_log_was_still_improving_or_none_could_be_judged(results, tmp_path, fast_plots):
    settled = {k: [(*stage[:3], 0, *stage[4:]) for stage in stages] for k, stages in CONVERGENCE.items()}
    cells, summary = _convergence(settled)
    write_report(replace(results, convergence=cells, convergence_summary=summary), tmp_path, formats=("md",))
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert readme.split("\n\n")[1].startswith("**Convergence**: no training log was still improving when training "
                                                 "ended (the rule is under *Convergence* in the note below). Not judged: "
                                                 "toy b&c / msp, seeds 0, 1, 2 (1 epoch)")
    assert "†" not in "".join((tmp_path / "tables" / f"{t}.md").read_text(encoding="utf-8")
                              for t in ("summary", "convergence"))
    one_epoch = {k: [(*stage[:3], 0, 3, "1 epoch", *stage[6:]) for stage in stages]
                 for k, stages in CONVERGENCE.items()}
    cells, summary = _convergence(one_epoch)
    write_report(replace(results, convergence=cells, convergence_summary=summary), tmp_path, formats=("md",))
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert readme.split("\n\n")[1] == (
        "**Convergence** could not be judged for any training log: toy_a / msp, seeds 0, 1, 2 (1 epoch); "
        "toy_a / mc_dropout, seeds 0, 1, 2 (1 epoch); toy b&c / msp, seeds 0, 1, 2 (1 epoch); "
        "toy b&c / mc_dropout (stage 2), seeds 0, 1, 2 (1 epoch).")
    assert {r["Still improving (seeds)"] for r in md_rows(tmp_path / "tables" / "convergence.md")} == {
        "n/a: 1 epoch", ""}  # "": toy_a's failed method


def test_readme_header_names_the_cells_not_learning_apart_from_those_still_improving(results, tmp_path, fast_plots):
    """toy b&c's mc_dropout stage 2, seed 0, not learning: alone, then beside toy_a's msp
    seed 0 still improving; each kind is named, both carry the mark."""
    stuck = {("toy b&c", "mc_dropout", 2): 1}
    cells, summary = _convergence(not_learning=stuck)
    write_report(replace(results, convergence=cells, convergence_summary=summary), tmp_path, formats=("md",))
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert readme.split("\n\n")[1] == (
        "**Not learning when training ended** (the rule is under *Convergence* in the note below): "
        "toy b&c / mc_dropout (stage 2), seed 0. Marked `†` in the summary and convergence tables: "
        "mc_dropout (toy b&c); their numbers come from models that had not learned. Not judged: "
        "toy b&c / msp, seeds 0, 1, 2 (1 epoch); toy b&c / mc_dropout (stage 2), seed 1 (no training log).")
    rows = md_rows(tmp_path / "tables" / "convergence.md")
    assert [(r["Method"], r["Still improving (seeds)"]) for r in rows if r["Dataset"] == "toy b&c"][1:3] == [
        ("mc_dropout †", "n/a: 1 epoch"), ("mc_dropout †", "1 of 2 not learning; n/a for 1: no training log")]
    both = {**CONVERGENCE, ("toy_a", "msp"): [(1, "msp", 3, 1, 0, "", 4, 3.0, 0.991, 0.05, 0.9, 0.35)]}
    cells, summary = _convergence(both, not_learning=stuck)
    write_report(replace(results, convergence=cells, convergence_summary=summary), tmp_path, formats=("md",))
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert readme.split("\n\n")[1].startswith(
        "**Still improving or not learning when training ended** (the rule is under *Convergence* in the note "
        "below). Still improving: toy_a / msp, seed 0. Not learning: toy b&c / mc_dropout (stage 2), seed 0. "
        "Marked `†` in the summary and convergence tables: msp (toy_a), mc_dropout (toy b&c); their numbers come "
        "from models that had not converged or had not learned.")
    for words in ("`not learning`", "at most 1 percentage point above the share of the most frequent class, "
                  "estimated from the labels of its stored test split"):
        assert words in readme, words


# ------------------------------------------------------------------------------------ LaTeX
def test_tex_bold_best_marks_and_escaping(report, results):
    out, _ = report
    text = (out / "tables" / "summary.tex").read_text(encoding="utf-8")
    assert r"\toprule" in text and r"\midrule" in text and r"\bottomrule" in text
    assert "±" not in text and "▲" not in text and "≈" not in text and r"$\pm$" in text
    assert r"$\approx$[" in text  # the calibration errors' approximate intervals
    assert r"ACC (\%)" in text and r"AURC ($\times$1000)" in text and r"NLL ($\times$10)" in text
    lines = tex_lines(out / "tables" / "summary.tex", 2)
    assert r"toy b\&c/mc\_dropout $^\dagger$" in lines  # special characters escaped
    # ACC: higher is better -> mc_dropout bold, arrow after the bold value; the reference not
    assert lines[r"toy\_a/mc\_dropout"][0] == r"\textbf{86.00 $\pm$ 1.00 [84.77, 88.34]}$^\uparrow$"
    assert lines[r"toy\_a/msp (ref)"][0] == "82.00 $\\pm$ 2.00 [80.77, 84.34]"
    assert lines[r"toy\_a/mc\_dropout"][4].endswith(r"$^\downarrow$")  # ECE worse
    # ECE: lower is better, judged within the dataset only
    for dataset in DATASETS:
        means = {m: np.mean(seed_values(results, dataset, m, "test", "ece")) * 100
                 for m in METHODS if ran(dataset, m)}
        best = min(means, key=means.get)
        for m, mean in means.items():
            marked = " $^\\dagger$" if (dataset, m) == ("toy b&c", "mc_dropout") else ""  # still improving
            cell = lines[tex(dataset) + "/" + tex(m) + (" (ref)" if m == REFERENCE else "") + marked][4]
            assert cell.startswith(r"\textbf{") == (m == best), (dataset, m, cell)
            assert f"{mean:.2f}" in cell


def test_tex_best_is_judged_per_split_score_and_severity_group(report, results):
    out, _ = report
    ood = tex_lines(out / "tables" / "ood.tex", 4)
    for dataset in DATASETS:
        for score in ("msp", "entropy"):
            means = {m: np.mean(seed_values(results, dataset, m, "ood/svhn", "ood_auroc", score))
                     for m in METHODS if ran(dataset, m)}
            best = max(means, key=means.get)
            for m in means:
                key = "/".join([tex(dataset), tex(m) + (" (ref)" if m == REFERENCE else ""), "ood/svhn", score])
                assert ood[key][0].startswith(r"\textbf{") == (m == best), key
        # mutual_info: a single method -> nothing to compare, nothing bold
        key = "/".join([tex(dataset), r"mc\_dropout", "ood/svhn", r"mutual\_info"])
        assert not any(c.startswith(r"\textbf{") for c in ood[key])
    sev = tex_lines(out / "tables" / "shift_severity.tex", 4)  # keys: dataset, method, severity, samples
    for level in ("0", "1", "5", "all"):  # accuracy: mc_dropout has the bonus at every severity
        assert sev[rf"toy\_a/mc\_dropout/{level}/{SAMPLES_PER_SPLIT}"][0].startswith(r"\textbf{")
        assert not sev[rf"toy\_a/msp/{level}/{SAMPLES_PER_SPLIT}"][0].startswith(r"\textbf{")
        assert sev[rf"toy\_a/msp/{level}/{SAMPLES_PER_SPLIT}"][1].startswith(r"\textbf{")  # ties in ECE: all bold
    corr = tex_lines(out / "tables" / "shift_corruption.tex", 3)
    assert corr[r"toy b\&c/mc\_dropout/mCE"][-1] == r"\textbf{85.00}"  # lowest mCE
    assert corr[r"toy b\&c/broken/mCE"][-1] == "120.00"


# ------------------------------------------------------------------------------------ selection
def test_metrics_restrict_columns_and_unknown_metric_is_an_error(results, tmp_path, fast_plots):
    written = write_report(results, tmp_path, formats=("md", "csv"),
                           metrics=["nll", "accuracy", "failure_aupr_success", "ood_fpr95"])
    summary = md_rows(tmp_path / "tables" / "summary.md")
    assert list(summary[0]) == ["Dataset", "Method", "NLL (x10)", "ACC (%)", "AUPR-S (%)"]
    aupr = seed_values(results, "toy_a", "mc_dropout", "test", "failure_aupr_success")
    assert find(summary, Dataset="toy_a", Method="mc_dropout")["AUPR-S (%)"] == with_ci(aupr, 100)
    corr = md_rows(tmp_path / "tables" / "shift_corruption.md")
    assert list(corr[0])[3:] == ["NLL (x10)", "ACC (%)", "AUPR-S (%)", "CE (%)"]
    assert list(md_rows(tmp_path / "tables" / "ood.md")[0])[4:] == ["FPR95 (%)"]
    csv = pd.read_csv(tmp_path / "tables" / "summary.csv")
    assert [c for c in csv.columns if c.endswith("_mean")] == [
        "nll_mean", "accuracy_mean", "failure_aupr_success_mean"]
    conventions = readme_section((tmp_path / "README.md").read_text(encoding="utf-8"), "## Conventions")
    for metric in ("nll", "accuracy", "failure_aupr_success", "ood_fpr95"):
        assert get_metric(metric).convention in conventions
    assert "`ece`" not in conventions and "`ood_auroc`" not in conventions
    # ECE is not selected: no ECE-vs-severity plot
    assert not any(p.name.endswith("_ece.png") for p in written)
    assert any(p.name == "severity_toy_a_nll.png" for p in written)
    assert sorted(fast_plots) == sorted(p.name for p in written if p.suffix == ".png")

    only_ood = tmp_path / "only_ood"
    written = write_report(results, only_ood, formats=("md",), metrics=["ood_auroc"])
    assert sorted(p.name for p in written if p.parent.name == "tables") == [
        "convergence.md", "efficiency.md", "ood.md", "shift_corruption.md"]  # CE, efficiency, convergence: fixed
    assert "Not shown" in (only_ood / "README.md").read_text(encoding="utf-8")

    with pytest.raises(ConfigError, match=r"unknown metric 'nope'.* Known metrics: accuracy, "):
        write_report(results, tmp_path, metrics=["accuracy", "nope"])


def test_methods_filter_and_formats(results, tmp_path, fast_plots):
    written = write_report(results, tmp_path, formats=("md",), methods=["mc_dropout"])
    assert not list((tmp_path / "tables").glob("*.tex"))
    assert not list((tmp_path / "tables").glob("*.csv"))
    for table in TABLE_NAMES:
        rows = md_rows(tmp_path / "tables" / f"{table}.md")
        assert rows and {r["Method"].removesuffix(" †") for r in rows} == {"mc_dropout"}, table
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "msp (ref)" not in readme and "broken" not in readme
    assert not any("msp" in p.name for p in written)
    assert "reliability_toy_a_mc_dropout.png" in fast_plots
    with pytest.raises(ConfigError, match="nope"):
        write_report(results, tmp_path, methods=["nope"])
    with pytest.raises(ConfigError, match="xlsx"):
        write_report(results, tmp_path, formats=("xlsx",))


def test_empty_tables_say_so(tmp_path, fast_plots):
    base = make_results()
    metrics = base.metrics[base.metrics["split"] == "test"]
    results = AnalysisResults(
        suite="clean_only", metrics=metrics, datasets=["toy_a"], methods=["msp", "mc_dropout"],
        splits={"toy_a": ["test"]}, seeds={("toy_a", m): list(SEEDS) for m in ("msp", "mc_dropout")},
        failures=pd.DataFrame(columns=["dataset", "method", "seed", "reason"]),
        load_predictions=_load_predictions, reference="msp", summary=_summary(metrics),
    )
    write_report(results, tmp_path)
    tables = tmp_path / "tables"
    assert md_rows(tables / "summary.md")
    for name in ("shift_severity", "shift_corruption", "shift_other", "ood", "efficiency", "convergence"):
        md = (tables / f"{name}.md").read_text(encoding="utf-8")
        assert md.startswith("No ") and "|" not in md, name
        assert "% No " in (tables / f"{name}.tex").read_text(encoding="utf-8")
        assert pd.read_csv(tables / f"{name}.csv").empty
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "No corruption split was evaluated." in readme and "No OOD split was evaluated." in readme
    assert "## Failed cells\n\nNone." in readme
    assert "No training log was found." in readme and "Still improving when" not in readme
    assert not [name for name in fast_plots if name.startswith(("severity_", "training_"))]
    assert "reliability_toy_a_msp.png" in fast_plots


# ------------------------------------------------------------------------------------ determinism
def test_output_is_deterministic(report, results, tmp_path):
    first, paths_first = report
    paths = write_report(results, tmp_path)
    assert [p.relative_to(tmp_path) for p in paths] == [p.relative_to(first) for p in paths_first]
    for path in paths:
        assert path.read_bytes() == (first / path.relative_to(tmp_path)).read_bytes(), path.name


def test_pngs_are_valid_images(report):
    out, _ = report
    pngs = sorted((out / "plots").glob("*.png"))
    assert pngs
    for path in pngs:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"Software" not in data  # no version stamp in the file
        img = mpimg.imread(path)
        assert img.ndim == 3 and img.shape[0] >= 200 and img.shape[1] >= 200
        assert float(img[..., :3].std()) > 0.01  # not a blank canvas


def test_every_header_states_its_scale(report):
    """Metric headers carry METRIC_INFO's unit, which must match the paper's scale."""
    out, _ = report
    units = {100: "%", 1000: "x1000", 10: "x10"}
    for name, headers in (("summary", SUMMARY_HEADERS), ("ood", OOD_HEADERS)):
        for header, metric in headers:
            assert get_metric(metric).scale == SCALES[metric], metric
            unit = re.search(r"\((.+)\)$", header).group(1)
            assert unit == units.get(SCALES[metric]) or (metric == "brier" and unit == "x100")


# ------------------------------------------------------------------------------------ curves
def test_reliability_bins_are_lo_exclusive_hi_inclusive():
    edges = np.linspace(0.0, 1.0, 16)
    # on an edge, just above its float32 value (the KEP-SVGP edges are torch's float32
    # linspace; 2/15 + 1e-9 would still be below float32(2/15) = 0.13333334), at 1
    conf = np.array([edges[2], edges[2] + 1e-7, 1.0, 0.5])
    k = 10
    probs = np.stack([conf] + [(1 - conf) / (k - 1)] * (k - 1), axis=1)  # class 0 is top
    labels = np.array([0, 1, 0, 0])  # only the second prediction is wrong
    stats = calibration_bins(probs, labels)
    # (lo, hi]: edges[2] -> bin 1, just above -> bin 2, 1.0 -> last bin, 0.5 -> bin 7
    assert {i: int(c) for i, c in enumerate(stats["count"]) if c} == {1: 1, 2: 1, 7: 1, 14: 1}
    np.testing.assert_allclose(stats["acc"][[1, 2, 7, 14]], [1.0, 0.0, 1.0, 1.0])
    correct = np.array([1.0, 0.0, 1.0, 1.0])
    assert ece(probs, labels) == pytest.approx(np.mean(np.abs(correct - conf)))  # one sample per bin


def test_risk_coverage_hand_example():
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.6, 0.4]])
    labels = np.array([0, 1, 0, 0])  # second sample (conf 0.6, first of the tie) is wrong
    coverage, risk = risk_coverage_curve(probs, labels)
    np.testing.assert_allclose(coverage, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(risk, [0.0, 0.0, 1 / 3, 1 / 4])  # stable: index 1 before 3


def test_full_shift_grid_is_written_to_files_but_not_inlined(results, tmp_path, fast_plots):
    """Every shift split (the whole corruption x severity grid) has a row in
    tables/shift_splits.*; the README links the file instead of inlining it."""

    write_report(results, tmp_path, ("md", "csv"))
    grid = pd.read_csv(tmp_path / "tables" / "shift_splits.csv")
    expected = {s for d in results.datasets for s in results.splits[d] if s.startswith("shift/")}
    assert set(grid["split"].dropna()) == expected  # (a method whose every seed failed has a "failed" row)
    readme = (tmp_path / "README.md").read_text()
    assert "tables/shift_splits.md" in readme


def test_hand_written_notes_are_inlined_at_the_top_and_kept(results, tmp_path, fast_plots):
    notes = "## How this run compares with the paper\n\nOrdering *agrees* on ACC.\n"
    (tmp_path / "NOTES.md").write_text(notes, encoding="utf-8")
    written = write_report(results, tmp_path, formats=("md",))
    assert tmp_path / "NOTES.md" not in written
    assert (tmp_path / "NOTES.md").read_text(encoding="utf-8") == notes  # never rewritten
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    heading, convergence, after = readme.split("\n\n", 2)  # the convergence statement heads the report
    assert heading.startswith("# uqbench report:") and convergence.startswith("**Still improving")
    assert after.startswith(notes.strip())
    assert readme.index("Ordering *agrees*") < readme.index("Reference method:")
    (tmp_path / "NOTES.md").unlink()
    write_report(results, tmp_path, formats=("md",))
    assert "Ordering" not in (tmp_path / "README.md").read_text(encoding="utf-8")
