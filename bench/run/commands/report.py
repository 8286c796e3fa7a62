"""``report [NAME]``: rebuild a run's tables and plots from its store alone (no model is
built and no checkpoint read): a run by NAME (its recorded plan), a store alone
(``--suite NAME`` of no suite file), or ``--suite`` with the run's flags.  ``report`` with
``--metrics``, ``--scores`` or a plugin adding metrics or scores writes a view beside the
run's report, ``<reports>/NAME+ADDITION/`` (:func:`additions`)."""
from __future__ import annotations

import argparse
from dataclasses import replace

from bench.config.spec import RunSpec
from bench.run.flags import OptionGroups, configure, load_plugins, named, overrides, report_options
from bench.run.named import named_run, recorded_suite, store_only, stored_run
from bench.store.runs import RunRecord

HELP = "rebuild a run's tables and plots from its store only"


def add(sub, groups: OptionGroups) -> None:
    report = sub.add_parser("report", parents=[groups.plan, groups.results, groups.reports, groups.shown,
                                               groups.common], help=HELP,
                            description=HELP + " (no model is built). --suite NAME also reports a "
                                        "store <results>/NAME made by an older version, without its suite file.")
    named(report)
    report.set_defaults(download=False, strict_data=False)


def main(args: argparse.Namespace) -> int:
    """Report the run (module docstring); its store's record is read once, here."""
    from bench.config.spec import load_suite
    from bench.run.report import report_suite
    from bench.store.runs import check_owner, owner, read_record, view_name

    record = named_run(args)
    load_plugins(args, record.spec.plugins if record is not None else ())
    configure(args)
    options = report_options(args)  # unknown --metrics, --format or --severity: an error here, before any work
    suite, suite_file = None, args.suite
    if args.run is not None:
        name = args.run
        if record is not None:
            suite, given, suite_file = recorded_suite(record), record.spec.overrides, record.spec.suite_file
            options = replace(options, selection=replace(given, methods=args.methods,
                                                         datasets=args.datasets or given.datasets))
    elif store_only(args):
        name = args.suite
    else:
        suite = load_suite(args.suite, overrides(args))
        name = stored_run(args, suite.name, overrides(args))
    store_root, out = args.results / name, args.reports / name
    if args.run is None:
        record = read_record(store_root)
    mine = owner(store_root, record=record) or RunSpec(name, suite.name if suite is not None else name)
    added = additions(args, record)
    if added is not None:  # the run's own report stays as it is; the view goes beside it
        out = args.reports / view_name(name, *added)
    run = replace(mine, name=name, suite_file=suite_file or "")
    check_owner(out, "report", run)
    return report_suite(suite, store_root, out, replace(options, run=run), record.started if record else "")


def additions(args: argparse.Namespace, record: RunRecord | None) -> tuple[list, list, list] | None:
    """What ``report`` adds to the run's own report: the ``--plugin`` modules that register
    metrics or OOD scores and that the run (its store ``record``) was not made with, the
    ``--metrics`` and the ``--scores`` given; None when it adds nothing.  Such a report is
    a view, written beside the run's report (:func:`bench.store.runs.view_name`)."""
    from bench.core.registry import METRICS, SCORES

    recorded = set(record.spec.plugins) if record is not None else set()
    plugins = [p for p in dict.fromkeys(args.plugin)
               if p not in recorded and (METRICS.names_from(p) or SCORES.names_from(p))]
    metrics, scores = list(args.metrics or ()), list(args.scores or ())
    return (plugins, metrics, scores) if plugins or metrics or scores else None
