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
      last bin and ``c = 0`` goes to the first.  The edges are the float32 values of
      ``torch.linspace(0, 1, 16)`` that the reference's ``calc_ece`` uses, compared with the
      confidence in float64 (as torch promotes), so float32 softmax outputs -- and float64
      ones -- fall into exactly the reference's bins, also at 8/15, 0.6 and 2/3, where
      torch's edges sit one float32 step below ``float32(k/15)``; the sums are float64.
      Empty bins contribute 0.
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

Registry
    Every metric is a function decorated with :func:`metric`, which registers a
    :class:`Metric` in ``bench.registry.METRICS`` carrying everything else that is said
    about it: kind, label and unit, direction, the convention sentence reports print, its
    vectorised bootstrap kernel (if any) and its place in named selections
    (:func:`selection`: ``"paper"`` = the KEP-SVGP Table 1 set, ``"default"`` = what
    analysis computes and the summary and OOD tables show by default (the paper's set
    with the debiased ECE beside ECE), ``"shift"`` the columns of the shift tables,
    ``"severity"`` the metrics plotted against corruption severity).  The registry is the only list of metrics.
    Besides the paper's conventions above, every other convention of ``metrics.md`` is
    registered under its own name (``ece_torchmetrics``, ``ece_adaptive``, ``aurc_unique``,
    ``augrc``, ``ood_fpr95_openood``, ...); each docstring states its convention exactly.

Uncertainty decomposition
    :func:`entropy` and :func:`decompose` (total = H[p-bar], aleatoric = mean member
    entropy, epistemic = their difference) are plain functions, not registered metrics.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

import numpy as np

from bench.registry import METRICS

__all__ = [
    "KINDS",
    "UNITS",
    "Metric",
    "metric",
    "get_metric",
    "selection",
    "registered",
    "check_probs_labels",
    "check_scores",
    "chunks",
    "BINNINGS",
    "CALIBRATION_TARGETS",
    "calibration_bins",
    "risk_coverage_curve",
    "entropy",
    "decompose",
]  # plus every registered metric function, by its name (see ``run_suite.py list``)

_Metric = Callable[..., float]


# --------------------------------------------------------------------------- validation


