"""A small pre-LayerNorm Vision Transformer whose attention layers come from a registry.

**One place builds attention.**  Every block's attention is made by :func:`make_attention`
from a registered name and keyword options: ``model.attention`` with
``model.attention_options`` unless the method replaces that block.  A method replaces
blocks by returning ``{block index: (registered name, options)}`` from
``TrainedMethod.attention_layers`` (e.g. KEP-SVGP: the last block); every other block is
built exactly as the plain softmax ViT builds it, so a comparison with MSP changes only
the replaced blocks.  Layers are constructed as ``cls(dim=..., heads=..., dropout=...,
**options)`` and map ``[B, N, dim] -> [B, N, dim]``; a layer whose constructor has an
``n_tokens`` keyword also receives the sequence length (KEP-SVGP sizes parameters by it).
The plain ``softmax`` layer lives here; layers that a method introduces live with it.

**Hidden-space tokens** (the one mechanism for a layer that needs more than its block's
normalised input).  A layer may own learned tokens in the model's hidden space,
``layer.hidden_tokens`` (a ``[..., M, dim]`` parameter, None for none): SGPA's global
inducing keys.  Block l hands them to its layer as ``attn(norm1(x), tokens=t)`` with

    t = z                                 in block 0,
    t = norm1_l(z + MLP_{l−1}(z))         in block l ≥ 1,

i.e. they pass through the previous block's MLP with residual and then the block's
LayerNorm (official SGPA ViT, ``vit.py``; the MLP sees the raw tokens, as there).

A layer may also add a regulariser (KL, KSVD) from its last forward pass to the loss: it
derives from ``bench.train.method.LossTerm`` and implements ``extra_loss() -> Tensor | None``.

**Padding** (text).  Every layer's ``forward`` takes ``mask=None``: a ``[B, N]`` bool
tensor, True at real tokens, False at padding (None for images: no padding, and the layer
computes exactly what it computes without the argument).  A layer masks padded keys, so
its outputs at real tokens do not depend on what sits at padded positions.  Blocks pass
the mask only when there is one.

**Noise at prediction time.**  A layer that draws random numbers in a forward pass whatever
the mode (a GP layer's samples, KDEformer's hash directions) says so with the class attribute
``stochastic = True``; one that does not says ``stochastic = False``, and a layer that says
nothing is taken to sample.  A dropout layer draws noise while it is in training mode (MC
Dropout keeps it so at test).  :meth:`Backbone.deterministic_depth` reads this off the
model in its current mode: the blocks before the first noisy one compute the same thing in
every Monte-Carlo pass, so ``bench.train.loop.predict`` runs them once per batch
(:meth:`Backbone.trunk`) and only the rest S times (:meth:`Backbone.tail`).

**Backbones.**  :class:`ViT` (patches of images) and :class:`TextTransformer` (token ids)
differ only in how they embed their input and whether it has padding; both are a
:class:`Backbone`: the same blocks from the same attention constructor, the same forward
loop and the same readout (pooled tokens -> LayerNorm -> Linear; mean pooling over real
tokens, the class token, or sequence pooling).  :func:`backbone` picks the one that fits
a data bundle.
"""
from __future__ import annotations

import inspect
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from bench.data import DataBundle
from bench.core.errors import ConfigError
from bench.core.registry import ATTENTIONS
from bench.config.spec import ModelConfig
from bench.data.text import PAD_ID

AttentionChoice = tuple[str, Mapping]  # (registered attention name, keyword options)


@ATTENTIONS.register("softmax")
class SoftmaxAttention(nn.Module):
    """Multi-head scaled dot-product attention, softmax(QK^T / sqrt(d)) V.

    ``scale = "head"``: d = head width (the usual choice); ``"width"``: d = the model width
    (the official KEP-SVGP ViT divides by sqrt(384) with 12 heads of 32)."""

    stochastic = False  # no noise but its dropout (module docstring, "Noise at prediction time")

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, scale: str = "head") -> None:
        super().__init__()
        if scale not in ("head", "width"):
            raise ConfigError(f"softmax attention: scale must be 'head' or 'width', got {scale!r}")
        self.heads = heads
        self.scale = dim**-0.5 if scale == "width" else (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        keys = None if mask is None else mask[:, None, None, :]  # [B, 1, 1, N]: padded keys get no weight
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys, scale=self.scale)
        return self.drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))

    def extra_repr(self) -> str:
        return f"heads={self.heads}, scale={self.scale:.4g}"


def make_attention(cfg: ModelConfig, n_tokens: int, choice: AttentionChoice | None = None) -> nn.Module:
    """The one constructor of attention layers: ``choice = (name, options)`` from the
    registry (default: ``cfg.attention`` with ``cfg.attention_options``), built with the
    backbone's width, heads and dropout, plus ``n_tokens`` where the layer asks for it."""
    name, options = choice if choice is not None else (cfg.attention, cfg.attention_options)
    cls = ATTENTIONS.get(name, key="model.attention")
    kwargs = dict(options)
    if "n_tokens" in inspect.signature(cls).parameters:
        kwargs["n_tokens"] = n_tokens
    try:
        return cls(dim=cfg.dim, heads=cfg.heads, dropout=cfg.dropout, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"attention {name!r}: bad options {dict(options)}: {exc}") from None


