"""Statistics: the per-seed metric values summarised over seeds, with intervals and tests.

:func:`summarise` gives mean and std over seeds of every (dataset, method, split, metric,
score), and on ``test`` and OOD splits the interval of the seed-mean and the test against
the reference method (:data:`SIGNIFICANCE_TESTS <bench.analysis.bootstrap.SIGNIFICANCE_TESTS>`: by
default seed-level variation added to a paired bootstrap over test samples), Holm-corrected.
:func:`severity_table` averages the labelled-split metrics over corruption types per
severity, with bootstrap bands; :func:`corruption_errors` gives CE and mCE relative to the
reference; :func:`efficiency` the costs from ``cell.json``.  Everything is seeded: the same
predictions give the same numbers.
"""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench.analysis import bootstrap
from bench.analysis.evaluate import METRIC_COLUMNS, CellScores, labelled_and_ood, metric_value, table_of
from bench.store.catalog import Catalog
from bench.store import CellRecord
from bench.data import corruption_of, is_ood
from bench.core.errors import ConfigError, one_line
from bench.metrics import get_metric, selection

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
ALPHA = 0.05  # significance level after Holm correction
SEVERITY_RESAMPLES = 200  # 75 splits x a few metrics stay fast on CIFAR-sized stores
SIGNIFICANCE = bootstrap.SEEDS_AND_SAMPLES  # the default test behind a mark (bootstrap.SIGNIFICANCE_TESTS)
#: ``test`` column: what a p-value accounts for
TESTS = {"both": "seeds+samples", "one_run": "samples only (one run)",
         bootstrap.SAMPLES_SEEDS_FIXED: "samples, seeds fixed"}

SUMMARY_COLUMNS = ["dataset", "method", "split", "table", "metric", "score", "n_seeds", "mean", "std",
                   "ci_low", "ci_high", "p_value", "p_holm", "verdict", "test", "seeds_needed"]
SEVERITY_COLUMNS = ["dataset", "method", "severity", "metric", "n_seeds", "n_samples", "mean", "std", "ci_low",
                    "ci_high"]
CE_COLUMNS = ["dataset", "method", "corruption", "ce"]
#: the costs of a method (:func:`efficiency`); the report's efficiency table shows them in this order
EFFICIENCY_FIELDS = ("parameters", "train_seconds", "predict_seconds_per_1000", "peak_memory_mb", "passes",
                     "detector_fit_seconds", "detector_score_seconds_per_1000")
EFFICIENCY_COLUMNS = ["dataset", "method", *EFFICIENCY_FIELDS]


def check_significance(significance: str) -> str:
    """``significance`` when it names a test of :data:`bench.analysis.bootstrap.SIGNIFICANCE_TESTS`, else a ConfigError."""
    if significance not in bootstrap.SIGNIFICANCE_TESTS:
        raise ConfigError(f"unknown significance test {significance!r}; known: {', '.join(bootstrap.SIGNIFICANCE_TESTS)}")
    return significance


def _units(metrics_df: pd.DataFrame, keys: list[str]) -> dict[tuple, dict[int, float]]:
    """``keys`` tuple -> {seed or replicate: value on the full split} (the units of a mean)."""
    units: dict[tuple, dict[int, float]] = {}
    for *k, s, v in metrics_df[keys + ["seed", "value"]].itertuples(index=False, name=None):
        units.setdefault(tuple(k), {})[int(s)] = float(v)
    return units


def _resampled(errors: dict[str, tuple], where: tuple, name: str, boot, *inputs) -> np.ndarray | None:
    """``boot(name, *inputs)`` (a :mod:`bench.analysis.bootstrap` bootstrap of metric ``name``), or None
    once the metric's bootstrap has raised (a plugin's kernel, or its function on one
    resample): its first error is recorded in ``errors`` with ``where`` (dataset, method, seed)."""
    if name in errors:
        return None
    try:
        return boot(name, *inputs)
    except Exception as exc:  # noqa: BLE001  (any error of a metric's own code)
        errors[name] = (*where, one_line(exc))
        return None


