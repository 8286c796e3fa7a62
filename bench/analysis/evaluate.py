"""Evaluation: the registered metrics on stored predictions, one value per cell and split.

:func:`evaluate` computes, for one prediction set, labelled-split metrics (kinds other
than ``ood``) on the ``test`` and ``shift/...`` splits and OOD metrics on the ``ood/...``
splits with the ``test`` split as the in-distribution side, once per OOD score
(:func:`ood_scores`).  :func:`evaluate_catalog` does so for every cell of a
:class:`~bench.catalog.Catalog` (derived methods combined from their members' stored
predictions) and collects what could not be evaluated: failed, damaged and unnamed
cells, replicates that could not be formed, metrics that raised.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench import progress
from bench.catalog import Catalog, Preds
from bench.data import is_ood
from bench.errors import one_line
from bench.metrics import entropy, get_metric, mutual_information, selection

#: the OOD scores of :func:`ood_scores` (higher = more in-distribution), in display order
SCORES = ("msp", "entropy", "mutual_info")
METRIC_COLUMNS = ["dataset", "method", "seed", "split", "metric", "score", "value"]
FAILURE_COLUMNS = ["dataset", "method", "seed", "reason"]
DAMAGED_COLUMNS = ["cell", "dataset", "method", "seed", "reason"]


def split_order(split: str) -> tuple:
    group = 0 if split == "test" else 2 if is_ood(split) else 1
    return (group, split)


def table_of(split: str) -> str:
    return "in_distribution" if split == "test" else "ood" if is_ood(split) else "shift"


def analysed_metrics(picked: list[str] | None = None) -> list[str]:
    """The metrics analysis computes: the ``"default"`` selection plus any picked ones
    (registered names, checked where they entered: :func:`bench.report.validate_metrics`)."""
    return list(dict.fromkeys(selection("default") + list(picked or [])))


def ood_scores(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-image OOD scores (higher = more in-distribution) of one prediction set."""
    probs = np.exp(arrays["log_probs"].astype(np.float64))
    out = {"msp": probs.max(axis=1), "entropy": -entropy(probs)}
    if "entropy_of_mean" in arrays and "mean_entropy" in arrays:
        out["mutual_info"] = -mutual_information(arrays["entropy_of_mean"], arrays["mean_entropy"])
    return out


def labelled_and_ood(names: list[str]) -> tuple[list[str], list[str]]:
    """(labelled-split metrics, OOD metrics) of ``names``, order kept."""
    return [n for n in names if not get_metric(n).on_scores], [n for n in names if get_metric(n).on_scores]


def metric_value(name: str, inputs: tuple, errors: dict | None = None, where: tuple = ()) -> float:
    """The registered metric ``name`` on ``inputs``.  With ``errors``, a metric that raises
    (a plugin's bug) gives NaN and its error is recorded under ``where``; without it the
    error propagates."""
    try:
        return float(get_metric(name)(*inputs))
    except Exception as exc:  # noqa: BLE001  (any error of a metric's own code)
        if errors is None:
            raise
        errors[where] = one_line(exc)
        return float("nan")


def evaluate(preds: Preds, names: list[str],
             errors: dict[tuple[str, str, str], str] | None = None) -> list[tuple[str, str, str, float]]:
    """``(split, metric, score, value)`` for every evaluation split of one prediction set.

    With ``errors``, a metric that raises (a plugin's bug) gives NaN and its error is
    recorded under ``(split, metric, score)``; the other metrics go on.  Without it the
    error propagates."""
    labelled, on_scores = labelled_and_ood(names)

    def value(name: str, split: str, score: str, *inputs) -> float:
        return metric_value(name, inputs, errors, (split, name, score))

    rows = []
    test_scores = ood_scores(preds["test"]) if "test" in preds else None
    for split in sorted(preds, key=split_order):
        if split == "val":
            continue
        arrays = preds[split]
        if is_ood(split):
            if test_scores is None:
                continue
            scores = ood_scores(arrays)
            for score in SCORES:
                if score in scores and score in test_scores:
                    for name in on_scores:
                        rows.append((split, name, score, value(name, split, score, test_scores[score], scores[score])))
        else:
            probs = np.exp(arrays["log_probs"].astype(np.float64))
            for name in labelled:
                rows.append((split, name, "", value(name, split, "", probs, arrays["labels"])))
    return rows


