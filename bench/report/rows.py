"""Report rows: the analysis frames indexed once (:class:`ResultsIndex`), then one row
builder per table source (:data:`SOURCES`), each giving a (dataset, method)'s rows with
their raw statistics (:class:`Stat`).

Rows follow the results' display orders (datasets, methods, splits, OOD scores in the
order of :func:`bench.scores.score_key`, severities); nothing depends on the row order of
the input frames.  Which table takes which source is :data:`bench.report.tables.TABLES`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import pandas as pd

from bench.analysis import CONVERGENCE_FIELDS, CONVERGENCE_SUMMARY_COLUMNS, EFFICIENCY_COLUMNS, EFFICIENCY_FIELDS
from bench.data import corruption_of, corruption_split, is_ood, is_shift
from bench.scores import score_key

if TYPE_CHECKING:
    from bench.analysis import AnalysisResults

#: the statistics of a summary row and of a severity row (:class:`Stat` fields)
SUMMARY_STATS = ("mean", "std", "ci_low", "ci_high", "p_holm", "verdict", "test")
SEVERITY_STATS = ("mean", "std", "ci_low", "ci_high")


@dataclass(frozen=True)
class Stat:
    """Raw (unscaled) statistics of one cell; NaN/"" where the source has none."""

    mean: float = math.nan
    std: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    p_holm: float = math.nan
    verdict: str = ""
    test: str = ""  # what the p-value accounts for (bench.analysis.TESTS)
    seeds_needed: float = math.nan


NO_STAT = Stat()


@dataclass(frozen=True)
class Row:
    """One row of a table: its dataset, method and keys, and each column's statistics."""

    dataset: str
    method: str
    keys: tuple  # raw values of the spec's key columns (severity stays an int, -1 = all)
    stats: dict[str, Stat]  # column key -> statistics
    n_seeds: int
    failed: bool = False
    partial: bool = False  # only the columns in ``stats`` apply (the mCE row); others are blank


Key = tuple  # (dataset, method)


@dataclass(frozen=True)
class Stage:
    """One training stage of a method as the convergence summary gives it (raw means over
    seeds of :data:`~bench.analysis.CONVERGENCE_FIELDS`, ``values``); ``source`` is the
    method row whose training log it is (the method's own, or its base's)."""

    stage: int
    source: str
    n_seeds: int
    n_flagged: int  # seeds still improving at the end or not learning (bench.analysis.RULE), ...
    n_not_learning: int  # ... of which not learning
    n_unjudged: int  # seeds whose log could not be judged, ...
    unjudged: str  # ... and why ("1 epoch", "no training log", "; "-joined)
    values: dict[str, float]

    def improving_text(self) -> str:
        """The *Still improving* cell: ``k of n`` seeds judged still improving (left out when
        none is and some are not learning), ``m of n not learning`` when some are, and
        ``n/a: why`` for the seeds that could not be judged (``n/a for m: why`` beside
        judged ones)."""
        judged = self.n_seeds - self.n_unjudged
        improving = self.n_flagged - self.n_not_learning
        parts = [f"{improving} of {judged}"] if judged and (improving or not self.n_not_learning) else []
        if self.n_not_learning:
            parts.append(f"{self.n_not_learning} of {judged} not learning")
        if self.n_unjudged:
            parts.append(f"n/a{f' for {self.n_unjudged}' if judged else ''}: {self.unjudged}")
        return "; ".join(parts)


def _float(x) -> float:
    return math.nan if x is None or pd.isna(x) else float(x)


def _int(x) -> int:
    return 0 if x is None or pd.isna(x) else int(x)


def _records(frame: pd.DataFrame, columns: Sequence[str]) -> Iterable[dict]:
    """Rows of ``frame`` as dicts; nothing when it is empty or lacks a column."""
    if frame is None or not len(frame) or any(c not in frame.columns for c in columns):
        return []
    return frame[list(columns)].to_dict("records")


