"""Cost of Monte-Carlo prediction, whole passes against passes that share the trunk, and of
an SGPA training step with and without flushing denormal floats.

Prediction: for every trained method of the ``default`` suite (its backbone, 28x28 images)
and for msp, mc_dropout and kep_svgp on the KEP-SVGP paper backbone (``vit_cifar_paper``:
7 blocks, width 384, the GP in the last block; 32x32x3 images), the CPU seconds per image
of a prediction batch with each method's S passes: *whole* = S forwards of the whole model
(no block shared between the passes), *shared* = ``bench.train.loop.passes`` (the
blocks before the first that draws noise once, the rest S times), on the same model and
inputs, and the ratio whole / shared.  Their logits are compared too (the same seed must
give the same numbers).

Training: one SGPA training step (forward, loss with its KL, backward, AdamW) on the official
CIFAR settings of the ``cifar10`` suite (5 blocks, width 128, SGPA in every block), with
``torch.set_flush_denormal`` off and on.

    nice -n 10 .venv/bin/python benchmarks/predict_cost.py [--batch 128] [--repeats 4]

writes ``reports/perf/predict_cost.md``.  One thread (BLAS and torch pinned to 1), process
CPU seconds, the best of ``--repeats`` alternating rounds; inputs are seeded random images (prediction cost
does not depend on content).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import datasets  # noqa: E402,F401  (registers the data sets the suites name)
import methods  # noqa: E402,F401  (registers the methods and attention layers)
from bench.data import DataBundle, Split  # noqa: E402
from bench.core.registry import METHODS  # noqa: E402
from bench.config.spec import build_suite, load_suite  # noqa: E402
from bench.train.loop import Normalize, make_optimizer, passes, seed_everything, to_tensor  # noqa: E402
from machine import provenance  # noqa: E402


def images(shape: tuple[int, int, int], n: int, seed: int = 0) -> DataBundle:
    """A 10-class bundle of ``n`` seeded random uint8 images of ``shape`` (H, W, C)."""
    rng = np.random.default_rng(seed)
    split = Split(rng.integers(0, 256, (n, *shape), dtype=np.uint8), rng.integers(0, 10, n).astype(np.int64))
    return DataBundle("random", 10, shape, (0.5,) * shape[2], (0.25,) * shape[2],
                      {"train": lambda: split, "val": lambda: split, "test": lambda: split})


ROUND_SECONDS = 0.5  # a timed round repeats a call this long at least (short calls vary by 15% here)


def best(repeats: int, *fns) -> list[tuple[float, object]]:
    """(best process CPU seconds per call, last result) of each of ``fns`` over ``repeats``
    rounds.  Each is called once untimed first, which also sets how many calls a round
    makes (the same for every fn: enough for ``ROUND_SECONDS`` of the slowest first call's
    pace, so that a round of a millisecond call is not one clock reading); the rounds
    alternate which goes first, so neither pays the warm-up or sits always second (msp's
    S = 1 row, where both paths do the same work, shows what remains of such a bias)."""
    first = []
    for fn in fns:
        start = time.process_time()
        first.append((fn(), time.process_time() - start))
    outs = [out for out, _ in first]
    calls = max(1, math.ceil(ROUND_SECONDS / max(max(t for _, t in first), 1e-6)))
    times = [[] for _ in fns]
    for r in range(repeats):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            start = time.process_time()
            for _ in range(calls):
                outs[i] = fns[i]()
            times[i].append((time.process_time() - start) / calls)
    return [(min(t), out) for t, out in zip(times, outs)]


def prediction_rows(suite, shape: tuple[int, int, int], batch: int, repeats: int) -> list[tuple]:
    """(backbone, method, S, depth, whole s/image, shared s/image, ratio, max |diff|) per method."""
    data = images(shape, batch)
    cpu = torch.device("cpu")
    x = Normalize(data, cpu)(to_tensor(data.get("test"), cpu)[0])
    rows = []
    for spec in suite.methods:
        if spec.kind != "trained":
            continue
        method = METHODS.get(spec.type)(spec.options)
        seed_everything(0)
        model = method.prediction_model(method.build_model(spec.model, data), spec.model, data)
        method.eval_mode(model)
        s = method.samples

        def whole():
            torch.manual_seed(1)
            return torch.stack([model(x).float() for _ in range(s)])

        def shared():
            torch.manual_seed(1)
            return passes(model, x, s, batched=False)

        with torch.no_grad():
            (t_whole, a), (t_shared, b) = best(repeats, whole, shared)
        depth = model.deterministic_depth()
        rows.append((suite.name, spec.name, s, "embedding" if depth is None else f"{depth}/{len(model.blocks)}",
                     t_whole / batch, t_shared / batch, t_whole / t_shared, float((a - b).abs().max())))
        print(f"{suite.name:10s} {spec.name:20s} S={s:2d} whole {1e3 * t_whole / batch:8.3f} ms/img "
              f"shared {1e3 * t_shared / batch:8.3f} ms/img ratio {t_whole / t_shared:5.2f}", flush=True)
    return rows


def sgpa_step(flush: bool, batch: int, steps: int) -> float:
    """Best CPU seconds of one SGPA training step on the cifar10 suite's SGPA settings."""
    spec = next(m for m in load_suite("cifar10").methods if m.name == "sgpa")
    data = images((32, 32, 3), batch, seed=1)
    cpu = torch.device("cpu")
    method = METHODS.get(spec.type)(spec.options)
    seed_everything(0)
    model = method.build_model(spec.model, data)
    opt = make_optimizer(model, spec.train, cpu)
    x, y = to_tensor(data.get("train"), cpu)
    x = Normalize(data, cpu)(x)
    model.train()
    torch.set_flush_denormal(flush)
    try:
        times = []
        for _ in range(steps):
            start = time.process_time()
            opt.zero_grad()
            method.training_loss(model, model(x), y).backward()
            opt.step()
            times.append(time.process_time() - start)
    finally:
        torch.set_flush_denormal(False)
    return min(times[1:] or times)  # the first step pays one-off allocations


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128, help="images per prediction batch / training step")
    ap.add_argument("--repeats", type=int, default=4, help="timed rounds per path, after one untimed call each")
    ap.add_argument("--steps", type=int, default=6, help="SGPA training steps per setting (the first is not timed)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "perf" / "predict_cost.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    rows = prediction_rows(load_suite("default"), (28, 28, 1), args.batch, args.repeats)
    paper = build_suite({"name": "paper", "seeds": [0], "datasets": {"mnist5k": {}},
                         "model": {"preset": "vit_cifar_paper"},
                         "methods": {"msp": {}, "mc_dropout": {"samples": 10}, "kep_svgp": {"samples": 10}}})
    rows += prediction_rows(paper, (32, 32, 3), args.batch, args.repeats)
    step_off = sgpa_step(False, args.batch, args.steps)
    step_on = sgpa_step(True, args.batch, args.steps)
    print(f"sgpa training step: {step_off:.3f} s without flush, {step_on:.3f} s with", flush=True)

    lines = [
        "# Monte-Carlo prediction with a shared trunk; SGPA with denormals flushed",
        "",
        "`benchmarks/predict_cost.py` (module docstring). CPU seconds per image of a batch of "
        f"{args.batch}, one thread, best of {args.repeats}. *whole*: S forwards of the whole model (no "
        "block shared between the passes); *shared*: `bench.train.loop.passes` (the deterministic blocks once, the rest S times). "
        "*Deterministic*: blocks before the first that draws noise / all blocks (*embedding*: the "
        "embedding itself draws noise, so every pass is whole). The last column compares the two "
        "paths' logits under the same seed.",
        "",
        "| backbone | method | S | deterministic | whole ms/image | shared ms/image | whole / shared | max abs diff |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for suite, name, s, depth, whole, shared, ratio, diff in rows:
        lines.append(f"| {suite} | {name} | {s} | {depth} | {1e3 * whole:.3f} | {1e3 * shared:.3f} | "
                     f"{ratio:.2f} | {diff:.1e} |")
    same = [r[6] for r in rows if r[2] == 1 or r[3] == "embedding" or r[3].startswith("0/")]
    if same:  # both paths do the same work: their ratio is the measurement's own spread
        lines += ["", f"Rows where both paths do the same work (S = 1, or no deterministic block) "
                      f"measure the noise of this comparison: ratios {min(same):.2f}-{max(same):.2f}."]
    lines += [
        "",
        "## SGPA training step, denormals flushed or not",
        "",
        f"The `cifar10` suite's SGPA (official CIFAR settings), batch {args.batch}, best of "
        f"{args.steps - 1} steps after the first: {step_off:.3f} s without "
        f"`torch.set_flush_denormal`, {step_on:.3f} s with it (ratio {step_off / step_on:.2f}).",
        "",
        "## Run",
        "",
        *provenance("predict_cost.py" + ("" if not argv else " " + " ".join(argv)),
                    f"; torch {torch.__version__}; wall time {time.perf_counter() - started:.0f} s"),
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:] or None)
