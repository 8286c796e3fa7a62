"""Where cells run: :func:`run_job` (one cell under its lock, in any process) behind the
executors, each an :class:`Executor` registered by name in
:data:`bench.core.registry.EXECUTORS` here, where it is defined (``--executor``, a suite's
``[executor] kind``).

* ``local`` (default): the cells one after another in this process.
* ``processes``: a pool of ``--workers N`` processes on this machine (:func:`pool`;
  spawned, so CUDA and OpenMP start clean in each), one cell at a time in each.  A worker
  that dies (the OOM killer's SIGKILL, a segfault) fails the cell it was running, with the
  signal named; a fresh worker takes its place and the other cells go on.  A runner
  stopped (Ctrl-C, SIGTERM) stops its workers, each releasing its cell's lock.  On CUDA,
  workers are spread over the visible GPUs and ``--cells-per-gpu K`` runs K cells on each
  GPU at once (N = GPUs x K); on CPU the cores are shared out (``torch.set_num_threads``).
* ``slurm`` (and ``submitit-local``, the same jobs as local processes, for testing and for
  a workstation): one job per cell through **submitit**, as a SLURM job array with the
  partition, GPUs and CPUs per cell, memory, time limit, array throttle and extra sbatch
  options of :class:`~bench.config.executor_config.SlurmOptions`.  Submitit pickles the cell
  function and its arguments, writes the sbatch script, requeues a job on preemption or
  time-out (the cell resumes from its last training state, ``[train] checkpoint_every``)
  and returns each job's result.  It is a small, well-kept library with no server, unlike
  Ray; a Ray user would plug in by mapping :func:`run_job` over the :class:`Job` list with
  ``ray.remote``.

Every executor runs :func:`run_job`, which takes the cell's lock (:mod:`bench.store.lock`), so
runners on one store (two terminals, two SLURM arrays) never train a cell twice: a cell
another runner holds is reported ``elsewhere`` and left to it; under the lock the cell
itself runs (:func:`bench.train.cell.run_cell`).  A fresh process (a pool worker, a SLURM job)
first loads the registries (:func:`bench.core.registry.import_plugins`) and the data settings
the job carries.  The runner above (:mod:`bench.run.runner`) plans, checks the configuration
and picks the executor; the settings that pick it are :mod:`bench.config.executor_config`.
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from bench.core import progress
from bench.data import configure_data
from bench.core.errors import ConfigError, require_package
from bench.config.executor_config import ExecutorConfig, SlurmOptions
from bench.store.lock import LOCK_SUFFIX, CellLock
from bench.store.plan import Cell
from bench.core.registry import EXECUTORS, import_plugins
from bench.store import CellRecord, Store


@dataclass(frozen=True)
class Job:
    """One cell as any executor ships it (picklable): the cell, the store, the device, and
    what a fresh process needs to rebuild the registries and find the data."""

    cell: Cell
    store_root: str
    device: str  # "cpu", "cuda", "cuda:<index>", or "auto": CUDA when the machine running the job has it
    plugins: tuple[str, ...] = ()
    data_root: str | None = None
    download: bool = False
    strict: bool = False
    threads: int = 0  # torch threads in a worker process (0: leave as is)
    tensorboard: bool = False  # also write the training log as TensorBoard events
    progress: str = "off"  # how the process running it shows progress (bench.core.progress)
    verbose: bool = False  # lines mode: every epoch and split (bench.core.progress.configure)


@dataclass(frozen=True)
class Outcome:
    key: str
    label: str
    status: str  # complete, skipped (complete already), failed, elsewhere (locked by another runner)
    detail: str
    seconds: float


# --------------------------------------------------------------------------- the cell function of every executor

_DATA: dict[str, object] = {}  # dataset name -> loaded bundle, per process
_SET_UP: set[tuple] = set()  # the process settings (plugins, data, threads) this process has taken
_LOCK = None  # the lock of the cell this process is running (released on preemption)
_DEVICE: str | None = None  # a pool worker's device, claimed at its start


def _set_up_process(job: Job) -> None:
    """Once per process and settings: the registries filled (built-ins and the job's
    plugins), the data settings, torch's thread count, how progress shows."""
    key = (job.plugins, job.data_root, job.download, job.strict, job.threads, job.progress, job.verbose)
    if key in _SET_UP:
        return
    import_plugins(list(job.plugins))
    configure_data(job.data_root, download=job.download, strict=job.strict)
    if job.threads:
        import torch

        torch.set_num_threads(job.threads)
    progress.configure(job.progress, job.verbose)
    _SET_UP.add(key)


