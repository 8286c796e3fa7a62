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
    Two sources of variation stand behind a seed-mean: the training seeds and the test
    samples, crossed (every seed is evaluated on the same test set).  A reader who re-runs
    the benchmark draws new seeds and, in effect, a new test set: the variance of a
    seed-mean is then sigma_seed^2 / S + sigma_image^2 / N + sigma_own^2 / (S N), the last
    term being each seed's own errors on particular test images.  Two measured quantities
    estimate it: the spread of the S per-seed values on the full test set (s^2 estimates
    sigma_seed^2 + sigma_own^2 / N, so s^2 / S is the first and last term) and the test
    images' shared part sigma_image^2 / N, which is the bootstrap variance of the
    seed-mean over test samples with the seeds held fixed (:func:`seed_mean_distribution`,
    V_T = sigma_image^2 / N + sigma_own^2 / (S N)) less the seeds' own part; with V_s the
    mean of each seed's own bootstrap variance (sigma_image^2 / N + sigma_own^2 / N),
    sigma_own^2 / (S N) = (V_s - V_T) / (S - 1).  So the variance is
    s^2 / S + V_T - (V_s - V_T) / (S - 1).  Adding s^2 / S to V_T without the correction
    would count each seed's own errors twice and cover about 99% instead of 95% where they
    dominate (as for accuracy).  The estimate is referred to a t distribution with S - 1
    degrees of freedom (the smaller S - 1 of two methods: the lower bound of the
    Welch-Satterthwaite df, as in Hsu's conservative Welch test), the bootstrap part
    counted as exact.  With three seeds the plug-in Welch-Satterthwaite df is
    anticonservative (an unluckily small s^2 shrinks the interval and raises its df at
    once: 91-93% coverage and 5-7% false positives in the coverage study), and a bootstrap
    over the seeds would shrink their variance by 2/3 and use normal quantiles where t with
    2 degrees of freedom has 4.3 instead of 1.96.  The centre is the point
    estimate minus the bootstrap's bias estimate (mean of the distribution minus the
    point), which moves a biased statistic such as plug-in ECE back towards the truth
    instead of leaving its interval beside the estimate; a metric whose estimate is
    bias-corrected by construction (``bias_corrected``: the ``bias_corrected`` field of its
    ``bench.metrics.Metric``, e.g. the debiased ECE) is centred on the point estimate:
    correcting it a second time adds the noise of the bias estimate to the centre, which the
    standard error does not count, and its test fired too often.
    ``benchmarks/coverage.py`` measures the coverage of the intervals and the
    false-positive rate of the tests.

    :func:`seed_mean` gives one seed-mean (its interval), :func:`difference` a difference
    to the reference (its two-sided test; paired over seeds where both methods were
    trained from the same seeds, Welch otherwise) and :func:`seeds_needed` the number of
    seeds per method at which a difference of the observed size would be marked with 80%
    power in a Holm family of ``family`` comparisons.  Where one side is a single run (one
    seed, one ensemble replicate), its seed variance cannot be measured: the result says so (``measured = False``) and uses
    what can be measured.  :func:`paired_z_test` is the test-sample-only z-test (seeds held
    fixed), kept as the ``samples_seeds_fixed`` option; :func:`bootstrap_ci` the
    percentile interval; :func:`holm` the Holm-Bonferroni adjustment across the
    comparisons of one table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from bench.metrics import check_probs_labels, check_scores, get_metric
from bench.metrics.inputs import read_only
from bench.metrics.resample import chunks

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
    "SIGNIFICANCE_TESTS",
    "TwoLevel",
    "seed_mean",
    "difference",
    "seeds_needed",
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
    for rows in chunks(n_resamples, n):  # bounded memory; same stream as one big draw
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
    probs, labels = check_probs_labels(probs, labels)
    w = _check_weights(weights, labels.shape[0])
    if m.bootstrap is not None:
        return m.bootstrap(read_only(probs), read_only(labels), read_only(w))
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
    s_id, s_ood = check_scores(scores_id, scores_ood)
    w_id = _check_weights(w_id, s_id.shape[0], "w_id")
    w_ood = _check_weights(w_ood, s_ood.shape[0], "w_ood")
    if w_id.shape[0] != w_ood.shape[0]:
        raise ValueError(f"w_id and w_ood need the same number of resamples, got {w_id.shape[0]} and {w_ood.shape[0]}")
    if m.bootstrap is not None:
        return m.bootstrap(*map(read_only, (s_id, s_ood, w_id, w_ood)))
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


