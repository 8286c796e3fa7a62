"""Analysis: stored predictions -> tidy tables of metric values.  Never touches a model.

:func:`collect` walks a plan's cells in the store, computes derived methods (temperature
scaling, ensembles) from their members' stored predictions, and evaluates every metric:
classification metrics on labelled evaluation splits (``test``, ``shift/...``) and OOD
metrics on ``ood/...`` splits with the ``test`` split as the in-distribution side, for each
OOD score (MSP; predictive entropy; mutual information where the decomposition exists).
It then adds paired bootstrap intervals and significance against the reference method
(``test`` and OOD splits), corruption aggregates per severity, corruption errors and the
efficiency of every method.  Everything is seeded: the same store gives the same tables.
"""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from bench import stats
from bench.metrics import CLASSIFICATION_METRICS, METRIC_INFO, OOD_METRICS, decompose, entropy
from bench.data import corruption_of, is_ood
from bench.plan import Plan
from bench.registry import METHODS, METRICS
from bench.store import CHECKPOINT, Store

Preds = dict[str, dict[str, np.ndarray]]  # split -> {"log_probs", "labels", optional decomposition terms}

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
ALPHA = 0.05  # significance level after Holm correction
SCORES = ("msp", "entropy", "mutual_info")  # OOD scores, higher = more in-distribution
SEVERITY_METRICS = ("accuracy", "ece", "nll")  # severity aggregates get bootstrap bands (the plotted ones)
SEVERITY_RESAMPLES = 200  # 75 splits x 3 metrics stay fast on CIFAR-sized stores


@dataclass
class AnalysisResults:
    """Everything the report renders, computed from the store alone.

    ``metrics`` (per seed): columns ``dataset, method, seed, split, metric, score, value``;
    values are raw (unscaled: accuracy in [0, 1], NLL in nats, ...).  Classification
    metrics are rows for labelled splits (``test``, ``shift/...``) with ``score == ""``;
    OOD metrics (``ood_*``) are rows for ``ood/...`` splits, computed with the ``test``
    split as the in-distribution side, once per OOD score: ``"msp"`` (max probability, every
    method), ``"entropy"`` (negative predictive entropy H[p-bar]) and ``"mutual_info"``
    (negative mutual information, only for methods with several samples or members).
    ``seed`` is the training seed, or the replicate index for methods combined from
    several seeds (ensembles).

    ``summary`` (one row per dataset, method, split, metric, score): ``table`` (which
    report table: ``in_distribution`` for ``test``, ``shift``, ``ood``), ``n_seeds``,
    ``mean``, ``std`` (over seeds, ddof=1; NaN for one seed), ``ci_low``/``ci_high`` (95%
    paired bootstrap interval of the seed-mean over test samples), ``p_value`` and
    ``p_holm`` (paired bootstrap z-test of the difference to ``reference``: the difference
    over the standard deviation of its bootstrap distribution on the same resampled
    samples; Holm-corrected across all comparisons of one dataset's table) and
    ``verdict`` (``"ref"`` for the reference, ``"better"``/``"worse"`` where p_holm < 0.05
    in the metric's good/bad direction, else ``""``).

    ``severity`` (corruption aggregates): ``dataset, method, severity, metric, n_seeds,
    mean, std, ci_low, ci_high``: the metric averaged over the corruption types evaluated at
    that severity (1..5), severity 0 being the clean ``test`` split; ``severity == -1`` is
    the average over every corruption split.

    ``corruption_errors``: ``dataset, method, corruption, ce``: sum over severities of the
    method's error (1 - accuracy) over the reference's, per corruption, and
    ``corruption == "mCE"`` their mean (1.0 for the reference itself).

    ``efficiency``: ``dataset, method, parameters, train_seconds, predict_seconds_per_1000,
    peak_memory_mb, passes`` from ``cell.json`` (means over seeds; combinators add up their
    members' training and prediction time and passes).

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
    reference: str = ""  # the method significance and corruption errors are relative to
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    severity: pd.DataFrame = field(default_factory=pd.DataFrame)
    corruption_errors: pd.DataFrame = field(default_factory=pd.DataFrame)
    efficiency: pd.DataFrame = field(default_factory=pd.DataFrame)


def split_order(split: str) -> tuple:
    group = 0 if split == "test" else 2 if is_ood(split) else 1
    return (group, split)


def table_of(split: str) -> str:
    return "in_distribution" if split == "test" else "ood" if is_ood(split) else "shift"


def ood_scores(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-image OOD scores (higher = more in-distribution) of one prediction set."""
    probs = np.exp(arrays["log_probs"].astype(np.float64))
    out = {"msp": probs.max(axis=1), "entropy": -entropy(probs)}
    if "entropy_of_mean" in arrays and "mean_entropy" in arrays:
        mi = arrays["entropy_of_mean"].astype(np.float64) - arrays["mean_entropy"].astype(np.float64)
        out["mutual_info"] = -np.maximum(mi, 0.0)
    return out


