"""Selective classification on ``(probs, labels)``: the risk-coverage curve and its areas.

A classifier that may abstain accepts its most confident samples (MSP) first: at coverage
i/N the selective risk is E_i / i, E_i = errors among the i most confident.  These metrics
are registered with kind ``failure``, as are the misclassification-detection metrics of
``bench.metrics.failure``.

Conventions
    * AURC: samples sorted by confidence, highest first, with a *stable* sort (ties keep
      their input order); AURC = (1/n) sum_i E_i / i, E_i = errors among the top i.
    * E-AURC = AURC - AURC*, AURC* = r + (1 - r) ln(1 - r), r = error rate (AURC* = 1 at r = 1).
    * Variants (``docs/reference/metrics.md`` section 3): the trapezoid and unique-threshold
      areas of TorchUncertainty and fd-shifts, the exact discrete optimum, the generalised
      risk (AUGRC) and single operating points (risk at 80% coverage, coverage at 5%
      risk), each registered under its own name with its convention in its docstring.

The vectorised bootstrap kernels of AURC and E-AURC stand just above them.
"""
from __future__ import annotations

import numpy as np

from bench.metrics.curves import BinaryCurve
from bench.metrics.inputs import confidence_correct
from bench.metrics.record import metric


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
    risk = _selective_risk(*confidence_correct(probs, labels))
    return np.arange(1, risk.shape[0] + 1) / risk.shape[0], risk


# ----------------------------------------------------------------------------------- AURC


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
    conf, correct = confidence_correct(probs, labels)
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


@metric(
    'failure', 'AURC', 'x1000', False,
    'Riemann mean of selective risk E_i/i over i = 1..N, MSP, stable sort (KEP-SVGP).',
    bootstrap=_boot_aurc, selections={"paper": 1, "default": 1, "shift": 4},
    bounds=(0.0, 1.0),
)
def aurc(probs: np.ndarray, labels: np.ndarray) -> float:
    """Area under the risk-coverage curve (Riemann mean), raw risk (not x1000).

    ``probs`` [N, C], ``labels`` [N] int.  Samples sorted by confidence (max prob),
    highest first, stable sort (ties keep input order); E_i = errors among the top i;
    AURC = (1/N) sum_{i=1..N} E_i / i.
    """
    return _aurc(*confidence_correct(probs, labels))


@metric(
    'failure', 'AURC-trap', 'x1000', False,
    "Trapezoid of selective risk over coverage [1/N, 1] divided by (1 - 1/N), MSP "
    "(TorchUncertainty; stable sort: TorchUncertainty's unstable argsort may order tied confidences, e.g. saturated 1.0, differently).",
    bounds=(0.0, 1.0),
)
def aurc_trapezoid(probs: np.ndarray, labels: np.ndarray) -> float:
    """TorchUncertainty's AURC: trapezoid of selective risk over coverage [1/N, 1], / (1 - 1/N).

    ``probs`` [N, C], ``labels`` [N] int.  Risks R_i = E_i / i as :func:`aurc` (stable
    sort by descending confidence) at coverages i/N; the trapezoid area over [1/N, 1] is
    divided by (1 - 1/N), i.e. (sum_i R_i - (R_1 + R_N)/2) / (N - 1).  NaN for N = 1.
    Raw risk (not x1000).
    """
    conf, correct = confidence_correct(probs, labels)
    n = conf.shape[0]
    if n < 2:
        return float("nan")
    risk = _selective_risk(conf, correct)
    return float(np.trapezoid(risk, np.arange(1, n + 1) / n) / (1.0 - 1.0 / n))


