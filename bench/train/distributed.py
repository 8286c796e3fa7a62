"""One cell on several processes: ``torchrun --nproc_per_node K run_suite.py ...``.

torchrun starts K copies of the runner with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set;
:func:`setup` joins them into a process group (NCCL on CUDA, gloo on CPU) and gives each
its device.  Rank 0 is the runner as usual (plan, locks, store, report); the other ranks
*follow*: rank 0 announces each cell it is about to train (:func:`announce`) and they
train it with it, holding no lock and writing nothing.  Inside :func:`bench.train.loop.fit`
the model is wrapped in DistributedDataParallel and every step's global batch (the one a
single process would take, augmented the same way) is split into K equal parts, so the
gradients DDP averages are the single-process gradients.  Loss terms that are means over
the batch and enter the loss non-linearly (KEP-SVGP's KSVD term J²) take their mean over
the global batch through :func:`batch_mean`; terms linear in the batch mean (cross-entropy,
SGPA's amortised KL) and parameter-only terms (KL of the inducing variables) need nothing.

Failures: a non-finite loss is seen by every rank at the same step (the gradients are
averaged) and fails the cell on all of them; any other failure of one rank while the ranks
train together cannot be recovered (the others wait in a collective), so that rank marks
the cell failed where it can and :func:`abort` ends it, and torchrun stops the rest.  The
group's timeout is long (:data:`TIMEOUT`) because rank 0 alone prepares data and predicts
every evaluation split while the others wait for the next cell.

Without a process group (the usual case) every function here is the identity, at no cost.
"""
from __future__ import annotations

import importlib
import os
import sys
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from bench.core.errors import ConfigError


#: how long a rank waits in a collective (rank 0's data preparation and prediction included)
TIMEOUT = timedelta(hours=6)


def world() -> tuple[int, int]:
    """``(rank, world size)``; ``(0, 1)`` without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def active() -> bool:
    """True inside a process group of more than one process."""
    return world()[1] > 1


def setup(device: torch.device) -> torch.device:
    """Join torchrun's process group when ``WORLD_SIZE`` > 1 (else do nothing) and return
    this process's device: ``cuda:LOCAL_RANK`` on CUDA, the CPU otherwise."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1 or (dist.is_available() and dist.is_initialized()):
        return device
    if not dist.is_available():
        raise ConfigError("WORLD_SIZE > 1 (torchrun) but this torch has no torch.distributed")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise ConfigError(f"torchrun rank {local} has no GPU: {torch.cuda.device_count()} visible; "
                              "start at most that many processes (--nproc_per_node)")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    # torch.distributed.nn.functional takes the default group as its functions' default
    # argument, evaluated on import; imported once the group exists (DDP's first use imports
    # it), it would hold the group past destroy_process_group, whose threads would then run
    # on into the interpreter's exit and can abort it.  Imported first, it holds None.
    importlib.import_module("torch.distributed.nn.functional")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=TIMEOUT)
    return device


def abort(reason: str) -> NoReturn:
    """End this rank at once (no collective, no cleanup that could wait on the others):
    torchrun then stops every rank.  A lock this process held is stale at once (its owner
    is gone), so the next run takes the cell over."""
    rank, size = world()
    sys.stderr.write(f"rank {rank} of {size}: {reason}; stopping every rank\n")
    sys.stderr.flush()
    os._exit(1)


def teardown() -> None:
    """Destroy the process group (its threads end here, not at the interpreter's exit)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def announce(message: object | None = None) -> object:
    """Rank 0 sends ``message`` to every rank; the others receive it (their argument is
    ignored).  Used for the cell to train next (and its resume state), or ``None`` = done."""
    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if active():
        dist.barrier()


def batch_mean(values: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The mean of ``values`` over the global batch (``weights``, broadcastable to
    ``values``, weight each element: e.g. 0 at padded tokens).  In one process exactly
    ``values.mean()`` (or the weighted sum over the weight total); under DDP the sums and
    counts of every rank are added, differentiably, so a non-linear function of the mean
    (J² of the KSVD term) is the single-process one."""
    if weights is None:
        if not active():
            return values.mean()
        total, count = values.sum(), values.numel()
    else:
        total = (values * weights).sum()
        count = weights.sum() * (values.numel() / weights.numel())
        if not active():
            return total / count
    count = torch.as_tensor(count, dtype=total.dtype, device=total.device).detach().clone()
    dist.all_reduce(count)
    return _AllSum.apply(total) / count


class _AllSum(torch.autograd.Function):
    """The sum over the ranks, differentiable: the gradient of each rank's input is the sum
    over the ranks of the output's gradients (the sum's adjoint).  Plain blocking
    collectives (torch's own differentiable all_reduce is deprecated)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        t = t.clone()
        dist.all_reduce(t)
        return t

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def all_sum_(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over the ranks in place (no gradient); the identity in one process."""
    if active():
        dist.all_reduce(t)
    return t


def all_min_(t: torch.Tensor) -> torch.Tensor:
    if active():
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return t
