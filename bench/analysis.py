"""Analysis: a store's predictions -> versioned result files that the report reads.

:func:`analyse` evaluates, for every cell of a :class:`~bench.catalog.Catalog` (derived
methods combined from their members' stored predictions), every selected registered
metric: labelled-split metrics (kinds other than ``ood``) on ``test`` and ``shift/...``
splits, OOD metrics on ``ood/...`` splits with the ``test`` split as the
in-distribution side, once per OOD score (MSP; predictive entropy; mutual information
where the decomposition exists).  It adds paired bootstrap intervals and significance
against the reference method (``test`` and OOD splits), corruption aggregates per
severity, corruption errors and the efficiency of every method.  Everything is seeded:
the same store gives the same numbers.

:func:`save` writes them under ``<reports>/<suite>/analysis/`` (:data:`FILES`: tidy CSV
tables a researcher loads with ``pandas.read_csv``, and ``analysis.json`` with the
schema version, the options, the fingerprint of the store and the display orders);
:func:`load` reads them back into an :class:`AnalysisResults`, which is all the report
renders from.  :func:`analyse_store` reuses the files when the fingerprint (the manifests'
digests of the cells used, the selection, the analysis options, the analysis code and the
methods' differences from their authors' code) is unchanged, and recomputes them otherwise.

Why CSV and not Parquet: the tables are small (the default store's per-seed table is
about 1 MB gzipped), CSV needs no further dependency in a suite whose fresh install is
measured against a time budget, it diffs in review, and floats are written with
``repr`` precision so reading them back gives the same bits (the report renders from
the reloaded files, so a cached and a fresh report are byte-identical).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from bench import stats
from bench.catalog import Catalog, Preds
from bench.data import corruption_of, is_ood
from bench.errors import ConfigError
from bench.metrics import entropy, get_metric, selection
from bench.store import atomic_write_bytes, atomic_write_json

ANALYSIS_SCHEMA = 3  # bump when the files' columns or meaning change
ANALYSIS_DIR = "analysis"
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
ALPHA = 0.05  # significance level after Holm correction
SCORES = ("msp", "entropy", "mutual_info")  # OOD scores, higher = more in-distribution
SEVERITY_RESAMPLES = 200  # 75 splits x a few metrics stay fast on CIFAR-sized stores

METRIC_COLUMNS = ["dataset", "method", "seed", "split", "metric", "score", "value"]
SUMMARY_COLUMNS = ["dataset", "method", "split", "table", "metric", "score", "n_seeds", "mean", "std",
                   "ci_low", "ci_high", "p_value", "p_holm", "verdict", "test", "seeds_needed"]
SIGNIFICANCE = stats.SEEDS_AND_SAMPLES  # the default test behind a mark (stats.SIGNIFICANCE_TESTS)
#: ``test`` column: what a p-value accounts for
TESTS = {"both": "seeds+samples", "one_run": "samples only (one run)",
         stats.SAMPLES_SEEDS_FIXED: "samples, seeds fixed"}
SEVERITY_COLUMNS = ["dataset", "method", "severity", "metric", "n_seeds", "mean", "std", "ci_low", "ci_high"]
CE_COLUMNS = ["dataset", "method", "corruption", "ce"]
EFFICIENCY_COLUMNS = ["dataset", "method", "parameters", "train_seconds", "predict_seconds_per_1000",
                      "peak_memory_mb", "passes"]
FAILURE_COLUMNS = ["dataset", "method", "seed", "reason"]
DAMAGED_COLUMNS = ["cell", "dataset", "method", "seed", "reason"]

#: file -> (AnalysisResults field, columns, string columns)
FILES: dict[str, tuple[str, list[str], tuple[str, ...]]] = {
    "metrics.csv.gz": ("metrics", METRIC_COLUMNS, ("dataset", "method", "split", "metric", "score")),
    "summary.csv": ("summary", SUMMARY_COLUMNS, ("dataset", "method", "split", "table", "metric", "score", "verdict",
                                                 "test")),
    "severity.csv": ("severity", SEVERITY_COLUMNS, ("dataset", "method", "metric")),
    "corruption_errors.csv": ("corruption_errors", CE_COLUMNS, ("dataset", "method", "corruption")),
    "efficiency.csv": ("efficiency", EFFICIENCY_COLUMNS, ("dataset", "method")),
    "failures.csv": ("failures", FAILURE_COLUMNS, ("dataset", "method", "reason")),
    "damaged.csv": ("damaged", DAMAGED_COLUMNS, ("cell", "dataset", "method", "reason")),
}
_CODE = ("metrics.py", "stats.py", "analysis.py", "catalog.py", "method.py")  # their text is in the fingerprint


@dataclass
class AnalysisResults:
    """Everything the report renders (what :func:`load` reads from the analysis files).

    ``metrics`` (per seed): columns :data:`METRIC_COLUMNS`; values are raw (unscaled:
    accuracy in [0, 1], NLL in nats, ...).  Labelled-split metrics are rows for ``test``
    and ``shift/...`` splits with ``score == ""``; OOD metrics are rows for ``ood/...``
    splits, computed with the ``test`` split as the in-distribution side, once per OOD
    score: ``"msp"`` (max probability, every method), ``"entropy"`` (negative predictive
    entropy H[p-bar]) and ``"mutual_info"`` (negative mutual information, only for methods
    with several samples or members).  ``seed`` is the training seed, or the replicate
    index for methods combined from several seeds (ensembles).

    ``summary`` (one row per dataset, method, split, metric, score): ``table``
    (``in_distribution`` for ``test``, ``shift``, ``ood``), ``n_seeds``, ``mean``, ``std``
    (over seeds, ddof=1; NaN for one seed), ``ci_low``/``ci_high`` (95% interval of the
    seed-mean), ``p_value`` and ``p_holm`` (test of the difference to ``reference``;
    Holm-corrected across the comparisons of one dataset's table, the ``"paper"``
    selection's metrics as one family and any further analysed metrics as another),
    ``verdict`` (``"ref"``; ``"better"``/``"worse"`` where p_holm < 0.05 in the metric's
    good direction; ``"better (one run)"``/``"worse (one run)"`` when one side's seed
    variation could not be measured; else ``""``), ``test`` (what the p-value accounts
    for, :data:`TESTS`) and ``seeds_needed`` (:func:`bench.stats.seeds_needed`).  With the
    default ``significance`` (``seeds_and_samples``) intervals and tests add the
    seed-level variance to the paired test-sample bootstrap (:mod:`bench.stats`); with
    ``samples_seeds_fixed`` they are the percentile interval and z-test over test samples
    with the trained seeds held fixed.

    ``severity``: the metric averaged over the corruption types evaluated at a severity
    (1..5; 0 = the clean ``test`` split; -1 = every corruption split), then mean/std over
    seeds, with a bootstrap band for the metrics of the ``"severity"`` selection.
    ``corruption_errors``: per corruption the method's summed error over the reference's,
    and ``corruption == "mCE"`` their mean.  ``efficiency``: costs from ``cell.json``
    (means over seeds; combinators add up their members').  ``failures``: cells that
    failed or were interrupted, and derived replicates that could not be formed.
    ``damaged``: cells whose files no longer match their manifest, hold a stray prediction
    file or unusable arrays, and directories that name no cell (``cell`` = directory).

    ``load_predictions(dataset, method, seed, split)`` returns ``(probs [N, C] float64,
    labels [N] int64)`` for plots (:meth:`bench.catalog.Catalog.predictions`).
    """

    suite: str
    metrics: pd.DataFrame
    datasets: list[str]  # display order
    methods: list[str]  # display order (suite order)
    splits: dict[str, list[str]]  # per dataset: evaluated splits in order (test, shift/..., ood/...)
    seeds: dict[tuple[str, str], list[int]]  # (dataset, method) -> seeds/replicates available
    failures: pd.DataFrame
    load_predictions: Callable[[str, str, int, str], tuple[np.ndarray, np.ndarray]]
    reference: str = ""  # the method significance and corruption errors are relative to
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    severity: pd.DataFrame = field(default_factory=pd.DataFrame)
    corruption_errors: pd.DataFrame = field(default_factory=pd.DataFrame)
    efficiency: pd.DataFrame = field(default_factory=pd.DataFrame)
    analysed_metrics: list[str] = field(default_factory=list)  # the metrics the files hold
    significance: str = SIGNIFICANCE  # the test behind the marks and intervals (stats.SIGNIFICANCE_TESTS)
    # dataset -> {metric shown in the tables: metric shown in its place} (e.g. CoLA's
    # accuracy column shows MCC, as the paper's Table 1): the data set's headline_metrics
    headlines: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # dataset -> its protocol note (report_note)
    # method -> how it differs from its authors' code, one line each (Catalog.method_deviations)
    deviations: dict[str, list[str]] = field(default_factory=dict)
    damaged: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=DAMAGED_COLUMNS))


def split_order(split: str) -> tuple:
    group = 0 if split == "test" else 2 if is_ood(split) else 1
    return (group, split)


def table_of(split: str) -> str:
    return "in_distribution" if split == "test" else "ood" if is_ood(split) else "shift"


def analysed_metrics(picked: list[str] | None = None) -> list[str]:
    """The metrics analysis computes: the ``"default"`` selection plus any picked ones."""
    names = list(dict.fromkeys(selection("default") + list(picked or [])))
    for n in names:
        get_metric(n)  # unknown names raise ConfigError, listing the registered ones
    return names


def ood_scores(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-image OOD scores (higher = more in-distribution) of one prediction set."""
    probs = np.exp(arrays["log_probs"].astype(np.float64))
    out = {"msp": probs.max(axis=1), "entropy": -entropy(probs)}
    if "entropy_of_mean" in arrays and "mean_entropy" in arrays:
        mi = arrays["entropy_of_mean"].astype(np.float64) - arrays["mean_entropy"].astype(np.float64)
        out["mutual_info"] = -np.maximum(mi, 0.0)
    return out


def _by_inputs(names: list[str]) -> tuple[list[str], list[str]]:
    """(labelled-split metrics, OOD metrics) of ``names``, order kept."""
    return [n for n in names if not get_metric(n).on_scores], [n for n in names if get_metric(n).on_scores]


def evaluate(preds: Preds, names: list[str],
             errors: dict[tuple[str, str, str], str] | None = None) -> list[tuple[str, str, str, float]]:
    """``(split, metric, score, value)`` for every evaluation split of one prediction set.

    With ``errors``, a metric that raises (a plugin's bug) gives NaN and its error is
    recorded under ``(split, metric, score)``; the other metrics go on.  Without it the
    error propagates."""
    from bench.errors import one_line

    labelled, on_scores = _by_inputs(names)

    def value(name: str, split: str, score: str, *inputs) -> float:
        try:
            return float(get_metric(name)(*inputs))
        except Exception as exc:  # noqa: BLE001  (any error of a metric's own code)
            if errors is None:
                raise
            errors[(split, name, score)] = one_line(exc)
            return float("nan")

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


def check_significance(significance: str) -> str:
    if significance not in stats.SIGNIFICANCE_TESTS:
        raise ConfigError(f"unknown significance test {significance!r}; known: {', '.join(stats.SIGNIFICANCE_TESTS)}")
    return significance


def analyse(catalog: Catalog, metrics: list[str] | None = None, resamples: int = BOOTSTRAP_RESAMPLES,
            seed: int = BOOTSTRAP_SEED, significance: str = SIGNIFICANCE) -> AnalysisResults:
    """Every table of the report, computed from the catalog's stored predictions.
    ``metrics``: the metrics to compute (default :func:`analysed_metrics`);
    ``significance``: the test behind marks and intervals (:data:`bench.stats.SIGNIFICANCE_TESTS`).
    A metric that raises is named once among the failures (where it first raised, with its
    error); its summary rows where it raised have the verdict ``error`` and it gets no
    bootstrap, while every other metric is computed as usual."""
    check_significance(significance)
    names = list(metrics) if metrics is not None else analysed_metrics()
    classes = {d: catalog.dataset_class(d) for d in catalog.datasets}
    headlines = {d: dict(swaps) for d, c in classes.items() if (swaps := getattr(c, "headline_metrics", None))}
    notes = {d: str(note) for d, c in classes.items() if (note := getattr(c, "report_note", None))}
    deviations = {e.name: lines for e in catalog.methods if (lines := catalog.method_deviations(e.name))}
    names += [t for swaps in headlines.values() for t in swaps.values() if t not in names]
    cache: dict[tuple[str, str, int], Preds] = {}
    for d, m, s in list(catalog.cells):
        catalog.stored(d, m, s)  # loads and checks every array; damaged cells leave catalog.cells
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
                    preds = catalog.stored(d, entry.name, rid)
                    if preds is not None:
                        cache[(d, entry.name, rid)] = preds
                    continue
                preds = catalog.combined(d, entry, rid, members)
                if isinstance(preds, dict):
                    cache[(d, entry.name, rid)] = preds
                elif any((d, entry.base, s) in catalog.cells or (d, entry.base, s) in catalog.problems
                         for s in members):
                    failures.append({"dataset": d, "method": entry.name, "seed": rid, "reason": preds})

    rows, raised = [], {}  # raised: (dataset, method, seed, split, metric, score) -> error
    for (d, m, s), preds in cache.items():
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
    computed = [n for n in names if n not in first]  # bootstrapped: a metric that raised would raise again
    metrics_df = pd.DataFrame(rows, columns=METRIC_COLUMNS)
    splits = {d: sorted({sp for (dn, _, _), p in cache.items() if dn == d for sp in p if sp != "val"},
                        key=split_order) for d in catalog.datasets}
    seeds: dict[tuple[str, str], list[int]] = {}
    for d, m, s in cache:
        seeds.setdefault((d, m), []).append(s)
    # methods whose units are training seeds (trained, or one member per replicate): two of
    # them with the same seeds are compared seed by seed
    by_seed = {e.name for e in catalog.methods if e.kind == "trained" or e.method.members_per_replicate() == 1}
    in_bootstrap: dict[str, tuple] = {}  # metric -> (dataset, method, seed, error) where its bootstrap first raised
    summary = _summary(metrics_df, cache, seeds, catalog.reference, computed, resamples, seed, headlines,
                       by_seed, significance, in_bootstrap)
    severity = _severity(metrics_df, cache, seeds, computed, seed, significance, in_bootstrap)
    if raised:
        at = {(d, m, split, metric, score) for d, m, _, split, metric, score in raised}
        keys = summary[["dataset", "method", "split", "metric", "score"]].itertuples(index=False, name=None)
        summary.loc[[k in at for k in keys], "verdict"] = "error"
    failures += [{"dataset": d, "method": m, "seed": s,
                  "reason": f"metric {metric!r} raised {why} in its bootstrap; its values are shown, its intervals "
                            "and marks are left out"}
                 for metric, (d, m, s, why) in in_bootstrap.items()]
    failures_df = pd.DataFrame(failures, columns=FAILURE_COLUMNS)
    if len(failures_df):
        failures_df = failures_df.sort_values(["dataset", "method", "seed", "reason"], kind="stable").reset_index(drop=True)
    return AnalysisResults(
        suite=catalog.name,
        metrics=metrics_df,
        datasets=list(catalog.datasets),
        methods=[e.name for e in catalog.methods],
        splits=splits,
        seeds={k: sorted(v) for k, v in seeds.items()},
        failures=failures_df,
        damaged=pd.DataFrame(damaged, columns=DAMAGED_COLUMNS),
        load_predictions=catalog.predictions,
        reference=catalog.reference,
        summary=summary,
        severity=severity,
        corruption_errors=_corruption_errors(metrics_df, catalog.reference),
        efficiency=_efficiency(catalog),
        analysed_metrics=names,
        significance=significance,
        headlines=headlines,
        notes=notes,
        deviations=deviations,
    )


# ------------------------------------------------------------------ files and the cache


def fingerprint(catalog: Catalog, metrics: list[str], resamples: int, seed: int,
                significance: str = SIGNIFICANCE) -> str:
    """sha256 of everything the analysis files depend on (see the module docstring)."""
    here = Path(__file__).parent
    code = {name: hashlib.sha256((here / name).read_bytes()).hexdigest() for name in _CODE}
    fns = {name: hashlib.sha256(_source(get_metric(name).fn).encode()).hexdigest() for name in metrics}
    deviations = {m.name: catalog.method_deviations(m.name) for m in catalog.methods}  # the methods' code decides
    blob = json.dumps({"schema": ANALYSIS_SCHEMA, "metrics": metrics, "resamples": resamples, "seed": seed,
                       "significance": significance, "code": code, "functions": fns, "store": catalog.fingerprint(),
                       "deviations": deviations}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _source(fn) -> str:
    """A function's source text (a plugin metric's code is not among the files hashed)."""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return repr(fn)


def save(results: AnalysisResults, out: Path, key: str, options: dict) -> None:
    """Write the analysis files under ``out`` (``analysis.json`` last, so a run killed
    midway leaves files whose key does not match and is recomputed)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    digests = {}
    for name, (attr, columns, _) in FILES.items():
        frame = getattr(results, attr)
        frame = frame[columns] if len(frame) else pd.DataFrame(columns=columns)
        text = frame.to_csv(index=False, na_rep="nan", lineterminator="\n")
        data = text.encode("utf-8")
        if name.endswith(".gz"):
            data = _gzip(data)
        atomic_write_bytes(out / name, data)
        digests[name] = hashlib.sha256(data).hexdigest()
    atomic_write_json(out / "analysis.json", {
        "schema": ANALYSIS_SCHEMA,
        "key": key,
        "options": options,
        "suite": results.suite,
        "reference": results.reference,
        "datasets": results.datasets,
        "methods": results.methods,
        "metrics": results.analysed_metrics,
        "headlines": results.headlines,
        "notes": results.notes,
        "deviations": results.deviations,
        "splits": results.splits,
        "seeds": [[d, m, s] for (d, m), s in sorted(results.seeds.items())],
        "files": digests,
        "columns": {name: columns for name, (_, columns, _) in FILES.items()},
    })


def _gzip(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, compresslevel=6, mtime=0)  # mtime 0: the same bytes every time


def read_manifest(out: Path) -> dict | None:
    """``analysis.json`` of ``out`` when it and every file it lists verify, else None."""
    try:
        meta = json.loads((Path(out) / "analysis.json").read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or meta.get("schema") != ANALYSIS_SCHEMA:
            return None
        for name, digest in meta["files"].items():
            if hashlib.sha256((Path(out) / name).read_bytes()).hexdigest() != digest:
                return None
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return None
    return meta


def load(out: Path, load_predictions: Callable | None = None) -> AnalysisResults:
    """The analysis files under ``out`` as :class:`AnalysisResults` (what the report reads)."""
    meta = read_manifest(out)
    if meta is None:
        raise FileNotFoundError(f"no valid analysis files under {out}")
    frames = {}
    for name, (attr, columns, strings) in FILES.items():
        frame = pd.read_csv(Path(out) / name, keep_default_na=False, na_values={c: ["nan"] for c in columns if c not in strings},
                            dtype={c: str for c in strings})
        frames[attr] = frame[columns]

    def missing(*_args):
        raise KeyError("these analysis files were loaded without a store to read predictions from")

    return AnalysisResults(
        suite=meta["suite"],
        datasets=list(meta["datasets"]),
        methods=list(meta["methods"]),
        splits={d: list(v) for d, v in meta["splits"].items()},
        seeds={(d, m): list(s) for d, m, s in meta["seeds"]},
        load_predictions=load_predictions or missing,
        reference=meta["reference"],
        analysed_metrics=list(meta["metrics"]),
        significance=str(meta["options"].get("significance", SIGNIFICANCE)),
        headlines={d: dict(v) for d, v in meta.get("headlines", {}).items()},
        notes=dict(meta.get("notes", {})),
        deviations={m: list(lines) for m, lines in meta.get("deviations", {}).items()},
        **frames,
    )


def analyse_store(catalog: Catalog, out: Path, metrics: list[str] | None = None,
                  resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                  significance: str = SIGNIFICANCE) -> tuple[AnalysisResults, bool]:
    """The analysis of ``catalog`` as written under ``out``: reused when its key matches,
    else recomputed and written.  Returns ``(results read from the files, reused)``."""
    names = analysed_metrics(metrics)
    key = fingerprint(catalog, names, resamples, seed, check_significance(significance))
    meta = read_manifest(out)
    reused = meta is not None and meta.get("key") == key
    if not reused:
        save(analyse(catalog, names, resamples, seed, significance), out, key,
             {"resamples": resamples, "seed": seed, "significance": significance})
    return load(out, catalog.predictions), reused


# ---------------------------------------------------------------------- the statistics


def _units(metrics_df: pd.DataFrame, keys: list[str]) -> dict[tuple, dict[int, float]]:
    """``keys`` tuple -> {seed or replicate: value on the full split} (the units of a mean)."""
    units: dict[tuple, dict[int, float]] = {}
    for *k, s, v in metrics_df[keys + ["seed", "value"]].itertuples(index=False, name=None):
        units.setdefault(tuple(k), {})[int(s)] = float(v)
    return units


def _resampled(errors: dict[str, tuple], where: tuple, name: str, boot, *inputs) -> np.ndarray | None:
    """``boot(name, *inputs)`` (a :mod:`bench.stats` bootstrap of metric ``name``), or None
    once the metric's bootstrap has raised (a plugin's kernel, or its function on one
    resample): its first error is recorded in ``errors`` with ``where`` (dataset, method, seed)."""
    from bench.errors import one_line

    if name in errors:
        return None
    try:
        return boot(name, *inputs)
    except Exception as exc:  # noqa: BLE001  (any error of a metric's own code)
        errors[name] = (*where, one_line(exc))
        return None


def _summary(metrics_df: pd.DataFrame, cache: dict, seeds: dict, reference: str, names: list[str],
             resamples: int, seed: int, headlines: dict[str, dict[str, str]] | None = None,
             by_seed: set[str] | frozenset[str] = frozenset(), significance: str = SIGNIFICANCE,
             errors: dict[str, tuple] | None = None) -> pd.DataFrame:
    """Mean/std over seeds for every (dataset, method, split, metric, score); on ``test``
    and OOD splits also the CI of the seed-mean and the test against the reference method
    (``significance``; methods in ``by_seed`` are keyed by training seed and compared seed
    by seed when both sides have the same seeds), Holm-corrected per (dataset, table)
    within the paper selection (with a dataset's ``headlines`` swapped in: CoLA's MCC for
    accuracy), and separately among any further metrics.  A metric whose bootstrap raises
    (recorded in ``errors``, :func:`_resampled`) keeps its mean and std, without CI or test."""
    errors = {} if errors is None else errors
    if metrics_df.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    labelled, on_scores = _by_inputs(names)
    keys = ["dataset", "method", "split", "metric", "score"]
    g = metrics_df.groupby(keys, sort=False)["value"]
    out = g.agg(n_seeds="count", mean="mean", std=lambda v: v.std(ddof=1) if len(v) > 1 else np.nan).reset_index()
    out.insert(3, "table", out["split"].map(table_of))
    boots: dict[tuple, dict[int, np.ndarray]] = {}  # key -> seed -> the metric on every resample
    for dataset in out["dataset"].unique():
        weights = {}
        for (dn, _method, _s), preds in cache.items():
            if dn != dataset:
                continue
            for split in preds:
                if split == "test" or is_ood(split):
                    n = len(preds[split]["labels"])
                    weights.setdefault(split, _weights(n, resamples, seed, split))
        for method in out.loc[out["dataset"] == dataset, "method"].unique():
            for s in seeds.get((dataset, method), []):
                preds = cache[(dataset, method, s)]
                if "test" not in preds:
                    continue
                probs = np.exp(preds["test"]["log_probs"].astype(np.float64))
                for name in labelled:
                    boot = _resampled(errors, (dataset, method, s), name, stats.boot_metric,
                                      probs, preds["test"]["labels"], weights["test"])
                    if boot is not None:
                        boots.setdefault((dataset, method, "test", name, ""), {})[s] = boot
                test_scores = ood_scores(preds["test"])
                for split in preds:
                    if not is_ood(split):
                        continue
                    scores = ood_scores(preds[split])
                    for score in SCORES:
                        if score in scores and score in test_scores:
                            for name in on_scores:
                                boot = _resampled(errors, (dataset, method, s), name, stats.boot_ood_metric,
                                                  test_scores[score], scores[score], weights["test"], weights[split])
                                if boot is not None:
                                    boots.setdefault((dataset, method, split, name, score), {})[s] = boot
    boots = {k: per_seed for k, per_seed in boots.items() if k[3] not in errors}
    dist = {k: stats.seed_mean_distribution(list(per_seed.values())) for k, per_seed in boots.items()}

    units = _units(metrics_df, keys)
    rows = list(out[keys].itertuples(index=False, name=None))
    means = dict(zip(rows, out["mean"]))
    both = significance == stats.SEEDS_AND_SAMPLES
    ci = [(np.nan, np.nan) if k not in dist else
          stats.seed_mean(units[k], boots[k]).interval() if both else stats.bootstrap_ci(dist[k]) for k in rows]
    out["ci_low"], out["ci_high"] = [c[0] for c in ci], [c[1] for c in ci]
    p_values, directions, tests, needed = [], [], [], []
    for k in rows:
        ref = (k[0], reference, *k[2:])
        if k[1] == reference or k not in dist or ref not in dist:
            p_values.append(np.nan), directions.append(0.0), tests.append(""), needed.append(np.nan)
            continue
        if both:
            pair = (units[k], boots[k], units[ref], boots[ref], k[1] in by_seed and reference in by_seed)
            est = stats.difference(*pair)
            p_values.append(est.p_value())
            directions.append(est.center)
            tests.append(TESTS["both"] if est.measured else TESTS["one_run"])
            needed.append(stats.seeds_needed(*pair))
        else:
            observed = float(means[k] - means[ref])
            p_values.append(stats.paired_z_test(dist[k] - dist[ref], observed))
            directions.append(observed)
            tests.append(TESTS[stats.SAMPLES_SEEDS_FIXED])
            needed.append(np.nan)
    out["p_value"] = p_values
    out["p_holm"] = np.nan
    # Holm families: one dataset's table, the paper selection apart from metrics picked on
    # top of it, so adding columns never changes the verdicts of the paper's metrics
    paper = set(selection("paper"))
    swaps = headlines or {}
    family = pd.Series([
        (metric in paper and metric not in swaps.get(d, {})) or metric in swaps.get(d, {}).values()
        for d, metric in zip(out["dataset"], out["metric"])], index=out.index, dtype=bool)
    for _, idx in out.groupby([out["dataset"], out["table"], family], sort=False).groups.items():
        finite = [i for i in idx if np.isfinite(out.at[i, "p_value"])]
        if finite:
            out.loc[finite, "p_holm"] = stats.holm(out.loc[finite, "p_value"].to_numpy())
    out["verdict"] = [
        _verdict(method, metric, direction, p, reference, test)
        for method, metric, direction, p, test in zip(out["method"], out["metric"], directions, out["p_holm"], tests)
    ]
    out["test"], out["seeds_needed"] = tests, needed
    return out[SUMMARY_COLUMNS]


def _verdict(method: str, metric: str, direction: float, p_holm: float, reference: str, test: str) -> str:
    """``ref`` for the reference; ``better``/``worse`` when significant after Holm (the sign
    of ``direction``, the estimated difference to the reference, against the metric's
    good direction), with `` (one run)`` when a side's seed variation was not measured."""
    if method == reference:
        return "ref"
    if not (np.isfinite(p_holm) and p_holm < ALPHA):
        return ""
    verdict = "better" if (direction > 0) == get_metric(metric).higher_is_better else "worse"
    return verdict + (" (one run)" if test == TESTS["one_run"] else "")


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


def _severity(metrics_df: pd.DataFrame, cache: dict, seeds: dict, names: list[str], seed: int,
              significance: str = SIGNIFICANCE, errors: dict[str, tuple] | None = None) -> pd.DataFrame:
    """Labelled-split metrics averaged over corruption types per severity (0 = clean test,
    -1 = every corruption split), then mean and std over seeds; for the analysed metrics
    of the ``"severity"`` selection also a 95% interval of the seed-mean, built as the
    summary's (``significance``) from a paired bootstrap over test samples (each split
    resampled with its own shared index matrix, the corruption average taken per
    resample) and, by default, the seeds' spread."""
    df = metrics_df[metrics_df["score"] == ""].copy()
    df["severity"] = df["split"].map(_severity_of)
    df = df.dropna(subset=["severity"])
    if df.empty or (df["severity"] > 0).sum() == 0:
        return pd.DataFrame(columns=SEVERITY_COLUMNS)
    df["severity"] = df["severity"].astype(int)
    per_seed = df.groupby(["dataset", "method", "seed", "severity", "metric"], sort=False)["value"].mean().reset_index()
    overall = df[df["severity"] > 0].groupby(["dataset", "method", "seed", "metric"], sort=False)["value"].mean().reset_index()
    overall["severity"] = -1
    per_seed = pd.concat([per_seed, overall[per_seed.columns]], ignore_index=True)
    g = per_seed.groupby(["dataset", "method", "severity", "metric"], sort=False)["value"]
    out = g.agg(n_seeds="count", mean="mean", std=lambda v: v.std(ddof=1) if len(v) > 1 else np.nan).reset_index()
    banded = [n for n in selection("severity") if n in names]
    bands = _severity_bands(df, cache, seeds, banded, seed, {} if errors is None else errors)
    keys = ["dataset", "method", "severity", "metric"]
    units = _units(per_seed, keys)
    ci = [(np.nan, np.nan) if k not in bands else
          stats.seed_mean(units[k], bands[k]).interval() if significance == stats.SEEDS_AND_SAMPLES
          else stats.bootstrap_ci(stats.seed_mean_distribution(list(bands[k].values())))
          for k in out[keys].itertuples(index=False, name=None)]
    out["ci_low"], out["ci_high"] = [c[0] for c in ci], [c[1] for c in ci]
    return out.sort_values(["dataset", "method", "severity", "metric"], kind="stable",
                           key=_display_key(out))[SEVERITY_COLUMNS].reset_index(drop=True)


def _severity_bands(df: pd.DataFrame, cache: dict, seeds: dict, names: list[str],
                    seed: int, errors: dict[str, tuple]) -> dict[tuple, dict[int, np.ndarray]]:
    """(dataset, method, severity, metric) -> seed -> the corruption-averaged metric on
    every resample [B] (each split resampled with its own shared matrix); none for a
    metric whose bootstrap raised (recorded in ``errors``, :func:`_resampled`)."""
    split_severity = dict(zip(df["split"], df["severity"]))
    bands = {}
    for (dataset, method), seed_list in seeds.items():
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
                for name in names:
                    value = _resampled(errors, (dataset, method, s), name, stats.boot_metric, probs, arrays["labels"], w)
                    if value is None:
                        continue
                    sums.setdefault((sev, name), []).append(value)
                    if sev > 0:
                        sums.setdefault((-1, name), []).append(value)
            for (sev, name), values in sums.items():
                bands.setdefault((dataset, method, sev, name), {})[s] = np.mean(values, axis=0)
    return {k: per_seed for k, per_seed in bands.items() if k[3] not in errors}


def _display_key(df: pd.DataFrame):
    """Sort key keeping datasets and methods in their first-appearance (suite) order."""
    order = {c: {v: i for i, v in enumerate(dict.fromkeys(df[c]))} for c in ("dataset", "method")}
    return lambda col: col.map(order[col.name]) if col.name in order else col


def _corruption_errors(metrics_df: pd.DataFrame, reference: str) -> pd.DataFrame:
    """CE_c = sum_s err(method, c, s) / sum_s err(reference, c, s), err = 1 - accuracy
    (seed-mean); mCE = mean over corruptions (Hendrycks & Dietterich, 2019, relative to a
    reference method instead of AlexNet)."""
    acc = metrics_df[(metrics_df["metric"] == "accuracy") & metrics_df["split"].map(lambda s: corruption_of(s) is not None)]
    if acc.empty:
        return pd.DataFrame(columns=CE_COLUMNS)
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
    return pd.DataFrame(rows, columns=CE_COLUMNS)


def _efficiency(catalog: Catalog) -> pd.DataFrame:
    """Cost per method from ``cell.json`` (mean over seeds); a combinator of M members costs
    the sum of its members' training and prediction, with M x S passes."""
    rows = []
    for d in catalog.datasets:
        trained = {}
        for e in catalog.methods:
            if e.kind != "trained":
                continue
            infos = [catalog.cells[(d, e.name, s)].read_cell() or {} for s in catalog.seeds
                     if (d, e.name, s) in catalog.cells]
            if infos:
                trained[e.name] = {
                    "parameters": infos[0].get("parameters", np.nan),
                    "train_seconds": float(np.mean([i.get("train_seconds", np.nan) for i in infos])),
                    "predict_seconds_per_1000": float(np.mean([i.get("predict_seconds_per_1000", np.nan) for i in infos])),
                    "peak_memory_mb": float(np.max([i.get("peak_memory_mb", np.nan) for i in infos])),
                    "passes": infos[0].get("samples", 1),
                }
        for e in catalog.methods:
            if e.name in trained:
                rows.append({"dataset": d, "method": e.name, **trained[e.name]})
            elif e.kind == "derived" and e.base in trained:
                base = trained[e.base]
                k = e.method.members_per_replicate()
                rows.append({"dataset": d, "method": e.name, "parameters": base["parameters"] * k,
                             "train_seconds": base["train_seconds"] * k,
                             "predict_seconds_per_1000": base["predict_seconds_per_1000"] * k,
                             "peak_memory_mb": base["peak_memory_mb"], "passes": base["passes"] * k})
    return pd.DataFrame(rows, columns=EFFICIENCY_COLUMNS)


__all__ = ["AnalysisResults", "analyse", "analyse_store", "analysed_metrics", "save", "load", "fingerprint",
           "evaluate", "ood_scores"]
