"""Tests for bench.metrics against independent references.

References: sklearn (AUROC, ROC points, AP, PR curve + auc, log loss, accuracy, Brier),
brute-force loops written here (ECE, AURC, OOD FPR95), and hand-worked cases whose
arithmetic is spelled out in comments.  No expected value is produced by the code under test.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import (
    accuracy_score,
    auc,
    average_precision_score,
    brier_score_loss,
    log_loss,
    matthews_corrcoef,
    precision_recall_curve,
    roc_auc_score,
    roc_curve,
)

import bench.metrics as M
from bench.metrics.curves import BinaryCurve
from bench.core.registry import METRICS
from tests.helpers.synthetic import make_case

# ----------------------------------------------------------------------------- helpers




def conf_correct(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p, dtype=np.float64)
    return p.max(axis=1), p.argmax(axis=1) == y


def ece_loop(p: np.ndarray, y: np.ndarray, n_bins: int = 15) -> float:
    """Brute-force top-label ECE as KEP-SVGP's ``calc_ece`` computes it, in torch: an explicit
    loop over ``torch.linspace(0, 1, B+1)`` (float32) bins, ``conf.gt(lo) * conf.le(hi)`` in
    torch's promotion (float64 confidences against float32 edges); c = 0 in the first bin
    (our documented addition; the reference drops it)."""
    import torch

    conf_np, correct = conf_correct(p, y)
    conf = torch.from_numpy(np.asarray(p).max(axis=1))  # keeps the input dtype
    bounds = torch.linspace(0, 1, n_bins + 1)
    total = 0.0
    for m in range(n_bins):
        in_bin = (conf.gt(bounds[m]) & conf.le(bounds[m + 1])).numpy()
        if m == 0:
            in_bin |= conf_np == 0.0
        members = np.flatnonzero(in_bin)
        if not len(members):
            continue  # empty bin contributes 0
        acc_m = sum(bool(correct[i]) for i in members) / len(members)
        conf_m = sum(float(conf_np[i]) for i in members) / len(members)
        total += len(members) / len(conf_np) * abs(acc_m - conf_m)
    return total


def aurc_loop(p: np.ndarray, y: np.ndarray) -> float:
    """Brute-force AURC: Python's (stable) sorted by descending confidence, running risk."""
    conf, correct = conf_correct(p, y)
    order = sorted(range(len(conf)), key=lambda i: -float(conf[i]))
    errors, total = 0, 0.0
    for rank, i in enumerate(order, start=1):
        errors += 0 if correct[i] else 1
        total += errors / rank
    return total / len(conf)


def ood_fpr95_loop(s_id: np.ndarray, s_ood: np.ndarray) -> float:
    """Brute force: tau = largest ID score t with count(s_id >= t) >= 0.95 * N1 (integers)."""
    n1 = len(s_id)
    tau = max(t for t in s_id if 100 * sum(1 for v in s_id if v >= t) >= 95 * n1)
    return sum(1 for v in s_ood if v >= tau) / len(s_ood)


# sklearn's brier_score_loss warns (and still computes) on rounded or float32 rows
NOT_NORMALISED_OK = pytest.mark.filterwarnings(
    "ignore:The y_prob values do not sum to one:UserWarning"
)

RANDOM_CASES = [
    # (n, classes, seed, decimals)
    (20, 3, 0, None),
    (137, 5, 1, None),
    (1000, 10, 2, None),
    (5000, 4, 3, None),
    (60, 3, 4, 1),
    (500, 4, 5, 1),
    (3000, 10, 6, 1),
    (400, 5, 7, 2),
    (2000, 3, 8, 2),
]


# ----------------------------------------------------------------------- registry


def test_every_registered_metric_is_its_module_function_with_metadata():
    paper = M.selection("paper")
    assert {"accuracy", "ece", "nll", "brier", "aurc", "eaurc", "failure_auroc", "ood_auroc",
            "ood_fpr95"} <= set(paper)
    assert paper[:8] == ["accuracy", "aurc", "failure_auroc", "failure_fpr95", "ece", "nll", "brier", "eaurc"]
    for name in M.registered():
        m = METRICS.get(name)
        assert m.name == name and m.fn is getattr(M, name)
        assert name in M.__all__  # exported by its name, as the package says
        assert m.kind in M.KINDS and m.unit in M.UNITS and m.on_scores == (m.kind == "ood")


