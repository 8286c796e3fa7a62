"""One cell from start to end, in whichever process runs it: :func:`run_cell` trains the
cell's model (:mod:`bench.train.loop`), predicts every evaluation split and stores the
predictions (:mod:`bench.store`), as named steps: start or resume, train, store the
training's files, predict every split, store the features and their cost, seal.  Every
executor calls it (through :func:`bench.run.executors.run_job`, which holds the cell's lock).

An incomplete cell (a run killed mid-cell) is cleared and redone; one that left a saved
training state that passes the checks resumes from it.  A cell whose training fails (a
non-finite loss, running out of memory, any other error inside the cell) is stored with
status ``failed`` and the reason, and the run goes on.  What the cell tells while it runs
(console, TensorBoard, peak memory) is :mod:`bench.train.telemetry`.
"""
from __future__ import annotations

import csv
import errno
import io
import json
import platform
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from bench.train import distributed

from bench.core import progress
from bench.data import DataBundle, is_ood
from bench.core.errors import ConfigError, NonFiniteLoss, one_line
from bench.store.plan import Cell
from bench.core.registry import DATASETS, METHODS
from bench.scores import detector_cost
from bench.config.spec import DatasetSpec
from bench.store import CHECKPOINT, TRAIN_LOG, CellDir, CellRecord, Stage1Record, TrainingFeatures
from bench.train.loop import LOG_COLUMNS, TrainResult, fit, optimiser_steps, predict, seed_everything
from bench.train.state import (TRAIN_STATE, UnusableState, read_training_state, state_dict_problem,
                               training_state_bytes)
from bench.train.telemetry import Console, Events, peak_memory_mb, reset_peak_memory, tensorboard_folder


def load_data(spec: DatasetSpec) -> DataBundle:
    """A suite's data set, loaded by its registered family."""
    return DATASETS.get(spec.type).load(spec.options)


def versions() -> dict:
    """The versions a cell records in its ``cell.json``."""
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}


#: what to do before running again when a cell's file cannot be written for want of room
NO_ROOM = {errno.ENOSPC: "after freeing space on that disk", errno.EDQUOT: "after freeing space within your quota",
           errno.EFBIG: "after raising the file-size limit (ulimit -f)"}
TOKENIZER = "tokenizer.json"  # text cells: the vocabulary and length (bench.data.text.WordTokenizer.to_dict)


def _save_state(cd: CellDir, state: dict) -> None:
    # atomic: a kill leaves the old state or the new one, each with its key and checksum
    cd.write_bytes(TRAIN_STATE, training_state_bytes(state, cd.key))


def _saved_state(cell: Cell, cd: CellDir, model: torch.nn.Module, console: Console) -> dict | None:
    """The training state an interrupted run of this cell left, if any, when it is this
    cell's and fits ``model`` (:func:`bench.train.state.read_training_state`); any other state
    is deleted with one warning naming the cell and the reason, and the cell starts over."""
    path = cd.path / TRAIN_STATE
    if not path.is_file():
        return None
    try:
        state = read_training_state(path, cell.key, model, cell.method.train)
    except UnusableState as exc:
        console.warn(f"{cell.label} ({cell.key}): {TRAIN_STATE} not resumed: {exc}; discarded, the cell starts over")
        path.unlink(missing_ok=True)
        return None
    console.log(f"{cd.key}: resuming from epoch {state['epoch']}")
    return state


