"""Uncertainty metrics as pure numpy functions (definitions: ``reference/metrics.md``).

Every function returns a raw, unscaled Python ``float`` (accuracy and ECE as fractions in
[0, 1], NLL in nats, Brier in [0, 2], AURC/E-AURC as plain risks); scales such as %, x100
or x1000 are applied only in reports.  The conventions are the paper-faithful ones
(KEP-SVGP, official code ``CIFAR/utils/metrics.py``):

Inputs
    Classification metrics take ``probs`` ``[N, C]`` (rows are predictive distributions;
    finite and in [0, 1], rows are neither checked to sum to 1 nor renormalised) and
    ``labels`` ``[N]`` (integer dtype, values in ``[0, C)``).  OOD metrics take
    ``scores_id`` ``[N1]`` and ``scores_ood`` ``[N2]`` (finite, both non-empty), where a
    higher score means "more in-distribution".  float32 and float64 inputs are accepted;
    everything is computed in float64.  Invalid inputs raise ``ValueError``.

Notation
    prediction = ``argmax`` of the row (ties -> lowest class index, as ``np.argmax``);
    confidence ``c`` = maximum probability (MSP); a prediction is *correct* when it equals
    the label.

Conventions
    * ECE: top-label, ``n_bins`` equal-width bins with edges ``linspace(0, 1, n_bins + 1)``;
      a sample is in bin m when ``lo < c <= hi`` (``(lo, hi]``), so ``c = 1.0`` is in the
      last bin and ``c = 0`` goes to the first.  Bins are assigned in the input's float
      precision (a float32 confidence equal to float32(0.2) is on the edge 0.2, as in the
      float32 torch reference); the sums are float64.  Empty bins contribute 0.
    * NLL: probabilities are clamped below at ``np.finfo(np.float64).tiny`` so a zero
      probability on the true class gives a large finite value (about 708.4), not inf.
    * Brier: squared error summed over classes, averaged over samples (range [0, 2]).
    * AURC: samples sorted by confidence, highest first, with a *stable* sort (ties keep
      their input order); AURC = (1/n) sum_i E_i / i, E_i = errors among the top i.
    * E-AURC = AURC - AURC*, AURC* = r + (1 - r) ln(1 - r), r = error rate (AURC* = 1 at r = 1).
    * Failure prediction (misclassification detection): positive = correct prediction,
      score = MSP.  AUROC counts ties as one half (sklearn ``roc_auc_score``); FPR95 is the
      FPR of the ``sklearn.metrics.roc_curve`` point (default ``drop_intermediate=True``,
      initial (0, 0) point included) whose TPR is nearest 0.95, first on ties;
      AUPR-Success is the trapezoid area under the precision-recall curve (sklearn
      ``auc(recall, precision)``); AUPR-Error is average precision with errors positive
      and score -MSP.  Undefined values (no positives and/or no negatives) are NaN.
    * OOD detection: ID = positive.  AUROC (ties half), AUPR-In = average precision with
      score s, AUPR-Out = average precision with OOD positive and score -s.  FPR95: tau is
      the largest value with at least 95% of ID scores ``>= tau`` (the k-th largest ID
      score, k = ceil(0.95 N1) computed in integers) and FPR95 is the fraction of OOD
      scores ``>= tau`` (OOD samples tied with tau count as accepted).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from bench.registry import METRICS

__all__ = [
    "CLASSIFICATION_METRICS",
    "OOD_METRICS",
    "accuracy",
    "ece",
    "nll",
    "brier",
    "aurc",
    "eaurc",
    "failure_auroc",
    "failure_fpr95",
    "failure_aupr_success",
    "failure_aupr_error",
    "ood_auroc",
    "ood_aupr_in",
    "ood_aupr_out",
    "ood_fpr95",
]

CLASSIFICATION_METRICS: tuple[str, ...] = (
    "accuracy",
    "ece",
    "nll",
    "brier",
    "aurc",
    "eaurc",
    "failure_auroc",
    "failure_fpr95",
    "failure_aupr_success",
    "failure_aupr_error",
)
OOD_METRICS: tuple[str, ...] = ("ood_auroc", "ood_aupr_in", "ood_aupr_out", "ood_fpr95")

_Metric = Callable[..., float]


def _register(fn: _Metric) -> _Metric:
    """Register ``fn`` in :data:`bench.registry.METRICS` under its function name."""
    return METRICS.register(fn.__name__)(fn)


# --------------------------------------------------------------------------- validation


def _check_probs_labels(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate a classification input; return ``(probs, labels)`` as given (arrays).

    ``probs`` keeps its dtype (callers convert to float64; ECE bins in the input precision).
    """
    probs = np.asarray(probs)
    labels = np.asarray(labels)
    if probs.ndim != 2:
        raise ValueError(f"probs must be 2-D [N, C], got shape {probs.shape}")
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D [N], got shape {labels.shape}")
    n, n_classes = probs.shape
    if n == 0:
        raise ValueError("probs and labels must contain at least one sample (N > 0)")
    if n_classes == 0:
        raise ValueError("probs must have at least one class (C > 0)")
    if labels.shape[0] != n:
        raise ValueError(
            f"probs and labels disagree on N: probs {probs.shape}, labels {labels.shape}"
        )
    if not (np.issubdtype(probs.dtype, np.floating) or np.issubdtype(probs.dtype, np.integer)):
        raise ValueError(f"probs must be a real numeric array, got dtype {probs.dtype}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must have an integer dtype, got {labels.dtype}")
    if not np.all(np.isfinite(probs)):
        raise ValueError("probs contains NaN or inf")
    if probs.min() < 0 or probs.max() > 1:
        raise ValueError(
            f"probs must lie in [0, 1], got values in [{probs.min()}, {probs.max()}]"
        )
    if labels.min() < 0 or labels.max() >= n_classes:
        raise ValueError(
            f"labels must lie in [0, {n_classes}), got values in [{labels.min()}, {labels.max()}]"
        )
    return probs, labels