# ------------------------------------------------------ seeds and test samples together

SEEDS_AND_SAMPLES = "seeds_and_samples"  # default: seed-level variance + paired test-sample bootstrap
SAMPLES_SEEDS_FIXED = "samples_seeds_fixed"  # paired bootstrap z-test over test samples, seeds fixed
#: The tests behind a significance mark (``bench.analysis`` option ``significance``).
SIGNIFICANCE_TESTS = (SEEDS_AND_SAMPLES, SAMPLES_SEEDS_FIXED)

Units = Mapping[int, float]  # seed (or replicate) -> the metric on the full split
Boots = Mapping[int, np.ndarray]  # seed -> the metric on every resample [B] (shared resamples)


@dataclass(frozen=True)
class TwoLevel:
    """A seed-mean (or a difference of two) with both sources of variation.

    ``center``: point estimate minus the test-sample bootstrap's bias estimate (the point
    estimate itself for a metric whose estimate is bias-corrected by construction); ``se``:
    sqrt(test-sample variance + seed-level variance of the mean); ``df``: its degrees of
    freedom (S - 1, the smaller of two sides; ``inf`` when no seed-level part was
    measured); ``measured``:
    every side's seed variance was measured (at least two finite units each).  NaN
    ``center``/``se`` when the bootstrap has fewer than two finite values.
    """

    center: float
    se: float
    df: float
    measured: bool

    def _quantile(self, q: float) -> float:
        from scipy.stats import norm, t

        return float(norm.ppf(q) if not np.isfinite(self.df) else t.ppf(q, self.df))

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must lie in (0, 1), got {level!r}")
        if not (np.isfinite(self.center) and np.isfinite(self.se)):
            return float("nan"), float("nan")
        half = self._quantile(0.5 + level / 2.0) * self.se
        return self.center - half, self.center + half

    def p_value(self) -> float:
        """Two-sided p-value of "the quantity is 0"; NaN (no test) when nothing varied
        (``se`` 0: e.g. two methods whose per-seed values agree and whose resamples differ
        by float rounding only, where a centre of 1e-17 must not read as a sure difference)."""
        from scipy.stats import norm, t

        if not (np.isfinite(self.center) and np.isfinite(self.se)):
            return float("nan")
        if self.center == 0.0:
            return 1.0
        if self.se == 0.0:
            return float("nan")
        z = abs(self.center) / self.se
        return float(min(1.0, 2.0 * (norm.sf(z) if not np.isfinite(self.df) else t.sf(z, self.df))))


@dataclass(frozen=True)
class _Side:
    """The units of one mean: finite values [S] and their bootstrap rows [S, B]."""

    values: np.ndarray
    boot: np.ndarray

    @classmethod
    def of(cls, units: Units, boots: Boots, seeds: Sequence[int] | None = None) -> _Side:
        keys = [k for k in (sorted(units) if seeds is None else seeds) if np.isfinite(units[k])]
        b = len(next(iter(boots.values()))) if boots else 0
        return cls(np.array([units[k] for k in keys], dtype=np.float64),
                   np.array([boots[k] for k in keys], dtype=np.float64).reshape(len(keys), b))

    def __sub__(self, other: _Side) -> _Side:
        return _Side(self.values - other.values, self.boot - other.boot)

    @property
    def n(self) -> int:
        return int(self.values.size)

    def mean_dist(self) -> np.ndarray:
        """Bootstrap distribution [B] of the mean over units (NaN where a unit is NaN)."""
        return self.boot.mean(axis=0) if self.n else np.full(self.boot.shape[1], np.nan)

    def own(self) -> float:
        """The part of the mean's bootstrap variance that is the units' own test-sample
        noise, (mean_s var(boot_s) - var(mean of boot)) / (S - 1) (sigma_own^2 / (S N) of
        the module docstring; it is also in the units' spread); 0 below two units."""
        if self.n < 2:
            return 0.0
        each = float(np.mean([_variance(row) for row in self.boot]))
        return max(0.0, (each - _variance(self.mean_dist())) / (self.n - 1))

    def seed_part(self, seeds: int | None = None) -> tuple[float, float]:
        """``(s^2 / S, S - 1)``: the variance of the mean from the units' spread (seed-level
        variation and each unit's own test-sample noise) with ``seeds`` units (default: as
        many as measured); ``(nan, 0)`` below two units."""
        if self.n < 2:
            return float("nan"), 0.0
        s = self.n if seeds is None else seeds
        return float(self.values.var(ddof=1)) / s, float(s - 1)


