"""Paired bootstrap confidence intervals and significance tests, vectorised (numpy only).

Why paired
    Every method and seed evaluated on one split uses the *same* seeded resamples
    (:func:`resample_weights`; :func:`index_matrix` gives them as indices).  Differences
    between methods are then computed resample by resample, so the sample-to-sample
    variation they share cancels and only their disagreement is left: the interval of a
    difference is much narrower than two independent intervals would suggest.  OOD metrics
    resample the ID and the OOD side independently (two seeded matrices), each shared by
    all methods.

How it is fast
    A resample is represented by its count vector ``w[b, i]`` = how often sample ``i`` was
    drawn (:func:`resample_weights`, :func:`weights_from_index`).  Each metric is rewritten
    as a weighted computation over the *original* samples, so nothing is ever re-sorted:
    means (accuracy, NLL, Brier) and ECE's per-bin sums are one matrix product ``w @ x``;
    sort-based metrics (AURC, ROC, PR, FPR95) sort once and then need, per resample, one
    gather of the counts into the sorted order and cumulative sums along it.  Those passes
    run one resample at a time (a 1-D row stays in cache; batched 2-D passes measured about
    3x slower at N = 10,000).  Cost: see ``benchmarks/bootstrap_cost.py``.

Exactness contract (tested)
    For every resample ``b`` and every default metric (``bench.metrics``),
    ``boot_metric(name, probs, labels, w)[b]`` equals
    ``METRICS.get(name)(probs[idx[b]], labels[idx[b]])`` up to float rounding (~1e-12),
    tie conventions included: AURC's stable sort, tie groups of ROC/PR points, sklearn's
    ``drop_intermediate`` for FPR95.  Undefined values (e.g. failure AUROC of a resample
    without errors) are NaN, as the metric gives.  AURC depends on the order of tied
    samples, so :func:`index_matrix` returns each row *sorted*: a resample is a multiset of
    indices, and the sorted order keeps the original order inside tie groups, which is what
    the count vector can reproduce.  Metrics without a vectorised form (e.g. variants
    registered later) are evaluated exactly by an explicit loop over resamples.

Intervals and tests
    :func:`bootstrap_ci` gives the percentile interval; :func:`seed_mean_distribution` the
    bootstrap distribution of a mean over seeds (every seed on the same resamples);
    :func:`paired_test` a two-sided bootstrap p-value for "difference = 0" and :func:`holm`
    the Holm-Bonferroni adjustment across the comparisons of one table.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np

from bench.metrics import (
    METRIC_INFO,
    _check_probs_labels,
    _check_scores,
    _confidence_correct,
)
from bench.registry import METRICS

__all__ = [
    "DEFAULT_RESAMPLES",
    "resample_weights",
    "index_matrix",
    "weights_from_index",
    "boot_metric",
    "boot_ood_metric",
    "bootstrap_ci",
    "seed_mean_distribution",
    "paired_test",
    "paired_z_test",
    "holm",
]

DEFAULT_RESAMPLES = 1000
_CHUNK_ELEMENTS = 1 << 20  # rows of w per matrix product: ~8 MB per [rows, N] float64 copy


# ------------------------------------------------------------------------- resamples


def resample_weights(n: int, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """Seeded bootstrap count vectors ``[n_resamples, n]`` (int64): the usual entry point.

    Row ``b`` counts ``n`` draws with replacement from ``range(n)`` made by
    ``np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))``; equal to
    ``weights_from_index(index_matrix(n, n_resamples, seed), n)`` without building the
    index matrix.  Share one matrix between every method and seed evaluated on the same
    split: that is what makes the bootstrap paired.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    rng = np.random.default_rng(seed)
    out = np.empty((n_resamples, n), np.int64)
    for rows in _chunks(n_resamples, n):  # bounded memory; same stream as one big draw
        out[rows] = weights_from_index(rng.integers(0, n, size=(rows.stop - rows.start, n)), n)
    return out


