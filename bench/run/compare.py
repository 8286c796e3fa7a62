"""``compare``: does a run reproduce a reference report, within stated tolerances?

:func:`compare_run` analyses a run's store afresh, as ``report`` analyses it (the store's
cells selected by the run's recorded plan; the reference's metrics, OOD scores and
analysis options), into a temporary folder (nothing is written to the store or to any
report), and compares the numbers with the reference report's analysis files
(``REFERENCE/analysis/``): every per-seed value (``metrics.csv.gz``) and every mean over
seeds (``summary.csv``), per dataset, method, split, metric and OOD score.  Timings (the
efficiency table, training seconds) and the training logs are not compared; the
intervals, p-values, severity averages and corruption errors of the tables are computed
from the values compared.

The rule (:func:`tolerance`): a difference ``|run - reference|`` (raw units: fractions,
nats) is within tolerance when it is at most the larger of

* a tenth of the reference's standard deviation over seeds of that dataset, method,
  split, metric and score (:data:`SEED_FRACTION`; none for a method with one seed), and
* one sample of that split: ``1/N`` for its ``N`` images (for an OOD split the smaller of
  the OOD set and the test split), what accuracy, FPR95 and the other ranking metrics
  move by when one image changes side.

Both values missing (NaN: e.g. a failure metric on a split without errors) is equal; one
missing is outside.  Measured, for the default suite: on one machine a re-run gives every
value bit for bit; across machines the per-cell values differ at float32 round-off (test
ECE 0.0335626444 vs 0.0335626507) while accuracies are identical, and ranking metrics on
the 50-image corruption splits and the 500-image OOD sets move by one sample (an OOD FPR95
94.73% -> 94.80%: one image of 500 at one seed), all within the rule.

Runs of different plans are not compared (:class:`~bench.core.errors.ConfigError`): the cells
(dataset, method, seed and, where the reference's ``cells.json`` records it, the
configuration), the methods, the seeds or replicates, and the splits must be the same.
"""
from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench.analysis import ANALYSIS_DIR, ANALYSIS_SCHEMA, AnalysisResults, analyse_store, load, read_manifest
from bench.store.catalog import Catalog, open_store
from bench.core.errors import ConfigError
from bench.metrics import get_metric
from bench.store.plan import make_plan
from bench.core.registry import METRICS, SCORES
from bench.run.report import cells_record, read_cells_record
from bench.store.runs import COMMAND
from bench.config.spec import Suite

#: the fraction of the reference's seed std a difference may reach
SEED_FRACTION = 0.1
#: relative slack on the tolerance: a difference of exactly one sample, computed in floating point
SLACK = 1e-9
#: a seed std at or below this is round-off of equal values: no spread to measure a difference in
NO_SPREAD = 1e-12
#: the rule, as the command's help, its verdict and the docs state it
RULE = ("a value is within tolerance when |run - reference| <= max(seed std / 10, one sample of its split: 1/N "
        "for N images, for an OOD split the smaller of the OOD set and the test split)")
_KEYS = ["dataset", "method", "split", "metric", "score"]


