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


def squares_split(n: int, rng: np.random.Generator, side: int = 10):
    """``n`` grayscale ``side x side`` noise images with a bright 3x3 square whose corner
    (top-left, top-right, bottom-left) encodes one of 3 classes: learnable in a few epochs."""
    from bench.data import Split

    corners = [(1, 1), (1, side - 4), (side - 4, 1)]
    y = rng.integers(0, 3, n)
    x = rng.integers(0, 60, (n, side, side)).astype(np.uint8)
    for i, c in enumerate(y):
        r, col = corners[c]
        x[i, r : r + 3, col : col + 3] = 250
    return Split(x, y.astype(np.int64))


def squares_bundle(sizes: tuple[int, int, int] = (150, 60, 60), seed: int = 0, side: int = 10):
    """A 3-class DataBundle of :func:`squares_split` train/val/test splits of ``sizes``;
    normalisation from the train split."""
    from bench.data import DataBundle

    rng = np.random.default_rng(seed)
    splits = {name: squares_split(n, rng, side) for name, n in zip(("train", "val", "test"), sizes)}
    tr = splits["train"].x / 255.0
    return DataBundle("squares", 3, (side, side, 1), (float(tr.mean()),), (float(tr.std()),),
                      {k: (lambda s=s: s) for k, s in splits.items()})
