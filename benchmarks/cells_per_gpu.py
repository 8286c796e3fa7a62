"""Cells per hour on one GPU with ``--executor processes --cells-per-gpu K``.

For each K of ``--k`` (default ``1,2,4,8``) this script runs ``run_suite.py`` as a
subprocess on a suite it writes (``cells_per_gpu.toml`` in its work folder), into a fresh
store, and times it:

* the suite: data set ``cifar10`` on a data root of synthetic CIFAR-10 files
  (``benchmarks/synthetic_cifar.py``, written into the work folder at ``--train`` /
  ``--test`` images, default the official 50,000 / 10,000; or ``--data DIR``, any
  ``--data-root`` holding ``cifar-10-batches-py/``), method ``msp`` only, the
  ``vit_cifar_paper`` backbone (``--dim``, ``--depth``, ``--heads``, ``--patch-size``,
  ``--mlp-ratio`` shrink it for smoke tests), the ``[train]`` table of the built-in
  ``cifar10`` suite with ``--epochs E`` (default 2; the warm-up is shortened to fit, as
  ``run_suite.py --epochs`` does), ``--cells N`` cells = seeds 0..N-1 (default 8), and only
  the ``test`` split evaluated (``--all-splits``: the cifar10 suite's 75 corruption splits
  and its OOD sets too);
* the command: ``run_suite.py --suite <that file> --data-root DATA --epochs E --executor
  processes --results <fresh> --reports <fresh> --format csv`` with ``--device cuda
  --cells-per-gpu K`` on CUDA (workers = visible GPUs x K), or ``--device cpu --workers K``
  on a CPU (a smoke run: its numbers are CPU numbers and the report says so);
* the measurement: the subprocess's wall clock minus its report stage (the ``report: ...
  s)`` line ``run_suite.py`` prints), so data loading, the preflight checks, the worker
  start-up and every cell are in it; cells/hour = complete cells / that wall x 3600; the
  mean train and predict seconds per cell and the largest peak memory per cell come from
  each cell's ``cell.json`` (``train_seconds``, ``predict_seconds``, ``peak_memory_mb``:
  CUDA's peak allocation on a GPU, the process's resident high-water mark on a CPU);
  speed-up = cells/hour over that of the smallest K.

Before the timed runs (on CUDA, or with ``--all-splits``; ``--no-warmup`` skips it), one
untimed cell (seed 0, one epoch) runs into its own store, so torch.compile's on-disk cache
and the generated corruption cache are warm for every K alike.

Usage (repository root)::

    python3 benchmarks/cells_per_gpu.py [--k 1,2,4,8] [--cells 8] [--epochs 2] [--data DIR]
        [--all-splits] [--run-timeout S] [--out reports/perf/cells_per_gpu.md]

The Markdown report goes to ``--out`` (rewritten after each K, so a run cut short keeps the
K values it finished) or stdout; progress goes to stderr; ``--work DIR`` keeps the data,
suite, stores and run logs (default: a temporary folder, deleted at the end).  Exit status
1 when a run failed or left a cell incomplete (the report names it), else 0.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from bench.store import DAMAGED_MARK, TRAIN_LOG, CellDir, CellRecord  # noqa: E402
from machine import cpu_model, run_section  # noqa: E402
from synthetic_cifar import write_synthetic  # noqa: E402

PRESET = "vit_cifar_paper"
METHOD = "msp"
SUITE_NAME = "cells_per_gpu"
REPORT_LINE = re.compile(r"^report: .*; ([0-9.]+) s\)\s*$", re.MULTILINE)


# --------------------------------------------------------------------------- the suite


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"cannot write {value!r} to TOML")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def suite_text(args: argparse.Namespace) -> str:
    """The suite file: the built-in cifar10 suite's ``[train]`` (and, with ``--all-splits``,
    its split list), the paper preset with the shrinking flags on top, msp, N seeds."""
    with open(ROOT / "bench" / "suites" / "cifar10.toml", "rb") as f:
        cifar10 = tomllib.load(f)
    train = dict(cifar10["train"])
    if args.batch_size is not None:
        train["batch_size"] = args.batch_size
    train["compile"] = {"auto": "auto", "on": True, "off": False}[args.compile]
    model = {"preset": PRESET}
    for key in ("dim", "depth", "heads", "patch_size", "mlp_ratio"):
        if getattr(args, key) is not None:
            model[key] = getattr(args, key)
    splits = cifar10["datasets"]["cifar10"]["splits"] if args.all_splits else ["test"]
    lines = [
        "# Written by benchmarks/cells_per_gpu.py: msp on the paper ViT, one cell per seed.",
        f"description = {_toml(f'cells per GPU: {METHOD} on {PRESET}, {args.cells} seeds')}",
        f"seeds = {_toml(list(range(args.cells)))}",
        "",
        "[train]   # the built-in cifar10 suite's (epochs come from --epochs)",
        *(f"{k} = {_toml(v)}" for k, v in train.items()),
        "",
        "[model]",
        *(f"{k} = {_toml(v)}" for k, v in model.items()),
        "",
        "[datasets.cifar10]",
        f"splits = {_toml(splits)}",
        "",
        f"[methods.{METHOD}]",
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class StoredCell:
    """A complete cell of a store: its ``cell.json`` and, when read, its ``train_log.csv``
    rows (one dict per epoch, the CSV's own column names)."""

    record: CellRecord
    log: list[dict] = field(default_factory=list)


@dataclass
class Run:
    k: int
    workers: int
    wall_s: float = float("nan")  # the subprocess, report stage excluded
    total_s: float = float("nan")  # the subprocess, all of it
    report_s: float = float("nan")
    rc: int | None = None
    timed_out: bool = False
    cells: list[StoredCell] = field(default_factory=list)  # each complete cell
    problems: list[str] = field(default_factory=list)  # cells not complete: "<key>: <state> (<reason>)"
    log: str = ""

    @property
    def cells_per_hour(self) -> float:
        return len(self.cells) / self.wall_s * 3600 if self.cells and self.wall_s > 0 else float("nan")

    def peak(self) -> float:
        vals = [float(c.record.peak_memory_mb) for c in self.cells if c.record.peak_memory_mb is not None]
        return max(vals) if vals else float("nan")


def _mean(values: list[float | None]) -> float:
    """The mean of the recorded ``values`` (one per cell, None where unrecorded); NaN for none."""
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else float("nan")


def read_store(store: Path, logs: bool = False) -> tuple[list[StoredCell], list[str]]:
    """Every complete cell of a store (``logs``: with its ``train_log.csv`` rows), and one
    line per other cell."""
    import csv

    done, problems = [], []
    if not store.is_dir():
        return done, [f"{store}: no store (the run stopped before any cell)"]
    for path in sorted(p for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if DAMAGED_MARK in path.name:
            continue
        cd = CellDir(path)
        state, reason = cd.condition()
        if state == "complete":
            log = path / TRAIN_LOG
            rows = list(csv.DictReader(log.open())) if logs and log.is_file() else []
            done.append(StoredCell(cd.read_cell() or CellRecord(), rows))
        else:
            problems.append(f"{path.name}: {state}" + (f" ({reason})" if reason else ""))
    return done, problems


def _kill(proc: subprocess.Popen) -> int:
    """Kill the runner and its pool workers (one session of their own); its exit status."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.wait()


def run_suite(args: argparse.Namespace, work: Path, data: Path, suite: Path, k: int, tag: str, *,
              seeds: str | None = None, epochs: int | None = None) -> Run:
    """``run_suite.py`` on ``suite`` with K cells per GPU (K CPU workers), into fresh folders."""
    results, reports, log_path = work / f"results_{tag}", work / f"reports_{tag}", work / f"run_{tag}.log"
    cmd = [sys.executable, str(ROOT / "run_suite.py"), "--suite", str(suite), "--data-root", str(data),
           "--epochs", str(epochs or args.epochs), "--executor", "processes", "--results", str(results),
           "--reports", str(reports), "--format", "csv", "--device", args.device,
           "--name", SUITE_NAME]  # the run's folders are <results>/SUITE_NAME, whatever --epochs and --seeds
    if seeds is not None:
        cmd += ["--seeds", seeds]
    cmd += ["--cells-per-gpu", str(k)] if args.device == "cuda" else ["--workers", str(k)]
    workers = k * max(1, args.gpus) if args.device == "cuda" else k
    run = Run(k, workers)
    print(f"[cells_per_gpu] {tag}: {shlex.join(cmd[1:])}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            run.rc = proc.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            run.timed_out = True
            run.rc = _kill(proc)
        finally:  # this script interrupted or terminated: never leave the runner training on
            if proc.poll() is None:
                _kill(proc)
    run.total_s = time.perf_counter() - t0
    run.log = log_path.read_text(errors="replace")
    reported = REPORT_LINE.findall(run.log)
    run.report_s = float(reported[-1]) if reported else 0.0
    run.wall_s = run.total_s - run.report_s
    run.cells, run.problems = read_store(results / SUITE_NAME)
    state = f"rc {run.rc}" + (f", killed after {args.run_timeout} s" if run.timed_out else "")
    print(f"[cells_per_gpu] {tag}: {len(run.cells)} cell(s) complete, wall {run.wall_s:.1f} s "
          f"(+ report {run.report_s:.1f} s), {state}", file=sys.stderr, flush=True)
    if run.rc not in (0, 1) and not run.timed_out:
        tail = "\n".join(run.log.splitlines()[-25:])
        print(f"[cells_per_gpu] {tag}: run_suite.py failed (exit {run.rc}); last lines of {log_path}:\n{tail}",
              file=sys.stderr, flush=True)
    return run


# --------------------------------------------------------------------------- report


def _f(value: float, fmt: str = "{:,.1f}") -> str:
    return "n/a" if value is None or not math.isfinite(value) else fmt.format(value)


def render(args: argparse.Namespace, argv: list[str], runs: list[Run], warmup: Run | None, env: dict,
           data_text: str, started: float) -> str:
    on_gpu = args.device == "cuda"
    dname = env["device_name"]
    if on_gpu:
        title = f"# Cells per GPU: {METHOD} on `{PRESET}`, `--executor processes --cells-per-gpu K` ({dname})"
        unit = "cells per GPU"
    else:
        title = (f"# Cells per CPU worker: {METHOD} on `{PRESET}`, `--executor processes --workers K` "
                 f"(CPU smoke run, not a GPU measurement)")
        unit = "CPU workers"
    shrunk = {k: getattr(args, k) for k in ("dim", "depth", "heads", "patch_size", "mlp_ratio") if getattr(args, k) is not None}
    model = f"`{PRESET}`" + (f" shrunk to {', '.join(f'{k} {v}' for k, v in shrunk.items())}" if shrunk else "")
    splits = ("every split of the built-in cifar10 suite (test, 75 corruption splits, OOD)" if args.all_splits
              else "the test split only (plus each epoch's validation)")
    L = [title, ""]
    if not on_gpu:
        L += ["**Smoke run on a CPU**: every number below is a CPU number (K = worker processes sharing the "
              "cores), made to check the script, not to size a GPU.", ""]
    L += [
        f"{args.cells} cells ({METHOD}, seeds 0..{args.cells - 1}) of {model}, {args.epochs} epoch(s) each with the "
        f"built-in cifar10 suite's `[train]` recipe (compile `{args.compile}`), on {data_text}; evaluated on "
        f"{splits}. For each K a fresh store and one `run_suite.py` subprocess "
        f"({'workers = ' + str(max(1, args.gpus)) + ' GPU(s) x K' if on_gpu else 'K workers'}). "
        "Wall = the subprocess's wall clock without its report stage (data loading, preflight, worker start-up and "
        "every cell are in it); cells/hour = complete cells / wall x 3600; train and predict seconds are the means "
        "of the cells' `cell.json`; peak memory is the largest cell's "
        + ("CUDA peak allocation" if on_gpu else "resident high-water mark") + ".",
        "",
    ]
    if warmup is not None:
        L += [f"Untimed warm-up before the runs (one cell, one epoch; torch.compile and corruption caches): "
              f"{_f(warmup.total_s)} s, {len(warmup.cells)} cell complete.", ""]
    base = next((r for r in sorted(runs, key=lambda r: r.k) if math.isfinite(r.cells_per_hour)), None)
    head = ["K (" + unit + ")", "workers", "cells complete", "wall (s)", "cells / hour", "mean train s / cell",
            "mean predict s / cell", "peak memory / cell (MB)", f"speed-up vs K={base.k if base else '?'}"]
    L += ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in runs:
        speed = r.cells_per_hour / base.cells_per_hour if base is not None else float("nan")
        done = f"{len(r.cells)}/{args.cells}" + (" (cut off)" if r.timed_out else "")
        L.append("| " + " | ".join([str(r.k), str(r.workers), done, _f(r.wall_s), _f(r.cells_per_hour),
                                    _f(_mean([c.record.train_seconds for c in r.cells]), "{:,.2f}"),
                                    _f(_mean([c.record.predict_seconds for c in r.cells]), "{:,.2f}"),
                                    _f(r.peak(), "{:,.0f}"), _f(speed, "{:.2f}x")]) + " |")
    compiles = sorted({str(c.record.compile) for r in runs for c in r.cells})
    L += ["", f"- torch.compile per cell (`cell.json` `compile`): {', '.join(compiles) or 'n/a'}"]
    L += [f"- K={r.k}: report stage {_f(r.report_s)} s (not in the wall), run_suite.py exit {r.rc}"
          + (f", killed at --run-timeout {args.run_timeout} s" if r.timed_out else "") for r in runs]
    for r in runs:
        for p in r.problems[:5]:
            L.append(f"- K={r.k}: not complete: {p}")
    L += run_section("cells_per_gpu.py", argv, f"{dname} (`{args.device}`)", time.perf_counter() - started, on_gpu)
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    from bench.run.flags import int_at_least, positive_int_list

    _positive = int_at_least(1)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=positive_int_list(distinct=True), default=[1, 2, 4, 8], help="cells per GPU to time (default 1,2,4,8)")
    ap.add_argument("--cells", type=_positive, default=8, help="cells per run = seeds 0..N-1 (default 8)")
    ap.add_argument("--epochs", type=_positive, default=2, help="epochs per cell (default 2)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="cuda: --cells-per-gpu K; cpu: --workers K, a smoke run (default: cuda when present)")
    ap.add_argument("--data", type=Path, default=None,
                    help="a data root holding cifar-10-batches-py/ (default: synthetic files written into the work folder)")
    ap.add_argument("--train", type=_positive, default=50_000, help="synthetic training images (default 50000)")
    ap.add_argument("--test", type=_positive, default=10_000, help="synthetic test images (default 10000)")
    ap.add_argument("--all-splits", action="store_true",
                    help="evaluate every split of the cifar10 suite (corruptions, OOD), not just test")
    ap.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                    help="[train] compile of the cells (default auto: on CUDA)")
    ap.add_argument("--batch-size", type=_positive, default=None, help="replace the suite's batch size (128)")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                    help="one untimed cell first (default: on CUDA or with --all-splits)")
    ap.add_argument("--run-timeout", type=_positive, default=None,
                    help="kill a run_suite.py run after this many seconds (its complete cells still count)")
    ap.add_argument("--work", type=Path, default=None, help="keep data, suite, stores and logs here (default: temporary)")
    ap.add_argument("--out", type=Path, default=None, help="Markdown report file (default: stdout)")
    for flag in ("dim", "depth", "heads", "patch-size"):
        ap.add_argument(f"--{flag}", type=_positive, default=None, help=f"replace the preset's {flag} (smoke tests)")
    ap.add_argument("--mlp-ratio", type=float, default=None, help="replace the preset's MLP ratio (smoke tests)")
    return ap.parse_args(argv)


def environment(args: argparse.Namespace) -> dict:
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device")
    args.gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    if args.device == "cuda":
        names = sorted({torch.cuda.get_device_name(i) for i in range(args.gpus)})
        name = f"{args.gpus} x {', '.join(names)}" if args.gpus > 1 else names[0]
    else:
        name = f"CPU: {cpu_model()}, {os.cpu_count()} cores"
    return {"device_name": name}


def measure(args: argparse.Namespace, argv: list[str], work: Path) -> tuple[str, bool]:
    """Run every K; the report and whether every run completed every cell."""
    started = time.perf_counter()
    env = environment(args)
    if args.data is not None:
        data, data_text = args.data.resolve(), f"the data root `{args.data}`"
    else:
        data = work / "data"
        print(f"[cells_per_gpu] writing synthetic CIFAR-10 ({args.train} train, {args.test} test) to {data}",
              file=sys.stderr, flush=True)
        write_synthetic(data, train=args.train, test=args.test, classes=(10, 100) if args.all_splits else (10,),
                        svhn=args.test if args.all_splits else 0, seed=0)
        data_text = (f"synthetic CIFAR-10 (`benchmarks/synthetic_cifar.py`: {args.train:,} training images, "
                     f"of which 10% are held out for validation, and {args.test:,} test images)")
    suite = work / f"{SUITE_NAME}.toml"
    suite.write_text(suite_text(args))
    warmup = None
    if args.warmup or (args.warmup is None and (args.device == "cuda" or args.all_splits)):
        warmup = run_suite(args, work, data, suite, 1, "warmup", seeds="0", epochs=1)
    runs: list[Run] = []
    report = ""
    for k in args.k:
        runs.append(run_suite(args, work, data, suite, k, f"k{k}"))
        report = render(args, argv, runs, warmup, env, data_text, started)
        if args.out is not None:  # after each K: a run cut short keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(report)
    return report, all(r.rc == 0 and len(r.cells) == args.cells for r in runs)


def run(argv: list[str] | None = None) -> tuple[str, bool]:
    """Measure every K and write the Markdown report to ``--out`` (or stdout); returns it and
    whether every run completed every cell."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:  # `timeout` sends SIGTERM: exit through the finally clauses, which stop the runner too
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        if args.work is not None:
            args.work.mkdir(parents=True, exist_ok=True)
            report, ok = measure(args, argv, args.work.resolve())
        else:
            with tempfile.TemporaryDirectory(prefix="cells_per_gpu.") as tmp:
                report, ok = measure(args, argv, Path(tmp))
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    if args.out is None:
        sys.stdout.write(report)
    else:
        print(f"wrote {args.out}", file=sys.stderr)
    return report, ok


def main(argv: list[str] | None = None) -> str:
    """:func:`run`'s report."""
    return run(argv)[0]


if __name__ == "__main__":
    sys.exit(0 if run()[1] else 1)  # 1: a run failed or left a cell incomplete (the report says which)
