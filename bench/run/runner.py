"""Runs a plan: loads each data set once, checks the configuration before anything is
written (:func:`preflight`: every split readable, every split pattern matching a split,
every model buildable), records the suite in the store, hands the incomplete cells to the
executor its :class:`RunOptions` name (:mod:`bench.run.executors`) and logs each outcome as it comes.  Complete cells
(their manifest verifies) are skipped with a log line.  Under torchrun, rank 0 does all
this and the other ranks follow it, training each cell it announces (:func:`_follow`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from bench.train import distributed

from bench.core import progress
from bench.train.cell import load_data
from bench.train.telemetry import Console
from bench.data import DataBundle, split_summary
from bench.core.errors import ConfigError, NonFiniteLoss
from bench.config.executor_config import ExecutorConfig
from bench.config.spec import Suite
from bench.run.executors import Executor, Job
from bench.store.plan import Plan
from bench.core.registry import EXECUTORS, METHODS
from bench.store.runs import RunRecord, claim
from bench.store import Store
from bench.train.loop import fit, seed_everything


def preflight(plan: Plan, datasets: dict[str, DataBundle], to_run: set[str] | None = None) -> None:
    """Raise ConfigError for anything that would make a cell fail for config reasons:
    split patterns matching nothing, a model that cannot be built for the data, or a data
    file that cannot be read.  Every split a cell still ``to_run`` (dataset names; None =
    all) needs -- train, val, test, shift and OOD -- is loaded once and released, so a broken
    file is an error before the first cell trains (generated corruptions land in their cache)."""
    for d in plan.suite.datasets:
        data = datasets[d.name]
        if to_run is None or d.name in to_run:
            for split in ["train", *data.eval_splits(d.splits)]:
                try:
                    data.get(split)
                except ConfigError:
                    raise
                except Exception as exc:  # noqa: BLE001  (any reader error: named, exit 2, nothing trained)
                    raise ConfigError(f"datasets.{d.name}: split {split!r} cannot be read: "
                                      f"{type(exc).__name__}: {exc}") from None
                data.release(split)
        for pattern in d.splits:
            if not data.eval_splits((pattern,))[1:] and pattern != "val":
                raise ConfigError(
                    f"datasets.{d.name}.splits: pattern {pattern!r} matches no split; "
                    f"available: {split_summary(n for n in data.split_names() if n != 'train')}"
                )
        for m in plan.suite.methods:
            if m.kind == "trained":  # the training and the prediction model (a swapped attention)
                method = METHODS.get(m.type)(m.options)
                method.prediction_model(method.build_model(m.model, data), m.model, data)


@dataclass
class RunSummary:
    done: list[str] = field(default_factory=list)  # trained here
    fitted: list[str] = field(default_factory=list)  # post-hoc cells fitted here on their stage-1 cell (none trained)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)  # locked by another runner on the same store
    started: str = ""  # when the run was first started, as its store record keeps it ("" without a record)


@dataclass(frozen=True)
class RunOptions:
    """How :func:`run_plan` runs a plan.  ``executor``: where the cells run (an
    :class:`~bench.config.executor_config.ExecutorConfig`, its ``kind`` a name of
    :data:`bench.core.registry.EXECUTORS`).  ``record`` (:func:`bench.store.runs.store_record`)
    claims the store as its ``run.json`` (:func:`bench.store.runs.claim`: a ConfigError when
    another run claimed it for another plan meanwhile); its plugins are loaded by each
    job.  ``describe`` (the full suite) is recorded in the store's ``suite.json``.
    ``tensorboard``: each cell also writes its training log as TensorBoard events.
    ``job_device``: the device the cells' jobs ask for where they run instead of the
    runner's (SLURM: ``"auto"`` is resolved on each job's node, as a login node may have
    no GPU)."""

    executor: ExecutorConfig = ExecutorConfig()
    record: RunRecord | None = None
    describe: Suite | None = None
    tensorboard: bool = False
    job_device: str | None = None


def run_plan(plan: Plan, store: Store, device: torch.device, console: Console,
             options: RunOptions = RunOptions()) -> RunSummary:
    """Run every incomplete cell with the executor of ``options`` (:class:`RunOptions`).
    The record and the description are written once the data loaded and the preflight
    checks passed, before any cell.  Under torchrun, rank 0 does all this and the other
    ranks follow it (:func:`_follow`)."""
    executor = EXECUTORS.get(options.executor.kind, key="--executor")(options.executor)
    rank, size = distributed.world()
    if size > 1 and not executor.in_process:
        raise ConfigError(f"torchrun trains each cell on its {size} processes together: use --executor local "
                          f"(got {options.executor.kind}); to run several cells at once, start several runners "
                          "instead")
    if rank > 0:
        return _follow(plan, device)
    try:
        datasets = {d.name: load_data(d) for d in plan.suite.datasets}
        # every cell verified once (sha256 of its files): decides what preflight loads and what runs
        conditions = {c.key: store.cell(c.key).condition() for c in plan.cells}
        preflight(plan, datasets, {c.dataset.name for c in plan.cells if conditions[c.key][0] != "complete"})
    except BaseException:
        if size > 1:
            distributed.announce(None)  # the followers stop too
        raise
    if size > 1:
        distributed.announce("ready")  # the data (and generated caches) are in place for the followers
    try:
        return _run_jobs(plan, store, options.job_device or str(device), console, options, executor,
                         (datasets, conditions))
    finally:
        if size > 1:
            distributed.announce(None)  # no more cells: the followers return


def _run_jobs(plan, store, device: str, console, options: RunOptions, executor: Executor, loaded) -> RunSummary:
    """:func:`run_plan` once the data are loaded and checked (``loaded``: the data sets by
    name and each cell's condition): claim and describe the store, submit the incomplete
    cells to the ``executor`` (each job on ``device``), log each outcome."""
    from bench.data import data_settings

    datasets, conditions = loaded
    summary = RunSummary()
    if options.record is not None:  # first: a store another run claimed meanwhile for another plan is refused here
        claimed, damage = claim(store.root, options.record)
        summary.started = claimed.started
        if damage is not None:
            console.warn(f"{damage}; rewritten for this run")
    if options.describe is not None:
        from bench.store.catalog import write_store_description

        write_store_description(store.root, options.describe)
    total = len(plan.cells)
    measured: dict[str, list[float]] = {}  # method -> seconds per cell: the time-left estimate's costs
    for cell in plan.cells:
        if conditions[cell.key][0] == "complete":
            console.log(f"[{len(summary.skipped) + 1}/{total}] {cell.label}: complete, skipped ({cell.key})")
            summary.skipped.append(cell.key)
            measured.setdefault(cell.method.name, []).append(store.cell(cell.key).seconds())
    settings = data_settings()
    # a worker process shows a line per epoch and split unless the run is quiet; this one keeps its mode
    shown = progress.mode() if executor.in_process else "off" if progress.mode() == "off" else "lines"
    plugins = options.record.spec.plugins if options.record is not None else ()
    jobs = [Job(c, str(store.root), device, tuple(plugins), str(settings.root) if settings.root else None,
                settings.download, settings.strict, tensorboard=options.tensorboard, progress=shown,
                verbose=progress.verbose())
            for c in plan.cells if conditions[c.key][0] != "complete"]
    outcomes = executor.outcomes(jobs, store.root, device, console, datasets)
    with progress.task("cells", total=total, unit="cell", initial=len(summary.skipped), rate=False) as bar:
        _log_outcomes(outcomes, summary, console, bar, total, [(j.cell.key, j.cell.method.name) for j in jobs],
                      not executor.in_process, {c.key for c in plan.cells if c.post_hoc}, measured, executor.at_once())
    return summary


def _log_outcomes(outcomes, summary: RunSummary, console: Console, bar, total: int, jobs: list[tuple[str, str]],
                  queued: bool, post_hoc: set[str], measured: dict[str, list[float]], at_once: int) -> None:
    """Log each cell's outcome as it comes (with ``queued``: the counts of an executor
    that runs several at once) and record it in ``summary`` (a complete cell of
    ``post_hoc``, the keys of cells that train nothing, as fitted).  ``jobs``: the cells
    submitted, ``(key, method)``.  Each line and the bar count every cell of the run, the
    skipped ones included, and say the time left (:func:`bench.core.progress.time_left`: the
    cells still to come at the measured cost of their method, ``measured`` as the store
    recorded it for the complete cells and as each cell of this run takes, ``at_once``
    cells at a time)."""
    pending = dict(jobs)
    finished = len(summary.skipped)
    for out in outcomes:
        finished += 1
        prefix = f"[{finished}/{total}] {out.label}"
        method = pending.pop(out.key, None)
        if out.status == "complete" and method is not None:
            measured.setdefault(method, []).append(out.seconds)
        left = progress.time_left(list(pending.values()), measured, at_once)
        eta = f"; about {progress.duration(left)} left" if pending and left == left else ""
        if out.status == "complete":
            console.log(f"{prefix}: complete in {progress.duration(out.seconds)}, {out.detail}{eta}")
            (summary.fitted if out.key in post_hoc else summary.done).append(out.key)
        elif out.status == "skipped":
            console.log(f"{prefix}: completed by another runner, skipped ({out.key}){eta}")
            summary.skipped.append(out.key)
        elif out.status == "elsewhere":
            console.log(f"{prefix}: running elsewhere, {out.detail}; left to that runner{eta}")
            summary.elsewhere.append(out.key)
        else:
            console.warn(f"{prefix}: FAILED after {progress.duration(out.seconds)}: {out.detail}{eta}")
            summary.failed.append(out.key)
        if queued:
            console.log(f"  {len(summary.done) + len(summary.fitted)} done, {len(summary.failed)} failed, "
                        f"{len(pending)} queued or running")
        bar.advance()
        bar.suffix(eta.removeprefix("; "))


def _follow(plan: Plan, device: torch.device) -> RunSummary:
    """A torchrun rank other than 0: train each cell rank 0 announces with it (same seed,
    same model, its share of every batch), store nothing, until rank 0 says done."""
    if distributed.announce() != "ready":
        return RunSummary()
    datasets = {d.name: load_data(d) for d in plan.suite.datasets}
    cells = {c.key: c for c in plan.cells}
    summary = RunSummary()
    while (message := distributed.announce()) is not None:
        cell = cells[message["key"]]
        method = METHODS.get(cell.method.type)(cell.method.options)
        seed_everything(cell.seed)
        model = method.build_model(cell.method.model, datasets[cell.dataset.name]).to(device)
        try:
            fit(method, model, datasets[cell.dataset.name], cell.method.train, device, cell.seed, resume=message["resume"])
            summary.done.append(cell.key)
        except NonFiniteLoss:  # every rank sees it at the same step; rank 0 records the failure
            summary.failed.append(cell.key)
        except BaseException as exc:  # noqa: BLE001 - rank 0 waits in a collective: stop them all
            distributed.abort(f"{cell.label}: {type(exc).__name__}: {exc}")
    return summary