def index_matrix(n: int, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """Seeded bootstrap indices ``[n_resamples, n]`` (int64), each row sorted ascending.

    The draws of :func:`resample_weights` (same ``seed``), each row sorted.  Sorting is
    free of statistical meaning (a resample is a multiset) and makes order-dependent
    conventions (AURC's stable sort of tied confidences) a function of the counts alone:
    ``metric(probs[idx[b]], labels[idx[b]])`` is what :func:`boot_metric` computes.
    """
    counts = resample_weights(n, n_resamples, seed)
    return np.repeat(np.tile(np.arange(n, dtype=np.int64), n_resamples), counts.ravel()).reshape(
        n_resamples, n
    )


def weights_from_index(idx: np.ndarray, n: int) -> np.ndarray:
    """Count vectors ``w`` ``[B, n]`` (int64) of index rows ``idx`` ``[B, M]``.

    ``w[b, i]`` = number of times ``i`` occurs in ``idx[b]`` (one ``np.bincount`` over row
    offsets ``b * n + idx``).  ``M`` is usually ``n``.
    """
    idx = np.asarray(idx)
    if idx.ndim != 2:
        raise ValueError(f"idx must be 2-D [B, M], got shape {idx.shape}")
    if not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"idx must have an integer dtype, got {idx.dtype}")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"idx values must lie in [0, {n}), got [{idx.min()}, {idx.max()}]")
    n_rows = idx.shape[0]
    flat = (idx + (np.arange(n_rows, dtype=np.int64) * n)[:, None]).ravel()
    return np.bincount(flat, minlength=n_rows * n).reshape(n_rows, n)


def _check_weights(weights: np.ndarray, n: int, name: str = "weights") -> np.ndarray:
    """Validate count vectors ``[B, n]``: non-negative integers, every row sum > 0."""
    w = np.asarray(weights)
    if w.ndim != 2 or w.shape[1] != n:
        raise ValueError(f"{name} must have shape [B, {n}], got {w.shape}")
    if w.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one resample")
    if not np.issubdtype(w.dtype, np.integer):
        if not np.issubdtype(w.dtype, np.floating) or not np.all(w == np.round(w)):
            raise ValueError(f"{name} must be integer counts, got dtype {w.dtype}")
    w = w.astype(np.int64, copy=False)
    if w.min() < 0:
        raise ValueError(f"{name} must be non-negative counts")
    if np.any(w.sum(axis=1) == 0):
        raise ValueError(f"every row of {name} must draw at least one sample")
    return w


def _chunks(n_rows: int, n_cols: int) -> Iterator[slice]:
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
    for rows in _chunks(w.shape[0], w.shape[1]):
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
    """Top-label ECE on ``(lo, hi]`` bins, bins assigned as ``bench.metrics.calibration_bins``."""
    bin_dtype = np.result_type(probs.dtype, np.float32)
    conf_native = probs.astype(bin_dtype, copy=False).max(axis=1)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    bins = np.clip(np.searchsorted(edges.astype(bin_dtype), conf_native, side="left") - 1, 0, n_bins - 1)
    correct = probs.argmax(axis=1) == labels
    # D[i, bin_i] = correct_i - conf_i, so (w @ D)[b, m] = sum_acc - sum_conf of bin m
    gap = np.zeros((labels.shape[0], n_bins))
    gap[np.arange(labels.shape[0]), bins] = correct - conf_native.astype(np.float64)
    out = np.empty(w.shape[0])
    for rows in _chunks(w.shape[0], w.shape[1]):
        wr = w[rows].astype(np.float64)
        out[rows] = np.abs(wr @ gap).sum(axis=1) / wr.sum(axis=1)
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


def _boot_eaurc(probs, labels, w):
    """AURC - AURC*, AURC* = r + (1 - r) ln(1 - r) (limit 1 at r = 1), per resample."""
    aurc, r = _boot_aurc_parts(probs, labels, w)
    optimum = np.ones_like(r)
    below = r < 1.0
    optimum[below] = r[below] + (1.0 - r[below]) * np.log1p(-r[below])
    return aurc - optimum


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


_CLASSIFICATION: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "accuracy": _boot_accuracy,
    "ece": _boot_ece,
    "nll": _boot_nll,
    "brier": _boot_brier,
    "aurc": _boot_aurc,
    "eaurc": _boot_eaurc,
    "failure_auroc": _boot_failure_auroc,
    "failure_fpr95": _boot_failure_fpr95,
    "failure_aupr_success": _boot_failure_aupr_success,
    "failure_aupr_error": _boot_failure_aupr_error,
}