@dataclass
class Evaluation:
    """Every cell of a catalog evaluated (:func:`evaluate_catalog`): the input of the statistics.

    ``predictions``: (dataset, method, seed or replicate) -> its predictions, for every
    cell and replicate that could be read or formed, in catalog order.  ``metrics``:
    :data:`METRIC_COLUMNS` rows of every one of them.  ``raised``: (dataset, method, seed,
    split, metric, score) -> the error of a metric that raised there (its value is NaN).
    ``failures`` (:data:`FAILURE_COLUMNS`) and ``damaged`` (:data:`DAMAGED_COLUMNS`): rows
    for the cells and replicates left out and the metrics that raised."""

    names: list[str]  # the metrics evaluated: the requested ones and the datasets' headline metrics
    headlines: dict[str, dict[str, str]]  # dataset -> {metric shown in the tables: metric shown in its place}
    notes: dict[str, str]  # dataset -> its protocol note (report_note)
    predictions: dict[tuple[str, str, int], Preds]
    metrics: pd.DataFrame
    raised: dict[tuple[str, str, int, str, str, str], str]
    failures: list[dict]
    damaged: list[dict]


def evaluate_catalog(catalog: Catalog, names: list[str]) -> Evaluation:
    """Every metric of ``names`` (and the datasets' headline metrics) on every cell of
    ``catalog`` and every replicate of its derived methods.  A metric that raises is named
    once among the failures (where it first raised, with its error); its values where it
    raised are NaN, and every other metric is computed as usual."""
    classes = {d: catalog.dataset_class(d) for d in catalog.datasets}
    headlines = {d: dict(swaps) for d, c in classes.items() if (swaps := getattr(c, "headline_metrics", None))}
    notes = {d: str(note) for d, c in classes.items() if (note := getattr(c, "report_note", None))}
    names = list(names) + [t for swaps in headlines.values() for t in swaps.values() if t not in names]
    cache: dict[tuple[str, str, int], Preds] = {}
    for d, m, s in list(catalog.cells):
        catalog.load_or_mark_damaged(d, m, s)  # damaged cells leave catalog.cells before the failures are listed
    failures: list[dict] = [{"dataset": d, "method": m, "seed": s, "reason": why}
                            for (d, m, s), why in catalog.problems.items() if (d, m, s) not in catalog.damaged]
    damaged: list[dict] = [{"cell": cell, "dataset": d, "method": m, "seed": s, "reason": why}
                           for (d, m, s), (cell, why) in catalog.damaged.items()]
    damaged += [{"cell": key, "dataset": "", "method": "", "seed": -1, "reason": why}
                for key, why in catalog.unnamed.items()]
    for d in catalog.datasets:
        for entry in catalog.methods:
            for rid, members in catalog.replicates(d, entry):
                if entry.kind == "trained":
                    preds = catalog.load_or_mark_damaged(d, entry.name, rid)
                    if preds is not None:
                        cache[(d, entry.name, rid)] = preds
                    continue
                preds = catalog.combined(d, entry, rid, members)
                if isinstance(preds, dict):
                    cache[(d, entry.name, rid)] = preds
                elif any((d, entry.base, s) in catalog.cells or (d, entry.base, s) in catalog.problems
                         for s in members):
                    failures.append({"dataset": d, "method": entry.name, "seed": rid, "reason": preds})

    rows, raised = [], {}
    for (d, m, s), preds in progress.tracked(cache.items(), "analysis", len(cache), "cell", "{count} cells"):
        errors: dict[tuple[str, str, str], str] = {}
        rows += [(d, m, s, split, metric, score, value) for split, metric, score, value in evaluate(preds, names, errors)]
        raised.update({(d, m, s, *where): why for where, why in errors.items()})
    first: dict[str, tuple] = {}  # metric -> (dataset, method, seed, split, score, error) where it first raised
    for (d, m, s, split, metric, score), why in raised.items():
        first.setdefault(metric, (d, m, s, split, score, why))
    failures += [{"dataset": d, "method": m, "seed": s,
                  "reason": f"metric {metric!r} raised {why} (first on split {split}{f', score {score}' if score else ''}); "
                            "its cells show 'error' where it raised, every other metric is computed"}
                 for metric, (d, m, s, split, score, why) in first.items()]
    return Evaluation(names=names, headlines=headlines, notes=notes, predictions=cache,
                      metrics=pd.DataFrame(rows, columns=METRIC_COLUMNS), raised=raised, failures=failures,
                      damaged=damaged)