def run_cell(cell: Cell, data: DataBundle, cd: CellDir, device: torch.device, console: Console,
             tensorboard: bool = False) -> tuple[str, str]:
    """Train, predict every evaluation split, store; returns (status, one-line detail).
    An interrupted cell whose saved training state passes the checks resumes from it.
    ``tensorboard``: also write the training log as TensorBoard events
    (:func:`~bench.train.telemetry.tensorboard_folder`)."""
    cd.reset(keep=(TRAIN_STATE,))  # a damaged sealed cell is moved aside whole: it keeps no state
    method = METHODS.get(cell.method.type)(cell.method.options)
    record = CellRecord(key=cell.key, dataset=cell.dataset.name, method=cell.method.name, seed=cell.seed,
                        config=cell.config, status="running", device=str(device), versions=versions(),
                        started=_now(), samples=method.samples, average=method.average)
    cd.write_cell(record)
    try:
        model, resume, first, record = _start(cell, method, data, cd, device, console, record)
        _ready(cell, method, model, first, resume, device)
        result = _trained(cell, method, model, data, cd, device, console, resume, record, tensorboard)
        _store_training(cd, result, data)
        model = method.prediction_model(model, cell.method.model, data).to(device)
        predicted = _predict_splits(cell, method, model, data, cd, device)
        record = _store_features(cell, method, model, data, cd, device, record)
    except ConfigError:
        raise
    except Exception as exc:  # a failure inside one cell must not stop the grid
        return _failed(cell, cd, record, exc, console)
    record = record.replace(
        finished=_now(), train_seconds=round(result.seconds, 3), predict_seconds=round(predicted.seconds, 3),
        predict_seconds_per_1000=round(1000 * predicted.seconds / max(1, predicted.images), 4),
        parameters=sum(p.numel() for p in model.parameters()), best_epoch=result.best_epoch,
        compile=result.compile, best_val_acc=result.best_val_acc, test_acc=predicted.test_acc,
        peak_memory_mb=peak_memory_mb(device))
    (cd.path / TRAIN_STATE).unlink(missing_ok=True)  # the finished cell needs no resumable state
    cd.seal(record)
    return "complete", _outcome(cell, record)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _start(cell: Cell, method, data: DataBundle, cd: CellDir, device: torch.device, console: Console,
           record: CellRecord) -> tuple[torch.nn.Module, dict | None, dict | None, CellRecord]:
    """The cell's network, seeded, with where it starts from: the saved training state of
    an interrupted run (resumed), a two-stage cell's stage-1 weights (the third item), or
    nothing; the record says which, so that a failure in :func:`_ready` keeps it."""
    seed_everything(cell.seed)
    model = method.build_model(cell.method.model, data).to(device)
    resume = _saved_state(cell, cd, model, console)
    state = None
    if resume is not None:
        record = record.replace(resumed_from_epoch=resume["epoch"])
    elif cell.stage1 is not None:  # two-stage: start from the stage-1 weights
        state, first = stage1_state(cell, cd.path.parent, data, device, console)
        record = record.replace(stage1=first)
    return model, resume, state, record


def _ready(cell: Cell, method, model: torch.nn.Module, stage1: dict | None, resume: dict | None,
           device: torch.device) -> None:
    """Load a two-stage cell's stage-1 weights into ``model`` (and seed again), open the
    peak-memory window and tell the other torchrun ranks."""
    if stage1 is not None:
        method.init_from_stage1(model, stage1)
        seed_everything(cell.seed)
    reset_peak_memory(device)
    if distributed.active():  # the other torchrun ranks train this cell with this one
        distributed.announce({"key": cell.key, "resume": resume})


def _trained(cell: Cell, method, model: torch.nn.Module, data: DataBundle, cd: CellDir, device: torch.device,
             console: Console, resume: dict | None, record: CellRecord, tensorboard: bool) -> TrainResult:
    """The cell's training (:func:`_train`, with its TensorBoard events where asked); a
    post-hoc cell trains nothing: its result is the stage-1 network as stored."""
    if cell.post_hoc:
        first = record.stage1
        return TrainResult({k: v.detach().clone() for k, v in model.state_dict().items()},
                           first.best_epoch, first.best_val_acc)
    events = Events(tensorboard_folder(cd.path.parent, cell), fresh=resume is None) if tensorboard else None
    try:
        result = _train(cell, method, model, data, cd, device, resume, events)
    finally:
        if events is not None:
            events.close()
    if result.compile.startswith("failed"):
        console.warn(f"{cell.label}: torch.compile {result.compile}")
    return result


