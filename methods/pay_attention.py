"""Optimised, Efficient and Super Attention (Hosseini & Hosseini, arXiv 2403.01643).

With X in R^{l x d} the layer input, h heads, d_h = d / h and X_(i) the i-th column slice
of width d_h, the output is [H_1 ... H_h] W^O (W^O in R^{d x d}, with bias) and

    Optimised:  H_i = softmax(X W_i^Q (X W_i^K)^T / sqrt(d_h)) X_(i)   (W^V merged into W^O)
    Efficient:  H_i = softmax(X W_i^Q X_(i)^T / sqrt(d_h)) X_(i)       (W^K merged into W^Q too)
    Super:      H_i = softmax(X W_i^Q X_(i)^T / sqrt(d_h)) (W_A X)_(i)  (W_A in R^{l x l})

Softmax over the keys (the reimplementation's query-axis softmax is the ``axis =
"queries"`` ablation).  Super has one bias-free W_A per layer shared by every head (the
authors' version) and needs a fixed sequence length; ``wa_init = "identity"`` (default,
identity plus N(0, 0.01^2) noise) starts it as Efficient, ``"xavier"`` follows the
reimplementation.  Parameters: Optimised 3d^2 + 3d, Efficient 2d^2 + 2d, Super
2d^2 + 2d + l^2 (softmax attention: 4d^2 + 4d).

Padding (``mask [B, l]``, True at real tokens; ``None`` runs the code above unchanged):
padded keys get no weight in the softmax over keys; with ``axis = "queries"`` padded
queries are left out of the softmax over the queries (their weights are 0) and padded keys
out of the sum over keys.  Super zeroes X's padded rows before W_A X, so W_A mixes real
tokens only.

The authors published no code: the layers follow the paper's equations (``docs/fidelity.md``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.errors import ConfigError
from bench.train.method import TrainedMethod
from bench.core.registry import ATTENTIONS, METHODS


class _PayAttention(nn.Module):
    """Shared machinery: per-head queries (and keys), softmax over ``axis``, output W^O."""

    own_keys = True  # Optimised: keys from W^K; Efficient/Super: keys = X_(i)
    stochastic = False  # no noise but its dropout (bench.train.vit: noise at prediction time)

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, axis: str = "keys") -> None:
        super().__init__()
        if axis not in ("keys", "queries"):
            raise ConfigError(f"attention axis must be 'keys' or 'queries', got {axis!r}")
        self.heads, self.axis = heads, axis
        self.scale = (dim // heads) ** -0.5
        self.qk = nn.Linear(dim, 2 * dim if self.own_keys else dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def heads_of(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        return x.view(b, n, self.heads, c // self.heads).transpose(1, 2)  # [B, H, N, D]

    def values(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.heads_of(x)  # a token's own value: padded keys are masked in the attention

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        if self.own_keys:
            q, k = self.qk(x).view(b, n, 2, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        else:
            q, k = self.heads_of(self.qk(x)), self.heads_of(x)
        if mask is not None:
            return self._masked(q, k, self.values(x, mask), mask.bool())
        values = self.values(x)
        if self.axis == "keys":  # the fused kernel: no N x N matrix kept for the backward pass
            out = F.scaled_dot_product_attention(q, k, values, scale=self.scale)
        else:
            out = torch.softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-2) @ values
        return self.drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))

    def _masked(self, q: torch.Tensor, k: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The attention with padded keys out (and, over the queries, padded queries out)."""
        b, h, n, d = q.shape
        real_key = mask[:, None, None, :]  # [B, 1, 1, N]
        if self.axis == "keys":
            out = F.scaled_dot_product_attention(q, k, values, attn_mask=real_key, scale=self.scale)
        else:
            logits = ((q @ k.transpose(-2, -1)) * self.scale).masked_fill(~mask[:, None, :, None], float("-inf"))
            weights = torch.softmax(logits, dim=-2).masked_fill(~real_key, 0.0)  # padded queries 0; keys out
            out = weights @ values
        return self.drop(self.proj(out.transpose(1, 2).reshape(b, n, h * d)))


@ATTENTIONS.register("optimised")
class OptimisedAttention(_PayAttention):
    """H_i = softmax(X W_i^Q (X W_i^K)^T / sqrt(d_h)) X_(i); 3d^2 + 3d parameters."""


@ATTENTIONS.register("efficient")
class EfficientAttention(_PayAttention):
    """H_i = softmax(X W_i^Q X_(i)^T / sqrt(d_h)) X_(i); 2d^2 + 2d parameters."""

    own_keys = False


@ATTENTIONS.register("super")
class SuperAttention(_PayAttention):
    """Efficient attention with values W_A X, one W_A in R^{l x l} per layer shared by the
    heads (bias-free); 2d^2 + 2d + l^2 parameters.  Needs the fixed length ``n_tokens``."""

    own_keys = False

    def __init__(self, dim: int, heads: int, n_tokens: int, dropout: float = 0.0, axis: str = "keys",
                 wa_init: str = "identity") -> None:
        super().__init__(dim, heads, dropout, axis)
        if wa_init not in ("identity", "xavier"):
            raise ConfigError(f"super attention: wa_init must be 'identity' or 'xavier', got {wa_init!r}")
        self.n_tokens = n_tokens
        self.wa = nn.Parameter(torch.empty(n_tokens, n_tokens))
        if wa_init == "identity":
            with torch.no_grad():
                self.wa.copy_(torch.eye(n_tokens) + 0.01 * torch.randn(n_tokens, n_tokens))
        else:
            nn.init.xavier_uniform_(self.wa)

    def values(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[1] != self.n_tokens:
            raise ConfigError(f"super attention was built for {self.n_tokens} tokens, got {x.shape[1]}")
        if mask is not None:
            x = x.masked_fill(~mask.bool()[..., None], 0.0)  # W_A mixes real tokens only
        return self.heads_of(self.wa.to(x.dtype) @ x)  # W_A mixes tokens, shared by the heads


@dataclass(frozen=True)
class PayOptions:
    axis: Literal["keys", "queries"] = "keys"  # softmax axis (queries: the reimplementation's ablation)


@METHODS.register("optimised_attention")
class OptimisedAttentionMethod(TrainedMethod):
    """ViT with Optimised Attention (values = the input's head slice) in every block."""

    attention = "optimised"
    Options = PayOptions

    def attention_options(self) -> dict:
        return {"axis": self.options.axis}


@METHODS.register("efficient_attention")
class EfficientAttentionMethod(OptimisedAttentionMethod):
    """ViT with Efficient Attention (keys and values = the input's head slice) in every block."""

    attention = "efficient"


@METHODS.register("super_attention")
class SuperAttentionMethod(TrainedMethod):
    """ViT with Super Attention (Efficient + one shared token-mixing W_A) in every block."""

    attention = "super"

    @dataclass(frozen=True)
    class Options(PayOptions):
        wa_init: Literal["identity", "xavier"] = "identity"

    def attention_options(self) -> dict:
        return {"axis": self.options.axis, "wa_init": self.options.wa_init}