@dataclass
class ResultsIndex:
    """The input frames keyed for lookup; row order of the frames never matters."""

    split_rank: dict[str, dict[str, int]]  # dataset -> split -> display rank
    severity: int
    # (dataset, method) -> (split, score) -> metric -> stat, and the max n_seeds per (split, score)
    summary: dict[Key, dict[tuple[str, str], dict[str, Stat]]] = field(default_factory=dict)
    summary_n: dict[Key, dict[tuple[str, str], int]] = field(default_factory=dict)
    by_severity: dict[Key, dict[int, dict[str, Stat]]] = field(default_factory=dict)
    severity_n: dict[Key, dict[int, int]] = field(default_factory=dict)
    severity_samples: dict[Key, dict[int, float]] = field(default_factory=dict)  # samples per split (NaN: they differ)
    ce: dict[Key, dict[str, float]] = field(default_factory=dict)
    efficiency: dict[Key, dict[str, float]] = field(default_factory=dict)
    seeds: dict[Key, int] = field(default_factory=dict)
    convergence: dict[Key, list[Stage]] = field(default_factory=dict)  # stages in order
    flagged: set[Key] = field(default_factory=set)  # a stage still improving or not learning in some seed

    @classmethod
    def build(cls, results: AnalysisResults, severity: int) -> ResultsIndex:
        """Index the result frames; for a dataset with ``headlines`` ({shown: in its place})
        the stats of the replacing metric are filed under the replaced one's column."""
        ix = cls({d: {s: i for i, s in enumerate(sp)} for d, sp in results.splits.items()}, severity)
        swaps = {d: ({v: k for k, v in sw.items()}, set(sw)) for d, sw in results.headlines.items()}

        def columns(dataset: str, metric: str) -> list[str]:
            into, out = swaps.get(dataset, ({}, set()))
            return ([into[metric]] if metric in into else []) + ([] if metric in out else [metric])

        ix.seeds = {k: len(v) for k, v in results.seeds.items()}
        for r in _records(results.summary, ["dataset", "method", "split", "score", "metric", "n_seeds",
                                            *SUMMARY_STATS, "seeds_needed"]):
            key, rk = (r["dataset"], r["method"]), (r["split"], "" if pd.isna(r["score"]) else str(r["score"]))
            for col in columns(r["dataset"], r["metric"]):
                ix.summary.setdefault(key, {}).setdefault(rk, {})[col] = _stat(r)
            n = ix.summary_n.setdefault(key, {})
            n[rk] = max(n.get(rk, 0), _int(r["n_seeds"]))
        for r in _records(results.severity, ["dataset", "method", "severity", "metric", "n_seeds", "n_samples",
                                             *SEVERITY_STATS]):
            key, sev = (r["dataset"], r["method"]), int(r["severity"])
            for col in columns(r["dataset"], r["metric"]):
                ix.by_severity.setdefault(key, {}).setdefault(sev, {})[col] = _stat(r)
            n = ix.severity_n.setdefault(key, {})
            n[sev] = max(n.get(sev, 0), _int(r["n_seeds"]))
            ix.severity_samples.setdefault(key, {})[sev] = _float(r["n_samples"])
        for r in _records(results.corruption_errors, ["dataset", "method", "corruption", "ce"]):
            ix.ce.setdefault((r["dataset"], r["method"]), {})[r["corruption"]] = _float(r["ce"])
        for r in _records(results.efficiency, EFFICIENCY_COLUMNS):
            ix.efficiency[(r["dataset"], r["method"])] = {k: _float(r[k]) for k in EFFICIENCY_FIELDS}
        for r in sorted(_records(results.convergence_summary, CONVERGENCE_SUMMARY_COLUMNS), key=lambda r: r["stage"]):
            key = (r["dataset"], r["method"])
            ix.convergence.setdefault(key, []).append(Stage(
                _int(r["stage"]), _text(r["source"]), _int(r["n_seeds"]), _int(r["n_flagged"]),
                _int(r["n_not_learning"]), _int(r["n_unjudged"]),
                _text(r["unjudged"]), {k: _float(r[k]) for k in CONVERGENCE_FIELDS}))
            if _int(r["n_flagged"]):
                ix.flagged.add(key)
        return ix

    def split_key(self, dataset: str, split: str) -> tuple:
        rank = self.split_rank.get(dataset, {})
        return (rank.get(split, len(rank)), split)


def _text(x) -> str:
    return "" if x is None or pd.isna(x) else str(x)


def _stat(record: dict) -> Stat:
    return Stat(*(_float(record.get(s)) for s in ("mean", "std", "ci_low", "ci_high", "p_holm")),
                 verdict=_text(record.get("verdict")), test=_text(record.get("test")),
                 seeds_needed=_float(record.get("seeds_needed")))


def _summary_rows(ix: ResultsIndex, dataset: str, method: str,
                  select: Callable[[str, str], tuple | None]) -> list[Row]:
    """Rows from ``results.summary``: ``select(split, score)`` gives the row keys or None."""
    cells = ix.summary.get((dataset, method), {})
    picked = [((split, score), select(split, score)) for split, score in cells]
    picked = [(rk, keys) for rk, keys in picked if keys is not None]
    picked.sort(key=lambda p: (ix.split_key(dataset, p[0][0]), score_key(p[0][1])))
    return [Row(dataset, method, keys, cells[rk], ix.summary_n[(dataset, method)][rk])
            for rk, keys in picked]


def _rows_test(ix: ResultsIndex, dataset: str, method: str) -> list[Row]:
    return _summary_rows(ix, dataset, method, lambda split, score: () if split == "test" and not score else None)


def _rows_other_shift(ix: ResultsIndex, dataset: str, method: str) -> list[Row]:
    def select(split: str, score: str) -> tuple | None:
        return (split,) if is_shift(split) and corruption_of(split) is None and not score else None

    return _summary_rows(ix, dataset, method, select)


def _rows_all_shift(ix: ResultsIndex, dataset: str, method: str) -> list[Row]:
    return _summary_rows(ix, dataset, method, lambda split, score: (split,) if is_shift(split) and not score else None)