def _store_training(cd: CellDir, result: TrainResult, data: DataBundle) -> None:
    """The training's files: its log (``train_log.csv``), the chosen weights and, for
    text, the vocabulary the predictions are made with."""
    if result.log:
        log_buf = io.StringIO()
        # every column of any row (a resumed cell's first rows may predate a column)
        writer = csv.DictWriter(log_buf, fieldnames=list(dict.fromkeys(k for row in result.log for k in row)))
        writer.writeheader()
        writer.writerows(result.log)
        cd.write_bytes(TRAIN_LOG, log_buf.getvalue().encode())
    ckpt = io.BytesIO()
    torch.save(result.state_dict, ckpt)
    cd.write_checkpoint(ckpt.getvalue())
    if data.tokenizer is not None:
        cd.write_bytes(TOKENIZER, json.dumps(data.tokenizer.to_dict(), ensure_ascii=False).encode("utf-8"))


@dataclass(frozen=True)
class Predicted:
    """What predicting every split of a cell cost and gave: seconds, images, test accuracy."""

    seconds: float
    images: int
    test_acc: float


def _predict_splits(cell: Cell, method, model: torch.nn.Module, data: DataBundle, cd: CellDir,
                    device: torch.device) -> Predicted:
    """Predict and store every evaluation split (logits and features on the splits OOD
    scores read, :func:`scored_split`); a shift or OOD split's data is released once stored."""
    t_pred, n_pred, test_acc = time.perf_counter(), 0, float("nan")
    train = cell.method.train
    for split in data.eval_splits(cell.dataset.splits):
        s = data.get(split)
        scored = scored_split(split)
        passes = f"{method.samples} passes" if method.samples > 1 else "1 pass"
        with progress.task(f"{cell.label}: predict {split}", total=len(s) * method.samples, unit="img",
                           done=f"{len(s)} images x {passes}", detail=True) as task:
            preds = predict(method, model, s, data, device, train.eval_batch_size, extras=True,
                            precision=train.precision, batch_passes=train.batch_passes,
                            features=cell.store.features and scored, on_pass=task.advance)
        cd.write_preds(split, preds if scored else preds.replace(logits=None))
        n_pred += len(s)
        if split == "test":
            test_acc = float((preds.log_probs.argmax(1) == s.y).mean())
        if split not in ("train", "val", "test"):
            data.release(split)
    return Predicted(time.perf_counter() - t_pred, n_pred, test_acc)


def _store_features(cell: Cell, method, model: torch.nn.Module, data: DataBundle, cd: CellDir,
                    device: torch.device, record: CellRecord) -> CellRecord:
    """Where the suite stores features: the training features and the feature-space
    detectors' cost (``ood_detectors``), or why the model has none (``no_features``)."""
    if not cell.store.features:
        return record
    if why := features_absent(model):
        record = record.replace(no_features=why)  # analysis names it where a feature score is missing
    else:
        _store_training_features(cell, method, model, data, cd, device)
    return record.replace(ood_detectors=_detector_cost(cd) or None)


def _outcome(cell: Cell, record: CellRecord) -> str:
    """The one-line detail of a complete cell."""
    if cell.post_hoc:  # its "best epoch" is its stage 1's: it trained nothing
        first = record.stage1
        where = f"{first.method}'s stored cell" if first.reused else \
            f"{first.method}'s network, trained in this cell (its cell was not in the store)"
        return f"fitted on {where}, test acc {record.test_acc:.3f}"
    return f"best epoch {record.best_epoch}, test acc {record.test_acc:.3f}"


def _failed(cell: Cell, cd: CellDir, record: CellRecord, exc: Exception, console: Console) -> tuple[str, str]:
    """The cell stored as failed with a one-line reason for ``exc`` (called while it is
    handled): a non-finite loss as it says, running out of memory with the sizes to
    lower, an OSError with its path and what to do, any other error with its traceback
    on the console."""
    if isinstance(exc, NonFiniteLoss):
        return cd.mark_failed(record, str(exc))
    if isinstance(exc, Stage1Unusable):
        return _fail_cell(cd, record, str(exc))
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):  # this cell is too big; the grid goes on
        m, t = cell.method.model, cell.method.train
        return _fail_cell(cd, record, (
            f"out of memory ({type(exc).__name__}) with model dim {m.dim}, depth {m.depth}, heads {m.heads}, "
            f"batch_size {t.batch_size}, eval_batch_size {t.eval_batch_size}: lower batch_size / "
            "eval_batch_size or the model size, or use a machine with more memory"))
    if isinstance(exc, OSError):  # a full disk, the file-size limit, an unreadable file: its path, no traceback
        fix = NO_ROOM.get(exc.errno, "once that is fixed")
        return _fail_cell(cd, record, f"{one_line(exc)}; run again {fix} to redo the cell")
    console.warn(traceback.format_exc())
    return _fail_cell(cd, record, f"{type(exc).__name__}: {exc}")