# ------------------------------------------------------------ sklearn cross-checks


@NOT_NORMALISED_OK
@pytest.mark.parametrize("n,c,seed,decimals", RANDOM_CASES)
def test_classification_metrics_match_sklearn(n, c, seed, decimals):
    p, y = make_case(n, c, seed, decimals)
    conf, correct = conf_correct(p, y)
    assert 0 < correct.sum() < n  # both classes present, so every failure metric is defined

    assert M.accuracy(p, y) == pytest.approx(accuracy_score(y, p.argmax(axis=1)), abs=1e-15)
    assert M.brier(p, y) == pytest.approx(brier_score_loss(y, p, labels=list(range(c))), abs=1e-12)

    assert M.failure_auroc(p, y) == pytest.approx(roc_auc_score(correct, conf), abs=1e-12)

    fpr, tpr, _ = roc_curve(correct, conf)  # default drop_intermediate=True
    assert M.failure_fpr95(p, y) == fpr[np.argmin(np.abs(tpr - 0.95))]

    precision, recall, _ = precision_recall_curve(correct, conf)
    assert M.failure_aupr_success(p, y) == pytest.approx(auc(recall, precision), abs=1e-12)

    assert M.failure_aupr_error(p, y) == pytest.approx(
        average_precision_score(~correct, -conf), abs=1e-12
    )
    assert M.mcc(p, y) == pytest.approx(matthews_corrcoef(y, p.argmax(axis=1)), abs=1e-12)


def test_mcc_degenerate_cases_match_sklearn():
    """One predicted class (denominator 0) gives 0, as sklearn; perfect and inverted
    binary predictions give +1 and -1."""
    y = np.array([0, 1, 1, 0, 1])
    one_class = np.tile([0.9, 0.1], (5, 1))
    assert M.mcc(one_class, y) == matthews_corrcoef(y, np.zeros(5, int)) == 0.0
    perfect = np.eye(2)[y]
    assert M.mcc(perfect, y) == pytest.approx(1.0) and M.mcc(perfect[:, ::-1], y) == pytest.approx(-1.0)


@pytest.mark.parametrize("n,c,seed", [(20, 3, 0), (137, 5, 1), (2000, 10, 2)])
def test_nll_matches_sklearn_log_loss(n, c, seed):
    p, y = make_case(n, c, seed)  # unrounded: rows sum to 1, as log_loss requires
    assert M.nll(p, y) == pytest.approx(log_loss(y, p, labels=list(range(c))), rel=1e-12)


@NOT_NORMALISED_OK
@pytest.mark.parametrize("n,c,seed,decimals", [(300, 4, 11, None), (300, 4, 12, 1)])
def test_float32_inputs_match_float64_references(n, c, seed, decimals):
    p, y = make_case(n, c, seed, decimals)
    p32 = p.astype(np.float32)
    p_wide = p32.astype(np.float64)  # the exact values the float32 array holds
    conf, correct = conf_correct(p_wide, y)
    assert M.accuracy(p32, y) == pytest.approx(accuracy_score(y, p_wide.argmax(axis=1)))
    assert M.failure_auroc(p32, y) == pytest.approx(roc_auc_score(correct, conf), abs=1e-12)
    assert M.failure_aupr_error(p32, y) == pytest.approx(
        average_precision_score(~correct, -conf), abs=1e-12
    )
    assert M.aurc(p32, y) == pytest.approx(aurc_loop(p_wide, y), abs=1e-12)
    assert M.brier(p32, y) == pytest.approx(
        brier_score_loss(y, p_wide, labels=list(range(c))), abs=1e-12
    )