def draws_noise(module: nn.Module) -> bool:
    """Whether a forward pass of ``module`` in its current mode draws random numbers: a
    dropout with p > 0 in training mode, or a layer whose ``stochastic`` is True (module
    docstring, "Noise at prediction time"); checked over every submodule."""
    for m in module.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0:
            return True
        if getattr(m, "stochastic", False):
            return True
    return False


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

    def hidden_tokens(self, previous: "Block | None") -> torch.Tensor | None:
        """The attention's hidden-space tokens as this block hands them over (module
        docstring): raw in block 0, else norm1(z + MLP_prev(z)); None if it owns none."""
        z = getattr(self.attn, "hidden_tokens", None)
        if z is None or previous is None:
            return z
        return self.norm1(z + previous.mlp(z))

    def draws_noise(self) -> bool:
        """Whether a forward pass draws random numbers in the current mode (an attention
        layer that does not say whether it samples is taken to)."""
        return getattr(self.attn, "stochastic", True) or draws_noise(self)

    def forward(self, x: torch.Tensor, previous: "Block | None" = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        kwargs = {}
        if (tokens := self.hidden_tokens(previous)) is not None:
            kwargs["tokens"] = tokens
        if mask is not None:
            kwargs["mask"] = mask
        x = x + self.attn(self.norm1(x), **kwargs)
        return x + self.mlp(self.norm2(x))


class Backbone(nn.Module):
    """What every backbone shares: positions, ``depth`` blocks (attention from
    :func:`make_attention`, replaced where ``attention_layers`` says), the forward loop and
    the readout.  A subclass sets up its embedding and implements :meth:`embed` (input ->
    tokens ``[B, N, dim]``) and, for padded inputs, :meth:`padding_mask`."""

    def __init__(self, stem: tuple[str, nn.Module], n_tokens: int, num_classes: int, cfg: ModelConfig,
                 attention_layers: Mapping[int, AttentionChoice] | None = None) -> None:
        """``stem`` = (attribute name, embedding module), registered before every other
        module: the parameter order (and so the optimiser's and gradient clipping's
        summation order) and the initial weights are those of the original ViT."""
        super().__init__()
        setattr(self, *stem)
        attention_layers = dict(attention_layers or {})
        if bad := sorted(i for i in attention_layers if not 0 <= i < cfg.depth):
            raise ConfigError(f"attention replaced in blocks {bad}, but model.depth is {cfg.depth}")
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.dim)) if cfg.pool == "cls" else None
        n_tokens += 1 if self.cls is not None else 0
        self.pos = nn.Parameter(cfg.pos_init_std * torch.randn(1, n_tokens, cfg.dim))
        self.drop = nn.Dropout(cfg.dropout) if cfg.embed_dropout else nn.Identity()
        self.blocks = nn.ModuleList(
            Block(cfg.dim, cfg.mlp_ratio, cfg.dropout, make_attention(cfg, n_tokens, attention_layers.get(i)), cfg.mlp_final_gelu)
            for i in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, num_classes)
        # ``pool = "sequence"`` (CCT's sequence pooling; the head of SGPA's official ViT): token
        # weights softmax_n(w . x_n + b); created last, so the other models' parameters are unchanged
        self.seqpool = nn.Linear(cfg.dim, 1) if cfg.pool == "sequence" else None

    def positioned(self, x: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[B, N, dim]`` -> with the class token (if any) and positions."""
        if self.cls is not None:
            x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1)
        return self.drop(x + self.pos)

    def padding_mask(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """``[B, N]`` bool, True at real tokens (class token included), or None: no padding."""
        return None

    def readout(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens ``[B, N, dim]`` after the blocks -> pooled (class token, the mean over real
        tokens, or their sequence-pooling average) -> LayerNorm -> logits ``[B, classes]``."""
        if self.cls is not None:
            pooled = x[:, 0]
        elif self.seqpool is not None:
            logits = self.seqpool(x)  # [B, N, 1]
            if mask is not None:
                logits = logits.masked_fill(~mask[..., None], float("-inf"))
            pooled = (torch.softmax(logits, dim=1).transpose(1, 2) @ x).squeeze(1)
        elif mask is None:
            pooled = x.mean(dim=1)
        else:
            w = mask.to(x.dtype).unsqueeze(-1)  # [B, N, 1]
            pooled = (x * w).sum(dim=1) / w.sum(dim=1)
        return self.head(self.norm(pooled))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.tail(*self.trunk(inputs, 0), 0)

    def deterministic_depth(self) -> int | None:
        """How many leading blocks draw no random numbers in the current mode (their output
        is the same in every Monte-Carlo pass); None when the embedding itself does (an
        active embedding dropout)."""
        if draws_noise(self.drop):
            return None
        return next((i for i, block in enumerate(self.blocks) if block.draws_noise()), len(self.blocks))

    def trunk(self, inputs: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The embedding and the first ``depth`` blocks: ``(tokens [B, N, dim], padding mask)``."""
        mask = self.padding_mask(inputs)
        x = self.embed(inputs)
        for i in range(depth):
            x = self.blocks[i](x, self.blocks[i - 1] if i else None, mask)
        return x, mask

    def tail(self, x: torch.Tensor, mask: torch.Tensor | None, depth: int) -> torch.Tensor:
        """Blocks ``depth`` .. end and the readout, on what :meth:`trunk` returned: logits."""
        for i in range(depth, len(self.blocks)):
            x = self.blocks[i](x, self.blocks[i - 1] if i else None, mask)
        return self.readout(x, mask)


class ViT(Backbone):
    """Patch embedding (Conv2d) + learned positions + ``depth`` blocks + pooled linear head.

    ``attention_layers`` maps block indices to the ``(name, options)`` that replace
    ``cfg.attention`` there.  Readout: pooled token (mean of the tokens, as the official
    KEP-SVGP ViT, the class token, or sequence pooling) -> LayerNorm -> Linear.  Input:
    float images ``[B, C, H, W]`` (already normalised); output: logits ``[B, classes]``.
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_classes: int,
        cfg: ModelConfig,
        attention_layers: Mapping[int, AttentionChoice] | None = None,
    ) -> None:
        h, w, c = image_shape
        p = cfg.patch_size
        if h % p or w % p:
            raise ConfigError(f"model.patch_size {p} must divide the image size {h}x{w}")
        patch = nn.Conv2d(c, cfg.dim, kernel_size=p, stride=p)  # first: parameters draw from the RNG in this order
        super().__init__(("patch", patch), (h // p) * (w // p), num_classes, cfg, attention_layers)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``[B, C, H, W]`` -> tokens ``[B, N, dim]`` (patches, class token, positions)."""
        return self.positioned(self.patch(x).flatten(2).transpose(1, 2))


class TextTransformer(Backbone):
    """Token embedding (``<pad>`` = 0 embeds to zeros) + learned positions + ``depth``
    blocks + pooled linear head, for token ids ``[B, max_len]`` padded after the text.
    Padded positions are masked in every attention layer and left out of the mean
    pooling; position 0 always counts as real (an empty text is one ``<pad>`` token)."""

    def __init__(self, vocab_size: int, max_len: int, num_classes: int, cfg: ModelConfig,
                 attention_layers: Mapping[int, AttentionChoice] | None = None) -> None:
        tokens = nn.Embedding(vocab_size, cfg.dim, padding_idx=PAD_ID)  # first, as the ViT's patches
        super().__init__(("tokens", tokens), max_len, num_classes, cfg, attention_layers)
        self.max_len = max_len

    def padding_mask(self, ids: torch.Tensor) -> torch.Tensor:
        mask = ids != PAD_ID
        mask[:, 0] = True
        if self.cls is not None:
            mask = torch.cat([torch.ones_like(mask[:, :1]), mask], dim=1)
        return mask

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] != self.max_len:
            raise ValueError(f"token ids must be [B, {self.max_len}], got {tuple(ids.shape)}")
        return self.positioned(self.tokens(ids))


class HeadInputs:
    """The penultimate features of a model: what its Linear ``head`` reads (a
    :class:`Backbone`'s pooled, normalised token), collected by a forward pre-hook while
    the context is open (nothing for a model without such a head, or when ``on`` is
    False).  :meth:`take` returns the mean over the S passes of the rows read since the
    last call, or None (and stops collecting) when the head did not read S x B rows."""

    def __init__(self, model: nn.Module, on: bool = True) -> None:
        head = getattr(model, "head", None)
        self.rows: list[torch.Tensor] = []
        self.hook = (head.register_forward_pre_hook(lambda _m, args: self.rows.append(args[0].float()))
                     if on and isinstance(head, nn.Linear) else None)

    def take(self, samples: int, batch: int) -> torch.Tensor | None:
        """``[B, D]``: the mean over passes (one call of S*B rows, pass-major, or S calls of B)."""
        rows, self.rows = self.rows, []
        if self.hook is None:
            return None
        if not rows or sum(len(r) for r in rows) != samples * batch:
            self.close()
            return None
        return torch.cat(rows).unflatten(0, (samples, batch)).mean(0)

    def close(self) -> None:
        if self.hook is not None:
            self.hook.remove()
            self.hook = None

    def __enter__(self) -> "HeadInputs":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def backbone(data: DataBundle, cfg: ModelConfig, attention_layers: Mapping[int, AttentionChoice] | None = None) -> Backbone:
    """The backbone for ``data``: a :class:`TextTransformer` for token data (vocabulary and
    length from its tokenizer), else a :class:`ViT` for its image shape."""
    if data.tokenizer is not None:
        return TextTransformer(data.tokenizer.vocab_size, data.tokenizer.max_len, data.num_classes, cfg, attention_layers)
    return ViT(data.image_shape, data.num_classes, cfg, attention_layers)