def _rows_ood(ix: ResultsIndex, dataset: str, method: str) -> list[Row]:
    return _summary_rows(ix, dataset, method, lambda split, score: (split, score) if is_ood(split) else None)


def _rows_corruption(ix: ResultsIndex, dataset: str, method: str) -> list[Row]:
    """Corruptions at the chosen severity (plus CE), then the method's mCE row."""

    def select(split: str, score: str) -> tuple | None:
        cs = corruption_of(split)
        return (cs[0],) if cs and cs[1] == ix.severity and not score else None

    rows = _summary_rows(ix, dataset, method, select)
    ce = ix.ce.get((dataset, method), {})
    seen = {r.keys[0] for r in rows}
    order = {c: ix.split_key(dataset, corruption_split(c, ix.severity)) for c in ce}
    n = ix.seeds.get((dataset, method), 0)
    rows += [Row(dataset, method, (c,), {}, n) for c in sorted(ce, key=lambda c: (order[c], c))
             if c not in seen and c != "mCE"]
    rows = [Row(r.dataset, r.method, r.keys, {**r.stats, "ce": Stat(ce.get(r.keys[0], math.nan))}, r.n_seeds)
            for r in rows]
    if "mCE" in ce:
        rows.append(Row(dataset, method, ("mCE",), {"ce": Stat(ce["mCE"])}, n, partial=True))
    return rows


def _rows_severity(ix: ResultsIndex, dataset: str, method: str) -> list[Row]:
    """Severities 0..5, then all; keys (severity, samples per split)."""
    cells = ix.by_severity.get((dataset, method), {})
    n = ix.severity_n.get((dataset, method), {})
    samples = ix.severity_samples.get((dataset, method), {})
    return [Row(dataset, method, (sev, sample_count(samples.get(sev, math.nan))), cells[sev], n[sev])
            for sev in sorted(cells, key=lambda s: (s < 0, s))]


VARIES = "varies"  # the samples-per-split key of a severity row whose splits differ in size


def sample_count(n: float) -> int | str:
    """An ``n_samples`` value as a row key: the count, or :data:`VARIES` (NaN)."""
    return VARIES if math.isnan(n) else int(n)


def _rows_efficiency(ix: ResultsIndex, dataset: str, method: str) -> list[Row]:
    values = ix.efficiency.get((dataset, method))
    if values is None:
        return []
    return [Row(dataset, method, (), {k: Stat(v) for k, v in values.items()}, ix.seeds.get((dataset, method), 0))]


def _rows_convergence(ix: ResultsIndex, dataset: str, method: str) -> list[Row]:
    """One row per training stage; keys (stage, whose log, still improving): the stage is
    shown only for a two-stage method, the log as ``own`` or ``base <method>``."""
    stages = ix.convergence.get((dataset, method), [])
    return [Row(dataset, method, (str(st.stage) if len(stages) > 1 else "",
                                  "own" if st.source == method else f"base {st.source}", st.improving_text()),
                {k: Stat(v) for k, v in st.values.items()}, st.n_seeds) for st in stages]


SOURCES: dict[str, Callable[[ResultsIndex, str, str], list[Row]]] = {
    "test": _rows_test,
    "severity": _rows_severity,
    "corruption": _rows_corruption,
    "other_shift": _rows_other_shift,
    "all_shift": _rows_all_shift,
    "ood": _rows_ood,
    "efficiency": _rows_efficiency,
    "convergence": _rows_convergence,
}


#: the splits each row builder shows (a builder not named here: any data set)
SOURCE_SPLITS: dict[str, Callable[[str], bool]] = {
    "test": lambda split: split == "test",
    "severity": lambda split: corruption_of(split) is not None,
    "corruption": lambda split: corruption_of(split) is not None,
    "other_shift": lambda split: is_shift(split) and corruption_of(split) is None,
    "all_shift": is_shift,
    "ood": is_ood,
}


def _failure_keys(results: AnalysisResults) -> set[Key]:
    f = results.failures
    return {(str(d), str(m)) for d, m in zip(f["dataset"], f["method"])} if len(f) else set()


def table_rows(results: AnalysisResults, methods: list[str], source: str, n_keys: int,
               ix: ResultsIndex) -> list[Row]:
    """Rows of the row builder ``source`` (:data:`SOURCES`) in display order: datasets,
    then methods, then the source's own order.

    A (dataset, method) with no successful seed and a recorded failure gets one ``failed``
    row (``n_keys`` empty keys) in each table whose splits the dataset has (every table
    when none of its splits was evaluated); one that was not run on the dataset gets none.
    """
    failed_pairs = _failure_keys(results)
    rows: list[Row] = []
    for dataset in results.datasets:
        splits = results.splits.get(dataset, [])
        shows = source not in SOURCE_SPLITS or not splits or any(map(SOURCE_SPLITS[source], splits))
        for method in methods:
            mine = SOURCES[source](ix, dataset, method)
            if not mine and shows and not results.seeds.get((dataset, method)) and (dataset, method) in failed_pairs:
                mine = [Row(dataset, method, ("",) * n_keys, {}, 0, failed=True)]
            rows += mine
    return rows
