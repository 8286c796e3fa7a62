"""Every GPU figure of the project in one command: ``reports/perf/gpu.md``.

Made for a lent GPU machine whose time comes as one short lease: one command runs five
steps in order, each in its own subprocess with its own time cap, and rewrites
``--out`` (and a copy in ``$OUT`` when that variable is set) as soon as each step ends,
so a run cut off at any point still brings back every step it finished:

1. **CUDA-marked tests**: ``pytest -m cuda`` over the test files holding the ``cuda`` mark
   (``tests/helpers/devices.py``); each test's outcome, and every skip with its reason.
2. **Training**: ``bench.train.loop.fit`` (``benchmarks/train_throughput.py``'s measurement) for
   msp, kep_svgp and sgpa on the ``vit_cifar_paper`` preset at batch 128, eager and
   compiled, and the original-style path (float32, a CPU DataLoader with per-image
   transforms) for msp and kep_svgp at the same batch, giving the speed-up; then the largest
   batch that trains (eager, doubling until CUDA runs out of memory) and that batch compiled.
   Images/s and peak allocated memory per row.
3. **Evaluation and MFU**: ``bench.train.loop.predict`` images/s with each method's Monte-Carlo
   passes; the FLOPs of one msp training image (``FlopCounterMode``) over step 2's msp
   rates give its model FLOPs utilisation against the GPU's dense bf16 peak.
4. **The ``cifar10`` suite**: ``run_suite.py --suite cifar10 --epochs 2 --seeds 0
   --methods msp,kep_svgp,sgpa`` on synthetic CIFAR data written in the official format
   (``benchmarks/synthetic_cifar.py``: the official 50,000 training images, so an epoch is
   an official epoch; 1,000 test images per evaluation split). Epoch 1 pays compilation,
   epoch 2 is the steady epoch; the GPU-hours of the whole suite (every trained method,
   its epochs, five seeds, every evaluation split at its official size) are projected from
   these cells; a method not run here borrows msp's rates, as its row says.
5. **Attention cost**: ``benchmarks/attention_cost.py``, one attention layer forward and
   backward at N = 64 ... 4096 tokens, every layer.

Every section names the device, torch (and CUDA) version and the date it was measured
on; a step that did not run or was cut at its cap says so and why, and the run ends with
the list of what was skipped.  The caps share ``--budget`` seconds (default 450) in fixed
proportions, time a step leaves unused passing to the later ones.

``--dry-run`` runs the same five steps on the CPU at tiny sizes in seconds (a shrunken
model, a few images, no compilation, no largest-batch search): CI runs it so the script
cannot rot between GPU leases; its report goes to the system's temporary folder unless
``--out`` is given, never over the committed one, and says in every heading that it is a
CPU dry run.

Usage (repository root; on the GPU machine ``python3``)::

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_acceptance.py [--budget 450] [--out reports/perf/gpu.md]
        [--steps 1,2,3,4,5] [--work DIR]
    .venv/bin/python benchmarks/gpu_acceptance.py --dry-run

``--steps 2,4`` re-runs only those steps and keeps the other sections of an existing
``--out``.  Exit status: 0 when every step ran to its end and the tests passed, 1 otherwise
(the report says which), 2 on bad input or with no CUDA device and no ``--dry-run``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from cells_per_gpu import StoredCell, _f, _kill, read_store  # noqa: E402

METHODS = ("msp", "kep_svgp", "sgpa")  # the seed methods with a GP attention, and their baseline
REFERENCE_METHODS = ("msp", "kep_svgp")  # the original-style path is timed for these
BATCH = 128  # the paper recipe's batch size
SUITE = "cifar10"
SUITE_SEEDS_RUN = "0"
SUITE_EPOCHS_RUN = 2  # epoch 1 compiles; epoch 2 is the steady epoch the projection uses
OUT_FILES = ("gpu.md", "tests.log", "training.jsonl", "training.log", "evaluation.jsonl", "evaluation.log", "suite.log",
             "attention.md")
MARK = "<!-- gpu_acceptance step {} -->"


@dataclass(frozen=True)
class Step:
    number: int
    key: str
    title: str
    weight: float  # share of the budget


STEPS = (
    Step(1, "tests", "CUDA-marked tests", 0.14),
    Step(2, "training", "Training throughput and peak memory", 0.38),
    Step(3, "evaluation", "Evaluation throughput and MFU", 0.10),
    Step(4, "suite", f"One epoch of the `{SUITE}` suite and its GPU-hour projection", 0.26),
    Step(5, "attention", "Attention cost to N = 4096", 0.12),
)

#: sizes of a GPU run and of a CPU dry run
SIZES = {
    False: {"steps": 50, "warmup_steps": 5, "val_size": 256, "loader_workers": 8, "max_batch_steps": 3,
            "max_batch_start": 1024, "eval_splits": 20, "eval_size": 2000, "eval_batch_size": 1000, "flop_batch": 8,
            "batch": BATCH, "model": {}, "synthetic": {"train": 50_000, "test": 1_000, "svhn": 1_000},
            "tokens": None, "repeats": None, "layers": None},
    True: {"steps": 2, "warmup_steps": 1, "val_size": 8, "loader_workers": 0, "max_batch_steps": 1,
           "max_batch_start": 8, "eval_splits": 2, "eval_size": 8, "eval_batch_size": 8, "flop_batch": 2,
           "batch": 4, "model": {"dim": 16, "depth": 1, "heads": 2, "patch_size": 8, "mlp_ratio": 2.0},
           "synthetic": {"train": 100, "test": 4, "svhn": 4}, "tokens": "64,128", "repeats": 1,
           "layers": "softmax,kep_svgp"},
}


# ======================================================================================
# What the run is on
# ======================================================================================


def environment(dry_run: bool) -> dict:
    import torch

    from machine import cpu_model

    on_gpu = torch.cuda.is_available() and not dry_run
    name = torch.cuda.get_device_name(0) if on_gpu else f"CPU: {cpu_model()}"
    return {"on_gpu": on_gpu, "device": "cuda" if on_gpu else "cpu", "device_name": name,
            "torch": torch.__version__ + (f", CUDA {torch.version.cuda}" if on_gpu else ""),
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def label(env: dict) -> str:
    """What every section heading carries: the device, torch and the date."""
    run = "" if env["on_gpu"] else "CPU dry run, not a GPU measurement; "
    return f"({run}{env['device_name']}; torch {env['torch']}; {env['date']})"


# ======================================================================================
# Subprocesses with a cap
# ======================================================================================


def run_capped(cmd: list[str], cap: float, log: Path, env: dict | None = None) -> tuple[int | None, bool, float]:
    """Run ``cmd`` (repository root, its own process group, output to ``log``) for at most
    ``cap`` seconds; returns (exit status or None when killed, whether the cap killed it,
    seconds).  The whole group is killed at the cap: no compile worker or data loader of a
    cut step keeps the GPU."""
    t0 = time.perf_counter()
    print(f"[gpu_acceptance] {shlex.join(cmd[1:])} (cap {cap:.0f} s)", file=sys.stderr, flush=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        timed_out = False
        try:
            rc = proc.wait(timeout=max(1.0, cap))
        except subprocess.TimeoutExpired:
            timed_out, rc = True, None
        finally:
            if proc.poll() is None:
                _kill(proc)
    return rc, timed_out, time.perf_counter() - t0


def read_rows(path: Path) -> list[dict]:
    """The JSON lines a child wrote (a line cut by a kill is dropped)."""
    rows = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def ended(rc: int | None, timed_out: bool, seconds: float, cap: float) -> str:
    if timed_out:
        return f"cut at its cap of {cap:.0f} s"
    return f"ended in {seconds:.0f} s of its {cap:.0f} s cap" + ("" if rc == 0 else f", exit status {rc}")


# ======================================================================================
# Children: steps 2 and 3 measure in a process of their own
# ======================================================================================


def _throughput_args(sizes: dict, device: str):
    import train_throughput as tt

    argv = ["--steps", str(sizes["steps"]), "--warmup-steps", str(sizes["warmup_steps"]),
            "--val-size", str(sizes["val_size"]), "--loader-workers", str(sizes["loader_workers"]),
            "--max-batch-steps", str(sizes["max_batch_steps"]), "--eval-splits", str(sizes["eval_splits"]),
            "--eval-size", str(sizes["eval_size"]), "--eval-batch-size", str(sizes["eval_batch_size"]),
            "--flop-batch", str(sizes["flop_batch"]), "--device", device, "--suite", SUITE]
    for key, value in sizes["model"].items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return tt.parse_args(argv)


def child(kind: str, rows_path: Path, dry_run: bool, device: str) -> None:
    """Steps 2 (``training``) and 3 (``evaluation``): one JSON line per measurement, written
    as soon as it is made.  The first line is the plan (every item this child means to
    measure), so the parent can name what a cut left unmeasured.  Items that ``rows_path``
    already holds a measurement of (``--resume``) are not measured again."""
    import torch
    import train_throughput as tt
    from bench.config.spec import load_suite

    sizes = SIZES[dry_run]
    args = _throughput_args(sizes, device)
    dev = torch.device(device)
    suite = load_suite(SUITE)
    setups = {m: tt.method_setup(m, suite, tt.model_overrides(args)) for m in METHODS}
    batch = sizes["batch"]
    done = {r["item"]: r for r in read_rows(rows_path) if r.get("item") and r.get("kind") not in ("error", "skipped")}
    out = open(rows_path, "a", buffering=1)

    def emit(row: dict) -> None:
        if row.get("kind") == "plan" and any(r.get("kind") == "plan" for r in read_rows(rows_path)):
            return  # resumed: the first run's plan stands
        out.write(json.dumps(row) + "\n")

    def attempt(item: str, fn) -> dict | None:
        if item in done:
            print(f"[gpu_acceptance] {kind}: {item}: measured by an earlier run", file=sys.stderr, flush=True)
            return done[item]
        print(f"[gpu_acceptance] {kind}: {item}", file=sys.stderr, flush=True)
        try:
            row = fn()
        except Exception as exc:  # noqa: BLE001  (one measurement failing must not stop the others)
            emit({"item": item, "kind": "error", "error": f"{type(exc).__name__}: {exc}"[:500]})
            return None
        finally:
            tt.reset_memory(dev)
        if row is not None:
            emit({"item": item, **row})
        return row

    if kind == "training":
        plan = []
        for m in METHODS:
            plan += [f"ours {m} B={batch} compile off"] + ([f"reference {m} B={batch}"] if m in REFERENCE_METHODS else [])
            plan += [f"ours {m} B={batch} compile on"]
        plan += [f"largest batch {m}" for m in METHODS] + [f"ours {m} largest B compile on" for m in METHODS]
        emit({"kind": "plan", "items": plan, "params": {s.name: _params(s, tt) for s in setups.values()}})
        for m in METHODS:
            s = setups[m]
            attempt(f"ours {m} B={batch} compile off",
                    lambda: {"kind": "ours", "steps": args.steps, **tt.measure_ours(s, batch, False, args, dev)})
            if m in REFERENCE_METHODS:
                attempt(f"reference {m} B={batch}",
                        lambda: {"kind": "ref", "steps": args.steps, **tt.measure_reference(s, batch, args, dev)})
            if dry_run:
                emit({"item": f"ours {m} B={batch} compile on", "kind": "skipped",
                      "why": "dry run: torch.compile is not exercised on the CPU"})
            else:
                attempt(f"ours {m} B={batch} compile on",
                        lambda: {"kind": "ours", "steps": args.steps, **tt.measure_ours(s, batch, True, args, dev)})
        largest = {}
        for m in METHODS:
            item = f"largest batch {m}"
            if dev.type != "cuda":
                emit({"item": item, "kind": "skipped", "why": "the search doubles B until CUDA runs out of memory: CUDA only"})
                continue
            row = attempt(item, lambda: _largest(setups[m], sizes, args, dev, tt))
            if row is not None and row.get("batch"):
                largest[m] = row["batch"]
        small = argparse.Namespace(**{**vars(args), "steps": args.max_batch_steps})
        for m in METHODS:
            item = f"ours {m} largest B compile on"
            if m not in largest:
                emit({"item": item, "kind": "skipped", "why": "no largest batch was found (see the row above)"})
                continue
            attempt(item, lambda: {"kind": "ours", "steps": small.steps, "largest": True,
                                   **tt.measure_ours(setups[m], largest[m], True, small, dev)})
    elif kind == "evaluation":
        emit({"kind": "plan", "items": [f"evaluation {m}" for m in METHODS] + ["FLOPs msp"]})
        for m in METHODS:
            attempt(f"evaluation {m}", lambda: {"kind": "eval", "splits": args.eval_splits, "size": args.eval_size,
                                                 **tt.measure_eval(setups[m], args, dev)})
        probe = tt.synthetic_bundle(tt.synthetic_images(2, tt.np.random.default_rng(0)),
                                    tt.synthetic_images(1, tt.np.random.default_rng(0)))

        def flops() -> dict:
            model = tt.build_model(setups["msp"], probe, dev, args.seed)
            return {"kind": "flops", "method": "msp", "batch": args.flop_batch,
                    "flops_per_image": tt.training_flops_per_image(setups["msp"].method, model, tt.IMAGE_SHAPE,
                                                                   args.flop_batch, dev)}
        attempt("FLOPs msp", flops)
    out.close()


def _params(setup, tt) -> int:
    probe = tt.synthetic_bundle(tt.synthetic_images(2, tt.np.random.default_rng(0)),
                                tt.synthetic_images(1, tt.np.random.default_rng(0)))
    return sum(p.numel() for p in setup.method.build_model(setup.model_cfg, probe).parameters())


def _largest(setup, sizes: dict, args, dev, tt) -> dict:
    """The largest power-of-two batch from ``max_batch_start`` that trains eagerly (its row),
    or a row saying that not even the start fits."""
    row = tt.find_max_batch(setup, sizes["max_batch_start"], args, dev)
    if row is None:
        return {"kind": "largest", "method": setup.name, "batch": None,
                "note": f"B={sizes['max_batch_start']} already ran out of memory"}
    return {"kind": "ours", "steps": args.max_batch_steps, "largest": True, **row}


# ======================================================================================
# Step 1: the CUDA-marked tests
# ======================================================================================

OUTCOME = re.compile(r"^(tests/\S+::\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
SKIP_LINE = re.compile(r"^SKIPPED \[\d+\] (\S+?):\d+: (.*)$")


def cuda_test_files() -> list[str]:
    """The test files that use the ``cuda`` mark's helpers."""
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        if "needs_cuda" in text or "device_params(" in text or "mark.cuda" in text:
            found.append(str(path.relative_to(ROOT)))
    return found


