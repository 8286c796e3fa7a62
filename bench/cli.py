"""Command line: ``python run_suite.py [run|report|list] [options]``.

* ``run`` (default): plan the suite, train and predict every incomplete cell into the
  store ``<results>/<suite>/``, then write the report ``<reports>/<suite>/``.
* ``report``: rebuild every table and plot from the store alone (no model is built and
  no checkpoint read).  Analysis files under ``<reports>/<suite>/analysis/`` are reused
  while the store and the analysis options are unchanged.  The store describes itself: when
  ``--suite NAME`` is no suite file but ``<results>/NAME/`` is a store, that store is
  reported on its own.
* ``list``: the registered methods, datasets, attention layers, metrics, OOD scores and suites.

Exit status: 0 success, 1 some cells failed (the report marks them; with ``--strict``
also when a report leaves out any cell) or the report could not be written (the previous
one is kept), 2 bad input (nothing written).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path

from bench.data import SEVERITIES
from bench.errors import ConfigError, one_line
from bench.executor_config import EXECUTORS, ExecutorConfig
from bench.registry import import_plugins
from bench.stats import SEEDS_AND_SAMPLES as SIGNIFICANCE, SIGNIFICANCE_TESTS


def _csv(kind):
    def parse(text: str):
        items = tuple(x.strip() for x in text.split(",") if x.strip())
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind}")
        if kind == "seeds":
            try:
                return tuple(int(x) for x in items)
            except ValueError:
                raise argparse.ArgumentTypeError(f"seeds must be integers, got {text!r}") from None
        return items

    return parse


def int_at_least(minimum: int):
    """An argparse ``type``: an integer >= ``minimum`` (the benchmarks' flags use it too)."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def positive_int_list(distinct: bool = False):
    """An argparse ``type``: comma-separated positive integers, e.g. ``1,2,4,8`` (no
    repeats when ``distinct``; the benchmarks' list flags)."""
    what = "distinct positive integers" if distinct else "positive integers"

    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, e.g. 1,2,4,8; got {text!r}") from None
        if not values or min(values) < 1 or (distinct and len(set(values)) != len(values)):
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, e.g. 1,2,4,8; got {text!r}")
        return values

    return parse


_positive_int = int_at_least(1)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="run_suite.py",
        description="uqbench: train, evaluate and report uncertainty methods for Transformers.",
    )
    p.add_argument("command", nargs="?", default="run", choices=("run", "report", "list", "verify", "status"),
                   help="run (default): train+predict+report; report: tables and plots from the store; "
                        "list: registries; verify: check every cell of a store against its manifest; "
                        "status: done/failed/running/missing cells and the estimated time left")
    p.add_argument("--suite", default="default", help="built-in suite name or path to a suite .toml (default: default)")
    p.add_argument("--methods", type=_csv("methods"), help="comma-separated method names to run (or, with report, to show)")
    p.add_argument("--datasets", type=_csv("datasets"), help="comma-separated dataset names of the suite to use")
    p.add_argument("--seeds", type=_csv("seeds"), help="comma-separated seeds, replacing the suite's")
    p.add_argument("--epochs", type=_positive_int, help="training epochs for every method, replacing the suite's (warm-up shortened to fit)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to train (default: auto)")
    p.add_argument("--data-root", type=Path, default=None,
                   help="where on-disk data sets live (default: $UQBENCH_DATA_ROOT or ~/.cache/uqbench)")
    p.add_argument("--download", action="store_true",
                   help="fetch missing official archives over HTTPS (md5-verified); never done unless asked")
    p.add_argument("--strict-data", action="store_true",
                   help="a data file whose md5 differs from the official one is an error, not a warning")
    p.add_argument("--results", default="results", type=Path, help="prediction store root (default: results)")
    p.add_argument("--reports", default="reports", type=Path, help="report root (default: reports)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE so its registrations take part (repeatable)")
    p.add_argument("--format", type=_csv("formats"),
                   help="comma-separated table formats to write (default: every one; an unknown one is an error "
                        "that names them)")
    p.add_argument("--metrics", type=_csv("metrics"),
                   help="metric names to show in the report (default: the KEP-SVGP paper's set and the debiased "
                        "ECE; any name from `list`)")
    p.add_argument("--scores", type=_csv("OOD scores"),
                   help="OOD scores the OOD table ranks images by (default: msp, entropy, mutual_info, max_logit, "
                        "energy, mahalanobis, knn, vim; any name from `list`)")
    p.add_argument("--significance", default=SIGNIFICANCE, choices=SIGNIFICANCE_TESTS,
                   help="the test behind the report's marks and intervals: seeds_and_samples (default: seed-level "
                        "and test-sample variation) or samples_seeds_fixed (paired bootstrap over test samples, "
                        "trained seeds held fixed)")
    p.add_argument("--severity", type=_positive_int, default=SEVERITIES[-1],
                   help=f"corruption severity of the per-corruption table, {SEVERITIES[0]}..{SEVERITIES[-1]} "
                        f"(default: {SEVERITIES[-1]})")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when the report leaves out any cell of the suite (missing, running, failed or "
                        "damaged), not only failed or damaged ones")
    # Executor flags default to None: unset, the suite's [executor] table (or its default) applies.
    table = "the suite's [executor] {key}, else {default}"
    defaults = ExecutorConfig()
    p.add_argument("--executor", default=None, choices=EXECUTORS,
                   help="where cells run: one after another here (local), a pool of processes on this machine, "
                        "SLURM through submitit, or submitit's local processes (default: "
                        + table.format(key="kind", default=defaults.kind) + ")")
    p.add_argument("--workers", type=_positive_int, default=None,
                   help="--executor processes: worker processes on CPU (default: "
                        + table.format(key="workers", default=defaults.workers) + ")")
    p.add_argument("--cells-per-gpu", type=_positive_int, default=None,
                   help="--executor processes on CUDA: cells trained at once on each visible GPU (default: "
                        + table.format(key="cells_per_gpu", default=defaults.cells_per_gpu) + ")")
    p.add_argument("--slurm-partition", default=None,
                   help="SLURM partition for each cell's job (default: " + table.format(key="partition", default="the cluster's") + ")")
    p.add_argument("--slurm-gpus", type=int_at_least(0), default=None,
                   help="GPUs per cell (default: " + table.format(key="gpus", default=defaults.gpus) + ")")
    p.add_argument("--slurm-cpus", type=_positive_int, default=None,
                   help="CPUs per cell (default: " + table.format(key="cpus", default=defaults.cpus) + ")")
    p.add_argument("--slurm-mem-gb", type=_positive_float, default=None,
                   help="memory per cell in GB (default: " + table.format(key="mem_gb", default=f"{defaults.mem_gb:g}") + ")")
    p.add_argument("--slurm-time", type=_positive_int, default=None,
                   help="time limit per cell in minutes (default: " + table.format(key="time", default=defaults.time) + ")")
    p.add_argument("--slurm-array-limit", type=_positive_int, default=None,
                   help="at most this many cells at once (default: " + table.format(key="array_limit", default=defaults.array_limit) + ")")
    p.add_argument("--slurm-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a further sbatch option, e.g. account=myproj or qos=high (repeatable; added to the "
                        "suite's [executor.options], replacing an option of the same name)")
    p.add_argument("--allow-large", action="store_true",
                   help="lift the sanity limits on sizes (epochs, model size, more than 10,000 cells, image pixels, "
                        "text length, ...), as UQBENCH_ALLOW_LARGE=1 does")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-cell lines")
    p.add_argument("--debug", action="store_true", help="show the full traceback of any error")
    return p


