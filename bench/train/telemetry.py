"""What a run tells while it runs, apart from what it stores: the console a cell logs on
(:class:`Console`; progress bars go through :mod:`bench.core.progress`), a cell's
TensorBoard events (:class:`Events`, :func:`tensorboard_folder`,
:func:`require_tensorboard`) and its peak-memory window (:func:`reset_peak_memory`,
:func:`peak_memory_mb`, recorded in ``cell.json``).
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch

from bench.core import progress
from bench.core.errors import require_package
from bench.store.plan import Cell


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