def summarise(metrics_df: pd.DataFrame, cache: dict, seeds: dict, reference: str, names: list[str],
              resamples: int, seed: int, headlines: dict[str, dict[str, str]] | None = None,
              by_seed: set[str] | frozenset[str] = frozenset(), significance: str = SIGNIFICANCE,
              errors: dict[str, tuple] | None = None,
              scores: dict[tuple[str, str, int], CellScores] | None = None) -> pd.DataFrame:
    """Mean/std over seeds for every (dataset, method, split, metric, score); on ``test``
    and OOD splits also the CI of the seed-mean and the test against the reference method
    (``significance``; methods in ``by_seed`` are keyed by training seed and compared seed
    by seed when both sides have the same seeds), Holm-corrected per (dataset, table)
    within the paper selection (with a dataset's ``headlines`` swapped in: CoLA's MCC for
    accuracy), and separately among any further metrics.  A metric whose bootstrap raises
    (recorded in ``errors``, :func:`_resampled`) keeps its mean and std, without CI or test.
    ``seeds_needed`` (default test only) is what a mark needs in the comparison's Holm family
    of m finite p-values: 80% power for p < ALPHA / m.  A metric whose estimate is
    bias-corrected by construction (its record's ``bias_corrected``) has its interval centred
    on it, every other one on its estimate less the bootstrap's bias estimate; a difference
    is tested on its observed value (:func:`bench.analysis.bootstrap.difference`).
    ``scores``: the OOD scores of every prediction set (``bench.analysis.evaluate.ood_scores``),
    which the OOD metrics are bootstrapped on."""
    errors = {} if errors is None else errors
    if metrics_df.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    keys = ["dataset", "method", "split", "metric", "score"]
    g = metrics_df.groupby(keys, sort=False)["value"]
    out = g.agg(n_seeds="count", mean="mean", std=lambda v: v.std(ddof=1) if len(v) > 1 else np.nan).reset_index()
    out.insert(3, "table", out["split"].map(table_of))
    boots = _summary_boots(out, cache, seeds, names, resamples, seed, errors, scores or {})
    boots = {k: per_seed for k, per_seed in boots.items() if k[3] not in errors}
    dist = {k: bootstrap.seed_mean_distribution(list(per_seed.values())) for k, per_seed in boots.items()}

    units = _units(metrics_df, keys)
    rows = list(out[keys].itertuples(index=False, name=None))
    both = significance == bootstrap.SEEDS_AND_SAMPLES
    ci = [(np.nan, np.nan) if k not in dist else
          get_metric(k[3]).clip(*(bootstrap.seed_mean(units[k], boots[k], bias_corrected=_bias_corrected(k[3]))
                                  .interval() if both else bootstrap.bootstrap_ci(dist[k])))
          for k in rows]
    out["ci_low"], out["ci_high"] = [c[0] for c in ci], [c[1] for c in ci]
    means = dict(zip(rows, out["mean"]))
    comparisons = [_compare(k, reference, units, boots, dist, means, by_seed, both) for k in rows]
    out["p_value"] = [c.p_value for c in comparisons]
    out["seeds_needed"] = np.nan
    out["p_holm"] = np.nan
    _holm(out, {i: c.pair for i, c in zip(out.index, comparisons) if c.pair is not None}, headlines or {})
    out["verdict"] = [
        _verdict(method, metric, c.direction, p, reference, c.test)
        for method, metric, c, p in zip(out["method"], out["metric"], comparisons, out["p_holm"])
    ]
    out["test"] = [c.test for c in comparisons]
    return out[SUMMARY_COLUMNS]


def _summary_boots(out: pd.DataFrame, cache: dict, seeds: dict, names: list[str], resamples: int, seed: int,
                   errors: dict[str, tuple], scores: dict) -> dict[tuple, dict[int, np.ndarray]]:
    """(dataset, method, split, metric, score) -> seed -> the metric on every resample: the
    labelled metrics on ``test``, the OOD metrics on every OOD split's scores against
    ``test``'s (each split resampled with :func:`_weights` of its size)."""
    labelled, on_scores = labelled_and_ood(names)
    boots: dict[tuple, dict[int, np.ndarray]] = {}  # key -> seed -> the metric on every resample
    for dataset in out["dataset"].unique():
        weights = {}
        for (dn, _method, _s), preds in cache.items():
            if dn != dataset:
                continue
            for split in preds:
                if split == "test" or is_ood(split):
                    n = len(preds[split])
                    weights.setdefault(split, _weights(n, resamples, seed, split))
        for method in out.loc[out["dataset"] == dataset, "method"].unique():
            for s in seeds.get((dataset, method), []):
                preds = cache[(dataset, method, s)]
                if "test" not in preds:
                    continue
                where = (dataset, method, s)
                probs = np.exp(preds["test"].log_probs.astype(np.float64))
                for name in labelled:
                    boot = _resampled(errors, where, name, bootstrap.boot_metric, probs, preds["test"].labels,
                                      weights["test"])
                    if boot is not None:
                        boots.setdefault((dataset, method, "test", name, ""), {})[s] = boot
                _ood_boots(boots, where, preds, scores.get(where, {}), on_scores, weights, errors)
    return boots