def cmd_list() -> int:
    from bench.registry import ATTENTIONS, DATASETS, METHODS, METRICS, SCORES
    from bench.spec import available_suites

    def first_line(obj) -> str:
        doc = (obj.__doc__ or sys.modules[obj.__module__].__doc__ or "").strip().splitlines()
        return doc[0] if doc else ""

    print("methods:")
    for name in METHODS.names():
        cls = METHODS.get(name)
        print(f"  {name:<22} [{cls.kind}] {first_line(cls)}")
    print("datasets:")
    for name in DATASETS.names():
        print(f"  {name:<22} {first_line(DATASETS.get(name))}")
    print("attention layers:")
    for name in ATTENTIONS.names():
        print(f"  {name:<22} {first_line(ATTENTIONS.get(name))}")
    print("metrics (name [kind] label (unit), higher/lower is better; * = a default column):")
    for name in METRICS.names():
        m = METRICS.get(name)
        unit = f" ({m.unit})" if m.unit else ""
        star = "*" if "default" in m.selections else " "
        print(f"  {name:<28}{star} [{m.kind}] {m.label}{unit}, {'higher' if m.higher_is_better else 'lower'} is better")
    print("OOD scores (name, label, needs; * = a default score; higher = more in-distribution):")
    for name in SCORES.names():
        sc = SCORES.get(name)
        star = "*" if sc.default is not None else " "
        print(f"  {name:<28}{star} {sc.label}, needs {', '.join(sc.needs)}")
    print("suites:")
    print("  " + ", ".join(available_suites()))
    return 0


