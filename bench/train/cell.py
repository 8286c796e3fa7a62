"""One cell from start to end, in whichever process runs it: :func:`run_cell` trains the
cell's model (:mod:`bench.train.loop`), predicts every evaluation split and stores the
predictions (:mod:`bench.store`).  Every executor calls it (through
:func:`bench.run.executors.run_job`, which holds the cell's lock).

An incomplete cell (a run killed mid-cell) is cleared and redone; one that left a saved
training state that passes the checks resumes from it.  A cell whose training fails (a
non-finite loss, running out of memory, any other error inside the cell) is stored with
status ``failed`` and the reason, and the run goes on.  Also here: the console a cell
logs on (:class:`Console`; its progress, training per step and prediction per pass and
split, goes through :mod:`bench.core.progress`), its TensorBoard events (:class:`Events`) and
its peak-memory window (:func:`reset_peak_memory`, :func:`peak_memory_mb`).
"""
from __future__ import annotations

import csv
import errno
import io
import json
import platform
import re
import shutil
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from bench.train import distributed

from bench.core import progress
from bench.data import DataBundle, is_ood
from bench.core.errors import ConfigError, NonFiniteLoss, one_line, require_package
from bench.store.plan import Cell
from bench.core.registry import DATASETS, METHODS
from bench.scores import detector_cost
from bench.config.spec import DatasetSpec
from bench.store import TRAIN_LOG, CellDir
from bench.train.loop import LOG_COLUMNS, TrainResult, fit, optimiser_steps, predict, seed_everything
from bench.train.state import UnusableState, read_training_state, state_dict_problem, training_state_bytes


class Console:
    """A run's log on stderr: a line per finished cell and the like, nothing when quiet;
    warnings always.  Lines go above any progress bar (:func:`bench.core.progress.write`)."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet

    def log(self, msg: str) -> None:
        if not self.quiet:
            progress.write(msg)

    def warn(self, msg: str) -> None:
        progress.write(f"warning: {msg}")


TENSORBOARD = "tensorboard"  # <store>/tensorboard/<dataset>/<method>/seed<seed>/: one TensorBoard run per cell
#: a training-log column -> its TensorBoard tag (other columns, the method's own: ``method/<column>``)
TENSORBOARD_TAGS = {"train_loss": "loss/train", "train_ce": "loss/train_cross_entropy", "train_acc": "accuracy/train",
                    "val_acc": "accuracy/val",
                    "val_nll": "nll/val", "lr": "learning_rate", "seconds": "time/epoch_seconds"}


def require_tensorboard() -> None:
    """``--log tensorboard`` where the optional ``tensorboard`` package is missing or
    broken (it fails on import): a one-line ConfigError saying how to install or reinstall it."""
    require_package("torch.utils.tensorboard", "tensorboard", "--log tensorboard",  # imports the tensorboard package
                    otherwise=" (or leave --log out; train_log.csv is written either way)")


def tensorboard_folder(store_root: Path, cell: Cell) -> Path:
    """The cell's TensorBoard run: ``<store>/tensorboard/<dataset>/<method>/seed<seed>``
    (names reduced to letters, digits, ``_``, ``.``, ``-``), so ``tensorboard --logdir
    <store>/tensorboard`` shows every cell of a run side by side."""
    def safe(name: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "_"

    return Path(store_root) / TENSORBOARD / safe(cell.dataset.name) / safe(cell.method.name) / f"seed{cell.seed}"


class Events:
    """A cell's training log as TensorBoard scalars (one event file per run of the cell):
    each column of a log row under its tag (:data:`TENSORBOARD_TAGS`), at the epoch."""

    def __init__(self, folder: Path, fresh: bool) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if fresh:  # a cell started over: its earlier curves would overlap the new ones
            shutil.rmtree(folder, ignore_errors=True)
        self.writer = SummaryWriter(log_dir=str(folder))

    def epoch(self, row: dict) -> None:
        for column, value in row.items():
            if column != "epoch" and isinstance(value, (int, float)) and value == value:
                self.writer.add_scalar(TENSORBOARD_TAGS.get(column, f"method/{column}"), value, int(row["epoch"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def load_data(spec: DatasetSpec) -> DataBundle:
    """A suite's data set, loaded by its registered family."""
    return DATASETS.get(spec.type).load(spec.options)