def _ood_boots(boots: dict, where: tuple, preds: dict, cell_scores: CellScores, on_scores: list[str],
               weights: dict[str, np.ndarray], errors: dict[str, tuple]) -> None:
    """Add to ``boots`` the OOD metrics of one prediction set (``where``: dataset, method,
    seed) on every OOD split's scores against ``test``'s, for each score both have."""
    dataset, method, s = where
    test_scores = cell_scores.get("test", {})
    for split in preds:
        if not is_ood(split):
            continue
        for score, ood in cell_scores.get(split, {}).items():
            if score in test_scores:
                for name in on_scores:
                    boot = _resampled(errors, where, name, bootstrap.boot_ood_metric,
                                      test_scores[score], ood, weights["test"], weights[split])
                    if boot is not None:
                        boots.setdefault((dataset, method, split, name, score), {})[s] = boot


@dataclass(frozen=True)
class _Comparison:
    """One summary row against the reference method: the p-value (NaN: not tested), the
    direction of the difference, the ``test`` column and, for the default test, the
    :func:`bench.analysis.bootstrap.difference` arguments (what ``seeds_needed`` reuses)."""
    p_value: float = np.nan
    direction: float = 0.0
    test: str = ""
    pair: tuple | None = None


def _compare(k: tuple, reference: str, units: dict, boots: dict, dist: dict, means: dict,
             by_seed: set[str] | frozenset[str], both: bool) -> _Comparison:
    """The test of row ``k`` (dataset, method, split, metric, score) against the reference
    method's row: the default test (``both``: seeds and samples) or a paired z-test of the
    bootstrap distributions with the seeds fixed; none for the reference itself or where a
    side has no bootstrap."""
    ref = (k[0], reference, *k[2:])
    if k[1] == reference or k not in dist or ref not in dist:
        return _Comparison()
    if both:
        pair = (units[k], boots[k], units[ref], boots[ref], k[1] in by_seed and reference in by_seed)
        est = bootstrap.difference(*pair)
        return _Comparison(est.p_value(), est.center, TESTS["both"] if est.measured else TESTS["one_run"], pair)
    observed = float(means[k] - means[ref])
    return _Comparison(bootstrap.paired_z_test(dist[k] - dist[ref], observed), observed,
                       TESTS[bootstrap.SAMPLES_SEEDS_FIXED])


def _holm(out: pd.DataFrame, pairs: dict[int, tuple], swaps: dict[str, dict[str, str]]) -> None:
    """Fill ``p_holm`` and ``seeds_needed`` of ``out``: Holm families are one dataset's
    table, the paper selection (with the dataset's headline ``swaps``) apart from metrics
    picked on top of it, so adding columns never changes the verdicts of the paper's
    metrics; what a mark needs in its family is p below ALPHA / the family's size (Holm's
    first step), for the rows with ``pairs`` (the default test)."""
    paper = set(selection("paper"))
    family = pd.Series([
        (metric in paper and metric not in swaps.get(d, {})) or metric in swaps.get(d, {}).values()
        for d, metric in zip(out["dataset"], out["metric"])], index=out.index, dtype=bool)
    for _, idx in out.groupby([out["dataset"], out["table"], family], sort=False).groups.items():
        finite = [i for i in idx if np.isfinite(out.at[i, "p_value"])]
        if finite:
            out.loc[finite, "p_holm"] = bootstrap.holm(out.loc[finite, "p_value"].to_numpy())
        for i in finite:
            if i in pairs:
                out.at[i, "seeds_needed"] = bootstrap.seeds_needed(*pairs[i], family=len(finite), alpha=ALPHA)