def cmd_status(suite, args: argparse.Namespace) -> int:
    """Print, for every planned cell of ``suite`` in its store, whether it is done, failed
    (with the reason), running (a live runner holds its lock: who, since when), interrupted
    (with its last saved epoch), damaged or missing; then counts and the estimated time
    left, from the recorded timings of the done cells of the same method (else of all done
    cells), on the machine(s) they ran on."""
    import numpy as np
    import torch

    from bench.catalog import describe_runner, live_runner
    from bench.cell import TRAIN_STATE
    from bench.plan import make_plan
    from bench.store import Store

    store = Store(args.results / suite.name)
    counts = {"done": 0, "failed": 0, "running": 0, "interrupted": 0, "damaged": 0, "missing": 0}
    seconds: dict[str, list[float]] = {}
    pending: list[str] = []
    for cell in make_plan(suite).cells:
        cd = store.cell(cell.key)
        state, problem = cd.condition()
        if state == "complete":
            info = cd.read_cell() or {}
            counts["done"] += 1
            seconds.setdefault(cell.method.name, []).append(
                float(info.get("train_seconds", 0.0)) + float(info.get("predict_seconds", 0.0)))
            continue
        detail = {"missing": "", "failed": (problem or "")[len("failed: "):], "damaged": problem}.get(state, "")
        if state == "interrupted":
            detail = "no epoch saved yet"
            if (cd.path / TRAIN_STATE).is_file():
                try:
                    epoch = int(torch.load(cd.path / TRAIN_STATE, map_location="cpu", weights_only=True)["epoch"])
                    detail = f"last saved epoch {epoch}/{cell.method.train.epochs}"
                except Exception:  # noqa: BLE001  (a state being written or damaged)
                    detail = "training state unreadable"
        who = live_runner(store.root, cell.key) if state in ("missing", "interrupted") else None
        if who is not None:  # a live runner holds the cell's lock (a dead one's lock is stale)
            state, detail = "running", "; ".join(
                [f"{describe_runner(who)}, heartbeat {who['age']:.0f} s ago"] + ([detail] if detail else []))
        counts[state] += 1
        if state != "failed":
            pending.append(cell.method.name)
        print(f"{cell.label}: {state}{': ' + detail if detail else ''} ({cell.key})")
    done_all = [x for v in seconds.values() for x in v]
    left = sum(float(np.mean(seconds.get(m) or done_all)) for m in pending) if done_all else float("nan")
    estimate = f"{left / 3600:.2f} hours" if done_all else "unknown (no cell done yet)"
    print(f"{store.root}: " + ", ".join(f"{v} {k}" for k, v in counts.items())
          + f"; estimated time left for the {len(pending)} cell(s) to run: {estimate}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every cell directory of the store ``<results>/<suite>``: print one line per
    cell that is not complete; exit 0 when nothing is damaged, 1 otherwise (failed and
    interrupted cells are listed but are not damage)."""
    from bench.spec import suite_name_problem
    from bench.store import DAMAGED_MARK, CellDir

    name = Path(args.suite).stem if args.suite.endswith(".toml") else args.suite
    if (why := suite_name_problem(name)) is not None:
        raise ConfigError(f"--suite: {why}")
    root = args.results / name
    if not root.is_dir():
        raise ConfigError(f"verify: no store at {root}; pass --results DIR and --suite NAME")
    counts = {"complete": 0, "failed": 0, "interrupted": 0, "damaged": 0}
    for path in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if DAMAGED_MARK in path.name:
            print(f"{path.name}: moved aside earlier (damaged), not used")
            continue
        kind, problem = CellDir(path).condition()
        counts[kind] += 1
        if problem is not None:
            print(f"{path.name}: {kind}: {problem}")
    print(f"{root}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if counts["damaged"] else 0


def main(argv: list[str] | None = None) -> int:
    from bench.options import allowing_large

    args = build_parser().parse_args(argv)
    try:
        with allowing_large(args.allow_large):
            return _main(args)
    except ConfigError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, permissions, ... outside a cell: one line naming the path
        if args.debug:
            raise
        print(f"error: {one_line(exc)}; complete cells in the store are intact "
              "(run again once the problem is fixed; --debug shows the traceback)", file=sys.stderr)
        return 1


def check_directories(args: argparse.Namespace) -> None:
    """``--reports`` (and for ``run`` also ``--results`` and the data root) must be, or be
    creatable as, writable directories; every problem is reported at once, before any work."""
    from bench.data import data_root

    targets = [("--reports", args.reports)]
    if args.command == "run":
        targets += [("--results", args.results), ("--data-root", data_root())]
    elif args.results.exists() and not args.results.is_dir():
        targets.append(("--results", args.results))
    problems = [msg for flag, path in targets if (msg := _directory_problem(flag, Path(path)))]
    if problems:
        raise ConfigError("unusable directories:\n  " + "\n  ".join(problems))


def _directory_problem(flag: str, path: Path) -> str | None:
    if path.exists() and not path.is_dir():
        return f"{flag} {path}: exists and is not a directory; give a directory"
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{flag} {path}: {probe} is a file, so the directory cannot be created there"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{flag} {path}: {probe} is not writable (read-only filesystem or permissions); choose another"
    return None


def _main(args: argparse.Namespace) -> int:
    import_plugins(args.plugin)
    if args.command == "list":
        return cmd_list()
    if args.command == "verify":
        return cmd_verify(args)
    if args.command == "status":
        from bench.spec import Overrides, load_suite, select

        suite = load_suite(args.suite, Overrides(seeds=args.seeds, epochs=args.epochs, methods=args.methods))
        return cmd_status(select(suite, args.methods, args.datasets, to_run=False), args)

    from bench.data import configure_data
    from bench.spec import Overrides, load_suite, select

    configure_data(args.data_root, download=args.download, strict=args.strict_data)
    check_directories(args)

    from bench.report.suite import report_suite

    report_options = _report_options(args)  # unknown --metrics, --format or --severity: an error here, before any work
    overrides = Overrides(seeds=args.seeds, epochs=args.epochs, methods=args.methods)
    if args.command == "report" and _store_only(args):
        name = args.suite
        return report_suite(None, args.results / name, args.reports / name, report_options)
    suite = load_suite(args.suite, overrides)
    store_root = args.results / suite.name
    status = 0
    if args.command == "run":
        from bench.cell import Console
        from bench.executors import require_executor
        from bench.plan import make_plan
        from bench.runner import run_plan
        from bench.store import Store
        from bench.train import resolve_device

        from bench import distributed

        device = distributed.setup(resolve_device(args.device))  # under torchrun: join its process group
        rank, size = distributed.world()
        console = Console(args.quiet or rank > 0)
        plan = make_plan(select(suite, args.methods, args.datasets))
        where = executor_settings(args, suite.executor)
        require_executor(where.kind)  # e.g. slurm without sbatch: refused before anything is written
        console.log(f"suite {suite.name!r}: {len(plan.cells)} cells on {device}, store {store_root}"
                    + (f"; each cell on {size} torchrun processes (DDP)" if size > 1 else ""))
        try:
            summary = run_plan(plan, Store(store_root), device, console, describe=suite, executor=where.kind,
                               workers=where.workers, cells_per_gpu=where.cells_per_gpu, slurm=where.slurm_options(),
                               plugins=tuple(args.plugin))
        finally:
            distributed.teardown()
        if rank > 0:
            return 0  # rank 0 stores, analyses and reports
        console.log(f"done: {len(summary.done)} trained, {len(summary.skipped)} skipped, {len(summary.failed)} failed"
                    + (f", {len(summary.elsewhere)} running elsewhere" if summary.elsewhere else ""))
        status = 1 if summary.failed else 0
    return max(status, report_suite(suite, store_root, args.reports / suite.name, report_options))


#: executor flag (argparse dest) -> the [executor] key it overrides
EXECUTOR_FLAGS = {"executor": "kind", "workers": "workers", "cells_per_gpu": "cells_per_gpu",
                  "slurm_partition": "partition", "slurm_gpus": "gpus", "slurm_cpus": "cpus",
                  "slurm_mem_gb": "mem_gb", "slurm_time": "time", "slurm_array_limit": "array_limit"}


def executor_settings(args: argparse.Namespace, table: ExecutorConfig) -> ExecutorConfig:
    """The executor to run with: each flag given on the command line, else the suite's
    ``[executor]`` key (``table``, an :class:`~bench.executor_config.ExecutorConfig`), else its
    default.  ``--slurm-option`` adds to the table's options, replacing one of the same name.
    A partition or option that would not stay on its own line of the batch script is a
    ConfigError, as in the table."""
    from bench.executor_config import sbatch_option_name, sbatch_option_problem, sbatch_text_problem

    given = {key: getattr(args, dest) for dest, key in EXECUTOR_FLAGS.items() if getattr(args, dest) is not None}
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


def _store_only(args: argparse.Namespace) -> bool:
    """``report --suite NAME`` where NAME is no suite file but a store folder under --results
    (NAME must be a suite name: one path component)."""
    from bench.spec import resolve_suite_path, suite_name_problem

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


def _report_options(args: argparse.Namespace):
    """The report's choices from the command line, a :class:`bench.report.suite.ReportOptions`
    (``--methods`` picks the methods ``report`` shows; for ``run`` it narrows the suite;
    no ``--format``: every format); an unknown ``--metrics`` name, ``--format`` or
    ``--severity`` is a ConfigError."""
    from bench.report.formats import FORMATS
    from bench.report.suite import ReportOptions

    return ReportOptions(suite=args.suite, results=args.results, data_root=args.data_root,
                         methods=args.methods if args.command == "report" else None, datasets=args.datasets,
                         seeds=args.seeds, epochs=args.epochs, metrics=args.metrics, scores=args.scores,
                         formats=args.format or FORMATS,
                         severity=args.severity, significance=args.significance, strict=args.strict,
                         quiet=args.quiet, debug=args.debug)
