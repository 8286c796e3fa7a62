"""OOD detection on ``(scores_id, scores_ood)``, higher score = more in-distribution.

Conventions
    * ID = positive.  AUROC (ties half), AUPR-In = average precision with score s,
      AUPR-Out = average precision with OOD positive and score -s.  FPR95: tau is the
      largest value with at least 95% of ID scores ``>= tau`` (the k-th largest ID score,
      k = ceil(0.95 N1) computed in integers) and FPR95 is the fraction of OOD scores
      ``>= tau`` (OOD samples tied with tau count as accepted).
    * Variants (``docs/reference/metrics.md`` section 5): OpenOOD's and TorchUncertainty's FPR95
      (OOD positive) and OpenOOD's trapezoid AUPRs, registered beside their defaults.

The vectorised bootstrap kernels stand just above the metrics they evaluate.
"""
from __future__ import annotations

import numpy as np

from bench.metrics.curves import BinaryCurve
from bench.metrics.inputs import check_scores
from bench.metrics.record import metric
from bench.metrics.resample import (
    TieGroups,
    auroc_from_cumulative,
    average_precision_from_cumulative,
)


def _ood_curve(
    scores_id: np.ndarray, scores_ood: np.ndarray, *, ood_positive: bool
) -> BinaryCurve:
    """Binary curve for OOD detection: ID positive with score s, or OOD positive with -s."""
    s_id, s_ood = check_scores(scores_id, scores_ood)
    is_id = np.concatenate((np.ones(s_id.shape[0], bool), np.zeros(s_ood.shape[0], bool)))
    score = np.concatenate((s_id, s_ood))
    if ood_positive:
        return BinaryCurve(~is_id, -score)
    return BinaryCurve(is_id, score)


def _boot_ood_curve(s_id, s_ood, w_id, w_ood, fn, ood_positive: bool) -> np.ndarray:
    """``fn`` on the ID-vs-OOD curve of every resample (ID and OOD counts side by side)."""
    is_id = np.concatenate((np.ones(s_id.shape[0], bool), np.zeros(s_ood.shape[0], bool)))
    score = np.concatenate((s_id, s_ood))
    groups = TieGroups(~is_id, -score) if ood_positive else TieGroups(is_id, score)
    return np.array(
        [fn(*groups.cumulative(np.concatenate((a, b)))) for a, b in zip(w_id, w_ood)], dtype=np.float64
    )


def _boot_ood_auroc(s_id, s_ood, w_id, w_ood):
    return _boot_ood_curve(s_id, s_ood, w_id, w_ood, auroc_from_cumulative, False)


@metric(
    'ood', 'AUROC', '%', True,
    'ID-vs-OOD AUROC, ID = positive, score s (higher = ID, MSP by default), ties count '
    'half.',
    bootstrap=_boot_ood_auroc, selections={"paper": 10, "default": 10},
)
def ood_auroc(scores_id: np.ndarray, scores_ood: np.ndarray) -> float:
    """ID-vs-OOD AUROC in [0, 1]; ID = positive, higher score = more ID, ties count half.

    ``scores_id`` [N1], ``scores_ood`` [N2], both non-empty.
    """
    return _ood_curve(scores_id, scores_ood, ood_positive=False).auroc()


def _boot_ood_aupr_in(s_id, s_ood, w_id, w_ood):
    return _boot_ood_curve(s_id, s_ood, w_id, w_ood, average_precision_from_cumulative, False)


@metric(
    'ood', 'AUPR-In', '%', True,
    'Average precision, ID = positive, score s (higher = ID).',
    bootstrap=_boot_ood_aupr_in, selections={"paper": 11, "default": 11},
)
def ood_aupr_in(scores_id: np.ndarray, scores_ood: np.ndarray) -> float:
    """AUPR-In: average precision with ID = positive and score s.

    ``scores_id`` [N1], ``scores_ood`` [N2], both non-empty.
    """
    return _ood_curve(scores_id, scores_ood, ood_positive=False).average_precision()


@metric(
    'ood', 'AUPR-In-trap', '%', True,
    'Trapezoid area under PR, ID = positive, score s (OpenOOD).',
)
def ood_aupr_in_trapezoid(scores_id: np.ndarray, scores_ood: np.ndarray) -> float:
    """OpenOOD's AUPR_IN: trapezoid area under precision-recall, ID = positive, score s.

    ``scores_id`` [N1], ``scores_ood`` [N2].  ``auc(recall, precision)`` on sklearn
    ``precision_recall_curve`` (with its final (0, 1) point).
    """
    return _ood_curve(scores_id, scores_ood, ood_positive=False).aupr_trapezoid()


def _boot_ood_aupr_out(s_id, s_ood, w_id, w_ood):
    return _boot_ood_curve(s_id, s_ood, w_id, w_ood, average_precision_from_cumulative, True)


@metric(
    'ood', 'AUPR-Out', '%', True,
    'Average precision, OOD = positive, score -s.',
    bootstrap=_boot_ood_aupr_out, selections={"paper": 12, "default": 12},
)
def ood_aupr_out(scores_id: np.ndarray, scores_ood: np.ndarray) -> float:
    """AUPR-Out: average precision with OOD = positive and score -s.

    ``scores_id`` [N1], ``scores_ood`` [N2], both non-empty.
    """
    return _ood_curve(scores_id, scores_ood, ood_positive=True).average_precision()


