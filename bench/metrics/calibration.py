"""Calibration metrics on ``(probs, labels)``: the reliability bins, ECE and its variants.

Conventions
    * ECE: top-label, ``n_bins`` equal-width bins with edges ``linspace(0, 1, n_bins + 1)``;
      a sample is in bin m when ``lo < c <= hi`` (``(lo, hi]``), so ``c = 1.0`` is in the
      last bin and ``c = 0`` goes to the first.  The edges are the float32 values of
      ``torch.linspace(0, 1, 16)`` that the reference's ``calc_ece`` uses, compared with the
      confidence in float64 (as torch promotes), so float32 softmax outputs -- and float64
      ones -- fall into exactly the reference's bins, also at 8/15, 0.6 and 2/3, where
      torch's edges sit one float32 step below ``float32(k/15)``; the sums are float64.
      Empty bins contribute 0.
    * Variants (``docs/reference/metrics.md`` section 2): the same per-bin statistics under
      another binning (:data:`BINNINGS`), over every class probability instead of the top
      label (:data:`CALIBRATION_TARGETS`), reduced by another norm (MCE: max, RMSCE: L2),
      or with the plug-in estimator's bias removed (:func:`ece_debiased`).  Each is
      registered under its own name and its docstring states its convention exactly.

The reliability bins (:func:`calibration_bins` and the helpers it calls) serve every
calibration error here and the reliability diagram.  The vectorised bootstrap kernels
of ECE and debiased ECE stand just above them.
"""
from __future__ import annotations

import numpy as np

from bench.metrics.inputs import check_probs_labels
from bench.metrics.record import metric
from bench.metrics.resample import chunks


# ----------------------------------------------------------------------- reliability bins


#: Binning schemes of :func:`calibration_bins` (``docs/reference/metrics.md`` section 2).
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


# ------------------------------------------------------------------- ECE and debiased ECE


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


@metric(
    'calibration', 'ECE', '%', False,
    'Top-label ECE, 15 (lo, hi] bins on the float32 edges of torch.linspace(0, 1, 16), '
    'compared in float64, confidence 1.0 in the last bin: KEP-SVGP calc_ece bin for bin, '
    'for float32 and float64 inputs.',
    bootstrap=_boot_ece, selections={"paper": 4, "default": 4, "shift": 1, "severity": 1},
    interval='Interval approximate: measured coverage 92-97% when the model is miscalibrated by a few '
             'points, 37-47% for a calibrated one (true ECE 0, where the upward bias is largest) '
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


@metric(
    'calibration', 'ECE-debiased', '%', False,
    "ECE's 15 (lo, hi] bins with Kumar et al. (2019)'s normal bias correction in closed "
    'form: per bin 2|acc - conf| - E|acc - conf + sZ|, s^2 = acc(1 - acc)/n_m (the '
    "infinite-resample limit of uncertainty-calibration's normal_debiased_ce); may be "
    'slightly negative.',
    bootstrap=_boot_ece_debiased, selections={"default": 4.5, "shift": 1.5, "severity": 1.5},
    interval='Interval approximate: measured coverage 94-97% when the model is miscalibrated by a few '
             'points, 56-66% for a calibrated one (true ECE 0, which the estimate itself overshoots by about '
             '1.5 points at 1,000 test images) (reports/perf/coverage.md).',
    bias_corrected=True,
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
    confidence lying exactly on an edge bins as in torchmetrics.  The bin sums run in
    float64; torchmetrics sums each bin in float32 (``scatter_add_``), whose round-off grows
    with a bin's count: up to 2.5e-5 apart on about 4,700 tied confidences (measured against
    torchmetrics, docs/fidelity.md), 4.2e-5 when 4,700 equal confidences 0.9 fill one bin
    (``tests/bench/metrics/test_conventions.py``).  Otherwise equals torchmetrics'
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