def step_tests(ctx: dict, cap: float) -> tuple[str, bool]:
    files = cuda_test_files()
    log = ctx["work"] / "tests.log"
    cmd = [sys.executable, "-m", "pytest", "-v", "-rfEs", "-m", "cuda", "-p", "no:cacheprovider", *files]
    rc, timed_out, secs = run_capped(cmd, cap, log)
    text = log.read_text(errors="replace")
    outcomes: dict[str, str] = {}
    for line in text.splitlines():
        if m := OUTCOME.match(line):
            outcomes[m.group(1)] = m.group(2)
    counts = {k: sum(1 for v in outcomes.values() if v == k) for k in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    skips = sorted({m.group(2) for line in text.splitlines() if (m := SKIP_LINE.match(line))})
    summary = next((line.strip("= ") for line in reversed(text.splitlines())
                    if re.match(r"^=+ .*\d+ (passed|failed|skipped|deselected|errors?)\b.* in [\d.]+s", line)), "")
    L = [f"`{shlex.join(['python', *cmd[1:]])}`: {ended(rc, timed_out, secs, cap)}.", "",
         f"Files holding the mark: {', '.join(f'`{f}`' for f in files) or 'none'}.", "",
         "| passed | failed | errors | skipped |", "|---:|---:|---:|---:|",
         f"| {counts['PASSED']} | {counts['FAILED']} | {counts['ERROR']} | {counts['SKIPPED']} |", ""]
    if summary:
        L += [f"pytest's summary: `{summary}`", ""]
    bad = [t for t, v in outcomes.items() if v in ("FAILED", "ERROR")]
    if bad:
        L += ["Failed:", "", *(f"- `{t}`" for t in bad), ""]
        L += ["The last lines of the log:", "", "```", *text.splitlines()[-30:], "```", ""]
    if skips:
        L += ["Skipped, with pytest's reasons:", "", *(f"- {s}" for s in skips), ""]
    if timed_out:
        L += [f"{len(outcomes)} test(s) reported before the cap; the rest did not run.", ""]
    if rc not in (0, None) and not outcomes:
        L += ["No test reported an outcome; the last lines of the log:", "", "```", *text.splitlines()[-30:], "```", ""]
    ok = rc == 0 and not timed_out and counts["FAILED"] == counts["ERROR"] == 0
    if ctx["env"]["on_gpu"] and any("CUDA" in s for s in skips):
        ok = False
        L += ["A test was skipped for want of CUDA on a machine that has it: its check is wrong.", ""]
    return "\n".join(L), ok


# ======================================================================================
# Steps 2 and 3: training and evaluation
# ======================================================================================


def _table(header: list[str], rows: list[list[str]], align: str = "") -> list[str]:
    import train_throughput as tt

    return tt._table(header, rows, align)


def _not_reached(rows: list[dict], why: str) -> tuple[list[str], list[str]]:
    plan = next((r for r in rows if r.get("kind") == "plan"), {"items": []})
    seen = {r.get("item") for r in rows}
    measured = {r.get("item") for r in rows if r.get("kind") not in ("error", "skipped", "plan", "crash")}
    missing = [item for item in plan["items"] if item not in seen]
    lines = []
    for r in rows:
        if r.get("item") in measured:
            continue  # a resumed run measured what an earlier one could not
        if r.get("kind") == "error":
            lines.append(f"- {r['item']}: failed: `{r['error']}`")
        elif r.get("kind") == "skipped":
            lines.append(f"- {r['item']}: skipped: {r['why']}")
    lines += [f"- {item}: not reached ({why})" for item in missing]
    return list(dict.fromkeys(lines)), missing


def run_child(ctx: dict, kind: str, cap: float) -> tuple[list[dict], int | None, bool, float]:
    path = ctx["work"] / f"{kind}.jsonl"
    if not ctx["resume"]:
        path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__)), "--child", kind, "--rows", str(path), "--device", ctx["env"]["device"]]
    if ctx["dry_run"]:
        cmd.append("--dry-run")
    rc, timed_out, secs = run_capped(cmd, cap, ctx["work"] / f"{kind}.log")
    rows = read_rows(path)
    if rc not in (0, None):
        tail = (ctx["work"] / f"{kind}.log").read_text(errors="replace").splitlines()[-15:]
        rows.append({"kind": "crash", "tail": tail})
    return rows, rc, timed_out, secs


