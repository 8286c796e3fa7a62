"""``run`` (the default command): name the run (:mod:`bench.store.runs`: ``--name``, else
the suite's name, with a tag and hash of the plan overrides when there are any), train
and predict every incomplete cell into its store ``<results>/NAME/`` with the executor
chosen (:data:`bench.core.registry.EXECUTORS`, :func:`executor_settings`), then write its
report ``<reports>/NAME/``.  A store or report folder of another plan is refused."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from bench.config.executor_config import ExecutorConfig
from bench.config.spec import RunSpec
from bench.core.errors import ConfigError
from bench.core.registry import EXECUTORS
from bench.run.flags import (OptionGroups, configure, int_at_least, load_plugins, overrides, positive_float,
                             positive_int, report_options)
from bench.run.interrupt import Interrupted, stopped_at

HELP = "train and predict every incomplete cell of a run, then write its report (the default command)"


def add(sub, groups: OptionGroups) -> None:
    run = sub.add_parser("run", parents=[groups.plan, groups.results, groups.reports, groups.shown, groups.common],
                         help=HELP, description=HELP + ".")
    run.add_argument("--name", default=None,
                     help="the run's name: its store <results>/NAME and report <reports>/NAME (default: the suite's "
                          "name; with --methods/--datasets/--seeds/--epochs, the suite's name, a tag of them and a "
                          "hash, e.g. default-epochs1-a3f9)")
    run.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to train (default: auto)")
    run.add_argument("--download", action="store_true",
                     help="fetch missing official archives over HTTPS (md5-verified); never done unless asked")
    run.add_argument("--strict-data", action="store_true",
                     help="a data file whose md5 differs from the official one is an error, not a warning")
    run.add_argument("--log", action="append", default=[], choices=("tensorboard",),
                     help="also write each cell's training log (loss, accuracy, learning rate, the method's own "
                          "terms) as TensorBoard events under <results>/NAME/tensorboard/ (needs the optional "
                          "tensorboard package)")
    # Executor flags default to None: unset, the suite's [executor] table (or its default) applies.
    table = "the suite's [executor] {key}, else {default}"
    defaults = ExecutorConfig()
    run.add_argument("--executor", default=None, metavar="{" + ",".join(EXECUTORS.names()) + "}",
                     help="where cells run: one after another here (local), a pool of processes on this machine, "
                          "SLURM through submitit, or submitit's local processes (default: "
                          + table.format(key="kind", default=defaults.kind) + ")")
    run.add_argument("--workers", type=positive_int, default=None,
                     help="--executor processes: worker processes on CPU (default: "
                          + table.format(key="workers", default=defaults.workers) + ")")
    run.add_argument("--cells-per-gpu", type=positive_int, default=None,
                     help="--executor processes on CUDA: cells trained at once on each visible GPU (default: "
                          + table.format(key="cells_per_gpu", default=defaults.cells_per_gpu) + ")")
    run.add_argument("--slurm-partition", default=None,
                     help="SLURM partition for each cell's job (default: "
                          + table.format(key="partition", default="the cluster's") + ")")
    run.add_argument("--slurm-gpus", type=int_at_least(0), default=None,
                     help="GPUs per cell (default: " + table.format(key="gpus", default=defaults.gpus) + ")")
    run.add_argument("--slurm-cpus", type=positive_int, default=None,
                     help="CPUs per cell (default: " + table.format(key="cpus", default=defaults.cpus) + ")")
    run.add_argument("--slurm-mem-gb", type=positive_float, default=None,
                     help="memory per cell in GB (default: "
                          + table.format(key="mem_gb", default=f"{defaults.mem_gb:g}") + ")")
    run.add_argument("--slurm-time", type=positive_int, default=None,
                     help="time limit per cell in minutes (default: " + table.format(key="time", default=defaults.time) + ")")
    run.add_argument("--slurm-array-limit", type=positive_int, default=None,
                     help="at most this many cells at once (default: "
                          + table.format(key="array_limit", default=defaults.array_limit) + ")")
    run.add_argument("--slurm-option", action="append", default=[], metavar="KEY=VALUE",
                     help="a further sbatch option, e.g. account=myproj or qos=high (repeatable; added to the "
                          "suite's [executor.options], replacing an option of the same name)")


def main(args: argparse.Namespace) -> int:
    """Name the run, refuse another plan's store or report, train and predict its
    incomplete cells, report; Ctrl-C says where it stopped (:class:`Interrupted`)."""
    from bench.config.spec import build_suite, resolve_suite_path, suite_source
    from bench.store.runs import check_name, default_name

    if args.suite is None:
        args.suite = "default"
    load_plugins(args)
    configure(args)
    source = suite_source(args.suite)
    given = overrides(args)
    suite = build_suite(source, given)
    name = args.name if args.name is not None else default_name(suite.name, given.to_json())
    check_name(name, "--name" if args.name is not None else "the run's name (give a shorter one with --name)")
    spec = RunSpec(name, suite.name, args.suite, given, tuple(args.plugin))
    return _run(args, spec, suite, source, str(resolve_suite_path(args.suite).resolve()))


def _run(args: argparse.Namespace, spec: RunSpec, suite, source: dict, suite_file: str) -> int:
    """:func:`main` once the run is named: check, train, report (``suite_file``: the suite
    file's absolute path, which the store's record keeps)."""
    from bench.config.spec import select, unstored_scores_problem
    from bench.run.report import report_suite
    from bench.store.plan import make_plan
    from bench.store.runs import check_owner, foreign_cells, store_record
    from bench.train.telemetry import require_tensorboard

    store_root, out = args.results / spec.name, args.reports / spec.name
    if args.scores and (why := unstored_scores_problem(args.scores, suite.store)) is not None:
        raise ConfigError(f"--scores: {why}")
    selected = select(suite, args.methods, args.datasets)
    plan = make_plan(selected)
    # a damaged run.json is this run's to rewrite when the store holds no cell of another plan
    rewritable = not foreign_cells(store_root, [c.key for c in plan.cells])
    check_owner(store_root, "store", spec, rewritable)
    report_damage = check_owner(out, "report", spec, rewritable)
    options = report_options(args, spec)
    if "tensorboard" in args.log:
        require_tensorboard()
    where = executor_settings(args, suite.executor)
    EXECUTORS.get(where.kind)(where).check()  # e.g. slurm without sbatch: refused before anything is written
    record = store_record(dataclasses.replace(spec, suite_file=suite_file), source, plan)
    summary = _train(args, record, suite, plan, where, report_damage)
    if summary is None:
        return 0  # a torchrun rank other than 0: rank 0 stores, analyses and reports
    status = 1 if summary.failed else 0
    try:
        status = max(status, report_suite(selected, store_root, out, options, summary.started))
    except KeyboardInterrupt:
        raise Interrupted(stopped_at(plan, store_root)) from None
    _done(args, spec, store_root, out)
    return status


def _train(args: argparse.Namespace, record, suite, plan, where: ExecutorConfig, report_damage: str | None):
    """Train and predict the plan's incomplete cells (:func:`bench.run.runner.run_plan`) and
    say what was done; None on a torchrun rank other than 0."""
    from bench.run.runner import RunOptions, run_plan
    from bench.store import Store
    from bench.store.runs import describe
    from bench.train import distributed
    from bench.train.telemetry import Console
    from bench.train.loop import resolve_device

    # jobs on other nodes than this (often GPU-less) login node: each resolves --device where it runs
    job_device = args.device if EXECUTORS.get(where.kind).other_nodes else None
    device = distributed.setup(resolve_device("cpu" if job_device else args.device))  # torchrun: join its group
    rank, size = distributed.world()
    console = Console(args.quiet or rank > 0)
    if report_damage is not None and rank == 0:
        console.warn(f"{report_damage}; this run's report rewrites it")
    shown = f"{job_device} (resolved on each job's node)" if job_device else device
    store_root = args.results / record.spec.name
    console.log(f"run {record.spec.name!r}: {describe(record.spec)}, {len(plan.cells)} cells on {shown}, store "
                f"{store_root}" + (f"; each cell on {size} torchrun processes (DDP)" if size > 1 else ""))
    options = RunOptions(where, record, suite, "tensorboard" in args.log, job_device)
    try:
        summary = run_plan(plan, Store(store_root), device, console, options)
    except KeyboardInterrupt:
        raise Interrupted(stopped_at(plan, store_root)) from None
    finally:
        distributed.teardown()
    if rank > 0:
        return None
    fitted = f", {len(summary.fitted)} fitted on a stored cell (post hoc)" if summary.fitted else ""
    console.log(f"done: {len(summary.done)} trained{fitted}, {len(summary.skipped)} skipped, {len(summary.failed)} failed"
                + (f", {len(summary.elsewhere)} running elsewhere" if summary.elsewhere else ""))
    return summary


def _done(args: argparse.Namespace, spec: RunSpec, store_root: Path, out: Path) -> None:
    """The run's last line: where its store and report are, and how to see it again."""
    from bench.store.runs import COMMAND
    from bench.train.telemetry import Console

    more = f" --results {args.results}" if args.results != Path("results") else ""
    Console(args.quiet).log(f"run {spec.name!r}: store {store_root}, report {out / 'README.md'}; "
                            f"see it again with `{' '.join(COMMAND)} status {spec.name}{more}`")


#: executor flag (argparse dest) -> the [executor] key it overrides
EXECUTOR_FLAGS = {"executor": "kind", "workers": "workers", "cells_per_gpu": "cells_per_gpu",
                  "slurm_partition": "partition", "slurm_gpus": "gpus", "slurm_cpus": "cpus",
                  "slurm_mem_gb": "mem_gb", "slurm_time": "time", "slurm_array_limit": "array_limit"}


def executor_settings(args: argparse.Namespace, table: ExecutorConfig) -> ExecutorConfig:
    """The executor to run with: each flag given on the command line, else the suite's
    ``[executor]`` key (``table``, an :class:`~bench.config.executor_config.ExecutorConfig`), else its
    default.  ``--slurm-option`` adds to the table's options, replacing one of the same name.
    A partition or option that would not stay on its own line of the batch script is a
    ConfigError, as in the table."""
    from bench.config.executor_config import sbatch_option_name, sbatch_option_problem, sbatch_text_problem

    given = {key: getattr(args, dest) for dest, key in EXECUTOR_FLAGS.items() if getattr(args, dest) is not None}
    if args.executor is not None:  # an unknown name: the registry's message
        EXECUTORS.validate(args.executor, "--executor")
    if args.slurm_partition is not None and (problem := sbatch_text_problem(args.slurm_partition)):
        raise ConfigError(f"--slurm-partition: {problem}")
    options = dict(table.options)
    for item in args.slurm_option:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--slurm-option {item!r}: expected KEY=VALUE, e.g. account=myproj")
        if problem := sbatch_option_problem(key, value):
            raise ConfigError(f"--slurm-option {item!r}: {problem}")
        options[sbatch_option_name(key)] = value.strip()
    return dataclasses.replace(table, **given, options=options)
