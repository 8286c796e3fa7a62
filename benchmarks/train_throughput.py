"""Training and evaluation throughput of the paper ViT: our loop against the original recipe.

Made for one GPU; it also runs on CPU at tiny sizes, which is how the tests smoke-test it.  Every number is measured on the one device it names.

1. **Our training loop**: :func:`bench.train.loop.fit` on an in-memory CIFAR-shaped data set
   (32x32x3 uint8, 10 classes, random pixels) whose train split holds ``steps x B`` images,
   ``TrainConfig(epochs=2, warmup_epochs=0, batch_size=B, compile=on|off,
   augment=("crop", "flip"), precision=...)`` (the other fields at their defaults: AdamW,
   gradient-norm clipping at 1).  Epoch 1 absorbs compilation and other one-off costs;
   the time of epoch 2 (``TrainResult.log[-1]["seconds"]``) is the measurement.  Each
   epoch ends with a validation prediction of a ``--val-size`` split (kept small; it is
   inside the timed epoch).  Peak memory: ``torch.cuda.max_memory_allocated`` (model,
   optimiser state, activations and the uint8 train set, which our loop keeps on the GPU
   and whose size is shown beside it); on CPU "n/a".
2. **The original recipe** (how the KEP-SVGP/SGPA code trains): a
   ``torch.utils.data.DataLoader`` (``--loader-workers`` processes, pinned memory on CUDA)
   over a Dataset of uint8 HWC images whose ``__getitem__`` crops (32 with 4-pixel zero
   padding), flips, scales to [0, 1] and normalises one image at a time on the CPU
   (:class:`ReferenceImages`; torch/numpy ops, as torchvision's RandomCrop,
   RandomHorizontalFlip, ToTensor, Normalize); float32, no autocast, no compile, plain
   (not fused) AdamW, loss = ``method.training_loss`` (cross-entropy plus the method's
   terms).  ``--steps`` steps are timed after ``--warmup-steps``, between
   ``torch.cuda.synchronize()`` calls.  The speed-up is ours / reference.
3. **Model FLOPs utilisation** of msp: FLOPs of one training image (forward + backward,
   counted by ``torch.utils.flop_counter.FlopCounterMode``: matrix products, convolutions
   and attention; attention runs through the math SDPA backend while counting so that
   every device counts it) x images/s, over the GPU's dense bf16 peak.
4. **Evaluation**: :func:`bench.train.loop.predict` with the method's S Monte-Carlo passes over
   ``--eval-splits`` splits of ``--eval-size`` images (the same random images each time:
   content does not change the cost); a warm-up prediction first.
5. **Projection** of the device-hours of a suite (``--suite``, default ``cifar10``): train,
   per-epoch validation and evaluation time per cell, summed over trained methods x seeds.

Usage (repository root)::

    .venv/bin/python benchmarks/train_throughput.py [--methods msp,mc_dropout,kep_svgp,sgpa]
        [--batch-sizes 128,512,1024] [--compile on,off] [--find-max-batch] [--out FILE]

The report goes to stdout unless ``--out`` names a file; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import gc
import importlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

# Registrations: the softmax attention (bench.train.vit), cifar10 (so the suite file parses), the methods.
for _module in ("bench.train.vit", "datasets", "methods"):
    importlib.import_module(_module)

from bench.data import (CORRUPTIONS, OOD_PREFIX, SEVERITIES, DataBundle, Split, corruption_split,  # noqa: E402
                        holdout_size, is_ood, is_shift)
from bench.core.registry import METHODS  # noqa: E402
from bench.config.spec import MODEL_PRESETS, ModelConfig, TrainConfig, load_suite  # noqa: E402
from bench.run.flags import positive_int_list  # noqa: E402
from bench.train.loop import switched_on, fit, predict, resolve_device, seed_everything  # noqa: E402
from datasets.cifar import CIFAR10  # noqa: E402
import synthetic_cifar  # noqa: E402
from machine import cpu_model, run_section  # noqa: E402

PRESET = "vit_cifar_paper"
IMAGE_SHAPE = (32, 32, 3)  # H, W, C
CLASSES = CIFAR10.num_classes
MEAN, STD = CIFAR10.mean, CIFAR10.std  # CIFAR-10's pixel statistics, as the suite normalises it
PAD = 4  # RandomCrop(32, padding=4)

#: Dense (no sparsity) bf16 tensor-core peaks in TFLOPS, matched in order against
#: ``torch.cuda.get_device_name()`` (NVIDIA data sheets); ``--peak-tflops`` overrides.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.4),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.4),  # SXM (HBM3)
    ("A100", 312.0),
)

#: Sizes of the official CIFAR files the suite reads (images).
CIFAR_TRAIN_PER_CLASS = 5_000  # CIFAR-10: 50,000 training images, 10 classes
CIFAR_TEST = 10_000
OOD_SIZES = {"svhn": 26_032, "cifar100": 10_000, "cifar10": 10_000}


# ======================================================================================
# Data
# ======================================================================================


def synthetic_images(n: int, rng: np.random.Generator) -> Split:
    """``n`` CIFAR-shaped uint8 images of 10 classes (a colour per class plus noise: the
    images :mod:`synthetic_cifar` writes to disk; content does not change the cost)."""
    x, y = synthetic_cifar.synthetic_images(n, synthetic_cifar.class_colours(CLASSES, rng), rng)
    return Split(x, y)


def synthetic_bundle(train: Split, val: Split) -> DataBundle:
    """An in-memory :class:`DataBundle` with CIFAR-10's shape and pixel statistics."""
    return DataBundle("synthetic_cifar", CLASSES, IMAGE_SHAPE, MEAN, STD,
                      {"train": lambda: train, "val": lambda: val})


