"""Forward+backward time and peak memory of one attention layer vs sequence length.

Layers: ``softmax`` (bench.train.vit), ``sgpa`` (methods/sgpa.py, decoupled, diagonal
covariance), ``kep_svgp`` (methods/kep_svgp.py, add merge) and the attention variants
(``symmetric``, ``pap`` with one ADMM iteration, ``scaled`` with S in R^{H x N x N},
``kdeformer`` with buckets of 64 and 64 residual samples, ``optimised``, ``efficient``,
``super``) and ``rff_gp`` (methods/rff_gp_attention.py, 16 cos/sin feature pairs per
head) at N = 64, 256, 1024, 4096 tokens, on whatever device is present (CUDA if available,
else CPU).  Each (layer, N) runs in a fresh subprocess so the peak memory is that
configuration's alone: CUDA peak allocated memory, or on CPU the process's peak RSS above
its RSS just before the first forward.  The scaling exponent is the least-squares slope of log(time) and log(memory)
against log(N) over the two largest N (the asymptotic regime) and over all N.  On CUDA
one subprocess measures every (layer, N), the allocator's peak reset before each and one
untimed call first absorbing the one-off allocations (the CUDA peak needs no fresh
process, and starting 44 CUDA processes would cost minutes).

Usage (repository root)::

    .venv/bin/python benchmarks/attention_cost.py [--out reports/perf/attention_cost.md] [--layers rff_gp,softmax]
        [--tokens 64,256,1024,4096] [--repeats 9]

``--layers`` measures only the named layers (the table then has only their rows);
``--tokens`` and ``--repeats`` shrink the run (``benchmarks/gpu_acceptance.py --dry-run``).
``--out`` is rewritten after each layer, so a run cut short keeps the layers it finished.
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


def measure(layer: str, n: int, repeats: int = REPEATS) -> dict:
    """Runs in the child process: build the layer, time ``repeats`` forward+backward passes."""
    import resource

    import torch

    import methods  # noqa: F401  (registers sgpa, kep_svgp)
    from bench.train.method import extra_losses
    from bench.config.spec import ModelConfig
    from bench.train.vit import make_attention

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
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        peak_mb = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    else:
        peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return {"layer": layer, "n": n, "device": str(device), "seconds": sorted(times)[len(times) // 2],
            "peak_mb": max(peak_mb, 0.0), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU", "repeats": repeats}


def slope(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-12)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def _tokens(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--tokens takes positive integers separated by commas, e.g. 64,256; got {text!r}")
    return values


def render(rows: list[dict], layers: list[str], tokens: list[int], argv: list[str], wall_s: float) -> str:
    """The Markdown report of the rows measured so far (a layer with a missing N shows n/a)."""
    from machine import run_section

    first = rows[0]
    on_gpu = first["device"].startswith("cuda")
    lines = [
        "# Attention cost: one layer, forward + backward",
        "",
        f"Batch {BATCH}, width {DIM}, {HEADS} heads; median of {first['repeats']} timed steps after {WARMUP} warm-up "
        f"steps; device `{first['device']}` ({first['device_name'] if on_gpu else str(first['threads']) + ' threads'}), "
        f"torch {first['torch']}. Peak memory: "
        + ("CUDA peak allocated above what was allocated before the first forward (the allocator's peak reset before "
           "each (layer, N), in one process after an untimed call)." if on_gpu
           else "peak RSS of a fresh process above its RSS before the first forward (CPU)."),
        "",
        "| layer | " + " | ".join(f"N={n} time (ms)" for n in tokens) + " | " + " | ".join(f"N={n} peak (MiB)" for n in tokens)
        + " | time exponent (largest 2 N / all N) | memory exponent (largest 2 N / all N) |",
        "|---|" + "---:|" * (2 * len(tokens) + 2),
    ]
    for layer in layers:
        by_n = {row["n"]: row for row in rows if row["layer"] == layer}
        if not by_n:
            continue
        t = [by_n[n]["seconds"] * 1000 if n in by_n else None for n in tokens]
        m = [by_n[n]["peak_mb"] if n in by_n else None for n in tokens]
        ns = [n for n in tokens if n in by_n]
        tt, mm = [x for x in t if x is not None], [x for x in m if x is not None]
        exps = (f" | {slope(ns[-2:], tt[-2:]):.2f} / {slope(ns, tt):.2f} | {slope(ns[-2:], mm[-2:]):.2f} / {slope(ns, mm):.2f} |"
                if len(ns) >= 2 else " | n/a | n/a |")
        lines.append(f"| {layer} | " + " | ".join("n/a" if x is None else f"{x:.2f}" for x in t) + " | "
                     + " | ".join("n/a" if x is None else f"{x:.1f}" for x in m) + exps)
    lines += ["", "An exponent near 1 means cost linear in N, near 2 quadratic."]
    done = {row["layer"] for row in rows}
    if missing := [layer for layer in layers if layer not in done]:
        lines += ["", f"Not measured (the run stopped or failed first): {', '.join(missing)}."]
    if on_gpu:
        lines += run_section("attention_cost.py", argv, f"{first['device_name']} (`{first['device']}`)", wall_s, True)
    else:
        lines += ["", *provenance("attention_cost.py")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    import torch

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/perf/attention_cost.md"))
    parser.add_argument("--layers", default=",".join(LAYERS), help="comma-separated layers to measure (default: all)")
    parser.add_argument("--tokens", type=_tokens, default=list(TOKENS), help="token counts N (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed steps per (layer, N); the median is reported")
    parser.add_argument("--child", nargs=3, metavar=("LAYERS", "NS", "REPEATS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    layers = [name for name in args.layers.split(",") if name]
    if unknown := [name for name in layers if name not in LAYERS]:
        parser.error(f"unknown layers {unknown}; known: {', '.join(LAYERS)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.child:
        child_layers, ns, repeats = args.child[0].split(","), [int(n) for n in args.child[1].split(",")], int(args.child[2])
        if torch.cuda.is_available():  # one-off allocations (cuBLAS workspace, kernels) in an untimed first call
            measure(child_layers[0], ns[0], 1)
        for layer in child_layers:
            for n in ns:
                print(json.dumps(measure(layer, n, repeats)), flush=True)
        return
    root = Path(__file__).resolve().parents[1]
    start = time.perf_counter()
    # CPU: a fresh process per (layer, N) for its RSS peak; CUDA: one process for everything
    jobs = ([([layer], [n]) for layer in layers for n in args.tokens] if not torch.cuda.is_available()
            else [(layers, list(args.tokens))])
    rows = []

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(render(rows, layers, list(args.tokens), argv, time.perf_counter() - start))

    for job_layers, ns in jobs:
        cmd = [sys.executable, __file__, "--child", ",".join(job_layers), ",".join(map(str, ns)), str(args.repeats)]
        proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(root)})
        for line in proc.stdout:  # rows as they are measured: a run cut short keeps what it finished
            rows.append(json.loads(line))
            print(f"{rows[-1]['layer']:9s} N={rows[-1]['n']:5d}: {rows[-1]['seconds'] * 1000:9.2f} ms  "
                  f"{rows[-1]['peak_mb']:9.1f} MiB", flush=True)
            if rows[-1]["n"] == ns[-1]:
                save()
        if proc.wait() != 0:
            save()
            raise SystemExit(f"{','.join(job_layers)} N={ns} failed:\n{proc.stderr.read()}")
    save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