def step_training(ctx: dict, cap: float) -> tuple[str, bool]:
    rows, rc, timed_out, secs = run_child(ctx, "training", cap)
    ctx["training_rows"] = rows
    sizes = SIZES[ctx["dry_run"]]
    plan = next((r for r in rows if r.get("kind") == "plan"), {"params": {}})
    ours = [r for r in rows if r.get("kind") == "ours"]
    ref = [r for r in rows if r.get("kind") == "ref"]
    if ctx["resume"]:
        L0 = ["Resumed (`--resume`): the rows measured by an earlier run in the same work folder were kept, the rest "
              "measured now.", ""]
    else:
        L0 = []
    model = ("`vit_cifar_paper` preset" + (" shrunk to " + ", ".join(f"{k} {v}" for k, v in sizes["model"].items())
                                           if sizes["model"] else ""))
    L = [*L0, f"The training child {ended(rc, timed_out, secs, cap)}.", "",
         f"Model: {model}; parameters " + ", ".join(f"{m} {n:,}" for m, n in plan["params"].items()) + ". "
         f"Our loop: `bench.train.loop.fit` with `TrainConfig(epochs=2, warmup_epochs=0, batch_size=B, compile=..., "
         "augment=('crop', 'flip'))` on CIFAR-shaped uint8 images held on the device; the second epoch is timed "
         f"({sizes['steps']} steps at B={sizes['batch']}, {sizes['max_batch_steps']} at the largest B; it includes a "
         f"validation prediction of {sizes['val_size']} images). Original-style path: a DataLoader with "
         f"{sizes['loader_workers']} workers transforming one image at a time on the CPU, float32, eager, plain AdamW, "
         f"{sizes['steps']} steps timed after {sizes['warmup_steps']}. Peak memory: `torch.cuda.max_memory_allocated`"
         " (model, optimiser, activations and our loop's train set on the device).", ""]
    L += _table(["method", "B", "compile", "steps timed", "images/s", "step (ms)", "epoch 1 (s)", "epoch 2 (s)",
                 "peak alloc (MiB)", "compile status"],
                [[r["method"], str(r["batch"]) + (" (largest)" if r.get("largest") else ""), r["compile"],
                  str(r["steps"]), _f(r["images_s"], "{:,.0f}"), _f(r["step_ms"], "{:,.2f}"),
                  _f(r["epoch1_s"], "{:.3g}"), _f(r["epoch2_s"], "{:.3g}"), _f(r["peak_mib"]), r["status"]]
                 for r in ours], "lrlrrrrrrl")
    L += ["", "Original-style path:", ""]
    L += _table(["method", "B", "DataLoader workers", "images/s", "step (ms)", "peak alloc (MiB)"],
                [[r["method"], str(r["batch"]), str(r["workers"]), _f(r["images_s"], "{:,.0f}"),
                  _f(r["step_ms"], "{:,.2f}"), _f(r["peak_mib"])] for r in ref])
    L += ["", "Speed-up of our loop over the original-style path (images/s over images/s, same method and batch):", ""]
    speed = []
    for r in ref:
        cells = []
        for c in ("off", "on"):
            o = next((x for x in ours if (x["method"], x["batch"], x["compile"]) == (r["method"], r["batch"], c)), None)
            cells.append("n/a" if o is None else f"{o['images_s'] / r['images_s']:.2f}x")
        speed.append([r["method"], str(r["batch"]), *cells])
    L += _table(["method", "B", "ours eager / original", "ours compiled / original"], speed)
    notes, missing = _not_reached(rows, f"the step's cap of {cap:.0f} s came first" if timed_out else "the child stopped")
    crash = next((r for r in rows if r.get("kind") == "crash"), None)
    if notes:
        L += ["", "Not measured:", "", *notes]
        ctx["skipped"] += [f"step 2: {n[2:]}" for n in notes]
    if crash:
        L += ["", "The child's last lines:", "", "```", *crash["tail"], "```"]
    ok = not timed_out and rc == 0 and not _errors(rows) and not missing
    return "\n".join(L), ok