@dataclass(frozen=True)
class Difference:
    """One compared value: ``seed`` (``None``: the mean over seeds), the run's and the
    reference's values (raw units; NaN: missing), ``delta`` (``|run - reference|``, 0 when
    both are missing, inf when one is), the reference's seed ``std`` (NaN for one seed),
    the split's ``samples`` (0: unknown) and the ``tolerance`` (:func:`tolerance`)."""

    dataset: str
    method: str
    split: str
    metric: str
    score: str
    seed: int | None
    run: float
    reference: float
    delta: float
    std: float
    samples: int
    tolerance: float

    @property
    def ratio(self) -> float:
        """The difference in tolerances (> 1: outside)."""
        return self.delta / self.tolerance if self.tolerance > 0 else (0.0 if self.delta == 0 else math.inf)

    @property
    def outside(self) -> bool:
        return self.delta > self.tolerance * (1 + SLACK)

    @property
    def in_std(self) -> float:
        """The difference in the reference's seed std (NaN when it has none: one seed, or
        seeds whose values are equal up to round-off, std <= :data:`NO_SPREAD`)."""
        return self.delta / self.std if self.std > NO_SPREAD else math.nan

    def line(self) -> str:
        """The difference as ``compare`` lists it, in the metric's report units."""
        scale, unit = _units(self.metric)
        score = f" [{self.score}]" if self.score else ""
        at = f"seed {self.seed}" if self.seed is not None else "mean over seeds"
        if math.isinf(self.delta):
            which = "the run" if math.isnan(self.reference) else "the reference"
            return (f"{self.dataset} / {self.method} / {self.metric}{score} on {self.split} ({at}): computed only in "
                    f"{which} (run {_num(self.run, scale)}, reference {_num(self.reference, scale)})")
        spread = f" = {self.in_std:.3g} seed std" if not math.isnan(self.in_std) else " (no seed std)"
        why = ("a tenth of the seed std" if self.std > NO_SPREAD and SEED_FRACTION * self.std >= _resolution(self.samples)
               else f"one sample of {self.samples}" if self.samples else "no seed std, split size unknown")
        return (f"{self.dataset} / {self.method} / {self.metric}{score} on {self.split} ({at}): run "
                f"{_num(self.run, scale)}{unit} vs reference {_num(self.reference, scale)}{unit}; |diff| "
                f"{_num(self.delta, scale)}{unit}{spread}; tolerance {_num(self.tolerance, scale)}{unit} ({why})")


@dataclass(frozen=True)
class Comparison:
    """The outcome of :func:`compare_run`: the reference as given, every compared value
    (:class:`Difference`), the metrics in the reference's order, and notes on what was not
    compared."""

    reference: str
    values: list[Difference]
    metrics: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def outside(self) -> list[Difference]:
        """The values outside their tolerance, worst (most tolerances away) first."""
        return sorted((d for d in self.values if d.outside), key=lambda d: (-d.ratio, _order(d)))

    @property
    def reproduces(self) -> bool:
        return not any(d.outside for d in self.values)

    def verdict(self) -> list[str]:
        """One line when the run reproduces the reference; else a line with the counts, one
        line per dataset, method, metric and score outside (its worst value; worst first)
        and the rule."""
        if self.reproduces:
            return [f"reproduces {self.reference} within its tolerances"]
        outside = self.outside
        worst: dict[tuple, tuple[Difference, int]] = {}
        for d in outside:
            key = (d.dataset, d.method, d.metric, d.score)
            first, count = worst.get(key, (d, 0))
            worst[key] = (first, count + 1)
        lines = [f"does not reproduce {self.reference}: {len(outside)} of {len(self.values)} values outside their "
                 f"tolerances, in {len(worst)} row{'s' if len(worst) > 1 else ''} (dataset, method, metric, score), worst "
                 "first:"]
        for first, count in worst.values():
            lines.append(f"  {first.line()}" + (f" [{count} values outside]" if count > 1 else ""))
        lines.append(f"  ({RULE})")
        return lines

    def details(self) -> list[str]:
        """Per dataset and metric: the values compared, the largest difference (in the
        metric's report units, where) and the largest in seed stds, and how many are outside."""
        from tabulate import tabulate

        rows = []
        groups: dict[tuple[str, str], list[Difference]] = {}
        for d in self.values:
            groups.setdefault((d.dataset, d.metric), []).append(d)
        order = {name: i for i, name in enumerate(self.metrics)}
        for (dataset, metric), values in sorted(groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], -1))):
            scale, unit = _units(metric)
            largest = max(values, key=lambda d: d.delta)
            spread = [d for d in values if not math.isnan(d.in_std)]
            in_std = max(spread, key=lambda d: d.in_std) if spread else None
            rows.append([dataset, metric, len(values), f"{_num(largest.delta, scale)}{unit}",
                         _where(largest) if largest.delta > 0 else "",
                         f"{in_std.in_std:.3g}" if in_std is not None else "n/a",
                         _where(in_std) if in_std is not None and in_std.delta > 0 else "",
                         sum(d.outside for d in values)])
        return tabulate(rows, headers=["dataset", "metric", "values", "largest |diff|", "at", "largest in seed std",
                                       "at", "outside"], tablefmt="simple", disable_numparse=True).splitlines()


