"""The severity table of ``bench/analysis/summary.py``: severity 0 compares the same
images as the corruption splits (the clean test images they were made from), and every
row says how many samples each of its splits holds."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.special import log_softmax
from sklearn.metrics import accuracy_score

from bench.analysis.evaluate import METRIC_COLUMNS, evaluate
from bench.analysis.summary import clean_source_size, severity_table
from bench.store import Predictions

N_TEST, N_CORRUPTED, C = 400, 50, 4
CORRUPTIONS = ("shift/gaussian_noise/1", "shift/gaussian_noise/5", "shift/contrast/1", "shift/contrast/5")


def _preds(rng, labels: np.ndarray, quality: np.ndarray | float) -> Predictions:
    logits = rng.normal(size=(len(labels), C))
    logits[np.arange(len(labels)), labels] += quality
    return Predictions(log_softmax(logits, axis=1).astype(np.float32), labels)


@pytest.fixture(scope="module")
def cells():
    """Two seeds of one method: 400 test images whose first 50 (those the corruption splits
    are made from, as every data set makes them) are much easier than the rest."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, C, N_TEST)
    quality = np.where(np.arange(N_TEST) < N_CORRUPTED, 4.0, 0.0)
    cache = {}
    for seed in (0, 1):
        preds = {"test": _preds(rng, labels, quality)}
        preds.update({split: _preds(rng, labels[:N_CORRUPTED], 1.0) for split in CORRUPTIONS})
        cache[("d", "m", seed)] = preds
    rows = [("d", "m", s, *row) for (_, _, s), preds in cache.items() for row in evaluate(preds, ["accuracy", "nll"])]
    return cache, pd.DataFrame(rows, columns=METRIC_COLUMNS)


def test_severity_0_is_the_clean_samples_the_corruptions_were_made_from(cells):
    cache, metrics = cells
    table = severity_table(metrics, cache, {("d", "m"): [0, 1]}, ["accuracy", "nll"], seed=0)

    def row(severity: int, metric: str) -> pd.Series:
        return table[(table.severity == severity) & (table.metric == metric)].iloc[0]

    def clean(metric, seed: int, n: int) -> float:
        test = cache[("d", "m", seed)]["test"]
        probs = np.exp(test.log_probs[:n].astype(np.float64))
        if metric == "accuracy":
            return accuracy_score(test.labels[:n], probs.argmax(1))
        return float(np.mean(-np.log(probs[np.arange(n), test.labels[:n]])))  # NLL

    for metric in ("accuracy", "nll"):
        same_images = np.mean([clean(metric, s, N_CORRUPTED) for s in (0, 1)])
        assert row(0, metric)["mean"] == pytest.approx(same_images, rel=1e-6)
        assert row(0, metric)["mean"] != pytest.approx(np.mean([clean(metric, s, N_TEST) for s in (0, 1)]), rel=1e-3)
    assert row(0, "accuracy").ci_low <= row(0, "accuracy")["mean"] <= row(0, "accuracy").ci_high
    assert set(table["n_samples"]) == {N_CORRUPTED}  # severity 0 counts the same 50 images as 1..5 and all
    assert sorted(set(table["severity"])) == [-1, 0, 1, 5]


def test_clean_source_is_the_first_test_images_when_the_labels_are_theirs(cells):
    cache, _ = cells
    preds = cache[("d", "m", 0)]
    assert clean_source_size(preds, "shift/contrast/5") == N_CORRUPTED
    shifted = preds["test"].labels[1:N_CORRUPTED + 1]
    other = dict(preds, **{"shift/x/1": Predictions(preds["test"].log_probs[:N_CORRUPTED], shifted)})
    assert clean_source_size(other, "shift/x/1") == N_TEST  # not made from the first images: the whole test split