class Stage1Unusable(Exception):
    """A two-stage cell's stored stage-1 cell that must not be started from; the message
    names that cell, what is wrong with it and what to do."""


def stage1_state(cell: Cell, store_root: Path, data: DataBundle, device: torch.device,
                 console: Console) -> tuple[dict, Stage1Record]:
    """The stage-1 weights of a two-stage cell and what was done for them: the stored
    ``checkpoint.pt`` of its stage-1 cell (``cell.stage1``, the folder of its key) when the
    store holds it complete, else that cell's method trained here with its own settings and
    seed (not stored as a cell).  The record (``stage1`` in cell.json) names the cell and
    gives stage 1's training seconds, best epoch and best validation accuracy (those of the
    stored cell when it was reused).

    A stored stage-1 cell is checked as the store checks any cell, checkpoint included
    (:meth:`bench.store.CellDir.condition`, once), and its weights against the network its
    method builds (names, dtypes, shapes); one that is damaged or does not fit raises
    :class:`Stage1Unusable` (nothing is trained from it)."""
    first = cell.stage1
    name = f"its stage-1 cell {first.key} ({first.label})"
    method = METHODS.get(first.method.type)(first.method.options)
    found = CellDir(Path(store_root) / first.key)
    state, why = found.condition()
    if state == "damaged":
        raise Stage1Unusable(f"{name} is damaged: {why}; run again: `run` moves it aside and retrains it "
                             "before this cell")
    stored = found.read_cell() if state == "complete" else None
    if stored is not None and (stored.dataset, stored.method, stored.seed) == (
            first.dataset.name, first.method.name, first.seed):
        weights = torch.load(found.path / CHECKPOINT, map_location="cpu", weights_only=True)
        expected = {k: (v.dtype, tuple(v.shape))
                    for k, v in method.build_model(first.method.model, data).state_dict().items()}
        if (why := state_dict_problem(weights, expected)) is not None:
            raise Stage1Unusable(f"{name} holds a {CHECKPOINT} that does not fit {first.method.name}'s network "
                                 f"({why}); move its folder {found.path} aside and run again to retrain it")
        return weights, Stage1Record(first.method.name, first.key, True, stored.train_seconds, stored.best_epoch,
                                     stored.best_val_acc)
    console.log(f"{cell.label}: stage 1 ({first.label}, {first.key}) is not in the store: training it in this cell")
    seed_everything(first.seed)
    model = method.build_model(first.method.model, data).to(device)
    with progress.task(f"{cell.label}: training (stage 1 of {cell.method.name})", total=first.method.train.epochs,
                       unit="epoch") as task:
        result = fit(method, model, data, first.method.train, device, first.seed, on_epoch=lambda row: task.advance())
    return result.state_dict, Stage1Record(first.method.name, first.key, False, round(result.seconds, 3),
                                           result.best_epoch, result.best_val_acc)


def _train(cell: Cell, method, model: torch.nn.Module, data: DataBundle, cd: CellDir, device: torch.device,
           resume: dict | None, events: Events | None):
    """:func:`bench.train.loop.fit` with its progress (a step at a time; a line per epoch in
    ``lines`` mode), its resumable states saved in the cell and its log rows as events."""
    train = cell.method.train
    epochs_left = train.epochs - (resume["epoch"] if resume else 0)
    steps = optimiser_steps(len(data.get("train")), train.batch_size) * epochs_left

    with progress.task(f"{cell.label}: training", total=steps, unit="step") as task:
        def on_epoch(row: dict) -> None:
            task.note(f"epoch {row['epoch']}/{train.epochs}: {epoch_losses(row)}, "
                      f"acc {row['train_acc']:.3f}, val acc {row['val_acc']:.3f} ({progress.duration(row['seconds'])})")
            if events is not None:
                events.epoch(row)

        return fit(method, model, data, train, device, cell.seed, on_epoch=on_epoch, resume=resume,
                   on_checkpoint=lambda state: _save_state(cd, state), on_step=task.advance)