def _confidence_correct(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate, then return MSP confidence ``[N]`` float64 and correctness ``[N]`` bool."""
    probs, labels = _check_probs_labels(probs, labels)
    p = np.asarray(probs, dtype=np.float64)
    return p.max(axis=1), p.argmax(axis=1) == labels


def _check_scores(scores_id: np.ndarray, scores_ood: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate OOD scores; return both as float64 1-D arrays."""
    out = []
    for name, s in (("scores_id", scores_id), ("scores_ood", scores_ood)):
        s = np.asarray(s)
        if s.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {s.shape}")
        if s.shape[0] == 0:
            raise ValueError(f"{name} must contain at least one score")
        if not (np.issubdtype(s.dtype, np.floating) or np.issubdtype(s.dtype, np.integer)):
            raise ValueError(f"{name} must be a real numeric array, got dtype {s.dtype}")
        s = s.astype(np.float64)
        if not np.all(np.isfinite(s)):
            raise ValueError(f"{name} contains NaN or inf")
        out.append(s)
    return out[0], out[1]


# ------------------------------------------------------------ binary ROC / PR machinery


class _BinaryCurve:
    """Cumulative confusion counts of a binary scoring problem at every distinct threshold.

    Same points as sklearn's ``confusion_matrix_at_thresholds``: scores sorted descending,
    one point per distinct score value (tied scores enter together), thresholds
    decreasing.  ``tps[j]`` / ``fps[j]`` = positives / negatives with score >= the j-th
    threshold.  ``n_pos`` / ``n_neg`` are the totals.
    """

    def __init__(self, positive: np.ndarray, score: np.ndarray) -> None:
        positive = np.asarray(positive, dtype=bool)
        score = np.asarray(score, dtype=np.float64)
        n = score.shape[0]
        # Two plain sorts instead of an argsort (several times faster at N ~ 1e6); the
        # order inside a run of tied scores never matters because ties enter together.
        desc = np.sort(score)[::-1]
        last = np.append(np.flatnonzero(np.diff(desc)), n - 1)  # end of each tie run
        thresholds = desc[last]
        pos_scores = np.sort(score[positive])
        # positives with score >= threshold, and everything with score >= threshold
        tps = pos_scores.shape[0] - np.searchsorted(pos_scores, thresholds, side="left")
        self.tps = tps.astype(np.float64)
        self.fps = (last + 1 - tps).astype(np.float64)
        self.n_pos = int(pos_scores.shape[0])
        self.n_neg = int(n - pos_scores.shape[0])

    def roc(self) -> tuple[np.ndarray, np.ndarray]:
        """``(fpr, tpr)`` exactly as ``sklearn.metrics.roc_curve`` (drop_intermediate=True).

        Interior points collinear with both neighbours in (fps, tps) space (zero second
        difference in both) are dropped, then the (0, 0) start point is prepended.
        Requires at least one positive and one negative.
        """
        fps, tps = self.fps, self.tps
        if fps.shape[0] > 2:
            corner = (np.diff(fps, 2) != 0) | (np.diff(tps, 2) != 0)
            keep = np.concatenate(([True], corner, [True]))
            fps, tps = fps[keep], tps[keep]
        fps = np.concatenate(([0.0], fps))
        tps = np.concatenate(([0.0], tps))
        return fps / fps[-1], tps / tps[-1]

    def pr(self) -> tuple[np.ndarray, np.ndarray]:
        """``(recall, precision)`` at every threshold, recall non-decreasing.

        Matches ``sklearn.metrics.precision_recall_curve`` (reversed), without its final
        (recall 0, precision 1) point.  Requires at least one positive.
        """
        return self.tps / self.n_pos, self.tps / (self.tps + self.fps)

    def defined(self) -> bool:
        """Both classes present (ROC quantities are defined)."""
        return self.n_pos > 0 and self.n_neg > 0

    def auroc(self) -> float:
        """Area under the ROC curve (trapezoid; tied scores count one half); NaN if undefined."""
        if not self.defined():
            return float("nan")
        fpr, tpr = self.roc()
        return float(np.trapezoid(tpr, fpr))

    def fpr_at_tpr(self, target: float = 0.95) -> float:
        """FPR at the ROC point with TPR nearest ``target`` (first on ties); NaN if undefined."""
        if not self.defined():
            return float("nan")
        fpr, tpr = self.roc()
        return float(fpr[np.argmin(np.abs(tpr - target))])

    def aupr_trapezoid(self) -> float:
        """Trapezoid area under precision(recall), with the (0, 1) point; NaN without positives.

        Equals ``sklearn.metrics.auc(recall, precision)`` on ``precision_recall_curve``.
        """
        if self.n_pos == 0:
            return float("nan")
        recall, precision = self.pr()
        return float(np.trapezoid(np.append(1.0, precision), np.append(0.0, recall)))

    def average_precision(self) -> float:
        """Step-wise AP = sum_j (R_j - R_{j-1}) P_j, R_0 = 0 (sklearn); NaN without positives."""
        if self.n_pos == 0:
            return float("nan")
        recall, precision = self.pr()
        return float(max(0.0, np.sum(np.diff(recall, prepend=0.0) * precision)))


def _failure_curve(probs: np.ndarray, labels: np.ndarray, *, errors_positive: bool) -> _BinaryCurve:
    """Binary curve for misclassification detection from ``(probs, labels)``.

    ``errors_positive=False``: correct = positive, score = MSP.
    ``errors_positive=True``: error = positive, score = -MSP.
    """
    conf, correct = _confidence_correct(probs, labels)
    if errors_positive:
        return _BinaryCurve(~correct, -conf)
    return _BinaryCurve(correct, conf)


def _ood_curve(
    scores_id: np.ndarray, scores_ood: np.ndarray, *, ood_positive: bool
) -> _BinaryCurve:
    """Binary curve for OOD detection: ID positive with score s, or OOD positive with -s."""
    s_id, s_ood = _check_scores(scores_id, scores_ood)
    is_id = np.concatenate((np.ones(s_id.shape[0], bool), np.zeros(s_ood.shape[0], bool)))
    score = np.concatenate((s_id, s_ood))
    if ood_positive:
        return _BinaryCurve(~is_id, -score)
    return _BinaryCurve(is_id, score)


# ------------------------------------------------------------------- classification


@_register
def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy in [0, 1].

    ``probs`` [N, C], ``labels`` [N] int.  Prediction = ``argmax`` (ties -> lowest index).
    """
    _, correct = _confidence_correct(probs, labels)
    return float(correct.mean())


def calibration_bins(probs: np.ndarray, labels: np.ndarray, *, n_bins: int = 15) -> dict[str, np.ndarray]:
    """Top-label reliability statistics on ``n_bins`` equal-width ``(lo, hi]`` bins.

    Returns ``edges`` [B+1] (float64), ``count``, ``sum_conf``, ``sum_acc`` [B] and the
    per-bin means ``conf``, ``acc`` [B] (NaN in empty bins).  Confidence c = max prob; bin
    m holds ``lo < c <= hi`` (c = 1.0 in the last bin, c = 0 in the first).  Bin
    membership is decided in the input's float precision (float32 inputs compare against
    float32 edges), sums in float64.  Shared by :func:`ece` and the reliability diagram.
    """
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    probs, labels = _check_probs_labels(probs, labels)
    bin_dtype = np.result_type(probs.dtype, np.float32)  # float32 stays float32, else float64
    conf_native = probs.astype(bin_dtype, copy=False).max(axis=1)
    edges = np.linspace(0.0, 1.0, int(n_bins) + 1)
    # first edge >= c is the upper edge of c's (lo, hi] bin; c = 0 -> index 0 -> bin 0
    bins = np.clip(np.searchsorted(edges.astype(bin_dtype), conf_native, side="left") - 1, 0, n_bins - 1)

    conf = conf_native.astype(np.float64)  # exact widening: same values as the float64 max
    correct = probs.argmax(axis=1) == labels
    count = np.bincount(bins, minlength=n_bins).astype(np.float64)
    sum_conf = np.bincount(bins, weights=conf, minlength=n_bins)
    sum_acc = np.bincount(bins, weights=correct.astype(np.float64), minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc, mean_conf = sum_acc / count, sum_conf / count
    return {"edges": edges, "count": count, "sum_conf": sum_conf, "sum_acc": sum_acc, "acc": acc, "conf": mean_conf}


@_register
def ece(probs: np.ndarray, labels: np.ndarray, *, n_bins: int = 15) -> float:
    """Top-label expected calibration error as a fraction in [0, 1] (not %).

    ``probs`` [N, C], ``labels`` [N] int; bins as in :func:`calibration_bins` (15
    equal-width ``(lo, hi]`` bins, the KEP-SVGP convention).
    ECE = sum_m (n_m / N) |acc_m - conf_m|; empty bins contribute 0.
    """
    b = calibration_bins(probs, labels, n_bins=n_bins)
    # n_m/N * |acc_m - conf_m| = |sum_acc_m - sum_conf_m| / N; empty bins give 0
    return float(np.abs(b["sum_acc"] - b["sum_conf"]).sum() / b["count"].sum())


@_register
def nll(probs: np.ndarray, labels: np.ndarray) -> float:
    """Negative log-likelihood in nats: -(1/N) sum_i log p[i, y_i].

    ``probs`` [N, C], ``labels`` [N] int.  The true-class probability is clamped below at
    ``np.finfo(np.float64).tiny`` (~2.2e-308), so a zero gives ~708.4 per sample, not inf.
    """
    probs, labels = _check_probs_labels(probs, labels)
    p_true = np.asarray(probs, dtype=np.float64)[np.arange(labels.shape[0]), labels]
    return float(-np.log(np.maximum(p_true, np.finfo(np.float64).tiny)).mean())


@_register
def brier(probs: np.ndarray, labels: np.ndarray) -> float:
    """Multi-class Brier score: (1/N) sum_i sum_k (p_ik - 1[y_i = k])^2, range [0, 2].

    ``probs`` [N, C], ``labels`` [N] int.  Summed over classes (not averaged).
    """
    probs, labels = _check_probs_labels(probs, labels)
    p = np.asarray(probs, dtype=np.float64)
    p_true = p[np.arange(labels.shape[0]), labels]
    # sum_k (p_k - 1[k=y])^2 = sum_k p_k^2 - 2 p_y + 1
    per_sample = np.einsum("ij,ij->i", p, p) - 2.0 * p_true + 1.0
    return float(np.maximum(per_sample, 0.0).mean())


@_register
def aurc(probs: np.ndarray, labels: np.ndarray) -> float:
    """Area under the risk-coverage curve (Riemann mean), raw risk (not x1000).

    ``probs`` [N, C], ``labels`` [N] int.  Samples sorted by confidence (max prob),
    highest first, stable sort (ties keep input order); E_i = errors among the top i;
    AURC = (1/N) sum_{i=1..N} E_i / i.
    """
    return _aurc(*_confidence_correct(probs, labels))


def _selective_risk(conf: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """E_i / i for i = 1..N: error rate among the i most confident (stable sort)."""
    order = np.argsort(-conf, kind="stable")
    errors = np.cumsum(~correct[order], dtype=np.float64)
    return errors / np.arange(1, errors.shape[0] + 1)


def _aurc(conf: np.ndarray, correct: np.ndarray) -> float:
    """AURC from confidences ``[N]`` and correctness ``[N]`` (already validated)."""
    return float(np.mean(_selective_risk(conf, correct)))


def risk_coverage_curve(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(coverage i/N, selective risk E_i/i)`` for i = 1..N, the curve :func:`aurc` averages."""
    risk = _selective_risk(*_confidence_correct(probs, labels))
    return np.arange(1, risk.shape[0] + 1) / risk.shape[0], risk


