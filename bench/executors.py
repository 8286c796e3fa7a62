"""Where cells run: one cell function, :func:`run_job`, behind three executors.

* ``local`` (default): the cells one after another in this process.
* ``processes``: a pool of ``--workers N`` processes on this machine (:func:`pool`;
  spawned, so CUDA and OpenMP start clean in each), one cell at a time in each.  A worker
  that dies (the OOM killer's SIGKILL, a segfault) fails the cell it was running, with the
  signal named; a fresh worker takes its place and the other cells go on.  On CUDA,
  workers are spread over the visible GPUs and ``--cells-per-gpu K`` runs K cells on each
  GPU at once (N = GPUs x K); on CPU the cores are shared out (``torch.set_num_threads``).
* ``slurm`` (and ``submitit-local``, the same jobs as local processes, for testing and for
  a workstation): one job per cell through **submitit**, as a SLURM job array with the
  partition, GPUs and CPUs per cell, memory, time limit, array throttle and extra sbatch
  options given on the command line or in the suite's ``[executor]`` table.  Submitit pickles the cell function and its
  arguments, writes the sbatch script, requeues a job on preemption or time-out (the cell
  resumes from its last training state, ``[train] checkpoint_every``) and returns each
  job's result.  It is a small, well-kept library with no server, unlike Ray; a Ray user
  would plug in by mapping :func:`run_job` over the :class:`Job` list with ``ray.remote``.

Every executor runs :func:`run_job`, which takes the cell's lock (:mod:`bench.lock`), so
runners on one store (two terminals, two SLURM arrays) never train a cell twice: a cell
another runner holds is reported ``elsewhere`` and left to it.  The parent process plans,
checks the configuration (preflight) and writes the report once at the end.

Which executor, and its settings, come from a suite's ``[executor]`` table
(:class:`ExecutorConfig`, one key per flag) with the command-line flags on top.  Neither
enters a cell's key or the store: they decide where a cell runs, not what it computes.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import time
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from bench.options import Problems, parse

if TYPE_CHECKING:  # bench.spec imports this module (for ExecutorConfig); bench.plan imports bench.spec
    from bench.plan import Cell

EXECUTORS = ("local", "processes", "slurm", "submitit-local")


@dataclass(frozen=True)
class Job:
    """One cell as any executor ships it (picklable): the cell, the store, the device, and
    what a fresh process needs to rebuild the registries and find the data."""

    cell: Cell
    store_root: str
    device: str  # "cpu", "cuda" or "cuda:<index>"
    plugins: tuple[str, ...] = ()
    data_root: str | None = None
    download: bool = False
    strict: bool = False
    threads: int = 0  # torch threads in a worker process (0: leave as is)


@dataclass(frozen=True)
class Outcome:
    key: str
    label: str
    status: str  # complete, skipped (complete already), failed, elsewhere (locked by another runner)
    detail: str
    seconds: float


@dataclass
class SlurmOptions:
    """``--slurm-*`` flags: what each cell's job asks SLURM for."""

    partition: str | None = None
    gpus_per_cell: int = 1
    cpus_per_cell: int = 8
    mem_gb: float = 32.0
    time_min: int = 24 * 60
    array_limit: int = 64  # at most this many cells at once (sbatch --array=...%limit)
    extra: dict[str, str] = field(default_factory=dict)  # further sbatch options, e.g. {"account": "x"}

    def parameters(self) -> dict:
        """submitit ``update_parameters`` keywords for SLURM; a partition or extra option that
        would not stay on its own ``#SBATCH`` line (:func:`sbatch_option_problem`) is a
        ConfigError."""
        from bench.errors import ConfigError

        for key, value in self.extra.items():
            if problem := sbatch_option_problem(key, value):
                raise ConfigError(f"sbatch option {shown(key)}: {problem}")
        if problem := sbatch_text_problem(self.partition or ""):
            raise ConfigError(f"SLURM partition: {problem}")
        params = {"timeout_min": self.time_min, "slurm_array_parallelism": self.array_limit,
                  "gpus_per_node": self.gpus_per_cell, "cpus_per_task": self.cpus_per_cell,
                  "mem_gb": self.mem_gb, "tasks_per_node": 1, "nodes": 1}
        if self.partition:
            params["slurm_partition"] = self.partition
        if self.extra:
            params["slurm_additional_parameters"] = dict(self.extra)
        return params


def sbatch_option_name(key: str) -> str:
    """An extra sbatch option's name as submitit takes it: ``--mail-type`` -> ``mail_type``."""
    return key.strip().lstrip("-").replace("-", "_")


_SBATCH_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # an option name as sbatch_option_name leaves it


def shown(text: str) -> str:
    """``text`` as one line of a message: itself when printable, else its repr (``'a\\nb'``)."""
    return text if text.isprintable() else repr(text)


