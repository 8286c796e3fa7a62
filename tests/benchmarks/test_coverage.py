"""benchmarks/coverage.py, bounded: the report's intervals cover a known truth and its marks
stay at their level under the null, where the seeds-fixed construction does not.

A small version of the committed study (reports/perf/coverage.md): 120 simulated benchmarks
of 300 test images and 3 seeds per method with strong seed-level variation (seed sd 0.4 of
the margin), B = 200 resamples; a calibrated benchmark whose seeds miss the same images for
the debiased ECE; a small power study.
At 120 replicates an observed rate has a Monte-Carlo band of about +-4 points around 95%
and +-4 points around 5%; the bounds below allow for it.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.helpers import import_benchmarks

import_benchmarks()
import coverage as study  # noqa: E402

REPLICATES = 120
METRICS = ("accuracy", "nll", "aurc")


@pytest.fixture(scope="module")
def small():
    setting = replace(study.SETTINGS[0], name="small", n=300, seed_sd=0.4)
    return study.simulate(setting, REPLICATES, resamples=200, metrics=METRICS, seed=0)


@pytest.mark.parametrize("setting", [study.SETTINGS[0], study.SETTINGS[7]], ids=["own errors", "same images"])
def test_truth_by_quadrature_matches_a_large_sample(setting):
    """The population truth the study checks against, against one large simulated test set
    per seed skill (the seed-mean of 200 seeds of 20,000 images), for seeds that make
    their own errors and for seeds that miss the same images."""
    rng = np.random.default_rng(1)
    from bench.metrics import get_metric

    values = {name: [] for name in ("accuracy", "nll", "ece")}
    for _ in range(200):
        z = rng.normal(size=20_000)
        labels = rng.integers(0, setting.classes, z.size)
        probs = study._predictions(setting, rng, z, labels)
        for name in values:
            values[name].append(get_metric(name)(probs, labels))
    truth = study.truth(setting)
    assert np.mean(values["accuracy"]) == pytest.approx(truth["accuracy"], abs=0.003)
    assert np.mean(values["nll"]) == pytest.approx(truth["nll"], abs=0.01)
    assert np.mean(values["ece"]) == pytest.approx(truth["ece"], abs=0.004)  # plug-in bias ~0.002 at 20k


@pytest.mark.parametrize("metric", METRICS)
def test_seed_aware_intervals_cover_and_seeds_fixed_ones_do_not(small, metric):
    covered = small["covered"][(metric, "seeds+samples")] / REPLICATES
    assert 0.90 <= covered <= 0.99, covered
    # the construction the report used before: test samples only, seeds held fixed
    assert small["covered"][(metric, "samples, seeds fixed")] / REPLICATES < 0.85


@pytest.mark.parametrize("metric", METRICS)
def test_marks_under_the_null_fire_at_most_at_the_nominal_rate(small, metric):
    band = 1.96 * np.sqrt(0.05 * 0.95 / REPLICATES)
    assert small["rejected"][(metric, "seeds+samples")] / REPLICATES <= 0.05 + band
    assert small["family"]["seeds+samples"] / REPLICATES <= 0.05 + band
    # the seeds-fixed z-test fires far more often under the same null
    assert small["rejected"][(metric, "samples, seeds fixed")] / REPLICATES > 0.15


def test_same_images_settings_make_the_seeds_miss_the_same_images():
    """The per-image error correlation between two seeds, counted here with numpy: about 0.3
    where the seeds miss the same images (as in real benchmarks), about 0.05 where each
    seed makes its own errors."""
    rng = np.random.default_rng(2)

    def correlation(setting) -> float:
        z = rng.normal(size=50_000)
        labels = rng.integers(0, setting.classes, z.size)
        e1, e2 = (study._predictions(setting, rng, z, labels).argmax(axis=1) != labels for _ in range(2))
        return float(np.corrcoef(e1, e2)[0, 1])

    for setting in (s for s in study.SETTINGS if "same images" in s.name):
        assert 0.25 <= correlation(setting) <= 0.37, setting.name
    assert correlation(study.SETTINGS[0]) < 0.1


def test_the_debiased_ece_keeps_its_estimate_and_its_level_on_a_calibrated_model():
    """True ECE 0 (a calibrated model, seeds that miss the same images): the debiased ECE's
    interval is centred on its estimate (bias-corrected by construction), plug-in ECE's below
    its estimate (the bootstrap's bias correction), and the debiased ECE's test under the
    null fires at most at the nominal rate."""
    setting = replace(study.SETTINGS[9], name="calibrated, small", n=300)
    assert study.truth(setting)["ece"] < 1e-12
    res = study.simulate(setting, REPLICATES, resamples=200, metrics=("ece", "ece_debiased"), seed=3)
    assert res["center"]["ece_debiased"] == pytest.approx(res["estimate"]["ece_debiased"], abs=1e-9)
    assert res["center"]["ece"] < res["estimate"]["ece"] - 0.005 * REPLICATES  # at least 0.5 points below
    band = 1.96 * np.sqrt(0.05 * 0.95 / REPLICATES)
    assert res["rejected"][("ece_debiased", "seeds+samples")] / REPLICATES <= 0.05 + band


def test_seeds_at_power_interpolates_between_the_grid_points():
    assert study.seeds_at_power({3: 0.5, 5: 0.7, 10: 0.9}) == pytest.approx(7.5)  # 5 + (0.8 - 0.7) / 0.2 * 5
    assert study.seeds_at_power({3: 0.85, 5: 0.9}) == 3
    assert np.isinf(study.seeds_at_power({3: 0.1, 5: 0.2}))


def test_power_grows_with_seeds_and_falls_with_the_family_size():
    """A 5-point accuracy gain: marked more often with 10 seeds than with 3, less often in a
    Holm family of 60 than alone; the gain is the one asked for (by the quadrature truth)."""
    setting = study.POWER_SETTING
    better = study.with_accuracy_gain(setting, 0.05)
    assert study.truth(better)["accuracy"] - study.truth(setting)["accuracy"] == pytest.approx(0.05, abs=1e-5)
    r = 60
    res = study.power(setting, r, resamples=100, deltas=(0.05,), grid=(3, 10), families=(1, 60), printed_at=(10,))
    marked = {k[1:]: v / r for k, v in res["marked"].items()}
    assert marked[(10, 1)] > marked[(3, 1)] + 0.2 and marked[(10, 1)] > 0.8
    assert marked[(3, 60)] < marked[(3, 1)] and marked[(3, 60)] <= 0.1
    assert all(np.isfinite(res["needed"][(0.05, 10, 1)]))


def test_one_run_settings_alone_report_without_findings_and_bad_indices_are_exit_2(tmp_path, capsys):
    """--settings naming only the one-run setting has no seed-aware level to read off (it
    raised on an empty max); an index past SETTINGS is one line, exit 2."""
    one_run = next(i for i, st in enumerate(study.SETTINGS) if st.seeds == 1)
    out = tmp_path / "c.md"
    study.main(["--replicates", "2", "--resamples", "50", "--power-replicates", "0", "--settings", str(one_run),
                "--out", str(out)])
    assert "## Findings" not in out.read_text() and "## Run" in out.read_text()
    with pytest.raises(SystemExit) as stop:
        study.main(["--settings", str(len(study.SETTINGS)), "--out", str(out)])
    assert stop.value.code == 2 and "--settings takes indices" in capsys.readouterr().err


def test_holm_families_are_the_committed_reports_families():
    """Each reference suite's family size is the number of finite p-values among the paper
    metrics of its test split in the committed report (reports/<suite>/analysis/summary.csv),
    counted here with pandas."""
    import pandas as pd

    from bench.metrics import selection

    paper = set(selection("paper"))
    for suite, m in study.suite_families().items():
        summary = pd.read_csv(study.ROOT / "reports" / suite / "analysis" / "summary.csv")
        test = summary[(summary["split"] == "test") & summary["metric"].isin(paper) & summary["p_value"].notna()]
        assert test.groupby("dataset").size().tolist() == [m], suite
    assert set(study.suite_families().values()) <= set(study.FAMILIES)


def test_soft_thresholded_ece_at_zero_is_plug_in_ece_and_shrinks_each_gap():
    """c = 0 is plug-in ECE (bench.metrics' ece); one bin of 100 confidences 0.8 with 90
    correct: gap 0.1, s = sqrt(0.9 * 0.1 / 100) = 0.03, so c = 2 leaves 0.04 and c = 4 nothing."""
    from bench.metrics import get_metric

    rng = np.random.default_rng(4)
    probs = rng.dirichlet(np.ones(10), 500)
    labels = rng.integers(0, 10, 500)
    assert study.soft_thresholded_ece(probs, labels, (0.0,))[0] == pytest.approx(get_metric("ece")(probs, labels))
    one = np.full((100, 2), 0.2)
    one[:, 0] = 0.8
    hits = np.r_[np.zeros(90, int), np.ones(10, int)]
    assert study.soft_thresholded_ece(one, hits, (0.0, 2.0, 4.0)) == pytest.approx([0.1, 0.04, 0.0], abs=1e-12)


def test_l1_tradeoff_orders_the_estimators_at_true_ece_0():
    """At true ECE 0 plug-in ECE lies above the debiased ECE, which lies above 0; a larger
    soft threshold gives a smaller mean (a bin with accuracy 0 or 1 has s = 0 and keeps its
    gap, as in the debiased ECE, so even a huge threshold leaves those)."""
    calibrated = replace(study.TRADEOFF_SETTINGS[0], n=300)
    res = study.l1_tradeoff((calibrated,), 10, thresholds=(0.0, 1.0, 100.0))[calibrated.name]
    assert res["truth"] < 1e-12
    assert res["soft"][0] > res["ece_debiased"] > 0.0
    assert res["soft"][0] > res["soft"][1] > res["soft"][2] >= 0.0


def test_above_level_is_the_exact_one_sided_binomial_test():
    """Against scipy's binomtest (alternative "greater") and a hand count: 1 rejection in 1
    replicate at 5% has P(X >= 1) = 0.05; 0 rejections are no evidence at all (p = 1)."""
    from scipy.stats import binomtest

    for k, r in ((21, 300), (28, 300), (150, 3000), (3, 10)):
        assert study.above_level(k, r) == pytest.approx(binomtest(k, r, 0.05, alternative="greater").pvalue)
    assert study.above_level(1, 1) == pytest.approx(0.05)
    assert study.above_level(0, 300) == pytest.approx(1.0)


def test_level_check_tells_monte_carlo_error_from_a_rate_above_5_percent():
    """Fifty cells of 300 replicates at a true 5% (binomial draws) pass although about half
    lie above 5%; one cell at 12% (36 of 300: one-sided p 4e-6, times 51 cells still tiny)
    is flagged, and only that one."""
    rng = np.random.default_rng(5)
    exact = [(int(k), 300) for k in rng.binomial(300, 0.05, 50)]
    assert sum(k > 15 for k, _ in exact) >= 10  # many cells above 5% by chance alone
    assert study.level_check(exact)[1] == 0
    smallest, above = study.level_check(exact + [(36, 300)])
    assert above == 1 and smallest < 1e-3


def test_median_band_is_the_order_statistic_interval_of_the_median():
    """For 100 values the distribution-free 95% interval of the median runs from the 40th to
    the 61st order statistic (the binomial(100, 1/2) table); it covers the true median of a
    skewed distribution in about 95% of draws; NaN values are left out."""
    values = np.arange(1.0, 101.0)
    median, (low, high) = study.median_band(list(np.random.default_rng(6).permutation(values)))
    assert (median, low, high) == (50.5, 40.0, 61.0)
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(400):
        _, (lo, hi) = study.median_band(list(rng.exponential(size=200)))
        covered += lo <= np.log(2.0) <= hi
    assert 0.92 <= covered / 400 <= 0.99
    assert study.median_band([np.nan, 1.0, 2.0, 3.0])[0] == 2.0
