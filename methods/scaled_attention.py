"""Scaled Attention (Teo & Nguyen, NeurIPS 2024, official ``Scaled_Attention/softmax.py``):
centring the keys' features in the kernel-PCA view of attention gives

    out = softmax(Q K^T / sqrt(D)) (I_N - S) V,

with a learned S in R^{H x N x N} initialised to 0, so the layer starts as softmax
attention (``variant = "matrix"``), or the scalar form (``variant = "scalar"``)

    out = softmax(Q K^T / sqrt(D)) (I_N - alpha softmax(K K^T / sqrt(D))) V,  alpha init 0.

The query/key/value and output projections have the softmax layer's names and shapes.

Padding (``mask [B, N]``, True at real tokens; ``None`` runs the code above unchanged):
padded keys get no weight in softmax(Q K^T) (and, scalar form, in softmax(K K^T)); the
matrix form zeroes V's padded rows before S V, so S mixes real tokens only.

Compared with the official layer: ``docs/fidelity.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from bench.core.errors import ConfigError
from bench.train.method import TrainedMethod
from bench.core.registry import ATTENTIONS, METHODS


@ATTENTIONS.register("scaled")
class ScaledAttention(nn.Module):
    """softmax(QK^T / sqrt(D)) (I - S) V with S learned (init 0): see the module docstring."""

    stochastic = False  # no noise but its dropout (bench.train.vit: noise at prediction time)

    def __init__(self, dim: int, heads: int, n_tokens: int, dropout: float = 0.0,
                 variant: str = "matrix") -> None:
        super().__init__()
        if variant not in ("matrix", "scalar"):
            raise ConfigError(f"scaled attention: variant must be 'matrix' or 'scalar', got {variant!r}")
        self.heads, self.variant = heads, variant
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)
        if variant == "matrix":
            self.s = nn.Parameter(torch.zeros(heads, n_tokens, n_tokens))
        else:
            self.alpha = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if mask is not None:
            return self._masked(q, k, v, mask.bool())
        attn = torch.softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1)
        if self.variant == "matrix":
            centred = v - self.s.to(v.dtype) @ v  # (I - S) V, S broadcast over the batch
        else:
            keys = torch.softmax((k @ k.transpose(-2, -1)) * self.scale, dim=-1)
            centred = v - self.alpha.to(v.dtype) * (keys @ v)
        out = attn @ centred
        return self.drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))

    def _masked(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The forward pass with padded keys out of both softmaxes and of S V."""
        b, h, n, d = q.shape
        pad_key = ~mask[:, None, None, :]  # [B, 1, 1, N]
        attn = torch.softmax(((q @ k.transpose(-2, -1)) * self.scale).masked_fill(pad_key, float("-inf")), dim=-1)
        v = v.masked_fill(~mask[:, None, :, None], 0.0)  # padded rows of V out of S V
        if self.variant == "matrix":
            centred = v - self.s.to(v.dtype) @ v
        else:
            keys = torch.softmax(((k @ k.transpose(-2, -1)) * self.scale).masked_fill(pad_key, float("-inf")), dim=-1)
            centred = v - self.alpha.to(v.dtype) * (keys @ v)
        out = attn @ centred
        return self.drop(self.proj(out.transpose(1, 2).reshape(b, n, h * d)))


@METHODS.register("scaled_attention")
class ScaledAttentionMethod(TrainedMethod):
    """ViT with Scaled Attention (learned centring S, init 0) in every block."""

    attention = "scaled"

    @dataclass(frozen=True)
    class Options:
        variant: Literal["matrix", "scalar"] = "matrix"  # S in R^{H x N x N}, or alpha softmax(KK^T)

    def attention_options(self) -> dict:
        return {"variant": self.options.variant}
