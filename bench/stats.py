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
    For every resample ``b`` and every metric with a vectorised kernel (the ``bootstrap``
    field of its ``bench.metrics.Metric``; the kernels live next to the metrics),
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
    :func:`paired_z_test` the two-sided test of "difference = 0" that analysis uses and :func:`holm`
    the Holm-Bonferroni adjustment across the comparisons of one table.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from bench.metrics import _check_probs_labels, _check_scores, _chunks, get_metric

__all__ = [
    "DEFAULT_RESAMPLES",
    "resample_weights",
    "index_matrix",
    "weights_from_index",
    "boot_metric",
    "boot_ood_metric",
    "bootstrap_ci",
    "seed_mean_distribution",
    "paired_z_test",
    "holm",
]

DEFAULT_RESAMPLES = 1000


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


def boot_metric(name: str, probs: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Classification metric ``name`` on every bootstrap resample: ``[B]`` float64.

    ``probs`` ``[N, C]`` and ``labels`` ``[N]`` as for ``bench.metrics``; ``weights``
    ``[B, N]`` non-negative integer counts (:func:`resample_weights`).  Entry ``b`` equals
    ``bench.metrics.<name>(probs[idx[b]], labels[idx[b]])`` for the sorted index row
    ``idx[b]`` with those counts (float rounding aside); undefined values are NaN.  The
    metric's ``bootstrap`` kernel is used where it has one; any other registered metric is
    evaluated exactly by a loop over resamples (slow, but correct).
    """
    m = get_metric(name)  # unknown names raise, listing the known ones
    if m.on_scores:
        raise ValueError(f"{name!r} is an OOD metric: use boot_ood_metric")
    probs, labels = _check_probs_labels(probs, labels)
    w = _check_weights(weights, labels.shape[0])
    if m.bootstrap is not None:
        return m.bootstrap(probs, labels, w)
    fn = m.fn
    n = labels.shape[0]
    out = np.empty(w.shape[0])
    for b in range(w.shape[0]):
        rep = np.repeat(np.arange(n), w[b])
        out[b] = fn(probs[rep], labels[rep])
    return out


# ------------------------------------------------------------------------ OOD metrics


def boot_ood_metric(
    name: str, scores_id: np.ndarray, scores_ood: np.ndarray, w_id: np.ndarray, w_ood: np.ndarray
) -> np.ndarray:
    """OOD metric ``name`` on every bootstrap resample: ``[B]`` float64.

    ``scores_id`` ``[N1]``, ``scores_ood`` ``[N2]`` (higher = more ID); ``w_id`` ``[B, N1]``
    and ``w_ood`` ``[B, N2]`` are count vectors drawn independently (ID and OOD are
    separate samples), each shared by every method evaluated on those splits.  Entry ``b``
    equals ``bench.metrics.<name>(scores_id[idx_id[b]], scores_ood[idx_ood[b]])``.  The
    metric's ``bootstrap`` kernel is used where it has one; other metrics are looped over
    exactly.
    """
    m = get_metric(name)
    if not m.on_scores:
        raise ValueError(f"{name!r} is a classification metric: use boot_metric")
    s_id, s_ood = _check_scores(scores_id, scores_ood)
    w_id = _check_weights(w_id, s_id.shape[0], "w_id")
    w_ood = _check_weights(w_ood, s_ood.shape[0], "w_ood")
    if w_id.shape[0] != w_ood.shape[0]:
        raise ValueError(f"w_id and w_ood need the same number of resamples, got {w_id.shape[0]} and {w_ood.shape[0]}")
    if m.bootstrap is not None:
        return m.bootstrap(s_id, s_ood, w_id, w_ood)
    fn = m.fn
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


def paired_z_test(diff: np.ndarray, observed: float) -> float:
    """Two-sided paired bootstrap z-test for "difference = 0": p = 2 Phi(-|observed| / se),
    with ``se`` the standard deviation of the paired bootstrap differences ``diff`` [B].

    Unlike a percentile-count p-value, which cannot fall below 2/(B+1), this one is not
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
