"""Synthetic predictions shared by the metric, convention and bootstrap tests."""
from __future__ import annotations

import numpy as np
from bench.store.record import CellRecord, Predictions


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


def fake_suite(name: str, methods: str = "", seeds: tuple[int, ...] = (0, 1)) -> str:
    """A suite file for :func:`fake_store`: the tiny suite (msp on mnist5k, 1 epoch) with
    ``seeds``, the test and OOD splits, plus the method tables in ``methods``."""
    from tests.helpers.suites import tiny_suite

    return tiny_suite(name, seeds=seeds, methods=f"[methods.msp]\n{methods}", data={"splits": ["test", "ood/*"]})


def fake_store(results, suite_file, *, overrides=None, only=None, failed=(), unsealed=(), n: int = 40,
               splits: tuple[str, ...] = ("val", "test", "ood/noise")) -> dict:
    """Write the cells a suite file plans into ``results/<suite>/`` as ``run`` would, with
    random predictions instead of training (no model is built): ``n`` samples of each of
    ``splits``, labels shared by all cells, better-than-chance logits.  ``overrides``: a :class:`bench.config.spec.Overrides`
    (e.g. other epochs: another configuration); ``only``: the ``(method, seed)`` pairs to
    write (default all); ``failed`` / ``unsealed``: pairs stored as failed / left as a run
    in progress.  ``suite.json`` is written as ``run`` writes it.  Returns ``(method, seed)``
    -> cell key of every planned cell."""
    import zlib
    from pathlib import Path

    from scipy.special import log_softmax

    from bench.store.catalog import write_store_description
    from bench.core.registry import import_plugins
    from bench.store.plan import make_plan
    from bench.config.spec import Overrides, load_suite
    from bench.store import Store

    import_plugins([])  # the built-in methods and datasets the suite names
    suite = load_suite(str(suite_file), overrides or Overrides())
    plan = make_plan(suite)
    store = Store(Path(results) / suite.name)
    keys = {}
    for cell in plan.cells:
        keys[(cell.method.name, cell.seed)] = cell.key
        if only is not None and (cell.method.name, cell.seed) not in only:
            continue
        cd = store.cell(cell.key)
        cd.reset()
        info = {"key": cell.key, "dataset": cell.dataset.name, "method": cell.method.name, "seed": cell.seed,
                "config": cell.config, "status": "running", "samples": 1}
        if (cell.method.name, cell.seed) in failed:
            cd.write_cell(CellRecord.from_json({**info, "status": "failed", "reason": "NonFiniteLoss: loss became nan at epoch 1"}))
            continue
        rng = np.random.default_rng(zlib.crc32(cell.key.encode()))
        for split in splits:
            labels = np.random.default_rng(zlib.crc32(split.encode())).integers(0, 10, n)
            logits = rng.normal(size=(n, 10))
            if not split.startswith("ood/"):
                logits[np.arange(n), labels] += 2.0
            cd.write_preds(split, Predictions(log_softmax(logits, axis=1), np.full(n, -1) if split.startswith("ood/") else labels))
        if (cell.method.name, cell.seed) in unsealed:
            cd.write_cell(CellRecord.from_json(info))
            continue
        cd.seal(CellRecord.from_json({**info, "train_seconds": 1.0, "predict_seconds": 0.1, "predict_seconds_per_1000": 1.0,
                 "parameters": 1000, "peak_memory_mb": 10.0}))
    write_store_description(store.root, suite)
    return keys