def epoch_losses(row: dict) -> str:
    """An epoch's losses as its progress line gives them: the data term first
    (``cross-entropy 0.4321``), then each of the method's own columns by name and the
    objective they make together (``; kl 3.39e+04, ksvd 1.32 (the method's, as logged);
    objective 3.389e+04``), so a large method term is not read as a diverging fit."""
    text = f"cross-entropy {row['train_ce']:.4f}"
    own = [(k, v) for k, v in row.items() if k not in LOG_COLUMNS and isinstance(v, (int, float))]
    if own:
        text += (f"; {', '.join(f'{k} {v:.4g}' for k, v in own)} (the method's, as logged); "
                 f"objective {row['train_loss']:.4g}")
    return text


def scored_split(split: str) -> bool:
    """Whether a split's logits and features are stored: ``val``, ``test`` and ``ood/...``,
    the splits OOD scores read (the corruption grid would multiply a cell's size: 75 x
    10,000 CIFAR images of 384 features)."""
    return split in ("val", "test") or is_ood(split)


def training_subset(n: int, limit: int) -> np.ndarray:
    """The training images whose features a cell stores: all ``n`` when ``n <= limit``,
    else ``limit`` of them drawn without replacement by a generator seeded 0 (the same
    images for every method and seed of a dataset), in ascending order."""
    if n <= limit:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).choice(n, size=limit, replace=False))


def features_absent(model: torch.nn.Module) -> str | None:
    """Why a model stores no features although the suite keeps them (its readout is not a
    Linear layer, whose input the features are: SNGP's random-feature GP head, last-layer
    Laplace's posterior head); None when it stores them."""
    head = getattr(model, "head", None)
    if isinstance(head, torch.nn.Linear):
        return None
    return f"its model's readout ({type(head).__name__}) is not a Linear layer, whose input the store keeps as features"


def _store_training_features(cell: Cell, method, model: torch.nn.Module, data: DataBundle, cd: CellDir,
                             device: torch.device) -> None:
    """The features of :func:`training_subset` of the training split (predicted as a test
    split: no augmentation, the method's passes) and the classifier head, for the OOD
    scores that fit on in-distribution data (a model whose head is a Linear:
    :func:`features_absent`)."""
    head = model.head
    train = data.get("train")
    index = training_subset(len(train), cell.store.train_features)
    subset = type(train)(np.ascontiguousarray(train.x[index]), np.ascontiguousarray(train.y[index]))
    t = cell.method.train
    with progress.task(f"{cell.label}: predict training features", total=len(subset) * method.samples, unit="img",
                       done=f"{len(subset)} images", detail=True) as task:
        preds = predict(method, model, subset, data, device, t.eval_batch_size, extras=True, precision=t.precision,
                        batch_passes=t.batch_passes, features=True, on_pass=task.advance)
    if preds.features is not None:
        weight = head.weight.detach().float().cpu().numpy()
        bias = head.bias.detach().float().cpu().numpy() if head.bias is not None else np.zeros(len(weight), np.float32)
        cd.write_training_features(TrainingFeatures(preds.features, subset.y, weight, bias, np.int64(len(train))))


def _detector_cost(cd: CellDir) -> dict[str, dict[str, float]] | None:
    """:func:`bench.scores.detector_cost` of the cell's stored training features and test
    split, for ``cell.json`` (None without training features or a test split)."""
    training = cd.read_training_features()
    if training is None or "test" not in cd.splits():
        return None
    return detector_cost(training, cd.read_preds("test"))


def _fail_cell(cd: CellDir, record: CellRecord, reason: str) -> tuple[str, str]:
    """A cell's own failure (not a non-finite loss): recorded, and the grid goes on; under
    torchrun the other ranks may wait in a collective, so the run stops (torchrun ends them)."""
    outcome = cd.mark_failed(record, reason)
    if distributed.active():
        distributed.abort(f"cell {record.key} failed: {reason}")
    return outcome
