"""``compare NAME REFERENCE``: whether a run reproduces a reference report within stated
tolerances (:mod:`bench.run.compare`): exit 0 with one line, 1 listing what is outside,
2 for a reference of another plan."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.run.flags import OptionGroups, load_plugins
from bench.run.named import named_run, recorded_suite

HELP = "check that a run reproduces a reference report within stated tolerances"


def add(sub, groups: OptionGroups) -> None:
    compare = sub.add_parser(
        "compare", parents=[groups.results, groups.reports, groups.common], help=HELP,
        description="Check that the run NAME (its store <results>/NAME) reproduces the reference report REFERENCE: "
                    "the store is analysed afresh as `report` analyses it (the reference's metrics, OOD scores and "
                    "analysis options; in a temporary folder, nothing is written), and every per-seed value and "
                    "mean over seeds is compared with REFERENCE/analysis/ per dataset, method, split, metric and "
                    "OOD score; timings are not compared. The rule: a value is within tolerance when |run - "
                    "reference| <= max(a tenth of the reference's std over seeds, one sample of its split: 1/N for N "
                    "images; for an OOD split the smaller of the OOD set and the test split). Exit 0 with one line "
                    "when every value is within; 1 listing the metrics outside, worst first; 2 when the run and "
                    "the reference are of different plans (cells, configurations, methods, seeds or splits) or "
                    "REFERENCE is no report folder.")
    compare.add_argument("run", metavar="NAME", help="the run to check (its store <results>/NAME)")
    compare.add_argument("reference", metavar="REFERENCE", type=Path,
                         help="the reference's report folder, e.g. a copy of the committed reports/default (the run's "
                              "own report <reports>/NAME is refused: its run rewrites it)")
    compare.add_argument("--details", action="store_true",
                         help="also print, per dataset and metric, the largest difference (in the report's units and "
                              "in seed stds) and where it is")
    compare.set_defaults(suite=None)


def main(args: argparse.Namespace) -> int:
    """Exit 0 with one line when the run reproduces the reference, 1 listing what is
    outside its tolerances."""
    from bench.run.compare import compare_run

    record = named_run(args)
    load_plugins(args, record.spec.plugins if record is not None else ())
    comparison = compare_run(args.results / args.run, args.reference,
                             recorded_suite(record) if record is not None else None,
                             own_report=args.reports / args.run)
    for note in comparison.notes:
        print(f"compare: {note}", file=sys.stderr)
    if args.details:
        print("\n".join(comparison.details()))
    print("\n".join(comparison.verdict()))
    return 0 if comparison.reproduces else 1