@_register
def eaurc(probs: np.ndarray, labels: np.ndarray) -> float:
    """Excess AURC: AURC - AURC*, AURC* = r + (1 - r) ln(1 - r), r = error rate.

    ``probs`` [N, C], ``labels`` [N] int.  AURC* is the analytic optimum (KEP-SVGP,
    fd-shifts); at r = 1 it takes its limit 1 (0 ln 0 = 0).  Raw (not x1000).
    """
    conf, correct = _confidence_correct(probs, labels)
    r = float(np.mean(~correct))
    optimum = 1.0 if r >= 1.0 else r + (1.0 - r) * float(np.log1p(-r))
    return _aurc(conf, correct) - optimum


@_register
def failure_auroc(probs: np.ndarray, labels: np.ndarray) -> float:
    """Misclassification-detection AUROC in [0, 1]: correct = positive, score = MSP.

    ``probs`` [N, C], ``labels`` [N] int.  Ties count one half (sklearn ``roc_auc_score``).
    NaN when all predictions are correct or all are wrong.
    """
    return _failure_curve(probs, labels, errors_positive=False).auroc()


@_register
def failure_fpr95(probs: np.ndarray, labels: np.ndarray) -> float:
    """FPR (fraction of errors accepted) at the ROC point with TPR nearest 0.95.

    ``probs`` [N, C], ``labels`` [N] int.  Correct = positive, score = MSP.  Points as
    ``sklearn.metrics.roc_curve`` returns them (drop_intermediate=True, with the initial
    (0, 0)); argmin |TPR - 0.95|, first on ties.  NaN when all correct or all wrong.
    """
    return _failure_curve(probs, labels, errors_positive=False).fpr_at_tpr(0.95)


