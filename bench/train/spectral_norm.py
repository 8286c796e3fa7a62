"""Spectral normalisation of the backbone's residual branches: the one implementation that
every method bounding its residual branches uses (``methods/sngp.py``, ``methods/ddu.py``).

A residual block ``x + h(x)`` is bi-Lipschitz when ``h`` has Lipschitz constant below 1;
bounding the spectral norm of the dense layers inside ``h`` is how SNGP (Liu et al. 2020)
and DDU (Mukhoti et al. 2023) make the feature map distance-preserving.  For a weight W,
power iteration (buffers u, v; 15 steps at construction, ``iterations`` per training-mode
forward) estimates σ̂ = uᵀ W v and the layer uses

    W_sn = W · min(1, c / σ̂)            c = the bound

which is edward2's ``SpectralNormalization`` and DDU's ``spectral_norm_fc``
(``W / max(1, σ̂ / c)``, omegafragger/DDU ``net/spectral_normalization/spectral_norm_fc.py:98-101``).
In eval mode u and v stay as they are.  Gradients pass through W and σ̂ with u, v held fixed
(torch's ``spectral_norm``).

Which layers: :func:`residual_linears`, the attention's output projection ``attn.proj`` and
both Linear layers of the MLP (``mlp.0``, ``mlp.3``) of every block; query/key/value
projections, patch embedding, LayerNorms and the head are left alone.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from bench.core.errors import ConfigError


class SpectralNormBound(nn.Module):
    """Parametrization W -> W · min(1, bound / σ̂), σ̂ = uᵀ W v from power iteration.

    ``iterations`` power-iteration steps per training-mode call update the buffers u
    (left singular vector, [out]) and v (right, [in]); eval mode uses them as they are.
    Gradients pass through W and σ̂ with u, v held fixed (torch's ``spectral_norm``)."""

    def __init__(self, weight: torch.Tensor, bound: float, iterations: int = 1) -> None:
        super().__init__()
        if weight.ndim != 2:
            raise ValueError(f"spectral normalisation wraps a matrix, got shape {tuple(weight.shape)}")
        self.bound, self.iterations = float(bound), int(iterations)
        out_f, in_f = weight.shape
        self.register_buffer("u", F.normalize(weight.new_empty(out_f).normal_(), dim=0, eps=1e-12))
        self.register_buffer("v", F.normalize(weight.new_empty(in_f).normal_(), dim=0, eps=1e-12))
        self.power_iteration(weight.detach(), 15)  # a converged start, as torch's spectral_norm

    @torch.no_grad()
    def power_iteration(self, weight: torch.Tensor, steps: int) -> None:
        for _ in range(steps):
            self.v.copy_(F.normalize(weight.t() @ self.u, dim=0, eps=1e-12))
            self.u.copy_(F.normalize(weight @ self.v, dim=0, eps=1e-12))

    def sigma(self, weight: torch.Tensor) -> torch.Tensor:
        """σ̂ = uᵀ W v (a 0-d tensor, differentiable in W)."""
        return torch.dot(self.u, weight @ self.v)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=weight.device.type, enabled=False):  # σ̂ in the weight's precision
            if self.training:
                self.power_iteration(weight.detach(), self.iterations)
            sigma = self.sigma(weight)
            return weight * torch.clamp(self.bound / sigma, max=1.0)


def spectral_normalise(linear: nn.Linear, bound: float, iterations: int) -> None:
    """Wrap ``linear.weight`` in :class:`SpectralNormBound` (in place)."""
    parametrize.register_parametrization(linear, "weight", SpectralNormBound(linear.weight, bound, iterations))


def residual_linears(model: nn.Module, method: str = "sngp") -> list[tuple[str, nn.Linear]]:
    """The dense layers of every block's residual branches: ``attn.proj`` (the attention's
    output projection) and the MLP's ``mlp.0`` and ``mlp.3``, with their names in ``model``.
    ``method`` names the method in the error for an attention without ``proj``."""
    out = []
    for i, block in enumerate(model.blocks):
        proj = getattr(block.attn, "proj", None)
        if not isinstance(proj, nn.Linear):
            raise ConfigError(f"{method}: the attention of block {i} ({type(block.attn).__name__}) has no Linear output "
                              "projection `proj` to normalise; use model.attention = \"softmax\" or spectral_norm = false")
        out += [(f"blocks.{i}.attn.proj", proj), (f"blocks.{i}.mlp.0", block.mlp[0]), (f"blocks.{i}.mlp.3", block.mlp[3])]
    return out


def spectral_normalise_residuals(model: nn.Module, bound: float, iterations: int, method: str) -> None:
    """Wrap every layer of :func:`residual_linears` in :class:`SpectralNormBound` (in place)."""
    for _, linear in residual_linears(model, method):
        spectral_normalise(linear, bound, iterations)
