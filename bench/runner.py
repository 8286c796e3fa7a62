"""The sequential local runner: train and predict every incomplete cell of a plan.

Complete cells (manifest verifies) are skipped with a log line; incomplete ones (a run
killed mid-cell) are cleared and redone; a cell whose training fails (non-finite loss, or
any other error inside the cell) is stored with status ``failed`` and the reason, and the
run goes on.  Configuration problems are found up front, before anything is written, by
building every (dataset, method) model once (:func:`preflight`).
"""
from __future__ import annotations

import csv
import io
import json
import platform
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from bench import distributed
from bench.data import DataBundle
from bench.errors import ConfigError, NonFiniteLoss
from bench.plan import Cell, Plan
from bench.registry import DATASETS, METHODS
from bench.spec import DatasetSpec
from bench.store import CellDir, Store
from bench.train import UnusableState, fit, predict, read_training_state, seed_everything, training_state_bytes


class Console:
    """Progress bars on a terminal, one line per finished cell, nothing when quiet."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.bars = not quiet and sys.stderr.isatty()
        self._tqdm = None
        if self.bars:
            from tqdm import tqdm

            self._tqdm = tqdm

    def log(self, msg: str) -> None:
        if self.quiet:
            return
        if self._tqdm is not None:
            self._tqdm.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)

    def warn(self, msg: str) -> None:
        print(f"warning: {msg}", file=sys.stderr, flush=True)

    def bar(self, total: int, desc: str, leave: bool = True):
        if self._tqdm is None:
            return None
        return self._tqdm(total=total, desc=desc, leave=leave, file=sys.stderr, dynamic_ncols=True)


def load_data(spec: DatasetSpec) -> DataBundle:
    return DATASETS.get(spec.type).load(spec.options)


def preflight(plan: Plan, datasets: dict[str, DataBundle], to_run: set[str] | None = None) -> None:
    """Raise ConfigError for anything that would make a cell fail for config reasons:
    split patterns matching nothing, a model that cannot be built for the data, or a data
    file that cannot be read.  Every split a cell still ``to_run`` (dataset names; None =
    all) needs -- train, val, test, shift and OOD -- is loaded once and released, so a broken
    file is an error before the first cell trains (generated corruptions land in their cache)."""
    for d in plan.suite.datasets:
        data = datasets[d.name]
        if to_run is None or d.name in to_run:
            for split in ["train", *data.eval_splits(d.splits)]:
                try:
                    data.get(split)
                except ConfigError:
                    raise
                except Exception as exc:  # noqa: BLE001  (any reader error: named, exit 2, nothing trained)
                    raise ConfigError(f"datasets.{d.name}: split {split!r} cannot be read: "
                                      f"{type(exc).__name__}: {exc}") from None
                data.release(split)
        for pattern in d.splits:
            if not data.eval_splits((pattern,))[1:] and pattern != "val":
                raise ConfigError(
                    f"datasets.{d.name}.splits: pattern {pattern!r} matches no split; "
                    f"available: {', '.join(n for n in data.split_names() if n != 'train')}"
                )
        for m in plan.suite.methods:
            if m.kind == "trained":  # the training and the prediction model (a swapped attention)
                method = METHODS.get(m.type)(m.options)
                method.prediction_model(method.build_model(m.model, data), m.model, data)


def versions() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}


@dataclass
class RunSummary:
    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)  # locked by another runner on the same store


def run_plan(plan: Plan, store: Store, device: torch.device, console: Console, describe=None,
             executor: str = "local", workers: int = 1, cells_per_gpu: int = 1, slurm=None,
             plugins: tuple[str, ...] = ()) -> RunSummary:
    """Run every incomplete cell with the chosen executor (:mod:`bench.executors`).
    ``describe`` (the full suite) is recorded in the store's ``suite.json`` once the data
    loaded and the preflight checks passed, before any cell.  Under torchrun, rank 0 does
    all this and the other ranks follow it (:func:`_follow`)."""
    rank, size = distributed.world()
    if size > 1 and executor != "local":
        raise ConfigError(f"torchrun trains each cell on its {size} processes together: use --executor local "
                          f"(got {executor}); to run several cells at once, start several runners instead")
    if rank > 0:
        return _follow(plan, device)
    try:
        datasets = {d.name: load_data(d) for d in plan.suite.datasets}
        # every cell verified once (sha256 of its files): decides what preflight loads and what runs
        conditions = {c.key: store.cell(c.key).condition() for c in plan.cells}
        preflight(plan, datasets, {c.dataset.name for c in plan.cells if conditions[c.key][0] != "complete"})
    except BaseException:
        if size > 1:
            distributed.announce(None)  # the followers stop too
        raise
    if size > 1:
        distributed.announce("ready")  # the data (and generated caches) are in place for the followers
    try:
        return _run_jobs(plan, store, device, console, describe, executor, workers, cells_per_gpu, slurm, plugins,
                         datasets, conditions)
    finally:
        if size > 1:
            distributed.announce(None)  # no more cells: the followers return


def _run_jobs(plan, store, device, console, describe, executor, workers, cells_per_gpu, slurm, plugins,
              datasets, conditions) -> RunSummary:
    """:func:`run_plan` once the data are loaded and checked: describe the store, submit the
    incomplete cells to the executor, log each outcome."""
    from bench.data import data_settings
    from bench.executor_config import SlurmOptions
    from bench.executors import Job, pool, preload, run_job, submitit_run

    if describe is not None:
        from bench.catalog import write_store_description

        write_store_description(store.root, describe)
    summary = RunSummary()
    total = len(plan.cells)
    for cell in plan.cells:
        if conditions[cell.key][0] == "complete":
            console.log(f"[{len(summary.skipped) + 1}/{total}] {cell.label}: complete, skipped ({cell.key})")
            summary.skipped.append(cell.key)
    settings = data_settings()
    jobs = [Job(c, str(store.root), str(device), tuple(plugins), str(settings.root) if settings.root else None,
                settings.download, settings.strict) for c in plan.cells if conditions[c.key][0] != "complete"]
    if executor == "local":
        preload(datasets)
        outcomes = (run_job(job, console) for job in jobs)
    elif executor == "processes":
        devices = None
        if device.type == "cuda" and torch.cuda.device_count() > 0:
            gpus = torch.cuda.device_count()
            workers = gpus * cells_per_gpu
            devices = [f"cuda:{i % gpus}" for i in range(workers)]
        console.log(f"executor processes: {workers} worker(s)" + (f" on {len(set(devices))} GPU(s)" if devices else ""))
        outcomes = pool(jobs, workers, devices)
    else:
        folder = store.root / ".submitit"
        console.log(f"executor {executor}: {len(jobs)} job(s), scripts and logs in {folder}")
        outcomes = submitit_run(jobs, folder, executor, slurm or SlurmOptions())
    bar = console.bar(len(jobs), "cells")
    finished = len(summary.skipped)
    for n_out, out in enumerate(outcomes, 1):
        finished += 1
        prefix = f"[{finished}/{total}] {out.label}"
        if out.status == "complete":
            console.log(f"{prefix}: complete in {out.seconds:.1f} s, {out.detail}")
            summary.done.append(out.key)
        elif out.status == "skipped":
            console.log(f"{prefix}: completed by another runner, skipped ({out.key})")
            summary.skipped.append(out.key)
        elif out.status == "elsewhere":
            console.log(f"{prefix}: running elsewhere, {out.detail}; left to that runner")
            summary.elsewhere.append(out.key)
        else:
            console.warn(f"{prefix}: FAILED after {out.seconds:.1f} s: {out.detail}")
            summary.failed.append(out.key)
        if executor != "local":
            console.log(f"  {len(summary.done)} done, {len(summary.failed)} failed, "
                        f"{len(jobs) - n_out} queued or running")
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return summary


def _follow(plan: Plan, device: torch.device) -> RunSummary:
    """A torchrun rank other than 0: train each cell rank 0 announces with it (same seed,
    same model, its share of every batch), store nothing, until rank 0 says done."""
    if distributed.announce() != "ready":
        return RunSummary()
    datasets = {d.name: load_data(d) for d in plan.suite.datasets}
    cells = {c.key: c for c in plan.cells}
    summary = RunSummary()
    while (message := distributed.announce()) is not None:
        cell = cells[message["key"]]
        method = METHODS.get(cell.method.type)(cell.method.options)
        seed_everything(cell.seed)
        model = method.build_model(cell.method.model, datasets[cell.dataset.name]).to(device)
        try:
            fit(method, model, datasets[cell.dataset.name], cell.method.train, device, cell.seed, resume=message["resume"])
            summary.done.append(cell.key)
        except NonFiniteLoss:  # every rank sees it at the same step; rank 0 records the failure
            summary.failed.append(cell.key)
        except BaseException as exc:  # noqa: BLE001 - rank 0 waits in a collective: stop them all
            distributed.abort(f"{cell.label}: {type(exc).__name__}: {exc}")
    return summary


TRAIN_STATE = "train_state.pt"  # the resumable training state of a cell in progress
TOKENIZER = "tokenizer.json"  # text cells: the vocabulary and length (bench.text.WordTokenizer.to_dict)


def _save_state(cd: CellDir, state: dict) -> None:
    # atomic: a kill leaves the old state or the new one, each with its key and checksum
    cd.write_bytes(TRAIN_STATE, training_state_bytes(state, cd.key))


def _saved_state(cell: Cell, cd: CellDir, model: torch.nn.Module, console: Console) -> dict | None:
    """The training state an interrupted run of this cell left, if any, when it is this
    cell's and fits ``model`` (:func:`bench.train.read_training_state`); any other state
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


