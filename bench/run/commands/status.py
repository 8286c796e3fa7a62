"""``status [NAME]``: a run's cells, done / failed / running / interrupted / damaged /
missing, and the time left: the cells its record names (``status NAME``, narrowed by
``--methods``, ``--datasets`` and ``--seeds``) or a suite's plan and flags, in its run's
store."""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.core.errors import ConfigError
from bench.run.commands.listing import method_lines
from bench.run.flags import OptionGroups, load_plugins, named, overrides
from bench.run.named import named_run, recorded_suite, stored_run
from bench.store.runs import PlannedCell

HELP = "done / failed / running / missing cells of a run and the time left"


def add(sub, groups: OptionGroups) -> None:
    status = sub.add_parser("status", parents=[groups.plan, groups.results, groups.reports, groups.common], help=HELP,
                            description=HELP + ".")
    named(status)


def main(args: argparse.Namespace) -> int:
    """``status NAME`` or ``status --suite ...`` (module docstring)."""
    from bench.config.spec import load_suite, select
    from bench.store.plan import make_plan
    from bench.store.runs import COMMAND

    record = named_run(args)
    load_plugins(args, record.spec.plugins if record is not None else ())
    if args.run is not None:
        if record is None:
            raise ConfigError(f"status {args.run}: the store {args.results / args.run} has no record of its plan (made "
                              "before runs had names): give the suite file and the flags it ran with instead, "
                              f"e.g. `{' '.join(COMMAND)} status --suite FILE --epochs N`")
        cells = [c for c in record.cells if (args.methods is None or c.method in args.methods)
                 and (args.datasets is None or c.dataset in args.datasets) and (args.seeds is None or c.seed in args.seeds)]
        suite = recorded_suite(record)
        if args.methods or args.datasets:
            suite = select(suite, args.methods, args.datasets, to_run=False)
        return cmd_status(cells, args.results / args.run, suite)
    given = overrides(args)
    suite = load_suite(args.suite or "default", given)
    selected = select(suite, args.methods, args.datasets, to_run=False)
    cells = [PlannedCell.of(c) for c in make_plan(selected).cells]
    return cmd_status(cells, args.results / stored_run(args, suite.name, given), selected)


def cmd_status(cells: list[PlannedCell], store_root: Path, suite=None) -> int:
    """Print every planned cell in the store ``store_root``: done (with what it cost),
    failed (with the reason), running (a live runner holds its lock: who, since when),
    interrupted (with its last saved epoch), damaged or missing; then counts and the
    estimated time left (:func:`bench.core.progress.time_left`: each cell still to run at the
    recorded cost of the done cells of its method, else of all done cells), or that
    nothing is left; then the derived methods of ``suite`` (a :class:`bench.config.spec.Suite`),
    computed from these cells."""
    from bench.store.catalog import describe_runner, live_runner
    from bench.train.state import TRAIN_STATE, saved_epoch
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