def tolerance(std: float, samples: int) -> float:
    """The tolerance of a value (module docstring): the larger of :data:`SEED_FRACTION` of
    the reference's seed ``std`` (NaN: none) and one sample of a split of ``samples``
    images (0: unknown)."""
    spread = SEED_FRACTION * std if std > NO_SPREAD else 0.0  # NaN > x is False
    return max(spread, _resolution(samples))


def compare_run(store_root: Path, reference: Path, suite: Suite | None = None, own_report: Path | None = None,
                shown: str | None = None) -> Comparison:
    """Compare the run whose store is ``store_root`` with the report folder ``reference``
    (module docstring).  ``suite``: the run's recorded plan, which selects its cells as
    ``report`` does (None: the store alone); ``own_report``: the run's own report folder,
    refused as the reference (``run`` rewrites it: it would compare the run with itself);
    ``shown``: how the verdict names the reference (default: the path).  A reference that
    is no report folder, whose analysis files do not verify or were written by another
    schema, that analysed metrics or scores not registered here, or whose plan differs from
    the run's is a ConfigError."""
    reference = Path(reference)
    shown = shown or str(reference)
    if own_report is not None and Path(own_report).resolve() == reference.resolve():
        raise ConfigError(
            f"compare: {shown} is this run's own report (its run and report rewrite it), not a reference: compare "
            f"with a copy of the reference, e.g. the committed one: `make compare`, or `git archive HEAD "
            f"{shown} | tar -x -C DIR` and compare with DIR/{shown}")
    ref, meta = _read_reference(reference, shown)
    catalog = _open_run(store_root, suite)
    _check_cells(catalog, reference, shown)
    with tempfile.TemporaryDirectory(prefix="uqbench-compare-") as tmp:
        options = meta.get("options") or {}
        run, _ = analyse_store(catalog, Path(tmp) / ANALYSIS_DIR, ref.analysed_metrics,
                               resamples=int(options.get("resamples", 1000)), seed=int(options.get("seed", 0)),
                               significance=str(options.get("significance", ref.significance)),
                               scores=ref.scores or None)
    _check_plan(run, ref, shown)
    notes = []
    extra = [m for m in run.analysed_metrics if m not in ref.analysed_metrics]
    if extra:
        notes.append(f"metric(s) {', '.join(extra)}: not in the reference's analysis, not compared")
    if read_cells_record(reference) is None:
        notes.append(f"{shown} records no cells.json (a report written before reports recorded their cells): the "
                     "cells' configurations were not checked, only their datasets, methods and seeds")
    return Comparison(shown, _differences(run, ref, _split_sizes(catalog, run)), list(ref.analysed_metrics), notes)


def _read_reference(folder: Path, shown: str) -> tuple[AnalysisResults, dict]:
    """The reference's analysis files and their ``analysis.json`` (ConfigError naming what
    is wrong when they are not there, not readable or do not verify)."""
    where = folder / ANALYSIS_DIR
    if not folder.is_dir():
        raise ConfigError(f"compare: no report folder {shown}; give a report folder as the reference, e.g. "
                          "reports/default")
    try:
        meta = json.loads((where / "analysis.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"compare: {shown} has no analysis files ({where / 'analysis.json'} is missing); give a "
                          "report folder written by `run` or `report`, e.g. reports/default") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"compare: {where / 'analysis.json'} cannot be read ({exc}); restore it (e.g. git "
                          f"checkout {shown}) or give another reference") from None
    schema = meta.get("schema") if isinstance(meta, dict) else None
    if schema != ANALYSIS_SCHEMA:
        raise ConfigError(f"compare: {shown} holds analysis files of schema {schema!r}, this version reads "
                          f"{ANALYSIS_SCHEMA}: re-report the reference's store with this version ({' '.join(COMMAND)} "
                          "report), or compare with a reference written by it")
    if read_manifest(where) is None:
        raise ConfigError(f"compare: the analysis files under {where} do not match the digests their analysis.json "
                          f"records (changed or cut short after they were written); restore them (e.g. git checkout "
                          f"{shown}) or give another reference")
    ref = load(where)
    unknown = [m for m in ref.analysed_metrics if m not in METRICS] + [s for s in ref.scores if s not in SCORES]
    if unknown:
        raise ConfigError(f"compare: {shown} analysed {', '.join(map(repr, unknown))}, which nothing registered here "
                          "defines: pass --plugin MODULE for the module that registers it")
    return ref, meta


