"""Synthetic predictions shared by the metric, convention and bootstrap tests."""
from __future__ import annotations

import numpy as np


def make_case(n: int, c: int, seed: int, decimals: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Random softmax probabilities [n, c] and labels [n] (about 60-70% correct).

    ``decimals`` rounds the probabilities (heavy ties in confidence and in argmax, values
    on bin edges; rows then no longer sum exactly to 1, which the metrics allow).
    """
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=2.0, size=(n, c))
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    labels = np.where(rng.random(n) < 0.6, p.argmax(axis=1), rng.integers(0, c, n))
    if decimals is not None:
        p = np.round(p, decimals)
    return p, labels.astype(np.int64)
