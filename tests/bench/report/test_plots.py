"""The report's plots (``bench/report/plots.py``), read back from the matplotlib figures
they save: each labels the metric it shows (CoLA's MCC where the accuracy would be), the
risk-coverage legend shows the summary table's AURC (mean over seeds), the reliability
diagram has each bin's image count under it, the severity axis says what severity 0
is and how many samples each split holds, and the training curves are each method's
validation NLL and training accuracy per epoch, mean over seeds."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from bench.metrics import calibration_bins, risk_coverage_curve
from bench.report import RunTitle, write_report
from tests.bench.report.test_report import (SAMPLES_PER_SPLIT, SEEDS, TRAINING_EPOCHS, make_results, md_rows,
                                            readme_section, training_value)


@pytest.fixture
def figures(monkeypatch) -> dict[str, list[dict]]:
    """File name -> per axes of the figure saved there: title, axis labels, legend texts,
    bar heights and line data (nothing is written: the PNG encoding is skipped)."""
    seen: dict[str, list[dict]] = {}

    def savefig(fig: Figure, fname, *args, **kwargs):
        seen[Path(fname).name] = [{
            "title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
            "suptitle": fig._suptitle.get_text() if fig._suptitle is not None else "",
            "legend": [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else [],
            "bars": [p.get_height() for p in ax.patches if hasattr(p, "get_height")],
            "lines": [(line.get_label(), line.get_xdata(), line.get_ydata()) for line in ax.get_lines()],
        } for ax in fig.axes]

    monkeypatch.setattr(Figure, "savefig", savefig)
    return seen


def _summary_mean(results, dataset: str, method: str, metric: str) -> float:
    s = results.summary
    row = s[(s.dataset == dataset) & (s.method == method) & (s.split == "test") & (s.metric == metric)
            & (s.score == "")]
    return float(row["mean"].iloc[0])


def test_risk_coverage_legend_shows_the_tables_aurc_and_the_mean_curve(tmp_path, figures):
    results = make_results()
    write_report(results, tmp_path, formats=("md",))
    (ax,) = figures["risk_coverage_toy_a.png"]
    table = {r["Method"].removesuffix(" (ref)"): r["AURC (x1000)"]
             for r in md_rows(tmp_path / "tables" / "summary.md") if r["Dataset"] == "toy_a"}
    for method, text in zip(["msp", "mc_dropout"], ax["legend"]):
        shown = table[method].split(" ± ")[0]
        assert shown == f"{1000 * _summary_mean(results, 'toy_a', method, 'aurc'):.2f}"
        assert text == f"{method} (AURC x1000 = {shown}, mean of {len(SEEDS)})"
    label, coverage, risk = ax["lines"][0]  # msp: the mean of its seeds' curves
    curves = [risk_coverage_curve(*results.load_predictions("toy_a", "msp", s, "test"))[1] for s in SEEDS]
    np.testing.assert_allclose(risk, np.mean(curves, axis=0))
    np.testing.assert_allclose(coverage, np.arange(1, len(risk) + 1) / len(risk))
    assert "mean over seeds" in ax["title"]


def test_reliability_diagram_has_each_bins_count_under_it(tmp_path, figures):
    results = make_results()
    write_report(results, tmp_path, formats=("md",))
    diagram, counts = figures["reliability_toy_a_msp.png"]
    probs, labels = results.load_predictions("toy_a", "msp", min(SEEDS), "test")
    expected = calibration_bins(probs, labels, n_bins=15)["count"]
    np.testing.assert_array_equal(counts["bars"], expected)
    assert sum(counts["bars"]) == len(labels)
    assert counts["ylabel"] == f"samples per bin\n(of {len(labels)})"
    assert counts["xlabel"] == "confidence (max probability)" and diagram["ylabel"] == "accuracy"


def test_severity_axis_says_severity_0_is_the_same_images_clean(tmp_path, figures):
    write_report(make_results(), tmp_path, formats=("md",))
    (ax,) = figures["severity_toy_a_accuracy.png"]
    assert " ".join(ax["xlabel"].split()) == \
        f"corruption severity (0 = the same samples, clean; {SAMPLES_PER_SPLIT} samples each)"  # wrapped to fit


def _with_mcc_for_toy_a(results):
    """The results as a data set with CoLA's headline metrics (``toy_a`` shows MCC in the
    accuracy column; ``toy b&c`` does not), with MCC values unlike the accuracy's."""
    severity = results.severity
    mcc = severity[(severity.dataset == "toy_a") & (severity.metric == "accuracy")].copy()
    mcc["metric"], mcc["mean"] = "mcc", mcc["mean"] - 0.5
    summary = results.summary
    mcc_summary = summary[(summary.dataset == "toy_a") & (summary.metric == "accuracy")].copy()
    mcc_summary["metric"], mcc_summary["mean"] = "mcc", mcc_summary["mean"] - 0.5
    return replace(results, headlines={"toy_a": {"accuracy": "mcc"}},
                   severity=pd.concat([severity, mcc], ignore_index=True),
                   summary=pd.concat([summary, mcc_summary], ignore_index=True))