def _bias_corrected(metric: str) -> bool:
    """The metric's estimate is bias-corrected by construction (its record's
    ``bias_corrected``): its intervals and tests get no bootstrap bias correction."""
    return get_metric(metric).bias_corrected


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
    w = bootstrap.resample_weights(n, resamples, (seed + offset) % 2**32)
    w.flags.writeable = False
    return w


def _severity_of(split: str) -> int | None:
    """1..5 for ``shift/<corruption>/<severity>``, None otherwise."""
    corruption = corruption_of(split)
    return corruption[1] if corruption else None


def clean_source_size(preds: dict, split: str) -> int:
    """How many leading ``test`` images the corruption split ``split`` of one prediction
    set was made from (:mod:`bench.data`: a corruption split holds the first N test
    images, corrupted): N, its own size, when its labels are those of the first N test
    images; the whole test split where they are not (a split made otherwise)."""
    labels, test = preds[split].labels, preds["test"].labels
    n = len(labels)
    return n if n <= len(test) and np.array_equal(labels, test[:n]) else len(test)


def _one_size(sizes: set[int]) -> float:
    """The one image count of the splits averaged in a row, NaN where they differ."""
    return float(next(iter(sizes))) if len(sizes) == 1 else np.nan


def _clean_rows(df: pd.DataFrame, cache: dict) -> tuple[pd.DataFrame, dict[tuple, dict[str, int]]]:
    """Severity-0 rows: per cell and metric, the metric on the clean test samples each
    corruption split was made from (:func:`clean_source_size`), averaged over the
    corruption splits as the corrupted values are; and per cell, corruption split ->
    that image count.  A metric that raises gives NaN (its error is named by evaluation)."""
    rows, sizes = [], {}
    for (d, m, s), cell in df.groupby(["dataset", "method", "seed"], sort=False):
        preds = cache.get((d, m, s), {})
        if "test" not in preds:
            continue
        mine = sizes[(d, m, s)] = {split: clean_source_size(preds, split) for split in dict.fromkeys(cell["split"])}
        probs, labels = np.exp(preds["test"].log_probs.astype(np.float64)), preds["test"].labels
        for name in dict.fromkeys(cell["metric"]):
            values = {n: metric_value(name, (probs[:n], labels[:n]), errors={}) for n in set(mine.values())}
            value = (next(iter(values.values())) if len(values) == 1
                     else float(np.mean([values[n] for n in mine.values()])))
            rows.append((d, m, s, "test", name, "", value, 0))
    return pd.DataFrame(rows, columns=[*METRIC_COLUMNS, "severity"]), sizes


