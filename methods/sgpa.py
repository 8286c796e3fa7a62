r"""SGPA: sparse Gaussian process attention (Chen & Li, ICLR 2023; code chenw20/SGPA).

Softmax attention is replaced by the posterior of a sparse GP whose kernel compares
queries and keys, so every attention output is a Gaussian random variable; the network
is trained with cross-entropy on one reparameterised sample plus the layers' KL terms,
and predicts by averaging the softmax probabilities of ``samples`` stochastic passes.

Notation (per head; B batch, T tokens, C width, H heads, D = C / H head width, M global
keys).  ``h`` is the block's LayerNorm output ``[B, T, C]``.

* Keys and queries share one projection (W_q = W_k, needed for a symmetric kernel):
  q = k = W_qk h.  Values v = W_v h.  Since queries and keys are the same tokens,
  q = k = γ below; the equations keep separate letters for readability.
* Kernels (per head; parameters per layer):

  - ``ard``:         k(x, y) = σ · exp(−½ ‖(x − y) / ℓ‖²),  log σ = 0,  log ℓ_d ~ N(0, 1)
  - ``exponential``: k(x, y) = σ · exp(Σ_d x_d y_d / ℓ_d²),  log σ = −4, log ℓ_d ~ 4 + N(0, 1)

* **Decoupled SGPA** (``variant="decoupled"``, the official code).  Two inducing sets:
  β = M global keys k_β (learned, see "Global keys" below) and γ = the sequence's own
  keys, whose inducing values are amortised: v_γ = W_v h.  Global parameters per head:
  v_β ∈ R^{M×D} and, per output dimension d, a whitened lower-triangular factor
  S̃_d^{1/2} (M×M, diagonal exp(·) > 0, initialised to I).  With K̂_ββ = K_ββ + jitter·I
  (used for K_ββ everywhere) and L = chol(K̂_ββ), A = L^{-1} K_βq:

      mean_d  = K_qγ v_γ,d − K_qβ K̂_ββ^{-1} K_βγ v_γ,d + K_qβ v_β,d
      Σ_d     = K_qq − K_qβ K̂_ββ^{-1} K_βq + K_qβ L^{-ᵀ} S̃_d^{1/2} S̃_d^{1/2ᵀ} L^{-1} K_βq
              = K_qq − AᵀA + F_dᵀ F_d,           F_d = S̃_d^{1/2ᵀ} A   (M × T)
      KL      = Σ_{h,d} ½[v_β,dᵀ K̂_ββ v_β,d + E_batch{v_γ,dᵀ (K_γγ − K_γβ K̂_ββ^{-1} K_βγ) v_γ,d}
                          + ‖S̃_d^{1/2}‖_F² − M] − Σ log diag S̃_d^{1/2}

  (amortised term averaged over the batch, everything summed over heads and dims).
  Cost O(T²D + M³ + TM²) per head with the diagonal covariance.

* **Standard SGPA** (``variant="standard"``; from the paper, not in the repository).  The
  inducing points are the T keys of the sequence; K̂ = K_kk + jitter·I is the prior
  covariance of u_d = f_d(k).  The variational posterior is amortised from the tokens:

      q(u_d) = N(K̂ v_d, K̂ Σ_d K̂),   Σ_d = diag(σ_{1,d}², …, σ_{T,d}²),
      log σ_{t,d} = (W_σ h_t)_{hd}   (a Linear like W_v; zero weight and bias at init)

  so, with S_d := Σ_d in the reference's notation (S_d is the whitened-by-K̂^{-1}
  covariance, m_u = K̂ v_d):

      mean_d = K_qk v_d
      Σ_d^f  = K_qq + K_qk (S_d − K̂^{-1}) K_kq = K_qq − AᵀA + F_dᵀF_d,
               A = L^{-1} K_kq,  F_d = diag(σ_{·,d}) K_kq,  L = chol(K̂)
      KL     = Σ_{h,d} E_batch ½[tr(K̂ Σ_d) + v_dᵀ K̂ v_d − T − log|K̂| − log|Σ_d|]
             = KL(N(K̂ v_d, K̂ Σ_d K̂) ‖ N(0, K̂)),

  an exact Gaussian KL against the GP prior at the keys.  Cost O(T³) per head.

* **Covariance.**  ``covariance="diag"`` (HEAD 689cddd): per-token variances
  diag(Σ_d) = k(q_t, q_t) − ‖A_t‖² + ‖F_d,t‖², clamped at 0 against round-off, and
  f = mean + √var · ε.  ``covariance="full"`` (old code 282ba6a): the T×T covariance
  per output dim, sampled as f_d = mean_d + chol(K_qq − AᵀA + jitter·I) ε₁ + F_dᵀ ε₂ with
  standard normal ε₁ (T entries) and ε₂ (one per row of F_d: M decoupled, T standard),
  independent per dim: the same law as chol(Σ_d + jitter·I) ε
  (the old code's per-dim Cholesky), but one T×T Cholesky per head, shared by the dims.
  That Cholesky (and the standard variant's chol(K̂)) retries with 10× the jitter, up to
  three times, when round-off makes the matrix indefinite; K̂ in the KL uses the jitter
  that succeeded.
* **Output.** The sample (``self.sample = True``; ``False`` gives the mean, for tests) of
  every head is concatenated, then W_O (Linear) and dropout.
* **Global keys** (decoupled only).  ``key_passing=True`` (official ViT): the model owns
  M keys z_0 ∈ R^{M×C} in hidden space.  Block l (pre-LN, see :class:`SGPAViT`) feeds its
  attention the normalised keys LN1_l(z_l) next to its tokens LN1_l(x), so
  k_β = W_qk · LN1_l(z_l); after the block the keys take the block's MLP with residual,
  z_{l+1} = z_l + MLP_l(LN2_l(z_l)) (no attention residual: keys do not attend).  Hence
  layer l+1 uses k_β = W_qk^{(l+1)} · LN1_{l+1}(z_l + MLP_l(LN2_l(z_l))): "the previous
  block's MLP + residual and the LayerNorm".  SGPA's ViT shares one LayerNorm module
  across blocks; our blocks each own theirs, and keys always use the same norm as that
  block's tokens (including block 0).  ``key_passing=False``: each layer owns M keys in
  its own input space (the LayerNorm output), k_β = W_qk · keys_l.

* **Loss.**  CE + Σ_layers kl_weight · w · KL (not divided by the data size).  With
  ``kl_anneal`` the weight w ramps linearly from 0 (first step) to 1 at half of the
  optimiser steps, then stays 1; otherwise w = 1.  The training loop's
  ``method.on_train_step(model, step, total_steps)`` hook sets w on every layer before
  each step (a layer used outside ``fit`` keeps w = 1).

Faithful to HEAD 689cddd: decoupled SGPA, diagonal covariance, ARD kernel, keys_len 16,
jitter 1e-6, 10 samples with probability averaging, KL not divided by the data size,
KL annealing (``kl_anneal=True``; off by default here, as the old code, which does not
anneal).  SGPA replaces the attention of every block.  Deviations: per-block LayerNorms (above); the backbone is
:class:`bench.vit.ViT` (Conv2d patches, learned positions, pooling from ``ModelConfig``),
not SGPA's CCT head; the ramp is per optimiser step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import torch
from torch import nn

from bench.data import DataBundle
from bench.method import TrainedMethod
from bench.registry import ATTENTIONS, METHODS
from bench.spec import ModelConfig
from bench.vit import AttentionFactory, Block, ViT


# ----------------------------------------------------------------------------- kernels


class ARDKernel(nn.Module):
    """k(x, y) = σ·exp(−½‖(x − y)/ℓ‖²) per head; log σ = 0, log ℓ_d ~ N(0, 1)."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(heads))
        self.log_lengthscale = nn.Parameter(torch.randn(heads, head_dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``x [..., H, N, D]``, ``y [..., H, P, D]`` (broadcast) -> ``[..., H, N, P]``."""
        ell = self.log_lengthscale.exp()[:, None, :]
        xs, ys = x / ell, y / ell
        sq = (xs * xs).sum(-1)[..., :, None] + (ys * ys).sum(-1)[..., None, :] - 2.0 * xs @ ys.transpose(-1, -2)
        return self.log_scale.exp()[:, None, None] * torch.exp(-0.5 * sq.clamp_min(0.0))


class ExponentialKernel(nn.Module):
    """k(x, y) = σ·exp(Σ_d x_d y_d / ℓ_d²) per head; log σ = −4, log ℓ_d ~ 4 + N(0, 1)."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.full((heads,), -4.0))
        self.log_lengthscale = nn.Parameter(4.0 + torch.randn(heads, head_dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``x [..., H, N, D]``, ``y [..., H, P, D]`` (broadcast) -> ``[..., H, N, P]``."""
        ell = self.log_lengthscale.exp()[:, None, :]
        return self.log_scale.exp()[:, None, None] * torch.exp((x / ell) @ (y / ell).transpose(-1, -2))


KERNELS: dict[str, type[nn.Module]] = {"ard": ARDKernel, "exponential": ExponentialKernel}


def psd_cholesky(mat: torch.Tensor, jitter: float, tries: int = 4) -> tuple[torch.Tensor, float]:
    """Cholesky factor of ``mat + j·I`` for the first ``j`` in jitter·(1, 10, 100, ...) that
    works for the whole batch; returns the factor and that ``j``."""
    eye = torch.eye(mat.shape[-1], dtype=mat.dtype, device=mat.device)
    for attempt in range(tries):
        j = jitter * 10.0**attempt
        chol, info = torch.linalg.cholesky_ex(mat + j * eye)
        if not bool(info.any()):
            return chol, j
    raise RuntimeError(f"SGPA: matrix not positive definite even with jitter {j:g}")


# ----------------------------------------------------------------------------- attention


class Posterior(NamedTuple):
    """Posterior of one SGPA layer's outputs (all heads): ``mean [B, H, T, D]``; ``cov`` is
    the per-token variance ``[B, H, T, D]`` (diag mode) or the covariance over tokens of each
    output dim ``[B, H, D, T, T]`` (full mode); ``kl`` the layer's KL (scalar)."""

    mean: torch.Tensor
    cov: torch.Tensor
    kl: torch.Tensor


class _GP(NamedTuple):
    """What sampling needs: Σ_d = k_qq − aᵀa + factor_dᵀ factor_d."""

    mean: torch.Tensor  # [B, H, T, D]
    k_qq: torch.Tensor  # [B, H, T, T] prior covariance at the queries
    a: torch.Tensor  # [B, H, P, T] L^{-1} K_uq, so that the Nyström term is aᵀa
    factor: torch.Tensor  # [B, H, D, P', T] per-dim F_d of the variational term
    kl: torch.Tensor | None


@ATTENTIONS.register("sgpa")
class SGPAAttention(nn.Module):
    """Sparse-GP attention ``[B, T, C] -> [B, T, C]`` (see the module docstring).

    ``forward(x, keys=None)``: ``x`` is the LayerNorm output; ``keys [M, C]`` are global keys
    in the same space, passed by :class:`SGPAViT` when the model owns them
    (``own_keys=False``); with ``own_keys=True`` the layer uses its own ``self.keys``.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        dropout: float = 0.0,
        *,
        kernel: str = "ard",
        keys_len: int = 16,
        variant: str = "decoupled",
        covariance: str = "diag",
        jitter: float = 1e-6,
        kl_weight: float = 1.0,
        own_keys: bool = True,
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        if variant not in ("decoupled", "standard") or covariance not in ("diag", "full"):
            raise ValueError(f"unknown SGPA variant {variant!r} or covariance {covariance!r}")
        self.heads, self.head_dim = heads, dim // heads
        self.variant, self.covariance, self.jitter = variant, covariance, jitter
        self.qk = nn.Linear(dim, dim)  # W_q = W_k
        self.v = nn.Linear(dim, dim)
        self.kernel = KERNELS[kernel](heads, self.head_dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)
        d, m = self.head_dim, keys_len
        if variant == "decoupled":
            self.keys = nn.Parameter(torch.randn(m, dim)) if own_keys else None
            self.v_beta = nn.Parameter(torch.zeros(heads, m, d))  # q(u_β) starts at the prior
            self.s_log_diag = nn.Parameter(torch.zeros(heads, d, m))  # S̃^{1/2} = I at init
            self.s_offdiag = nn.Parameter(torch.zeros(heads, d, m * (m - 1) // 2))
            self.register_buffer("_tril", torch.tril_indices(m, m, offset=-1), persistent=False)
        else:
            self.log_sigma = nn.Linear(dim, dim)  # W_σ: amortised log σ_{t,d}
            nn.init.zeros_(self.log_sigma.weight)
            nn.init.zeros_(self.log_sigma.bias)
        self.sample = True  # reparameterised sample; False = posterior mean
        self.kl_weight = kl_weight
        self.anneal_weight = 1.0  # set by SGPA.on_train_step
        self._kl: torch.Tensor | None = None

    # --- pieces ------------------------------------------------------------------------
    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """``[..., N, C] -> [..., H, N, D]``, in float32 at least (bf16 autocast off below)."""
        t = t.unflatten(-1, (self.heads, self.head_dim)).transpose(-2, -3)
        return t.to(torch.promote_types(t.dtype, torch.float32))

    def s_sqrt(self) -> torch.Tensor:
        """Whitened factors S̃_d^{1/2} ``[H, D, M, M]``: exp(diag), free strictly-lower part."""
        h, d, m = self.s_log_diag.shape
        low = self.s_offdiag.new_zeros(h, d, m, m)
        low[..., self._tril[0], self._tril[1]] = self.s_offdiag
        return low + torch.diag_embed(self.s_log_diag.exp())

    def _gp(self, x: torch.Tensor, keys: torch.Tensor | None, with_kl: bool) -> _GP:
        q, v = self._heads(self.qk(x)), self._heads(self.v(x))  # [B, H, T, D]
        if self.variant == "decoupled":
            keys = self.keys if keys is None else keys
            if keys is None:
                raise ValueError("this SGPA layer owns no keys: pass keys=[M, C] to forward")
            k_beta = self._heads(self.qk(keys))  # [H, M, D]
        else:
            log_sigma = self._heads(self.log_sigma(x))
        with torch.autocast(device_type=x.device.type, enabled=False):
            if self.variant == "decoupled":
                return self._decoupled(q, v, k_beta, with_kl)
            return self._standard(q, v, log_sigma, with_kl)

    def _decoupled(self, q: torch.Tensor, v: torch.Tensor, k_beta: torch.Tensor, with_kl: bool) -> _GP:
        m = k_beta.shape[-2]
        k_qq = self.kernel(q, q)  # = K_qγ = K_γγ  [B, H, T, T]
        k_bq = self.kernel(k_beta, q)  # K_βq = K_βγ  [B, H, M, T]
        eye = torch.eye(m, dtype=q.dtype, device=q.device)
        k_bb = self.kernel(k_beta, k_beta) + self.jitter * eye  # K̂_ββ [H, M, M]
        chol = torch.linalg.cholesky(k_bb)
        a = torch.linalg.solve_triangular(chol, k_bq, upper=False)  # L^{-1} K_βq  [B, H, M, T]
        v_beta = self.v_beta.to(q.dtype)
        kv, av = k_qq @ v, a @ v  # K_γγ v_γ [B,H,T,D];  L^{-1} K_βγ v_γ [B,H,M,D]
        mean = kv - a.transpose(-1, -2) @ av + k_bq.transpose(-1, -2) @ v_beta
        s_sqrt = self.s_sqrt().to(q.dtype)  # [H, D, M, M]
        factor = s_sqrt.transpose(-1, -2) @ a.unsqueeze(2)  # S̃_d^{1/2ᵀ} A  [B, H, D, M, T]
        kl = None
        if with_kl:
            amortised = ((v * kv).sum((-2, -1)) - (av * av).sum((-2, -1))).mean(0).sum()
            h, d = self.heads, self.head_dim
            glob = (v_beta * (k_bb @ v_beta)).sum() + (s_sqrt * s_sqrt).sum() - h * d * m
            kl = 0.5 * (amortised + glob) - self.s_log_diag.sum()
        return _GP(mean, k_qq, a, factor, kl)

    def _standard(self, q: torch.Tensor, v: torch.Tensor, log_sigma: torch.Tensor, with_kl: bool) -> _GP:
        t = q.shape[-2]
        k = self.kernel(q, q)  # K_qq = K_qk = K_kk  [B, H, T, T]
        chol, jitter = psd_cholesky(k, self.jitter)  # chol(K̂)
        a = torch.linalg.solve_triangular(chol, k, upper=False)  # L^{-1} K_kq
        mean = k @ v
        sigma = log_sigma.exp().transpose(-1, -2)  # [B, H, D, T]
        factor = sigma.unsqueeze(-1) * k.unsqueeze(2)  # diag(σ_d) K_kq  [B, H, D, T, T]
        kl = None
        if with_kl:
            k_hat = k + jitter * torch.eye(t, dtype=k.dtype, device=k.device)
            d = self.head_dim
            trace = (sigma.square() * torch.diagonal(k_hat, dim1=-2, dim2=-1).unsqueeze(2)).sum((-2, -1))
            quad = (v * (k_hat @ v)).sum((-2, -1))
            logdet_k = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
            logdet_s = 2.0 * log_sigma.sum((-2, -1))
            kl = (0.5 * (trace + quad - t * d - d * logdet_k - logdet_s)).mean(0).sum()
        return _GP(mean, k, a, factor, kl)

    @staticmethod
    def _residual(gp: _GP) -> torch.Tensor:
        """K_qq − aᵀa ``[B, H, T, T]``: the prior covariance left unexplained by the inducing set."""
        return gp.k_qq - gp.a.transpose(-1, -2) @ gp.a

    @staticmethod
    def _diag_var(gp: _GP) -> torch.Tensor:
        """Per-token variances ``[B, H, T, D]``, clamped at 0 against round-off."""
        base = torch.diagonal(gp.k_qq, dim1=-2, dim2=-1) - (gp.a * gp.a).sum(-2)  # [B, H, T]
        extra = (gp.factor * gp.factor).sum(-2).transpose(-1, -2)  # [B, H, T, D]
        return (base.unsqueeze(-1) + extra).clamp_min(0.0)

    # --- public ------------------------------------------------------------------------
    def posterior(self, x: torch.Tensor, keys: torch.Tensor | None = None) -> Posterior:
        """Posterior mean, covariance (per ``self.covariance``) and KL for inputs ``x``."""
        gp = self._gp(x, keys, with_kl=True)
        if self.covariance == "diag":
            cov = self._diag_var(gp)
        else:
            cov = self._residual(gp).unsqueeze(2) + gp.factor.transpose(-1, -2) @ gp.factor
        return Posterior(gp.mean, cov, gp.kl)

    def rsample(self, x: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """One reparameterised sample of the heads' outputs ``[B, H, T, D]``."""
        return self._draw(self._gp(x, keys, with_kl=False))

    def _draw(self, gp: _GP) -> torch.Tensor:
        if self.covariance == "diag":
            std = self._diag_var(gp).clamp_min(1e-12).sqrt()
            return gp.mean + std * torch.randn_like(gp.mean)
        chol, _ = psd_cholesky(self._residual(gp), self.jitter)  # [B, H, T, T]
        eps1 = torch.randn_like(gp.mean)  # [B, H, T, D]
        eps2 = torch.randn(*gp.factor.shape[:-1], 1, dtype=gp.mean.dtype, device=gp.mean.device)
        low_rank = (gp.factor.transpose(-1, -2) @ eps2).squeeze(-1).transpose(-1, -2)  # F_dᵀ ε₂
        return gp.mean + chol @ eps1 + low_rank

    def forward(self, x: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        gp = self._gp(x, keys, with_kl=self.training)
        self._kl = gp.kl
        out = self._draw(gp) if self.sample else gp.mean  # [B, H, T, D]
        out = out.transpose(1, 2).flatten(2).to(x.dtype)
        return self.drop(self.proj(out))

    def extra_loss(self) -> torch.Tensor | None:
        """kl_weight · anneal_weight · KL of the last forward, if it ran in training mode."""
        if self._kl is None:
            return None
        return self.kl_weight * self.anneal_weight * self._kl


# ----------------------------------------------------------------------------- model


def block_with_keys(
    block: Block, x: torch.Tensor, keys: torch.Tensor, update_keys: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pre-LN block on tokens ``x [B, T, C]`` that also carries global keys ``[M, C]``:
    the attention sees LN1(keys); the keys then take the block's MLP with residual."""
    x = x + block.attn(block.norm1(x), keys=block.norm1(keys))
    x = x + block.mlp(block.norm2(x))
    if update_keys:
        keys = keys + block.mlp(block.norm2(keys))
    return x, keys


class SGPAViT(ViT):
    """:class:`bench.vit.ViT` whose blocks pass SGPA's global keys along (``keys_len > 0``).

    ``self.keys [M, C]`` (z_0, ~N(0, 1)) live in hidden space; block l uses LN1_l(z_l) as
    its attention's keys and hands z_{l+1} = z_l + MLP_l(LN2_l(z_l)) to block l+1.  With
    ``keys_len = 0`` it is the plain ViT (layers own their keys, or use none).
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_classes: int,
        cfg: ModelConfig,
        attention_for_block: AttentionFactory,
        keys_len: int = 0,
    ) -> None:
        super().__init__(image_shape, num_classes, cfg, attention_for_block)
        self.keys = nn.Parameter(torch.randn(keys_len, cfg.dim)) if keys_len > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        keys = self.keys
        for i, block in enumerate(self.blocks):
            if keys is None:
                x = block(x)
            else:
                x, keys = block_with_keys(block, x, keys, update_keys=i + 1 < len(self.blocks))
        return self.readout(x)


# ----------------------------------------------------------------------------- method


def kl_anneal_weight(step: int, total_steps: int) -> float:
    """Linear ramp 0 → 1 over the first half of training (step 0 has weight 0), then 1."""
    half = total_steps / 2
    return min(1.0, step / half) if half > 0 else 1.0


@METHODS.register("sgpa")
class SGPA(TrainedMethod):
    """ViT with SGPA in every block; CE + weighted KL; averages ``samples`` passes."""

    @dataclass(frozen=True)
    class Options:
        kernel: Literal["ard", "exponential"] = "ard"
        keys_len: int = field(default=16, metadata={"min": 1})  # M global keys per layer (decoupled)
        variant: Literal["decoupled", "standard"] = "decoupled"
        covariance: Literal["diag", "full"] = "diag"
        key_passing: bool = True  # global keys pass through the blocks (decoupled only)
        jitter: float = field(default=1e-6, metadata={"exclusive_min": 0.0})
        kl_weight: float = field(default=1.0, metadata={"min": 0.0})  # η_kl; KL not ÷ N_data
        kl_anneal: bool = False  # linear 0 → 1 over the first half of training (HEAD)
        samples: int = field(default=10, metadata={"min": 1})  # stochastic passes at test
        average: Literal["probs", "logits"] = "probs"

    def _passes_keys(self) -> bool:
        return self.options.key_passing and self.options.variant == "decoupled"

    def attention_for_block(self, cfg: ModelConfig) -> AttentionFactory:
        o = self.options
        kwargs = dict(
            kernel=o.kernel,
            keys_len=o.keys_len,
            variant=o.variant,
            covariance=o.covariance,
            jitter=o.jitter,
            kl_weight=o.kl_weight,
            own_keys=not self._passes_keys(),
        )
        return lambda _block, _n_tokens: SGPAAttention(cfg.dim, cfg.heads, cfg.dropout, **kwargs)

    def build_model(self, cfg: ModelConfig, data: DataBundle) -> SGPAViT:
        keys_len = self.options.keys_len if self._passes_keys() else 0
        return SGPAViT(data.image_shape, data.num_classes, cfg, self.attention_for_block(cfg), keys_len)

    def on_train_step(self, model: nn.Module, step: int, total_steps: int) -> None:
        """Before optimiser step ``step`` of ``total_steps``: set every layer's KL-annealing
        weight (:func:`kl_anneal_weight` with ``kl_anneal``, else 1)."""
        weight = kl_anneal_weight(step, total_steps) if self.options.kl_anneal else 1.0
        for module in model.modules():
            if isinstance(module, SGPAAttention):
                module.anneal_weight = weight