def _unique_threshold_counts(conf: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(k_g, E_g)`` per distinct confidence u_g, descending: samples with c >= u_g and the
    errors among them (tied confidences enter together; float64)."""
    curve = BinaryCurve(~correct, conf)  # errors are the "positives"
    return curve.tps + curve.fps, curve.tps


@metric(
    'failure', 'AURC-uniq', 'x1000', False,
    'Trapezoid over the RC curve at unique confidence thresholds (ties grouped) plus '
    '(0, top risk) (fd-shifts).',
    bounds=(0.0, 1.0),
)
def aurc_unique(probs: np.ndarray, labels: np.ndarray) -> float:
    """fd-shifts' AURC: trapezoid over the RC curve at unique confidence thresholds.

    ``probs`` [N, C], ``labels`` [N] int.  One point per distinct confidence u (tied
    samples accepted together, so input order never matters): coverage k/N and selective
    risk E/k, where k = #{c >= u} and E = errors among them; plus (coverage 0, the risk of
    the most confident group).  Area by the trapezoid rule over [0, 1].  Raw (fd-shifts
    reports x1000).
    """
    conf, correct = confidence_correct(probs, labels)
    accepted, errors = _unique_threshold_counts(conf, correct)
    risk = errors / accepted
    coverage = np.concatenate(([0.0], accepted / conf.shape[0]))
    return float(np.trapezoid(np.concatenate((risk[:1], risk)), coverage))


# --------------------------------------------------------------------------------- E-AURC


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
    conf, correct = confidence_correct(probs, labels)
    return _aurc(conf, correct) - float(_optimal_aurc(np.mean(~correct)))


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
    conf, correct = confidence_correct(probs, labels)
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
    conf, correct = confidence_correct(probs, labels)
    n = conf.shape[0]
    i = np.arange(1, n + 1, dtype=np.float64)
    oracle_errors = np.maximum(i - np.count_nonzero(correct), 0.0)  # E_i with all correct first
    return _aurc(conf, correct) - float(np.mean(oracle_errors / i))


# ---------------------------------------------------------------------------------- AUGRC


@metric(
    'failure', 'AUGRC', 'x1000', False,
    'Riemann mean of generalised risk E_i/N over i = 1..N, MSP, stable sort.',
    bounds=(0.0, 1.0),
)
def augrc(probs: np.ndarray, labels: np.ndarray) -> float:
    """AUGRC (Traub et al., NeurIPS 2024), Riemann mean: (1/N) sum_i E_i / N.

    ``probs`` [N, C], ``labels`` [N] int.  Generalised risk at coverage i/N = E_i / N (the
    probability of being accepted and wrong), E_i = errors among the i most confident
    (stable sort, as :func:`aurc`).  Range [0, 1]; raw (fd-shifts reports x1000).
    """
    conf, correct = confidence_correct(probs, labels)
    n = conf.shape[0]
    return float(np.mean(_sorted_errors(conf, correct)) / n)


@metric(
    'failure', 'AUGRC-trap', 'x1000', False,
    'Trapezoid over generalised risk E/N at unique thresholds plus (0, 0) (fd-shifts).',
    bounds=(0.0, 1.0),
)
def augrc_trapezoid(probs: np.ndarray, labels: np.ndarray) -> float:
    """fd-shifts' AUGRC: trapezoid over the generalised-risk curve at unique thresholds.

    ``probs`` [N, C], ``labels`` [N] int.  Points (k/N, E/N) for every distinct confidence
    u (k = #{c >= u}, E = errors among them; ties accepted together) plus (0, 0); area by
    the trapezoid rule over [0, 1] (fd-shifts ``RiskCoverageStats.augrc`` /
    ``generalized_risk_stats``).  Raw (fd-shifts reports x1000).
    """
    conf, correct = confidence_correct(probs, labels)
    n = conf.shape[0]
    accepted, errors = _unique_threshold_counts(conf, correct)
    coverage = np.concatenate(([0.0], accepted / n))
    return float(np.trapezoid(np.concatenate(([0.0], errors / n)), coverage))


# ----------------------------------------------------------------------- operating points


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
    conf, correct = confidence_correct(probs, labels)
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
    conf, correct = confidence_correct(probs, labels)
    errors = _sorted_errors(conf, correct)
    admissible = np.flatnonzero(20.0 * errors <= np.arange(1, errors.shape[0] + 1))
    if admissible.shape[0] == 0:
        return float("nan")
    return float((admissible[-1] + 1) / conf.shape[0])
