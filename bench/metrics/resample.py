"""What the vectorised bootstrap kernels share.

A resample is a count vector ``w[b, i]`` (``bench.analysis.bootstrap.resample_weights``); each kernel
evaluates one metric on every row of ``w`` over the original samples (exactness contract
and cost: ``bench.analysis.bootstrap``).  A metric names its kernel in ``@metric(bootstrap=...)``, and
the kernel sits beside its metric.  Shared here: row chunks that bound the memory of
``w @ x`` (:func:`chunks`), and ROC / PR quantities of every resample computed from
weighted counts over the runs of tied scores (:class:`TieGroups`), the resampled
counterparts of :class:`bench.metrics.curves.BinaryCurve`.
"""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np


_CHUNK_ELEMENTS = 1 << 20  # rows of w per matrix product: ~8 MB per [rows, N] float64 copy


def chunks(n_rows: int, n_cols: int) -> Iterator[slice]:
    """Row slices of about ``_CHUNK_ELEMENTS`` elements (bounded memory for ``w @ x``)."""
    step = max(1, _CHUNK_ELEMENTS // max(n_cols, 1))
    for start in range(0, n_rows, step):
        yield slice(start, min(start + step, n_rows))


# -------------------------------------------------------------- weighted tie groups


class TieGroups:
    """Samples sorted by score (descending) and cut into runs of tied scores.

    The runs are the thresholds of ``bench.metrics.curves.BinaryCurve``.  A resample's
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


def auroc_from_cumulative(tp: np.ndarray, fp: np.ndarray) -> float:
    """Trapezoid ROC area (ties count one half); NaN without positives or negatives.

    Area = sum_g (FP_g - FP_{g-1}) (TP_g + TP_{g-1}) / (2 P N) (FP_{-1} = TP_{-1} = 0):
    the trapezoid rule on the ROC points, with an exact integer numerator.
    """
    p, n = tp[-1], fp[-1]
    if p == 0 or n == 0:
        return float("nan")
    num = int(fp[0]) * int(tp[0]) + int(np.dot(fp[1:] - fp[:-1], tp[1:] + tp[:-1]))
    return num / (2.0 * float(p) * float(n))


def average_precision_from_cumulative(tp: np.ndarray, fp: np.ndarray) -> float:
    """Step-wise AP = sum_g (pos_g / P) precision_g, clipped at 0; NaN without positives.

    Only runs that draw positives contribute, and their precision denominators are > 0.
    """
    if tp[-1] == 0:
        return float("nan")
    prec = tp / np.maximum(tp + fp, 1)
    total = float(tp[0]) * prec[0] + float(np.dot(tp[1:] - tp[:-1], prec[1:]))
    return max(0.0, total / float(tp[-1]))


def aupr_trapezoid_from_cumulative(tp: np.ndarray, fp: np.ndarray) -> float:
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


def fpr_at_tpr_from_cumulative(tp: np.ndarray, fp: np.ndarray, target: float = 0.95) -> float:
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
    """The full search of :func:`fpr_at_tpr_from_cumulative` (P > 0 and N > 0).

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


def curve_metric(
    fn: Callable[[np.ndarray, np.ndarray], float], groups: TieGroups, w: np.ndarray
) -> np.ndarray:
    """``fn`` on the cumulative counts of every row of ``w``.

    One resample at a time: 1-D passes over a row stay in cache and beat 2-D batches
    (about 3x at N = 10,000 on the benchmark machine).
    """
    return np.array([fn(*groups.cumulative(row)) for row in w], dtype=np.float64)
