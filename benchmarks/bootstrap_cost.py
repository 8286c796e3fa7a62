"""Cost of the paired bootstrap in ``bench.analysis.bootstrap``: B resamples of one evaluation split.

Times ``boot_metric`` for every default classification metric on a 10,000-sample,
10-class split and ``boot_ood_metric`` for every default OOD metric on 10,000 ID vs 10,000
OOD scores, B = 1,000 resamples each (the requirement: well under 1 s per metric), plus the
seeded resample generation.  Predictions are synthetic (float32 log-probabilities of a
~85%-accurate classifier, read back as float64 probabilities as ``bench.analysis`` does);
every timing is checked against the plain metric on a few explicitly resampled arrays.
Prints a Markdown table and writes it, with the command, the machine and the library
versions, to ``reports/perf/bootstrap.md``.

    nice -n 10 .venv/bin/python benchmarks/bootstrap_cost.py [--n 10000] [--resamples 1000]

One process on one core: BLAS thread pools are pinned to 1 before numpy loads.  The table
gives process CPU seconds (robust on a shared machine) and wall seconds, each the best of
``--repeats`` runs.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core, before numpy loads its BLAS

import numpy as np  # noqa: E402

from bench.analysis import bootstrap  # noqa: E402
from bench.metrics import get_metric, selection  # noqa: E402
from bench.core.registry import METRICS  # noqa: E402
from machine import cpu_model  # noqa: E402

SPOT_CHECKS = 3  # resamples compared with the plain metric on explicitly resampled arrays


def synthetic_probs(n: int, n_classes: int, signal: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities [n, C] (float64 from float32 log-probs) and labels [n] of a noisy classifier."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, n)
    logits = rng.normal(scale=1.5, size=(n, n_classes))
    logits[np.arange(n), labels] += signal
    log_probs = (logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))).astype(np.float32)
    return np.exp(log_probs.astype(np.float64)), labels




def command_line() -> str:
    """This run's command line, with its ``nice`` level and the interpreter as invoked."""
    exe = Path(sys.executable)
    try:
        exe = exe.relative_to(ROOT)
    except ValueError:
        exe = Path(exe.name)
    niceness = os.nice(0)
    return ("nice -n %d " % niceness if niceness else "") + shlex.join([str(exe)] + sys.argv)


def best_of(repeats: int, fn) -> tuple[float, float, object]:
    """(best CPU seconds, best wall seconds, last result) over ``repeats`` calls."""
    cpu, wall, out = [], [], None
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return min(cpu), min(wall), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000, help="samples per split (ID test and OOD)")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--resamples", type=int, default=bootstrap.DEFAULT_RESAMPLES)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per metric (best is reported)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "perf" / "bootstrap.md")
    args = ap.parse_args()
    n, b = args.n, args.resamples

    probs, labels = synthetic_probs(n, args.classes, signal=4.0, seed=0)
    ood_probs, _ = synthetic_probs(n, args.classes, signal=0.0, seed=1)
    s_id, s_ood = probs.max(axis=1), ood_probs.max(axis=1)

    gen_cpu, gen_wall, w = best_of(args.repeats, lambda: bootstrap.resample_weights(n, b, seed=0))
    w_ood = bootstrap.resample_weights(n, b, seed=1)
    idx, idx_ood = bootstrap.index_matrix(n, SPOT_CHECKS, seed=0), bootstrap.index_matrix(n, SPOT_CHECKS, seed=1)
    assert np.array_equal(bootstrap.weights_from_index(idx, n), w[:SPOT_CHECKS])

    rows = []  # (metric, cpu, wall, full-split value, CI low, CI high, spot-check max |diff|)
    for name in selection("paper"):
        if get_metric(name).on_scores:
            cpu, wall, values = best_of(args.repeats, lambda: bootstrap.boot_ood_metric(name, s_id, s_ood, w, w_ood))
            full = METRICS.get(name)(s_id, s_ood)
            ref = [METRICS.get(name)(s_id[i], s_ood[j]) for i, j in zip(idx, idx_ood)]
        else:
            cpu, wall, values = best_of(args.repeats, lambda: bootstrap.boot_metric(name, probs, labels, w))
            full = METRICS.get(name)(probs, labels)
            ref = [METRICS.get(name)(probs[i], labels[i]) for i in idx]
        err = float(np.max(np.abs(np.asarray(values[:SPOT_CHECKS]) - ref)))
        low, high = bootstrap.bootstrap_ci(values)
        rows.append((name, cpu, wall, full, low, high, err))
        print(f"{name:22s} cpu {cpu:6.3f} s  wall {wall:6.3f} s  spot-check |diff| {err:.1e}", flush=True)

    accuracy = METRICS.get("accuracy")(probs, labels)
    lines = [
        "# Paired bootstrap cost",
        "",
        f"`bench.analysis.bootstrap` with B = {b:,} resamples of one split: every default classification metric on "
        f"N = {n:,} samples x {args.classes} classes (synthetic float32 log-probabilities, accuracy "
        f"{accuracy:.3f}), every default OOD metric on {n:,} ID vs {n:,} OOD MSP scores (ID and OOD "
        "resampled independently).  Seconds for all B resamples of one metric, best of "
        f"{args.repeats} runs: process CPU time (one core, BLAS pinned to 1 thread) and wall time "
        "(which on a shared machine also counts waiting for the CPU).  Target: well under 1 s per "
        f"metric.  The last column compares the first {SPOT_CHECKS} resamples with the plain metric "
        "on the explicitly resampled arrays.",
        "",
        f"Resample generation (`resample_weights({n:,}, {b:,})`, one [B, N] count matrix): "
        f"{gen_cpu:.3f} s CPU, {gen_wall:.3f} s wall; made once per split and shared by every method and seed.",
        "",
        "| metric | CPU s | wall s | ms per resample | full-split value | 95% CI | spot-check max abs diff |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, cpu, wall, full, low, high, err in rows:
        lines.append(
            f"| {name} | {cpu:.3f} | {wall:.3f} | {1000 * cpu / b:.3f} | {full:.4f} | "
            f"[{low:.4f}, {high:.4f}] | {err:.1e} |"
        )
    slowest = max(rows, key=lambda r: r[1])
    lines += [
        f"| **all {len(rows)} metrics** | **{sum(r[1] for r in rows):.3f}** | {sum(r[2] for r in rows):.3f} | | | | |",
        "",
        f"Slowest metric: {slowest[0]}, {slowest[1]:.3f} s CPU for {b:,} resamples.",
        "",
        "## Run",
        "",
        f"- command: `{command_line()}` (from the repository root)",
        f"- date (UTC): {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M')}",
        f"- machine: {os.cpu_count()} logical CPUs (nproc), {cpu_model()}, {platform.machine()}",
        f"- Python {platform.python_version()}, numpy {np.__version__}",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