def boot_metric(name: str, probs: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Classification metric ``name`` on every bootstrap resample: ``[B]`` float64.

    ``probs`` ``[N, C]`` and ``labels`` ``[N]`` as for ``bench.metrics``; ``weights``
    ``[B, N]`` non-negative integer counts (:func:`resample_weights`).  Entry ``b`` equals
    ``bench.metrics.<name>(probs[idx[b]], labels[idx[b]])`` for the sorted index row
    ``idx[b]`` with those counts (float rounding aside); undefined values are NaN.  The
    default metrics (``CLASSIFICATION_METRICS``) are vectorised; any other registered metric
    is evaluated exactly by a loop over resamples (slow, but correct).
    """
    probs, labels = _check_probs_labels(probs, labels)
    w = _check_weights(weights, labels.shape[0])
    fast = _CLASSIFICATION.get(name)
    if fast is not None:
        return fast(probs, labels, w)
    fn = METRICS.get(name)  # unknown names raise, listing the known ones
    if METRIC_INFO[name].family != "classification":
        raise ValueError(f"{name!r} is an OOD metric: use boot_ood_metric")
    n = labels.shape[0]
    out = np.empty(w.shape[0])
    for b in range(w.shape[0]):
        rep = np.repeat(np.arange(n), w[b])
        out[b] = fn(probs[rep], labels[rep])
    return out


# ------------------------------------------------------------------------ OOD metrics


def _ood_curve(s_id, s_ood, w_id, w_ood, fn, ood_positive: bool) -> np.ndarray:
    """``fn`` on the ID-vs-OOD curve of every resample (ID and OOD counts side by side)."""
    is_id = np.concatenate((np.ones(s_id.shape[0], bool), np.zeros(s_ood.shape[0], bool)))
    score = np.concatenate((s_id, s_ood))
    groups = _Groups(~is_id, -score) if ood_positive else _Groups(is_id, score)
    return np.array(
        [fn(*groups.cumulative(np.concatenate((a, b)))) for a, b in zip(w_id, w_ood)], dtype=np.float64
    )


def _boot_ood_auroc(s_id, s_ood, w_id, w_ood):
    return _ood_curve(s_id, s_ood, w_id, w_ood, _auroc_from_cumulative, False)


def _boot_ood_aupr_in(s_id, s_ood, w_id, w_ood):
    return _ood_curve(s_id, s_ood, w_id, w_ood, _average_precision_from_cumulative, False)


def _boot_ood_aupr_out(s_id, s_ood, w_id, w_ood):
    return _ood_curve(s_id, s_ood, w_id, w_ood, _average_precision_from_cumulative, True)


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


_OOD: dict[str, Callable[..., np.ndarray]] = {
    "ood_auroc": _boot_ood_auroc,
    "ood_aupr_in": _boot_ood_aupr_in,
    "ood_aupr_out": _boot_ood_aupr_out,
    "ood_fpr95": _boot_ood_fpr95,
}


def boot_ood_metric(
    name: str, scores_id: np.ndarray, scores_ood: np.ndarray, w_id: np.ndarray, w_ood: np.ndarray
) -> np.ndarray:
    """OOD metric ``name`` on every bootstrap resample: ``[B]`` float64.

    ``scores_id`` ``[N1]``, ``scores_ood`` ``[N2]`` (higher = more ID); ``w_id`` ``[B, N1]``
    and ``w_ood`` ``[B, N2]`` are count vectors drawn independently (ID and OOD are
    separate samples), each shared by every method evaluated on those splits.  Entry ``b``
    equals ``bench.metrics.<name>(scores_id[idx_id[b]], scores_ood[idx_ood[b]])``.  Default
    metrics (``OOD_METRICS``) are vectorised; other registered ones are looped over exactly.
    """
    s_id, s_ood = _check_scores(scores_id, scores_ood)
    w_id = _check_weights(w_id, s_id.shape[0], "w_id")
    w_ood = _check_weights(w_ood, s_ood.shape[0], "w_ood")
    if w_id.shape[0] != w_ood.shape[0]:
        raise ValueError(f"w_id and w_ood need the same number of resamples, got {w_id.shape[0]} and {w_ood.shape[0]}")
    fast = _OOD.get(name)
    if fast is not None:
        return fast(s_id, s_ood, w_id, w_ood)
    fn = METRICS.get(name)
    if METRIC_INFO[name].family != "ood":
        raise ValueError(f"{name!r} is a classification metric: use boot_metric")
    out = np.empty(w_id.shape[0])
    for b in range(w_id.shape[0]):
        out[b] = fn(np.repeat(s_id, w_id[b]), np.repeat(s_ood, w_ood[b]))
    return out


# -------------------------------------------------------------- intervals and tests


def bootstrap_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval ``(low, high)`` of bootstrap values ``[B]``, NaN ignored.

    Bounds are ``np.percentile`` (linear interpolation) at ``(1 - level)/2`` and
    ``(1 + level)/2``; ``(nan, nan)`` when no value is finite.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[~np.isnan(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    low, high = np.percentile(v, [50.0 * (1.0 - level), 50.0 * (1.0 + level)])
    return float(low), float(high)


def seed_mean_distribution(per_seed: Sequence[np.ndarray]) -> np.ndarray:
    """Bootstrap distribution ``[B]`` of the mean over seeds.

    ``per_seed[s][b]`` is seed ``s``'s metric on resample ``b``; every seed must use the
    same resamples (same count matrix), so entry ``b`` is the seed-mean on one resampled
    test set and its percentiles give the CI of the seed-mean.  The trained seeds are held
    fixed: the interval covers test-sample noise, not the variation of training new seeds.
    A NaN in any seed makes that resample NaN (then ignored by :func:`bootstrap_ci`).
    """
    if len(per_seed) == 0:
        raise ValueError("per_seed must hold at least one seed")
    arrays = [np.asarray(a, dtype=np.float64) for a in per_seed]
    if any(a.ndim != 1 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
        raise ValueError(f"per_seed must be 1-D arrays of one length, got shapes {[a.shape for a in arrays]}")
    return np.mean(np.stack(arrays), axis=0)


def paired_test(diff: np.ndarray, observed: float) -> float:
    """Two-sided paired bootstrap p-value for "difference = 0".

    ``diff`` ``[B]``: metric(method) - metric(reference) on each shared resample;
    ``observed``: the same difference on the full split.  With B' finite values and
    ``opposite`` = #{b : diff[b] * sign(observed) <= 0} (resamples at or beyond zero on the
    side opposite the observed effect),

        p = min(1, 2 * (1 + opposite) / (B' + 1)).

    This doubles a one-sided bootstrap tail with the usual +1 correction (never 0; the
    smallest value is 2/(B'+1), ~0.002 for B = 1000), and agrees with the percentile CI:
    the equal-tailed (1 - a) interval of ``diff`` excludes 0 about when p <= a.
    ``observed == 0`` gives p = 1.  NaN when ``observed`` is NaN or no ``diff`` is finite.
    """
    d = np.asarray(diff, dtype=np.float64).ravel()
    d = d[~np.isnan(d)]
    if d.size == 0 or np.isnan(observed):
        return float("nan")
    opposite = int(np.count_nonzero(d * np.sign(observed) <= 0))
    return float(min(1.0, 2.0 * (1 + opposite) / (d.size + 1)))


def paired_z_test(diff: np.ndarray, observed: float) -> float:
    """Two-sided paired bootstrap z-test for "difference = 0": p = 2 Phi(-|observed| / se),
    with ``se`` the standard deviation of the paired bootstrap differences ``diff`` [B].

    Unlike :func:`paired_test`, whose p-value cannot fall below 2/(B+1), this one is not
    floored by the number of resamples, so it survives a Holm correction over the tens of
    comparisons of one table (2/(B+1) x 60 comparisons > 0.05 for B = 1000).  It assumes
    the bootstrap distribution of the difference is roughly normal.  ``observed == 0`` gives
    p = 1; a zero ``se`` with a non-zero difference gives p = 0; NaN without finite ``diff``."""
    d = np.asarray(diff, dtype=np.float64).ravel()
    d = d[np.isfinite(d)]
    if d.size < 2 or not np.isfinite(observed):
        return float("nan")
    if observed == 0:
        return 1.0
    se = float(d.std(ddof=1))
    if se == 0.0:
        return 0.0
    from scipy.stats import norm

    return float(min(1.0, 2.0 * norm.sf(abs(observed) / se)))


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (step-down), in the input order.

    With the m finite p-values sorted ascending p_(1) <= ... <= p_(m):
    adj_(i) = min(1, max_{j <= i} (m - j + 1) p_(j)), so adjusted values are monotone in
    the raw ones and capped at 1.  NaN entries stay NaN and are not counted in m.
    Reject H_(i) at family-wise level a when adj_(i) <= a.
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"p_values must be 1-D, got shape {p.shape}")
    finite = ~np.isnan(p)
    q = p[finite]
    if np.any((q < 0) | (q > 1)):
        raise ValueError("p-values must lie in [0, 1]")
    m = q.shape[0]
    order = np.argsort(q, kind="stable")
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * q[order]))
    out = np.full(p.shape, np.nan)
    out[finite] = adjusted
    return out