def _open_run(store_root: Path, suite: Suite | None) -> Catalog:
    """The run's store as ``report`` opens it: the cells its plan (``suite``) expects, or
    the store alone."""
    planned = {c.key for c in make_plan(suite).cells} if suite is not None else set()
    return open_store(store_root, suite, planned)


def _check_cells(catalog: Catalog, reference: Path, shown: str) -> None:
    """Refuse (ConfigError) a run whose cells are not the reference's: the (dataset, method,
    seed) of each trained cell and, where the reference's ``cells.json`` records it, its
    configuration (the resolved config less the seed).  The run's cells left out of its
    analysis (failed, damaged, interrupted) are named with their state."""
    recorded = read_cells_record(reference)
    if recorded is None:
        return  # an older reference: its seeds are compared after the analysis
    theirs = {(d, m, s): config for _, d, m, s, config in recorded}
    mine = {(c["dataset"], c["method"], c["seed"]): c["configuration"]
            for c in cells_record(catalog, {m.name for m in catalog.methods})}
    problems = []
    for d, m, s in sorted(theirs.keys() - mine.keys()):
        state = catalog.left.get((d, m, s))
        problems.append(f"{d} / {m} / seed {s}: in the reference, not in the run"
                        + (f" (its cell {state[0]} is {state[1]}: {state[2]})" if state else ""))
    problems += [f"{d} / {m} / seed {s}: in the run, not in the reference" for d, m, s in sorted(mine.keys() - theirs.keys())]
    problems += [f"{d} / {m} / seed {s}: of another configuration than the reference's (its resolved config "
                 "differs: other epochs, model, data or suite file)"
                 for (d, m, s), config in sorted(mine.items())
                 if (d, m, s) in theirs and theirs[(d, m, s)] is not None and theirs[(d, m, s)] != config]
    if problems:
        _refuse(shown, problems)


def _check_plan(run: AnalysisResults, ref: AnalysisResults, shown: str) -> None:
    """Refuse (ConfigError) analyses of different plans: their datasets, methods, seeds
    (or replicates) per dataset and method, or splits per dataset differ."""
    problems = []
    for what, mine, theirs in (("dataset", set(run.datasets), set(ref.datasets)),
                               ("method", set(run.methods), set(ref.methods))):
        problems += [f"{what} {x}: in the reference, not in the run" for x in sorted(theirs - mine)]
        problems += [f"{what} {x}: in the run, not in the reference" for x in sorted(mine - theirs)]
    for key in sorted(run.seeds.keys() | ref.seeds.keys()):
        mine, theirs = run.seeds.get(key, []), ref.seeds.get(key, [])
        if sorted(mine) != sorted(theirs):
            problems.append(f"{key[0]} / {key[1]}: seeds {_listed(mine)} in the run, {_listed(theirs)} in the reference")
    for dataset in sorted(run.splits.keys() & ref.splits.keys()):
        mine, theirs = set(run.splits[dataset]), set(ref.splits[dataset])
        if mine != theirs:
            problems.append(f"{dataset}: splits {_listed(sorted(theirs - mine))} only in the reference, "
                            f"{_listed(sorted(mine - theirs))} only in the run")
    if problems:
        _refuse(shown, problems)