@_register
def failure_aupr_success(probs: np.ndarray, labels: np.ndarray) -> float:
    """AUPR-Success: trapezoid area under precision-recall, correct = positive, score = MSP.

    ``probs`` [N, C], ``labels`` [N] int.  Equals ``sklearn.metrics.auc(recall, precision)``
    on ``precision_recall_curve`` (final (recall 0, precision 1) point included).  NaN when
    no prediction is correct.
    """
    return _failure_curve(probs, labels, errors_positive=False).aupr_trapezoid()


@_register
def failure_aupr_error(probs: np.ndarray, labels: np.ndarray) -> float:
    """AUPR-Error: average precision with errors = positive and score = -MSP.

    ``probs`` [N, C], ``labels`` [N] int.  As ``sklearn.metrics.average_precision_score``.
    NaN when there are no errors.
    """
    return _failure_curve(probs, labels, errors_positive=True).average_precision()


# ------------------------------------------------------------------------------- OOD


@_register
def ood_auroc(scores_id: np.ndarray, scores_ood: np.ndarray) -> float:
    """ID-vs-OOD AUROC in [0, 1]; ID = positive, higher score = more ID, ties count half.

    ``scores_id`` [N1], ``scores_ood`` [N2], both non-empty.
    """
    return _ood_curve(scores_id, scores_ood, ood_positive=False).auroc()