def severity_table(metrics_df: pd.DataFrame, cache: dict, seeds: dict, names: list[str], seed: int,
                   significance: str = SIGNIFICANCE, errors: dict[str, tuple] | None = None) -> pd.DataFrame:
    """Labelled-split metrics averaged over corruption types per severity (-1 = every
    corruption split), then mean and std over seeds.  Severity 0 is the same images
    clean: each corruption split's clean source, the first N images of ``test``
    (:func:`clean_source_size`), averaged alike; ``n_samples`` is the image count of each
    split a row averages (NaN where they differ).  For the analysed metrics of the
    ``"severity"`` selection also a 95% interval of the seed-mean, built as the summary's
    (``significance``) from a paired bootstrap over the images (one shared index matrix
    per split size, so a corruption split and its clean source are resampled alike, the
    corruption average taken per resample) and, by default, the seeds' spread."""
    df = metrics_df[metrics_df["score"] == ""].copy()
    df["severity"] = df["split"].map(_severity_of)
    df = df.dropna(subset=["severity"])
    if df.empty:
        return pd.DataFrame(columns=SEVERITY_COLUMNS)
    df["severity"] = df["severity"].astype(int)
    clean, clean_sizes = _clean_rows(df, cache)
    images: dict[tuple, set[int]] = {}
    for d, m, s, split, sev in df[["dataset", "method", "seed", "split", "severity"]].drop_duplicates().itertuples(
            index=False, name=None):
        n = len(cache[(d, m, s)][split])
        images.setdefault((d, m, sev), set()).add(n)
        images.setdefault((d, m, -1), set()).add(n)
    for (d, m, _s), per_split in clean_sizes.items():
        images.setdefault((d, m, 0), set()).update(per_split.values())
    per_seed = pd.concat([clean, df], ignore_index=True) if len(clean) else df
    per_seed = (per_seed.groupby(["dataset", "method", "seed", "severity", "metric"], sort=False)["value"]
                .mean().reset_index())
    overall = df.groupby(["dataset", "method", "seed", "metric"], sort=False)["value"].mean().reset_index()
    overall["severity"] = -1
    per_seed = pd.concat([per_seed, overall[per_seed.columns]], ignore_index=True)
    g = per_seed.groupby(["dataset", "method", "severity", "metric"], sort=False)["value"]
    out = g.agg(n_seeds="count", mean="mean", std=lambda v: v.std(ddof=1) if len(v) > 1 else np.nan).reset_index()
    out["n_samples"] = [_one_size(images.get(k, set())) for k in out[["dataset", "method", "severity"]].itertuples(
        index=False, name=None)]
    banded = [n for n in selection("severity") if n in names]
    bands = _severity_bands(df, cache, seeds, clean_sizes, banded, seed, {} if errors is None else errors)
    keys = ["dataset", "method", "severity", "metric"]
    units = _units(per_seed, keys)
    ci = [(np.nan, np.nan) if k not in bands else
          get_metric(k[3]).clip(*(bootstrap.seed_mean(units[k], bands[k], bias_corrected=_bias_corrected(k[3]))
                                  .interval()
                                  if significance == bootstrap.SEEDS_AND_SAMPLES
                                  else bootstrap.bootstrap_ci(bootstrap.seed_mean_distribution(list(bands[k].values())))))
          for k in out[keys].itertuples(index=False, name=None)]
    out["ci_low"], out["ci_high"] = [c[0] for c in ci], [c[1] for c in ci]
    return out.sort_values(["dataset", "method", "severity", "metric"], kind="stable",
                           key=_display_key(out))[SEVERITY_COLUMNS].reset_index(drop=True)


def _severity_bands(df: pd.DataFrame, cache: dict, seeds: dict, clean_sizes: dict[tuple, dict[str, int]],
                    names: list[str], seed: int, errors: dict[str, tuple]) -> dict[tuple, dict[int, np.ndarray]]:
    """(dataset, method, severity, metric) -> seed -> the corruption-averaged metric on
    every resample [B] (each split resampled with the shared matrix of its size; severity
    0: each corruption split's clean source, ``clean_sizes``); none for a metric whose
    bootstrap raised (recorded in ``errors``, :func:`_resampled`)."""
    split_severity = dict(zip(df["split"], df["severity"]))
    bands = {}
    for (dataset, method), seed_list in seeds.items():
        for s in seed_list:
            preds = cache[(dataset, method, s)]
            sums: dict[tuple[int, str], list[np.ndarray]] = {}
            parts = [(split, sev, preds[split], 1) for split, sev in split_severity.items() if split in preds]
            clean = list(clean_sizes.get((dataset, method, s), {}).values())
            parts += [("test", 0, preds["test"].head(n),
                       clean.count(n) if len(set(clean)) > 1 else 1) for n in sorted(set(clean))]
            for split, sev, arrays, copies in parts:
                n = len(arrays)
                w = _weights(n, SEVERITY_RESAMPLES, seed)
                probs = np.exp(arrays.log_probs.astype(np.float64))
                for name in names:
                    value = _resampled(errors, (dataset, method, s), name, bootstrap.boot_metric, probs, arrays.labels, w)
                    if value is None:
                        continue
                    sums.setdefault((sev, name), []).extend([value] * copies)
                    if sev > 0:
                        sums.setdefault((-1, name), []).append(value)
            for (sev, name), values in sums.items():
                bands.setdefault((dataset, method, sev, name), {})[s] = np.mean(values, axis=0)
    return {k: per_seed for k, per_seed in bands.items() if k[3] not in errors}


def _display_key(df: pd.DataFrame):
    """Sort key keeping datasets and methods in their first-appearance (suite) order."""
    order = {c: {v: i for i, v in enumerate(dict.fromkeys(df[c]))} for c in ("dataset", "method")}
    return lambda col: col.map(order[col.name]) if col.name in order else col


