"""What the Gaussian-process attention layers share (``sgpa``, ``rff_gp_attention``,
``cgpt``/``scgpt``); registers nothing.

* :class:`AnnealedTerm`: a layer whose loss term (a KL or a regulariser) is
  ``weight · anneal_weight · term`` of its last training-mode forward pass; the method sets
  ``anneal_weight`` through :func:`set_anneal_weight` from its training hooks, and a layer
  used outside ``fit`` keeps 1.
* The annealing schedules: :func:`kl_anneal_weight` (per optimiser step),
  :func:`kl_anneal_weight_per_epoch` (SGPA's official per-epoch ramp) and
  :func:`linear_anneal_weight` (CGPT's ``anneal_scheduler``).
* :func:`psd_cholesky`: a Cholesky factor that raises the jitter when round-off makes the
  matrix indefinite.
"""
from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from bench.train.method import LossTerm


class AnnealedTerm(LossTerm):
    """A :class:`~bench.train.method.LossTerm` layer adding ``term_weight · anneal_weight · term``
    to the loss, where ``term`` (``last_term``, a scalar tensor) is what its last forward
    pass computed in training mode (None after an eval-mode pass).  The layer calls
    :meth:`init_term` in its ``__init__`` (after ``nn.Module.__init__``) and sets
    ``last_term`` in every forward; the training log names the term :attr:`term_name`."""

    term_name: ClassVar[str] = "kl"

    def init_term(self, weight: float) -> None:
        """The term's fixed weight (the method's ``kl_weight`` or ``reg_weight``); the
        annealing weight starts at 1 and no term is held yet."""
        self.term_weight = float(weight)
        self.anneal_weight = 1.0  # set by the method's on_train_step / on_train_epoch (set_anneal_weight)
        self.last_term: torch.Tensor | None = None

    def extra_loss(self) -> torch.Tensor | None:
        """term_weight · anneal_weight · term of the last training-mode forward; None otherwise."""
        if not self.training or self.last_term is None:
            return None
        return self.term_weight * self.anneal_weight * self.last_term

    def loss_terms(self) -> dict:
        """``{term_name: term}`` (before weighting) of the last training forward, for the training log."""
        if not self.training or self.last_term is None:
            return {}
        return {self.term_name: self.last_term}


def set_anneal_weight(model: nn.Module, layer: type[AnnealedTerm], weight: float) -> None:
    """Set ``anneal_weight`` of every ``layer`` module of ``model`` to ``weight``."""
    for module in model.modules():
        if isinstance(module, layer):
            module.anneal_weight = weight


def kl_anneal_weight(step: int, total_steps: int) -> float:
    """Linear ramp 0 → 1 over the first half of training (step 0 has weight 0), then 1."""
    half = total_steps / 2
    return min(1.0, step / half) if half > 0 else 1.0


def kl_anneal_weight_per_epoch(epoch: int, epochs: int) -> float:
    """SGPA's official ramp: weight min(1, 2e / E) through epoch e of E (epoch 0 has weight
    0), accumulated by adding 2 / E after each epoch as the official training does."""
    weight = 0.0
    for _ in range(epoch):
        weight += 2 / epochs
    return min(1.0, weight)


def linear_anneal_weight(epoch: int, epochs: int) -> float:
    """CGPT's official ``anneal_scheduler``: e / E in epoch e of E (epoch 0 has weight 0)."""
    return epoch / max(epochs, 1)


def psd_cholesky(mat: torch.Tensor, jitter: float, tries: int = 4,
                 sync_free: bool | None = None) -> tuple[torch.Tensor, float | torch.Tensor]:
    """Cholesky factor of ``mat + j·I`` for the first ``j`` in jitter·(1, 10, 100, ...) that
    works for the whole batch; returns the factor and that ``j``.

    ``sync_free`` (default: on CUDA) never reads a device value on the host: every try is
    factorised, without gradient, in one batched call, the first that works is picked on
    the device (``j`` then is a 0-d tensor), and the factor of ``mat + j·I`` is computed
    once more with gradient (a failed try's factor holds NaN on CUDA, which would reach
    the gradient through a selection).  A matrix that fails every try gets a NaN factor,
    so the training loop's non-finite check fails that cell alone (a device-side assert
    would poison the CUDA context for every later cell).  Otherwise (CPU) the tries run
    one by one, stopping at the first that works, and failing them all raises."""
    eye = torch.eye(mat.shape[-1], dtype=mat.dtype, device=mat.device)
    if mat.is_cuda if sync_free is None else sync_free:
        with torch.no_grad():
            js = jitter * torch.pow(10.0, torch.arange(tries, dtype=mat.dtype, device=mat.device))  # [tries]
            _, info = torch.linalg.cholesky_ex(mat.detach().unsqueeze(0) + js.view(-1, *[1] * mat.dim()) * eye)
            ok = (info == 0).reshape(tries, -1).all(1)  # [tries]: the try works for the whole batch
            j = js.index_select(0, ok.to(torch.int8).argmax().view(1))[0]  # argmax gives the first maximum
        chol, _ = torch.linalg.cholesky_ex(mat + j * eye)
        return chol.masked_fill(~ok.any(), float("nan")), j
    for attempt in range(tries):
        j = jitter * 10.0**attempt
        chol, info = torch.linalg.cholesky_ex(mat + j * eye)
        if not bool(info.any()):
            return chol, j
    raise RuntimeError(f"GP attention: matrix not positive definite even with jitter {j:g}")