def _errors(rows: list[dict]) -> list[dict]:
    """Failed measurements that no later (resumed) run made good."""
    measured = {r.get("item") for r in rows if r.get("kind") not in ("error", "skipped", "plan", "crash")}
    return [r for r in rows if r.get("kind") == "error" and r.get("item") not in measured]


def _peak_tflops(name: str) -> tuple[float | None, str]:
    import train_throughput as tt

    return tt.peak_tflops(name, None)


def step_evaluation(ctx: dict, cap: float) -> tuple[str, bool]:
    rows, rc, timed_out, secs = run_child(ctx, "evaluation", cap)
    evals = [r for r in rows if r.get("kind") == "eval"]
    flops = next((r for r in rows if r.get("kind") == "flops"), None)
    sizes = SIZES[ctx["dry_run"]]
    L = [f"The evaluation child {ended(rc, timed_out, secs, cap)}.", "",
         f"`bench.train.loop.predict` over {sizes['eval_splits']} splits of {sizes['eval_size']:,} images (eval batch "
         f"{sizes['eval_batch_size']}, bf16 autocast on CUDA), each image through the method's S Monte-Carlo passes; "
         "one warm-up prediction first. Forward passes/s = images x S / seconds.", ""]
    L += _table(["method", "S", "images/s", "forward passes/s", "seconds", "peak alloc (MiB)"],
                [[r["method"], str(r["samples"]), _f(r["images_s"], "{:,.0f}"), _f(r["passes_s"], "{:,.0f}"),
                  _f(r["seconds"], "{:.3g}"), _f(r["peak_mib"])] for r in evals])
    L += ["", "**Model FLOPs utilisation of msp**", ""]
    env = ctx["env"]
    peak, source = _peak_tflops(env["device_name"]) if env["on_gpu"] else (None, "not a GPU")
    if flops is None:
        L.append("The FLOP count did not run (below).")
    else:
        f = flops["flops_per_image"]
        L += [f"One training image (forward + backward, `torch.utils.flop_counter.FlopCounterMode` at "
              f"{flops['batch']} images; matrix products and attention): {f / 1e9:,.3f} GFLOP. Peak: "
              + (f"{peak:,.1f} TFLOPS dense bf16 ({source})." if peak else f"unknown ({source}): MFU n/a.")
              + " The original-style path trains in float32, so its MFU against the bf16 peak says how much of the"
              " chip it leaves unused, not what float32 could reach.", ""]
        msp_rows = [r for r in ctx.get("training_rows", []) if r.get("kind") in ("ours", "ref") and r.get("method") == "msp"]
        if not msp_rows:
            L.append("No msp training rate from step 2 to divide by (step 2 did not run or measured no msp row).")
        else:
            L += _table(["path", "B", "compile", "images/s", "achieved TFLOPS", "MFU"],
                        [["ours" if r["kind"] == "ours" else "original-style", str(r["batch"]), r.get("compile", "off"),
                          _f(r["images_s"], "{:,.0f}"), _f(f * r["images_s"] / 1e12, "{:,.3f}"),
                          _f(100 * f * r["images_s"] / 1e12 / peak if peak else None, "{:.2f}%")] for r in msp_rows],
                        "llrrrr")
    notes, missing = _not_reached(rows, f"the step's cap of {cap:.0f} s came first" if timed_out else "the child stopped")
    if notes:
        L += ["", "Not measured:", "", *notes]
        ctx["skipped"] += [f"step 3: {n[2:]}" for n in notes]
    crash = next((r for r in rows if r.get("kind") == "crash"), None)
    if crash:
        L += ["", "The child's last lines:", "", "```", *crash["tail"], "```"]
    ok = not timed_out and rc == 0 and not _errors(rows) and not missing
    return "\n".join(L), ok


# ======================================================================================
# Step 4: the cifar10 suite on synthetic data of the official format
# ======================================================================================


def suite_file(ctx: dict) -> str:
    """The suite the step runs: the built-in one by name, or in a dry run a copy whose
    model is shrunk (its ``[model]`` table gains the dry run's sizes)."""
    if not ctx["dry_run"]:
        return SUITE
    text = (ROOT / "bench" / "suites" / f"{SUITE}.toml").read_text(encoding="utf-8")
    anchor = 'preset = "vit_cifar_paper"\n'
    if anchor not in text:
        raise SystemExit(f"bench/suites/{SUITE}.toml has no line {anchor.strip()!r} to shrink the model after")
    extra = "".join(f"{k} = {v!r}\n" for k, v in SIZES[True]["model"].items())
    path = ctx["work"] / f"{SUITE}_dry_run.toml"
    path.write_text(text.replace(anchor, anchor + extra, 1), encoding="utf-8")
    return str(path)


def projection(suite, cells: list[StoredCell], n_train_run: int) -> tuple[dict, list[dict]]:
    """Per trained method of ``suite``: seconds of one cell at the official sizes, and hours
    over the suite's seeds (formula in the report).  A method without a measured cell borrows
    msp's, its prediction scaled by its passes over msp's."""
    import train_throughput as tt
    from bench.core.registry import METHODS as REGISTRY

    work = tt.suite_workload(suite)
    by_method = {c.record.method: c for c in cells}
    proxy = by_method.get("msp") or (cells[0] if cells else None)
    rows = []
    for m in suite.methods:
        if m.kind != "trained" or proxy is None:
            continue
        method = REGISTRY.get(m.type)(m.options)
        src = by_method.get(m.name, proxy)
        log, rec = src.log, src.record
        if len(log) < 2:
            continue
        epoch_s = float(log[-1]["seconds"]) * work["n_train"] / n_train_run
        compile_s = max(0.0, float(log[0]["seconds"]) - float(log[-1]["seconds"]))
        pred_per_image = float(rec.predict_seconds_per_1000) / 1000
        if rec.method != m.name:
            pred_per_image *= method.samples / max(1, rec.samples or 1)
        trains = not method.post_hoc()
        train_s = m.train.epochs * epoch_s if trains else 0.0
        eval_s = work["n_eval"] * pred_per_image
        cell_s = (compile_s if trains else 0.0) + train_s + eval_s
        rows.append({"method": m.name, "seeds": len(suite.seeds), "epochs": m.train.epochs if trains else 0,
                     "samples": method.samples, "epoch_s": epoch_s if trains else 0.0, "compile_s": compile_s if trains else 0.0,
                     "train_s": train_s, "eval_s": eval_s, "cell_s": cell_s, "hours": cell_s * len(suite.seeds) / 3600,
                     "measured": rec.method == m.name,
                     "note": "" if rec.method == m.name else f"rates of {rec.method} (not run here)"
                     + ("; post-hoc: trains nothing" if not trains else "")})
    return work, rows


def step_suite(ctx: dict, cap: float) -> tuple[str, bool]:
    import train_throughput as tt  # noqa: F401  (registers the data sets and methods)
    from bench.config.spec import load_suite
    from synthetic_cifar import write_synthetic

    t0 = time.perf_counter()
    sizes = SIZES[ctx["dry_run"]]["synthetic"]
    data = ctx["work"] / "cifar-synth"
    if not (data / "cifar-10-batches-py").is_dir():
        write_synthetic(data, train=sizes["train"], test=sizes["test"], svhn=sizes["svhn"], classes=(10, 100), seed=0)
    write_s = time.perf_counter() - t0
    suite_arg = suite_file(ctx)
    results, reports = ctx["work"] / "results", ctx["work"] / "reports"
    name = "gpu_acceptance"
    cmd = [sys.executable, str(ROOT / "run_suite.py"), "--suite", suite_arg, "--data-root", str(data),
           "--epochs", str(SUITE_EPOCHS_RUN), "--seeds", SUITE_SEEDS_RUN, "--methods", ",".join(METHODS),
           "--device", ctx["env"]["device"], "--results", str(results), "--reports", str(reports), "--name", name,
           "--format", "csv", "--quiet"]
    rc, timed_out, secs = run_capped(cmd, cap - write_s, ctx["work"] / "suite.log")
    cells, problems = read_store(results / name, logs=True)
    suite = load_suite(suite_arg)
    shown = ["python", "run_suite.py", *[("DATA" if a == str(data) else "RESULTS" if a == str(results)
                                          else "REPORTS" if a == str(reports) else a) for a in cmd[2:]]]
    L = [f"Synthetic CIFAR-10 and CIFAR-100 in the official format (`benchmarks/synthetic_cifar.py`: "
         f"{sizes['train']:,} training images, {sizes['test']:,} test images, SVHN {sizes['svhn']:,}; written in "
         f"{write_s:.0f} s), then `{shlex.join(shown)}`: {ended(rc, timed_out, secs, cap - write_s)} "
         "(the report stage included).", ""]
    L += _table(["method", "compile", "epoch 1 (s)", "epoch 2 (s)", "train acc (epoch 2)", "predict s / 1000 images",
                 "peak memory (MB)", "test acc"],
                [[c.record.method, str(c.record.compile), _f(float(c.log[0]["seconds"]), "{:.3g}") if c.log else "n/a",
                  _f(float(c.log[-1]["seconds"]), "{:.3g}") if len(c.log) > 1 else "n/a",
                  _f(float(c.log[-1]["train_acc"]), "{:.3f}") if c.log else "n/a",
                  _f(c.record.predict_seconds_per_1000, "{:.3g}"), _f(c.record.peak_memory_mb, "{:,.0f}"),
                  _f(c.record.test_acc, "{:.3f}")] for c in cells], "llrrrrrr")
    run = {c.record.method for c in cells}
    missing = [m for m in METHODS if m not in run]
    if problems or missing:
        why = f"the step's cap of {cap:.0f} s came first" if timed_out else f"run_suite.py exit status {rc}"
        L += ["", "Not complete: " + "; ".join(problems + [f"{m}: no complete cell ({why})" for m in missing]) + "."]
        ctx["skipped"] += [f"step 4: {m}: no complete cell ({why})" for m in missing]
    if rc not in (0, None) and not cells:
        tail = (ctx["work"] / "suite.log").read_text(errors="replace").splitlines()[-20:]
        L += ["", "```", *tail, "```"]
    work, proj = projection(suite, cells, sizes["train"] - holdout(sizes["train"]))
    unit = "GPU-hours" if ctx["env"]["on_gpu"] else "CPU-hours of a shrunken model (a dry run: no estimate of anything)"
    L += ["", f"**Projection for the whole `{SUITE}` suite** ({unit}):", "",
          "    cell seconds = C + E x T_epoch + N_eval x P          hours = seeds x cell seconds / 3600",
          "",
          f"T_epoch = epoch 2's seconds (training on {work['n_train']:,} images and validating {work['n_val']:,} with "
          "the method's passes" + ("" if sizes["train"] - holdout(sizes["train"]) == work["n_train"] else
                                   ", scaled from this run's training images to the official ones") + "), C = epoch 1 "
          "less epoch 2 (compilation and warm-up, once per cell), E = the method's epochs in the suite, "
          f"N_eval = {work['n_eval']:,} images over the suite's {work['eval_splits']} evaluation splits at their official "
          "sizes, P = this run's prediction seconds per image with the method's passes (1,000-image splits: one eval "
          "batch each). Derived methods (temperature scaling, ensembles) reuse stored predictions; a post-hoc method "
          "trains nothing. Not included: the data's first read, the corruption cache and the report stage.", ""]
    L += _table(["method", "seeds", "E", "S", "T_epoch (s)", "C (s)", "train (h/cell)", "eval (s/cell)", unit.split(" ")[0],
                 "note"],
                [[r["method"], str(r["seeds"]), str(r["epochs"]), str(r["samples"]), _f(r["epoch_s"], "{:.3g}"),
                  _f(r["compile_s"], "{:.3g}"), _f(r["train_s"] / 3600, "{:.2f}"), _f(r["eval_s"], "{:,.0f}"),
                  _f(r["hours"], "{:,.2f}"), r["note"]] for r in proj], "lrrrrrrrrl")
    if proj:
        total = sum(r["hours"] for r in proj)
        measured = sum(r["hours"] for r in proj if r["measured"])
        L += ["", f"**Total: {total:,.1f} {unit.split(' ')[0]}** for {len(proj)} trained methods x "
              f"{len(suite.seeds)} seeds on one {ctx['env']['device_name']} ({measured:,.1f} of them from methods run "
              "here), cells one after another."]
    else:
        L += ["", "No projection: no cell completed two epochs."]
    ok = not timed_out and rc == 0 and not missing and not problems
    return "\n".join(L), ok