def sbatch_text_problem(text: str) -> str | None:
    """Why ``text`` cannot go into the batch script (None: it can).  Each SLURM setting
    becomes one line ``#SBATCH --name=value`` of the script: a newline (or any other
    control character) would begin a line of its own, a shell command."""
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is None:
        return None
    return (f"{text!r} contains the control character U+{ord(bad):04X}; each sbatch setting is one "
            "line of printable text in the batch script, so remove it")


def sbatch_option_problem(key: str, value: str) -> str | None:
    """Why the extra sbatch option ``key = value`` cannot be used (None: it can): a control
    character in either (:func:`sbatch_text_problem`), or a name unlike sbatch's option
    names (letters, digits, ``-``, ``_``)."""
    problem = sbatch_text_problem(key) or sbatch_text_problem(value)
    if problem is None and not _SBATCH_NAME.fullmatch(sbatch_option_name(key)):
        problem = (f"{key!r} is not an sbatch option name: letters, digits, '-' and '_', starting with a letter "
                   "(e.g. account, mail-type)")
    return problem


@dataclass(frozen=True)
class ExecutorConfig:
    """Where the cells run: a suite's ``[executor]`` table.  Each key stands for the flag
    named beside it, and a flag given on the command line wins over the key.  Example::

        [executor]
        kind = "slurm"
        partition = "gpu"
        time = 720             # minutes
        [executor.options]     # further sbatch options
        account = "myproject"
    """

    kind: str = field(default="local", metadata={"choices": EXECUTORS})  # --executor
    workers: int = field(default=2, metadata={"min": 1, "soft_max": 4096})  # --workers (CPU pool size)
    cells_per_gpu: int = field(default=1, metadata={"min": 1, "soft_max": 1024})  # --cells-per-gpu
    partition: str = ""  # --slurm-partition; "" = the cluster's default partition
    gpus: int = field(default=SlurmOptions.gpus_per_cell, metadata={"min": 0, "soft_max": 64})  # --slurm-gpus, per cell
    cpus: int = field(default=SlurmOptions.cpus_per_cell, metadata={"min": 1, "soft_max": 4096})  # --slurm-cpus, per cell
    mem_gb: float = field(default=SlurmOptions.mem_gb, metadata={"exclusive_min": 0.0, "soft_max": 1 << 16})  # --slurm-mem-gb
    time: int = field(default=SlurmOptions.time_min, metadata={"min": 1, "soft_max": 366 * 24 * 60})  # --slurm-time, minutes
    array_limit: int = field(default=SlurmOptions.array_limit, metadata={"min": 1, "soft_max": 1 << 20})  # --slurm-array-limit
    options: dict = field(default_factory=dict, hash=False)  # --slurm-option KEY=VALUE; name -> value (strings)

    def slurm_options(self) -> SlurmOptions:
        return SlurmOptions(self.partition or None, self.gpus, self.cpus, self.mem_gb, self.time, self.array_limit,
                            dict(self.options))


def parse_executor(table: object, path: str = "executor", problems: Problems | None = None) -> ExecutorConfig | None:
    """An ``[executor]`` table as an :class:`ExecutorConfig`; every problem is reported with
    its key path (``executor.workers``), like the rest of the suite.  Option names are
    normalised as ``--slurm-option`` does (``mail-type`` -> ``mail_type``), integer values
    become strings."""
    own = problems is None
    problems = Problems() if own else problems
    before = len(problems)
    if not isinstance(table, dict):
        problems.add(path, f"expected a table of executor settings (kind, workers, partition, ...), got {table!r}")
        table = None
    elif isinstance(table.get("time"), str):  # "24:00:00", sbatch's own notation
        problems.add(f"{path}.time", f"the time limit per cell in minutes, an integer (e.g. time = 1440 for "
                                     f"24 hours), got {table['time']!r}")
        table = {k: v for k, v in table.items() if k != "time"}
    config = parse(ExecutorConfig, table, path, problems) if table is not None else None
    if config is not None:
        options = {}
        for key, value in config.options.items():
            sub = f"{path}.options.{shown(key)}"
            name = sbatch_option_name(key)
            if not name:
                problems.add(sub, "an sbatch option needs a name, e.g. account = \"myproject\"")
            elif isinstance(value, bool) or not isinstance(value, (str, int)):
                problems.add(sub, f"expected a string or an integer (the sbatch option's value), got {value!r}")
            elif problem := sbatch_option_problem(key, str(value)):
                problems.add(sub, problem)
            else:
                options[name] = str(value)
        if problem := sbatch_text_problem(config.partition):
            problems.add(f"{path}.partition", problem)
        config = replace(config, options=options)
    if own:
        problems.raise_if_any()
    return config if len(problems) == before else None