class ReferenceImages(torch.utils.data.Dataset):
    """The original implementations' training set: uint8 HWC images transformed one at a
    time on the CPU, as torchvision's ``RandomCrop(H, padding=4)``, ``RandomHorizontalFlip()``,
    ``ToTensor()``, ``Normalize(mean, std)`` do (pad with 0 pixels, crop, flip, /255, normalise).

    Random draws use torch's generator, which the DataLoader seeds differently in each
    worker (numpy's would repeat across workers)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.x, self.y = x, y
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.x)

    def transform(self, img: np.ndarray, oy: int, ox: int, flip: bool) -> torch.Tensor:
        """One HWC uint8 image -> normalised float32 CHW: the ``[oy, ox]`` window of the image
        zero-padded by 4 on each side (offsets 0..8; 4 = centred), mirrored if ``flip``."""
        h, w = img.shape[:2]
        padded = np.pad(img, ((PAD, PAD), (PAD, PAD), (0, 0)))
        crop = padded[oy : oy + h, ox : ox + w]
        if flip:
            crop = crop[:, ::-1]
        t = torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1).float().div_(255.0)
        return (t - self.mean) / self.std

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        oy, ox = torch.randint(0, 2 * PAD + 1, (2,)).tolist()
        flip = bool(torch.rand(()) < 0.5)
        return self.transform(self.x[i], oy, ox, flip), int(self.y[i])


# ======================================================================================
# Methods and models
# ======================================================================================


@dataclass
class MethodSetup:
    name: str
    method: object  # a TrainedMethod
    model_cfg: ModelConfig
    source: str  # where the options came from


def model_overrides(args: argparse.Namespace) -> dict:
    keys = {"dim": args.dim, "depth": args.depth, "heads": args.heads, "patch_size": args.patch_size,
            "mlp_ratio": args.mlp_ratio}
    return {k: v for k, v in keys.items() if v is not None}


def method_setup(name: str, suite, overrides: dict) -> MethodSetup:
    """The method as the suite configures it (options, backbone), else with its default
    options on the ``vit_cifar_paper`` preset; then the command line's model overrides."""
    try:
        spec = suite.method(name)
    except KeyError:
        spec = None
    if spec is not None and spec.kind == "trained":
        method = METHODS.get(spec.type)(spec.options)
        cfg, source = spec.model, f"suite {suite.name}"
    else:
        cls = METHODS.get(name)
        if getattr(cls, "kind", "") != "trained":
            raise SystemExit(f"--methods: {name!r} is not a trained method")
        method = cls(cls.Options())
        cfg, source = ModelConfig(**{**MODEL_PRESETS[PRESET], **cls.model_defaults(), "preset": PRESET}), "defaults"
    return MethodSetup(name, method, dataclasses.replace(cfg, **overrides), source)


def build_model(setup: MethodSetup, data: DataBundle, device: torch.device, seed: int) -> torch.nn.Module:
    seed_everything(seed)
    return setup.method.build_model(setup.model_cfg, data).to(device)