def versions() -> dict:
    """The versions a cell records in its ``cell.json``."""
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}


#: what to do before running again when a cell's file cannot be written for want of room
NO_ROOM = {errno.ENOSPC: "after freeing space on that disk", errno.EDQUOT: "after freeing space within your quota",
           errno.EFBIG: "after raising the file-size limit (ulimit -f)"}
TRAIN_STATE = "train_state.pt"  # the resumable training state of a cell in progress
TOKENIZER = "tokenizer.json"  # text cells: the vocabulary and length (bench.data.text.WordTokenizer.to_dict)


def saved_epoch(cd: CellDir) -> int | None:
    """The epoch a cell's resumable training state was saved at (None: no state, or one
    that cannot be read); the file is mapped, not read whole."""
    path = cd.path / TRAIN_STATE
    if not path.is_file():
        return None
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["epoch"])
    except Exception:  # noqa: BLE001  (a state being written or damaged)
        return None


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
    (:func:`tensorboard_folder`)."""
    cd.reset(keep=(TRAIN_STATE,))  # a damaged sealed cell is moved aside whole: it keeps no state
    method = METHODS.get(cell.method.type)(cell.method.options)
    info = {
        "key": cell.key,
        "dataset": cell.dataset.name,
        "method": cell.method.name,
        "seed": cell.seed,
        "config": cell.config,
        "status": "running",
        "device": str(device),
        "versions": versions(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "samples": method.samples,
        "average": method.average,
    }
    cd.write_cell(info)
    try:
        seed_everything(cell.seed)
        model = method.build_model(cell.method.model, data).to(device)
        resume = _saved_state(cell, cd, model, console)
        if resume is not None:
            info["resumed_from_epoch"] = resume["epoch"]
        elif cell.stage1 is not None:  # two-stage: start from the stage-1 weights
            state, info["stage1"] = stage1_state(cell, cd.path.parent, data, device, console)
            method.init_from_stage1(model, state)
            seed_everything(cell.seed)
        reset_peak_memory(device)
        if distributed.active():  # the other torchrun ranks train this cell with this one
            distributed.announce({"key": cell.key, "resume": resume})
        if cell.post_hoc:  # nothing to train: the stage-1 network as stored
            first = info["stage1"]
            result = TrainResult({k: v.detach().clone() for k, v in model.state_dict().items()},
                                 first["best_epoch"], first["best_val_acc"])
        else:
            events = Events(tensorboard_folder(cd.path.parent, cell), fresh=resume is None) if tensorboard else None
            try:
                result = _train(cell, method, model, data, cd, device, resume, events)
            finally:
                if events is not None:
                    events.close()
        if result.compile.startswith("failed"):
            console.warn(f"{cell.label}: torch.compile {result.compile}")
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
        if data.tokenizer is not None:  # the vocabulary the predictions were made with
            cd.write_bytes(TOKENIZER, json.dumps(data.tokenizer.to_dict(), ensure_ascii=False).encode("utf-8"))

        model = method.prediction_model(model, cell.method.model, data).to(device)
        t_pred, n_pred, detectors = time.perf_counter(), 0, None
        test_acc = float("nan")
        for split in data.eval_splits(cell.dataset.splits):
            s = data.get(split)
            extras: dict[str, np.ndarray] = {}
            train = cell.method.train
            scored = scored_split(split)
            passes = f"{method.samples} passes" if method.samples > 1 else "1 pass"
            with progress.task(f"{cell.label}: predict {split}", total=len(s) * method.samples, unit="img",
                               done=f"{len(s)} images x {passes}", detail=True) as task:
                lp = predict(method, model, s, data, device, train.eval_batch_size, extras,
                             precision=train.precision, batch_passes=train.batch_passes,
                             features=cell.store.features and scored, on_pass=task.advance)
            if not scored:
                extras.pop("logits", None)
            cd.write_preds(split, lp, s.y, **extras)
            n_pred += len(s)
            if split == "test":
                test_acc = float((lp.argmax(1) == s.y).mean())
            if split not in ("train", "val", "test"):
                data.release(split)
        pred_secs = time.perf_counter() - t_pred
        if cell.store.features:
            if why := features_absent(model):
                info["no_features"] = why  # analysis names it where a feature score is missing
            else:
                _store_training_features(cell, method, model, data, cd, device)
            detectors = _detector_cost(cd)
    except NonFiniteLoss as exc:
        return cd.mark_failed(info, str(exc))
    except Stage1Unusable as exc:
        return _fail_cell(cd, info, str(exc))
    except ConfigError:
        raise
    except (MemoryError, torch.OutOfMemoryError) as exc:  # this cell is too big; the grid goes on
        m, t = cell.method.model, cell.method.train
        return _fail_cell(cd, info, (
            f"out of memory ({type(exc).__name__}) with model dim {m.dim}, depth {m.depth}, heads {m.heads}, "
            f"batch_size {t.batch_size}, eval_batch_size {t.eval_batch_size}: lower batch_size / "
            "eval_batch_size or the model size, or use a machine with more memory"))
    except OSError as exc:  # a full disk, the file-size limit, an unreadable file: its path, no traceback
        fix = NO_ROOM.get(exc.errno, "once that is fixed")
        return _fail_cell(cd, info, f"{one_line(exc)}; run again {fix} to redo the cell")
    except Exception as exc:  # a bug or resource error inside one cell must not stop the grid
        console.warn(traceback.format_exc())
        return _fail_cell(cd, info, f"{type(exc).__name__}: {exc}")
    info.update(
        {
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "train_seconds": round(result.seconds, 3),
            "predict_seconds": round(pred_secs, 3),
            "predict_seconds_per_1000": round(1000 * pred_secs / max(1, n_pred), 4),
            "parameters": sum(p.numel() for p in model.parameters()),
            "best_epoch": result.best_epoch,
            "compile": result.compile,
            "best_val_acc": result.best_val_acc,
            "test_acc": test_acc,
            "peak_memory_mb": peak_memory_mb(device),
        }
    )
    if detectors:
        info["ood_detectors"] = detectors
    (cd.path / TRAIN_STATE).unlink(missing_ok=True)  # the finished cell needs no resumable state
    cd.seal(info)
    if cell.post_hoc:  # its "best epoch" is its stage 1's: it trained nothing
        first = info["stage1"]
        where = f"{first['method']}'s stored cell" if first["reused"] else \
            f"{first['method']}'s network, trained in this cell (its cell was not in the store)"
        return "complete", f"fitted on {where}, test acc {test_acc:.3f}"
    return "complete", f"best epoch {result.best_epoch}, test acc {test_acc:.3f}"


class Stage1Unusable(Exception):
    """A two-stage cell's stored stage-1 cell that must not be started from; the message
    names that cell, what is wrong with it and what to do."""


def stage1_state(cell: Cell, store_root: Path, data: DataBundle, device: torch.device,
                 console: Console) -> tuple[dict, dict]:
    """The stage-1 weights of a two-stage cell and what was done for them: the stored
    ``checkpoint.pt`` of its stage-1 cell (``cell.stage1``, found by
    :func:`bench.store.catalog.stored_cell`) when the store holds it complete, else that cell's
    method trained here with its own settings and seed (not stored as a cell).  The record
    (``stage1`` in cell.json) names the cell and gives stage 1's training seconds, best
    epoch and best validation accuracy (those of the stored cell when it was reused).

    A stored stage-1 cell is checked as the store checks any cell, checkpoint included
    (:meth:`bench.store.CellDir.condition`), and its weights against the network its
    method builds (names, dtypes, shapes); one that is damaged or does not fit raises
    :class:`Stage1Unusable` (nothing is trained from it)."""
    from bench.store.catalog import stored_cell
    from bench.store import CHECKPOINT

    first = cell.stage1
    name = f"its stage-1 cell {first.key} ({first.label})"
    found = stored_cell(store_root, first.dataset.name, first.method.name, first.seed, first.key)
    if found is None and (damage := CellDir(Path(store_root) / first.key).condition())[0] == "damaged":
        raise Stage1Unusable(f"{name} is damaged: {damage[1]}; run again: `run` moves it aside and retrains it "
                             "before this cell")
    if found is not None:
        state = torch.load(found.path / CHECKPOINT, map_location="cpu", weights_only=True)
        method = METHODS.get(first.method.type)(first.method.options)
        expected = {k: (v.dtype, tuple(v.shape))
                    for k, v in method.build_model(first.method.model, data).state_dict().items()}
        if (why := state_dict_problem(state, expected)) is not None:
            raise Stage1Unusable(f"{name} holds a {CHECKPOINT} that does not fit {first.method.name}'s network "
                                 f"({why}); move its folder {found.path} aside and run again to retrain it")
        stored = found.read_cell() or {}
        return state, {"method": first.method.name, "key": first.key, "reused": True,
                       **{k: stored.get(k) for k in ("train_seconds", "best_epoch", "best_val_acc")}}
    console.log(f"{cell.label}: stage 1 ({first.label}, {first.key}) is not in the store: training it in this cell")
    method = METHODS.get(first.method.type)(first.method.options)
    seed_everything(first.seed)
    model = method.build_model(first.method.model, data).to(device)
    with progress.task(f"{first.label}: training (stage 1 of {cell.method.name})", total=first.method.train.epochs,
                       unit="epoch") as task:
        result = fit(method, model, data, first.method.train, device, first.seed, on_epoch=lambda row: task.advance())
    return result.state_dict, {"method": first.method.name, "key": first.key, "reused": False,
                               "train_seconds": round(result.seconds, 3), "best_epoch": result.best_epoch,
                               "best_val_acc": result.best_val_acc}


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
    extras: dict[str, np.ndarray] = {}
    t = cell.method.train
    with progress.task(f"{cell.label}: predict training features", total=len(subset) * method.samples, unit="img",
                       done=f"{len(subset)} images", detail=True) as task:
        predict(method, model, subset, data, device, t.eval_batch_size, extras, precision=t.precision,
                batch_passes=t.batch_passes, features=True, on_pass=task.advance)
    if "features" in extras:
        weight = head.weight.detach().float().cpu().numpy()
        bias = head.bias.detach().float().cpu().numpy() if head.bias is not None else np.zeros(len(weight), np.float32)
        cd.write_training_features(extras["features"], subset.y, weight, bias, len(train))


def _detector_cost(cd: CellDir) -> dict[str, dict[str, float]] | None:
    """:func:`bench.scores.detector_cost` of the cell's stored training features and test
    split, for ``cell.json`` (None without training features or a test split)."""
    training = cd.read_training_features()
    if training is None or "test" not in cd.splits():
        return None
    return detector_cost(training, cd.read_arrays("test"))


def _fail_cell(cd: CellDir, info: dict, reason: str) -> tuple[str, str]:
    """A cell's own failure (not a non-finite loss): recorded, and the grid goes on; under
    torchrun the other ranks may wait in a collective, so the run stops (torchrun ends them)."""
    outcome = cd.mark_failed(info, reason)
    if distributed.active():
        distributed.abort(f"cell {info['key']} failed: {reason}")
    return outcome


def reset_peak_memory(device: torch.device) -> None:
    """Start a cell's peak-memory window: CUDA's peak counter, or on Linux the process's
    resident-set high-water mark (writing 5 to /proc/self/clear_refs resets VmHWM)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux, or not allowed: peak_memory_mb falls back to the lifetime peak


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory since :func:`reset_peak_memory`: CUDA memory allocated, or the
    process's peak resident set (VmHWM; without /proc, the lifetime peak ru_maxrss)."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB
