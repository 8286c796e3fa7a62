"""Evaluation: the registered metrics on stored predictions, one value per cell and split.

:func:`evaluate` computes, for one prediction set, labelled-split metrics (kinds other
than ``ood``) on the ``test`` and ``shift/...`` splits and OOD metrics on the ``ood/...``
splits with the ``test`` split as the in-distribution side, once per OOD score
(registered in ``bench.core.registry.SCORES``, :mod:`bench.scores`; computed by
:func:`ood_scores`, fitted on the cell's stored training features where a score needs
them).  :func:`evaluate_catalog` does so for every cell of a
:class:`~bench.store.catalog.Catalog` (derived methods combined from their members' stored
predictions) and collects what could not be evaluated: failed, damaged and unnamed
cells, replicates that could not be formed, metrics that raised, and the scores that
could not be computed with the reason (:data:`UNSCORED_COLUMNS`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bench.core import progress
from bench.store.catalog import Catalog, Preds
from bench.data import is_ood
from bench.core.errors import one_line
from bench.store import READ_ERRORS
from bench.metrics import get_metric, selection
from bench.scores import NEEDS, TRAINING, default_scores, get_score
from bench.scores.record import FEATURES, LOGITS, fitting_view
from bench.store import TrainingFeatures

METRIC_COLUMNS = ["dataset", "method", "seed", "split", "metric", "score", "value"]
FAILURE_COLUMNS = ["dataset", "method", "seed", "reason"]
DAMAGED_COLUMNS = ["cell", "dataset", "method", "seed", "reason"]
#: a selected OOD score that could not be computed for a method on a dataset, and why
UNSCORED_COLUMNS = ["dataset", "method", "score", "reason"]
#: what to do when a trained cell lacks what a score needs (stored before this code, or without features)
RERUN = {
    LOGITS: "needs logits: rerun the suite (this cell was stored before the store kept logits)",
    FEATURES: "needs features: rerun with `[store] features = true` (this cell stored none)",
    TRAINING: "needs training features: rerun with `[store] features = true` (this cell stored none)",
}
#: what ``ood_scores`` maps split -> score -> per-image score, for the ``test`` and ``ood/...`` splits
CellScores = dict[str, dict[str, np.ndarray]]


def split_order(split: str) -> tuple:
    group = 0 if split == "test" else 2 if is_ood(split) else 1
    return (group, split)


def table_of(split: str) -> str:
    return "in_distribution" if split == "test" else "ood" if is_ood(split) else "shift"


def analysed_metrics(picked: list[str] | None = None) -> list[str]:
    """The metrics analysis computes: the ``"default"`` selection plus any picked ones
    (registered names, checked where they entered: :func:`bench.report.validate_metrics`)."""
    return list(dict.fromkeys(selection("default") + list(picked or [])))


def analysed_scores(picked: list[str] | None = None) -> list[str]:
    """The OOD scores analysis computes: ``picked`` (``--scores``, registered names checked
    where they entered) or else the default selection (:func:`bench.scores.default_scores`)."""
    return list(dict.fromkeys(picked)) if picked else default_scores()


def ood_scores(preds: Preds, names: list[str], training: TrainingFeatures | None = None,
               ) -> tuple[CellScores, dict[str, str]]:
    """The OOD scores ``names`` of one prediction set on its ``test`` and ``ood/...``
    splits: ``(split -> score -> [N] float64, score -> why it was not computed)``.

    A score is computed where every array it reads is stored on ``test`` and every
    ``ood/...`` split; one that fits does so once, on ``training`` (the cell's stored
    ``features/train.npz``).  Why not: the need it lacks (``"features"``, ``"logits"``,
    ``"samples"``, ``"training features"``: :data:`bench.scores.NEEDS`), ``raised ...``
    when its fit or function raised (a plugin's bug), or ``gave ...`` when it did not give
    one finite value per image."""
    if "test" not in preds:
        return {sp: {} for sp in preds if is_ood(sp)}, {}
    splits = ["test", *sorted(sp for sp in preds if is_ood(sp))]
    fitted_on = fitting_view(training) if training is not None else None
    out: CellScores = {sp: {} for sp in splits}
    why: dict[str, str] = {}
    for name in names:
        score = get_score(name)
        lacks = next((need for sp in splits if (need := score.lacks(preds[sp], fitted_on is not None))), None)
        if lacks is not None:
            why[name] = lacks
            continue
        try:
            fitted = score.fit(fitted_on) if score.fit is not None else None
            for sp in splits:
                values, n = score(preds[sp], fitted), len(preds[sp])
                if values.shape != (n,):
                    why[name] = f"gave shape {list(values.shape)} on {sp}, not [{n}]"
                elif not np.isfinite(values).all():
                    why[name] = f"gave non-finite values on {sp}"
                if name in why:
                    break
                out[sp][name] = values
        except Exception as exc:  # noqa: BLE001  (any error of a score's own code)
            why[name] = f"raised {one_line(exc)}"
        if name in why:
            for sp in splits:
                out[sp].pop(name, None)
    return out, why


def _no_features(catalog: Catalog, dataset: str, method: str, seed) -> str | None:
    """Why a trained cell stored no features although its suite kept them (``no_features``
    in its cell.json, :func:`bench.train.cell.features_absent`), or None."""
    cell = catalog.cells.get((dataset, method, seed))
    return catalog.record(cell).no_features if cell is not None else None


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
             errors: dict[tuple[str, str, str], str] | None = None,
             scores: CellScores | None = None) -> list[tuple[str, str, str, float]]:
    """``(split, metric, score, value)`` for every evaluation split of one prediction set;
    OOD metrics once per score of ``scores`` (:func:`ood_scores`; default: the default
    scores that need no training features).

    With ``errors``, a metric that raises (a plugin's bug) gives NaN and its error is
    recorded under ``(split, metric, score)``; the other metrics go on.  Without it the
    error propagates."""
    labelled, on_scores = labelled_and_ood(names)

    def value(name: str, split: str, score: str, *inputs) -> float:
        return metric_value(name, inputs, errors, (split, name, score))

    rows = []
    if scores is None:
        scores = ood_scores(preds, analysed_scores())[0]
    test_scores = scores.get("test")
    for split in sorted(preds, key=split_order):
        if split == "val":
            continue
        arrays = preds[split]
        if is_ood(split):
            if test_scores is None:
                continue
            for score, ood in scores.get(split, {}).items():
                if score in test_scores:
                    for name in on_scores:
                        rows.append((split, name, score, value(name, split, score, test_scores[score], ood)))
        else:
            probs = np.exp(arrays.log_probs.astype(np.float64))
            for name in labelled:
                rows.append((split, name, "", value(name, split, "", probs, arrays.labels)))
    return rows


@dataclass
class Evaluation:
    """Every cell of a catalog evaluated (:func:`evaluate_catalog`): the input of the statistics.

    ``predictions``: (dataset, method, seed or replicate) -> its predictions, for every
    cell and replicate that could be read or formed, in catalog order.  ``metrics``:
    :data:`METRIC_COLUMNS` rows of every one of them.  ``scores``: their OOD scores
    (:func:`ood_scores`); ``unscored``: :data:`UNSCORED_COLUMNS` rows, one per dataset,
    method and selected score that could not be computed (a need that is expected to be
    missing, several passes for a single-pass method, is left out).  ``raised``: (dataset, method, seed,
    split, metric, score) -> the error of a metric that raised there (its value is NaN).
    ``failures`` (:data:`FAILURE_COLUMNS`) and ``damaged`` (:data:`DAMAGED_COLUMNS`): rows
    for the cells and replicates left out and the metrics that raised."""

    names: list[str]  # the metrics evaluated: the requested ones and the datasets' headline metrics
    headlines: dict[str, dict[str, str]]  # dataset -> {metric shown in the tables: metric shown in its place}
    notes: dict[str, str]  # dataset -> its protocol note (report_note)
    ood_groups: dict[str, dict[str, list[str]]]  # dataset -> group (near, far) -> OOD set names (ood_groups)
    predictions: dict[tuple[str, str, int], Preds]
    metrics: pd.DataFrame
    raised: dict[tuple[str, str, int, str, str, str], str]
    failures: list[dict]
    damaged: list[dict]
    # (dataset, method, seed) -> split -> OOD score -> per-image scores (:func:`ood_scores`)
    scores: dict[tuple[str, str, int], CellScores] = field(default_factory=dict)
    unscored: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=UNSCORED_COLUMNS))


def evaluate_catalog(catalog: Catalog, names: list[str], scores: list[str] | None = None) -> Evaluation:
    """Every metric of ``names`` (and the datasets' headline metrics) on every cell of
    ``catalog`` and every replicate of its derived methods, OOD metrics once per OOD score
    of ``scores`` (default :func:`analysed_scores`).  A metric that raises is named
    once among the failures (where it first raised, with its error); its values where it
    raised are NaN, and every other metric is computed as usual."""
    scores = analysed_scores(scores)
    classes = {d: catalog.dataset_class(d) for d in catalog.datasets}
    headlines = {d: dict(swaps) for d, c in classes.items() if (swaps := getattr(c, "headline_metrics", None))}
    notes = {d: str(note) for d, c in classes.items() if (note := getattr(c, "report_note", None))}
    groups = {d: {str(g): [str(n) for n in names] for g, names in dict(declared).items()}
              for d, c in classes.items() if (declared := getattr(c, "ood_groups", None))}
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
            if entry.kind == "trained":
                for s, _ in catalog.replicates(d, entry):
                    preds = catalog.load_or_mark_damaged(d, entry.name, s)
                    if preds is not None:
                        cache[(d, entry.name, s)] = preds
                continue
            for rid, members in catalog.formed(d, entry):
                cache[(d, entry.name, rid)] = catalog.combined(d, entry, rid, members)
            failures += [{"dataset": d, "method": entry.name, "seed": rid, "reason": why}
                         for rid, why in catalog.unformed(d, entry).items()]

    rows, raised, per_cell, unscored = [], {}, {}, {}
    kinds = {e.name: e.kind for e in catalog.methods}
    for (d, m, s), preds in progress.tracked(cache.items(), "analysis", len(cache), "cell", "{count} cells"):
        trained, unreadable = kinds.get(m) == "trained", None
        try:
            training = catalog.training_features(d, m, s) if trained else None
        except READ_ERRORS as exc:
            training, unreadable = None, f"its stored training features are unreadable ({one_line(exc)})"
        per_cell[(d, m, s)], lacking = ood_scores(preds, scores, training)
        absent = (_no_features(catalog, d, m, s)
                  if trained and any(need in (FEATURES, TRAINING) for need in lacking.values()) else None)
        for score, need in lacking.items():
            if need == "samples":
                continue  # several passes or members: a single-pass method has none, as expected
            if need not in NEEDS and need != TRAINING:
                reason = need  # it raised
            elif not trained:
                reason = f"needs {need}, which a method combined from its members' stored probabilities does not have"
            elif need in (FEATURES, TRAINING) and absent:
                reason = f"needs {need}: {absent}"
            else:
                reason = unreadable if need == TRAINING and unreadable else RERUN.get(need, f"needs {need}")
            unscored.setdefault((d, m, score), reason)
        errors: dict[tuple[str, str, str], str] = {}
        rows += [(d, m, s, split, metric, score, value)
                 for split, metric, score, value in evaluate(preds, names, errors, per_cell[(d, m, s)])]
        raised.update({(d, m, s, *where): why for where, why in errors.items()})
    first: dict[str, tuple] = {}  # metric -> (dataset, method, seed, split, score, error) where it first raised
    for (d, m, s, split, metric, score), why in raised.items():
        first.setdefault(metric, (d, m, s, split, score, why))
    failures += [{"dataset": d, "method": m, "seed": s,
                  "reason": f"metric {metric!r} raised {why} (first on split {split}{f', score {score}' if score else ''}); "
                            "its cells show 'error' where it raised, every other metric is computed"}
                 for metric, (d, m, s, split, score, why) in first.items()]
    unscored_df = pd.DataFrame([(d, m, score, why) for (d, m, score), why in unscored.items()], columns=UNSCORED_COLUMNS)
    return Evaluation(names=names, headlines=headlines, notes=notes, ood_groups=groups, predictions=cache,
                      metrics=pd.DataFrame(rows, columns=METRIC_COLUMNS), raised=raised, failures=failures,
                      damaged=damaged, scores=per_cell, unscored=unscored_df)