# ======================================================================================
# Device helpers
# ======================================================================================


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    n = torch.get_num_threads()
    return f"CPU: {cpu_model()} ({n} torch thread{'s' if n != 1 else ''})"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def peak_tflops(name: str, override: float | None) -> tuple[float | None, str]:
    """The device's dense bf16 peak (TFLOPS) and where it came from."""
    if override is not None:
        return override, "--peak-tflops"
    for key, value in PEAK_BF16_TFLOPS:
        if key in name:
            return value, f"table entry {key!r}"
    return None, "unknown device"


# ======================================================================================
# Measurements
# ======================================================================================


def measure_ours(setup: MethodSetup, batch: int, compile_on: bool, args, device: torch.device) -> dict:
    """Throughput of :func:`bench.train.loop.fit`: the second of two epochs of ``steps`` steps."""
    rng = np.random.default_rng(args.seed)
    data = synthetic_bundle(synthetic_images(args.steps * batch, rng), synthetic_images(args.val_size, rng))
    if compile_on:
        torch._dynamo.reset()  # a fresh compile per model (no stale guards, no recompile limit)
    model = build_model(setup, data, device, args.seed)
    reset_memory(device)
    cfg = TrainConfig(epochs=2, warmup_epochs=0, batch_size=batch, compile=compile_on, augment=("crop", "flip"),
                      precision=args.precision, eval_batch_size=args.eval_batch_size)
    result = fit(setup.method, model, data, cfg, device, args.seed)
    first, last = result.log[0]["seconds"], result.log[-1]["seconds"]
    sync(device)
    t0 = time.perf_counter()  # the validation inside each epoch, timed again on its own (an estimate)
    predict(setup.method, model, data.get("val"), data, device, args.eval_batch_size, precision=args.precision)
    val_s = time.perf_counter() - t0
    row = {
        "method": setup.name, "batch": batch, "compile": "on" if compile_on else "off", "status": result.compile,
        "step_ms": 1000 * last / args.steps, "images_s": args.steps * batch / last, "epoch1_s": first,
        "epoch2_s": last, "val_s": val_s, "peak_mib": peak_mib(device),
        "data_mib": (data.get("train").x.nbytes + data.get("train").y.nbytes) / 2**20,
    }
    del model, data, result
    return row