def evaluate(preds: Preds) -> list[tuple[str, str, str, float]]:
    """``(split, metric, score, value)`` for every evaluation split of one prediction set."""
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
                    for name in OOD_METRICS:
                        value = METRICS.get(name)(test_scores[score], scores[score])
                        rows.append((split, name, score, float(value)))
        else:
            probs = np.exp(arrays["log_probs"].astype(np.float64))
            for name in CLASSIFICATION_METRICS:
                rows.append((split, name, "", float(METRICS.get(name)(probs, arrays["labels"]))))
    return rows


def collect(plan: Plan, store: Store, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> AnalysisResults:
    suite = plan.suite
    cache: dict[tuple[str, str, int], Preds] = {}
    failures: list[dict] = []
    cells: dict[tuple[str, str, int], dict] = {}  # cell.json of every complete trained cell

    for d in suite.datasets:
        for m in suite.methods:
            if m.kind != "trained":
                continue
            for s in suite.seeds:
                cd = store.cell(plan.find(d.name, m.name, s).key)
                status = cd.status(skip=(CHECKPOINT,))  # analysis never reads weights
                if status == "failed":
                    failures.append({"dataset": d.name, "method": m.name, "seed": s,
                                     "reason": (cd.read_cell() or {}).get("reason", "failed")})
                elif status == "complete":
                    cache[(d.name, m.name, s)] = {split: cd.read_arrays(split) for split in cd.splits()}
                    cells[(d.name, m.name, s)] = cd.read_cell() or {}
        for m in suite.methods:
            if m.kind == "derived":
                _combine(d.name, m, suite.seeds, cache, failures)

    rows = [
        (dataset, method, s, split, metric, score, value)
        for (dataset, method, s), preds in cache.items()
        for split, metric, score, value in evaluate(preds)
    ]
    metrics_df = pd.DataFrame(rows, columns=["dataset", "method", "seed", "split", "metric", "score", "value"])
    splits = {
        d.name: sorted({sp for (dn, _, _), p in cache.items() if dn == d.name for sp in p if sp != "val"}, key=split_order)
        for d in suite.datasets
    }
    seeds: dict[tuple[str, str], list[int]] = {}
    for dataset, method, s in cache:
        seeds.setdefault((dataset, method), []).append(s)
    seeds = {k: sorted(v) for k, v in seeds.items()}
    methods = [m.name for m in suite.methods]
    reference = suite.reference_method

    def load_predictions(dataset: str, method: str, s: int, split: str) -> tuple[np.ndarray, np.ndarray]:
        arrays = cache[(dataset, method, s)][split]
        return np.exp(arrays["log_probs"].astype(np.float64)), arrays["labels"]

    return AnalysisResults(
        suite=suite.name,
        metrics=metrics_df,
        datasets=[d.name for d in suite.datasets],
        methods=methods,
        splits=splits,
        seeds=seeds,
        failures=pd.DataFrame(failures, columns=["dataset", "method", "seed", "reason"]),
        load_predictions=load_predictions,
        reference=reference,
        summary=_summary(metrics_df, cache, seeds, reference, resamples, seed),
        severity=_severity(metrics_df, cache, seeds, seed),
        corruption_errors=_corruption_errors(metrics_df, reference),
        efficiency=_efficiency(suite, cells),
    )


def _combine(dataset: str, m, seeds: tuple[int, ...], cache: dict, failures: list[dict]) -> None:
    """Compute a derived method's replicates from its members' stored predictions."""
    method = METHODS.get(m.type)(m.options)
    base = m.options.base
    for rid, member_seeds in method.replicates(seeds):
        failed = [s for s in member_seeds
                  if any(f["dataset"] == dataset and f["method"] == base and f["seed"] == s for f in failures)]
        if failed:
            failures.append({"dataset": dataset, "method": m.name, "seed": rid,
                             "reason": f"member {base} seed(s) {failed} failed"})
            continue
        members = [cache.get((dataset, base, s)) for s in member_seeds]
        if any(x is None for x in members):
            continue
        common = sorted(set.intersection(*(set(x) for x in members)), key=split_order)
        labels = {sp: members[0][sp]["labels"] for sp in common}
        combined = method.combine([{sp: x[sp]["log_probs"] for sp in common} for x in members], labels)
        preds = {sp: {"log_probs": combined[sp], "labels": labels[sp]} for sp in combined}
        if len(members) > 1:  # decomposition terms from the members' predictive distributions
            for sp in combined:
                terms = decompose(np.stack([np.exp(x[sp]["log_probs"].astype(np.float64)) for x in members]))
                preds[sp].update(entropy_of_mean=terms["total"], mean_entropy=terms["aleatoric"])
        cache[(dataset, m.name, rid)] = preds


def _summary(metrics_df: pd.DataFrame, cache: dict, seeds: dict, reference: str, resamples: int,
             seed: int) -> pd.DataFrame:
    """Mean/std over seeds for every (dataset, method, split, metric, score); on ``test``
    and OOD splits also the paired bootstrap CI of the seed-mean and the test against the
    reference method, Holm-corrected per (dataset, table)."""
    if metrics_df.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    keys = ["dataset", "method", "split", "metric", "score"]
    g = metrics_df.groupby(keys, sort=False)["value"]
    out = g.agg(n_seeds="count", mean="mean", std=lambda v: v.std(ddof=1) if len(v) > 1 else np.nan).reset_index()
    out.insert(3, "table", out["split"].map(table_of))
    dist: dict[tuple, np.ndarray] = {}  # bootstrap distribution of the seed-mean
    for dataset in out["dataset"].unique():
        weights = {}
        for (dn, method, _s), preds in cache.items():
            if dn != dataset:
                continue
            for split in preds:
                if split == "test" or is_ood(split):
                    n = len(preds[split]["labels"])
                    weights.setdefault(split, _weights(n, resamples, seed, split))
        for method in out.loc[out["dataset"] == dataset, "method"].unique():
            per_seed: dict[tuple, list[np.ndarray]] = {}
            for s in seeds.get((dataset, method), []):
                preds = cache[(dataset, method, s)]
                if "test" not in preds:
                    continue
                probs = np.exp(preds["test"]["log_probs"].astype(np.float64))
                for name in CLASSIFICATION_METRICS:
                    per_seed.setdefault(("test", name, ""), []).append(
                        stats.boot_metric(name, probs, preds["test"]["labels"], weights["test"]))
                test_scores = ood_scores(preds["test"])
                for split in preds:
                    if not is_ood(split):
                        continue
                    scores = ood_scores(preds[split])
                    for score in SCORES:
                        if score in scores and score in test_scores:
                            for name in OOD_METRICS:
                                per_seed.setdefault((split, name, score), []).append(stats.boot_ood_metric(
                                    name, test_scores[score], scores[score], weights["test"], weights[split]))
            for (split, name, score), values in per_seed.items():
                dist[(dataset, method, split, name, score)] = stats.seed_mean_distribution(values)

    ci = [stats.bootstrap_ci(dist[k]) if k in dist else (np.nan, np.nan) for k in out[keys].itertuples(index=False, name=None)]
    out["ci_low"], out["ci_high"] = [c[0] for c in ci], [c[1] for c in ci]
    means = dict(zip(out[keys].itertuples(index=False, name=None), out["mean"]))
    p_values, ref_means = [], []
    for k in out[keys].itertuples(index=False, name=None):
        ref = (k[0], reference, *k[2:])
        ref_means.append(means.get(ref, np.nan))
        if k[1] == reference or k not in dist or ref not in dist:
            p_values.append(np.nan)
        else:
            p_values.append(stats.paired_z_test(dist[k] - dist[ref], float(means[k] - means[ref])))
    out["p_value"] = p_values
    out["p_holm"] = np.nan
    for _, idx in out.groupby(["dataset", "table"], sort=False).groups.items():
        finite = [i for i in idx if np.isfinite(out.at[i, "p_value"])]
        if finite:
            out.loc[finite, "p_holm"] = stats.holm(out.loc[finite, "p_value"].to_numpy())
    out["verdict"] = [
        _verdict(method, metric, mean, ref_mean, p, reference)
        for method, metric, mean, ref_mean, p in zip(out["method"], out["metric"], out["mean"], ref_means, out["p_holm"])
    ]
    return out[SUMMARY_COLUMNS]


SUMMARY_COLUMNS = ["dataset", "method", "split", "table", "metric", "score", "n_seeds", "mean", "std",
                   "ci_low", "ci_high", "p_value", "p_holm", "verdict"]


def _verdict(method: str, metric: str, mean: float, ref_mean: float, p_holm: float, reference: str) -> str:
    """``ref`` for the reference; ``better``/``worse`` when significant after Holm."""
    if method == reference:
        return "ref"
    if not (np.isfinite(p_holm) and p_holm < ALPHA):
        return ""
    return "better" if (mean > ref_mean) == METRIC_INFO[metric].higher_is_better else "worse"


@functools.lru_cache(maxsize=8)  # a few [B, N] matrices per analysis (test, OOD sets, severity)
def _weights(n: int, resamples: int, seed: int, ood_split: str = "") -> np.ndarray:
    """Bootstrap count vectors [resamples, n].  ``test`` and every corruption split are the
    same images, so one matrix per size pairs them by image; each OOD set (``ood_split``)
    is a separate sample and gets its own draw."""
    offset = zlib.crc32(ood_split.encode()) if is_ood(ood_split) else 0
    w = stats.resample_weights(n, resamples, (seed + offset) % 2**32)
    w.flags.writeable = False
    return w


def _severity_of(split: str) -> int | None:
    """1..5 for ``shift/<corruption>/<severity>``, 0 for ``test``, None otherwise."""
    if split == "test":
        return 0
    corruption = corruption_of(split)
    return corruption[1] if corruption else None


def _severity(metrics_df: pd.DataFrame, cache: dict, seeds: dict, seed: int) -> pd.DataFrame:
    """Classification metrics averaged over corruption types per severity (0 = clean test,
    -1 = every corruption split), then mean and std over seeds; for
    :data:`SEVERITY_METRICS` also a 95% paired bootstrap interval of the seed-mean (each
    split resampled with its own shared index matrix, the corruption average taken per
    resample)."""
    cols = ["dataset", "method", "severity", "metric", "n_seeds", "mean", "std", "ci_low", "ci_high"]
    df = metrics_df[metrics_df["score"] == ""].copy()
    df["severity"] = df["split"].map(_severity_of)
    df = df.dropna(subset=["severity"])
    if df.empty or (df["severity"] > 0).sum() == 0:
        return pd.DataFrame(columns=cols)
    df["severity"] = df["severity"].astype(int)
    per_seed = df.groupby(["dataset", "method", "seed", "severity", "metric"], sort=False)["value"].mean().reset_index()
    overall = df[df["severity"] > 0].groupby(["dataset", "method", "seed", "metric"], sort=False)["value"].mean().reset_index()
    overall["severity"] = -1
    per_seed = pd.concat([per_seed, overall[per_seed.columns]], ignore_index=True)
    g = per_seed.groupby(["dataset", "method", "severity", "metric"], sort=False)["value"]
    out = g.agg(n_seeds="count", mean="mean", std=lambda v: v.std(ddof=1) if len(v) > 1 else np.nan).reset_index()
    bands = _severity_bands(df, cache, seeds, seed)
    keys = out[["dataset", "method", "severity", "metric"]].itertuples(index=False, name=None)
    ci = [bands.get(k, (np.nan, np.nan)) for k in keys]
    out["ci_low"], out["ci_high"] = [c[0] for c in ci], [c[1] for c in ci]
    return out.sort_values(["dataset", "method", "severity", "metric"], kind="stable", key=_display_key(out))[cols].reset_index(drop=True)


def _severity_bands(df: pd.DataFrame, cache: dict, seeds: dict, seed: int) -> dict[tuple, tuple[float, float]]:
    """(dataset, method, severity, metric) -> bootstrap CI of the corruption-averaged seed-mean."""
    split_severity = dict(zip(df["split"], df["severity"]))
    bands = {}
    for (dataset, method), seed_list in seeds.items():
        per_seed: dict[tuple[int, str], list[np.ndarray]] = {}
        for s in seed_list:
            preds = cache[(dataset, method, s)]
            sums: dict[tuple[int, str], list[np.ndarray]] = {}
            for split, sev in split_severity.items():
                if split not in preds:
                    continue
                arrays = preds[split]
                n = len(arrays["labels"])
                w = _weights(n, SEVERITY_RESAMPLES, seed)
                probs = np.exp(arrays["log_probs"].astype(np.float64))
                for name in SEVERITY_METRICS:
                    value = stats.boot_metric(name, probs, arrays["labels"], w)
                    sums.setdefault((sev, name), []).append(value)
                    if sev > 0:
                        sums.setdefault((-1, name), []).append(value)
            for k, values in sums.items():
                per_seed.setdefault(k, []).append(np.mean(values, axis=0))
        for (sev, name), values in per_seed.items():
            bands[(dataset, method, sev, name)] = stats.bootstrap_ci(stats.seed_mean_distribution(values))
    return bands


def _display_key(df: pd.DataFrame):
    """Sort key keeping datasets and methods in their first-appearance (suite) order."""
    order = {c: {v: i for i, v in enumerate(dict.fromkeys(df[c]))} for c in ("dataset", "method")}
    return lambda col: col.map(order[col.name]) if col.name in order else col


def _corruption_errors(metrics_df: pd.DataFrame, reference: str) -> pd.DataFrame:
    """CE_c = sum_s err(method, c, s) / sum_s err(reference, c, s), err = 1 - accuracy
    (seed-mean); mCE = mean over corruptions (Hendrycks & Dietterich, 2019, relative to a
    reference method instead of AlexNet)."""
    cols = ["dataset", "method", "corruption", "ce"]
    acc = metrics_df[(metrics_df["metric"] == "accuracy") & metrics_df["split"].map(lambda s: corruption_of(s) is not None)]
    if acc.empty:
        return pd.DataFrame(columns=cols)
    acc = acc.assign(corruption=acc["split"].map(lambda s: corruption_of(s)[0]), error=1.0 - acc["value"])
    err = acc.groupby(["dataset", "method", "corruption", "split"], sort=False)["error"].mean().reset_index()
    total = err.groupby(["dataset", "method", "corruption"], sort=False)["error"].sum().reset_index()
    rows = []
    for (dataset, method), grp in total.groupby(["dataset", "method"], sort=False):
        ref = total[(total["dataset"] == dataset) & (total["method"] == reference)].set_index("corruption")["error"]
        ces = [(c, e / ref[c]) for c, e in zip(grp["corruption"], grp["error"]) if c in ref and ref[c] > 0]
        rows += [(dataset, method, c, ce) for c, ce in ces]
        if ces:
            rows.append((dataset, method, "mCE", float(np.mean([ce for _, ce in ces]))))
    return pd.DataFrame(rows, columns=cols)


def _efficiency(suite, cells: dict[tuple[str, str, int], dict]) -> pd.DataFrame:
    """Cost per method from ``cell.json`` (mean over seeds); a combinator of M members costs
    the sum of its members' training and prediction, with M x S passes."""
    cols = ["dataset", "method", "parameters", "train_seconds", "predict_seconds_per_1000", "peak_memory_mb", "passes"]
    rows = []
    for d in suite.datasets:
        trained = {}
        for m in suite.methods:
            if m.kind != "trained":
                continue
            infos = [cells[(d.name, m.name, s)] for s in suite.seeds if (d.name, m.name, s) in cells]
            if infos:
                trained[m.name] = {
                    "parameters": infos[0].get("parameters", np.nan),
                    "train_seconds": float(np.mean([i.get("train_seconds", np.nan) for i in infos])),
                    "predict_seconds_per_1000": float(np.mean([i.get("predict_seconds_per_1000", np.nan) for i in infos])),
                    "peak_memory_mb": float(np.max([i.get("peak_memory_mb", np.nan) for i in infos])),
                    "passes": infos[0].get("samples", 1),
                }
        for m in suite.methods:
            if m.name in trained:
                rows.append({"dataset": d.name, "method": m.name, **trained[m.name]})
            elif m.kind == "derived" and m.options.base in trained:
                base = trained[m.options.base]
                k = METHODS.get(m.type)(m.options).members_per_replicate()
                rows.append({"dataset": d.name, "method": m.name, "parameters": base["parameters"] * k,
                             "train_seconds": base["train_seconds"] * k,
                             "predict_seconds_per_1000": base["predict_seconds_per_1000"] * k,
                             "peak_memory_mb": base["peak_memory_mb"], "passes": base["passes"] * k})
    return pd.DataFrame(rows, columns=cols)
