"""``runs``: the runs of a store root (:func:`bench.store.runs.list_runs`)."""
from __future__ import annotations

import argparse
import sys

from bench.run.flags import OptionGroups

HELP = "list the runs of a store root: name, suite, overrides, cells done/failed/missing, last change"


def add(sub, groups: OptionGroups) -> None:
    # every command takes --results and --reports (a wrapper script may pass them to all)
    sub.add_parser("runs", parents=[groups.results, groups.reports, groups.common], help=HELP,
                   description=HELP + ".")


def main(args: argparse.Namespace) -> int:
    return cmd_runs(args)


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