@_register
def ood_aupr_in(scores_id: np.ndarray, scores_ood: np.ndarray) -> float:
    """AUPR-In: average precision with ID = positive and score s.

    ``scores_id`` [N1], ``scores_ood`` [N2], both non-empty.
    """
    return _ood_curve(scores_id, scores_ood, ood_positive=False).average_precision()


@_register
def ood_aupr_out(scores_id: np.ndarray, scores_ood: np.ndarray) -> float:
    """AUPR-Out: average precision with OOD = positive and score -s.

    ``scores_id`` [N1], ``scores_ood`` [N2], both non-empty.
    """
    return _ood_curve(scores_id, scores_ood, ood_positive=True).average_precision()


@_register
def ood_fpr95(scores_id: np.ndarray, scores_ood: np.ndarray) -> float:
    """Fraction of OOD samples accepted at the threshold keeping at least 95% of ID.

    ``scores_id`` [N1], ``scores_ood`` [N2], both non-empty; higher = more ID.
    tau = the largest value with at least 95% of ID scores >= tau, i.e. the k-th largest
    ID score with k = ceil(0.95 N1) (integer arithmetic: N1 = 20 gives k = 19); returns
    mean(scores_ood >= tau), so OOD scores tied with tau count as false positives.
    """
    s_id, s_ood = _check_scores(scores_id, scores_ood)
    n1 = s_id.shape[0]
    k = (95 * n1 + 99) // 100  # ceil(95 * n1 / 100), exact
    tau = np.partition(s_id, n1 - k)[n1 - k]  # k-th largest
    return float(np.mean(s_ood >= tau))