def test_every_plot_and_table_labels_the_metric_it_shows(tmp_path, figures):
    results = _with_mcc_for_toy_a(make_results())
    write_report(results, tmp_path, formats=("md", "csv"))
    severity = results.severity
    expected = severity[(severity.dataset == "toy_a") & (severity.method == "msp") & (severity.metric == "mcc")
                        & (severity.severity >= 0)].sort_values("severity")["mean"].to_numpy() * 100
    (mcc,) = [axes[0] for name, axes in figures.items() if name.startswith("severity_toy_a_")
              and np.allclose(axes[0]["lines"][0][2], expected)]  # the plot whose msp line is MCC
    assert mcc["lines"][0][0] == "msp"
    assert mcc["ylabel"] == "MCC (x100)" and mcc["title"].startswith("MCC vs. corruption severity: toy_a")
    assert "severity_toy_a_mcc.png" in figures and "severity_toy_a_accuracy.png" not in figures
    (acc,) = figures["severity_toy_b_c_accuracy.png"]
    assert acc["ylabel"] == "ACC (%)" and acc["title"].startswith("ACC vs. corruption severity")

    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    mine = readme_section(readme, "## toy_a")
    assert "MCC (x100)" in mine
    assert "ACC (%)" not in mine  # toy_a's own tables name MCC only
    assert "ACC (%)" in readme_section(readme, "## toy b&c") and "MCC" not in readme_section(readme, "## toy b&c")
    both = md_rows(tmp_path / "tables" / "summary.md")  # both data sets in one table: the joint label
    assert "ACC/MCC (%)" in both[0]
    msp = next(r for r in both if r["Dataset"] == "toy_a" and r["Method"].startswith("msp"))
    assert msp["ACC/MCC (%)"].startswith(f"{100 * _summary_mean(results, 'toy_a', 'msp', 'mcc'):.2f}")
    csv = pd.read_csv(tmp_path / "tables" / "summary.csv")
    assert "accuracy_or_mcc_mean" in csv and "accuracy_mean" not in csv  # the CSV names what it holds too
    alone = tmp_path / "toy_a_alone"  # toy_a on its own: every column of MCC is named MCC
    write_report(replace(results, datasets=["toy_a"]), alone, formats=("md", "csv"))
    assert "MCC (x100)" in md_rows(alone / "tables" / "summary.md")[0]
    assert "mcc_mean" in pd.read_csv(alone / "tables" / "summary.csv")


def test_no_failed_rows_in_a_table_of_splits_the_data_set_does_not_have(tmp_path, figures):
    """A data set without OOD splits (CoLA) has no OOD rows, not even for a method whose
    every seed failed: its README section says that no OOD split was evaluated."""
    results = make_results()
    keep = ~results.summary["split"].str.startswith("ood/")
    results = replace(results, summary=results.summary[keep].reset_index(drop=True),
                      splits={d: [s for s in sp if not s.startswith("ood/")] for d, sp in results.splits.items()})
    write_report(results, tmp_path, formats=("md",))
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    ood = readme_section(readme, "## toy_a").split("### OOD detection")[1].split("###")[0]
    assert "failed" not in ood and "No OOD split was evaluated." in ood
    summary = readme_section(readme, "## toy_a").split("### Summary")[1].split("###")[0]
    assert "| broken" in summary and "failed" in summary  # the summary still names the failed method


