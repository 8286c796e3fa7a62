"""Golden tests for the named metric variants of bench.metrics (docs/reference/metrics.md).

Every expected value is worked out independently of the code under test: by hand (the
arithmetic is in the comments, exact fractions where possible), with scikit-learn/scipy,
with literal ports of the reference suites' code (torchmetrics, fd-shifts, OpenOOD,
TorchUncertainty, Hendrycks' calibration_tools) written here, or with brute-force Python
loops.  Pitfalls of metrics.md section 9 are covered: confidences on bin edges and at 1.0,
tied confidences, empty bins, all-correct / all-wrong sets, r = 0 and r -> 1 for E-AURC,
FPR95 with ID and OOD tied at the threshold, and nearest-TPR vs first-TPR >= 0.95.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import entropy as scipy_entropy
from sklearn.metrics import (
    auc,
    average_precision_score,
    brier_score_loss,
    precision_recall_curve,
    roc_curve,
)

import bench.metrics as M
from bench.core.registry import METRICS
from tests.helpers.synthetic import make_case

# ----------------------------------------------------------------------------- helpers




def conf_correct(p, y):
    p = np.asarray(p, dtype=np.float64)
    return p.max(axis=1), p.argmax(axis=1) == y


def rows(confs, correct):
    """Two-class rows [c, 0] (prediction 0, confidence c); label 0 if correct else 1.

    Rows need not sum to 1 for the metrics, which lets a row carry any confidence.
    """
    p = np.stack([np.asarray(confs, float), np.zeros(len(confs))], axis=1)
    y = np.where(np.asarray(correct, bool), 0, 1).astype(np.int64)
    return p, y


def binned_loop(values, hits, bin_of, norm="l1"):
    """Brute force: group pair indices by ``bin_of(i)`` in a dict, then reduce.

    l1: sum_m (n_m/n)|acc_m - conf_m|; l2: sqrt of sum_m (n_m/n)(acc_m - conf_m)^2;
    max: max_m |acc_m - conf_m| over the (necessarily non-empty) groups.
    """
    groups: dict = {}
    for i in range(len(values)):
        groups.setdefault(bin_of(i), []).append(i)
    n = len(values)
    terms = []
    for members in groups.values():
        acc = sum(float(hits[i]) for i in members) / len(members)
        conf = sum(float(values[i]) for i in members) / len(members)
        terms.append((len(members), abs(acc - conf)))
    if norm == "l1":
        return sum(k / n * g for k, g in terms)
    if norm == "l2":
        return math.sqrt(sum(k / n * g * g for k, g in terms))
    return max(g for _, g in terms)


def upper_closed_bin(c, n_bins=15):
    """(lo, hi] bin of c by an explicit scan of the edges k/B (c = 0 -> bin 0)."""
    for m in range(n_bins):
        if c <= (m + 1) / n_bins:
            return m
    raise AssertionError(c)


def kepsvgp_bin(c, n_bins=15):
    """(lo, hi] bin of c against the float32 edges torch.linspace itself returns, compared in
    float64 (the KEP-SVGP reference's bins; c = 0 -> bin 0)."""
    import torch

    edges = [float(e) for e in torch.linspace(0, 1, n_bins + 1)]
    for m in range(n_bins):
        if c <= edges[m + 1]:
            return m
    raise AssertionError(c)


RANDOM_CASES = [(40, 3, 0, None), (600, 5, 1, None), (1500, 10, 2, None), (500, 4, 3, 1), (800, 3, 4, 2)]
TIE_FREE = [(40, 3, 0, None), (600, 5, 1, None), (1500, 10, 2, None)]

# ====================================================================== calibration


# ---- ECE (lo, hi] vs torchmetrics' [lo, hi) with a hidden bin for 1.0

ONE_P = np.array([[1.0, 0.0], [0.95, 0.05], [0.5, 0.5]])
ONE_Y = np.array([1, 0, 0])  # c = 1.0 WRONG, c = 0.95 correct, c = 0.5 correct (argmax tie -> 0)


def test_confidence_one_last_bin_vs_hidden_bin():
    # 15 bins, width 1/15.  ece, (lo, hi]:
    #   bin 14 (0.9333, 1]: {1.0 wrong, 0.95 correct} -> |1 - 1.95| = 0.95
    #   bin 7 (0.4667, 0.5333]: {0.5 correct}          -> |1 - 0.5|  = 0.5     ECE = 1.45/3
    assert M.ece(ONE_P, ONE_Y) == pytest.approx(1.45 / 3, abs=1e-12)
    # ece_torchmetrics, [lo, hi): 1.0 alone in the hidden 16th bin -> |0 - 1| = 1
    #   bin 14 [0.9333, 1): {0.95 correct} -> |1 - 0.95| = 0.05;  bin 7: 0.5   ECE = 1.55/3
    # (0.95 and 0.5 are float32-rounded by torchmetrics: abs tolerance 1e-7)
    assert M.ece_torchmetrics(ONE_P, ONE_Y) == pytest.approx(1.55 / 3, abs=1e-7)
    # the difference is exactly the pooling at 1.0: (|0-1| + |1-0.95| - |1-1.95|) / 3
    diff = (abs(0 - 1.0) + abs(1 - 0.95) - abs(1 - 1.95)) / 3
    assert M.ece_torchmetrics(ONE_P, ONE_Y) - M.ece(ONE_P, ONE_Y) == pytest.approx(diff, abs=1e-7)
    # fd-shifts' stretched edges keep 1.0 in its last bin (20 bins: (0.95, 1.0] pooled):
    #   bin 19 [0.9500000095, 1.00000001): {1.0 wrong} only, since 0.95 < 0.9500000095 ->
    #   bin 18 [0.90000001, 0.9500000095): {0.95 correct};  bin 9 [0.45.., 0.50000001): 0.5
    #   (|0 - 1| + |1 - 0.95| + |1 - 0.5|) / 3 = 1.55 / 3
    assert M.ece_fdshifts(ONE_P, ONE_Y) == pytest.approx(1.55 / 3, abs=1e-12)
    # MCE, (lo, hi] bins: bin 14 |0.5 - 0.975| = 0.475, bin 7 |1 - 0.5| = 0.5 -> 0.5
    assert M.mce(ONE_P, ONE_Y) == pytest.approx(0.5, abs=1e-12)


def test_torchmetrics_float32_cast_sends_near_one_to_hidden_bin():
    # float64 1 - 1e-10 rounds to float32 1.0 (torchmetrics casts with .float())
    p = np.array([[1.0 - 1e-10, 1e-10], [0.97, 0.03]])
    y = np.array([1, 0])  # first wrong, second correct
    # ece: both in bin 14 -> |1 - (0.9999999999 + 0.97)| / 2
    assert M.ece(p, y) == pytest.approx(abs(1 - (1 - 1e-10 + 0.97)) / 2, abs=1e-12)
    # torchmetrics: hidden bin {1.0 wrong} -> 1;  bin 14 {float32(0.97) correct}
    c97 = float(np.float32(0.97))
    assert M.ece_torchmetrics(p, y) == pytest.approx((1.0 + abs(1 - c97)) / 2, abs=1e-12)


# 4 classes, n_bins = 4: the edges 0.25, 0.5, 0.75 are exact in any precision
EDGE_P = np.array(
    [
        [0.5, 0.5, 0.0, 0.0],  # c = 0.5  (edge), pred 0, label 0 -> correct
        [0.75, 0.25, 0.0, 0.0],  # c = 0.75 (edge), pred 0, label 1 -> wrong
        [0.25, 0.25, 0.25, 0.25],  # c = 0.25 (edge), pred 0, label 0 -> correct
        [0.6, 0.4, 0.0, 0.0],  # c = 0.6, pred 0, label 0 -> correct
    ]
)
EDGE_Y = np.array([0, 1, 0, 0])


def test_edges_upper_closed_vs_lower_closed():
    # (lo, hi]: 0.25 -> bin 0, 0.5 -> bin 1, 0.6 and 0.75 -> bin 2
    #   |1 - .25| + |1 - .5| + |1 - 1.35| = .75 + .5 + .35 = 1.6  -> 1.6 / 4
    assert M.ece(EDGE_P, EDGE_Y, n_bins=4) == pytest.approx(0.4, abs=1e-12)
    # [lo, hi) (torchmetrics): 0.25 -> bin 1, 0.5 and 0.6 -> bin 2, 0.75 -> bin 3
    #   |1 - .25| + |2 - 1.1| + |0 - .75| = .75 + .9 + .75 = 2.4  -> 2.4 / 4
    assert M.ece_torchmetrics(EDGE_P, EDGE_Y, n_bins=4) == pytest.approx(0.6, abs=1e-7)
    # fd-shifts edges k (1 + 1e-8) / 4 lie just above k/4, so exact edges stay low: = (lo, hi]
    assert M.ece_fdshifts(EDGE_P, EDGE_Y, n_bins=4) == pytest.approx(0.4, abs=1e-12)


def test_fdshifts_twenty_bins_hand():
    # 20 bins.  c = 0.2 (5 equal classes) is just below the stretched edge 0.2000000020 -> bin 3
    p = np.array([[1.0, 0, 0, 0, 0], [0.2] * 5, [0.97, 0.03, 0, 0, 0]])
    y = np.array([0, 0, 1])  # 1.0 correct, 0.2 correct, 0.97 wrong
    # bin 19 [0.9500000095, 1.00000001): {1.0 ok, 0.97 wrong} -> |1 - 1.97| = 0.97
    # bin 3: {0.2 ok} -> 0.8.   ECE = 1.77 / 3
    assert M.ece_fdshifts(p, y) == pytest.approx(1.77 / 3, abs=1e-12)


# ---- all-class, class-wise, MCE-all (3 classes; no value on a k/15 edge)

ALL_P = np.array([[0.45, 0.44, 0.11], [0.7, 0.25, 0.05]])
ALL_Y = np.array([0, 2])  # row 0: pred 0 = label -> correct; row 1: pred 0, label 2 -> wrong
# (value, hit) pairs and their (lo, hi] bins (15 * value -> bin = ceil - 1):
#   (0.45, 1) b6   (0.44, 0) b6   (0.11, 0) b1   (0.70, 0) b10   (0.25, 0) b3   (0.05, 1) b0


def test_all_class_ece_and_mce_hand():
    # bins: b6 |1 - 0.89| = 0.11, b1 0.11, b10 0.7, b3 0.25, b0 |1 - 0.05| = 0.95
    # all-class ECE = (0.11 + 0.11 + 0.7 + 0.25 + 0.95) / (N*C = 6) = 2.12 / 6
    assert M.ece_all_class(ALL_P, ALL_Y) == pytest.approx(2.12 / 6, abs=1e-12)
    # MCE-all: max |acc - conf| over non-empty bins: b6 |0.5 - 0.445| = 0.055, b1 0.11,
    # b10 0.7, b3 0.25, b0 0.95 -> 0.95
    assert M.mce_all_class(ALL_P, ALL_Y) == pytest.approx(0.95, abs=1e-12)
    # top-label ECE for contrast: c = 0.45 correct (0.55), c = 0.7 wrong (0.7) -> 1.25 / 2
    assert M.ece(ALL_P, ALL_Y) == pytest.approx(0.625, abs=1e-12)


def test_classwise_ece_hand():
    # class 0: (0.45, 1) b6, (0.70, 0) b10 -> (0.55 + 0.70) / 2 = 0.625
    # class 1: (0.44, 0) b6, (0.25, 0) b3  -> (0.44 + 0.25) / 2 = 0.345
    # class 2: (0.11, 0) b1, (0.05, 1) b0  -> (0.11 + 0.95) / 2 = 0.53
    # mean over classes = 1.5 / 3 = 0.5  (all-class pools b6 across classes: 0.353 < 0.5)
    assert M.ece_classwise(ALL_P, ALL_Y) == pytest.approx(0.5, abs=1e-12)


# ---- MCE / RMS / empty bins (no confidence on an edge)

MR_P, MR_Y = rows([0.15, 0.18, 0.25, 0.35, 0.38, 0.97, 0.99], [1, 0, 1, 1, 0, 1, 1])
# bins: b2 (0.1333, 0.2] {0.15 ok, 0.18 wrong}: acc .5, conf .165 -> gap .335
#       b3 (0.2, 0.2667] {0.25 ok} -> .75;  b5 (0.3333, 0.4] {0.35 ok, 0.38 wrong} -> gap .135
#       b14 {0.97, 0.99 ok} -> gap .02;  the other 11 bins are empty


def test_mce_rms_hand_with_empty_bins():
    assert M.ece(MR_P, MR_Y) == pytest.approx((2 * 0.335 + 0.75 + 2 * 0.135 + 2 * 0.02) / 7, abs=1e-12)
    assert M.mce(MR_P, MR_Y) == pytest.approx(0.75, abs=1e-12)  # empty bins ignored, not NaN
    rms = math.sqrt((2 * 0.335**2 + 0.75**2 + 2 * 0.135**2 + 2 * 0.02**2) / 7)
    assert M.rms_ce(MR_P, MR_Y) == pytest.approx(rms, abs=1e-12)


# ---- adaptive (equal-mass) ECE


def test_adaptive_ece_stable_ties_at_boundary():
    # N = 5, B = 2 -> sizes 3, 2.  Confidences 0.6 x4 (tied) and 0.9.
    p, y = rows([0.6, 0.6, 0.6, 0.6, 0.9], [1, 1, 1, 0, 1])
    # stable ascending order 0,1,2 | 3,4:  bin 0 {ok, ok, ok}: |3 - 1.8| = 1.2
    #                                      bin 1 {0.6 wrong, 0.9 ok}: |1 - 1.5| = 0.5 -> 1.7/5
    assert M.ece_adaptive(p, y, n_bins=2) == pytest.approx(0.34, abs=1e-12)
    # the wrong one first instead: bin 0 {wrong, ok, ok}: |2 - 1.8| = 0.2, bin 1 {ok, ok}:
    # |2 - 1.5| = 0.5 -> 0.7/5 (so the tie order inside 0.6 decides the value)
    p2, y2 = rows([0.6, 0.6, 0.6, 0.6, 0.9], [0, 1, 1, 1, 1])
    assert M.ece_adaptive(p2, y2, n_bins=2) == pytest.approx(0.14, abs=1e-12)


def test_adaptive_ece_fewer_samples_than_bins():
    # N = 7 < B = 15: every sample alone in a bin, the 8 empty bins contribute 0
    expected = (0.85 + 0.18 + 0.75 + 0.65 + 0.38 + 0.03 + 0.01) / 7  # sum |correct - c| / N
    assert M.ece_adaptive(MR_P, MR_Y) == pytest.approx(expected, abs=1e-12)


# ---- RPC's RMS on bins of 100 (Hendrycks calib_err, last bin skipped)


def test_rms_adaptive100_skips_last_bin():
    # N = 250: bins [0, 100) and [100, 250); the reference loop skips the last one.
    # lowest 100: c = 0.3, 40 correct -> gap |0.4 - 0.3| = 0.1;  top 150: c = 0.9, all wrong
    p, y = rows([0.3] * 100 + [0.9] * 150, [1] * 40 + [0] * 60 + [0] * 150)
    # RMS = sqrt(100/250 * 0.1^2) = sqrt(0.004); (with the last bin: sqrt(0.004 + 0.6*0.81))
    assert M.rms_ce_adaptive100(p, y) == pytest.approx(math.sqrt(0.004), abs=1e-12)


def test_rms_adaptive100_ties_and_small_n():
    # N = 250, bins [0, 100) | [100, 250) (skipped).  150 tied at c = 0.5: indices 0..99
    # correct, 100..149 wrong; then 100 at 0.9.  Stable order: bin 0 = indices 0..99, all
    # correct -> gap 0.5 -> sqrt(100/250 * 0.25) = sqrt(0.1).  (Reversed tie order: bin 0 =
    # 50 wrong + 50 correct -> gap 0 -> 0.)
    p, y = rows([0.5] * 150 + [0.9] * 100, [1] * 100 + [0] * 50 + [1] * 100)
    assert M.rms_ce_adaptive100(p, y) == pytest.approx(math.sqrt(0.1), abs=1e-12)
    # N = 300: three bins of 100, the last skipped.  bin 0 as above (gap 0.5); bin 1 = the
    # 50 wrong at 0.5 + 50 correct at 0.9: acc 0.5, conf 0.7 -> gap 0.2
    # -> sqrt(1/3 * 0.25 + 1/3 * 0.04) = sqrt(0.29 / 3)
    p, y = rows([0.5] * 150 + [0.9] * 150, [1] * 100 + [0] * 50 + [1] * 150)
    assert M.rms_ce_adaptive100(p, y) == pytest.approx(math.sqrt(0.29 / 3), abs=1e-12)
    # 100 <= N < 200: a single (last) bin, skipped -> 0;  N < 100: the reference crashes -> NaN
    p1, y1 = rows([0.9] * 199, [0] * 199)
    assert M.rms_ce_adaptive100(p1, y1) == 0.0
    p2, y2 = rows([0.9] * 99, [0] * 99)
    assert math.isnan(M.rms_ce_adaptive100(p2, y2))


# ---- brute-force and reference-port cross-checks


@pytest.mark.parametrize("n,c,seed,decimals", RANDOM_CASES)
def test_calibration_variants_match_loops(n, c, seed, decimals):
    p, y = make_case(n, c, seed, decimals)
    conf, correct = conf_correct(p, y)
    top_bin = [kepsvgp_bin(float(v)) for v in conf]  # MCE and RMSCE use ECE's bins
    assert M.mce(p, y) == pytest.approx(binned_loop(conf, correct, lambda i: top_bin[i], "max"), abs=1e-12)
    assert M.rms_ce(p, y) == pytest.approx(binned_loop(conf, correct, lambda i: top_bin[i], "l2"), abs=1e-12)

    flat = p.ravel()
    hit = (np.arange(c)[None, :] == y[:, None]).ravel()
    flat_bin = [upper_closed_bin(float(v)) for v in flat]
    assert M.ece_all_class(p, y) == pytest.approx(binned_loop(flat, hit, lambda j: flat_bin[j]), abs=1e-12)
    assert M.mce_all_class(p, y) == pytest.approx(
        binned_loop(flat, hit, lambda j: flat_bin[j], "max"), abs=1e-12
    )
    per_class = [
        binned_loop(p[:, k], y == k, lambda i, k=k: upper_closed_bin(float(p[i, k]))) for k in range(c)
    ]
    assert M.ece_classwise(p, y) == pytest.approx(sum(per_class) / c, abs=1e-12)
    assert M.ece_classwise(p, y) >= M.ece_all_class(p, y) - 1e-12  # triangle inequality

    # equal mass: Python's stable sort on (confidence, index), sizes like np.array_split
    order = sorted(range(n), key=lambda i: (float(conf[i]), i))
    sizes = [n // 15 + (1 if m < n % 15 else 0) for m in range(15)]
    rank_bin = {}
    start = 0
    for m, size in enumerate(sizes):
        for i in order[start : start + size]:
            rank_bin[i] = m
        start += size
    assert M.ece_adaptive(p, y) == pytest.approx(binned_loop(conf, correct, lambda i: rank_bin[i]), abs=1e-12)


def fdshifts_ece(confids, correct, n_bins=20):
    """Port of fd-shifts StatsCache.calibration_stats + expected_calibration_error."""
    y_prob, y_true = np.asarray(confids, np.float64), np.asarray(correct, np.int64)
    bins = np.linspace(0.0, 1.0 + 1e-8, n_bins + 1)
    binids = np.digitize(y_prob, bins) - 1
    bin_sums = np.bincount(binids, weights=y_prob, minlength=len(bins))
    bin_true = np.bincount(binids, weights=y_true, minlength=len(bins))
    bin_total = np.bincount(binids, minlength=len(bins))
    nonzero = bin_total != 0
    prob_true = bin_true[nonzero] / bin_total[nonzero]
    prob_pred = bin_sums[nonzero] / bin_total[nonzero]
    prob_total = bin_total[nonzero] / bin_total.sum()
    return float(np.dot(np.abs(prob_true - prob_pred), prob_total))


@pytest.mark.parametrize("n,c,seed,decimals", RANDOM_CASES)
def test_ece_fdshifts_matches_port(n, c, seed, decimals):
    p, y = make_case(n, c, seed, decimals)
    conf, correct = conf_correct(p, y)
    assert M.ece_fdshifts(p, y) == pytest.approx(fdshifts_ece(conf, correct), abs=1e-12)


def hendrycks_calib_err(confidence, correct, beta=100):
    """Port of Hendrycks' calibration_tools.calib_err(p='2') (loop skips the last bin)."""
    idxs = np.argsort(confidence)
    confidence, correct = confidence[idxs], correct[idxs]
    bins = [[i * beta, (i + 1) * beta] for i in range(len(confidence) // beta)]
    bins[-1] = [bins[-1][0], len(confidence)]
    cerr, total = 0.0, len(confidence)
    for i in range(len(bins) - 1):
        bc, bk = confidence[bins[i][0] : bins[i][1]], correct[bins[i][0] : bins[i][1]]
        if len(bc) > 0:
            cerr += len(bc) / total * np.square(np.abs(np.nanmean(bc) - np.nanmean(bk)))
    return math.sqrt(cerr)


@pytest.mark.parametrize("n,c,seed", [(1234, 5, 0), (1500, 10, 2), (350, 3, 9)])
def test_rms_adaptive100_matches_hendrycks(n, c, seed):
    p, y = make_case(n, c, seed)  # unrounded: no ties, so the reference's unstable sort agrees
    conf, correct = conf_correct(p, y)
    expected = hendrycks_calib_err(conf, correct.astype(float))
    assert M.rms_ce_adaptive100(p, y) == pytest.approx(expected, abs=1e-12)


def test_ece_torchmetrics_matches_torch_port():
    """Port of torchmetrics _binning_bucketize/_ce_compute (l1), run in torch itself."""
    torch = pytest.importorskip("torch")

    def tm_ece(probs, target, n_bins):
        preds = torch.as_tensor(probs)
        confidences, predictions = preds.max(dim=1)
        accuracies = predictions.eq(torch.as_tensor(target))
        confidences, accuracies = confidences.float(), accuracies.float()
        bounds = torch.linspace(0, 1, n_bins + 1, dtype=torch.float)
        acc_bin = torch.zeros(len(bounds), dtype=confidences.dtype)
        conf_bin = torch.zeros(len(bounds), dtype=confidences.dtype)
        count_bin = torch.zeros(len(bounds), dtype=confidences.dtype)
        indices = torch.bucketize(confidences, bounds, right=True) - 1
        count_bin.scatter_add_(0, indices, torch.ones_like(confidences))
        conf_bin.scatter_add_(0, indices, confidences)
        conf_bin = torch.nan_to_num(conf_bin / count_bin)
        acc_bin.scatter_add_(0, indices, accuracies)
        acc_bin = torch.nan_to_num(acc_bin / count_bin)
        prop_bin = count_bin / count_bin.sum()
        return float(torch.sum(torch.abs(acc_bin - conf_bin) * prop_bin))

    for n, c, seed, decimals in TIE_FREE:
        p, y = make_case(n, c, seed, decimals)
        p[::7] = np.eye(c)[p[::7].argmax(axis=1)]  # some confidences exactly 1.0
        assert M.ece_torchmetrics(p, y) == pytest.approx(tm_ece(p, y, 15), abs=2e-6)
    # dyadic bins (edges exact in float32 on every platform): the hand case above
    assert M.ece_torchmetrics(EDGE_P, EDGE_Y, n_bins=4) == pytest.approx(tm_ece(EDGE_P, EDGE_Y, 4), abs=1e-6)
    p, y = make_case(500, 4, 3, 1)  # 1-decimal rounding: 0.5 and 1.0 on edges of 8 bins
    assert M.ece_torchmetrics(p, y, n_bins=8) == pytest.approx(tm_ece(p, y, 8), abs=2e-6)
    assert M.ece_torchmetrics(ONE_P, ONE_Y) == pytest.approx(tm_ece(ONE_P, ONE_Y, 15), abs=1e-6)


def test_calibration_bins_schemes_shapes():
    b = M.calibration_bins(ONE_P, ONE_Y, binning="torchmetrics")
    assert b["count"].tolist() == [0] * 7 + [1] + [0] * 6 + [1, 1]  # 15 bins + hidden slot
    assert b["edges"].shape == (16,)
    b = M.calibration_bins(ONE_P, ONE_Y)
    assert b["count"].tolist() == [0] * 7 + [1] + [0] * 6 + [2]
    b = M.calibration_bins(MR_P, MR_Y, n_bins=3, binning="equal_mass")
    assert "edges" not in b and b["count"].tolist() == [3, 2, 2]
    b = M.calibration_bins(ALL_P, ALL_Y, targets="all_class")
    assert b["count"].sum() == 6
    with pytest.raises(ValueError):
        M.calibration_bins(ONE_P, ONE_Y, binning="lower_closed")
    with pytest.raises(ValueError):
        M.calibration_bins(ONE_P, ONE_Y, targets="classwise")


# ====================================================================== Brier


def test_brier_top_label_hand_and_sklearn():
    p = np.array([[0.7, 0.2, 0.1], [0.5, 0.5, 0.0]])
    y = np.array([0, 2])
    # row 0: c = 0.7 correct -> (0.7 - 1)^2 = 0.09; row 1: c = 0.5 wrong -> 0.25.  mean 0.17
    assert M.brier_top_label(p, y) == pytest.approx(0.17, abs=1e-12)
    for n, c, seed, dec in RANDOM_CASES:
        p, y = make_case(n, c, seed, dec)
        conf, correct = conf_correct(p, y)
        assert M.brier_top_label(p, y) == pytest.approx(brier_score_loss(correct, conf), abs=1e-12)


# ====================================================================== selective classification

SEL_P, SEL_Y = rows([0.9, 0.7, 0.7, 0.6], [1, 0, 1, 1])  # tie at 0.7: wrong first (input order)
SEL_P2, SEL_Y2 = rows([0.9, 0.7, 0.7, 0.6], [1, 1, 0, 1])  # same multiset, tie order swapped


def test_aurc_trapezoid_hand():
    # stable order: E = 0,1,1,1 -> R = 0, 1/2, 1/3, 1/4 at coverage 1/4 .. 1
    # trapezoid / (1 - 1/n) = (sum R - (R_1 + R_n)/2) / (n - 1) = (13/12 - 1/8) / 3 = 23/72
    assert M.aurc_trapezoid(SEL_P, SEL_Y) == pytest.approx(23 / 72, abs=1e-12)
    # swapped: R = 0, 0, 1/3, 1/4 -> (7/12 - 1/8) / 3 = 11/72
    assert M.aurc_trapezoid(SEL_P2, SEL_Y2) == pytest.approx(11 / 72, abs=1e-12)
    assert math.isnan(M.aurc_trapezoid(*rows([0.8], [1])))  # N = 1: undefined in TU


def test_aurc_unique_groups_ties():
    # unique thresholds: 0.9 -> k=1, E=0;  0.7 -> k=3, E=1;  0.6 -> k=4, E=1
    # points (0, 0) (1/4, 0) (3/4, 1/3) (1, 1/4): area = 1/2 * (0 + 1/3)/2 + 1/4 * (1/3 + 1/4)/2
    #                                                  = 1/12 + 7/96 = 15/96
    assert M.aurc_unique(SEL_P, SEL_Y) == pytest.approx(15 / 96, abs=1e-12)
    assert M.aurc_unique(SEL_P2, SEL_Y2) == pytest.approx(15 / 96, abs=1e-12)  # order-free
    # whereas the Riemann AURC sees the tie order: 13/48 vs 7/48
    assert M.aurc(SEL_P, SEL_Y) != M.aurc(SEL_P2, SEL_Y2)


def test_augrc_hand():
    # Riemann: E_i / n with E = 0,1,1,1 -> (0 + 1 + 1 + 1) / 4 / 4 = 3/16; swapped E = 0,0,1,1 -> 2/16
    assert M.augrc(SEL_P, SEL_Y) == pytest.approx(3 / 16, abs=1e-12)
    assert M.augrc(SEL_P2, SEL_Y2) == pytest.approx(2 / 16, abs=1e-12)
    # fd-shifts trapezoid, unique thresholds: (0, 0) (1/4, 0) (3/4, 1/4) (1, 1/4)
    #   1/2 * (0 + 1/4)/2 + 1/4 * (1/4 + 1/4)/2 = 1/16 + 1/16 = 1/8 (both tie orders)
    assert M.augrc_trapezoid(SEL_P, SEL_Y) == pytest.approx(1 / 8, abs=1e-12)
    assert M.augrc_trapezoid(SEL_P2, SEL_Y2) == pytest.approx(1 / 8, abs=1e-12)


def test_eaurc_discrete_hand():
    # AURC = 13/48 (see test_metrics), n_c = 3: optimum (1/4) * (4 - 3)/4 = 1/16 = 3/48
    assert M.eaurc_discrete(SEL_P, SEL_Y) == pytest.approx(10 / 48, abs=1e-12)
    assert M.eaurc_discrete(SEL_P2, SEL_Y2) == pytest.approx(4 / 48, abs=1e-12)
    # a perfect ranking: E = 0,0,0,1 -> AURC = 1/16 = optimum -> exactly 0 (analytic > 0)
    p, y = rows([0.9, 0.8, 0.7, 0.6], [1, 1, 1, 0])
    assert M.eaurc_discrete(p, y) == 0.0
    assert M.eaurc(p, y) == pytest.approx(0.0625 - (0.25 + 0.75 * math.log(0.75)), abs=1e-12)


def test_eaurc_variants_r0_and_r_to_1():
    p, _ = rows([0.9, 0.8, 0.6], [1, 1, 1])
    assert M.eaurc_discrete(p, np.array([0, 0, 0])) == 0.0  # r = 0
    assert M.eaurc_discrete(p, np.array([1, 1, 1])) == pytest.approx(0.0, abs=1e-15)  # r = 1
    # r = (n-1)/n, n = 1000, the single correct one ranked first (the best ranking):
    # AURC = (1/n) sum_{i=1..n} (i-1)/i = (n - H_n)/n = discrete optimum -> E-AURC 0 exactly;
    # analytic AURC* = r + (1-r) ln(1-r) = (n - 1 - ln n)/n, so E-AURC = (1 + ln n - H_n)/n
    n = 1000
    h_n = math.fsum(1.0 / i for i in range(1, n + 1))
    conf = np.linspace(0.99, 0.5, n)
    p, y = rows(conf, [1] + [0] * (n - 1))
    assert M.aurc(p, y) == pytest.approx((n - h_n) / n, abs=1e-12)
    assert M.eaurc_discrete(p, y) == pytest.approx(0.0, abs=1e-15)
    assert M.eaurc(p, y) == pytest.approx((1 + math.log(n) - h_n) / n, abs=1e-12)
    # the correct one ranked last: AURC = ((n-1) + (n-1)/n) / n; discrete E-AURC subtracts (n-H_n)/n
    p, y = rows(conf, [0] * (n - 1) + [1])
    expected = ((n - 1) + (n - 1) / n) / n - (n - h_n) / n
    assert M.eaurc_discrete(p, y) == pytest.approx(expected, abs=1e-12)


def test_risk_at_80_coverage_hand():
    # n = 5: k = ceil(4) = 4; order .9 ok, .8 wrong, .7 ok, .6 ok, .5 wrong -> R_4 = 1/4
    p, y = rows([0.9, 0.8, 0.7, 0.6, 0.5], [1, 0, 1, 1, 0])
    assert M.risk_at_80_coverage(p, y) == pytest.approx(0.25, abs=1e-15)
    # n = 4: k = ceil(3.2) = 4 -> R_4 = 1/4 ; n = 6: k = ceil(4.8) = 5
    assert M.risk_at_80_coverage(SEL_P, SEL_Y) == pytest.approx(0.25, abs=1e-15)
    p6, y6 = rows([0.9, 0.8, 0.7, 0.6, 0.5, 0.4], [1, 1, 1, 1, 0, 0])  # R_5 = 1/5 (R_4 = 0)
    assert M.risk_at_80_coverage(p6, y6) == pytest.approx(0.2, abs=1e-15)


def test_coverage_at_5_risk_hand():
    conf = np.linspace(0.99, 0.5, 21)
    # 21 samples by descending confidence, errors at ranks 2 and 21:
    # E_i = 0 (i=1), 1 (i=2..20), 2 (i=21).  E_i/i <= 5%: i=1 yes; 2..19 no; i=20: 1/20 = 5%
    # exactly -> yes; i=21: 2/21 no.  Largest admissible coverage 20/21 (risk not monotone).
    # (TorchUncertainty's NaN check would read index 1 of the unflipped array, R_2 > 5%, and
    # return NaN here.)
    correct = [1, 0] + [1] * 18 + [0]
    assert M.coverage_at_5_risk(*rows(conf, correct)) == pytest.approx(20 / 21, abs=1e-15)
    assert M.coverage_at_5_risk(*rows(conf[:20], correct[:20])) == 1.0  # 1/20 at full coverage
    assert M.coverage_at_5_risk(*rows(conf[:3], [1, 1, 1])) == 1.0  # all correct
    assert math.isnan(M.coverage_at_5_risk(*rows(conf[:3], [0, 0, 0])))  # never <= 5%
    assert M.coverage_at_5_risk(*rows(conf[:3], [1, 0, 0])) == pytest.approx(1 / 3)


# ---- reference ports


def fdshifts_rc_points(confids, residuals, generalized):
    """Port of fd-shifts selective_risk_stats / generalized_risk_stats (rc_stats_utils.py)."""
    n = len(residuals)
    idx = np.argsort(confids)
    residuals, confidence = residuals[idx], confids[idx]
    cov, error_sum = n, float(sum(residuals))
    coverages, risks = [1.0], [error_sum / n]
    for i in range(n - 1):
        cov -= 1
        error_sum -= residuals[i]
        if confidence[i] != confidence[i + 1]:
            coverages.append(cov / n)
            risks.append(error_sum / n if generalized else error_sum / cov)
    coverages.append(0)
    risks.append(0 if generalized else risks[-1])
    return np.array(coverages), np.array(risks)


def fdshifts_auc(confids, residuals, generalized):
    coverages, risks = fdshifts_rc_points(confids, residuals, generalized)
    return -np.trapezoid(risks, coverages)  # coverages descending


def risk_loop(conf, correct):
    """Selective risks E_i / i, Python's stable sorted() by descending confidence."""
    order = sorted(range(len(conf)), key=lambda i: -float(conf[i]))
    errors, out = 0, []
    for rank, i in enumerate(order, start=1):
        errors += 0 if correct[i] else 1
        out.append(Fraction(errors, rank))
    return out


@pytest.mark.parametrize("n,c,seed,decimals", RANDOM_CASES)
def test_selective_variants_match_references(n, c, seed, decimals):
    p, y = make_case(n, c, seed, decimals)
    conf, correct = conf_correct(p, y)
    residuals = (~correct).astype(np.float64)
    assert M.aurc_unique(p, y) == pytest.approx(fdshifts_auc(conf, residuals, False), abs=1e-12)
    assert M.augrc_trapezoid(p, y) == pytest.approx(fdshifts_auc(conf, residuals, True), abs=1e-12)

    risks = risk_loop(conf, correct)  # exact fractions
    cov = np.arange(1, n + 1) / n
    assert M.aurc_trapezoid(p, y) == pytest.approx(
        auc(cov, np.array([float(r) for r in risks])) / (1 - 1 / n), abs=1e-12
    )
    errors = [r * (i + 1) for i, r in enumerate(risks)]  # E_i
    assert M.augrc(p, y) == pytest.approx(float(sum(errors) / (n * n)), abs=1e-12)
    n_c = int(correct.sum())
    optimum = sum(Fraction(i - n_c, i) for i in range(n_c + 1, n + 1)) / n
    assert M.eaurc_discrete(p, y) == pytest.approx(float(sum(risks) / n - optimum), abs=1e-12)
    k80 = math.ceil(Fraction(4 * n, 5))  # ceil(0.8 n), exact
    assert M.risk_at_80_coverage(p, y) == pytest.approx(float(risks[k80 - 1]), abs=1e-15)
    admissible = [i + 1 for i, r in enumerate(risks) if r <= Fraction(5, 100)]
    expected = admissible[-1] / n if admissible else math.nan
    assert M.coverage_at_5_risk(p, y) == pytest.approx(expected, nan_ok=True)


def test_fdshifts_port_sees_ties():
    """The rounded data has tie groups mixing correct and wrong predictions."""
    p, y = make_case(500, 4, 3, 1)
    conf, correct = conf_correct(p, y)
    mixed = [v for v in np.unique(conf) if 0 < correct[conf == v].sum() < (conf == v).sum()]
    assert len(mixed) >= 3


# ====================================================================== failure prediction


def test_failure_fpr95_first_vs_nearest():
    # 16 correct (distinct c), then wrong at .80, correct at .75, wrong at .70: 17 pos, 2 neg
    conf = [0.99 - 0.01 * k for k in range(16)] + [0.80, 0.75, 0.70]
    p, y = rows(conf, [1] * 16 + [0, 1, 0])
    # ROC points (fps, tps) after drop_intermediate: (0,0) (0,1) (0,16) (1,16) (1,17) (2,17)
    # TPR 0, 1/17, 16/17, 16/17, 1, 1.  Nearest 0.95: 16/17 = 0.941 (first at FPR 0) -> 0
    # first TPR >= 0.9495: TPR 1 at fps 1 -> FPR 1/2
    assert M.failure_fpr95(p, y) == 0.0
    assert M.failure_fpr95_first(p, y) == 0.5
    fpr, tpr, _ = roc_curve(y == 0, p[:, 0])
    assert np.min(fpr[tpr >= 0.9495]) == 0.5  # fd-shifts' formula, on sklearn's points


def test_failure_fpr95_first_uses_dropped_points():
    # 18 correct alone, two tie groups {correct, wrong} at .70 and .65, two wrong at .60, .55
    conf = [0.99 - 0.01 * k for k in range(18)] + [0.70, 0.70, 0.65, 0.65, 0.60, 0.55]
    p, y = rows(conf, [1] * 18 + [1, 0, 1, 0, 0, 0])
    # (fps, tps): ... (0,18) (1,19) (2,20) (3,20) (4,20); (1,19) is collinear with its
    # neighbours and sklearn drops it, so TPR 0.95 exactly is not a point: the first point
    # with TPR >= 0.9495 is (2, 20) -> FPR 2/4 = 0.5 (0.25 if it were kept).  Nearest 0.95:
    # |0.9 - 0.95| < |1 - 0.95| in floats -> TPR 0.9 at FPR 0.
    assert M.failure_fpr95_first(p, y) == 0.5
    assert M.failure_fpr95(p, y) == 0.0


FAIL_P, FAIL_Y = rows([0.9, 0.7, 0.6, 0.6], [1, 0, 1, 0])  # correct/wrong tie at 0.6


def test_failure_aupr_variants_hand():
    # success AP, correct positive: 0.9 (R .5, P 1); 0.7 (R .5, P .5); 0.6 (R 1, P .5)
    # AP = .5*1 + 0*.5 + .5*.5 = 0.75
    assert M.failure_aupr_success_ap(FAIL_P, FAIL_Y) == pytest.approx(0.75, abs=1e-12)
    # error trapezoid, errors positive with -c: -0.6 (R .5, P .5); -0.7 (R 1, P 2/3);
    # -0.9 (R 1, P .5); plus (R 0, P 1): .5*(1 + .5)/2 + .5*(.5 + 2/3)/2 = 3/8 + 7/24 = 2/3
    assert M.failure_aupr_error_trapezoid(FAIL_P, FAIL_Y) == pytest.approx(2 / 3, abs=1e-12)


@pytest.mark.parametrize("n,c,seed,decimals", RANDOM_CASES)
def test_failure_variants_match_sklearn(n, c, seed, decimals):
    p, y = make_case(n, c, seed, decimals)
    conf, correct = conf_correct(p, y)
    fpr, tpr, _ = roc_curve(correct, conf)
    assert M.failure_fpr95_first(p, y) == np.min(fpr[np.argwhere(tpr >= 0.9495)])
    assert M.failure_aupr_success_ap(p, y) == pytest.approx(average_precision_score(correct, conf), abs=1e-12)
    precision, recall, _ = precision_recall_curve(~correct, -conf)
    assert M.failure_aupr_error_trapezoid(p, y) == pytest.approx(auc(recall, precision), abs=1e-12)


# ====================================================================== OOD


def openood_metrics(s_id, s_ood):
    """Port of OpenOOD v1.5 auc_and_fpr_recall (conf = score, label -1 = OOD)."""
    conf = np.concatenate([s_id, s_ood])
    ood_indicator = np.concatenate([np.zeros(len(s_id)), np.ones(len(s_ood))])
    fpr_list, tpr_list, _ = roc_curve(ood_indicator, -conf)
    fpr = fpr_list[np.argmax(tpr_list >= 0.95)]
    precision_in, recall_in, _ = precision_recall_curve(1 - ood_indicator, conf)
    precision_out, recall_out, _ = precision_recall_curve(ood_indicator, -conf)
    return fpr, auc(recall_in, precision_in), auc(recall_out, precision_out)


def tu_fprx(s_id, s_ood, recall_level=0.95):
    """numpy port of TorchUncertainty FPRx.compute with conf = -s (OOD-ness), OOD = 1; the
    recall is int / int in float32 and compared with the float32 recall level, as torch
    does with its default dtype."""
    conf = -np.concatenate([s_id, s_ood])
    targets = np.concatenate([np.zeros(len(s_id)), np.ones(len(s_ood))])
    indx = np.argsort(-targets, kind="stable")  # OOD first
    examples = conf[indx]
    labels = np.zeros(len(targets), bool)
    labels[: int(np.count_nonzero(targets))] = True
    desc = np.argsort(-examples, kind="stable")
    examples, labels = examples[desc], labels[desc]
    threshold_idxs = np.concatenate([np.where(np.diff(examples))[0], [labels.shape[0] - 1]])
    true_pos = np.cumsum(labels)[threshold_idxs]
    false_pos = 1 + threshold_idxs - true_pos
    recall = (true_pos / true_pos[-1]).astype(np.float32)  # exact quotient, rounded once
    last_ind = np.searchsorted(true_pos, true_pos[-1])
    recall = np.concatenate([recall[: last_ind + 1][::-1], np.ones(1, np.float32)])
    false_pos = np.concatenate([false_pos[: last_ind + 1][::-1], [0.0]])
    cutoff = np.argmin(np.abs(recall - np.float32(recall_level)))
    return false_pos[cutoff] / (~labels).sum()


def test_ood_fpr95_conventions_differ_hand():
    s_id = np.arange(1.0, 21.0)  # 1..20
    s_ood = np.array([0.5, 1.0, 2.0, 25.0])  # one OOD above every ID sample
    # default (ID positive): tau = 19th largest ID = 2; OOD >= 2: {2.0 (tie), 25} -> 2/4
    assert M.ood_fpr95(s_id, s_ood) == 0.5
    # OpenOOD (OOD positive, -s): catching 95% of 4 OOD means catching all 4, i.e. the one
    # at 25 -> every ID sample flagged: (fps, tps) at -25 = (20, 4) -> FPR 1
    assert M.ood_fpr95_openood(s_id, s_ood) == 1.0
    # TU: recalls .25, .5, .75 (x19), 1; nearest .95 is 1 -> 20/20
    assert M.ood_fpr95_tu(s_id, s_ood) == 1.0


def test_ood_fpr95_ties_at_threshold():
    s_id = np.array([1.0, 2.0, 3.0, 4.0])
    s_ood = np.array([0.0] * 18 + [1.0] * 2)  # two OOD tied with the ID sample at 1.0
    # OpenOOD: -s thresholds: -0: (tps 18, fps 0) TPR .9;  -1: (20, 1) TPR 1 -> first >= .95
    # -> the tied ID sample is flagged with them: FPR 1/4
    assert M.ood_fpr95_openood(s_id, s_ood) == 0.25
    # TU: candidates TPR 18/20 (fp 0) and 20/20 (fp 1) are equally far from 19/20
    # (|20*18 - 19*20| = |20*20 - 19*20| = 20): an exact tie, which goes to the lowest
    # threshold (TPR 1, fp 1) -> 1/4.  TorchUncertainty's float32 recalls tie here too;
    # float64 (Hendrycks) has |0.9 - 0.95| < |1 - 0.95| and would give 0.
    assert M.ood_fpr95_tu(s_id, s_ood) == 0.25
    assert abs(np.float32(0.9) - np.float32(0.95)) == abs(np.float32(1.0) - np.float32(0.95))
    assert abs(0.9 - 0.95) < abs(1.0 - 0.95)
    # default: k = ceil(3.8) = 4 -> tau = 1; OOD >= 1: the two ties -> 2/20
    assert M.ood_fpr95(s_id, s_ood) == pytest.approx(0.1)


def test_ood_fpr95_tu_equal_recall_takes_lowest_threshold():
    s_id = np.array([1.0, 2.0, 3.0, 4.0])
    s_ood = np.array([0.0] * 19 + [10.0])
    # -s thresholds: -0 (19 OOD): recall 19/20 = 0.95 exactly, fp 0; -1..-4: recall 0.95,
    # fp 1..4; -10: recall 1.  TU scans from the lowest threshold reaching full recall
    # upwards and keeps the first minimum: -4 (distance 0) -> fp 4 -> FPR 4/4.
    assert M.ood_fpr95_tu(s_id, s_ood) == 1.0
    # OpenOOD: the first point with TPR >= .95 is -0 -> FPR 0
    assert M.ood_fpr95_openood(s_id, s_ood) == 0.0
    # default: tau = 4th largest ID = 1 -> OOD >= 1: {10} -> 1/20
    assert M.ood_fpr95(s_id, s_ood) == pytest.approx(0.05)


def test_ood_aupr_trapezoid_hand():
    s_id, s_ood = np.array([0.9, 0.6, 0.3]), np.array([0.7])
    # In (ID positive, s): .9 (R 1/3, P 1); .7 (1/3, 1/2); .6 (2/3, 2/3); .3 (1, 3/4); + (0, 1)
    # 1/3 * (1 + 1)/2 + 0 + 1/3 * (1/2 + 2/3)/2 + 1/3 * (2/3 + 3/4)/2 = 24/72 + 14/72 + 17/72
    assert M.ood_aupr_in_trapezoid(s_id, s_ood) == pytest.approx(55 / 72, abs=1e-12)
    # Out (OOD positive, -s): -.3 (R 0, P 0); -.6 (0, 0); -.7 (1, 1/3); -.9 (1, 1/4); + (0, 1)
    # the only width is R 0 -> 1 between P 0 and P 1/3: (0 + 1/3)/2 = 1/6
    assert M.ood_aupr_out_trapezoid(s_id, s_ood) == pytest.approx(1 / 6, abs=1e-12)


OOD_CASES = [(3, 4, 1, None), (20, 20, 3, None), (100, 250, 5, 1), (999, 400, 6, 2), (1500, 1500, 7, 1)]


@pytest.mark.parametrize("n_id,n_ood,seed,decimals", OOD_CASES)
def test_ood_variants_match_references(n_id, n_ood, seed, decimals):
    rng = np.random.default_rng(seed)
    s_id, s_ood = rng.normal(loc=0.7, size=n_id), rng.normal(loc=0.0, size=n_ood)
    if decimals is not None:  # heavy ties, including ID-OOD ties
        s_id, s_ood = np.round(s_id, decimals), np.round(s_ood, decimals)
    fpr, aupr_in, aupr_out = openood_metrics(s_id, s_ood)
    assert M.ood_fpr95_openood(s_id, s_ood) == fpr
    assert M.ood_aupr_in_trapezoid(s_id, s_ood) == pytest.approx(aupr_in, abs=1e-12)
    assert M.ood_aupr_out_trapezoid(s_id, s_ood) == pytest.approx(aupr_out, abs=1e-12)
    assert M.ood_fpr95_tu(s_id, s_ood) == pytest.approx(tu_fprx(s_id, s_ood), abs=1e-15)


# ====================================================================== degenerate sets

DEG_P = np.array([[0.5, 0.3, 0.2], [0.9, 0.05, 0.05], [0.2, 0.7, 0.1]])  # c = .5, .9, .7


def test_variants_all_correct():
    y = np.array([0, 0, 1])
    assert M.aurc_trapezoid(DEG_P, y) == 0.0 and M.aurc_unique(DEG_P, y) == 0.0
    assert M.augrc(DEG_P, y) == 0.0 and M.augrc_trapezoid(DEG_P, y) == 0.0
    assert M.eaurc_discrete(DEG_P, y) == 0.0
    assert M.risk_at_80_coverage(DEG_P, y) == 0.0 and M.coverage_at_5_risk(DEG_P, y) == 1.0
    assert math.isnan(M.failure_fpr95_first(DEG_P, y))
    assert M.failure_aupr_success_ap(DEG_P, y) == pytest.approx(1.0)
    assert math.isnan(M.failure_aupr_error_trapezoid(DEG_P, y))
    # (0.5-1)^2 + (0.9-1)^2 + (0.7-1)^2 = .25 + .01 + .09 -> .35/3
    assert M.brier_top_label(DEG_P, y) == pytest.approx(0.35 / 3, abs=1e-12)
    # each confidence alone in a bin in every scheme: (0.5 + 0.1 + 0.3) / 3
    for name in ("ece_torchmetrics", "ece_fdshifts", "ece_adaptive"):
        assert getattr(M, name)(DEG_P, y) == pytest.approx(0.3, abs=1e-7), name


def test_variants_all_wrong():
    y = np.array([1, 2, 0])
    assert M.aurc_trapezoid(DEG_P, y) == pytest.approx(1.0)  # every risk is 1
    assert M.aurc_unique(DEG_P, y) == pytest.approx(1.0)
    assert M.eaurc_discrete(DEG_P, y) == pytest.approx(0.0, abs=1e-15)
    # E_i = i: Riemann (1 + 2 + 3) / 9 = 2/3; trapezoid on (0,0) (1/3,1/3) (2/3,2/3) (1,1) = 1/2
    assert M.augrc(DEG_P, y) == pytest.approx(2 / 3, abs=1e-12)
    assert M.augrc_trapezoid(DEG_P, y) == pytest.approx(0.5, abs=1e-12)
    assert M.risk_at_80_coverage(DEG_P, y) == 1.0
    assert math.isnan(M.coverage_at_5_risk(DEG_P, y))
    assert math.isnan(M.failure_fpr95_first(DEG_P, y))
    assert math.isnan(M.failure_aupr_success_ap(DEG_P, y))
    assert M.failure_aupr_error_trapezoid(DEG_P, y) == pytest.approx(1.0)
    assert M.brier_top_label(DEG_P, y) == pytest.approx((0.25 + 0.81 + 0.49) / 3, abs=1e-12)


# ====================================================================== decomposition


def test_entropy_hand_and_zero_log_zero():
    h = M.entropy(np.array([[0.5, 0.5], [1.0, 0.0], [0.9, 0.1]]))
    expected = [math.log(2), 0.0, -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))]  # nats
    np.testing.assert_allclose(h, expected, rtol=0, atol=1e-15)
    assert M.entropy(np.array([1.0, 0.0, 0.0])) == 0.0  # 1-D input -> scalar array, 0 ln 0 = 0
    assert not np.signbit(M.entropy(np.array([[1.0, 0.0]]))[0])  # +0.0, not -0.0


def test_decompose_two_members_by_hand():
    members = np.array(
        [
            [[1.0, 0.0], [0.5, 0.5], [0.8, 0.2]],  # member 1
            [[0.0, 1.0], [0.5, 0.5], [0.4, 0.6]],  # member 2
        ]
    )
    out = M.decompose(members)
    h = lambda *q: -sum(x * math.log(x) for x in q if x > 0)  # noqa: E731
    # sample 0: members disagree completely: mean [.5, .5] -> total ln 2, each member 0
    # sample 1: identical members: total = aleatoric = ln 2, epistemic 0
    # sample 2: mean [.6, .4]; aleatoric (H[.8,.2] + H[.4,.6]) / 2
    total = [math.log(2), math.log(2), h(0.6, 0.4)]
    aleatoric = [0.0, math.log(2), (h(0.8, 0.2) + h(0.4, 0.6)) / 2]
    np.testing.assert_allclose(out["total"], total, rtol=0, atol=1e-15)
    np.testing.assert_allclose(out["aleatoric"], aleatoric, rtol=0, atol=1e-15)
    np.testing.assert_allclose(out["epistemic"], np.array(total) - np.array(aleatoric), rtol=0, atol=1e-15)
    assert out["epistemic"][1] == 0.0
    assert out["epistemic"][2] == pytest.approx(0.0863046217, abs=1e-9)  # 0.6730117 - 0.5867070


def test_decompose_total_is_entropy_of_mean_not_mean_entropy():
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=2.0, size=(5, 300, 4))
    members = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    out = M.decompose(members)
    mean = members.mean(axis=0)
    np.testing.assert_allclose(out["total"], scipy_entropy(mean, axis=-1), rtol=0, atol=1e-12)
    mean_entropy = scipy_entropy(members, axis=-1).mean(axis=0)
    np.testing.assert_allclose(out["aleatoric"], mean_entropy, rtol=0, atol=1e-12)
    assert np.all(out["total"] > mean_entropy + 1e-6)  # distinct members: H[mean] > mean H
    assert np.all(out["epistemic"] >= 0)
    # equal members: epistemic 0 (clipped at 0 against round-off)
    same = M.decompose(np.repeat(members[:1], 3, axis=0))
    assert np.all(same["epistemic"] >= 0) and np.max(same["epistemic"]) < 1e-12


@pytest.mark.parametrize(
    "bad",
    [np.ones((2, 3)), np.full((1, 2, 2), np.nan), np.full((2, 1, 2), 1.5), np.zeros((0, 2, 2))],
)
def test_decompose_bad_input(bad):
    with pytest.raises(ValueError):
        M.decompose(bad)


# ====================================================================== registry / info

DEFAULTS = M.selection("paper")
VARIANT_CLASSIFICATION = [m for m in M.registered(on_scores=False) if m not in DEFAULTS]
VARIANT_OOD = [m for m in M.registered(on_scores=True) if m not in DEFAULTS]


def test_every_registered_metric_carries_its_report_metadata():
    for name in M.registered():
        m = M.get_metric(name)
        assert METRICS.get(name) is m and m.fn is getattr(M, name)
        assert m.kind in M.KINDS and (m.kind == "ood") == m.on_scores
        assert m.scale == {"%": 100.0, "x100": 100.0, "x1000": 1000.0, "x10": 10.0, "": 1.0}[m.unit], name
        assert m.label and m.convention.endswith(".") and "\n" not in m.convention
    # named selections are orderings of registered metrics, not lists of their own
    for sel in ("paper", "default", "shift", "severity"):
        picked = M.selection(sel)
        assert picked and len(set(picked)) == len(picked) and set(picked) <= set(M.registered())
    # the default columns are the paper's and more; shift columns are default columns
    assert set(DEFAULTS) <= set(M.selection("default"))
    assert set(M.selection("shift")) <= set(M.selection("default"))
    assert set(M.selection("severity")) <= set(M.selection("shift"))


def test_a_metric_must_state_a_valid_kind_unit_and_convention():
    with pytest.raises(ValueError, match="kind"):
        M.Metric("x", M.accuracy, "regression", "X", "%", True, "A sentence.")
    with pytest.raises(ValueError, match="unit"):
        M.Metric("x", M.accuracy, "classification", "X", "percent", True, "A sentence.")
    with pytest.raises(ValueError, match="convention"):
        M.Metric("x", M.accuracy, "classification", "X", "%", True, "  ")
    with pytest.raises(ValueError, match="bounds"):
        M.Metric("x", M.accuracy, "classification", "X", "%", True, "A sentence.", bounds=(1.0, 0.0))
    with pytest.raises(ValueError, match="bounds"):
        M.Metric("x", M.accuracy, "classification", "X", "%", True, "A sentence.", bounds=(float("nan"), 1.0))


# metrics.md section 8 (KEP-SVGP Table 1): the paper's reporting scale of each default
PAPER_SCALES = {
    "accuracy": (100.0, "%", True),
    "ece": (100.0, "%", False),
    "nll": (10.0, "x10", False),
    "brier": (100.0, "x100", False),
    "aurc": (1000.0, "x1000", False),
    "eaurc": (1000.0, "x1000", False),
    "failure_auroc": (100.0, "%", True),
    "failure_fpr95": (100.0, "%", False),
    "failure_aupr_success": (100.0, "%", True),
    "failure_aupr_error": (100.0, "%", True),
    "ood_auroc": (100.0, "%", True),
    "ood_aupr_in": (100.0, "%", True),
    "ood_aupr_out": (100.0, "%", True),
    "ood_fpr95": (100.0, "%", False),
}


def test_default_info_has_paper_scales():
    assert set(PAPER_SCALES) == set(DEFAULTS)
    for name, expected in PAPER_SCALES.items():
        m = M.get_metric(name)
        assert (m.scale, m.unit, m.higher_is_better) == expected, name


def test_every_metric_returns_a_float():
    p, y = make_case(300, 4, 12)
    conf, _ = conf_correct(p, y)
    top = np.argsort(-conf)[:30]
    y[top] = p[top].argmax(axis=1)  # the 30 most confident are correct: Cov@5Risk defined
    rng = np.random.default_rng(1)
    s_id, s_ood = rng.normal(1.0, size=50), rng.normal(size=40)
    for name in M.registered(on_scores=False):
        for probs in (p, p.astype(np.float32)):
            value = METRICS.get(name)(probs, y)
            assert type(value) is float and math.isfinite(value), name
    for name in M.registered(on_scores=True):
        value = METRICS.get(name)(s_id, s_ood)
        assert type(value) is float and 0.0 <= value <= 1.0, name


@pytest.mark.parametrize("name", VARIANT_CLASSIFICATION)
@pytest.mark.parametrize(
    "probs,labels",
    [
        (np.array([0.6, 0.4]), np.array([0])),  # probs 1-D
        (np.array([[0.6, 0.4]]), np.array([2])),  # label out of range
        (np.array([[np.nan, 0.5]]), np.array([0])),  # NaN
        (np.array([[1.5, -0.5]]), np.array([0])),  # outside [0, 1]
        (np.array([[0.6, 0.4]]), np.array([0.0])),  # float labels
    ],
)
def test_variants_reject_bad_classification_input(name, probs, labels):
    with pytest.raises(ValueError):
        getattr(M, name)(probs, labels)


@pytest.mark.parametrize("name", VARIANT_OOD)
@pytest.mark.parametrize(
    "s_id,s_ood",
    [(np.ones((2, 2)), np.ones(3)), (np.array([]), np.ones(3)), (np.ones(3), np.array([np.inf]))],
)
def test_variants_reject_bad_ood_input(name, s_id, s_ood):
    with pytest.raises(ValueError):
        getattr(M, name)(s_id, s_ood)


BINNED = ["ece_torchmetrics", "ece_fdshifts", "ece_all_class", "mce_all_class", "ece_classwise",
          "ece_adaptive", "mce", "rms_ce"]


@pytest.mark.parametrize("name", BINNED)
@pytest.mark.parametrize("n_bins", [0, 2.5, True])
def test_variants_reject_bad_n_bins(name, n_bins):
    with pytest.raises(ValueError):
        getattr(M, name)(DEG_P, np.array([0, 0, 1]), n_bins=n_bins)


@pytest.mark.parametrize("bin_size", [0, -100, 2.5])
def test_rms_adaptive100_rejects_bad_bin_size(bin_size):
    with pytest.raises(ValueError):
        M.rms_ce_adaptive100(DEG_P, np.array([0, 0, 1]), bin_size=bin_size)


# ---- ECE at the exact inputs where float edges disagree (issue: peer conformance)


@pytest.mark.parametrize("k,partner", [(8, 0.56), (9, 0.62), (10, 0.70)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ece_bins_confidences_at_k_over_15_as_kepsvgp(k, partner, dtype):
    """KEP-SVGP's calc_ece bins against torch.linspace(0, 1, 16) in float32, whose edges 8,
    9, 10 lie one float32 step below float32(k/15): a confidence of exactly k/15 (float32
    or float64) is in the bin *above* the edge, together with a partner in (k/15, (k+1)/15].
    Hand computation: one bin holding a correct sample (c1) and a wrong one (c2) gives
    ECE = |1/2 - (c1 + c2)/2| (with separate bins it would be ((1 - c1) + c2)/2)."""
    c = dtype(k / 15)
    p = np.array([[c, 1 - c], [partner, 1 - partner]], dtype=dtype)
    y = np.array([0, 1])  # first correct, second wrong (both predict class 0)
    c1, c2 = float(p[0, 0]), float(p[1, 0])
    assert M.ece(p, y) == pytest.approx(abs(0.5 - (c1 + c2) / 2), abs=1e-15)
    assert M.ece(p, y) != pytest.approx(((1 - c1) + c2) / 2, abs=1e-6)


def test_ece_float64_confidence_just_above_a_low_edge_stays_below_torchs_edge():
    """torch's edge 3 is float32 0.2000000030 (above 0.2): a float64 confidence 0.2 + 1e-9
    shares bin (e2, e3] with 0.195, as in the reference (numpy edges would split them)."""
    c = 0.2 + 1e-9
    p = np.array([[c] + [(1 - c) / 5] * 5, [0.195] + [0.161] * 5])
    y = np.array([0, 1])
    assert M.ece(p, y) == pytest.approx(abs(0.5 - (c + 0.195) / 2), abs=1e-15)


def test_torch_linspace_float32_is_torchs_bit_for_bit():
    import torch

    for n in (2, 3, 11, 16, 21, 101):
        np.testing.assert_array_equal(M.torch_linspace_float32(n), torch.linspace(0, 1, n).numpy())


def test_eaurc_fdshifts_hand():
    """conf .9 (right), .8 (wrong), .8 (right), .6 (wrong).  fd-shifts' unique-threshold
    AURC: points (coverage, risk) (0, 0) [top group's risk], (1/4, 0), (3/4, 1/3),
    (1, 1/2): trapezoids 0 + 1/2 * (1/3)/2 + 1/4 * (1/3 + 1/2)/2 = 1/12 + 5/48 = 9/48.
    r = 1/2: AURC* = 1/2 + 1/2 ln(1/2).  KEP-SVGP's E-AURC uses the Riemann-mean AURC
    (1/4)(0/1 + 1/2 + 1/3 + 2/4) (stable order: the wrong .8 first) = 1/3 instead."""
    c = np.array([0.9, 0.8, 0.8, 0.6])
    p, y = np.stack([c, 1 - c], axis=1), np.array([0, 1, 0, 1])
    optimum = 0.5 + 0.5 * math.log(0.5)
    assert M.eaurc_fdshifts(p, y) == pytest.approx(9 / 48 - optimum, abs=1e-15)
    assert M.eaurc(p, y) == pytest.approx((0 + 1 / 2 + 1 / 3 + 2 / 4) / 4 - optimum, abs=1e-15)


def test_saturated_confidences_are_ranked_in_input_order():
    """Five predictions saturated at 1.0, one of them wrong: Risk@80Cov takes the k = 4 first
    in input order (stable sort), so the error counts only when it is among them.
    (TorchUncertainty's unstable argsort may pick any 4 of the tied 5.)"""
    p = np.tile([1.0, 0.0], (5, 1))
    assert M.risk_at_80_coverage(p, np.array([1, 0, 0, 0, 0])) == 0.25
    assert M.risk_at_80_coverage(p, np.array([0, 0, 0, 0, 1])) == 0.0
    # AURC-trap: risks E_i/i over coverage i/5 = [1, 1/2, 1/3, 1/4, 1/5] (error first) or
    # [0, 0, 0, 0, 1/5] (error last); trapezoid over [1/5, 1] / (1 - 1/5)
    first = (0.2 * ((1 + 1 / 2) + (1 / 2 + 1 / 3) + (1 / 3 + 1 / 4) + (1 / 4 + 1 / 5)) / 2) / 0.8
    assert M.aurc_trapezoid(p, np.array([1, 0, 0, 0, 0])) == pytest.approx(first, abs=1e-15)
    assert M.aurc_trapezoid(p, np.array([0, 0, 0, 0, 1])) == pytest.approx(0.2 * (0 + 1 / 5) / 2 / 0.8, abs=1e-15)


# ====================================================================== peers, run here
# torchmetrics and uncertainty-calibration are test dependencies (requirements.txt): the
# conventions named after them are checked against the packages themselves.


@pytest.mark.parametrize("seed", range(4))
def test_ece_torchmetrics_equals_torchmetrics_on_edges_ties_and_float32(seed):
    """Top-label, l1, 15 bins: MulticlassCalibrationError, and BinaryCalibrationError fed the
    top-label confidence and correctness.  Odd seeds round every probability to a multiple
    of 1/15, so confidences lie on (or one ulp from) torch's float32 edges: the case that
    correctly rounded edges k/15 bin differently (up to 0.09 apart)."""
    torch = pytest.importorskip("torch")
    from torchmetrics.classification import BinaryCalibrationError, MulticlassCalibrationError

    rng = np.random.default_rng(seed)
    for n, c in ((300, 10), (57, 2), (500, 3)):
        p, y = make_case(n, c, int(rng.integers(1 << 30)))
        if seed % 2:
            p = np.round(p * 15) / 15
        for probs in (p, p.astype(np.float32)):
            tm = MulticlassCalibrationError(num_classes=c, n_bins=15, norm="l1")(torch.as_tensor(probs), torch.as_tensor(y))
            assert M.ece_torchmetrics(probs, y) == pytest.approx(float(tm), abs=1e-6)
            conf = torch.as_tensor(probs).max(dim=1)
            correct = (conf.indices == torch.as_tensor(y)).long()
            tb = BinaryCalibrationError(n_bins=15, norm="l1")(conf.values.float(), correct)
            assert M.ece_torchmetrics(probs, y) == pytest.approx(float(tb), abs=1e-6)


def test_torchmetrics_binary_class_bins_float64_input_in_float64():
    """The docstring's example of torchmetrics disagreeing with itself: ours follows the
    multiclass class (float32 cast) on float64 input."""
    torch = pytest.importorskip("torch")
    from torchmetrics.classification import BinaryCalibrationError, MulticlassCalibrationError

    p, y = np.array([[11 / 15, 4 / 15], [0.75, 0.25]]), np.array([0, 1])  # correct, wrong
    tm = MulticlassCalibrationError(num_classes=2, n_bins=15, norm="l1")(torch.as_tensor(p), torch.as_tensor(y))
    tb = BinaryCalibrationError(n_bins=15, norm="l1")(torch.tensor([11 / 15, 0.75], dtype=torch.float64),
                                                      torch.tensor([1, 0]))
    assert M.ece_torchmetrics(p, y) == pytest.approx(float(tm), abs=1e-7) == pytest.approx(abs(1 - (11 / 15 + 0.75)) / 2, abs=1e-7)
    assert float(tb) == pytest.approx((1 - 11 / 15 + 0.75) / 2)


def test_ece_torchmetrics_sums_bins_in_float64_where_torchmetrics_loses_up_to_5e_5():
    """The docstring's float32 gap: 4,700 equal confidences 0.9, 4,230 of them correct (accuracy
    exactly 0.9).  Ours is the exact |0.9 - float32(0.9)| (the confidences binned in float32, the
    bin summed in float64); torchmetrics' float32 bin sums land 1e-5 to 5e-5 away, far above
    the 1e-6 the docstring used to promise."""
    torch = pytest.importorskip("torch")
    from torchmetrics.classification import MulticlassCalibrationError

    n, correct = 4700, 4230
    p = np.tile([0.9, 0.1], (n, 1))
    y = np.r_[np.zeros(correct, int), np.ones(n - correct, int)]
    exact = abs(Fraction(correct, n) - Fraction(float(np.float32(0.9))))
    assert M.ece_torchmetrics(p, y) == pytest.approx(float(exact), abs=1e-15)
    tm = float(MulticlassCalibrationError(num_classes=2, n_bins=15, norm="l1")(torch.as_tensor(p), torch.as_tensor(y)))
    assert 1e-5 < abs(tm - M.ece_torchmetrics(p, y)) < 5e-5


def test_ood_fpr95_tu_counts_only_float32_ties_as_ties():
    """OOD scores 0..429, ID scores 408.5 and 1e4 (OOD positive, score -s): recalls 408/430
    and 409/430 are equally far from 0.95 as fractions, but not in TorchUncertainty's float32
    arithmetic, where 408/430 is nearer; at that threshold no ID sample is flagged."""
    s_ood, s_id = np.arange(430.0), np.array([408.5, 1e4])
    c = np.float32(0.95)
    assert abs(np.float32(408) / np.float32(430) - c) < abs(np.float32(409) / np.float32(430) - c)
    assert M.ood_fpr95_tu(s_id, s_ood) == 0.0 == tu_fprx(s_id, s_ood)
    # the same construction for every OOD size 20k + 10 up to 5,000 (an exact rational tie each time)
    for k in range(250):
        n = 20 * k + 10
        s_ood, s_id = np.arange(float(n)), np.array([19 * k + 9.5, 1e4])
        assert M.ood_fpr95_tu(s_id, s_ood) == tu_fprx(s_id, s_ood), n


def test_ece_adaptive_splits_tied_confidences_in_input_order():
    """The docstring's minimal example: 20 confidences of float32 0.7, the first 14 correct,
    4 equal-mass bins of 5 in input order: gaps .3, .3, .1 (4 of 5 correct), .7."""
    p = np.tile(np.array([[0.7, 0.3]], np.float32), (20, 1))
    y = np.array([0] * 14 + [1] * 6)
    assert M.ece_adaptive(p, y, n_bins=4) == pytest.approx((0.3 + 0.3 + 0.1 + 0.7) / 4, abs=1e-6)


def test_ece_debiased_bin_terms_are_the_folded_normal_correction():
    """Three hand bins of ECE's 15: the corrected term of each is 2|g| - E|g + sZ|, with the
    folded normal's mean from scipy; a bin of one sample keeps its plug-in term."""
    from scipy.stats import foldnorm

    conf = np.array([0.55] * 4 + [0.75] * 10 + [0.95])
    correct = np.array([1, 0, 1, 0] + [1] * 9 + [0] + [1])
    p, y = np.stack([conf, 1 - conf], axis=1), np.where(correct == 1, 0, 1)
    expected = 0.0
    for c in (0.55, 0.75, 0.95):
        hits = correct[conf == c]
        n, acc = hits.size, hits.mean()
        g, s = acc - c, np.sqrt(acc * (1 - acc) / n)
        folded = foldnorm(abs(g) / s, scale=s).mean() if s > 0 else abs(g)
        expected += n * (2 * abs(g) - folded)
    assert M.ece_debiased(p, y) == pytest.approx(expected / conf.size, abs=1e-12)
    assert M.ece_debiased(p, y) < M.ece(p, y)


def test_ece_debiased_is_uncertainty_calibrations_normal_debiased_ce():
    """On ECE's bins, against the package's Monte-Carlo estimator (20,000 draws; it needs
    two samples in every bin it is given, so it is given the non-empty bins)."""
    np.random.seed(0)  # the package draws from numpy's global generator
    from calibration.utils import normal_debiased_ce

    rng = np.random.default_rng(7)
    for _ in range(5):
        conf = rng.uniform(0.5, 1.0, 3000)
        correct = rng.random(3000) < conf - rng.uniform(0.0, 0.15)
        p, y = np.stack([conf, 1 - conf], axis=1), np.where(correct, 0, 1)
        bins = np.clip(np.searchsorted(M.torch_linspace_float32(16).astype(np.float64), conf, side="left") - 1, 0, 14)
        binned = [np.stack([conf[bins == m], correct[bins == m].astype(float)], axis=1)
                  for m in range(15) if (bins == m).any()]
        assert M.ece_debiased(p, y) == pytest.approx(normal_debiased_ce(binned, power=1, resamples=20000), abs=5e-4)


def test_ece_debiased_bias_against_the_truth():
    """200 test sets of 1,000 (2 classes, top-label confidence uniform on [0.5, 1]).
    Overconfident by 5 points everywhere (true ECE 0.05): the debiased ECE is closer to the
    truth than the plug-in by more than half of the plug-in's bias.  Calibrated (true ECE
    0): the correction is partial, as it is for |.| at 0: with every bin gap g ~ N(0, s^2),
    E[2|g| - E|g + sZ|] = (2 - sqrt 2) E|g|, so the debiased mean is 0.59 x the plug-in's."""
    rng = np.random.default_rng(11)
    for shift, check in ((0.05, "miscalibrated"), (0.0, "calibrated")):
        plug_in, debiased = [], []
        for _ in range(200):
            conf = rng.uniform(0.5, 1.0, 1000)
            correct = rng.random(1000) < conf - shift
            p, y = np.stack([conf, 1 - conf], axis=1), np.where(correct, 0, 1)
            plug_in.append(M.ece(p, y))
            debiased.append(M.ece_debiased(p, y))
        if check == "miscalibrated":
            assert abs(np.mean(debiased) - shift) < 0.5 * (np.mean(plug_in) - shift)
        else:
            assert np.mean(debiased) == pytest.approx((2 - np.sqrt(2)) * np.mean(plug_in), rel=0.1)
