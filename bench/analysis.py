"""Analysis: stored predictions -> one tidy table of metric values.  Never touches a model.

:func:`collect` walks a plan's cells in the store, computes derived methods (temperature
scaling, ensembles) from their members' stored predictions, and evaluates every metric:
classification metrics on labelled evaluation splits (``test``, ``shift/...``) and OOD
metrics on ``ood/...`` splits, with the method's maximum softmax probability as the score
and its ``test`` split as the in-distribution side.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from bench.metrics import CLASSIFICATION_METRICS, OOD_METRICS
from bench.data import is_ood
from bench.plan import Plan
from bench.registry import METHODS, METRICS
from bench.store import CHECKPOINT, Store

Preds = dict[str, tuple[np.ndarray, np.ndarray]]  # split -> (log_probs [N, C], labels [N])


@dataclass
class AnalysisResults:
    """Everything the report renders, computed from the store alone.

    ``metrics``: tidy table with columns ``dataset, method, seed, split, metric, value``;
    values are raw (unscaled: accuracy in [0, 1], NLL in nats, ...).  Classification
    metrics are rows for labelled splits (``test``, ``shift/...``); OOD metrics (names
    starting ``ood_``) are rows for ``ood/...`` splits, computed with the ``test`` split as
    the in-distribution side.  ``seed`` is the training seed, or the replicate index for
    methods combined from several seeds (ensembles).

    ``load_predictions(dataset, method, seed, split)`` returns ``(probs [N, C] float64,
    labels [N] int64)`` for plots; labels are ``-1`` on OOD splits.
    """

    suite: str
    metrics: pd.DataFrame
    datasets: list[str]  # display order
    methods: list[str]  # display order (suite order)
    splits: dict[str, list[str]]  # per dataset: evaluated splits in order (test, shift/..., ood/...)
    seeds: dict[tuple[str, str], list[int]]  # (dataset, method) -> seeds/replicates available
    failures: pd.DataFrame  # columns: dataset, method, seed, reason
    load_predictions: Callable[[str, str, int, str], tuple[np.ndarray, np.ndarray]]


def split_order(split: str) -> tuple:
    group = 0 if split == "test" else 2 if is_ood(split) else 1
    return (group, split)


def evaluate(preds: Preds) -> list[tuple[str, str, float]]:
    """``(split, metric, value)`` for every evaluation split of one prediction set."""
    rows = []
    test_conf = None
    if "test" in preds:
        test_conf = np.exp(preds["test"][0].astype(np.float64)).max(axis=1)
    for split in sorted(preds, key=split_order):
        if split == "val":
            continue
        log_probs, labels = preds[split]
        probs = np.exp(log_probs.astype(np.float64))
        if is_ood(split):
            if test_conf is None:
                continue
            for name in OOD_METRICS:
                rows.append((split, name, float(METRICS.get(name)(test_conf, probs.max(axis=1)))))
        else:
            for name in CLASSIFICATION_METRICS:
                rows.append((split, name, float(METRICS.get(name)(probs, labels))))
    return rows


def collect(plan: Plan, store: Store) -> AnalysisResults:
    suite = plan.suite
    cache: dict[tuple[str, str, int], Preds] = {}
    failures: list[dict] = []

    def trained_preds(dataset: str, method: str, seed: int) -> Preds | str | None:
        """Predictions of a stored cell, its failure reason, or None when not run yet."""
        cd = store.cell(plan.find(dataset, method, seed).key)
        status = cd.status(skip=(CHECKPOINT,))  # analysis never reads weights
        if status == "failed":
            return (cd.read_cell() or {}).get("reason", "failed")
        if status != "complete":
            return None
        return {s: cd.read_preds(s) for s in cd.splits()}

    for d in suite.datasets:
        for m in suite.methods:
            if m.kind == "trained":
                for seed in suite.seeds:
                    got = trained_preds(d.name, m.name, seed)
                    if isinstance(got, str):
                        failures.append({"dataset": d.name, "method": m.name, "seed": seed, "reason": got})
                    elif got is not None:
                        cache[(d.name, m.name, seed)] = got
        for m in suite.methods:
            if m.kind != "derived":
                continue
            method = METHODS.get(m.type)(m.options)
            for rid, member_seeds in method.replicates(suite.seeds):
                members = [cache.get((d.name, m.options.base, s)) for s in member_seeds]
                failed = [s for s in member_seeds if any(
                    f["dataset"] == d.name and f["method"] == m.options.base and f["seed"] == s for f in failures)]
                if failed:
                    failures.append({"dataset": d.name, "method": m.name, "seed": rid,
                                     "reason": f"member {m.options.base} seed(s) {failed} failed"})
                    continue
                if any(x is None for x in members):
                    continue
                common = set.intersection(*(set(x) for x in members))
                labels = {s: members[0][s][1] for s in common}
                combined = method.combine([{s: x[s][0] for s in common} for x in members], labels)
                cache[(d.name, m.name, rid)] = {s: (combined[s], labels[s]) for s in combined}

    rows = []
    for (dataset, method, seed), preds in cache.items():
        rows.extend((dataset, method, seed, split, metric, value) for split, metric, value in evaluate(preds))
    columns = ["dataset", "method", "seed", "split", "metric", "value"]
    metrics_df = pd.DataFrame(rows, columns=columns)
    splits = {
        d.name: sorted({s for (dn, _, _), p in cache.items() if dn == d.name for s in p if s != "val"}, key=split_order)
        for d in suite.datasets
    }
    seeds = {}
    for dataset, method, seed in cache:
        seeds.setdefault((dataset, method), []).append(seed)

    def load_predictions(dataset: str, method: str, seed: int, split: str) -> tuple[np.ndarray, np.ndarray]:
        log_probs, labels = cache[(dataset, method, seed)][split]
        return np.exp(log_probs.astype(np.float64)), labels

    return AnalysisResults(
        suite=suite.name,
        metrics=metrics_df,
        datasets=[d.name for d in suite.datasets],
        methods=[m.name for m in suite.methods],
        splits=splits,
        seeds={k: sorted(v) for k, v in seeds.items()},
        failures=pd.DataFrame(failures, columns=["dataset", "method", "seed", "reason"]),
        load_predictions=load_predictions,
    )