def measure_reference(setup: MethodSetup, batch: int, args, device: torch.device) -> dict:
    """Throughput of the original recipe (module docstring, item 2)."""
    rng = np.random.default_rng(args.seed)
    steps, warmup = args.steps, args.warmup_steps
    train = synthetic_images((steps + warmup) * batch, rng)
    data = synthetic_bundle(train, synthetic_images(1, rng))
    model = build_model(setup, data, device, args.seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=5e-5)
    loader = torch.utils.data.DataLoader(
        ReferenceImages(train.x, train.y, MEAN, STD), batch_size=batch, shuffle=True, drop_last=True,
        num_workers=args.loader_workers, pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(args.seed),
    )
    reset_memory(device)
    total = steps + warmup
    t0 = 0.0
    for step, (x, y) in enumerate(loader):
        if step == warmup:
            sync(device)
            t0 = time.perf_counter()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        setup.method.on_train_step(model, step, total)
        logits = model(x)
        loss = setup.method.training_loss(model, logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync(device)
    seconds = time.perf_counter() - t0
    row = {"method": setup.name, "batch": batch, "workers": args.loader_workers, "step_ms": 1000 * seconds / steps,
           "images_s": steps * batch / seconds, "peak_mib": peak_mib(device)}
    del model, opt, loader, data
    return row


def find_max_batch(setup: MethodSetup, start: int, args, device: torch.device) -> dict | None:
    """The largest power-of-two multiple of ``start`` that trains (eager, ``--max-batch-steps``
    steps an epoch) before CUDA runs out of memory, with its throughput; None if even
    ``start`` does not fit."""
    best = None
    batch = start
    small = argparse.Namespace(**{**vars(args), "steps": args.max_batch_steps})
    while batch <= args.max_batch_limit:
        try:
            best = measure_ours(setup, batch, False, small, device)
        except torch.OutOfMemoryError:
            break
        except RuntimeError as exc:  # some libraries (cuBLAS, cuDNN) report OOM as a plain RuntimeError
            if "out of memory" not in str(exc).lower():
                raise
            break
        finally:
            reset_memory(device)
        print(f"  max batch {setup.name}: B={batch} fits", file=sys.stderr, flush=True)
        batch *= 2
    if best is not None:
        best["limit_hit"] = batch > args.max_batch_limit
    return best


def training_flops_per_image(method, model: torch.nn.Module, image_shape: tuple[int, int, int],
                             batch: int, device: torch.device) -> float:
    """FLOPs of one training image: one forward + backward of ``method.training_loss`` at
    ``batch`` images, as ``FlopCounterMode`` counts them (matrix products, convolutions,
    attention through the math SDPA backend), divided by ``batch``.  The gradients are
    cleared afterwards."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    h, w, c = image_shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, c, h, w, generator=gen).to(device)
    y = torch.randint(0, CLASSES, (batch,), generator=gen).to(device)
    model.train()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        loss = method.training_loss(model, model(x), y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / batch


def measure_eval(setup: MethodSetup, args, device: torch.device) -> dict:
    """Images/s of :func:`bench.train.loop.predict` with the method's S passes over
    ``--eval-splits`` splits of ``--eval-size`` images, after one warm-up prediction."""
    rng = np.random.default_rng(args.seed)
    split = synthetic_images(args.eval_size, rng)
    data = synthetic_bundle(split, split)
    model = build_model(setup, data, device, args.seed)
    model = setup.method.prediction_model(model, setup.model_cfg, data).to(device)
    warm = Split(split.x[: args.eval_batch_size], split.y[: args.eval_batch_size])
    predict(setup.method, model, warm, data, device, args.eval_batch_size, extras=True, precision=args.precision)
    reset_memory(device)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(args.eval_splits):
        predict(setup.method, model, split, data, device, args.eval_batch_size, extras=True, precision=args.precision)
    sync(device)
    seconds = time.perf_counter() - t0
    images = args.eval_splits * args.eval_size
    samples = setup.method.samples
    row = {"method": setup.name, "samples": samples, "seconds": seconds, "images_s": images / seconds,
           "passes_s": images * samples / seconds, "peak_mib": peak_mib(device)}
    del model, data
    return row


# ======================================================================================
# Projection
# ======================================================================================


def suite_workload(suite) -> dict:
    """What the suite's first dataset (a CIFAR one) asks of every cell: training images per
    epoch (after the validation hold-out and the last partial batch are dropped), validation
    images, and the images of every evaluation split (val included) at their official sizes."""
    ds = suite.datasets[0]
    opts = ds.options
    vf = getattr(opts, "val_fraction", 0.1)
    n_val = CLASSES * holdout_size(CIFAR_TRAIN_PER_CLASS, vf)
    n_train = CLASSES * CIFAR_TRAIN_PER_CLASS - n_val
    if getattr(opts, "train_limit", None):
        n_train = min(n_train, opts.train_limit)
    limit = getattr(opts, "eval_limit", None)
    shift_n = min(CIFAR_TEST, getattr(opts, "corruption_limit", None) or CIFAR_TEST)
    names = {"test": CIFAR_TEST}
    names.update({corruption_split(c, s): shift_n for c in CORRUPTIONS for s in SEVERITIES})
    for ood in getattr(opts, "ood", ()):
        names[f"{OOD_PREFIX}{ood}"] = OOD_SIZES.get(ood, getattr(opts, "noise_size", 1000))
    chosen = {n: k for n, k in names.items() if any(fnmatch.fnmatchcase(n, p) for p in ds.splits)}
    sizes = {"val": n_val, **{n: min(k, limit) if limit else k for n, k in chosen.items()}}
    return {"dataset": ds.name, "n_train": n_train, "n_val": n_val, "eval_splits": len(sizes),
            "n_eval": sum(sizes.values()), "n_shift": sum(1 for n in sizes if is_shift(n)),
            "ood": [n for n in sizes if is_ood(n)]}


def _nearest(rows: list[dict], batch: int) -> dict:
    return min(rows, key=lambda r: (abs(math.log2(r["batch"] / batch)), -r["batch"]))


def projection(suite, ours: list[dict], evals: list[dict], device: torch.device) -> tuple[dict, list[dict]]:
    """Per trained method of the suite: seconds of one cell and hours over its seeds, from the
    measured rates (the suite's batch size and compile setting, else the nearest measured;
    an unmeasured method borrows msp's rates, or the first measured method's)."""
    work = suite_workload(suite)
    measured = {r["method"] for r in ours}
    proxy = "msp" if "msp" in measured else (ours[0]["method"] if ours else None)
    rows = []
    for m in suite.methods:
        if m.kind != "trained":
            continue
        src = m.name if m.name in measured else proxy
        if src is None:
            continue
        want_compile = "on" if switched_on(m.train.compile, device) else "off"
        cand = [r for r in ours if r["method"] == src and r["compile"] == want_compile] or \
            [r for r in ours if r["method"] == src]
        tr = _nearest(cand, m.train.batch_size)
        ev = next(r for r in evals if r["method"] == src)
        samples = METHODS.get(m.type)(m.options).samples
        steps = work["n_train"] // min(m.train.batch_size, work["n_train"])
        images = steps * min(m.train.batch_size, work["n_train"])
        # training alone: epoch 2 less its validation (which the val term counts at full size)
        rate = tr["images_s"] * tr["epoch2_s"] / (tr["epoch2_s"] - tr["val_s"]) if tr["val_s"] < tr["epoch2_s"] else tr["images_s"]
        train_s = images * m.train.epochs / rate
        val_s = m.train.epochs * work["n_val"] * samples / ev["passes_s"]
        eval_s = work["n_eval"] * samples / ev["passes_s"]
        overhead_s = max(0.0, tr["epoch1_s"] - tr["epoch2_s"])
        cell_s = train_s + val_s + eval_s + overhead_s
        notes = []
        if src != m.name:
            notes.append(f"rates of {src} (not measured)")
        if tr["batch"] != m.train.batch_size or tr["compile"] != want_compile:
            notes.append(f"measured at B={tr['batch']}, compile {tr['compile']}")
        rows.append({
            "method": m.name, "seeds": len(suite.seeds), "epochs": m.train.epochs, "batch": m.train.batch_size,
            "samples": samples, "train_rate": rate, "pass_rate": ev["passes_s"], "train_s": train_s,
            "val_s": val_s, "eval_s": eval_s, "overhead_s": overhead_s, "cell_s": cell_s,
            "hours": cell_s * len(suite.seeds) / 3600, "note": "; ".join(notes), "measured": src == m.name,
        })
    return work, rows


# ======================================================================================
# Report
# ======================================================================================


def _f(x: float | None, fmt: str = "{:,.1f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _table(header: list[str], rows: list[list[str]], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    sep = "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"
    return ["| " + " | ".join(header) + " |", sep, *("| " + " | ".join(r) + " |" for r in rows)]


def render(res: dict, args: argparse.Namespace, argv: list[str]) -> str:
    dev, dname = res["device"], res["device_name"]
    tag = f"device: {dname}"
    on_gpu = dev.type == "cuda"
    cfg: ModelConfig = res["setups"][0].model_cfg
    over = model_overrides(args)
    model_desc = (f"`{PRESET}` preset" + (f" with overrides {', '.join(f'{k}={v}' for k, v in over.items())}" if over else "")
                  + f": patch {cfg.patch_size}, width {cfg.dim}, depth {cfg.depth}, {cfg.heads} heads, "
                  f"MLP ratio {cfg.mlp_ratio:g}")
    L = [
        f"# Training throughput: {dname}",
        "",
        f"**Every number below was measured on {dname}** (torch device `{dev}`).",
        "",
        f"Model: {model_desc}; CIFAR-shaped data (32x32x3 uint8 random pixels, 10 classes) made in memory. "
        f"Method options and backbones as suite `{args.suite}` configures them (else the method's defaults). "
        f"Parameters: " + ", ".join(f"{s.name} {res['params'][s.name]:,}" for s in res["setups"]) + ".",
        "",
        f"## Our training loop (`bench.train.loop.fit`): {tag}",
        "",
        f"`TrainConfig(epochs=2, warmup_epochs=0, batch_size=B, compile=..., augment=('crop', 'flip'), "
        f"precision={args.precision!r})`, other fields at their defaults (AdamW, gradient clipping at norm 1); "
        f"train split of {args.steps} x B images; the second epoch is timed (it includes a validation prediction "
        f"of {args.val_size} images with the method's S passes, small on purpose; \"of which validation\" is that prediction "
        "timed again on its own after training). Step time and images/s are epoch 2's, validation included. Epoch 1 "
        "also pays compilation and warm-up. Peak memory: "
        + ("`torch.cuda.max_memory_allocated`, including the uint8 train set our loop keeps on the GPU (its own column)."
           if on_gpu else "n/a on CPU."),
        "",
    ]
    L += _table(["method", "B", "compile", "step (ms)", "images/s", "epoch 1 (s)", "epoch 2 (s)", "of which validation (s)",
                 "peak alloc (MiB)", "train set on device (MiB)", "compile status"],
                [[r["method"], str(r["batch"]), r["compile"], _f(r["step_ms"], "{:,.2f}"), _f(r["images_s"], "{:,.0f}"),
                  _f(r["epoch1_s"], "{:.4g}"), _f(r["epoch2_s"], "{:.4g}"), _f(r["val_s"], "{:.4g}"), _f(r["peak_mib"]),
                  _f(r["data_mib"], "{:,.2f}"), r["status"]] for r in res["ours"]], "lrlrrrrrrrl")
    L += [
        "",
        f"## Original recipe (DataLoader, per-image CPU transforms, float32, eager): {tag}",
        "",
        f"DataLoader with {args.loader_workers} worker process{'es' if args.loader_workers != 1 else ''}"
        + (", pinned memory" if on_gpu else "") + "; crop/flip/normalise per image in `__getitem__`; "
        f"plain AdamW; {args.steps} steps timed after {args.warmup_steps} warm-up steps"
        + (" between `torch.cuda.synchronize()` calls; default float32 matmul precision (no TF32)." if on_gpu else "."),
        "",
    ]
    L += _table(["method", "B", "workers", "step (ms)", "images/s", "peak alloc (MiB)"],
                [[r["method"], str(r["batch"]), str(r["workers"]), _f(r["step_ms"], "{:,.2f}"),
                  _f(r["images_s"], "{:,.0f}"), _f(r["peak_mib"])] for r in res["ref"]])
    L += ["", f"## Speed-up of our loop over the original recipe: {tag}", "",
          "Images/s of ours divided by images/s of the original recipe, same method and batch size.", ""]
    modes = [c for c in ("on", "off") if any(r["compile"] == c for r in res["ours"])]
    speed_rows = []
    for ref in res["ref"]:
        cells = []
        for c in modes:
            o = next((r for r in res["ours"] if (r["method"], r["batch"], r["compile"]) == (ref["method"], ref["batch"], c)), None)
            cells.append("n/a" if o is None else f"{o['images_s'] / ref['images_s']:.2f}x")
        speed_rows.append([ref["method"], str(ref["batch"]), *cells])
    L += _table(["method", "B", *(f"ours compile {c} / reference" for c in modes)], speed_rows)

    L += ["", f"## Largest batch (eager, {args.max_batch_steps} steps an epoch): {tag}", ""]
    if not args.find_max_batch:
        L.append("Not requested (`--find-max-batch`).")
    elif not on_gpu:
        L.append("n/a: the search doubles B until CUDA runs out of memory; CUDA only.")
    else:
        L += _table(["method", "largest B that trained", "images/s", "peak alloc (MiB)", "note"],
                    [[m, "none" if r is None else str(r["batch"]), "n/a" if r is None else _f(r["images_s"], "{:,.0f}"),
                      "n/a" if r is None else _f(r["peak_mib"]),
                      "" if r is None else ("stopped at --max-batch-limit" if r["limit_hit"] else "next doubling ran out of memory")]
                     for m, r in res["max_batch"].items()])

    flops, (peak, peak_src) = res["flops"], res["peak"]
    L += ["", f"## Model FLOPs utilisation (msp): {tag}", ""]
    if flops is None:
        L.append("msp not measured.")
    else:
        L += [
            f"FLOPs of one training image (forward + backward, `FlopCounterMode` at {args.flop_batch} images: matrix "
            f"products, convolutions, attention; no elementwise ops): {flops / 1e9:,.3f} GFLOP. "
            + (f"Peak: {peak:,.1f} TFLOPS dense bf16 ({peak_src})." if on_gpu and peak else
               "MFU n/a: " + ("not a GPU." if not on_gpu else "no peak known for this GPU; pass --peak-tflops.")),
            "The original recipe trains in float32, so its MFU against the bf16 peak is an upper bound of what it could use.",
            "",
        ]
        rows = [["ours", str(r["batch"]), r["compile"], _f(r["images_s"], "{:,.0f}"),
                 _f(flops * r["images_s"] / 1e12, "{:,.3f}"),
                 _f(100 * flops * r["images_s"] / 1e12 / peak if on_gpu and peak else None, "{:.1f}%")]
                for r in res["ours"] if r["method"] == "msp"]
        rows += [["original recipe", str(r["batch"]), "off", _f(r["images_s"], "{:,.0f}"),
                  _f(flops * r["images_s"] / 1e12, "{:,.3f}"),
                  _f(100 * flops * r["images_s"] / 1e12 / peak if on_gpu and peak else None, "{:.1f}%")]
                 for r in res["ref"] if r["method"] == "msp"]
        L += _table(["loop", "B", "compile", "images/s", "achieved TFLOPS", "MFU"], rows, "llrrrr")

    L += ["", f"## Evaluation (`bench.train.loop.predict`): {tag}", "",
          f"{args.eval_splits} splits of {args.eval_size:,} images, eval batch {args.eval_batch_size}, precision "
          f"{args.precision!r}, S Monte-Carlo passes per image (each pass a forward of the whole batch); "
          "one warm-up prediction first. Forward passes/s = images x S / seconds.", ""]
    L += _table(["method", "S", "seconds", "images/s", "forward passes/s", "peak alloc (MiB)"],
                [[r["method"], str(r["samples"]), _f(r["seconds"], "{:.4g}"), _f(r["images_s"], "{:,.0f}"),
                  _f(r["passes_s"], "{:,.0f}"), _f(r["peak_mib"])] for r in res["evals"]])

    work, proj = res["projection"]
    L += ["", f"## Projection: hours for suite `{args.suite}` on {dname}", ""]
    if not proj:
        L.append("Nothing measured to project from.")
    else:
        unit = "GPU-hours" if on_gpu else "CPU-hours (this CPU; not a GPU estimate)"
        L += [
            "Per cell (one method, one seed), with the rates measured above:",
            "",
            "    cell seconds = N_train x E / R_train  +  E x N_val x S / R_pass  +  N_eval x S / R_pass  +  C",
            "    hours        = sum over trained methods of  seeds x cell seconds / 3600",
            "",
            f"N_train = {work['n_train']:,} training images of `{work['dataset']}` (the official 50,000 less the "
            f"validation hold-out; the last partial batch is dropped), E = the method's epochs, N_val = {work['n_val']:,} "
            f"(validated every epoch with S passes), N_eval = {work['n_eval']:,} images over {work['eval_splits']} "
            f"evaluation splits (val, test, {work['n_shift']} corruption splits, {', '.join(work['ood']) or 'no OOD'} "
            "at their official sizes), S = the method's Monte-Carlo passes, R_train = our training images/s at the "
            "suite's batch size and compile setting (else the nearest measured), epoch 2 less its validation, R_pass = forward passes/s of "
            "evaluation, C = epoch 1 minus epoch 2 (compilation and warm-up, once per cell). Derived methods (temperature "
            "scaling, ensembles) reuse stored predictions and cost nothing here. Not included: reading the data files, "
            "the analysis and the report.",
            "",
        ]
        L += _table(["method", "seeds", "E", "B", "S", "R_train (img/s)", "R_pass (passes/s)", "train (s/cell)",
                     "val (s/cell)", "eval (s/cell)", "C (s)", unit, "note"],
                    [[r["method"], str(r["seeds"]), str(r["epochs"]), str(r["batch"]), str(r["samples"]),
                      _f(r["train_rate"], "{:,.0f}"), _f(r["pass_rate"], "{:,.0f}"), _f(r["train_s"], "{:,.0f}"),
                      _f(r["val_s"], "{:,.0f}"), _f(r["eval_s"], "{:,.0f}"), _f(r["overhead_s"], "{:,.1f}"),
                      _f(r["hours"], "{:,.2f}"), r["note"]] for r in proj], "lrrrrrrrrrrrl")
        total = sum(r["hours"] for r in proj)
        measured = sum(r["hours"] for r in proj if r["measured"])
        L += ["", f"**Total: {total:,.1f} {unit}** for the suite's {len(proj)} trained methods x seeds "
              f"({measured:,.1f} of them from methods measured here; the rest borrow another method's rates)."]

    L += run_section("train_throughput.py", argv, f"{dname} (`{dev}`)", res["wall_s"], on_gpu,
                     f", numpy {np.__version__}")
    return "\n".join(L) + "\n"


# ======================================================================================
# Main
# ======================================================================================


def _compile_modes(text: str) -> list[bool]:
    modes = [v.strip() for v in text.split(",") if v.strip()]
    if not modes or any(m not in ("on", "off") for m in modes):
        raise argparse.ArgumentTypeError(f"--compile takes on, off or on,off; got {text!r}")
    return [m == "on" for m in modes]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="msp,mc_dropout,kep_svgp,sgpa", help="comma-separated trained methods")
    ap.add_argument("--batch-sizes", type=positive_int_list(), default=[128, 512, 1024], help="e.g. 128,1024")
    ap.add_argument("--compile", type=_compile_modes, default=[True, False], help="on, off or on,off")
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto", help="our loop and evaluation")
    ap.add_argument("--steps", type=int, default=100, help="timed training steps (our epoch 2; reference)")
    ap.add_argument("--warmup-steps", type=int, default=10, help="untimed steps of the original recipe")
    ap.add_argument("--val-size", type=int, default=64, help="validation images predicted after each of our epochs")
    ap.add_argument("--loader-workers", type=int, default=4, help="DataLoader workers of the original recipe")
    ap.add_argument("--find-max-batch", action="store_true", help="CUDA: double B past the largest until OOM")
    ap.add_argument("--max-batch-steps", type=int, default=3, help="steps an epoch while searching the largest B")
    ap.add_argument("--max-batch-limit", type=int, default=65536, help="stop doubling here")
    ap.add_argument("--flop-batch", type=int, default=8, help="images in the FLOP-counting step")
    ap.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of the GPU (overrides the table)")
    ap.add_argument("--eval-splits", type=int, default=77, help="evaluation splits (75 shift + 2 OOD)")
    ap.add_argument("--eval-size", type=int, default=2000, help="images per evaluation split")
    ap.add_argument("--eval-batch-size", type=int, default=1000)
    ap.add_argument("--suite", default="cifar10", help="suite whose method options and workload are used")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    for name, kind in (("dim", int), ("depth", int), ("heads", int), ("patch-size", int), ("mlp-ratio", float)):
        ap.add_argument(f"--{name}", type=kind, default=None, help=f"override the preset's {name} (tiny CPU runs)")
    ap.add_argument("--out", type=Path, default=None, help="write the report here (default: stdout)")
    args = ap.parse_args(argv)
    for key in ("steps", "val_size", "eval_splits", "eval_size", "eval_batch_size", "flop_batch", "max_batch_steps"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be at least 1")
    if args.warmup_steps < 0 or args.loader_workers < 0:
        ap.error("--warmup-steps and --loader-workers must not be negative")
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    return args


def run(args: argparse.Namespace) -> dict:
    """Every measurement; returns the rows :func:`render` turns into the report."""
    start = time.perf_counter()
    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    suite = load_suite(args.suite)
    setups = [method_setup(m, suite, model_overrides(args)) for m in args.methods]
    probe = synthetic_bundle(synthetic_images(2, np.random.default_rng(0)), synthetic_images(1, np.random.default_rng(0)))
    params = {s.name: sum(p.numel() for p in s.method.build_model(s.model_cfg, probe).parameters()) for s in setups}
    ours, ref, evals, max_batch = [], [], [], {}
    for s in setups:
        for batch in args.batch_sizes:
            for compile_on in args.compile:
                print(f"ours {s.name} B={batch} compile={'on' if compile_on else 'off'}", file=sys.stderr, flush=True)
                ours.append(measure_ours(s, batch, compile_on, args, device))
                reset_memory(device)
            print(f"reference {s.name} B={batch}", file=sys.stderr, flush=True)
            ref.append(measure_reference(s, batch, args, device))
            reset_memory(device)
        print(f"eval {s.name}", file=sys.stderr, flush=True)
        evals.append(measure_eval(s, args, device))
        reset_memory(device)
        if args.find_max_batch and device.type == "cuda":
            max_batch[s.name] = find_max_batch(s, 2 * max(args.batch_sizes), args, device)
    flops = None
    msp = next((s for s in setups if s.name == "msp"), None)
    if msp is not None:
        probe_model = build_model(msp, probe, device, args.seed)
        flops = training_flops_per_image(msp.method, probe_model, IMAGE_SHAPE, args.flop_batch, device)
        del probe_model
    name = device_name(device)
    return {
        "device": device, "device_name": name, "setups": setups, "params": params, "ours": ours, "ref": ref,
        "evals": evals, "max_batch": max_batch, "flops": flops, "peak": peak_tflops(name, args.peak_tflops),
        "projection": projection(suite, ours, evals, device), "wall_s": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> str:
    """Measure, render the Markdown report, write it to ``--out`` (or stdout); returns it."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    report = render(run(args), args, argv)
    if args.out is None:
        sys.stdout.write(report)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        print(f"wrote {args.out}", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
