"""Classification metrics on ``(probs, labels)``: accuracy, MCC, NLL and Brier.

Conventions
    * Accuracy and MCC: prediction = ``argmax`` (ties -> lowest class index).
    * NLL: probabilities are clamped below at ``np.finfo(np.float64).tiny`` so a zero
      probability on the true class gives a large finite value (about 708.4), not inf.
    * Brier: squared error summed over classes, averaged over samples (range [0, 2]).

The vectorised bootstrap kernels stand just above the metrics they evaluate.
"""
from __future__ import annotations

import numpy as np

from bench.metrics.inputs import check_probs_labels, confidence_correct
from bench.metrics.record import metric
from bench.metrics.resample import chunks


def _weighted_mean(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sum_i w[b, i] x[i] / sum_i w[b, i]`` for every row ``b``."""
    out = np.empty(w.shape[0])
    for rows in chunks(w.shape[0], w.shape[1]):
        wr = w[rows].astype(np.float64)
        out[rows] = (wr @ x) / wr.sum(axis=1)
    return out


def _boot_accuracy(probs, labels, w):
    _, correct = confidence_correct(probs, labels)
    return _weighted_mean(correct.astype(np.float64), w)


@metric(
    'classification', 'ACC', '%', True,
    'Top-1 accuracy, argmax prediction (ties to the lowest class).',
    bootstrap=_boot_accuracy, selections={"paper": 0, "default": 0, "shift": 0, "severity": 0},
)
def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy in [0, 1].

    ``probs`` [N, C], ``labels`` [N] int.  Prediction = ``argmax`` (ties -> lowest index).
    """
    _, correct = confidence_correct(probs, labels)
    return float(correct.mean())


@metric(
    "classification", "MCC", "x100", True,
    "Matthews correlation of argmax prediction and label, multi-class (Gorodkin's R_K), 0 "
    "when undefined (CoLA's metric).",
    bounds=(-1.0, 1.0),
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
    bounds=(-1.0, 1.0),
)
def mcc_per_batch(probs: np.ndarray, labels: np.ndarray) -> float:
    """The mean of :func:`mcc` over consecutive batches of :data:`MCC_BATCH` samples, as
    KEP-SVGP's ``CoLA/valid.py`` averages sklearn's MCC over its test batches."""
    probs, labels = check_probs_labels(probs, labels)
    starts = range(0, len(labels), MCC_BATCH)
    return float(np.mean([mcc(probs[i:i + MCC_BATCH], labels[i:i + MCC_BATCH]) for i in starts]))


def _boot_nll(probs, labels, w):
    p_true = np.asarray(probs, dtype=np.float64)[np.arange(labels.shape[0]), labels]
    return _weighted_mean(-np.log(np.maximum(p_true, np.finfo(np.float64).tiny)), w)


@metric(
    'classification', 'NLL', 'x10', False,
    'Mean -log p(true class) in nats, clamped at the float64 tiny value.',
    bootstrap=_boot_nll, selections={"paper": 5, "default": 5, "shift": 2, "severity": 2},
    bounds=(0.0, np.inf),
)
def nll(probs: np.ndarray, labels: np.ndarray) -> float:
    """Negative log-likelihood in nats: -(1/N) sum_i log p[i, y_i].

    ``probs`` [N, C], ``labels`` [N] int.  The true-class probability is clamped below at
    ``np.finfo(np.float64).tiny`` (~2.2e-308), so a zero gives ~708.4 per sample, not inf.
    """
    probs, labels = check_probs_labels(probs, labels)
    p_true = np.asarray(probs, dtype=np.float64)[np.arange(labels.shape[0]), labels]
    return float(-np.log(np.maximum(p_true, np.finfo(np.float64).tiny)).mean())


def _boot_brier(probs, labels, w):
    p = np.asarray(probs, dtype=np.float64)
    p_true = p[np.arange(labels.shape[0]), labels]
    per_sample = np.maximum(np.einsum("ij,ij->i", p, p) - 2.0 * p_true + 1.0, 0.0)
    return _weighted_mean(per_sample, w)


@metric(
    'classification', 'Brier', 'x100', False,
    'Squared error to the one-hot label summed over classes, mean over samples (range '
    '[0, 2]).',
    bootstrap=_boot_brier, selections={"paper": 6, "default": 6, "shift": 3},
    bounds=(0.0, 2.0),
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


# Brier's top-label variant scores the confidence alone and is registered as a
# calibration metric.
@metric(
    'calibration', 'Brier-top', 'x100', False,
    'Mean (c - 1[correct])^2 of the top-class confidence (TorchUncertainty top_class).',
    bounds=(0.0, 1.0),
)
def brier_top_label(probs: np.ndarray, labels: np.ndarray) -> float:
    """Top-label Brier score: (1/N) sum_i (c_i - 1[prediction i correct])^2, range [0, 1].

    ``probs`` [N, C], ``labels`` [N] int; c = max probability (TorchUncertainty
    ``BrierScore(top_class=True)``).
    """
    conf, correct = confidence_correct(probs, labels)
    return float(np.mean((conf - correct) ** 2))
