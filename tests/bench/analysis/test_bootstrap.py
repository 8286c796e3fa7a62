"""Tests for bench.analysis.bootstrap: paired bootstrap, intervals, p-values and Holm.

The reference for every bootstrap value is the metric itself (``bench.metrics``) applied to
the explicitly resampled arrays ``probs[idx[b]], labels[idx[b]]``; Holm and the p-value
rule are checked on hand-worked cases whose arithmetic is in the comments.
"""
from __future__ import annotations

import numpy as np
import pytest

import bench.metrics.resample as kernels  # what the vectorised kernels share
from bench.analysis import bootstrap
from bench.metrics import Metric, selection
from bench.core.registry import METRICS
from tests.helpers.synthetic import make_case

ATOL = 1e-9
# every metric with a vectorised kernel, found through the registry (no list of our own)
VECTORISED_CLASSIFICATION = [n for n in METRICS.names() if METRICS.get(n).bootstrap and not METRICS.get(n).on_scores]
VECTORISED_OOD = [n for n in METRICS.names() if METRICS.get(n).bootstrap and METRICS.get(n).on_scores]

# ----------------------------------------------------------------------------- helpers




def reference(name: str, idx: np.ndarray, *arrays: np.ndarray) -> np.ndarray:
    """The metric on each explicitly resampled data set ``arrays[k][idx[b]]``."""
    fn = METRICS.get(name)
    return np.array([fn(*(a[i] for a in arrays)) for i in idx])


def reference_ood(name: str, idx_id, idx_ood, s_id, s_ood) -> np.ndarray:
    fn = METRICS.get(name)
    return np.array([fn(s_id[a], s_ood[b]) for a, b in zip(idx_id, idx_ood)])


def assert_same(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert got.shape == expected.shape
    assert np.array_equal(np.isnan(got), np.isnan(expected)), f"{what}: NaN pattern differs"
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL, equal_nan=True, err_msg=what)