def corruption_errors(metrics_df: pd.DataFrame, reference: str) -> pd.DataFrame:
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


def efficiency(catalog: Catalog) -> pd.DataFrame:
    """Cost per method from ``cell.json``: a trained method's mean over its used cells; a
    derived one's over the replicates formed (:meth:`~bench.store.catalog.Catalog.formed`), each
    costing the sum of its members' parameters, training, prediction and passes (the
    first replicate's parameters and passes; time means over replicates; the largest peak
    memory).  A method with no used cell or formed replicate on
    a dataset has no row there: no cost is given for what was not computed."""
    rows = []
    for d in catalog.datasets:
        for e in catalog.methods:
            if e.kind == "trained":
                infos = [catalog.record(catalog.cells[(d, e.name, s)]) for s in catalog.seeds
                         if (d, e.name, s) in catalog.cells]
                if infos:
                    rows.append({
                        "dataset": d, "method": e.name,
                        "parameters": _recorded(infos[0].parameters),
                        "train_seconds": float(np.mean([_train_seconds(i) for i in infos])),
                        "predict_seconds_per_1000": float(np.mean([_recorded(i.predict_seconds_per_1000)
                                                                   for i in infos])),
                        "peak_memory_mb": float(np.max([_recorded(i.peak_memory_mb) for i in infos])),
                        "passes": _passes(infos[0]),
                        **_detector_seconds(infos),
                    })
                continue
            formed = catalog.formed(d, e)
            if formed:
                costs = [_replicate_costs([catalog.record(catalog.cells[(d, e.base, s)]) for s in members])
                         for _, members in formed]
                rows.append({"dataset": d, "method": e.name, "parameters": costs[0]["parameters"],
                             **{k: float(np.mean([c[k] for c in costs])) for k in ("train_seconds",
                                                                                 "predict_seconds_per_1000")},
                             "peak_memory_mb": float(np.max([c["peak_memory_mb"] for c in costs])),
                             "passes": costs[0]["passes"],
                             "detector_fit_seconds": np.nan, "detector_score_seconds_per_1000": np.nan})
    return pd.DataFrame(rows, columns=EFFICIENCY_COLUMNS)


def _replicate_costs(infos: list[CellRecord]) -> dict:
    """One derived replicate's costs from its members' ``cell.json``: parameters, training,
    prediction and passes added up, peak memory the largest."""
    return {"parameters": sum(_recorded(i.parameters) for i in infos),
            "train_seconds": float(sum(_train_seconds(i) for i in infos)),
            "predict_seconds_per_1000": float(sum(_recorded(i.predict_seconds_per_1000) for i in infos)),
            "peak_memory_mb": float(np.max([_recorded(i.peak_memory_mb) for i in infos])),
            "passes": sum(_passes(i) for i in infos)}


def _recorded(value):
    """A number of ``cell.json``, NaN where it is not recorded."""
    return np.nan if value is None else value


def _passes(info: CellRecord) -> int:
    """A cell's prediction passes (1 where ``cell.json`` records none)."""
    return 1 if info.samples is None else info.samples


def _train_seconds(info: CellRecord) -> float:
    """A cell's training seconds, a two-stage cell's stage 1 included (``stage1`` in
    cell.json: the stored cell's seconds when it was reused, else the seconds it took
    inside this cell): what it costs to have this model."""
    first = info.stage1.train_seconds if info.stage1 is not None else None
    return float(_recorded(info.train_seconds)) + float(first or 0.0)


def _detector_seconds(infos: list[CellRecord]) -> dict[str, float]:
    """The feature-space OOD detectors' cost of a method (``ood_detectors`` in cell.json,
    :func:`bench.scores.detector_cost`): fit seconds and scoring seconds per 1,000 images,
    each summed over the detectors a cell measured and averaged over the seeds; NaN where
    no cell measured any (no stored features, or a store written before they were)."""
    measured = [i.ood_detectors for i in infos if i.ood_detectors]

    def total(field: str) -> float:
        return float(np.mean([sum(float(d[field]) for d in m.values()) for m in measured])) if measured else np.nan

    return {"detector_fit_seconds": total("fit_seconds"),
            "detector_score_seconds_per_1000": total("score_seconds_per_1000")}
