"""The commands that read a run's store, and how a command stops on Ctrl-C.

* ``status``: each planned cell's state and the time left (:func:`cmd_status`), the
  cells from a run's record (``status NAME``) or from a suite and its flags;
* ``verify``: every cell folder of a store against its manifest (:func:`cmd_verify`);
* ``runs``: the runs of a store root (:func:`cmd_runs`, :func:`bench.store.runs.list_runs`);
* Ctrl-C or SIGTERM (:class:`CtrlC`): the first one winds the command down and it ends
  with one line saying what is done and saved (:func:`stopped_at`), a second one ends it
  at once.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
from pathlib import Path

from bench.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Planned:
    """A planned cell as ``status`` needs it: from a suite's plan or a run's record."""

    key: str
    dataset: str
    method: str
    seed: int
    epochs: int

    @property
    def label(self) -> str:
        return f"{self.dataset} / {self.method} / seed {self.seed}"


def cmd_status(cells: list[Planned], store_root: Path, suite=None) -> int:
    """Print every planned cell in the store ``store_root``: done (with what it cost),
    failed (with the reason), running (a live runner holds its lock: who, since when),
    interrupted (with its last saved epoch), damaged or missing; then counts and the
    estimated time left (:func:`bench.core.progress.time_left`: each cell still to run at the
    recorded cost of the done cells of its method, else of all done cells), or that
    nothing is left; then the derived methods of ``suite`` (a :class:`bench.config.spec.Suite`),
    computed from these cells."""
    from bench.store.catalog import describe_runner, live_runner
    from bench.train.cell import TRAIN_STATE, saved_epoch
    from bench.core.progress import duration, time_left
    from bench.store import Store

    store = Store(store_root)
    counts = {"done": 0, "failed": 0, "running": 0, "interrupted": 0, "damaged": 0, "missing": 0}
    seconds: dict[str, list[float]] = {}
    pending: list[str] = []
    for cell in cells:
        cd = store.cell(cell.key)
        state, problem = cd.condition()
        if state == "complete":
            counts["done"] += 1
            seconds.setdefault(cell.method, []).append(cd.seconds())
            print(f"{cell.label}: done in {duration(seconds[cell.method][-1])} ({cell.key})")
            continue
        detail = {"missing": "", "failed": (problem or "")[len("failed: "):], "damaged": problem}.get(state, "")
        if state == "interrupted":
            epoch = saved_epoch(cd)
            detail = ("no epoch saved yet" if not (cd.path / TRAIN_STATE).is_file() else
                      "training state unreadable" if epoch is None else f"last saved epoch {epoch}/{cell.epochs}")
        who = live_runner(store.root, cell.key) if state in ("missing", "interrupted") else None
        if who is not None:  # a live runner holds the cell's lock (a dead one's lock is stale)
            state, detail = "running", "; ".join(
                [f"{describe_runner(who)}, heartbeat {who['age']:.0f} s ago"] + ([detail] if detail else []))
        counts[state] += 1
        if state != "failed":
            pending.append(cell.method)
        print(f"{cell.label}: {state}{': ' + detail if detail else ''} ({cell.key})")
    left = time_left(pending, seconds)
    if not pending:
        tail = "nothing left to run" + (" (the failed cells run again with the run's command)"
                                        if counts["failed"] else "")
    else:
        estimate = duration(left) if left == left else "unknown (no cell done yet)"
        tail = f"estimated time left for the {len(pending)} cell(s) to run: {estimate}"
    print(f"{store.root}: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + f"; {tail}")
    derived = [line for m, line in zip(suite.methods, method_lines(suite)) if m.kind == "derived"] if suite else []
    if derived:
        print("derived methods (no cells: computed in analysis from their base's cells above):")
        print("\n".join(derived))
    return 0


def status(args: argparse.Namespace, record: dict | None) -> int:
    """``status NAME`` (the cells its record names, narrowed by --methods, --datasets and
    --seeds) or ``status --suite ...`` (the suite's plan, in its run's store)."""
    from bench.store.plan import make_plan
    from bench.store.runs import COMMAND
    from bench.config.spec import Overrides, load_suite, select

    if args.run is not None:
        if record is None:
            raise ConfigError(f"status {args.run}: the store {args.results / args.run} has no record of its plan (made "
                              "before runs had names): give the suite file and the flags it ran with instead, "
                              f"e.g. `{' '.join(COMMAND)} status --suite FILE --epochs N`")
        cells = [Planned(str(c["key"]), str(c["dataset"]), str(c["method"]), int(c["seed"]), int(c["epochs"]))
                 for c in record.get("cells", [])]
        cells = [c for c in cells if (args.methods is None or c.method in args.methods)
                 and (args.datasets is None or c.dataset in args.datasets) and (args.seeds is None or c.seed in args.seeds)]
        suite = recorded_suite(record)
        if suite is not None and (args.methods or args.datasets):
            suite = select(suite, args.methods, args.datasets, to_run=False)
        return cmd_status(cells, args.results / args.run, suite)
    suite = load_suite(args.suite or "default", Overrides(seeds=args.seeds, epochs=args.epochs, methods=args.methods))
    selected = select(suite, args.methods, args.datasets, to_run=False)
    plan = make_plan(selected)
    cells = [Planned(c.key, c.dataset.name, c.method.name, c.seed, c.method.train.epochs) for c in plan.cells]
    return cmd_status(cells, args.results / stored_run(args, suite.name), selected)


def method_lines(suite) -> list[str]:
    """One line per method of a suite (a :class:`bench.config.spec.Suite`), in its order, derived
    ones included: what it is and where its numbers come from (trained: epochs, a
    two-stage or post-hoc method's stage 1; derived: the base whose cells it is computed
    from in analysis, nothing trained)."""
    from bench.core.registry import METHODS
    from bench.config.spec import post_hoc_of, stage1_of

    lines = []
    for m in suite.methods:
        if m.kind == "derived":
            members = METHODS.get(m.type)(m.options).members_per_replicate()
            what = (f"derived: {members} seeds of {m.options.base} per replicate" if members > 1
                    else f"derived: from each seed of {m.options.base}") + ", computed in analysis (nothing trained)"
        elif (base := stage1_of(m)) and post_hoc_of(m):
            what = f"trained post hoc: fitted on {base}'s cell of each seed (no training of its own)"
        elif base:
            what = f"trained: {m.train.epochs} epochs, starting from {base}'s cell of each seed"
        else:
            what = f"trained: {m.train.epochs} epochs"
        lines.append(f"  {m.name:<22} {f'[{m.type}] ' if m.type != m.name else ''}{what}")
    return lines


def recorded_suite(record: dict):
    """The suite a run's store record (:func:`bench.store.runs.store_record`) planned: its suite
    file's contents as recorded, with its overrides and selection (None: a record that
    keeps no contents)."""
    from bench.store.runs import recorded_source
    from bench.config.spec import Overrides, build_suite, select

    if (source := recorded_source(record)) is None:
        return None
    given = record.get("overrides") or {}
    full = build_suite(source, Overrides(seeds=as_tuple(given.get("seeds")), epochs=given.get("epochs"),
                                         methods=as_tuple(given.get("methods"))))
    return select(full, as_tuple(given.get("methods")), as_tuple(given.get("datasets")), to_run=False)


def as_tuple(value) -> tuple | None:
    """A JSON list (a record's overrides) as a tuple; None stays None."""
    return None if value is None else tuple(value)


def cmd_suite(name: str) -> int:
    """``list --suite NAME``: a suite's data sets, seeds and methods, derived ones included
    (:func:`method_lines`)."""
    from bench.config.spec import load_suite

    suite = load_suite(name)
    print(f"suite {suite.name}" + (f": {suite.description}" if suite.description else ""))
    print(f"datasets: {', '.join(d.name for d in suite.datasets)}")
    print(f"seeds: {', '.join(map(str, suite.seeds))}")
    print(f"methods ({len(suite.methods)}; reference {suite.reference_method}):")
    print("\n".join(method_lines(suite)))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every cell directory of a run's store (``verify NAME``, or ``--suite``: the
    suite's store): print one line per cell that is not complete; exit 0 when nothing is
    damaged, 1 otherwise (failed and interrupted cells are listed but are not damage)."""
    from bench.train.telemetry import TENSORBOARD
    from bench.store.runs import COMMAND
    from bench.config.spec import suite_name_problem
    from bench.store import DAMAGED_MARK, CellDir

    if args.run is not None:
        name = args.run
    else:
        suite = args.suite or "default"
        name = Path(suite).stem if suite.endswith(".toml") else suite
        if (why := suite_name_problem(name)) is not None:
            raise ConfigError(f"--suite: {why}")
    root = args.results / name
    if not root.is_dir():
        raise ConfigError(f"verify: no store at {root}; give a run's NAME (`{' '.join(COMMAND)} runs` lists them) or "
                          "--results DIR")
    counts = {"complete": 0, "failed": 0, "interrupted": 0, "damaged": 0}
    for path in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != TENSORBOARD):
        if DAMAGED_MARK in path.name:
            print(f"{path.name}: moved aside earlier (damaged), not used")
            continue
        kind, problem = CellDir(path).condition()
        counts[kind] += 1
        if problem is not None:
            print(f"{path.name}: {kind}: {problem}")
    print(f"{root}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if counts["damaged"] else 0


def cmd_runs(args: argparse.Namespace) -> int:
    """List the runs under ``--results`` (:func:`bench.store.runs.list_runs`); a run whose record
    is damaged is listed as such and named on stderr with the command that rewrites it
    (exit 2)."""
    from bench.store.runs import list_runs, runs_table

    rows = list_runs(args.results)
    if not rows:
        print(f"no runs under {args.results}")
        return 0
    print(runs_table(rows))
    for row in rows:
        if row.damaged is not None:
            print(f"error: {row.damaged}", file=sys.stderr)
    return 2 if any(row.damaged is not None for row in rows) else 0


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


def stored_run(args: argparse.Namespace, suite: str) -> str:
    """The run that ``report``/``status`` with ``--suite`` and plan flags mean: the run those
    flags name when its store exists, else the suite's own run (the flags then select in it)."""
    from bench.store.runs import default_name, plan_overrides

    name = default_name(suite, plan_overrides(args.methods, args.datasets, args.seeds, args.epochs))
    return name if (args.results / name).is_dir() else suite


def stopped_at(plan, store_root: Path) -> str:
    """The line Ctrl-C ends a run with: its cells done, the ones in progress and the epoch
    each saved its training at."""
    from bench.train.cell import saved_epoch
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


