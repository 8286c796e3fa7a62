"""How ``report``, ``status``, ``verify`` and ``compare`` find their run: by NAME (its store
``<results>/NAME`` and the record it keeps, read once: :func:`named_run`), or by
``--suite`` and the plan flags it ran with (:func:`stored_run`), or a store reported alone
(:func:`store_only`)."""
from __future__ import annotations

import argparse

from bench.config.spec import Overrides, build_suite, resolve_suite_path, select, suite_name_problem
from bench.core.errors import ConfigError
from bench.store.runs import RunRecord, check_name, default_name, list_runs, read_record


def named_run(args: argparse.Namespace) -> RunRecord | None:
    """For a command given a run's NAME: check the name and the store, return its record
    (None: a store made before runs had names).  Without a NAME, ``--suite`` takes its
    default and there is no record."""
    if getattr(args, "run", None) is None:
        if hasattr(args, "suite") and args.suite is None:
            args.suite = "default"
        return None
    check_name(args.run, "NAME")
    if args.suite is not None:
        raise ConfigError(f"{args.command} {args.run}: give a run's NAME or --suite, not both")
    store = args.results / args.run
    if not store.is_dir():
        known = [r.name for r in list_runs(args.results)]
        raise ConfigError(f"no run {args.run!r} under {args.results}" + (
            f"; runs there: {', '.join(known)}" if known else "; run it first, or pass --results DIR"))
    return read_record(store)


def recorded_suite(record: RunRecord):
    """The suite a run's store record planned: its suite file's contents as recorded, with
    its overrides and selection."""
    given = record.spec.overrides
    return select(build_suite(record.source, given), given.methods, given.datasets, to_run=False)


def stored_run(args: argparse.Namespace, suite: str, given: Overrides) -> str:
    """The run that ``report``/``status`` with ``--suite`` and plan flags (``given``) mean:
    the run those flags name when its store exists, else the suite's own run (the flags
    then select in it)."""
    name = default_name(suite, given.to_json())
    return name if (args.results / name).is_dir() else suite


def store_only(args: argparse.Namespace) -> bool:
    """``report --suite NAME`` where NAME is no suite file but a store folder under --results
    (NAME must be a suite name: one path component)."""
    try:
        resolve_suite_path(args.suite)
        return False
    except ConfigError as exc:
        if (args.results / args.suite).is_dir() and not args.suite.endswith(".toml"):
            if (why := suite_name_problem(args.suite)) is not None:  # e.g. "..": a folder, but no store's name
                raise ConfigError(f"--suite: {why}") from None
            return True
        raise ConfigError(f"{exc}, nor a store folder {args.results / args.suite} (report a store with "
                          "--results DIR --suite NAME)") from None
