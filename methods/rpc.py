"""RPC-Attention (Teo & Nguyen, NeurIPS 2024): Principal Attention Pursuit on SymViT.

``symmetric``: softmax attention with one shared query/key projection (Q = K), so K K^T /
sqrt(D) is a symmetric Gram matrix, as the kernel-PCA view needs; a Linear(C -> 2C) for
keys and values instead of C -> 3C (attention parameters 3C^2 instead of 4C^2).  The RPC
tables' baseline is this SymViT, not a standard ViT (``docs/reference/attention_variants.md``
section 1).

``pap``: per (batch, head), keys K = L + S (low-rank L, sparse S) by ADMM with one
symmetric softmax-attention pass as the L step, as the official code writes it:

    mu = N C / (4 ||K||_1)   (one scalar per (batch, head), full width C, not detached)
    tau = lambda * mu
    L_0 = Y_0 = 0; for t = 1..T:
        S_t = shrink_tau(K - L_{t-1} + Y_{t-1} / mu)
        K~_t = K - S_t - Y_{t-1} / mu               (the code's minus)
        L_t = softmax(K~_t K~_t^T / sqrt(D)) V
        Y_t = Y_{t-1} + mu (K - L_t - S_t)

shrink_tau(x) = sign(x) max(|x| - tau, 0).  With T = 1 this is symmetric attention on keys
clipped to [-tau, tau].  The official layer has one T per process (``--num_iter``): its
README trains and evaluates with T = 4 (lambda = 4, block 0), and so does the ``rpc``
method by default (``iters_train = iters_test = 4``).  A different T at prediction than in
training is a variant the official code never runs (``Robust/run.sh``'s T = 1 training and
T = 4 evaluation are two unrelated commands, for deit_base and deit_tiny); the method runs
it only when asked by name (``mismatched_iters = true``), and it costs accuracy: on
MNIST-5k (12 epochs, seeds 0/1) trained 1 / tested 4 gave 0.67/0.75 test accuracy, matched
1/1 and 4/4 both 0.85/0.84, SymViT 0.86/0.84.  The fraction of non-zero entries of S (last
iteration, last training batch) is kept per layer and written to the training log: at
some widths tau is large enough that PAP barely acts.  Differences from the official code:
``docs/fidelity.md``.

Padding (``mask [B, N]``, True at real tokens; ``None`` runs the code above unchanged):
padded keys get no weight in every softmax pass, and PAP's mu uses the real tokens only
(N -> the real count N_b, ||K||_1 summed over real tokens), so real tokens' outputs are
those of the unpadded sequence.  The logged sparsity counts real tokens only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.errors import ConfigError
from bench.train.method import TrainedMethod
from bench.core.registry import ATTENTIONS, METHODS
from bench.config.spec import ModelConfig


@ATTENTIONS.register("symmetric")
class SymmetricAttention(nn.Module):
    """Softmax attention with Q = K: softmax(K K^T / sqrt(D)) V, one shared projection."""

    stochastic = False  # no noise but its dropout; PAP's iterations are deterministic too

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(K, V)``, each ``[B, H, N, D]``."""
        b, n, c = x.shape
        k, v = self.kv(x).view(b, n, 2, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        return k, v

    def mix(self, out: torch.Tensor) -> torch.Tensor:
        """Heads ``[B, H, N, D]`` -> ``[B, N, C]`` through the output projection."""
        b, h, n, d = out.shape
        return self.drop(self.proj(out.transpose(1, 2).reshape(b, n, h * d)))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        k, v = self.keys_values(x)
        keys = None if mask is None else key_mask(mask)
        return self.mix(F.scaled_dot_product_attention(k, k, v, attn_mask=keys, scale=self.scale))


def key_mask(mask: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` bool (True = real) -> SDPA's boolean ``attn_mask [B, 1, 1, N]``: padded keys out."""
    return mask.bool()[:, None, None, :]


def shrink(x: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Soft thresholding sign(x) max(|x| - tau, 0), elementwise."""
    return torch.sign(x) * torch.clamp(x.abs() - tau, min=0.0)


@ATTENTIONS.register("pap")
class PAPAttention(SymmetricAttention):
    """Principal Attention Pursuit on the symmetric layer (module docstring)."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, lam: float = 4.0, iters_train: int = 4,
                 iters_test: int = 4) -> None:
        super().__init__(dim, heads, dropout)
        if not lam > 0 or iters_train < 1 or iters_test < 1:
            raise ConfigError(f"pap: lam must be > 0 and iterations >= 1, got lam={lam}, "
                              f"iters_train={iters_train}, iters_test={iters_test}")
        self.dim, self.lam = dim, lam
        self.iters_train, self.iters_test = iters_train, iters_test
        self.register_buffer("s_nonzero", torch.tensor(float("nan")), persistent=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        k, v = self.keys_values(x)
        k32, v32 = k.float(), v.float()  # the ADMM arithmetic in float32 under autocast
        if mask is None:
            n = k.shape[2]
            mu = n * self.dim / (4.0 * k32.abs().sum(dim=(-2, -1), keepdim=True).clamp_min(1e-12))
            keys_mask = None
        else:  # N and ||K||_1 over the real tokens of each sample
            real = mask.bool()[:, None, :, None]  # [B, 1, N, 1]
            n = real.sum(dim=(-2, -1), keepdim=True).to(k32.dtype)  # [B, 1, 1, 1]
            mu = n * self.dim / (4.0 * k32.masked_fill(~real, 0.0).abs().sum(dim=(-2, -1), keepdim=True).clamp_min(1e-12))
            keys_mask = key_mask(mask)
        tau = self.lam * mu
        low = torch.zeros_like(k32)
        dual = torch.zeros_like(k32)
        sparse = low
        for _ in range(self.iters_train if self.training else self.iters_test):
            sparse = shrink(k32 - low + dual / mu, tau)
            keys = k32 - sparse - dual / mu
            low = F.scaled_dot_product_attention(keys, keys, v32, attn_mask=keys_mask, scale=self.scale)
            dual = dual + mu * (k32 - low - sparse)
        if self.training:
            if mask is None:
                self.s_nonzero = (sparse != 0).float().mean().detach()
            else:
                nonzero = ((sparse != 0) & real).float().sum(dim=(-3, -2, -1))  # [B]
                self.s_nonzero = (nonzero.sum() / (n.sum() * sparse.shape[1] * sparse.shape[3])).detach()
        return self.mix(low.to(v.dtype))

    def extra_repr(self) -> str:
        return f"heads={self.heads}, lam={self.lam}, iters_train={self.iters_train}, iters_test={self.iters_test}"


@METHODS.register("symvit")
class SymViT(TrainedMethod):
    """ViT with symmetric (Q = K) softmax attention in every block: RPC's baseline."""

    attention = "symmetric"


@METHODS.register("rpc")
class RPC(TrainedMethod):
    """SymViT with Principal Attention Pursuit in the chosen blocks (``blocks``: "first",
    "all", or block indices such as "0,2"), with one ADMM iteration count for training and
    prediction (the official README's 4) unless ``mismatched_iters`` names the variant."""

    @dataclass(frozen=True)
    class Options:
        lam: float = field(default=4.0, metadata={"exclusive_min": 0.0})  # lambda; tau = lambda * mu
        iters_train: int = field(default=4, metadata={"min": 1})  # ADMM iterations while training (official: 4)
        iters_test: int = field(default=4, metadata={"min": 1})  # ... while predicting: the same count
        mismatched_iters: bool = False  # allow iters_test != iters_train (not the official recipe)
        blocks: str = "first"  # "first", "all" or comma-separated block indices

        def __post_init__(self) -> None:
            if self.iters_train != self.iters_test and not self.mismatched_iters:
                raise ConfigError(
                    f"iters_train ({self.iters_train}) and iters_test ({self.iters_test}) differ: the official "
                    "layer trains and predicts with one count (its README: 4 and 4); set both to one value, or "
                    "mismatched_iters = true to run the mismatched variant on purpose")

    def deviations(self) -> list[str]:
        o = self.options
        if o.iters_train == o.iters_test:
            return []
        return [f"PAP trained with {o.iters_train} ADMM iteration(s), evaluated with {o.iters_test} "
                "(official: one count for both)"]

    def pap_blocks(self, depth: int) -> list[int]:
        spec = self.options.blocks.strip()
        if spec == "first":
            return [0]
        if spec == "all":
            return list(range(depth))
        try:
            blocks = sorted({int(b) for b in spec.split(",") if b.strip()})
        except ValueError:
            blocks = []
        if not blocks or any(not 0 <= b < depth for b in blocks):
            raise ConfigError(f"rpc: blocks must be 'first', 'all' or indices in 0..{depth - 1} "
                              f"such as '0' or '0,1', got {spec!r}")
        return blocks

    def attention_layers(self, cfg: ModelConfig) -> dict:
        o = self.options
        pap = set(self.pap_blocks(cfg.depth))
        options = {"lam": o.lam, "iters_train": o.iters_train, "iters_test": o.iters_test}
        return {b: ("pap", options) if b in pap else ("symmetric", {}) for b in range(cfg.depth)}

    def epoch_log(self, model: nn.Module) -> dict[str, float]:
        """``pap<block>_s_nonzero``: fraction of non-zero entries of S in the last training batch."""
        return {f"pap{i}_s_nonzero": float(block.attn.s_nonzero) for i, block in enumerate(model.blocks)
                if isinstance(block.attn, PAPAttention)}