def run_cell(cell: Cell, data: DataBundle, cd: CellDir, device: torch.device, console: Console) -> tuple[str, str]:
    """Train, predict every evaluation split, store; returns (status, one-line detail).
    An interrupted cell whose saved training state passes the checks resumes from it."""
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
        reset_peak_memory(device)
        if distributed.active():  # the other torchrun ranks train this cell with this one
            distributed.announce({"key": cell.key, "resume": resume})
        bar = console.bar(cell.method.train.epochs, "epochs", leave=False)
        result = fit(method, model, data, cell.method.train, device, cell.seed,
                     on_epoch=(lambda _r: bar.update(1)) if bar else None, resume=resume,
                     on_checkpoint=lambda state: _save_state(cd, state))
        if bar is not None:
            bar.close()
        if result.compile.startswith("failed"):
            console.warn(f"{cell.label}: torch.compile {result.compile}")
        log_buf = io.StringIO()
        writer = csv.DictWriter(log_buf, fieldnames=list(result.log[0]))
        writer.writeheader()
        writer.writerows(result.log)
        cd.write_bytes("train_log.csv", log_buf.getvalue().encode())
        ckpt = io.BytesIO()
        torch.save(result.state_dict, ckpt)
        cd.write_checkpoint(ckpt.getvalue())
        if data.tokenizer is not None:  # the vocabulary the predictions were made with
            cd.write_bytes(TOKENIZER, json.dumps(data.tokenizer.to_dict(), ensure_ascii=False).encode("utf-8"))

        model = method.prediction_model(model, cell.method.model, data).to(device)
        t_pred, n_pred = time.perf_counter(), 0
        test_acc = float("nan")
        for split in data.eval_splits(cell.dataset.splits):
            s = data.get(split)
            extras: dict[str, np.ndarray] = {}
            train = cell.method.train
            lp = predict(method, model, s, data, device, train.eval_batch_size, extras, precision=train.precision,
                         batch_passes=train.batch_passes)
            cd.write_preds(split, lp, s.y, **extras)
            n_pred += len(s)
            if split == "test":
                test_acc = float((lp.argmax(1) == s.y).mean())
            if split not in ("train", "val", "test"):
                data.release(split)
        pred_secs = time.perf_counter() - t_pred
    except NonFiniteLoss as exc:
        return cd.mark_failed(info, str(exc))
    except ConfigError:
        raise
    except (MemoryError, torch.OutOfMemoryError) as exc:  # this cell is too big; the grid goes on
        m, t = cell.method.model, cell.method.train
        return _fail_cell(cd, info, (
            f"out of memory ({type(exc).__name__}) with model dim {m.dim}, depth {m.depth}, heads {m.heads}, "
            f"batch_size {t.batch_size}, eval_batch_size {t.eval_batch_size}: lower batch_size / "
            "eval_batch_size or the model size, or use a machine with more memory"))
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
    (cd.path / TRAIN_STATE).unlink(missing_ok=True)  # the finished cell needs no resumable state
    cd.seal(info)
    return "complete", f"best epoch {result.best_epoch}, test acc {test_acc:.3f}"


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