def test_training_curves_show_validation_nll_and_training_accuracy_mean_over_seeds(tmp_path, figures):
    write_report(make_results(), tmp_path, formats=("md",))
    for dataset, labels in (("toy_a", ["msp", "mc_dropout"]), ("toy b&c", ["msp", "mc_dropout (stage 2)"])):
        nll, acc = figures[f"training_{dataset.replace(' ', '_').replace('&', '_')}.png"]
        assert (nll["ylabel"], acc["ylabel"]) == ("validation NLL (nats)", "training accuracy (%)")
        assert nll["xlabel"] == acc["xlabel"] == "epoch" and acc["legend"] == labels
        epochs = np.arange(1, TRAINING_EPOCHS[dataset] + 1)
        for i, label in enumerate(labels):
            method = label.split(" ")[0]
            values = np.array([[training_value(dataset, method, s, e) for e in epochs] for s in SEEDS])  # [S, E, 2]
            for ax, column, scale in ((nll, 1, 1.0), (acc, 0, 100.0)):
                name, x, y = ax["lines"][i]
                assert name == label
                np.testing.assert_array_equal(x, epochs)
                np.testing.assert_allclose(y, scale * values[:, :, column].mean(axis=0))
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "![Training curves: toy_a (validation NLL and training accuracy per epoch, mean over seeds)]" \
           "(plots/training_toy_a.png)" in readme


def test_every_plot_title_names_the_run(tmp_path, figures):
    """A plot copied out of its report still says which run it shows (a 1-epoch try must
    not pass for the reference run)."""
    write_report(make_results(), tmp_path, formats=("md",), run=RunTitle("try1", "default", "--epochs 1"))
    assert len(figures) >= 5
    for name, axes in figures.items():
        titles = [ax["title"] for ax in axes] + [ax["suptitle"] for ax in axes]
        assert any("run try1" in t.splitlines() for t in titles), (name, titles)


