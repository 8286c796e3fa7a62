"""The one training loop and the one prediction routine, shared by every trained method.

Adam or AdamW (fused where torch offers it: CUDA), linear warm-up then cosine decay to
``min_lr`` (stepped per batch), gradient-norm clipping, validation after every epoch and
the best-validation-accuracy weights kept (ties keep the earlier epoch).  Method-specific
loss terms enter through ``method.training_loss``.  The data sit on the training device
as uint8 and are cropped, flipped and normalised there in batches; ``[train] precision``
"auto" runs the forward pass under bf16 autocast on CUDA and in float32 on CPU, where
everything is deterministic for a seed.  ``[train] compile`` compiles the training
forward, falling back to eager execution (with the reason recorded) when it fails.

The step loop never waits for the device: no ``.item()``, no Python branch on a device
value.  A non-finite loss is flagged on the device and checked at the end of the epoch,
which raises :class:`~bench.core.errors.NonFiniteLoss` naming the epoch and step.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from bench.train import distributed
from bench.data import DataBundle, Split, TokenSplit
from bench.core.errors import ConfigError, NonFiniteLoss
from bench.train.method import LossTerm, TrainedMethod
from bench.config.spec import TrainConfig
from bench.train.vit import Backbone, HeadInputs
from bench.store import Predictions


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available; use --device cpu or auto")
    if name not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be auto, cpu or cuda, got {name!r}")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def to_tensor(split: Split | TokenSplit, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A split's inputs and labels on ``device``: uint8 images as ``[N, C, H, W]`` uint8
    (normalised per batch by :class:`Normalize`), token ids as they are (int64)."""
    x = torch.from_numpy(np.ascontiguousarray(split.x))
    if isinstance(split, Split):
        x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
    return x.contiguous().to(device), torch.from_numpy(split.y).to(device)


class Normalize:
    """A batch as the model takes it: images to float, normalised with the bundle's pixel
    statistics; token ids unchanged (the text backbone embeds them)."""

    def __init__(self, data: DataBundle, device: torch.device) -> None:
        self.text = data.tokenizer is not None
        if not self.text:
            self.mean = torch.tensor(data.mean, device=device).view(1, -1, 1, 1) * 255.0
            self.std = torch.tensor(data.std, device=device).view(1, -1, 1, 1) * 255.0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.text else (x.float() - self.mean) / self.std


