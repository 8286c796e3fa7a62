"""Forward+backward time and peak memory of one attention layer vs sequence length.

Layers: ``softmax`` (bench.vit), ``sgpa`` (methods/sgpa.py, decoupled, diagonal
covariance), ``kep_svgp`` (methods/kep_svgp.py, add merge) and the attention variants
(``symmetric``, ``pap`` with one ADMM iteration, ``scaled`` with S in R^{H x N x N},
``kdeformer`` with buckets of 64 and 64 residual samples, ``optimised``, ``efficient``,
``super``) and ``rff_gp`` (methods/rff_gp_attention.py, 16 cos/sin feature pairs per
head) at N = 64, 256, 1024, 4096 tokens, on whatever device is present (CUDA if available,
else CPU).  Each (layer, N) runs in a fresh subprocess so the peak memory is that
configuration's alone: CUDA peak allocated memory, or on CPU the process's peak RSS above
its RSS just before the first forward.  The scaling exponent is the least-squares slope of log(time) and log(memory)
against log(N) over the two largest N (the asymptotic regime) and over all N.

Usage (repository root)::

    .venv/bin/python benchmarks/attention_cost.py [--out reports/perf/attention_cost.md] [--layers rff_gp,softmax]

``--layers`` measures only the named layers (the table then has only their rows).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from machine import provenance  # noqa: E402  (benchmarks/machine.py)

LAYERS = ("softmax", "sgpa", "kep_svgp", "symmetric", "pap", "scaled", "kdeformer", "optimised", "efficient", "super",
          "rff_gp")
OPTIONS = {  # non-default layer options (KDEformer: the official ViT module's bucket and sample sizes)
    "pap": {"iters_train": 1},
    "kdeformer": {"bucket_size": 64, "samples": 64, "projections": 7},
}
TOKENS = (64, 256, 1024, 4096)
DIM, HEADS, BATCH = 64, 4, 2
REPEATS = 9
WARMUP = 3


def measure(layer: str, n: int) -> dict:
    """Runs in the child process: build the layer, time REPEATS forward+backward passes."""
    import resource

    import torch

    import methods  # noqa: F401  (registers sgpa, kep_svgp)
    from bench.method import extra_losses
    from bench.spec import ModelConfig
    from bench.vit import make_attention

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    cfg = ModelConfig(dim=DIM, depth=1, heads=HEADS, dropout=0.0)
    module = make_attention(cfg, n, (layer, OPTIONS.get(layer, {}))).to(device).train()  # as the backbone builds it
    x = torch.randn(BATCH, n, DIM, device=device, requires_grad=True)

    def step() -> None:
        out = module(x)
        loss = out.float().square().mean()
        for term in extra_losses(module):
            loss = loss + term
        loss.backward()

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    for _ in range(WARMUP):  # first calls pay one-off costs (allocator, kernels, thread pool)
        step()
    sync()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        peak_mb = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    else:
        peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return {"layer": layer, "n": n, "device": str(device), "seconds": sorted(times)[len(times) // 2],
            "peak_mb": max(peak_mb, 0.0), "torch": torch.__version__, "threads": torch.get_num_threads()}


def slope(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-12)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/perf/attention_cost.md"))
    parser.add_argument("--layers", default=",".join(LAYERS), help="comma-separated layers to measure (default: all)")
    parser.add_argument("--child", nargs=2, metavar=("LAYER", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    layers = [name for name in args.layers.split(",") if name]
    if unknown := [name for name in layers if name not in LAYERS]:
        parser.error(f"unknown layers {unknown}; known: {', '.join(LAYERS)}")
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]))))
        return
    root = Path(__file__).resolve().parents[1]
    rows = []
    for layer in layers:
        for n in TOKENS:
            out = subprocess.run([sys.executable, __file__, "--child", layer, str(n)], cwd=root,
                                 capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)})
            if out.returncode != 0:
                raise SystemExit(f"{layer} N={n} failed:\n{out.stderr}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{layer:9s} N={n:5d}: {rows[-1]['seconds'] * 1000:9.2f} ms  {rows[-1]['peak_mb']:9.1f} MiB", flush=True)

    lines = [
        "# Attention cost: one layer, forward + backward",
        "",
        f"Batch {BATCH}, width {DIM}, {HEADS} heads; median of {REPEATS} timed steps after {WARMUP} warm-up steps; "
        f"device `{rows[0]['device']}` ({rows[0]['threads']} threads), torch {rows[0]['torch']}. Peak memory: "
        + ("CUDA peak allocated above the inputs." if rows[0]["device"].startswith("cuda")
           else "peak RSS of a fresh process above its RSS before the first forward (CPU)."),
        "",
        "| layer | " + " | ".join(f"N={n} time (ms)" for n in TOKENS) + " | " + " | ".join(f"N={n} peak (MiB)" for n in TOKENS)
        + " | time exponent (largest 2 N / all N) | memory exponent (largest 2 N / all N) |",
        "|---|" + "---:|" * (2 * len(TOKENS) + 2),
    ]
    for layer in layers:
        r = [row for row in rows if row["layer"] == layer]
        t, m = [row["seconds"] for row in r], [row["peak_mb"] for row in r]
        ns = list(TOKENS)
        lines.append(
            f"| {layer} | " + " | ".join(f"{x * 1000:.2f}" for x in t) + " | " + " | ".join(f"{x:.1f}" for x in m)
            + f" | {slope(ns[-2:], t[-2:]):.2f} / {slope(ns, t):.2f} | {slope(ns[-2:], m[-2:]):.2f} / {slope(ns, m):.2f} |"
        )
    lines += [
        "",
        "An exponent near 1 means cost linear in N, near 2 quadratic.",
        "",
        *provenance("attention_cost.py"),
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
