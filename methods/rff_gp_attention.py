r"""Random-feature Gaussian-process attention (amirMahfoozi/Random-Feature-Gaussian-Process-
Attention, "Random Feature Gaussian Process Attention: Linear-Time Probabilistic Attention
with Calibrated Uncertainty"; layer ``SGP_LAYER`` of ``CIFAR-Dataset/sgp_layer_rff.py`` at
9845de9, the file its ViT ``CIFAR-Dataset/vit.py`` builds every block from).

Each head regresses the values on random Fourier features of the keys (Bayesian linear
regression in feature space = a GP with the random-feature kernel) and predicts at the
queries, so the cost is O(N M² + M³) per head: linear in the number of tokens N, for M
features.  The output is a sample of the predictive distribution; the KL of the feature
weights' posterior to N(0, I) is added to the loss.

Equations, per head (B batch, N tokens, C = H·D channels, M = 2·``features``)
-------------------------------------------------------------------------------
x ∈ R^{B×N×C} is the block's LayerNorm output.

1. q, v = one bias-free Linear C → 2C, laid out per head as [q_h; v_h] (the official
   ``fc_qv`` viewed as [B, N, H, 2D] and split); keys are the queries (K ≡ Q).
2. Features (fixed buffers Ω₀ ∈ R^{D×M/2} with orthonormal columns, the QR of a Gaussian
   matrix, and phases p ~ U(0, 2π)^{M/2}; trained log σ_f, log ℓ ∈ R^D, log σ²):
        z = (q ⊙ c/ℓ) Ω₀ + p,   c = √2 (``kernel="ard"``) or 1 (``"exponential"``),
        φ(q) = √σ_f · [cos z, sin z] / √M  ∈ R^M.
   With padding (``mask``) the keys' feature rows of padded tokens are zeroed: Φ_K = Φ_Q ⊙ m.
3. A = Φ_Kᵀ Φ_K + (σ² + j) I  (M × M; j = ``jitter``, ×10 up to three times when the
   Cholesky fails), A = RᵀR.
4. Posterior (weights of the regression, per output dim, N(W*, σ² A^{-1})):
        W* = A^{-1} Φ_Kᵀ V,   mean = Φ_Q W*,   var = σ² · diag(Φ_Q A^{-1} Φ_Qᵀ) (shared by the D dims)
5. Output: f = mean + √var ⊙ ε (ε ~ N(0, 1) per batch, head, token and dim; ``sample =
   False`` gives the mean), heads concatenated, W_O (Linear C → C), dropout.
6. KL per (sample, head) of N(W*, σ² A^{-1}) (D columns) to N(0, I):
        KL = ½ [ D σ² tr(A^{-1}) + ‖W*‖²_F − M D − D (M log σ² − log|A|) ]
   summed over heads and averaged over the batch; the loss adds ``kl_weight`` × (annealing
   weight) × Σ_layers KL, not divided by the data size.

Initialisation as the official layer: log σ_f = 0, log ℓ = 0, log σ² = −2, Ω₀ and p drawn once
per layer; jitter 1e-6.  Every block of the official ViT uses this layer (one sample per
forward), and its evaluation averages the softmax probabilities of 10 forward passes: the
method ``rff_gp_attention`` uses the layer in every block, with ``samples = 10`` and
``average = "probs"``.

Recipe and departures
---------------------
The repository ships the layer, the ViT and an evaluation script, but no CIFAR training
script; its ViT and evaluation are SGPA's (chenw20/SGPA) with the layer swapped.  We train
with SGPA's CIFAR objective: CE + KL weight 1, annealed 0 → 1 over the first half of
training when ``kl_anneal`` (on in the CIFAR suites, as SGPA's CIFAR training; per
optimiser step, SGPA's default here).  Departures: (1) the backbone is the suite's ViT
(``sgpa``'s ``preset = "uqbench"`` blocks and readout; the official ViT is SGPA's, with a
shared LayerNorm and sequence pooling); the official ViT's per-layer ``keys`` parameters,
which this layer ignores, are not created.  (2) With more features than head dimensions
(M/2 > D) the official QR takes a D×D block and the shapes no longer match (it raises); we
stack independent D×D orthogonal blocks and keep M/2 columns.  (3) Padding (text) is
handled as above; the official CIFAR layer has no mask.  (4) The features, A, its
Cholesky, the posterior and the KL run in float32 (or wider) under bf16 autocast.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from bench.train.method import MonteCarlo, TrainedMethod
from bench.core.registry import ATTENTIONS, METHODS
from methods._gp import AnnealedTerm, kl_anneal_weight, psd_cholesky, set_anneal_weight

KERNELS = ("ard", "exponential")


def orthonormal_columns(heads: int, rows: int, cols: int) -> torch.Tensor:
    """``[heads, rows, cols]``: per head, ``cols`` orthonormal columns of length ``rows`` from
    the QR of a standard normal matrix; when cols > rows, independent rows × rows orthogonal
    blocks side by side (each block's columns orthonormal)."""
    blocks = []
    for _ in range(heads):
        parts, left = [], cols
        while left > 0:
            take = min(left, rows)
            q, _ = torch.linalg.qr(torch.randn(rows, take), mode="reduced")  # [rows, take]
            parts.append(q)
            left -= take
        blocks.append(torch.cat(parts, dim=1))
    return torch.stack(blocks)


@ATTENTIONS.register("rff_gp")
class RFFGPAttention(AnnealedTerm, nn.Module):
    """Random-feature GP attention, ``[B, N, dim] -> [B, N, dim]`` (module docstring).

    ``features`` = M/2 (the official ``keys_len``): M = 2·features cos/sin features per
    head.  ``self.sample = False`` returns the posterior mean.  After a training-mode
    forward ``last_term`` holds that pass's KL and ``extra_loss()`` returns
    ``kl_weight · anneal_weight · KL`` (:class:`methods._gp.AnnealedTerm`)."""

    stochastic = True  # samples the GP output in every forward pass (bench.train.vit: noise at prediction time)

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, *, features: int = 16, kernel: str = "ard",
                 jitter: float = 1e-6, kl_weight: float = 1.0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        if features < 1:
            raise ValueError(f"features must be >= 1, got {features}")
        h, d = heads, dim // heads
        self.heads, self.head_dim, self.features, self.kernel = h, d, features, kernel
        self.jitter = float(jitter)
        self.init_term(kl_weight)
        self.sample = True
        self.qv = nn.Linear(dim, 2 * dim, bias=False)  # per head [q_h; v_h]
        self.proj = nn.Linear(dim, dim)  # W_O
        self.drop = nn.Dropout(dropout)
        self.log_sf = nn.Parameter(torch.zeros(h, 1))  # σ_f
        self.log_ls = nn.Parameter(torch.zeros(h, d))  # ℓ (ARD, per head)
        self.log_sigma2 = nn.Parameter(torch.tensor(-2.0))  # σ²
        self.register_buffer("omega", orthonormal_columns(h, d, features))  # Ω₀: [H, D, M/2]
        self.register_buffer("phase", 2 * math.pi * torch.rand(h, features))  # p: [H, M/2]

    def feature_map(self, q: torch.Tensor) -> torch.Tensor:
        """φ(q) ``[B, H, N, M]`` from queries ``[B, H, N, D]`` (float32 or wider)."""
        c = math.sqrt(2.0) if self.kernel == "ard" else 1.0
        omega = self.omega * (c * torch.exp(-self.log_ls))[..., None]  # [H, D, M/2]
        z = torch.einsum("bhnd,hdm->bhnm", q, omega.to(q.dtype)) + self.phase[None, :, None, :].to(q.dtype)
        amp = torch.exp(self.log_sf).sqrt()[None, :, :, None].to(q.dtype)  # [1, H, 1, 1]
        return amp * torch.cat([torch.cos(z), torch.sin(z)], dim=-1) / math.sqrt(2 * self.features)

    def posterior(self, x: torch.Tensor, mask: torch.Tensor | None = None, with_kl: bool = True):
        """``(mean, var, kl, v)`` for the block input ``x [B, N, C]``: mean ``[B, H, N, D]``,
        var ``[B, H, N, 1]`` (shared by the D dims), the KL (scalar: heads summed, batch
        averaged; None without ``with_kl``, as prediction needs none) in float32 or wider."""
        b, n, c = x.shape
        h, d = self.heads, self.head_dim
        q, v = self.qv(x).view(b, n, h, 2 * d).transpose(1, 2).chunk(2, dim=-1)  # [B, H, N, D] each
        with torch.autocast(device_type=x.device.type, enabled=False):
            dtype = torch.promote_types(q.dtype, torch.float32)
            q, v = q.to(dtype), v.to(dtype)
            phi_q = self.feature_map(q)  # [B, H, N, M]
            phi_k = phi_q if mask is None else phi_q * mask[:, None, :, None].to(dtype)  # padded keys: no rows
            m = phi_q.shape[-1]
            sigma2 = torch.exp(self.log_sigma2).to(dtype)
            a = phi_k.transpose(-1, -2) @ phi_k + sigma2 * torch.eye(m, dtype=dtype, device=x.device)  # [B, H, M, M]
            chol, _ = psd_cholesky(a, self.jitter)  # A + j I = L Lᵀ (L = Rᵀ)
            eye = torch.eye(m, dtype=dtype, device=x.device).expand_as(chol)
            l_inv = torch.linalg.solve_triangular(chol, eye, upper=False)  # L^{-1}: one M x M solve, then products
            t_q = l_inv @ phi_q.transpose(-1, -2)  # L^{-1} Φ_Qᵀ: [B, H, M, N]
            s = l_inv @ (phi_k.transpose(-1, -2) @ v)  # L^{-1} Φ_Kᵀ V: [B, H, M, D]
            mean = t_q.transpose(-1, -2) @ s  # Φ_Q A^{-1} Φ_Kᵀ V
            var = sigma2 * t_q.pow(2).sum(-2)[..., None]  # σ² ‖L^{-1} φ_q‖²: [B, H, N, 1]
            if not with_kl:
                return mean, var, None, v
            w_star = l_inv.transpose(-1, -2) @ s  # A^{-1} Φ_Kᵀ V
            tr_a_inv = l_inv.pow(2).sum((-2, -1))  # tr(A^{-1}) = ‖L^{-1}‖²_F: [B, H]
            logdet_a = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
            kl = 0.5 * (d * sigma2 * tr_a_inv + w_star.pow(2).sum((-2, -1)) - m * d
                        - d * (m * torch.log(sigma2) - logdet_a))  # [B, H]
        return mean, var, kl.sum(1).mean(), v

    def forward(self, x: torch.Tensor, eps: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x [B, N, C]`` -> ``[B, N, C]``; ``eps [B, H, N, D]`` fixes the sample's noise;
        ``mask [B, N]`` (True at real tokens) leaves padded keys out of the regression."""
        b, n, c = x.shape
        mean, var, kl, _ = self.posterior(x, mask, with_kl=self.training)
        f = mean
        if self.sample:
            if eps is None:
                eps = torch.randn(mean.shape, device=mean.device, dtype=mean.dtype)
            f = mean + var.clamp_min(0).sqrt() * eps.to(mean.dtype)
        out = self.drop(self.proj(f.transpose(1, 2).reshape(b, n, c).to(x.dtype)))
        self.last_term = kl
        return out

    def extra_repr(self) -> str:
        return (f"heads={self.heads}, features={self.features} (M={2 * self.features}), kernel={self.kernel!r}, "
                f"jitter={self.jitter:g}, kl_weight={self.term_weight:g}")


@METHODS.register("rff_gp_attention")
class RFFGPAttentionMethod(TrainedMethod):
    """A ViT with random-feature GP attention in every block (as the official ViT), trained
    with CE + KL, predicting with the mean probability of ``samples`` passes."""

    attention = "rff_gp"
    official = {"features": 16, "samples": 10, "average": "probs"}

    @dataclass(frozen=True)
    class Options(MonteCarlo):
        features: int = field(default=16, metadata={"min": 1})  # M/2 (official keys_len); M = 2·features
        kernel: Literal["ard", "exponential"] = "ard"
        jitter: float = field(default=1e-6, metadata={"exclusive_min": 0.0})
        kl_weight: float = field(default=1.0, metadata={"min": 0.0})  # KL not ÷ data size
        kl_anneal: bool = False  # linear 0 → 1 over the first half of training (SGPA's CIFAR training)

    def attention_options(self) -> dict:
        o = self.options
        return {"features": o.features, "kernel": o.kernel, "jitter": o.jitter, "kl_weight": o.kl_weight}

    def on_train_step(self, model: nn.Module, step: int, total_steps: int) -> None:
        """Before each optimiser step: every layer's KL-annealing weight (the linear ramp of
        ``methods._gp.kl_anneal_weight`` with ``kl_anneal``, else 1)."""
        set_anneal_weight(model, RFFGPAttention, kl_anneal_weight(step, total_steps) if self.options.kl_anneal else 1.0)

    def deviations(self) -> list[str]:
        """Where these options leave the official layer and evaluation (module docstring)."""
        o, ref = self.options, self.official
        out = o.pass_deviations(ref)
        if o.features != ref["features"]:
            out.append(f"{o.features} feature pairs per head (official CIFAR keys_len: {ref['features']})")
        return out