@pytest.mark.parametrize("n,c,seed,decimals", RANDOM_CASES[:6])
def test_binary_curve_points_equal_sklearn(n, c, seed, decimals):
    """The shared helper reproduces roc_curve's and precision_recall_curve's point sets."""
    p, y = make_case(n, c, seed, decimals)
    conf, correct = conf_correct(p, y)
    curve = BinaryCurve(correct, conf)

    fpr_ref, tpr_ref, _ = roc_curve(correct, conf)
    fpr, tpr = curve.roc()
    assert fpr.shape == fpr_ref.shape
    np.testing.assert_allclose(fpr, fpr_ref, rtol=0, atol=1e-15)
    np.testing.assert_allclose(tpr, tpr_ref, rtol=0, atol=1e-15)

    prec_ref, rec_ref, _ = precision_recall_curve(correct, conf)
    recall, precision = curve.pr()
    # sklearn: recall decreasing with a final (recall 0, precision 1) point
    np.testing.assert_allclose(recall[::-1], rec_ref[:-1], rtol=0, atol=1e-15)
    np.testing.assert_allclose(precision[::-1], prec_ref[:-1], rtol=0, atol=1e-15)


OOD_CASES = [
    # (n_id, n_ood, seed, decimals)
    (1, 5, 0, None),
    (3, 4, 1, None),
    (19, 30, 2, None),
    (20, 20, 3, None),
    (21, 7, 4, 1),
    (100, 250, 5, 1),
    (999, 400, 6, 2),
    (1500, 1500, 7, 1),
]


@pytest.mark.parametrize("n_id,n_ood,seed,decimals", OOD_CASES)
def test_ood_metrics_match_references(n_id, n_ood, seed, decimals):
    rng = np.random.default_rng(seed)
    s_id = rng.normal(loc=0.7, size=n_id)
    s_ood = rng.normal(loc=0.0, size=n_ood)
    if decimals is not None:  # heavy ties, including ID-OOD ties
        s_id, s_ood = np.round(s_id, decimals), np.round(s_ood, decimals)
    y = np.concatenate([np.ones(n_id, int), np.zeros(n_ood, int)])
    s = np.concatenate([s_id, s_ood])

    assert M.ood_auroc(s_id, s_ood) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert M.ood_aupr_in(s_id, s_ood) == pytest.approx(average_precision_score(y, s), abs=1e-12)
    assert M.ood_aupr_out(s_id, s_ood) == pytest.approx(
        average_precision_score(1 - y, -s), abs=1e-12
    )
    assert M.ood_fpr95(s_id, s_ood) == ood_fpr95_loop(s_id, s_ood)
    # float32 scores give the same answers as their exact float64 values
    s_id32, s_ood32 = s_id.astype(np.float32), s_ood.astype(np.float32)
    assert M.ood_auroc(s_id32, s_ood32) == pytest.approx(
        roc_auc_score(y, np.concatenate([s_id32, s_ood32]).astype(np.float64)), abs=1e-12
    )


# ------------------------------------------------------------- brute-force references


@pytest.mark.parametrize("n,c,seed,decimals", RANDOM_CASES[:8])
def test_ece_matches_loop(n, c, seed, decimals):
    p, y = make_case(n, c, seed, decimals)
    assert M.ece(p, y) == pytest.approx(ece_loop(p, y), abs=1e-12)
    assert M.ece(p, y, n_bins=10) == pytest.approx(ece_loop(p, y, n_bins=10), abs=1e-12)


def test_ece_loop_sees_edge_confidences():
    """The 2-decimal random data really put confidences on edges (0.2, 0.4, ..., 1.0)."""
    p, _ = make_case(2000, 3, 8, 2)
    conf = p.max(axis=1)
    assert np.isin(conf, [0.4, 0.6, 0.8, 1.0]).sum() > 50


@pytest.mark.parametrize("n,c,seed,decimals", RANDOM_CASES[:8])
def test_aurc_matches_loop(n, c, seed, decimals):
    # the rounded cases have many tied confidences of different correctness (n up to 2000),
    # so an unstable sort or a different tie order would change the value
    p, y = make_case(n, c, seed, decimals)
    assert M.aurc(p, y) == pytest.approx(aurc_loop(p, y), abs=1e-12)


