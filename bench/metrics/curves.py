"""The binary ROC / precision-recall curve of a scoring problem.

A binary scoring problem (positives, and a score that is higher for them) is summarised
by its cumulative confusion counts at every distinct threshold; :class:`BinaryCurve`
derives sklearn's ROC and PR points from them and the areas and operating points that
the failure-prediction and OOD metrics report (the unique-threshold risk-coverage
variants read its counts too).  ``bench.metrics.resample`` computes the same quantities
per bootstrap resample.
"""
from __future__ import annotations

import numpy as np


class BinaryCurve:
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