def preload(datasets: dict) -> None:
    """Hand this process's loaded data sets to :func:`run_job` (the local executor)."""
    _DATA.update(datasets)


def run_job(job: Job, console=None) -> Outcome:
    """Run one cell under its lock: skipped when complete, ``elsewhere`` when another runner
    holds it, else trained, predicted and stored (:func:`bench.train.cell.run_cell`)."""
    import torch

    from bench.train.cell import load_data, run_cell
    from bench.train.loop import resolve_device
    from bench.train.telemetry import Console

    global _LOCK
    _set_up_process(job)
    console = console or Console(quiet=True)
    cell, t0 = job.cell, time.perf_counter()
    store = Store(Path(job.store_root))
    cd = store.cell(cell.key)
    lock = CellLock(store.root / f"{cell.key}{LOCK_SUFFIX}")
    if not lock.acquire():
        who = lock.holder() or {}
        return Outcome(cell.key, cell.label, "elsewhere",
                       f"locked by {who.get('host', '?')} pid {who.get('pid', '?')} "
                       f"(heartbeat {who.get('age', float('nan')):.0f} s ago)", 0.0)
    _LOCK = lock
    try:
        state, problem = cd.condition()  # again, under the lock: another runner may have finished it
        if state == "complete":
            return Outcome(cell.key, cell.label, "skipped", "complete", 0.0)
        if state == "damaged":
            console.warn(f"{cell.label}: damaged ({problem}); moving it aside to {cell.key}.damaged-<time>/ and redoing it")
        if cell.dataset.name not in _DATA:
            _DATA[cell.dataset.name] = load_data(cell.dataset)
        try:
            device = resolve_device(job.device) if job.device == "auto" else torch.device(job.device)
            status, detail = run_cell(cell, _DATA[cell.dataset.name], cd, device, console,
                                      tensorboard=job.tensorboard)
        except OSError as exc:  # the cell's directory cannot be cleared or written
            status, detail = "failed", f"cell directory {cd.path} unusable: {exc.strerror or exc} ({exc.filename})"
        return Outcome(cell.key, cell.label, status, detail, time.perf_counter() - t0)
    finally:
        lock.release()
        _LOCK = None


def release_on_preemption() -> None:
    """Give up this process's cell lock now (the job is being preempted and requeued: the
    requeued job must be able to take the cell at once)."""
    if _LOCK is not None:
        _LOCK.release()


# --------------------------------------------------------------------------- executors


class _Stopped(BaseException):
    """SIGTERM in a pool worker: unwinds the cell it runs, releasing the cell's lock
    (:func:`run_job`), before the worker ends; no cell's own error handling catches it."""


def _stopped(_signum, _frame) -> None:
    raise _Stopped


def _pool_worker(conn, device: str | None, threads: int) -> None:
    """A pool worker: run each job received on ``conn`` and send its outcome back, until
    ``None`` comes (its device: ``device``, e.g. ``"cuda:1"``; None: the job's own).
    SIGTERM (the runner stopping the pool, or anyone) releases the lock of the cell it
    runs, and the worker then ends by that signal, which the runner names."""
    global _DEVICE
    _DEVICE = device
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's: it stops the workers
    signal.signal(signal.SIGTERM, _stopped)
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        while True:
            try:
                job = conn.recv()
            except EOFError:  # the pool's process is gone
                return
            if job is None:
                return
            try:
                outcome = _pool_run(job)
            except Exception as exc:  # noqa: BLE001  (outside the cell's own failure handling: report it)
                outcome = Outcome(job.cell.key, job.cell.label, "failed", f"{type(exc).__name__}: {exc}"[:500], 0.0)
            conn.send(outcome)
    except _Stopped:  # the cell's lock is released: end as the signal asked
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        os._exit(128 + signal.SIGTERM)  # not reached where the signal ends the process at once


def _pool_run(job: Job) -> Outcome:
    if _DEVICE is not None:
        job = replace(job, device=_DEVICE)
    return run_job(job)


def _death(process, key: str) -> str:
    """Why a pool worker stopped while running cell ``key``: its signal or exit status."""
    process.join(timeout=10)
    code = process.exitcode
    if code is None:  # it closed its pipe but lives on: stop it
        process.kill()
        process.join()
        return f"worker stopped answering while running {key}"
    if code < 0:
        try:
            return f"worker killed by {signal.Signals(-code).name} while running {key}"
        except ValueError:
            return f"worker killed by signal {-code} while running {key}"
    return f"worker exited with status {code} while running {key}"


