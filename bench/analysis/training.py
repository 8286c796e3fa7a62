"""Convergence: every trained cell's training log, and whether it was still improving when
its training ended.

A number from an under-trained model is a finding about the training budget, not about the
method, so every report shows the evidence that its models had converged.
:func:`convergence` reads the ``train_log.csv`` of each cell of a
:class:`~bench.store.catalog.Catalog` (written by ``bench.train.cell`` from the log of
``bench.train.loop.fit``: one row per epoch) and gives three tables (:class:`Convergence`):

* ``training`` (:data:`TRAINING_COLUMNS`): one row per dataset, method, seed and epoch of
  every cell that trained: the curves.  ``stage`` is 2 for the rows of a two-stage cell
  (CGPT fine-tuned from msp: its own log is its stage 2), else 1;
* ``cells`` (:data:`CONVERGENCE_COLUMNS`): one row per trained cell and stage: the last
  epoch's values, the best-validation epoch (``best_epoch`` of the ``cell.json`` beside
  the log), the windows :func:`judge` compared, the share of the most frequent class it
  compared the training accuracy with (``majority_share``) and its verdict.  ``source`` names the
  method row whose cell holds the log: a cell's own; for a post-hoc cell (one whose
  ``cell.json`` names a stage 1 and that trained nothing itself, so it has no log:
  last-layer Laplace on msp's network) the stage-1 cell, its base's cell of the same seed;
  a two-stage cell has two rows, stage 1 from that cell and stage 2 from its own log;
* ``summary`` (:data:`CONVERGENCE_SUMMARY_COLUMNS`): one row per dataset, method and
  stage, the means over seeds and how many seeds are flagged (``n_flagged``: still
  improving or not learning), how many of those are not learning (``n_not_learning``) and
  how many could not be judged, and why; a derived method (temperature scaling, ensembles: combinators
  over stored cells) has the rows of its base, whose networks it combines, over the seeds
  of the replicates it could form.

The rule, :func:`judge` (its thresholds are :data:`WINDOW_FRACTION`,
:data:`TRAIN_ACC_RISE` and :data:`VAL_NLL_DROP`; :data:`RULE` says it in the report's
words): with E epochs in a log and k = max(1, round(WINDOW_FRACTION x E)), the mean over the
last k epochs is compared with the mean over the k epochs before them; the cell is still
improving when its training accuracy rose by more than TRAIN_ACC_RISE (a fraction: 0.01
is one percentage point) or its validation NLL fell by more than VAL_NLL_DROP of the
earlier mean.  A point of training accuracy is the materiality line: below the seeds'
spread of test accuracy in the reference runs (std 0.6-1.0 points on the default suite),
and above the rise a converged model's last epochs show as a cosine schedule anneals
its learning rate (0.2-0.7 points for msp, KEP-SVGP and SGPA on the default suite, whose
sampled training passes gain most from the annealing).  The validation NLL's line is 15%:
over the last fifth of a cosine schedule it falls by 6-7% in an under-trained run (the
default suite's earlier 12 epochs, training accuracy 0.91 and rising 1.5-2 points) and by
up to 14% in converged ones (40-60 epochs, training accuracy >= 0.99: msp 0-10%, MC
Dropout 0-14%, SGPA 2-12%), so a smaller fall tells annealing from under-training no
better than chance; only a larger one flags.  A log of fewer than two epochs cannot be judged (``n/a: 1 epoch``).

A model that never learned is flagged too, whatever its windows show: a judged log whose
last epoch's training accuracy is at most TRAIN_ACC_RISE above the share of the most
frequent class (what a model that predicts one class scores) is ``not learning``, in place
of ``improving`` or ``not improving``.  That share is estimated from the labels of the
stored ``test`` split of the cell beside the log (:func:`majority_share`); a cell with no
stored test labels is not checked.  Example: KEP-SVGP on the text suite held training,
validation and test accuracy at 57.7%, the larger class's share, while its objective (a KL
term, mostly) still fell; without this check that read as converged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from bench.store.catalog import Catalog, Preds
from bench.core.errors import one_line
from bench.store import READ_ERRORS, TRAIN_LOG, CellDir

WINDOW_FRACTION = 0.2  # the compared windows: the last k epochs and the k before, k = this share of the epochs
TRAIN_ACC_RISE = 0.01  # training accuracy (a fraction) rising by more than this: still improving
VAL_NLL_DROP = 0.15  # validation NLL falling by more than this share of its earlier mean: still improving
IMPROVING = "improving"  # a verdict: still improving at the end (flagged)
NOT_IMPROVING = "not improving"
NOT_LEARNING = "not learning"  # a verdict: training accuracy at the most frequent class's share (flagged)
FLAGGED = (IMPROVING, NOT_LEARNING)  # the verdicts the report marks
LABELS_SPLIT = "test"  # the stored split whose labels give the most frequent class's share
UNJUDGED = "n/a: "  # a verdict that starts so could not be made; the reason follows
NO_LOG = "no training log"  # why a cell has no log: it trained nothing (a post-hoc cell)

#: the per-epoch columns of a training log that ``training`` keeps (a method's own columns,
#: e.g. KEP-SVGP's ``ksvd`` and ``kl``, stay in the cell's ``train_log.csv``)
LOG_FIELDS = ("lr", "train_loss", "train_acc", "val_acc", "val_nll", "seconds")
TRAINING_COLUMNS = ["dataset", "method", "seed", "stage", "epoch", *LOG_FIELDS]
#: what a convergence row gives of a log, in the report's column order (means over seeds in ``summary``)
CONVERGENCE_FIELDS = ("epochs", "best_epoch", "train_acc", "train_loss", "val_acc", "val_nll")
CONVERGENCE_COLUMNS = ["dataset", "method", "seed", "stage", "source", *CONVERGENCE_FIELDS, "window",
                       "train_acc_rise", "val_nll_drop", "majority_share", "verdict"]
CONVERGENCE_SUMMARY_COLUMNS = ["dataset", "method", "stage", "source", "n_seeds", "n_flagged", "n_not_learning",
                               "n_unjudged", "unjudged", *CONVERGENCE_FIELDS]


@dataclass(frozen=True)
class Judgement:
    """:func:`judge`'s verdict on one log, with what it compared: ``window`` (k epochs),
    ``train_acc_rise`` (the last window's mean training accuracy less the earlier one's, a
    fraction), ``val_nll_drop`` (the earlier window's mean validation NLL less the last
    one's, over the earlier one's) and ``majority_share`` (the most frequent class's share
    the last training accuracy was compared with); NaN where the log is too short or a
    value missing."""

    verdict: str
    window: int = 0
    train_acc_rise: float = np.nan
    val_nll_drop: float = np.nan
    majority_share: float = np.nan

    @property
    def flagged(self) -> bool:
        return self.verdict in FLAGGED


def window(epochs: int) -> int:
    """k, the epochs of each compared window: max(1, round(:data:`WINDOW_FRACTION` x epochs)),
    at most half the epochs (the two windows fit in the log)."""
    return max(1, min(round(WINDOW_FRACTION * epochs), epochs // 2))


#: the rule in the report's words, from the thresholds above
RULE = (f"with E epochs in a cell's training log and k = max(1, round({WINDOW_FRACTION:g} × E)) (k = 1 up to "
        f"{max(e for e in range(2, 1000) if window(e) == 1)} epochs), the mean over the last k epochs is compared "
        "with the mean over the k epochs before them; the cell is still improving when its training accuracy rose "
        f"by more than {100 * TRAIN_ACC_RISE:g} percentage point{'' if 100 * TRAIN_ACC_RISE == 1 else 's'} or its validation NLL fell by more than "
        f"{100 * VAL_NLL_DROP:g}% of the earlier mean. A cell is not learning (`{NOT_LEARNING}`, flagged like one still "
        f"improving) when its last epoch's training accuracy is at most {100 * TRAIN_ACC_RISE:g} percentage "
        f"point{'' if 100 * TRAIN_ACC_RISE == 1 else 's'} above the share of the most frequent class, estimated from "
        "the labels of its stored test split (not checked where it has none). A log of one epoch cannot be judged "
        "(`n/a: 1 epoch`)")


def judge(train_acc: Sequence[float], val_nll: Sequence[float], majority: float = np.nan) -> Judgement:
    """Whether a training log (per epoch, in order: training accuracy as a fraction,
    validation NLL in nats) was still improving materially at its end (the module
    docstring's rule): with E epochs and k = :func:`window` (E), the mean over the last k
    epochs against the mean over the k before; ``improving`` when the training accuracy
    rose by more than :data:`TRAIN_ACC_RISE` or the validation NLL fell by more than
    :data:`VAL_NLL_DROP` of its earlier mean (a comparison with a missing value is not
    met), else ``not improving``; ``n/a: 1 epoch`` (or ``n/a: no epoch``) below 2 epochs.
    ``majority``: the share of the most frequent class (a fraction; NaN: unknown, not
    checked); a judged log whose last training accuracy is at most :data:`TRAIN_ACC_RISE`
    above it is ``not learning`` instead."""
    acc, nll = np.asarray(train_acc, dtype=float), np.asarray(val_nll, dtype=float)
    n = len(acc)
    if n < 2:
        return Judgement(f"{UNJUDGED}{'1 epoch' if n == 1 else 'no epoch'}")
    k = window(n)
    last, before = slice(n - k, n), slice(n - 2 * k, n - k)
    rise = float(acc[last].mean() - acc[before].mean())
    earlier = float(nll[before].mean())
    drop = float((earlier - nll[last].mean()) / earlier) if earlier > 0 else np.nan
    flagged = rise > TRAIN_ACC_RISE or drop > VAL_NLL_DROP  # NaN compares False
    stuck = acc[-1] <= majority + TRAIN_ACC_RISE  # NaN (no share, no accuracy) compares False
    return Judgement(NOT_LEARNING if stuck else IMPROVING if flagged else NOT_IMPROVING, k, rise, drop, float(majority))


@dataclass(frozen=True)
class Convergence:
    """What :func:`convergence` gives: ``training``, ``cells`` and ``summary`` (module docstring)."""

    training: pd.DataFrame
    cells: pd.DataFrame
    summary: pd.DataFrame


def read_log(cd: CellDir) -> tuple[pd.DataFrame | None, str]:
    """A cell's training log sorted by epoch (every :data:`LOG_FIELDS` column; NaN where the
    log has none), or None and why not: :data:`NO_LOG` (the cell trained nothing) or the
    read error."""
    path = cd.path / TRAIN_LOG
    if not path.is_file():
        return None, NO_LOG
    try:
        log = pd.read_csv(path)
        log = log.assign(epoch=log["epoch"].astype(int)).sort_values("epoch", kind="stable").reset_index(drop=True)
    except READ_ERRORS as exc:
        return None, f"unreadable training log ({one_line(exc)})"
    return log.reindex(columns=["epoch", *LOG_FIELDS]), ""


def majority_share(preds: Preds | None) -> float:
    """The share of the most frequent label among the labels of a cell's stored
    :data:`LABELS_SPLIT` split (``preds``: its loaded splits; ``-1``, no label, left out):
    the accuracy of a model that predicts one class, as the test split estimates it; NaN
    when the cell stores no such split, it could not be read, or it holds no label."""
    if preds is None or LABELS_SPLIT not in preds:
        return np.nan
    labels = preds[LABELS_SPLIT].labels
    labels = labels[labels >= 0]
    return float(np.bincount(labels).max() / len(labels)) if len(labels) else np.nan


def _stage_row(log: pd.DataFrame | None, why: str, best: int | None, share: float) -> dict:
    """One convergence row's values: from ``log`` (a cell's; ``best``: its recorded best
    epoch; ``share``: the most frequent class's share of its stored test labels,
    :func:`majority_share`), or ``n/a: why``."""
    if log is None:
        return {f: np.nan for f in CONVERGENCE_FIELDS} | {"window": 0, "train_acc_rise": np.nan, "val_nll_drop": np.nan,
                                                            "majority_share": np.nan, "verdict": UNJUDGED + why}
    last = log.iloc[-1] if len(log) else pd.Series(dtype=float)
    judged = judge(log["train_acc"], log["val_nll"], share)
    return {"epochs": len(log), "best_epoch": float(best) if isinstance(best, (int, float)) else np.nan,
            **{f: float(last.get(f, np.nan)) for f in ("train_acc", "train_loss", "val_acc", "val_nll")},
            "window": judged.window, "train_acc_rise": judged.train_acc_rise, "val_nll_drop": judged.val_nll_drop,
            "majority_share": judged.majority_share, "verdict": judged.verdict}


def convergence(catalog: Catalog) -> Convergence:
    """The training logs of the catalog's cells, each judged (module docstring), in catalog
    order (datasets, methods, seeds, stages)."""
    by_key = {cd.key: (cell, cd) for cell, cd in catalog.cells.items()}  # cell: (dataset, row, seed)
    logs: dict[str, tuple[pd.DataFrame | None, str]] = {}

    shares: dict[str, float] = {}

    def log_of(cd: CellDir) -> tuple[pd.DataFrame | None, str]:
        if cd.key not in logs:
            logs[cd.key] = read_log(cd)
        return logs[cd.key]

    def share_of(cd: CellDir | None, log: pd.DataFrame | None) -> float:
        """The cell's majority share, from the predictions the catalog loaded (analysis has
        evaluated them before), once per cell and only for a log judge can judge."""
        if cd is None or log is None or len(log) < 2:
            return np.nan
        if cd.key not in shares:
            shares[cd.key] = majority_share(catalog.load_or_mark_damaged(*by_key[cd.key][0]))
        return shares[cd.key]

    epochs, cells = [], []
    for d in catalog.datasets:
        for entry in catalog.methods:
            for s in catalog.seeds:
                cd = catalog.cells.get((d, entry.name, s)) if entry.kind == "trained" else None
                if cd is None:
                    continue
                first = catalog.record(cd).stage1
                own, why = log_of(cd)
                stages = []  # (stage, source row, log, why not, the cell beside the log)
                if first is not None:
                    found = by_key.get(first.key)
                    if not first.reused:
                        stages.append((1, first.method, None,
                                       "stage 1 was trained inside the cell; its log was not kept", None))
                    elif found is None:
                        stages.append((1, first.method, None,
                                       f"its stage-1 cell {first.key} is not among the cells analysed", None))
                    else:
                        stages.append((1, found[0][1], *log_of(found[1]), found[1]))
                    if why != NO_LOG:  # a post-hoc cell trained nothing: it has no stage 2
                        stages.append((2, entry.name, own, why, cd))
                else:
                    stages.append((1, entry.name, own, why, cd))
                for stage, source, log, why_not, beside in stages:
                    best = catalog.record(beside).best_epoch if beside is not None else None
                    cells.append({"dataset": d, "method": entry.name, "seed": s, "stage": stage, "source": source,
                                  **_stage_row(log, why_not, best, share_of(beside, log))})
                if own is not None:
                    stage = 2 if first is not None else 1
                    epochs += [{"dataset": d, "method": entry.name, "seed": s, "stage": stage, **row}
                               for row in own.to_dict("records")]
    cells_df = pd.DataFrame(cells, columns=CONVERGENCE_COLUMNS)
    return Convergence(pd.DataFrame(epochs, columns=TRAINING_COLUMNS), cells_df, _summary(catalog, cells_df))


def _summary(catalog: Catalog, cells: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, method row and stage: the means over seeds of :data:`CONVERGENCE_FIELDS`
    (over the seeds with a log), the seeds, those flagged (still improving or not learning),
    those not learning and those not judged (with their reasons, ``; ``-joined); a derived row repeats its base row's rows over the
    member seeds of its replicates formed (none when no replicate could be formed)."""
    rows = []
    for d in catalog.datasets:
        for entry in catalog.methods:
            mine = cells[(cells["dataset"] == d) & (cells["method"] == (entry.base or entry.name))]
            if entry.kind == "derived":
                mine = mine[mine["seed"].isin({s for _, members in catalog.formed(d, entry) for s in members})]
            for stage, group in mine.groupby("stage", sort=True):
                unjudged = group["verdict"].str.startswith(UNJUDGED)
                rows.append({
                    "dataset": d, "method": entry.name, "stage": int(stage),
                    "source": ", ".join(dict.fromkeys(group["source"])),
                    "n_seeds": len(group), "n_flagged": int(group["verdict"].isin(FLAGGED).sum()),
                    "n_not_learning": int((group["verdict"] == NOT_LEARNING).sum()),
                    "n_unjudged": int(unjudged.sum()),
                    "unjudged": "; ".join(dict.fromkeys(v[len(UNJUDGED):] for v in group.loc[unjudged, "verdict"])),
                    **{f: float(group[f].mean()) for f in CONVERGENCE_FIELDS},  # NaN (no log) skipped
                })
    return pd.DataFrame(rows, columns=CONVERGENCE_SUMMARY_COLUMNS)