def augment(x: torch.Tensor, ops: tuple[str, ...], gen: torch.Generator) -> torch.Tensor:
    """Random crop with 4-pixel zero padding and/or horizontal flip, per sample, on uint8 NCHW.
    The offsets are drawn on ``gen``'s device (on the GPU: no copy, no wait, per step)."""
    b, _, h, w = x.shape
    if "crop" in ops:
        pad = 4
        padded = F.pad(x, (pad, pad, pad, pad))
        oy = torch.randint(0, 2 * pad + 1, (b,), generator=gen, device=gen.device).to(x.device)
        ox = torch.randint(0, 2 * pad + 1, (b,), generator=gen, device=gen.device).to(x.device)
        rows = (oy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
        cols = (ox[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
        idx_b = torch.arange(b, device=x.device)[:, None, None, None]
        idx_c = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
        x = padded[idx_b, idx_c, rows, cols]
    if "flip" in ops:
        flip = (torch.rand(b, generator=gen, device=gen.device) < 0.5).to(x.device)
        x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return x


def lr_factor(step: int, total: int, warmup: int, lr: float, min_lr: float) -> float:
    """Multiplier of the base lr: linear warm-up over ``warmup`` steps, then cosine to min_lr."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return (min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))) / lr


def switched_on(setting: bool | str, device: torch.device) -> bool:
    """Whether a ``[train]`` switch whose "auto" means "on CUDA" (``compile``,
    ``batch_passes``; the bf16 of ``precision``) is on for ``device``: true, or "auto" on a
    CUDA device."""
    return setting is True or (setting == "auto" and device.type == "cuda")


_FLUSHING = threading.local()  # how deep this thread is in flushing_denormals calls


def flushing_denormals(fn):
    """Run ``fn`` (which takes a ``device`` argument) with denormal floats flushed to zero
    when the device is the CPU, and restore the default afterwards.

    SGPA's kernel produces denormals, which x86 processors of some makes handle in
    microcode (a training step several times slower); flushing them costs nothing
    measurable on processors without that penalty.  Scoped to training and prediction, so
    that numbers computed later in the process (analysis, numpy) keep the default float
    behaviour; nested calls (``fit`` validates with ``predict``) leave the flag to the
    outermost.  The flag is per thread: torch sets it on the calling thread."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if signature.bind(*args, **kwargs).arguments["device"].type != "cpu":
            return fn(*args, **kwargs)
        depth = getattr(_FLUSHING, "depth", 0)
        if depth == 0:
            torch.set_flush_denormal(True)
        _FLUSHING.depth = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _FLUSHING.depth = depth
            if depth == 0:
                torch.set_flush_denormal(False)

    return wrapper


def autocast(device: torch.device, precision: str = "auto"):
    """The forward pass's precision (``[train] precision``): bf16 autocast for "bf16", and
    for "auto" on CUDA; float32 otherwise.  Layers keep their delicate parts in float32."""
    if precision == "bf16" or switched_on(precision, device):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """Adam or AdamW over ``model``'s parameters; the fused kernel on CUDA (one launch for
    every parameter; CPU keeps the default for-each implementation, whose results the
    committed CPU reference runs were made with)."""
    opt_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    kwargs = {"fused": True} if device.type == "cuda" else {}
    try:
        return opt_cls(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, **kwargs)
    except (RuntimeError, TypeError, ValueError):  # a torch or parameter type without the fused kernel
        return opt_cls(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


class CompiledForward:
    """``torch.compile(model)`` when wanted.  torch compiles at the first call (the forward)
    and the first backward, so the loop runs its first step as a *trial*
    (:attr:`on_trial`): if that step or the creation fails, the eager model takes over for
    good, with the reason kept in :attr:`status`; after a successful trial an error is an
    error."""

    def __init__(self, model: torch.nn.Module, wanted: bool) -> None:
        self.model, self.fn = model, model
        self.status = "off"
        self.on_trial = wanted
        if wanted:
            try:
                self.fn, self.status = torch.compile(model), "on"
            except Exception as exc:  # noqa: BLE001 - any compiler failure falls back
                self.fall_back(exc)

    def fall_back(self, exc: BaseException) -> None:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        self.fn, self.status = self.model, f"failed, trained eagerly: {type(exc).__name__}: {first}"
        self.on_trial = False


def _entropy(log_p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) over the last axis of log-probabilities (0 log 0 = 0)."""
    return -(log_p.exp() * log_p.nan_to_num(neginf=0.0)).sum(-1)


def decomposition_terms(sample_lp: torch.Tensor, mean_lp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(total, aleatoric)`` [B] in nats of S passes: total = H[(1/S) sum_s p_s] (from
    ``mean_lp`` [B, C], the log of the mean probability) and aleatoric = (1/S) sum_s H[p_s]
    (from ``sample_lp`` [S, B, C]); their difference is the mutual information (epistemic).

    The torch twin of :func:`bench.metrics.decompose` (the same formula, the one numpy
    definition), kept so that :func:`predict` computes the terms on the device without
    moving S x B x C probabilities to the host; ``tests/bench/train/test_loop.py`` checks that the two agree."""
    return _entropy(mean_lp), _entropy(sample_lp).mean(0)


@torch.no_grad()
@flushing_denormals
def predict(
    method: TrainedMethod, model: torch.nn.Module, split: Split | TokenSplit, data: DataBundle, device: torch.device,
    batch_size: int, extras: bool = False, precision: str = "auto",
    batch_passes: bool | str = "auto", features: bool = False, on_pass: Callable[[int], None] | None = None,
) -> Predictions:
    """The split's :class:`~bench.store.Predictions` with the method's S passes and
    averaging rule: ``log_probs`` [N, C] (float32; ``logits``: softmax of the mean logit,
    ``probs``: mean probability) and the split's ``labels``.

    With ``extras``, also what OOD scores read (float32): ``logits`` [N, C], the mean
    logit over the S passes; for S > 1 three numbers per image instead of all S x C
    probabilities: ``entropy_of_mean`` = H[(1/S) sum_s p_s] (total) and ``mean_entropy``
    = (1/S) sum_s H[p_s] (aleatoric; :func:`decomposition_terms`, nats) and
    ``prob_variance`` = sum_c Var_s[p_s,c]; with ``features`` too, ``features`` [N, D] =
    the head's input averaged over the passes (:class:`~bench.train.vit.HeadInputs`; the head is
    linear, so ``logits`` = head(features)), absent for a model without a Linear head.

    With ``batch_passes`` (``[train] batch_passes``; "auto" = on CUDA) and a method whose
    noise is drawn per input (:attr:`TrainedMethod.batched_samples`), the S passes run as
    one forward of the batch repeated S times, over ``batch_size // S`` images at a time,
    so every forward holds about ``batch_size`` inputs; otherwise S forwards of
    ``batch_size`` images.  Either way only the blocks from the first one that draws noise
    run S times (:func:`passes`).  Results stay on the device until the end.

    ``on_pass(n)`` (progress) is called after each pass with the number of images it ran
    (``len(split) * S`` in all)."""
    method.eval_mode(model)
    norm = Normalize(data, device)
    x_all, y_all = to_tensor(split, device)
    samples = method.samples
    batched = samples > 1 and method.batched_samples and switched_on(batch_passes, device)
    chunk = max(1, batch_size // samples) if batched else batch_size
    parts: list[Predictions] = []  # per batch, on the device
    with HeadInputs(model, on=extras and features) as head_inputs:
        for i in range(0, len(x_all), chunk):
            x = norm(x_all[i : i + chunk])
            with autocast(device, precision):
                logits = passes(model, x, samples, batched, on_pass)
            sample_lp = F.log_softmax(logits, dim=-1)
            mean_lp = torch.logsumexp(sample_lp, dim=0) - math.log(samples)  # log of the mean probability
            lp = F.log_softmax(logits.mean(0), dim=-1) if method.average == "logits" else mean_lp
            part = Predictions(lp, y_all[i : i + chunk])
            if extras:
                part = _with_extras(part, logits, sample_lp, mean_lp, head_inputs.take(samples, len(x)))
            parts.append(part)
    return Predictions.concat(parts, _to_numpy)


def _with_extras(part: Predictions, logits: torch.Tensor, sample_lp: torch.Tensor, mean_lp: torch.Tensor,
                 features: torch.Tensor | None) -> Predictions:
    """One batch's predictions with the extras of :func:`predict`: the mean logit, the
    decomposition terms for several passes, the features where the head's input was read."""
    part = part.replace(logits=logits.mean(0), features=features)
    if len(logits) == 1:
        return part
    h_mean, mean_h = decomposition_terms(sample_lp, mean_lp)
    return part.replace(entropy_of_mean=h_mean, mean_entropy=mean_h,
                        prob_variance=sample_lp.exp().var(0, correction=0).sum(-1))


def _to_numpy(batches: list[torch.Tensor]) -> np.ndarray:
    """Batches of one prediction array joined on the host (floats as float32)."""
    joined = torch.cat(batches)
    return (joined.float() if joined.is_floating_point() else joined).cpu().numpy()


def passes(model: torch.nn.Module, x: torch.Tensor, samples: int, batched: bool,
           on_pass: Callable[[int], None] | None = None) -> torch.Tensor:
    """Logits ``[S, B, C]`` (float32) of ``samples`` forward passes of ``x``.

    The blocks before the first one that draws noise in the model's current mode
    (:meth:`bench.train.vit.Backbone.deterministic_depth`) give the same output in every pass:
    they run once (:meth:`~bench.train.vit.Backbone.trunk`), and only the rest S times
    (:meth:`~bench.train.vit.Backbone.tail`), drawing the same random numbers in the same order
    as S whole forwards would.  ``batched``: the S tails as one forward of the trunk's
    output repeated S times (pass s reads rows s*B .. (s+1)*B - 1).  ``on_pass(n)`` is
    called after each pass (the S batched ones: once) with the images it ran."""
    depth = model.deterministic_depth() if samples > 1 and isinstance(model, Backbone) else None
    if depth is None:
        h, mask, tail = x, None, lambda t, m: model(t)
    else:
        h, mask = model.trunk(x, depth)
        tail = lambda t, m: model.tail(t, m, depth)  # noqa: E731
    tick = on_pass or (lambda _n: None)
    if batched:
        repeat = h.repeat(samples, *[1] * (h.dim() - 1))
        out = tail(repeat, None if mask is None else mask.repeat(samples, 1)).float().unflatten(0, (samples, len(x)))
        tick(samples * len(x))
        return out
    out = []
    for _ in range(samples):
        out.append(tail(h, mask).float())
        tick(len(x))
    return torch.stack(out)


def optimiser_steps(n: int, batch_size: int) -> int:
    """Optimiser steps per epoch of :func:`fit` on ``n`` training samples: full batches of
    ``min(batch_size, n)``, the last partial batch dropped, as the reference recipe does."""
    return n // min(batch_size, n)


@dataclass
class TrainResult:
    state_dict: dict
    best_epoch: int
    best_val_acc: float
    log: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    compile: str = "off"  # "on", "off" or "failed, trained eagerly: <reason>"


#: the columns every training log row has (:func:`fit`); any other column is the method's own
LOG_COLUMNS = ("epoch", "lr", "train_loss", "train_ce", "train_acc", "val_acc", "val_nll", "seconds")


@dataclass
class EpochSums:
    """What one training epoch adds up on the device (read once, at its end): the loss and
    the cross-entropy weighted by batch size, the correct predictions, each named
    regulariser's sum over the steps, and the first step whose loss was not finite (-1:
    none) with that loss."""
    loss: torch.Tensor
    ce: torch.Tensor
    correct: torch.Tensor
    bad_step: torch.Tensor
    bad_loss: torch.Tensor
    terms: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def zeros(cls, device: torch.device) -> EpochSums:
        return cls(torch.zeros((), device=device), torch.zeros((), device=device), torch.zeros((), device=device),
                   torch.full((), -1, dtype=torch.long, device=device), torch.zeros((), device=device))

    def flag(self, s: int, loss: torch.Tensor, term_layers: list[LossTerm]) -> None:
        """Before step ``s``'s update: its regularisers (summed over layers) and whether its
        loss is the epoch's first non-finite one."""
        for layer in term_layers:
            for name, value in layer.loss_terms().items():
                value = torch.as_tensor(value).detach().float()
                self.terms[name] = self.terms[name] + value if name in self.terms else value
        first_bad = (self.bad_step < 0) & ~torch.isfinite(loss.detach())
        self.bad_step = torch.where(first_bad, s, self.bad_step)
        self.bad_loss = torch.where(first_bad, loss.detach().float(), self.bad_loss)

    def add(self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        """A step's batch: its loss, cross-entropy and correct predictions."""
        self.loss += loss.detach() * len(y)
        self.ce += F.cross_entropy(logits.detach().float(), y) * len(y)
        self.correct += (logits.argmax(-1) == y).sum()

    def all_reduce(self, steps: int) -> None:
        """Across a process group: the first step any rank saw a non-finite loss at, and
        the global sums."""
        bad = distributed.all_min_(torch.where(self.bad_step >= 0, self.bad_step, steps))
        self.bad_step = torch.where(bad < steps, bad, -1)
        distributed.all_sum_(self.loss)
        distributed.all_sum_(self.ce)
        distributed.all_sum_(self.correct)

    def check(self, epoch: int, steps: int, one_process: bool) -> None:
        """:class:`NonFiniteLoss` naming the epoch and step when a loss was not finite (the
        epoch's one look at the flag); the loss too in one process."""
        if int(self.bad_step) >= 0:
            value = f" {float(self.bad_loss)}" if one_process else ""
            raise NonFiniteLoss(f"non-finite training loss{value} at epoch {epoch + 1}, "
                                f"step {int(self.bad_step) + 1} of {steps}")


class Trainer:
    """The training of one model by :func:`fit`, as named steps: :meth:`step` (one batch),
    :meth:`epoch` (the steps of an epoch, validation, the log row, the best weights) and
    the resume state, :meth:`state` and :meth:`resume`: the weights, the optimiser and
    schedule, the random generators, the epoch, the best weights so far and the log.

    Built in the order the random streams need: the epoch-order generator (``gen``, seeded
    with ``seed``; on CPU it also draws the augmentation, on the GPU ``aug_gen`` does), the
    data on the device, the optimiser and its warm-up + cosine schedule, the model wrapped
    for a process group and compiled when wanted, and the untrained weights as the best so
    far."""

    def __init__(self, method: TrainedMethod, model: torch.nn.Module, data: DataBundle, cfg: TrainConfig,
                 device: torch.device, seed: int, on_step: Callable[[], None] | None = None) -> None:
        self.start = time.perf_counter()
        self.method, self.model, self.data, self.cfg, self.device, self.on_step = method, model, data, cfg, device, on_step
        self.gen = torch.Generator().manual_seed(seed)  # the epoch order (and, on CPU, the augmentation)
        self.aug_gen = self.gen if device.type == "cpu" else torch.Generator(device).manual_seed(seed)
        train, self.val = data.get("train"), data.get("val")
        if cfg.augment and data.tokenizer is not None:
            raise ConfigError(f"train.augment {list(cfg.augment)} crops and flips images; dataset {data.name!r} is "
                              "text: set augment = [] for it")
        self.x_train, self.y_train = to_tensor(train, device)
        self.norm = Normalize(data, device)
        self.bs = min(cfg.batch_size, len(self.x_train))  # the batch optimiser_steps counts
        self.rank, self.size = distributed.world()
        if self.bs % self.size:
            raise ConfigError(f"train.batch_size {self.bs} cannot be split over {self.size} torchrun processes: "
                              f"use a multiple of {self.size}, or --nproc_per_node dividing it")
        per_rank = self.bs // self.size
        self.part = slice(self.rank * per_rank, (self.rank + 1) * per_rank)  # this rank's share of every batch
        self.steps_per_epoch = optimiser_steps(len(self.x_train), cfg.batch_size)
        self.total = total = self.steps_per_epoch * cfg.epochs
        warmup = self.steps_per_epoch * cfg.warmup_epochs
        self.opt = make_optimizer(model, cfg, device)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt,
                                                       lambda s: lr_factor(s, total, warmup, cfg.lr, cfg.min_lr))
        net = model
        if self.size > 1:
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        self.forward = CompiledForward(net, switched_on(cfg.compile, device))
        self.term_layers = [m for m in model.modules() if isinstance(m, LossTerm)]
        self.best = TrainResult(copy.deepcopy(model.state_dict()), -1, -1.0)

    def state(self, epoch: int) -> dict:
        """Everything :meth:`resume` needs to continue after ``epoch`` epochs (tensors and
        plain values only, so ``torch.load(weights_only=True)`` reads it); ``aug_gen``, the
        augmentation's generator, is saved apart when it is not ``gen`` (on the GPU)."""
        best = self.best
        state = {
            "epoch": epoch, "model": self.model.state_dict(), "opt": self.opt.state_dict(),
            "sched": self.sched.state_dict(), "gen": self.gen.get_state(), "torch_rng": torch.get_rng_state(),
            "seconds": time.perf_counter() - self.start,
            "best_state": best.state_dict, "best_epoch": best.best_epoch, "best_val_acc": best.best_val_acc,
            "log": best.log,
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        if self.aug_gen is not self.gen:
            state["aug_gen"] = self.aug_gen.get_state()
        return state

    def resume(self, state: dict) -> int:
        """Load a :meth:`state` (its seconds count as already spent); returns the first epoch
        still to run."""
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
        self.gen.set_state(state["gen"])
        if self.aug_gen is not self.gen and "aug_gen" in state:
            self.aug_gen.set_state(state["aug_gen"])
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and "cuda_rng" in state:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.best.state_dict = state["best_state"]
        self.best.best_epoch, self.best.best_val_acc = int(state["best_epoch"]), float(state["best_val_acc"])
        self.best.log = list(state["log"])
        self.start -= float(state.get("seconds", 0.0))
        return int(state["epoch"])

    def _backward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward, loss and gradients of one batch (the optimiser steps after)."""
        with autocast(self.device, self.cfg.precision):
            logits = self.forward.fn(self.norm(x))
            loss = self.method.training_loss(self.model, logits, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        return loss, logits

    def batch(self, perm: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``s``'s batch of the epoch order ``perm``, augmented, this rank's part of it."""
        idx = perm[s * self.bs : (s + 1) * self.bs]
        x = self.x_train[idx]
        if self.cfg.augment:
            x = augment(x, self.cfg.augment, self.aug_gen)
        y = self.y_train[idx]
        return (x[self.part], y[self.part]) if self.size > 1 else (x, y)

    def step(self, x: torch.Tensor, y: torch.Tensor, s: int, sums: EpochSums) -> None:
        """One optimiser step on a batch, added to ``sums``.  The first compiled step is the
        compiler's trial: a failure there falls back to the eager model and retries the step
        (a genuine error recurs in the retry)."""
        if self.forward.on_trial:
            try:
                loss, logits = self._backward(x, y)
                self.forward.on_trial = False
            except Exception as exc:  # noqa: BLE001 - a genuine error recurs in the eager retry
                self.forward.fall_back(exc)
                loss, logits = self._backward(x, y)
        else:
            loss, logits = self._backward(x, y)
        sums.flag(s, loss, self.term_layers)
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        sums.add(loss, logits, y)
        if self.on_step is not None:
            self.on_step()

    def validate(self) -> tuple[float, float]:
        """Validation accuracy and NLL (rank 0; NaN on the other ranks)."""
        if self.rank != 0:
            return float("nan"), float("nan")
        val = self.val
        val_lp = predict(self.method, self.model, val, self.data, self.device, self.cfg.eval_batch_size,
                         precision=self.cfg.precision, batch_passes=self.cfg.batch_passes).log_probs
        return float((val_lp.argmax(1) == val.y).mean()), float(-val_lp[np.arange(len(val.y)), val.y].mean())

    def epoch(self, epoch: int) -> dict:
        """Train epoch ``epoch`` (0-based), validate, and return its log row (kept in the
        log; the weights kept when validation accuracy beats the best so far)."""
        self.model.train()
        t0 = time.perf_counter()
        perm = torch.randperm(len(self.x_train), generator=self.gen).to(self.device)
        sums = EpochSums.zeros(self.device)
        self.method.on_train_epoch(self.model, epoch, self.cfg.epochs)
        for s in range(self.steps_per_epoch):
            x, y = self.batch(perm, s)
            self.method.on_train_step(self.model, epoch * self.steps_per_epoch + s, self.total)
            self.step(x, y, s, sums)
        if self.size > 1:
            sums.all_reduce(self.steps_per_epoch)
        sums.check(epoch, self.steps_per_epoch, self.size == 1)
        val_acc, val_nll = self.validate()
        seen = self.steps_per_epoch * self.bs
        row = {
            "epoch": epoch + 1,
            "lr": self.opt.param_groups[0]["lr"],
            "train_loss": float(sums.loss) / seen,
            "train_ce": float(sums.ce) / seen,
            "train_acc": float(sums.correct) / seen,
            "val_acc": val_acc,
            "val_nll": val_nll,
            "seconds": time.perf_counter() - t0,
            **self.method.epoch_log(self.model),
            **{name: float(total) / self.steps_per_epoch for name, total in sums.terms.items()},
        }
        self.best.log.append(row)
        if val_acc > self.best.best_val_acc:
            self.best.state_dict = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
            self.best.best_epoch, self.best.best_val_acc = epoch + 1, val_acc
        return row

    def checkpoint_due(self, done: int, row: dict) -> bool:
        """Whether a resume state is due after ``done`` epochs (the last one excepted):
        every ``checkpoint_every`` epochs, or (0) after an epoch that took over a minute."""
        every = self.cfg.checkpoint_every
        return done < self.cfg.epochs and (done % every == 0 if every else row["seconds"] > 60)

    def finish(self) -> TrainResult:
        """The model with the best weights loaded, and the result with the total seconds
        and the compiler's status."""
        self.model.load_state_dict(self.best.state_dict)
        self.best.seconds = time.perf_counter() - self.start
        self.best.compile = self.forward.status
        return self.best


@flushing_denormals
def fit(
    method: TrainedMethod,
    model: torch.nn.Module,
    data: DataBundle,
    cfg: TrainConfig,
    device: torch.device,
    seed: int,
    on_epoch: Callable[[dict], None] | None = None,
    resume: dict | None = None,
    on_checkpoint: Callable[[dict], None] | None = None,
    on_step: Callable[[], None] | None = None,
) -> TrainResult:
    """Train ``model`` on ``data``'s train split, validating on ``val`` after each epoch.

    Resumable: at the end of an epoch due for it (``cfg.checkpoint_every``; 0 = every epoch
    once one took over a minute) ``on_checkpoint`` receives the training state (model,
    optimiser, schedule, RNG states, epoch, best-so-far, log); ``resume`` = such a state
    (checked with :func:`bench.train.state.read_training_state` when it comes from a file) continues from
    the next epoch and ends with the same weights as an uninterrupted run (bit for bit on
    CPU).

    Inside a process group of K processes (torchrun, :mod:`bench.train.distributed`) the model
    trains under DistributedDataParallel: each step's global batch of ``batch_size`` is
    drawn and augmented as in one process, and each rank takes its K-th part, so the
    averaged gradients, the logged loss and the weights are the single-process ones (up
    to float summation order and per-rank dropout noise).  Only rank 0 validates.

    Each epoch's log row (``on_epoch(row)``, :attr:`TrainResult.log`) holds the columns of
    :data:`LOG_COLUMNS` -- the epoch, the learning rate, the training objective
    (``train_loss``: the cross-entropy plus the method's terms, as optimised), its data term
    alone (``train_ce``: the cross-entropy of the training logits), the training accuracy,
    the validation accuracy and NLL, the seconds -- then the method's :meth:`~bench.train.method.TrainedMethod.epoch_log` and the epoch's
    mean of each named regulariser of its :class:`~bench.train.method.LossTerm` layers
    (:meth:`~bench.train.method.LossTerm.loss_terms`, summed over layers).  ``on_step()`` is
    called after every optimiser step (progress)."""
    trainer = Trainer(method, model, data, cfg, device, seed, on_step)
    first = trainer.resume(resume) if resume is not None else 0
    for epoch in range(first, cfg.epochs):
        row = trainer.epoch(epoch)
        if on_epoch is not None:
            on_epoch(row)
        if on_checkpoint is not None and trainer.checkpoint_due(epoch + 1, row):
            on_checkpoint(trainer.state(epoch + 1))
    return trainer.finish()
