"""What every metric accepts, and the checks that enforce it.

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

A metric added by a plugin validates its inputs with the same checks
(:func:`check_probs_labels`, :func:`check_scores`).

Every registered metric, bootstrap kernel and OOD score receives its arrays read-only
(:func:`read_only`): the same arrays go to every metric and score of a cell, so one that
edited them in place (a plugin's bug) would change what the others compute; writing to
one raises ``ValueError`` instead, which analysis reports as that metric's or score's
error.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np


def read_only(value: Any) -> Any:
    """``value`` as a metric or score receives it: a numpy array as a read-only view of the
    same data (no copy; writing to it raises ``ValueError``), a mapping (a split's stored
    arrays) as a read-only mapping of such views; anything else unchanged."""
    if isinstance(value, np.ndarray):
        view = value.view()
        view.flags.writeable = False
        return view
    if isinstance(value, Mapping):
        return MappingProxyType({k: read_only(v) for k, v in value.items()})
    return value


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
    check_probability_values(probs, "probs")
    if labels.min() < 0 or labels.max() >= n_classes:
        raise ValueError(
            f"labels must lie in [0, {n_classes}), got values in [{labels.min()}, {labels.max()}]"
        )
    return probs, labels


def check_probability_values(probs: np.ndarray, name: str) -> None:
    """Raise ``ValueError`` unless ``probs`` (non-empty) is real, finite and in [0, 1]."""
    if not (np.issubdtype(probs.dtype, np.floating) or np.issubdtype(probs.dtype, np.integer)):
        raise ValueError(f"{name} must be a real numeric array, got dtype {probs.dtype}")
    if not np.all(np.isfinite(probs)):
        raise ValueError(f"{name} contains NaN or inf")
    if probs.min() < 0 or probs.max() > 1:
        raise ValueError(
            f"{name} must lie in [0, 1], got values in [{probs.min()}, {probs.max()}]"
        )


def confidence_correct(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
