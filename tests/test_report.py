"""Tests for bench.report on a synthetic AnalysisResults (no store, no model)."""
from __future__ import annotations

import zlib
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest

from bench.analysis import AnalysisResults
from bench.errors import ConfigError
from bench.metrics import calibration_bins, ece, risk_coverage_curve
from bench.report import sanitize, write_report

DATASETS = ["toy_a", "toy b&c"]  # the second name needs escaping / sanitising
METHODS = ["msp", "mc_dropout", "broken"]  # "broken": every seed failed on toy_a
SEEDS = [0, 1, 2]
SPLITS = ["test", "shift/gaussian_noise/3", "ood/svhn"]
CLASSIFICATION = ["accuracy", "ece", "nll", "brier", "aurc", "eaurc", "failure_auroc",
                  "failure_fpr95"]
OOD = ["ood_auroc", "ood_aupr_in", "ood_aupr_out", "ood_fpr95"]
FAIL_REASON = "NonFiniteLoss: loss became nan at epoch 3"

# hand-picked values the assertions check against
ACC = {("toy_a", "msp"): [0.80, 0.82, 0.84], ("toy_a", "mc_dropout"): [0.85, 0.86, 0.87]}


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
            if (dataset, method) == ("toy_a", "broken"):
                continue
            for seed in SEEDS:
                for split in SPLITS:
                    names = OOD if split.startswith("ood/") else CLASSIFICATION
                    for metric in names:
                        value = _metric_value(rng, dataset, method, split, metric, seed)
                        rows.append((dataset, method, seed, split, metric, value))
    return pd.DataFrame(rows, columns=["dataset", "method", "seed", "split", "metric", "value"])


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
    seeds = {(d, m): list(SEEDS) for d in DATASETS for m in METHODS}
    seeds[("toy_a", "broken")] = []
    failures = pd.DataFrame(
        [("toy_a", "broken", s, FAIL_REASON) for s in SEEDS],
        columns=["dataset", "method", "seed", "reason"],
    )
    return AnalysisResults(
        suite="synthetic",
        metrics=_metrics(),
        datasets=list(DATASETS),
        methods=list(METHODS),
        splits={d: list(SPLITS) for d in DATASETS},
        seeds=seeds,
        failures=failures,
        load_predictions=_load_predictions,
    )


@pytest.fixture(scope="module")
def results() -> AnalysisResults:
    return make_results()


