"""Cost of generating the CIFAR-10-C benchmark splits with ``datasets.corruptions``.

Times ``corrupt`` for the 15 benchmark corruptions x 5 severities (75 splits) and the 4
extras (95 splits in all) on 10,000 32x32 RGB images (crops of scikit-learn's two sample
photographs at several scales: real textures, no download), prints a Markdown table and
writes it, with the command, the machine and the library versions, to
``reports/perf/corruptions.md``.

    nice -n 10 .venv/bin/python benchmarks/corruption_cost.py [--n 10000] [--out PATH]

One process on one core: BLAS thread pools are pinned to 1 before numpy loads.  The
table gives process CPU seconds (what one core spends; robust on a shared machine) and, per
corruption, the wall time too.
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
import PIL  # noqa: E402
import scipy  # noqa: E402
from PIL import Image  # noqa: E402

from bench.data import BENCHMARK_CORRUPTIONS, CORRUPTIONS, SEVERITIES  # noqa: E402
from datasets.corruptions import VERSION, corrupt  # noqa: E402
from machine import cpu_model  # noqa: E402


def sample_crops(n: int, side: int = 32, seed: int = 0) -> np.ndarray:
    """``n`` random side x side crops of the sklearn sample photos, each photo first
    downscaled by 2, 4 or 8 (BOX) so crops hold CIFAR-like amounts of detail."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    pyramids = []
    for photo in load_sample_images().images:
        im = Image.fromarray(photo)
        for f in (2, 4, 8):
            pyramids.append(np.asarray(im.resize((im.width // f, im.height // f), Image.Resampling.BOX)))
    which = rng.integers(0, len(pyramids), size=n)
    out = np.empty((n, side, side, 3), np.uint8)
    for i, k in enumerate(which):
        p = pyramids[k]
        r, c = rng.integers(0, p.shape[0] - side + 1), rng.integers(0, p.shape[1] - side + 1)
        out[i] = p[r:r + side, c:c + side]
    return out




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000, help="number of 32x32 RGB images")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "perf" / "corruptions.md")
    args = ap.parse_args()

    images = sample_crops(args.n)
    corrupt(images[:8], "gaussian_noise", 1)  # import-time work out of the first timing
    rows = []  # (name, CPU seconds per severity, wall seconds for the 5 severities)
    for name in CORRUPTIONS:
        cpu, wall0 = [], time.perf_counter()
        for sev in SEVERITIES:
            t0 = time.process_time()
            out = corrupt(images, name, sev, seed=0)
            cpu.append(time.process_time() - t0)
            assert out.shape == images.shape and out.dtype == np.uint8
        rows.append((name, cpu, time.perf_counter() - wall0))
        print(f"{name:18s} " + " ".join(f"{t:6.2f}" for t in cpu) + f"  cpu {sum(cpu):7.2f} s  wall {rows[-1][2]:7.2f} s",
              flush=True)
    bench = [r for r in rows if r[0] in BENCHMARK_CORRUPTIONS]
    n_bench, n_all = len(bench) * len(SEVERITIES), len(rows) * len(SEVERITIES)
    bench_cpu, bench_wall = sum(sum(r[1]) for r in bench), sum(r[2] for r in bench)
    all_cpu, all_wall = sum(sum(r[1]) for r in rows), sum(r[2] for r in rows)

    blank = " |" * len(SEVERITIES)
    lines = ["| corruption | " + " | ".join(f"sev {s}" for s in SEVERITIES) + " | 5 severities, CPU | wall |",
             "|---|" + "---:|" * (len(SEVERITIES) + 2)]
    for name, cpu, wall in rows:
        label = name if name in BENCHMARK_CORRUPTIONS else f"{name} (extra)"
        lines.append(f"| {label} | " + " | ".join(f"{t:.2f}" for t in cpu) + f" | {sum(cpu):.2f} | {wall:.2f} |")
    lines.append(f"| **CIFAR-10-C benchmark: {len(bench)} corruptions, {n_bench} splits** |{blank}"
                 f" **{bench_cpu:.2f}** | {bench_wall:.2f} |")
    lines.append(f"| all {len(rows)} corruptions, {n_all} splits |{blank} {all_cpu:.2f} | {all_wall:.2f} |")
    table = "\n".join(lines)

    python = Path(sys.executable)
    python = python.relative_to(ROOT) if python.is_relative_to(ROOT) else python
    niceness = os.nice(0)
    cmd = (f"nice -n {niceness} " if niceness else "") + " ".join(
        shlex.quote(str(a)) for a in [python, Path(sys.argv[0]).resolve().relative_to(ROOT), *sys.argv[1:]])
    report = f"""# Corruption engine cost

Process CPU seconds (one core: BLAS pinned to 1 thread) for `datasets.corruptions.corrupt`
(engine version {VERSION}) on {args.n:,} RGB images of 32x32 (random crops of scikit-learn's
sample photos), one call per (corruption, severity), seed 0; the last column is the wall time
of the 5 calls, which on a shared machine also counts time spent waiting for the CPU.
One-time set-up (Poisson tables, frost textures, zoom operators) is included.

{table}

- command: `{cmd}` (from the repository root)
- machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu_model()}; shared with other work
- python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}, Pillow {PIL.__version__}
- date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}
"""
    print()
    print(table)
    print(f"\nbenchmark ({n_bench} splits): CPU {bench_cpu:.1f} s, wall {bench_wall:.1f} s; "
          f"all {n_all} splits: CPU {all_cpu:.1f} s, wall {all_wall:.1f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