def check_probs_labels(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must have an integer dtype, got {labels.dtype}")
    _check_probability_values(probs, "probs")
    if labels.min() < 0 or labels.max() >= n_classes:
        raise ValueError(
            f"labels must lie in [0, {n_classes}), got values in [{labels.min()}, {labels.max()}]"
        )
    return probs, labels


def _check_probability_values(probs: np.ndarray, name: str) -> None:
    """Raise ``ValueError`` unless ``probs`` (non-empty) is real, finite and in [0, 1]."""
    if not (np.issubdtype(probs.dtype, np.floating) or np.issubdtype(probs.dtype, np.integer)):
        raise ValueError(f"{name} must be a real numeric array, got dtype {probs.dtype}")
    if not np.all(np.isfinite(probs)):
        raise ValueError(f"{name} contains NaN or inf")
    if probs.min() < 0 or probs.max() > 1:
        raise ValueError(
            f"{name} must lie in [0, 1], got values in [{probs.min()}, {probs.max()}]"
        )


def _confidence_correct(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate, then return MSP confidence ``[N]`` float64 and correctness ``[N]`` bool."""
    probs, labels = check_probs_labels(probs, labels)
    p = np.asarray(probs, dtype=np.float64)
    return p.max(axis=1), p.argmax(axis=1) == labels


def check_scores(scores_id: np.ndarray, scores_ood: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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

    def fpr_at_first_tpr(self, target: float = 0.95) -> float:
        """FPR at the first ROC point with TPR >= ``target``; NaN if undefined.

        Points as :meth:`roc` (sklearn ``roc_curve``, drop_intermediate=True), thresholds
        decreasing, so this is the smallest FPR among the points reaching ``target``
        (fd-shifts ``min(fpr[tpr >= .9495])``, OpenOOD ``fpr[argmax(tpr >= .95)]``).
        """
        if not self.defined():
            return float("nan")
        fpr, tpr = self.roc()
        return float(fpr[np.argmax(tpr >= target)])

    def fpr_at_tpr_tu(self, target: float = 0.95) -> float:
        """FPR at recall nearest ``target``, TorchUncertainty's ``FPRx`` rule in its arithmetic.

        Candidates are every distinct threshold (no point dropped) from the highest down to
        the first one reaching full recall; the one with |recall - target| smallest is
        taken, ties going to the *lowest* threshold (the reference scans the reversed list
        and takes the first minimum).  As in TorchUncertainty, the recall is the integer
        count divided in float32 (torch's default dtype: one correctly rounded division)
        and the distance is computed in float32 against float32(target), so two candidates
        tie exactly when their float32 distances are equal: 18/20 and 20/20 around 0.95 tie
        (float32 0.9 and 1.0 are equally far from float32 0.95), 408/430 and 409/430 do not.
        FPR = negatives accepted there / all negatives.  NaN if undefined.  Hendrycks'
        ``fpr_and_fdr_at_recall`` (float64) agrees except on float32 ties, where its float64
        distances may differ and it keeps the nearer one.
        """
        if not self.defined():
            return float("nan")
        last = int(np.argmax(self.tps == self.n_pos))  # first threshold with full recall
        recall = self.tps[: last + 1].astype(np.float32) / np.float32(self.n_pos)
        distance = np.abs(recall - np.float32(target))
        j = last - int(np.argmin(distance[::-1]))
        return float(self.fps[j] / self.n_neg)

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
    s_id, s_ood = check_scores(scores_id, scores_ood)
    is_id = np.concatenate((np.ones(s_id.shape[0], bool), np.zeros(s_ood.shape[0], bool)))
    score = np.concatenate((s_id, s_ood))
    if ood_positive:
        return _BinaryCurve(~is_id, -score)
    return _BinaryCurve(is_id, score)


# ------------------------------------------------- vectorised bootstrap kernels
# A resample is a count vector w[b, i] (bench.stats.resample_weights); each kernel
# evaluates one metric on every row of w over the original samples (exactness
# contract and cost: bench.stats).  A metric names its kernel in @metric(bootstrap=...).

_CHUNK_ELEMENTS = 1 << 20  # rows of w per matrix product: ~8 MB per [rows, N] float64 copy


def chunks(n_rows: int, n_cols: int) -> Iterator[slice]:
    """Row slices of about ``_CHUNK_ELEMENTS`` elements (bounded memory for ``w @ x``)."""
    step = max(1, _CHUNK_ELEMENTS // max(n_cols, 1))
    for start in range(0, n_rows, step):
        yield slice(start, min(start + step, n_rows))


# -------------------------------------------------------------- weighted tie groups


class _Groups:
    """Samples sorted by score (descending) and cut into runs of tied scores.

    The runs are the thresholds of ``bench.metrics._BinaryCurve``.  A resample's
    thresholds are the runs it draws from; an undrawn run repeats the previous point of the
    cumulative counts, so it adds nothing to an area and is skipped where points are
    compared (FPR95).
    """

    def __init__(self, positive: np.ndarray, score: np.ndarray) -> None:
        self.order = np.argsort(-score, kind="stable")
        ordered = score[self.order]
        self.pos = np.asarray(positive, bool)[self.order].astype(np.int64)
        changes = np.flatnonzero(np.diff(ordered))
        # last sorted position of each run; None when every run is a single sample
        self.ends = None if changes.shape[0] == ordered.shape[0] - 1 else np.append(changes, ordered.shape[0] - 1)

    def cumulative(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(TP, FP)`` ``[G]`` (int64): drawn positives / negatives scoring >= each run, for counts ``w`` ``[N]``."""
        ws = w[self.order]
        tot = np.cumsum(ws)
        ws *= self.pos
        tp = np.cumsum(ws)
        if self.ends is not None:
            tot, tp = tot[self.ends], tp[self.ends]
        tot -= tp
        return tp, tot


def _auroc_from_cumulative(tp: np.ndarray, fp: np.ndarray) -> float:
    """Trapezoid ROC area (ties count one half); NaN without positives or negatives.

    Area = sum_g (FP_g - FP_{g-1}) (TP_g + TP_{g-1}) / (2 P N) (FP_{-1} = TP_{-1} = 0):
    the trapezoid rule on the ROC points, with an exact integer numerator.
    """
    p, n = tp[-1], fp[-1]
    if p == 0 or n == 0:
        return float("nan")
    num = int(fp[0]) * int(tp[0]) + int(np.dot(fp[1:] - fp[:-1], tp[1:] + tp[:-1]))
    return num / (2.0 * float(p) * float(n))


def _average_precision_from_cumulative(tp: np.ndarray, fp: np.ndarray) -> float:
    """Step-wise AP = sum_g (pos_g / P) precision_g, clipped at 0; NaN without positives.

    Only runs that draw positives contribute, and their precision denominators are > 0.
    """
    if tp[-1] == 0:
        return float("nan")
    prec = tp / np.maximum(tp + fp, 1)
    total = float(tp[0]) * prec[0] + float(np.dot(tp[1:] - tp[:-1], prec[1:]))
    return max(0.0, total / float(tp[-1]))


def _aupr_trapezoid_from_cumulative(tp: np.ndarray, fp: np.ndarray) -> float:
    """Trapezoid area under precision(recall) with the (0, 1) start point; NaN without positives.

    Area = sum_g (pos_g / P) (prec_g + prec_{g-1}) / 2 with prec_{-1} = 1.  Undrawn runs
    before the first drawn one sit on the start point (recall 0, precision 1) and later
    undrawn runs repeat the previous point: both add zero-width trapezoids.
    """
    p = tp[-1]
    if p == 0:
        return float("nan")
    tot = tp + fp
    prec = np.ones(tp.shape[0])
    np.divide(tp, tot, out=prec, where=tot > 0)
    area = float(tp[0]) * (prec[0] + 1.0) + float(np.dot(tp[1:] - tp[:-1], prec[1:] + prec[:-1]))
    return 0.5 * area / float(p)


def _fpr_at_tpr_from_cumulative(tp: np.ndarray, fp: np.ndarray, target: float = 0.95) -> float:
    """FPR at the ROC point with TPR nearest ``target`` (first on ties), on sklearn's points.

    Fast path: the nearest of *all* the resample's points (argmin over runs: an undrawn run
    repeats an earlier point, which argmin prefers, so the winner is a drawn run).  It is
    the answer unless ``drop_intermediate`` removes it, i.e. it is interior and the next
    drawn run has the same increment; then :func:`_fpr_at_tpr_kept_points` redoes the
    search on the kept points only.  (0, 0) comes first, so it wins distance ties.
    """
    p, n = tp[-1], fp[-1]
    if p == 0 or n == 0:
        return float("nan")
    dist = np.abs(tp / float(p) - target)
    j = int(np.argmin(dist))
    if not dist[j] < abs(0.0 - target):
        return 0.0
    if j > 0 and tp[j - 1] + fp[j - 1] > 0:  # j is not the first drawn run
        # next drawn run: first where TP or FP grows
        nxt = min(int(np.searchsorted(tp, tp[j], side="right")), int(np.searchsorted(fp, fp[j], side="right")))
        if (
            nxt < tp.shape[0]
            and tp[nxt] - tp[nxt - 1] == tp[j] - tp[j - 1]
            and fp[nxt] - fp[nxt - 1] == fp[j] - fp[j - 1]
        ):
            return _fpr_at_tpr_kept_points(tp, fp, target)
    return float(fp[j]) / float(n)


def _fpr_at_tpr_kept_points(tp: np.ndarray, fp: np.ndarray, target: float) -> float:
    """The full search of :func:`_fpr_at_tpr_from_cumulative` (P > 0 and N > 0).

    The resample's threshold points are the cumulative counts at its drawn runs.  As in
    ``sklearn.metrics.roc_curve(drop_intermediate=True)``, an interior point is dropped when
    its increment (pos, neg) equals the next point's; (0, 0) is prepended.
    """
    p, n = tp[-1], fp[-1]
    tot = tp + fp
    drawn = np.empty(tot.shape[0], bool)
    drawn[0] = tot[0] > 0
    np.not_equal(tot[1:], tot[:-1], out=drawn[1:])
    tps, fps = tp[drawn], fp[drawn]
    dt, df = tps[1:] - tps[:-1], fps[1:] - fps[:-1]  # increments of points 1..m-1
    keep = np.ones(tps.shape[0], bool)
    keep[1:-1] = (dt[:-1] != dt[1:]) | (df[:-1] != df[1:])
    tps, fps = tps[keep], fps[keep]
    dist = np.abs(tps / float(p) - target)
    best = int(np.argmin(dist))
    return float(fps[best]) / float(n) if dist[best] < abs(0.0 - target) else 0.0


def _curve_metric(
    fn: Callable[[np.ndarray, np.ndarray], float], groups: _Groups, w: np.ndarray
) -> np.ndarray:
    """``fn`` on the cumulative counts of every row of ``w``.

    One resample at a time: 1-D passes over a row stay in cache and beat 2-D batches
    (about 3x at N = 10,000 on the benchmark machine).
    """
    return np.array([fn(*groups.cumulative(row)) for row in w], dtype=np.float64)


# ------------------------------------------------------------- classification metrics


def _weighted_mean(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sum_i w[b, i] x[i] / sum_i w[b, i]`` for every row ``b``."""
    out = np.empty(w.shape[0])
    for rows in chunks(w.shape[0], w.shape[1]):
        wr = w[rows].astype(np.float64)
        out[rows] = (wr @ x) / wr.sum(axis=1)
    return out


def _boot_accuracy(probs, labels, w):
    _, correct = _confidence_correct(probs, labels)
    return _weighted_mean(correct.astype(np.float64), w)


def _boot_nll(probs, labels, w):
    p_true = np.asarray(probs, dtype=np.float64)[np.arange(labels.shape[0]), labels]
    return _weighted_mean(-np.log(np.maximum(p_true, np.finfo(np.float64).tiny)), w)


def _boot_brier(probs, labels, w):
    p = np.asarray(probs, dtype=np.float64)
    p_true = p[np.arange(labels.shape[0]), labels]
    per_sample = np.maximum(np.einsum("ij,ij->i", p, p) - 2.0 * p_true + 1.0, 0.0)
    return _weighted_mean(per_sample, w)


def _boot_ece(probs, labels, w, n_bins: int = 15):
    """Top-label ECE on the KEP-SVGP bins of :func:`ece`, per resample."""
    conf, correct = _calibration_pairs(probs, labels, "top_label")
    bins, conf64, _, _ = _assign_bins(conf, n_bins, "kepsvgp")
    # D[i, bin_i] = correct_i - conf_i, so (w @ D)[b, m] = sum_acc - sum_conf of bin m
    gap = np.zeros((labels.shape[0], n_bins))
    gap[np.arange(labels.shape[0]), bins] = correct - conf64
    out = np.empty(w.shape[0])
    for rows in chunks(w.shape[0], w.shape[1]):
        wr = w[rows].astype(np.float64)
        out[rows] = np.abs(wr @ gap).sum(axis=1) / wr.sum(axis=1)
    return out


def _debiased_bin_terms(count: np.ndarray, sum_acc: np.ndarray, sum_conf: np.ndarray) -> np.ndarray:
    """``n_m (2|g_m| - E|g_m + s_m Z|)`` per bin (0 where empty), any shape.

    g_m = acc_m - conf_m, s_m^2 = acc_m (1 - acc_m) / n_m, Z standard normal;
    E|g + sZ| = s sqrt(2/pi) exp(-g^2 / 2s^2) + g (1 - 2 Phi(-g/s)) (= |g| when s = 0).
    """
    from scipy.special import ndtr

    with np.errstate(invalid="ignore", divide="ignore"):
        acc = sum_acc / count
        g = acc - sum_conf / count
        s = np.sqrt(np.clip(acc * (1.0 - acc), 0.0, None) / count)
        folded = s * np.sqrt(2.0 / np.pi) * np.exp(-0.5 * (g / s) ** 2) + g * (1.0 - 2.0 * ndtr(-g / s))
    folded = np.where(s > 0, folded, np.abs(g))
    return np.where(count > 0, count * (2.0 * np.abs(g) - folded), 0.0)


def _boot_ece_debiased(probs, labels, w, n_bins: int = 15):
    """:func:`ece_debiased` per resample: per-bin counts and sums by one matrix product."""
    conf, correct = _calibration_pairs(probs, labels, "top_label")
    bins, conf64, _, _ = _assign_bins(conf, n_bins, "kepsvgp")
    rows_n = np.arange(labels.shape[0])
    x = np.zeros((labels.shape[0], 3 * n_bins))  # [count | sum_acc | sum_conf] one-hot per bin
    x[rows_n, bins] = 1.0
    x[rows_n, n_bins + bins] = correct
    x[rows_n, 2 * n_bins + bins] = conf64
    out = np.empty(w.shape[0])
    for rows in chunks(w.shape[0], w.shape[1]):
        wr = w[rows].astype(np.float64)
        sums = wr @ x
        terms = _debiased_bin_terms(sums[:, :n_bins], sums[:, n_bins:2 * n_bins], sums[:, 2 * n_bins:])
        out[rows] = terms.sum(axis=1) / wr.sum(axis=1)
    return out


def _harmonic(n_max: int) -> np.ndarray:
    """Harmonic numbers ``H_0..H_n_max`` (``H_0 = 0``)."""
    return np.concatenate(([0.0], np.cumsum(1.0 / np.arange(1, n_max + 1))))


def _boot_aurc_parts(probs, labels, w) -> tuple[np.ndarray, np.ndarray]:
    """AURC and error rate per resample.

    Stable sort by confidence (highest first).  A drawn copy of an error at rank r adds
    1/k to E_k/k for every k >= r, i.e. H_n - H_{r-1} to n * AURC.  Sample i with count
    w_i after S_i drawn samples occupies ranks S_i+1..S_i+w_i, contributing
    w_i H_n - (G[S_i + w_i] - G[S_i]) with G[m] = H_0 + ... + H_{m-1}.
    """
    conf, correct = _confidence_correct(probs, labels)
    order = np.argsort(-conf, kind="stable")
    err_pos = np.flatnonzero(~correct[order])  # sorted positions of the errors
    n_rows = w.sum(axis=1)
    h = _harmonic(int(n_rows.max()))
    g = np.concatenate(([0.0], np.cumsum(h[:-1])))
    w_err = w[:, order[err_pos]]
    err_count = w_err.sum(axis=1)
    aurc = np.empty(w.shape[0])
    for b in range(w.shape[0]):
        before = np.cumsum(w[b][order])[err_pos] - w_err[b]  # S_i of the errors
        aurc[b] = err_count[b] * h[n_rows[b]] - float(np.sum(g[before + w_err[b]] - g[before]))
    return aurc / n_rows, err_count / n_rows


def _boot_aurc(probs, labels, w):
    return _boot_aurc_parts(probs, labels, w)[0]


def _optimal_aurc(r: np.ndarray) -> np.ndarray:
    """AURC* = r + (1 - r) ln(1 - r) of error rates ``r`` (its limit 1 at r = 1): the area
    of a perfect ranking with error rate r (KEP-SVGP, fd-shifts)."""
    r = np.asarray(r, dtype=np.float64)
    below = r < 1.0
    safe = np.where(below, r, 0.0)
    return np.where(below, safe + (1.0 - safe) * np.log1p(-safe), 1.0)


def _boot_eaurc(probs, labels, w):
    """AURC - AURC* per resample."""
    aurc, r = _boot_aurc_parts(probs, labels, w)
    return aurc - _optimal_aurc(r)


def _failure_groups(probs, labels, errors_positive: bool) -> _Groups:
    conf, correct = _confidence_correct(probs, labels)
    if errors_positive:
        return _Groups(~correct, -conf)
    return _Groups(correct, conf)


def _boot_failure_auroc(probs, labels, w):
    return _curve_metric(_auroc_from_cumulative, _failure_groups(probs, labels, False), w)


def _boot_failure_fpr95(probs, labels, w):
    return _curve_metric(_fpr_at_tpr_from_cumulative, _failure_groups(probs, labels, False), w)


def _boot_failure_aupr_success(probs, labels, w):
    return _curve_metric(_aupr_trapezoid_from_cumulative, _failure_groups(probs, labels, False), w)


def _boot_failure_aupr_error(probs, labels, w):
    return _curve_metric(_average_precision_from_cumulative, _failure_groups(probs, labels, True), w)


# OOD resample kernels


def _boot_ood_curve(s_id, s_ood, w_id, w_ood, fn, ood_positive: bool) -> np.ndarray:
    """``fn`` on the ID-vs-OOD curve of every resample (ID and OOD counts side by side)."""
    is_id = np.concatenate((np.ones(s_id.shape[0], bool), np.zeros(s_ood.shape[0], bool)))
    score = np.concatenate((s_id, s_ood))
    groups = _Groups(~is_id, -score) if ood_positive else _Groups(is_id, score)
    return np.array(
        [fn(*groups.cumulative(np.concatenate((a, b)))) for a, b in zip(w_id, w_ood)], dtype=np.float64
    )


def _boot_ood_auroc(s_id, s_ood, w_id, w_ood):
    return _boot_ood_curve(s_id, s_ood, w_id, w_ood, _auroc_from_cumulative, False)


def _boot_ood_aupr_in(s_id, s_ood, w_id, w_ood):
    return _boot_ood_curve(s_id, s_ood, w_id, w_ood, _average_precision_from_cumulative, False)


def _boot_ood_aupr_out(s_id, s_ood, w_id, w_ood):
    return _boot_ood_curve(s_id, s_ood, w_id, w_ood, _average_precision_from_cumulative, True)


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


# ------------------------------------------------------------------ the metric registry

#: What a metric measures; ``ood`` metrics take ``(scores_id, scores_ood)``, every other
#: kind ``(probs, labels)`` on a labelled split.
KINDS = ("classification", "calibration", "failure", "ood", "text")
#: Reporting units and the scale that turns a raw value into them.
UNITS: dict[str, float] = {"%": 100.0, "x100": 100.0, "x1000": 1000.0, "x10": 10.0, "": 1.0}


@dataclass(frozen=True)
class Metric:
    """A registered metric: its function and everything analysis and reports need.

    ``fn`` returns a raw float (fractions, nats, plain risks); ``kind`` is one of
    :data:`KINDS` and fixes the inputs (:attr:`on_scores`); ``label``/``unit`` make the
    column header (``unit`` in :data:`UNITS`, which gives :attr:`scale`);
    ``higher_is_better`` the good direction (significance marks, bold best);
    ``convention`` the one sentence the report's conventions table prints.
    ``bootstrap`` is the vectorised evaluator over resamples (``(probs, labels, w)`` or
    ``(scores_id, scores_ood, w_id, w_ood)`` -> ``[B]``), or None: then
    ``bench.stats`` evaluates ``fn`` once per resample (exact, slower).  ``selections``
    maps named selections (:func:`selection`; ``"paper"`` = the KEP-SVGP Table 1 set,
    ``"default"`` = the default columns) to this metric's column position in them.
    ``interval`` says, in one sentence, where the report's 95% intervals of this metric are
    only approximate (empty: their coverage was measured nominal); a calibration error gets
    :data:`APPROXIMATE_CALIBRATION` unless it says more.
    """

    name: str
    fn: Callable[..., float]
    kind: str
    label: str
    unit: str
    higher_is_better: bool
    convention: str
    bootstrap: Callable[..., np.ndarray] | None = None
    selections: Mapping[str, float] = field(default_factory=dict)
    interval: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.unit not in UNITS:
            raise ValueError(f"metric {self.name!r}: unit must be one of {list(UNITS)}, got {self.unit!r}")
        if not self.convention.strip():
            raise ValueError(f"metric {self.name!r}: state its convention in one sentence")

    @property
    def on_scores(self) -> bool:
        """True for OOD metrics ``(scores_id, scores_ood)``; False for ``(probs, labels)``."""
        return self.kind == "ood"

    @property
    def scale(self) -> float:
        """Raw value x scale = the value in :attr:`unit`."""
        return UNITS[self.unit]

    def __call__(self, *args, **kwargs) -> float:
        return self.fn(*args, **kwargs)


#: The ``interval`` of a calibration error that says nothing more (:class:`Metric`).
APPROXIMATE_CALIBRATION = (
    "Interval approximate: a binned calibration error is biased upward, most near 0, which the "
    "bootstrap's bias correction removes only in part (measured for ECE in reports/perf/coverage.md)."
)


def metric(
    kind: str,
    label: str,
    unit: str,
    higher_is_better: bool,
    convention: str,
    *,
    bootstrap: Callable[..., np.ndarray] | None = None,
    selections: Mapping[str, float] | None = None,
    name: str | None = None,
    interval: str | None = None,
) -> Callable[[_Metric], _Metric]:
    """Decorator: register the function as a :class:`Metric` (named after the function
    unless ``name`` is given) and return the function unchanged.  A plugin module adds a
    metric the same way; it then appears in ``list``, ``--metrics`` and every table of its
    kind."""

    def deco(fn: _Metric) -> _Metric:
        key = name or fn.__name__
        note = interval if interval is not None else APPROXIMATE_CALIBRATION if kind == "calibration" else ""
        METRICS.register(key)(Metric(key, fn, kind, label, unit, higher_is_better, convention,
                                     bootstrap, dict(selections or {}), note))
        return fn

    return deco


def get_metric(name: str) -> Metric:
    """The registered :class:`Metric` ``name`` (unknown names raise ``ConfigError``)."""
    return METRICS.get(name)


def selection(name: str, on_scores: bool | None = None) -> list[str]:
    """The metrics of a named selection in column order; ``on_scores`` keeps only OOD
    (True) or only labelled-split (False) metrics.  Unknown selections are empty."""
    members = [(m.selections[name], m.name) for m in map(METRICS.get, METRICS.names())
               if name in m.selections and (on_scores is None or m.on_scores == on_scores)]
    return [n for _, n in sorted(members)]


def registered(on_scores: bool | None = None) -> list[str]:
    """Every registered metric name, sorted (optionally only OOD / only labelled ones)."""
    return [n for n in METRICS.names() if on_scores is None or METRICS.get(n).on_scores == on_scores]


# ------------------------------------------------------------------- classification


@metric(
    'classification', 'ACC', '%', True,
    'Top-1 accuracy, argmax prediction (ties to the lowest class).',
    bootstrap=_boot_accuracy, selections={"paper": 0, "default": 0, "shift": 0, "severity": 0},
)
def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy in [0, 1].

    ``probs`` [N, C], ``labels`` [N] int.  Prediction = ``argmax`` (ties -> lowest index).
    """
    _, correct = _confidence_correct(probs, labels)
    return float(correct.mean())


@metric(
    "classification", "MCC", "x100", True,
    "Matthews correlation of argmax prediction and label, multi-class (Gorodkin's R_K), 0 "
    "when undefined (CoLA's metric).",
)
def mcc(probs: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation coefficient in [-1, 1] (multi-class: Gorodkin's R_K).

    ``probs`` [N, C], ``labels`` [N] int; prediction = ``argmax``.  With N samples, c
    correct, t_k samples of class k and p_k predictions of class k:
    MCC = (c N - sum_k p_k t_k) / sqrt((N^2 - sum_k p_k^2) (N^2 - sum_k t_k^2)), defined
    as 0 when the denominator is 0 (one class predicted or present), as
    ``sklearn.metrics.matthews_corrcoef``.  The metric of CoLA (GLUE).
    """
    probs, labels = check_probs_labels(probs, labels)
    pred = np.asarray(probs, dtype=np.float64).argmax(axis=1)
    n_classes = probs.shape[1]
    t = np.bincount(labels, minlength=n_classes).astype(np.float64)
    p = np.bincount(pred, minlength=n_classes).astype(np.float64)
    n = float(labels.shape[0])
    c = float(np.count_nonzero(pred == labels))
    denom = (n * n - p @ p) * (n * n - t @ t)
    return 0.0 if denom <= 0 else float((c * n - p @ t) / np.sqrt(denom))


MCC_BATCH = 32  # the official CoLA evaluation's batch size


@metric(
    "classification", "MCC (per batch)", "x100", True,
    f"Mean over consecutive batches of {MCC_BATCH} samples (stored order; the last batch may "
    "be shorter) of each batch's MCC: the KEP-SVGP CoLA code's number, not the whole-split "
    "MCC; it depends on the sample order.",
)
def mcc_per_batch(probs: np.ndarray, labels: np.ndarray) -> float:
    """The mean of :func:`mcc` over consecutive batches of :data:`MCC_BATCH` samples, as
    KEP-SVGP's ``CoLA/valid.py`` averages sklearn's MCC over its test batches."""
    probs, labels = check_probs_labels(probs, labels)
    starts = range(0, len(labels), MCC_BATCH)
    return float(np.mean([mcc(probs[i:i + MCC_BATCH], labels[i:i + MCC_BATCH]) for i in starts]))


# ------------------------------------------------------------------ calibration machinery

#: Binning schemes of :func:`calibration_bins` (``reference/metrics.md`` section 2).
BINNINGS: tuple[str, ...] = ("kepsvgp", "upper_closed", "torchmetrics", "fdshifts", "equal_mass")


def torch_linspace_float32(n: int) -> np.ndarray:
    """``torch.linspace(0, 1, n)`` in float32, bit for bit, as a float32 array [n].

    torch's CPU and CUDA kernels compute the lower half as ``start + step * i`` and the
    upper half (``i >= n // 2``) as ``end - step * (n - 1 - i)``, with ``step`` =
    float32(1 / (n - 1)) and one rounding to float32 per value (a fused multiply-add).  In
    float64 the products of float32 ``step`` and small integers, and 1 minus them, are
    exact, so rounding once to float32 reproduces it.  For n = 16 it differs from
    ``float32(np.linspace(0, 1, 16))`` in the last bit at edges 3, 6, 7 (above) and 8, 9,
    10 (below 8/15, 0.6 and 2/3).
    """
    step = float(np.float32(1.0) / np.float32(n - 1))
    i = np.arange(n, dtype=np.float64)
    return np.where(i < n // 2, step * i, 1.0 - step * (n - 1 - i)).astype(np.float32)
#: What :func:`calibration_bins` bins: the top label, or every class probability.
CALIBRATION_TARGETS: tuple[str, ...] = ("top_label", "all_class")


def _check_n_bins(n_bins: int, name: str = "n_bins") -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"{name} must be a positive integer, got {n_bins!r}")
    return int(n_bins)


def _calibration_pairs(
    probs: np.ndarray, labels: np.ndarray, targets: str
) -> tuple[np.ndarray, np.ndarray]:
    """``(values, hits)`` that calibration metrics bin, from validated ``probs``/``labels``.

    ``top_label``: value = max probability [N], hit = prediction correct.  ``all_class``:
    value = every probability p_ik [N*C] (row-major, position i*C + k), hit = 1[y_i = k].
    Values keep the input precision (float32 stays float32, anything else float64) so that
    bin membership can be decided in it; hits are bool.
    """
    bin_dtype = np.result_type(probs.dtype, np.float32)  # float32 stays float32, else float64
    p = probs.astype(bin_dtype, copy=False)
    if targets == "top_label":
        return p.max(axis=1), probs.argmax(axis=1) == labels
    return p.ravel(), (np.arange(p.shape[1]) == labels[:, None]).ravel()


def _rank_bins(values: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Bins by rank: stable ascending sort by (value, index); ranks fill bin 0 first.

    Bin m receives ``sizes[m]`` consecutive ranks (sizes sum to ``len(values)``).
    """
    order = np.argsort(values, kind="stable")
    bins = np.empty(values.shape[0], dtype=np.intp)
    bins[order] = np.repeat(np.arange(sizes.shape[0]), sizes)
    return bins


def _assign_bins(
    values: np.ndarray, n_bins: int, binning: str
) -> tuple[np.ndarray, np.ndarray, int, np.ndarray | None]:
    """``(bins, values64, n_slots, edges)``: bin index per value, the float64 values to sum,
    the number of bin slots and the equal-width edges (None for ``equal_mass``).

    * ``kepsvgp``: ``(lo, hi]`` bins against the float32 edges of ``torch.linspace(0, 1,
      B+1)`` (:func:`torch_linspace_float32`), compared in float64, c = 0 in bin 0: the
      KEP-SVGP reference (``calc_ece`` bins float32 softmax outputs against float32 torch
      edges; a float64 confidence is compared with those float32 edges, as torch promotes).
    * ``upper_closed``: edges ``np.linspace(0, 1, B+1)`` in the values' precision,
      ``(lo, hi]``, c = 0 in bin 0 (a numpy reference in float64, e.g. SGPA's).
    * ``torchmetrics``: values cast to float32 (torchmetrics' ``.float()``), the float32
      edges of ``torch.linspace(0, 1, B+1)`` (:func:`torch_linspace_float32`), ``[lo, hi)``
      (``bucketize(right=True) - 1``), so c = 1.0 lands in a hidden slot B.
    * ``fdshifts``: float64 edges linspace(0, 1 + 1e-8, B+1), ``[lo, hi)``
      (``np.digitize(c, edges) - 1``); the 1e-8 stretch keeps c = 1.0 in bin B-1.
    * ``equal_mass``: B bins of equal count (the first N mod B bins one larger, as
      ``np.array_split`` / ``torch.tensor_split``) after a stable sort by (value, index).
    """
    if binning == "kepsvgp":
        edges = torch_linspace_float32(n_bins + 1).astype(np.float64)
        v64 = values.astype(np.float64)
        bins = np.clip(np.searchsorted(edges, v64, side="left") - 1, 0, n_bins - 1)
        return bins, v64, n_bins, np.linspace(0.0, 1.0, n_bins + 1)
    if binning == "upper_closed":
        edges = np.linspace(0.0, 1.0, n_bins + 1)
        # first edge >= c is the upper edge of c's (lo, hi] bin; c = 0 -> index 0 -> bin 0
        bins = np.clip(np.searchsorted(edges.astype(values.dtype), values, side="left") - 1, 0, n_bins - 1)
        return bins, values.astype(np.float64), n_bins, edges
    if binning == "torchmetrics":
        v32 = values.astype(np.float32)
        bins = np.searchsorted(torch_linspace_float32(n_bins + 1), v32, side="right") - 1  # 1.0 -> slot B
        return bins, v32.astype(np.float64), n_bins + 1, np.linspace(0.0, 1.0, n_bins + 1)
    if binning == "fdshifts":
        v64 = values.astype(np.float64)
        edges = np.linspace(0.0, 1.0 + 1e-8, n_bins + 1)
        return np.searchsorted(edges, v64, side="right") - 1, v64, n_bins, edges
    sizes = np.full(n_bins, values.shape[0] // n_bins)
    sizes[: values.shape[0] % n_bins] += 1
    return _rank_bins(values, sizes), values.astype(np.float64), n_bins, None


def _bin_statistics(
    values64: np.ndarray, hits: np.ndarray, bins: np.ndarray, n_slots: int
) -> dict[str, np.ndarray]:
    """Per-slot ``count``, ``sum_conf``, ``sum_acc`` and means ``acc``, ``conf`` (NaN if empty)."""
    count = np.bincount(bins, minlength=n_slots).astype(np.float64)
    sum_conf = np.bincount(bins, weights=values64, minlength=n_slots)
    sum_acc = np.bincount(bins, weights=hits.astype(np.float64), minlength=n_slots)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc, mean_conf = sum_acc / count, sum_conf / count
    return {"count": count, "sum_conf": sum_conf, "sum_acc": sum_acc, "acc": acc, "conf": mean_conf}


def _calibration_error(stats: dict[str, np.ndarray], norm: str, total: float | None = None) -> float:
    """Reduce bin statistics; ``total`` = number of binned values (default: all counted).

    ``l1``: sum_m (n_m/total)|acc_m - conf_m| (empty bins 0); ``l2``: the square root of
    sum_m (n_m/total)(acc_m - conf_m)^2; ``max``: max over non-empty bins |acc_m - conf_m|.
    """
    count = stats["count"]
    gap = stats["sum_acc"] - stats["sum_conf"]  # n_m (acc_m - conf_m)
    total = count.sum() if total is None else total
    if norm == "l1":
        return float(np.abs(gap).sum() / total)
    nonempty = count > 0
    if norm == "l2":
        return float(np.sqrt(np.sum(gap[nonempty] ** 2 / count[nonempty]) / total))
    return float(np.max(np.abs(gap[nonempty]) / count[nonempty]))


def calibration_bins(
    probs: np.ndarray,
    labels: np.ndarray,
    *,
    n_bins: int = 15,
    binning: str = "kepsvgp",
    targets: str = "top_label",
) -> dict[str, np.ndarray]:
    """Reliability statistics; by default top-label on ``n_bins`` equal-width ``(lo, hi]`` bins.

    Returns ``count``, ``sum_conf``, ``sum_acc`` and the per-bin means ``conf``, ``acc``
    (NaN in empty bins), plus ``edges`` [B+1] (float64 linspace, for display) for the
    equal-width schemes.  Default: confidence c = max prob; bin m holds ``lo < c <= hi``
    (c = 1.0 in the last bin, c = 0 in the first) on the KEP-SVGP reference's float32
    torch edges; sums in float64.  Shared by :func:`ece` and the reliability diagram.

    ``binning`` (see :data:`BINNINGS`): ``"kepsvgp"`` (default), ``"upper_closed"``
    (numpy edges in the input's precision),
    ``"torchmetrics"`` (float32 confidences, ``[lo, hi)`` bins; the arrays get a hidden
    (B+1)-th slot holding c = 1.0, as torchmetrics' ``CalibrationError``), ``"fdshifts"``
    (``[lo, hi)`` on float64 edges linspace(0, 1 + 1e-8, B+1)) or ``"equal_mass"`` (B bins
    of nearly equal count after a stable sort by (c, index); no ``edges``).
    ``targets``: ``"top_label"`` (default) or ``"all_class"`` (every p_ik binned against
    1[y_i = k]; N*C values, SGPA's all-class ECE).
    """
    n_bins = _check_n_bins(n_bins)
    if binning not in BINNINGS:
        raise ValueError(f"binning must be one of {BINNINGS}, got {binning!r}")
    if targets not in CALIBRATION_TARGETS:
        raise ValueError(f"targets must be one of {CALIBRATION_TARGETS}, got {targets!r}")
    probs, labels = check_probs_labels(probs, labels)
    values, hits = _calibration_pairs(probs, labels, targets)
    bins, values64, n_slots, edges = _assign_bins(values, n_bins, binning)
    stats = _bin_statistics(values64, hits, bins, n_slots)
    return stats if edges is None else {"edges": edges, **stats}


@metric(
    'calibration', 'ECE', '%', False,
    'Top-label ECE, 15 (lo, hi] bins on the float32 edges of torch.linspace(0, 1, 16), '
    'compared in float64, confidence 1.0 in the last bin: KEP-SVGP calc_ece bin for bin, '
    'for float32 and float64 inputs.',
    bootstrap=_boot_ece, selections={"paper": 4, "default": 4, "shift": 1, "severity": 1},
    interval='Interval approximate: measured coverage 95-97% when the model is miscalibrated by a few '
             'points, 47% for a calibrated one (true ECE 0, where the upward bias is largest) '
             '(reports/perf/coverage.md).',
)
def ece(probs: np.ndarray, labels: np.ndarray, *, n_bins: int = 15) -> float:
    """Top-label expected calibration error as a fraction in [0, 1] (not %).

    ``probs`` [N, C], ``labels`` [N] int; bins as in :func:`calibration_bins` (15
    ``(lo, hi]`` bins on torch's float32 edges: the KEP-SVGP reference, bin for bin; feed
    it the float32 softmax of the paper's logits to reproduce the paper's numbers).
    ECE = sum_m (n_m / N) |acc_m - conf_m|; empty bins contribute 0.
    """
    # n_m/N * |acc_m - conf_m| = |sum_acc_m - sum_conf_m| / N; empty bins give 0
    return _calibration_error(calibration_bins(probs, labels, n_bins=n_bins), "l1")


@metric(
    'calibration', 'ECE-debiased', '%', False,
    "ECE's 15 (lo, hi] bins with Kumar et al. (2019)'s normal bias correction in closed "
    'form: per bin 2|acc - conf| - E|acc - conf + sZ|, s^2 = acc(1 - acc)/n_m (the '
    "infinite-resample limit of uncertainty-calibration's normal_debiased_ce); may be "
    'slightly negative.',
    bootstrap=_boot_ece_debiased, selections={"default": 4.5, "shift": 1.5, "severity": 1.5},
    interval='Interval approximate: measured coverage 86-94% (94% for a calibrated model, 86% at '
             'accuracy 0.48) (reports/perf/coverage.md).',
)
def ece_debiased(probs: np.ndarray, labels: np.ndarray, *, n_bins: int = 15) -> float:
    """Top-label ECE with the plug-in estimator's upward bias removed, a fraction (not %).

    Plug-in ECE averages |acc_m - conf_m| over bins whose accuracy is itself a noisy
    estimate, so it is biased upward: a perfectly calibrated model scores about
    sum_m (n_m/N) s_m sqrt(2/pi) > 0.  Kumar, Liang & Ma (2019, "Verified uncertainty
    calibration") subtract that bias: with acc_m ~ N(a_m, s_m^2), s_m^2 = a_m (1 - a_m) /
    n_m, the bias of bin m is E|g_m + s_m Z| - |g_m|, so the corrected term is
    2|g_m| - E|g_m + s_m Z|.  Their package draws Z 1,000 times; the expectation has a
    closed form (the folded normal mean), used here, so the result is deterministic.
    Bins as :func:`ece` (the KEP-SVGP (lo, hi] bins on torch's float32 edges); a bin with
    a single sample, or with accuracy 0 or 1, has s_m = 0 and keeps its plug-in term (the
    package refuses bins of fewer than 2 samples, which top-label confidences, never below
    1/C, always leave empty at the bottom).  Result = sum_m (n_m/N)(2|g_m| - E|g_m + s_m Z|);
    it can be slightly negative for a well-calibrated model.
    """
    stats = calibration_bins(probs, labels, n_bins=n_bins)
    terms = _debiased_bin_terms(stats["count"], stats["sum_acc"], stats["sum_conf"])
    return float(terms.sum() / stats["count"].sum())


@metric(
    'classification', 'NLL', 'x10', False,
    'Mean -log p(true class) in nats, clamped at the float64 tiny value.',
    bootstrap=_boot_nll, selections={"paper": 5, "default": 5, "shift": 2, "severity": 2},
)
def nll(probs: np.ndarray, labels: np.ndarray) -> float:
    """Negative log-likelihood in nats: -(1/N) sum_i log p[i, y_i].

    ``probs`` [N, C], ``labels`` [N] int.  The true-class probability is clamped below at
    ``np.finfo(np.float64).tiny`` (~2.2e-308), so a zero gives ~708.4 per sample, not inf.
    """
    probs, labels = check_probs_labels(probs, labels)
    p_true = np.asarray(probs, dtype=np.float64)[np.arange(labels.shape[0]), labels]
    return float(-np.log(np.maximum(p_true, np.finfo(np.float64).tiny)).mean())


@metric(
    'classification', 'Brier', 'x100', False,
    'Squared error to the one-hot label summed over classes, mean over samples (range '
    '[0, 2]).',
    bootstrap=_boot_brier, selections={"paper": 6, "default": 6, "shift": 3},
)
def brier(probs: np.ndarray, labels: np.ndarray) -> float:
    """Multi-class Brier score: (1/N) sum_i sum_k (p_ik - 1[y_i = k])^2, range [0, 2].

    ``probs`` [N, C], ``labels`` [N] int.  Summed over classes (not averaged).
    """
    probs, labels = check_probs_labels(probs, labels)
    p = np.asarray(probs, dtype=np.float64)
    p_true = p[np.arange(labels.shape[0]), labels]
    # sum_k (p_k - 1[k=y])^2 = sum_k p_k^2 - 2 p_y + 1
    per_sample = np.einsum("ij,ij->i", p, p) - 2.0 * p_true + 1.0
    return float(np.maximum(per_sample, 0.0).mean())


@metric(
    'failure', 'AURC', 'x1000', False,
    'Riemann mean of selective risk E_i/i over i = 1..N, MSP, stable sort (KEP-SVGP).',
    bootstrap=_boot_aurc, selections={"paper": 1, "default": 1, "shift": 4},
)
def aurc(probs: np.ndarray, labels: np.ndarray) -> float:
    """Area under the risk-coverage curve (Riemann mean), raw risk (not x1000).

    ``probs`` [N, C], ``labels`` [N] int.  Samples sorted by confidence (max prob),
    highest first, stable sort (ties keep input order); E_i = errors among the top i;
    AURC = (1/N) sum_{i=1..N} E_i / i.
    """
    return _aurc(*_confidence_correct(probs, labels))


def _sorted_errors(conf: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """E_i for i = 1..N: errors among the i most confident (stable sort), float64."""
    order = np.argsort(-conf, kind="stable")
    return np.cumsum(~correct[order], dtype=np.float64)


def _selective_risk(conf: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """E_i / i for i = 1..N: error rate among the i most confident (stable sort)."""
    errors = _sorted_errors(conf, correct)
    return errors / np.arange(1, errors.shape[0] + 1)


def _aurc(conf: np.ndarray, correct: np.ndarray) -> float:
    """AURC from confidences ``[N]`` and correctness ``[N]`` (already validated)."""
    return float(np.mean(_selective_risk(conf, correct)))


def risk_coverage_curve(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(coverage i/N, selective risk E_i/i)`` for i = 1..N, the curve :func:`aurc` averages."""
    risk = _selective_risk(*_confidence_correct(probs, labels))
    return np.arange(1, risk.shape[0] + 1) / risk.shape[0], risk


@metric(
    'failure', 'E-AURC', 'x1000', False,
    "AURC (Riemann mean) minus the analytic optimum r + (1 - r) ln(1 - r) (KEP-SVGP; fd-shifts "
    "subtracts the same optimum from its unique-threshold AURC: eaurc_fdshifts).",
    bootstrap=_boot_eaurc, selections={"paper": 7, "default": 7},
)
def eaurc(probs: np.ndarray, labels: np.ndarray) -> float:
    """Excess AURC: AURC - AURC*, AURC* = r + (1 - r) ln(1 - r), r = error rate.

    ``probs`` [N, C], ``labels`` [N] int.  AURC* is the analytic optimum (KEP-SVGP,
    fd-shifts); at r = 1 it takes its limit 1 (0 ln 0 = 0).  Raw (not x1000).
    """
    conf, correct = _confidence_correct(probs, labels)
    return _aurc(conf, correct) - float(_optimal_aurc(np.mean(~correct)))


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


# ------------------------------------------------------------------------------- OOD


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


# =============================================================================================
# Named variants (reference/metrics.md sections 2-6).  Same signatures and raw scales as the
# defaults; each reuses the machinery above.
# =============================================================================================

# ------------------------------------------------------------------- calibration variants


@metric(
    'calibration', 'ECE-TM', '%', False,
    'Top-label ECE, 15 [lo, hi) bins on float32 confidences, 1.0 in a hidden 16th bin '
    '(torchmetrics, TorchUncertainty).',
)
def ece_torchmetrics(probs: np.ndarray, labels: np.ndarray, *, n_bins: int = 15) -> float:
    """Top-label ECE exactly as torchmetrics ``CalibrationError`` (and TorchUncertainty's ECE).

    ``probs`` [N, C], ``labels`` [N] int.  Reproduces their behaviour, bug included
    (torchmetrics #3510): confidences are cast to float32 (``.float()``), binned with
    ``bucketize(c, linspace(0, 1, B+1), right=True) - 1``, i.e. ``[lo, hi)`` bins, so a
    confidence exactly 1.0 (in float32: anything above 1 - 3e-8) lands in a hidden
    (B+1)-th bin that still counts in the sum.  ECE = sum over the B+1 slots of
    (n_m/N)|acc_m - conf_m|.  Differs from :func:`ece` for confidences on interior edges
    (which go up one bin) and at 1.0 (a bin of its own instead of pooling with
    (1 - 1/B, 1)).  The edges are torch's float32 ``linspace(0, 1, B+1)`` bit for bit
    (:func:`torch_linspace_float32`; some interior edges lie one ulp off k/B there), so a
    confidence lying exactly on an edge bins as in torchmetrics.  The sums run in float64
    (torchmetrics: float32), a difference below 1e-6.  Equals torchmetrics'
    ``MulticlassCalibrationError(n_bins=B, norm="l1")``, and ``BinaryCalibrationError`` fed
    the float32 top-label confidence and correctness.  torchmetrics is not consistent with
    itself on float64 input: its binary class skips the float32 cast and bins float64
    confidences on float64 edges (confidences 11/15 correct and 0.75 wrong: one float32
    bin, ECE 0.2417 in the multiclass class and here; two float64 bins, 0.5083 in the
    binary class).  ``BinaryCalibrationError`` on the probability of class 1 measures the
    positive class, not the top label (torchmetrics #1105).
    """
    stats = calibration_bins(probs, labels, n_bins=n_bins, binning="torchmetrics")
    return _calibration_error(stats, "l1")


@metric(
    'calibration', 'ECE-20', '%', False,
    'Top-label ECE, 20 [lo, hi) bins on edges linspace(0, 1 + 1e-8, 21), MSP as the '
    'score (fd-shifts).',
)
def ece_fdshifts(probs: np.ndarray, labels: np.ndarray, *, n_bins: int = 20) -> float:
    """Top-label ECE as fd-shifts computes it with MSP as the confidence score: 20 bins.

    ``probs`` [N, C], ``labels`` [N] int.  Bins ``np.digitize(c, linspace(0, 1 + 1e-8,
    21)) - 1`` in float64: ``[lo, hi)`` on edges stretched by 1e-8 (c = 1.0 in the last
    bin); ECE = sum over non-empty bins of (n_m/N)|acc_m - conf_m|.
    """
    stats = calibration_bins(probs, labels, n_bins=n_bins, binning="fdshifts")
    return _calibration_error(stats, "l1")


@metric(
    'calibration', 'ECE-all', '%', False,
    'All-class ECE: every p_ik against 1[y_i = k], 15 (lo, hi] bins, weights over N*C '
    'values (SGPA).',
)
def ece_all_class(probs: np.ndarray, labels: np.ndarray, *, n_bins: int = 15) -> float:
    """All-class ECE (SGPA's published ECE): every class probability is binned.

    ``probs`` [N, C], ``labels`` [N] int.  The N*C pairs (p_ik, 1[y_i = k]) go into 15
    equal-width ``(lo, hi]`` bins (as :func:`ece`); ECE = sum_m (n_m / (N C))|acc_m -
    conf_m|.  Not comparable with top-label ECE.  SGPA computed it with an external
    notebook that is not available; the bin count and edge rule here are uqbench's.
    """
    stats = calibration_bins(probs, labels, n_bins=n_bins, binning="upper_closed", targets="all_class")
    return _calibration_error(stats, "l1")


@metric(
    'calibration', 'MCE-all', '%', False,
    "All-class MCE: max over non-empty bins of the all-class ECE's 15 (lo, hi] bins "
    '(SGPA).',
)
def mce_all_class(probs: np.ndarray, labels: np.ndarray, *, n_bins: int = 15) -> float:
    """All-class MCE (SGPA's published MCE): max over non-empty bins of |acc_m - conf_m|.

    ``probs`` [N, C], ``labels`` [N] int; the bins of :func:`ece_all_class`.
    """
    stats = calibration_bins(probs, labels, n_bins=n_bins, binning="upper_closed", targets="all_class")
    return _calibration_error(stats, "max")


@metric(
    'calibration', 'cw-ECE', '%', False,
    'Class-wise ECE: per class, p_k against 1[y = k] in 15 (lo, hi] bins; mean over '
    'classes.',
)
def ece_classwise(probs: np.ndarray, labels: np.ndarray, *, n_bins: int = 15) -> float:
    """Class-wise ECE (Kull et al. 2019): per class k, bin p_k against 1[y = k]; mean over k.

    ``probs`` [N, C], ``labels`` [N] int.  For each class, 15 equal-width ``(lo, hi]`` bins
    of the N values p_ik; ECE_k = sum_m (n_km / N)|acc_km - conf_km|; the result is
    (1/C) sum_k ECE_k over all C classes (classes never predicted nor present count, with
    their probabilities, like any other).  Always >= :func:`ece_all_class`.
    """
    n_bins = _check_n_bins(n_bins)
    probs, labels = check_probs_labels(probs, labels)
    values, hits = _calibration_pairs(probs, labels, "all_class")
    bins, values64, _, _ = _assign_bins(values, n_bins, "upper_closed")
    n_classes = probs.shape[1]
    klass = np.tile(np.arange(n_classes), probs.shape[0])  # class of each row-major value
    stats = _bin_statistics(values64, hits, bins + n_bins * klass, n_bins * n_classes)
    # sum over (k, m) of |gap_km| / (N C) = (1/C) sum_k ECE_k
    return _calibration_error(stats, "l1")


@metric(
    'calibration', 'aECE', '%', False,
    "Top-label ECE on 15 equal-mass bins, stable sort by (float64 confidence, index) "
    "(TorchUncertainty aECE, which sorts float32 confidences with an unstable sort: tied "
    "confidences that a bin boundary splits can fall into other bins there; N < 15 gives "
    "NaN there, 0 here).",
)
def ece_adaptive(probs: np.ndarray, labels: np.ndarray, *, n_bins: int = 15) -> float:
    """Adaptive (equal-mass) top-label ECE, TorchUncertainty's aECE with 15 bins.

    ``probs`` [N, C], ``labels`` [N] int.  Confidences sorted ascending by (confidence,
    index) (stable, so ties at a bin boundary split by input order) and cut into B bins of
    equal count, the first N mod B one larger (``torch.tensor_split``); ECE formula as
    :func:`ece`.  With N < B the empty bins contribute 0 (TorchUncertainty gives NaN).
    Distinct confidences bin as in TorchUncertainty when they are distinct in float32.
    Tied confidences that a bin boundary splits are where the two differ: TorchUncertainty
    casts to float32 and sorts with ``torch.sort``, which is not stable, so which of the
    tied samples fall on each side follows torch's sorting algorithm, not the input order.
    Minimal example: 20 samples, every confidence float32 0.7, the first 14 correct, 4
    bins: here the bins hold samples 0-4, 5-9, 10-14, 15-19 (gaps .3, .3, .1, .7), ECE
    0.35; TorchUncertainty 0.13 on a CPU sorts the tied indices as 10, 19, 18, ..., 11, 0,
    9, ..., 1 and gives 0.30.  Neither order is more right: bins that split ties are
    arbitrary in any equal-mass scheme.
    """
    stats = calibration_bins(probs, labels, n_bins=n_bins, binning="equal_mass")
    return _calibration_error(stats, "l1")


@metric(
    'calibration', 'MCE', '%', False,
    'Top-label max |acc - conf| over non-empty 15 (lo, hi] bins (the bins of ECE).',
)
def mce(probs: np.ndarray, labels: np.ndarray, *, n_bins: int = 15) -> float:
    """Maximum calibration error: max over non-empty bins of |acc_m - conf_m|.

    ``probs`` [N, C], ``labels`` [N] int; top-label, the 15 ``(lo, hi]`` bins of
    :func:`ece`.  Empty bins are ignored (never NaN).
    """
    return _calibration_error(calibration_bins(probs, labels, n_bins=n_bins), "max")


@metric(
    'calibration', 'RMSCE', '%', False,
    'Top-label sqrt(sum (n_m/N)(acc_m - conf_m)^2), 15 (lo, hi] bins (the bins of ECE).',
)
def rms_ce(probs: np.ndarray, labels: np.ndarray, *, n_bins: int = 15) -> float:
    """RMS (L2) calibration error: sqrt(sum_m (n_m/N)(acc_m - conf_m)^2).

    ``probs`` [N, C], ``labels`` [N] int; top-label, the 15 ``(lo, hi]`` bins of
    :func:`ece`; empty bins contribute 0.
    """
    return _calibration_error(calibration_bins(probs, labels, n_bins=n_bins), "l2")


@metric(
    'calibration', 'RMSCE-100', '%', False,
    "Top-label RMS calibration error on sorted bins of 100 samples, last bin skipped (RPC's "
    "and Hendrycks' calib_err; their unstable np.argsort may split tied confidences at a bin "
    "boundary differently from this stable sort).",
)
def rms_ce_adaptive100(probs: np.ndarray, labels: np.ndarray, *, bin_size: int = 100) -> float:
    """RPC's RMS calibration error: adaptive bins of 100 samples (Hendrycks ``calib_err``).

    ``probs`` [N, C], ``labels`` [N] int.  Reproduces ``calib_err(conf, correct, p='2',
    beta=100)`` of Hendrycks' ``calibration_tools.py`` and of RPC's own copy
    (rachtsy/KPCA_code ``Robust/calibration_tools.py``, ``calib_err``, the same code), quirk
    included: confidences sorted ascending, here stable by (confidence, index) where the
    references' ``np.argsort`` (quicksort, unstable) may order tied confidences otherwise,
    which moves ties across a bin boundary (the only difference); m = N // 100 bins of 100 samples, the last
    one absorbing the remainder (100 to 199 samples); the loop then *skips the last bin*
    while still dividing by N: RMS = sqrt(sum_{m < last} (n_m/N)(acc_m - conf_m)^2).  So
    100 <= N < 200 gives 0.0 and N < 100 (where the reference crashes) gives NaN.
    """
    bin_size = _check_n_bins(bin_size, "bin_size")
    probs, labels = check_probs_labels(probs, labels)
    values, hits = _calibration_pairs(probs, labels, "top_label")
    n = values.shape[0]
    n_full = n // bin_size
    if n_full == 0:
        return float("nan")
    sizes = np.full(n_full, bin_size)
    sizes[-1] += n - n_full * bin_size
    stats = _bin_statistics(values.astype(np.float64), hits, _rank_bins(values, sizes), n_full)
    kept = {key: value[:-1] for key, value in stats.items()}  # the reference skips the last bin
    return _calibration_error(kept, "l2", total=n)


@metric(
    'calibration', 'Brier-top', 'x100', False,
    'Mean (c - 1[correct])^2 of the top-class confidence (TorchUncertainty top_class).',
)
def brier_top_label(probs: np.ndarray, labels: np.ndarray) -> float:
    """Top-label Brier score: (1/N) sum_i (c_i - 1[prediction i correct])^2, range [0, 1].

    ``probs`` [N, C], ``labels`` [N] int; c = max probability (TorchUncertainty
    ``BrierScore(top_class=True)``).
    """
    conf, correct = _confidence_correct(probs, labels)
    return float(np.mean((conf - correct) ** 2))


# ------------------------------------------------------------ selective-classification variants


def _unique_threshold_counts(conf: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(k_g, E_g)`` per distinct confidence u_g, descending: samples with c >= u_g and the
    errors among them (tied confidences enter together; float64)."""
    curve = _BinaryCurve(~correct, conf)  # errors are the "positives"
    return curve.tps + curve.fps, curve.tps


@metric(
    'failure', 'AURC-trap', 'x1000', False,
    "Trapezoid of selective risk over coverage [1/N, 1] divided by (1 - 1/N), MSP "
    "(TorchUncertainty; stable sort: TorchUncertainty's unstable argsort may order tied confidences, e.g. saturated 1.0, differently).",
)
def aurc_trapezoid(probs: np.ndarray, labels: np.ndarray) -> float:
    """TorchUncertainty's AURC: trapezoid of selective risk over coverage [1/N, 1], / (1 - 1/N).

    ``probs`` [N, C], ``labels`` [N] int.  Risks R_i = E_i / i as :func:`aurc` (stable
    sort by descending confidence) at coverages i/N; the trapezoid area over [1/N, 1] is
    divided by (1 - 1/N), i.e. (sum_i R_i - (R_1 + R_N)/2) / (N - 1).  NaN for N = 1.
    Raw risk (not x1000).
    """
    conf, correct = _confidence_correct(probs, labels)
    n = conf.shape[0]
    if n < 2:
        return float("nan")
    risk = _selective_risk(conf, correct)
    return float(np.trapezoid(risk, np.arange(1, n + 1) / n) / (1.0 - 1.0 / n))


@metric(
    'failure', 'AURC-uniq', 'x1000', False,
    'Trapezoid over the RC curve at unique confidence thresholds (ties grouped) plus '
    '(0, top risk) (fd-shifts).',
)
def aurc_unique(probs: np.ndarray, labels: np.ndarray) -> float:
    """fd-shifts' AURC: trapezoid over the RC curve at unique confidence thresholds.

    ``probs`` [N, C], ``labels`` [N] int.  One point per distinct confidence u (tied
    samples accepted together, so input order never matters): coverage k/N and selective
    risk E/k, where k = #{c >= u} and E = errors among them; plus (coverage 0, the risk of
    the most confident group).  Area by the trapezoid rule over [0, 1].  Raw (fd-shifts
    reports x1000).
    """
    conf, correct = _confidence_correct(probs, labels)
    accepted, errors = _unique_threshold_counts(conf, correct)
    risk = errors / accepted
    coverage = np.concatenate(([0.0], accepted / conf.shape[0]))
    return float(np.trapezoid(np.concatenate((risk[:1], risk)), coverage))


@metric(
    "failure", "E-AURC-fds", "x1000", False,
    "fd-shifts' E-AURC: its unique-threshold AURC (aurc_unique) minus the analytic optimum "
    "r + (1 - r) ln(1 - r).",
)
def eaurc_fdshifts(probs: np.ndarray, labels: np.ndarray) -> float:
    """fd-shifts' excess AURC: :func:`aurc_unique` - AURC*, AURC* = r + (1 - r) ln(1 - r).

    ``probs`` [N, C], ``labels`` [N] int.  Only the AURC* term is shared with
    :func:`eaurc` (KEP-SVGP subtracts it from the Riemann-mean AURC).  fd-shifts writes
    AURC* with ``ln(1 - r + eps)``, which differs from the exact value by < 3e-16 (and gives
    the same limit 1 at r = 1).  Raw (fd-shifts reports x1000).
    """
    conf, correct = _confidence_correct(probs, labels)
    return aurc_unique(probs, labels) - float(_optimal_aurc(np.mean(~correct)))


@metric(
    'failure', 'E-AURC-disc', 'x1000', False,
    'AURC minus the exact discrete optimum (1/N) sum_{i>n_c} (i - n_c)/i.',
)
def eaurc_discrete(probs: np.ndarray, labels: np.ndarray) -> float:
    """Excess AURC against the exact discrete optimum: AURC - (1/N) sum_{i>n_c} (i - n_c)/i.

    ``probs`` [N, C], ``labels`` [N] int; n_c = number correct.  The optimum is
    :func:`aurc` of a ranking with every correct prediction first, so a perfect ranking
    gives exactly 0 (the analytic :func:`eaurc` gives a positive value there); r = 0 and
    r = 1 give 0.  Raw (not x1000).
    """
    conf, correct = _confidence_correct(probs, labels)
    n = conf.shape[0]
    i = np.arange(1, n + 1, dtype=np.float64)
    oracle_errors = np.maximum(i - np.count_nonzero(correct), 0.0)  # E_i with all correct first
    return _aurc(conf, correct) - float(np.mean(oracle_errors / i))


@metric(
    'failure', 'AUGRC', 'x1000', False,
    'Riemann mean of generalised risk E_i/N over i = 1..N, MSP, stable sort.',
)
def augrc(probs: np.ndarray, labels: np.ndarray) -> float:
    """AUGRC (Traub et al., NeurIPS 2024), Riemann mean: (1/N) sum_i E_i / N.

    ``probs`` [N, C], ``labels`` [N] int.  Generalised risk at coverage i/N = E_i / N (the
    probability of being accepted and wrong), E_i = errors among the i most confident
    (stable sort, as :func:`aurc`).  Range [0, 1]; raw (fd-shifts reports x1000).
    """
    conf, correct = _confidence_correct(probs, labels)
    n = conf.shape[0]
    return float(np.mean(_sorted_errors(conf, correct)) / n)


@metric(
    'failure', 'AUGRC-trap', 'x1000', False,
    'Trapezoid over generalised risk E/N at unique thresholds plus (0, 0) (fd-shifts).',
)
def augrc_trapezoid(probs: np.ndarray, labels: np.ndarray) -> float:
    """fd-shifts' AUGRC: trapezoid over the generalised-risk curve at unique thresholds.

    ``probs`` [N, C], ``labels`` [N] int.  Points (k/N, E/N) for every distinct confidence
    u (k = #{c >= u}, E = errors among them; ties accepted together) plus (0, 0); area by
    the trapezoid rule over [0, 1] (fd-shifts ``RiskCoverageStats.augrc`` /
    ``generalized_risk_stats``).  Raw (fd-shifts reports x1000).
    """
    conf, correct = _confidence_correct(probs, labels)
    n = conf.shape[0]
    accepted, errors = _unique_threshold_counts(conf, correct)
    coverage = np.concatenate(([0.0], accepted / n))
    return float(np.trapezoid(np.concatenate(([0.0], errors / n)), coverage))


@metric(
    'failure', 'Risk@80Cov', '%', False,
    "Selective risk E_k/k of the k = ceil(0.8 N) most confident (TorchUncertainty; "
    "stable sort: TorchUncertainty's unstable argsort may order tied confidences, e.g. saturated 1.0, differently).",
)
def risk_at_80_coverage(probs: np.ndarray, labels: np.ndarray) -> float:
    """Selective risk at 80% coverage (TorchUncertainty ``RiskAt80Cov``): R_k = E_k / k.

    ``probs`` [N, C], ``labels`` [N] int.  k = ceil(0.8 N) in integer arithmetic; E_k =
    errors among the k most confident (stable sort by descending confidence, as
    :func:`aurc`).  In [0, 1].
    """
    conf, correct = _confidence_correct(probs, labels)
    k = (80 * conf.shape[0] + 99) // 100
    return float(_selective_risk(conf, correct)[k - 1])


@metric(
    'failure', 'Cov@5Risk', '%', True,
    "Largest coverage i/N with selective risk E_i/i <= 5%, NaN if none (TorchUncertainty; "
    "stable sort: TorchUncertainty's unstable argsort may order tied confidences, e.g. saturated 1.0, differently).",
)
def coverage_at_5_risk(probs: np.ndarray, labels: np.ndarray) -> float:
    """Largest coverage with selective risk <= 5% (TorchUncertainty ``CovAt5Risk``).

    ``probs`` [N, C], ``labels`` [N] int.  Returns max{i/N : E_i / i <= 0.05} over i =
    1..N (E_i as :func:`aurc`: stable sort by descending confidence; the comparison is
    exact, 20 E_i <= i), or NaN when no coverage reaches it.  Risk need not be monotone:
    the largest admissible coverage counts even if smaller ones are not admissible.
    (TorchUncertainty's NaN check reads its flipped risk array unflipped, which can
    return NaN where an admissible coverage exists; this is the documented intent.)
    """
    conf, correct = _confidence_correct(probs, labels)
    errors = _sorted_errors(conf, correct)
    admissible = np.flatnonzero(20.0 * errors <= np.arange(1, errors.shape[0] + 1))
    if admissible.shape[0] == 0:
        return float("nan")
    return float((admissible[-1] + 1) / conf.shape[0])


# ------------------------------------------------------------ failure-prediction variants


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


# ---------------------------------------------------------------------------- OOD variants


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
    float32 arithmetic (``_BinaryCurve.fpr_at_tpr_tu``); returns the fraction of ID samples
    flagged as OOD there.  Example: OOD scores 0..429 and ID scores (408.5, 1e4) give 0.0
    (recall 408/430 is nearer 0.95 than 409/430 in float32), as TorchUncertainty and
    Hendrycks' code do.
    """
    return _ood_curve(scores_id, scores_ood, ood_positive=True).fpr_at_tpr_tu(0.95)


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


# ------------------------------------------------------------- uncertainty decomposition


def entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats over the last axis: H[p] = -sum_k p_k ln p_k, 0 ln 0 = 0.

    ``probs`` [..., C] (finite, in [0, 1]; rows are not renormalised) -> float64 [...],
    e.g. [N, C] -> [N].  Not a registered metric.
    """
    p = np.asarray(probs)
    if p.ndim < 1 or p.shape[-1] == 0 or p.size == 0:
        raise ValueError(f"probs must have a non-empty last (class) axis, got shape {p.shape}")
    _check_probability_values(p, "probs")
    p = p.astype(np.float64)
    terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)  # 0 ln 0 = 0
    return 0.0 - terms.sum(axis=-1)  # "0.0 -" turns -0.0 into 0.0 for one-hot rows


def decompose(member_probs: np.ndarray) -> dict[str, np.ndarray]:
    """Total / aleatoric / epistemic uncertainty from member (or sample) probabilities.

    ``member_probs`` [M, N, C] (M members or MC samples).  Returns float64 [N] arrays:
    ``total`` = H[p-bar] with p-bar = (1/M) sum_m p_m (the entropy *of the mean*, the
    "ensemble entropy"), ``aleatoric`` = (1/M) sum_m H[p_m] (the mean *of the entropies*;
    TorchUncertainty once reported this as the ensemble entropy, PR #304),
    ``epistemic`` = total - aleatoric (mutual information), >= 0 for normalised rows by
    Jensen's inequality and clipped at 0 against round-off.  Not a registered metric.
    """
    p = np.asarray(member_probs)
    if p.ndim != 3 or 0 in p.shape:
        raise ValueError(f"member_probs must be a non-empty [M, N, C] array, got shape {p.shape}")
    _check_probability_values(p, "member_probs")
    p = p.astype(np.float64)
    total = entropy(p.mean(axis=0))
    aleatoric = entropy(p).mean(axis=0)
    return {"total": total, "aleatoric": aleatoric, "epistemic": np.maximum(total - aleatoric, 0.0)}