def _calibrated_as(confidence: float, accuracy: float, n: int = 1000, extra: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` test images of 10 classes whose top probability is ``confidence`` (± 0.01)
    and whose top class is right for a share ``accuracy`` of them; ``extra`` more images at
    confidence 0.97, all wrong (a bin holding a handful of images)."""
    rng = np.random.default_rng(0)
    top = np.concatenate([np.clip(confidence + rng.uniform(-0.01, 0.01, n), 0.11, 0.99), np.full(extra, 0.97)])
    labels = rng.integers(0, 10, n + extra)
    right = np.concatenate([np.arange(n) < round(accuracy * n), np.zeros(extra, bool)])
    predicted = np.where(right, labels, (labels + 1) % 10)
    probs = np.repeat(((1 - top) / 9)[:, None], 10, axis=1)
    probs[np.arange(n + extra), predicted] = top
    return probs, labels


@pytest.fixture
def diagrams(monkeypatch) -> dict[str, dict]:
    """File name -> the reliability diagram saved there: its bar groups (label and, per bar,
    bottom, height, face colour, filled) and the figure's legend texts."""
    seen: dict[str, dict] = {}

    def savefig(fig: Figure, fname, *args, **kwargs):
        ax = fig.axes[0]
        seen[Path(fname).name] = {
            "bars": [(c.get_label(), [(p.get_y(), p.get_height(), p.get_facecolor(), p.get_fill()) for p in c.patches])
                     for c in ax.containers],
            "legend": [t.get_text() for legend in [*fig.legends, ax.get_legend()] if legend for t in legend.get_texts()],
        }

    monkeypatch.setattr(Figure, "savefig", savefig)
    return seen


def _diagram(tmp_path, diagrams, probs, labels) -> dict:
    results = replace(make_results(), load_predictions=lambda *_: (probs, labels))
    write_report(results, tmp_path, formats=("md",), methods=["msp"])
    return diagrams["reliability_toy_a_msp.png"]


def test_a_reliability_diagram_tells_under_from_over_confidence_by_colour_and_legend(tmp_path, diagrams):
    """An under-confident model (confidence 0.5, accuracy 0.95) does not look calibrated:
    its gaps are bars from the confidence up to the accuracy (no negative height covering
    the accuracy bar), in a colour of their own that the legend names; an over-confident
    model's gaps (confidence 0.95, accuracy 0.5) are in another."""
    under = _diagram(tmp_path / "under", diagrams, *_calibrated_as(0.5, 0.95))
    over = _diagram(tmp_path / "over", diagrams, *_calibrated_as(0.95, 0.5))
    for drawn in (under, over):
        assert all(height >= 0 for _, bars in drawn["bars"] for _, height, _, _ in bars), drawn["bars"]
    assert any(t.startswith("under-confident") for t in under["legend"]), under["legend"]
    assert not any(t.startswith("over-confident") for t in under["legend"]), under["legend"]
    assert any(t.startswith("over-confident") for t in over["legend"]), over["legend"]

    def gaps(drawn: dict, side: str) -> list[tuple]:
        (bars,) = [bars for label, bars in drawn["bars"] if label.startswith(side)]
        return bars

    ((bottom, height, under_colour, _),) = gaps(under, "under-confident")  # the one filled bin, 0.49-0.51
    assert bottom == pytest.approx(0.5, abs=0.01) and bottom + height == pytest.approx(0.95)
    ((bottom, height, over_colour, _),) = gaps(over, "over-confident")
    assert bottom == pytest.approx(0.5) and bottom + height == pytest.approx(0.95, abs=0.01)
    (accuracy_colour,) = {colour for label, bars in under["bars"] if label == "accuracy" for _, _, colour, _ in bars}
    assert len({under_colour[:3], over_colour[:3], accuracy_colour[:3]}) == 3


def test_a_reliability_bin_of_a_handful_of_images_is_drawn_in_outline(tmp_path, diagrams):
    """Two of 1,002 images in the 0.93-1.0 bin: its accuracy bar is an outline, named in
    the legend, beside the full bin's filled one."""
    drawn = _diagram(tmp_path, diagrams, *_calibrated_as(0.5, 0.5, extra=2))
    filled = {label: [fill for *_, fill in bars] for label, bars in drawn["bars"] if label.startswith("accuracy")}
    assert filled == {"accuracy": [True], "accuracy, bin with < 1% of images": [False]}, filled
    assert "accuracy, bin with < 1% of images" in drawn["legend"]


@pytest.fixture
def rendered(monkeypatch) -> dict[str, dict]:
    """File name -> a severity plot as saved: title, axis label, whether the axis label
    lies inside the figure, and per line its label, marker and data."""
    seen: dict[str, dict] = {}

    def savefig(fig: Figure, fname, *args, **kwargs):
        if not Path(fname).name.startswith("severity_"):
            return
        (ax,) = fig.axes
        fig.canvas.draw()  # as saving draws it: the label where the PNG has it
        box = ax.xaxis.label.get_window_extent(fig.canvas.get_renderer())
        seen[Path(fname).name] = {
            "title": ax.get_title(), "xlabel": ax.get_xlabel(),
            "xlabel_inside": fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0,
            "lines": [(line.get_label(), line.get_marker(), line.get_xdata(), line.get_ydata())
                      for line in ax.get_lines()],
        }

    monkeypatch.setattr(Figure, "savefig", savefig)
    return seen


def _severity_plots(tmp_path, rendered, results=None) -> dict[str, dict]:
    write_report(results or make_results(), tmp_path, formats=("md",))
    return {name: plot for name, plot in rendered.items() if name.startswith("severity_toy_a_")}


def test_a_severity_plot_says_its_calibration_band_is_approximate_and_biased_on_small_splits(tmp_path, rendered):
    """ECE's intervals are approximate: its band is '≈95% CI', and on splits of 50 samples
    the axis says its values are biased upward, not comparable with the summary's ECE;
    accuracy's plot says neither.  Every axis label fits inside the figure."""
    plots = _severity_plots(tmp_path, rendered)
    ece, accuracy = plots["severity_toy_a_ece.png"], plots["severity_toy_a_accuracy.png"]
    assert "band = ≈95% CI" in ece["title"] and "band = 95% CI" in accuracy["title"]
    said = " ".join(ece["xlabel"].split())
    assert f"ECE on {SAMPLES_PER_SPLIT} samples per split is biased upward" in said, said
    assert "biased" not in accuracy["xlabel"] and "≈" not in accuracy["title"]
    assert all(plot["xlabel_inside"] for plot in plots.values()), {n: p["xlabel"] for n, p in plots.items()}


def test_methods_with_equal_values_stay_apart_on_a_severity_plot(tmp_path, rendered):
    """mc_dropout given msp's very numbers (as temperature scaling has msp's accuracy): the
    two lines differ in marker and are shifted sideways, so neither hides the other."""
    results = make_results()
    severity = results.severity
    same = severity[severity.method == "msp"].assign(method="mc_dropout")
    results = replace(results, severity=pd.concat([severity[severity.method != "mc_dropout"], same]))
    plot = _severity_plots(tmp_path, rendered, results)["severity_toy_a_accuracy.png"]
    (msp,) = [line for line in plot["lines"] if line[0] == "msp"]
    (twin,) = [line for line in plot["lines"] if line[0] == "mc_dropout"]
    np.testing.assert_array_equal(msp[3], twin[3])  # the same values
    assert msp[1] != twin[1] and not np.allclose(msp[2], twin[2])
    np.testing.assert_allclose(np.round(msp[2]), np.round(twin[2]))  # each still at its severity