def _record_death(job: Job, reason: str) -> Outcome:
    """The outcome of a cell whose worker process died (``reason``), recorded in the
    store as the cell's failure (``status`` shows it, the next run redoes the cell) unless
    another runner holds the cell meanwhile; the dead worker's own lock is stale at once
    (:mod:`bench.store.lock`) and is broken here.  A cell its worker completed before dying
    stays complete."""
    cell = job.cell
    store = Store(Path(job.store_root))
    cd = store.cell(cell.key)
    with CellLock(store.root / f"{cell.key}{LOCK_SUFFIX}") as held:
        if held and cd.condition()[0] == "complete":
            return Outcome(cell.key, cell.label, "complete", f"stored already ({reason})", 0.0)
        if held:  # its record so far, else (it died before it began the cell) who the cell is
            info = cd.read_cell() or CellRecord(key=cell.key, dataset=cell.dataset.name, method=cell.method.name,
                                                seed=cell.seed, config=cell.config)
            cd.mark_failed(info, reason)
    return Outcome(cell.key, cell.label, "failed", f"{reason}; the next run retries it", 0.0)


def dispatch_order(jobs: list[Job]) -> list[Job]:
    """The order a pool hands out ``jobs``: single-stage cells before two-stage ones (whose
    stage-1 cell should be stored first, as the plan orders them), and within each, more
    training epochs first (stable otherwise).  Epochs stand for a cell's length: started
    last, a long cell leaves the other workers idle at the end of the run (the default
    suite's SGPA cells, its longest, came last in plan order: the last one ran 95 s alone)."""
    return sorted(jobs, key=lambda j: (j.cell.stage1 is not None, -j.cell.method.train.epochs))