def _variance(values: np.ndarray) -> float:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.var(ddof=1)) if v.size >= 2 else float("nan")


def _combine(test_variance: float, spreads: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(se, df)`` of a test-sample variance (exact) plus the measured seed-level
    ``(variance, df)`` parts: se^2 = the sum; df = the smallest df of the parts (the lower
    bound of the Welch-Satterthwaite df), ``inf`` when no part was measured."""
    parts = [(v, df) for v, df in spreads if np.isfinite(v)]
    variance = test_variance + sum(v for v, _ in parts)
    return float(np.sqrt(variance)), min((df for _, df in parts), default=float("inf"))


def _estimate(point: float, dist: np.ndarray, sides: Sequence[_Side], bias_corrected: bool) -> TwoLevel:
    """``point`` (a mean, or a difference of means) with its test-sample bootstrap ``dist``
    [B] and the seed-level parts of ``sides`` (module docstring); centred on ``point`` when
    ``bias_corrected`` (the metric's estimate needs no bootstrap bias correction), else on
    ``point`` less the bootstrap's bias estimate."""
    d = np.asarray(dist, dtype=np.float64)
    d = d[np.isfinite(d)]
    measured = all(side.n >= 2 for side in sides)
    if d.size < 2 or not np.isfinite(point):
        return TwoLevel(float("nan"), float("nan"), float("nan"), measured)
    shared = max(0.0, float(d.var(ddof=1)) - sum(side.own() for side in sides))  # the images' part
    se, df = _combine(shared, [side.seed_part() for side in sides])
    center = float(point) if bias_corrected else 2.0 * float(point) - float(d.mean())
    return TwoLevel(center, se, float(df), measured)


def _sides(units_a: Units, boots_a: Boots, units_b: Units, boots_b: Boots, paired: bool) -> list[_Side]:
    """The independent seed-level parts of mean(a) - mean(b): the per-seed differences
    when ``paired`` and both have the same seeds, else each side."""
    if paired and set(units_a) == set(units_b):
        seeds = [k for k in sorted(units_a) if np.isfinite(units_a[k]) and np.isfinite(units_b[k])]
        return [_Side.of(units_a, boots_a, seeds) - _Side.of(units_b, boots_b, seeds)]
    return [_Side.of(units_a, boots_a), _Side.of(units_b, boots_b)]


def seed_mean(units: Units, boots: Boots, *, bias_corrected: bool = False) -> TwoLevel:
    """A seed-mean with both sources of variation (``.interval()`` is its CI).

    ``units``: seed -> the metric on the full split; ``boots``: seed -> the metric on
    every resample of that split (one resample matrix shared by the seeds).  With one unit
    only the test-sample noise is measured (``measured`` False).  ``bias_corrected``: the
    metric's estimate is bias-corrected by construction, so the centre is the seed-mean
    itself (no bootstrap bias correction)."""
    side = _Side.of(units, boots)
    return _estimate(float(side.values.mean()) if side.n else float("nan"), side.mean_dist(), [side],
                     bias_corrected)


def difference(units_a: Units, boots_a: Boots, units_b: Units, boots_b: Boots, paired: bool, *,
               bias_corrected: bool = True) -> TwoLevel:
    """mean(a) - mean(b) with both sources of variation (``.p_value()`` tests it against 0).

    ``units_*``/``boots_*`` as for :func:`seed_mean`, on the same resamples (the test-sample
    part is paired); ``paired`` = both are keyed by the same training seeds (then the
    seed-level part is the spread of the per-seed differences, else Welch's two spreads).
    Centred on the observed difference: under the null of two equal methods both sides
    carry the same estimator bias, so the bootstrap's bias estimate of the difference only
    adds noise the standard error does not count (plug-in ECE's test fired in 8.7% of
    simulated nulls with it, at most 5.7% without: reports/perf/coverage.md).
    ``bias_corrected=False`` subtracts that estimate as :func:`seed_mean` does (kept for
    the coverage study's comparison)."""
    a, b = _Side.of(units_a, boots_a), _Side.of(units_b, boots_b)
    point = float(a.values.mean() - b.values.mean()) if a.n and b.n else float("nan")
    return _estimate(point, a.mean_dist() - b.mean_dist(), _sides(units_a, boots_a, units_b, boots_b, paired),
                     bias_corrected)


def seeds_needed(units_a: Units, boots_a: Boots, units_b: Units, boots_b: Boots, paired: bool, *,
                 family: int = 1, alpha: float = 0.05, power: float = 0.8,
                 most: int = 1000) -> float:
    """Seeds per method at which a true difference equal to the observed one would be
    marked with probability ``power`` in a Holm family of ``family`` comparisons: its p-value
    below ``alpha / family`` (two-sided), which is what Holm asks of the family's smallest
    p-value (the one comparison that differs among ``family``); ``family`` 1 is the test
    without a multiplicity correction.  The smallest S >= 2 with
    |d| / se(S) >= t_{1 - alpha/(2 family)} + t_{power} (t with S - 1 df; d = the
    observed difference, as :func:`difference` centres it).
    se(S) keeps the measured variance components and scales the ones that shrink with more
    seeds: the spread of the per-seed values (seed-level variance and each seed's own
    test-sample errors) by 1/S, the test images' shared part not at all.  The spread enters
    as (s / c4(k))^2, the square of the unbiased estimate of its standard deviation from k
    measured values (c4(k) = sqrt(2 / (k - 1)) Gamma(k / 2) / Gamma((k - 1) / 2): 0.886 for
    k = 3, 0.940 for 5, 0.973 for 10), not as s^2: s^2 on k - 1 = 2 df falls below sigma^2
    in most draws (its median is 0.69 sigma^2), and with the plain s^2 the median count
    read from 3 seeds was 0.64-0.73 of the simulated count for a 1-point gain; with s / c4
    the median lies within 0.84-1.10 of it from 3, 5 or 10 seeds (reports/perf/coverage.md,
    6,000 simulated benchmarks), closer than with s^2 or a median-unbiased s^2 (which
    overshoots to 1.23 for a 2-point gain read from 3 seeds).
    ``inf`` when no count up to ``most`` reaches it; NaN when a seed variance could not be
    measured, the difference is undefined or nothing varied."""
    from scipy.stats import t

    if isinstance(family, bool) or not isinstance(family, (int, np.integer)) or family < 1:
        raise ValueError(f"family must be a positive integer (the comparisons Holm corrects over), got {family!r}")
    now = difference(units_a, boots_a, units_b, boots_b, paired)
    if not now.measured or not np.isfinite(now.center):
        return float("nan")
    if now.center == 0.0:
        return float("inf")  # no difference: no seed count makes one significant
    if now.se == 0.0:
        return float("nan")  # nothing varied: no test (TwoLevel.p_value)
    sides = _sides(units_a, boots_a, units_b, boots_b, paired)
    spread = sum(side.seed_part(1)[0] / _c4(side.n) ** 2 for side in sides)  # the sides' (s / c4)^2, summed
    shared = now.se ** 2 - sum(side.seed_part()[0] for side in sides)  # the test images' part
    seeds = np.arange(2, most + 1)
    se = np.sqrt(shared + spread / seeds)  # se(S); df = S - 1, as _combine gives
    critical = t.ppf(1 - alpha / (2 * family), seeds - 1)
    reached = np.flatnonzero(abs(now.center) >= (critical + t.ppf(power, seeds - 1)) * se)
    return float(seeds[reached[0]]) if reached.size else float("inf")


def _c4(k: int) -> float:
    """c4(k) = E[s] / sigma for the sample sd s of k >= 2 normal values (s / c4 is unbiased)."""
    from scipy.special import gammaln

    return float(np.sqrt(2.0 / (k - 1)) * np.exp(gammaln(k / 2.0) - gammaln((k - 1) / 2.0)))