def test_aurc_tie_case_discriminates_tie_order():
    """The rounded data has ties whose order changes AURC: the loop check above is sharp."""
    p, y = make_case(500, 4, 5, 1)
    conf, correct = conf_correct(p, y)
    order_rev = sorted(range(len(conf)), key=lambda i: (-float(conf[i]), -i))  # ties reversed
    errors = np.cumsum(~correct[order_rev])
    reversed_ties = float(np.mean(errors / np.arange(1, len(conf) + 1)))
    assert abs(reversed_ties - aurc_loop(p, y)) > 1e-6


# ---------------------------------------------------------------------- hand cases


def test_accuracy_argmax_ties_lowest_index():
    p = np.array([[0.4, 0.4, 0.2], [0.4, 0.4, 0.2], [0.1, 0.3, 0.6]])
    y = np.array([0, 1, 2])
    # row 0: argmax -> class 0 (lowest index) = label -> correct
    # row 1: argmax -> class 0, label 1 -> wrong; row 2 correct.  2/3
    assert M.accuracy(p, y) == pytest.approx(2 / 3)


ECE_ROWS = np.array(
    [
        [0.15, 0.15, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05],  # c=0.15, pred 0
        [0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.0],  # c=0.2 (edge), pred 0
        [0.25, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.0],  # c=0.25, pred 0
        [0.4, 0.3, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # c=0.4 (edge), pred 0
        [0.35, 0.35, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # c=0.35, pred 0 (tie -> 0)
        [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # c=1.0, pred 0
        [0.95, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # c=0.95, pred 0
    ]
)
ECE_LABELS = np.array([0, 5, 0, 1, 0, 0, 0])  # correct: yes, no, yes, no, yes, yes, yes
# Edges k/15: ... 0.1333 | 0.2 | 0.2667 | 0.3333 | 0.4 | ... 0.9333 | 1.0; bins (lo, hi].
#   bin 2 (0.1333, 0.2]:   c=0.15 (correct), c=0.2 (wrong)  -> |sum_acc - sum_conf|
#                                                              = |1 - 0.35| = 0.65
#   bin 3 (0.2, 0.2667]:   c=0.25 (correct)                 -> |1 - 0.25|  = 0.75
#   bin 5 (0.3333, 0.4]:   c=0.4 (wrong), c=0.35 (correct)  -> |1 - 0.75|  = 0.25
#   bin 14 (0.9333, 1.0]:  c=1.0, c=0.95 (both correct)     -> |2 - 1.95|  = 0.05
#   the other 11 bins are empty and contribute 0.
# ECE = sum_m (n_m/n)|acc_m - conf_m| = sum_m |sum_acc_m - sum_conf_m| / n = 1.7 / 7
# ([lo, hi) bins would give (0.85 + 0.55 + 0.4 + 0.65 + ...)/7 instead: 0.2 -> bin 3, 0.4 -> bin 6.)
ECE_EXPECTED = 1.7 / 7


def test_ece_hand_edges_and_one():
    assert M.ece(ECE_ROWS, ECE_LABELS) == pytest.approx(ECE_EXPECTED, abs=1e-12)


def test_ece_float32_edges_bin_like_float32_reference():
    # float32(0.2) and float32(0.4) equal the float32 edges, so they stay in the lower bin
    # (float64 widening would make them 0.2000000030 / 0.4000000060 and move them up).
    assert M.ece(ECE_ROWS.astype(np.float32), ECE_LABELS) == pytest.approx(ECE_EXPECTED, abs=1e-6)


def test_ece_zero_confidence_goes_to_first_bin():
    p = np.array([[0.0, 0.0], [0.05, 0.0]])  # rows need not sum to 1
    y = np.array([0, 1])
    # row 0: argmax 0 = label -> correct, c = 0 -> bin 0 (not dropped)
    # row 1: pred 0, label 1 -> wrong, c = 0.05 -> bin 0 (0, 0.0667]
    # bin 0: |sum_acc - sum_conf| = |1 - 0.05| = 0.95 -> ECE = 0.95 / 2
    assert M.ece(p, y) == pytest.approx(0.475, abs=1e-12)


def test_ece_custom_bins():
    # 2 bins (0, 0.5], (0.5, 1]: c=0.5 (correct) goes to bin 0 alone: |1 - 0.5| = 0.5
    # bin 1: c=0.9 (wrong), c=0.7 (correct): |1 - 1.6| = 0.6.  ECE = 1.1 / 3
    p = np.array([[0.5, 0.5], [0.9, 0.1], [0.3, 0.7]])
    y = np.array([0, 1, 1])
    assert M.ece(p, y, n_bins=2) == pytest.approx(1.1 / 3, abs=1e-12)


def test_nll_hand_and_zero_probability_is_finite():
    p = np.array([[0.5, 0.5], [1.0, 0.0]])
    y = np.array([0, 1])
    # -log 0.5 = ln 2; p=0 is clamped to tiny = 2^-1022, -log(2^-1022) = 1022 ln 2
    # mean = (ln 2 + 1022 ln 2) / 2 = 1023 ln 2 / 2
    value = M.nll(p, y)
    assert math.isfinite(value)
    assert value == pytest.approx(1023 * math.log(2) / 2, rel=1e-12)


def test_brier_hand():
    p = np.array([[0.7, 0.2, 0.1], [0.5, 0.5, 0.0]])
    y = np.array([0, 2])
    # row 0: (0.7-1)^2 + 0.2^2 + 0.1^2 = 0.09 + 0.04 + 0.01 = 0.14
    # row 1: 0.5^2 + 0.5^2 + (0-1)^2   = 0.25 + 0.25 + 1    = 1.5
    # mean = 1.64 / 2 = 0.82 (summed over classes; range [0, 2])
    assert M.brier(p, y) == pytest.approx(0.82, abs=1e-12)
    # worst case: all mass on a wrong class -> 1 + 1 = 2
    assert M.brier(np.array([[0.0, 1.0]]), np.array([0])) == pytest.approx(2.0)


AURC_P = np.array([[0.9, 0.1], [0.7, 0.3], [0.7, 0.3], [0.6, 0.4]])


def test_aurc_hand_stable_tie():
    y = np.array([0, 1, 0, 0])  # correct, WRONG, correct, correct; rows 1 and 2 tie at 0.7
    # stable order 0,1,2,3: E = 0,1,1,1 -> risks 0, 1/2, 1/3, 1/4
    # AURC = (0 + 0.5 + 0.3333 + 0.25) / 4 = (13/12) / 4 = 13/48
    assert M.aurc(AURC_P, y) == pytest.approx(13 / 48, abs=1e-12)
    # swap which of the tied rows is wrong: order 0,1,2,3 gives E = 0,0,1,1
    # AURC = (0 + 0 + 1/3 + 1/4) / 4 = (7/12) / 4 = 7/48
    y_swapped = np.array([0, 0, 1, 0])
    assert M.aurc(AURC_P, y_swapped) == pytest.approx(7 / 48, abs=1e-12)


def test_eaurc_hand():
    p = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    y = np.array([0, 0, 0, 1])  # only the least confident is wrong
    # E = 0,0,0,1 -> AURC = (1/4) / 4 = 0.0625;  r = 0.25
    # AURC* = 0.25 + 0.75 ln 0.75 = 0.25 - 0.215761554338835... = 0.034238445661164...
    expected = 0.0625 - (0.25 + 0.75 * math.log(0.75))
    assert M.aurc(p, y) == pytest.approx(0.0625, abs=1e-12)
    assert M.eaurc(p, y) == pytest.approx(expected, abs=1e-12)
    assert M.eaurc(p, y) == pytest.approx(0.028261554338835, abs=1e-12)


def test_eaurc_r0_and_all_wrong():
    p = np.array([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4]])
    # r = 0: AURC = 0 and AURC* = 0 + 1 * ln 1 = 0
    assert M.aurc(p, np.array([0, 0, 0])) == 0.0
    assert M.eaurc(p, np.array([0, 0, 0])) == 0.0
    # r = 1: every risk E_i / i = 1 -> AURC = 1; AURC* = limit 1 -> E-AURC = 0
    assert M.aurc(p, np.array([1, 1, 1])) == pytest.approx(1.0)
    assert M.eaurc(p, np.array([1, 1, 1])) == pytest.approx(0.0, abs=1e-12)


# 4 samples: correct at confidences 0.9, 0.6; wrong at 0.7, 0.6 (a correct/wrong tie at 0.6)
FAIL_P = np.array([[0.9, 0.1], [0.7, 0.3], [0.6, 0.4], [0.6, 0.4]])
FAIL_Y = np.array([0, 1, 0, 1])


def test_failure_auroc_hand_tie_counts_half():
    # (pos, neg) pairs: (0.9,0.7)=1, (0.9,0.6)=1, (0.6,0.7)=0, (0.6,0.6)=1/2 -> 2.5/4
    assert M.failure_auroc(FAIL_P, FAIL_Y) == pytest.approx(0.625, abs=1e-12)


def test_failure_aupr_success_hand_trapezoid():
    # thresholds 0.9: tp1 fp0 (R .5, P 1); 0.7: tp1 fp1 (R .5, P .5); 0.6: tp2 fp2 (R 1, P .5)
    # plus (R 0, P 1).  Trapezoid: 0.5*(1+1)/2 + 0 + 0.5*(0.5+0.5)/2 = 0.5 + 0.25
    assert M.failure_aupr_success(FAIL_P, FAIL_Y) == pytest.approx(0.75, abs=1e-12)


def test_failure_aupr_error_hand_average_precision():
    # errors positive, score -c: -0.6 {wrong, correct}: tp1 fp1 (R .5, P .5);
    # -0.7 wrong: tp2 fp1 (R 1, P 2/3); -0.9: tp2 fp2 (R 1, P .5)
    # AP = 0.5*0.5 + 0.5*(2/3) + 0*0.5 = 7/12
    assert M.failure_aupr_error(FAIL_P, FAIL_Y) == pytest.approx(7 / 12, abs=1e-12)


def test_failure_fpr95_uses_sklearn_drop_intermediate_points():
    # 20 correct, 20 wrong (C=2: label 0 = correct since c > 0.5, label 1 = wrong)
    top = [0.99 - 0.01 * k for k in range(10)]  # 10 correct alone: (tps, fps) = (1..10, 0)
    paired = [0.80 - 0.01 * k for k in range(10)]  # 1 correct + 1 wrong tied: (11..20, 1..10)
    bottom = [0.60 - 0.01 * k for k in range(10)]  # 10 wrong alone: (20, 11..20)
    conf = np.array(top + paired + paired + bottom)
    y = np.array([0] * 10 + [0] * 10 + [1] * 10 + [1] * 10)
    p = np.stack([conf, 1.0 - conf], axis=1)
    # drop_intermediate keeps (0,0) (1,0) (10,0) (20,10) (20,20) in (tps, fps):
    # TPR 0, .05, .5, 1, 1 -> nearest 0.95 is TPR 1 at FPR 10/20 = 0.5.
    # (Without dropping, (19, 9) would give TPR 0.95 exactly and FPR 0.45.)
    assert M.failure_fpr95(p, y) == pytest.approx(0.5, abs=1e-15)
    fpr, tpr, _ = roc_curve(y == 0, conf)
    assert fpr[np.argmin(np.abs(tpr - 0.95))] == 0.5  # sklearn agrees


def test_ood_hand_cases():
    # AUROC, ties half: pairs (3,2)=1 (3,1)=1 (2,2)=1/2 (2,1)=1 -> 3.5/4
    assert M.ood_auroc(np.array([3.0, 2.0]), np.array([2.0, 1.0])) == pytest.approx(0.875)
    s_id, s_ood = np.array([0.9, 0.6, 0.3]), np.array([0.7])
    # AUPR-In: order .9(ID) .7(OOD) .6(ID) .3(ID): precisions at recall 1/3, 2/3, 1 are
    # 1, 2/3, 3/4 -> AP = (1 + 2/3 + 3/4) / 3 = 29/36
    assert M.ood_aupr_in(s_id, s_ood) == pytest.approx(29 / 36, abs=1e-12)
    # AUPR-Out: OOD positive with -s: order -.3 -.6 -.7(OOD) -.9 -> precision 1/3 at recall 1
    assert M.ood_aupr_out(s_id, s_ood) == pytest.approx(1 / 3, abs=1e-12)


def test_ood_fpr95_n20_and_ties_at_tau():
    s_id = np.arange(1.0, 21.0)  # 1, 2, ..., 20
    # k = ceil(0.95 * 20) = 19 -> tau = 19th largest = 2 (19 of 20 ID scores are >= 2)
    s_ood = np.array([2.0, 1.5, 2.5, 0.0])
    # OOD >= 2: {2.0 (tie at tau, counted), 2.5} -> 2/4.
    # (k = 20 would give tau = 1 -> 3/4; a strict '>' would give 1/4.)
    assert M.ood_fpr95(s_id, s_ood) == 0.5
    # N1 = 3: k = ceil(2.85) = 3 -> tau = min ID = 0.1; OOD >= 0.1: {0.1, 0.5} -> 2/3
    s_id3, s_ood3 = np.array([0.1, 0.9, 0.5]), np.array([0.1, 0.5, 0.05])
    assert M.ood_fpr95(s_id3, s_ood3) == pytest.approx(2 / 3)


# ------------------------------------------------------------------ degenerate cases

DEG_P = np.array([[0.5, 0.3, 0.2], [0.9, 0.05, 0.05], [0.2, 0.7, 0.1]])


def test_all_correct():
    y = np.array([0, 0, 1])
    assert M.accuracy(DEG_P, y) == 1.0
    # bins: 0.5 -> (0.4667,0.5333], 0.9 -> (0.8667,0.9333], 0.7 -> (0.6667,0.7333], each alone
    # ECE = (|1-0.5| + |1-0.9| + |1-0.7|) / 3 = 0.9 / 3
    assert M.ece(DEG_P, y) == pytest.approx(0.3, abs=1e-12)
    assert M.nll(DEG_P, y) == pytest.approx(-(math.log(0.5) + math.log(0.9) + math.log(0.7)) / 3)
    # Brier rows: .25+.09+.04=.38; .01+.0025+.0025=.015; .04+.09+.01=.14 -> .535/3
    assert M.brier(DEG_P, y) == pytest.approx(0.535 / 3, abs=1e-12)
    assert M.aurc(DEG_P, y) == 0.0
    assert M.eaurc(DEG_P, y) == 0.0
    assert math.isnan(M.failure_auroc(DEG_P, y))
    assert math.isnan(M.failure_fpr95(DEG_P, y))
    assert M.failure_aupr_success(DEG_P, y) == pytest.approx(1.0)  # precision is 1 everywhere
    assert math.isnan(M.failure_aupr_error(DEG_P, y))  # no errors to detect


def test_all_wrong():
    y = np.array([1, 2, 0])
    assert M.accuracy(DEG_P, y) == 0.0
    # ECE = (0.5 + 0.9 + 0.7) / 3 = 0.7
    assert M.ece(DEG_P, y) == pytest.approx(0.7, abs=1e-12)
    assert M.nll(DEG_P, y) == pytest.approx(-(math.log(0.3) + math.log(0.05) + math.log(0.2)) / 3)
    # Brier rows: .25+.49+.04=.78; .81+.0025+.9025=1.715; .64+.49+.01=1.14 -> 3.635/3
    assert M.brier(DEG_P, y) == pytest.approx(3.635 / 3, abs=1e-12)
    assert M.aurc(DEG_P, y) == pytest.approx(1.0)
    assert M.eaurc(DEG_P, y) == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(M.failure_auroc(DEG_P, y))
    assert math.isnan(M.failure_fpr95(DEG_P, y))
    assert math.isnan(M.failure_aupr_success(DEG_P, y))  # no successes
    assert M.failure_aupr_error(DEG_P, y) == pytest.approx(1.0)  # every sample is an error


def test_single_class_problem():
    p = np.ones((5, 1))  # C = 1: every prediction is class 0 with confidence 1
    y = np.zeros(5, dtype=np.int64)
    assert M.accuracy(p, y) == 1.0
    assert M.ece(p, y) == 0.0
    assert M.nll(p, y) == 0.0
    assert M.brier(p, y) == 0.0
    assert M.aurc(p, y) == 0.0 and M.eaurc(p, y) == 0.0
    assert math.isnan(M.failure_auroc(p, y)) and math.isnan(M.failure_fpr95(p, y))
    assert math.isnan(M.failure_aupr_error(p, y))


def test_all_labels_equal_multiclass():
    p, _ = make_case(200, 4, 21)
    y = np.zeros(200, dtype=np.int64)  # every label is class 0
    conf, correct = conf_correct(p, y)
    assert M.accuracy(p, y) == pytest.approx(accuracy_score(y, p.argmax(axis=1)))
    assert M.ece(p, y) == pytest.approx(ece_loop(p, y), abs=1e-12)
    assert M.nll(p, y) == pytest.approx(log_loss(y, p, labels=[0, 1, 2, 3]), rel=1e-12)
    assert M.brier(p, y) == pytest.approx(brier_score_loss(y, p, labels=[0, 1, 2, 3]), abs=1e-12)
    assert M.failure_auroc(p, y) == pytest.approx(roc_auc_score(correct, conf), abs=1e-12)


# ------------------------------------------------------------------------ bad input

GOOD_P = np.array([[0.6, 0.4], [0.3, 0.7]])
GOOD_Y = np.array([0, 1])


@pytest.mark.parametrize("name", M.registered(on_scores=False))
@pytest.mark.parametrize(
    "probs,labels",
    [
        (np.array([0.6, 0.4]), np.array([0])),  # probs 1-D
        (np.ones((2, 2, 1)) / 2, GOOD_Y),  # probs 3-D
        (GOOD_P, np.array([0, 1, 1])),  # N mismatch
        (GOOD_P, GOOD_Y[:, None]),  # labels 2-D
        (np.zeros((0, 3)), np.zeros(0, dtype=int)),  # N = 0
        (GOOD_P, np.array([0, 2])),  # label out of range
        (GOOD_P, np.array([-1, 0])),  # negative label
        (GOOD_P, np.array([0.0, 1.0])),  # float labels
        (np.array([[np.nan, 0.5], [0.3, 0.7]]), GOOD_Y),  # NaN
        (np.array([[1.5, -0.5], [0.3, 0.7]]), GOOD_Y),  # outside [0, 1]
    ],
)
def test_bad_classification_input_raises(name, probs, labels):
    with pytest.raises(ValueError):
        getattr(M, name)(probs, labels)


@pytest.mark.parametrize("n_bins", [0, -3, 2.5, True])
def test_bad_n_bins_raises(n_bins):
    with pytest.raises(ValueError):
        M.ece(GOOD_P, GOOD_Y, n_bins=n_bins)


@pytest.mark.parametrize("name", M.registered(on_scores=True))
@pytest.mark.parametrize(
    "s_id,s_ood",
    [
        (np.ones((2, 2)), np.ones(3)),  # 2-D
        (np.ones(3), np.ones((3, 1))),  # 2-D
        (np.array([]), np.ones(3)),  # empty ID
        (np.ones(3), np.array([])),  # empty OOD
        (np.array([0.1, np.nan]), np.ones(3)),  # NaN
        (np.ones(3), np.array([np.inf])),  # inf
    ],
)
def test_bad_ood_input_raises(name, s_id, s_ood):
    with pytest.raises(ValueError):
        getattr(M, name)(s_id, s_ood)