@metric(
    'ood', 'AUPR-Out-trap', '%', True,
    'Trapezoid area under PR, OOD = positive, score -s (OpenOOD).',
)
def ood_aupr_out_trapezoid(scores_id: np.ndarray, scores_ood: np.ndarray) -> float:
    """OpenOOD's AUPR_OUT: trapezoid area under precision-recall, OOD = positive, score -s.

    ``scores_id`` [N1], ``scores_ood`` [N2].  ``auc(recall, precision)`` on sklearn
    ``precision_recall_curve`` (with its final (0, 1) point).
    """
    return _ood_curve(scores_id, scores_ood, ood_positive=True).aupr_trapezoid()


def _boot_ood_fpr95(s_id, s_ood, w_id, w_ood):
    """tau = k-th largest drawn ID score, k = ceil(0.95 n1); FPR = drawn OOD share >= tau.

    The k-th largest is the (n1 - k + 1)-th smallest: the first position of the ascending
    ID scores where the cumulative count reaches n1 - k + 1.  OOD scores >= tau are the
    ascending positions from ``searchsorted(left)`` on.
    """
    id_order = np.argsort(s_id, kind="stable")
    id_sorted = s_id[id_order]
    ood_order = np.argsort(s_ood, kind="stable")
    ood_sorted = s_ood[ood_order]
    n1 = w_id.sum(axis=1)
    rank = n1 - (95 * n1 + 99) // 100 + 1  # k = ceil(0.95 n1); tau is the rank-th smallest
    out = np.empty(w_id.shape[0])
    for b in range(w_id.shape[0]):
        tau = id_sorted[np.searchsorted(np.cumsum(w_id[b][id_order]), rank[b], side="left")]
        below = np.cumsum(w_ood[b][ood_order])
        first = int(np.searchsorted(ood_sorted, tau, side="left"))
        accepted = below[-1] - (below[first - 1] if first > 0 else 0)
        out[b] = accepted / below[-1]
    return out


@metric(
    'ood', 'FPR95', '%', False,
    'OOD accepted (s >= tau, ties accepted) at the largest tau keeping >= 95% of ID; ID '
    '= positive.',
    bootstrap=_boot_ood_fpr95, selections={"paper": 13, "default": 13},
)
def ood_fpr95(scores_id: np.ndarray, scores_ood: np.ndarray) -> float:
    """Fraction of OOD samples accepted at the threshold keeping at least 95% of ID.

    ``scores_id`` [N1], ``scores_ood`` [N2], both non-empty; higher = more ID.
    tau = the largest value with at least 95% of ID scores >= tau, i.e. the k-th largest
    ID score with k = ceil(0.95 N1) (integer arithmetic: N1 = 20 gives k = 19); returns
    mean(scores_ood >= tau), so OOD scores tied with tau count as false positives.
    """
    s_id, s_ood = check_scores(scores_id, scores_ood)
    n1 = s_id.shape[0]
    k = (95 * n1 + 99) // 100  # ceil(95 * n1 / 100), exact
    tau = np.partition(s_id, n1 - k)[n1 - k]  # k-th largest
    return float(np.mean(s_ood >= tau))


@metric(
    'ood', 'FPR95-OpenOOD', '%', False,
    'ID flagged as OOD at the first sklearn ROC point with OOD recall >= 0.95; OOD = '
    'positive, score -s (OpenOOD v1.5).',
)
def ood_fpr95_openood(scores_id: np.ndarray, scores_ood: np.ndarray) -> float:
    """OpenOOD v1.5 FPR@95: fraction of ID samples flagged as OOD at 95% OOD recall.

    ``scores_id`` [N1], ``scores_ood`` [N2]; higher score = more ID.  OOD = positive with
    score -s; on sklearn ``roc_curve`` points (drop_intermediate=True) the first point
    with TPR >= 0.95 (``fpr[argmax(tpr >= 0.95)]``); ID samples tied with the threshold
    count as flagged.
    """
    return _ood_curve(scores_id, scores_ood, ood_positive=True).fpr_at_first_tpr(0.95)


@metric(
    'ood', 'FPR95-TU', '%', False,
    "ID flagged as OOD at the threshold with OOD recall nearest 0.95, recalls and distances "
    "in float32 as TorchUncertainty computes them, float32 ties to the lowest threshold "
    "(Hendrycks' float64 code differs only on float32 ties); OOD = positive, score -s.",
)
def ood_fpr95_tu(scores_id: np.ndarray, scores_ood: np.ndarray) -> float:
    """TorchUncertainty ``FPR95`` (Hendrycks' ``fpr_and_fdr_at_recall``): OOD positive.

    ``scores_id`` [N1], ``scores_ood`` [N2]; higher score = more ID; OOD = positive with
    score -s (TorchUncertainty's ``-MSP``).  Over every distinct threshold down to the
    first reaching full OOD recall, the one with recall nearest 0.95, in TorchUncertainty's
    float32 arithmetic (``BinaryCurve.fpr_at_tpr_tu``); returns the fraction of ID samples
    flagged as OOD there.  Example: OOD scores 0..429 and ID scores (408.5, 1e4) give 0.0
    (recall 408/430 is nearer 0.95 than 409/430 in float32), as TorchUncertainty and
    Hendrycks' code do.
    """
    return _ood_curve(scores_id, scores_ood, ood_positive=True).fpr_at_tpr_tu(0.95)