def pool(jobs: list[Job], workers: int, devices: list[str] | None):
    """Yield each job's :class:`Outcome` as it finishes, from ``workers`` spawned processes
    (``devices``: one entry per worker, e.g. ``["cuda:0", "cuda:0", "cuda:1", "cuda:1"]``),
    handed out in :func:`dispatch_order`.

    Each worker runs one job at a time.  A worker that dies (the OOM killer, a segfault)
    fails only the cell it was running, with its signal named (:func:`_record_death`); a
    fresh worker on the same device takes the next job, and the other workers go on."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    slots = list(devices) if devices else [None] * workers
    threads = max(1, (os.cpu_count() or 1) // len(slots))
    todo = list(reversed(dispatch_order(jobs)))
    started = []
    busy: dict = {}  # our end of a busy worker's pipe -> (its process, its device, its job)

    def assign(conn, process, device: str | None) -> None:
        job = todo.pop()
        busy[conn] = (process, device, job)
        with suppress(OSError):  # it died meanwhile: the loop below sees it and fails the job
            conn.send(job)

    def start(device: str | None) -> None:
        ours, theirs = ctx.Pipe()
        process = ctx.Process(target=_pool_worker, args=(theirs, device, threads), name="uqbench pool worker")
        process.start()
        started.append(process)
        theirs.close()  # only the worker holds its end now: its death ends the pipe
        assign(ours, process, device)

    try:
        for device in slots[:len(todo)]:
            start(device)
        while busy:
            ready = wait([*busy, *(process.sentinel for process, _, _ in busy.values())])
            for conn in [c for c, (process, _, _) in busy.items() if c in ready or process.sentinel in ready]:
                process, device, job = busy.pop(conn)
                try:
                    outcome = conn.recv()
                except (EOFError, OSError):  # the worker died before answering
                    conn.close()
                    outcome = _record_death(job, _death(process, job.cell.key))
                    if todo:
                        start(device)
                else:
                    if todo:
                        assign(conn, process, device)
                    else:
                        with suppress(OSError):  # no more jobs: it may stop
                            conn.send(None)
                yield outcome
    finally:
        for process, _, _ in busy.values():  # stopped early (an error, ^C or SIGTERM in this process)
            process.terminate()  # SIGTERM: the worker releases its cell's lock and ends
        for process in started:
            process.join(timeout=60)
            if process.is_alive():  # hung on its way out
                process.kill()
                process.join()


class Executor:
    """How a run's incomplete cells are run, chosen by name from
    :data:`bench.core.registry.EXECUTORS` (``--executor``, the suite's ``[executor] kind``);
    ``config``: the run's :class:`~bench.config.executor_config.ExecutorConfig`."""

    in_process = False  # runs the cells in this process (the only executor torchrun allows)
    other_nodes = False  # runs the cells on other machines, which resolve --device where they run

    def __init__(self, config: ExecutorConfig) -> None:
        self.config = config

    def check(self) -> None:
        """Refuse, before any work, an executor this machine cannot run (a ConfigError)."""

    def outcomes(self, jobs: list[Job], store_root: Path, device: str, console, datasets: dict) -> Iterator[Outcome]:
        """Each job's :class:`Outcome` as it finishes (``device``: where the jobs train;
        ``datasets``: the run's data sets, loaded in this process)."""
        raise NotImplementedError

    def at_once(self) -> int:
        """How many cells run at once (after :meth:`outcomes` started them)."""
        return 1


@EXECUTORS.register("local")
class Local(Executor):
    """The cells one after another in this process."""

    in_process = True

    def outcomes(self, jobs, store_root, device, console, datasets):
        preload(datasets)
        return (run_job(job, console) for job in jobs)


@EXECUTORS.register("processes")
class Processes(Executor):
    """A pool of ``workers`` spawned processes on this machine (:func:`pool`); on CUDA,
    ``cells_per_gpu`` workers on each visible GPU."""

    def __init__(self, config: ExecutorConfig) -> None:
        super().__init__(config)
        self.workers = config.workers

    def outcomes(self, jobs, store_root, device, console, datasets):
        import torch

        devices = None
        if torch.device(device).type == "cuda" and torch.cuda.device_count() > 0:
            gpus = torch.cuda.device_count()
            self.workers = gpus * self.config.cells_per_gpu
            devices = [f"cuda:{i % gpus}" for i in range(self.workers)]
        console.log(f"executor processes: {self.workers} worker(s)"
                    + (f" on {len(set(devices))} GPU(s)" if devices else ""))
        return pool(jobs, self.workers, devices)

    def at_once(self) -> int:
        return self.workers


@EXECUTORS.register("submitit-local")
class SubmititLocal(Executor):
    """One job per cell through submitit, as local processes (for testing, a workstation):
    :func:`submitit_run`, its scripts and logs under ``<store>/.submitit``."""

    def check(self) -> None:
        require_package("submitit", "submitit", f"--executor {self.config.kind}", install="submitit==1.5.4")

    def outcomes(self, jobs, store_root, device, console, datasets):
        folder = Path(store_root) / ".submitit"
        console.log(f"executor {self.config.kind}: {len(jobs)} job(s), scripts and logs in {folder}")
        return submitit_run(jobs, folder, self.config.kind, self.config.slurm_options())

    def at_once(self) -> int:
        return self.config.slurm_options().array_limit


@EXECUTORS.register("slurm")
class Slurm(SubmititLocal):
    """One job per cell through submitit, as a SLURM job array (:class:`SlurmOptions`);
    it needs SLURM's ``sbatch`` and ``srun`` on PATH."""

    other_nodes = True

    def check(self) -> None:
        super().check()
        missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
        if missing:
            raise ConfigError(f"--executor slurm: no {' or '.join(missing)} on PATH, so no SLURM here; run on a "
                              "SLURM login node, or use --executor processes (or submitit-local) on this machine")


def submitit_executor(folder: Path, kind: str, slurm: SlurmOptions):
    """A submitit executor writing its scripts and logs under ``folder``."""
    EXECUTORS.get(kind)(ExecutorConfig(kind=kind)).check()
    import submitit

    if kind == "slurm":
        ex = submitit.AutoExecutor(folder=str(folder), cluster="slurm")
        ex.update_parameters(**slurm.parameters())
    else:
        ex = submitit.AutoExecutor(folder=str(folder), cluster="local")
        ex.update_parameters(timeout_min=slurm.time_min, gpus_per_node=0, tasks_per_node=1, nodes=1)
    return ex


def _cell_task():
    import submitit

    class CellTask(submitit.helpers.Checkpointable):
        """The cell function as a submitit job; on preemption or time-out it gives up the
        cell's lock and is requeued with the same job, which resumes from the cell's saved
        training state."""

        def __call__(self, job: Job) -> Outcome:
            return run_job(job)

        def checkpoint(self, *args, **kwargs):
            release_on_preemption()
            return super().checkpoint(*args, **kwargs)

    return CellTask()


def submitit_run(jobs: list[Job], folder: Path, kind: str, slurm: SlurmOptions):
    """Submit every job as one array and yield the outcomes as they finish."""
    ex = submitit_executor(folder, kind, slurm)
    task = _cell_task()
    submitted = ex.map_array(task, jobs)
    pending = dict(zip(submitted, jobs))
    while pending:
        for sj in [s for s in pending if s.done()]:
            job = pending.pop(sj)
            try:
                yield sj.result()
            except Exception as exc:  # noqa: BLE001  (the job failed or its node died)
                yield Outcome(job.cell.key, job.cell.label, "failed", f"{type(exc).__name__}: {exc}"[:500], 0.0)
        if pending:
            time.sleep(1.0)
