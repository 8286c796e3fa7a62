"""Failure prediction (misclassification detection) on ``(probs, labels)``.

Conventions
    * Positive = correct prediction, score = MSP.  AUROC counts ties as one half (sklearn
      ``roc_auc_score``); FPR95 is the FPR of the ``sklearn.metrics.roc_curve`` point
      (default ``drop_intermediate=True``, initial (0, 0) point included) whose TPR is
      nearest 0.95, first on ties; AUPR-Success is the trapezoid area under the
      precision-recall curve (sklearn ``auc(recall, precision)``); AUPR-Error is average
      precision with errors positive and score -MSP.  Undefined values (no positives
      and/or no negatives) are NaN.
    * Variants (``docs/reference/metrics.md`` section 4): fd-shifts' FPR95 (first point with
      TPR >= 0.9495), AUPR-Success as average precision and AUPR-Error by the trapezoid,
      registered beside their defaults.

The vectorised bootstrap kernels stand just above the metrics they evaluate.
"""
from __future__ import annotations

import numpy as np

from bench.metrics.curves import BinaryCurve
from bench.metrics.inputs import confidence_correct
from bench.metrics.record import metric
from bench.metrics.resample import (
    TieGroups,
    aupr_trapezoid_from_cumulative,
    auroc_from_cumulative,
    average_precision_from_cumulative,
    curve_metric,
    fpr_at_tpr_from_cumulative,
)


def _failure_curve(probs: np.ndarray, labels: np.ndarray, *, errors_positive: bool) -> BinaryCurve:
    """Binary curve for misclassification detection from ``(probs, labels)``.

    ``errors_positive=False``: correct = positive, score = MSP.
    ``errors_positive=True``: error = positive, score = -MSP.
    """
    conf, correct = confidence_correct(probs, labels)
    if errors_positive:
        return BinaryCurve(~correct, -conf)
    return BinaryCurve(correct, conf)


def _failure_groups(probs, labels, errors_positive: bool) -> TieGroups:
    conf, correct = confidence_correct(probs, labels)
    if errors_positive:
        return TieGroups(~correct, -conf)
    return TieGroups(correct, conf)


def _boot_failure_auroc(probs, labels, w):
    return curve_metric(auroc_from_cumulative, _failure_groups(probs, labels, False), w)


@metric(
    'failure', 'AUROC', '%', True,
    'Misclassification AUROC: correct = positive, score MSP, ties count half.',
    bootstrap=_boot_failure_auroc, selections={"paper": 2, "default": 2, "shift": 5},
)
def failure_auroc(probs: np.ndarray, labels: np.ndarray) -> float:
    """Misclassification-detection AUROC in [0, 1]: correct = positive, score = MSP.

    ``probs`` [N, C], ``labels`` [N] int.  Ties count one half (sklearn ``roc_auc_score``).
    NaN when all predictions are correct or all are wrong.
    """
    return _failure_curve(probs, labels, errors_positive=False).auroc()


def _boot_failure_fpr95(probs, labels, w):
    return curve_metric(fpr_at_tpr_from_cumulative, _failure_groups(probs, labels, False), w)


@metric(
    'failure', 'FPR95', '%', False,
    'Errors accepted at the sklearn ROC point with TPR nearest 0.95; correct = '
    'positive, score MSP.',
    bootstrap=_boot_failure_fpr95, selections={"paper": 3, "default": 3},
)
def failure_fpr95(probs: np.ndarray, labels: np.ndarray) -> float:
    """FPR (fraction of errors accepted) at the ROC point with TPR nearest 0.95.

    ``probs`` [N, C], ``labels`` [N] int.  Correct = positive, score = MSP.  Points as
    ``sklearn.metrics.roc_curve`` returns them (drop_intermediate=True, with the initial
    (0, 0)); argmin |TPR - 0.95|, first on ties.  NaN when all correct or all wrong.
    """
    return _failure_curve(probs, labels, errors_positive=False).fpr_at_tpr(0.95)


@metric(
    'failure', 'FPR95-first', '%', False,
    'Errors accepted at the first sklearn ROC point with TPR >= 0.9495; correct = '
    'positive, score MSP (fd-shifts).',
)
def failure_fpr95_first(probs: np.ndarray, labels: np.ndarray) -> float:
    """fd-shifts' FPR@95TPR: FPR at the first ROC point with TPR >= 0.9495.

    ``probs`` [N, C], ``labels`` [N] int.  Correct = positive, score = MSP; sklearn
    ``roc_curve`` points (drop_intermediate=True), i.e. ``min(fpr[tpr >= 0.9495])``.  NaN
    when all predictions are correct or all wrong.
    """
    return _failure_curve(probs, labels, errors_positive=False).fpr_at_first_tpr(0.9495)


def _boot_failure_aupr_success(probs, labels, w):
    return curve_metric(aupr_trapezoid_from_cumulative, _failure_groups(probs, labels, False), w)


@metric(
    'failure', 'AUPR-S', '%', True,
    'Trapezoid area under PR, correct = positive, score MSP.',
    bootstrap=_boot_failure_aupr_success, selections={"paper": 8, "default": 8},
)
def failure_aupr_success(probs: np.ndarray, labels: np.ndarray) -> float:
    """AUPR-Success: trapezoid area under precision-recall, correct = positive, score = MSP.

    ``probs`` [N, C], ``labels`` [N] int.  Equals ``sklearn.metrics.auc(recall, precision)``
    on ``precision_recall_curve`` (final (recall 0, precision 1) point included).  NaN when
    no prediction is correct.
    """
    return _failure_curve(probs, labels, errors_positive=False).aupr_trapezoid()


@metric(
    'failure', 'AUPR-S-AP', '%', True,
    'Average precision, correct = positive, score MSP (fd-shifts).',
)
def failure_aupr_success_ap(probs: np.ndarray, labels: np.ndarray) -> float:
    """AUPR-Success as average precision: correct = positive, score = MSP (fd-shifts).

    ``probs`` [N, C], ``labels`` [N] int.  As ``sklearn.metrics.average_precision_score``.
    NaN when no prediction is correct.
    """
    return _failure_curve(probs, labels, errors_positive=False).average_precision()


def _boot_failure_aupr_error(probs, labels, w):
    return curve_metric(average_precision_from_cumulative, _failure_groups(probs, labels, True), w)


@metric(
    'failure', 'AUPR-E', '%', True,
    'Average precision, error = positive, score -MSP.',
    bootstrap=_boot_failure_aupr_error, selections={"paper": 9, "default": 9},
)
def failure_aupr_error(probs: np.ndarray, labels: np.ndarray) -> float:
    """AUPR-Error: average precision with errors = positive and score = -MSP.

    ``probs`` [N, C], ``labels`` [N] int.  As ``sklearn.metrics.average_precision_score``.
    NaN when there are no errors.
    """
    return _failure_curve(probs, labels, errors_positive=True).average_precision()


@metric(
    'failure', 'AUPR-E-trap', '%', True,
    'Trapezoid area under PR, error = positive, score -MSP.',
)
def failure_aupr_error_trapezoid(probs: np.ndarray, labels: np.ndarray) -> float:
    """AUPR-Error by the trapezoid rule: errors = positive, score = -MSP.

    ``probs`` [N, C], ``labels`` [N] int.  ``sklearn.metrics.auc(recall, precision)`` on
    ``precision_recall_curve`` (final (recall 0, precision 1) point included).  NaN when
    there are no errors.
    """
    return _failure_curve(probs, labels, errors_positive=True).aupr_trapezoid()