def _refuse(shown: str, problems: list[str]) -> None:
    raise ConfigError("\n  ".join([f"compare: the run and {shown} are of different plans, not compared "
                                   f"({len(problems)} difference{'s' if len(problems) > 1 else ''}); compare a run "
                                   f"with a reference of its own plan ({' '.join(COMMAND)} status NAME lists the run's "
                                   "cells):",
                                   *problems]))


def _listed(items) -> str:
    return ", ".join(map(str, items)) if items else "none"


def _split_sizes(catalog: Catalog, run: AnalysisResults) -> dict[tuple[str, str], int]:
    """``(dataset, split) -> N``, the images one sample is one of: the split's size in the
    run's store (one cell per dataset); for an OOD split the smaller of it and ``test``."""
    sizes: dict[tuple[str, str], int] = {}
    for dataset, splits in run.splits.items():
        cell = next(((m, s) for d, m, s in sorted(catalog.cells) if d == dataset), None)
        if cell is None:
            continue
        for split in splits:
            try:
                sizes[(dataset, split)] = len(catalog.predictions(dataset, cell[0], cell[1], split)[1])
            except KeyError:
                continue
    for (dataset, split), n in list(sizes.items()):
        if split.startswith("ood/") and (dataset, "test") in sizes:
            sizes[(dataset, split)] = min(n, sizes[(dataset, "test")])
    return sizes


def _differences(run: AnalysisResults, ref: AnalysisResults, sizes: dict[tuple[str, str], int]) -> list[Difference]:
    """Every per-seed value and mean over seeds of the metrics both analysed, compared."""
    common = set(run.analysed_metrics) & set(ref.analysed_metrics)
    per_seed = _merged(run.metrics, ref.metrics, [*_KEYS, "seed"], "value", common)
    means = _merged(run.summary, ref.summary, _KEYS, "mean", common)
    means["seed"] = None
    both = pd.concat([per_seed, means], ignore_index=True)
    std = ref.summary[[*_KEYS, "std"]].drop_duplicates(_KEYS)
    both = both.merge(std, on=_KEYS, how="left")
    out = []
    for row in both.itertuples(index=False):
        samples = sizes.get((row.dataset, row.split), 0)
        std_value = float(row.std) if row.std == row.std else math.nan
        a, b = float(row.run), float(row.reference)
        delta = 0.0 if math.isnan(a) and math.isnan(b) else math.inf if math.isnan(a) or math.isnan(b) else abs(a - b)
        out.append(Difference(row.dataset, row.method, row.split, row.metric, row.score,
                              None if row.seed is None or row.seed != row.seed else int(row.seed), a, b, delta,
                              std_value, samples, tolerance(std_value, samples)))
    return out


def _merged(mine: pd.DataFrame, theirs: pd.DataFrame, keys: list[str], column: str, metrics: set[str]) -> pd.DataFrame:
    """``keys`` + ``run`` and ``reference`` (``column`` of each side; NaN where a side has no row)."""
    a = mine.loc[mine["metric"].isin(metrics), [*keys, column]].rename(columns={column: "run"})
    b = theirs.loc[theirs["metric"].isin(metrics), [*keys, column]].rename(columns={column: "reference"})
    return a.merge(b, on=keys, how="outer")


def _resolution(samples: int) -> float:
    """One sample of a split of ``samples`` images (0: unknown, no resolution)."""
    return 1.0 / samples if samples > 0 else 0.0


def _units(metric: str) -> tuple[float, str]:
    """The scale and unit suffix the report shows ``metric`` in."""
    record = get_metric(metric)  # registered: the reference's metrics were checked on reading it
    return record.scale, (" %" if record.unit == "%" else f" ({record.unit})" if record.unit else "")


def _num(value: float, scale: float) -> str:
    return "missing" if math.isnan(value) else f"{value * scale:.6g}"


def _where(d: Difference) -> str:
    at = f"seed {d.seed}" if d.seed is not None else "mean"
    return f"{d.method} / {d.split}{' [' + d.score + ']' if d.score else ''} / {at}"


def _order(d: Difference) -> tuple:
    return (d.dataset, d.method, d.metric, d.score, d.split, -1 if d.seed is None else d.seed)