def correctness_case(correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two-class probabilities whose prediction is right exactly where ``correct`` is True."""
    labels = np.zeros(correct.shape[0], np.int64)
    probs = np.where(correct[:, None], [[0.9, 0.1]], [[0.1, 0.9]])
    return probs, labels


# ----------------------------------------------------------------- resample matrices


def test_resamples_are_seeded_sorted_and_consistent(monkeypatch):
    monkeypatch.setattr(kernels, "_CHUNK_ELEMENTS", 200)  # 4 rows per chunk: exercise the chunking
    idx = bootstrap.index_matrix(50, 30, seed=7)
    w = bootstrap.resample_weights(50, 30, seed=7)
    assert idx.shape == (30, 50) and w.shape == (30, 50)
    assert np.all(np.diff(idx, axis=1) >= 0)  # rows sorted
    assert np.array_equal(bootstrap.weights_from_index(idx, 50), w)
    assert np.array_equal(w.sum(axis=1), np.full(30, 50))
    for b in (0, 13, 29):  # counts are the row's bincount
        assert np.array_equal(w[b], np.bincount(idx[b], minlength=50))
    assert np.array_equal(bootstrap.index_matrix(50, 30, seed=7), idx)
    assert not np.array_equal(bootstrap.index_matrix(50, 30, seed=8), idx)
    # drawn in row chunks, yet the same stream as one integers(size=(B, n)) call
    draws = np.random.default_rng(7).integers(0, 50, size=(30, 50))
    assert np.array_equal(bootstrap.weights_from_index(draws, 50), w)
    # weights_from_index does not need sorted rows or M == n
    assert np.array_equal(bootstrap.weights_from_index(np.array([[2, 0, 2]]), 4), [[1, 0, 2, 0]])


def test_bad_weights_are_rejected():
    p, y = make_case(10, 3, 0, None)
    ok = bootstrap.resample_weights(10, 4, 0)
    for bad in (ok[:, :9], -ok, np.zeros((2, 10), int), ok + 0.5, ok[0]):
        with pytest.raises(ValueError):
            bootstrap.boot_metric("accuracy", p, y, bad)
    assert np.array_equal(bootstrap.boot_metric("accuracy", p, y, ok.astype(float)),
                          bootstrap.boot_metric("accuracy", p, y, ok))
    with pytest.raises(Exception, match="unknown metric"):
        bootstrap.boot_metric("acuracy", p, y, ok)
    with pytest.raises(ValueError):
        bootstrap.weights_from_index(np.array([[0, 10]]), 10)


# ------------------------------------------------------------ exactness of the bootstrap

CASES = [(seed, decimals) for seed in range(4) for decimals in (None, 2, 1)]


@pytest.mark.parametrize("seed,decimals", CASES)
def test_boot_metric_equals_metric_on_resampled_arrays(seed, decimals):
    """For every resample b: boot_metric(...)[b] == metric(probs[idx[b]], labels[idx[b]]),
    ties included (rounded probabilities: tied confidences, tied argmax)."""
    p, y = make_case(30 + 17 * seed, 3, seed, decimals)
    idx = bootstrap.index_matrix(y.shape[0], 40, seed=seed)
    w = bootstrap.weights_from_index(idx, y.shape[0])
    for name in VECTORISED_CLASSIFICATION:
        assert_same(bootstrap.boot_metric(name, p, y, w), reference(name, idx, p, y), f"{name} seed={seed} dec={decimals}")


def test_the_paper_selection_is_vectorised():
    """The metrics analysed by default all have a fast path (the others loop exactly)."""
    assert set(selection("paper")) <= set(VECTORISED_CLASSIFICATION) | set(VECTORISED_OOD)


def test_float32_and_bin_edges():
    """float32 confidences exactly on ECE bin edges (binned in float32, as the metric does)."""
    rng = np.random.default_rng(3)
    conf = rng.choice(np.array([0.2, 0.4, 1 / 3, 0.6, 0.8, 1.0], np.float32), size=60)
    probs = np.stack([conf, 1 - conf], axis=1).astype(np.float32)
    y = (rng.random(60) < 0.3).astype(np.int64)
    idx = bootstrap.index_matrix(60, 40, seed=3)
    w = bootstrap.weights_from_index(idx, 60)
    for name in VECTORISED_CLASSIFICATION:
        assert_same(bootstrap.boot_metric(name, probs, y, w), reference(name, idx, probs, y), name)


def test_fpr95_drop_intermediate_paths_are_both_exercised(monkeypatch):
    """FPR95 must reproduce sklearn's drop_intermediate on the resampled ROC points.  The
    fast path (nearest point kept) and the full search (nearest point dropped) both run."""
    calls = []
    full = kernels._fpr_at_tpr_kept_points

    def counting(*args):
        calls.append(1)
        return full(*args)

    monkeypatch.setattr(kernels, "_fpr_at_tpr_kept_points", counting)
    n_rows = 0
    for seed in range(3):
        p, y = make_case(80, 3, seed, None)  # distinct scores: straight runs of equal steps
        idx = bootstrap.index_matrix(80, 100, seed=seed)
        w = bootstrap.weights_from_index(idx, 80)
        got = bootstrap.boot_metric("failure_fpr95", p, y, w)
        assert_same(got, reference("failure_fpr95", idx, p, y), f"seed={seed}")
        n_rows += 100
    assert 0 < len(calls) < n_rows


def test_undefined_resamples_are_nan():
    # 1 error in 25: many resamples draw no error -> failure AUROC / FPR95 / AUPR-Error NaN
    correct = np.ones(25, bool)
    correct[7] = False
    p, y = correctness_case(correct)
    idx = bootstrap.index_matrix(25, 60, seed=1)
    w = bootstrap.weights_from_index(idx, 25)
    for name in VECTORISED_CLASSIFICATION:
        got = bootstrap.boot_metric(name, p, y, w)
        assert_same(got, reference(name, idx, p, y), name)
    auroc = bootstrap.boot_metric("failure_auroc", p, y, w)
    assert np.isnan(auroc).any() and not np.isnan(auroc).all()
    # all correct: undefined everywhere; all wrong: AUPR-Success undefined, E-AURC = 0
    p, y = correctness_case(np.ones(25, bool))
    assert np.isnan(bootstrap.boot_metric("failure_auroc", p, y, w)).all()
    assert np.isnan(bootstrap.boot_metric("failure_aupr_error", p, y, w)).all()
    p, y = correctness_case(np.zeros(25, bool))
    assert np.isnan(bootstrap.boot_metric("failure_aupr_success", p, y, w)).all()
    np.testing.assert_allclose(bootstrap.boot_metric("eaurc", p, y, w), 0.0, atol=ATOL)


@pytest.mark.parametrize("seed,decimals", [(0, None), (1, 1), (2, 0), (3, 1)])
def test_boot_ood_metric_equals_metric_on_resampled_arrays(seed, decimals):
    """ID and OOD resampled independently; rounded scores tie within and across the sides
    (including ties at the FPR95 threshold)."""
    rng = np.random.default_rng(seed)
    s_id = rng.normal(1.0, 1.0, 35 + seed)
    s_ood = rng.normal(0.0, 1.0, 28)
    if decimals is not None:
        s_id, s_ood = np.round(s_id, decimals), np.round(s_ood, decimals)
    idx_id = bootstrap.index_matrix(s_id.shape[0], 40, seed=seed)
    idx_ood = bootstrap.index_matrix(s_ood.shape[0], 40, seed=seed + 100)
    w_id, w_ood = bootstrap.weights_from_index(idx_id, s_id.shape[0]), bootstrap.weights_from_index(idx_ood, s_ood.shape[0])
    for name in VECTORISED_OOD:
        got = bootstrap.boot_ood_metric(name, s_id, s_ood, w_id, w_ood)
        assert_same(got, reference_ood(name, idx_id, idx_ood, s_id, s_ood), f"{name} seed={seed}")


def test_unvectorised_registered_metric_falls_back_to_exact_loop(monkeypatch):
    def top2_mass(probs, labels):  # a stand-in for a later metric variant
        return float(np.sort(probs, axis=1)[:, -2:].sum(axis=1).mean() + 0 * labels.sum())

    monkeypatch.setitem(METRICS._items, "test_top2_mass", Metric(
        "test_top2_mass", top2_mass, "calibration", "top2", "", True, "Mass of the two largest probabilities."))
    p, y = make_case(20, 4, 0, 2)
    idx = bootstrap.index_matrix(20, 10, seed=0)
    got = bootstrap.boot_metric("test_top2_mass", p, y, bootstrap.weights_from_index(idx, 20))
    assert_same(got, reference("test_top2_mass", idx, p, y), "fallback")


# --------------------------------------------------------------------- intervals


def test_accuracy_ci_matches_normal_approximation():
    rng = np.random.default_rng(0)
    n = 4000
    correct = rng.random(n) < 0.8
    p, y = correctness_case(correct)
    acc = bootstrap.boot_metric("accuracy", p, y, bootstrap.resample_weights(n, 1000, seed=0))
    low, high = bootstrap.bootstrap_ci(acc)
    phat = correct.mean()
    half = 1.96 * np.sqrt(phat * (1 - phat) / n)  # ~0.0124
    assert abs(low - (phat - half)) < 0.2 * half
    assert abs(high - (phat + half)) < 0.2 * half


def test_bootstrap_ci_rules():
    v = np.arange(101, dtype=float)  # percentiles 2.5 and 97.5 of 0..100
    assert bootstrap.bootstrap_ci(v) == pytest.approx((2.5, 97.5))
    assert bootstrap.bootstrap_ci(np.append(v, [np.nan, np.nan])) == pytest.approx((2.5, 97.5))  # NaN ignored
    assert bootstrap.bootstrap_ci(v, level=0.5) == pytest.approx((25.0, 75.0))
    assert all(np.isnan(bootstrap.bootstrap_ci(np.full(5, np.nan))))
    with pytest.raises(ValueError):
        bootstrap.bootstrap_ci(v, level=95)


def test_same_seed_same_interval():
    p, y = make_case(300, 5, 1, 2)
    cis = [
        bootstrap.bootstrap_ci(bootstrap.boot_metric("failure_auroc", p, y, bootstrap.resample_weights(300, 200, seed=s)))
        for s in (5, 5, 6)
    ]
    assert cis[0] == cis[1]
    assert cis[0] != cis[2]


def test_pairing_shrinks_the_spread_of_a_difference():
    """Two methods that disagree on 10 of 2,000 samples: the paired bootstrap difference
    varies only through those 10 samples; independent resampling adds both accuracies'
    full sampling noise (sd ~ sqrt(2 * 0.16 / 2000) = 0.0126 vs ~ sqrt(10) / 2000 = 0.0016)."""
    rng = np.random.default_rng(2)
    n = 2000
    correct_a = rng.random(n) < 0.8
    correct_b = correct_a.copy()
    flip = rng.choice(n, 10, replace=False)
    correct_b[flip] = ~correct_b[flip]
    (pa, y), (pb, _) = correctness_case(correct_a), correctness_case(correct_b)
    w, w_other = bootstrap.resample_weights(n, 1000, seed=0), bootstrap.resample_weights(n, 1000, seed=1)
    paired = bootstrap.boot_metric("accuracy", pa, y, w) - bootstrap.boot_metric("accuracy", pb, y, w)
    unpaired = bootstrap.boot_metric("accuracy", pa, y, w) - bootstrap.boot_metric("accuracy", pb, y, w_other)
    assert paired.std() < 0.3 * unpaired.std()
    assert np.all(np.abs(paired) <= 10 * 10 / n)  # at most 10 flips, each drawn <= ~10 times


def test_seed_mean_distribution():
    a, b, c = np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, np.nan]), np.array([2.0, 2.0, 0.0])
    np.testing.assert_array_equal(bootstrap.seed_mean_distribution([a, b, c])[:2], [2.0, 2.0])
    assert np.isnan(bootstrap.seed_mean_distribution([a, b, c])[2])
    # per seed on the same resamples: the CI of the seed-mean is narrower than one seed's
    p1, y = make_case(400, 4, 0, None)
    p2, _ = make_case(400, 4, 0, None)
    p2 = np.roll(p2, 1, axis=1)  # another "seed": a different predictor on the same labels
    w = bootstrap.resample_weights(400, 300, seed=0)
    per_seed = [bootstrap.boot_metric("nll", q, y, w) for q in (p1, p2)]
    mean = bootstrap.seed_mean_distribution(per_seed)
    np.testing.assert_allclose(mean, (per_seed[0] + per_seed[1]) / 2)
    with pytest.raises(ValueError):
        bootstrap.seed_mean_distribution([a, a[:2]])
    with pytest.raises(ValueError):
        bootstrap.seed_mean_distribution([])


# ---------------------------------------------------------------------- p-values


def test_identical_methods_give_p_one_and_different_ones_small_p():
    rng = np.random.default_rng(4)
    n = 1000
    w = bootstrap.resample_weights(n, 1000, seed=0)
    correct_a = rng.random(n) < 0.9
    pa, y = correctness_case(correct_a)
    acc_a = bootstrap.boot_metric("accuracy", pa, y, w)
    assert bootstrap.paired_z_test(acc_a - acc_a, 0.0) == 1.0

    correct_b = correct_a & (rng.random(n) < 0.78)  # ~0.7 accuracy, always worse
    pb, _ = correctness_case(correct_b)
    acc_b = bootstrap.boot_metric("accuracy", pb, y, w)
    observed = correct_a.mean() - correct_b.mean()
    assert bootstrap.paired_z_test(acc_a - acc_b, observed) < 0.01
    assert bootstrap.paired_z_test(acc_b - acc_a, -observed) < 0.01
    # and for a sort-based metric
    au_a = bootstrap.boot_metric("failure_auroc", pa, y, w)
    assert bootstrap.paired_z_test(au_a - au_a, 0.0) == 1.0


# -------------------------------------------------------------------------- Holm


def test_holm_hand_worked():
    # p = [0.01, 0.04, 0.03, 0.005], m = 4.  Sorted: 0.005 (#3), 0.01 (#0), 0.03 (#2), 0.04 (#1).
    # Multipliers m - j + 1 = 4, 3, 2, 1:  4*0.005 = 0.02, 3*0.01 = 0.03, 2*0.03 = 0.06, 1*0.04 = 0.04.
    # Running maximum (monotone step-down):   0.02,        0.03,        0.06,        0.06.
    # Back in input order: #0 -> 0.03, #1 -> 0.06, #2 -> 0.06, #3 -> 0.02.
    np.testing.assert_allclose(bootstrap.holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    # cap at 1: [0.5, 0.6] -> 2*0.5 = 1.0, max(1.0, 1*0.6) = 1.0
    np.testing.assert_allclose(bootstrap.holm([0.5, 0.6]), [1.0, 1.0])
    # NaN stays NaN and is not counted: m = 2 -> 2*0.01 = 0.02, max(0.02, 0.04) = 0.04
    np.testing.assert_allclose(bootstrap.holm([0.01, np.nan, 0.04]), [0.02, np.nan, 0.04])
    np.testing.assert_allclose(bootstrap.holm([0.2]), [0.2])
    assert bootstrap.holm([]).shape == (0,)
    with pytest.raises(ValueError):
        bootstrap.holm([0.5, 1.5])


def test_holm_agrees_with_the_step_down_procedure():
    """adj_i <= alpha exactly when Holm's procedure at level alpha rejects H_i: compare
    p_(k) with alpha / (m - k + 1) in ascending order and stop at the first failure."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = int(rng.integers(1, 8))
        p = np.round(rng.random(m) ** 3, 3)
        adj = bootstrap.holm(p)
        assert np.all(adj >= p) and np.all(adj <= 1)
        for alpha in (0.01, 0.05, 0.1, 0.2):
            rejected = np.zeros(m, bool)
            for k, i in enumerate(np.argsort(p, kind="stable")):
                if p[i] > alpha / (m - k):
                    break
                rejected[i] = True
            assert np.array_equal(adj <= alpha, rejected), (p, alpha)


def test_paired_z_test_matches_the_normal_tail_and_is_not_floored_by_b():
    from scipy.stats import norm

    rng = np.random.default_rng(3)
    diff = rng.normal(0.05, 0.01, 1000)  # effect 5 standard errors away from 0
    se = diff.std(ddof=1)
    assert bootstrap.paired_z_test(diff, 0.05) == pytest.approx(2 * norm.sf(0.05 / se))
    assert bootstrap.paired_z_test(diff, 0.05) < 2 / 1001 / 100  # far below the percentile test's floor
    assert bootstrap.paired_z_test(diff, 0.0) == 1.0
    assert bootstrap.paired_z_test(np.zeros(10), 0.1) == 0.0
    assert np.isnan(bootstrap.paired_z_test(np.full(5, np.nan), 0.1))
    # a clear effect survives Holm over 60 comparisons, which a percentile-count p-value
    # (at least 2/(B+1) = 0.002, times 60 > 0.05) cannot
    assert bootstrap.holm([bootstrap.paired_z_test(diff, 0.05)] + [0.5] * 59)[0] < 0.05
    assert 60 * 2 / 1001 > 0.05


# --------------------------------------------- seeds and test samples (two-level statistics)

def flat(units: dict, b: int = 100) -> dict:
    """Bootstrap rows without test-sample noise: every resample gives the full-set value."""
    return {k: np.full(b, v) for k, v in units.items()}


def test_two_level_without_test_noise_is_the_classical_t_interval_and_t_tests():
    """With no test-sample noise the seed-mean interval is Student's t interval and the
    difference tests are scipy's paired and Welch t-tests."""
    from scipy import stats as sp

    a, b = np.array([0.71, 0.80, 0.86, 0.78]), np.array([0.75, 0.84, 0.85, 0.90])
    units_a, units_b = dict(enumerate(a)), dict(enumerate(b))
    lo, hi = bootstrap.seed_mean(units_a, flat(units_a)).interval()
    assert (lo, hi) == pytest.approx(sp.t.interval(0.95, len(a) - 1, loc=a.mean(), scale=sp.sem(a)), rel=1e-12)
    paired = bootstrap.difference(units_a, flat(units_a), units_b, flat(units_b), paired=True)
    assert paired.p_value() == pytest.approx(sp.ttest_rel(a, b).pvalue, rel=1e-10) and paired.measured
    # unpaired: Welch's statistic on the smaller S - 1 degrees of freedom (Hsu's conservative df)
    welch = bootstrap.difference(units_a, flat(units_a), units_b, flat(units_b), paired=False)
    t_welch = (a.mean() - b.mean()) / np.sqrt(a.var(ddof=1) / 4 + b.var(ddof=1) / 4)
    assert t_welch == pytest.approx(sp.ttest_ind(a, b, equal_var=False).statistic, rel=1e-12)
    assert welch.p_value() == pytest.approx(2 * sp.t.sf(abs(t_welch), 3), rel=1e-10)
    # units keyed by different seeds cannot be paired: Welch
    other = {k + 10: v for k, v in units_b.items()}
    assert bootstrap.difference(units_a, flat(units_a), other, flat(other), paired=True).p_value() == pytest.approx(
        welch.p_value(), rel=1e-12)


def test_two_level_of_single_runs_is_the_bootstrap_z_test_and_seeds_without_spread_use_t():
    from scipy.stats import norm, t

    rng = np.random.default_rng(3)
    noise = rng.normal(0.0, 0.01, (3, 2000))
    noise -= noise.mean(axis=1, keepdims=True)  # no bootstrap bias: the centre stays at the point
    boots_a, boots_b = {0: 0.80 + noise[0]}, {0: 0.78 + noise[1]}
    diff = boots_a[0] - boots_b[0]
    one = bootstrap.difference({0: 0.80}, boots_a, {0: 0.78}, boots_b, paired=True)
    assert not one.measured and one.p_value() == pytest.approx(bootstrap.paired_z_test(diff, 0.02), rel=1e-10)
    assert one.p_value() == pytest.approx(2 * norm.sf(0.02 / diff.std(ddof=1)), rel=1e-10)
    # three seeds that agree exactly, every seed with the same test-sample noise: the
    # bootstrap variance is all shared, and the t quantile has S - 1 = 2 df
    three_a = {k: 0.80 + noise[0] for k in range(3)}
    three_b = {k: 0.78 + noise[1] for k in range(3)}
    est = bootstrap.difference(dict.fromkeys(range(3), 0.80), three_a, dict.fromkeys(range(3), 0.78), three_b, paired=True)
    assert est.measured and est.df == 2
    assert est.p_value() == pytest.approx(2 * t.sf(0.02 / diff.std(ddof=1), 2), rel=1e-10)


def test_a_difference_where_nothing_varied_is_not_a_significant_one():
    """Temperature scaling on a binary task ranks like msp: the same per-seed values, and
    resamples that differ by a constant 1e-9 (float rounding) plus each seed's own
    +-noise. Nothing varies that a re-run could show (se 0 after the own-noise correction),
    so no test can claim the centre of -1e-9 is a difference; before, p was 0 (a mark)."""
    rng = np.random.default_rng(7)
    noise = rng.normal(0.0, 0.01, 500)
    base = {0: 0.9 + noise, 1: 0.8 - noise}
    ts = {0: base[0] + 1e-9 + noise * 1e-3, 1: base[1] + 1e-9 - noise * 1e-3}
    units = {0: 0.9, 1: 0.8}
    rounded = {0: 0.9 + 1e-9, 1: 0.8 + 1e-9}
    est = bootstrap.difference(rounded, ts, units, base, paired=True)
    assert est.se == 0.0 and est.center != 0.0  # the case: nothing varied, a rounding-size centre
    assert not est.p_value() < 0.05
    assert not bootstrap.seeds_needed(rounded, ts, units, base, paired=True) < 1000


def test_two_level_variance_counts_each_seeds_own_test_noise_once():
    """se^2 = V_T + s^2/S - (mean_s V_s - V_T)/(S - 1) (the crossed-design estimate of the
    module docstring), written out with numpy; one run: the bootstrap alone."""
    rng = np.random.default_rng(5)
    shared = rng.normal(0.0, 0.01, 1000)  # the test images' effect, common to every seed
    rows = np.stack([0.8 + d + shared + rng.normal(0.0, 0.02, 1000) for d in (-0.05, 0.0, 0.06)])
    units = {k: float(rows[k].mean()) for k in range(3)}
    est = bootstrap.seed_mean(units, dict(enumerate(rows)))
    v_t, v_s = rows.mean(axis=0).var(ddof=1), rows.var(axis=1, ddof=1).mean()
    variance = np.var(list(units.values()), ddof=1) / 3 + v_t - (v_s - v_t) / 2
    assert est.se == pytest.approx(np.sqrt(variance), rel=1e-12)
    assert est.df == 2
    one = bootstrap.seed_mean({0: units[0]}, {0: rows[0]})
    assert not one.measured and one.se == pytest.approx(rows[0].std(ddof=1), rel=1e-12) and np.isinf(one.df)


def test_two_level_centre_removes_the_bootstrap_bias():
    """A statistic whose resamples run 0.01 above it (as plug-in ECE's do): the interval is
    centred 0.01 below the point, where the percentile interval sits 0.01 above."""
    row = np.random.default_rng(0).normal(0.06, 0.005, 1000)
    est = bootstrap.seed_mean({0: 0.05}, {0: row})
    assert est.center == pytest.approx(0.05 - (row.mean() - 0.05), abs=1e-12)
    lo, hi = est.interval()
    assert (lo + hi) / 2 == pytest.approx(est.center) and hi < bootstrap.bootstrap_ci(row)[1] - 0.015


def _c4(k: int) -> float:
    """E[s] / sigma for the sample sd s of k normal values, from the chi distribution's mean
    (s sqrt(k - 1) / sigma is chi with k - 1 df)."""
    from scipy import stats as sp

    return float(sp.chi(k - 1).mean() / np.sqrt(k - 1))


def _four_seeds(sd: float) -> dict[int, float]:
    """Four per-seed differences with mean 1 and sample sd ``sd``."""
    return dict(enumerate(np.array([1.0, -1.0, 1.0, -1.0]) * np.sqrt(3) / 2 * sd + 1.0))


def test_seeds_needed_reaches_80_percent_power_by_the_noncentral_t():
    """Paired, no test noise, effect size 1 (difference = the seed sd as seeds_needed
    estimates it, s / c4 with c4 from the chi distribution): the exact power of the paired
    t-test (noncentral t) is >= 0.8 at the returned count and < 0.8 one seed fewer; G*Power's
    table gives 10 for this case."""
    from scipy import stats as sp

    def power(n: int, effect: float) -> float:
        crit = sp.t.ppf(0.975, n - 1)
        nc = effect * np.sqrt(n)
        return sp.nct.sf(crit, n - 1, nc) + sp.nct.cdf(-crit, n - 1, nc)

    a = _four_seeds(_c4(4))  # s / c4 = 1
    b = dict.fromkeys(range(4), 0.0)
    n = bootstrap.seeds_needed(a, flat(a), b, flat(b), paired=True)
    assert n == 10
    assert power(int(n), 1.0) >= 0.79 and power(int(n) - 1, 1.0) < 0.8
    # test-image noise shared by every seed, larger than the difference can carry: no seed count helps
    shared = np.random.default_rng(1).normal(0.0, 3.0, 500)
    assert np.isinf(bootstrap.seeds_needed(a, {k: v + shared for k, v in a.items()}, b, flat(b, 500), paired=True))
    # no difference at all (temperature scaling's accuracy, say): never significant
    assert np.isinf(bootstrap.seeds_needed(a, flat(a), a, flat(a), paired=True))
    # a side with one run: its seed variance is unknown
    assert np.isnan(bootstrap.seeds_needed({0: 1.0}, flat({0: 1.0}), {0: 0.0}, flat({0: 0.0}), paired=True))


def test_a_difference_observed_to_be_zero_is_not_marked_by_the_bootstrap_bias():
    """FPR95 at 100% for both methods in every seed (a saturated metric on an easy OOD
    set): the resamples of one side dip below 100% now and then, the other's never do, so
    a centre less the bootstrap's bias would be that dip, with a tiny se; an observed
    difference of exactly 0 is no evidence of one (the zoo report marked such pairs better
    and worse)."""
    rng = np.random.default_rng(3)
    dips = {k: np.where(rng.random(1000) < 0.1, 0.99, 1.0) for k in range(3)}
    flat = {k: np.ones(1000) for k in range(3)}
    units = dict.fromkeys(range(3), 1.0)
    est = bootstrap.difference(units, dips, units, flat, paired=True)
    assert est.center == 0.0 and est.p_value() == 1.0
    # a real difference of the same size is still tested on its centre
    shifted = bootstrap.difference(units, dips, dict.fromkeys(range(3), 0.99), flat, paired=True)
    assert shifted.center != 0.0


def test_a_bias_corrected_estimate_is_centred_on_itself_and_others_lose_the_bootstrap_bias():
    """Resamples that run 0.01 above the estimate (as a binned calibration error's do): a
    metric bias-corrected by construction (the debiased ECE) keeps its estimate as the
    centre of its interval, a plug-in one is moved 0.01 below it; a difference of two is
    tested on its observed value (two equal methods share their bias) unless asked to
    subtract the bootstrap's bias estimate."""
    from scipy import stats as sp

    rng = np.random.default_rng(2)
    rows_a = {k: v + rng.normal(0.0, 0.004, 1000) for k, v in {0: 0.06, 1: 0.07, 2: 0.065}.items()}
    rows_b = {k: v + rng.normal(0.0, 0.004, 1000) for k, v in {0: 0.05, 1: 0.058, 2: 0.049}.items()}
    units_a, units_b = {0: 0.05, 1: 0.06, 2: 0.055}, {0: 0.04, 1: 0.048, 2: 0.039}
    point = np.mean(list(units_a.values()))
    boot_mean = np.mean([r.mean() for r in rows_a.values()])
    assert bootstrap.seed_mean(units_a, rows_a, bias_corrected=True).center == pytest.approx(point, abs=1e-15)
    assert bootstrap.seed_mean(units_a, rows_a).center == pytest.approx(2 * point - boot_mean, abs=1e-12)
    lo, hi = bootstrap.seed_mean(units_a, rows_a, bias_corrected=True).interval()
    assert (lo + hi) / 2 == pytest.approx(point, abs=1e-12)
    diff = np.mean(list(units_a.values())) - np.mean(list(units_b.values()))
    est = bootstrap.difference(units_a, rows_a, units_b, rows_b, paired=True, bias_corrected=True)
    assert est.center == pytest.approx(diff, abs=1e-15)
    assert est.p_value() == pytest.approx(2 * sp.t.sf(abs(diff) / est.se, 2), rel=1e-12)
    plain = bootstrap.difference(units_a, rows_a, units_b, rows_b, paired=True)  # any metric's test: the observed difference
    assert plain.center == pytest.approx(diff, abs=1e-15) and plain.se == est.se
    shifted = bootstrap.difference(units_a, rows_a, units_b, rows_b, paired=True, bias_corrected=False)
    boot_diff = boot_mean - np.mean([r.mean() for r in rows_b.values()])
    assert shifted.se == est.se and shifted.center == pytest.approx(2 * diff - boot_diff, abs=1e-12)


def test_seeds_needed_in_a_holm_family_uses_alpha_over_its_size():
    """No test-sample noise, paired seeds with difference mean 1 and s / c4 = 1: the count is
    the smallest S with 1 / (1 / sqrt(S)) >= t_{1 - 0.05/(2m)}(S - 1) + t_{0.8}(S - 1) (scipy,
    written out here), for the family sizes of a one-method table (10) and of the default
    suite (60)."""
    from scipy import stats as sp

    a = _four_seeds(_c4(4))
    b = dict.fromkeys(range(4), 0.0)

    def expected(m: int) -> int:
        return next(s for s in range(2, 1001)
                    if np.sqrt(s) >= sp.t.ppf(1 - 0.05 / (2 * m), s - 1) + sp.t.ppf(0.8, s - 1))

    assert bootstrap.seeds_needed(a, flat(a), b, flat(b), paired=True) == expected(1) == 10
    for m in (10, 60):
        assert bootstrap.seeds_needed(a, flat(a), b, flat(b), paired=True, family=m) == expected(m)
    assert expected(60) > expected(10) > expected(1)
    with pytest.raises(ValueError, match="family must be a positive integer"):
        bootstrap.seeds_needed(a, flat(a), b, flat(b), paired=True, family=0)
