"""Progress of the long steps, and durations in words.

One process-wide setting (:func:`configure`) says how progress is shown on stderr:

* ``"bars"``: tqdm bars (a terminal): training per step, prediction per pass and image,
  analysis per cell, plots one by one;
* ``"lines"``: no bars, for logs that are files (CI, SLURM, ``nohup``): a line per
  finished step (a cell, the analysis, the plots), and a long training's latest epoch at
  most once every :data:`HEARTBEAT` seconds; *verbose* (``--verbose``), every epoch and
  every predicted split too (the tasks opened with ``detail=True``);
* ``"off"``: nothing (``--quiet``, and any process nobody configured: a library user, a
  test, a worker whose runner is quiet).

:func:`auto` picks ``bars`` on a terminal and ``lines`` elsewhere.  Code that runs a long
loop opens a :func:`task` and advances it; it does not know the mode.  The training and
prediction loops themselves (:mod:`bench.train.loop`) only call callbacks, which the cell
(:mod:`bench.train.cell`) connects to tasks.
"""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator

MODES = ("bars", "lines", "off")
HEARTBEAT = 60.0  # lines mode, not verbose: a task's notes at most once in this many seconds
_MODE = "off"
_VERBOSE = False
_OPEN: list["Task"] = []  # the tasks open in this process, innermost last


def auto(quiet: bool, stream=None) -> str:
    """The mode for a command: ``off`` when quiet, ``bars`` when ``stream`` (stderr) is a
    terminal, else ``lines``."""
    if quiet:
        return "off"
    stream = sys.stderr if stream is None else stream
    return "bars" if stream.isatty() else "lines"


def configure(mode: str, verbose: bool = False) -> None:
    """Set how this process shows progress (one of :data:`MODES`; ``verbose``: in lines
    mode, every note and every detail task's line)."""
    global _MODE, _VERBOSE
    if mode not in MODES:
        raise ValueError(f"progress mode must be one of {MODES}, got {mode!r}")
    _MODE, _VERBOSE = mode, verbose


def mode() -> str:
    return _MODE


def verbose() -> bool:
    return _VERBOSE


def duration(seconds: float) -> str:
    """A duration as a person reads it: ``4.2 s``, ``40 s``, ``12 min 5 s``, ``3 h 20 min``."""
    if seconds != seconds:  # NaN
        return "unknown"
    s = max(0.0, float(seconds))
    if s < 10:
        return f"{s:.1f} s"
    if s < 59.5:
        return f"{s:.0f} s"
    whole = int(round(s))
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s" if whole % 60 else f"{whole // 60} min"
    minutes = int(round(s / 60))
    return f"{minutes // 60} h {minutes % 60} min" if minutes % 60 else f"{minutes // 60} h"


def time_left(pending: list[str], measured: dict[str, list[float]], parallel: int = 1) -> float:
    """Seconds until the ``pending`` cells (their methods' names, one per cell) are done:
    each at the mean measured time of its method's cells (``measured``: method -> seconds
    per cell), a method not measured yet at the mean of all, divided over ``parallel``
    cells at once (at most one per pending cell); NaN when nothing is measured yet."""
    every = [x for v in measured.values() for x in v]
    if not every:
        return float("nan") if pending else 0.0
    total = sum(sum(measured.get(m) or every) / len(measured.get(m) or every) for m in pending)
    return total / max(1, min(parallel, len(pending)))


def write(text: str) -> None:
    """One line on stderr, above any open bar."""
    if any(t._bar is not None for t in _OPEN):
        from tqdm import tqdm

        tqdm.write(text, file=sys.stderr)
    else:
        print(text, file=sys.stderr, flush=True)


def line(text: str) -> None:
    """One line on stderr (:func:`write`), unless progress is off."""
    if _MODE != "off":
        write(text)


class Task:
    """One long step: a bar in ``bars`` mode; in ``lines`` mode :meth:`note` prints a line
    (unless verbose, at most once every :data:`HEARTBEAT` seconds) and closing prints
    ``done`` (when given) with the time taken, for a ``detail`` task only when verbose."""

    def __init__(self, desc: str, total: int | None, unit: str, done: str | None, detail: bool = False,
                 initial: int = 0, rate: bool = True) -> None:
        self.desc, self.total, self.unit, self.done, self.detail = desc, total, unit, done, detail
        self.count = 0
        self.started = self.noted = time.perf_counter()
        self._bar = None
        if _MODE == "bars":
            from tqdm import tqdm

            sized = _terminal_columns() > 0  # a terminal that reports no size (0 columns) would get no bar at all
            # without ``rate``, no rate or time left of tqdm's: the caller's estimate, if any, is the suffix
            fmt = None if rate else "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
            self._bar = tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr, dynamic_ncols=sized,
                             ncols=None if sized else 100, initial=initial, bar_format=fmt)

    def advance(self, n: int = 1) -> None:
        self.count += n
        if self._bar is not None:
            self._bar.update(n)

    def suffix(self, text: str) -> None:
        """Text after the bar (bars mode only: e.g. the time left, which lines give otherwise)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)

    def note(self, text: str) -> None:
        """The latest state in words (e.g. an epoch's loss): the bar's suffix, or a line."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
        elif _MODE == "lines":
            now = time.perf_counter()
            if _VERBOSE or now - self.noted >= HEARTBEAT:
                self.noted = now
                line(f"{self.desc}: {text}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif _MODE == "lines" and self.done is not None and (_VERBOSE or not self.detail):
            took = duration(time.perf_counter() - self.started)
            line(f"{self.desc}: {self.done.replace('{count}', str(self.count))} in {took}")


def _terminal_columns() -> int:
    """The width of the terminal stderr is on (0: unknown)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


@contextmanager
def task(desc: str, total: int | None = None, unit: str = "it", done: str | None = None,
         detail: bool = False, initial: int = 0, rate: bool = True) -> Iterator[Task]:
    """A :class:`Task` for the block, closed when it ends (an error included).  ``done``
    is what the ``lines`` mode's closing line says, ``{count}`` replaced by the units
    advanced (the time taken is added); a ``detail`` task (one split of a cell) says it
    only when verbose.  ``initial``: units done before (the bar starts there); ``rate``
    False: the bar shows no rate or time left of its own (:meth:`Task.suffix` gives one)."""
    t = Task(desc, total, unit, done, detail, initial, rate)
    _OPEN.append(t)
    try:
        yield t
    finally:
        _OPEN.remove(t)
        t.close()


def tracked(items, desc: str, total: int | None = None, unit: str = "it", done: str | None = None):
    """Yield ``items``, advancing a :func:`task` by one after each."""
    with task(desc, total, unit, done) as t:
        for item in items:
            yield item
            t.advance()


def advance(n: int = 1) -> None:
    """Advance the innermost open task (nothing when none is open): for loops deep inside a
    step whose task was opened by the caller (the report's plots)."""
    if _OPEN:
        _OPEN[-1].advance(n)
