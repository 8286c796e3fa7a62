"""A small pre-LayerNorm Vision Transformer whose attention layers come from a registry.

Attention layers are registered in ``bench.registry.ATTENTIONS`` and constructed as
``cls(dim=..., heads=..., dropout=...)``; they map ``[B, N, dim] -> [B, N, dim]``.  The
plain ``softmax`` layer lives here; layers that a method introduces (SGPA, KEP-SVGP, ...)
live with that method.  A method chooses the attention of each block through
``attention_for_block(block_index, n_tokens)`` (e.g. KEP-SVGP only in the last block).

A layer may also define ``extra_loss() -> Tensor | None``: a regulariser (KL, KSVD) from
its last forward pass, which the training loop adds to the loss.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from bench.errors import ConfigError
from bench.registry import ATTENTIONS
from bench.spec import ModelConfig


@ATTENTIONS.register("softmax")
class SoftmaxAttention(nn.Module):
    """Multi-head scaled dot-product attention, softmax(QK^T / sqrt(d)) V.

    ``scale = "head"``: d = head width (the usual choice); ``"width"``: d = the model width
    (the official KEP-SVGP ViT divides by sqrt(384) with 12 heads of 32)."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, scale: str = "head") -> None:
        super().__init__()
        if scale not in ("head", "width"):
            raise ConfigError(f"softmax attention: scale must be 'head' or 'width', got {scale!r}")
        self.heads = heads
        self.scale = dim**-0.5 if scale == "width" else (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))


class Block(nn.Module):
    """Pre-LN transformer block: x + Attn(LN x), then x + MLP(LN x)."""

    def __init__(self, dim: int, mlp_ratio: float, dropout: float, attention: nn.Module, final_gelu: bool = False) -> None:
        super().__init__()
        hidden = max(1, int(round(dim * mlp_ratio)))
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attention
        self.norm2 = nn.LayerNorm(dim)
        tail = [nn.GELU()] if final_gelu else []
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim), *tail, nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


AttentionFactory = Callable[[int, int], nn.Module]  # (block index, tokens per sequence) -> layer


class ViT(nn.Module):
    """Patch embedding (Conv2d) + learned positions + ``depth`` blocks + pooled linear head.

    Input: float images ``[B, C, H, W]`` (already normalised); output: logits ``[B, classes]``.
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_classes: int,
        cfg: ModelConfig,
        attention_for_block: AttentionFactory | None = None,
    ) -> None:
        super().__init__()
        h, w, c = image_shape
        p = cfg.patch_size
        if h % p or w % p:
            raise ConfigError(f"model.patch_size {p} must divide the image size {h}x{w}")
        if attention_for_block is None:
            attention_for_block = default_attention(cfg)
        self.pool = cfg.pool
        self.patch = nn.Conv2d(c, cfg.dim, kernel_size=p, stride=p)
        n_tokens = (h // p) * (w // p) + (1 if cfg.pool == "cls" else 0)
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.dim)) if cfg.pool == "cls" else None
        self.pos = nn.Parameter(cfg.pos_init_std * torch.randn(1, n_tokens, cfg.dim))
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg.dim, cfg.mlp_ratio, cfg.dropout, attention_for_block(i, n_tokens), cfg.mlp_final_gelu)
            for i in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``[B, C, H, W]`` -> tokens ``[B, N, dim]`` (patches, class token, positions)."""
        x = self.patch(x).flatten(2).transpose(1, 2)  # [B, N, dim]
        if self.cls is not None:
            x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1)
        return self.drop(x + self.pos)

    def readout(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``[B, N, dim]`` after the blocks -> logits ``[B, classes]``."""
        x = self.norm(x)
        return self.head(x[:, 0] if self.cls is not None else x.mean(dim=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.readout(x)


def make_attention(cfg: ModelConfig) -> nn.Module:
    """The backbone's attention layer: ``cfg.attention`` from the registry, built with
    ``cfg.attention_options``."""
    cls = ATTENTIONS.get(cfg.attention, key="model.attention")
    try:
        return cls(dim=cfg.dim, heads=cfg.heads, dropout=cfg.dropout, **cfg.attention_options)
    except TypeError as exc:
        raise ConfigError(f"model.attention_options for {cfg.attention!r}: {exc}") from None


def default_attention(cfg: ModelConfig) -> AttentionFactory:
    """Every block uses :func:`make_attention`."""
    return lambda _block, _n_tokens: make_attention(cfg)
