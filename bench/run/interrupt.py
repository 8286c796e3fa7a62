"""How a command stops on Ctrl-C or SIGTERM (:class:`CtrlC`): the first one winds the
command down and it ends with one line saying what is done and saved (:func:`stopped_at`,
:class:`Interrupted`); a second one ends it at once."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path


class Interrupted(Exception):
    """A command stopped by Ctrl-C; the message says where it stopped."""


class CtrlC:
    """Ctrl-C (SIGINT) or SIGTERM while a command runs: the first one raises
    KeyboardInterrupt, so the command winds down (cell locks released, pool workers stopped
    and their locks released, a report's staging folder removed) and says where it
    stopped, exit :attr:`code` (128 + the signal: 130, 143); a second one meanwhile ends the
    process at once, its worker processes with it."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum = signal.SIGINT  # the signal that stopped the command
        self.before: dict = {}

    @property
    def code(self) -> int:
        """The exit status of a command this stopped: 128 + the signal's number."""
        return 128 + int(self.signum)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.before = {s: signal.signal(s, self._first) for s in self.SIGNALS}
        return self

    def _first(self, signum, _frame) -> None:
        self.signum = signum
        for s in self.SIGNALS:
            signal.signal(s, self._again)
        raise KeyboardInterrupt

    @staticmethod
    def _again(signum, _frame) -> None:
        import multiprocessing

        for child in multiprocessing.active_children():
            child.kill()
        os.write(2, b"\ninterrupted again: stopped at once\n")
        os._exit(128 + signum)

    def __exit__(self, *exc) -> None:
        for s, handler in self.before.items():
            signal.signal(s, handler)
        self.before = {}


def stopped_at(plan, store_root: Path) -> str:
    """The line Ctrl-C ends a run with: its cells done, the ones in progress and the epoch
    each saved its training at."""
    from bench.train.state import saved_epoch
    from bench.store import CellDir, CellRecord

    done, saved = 0, []
    for cell in plan.cells:
        cd = CellDir(store_root / cell.key)
        if cd.says_complete():
            done += 1
        elif (cd.read_cell() or CellRecord()).running:
            saved.append(saved_epoch(cd))
    where = f"{len(saved)} in progress"
    if saved and all(e is None for e in saved):
        where += ", no epoch saved yet"
    elif saved:
        epochs = sorted({e for e in saved if e is not None})
        where += f" saved at epoch{'s' if len(epochs) > 1 else ''} {', '.join(map(str, epochs))}"
        if None in saved:
            where += " (some with no epoch saved yet)"
    return f"interrupted: {done} cell{'s' if done != 1 else ''} done, {where}; run the same command to resume"