# --------------------------------------------------------------------------- the cell function

_DATA: dict[str, object] = {}  # dataset name -> loaded bundle, per process
_READY: set[tuple] = set()
_LOCK = None  # the lock of the cell this process is running (released on preemption)
_DEVICE: str | None = None  # a pool worker's device, claimed at its start


def _prepare(job: Job) -> None:
    """Once per process: plugins registered, data settings, torch threads."""
    key = (job.plugins, job.data_root, job.download, job.strict, job.threads)
    if key in _READY:
        return
    import datasets  # noqa: F401  (registers the data sets)
    import methods  # noqa: F401  (registers the methods)
    from bench.cli import import_plugins
    from bench.data import configure_data

    import_plugins(list(job.plugins))
    configure_data(job.data_root, download=job.download, strict=job.strict)
    if job.threads:
        import torch

        torch.set_num_threads(job.threads)
    _READY.add(key)


def preload(datasets: dict) -> None:
    """Hand this process's loaded data sets to :func:`run_job` (the local executor)."""
    _DATA.update(datasets)


def run_job(job: Job, console=None) -> Outcome:
    """Run one cell under its lock: skipped when complete, ``elsewhere`` when another runner
    holds it, else trained, predicted and stored (:func:`bench.runner.run_cell`)."""
    global _LOCK
    import torch

    from bench.lock import LOCK_SUFFIX, CellLock
    from bench.runner import Console, load_data, run_cell
    from bench.store import Store

    _prepare(job)
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
            status, detail = run_cell(cell, _DATA[cell.dataset.name], cd, torch.device(job.device), console)
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


def _pool_worker(conn, device: str | None, threads: int) -> None:
    """A pool worker: run each job received on ``conn`` and send its outcome back, until
    ``None`` comes (its device: ``device``, e.g. ``"cuda:1"``; None: the job's own)."""
    global _DEVICE
    _DEVICE = device
    if threads:
        import torch

        torch.set_num_threads(threads)
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
    (:mod:`bench.lock`) and is broken here.  A cell its worker completed before dying
    stays complete."""
    from bench.lock import LOCK_SUFFIX, CellLock
    from bench.store import Store

    cell = job.cell
    store = Store(Path(job.store_root))
    cd = store.cell(cell.key)
    with CellLock(store.root / f"{cell.key}{LOCK_SUFFIX}") as held:
        if held and cd.condition()[0] == "complete":
            return Outcome(cell.key, cell.label, "complete", f"stored already ({reason})", 0.0)
        if held:  # its record so far, else (it died before it began the cell) who the cell is
            info = cd.read_cell() or {"key": cell.key, "dataset": cell.dataset.name, "method": cell.method.name,
                                      "seed": cell.seed, "config": cell.config}
            cd.mark_failed(info, reason)
    return Outcome(cell.key, cell.label, "failed", f"{reason}; the next run retries it", 0.0)


def pool(jobs: list[Job], workers: int, devices: list[str] | None):
    """Yield each job's :class:`Outcome` as it finishes, from ``workers`` spawned processes
    (``devices``: one entry per worker, e.g. ``["cuda:0", "cuda:0", "cuda:1", "cuda:1"]``).

    Each worker runs one job at a time.  A worker that dies (the OOM killer, a segfault)
    fails only the cell it was running, with its signal named (:func:`_record_death`); a
    fresh worker on the same device takes the next job, and the other workers go on."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    slots = list(devices) if devices else [None] * workers
    threads = max(1, (os.cpu_count() or 1) // len(slots))
    todo = list(reversed(jobs))
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
        for process, _, _ in busy.values():  # stopped early (an error or ^C in this process)
            process.terminate()
        for process in started:
            process.join(timeout=60)
            if process.is_alive():  # hung on its way out
                process.kill()
                process.join()


def require_executor(kind: str) -> None:
    """Refuse, before any work, an executor this machine cannot run (a ConfigError): slurm
    and submitit-local need submitit, slurm also SLURM's ``sbatch`` and ``srun`` on PATH."""
    from bench.errors import ConfigError

    if kind not in ("slurm", "submitit-local"):
        return
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise ConfigError(f"--executor {kind} needs submitit: pip install submitit==1.5.4") from None
    missing = [tool for tool in ("sbatch", "srun") if kind == "slurm" and shutil.which(tool) is None]
    if missing:
        raise ConfigError(f"--executor slurm: no {' or '.join(missing)} on PATH, so no SLURM here; run on a "
                          "SLURM login node, or use --executor processes (or submitit-local) on this machine")


def submitit_executor(folder: Path, kind: str, slurm: SlurmOptions):
    """A submitit executor writing its scripts and logs under ``folder``."""
    require_executor(kind)
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