def holdout(n_train_file: int) -> int:
    """Validation images held out of the data set's training file (the suite's rule)."""
    import train_throughput as tt
    from bench.config.spec import load_suite

    opts = load_suite(SUITE).datasets[0].options
    per_class = n_train_file // tt.CLASSES
    return tt.CLASSES * tt.holdout_size(per_class, getattr(opts, "val_fraction", 0.1))


# ======================================================================================
# Step 5: attention cost
# ======================================================================================


def step_attention(ctx: dict, cap: float) -> tuple[str, bool]:
    out = ctx["work"] / "attention.md"
    out.unlink(missing_ok=True)
    sizes = SIZES[ctx["dry_run"]]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "attention_cost.py"), "--out", str(out)]
    shrink = ["--tokens", sizes["tokens"], "--repeats", str(sizes["repeats"]), "--layers", sizes["layers"]] \
        if sizes["tokens"] else []
    cmd += shrink
    # the layers run in their own processes: CUDA_VISIBLE_DEVICES hides the GPU from a dry run
    rc, timed_out, secs = run_capped(cmd, cap, ctx["work"] / "attention.log",
                                     env={} if ctx["env"]["on_gpu"] else {"CUDA_VISIBLE_DEVICES": ""})
    L = [f"`{shlex.join(['python', 'benchmarks/attention_cost.py', *shrink])}`: {ended(rc, timed_out, secs, cap)}.", ""]
    if out.is_file():  # its report less its title, its headings one level down
        L += ["#" + line if line.startswith("## ") else line for line in out.read_text().splitlines()[1:]]
    else:
        L += ["No layer finished."]
    if rc not in (0, None):
        L += ["", "Its last lines:", "", "```", *(ctx["work"] / "attention.log").read_text(errors="replace").splitlines()[-15:],
              "```"]
    if timed_out:
        ctx["skipped"].append("step 5: the layers after the last one in the table (cap reached)")
    return "\n".join(L), not timed_out and rc == 0


# ======================================================================================
# The report
# ======================================================================================

RUNNERS = {"tests": step_tests, "training": step_training, "evaluation": step_evaluation, "suite": step_suite,
           "attention": step_attention}


def existing_sections(path: Path) -> dict[int, str]:
    """The step sections of an earlier report at ``path`` (kept when ``--steps`` re-runs others)."""
    if not path.is_file():
        return {}
    text, found = path.read_text(), {}
    parts = re.split(r"^<!-- gpu_acceptance step (\d) -->\n", text, flags=re.MULTILINE)
    for number, body in zip(parts[1::2], parts[2::2]):
        found[int(number)] = body.split("\n<!-- gpu_acceptance end -->")[0].rstrip("\n")
    return found


