"""``verify [NAME]``: every cell folder of a run's store checked against its manifest."""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.core.errors import ConfigError
from bench.run.flags import OptionGroups, load_plugins, named
from bench.run.named import named_run

HELP = "check every cell of a run's store against its manifest"


def add(sub, groups: OptionGroups) -> None:
    verify = sub.add_parser("verify", parents=[groups.results, groups.reports, groups.common], help=HELP,
                            description=HELP + "; exit 1 when a cell is damaged.")
    named(verify)
    verify.add_argument("--suite", default=None, help="the suite whose store <results>/NAME to check (instead of NAME)")


def main(args: argparse.Namespace) -> int:
    record = named_run(args)
    load_plugins(args, record.spec.plugins if record is not None else ())
    return cmd_verify(args)


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