@pytest.fixture(scope="module")
def report(results, tmp_path_factory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("report")
    return out, write_report(results, out)


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


def expected_cell(values: list[float], scale: float) -> str:
    v = np.asarray(values) * scale
    return f"{v.mean():.2f} ± {v.std(ddof=1):.2f}"


def seed_values(results, dataset, method, split, metric) -> list[float]:
    m = results.metrics
    sel = m[(m.dataset == dataset) & (m.method == method) & (m.split == split)
            & (m.metric == metric)].sort_values("seed")
    return sel["value"].tolist()


# ------------------------------------------------------------------------------------
def test_every_expected_file_exists(report):
    out, written = report
    expected = {out / "README.md"}
    for table in ("in_distribution", "shift", "ood"):
        expected |= {out / "tables" / f"{table}.{fmt}" for fmt in ("md", "tex", "csv")}
    for d in DATASETS:
        expected.add(out / "plots" / f"risk_coverage_{sanitize(d)}.png")
        for m in METHODS:
            if (d, m) == ("toy_a", "broken"):
                continue  # no successful seed -> nothing to plot
            expected.add(out / "plots" / f"reliability_{sanitize(d)}_{m}.png")
            expected.add(out / "plots" / f"ood_hist_{sanitize(d)}_{m}.png")
    assert set(written) == expected
    assert len(written) == len(set(written))
    assert all(p.is_file() for p in expected)
    assert not (out / "plots" / "reliability_toy_a_broken.png").exists()
    assert sanitize("toy b&c") == "toy_b_c"


def test_md_cells_equal_independent_mean_std(report, results):
    out, _ = report
    rows = md_rows(out / "tables" / "in_distribution.md")
    assert list(rows[0]) == ["Dataset", "Method", "ACC (%)", "AURC (x1000)", "AUROC (%)",
                             "FPR95 (%)", "ECE (%)", "NLL (x10)", "Brier (x100)",
                             "E-AURC (x1000)"]
    assert find(rows, Dataset="toy_a", Method="msp")["ACC (%)"] == "82.00 ± 2.00"
    assert find(rows, Dataset="toy_a", Method="mc_dropout")["ACC (%)"] == "86.00 ± 1.00"
    nll = seed_values(results, "toy b&c", "mc_dropout", "test", "nll")
    assert len(nll) == 3
    assert find(rows, Dataset="toy b&c", Method="mc_dropout")["NLL (x10)"] == expected_cell(nll, 10)

    shift = md_rows(out / "tables" / "shift.md")
    brier = seed_values(results, "toy_a", "msp", "shift/gaussian_noise/3", "brier")
    row = find(shift, Dataset="toy_a", Method="msp", Split="shift/gaussian_noise/3")
    assert row["Brier (x100)"] == expected_cell(brier, 100)

    ood = md_rows(out / "tables" / "ood.md")
    assert list(ood[0])[3:] == ["AUROC (%)", "AUPR-In (%)", "AUPR-Out (%)", "FPR95 (%)"]
    fpr = seed_values(results, "toy b&c", "msp", "ood/svhn", "ood_fpr95")
    assert find(ood, Dataset="toy b&c", Method="msp")["FPR95 (%)"] == expected_cell(fpr, 100)


# scales of KEP-SVGP Table 1, written out here independently of bench.report
SCALES = {"accuracy": 100, "aurc": 1000, "failure_auroc": 100, "failure_fpr95": 100,
          "ece": 100, "nll": 10, "brier": 100, "eaurc": 1000, "ood_auroc": 100,
          "ood_aupr_in": 100, "ood_aupr_out": 100, "ood_fpr95": 100}
COLUMNS = {
    "in_distribution": [("ACC (%)", "accuracy"), ("AURC (x1000)", "aurc"),
                        ("AUROC (%)", "failure_auroc"), ("FPR95 (%)", "failure_fpr95"),
                        ("ECE (%)", "ece"), ("NLL (x10)", "nll"), ("Brier (x100)", "brier"),
                        ("E-AURC (x1000)", "eaurc")],
    "shift": [("ACC (%)", "accuracy"), ("ECE (%)", "ece"), ("NLL (x10)", "nll"),
              ("Brier (x100)", "brier"), ("AURC (x1000)", "aurc"),
              ("AUROC (%)", "failure_auroc")],
    "ood": [("AUROC (%)", "ood_auroc"), ("AUPR-In (%)", "ood_aupr_in"),
            ("AUPR-Out (%)", "ood_aupr_out"), ("FPR95 (%)", "ood_fpr95")],
}


@pytest.mark.parametrize("table,split", [("in_distribution", "test"),
                                         ("shift", "shift/gaussian_noise/3"),
                                         ("ood", "ood/svhn")])
def test_every_column_has_its_scale_and_order(report, results, table, split):
    out, _ = report
    rows = md_rows(out / "tables" / f"{table}.md")
    keys = ["Dataset", "Method"] + ([] if table == "in_distribution" else ["Split"])
    assert list(rows[0]) == keys + [header for header, _ in COLUMNS[table]]
    row = find(rows, Dataset="toy b&c", Method="mc_dropout")
    for header, metric in COLUMNS[table]:
        vals = seed_values(results, "toy b&c", "mc_dropout", split, metric)
        assert row[header] == expected_cell(vals, SCALES[metric]), header


def test_all_nan_metric_renders_na_and_failed_method_gets_failed_row(report):
    out, _ = report
    rows = md_rows(out / "tables" / "in_distribution.md")
    assert find(rows, Dataset="toy_a", Method="msp")["AUROC (%)"] == "n/a"
    broken = find(rows, Dataset="toy_a", Method="broken")
    assert set(list(broken.values())[2:]) == {"failed"}
    # the same method on the other dataset is fine
    assert find(rows, Dataset="toy b&c", Method="broken")["ACC (%)"] not in ("failed", "n/a")
    # rows follow the display order: datasets, then methods
    assert [(r["Dataset"], r["Method"]) for r in rows] == [
        (d, m) for d in DATASETS for m in METHODS]


def test_tex_bold_best_and_escaping(report, results):
    out, _ = report
    tex = (out / "tables" / "in_distribution.tex").read_text(encoding="utf-8")
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert "±" not in tex and r"$\pm$" in tex
    assert r"ACC (\%)" in tex and r"AURC ($\times$1000)" in tex
    lines = {ln.split(" & ")[0] + "/" + ln.split(" & ")[1]: ln for ln in tex.splitlines()
             if " & " in ln and not ln.startswith("Dataset")}
    assert r"toy b\&c/mc\_dropout" in lines  # special characters escaped
    # ACC: higher is better -> mc_dropout (86.00) bold, msp (82.00) not
    assert r"\textbf{86.00 $\pm$ 1.00}" in lines[r"toy\_a/mc\_dropout"]
    assert r"\textbf{82.00" not in lines[r"toy\_a/msp"]
    # ECE: lower is better, judged within the dataset only
    for dataset in DATASETS:
        means = {m: np.mean(seed_values(results, dataset, m, "test", "ece")) * 100
                 for m in METHODS if seed_values(results, dataset, m, "test", "ece")}
        best = min(means, key=means.get)
        for m, mean in means.items():
            line = lines[f"{dataset}/{m}".replace("_", r"\_").replace("&", r"\&")]
            cell = line.rstrip(" \\").split(" & ")[2 + 4]  # ECE is the 5th metric column
            assert cell.startswith(r"\textbf{") == (m == best), (dataset, m, cell)
            assert f"{mean:.2f}" in cell


def test_csv_is_raw_and_parses_back(report, results):
    out, _ = report
    df = pd.read_csv(out / "tables" / "in_distribution.csv")
    assert list(df.columns[:4]) == ["dataset", "method", "split", "n_seeds"]
    assert "accuracy_mean" in df and "accuracy_std" in df and "eaurc_std" in df
    row = df[(df.dataset == "toy_a") & (df.method == "msp")].iloc[0]
    assert row["accuracy_mean"] == pytest.approx(0.82, abs=1e-9)  # unscaled
    assert row["accuracy_std"] == pytest.approx(0.02, abs=1e-9)
    assert row["n_seeds"] == 3
    assert np.isnan(row["failure_auroc_mean"])
    nll = seed_values(results, "toy b&c", "msp", "test", "nll")
    other = df[(df.dataset == "toy b&c") & (df.method == "msp")].iloc[0]
    assert other["nll_mean"] == pytest.approx(np.mean(nll), rel=1e-8)
    broken = df[(df.dataset == "toy_a") & (df.method == "broken")].iloc[0]
    assert broken["n_seeds"] == 0 and np.isnan(broken["accuracy_mean"])

    ood = pd.read_csv(out / "tables" / "ood.csv")
    assert set(ood["split"]) == {"ood/svhn"}
    assert {"ood_auroc_mean", "ood_aupr_in_mean", "ood_aupr_out_mean", "ood_fpr95_std"} <= set(ood)


def test_readme_has_tables_failures_and_plots(report):
    out, _ = report
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("# uqbench report: synthetic\n")
    assert "ddof=1" in readme and "(lo, hi]" in readme
    failed = readme.split("## Failed cells", 1)[1].split("## Plots", 1)[0]
    for seed in SEEDS:
        assert f"| toy_a     | broken   | {seed}      | {FAIL_REASON} |" in failed
    assert "82.00 ± 2.00" in readme
    images = [ln for ln in readme.splitlines() if ln.startswith("![")]
    assert len(images) == len(list((out / "plots").glob("*.png")))
    for line in images:
        rel = line.rsplit("](", 1)[1].rstrip(")")
        assert rel.startswith("plots/") and (out / rel).is_file()


def test_output_is_deterministic(report, results, tmp_path):
    first, paths_first = report
    paths = write_report(results, tmp_path)
    assert [p.relative_to(tmp_path) for p in paths] == [p.relative_to(first) for p in paths_first]
    for path in paths:
        assert path.read_bytes() == (first / path.relative_to(tmp_path)).read_bytes(), path.name


def test_methods_filter_and_formats(results, tmp_path):
    written = write_report(results, tmp_path, formats=("md",), methods=["msp"])
    assert not list((tmp_path / "tables").glob("*.tex"))
    assert not list((tmp_path / "tables").glob("*.csv"))
    for table in ("in_distribution", "shift", "ood"):
        rows = md_rows(tmp_path / "tables" / f"{table}.md")
        assert rows and {r["Method"] for r in rows} == {"msp"}
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "mc_dropout" not in readme and "broken" not in readme
    assert not any("mc_dropout" in p.name for p in written)
    with pytest.raises(ConfigError, match="nope"):
        write_report(results, tmp_path, methods=["nope"])
    with pytest.raises(ConfigError, match="xlsx"):
        write_report(results, tmp_path, formats=("xlsx",))


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


def test_reliability_bins_are_lo_exclusive_hi_inclusive():
    edges = np.linspace(0.0, 1.0, 16)
    conf = np.array([edges[2], edges[2] + 1e-9, 1.0, 0.5])  # on an edge, just above, at 1
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