def render(ctx: dict, sections: dict[int, str], argv: list[str], done: bool) -> str:
    env = ctx["env"]
    title = (f"# GPU acceptance: {env['device_name']}" if env["on_gpu"]
             else "# GPU acceptance: CPU dry run (tiny sizes; not a GPU measurement)")
    cmd = shlex.join(["python3", "benchmarks/gpu_acceptance.py", *argv])
    L = [title, "",
         f"Written by `{cmd}` (repository root), {'finished' if done else 'in progress or cut off'}: each section "
         "below is rewritten as soon as its step ends, and each names what it measured on. Steps run in order, each "
         f"in its own process with its own cap out of a budget of {ctx['budget']:.0f} s.", "",
         f"- device: {env['device_name']} (`{env['device']}`)",
         f"- torch {env['torch']}, python {env['python']}; {env['cpus']} CPUs",
         f"- date: {env['date']}", ""]
    if kept := [str(n) for n in sorted(sections) if n not in ctx["ran"]]:
        L += [f"Step{'s' if len(kept) > 1 else ''} {', '.join(kept)} kept from an earlier run of this script (each "
              "heading says what and when it measured).", ""]
    for step in STEPS:
        if step.number not in sections:
            continue
        L += [MARK.format(step.number), sections[step.number].rstrip("\n"), ""]
    L.append("<!-- gpu_acceptance end -->")
    if ctx["skipped"]:
        L += ["", "## Skipped or cut, and why", "", *(f"- {s}" for s in ctx["skipped"])]
    return "\n".join(L).rstrip("\n") + "\n"


def write(ctx: dict, sections: dict[int, str], argv: list[str], done: bool) -> None:
    out: Path = ctx["out"]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render(ctx, sections, argv, done))
    tmp.replace(out)
    dest = os.environ.get("OUT")
    if dest:  # the lent machine's way back: the report and the step logs
        Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, Path(dest) / "gpu.md")
        for name in OUT_FILES[1:]:
            if (ctx["work"] / name).is_file():
                shutil.copyfile(ctx["work"] / name, Path(dest) / name)


def _steps(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or any(v not in {s.number for s in STEPS} for v in values):
        raise argparse.ArgumentTypeError(f"--steps takes step numbers 1-5 separated by commas, e.g. 2,4; got {text!r}")
    return values


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for all steps together (default: 450)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU at tiny sizes, in seconds (what CI runs)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the report (default: reports/perf/gpu.md; with --dry-run, gpu_acceptance_dry_run.md in the "
                         "system's temporary folder)")
    ap.add_argument("--work", type=Path, default=None, help="data, stores and logs (default: a temporary folder)")
    ap.add_argument("--steps", type=_steps, default=[s.number for s in STEPS], help="which steps (default: 1,2,3,4,5)")
    ap.add_argument("--resume", action="store_true",
                    help="steps 2 and 3: keep the measurements an earlier run left in --work and measure only the rest")
    ap.add_argument("--child", choices=("training", "evaluation"), help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not math.isfinite(args.budget) or args.budget <= 0:
        ap.error(f"--budget must be a positive number of seconds, got {args.budget}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.child:
        child(args.child, args.rows, args.dry_run, args.device)
        return 0
    env = environment(args.dry_run)
    if not env["on_gpu"] and not args.dry_run:
        print("gpu_acceptance: no CUDA device is visible; run it on the GPU machine, or check the script here "
              "with --dry-run", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_acceptance_"))
    work.mkdir(parents=True, exist_ok=True)
    out = args.out or (Path(tempfile.gettempdir()) / "gpu_acceptance_dry_run.md" if args.dry_run
                       else ROOT / "reports" / "perf" / "gpu.md")
    if args.resume and not args.work:
        print("gpu_acceptance: --resume needs --work, the folder an earlier run left its measurements in",
              file=sys.stderr)
        return 2
    ctx = {"env": env, "work": work, "out": out, "dry_run": args.dry_run, "budget": args.budget, "skipped": [],
           "resume": args.resume, "ran": set(args.steps)}
    chosen = [s for s in STEPS if s.number in args.steps]
    sections = {n: body for n, body in existing_sections(out).items() if n not in args.steps} if args.steps != [
        s.number for s in STEPS] else {}
    start, all_ok = time.perf_counter(), True
    for i, step in enumerate(chosen):
        left = args.budget - (time.perf_counter() - start)
        cap = left * step.weight / sum(s.weight for s in chosen[i:])
        heading = f"## {step.number}. {step.title} {label(env)}"
        if cap < 5:
            body, ok = f"Not run: {left:.0f} s of the budget were left for it.", False
            ctx["skipped"].append(f"step {step.number}: not run (budget spent)")
        else:
            print(f"[gpu_acceptance] step {step.number}: {step.title} (cap {cap:.0f} s)", file=sys.stderr, flush=True)
            try:
                body, ok = RUNNERS[step.key](ctx, cap)
            except Exception as exc:  # noqa: BLE001  (the report of one step must not lose the others)
                body, ok = f"The step failed in the script itself: `{type(exc).__name__}: {exc}`", False
                ctx["skipped"].append(f"step {step.number}: failed ({type(exc).__name__})")
        sections[step.number] = f"{heading}\n\n{body}"
        all_ok &= ok
        write(ctx, sections, argv, done=False)
    write(ctx, sections, argv, done=True)
    wall = time.perf_counter() - start
    print(f"[gpu_acceptance] wrote {out} in {wall:.0f} s" + (f"; the work folder is {work}" if args.work else ""),
          file=sys.stderr)
    for line in ctx["skipped"]:
        print(f"[gpu_acceptance] skipped: {line}", file=sys.stderr)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
