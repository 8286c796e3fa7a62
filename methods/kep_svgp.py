r"""KEP-SVGP: self-attention as a pair of sparse variational Gaussian processes built from
the kernel SVD of the attention matrix (Chen et al., ICML 2024, arXiv 2402.01476).

Primal-Attention showed that softmax-free attention with a kernel K_att can be written in
its primal form through the asymmetric kernel SVD (KSVD) of K_att: the left and right
singular "projection scores" e(X), r(X) of the queries and keys, and the singular values
Λ.  KEP-SVGP puts a sparse variational GP on each side, with the s singular directions as
inducing features, so the kernel matrix to invert is the diagonal Λ² (O(s), not O(N³)).
The layer output is a *sample* of the GP posterior; its KL to the prior and the KSVD
objective are added to the cross-entropy.  The official code (yingyichen-cyy/KEP-SVGP,
``CIFAR/model/kep_svgp.py``) is what "faithful" below reproduces.

Equations, per head (notation of ``docs/reference/kep_svgp_and_sgpa.md`` §2-3)
-----------------------------------------------------------------------------
B batch, N tokens, C = h·d channels (h heads of width d), s = ``rank``; x ∈ R^{B×N×C} is
the block's LayerNorm output.

1. Queries and keys, one bias-free Linear C → 2C, no value projection, unit-normalised
   over the head dimension:  φ_q = q/‖q‖₂,  φ_k = k/‖k‖₂  ∈ R^{N×d}.
2. Data-dependent projection weights: X_h ∈ R^{N'×d} is head h's channel slice of the raw
   input x, with N' = s·rank_multi evenly spaced tokens n_k = ⌊k(N−1)/(N'−1)⌋ when
   N > s·rank_multi (else N' = N, all tokens).  W̃_e, W̃_r ∈ R^{h×N'×s} are learned
   (orthogonal init) and  W_e = X_hᵀ W̃_e,  W_r = X_hᵀ W̃_r  ∈ R^{d×s}  (per sample).
3. Projection scores:  e = φ_q W_e,  r = φ_k W_r  ∈ R^{N×s}.
4. Singular values: D = diag(exp ℓ_λ), ℓ_λ ~ U(0, 1) at init.  The code calls D "Λ^{-1/2}",
   so  Λ = D^{-2},  Λ^{-1} = D²,  and the inducing prior covariance is
   K_uu = Λ² = D^{-4},  K_uu^{-1} = D⁴.
5. Variational posterior q(u) of the s inducing outputs (m_u ∈ R^{h×s×s}: rows = inducing
   features a, columns = output dims j), with triangular factors built from ℓ_S ∈ R^{h×s×s}
   and T ∈ R^{h×s×s×s} (all N(0, 1) at init):
        L[h, x, y, z] = δ_yz · exp(ℓ_S[h, x, y]) + 1[z < y] · T[h, x, y, z].
6. Posterior of the outputs, both branches sharing (m_u, L):
        A = (e + r) D²        ∈ R^{N×s}    (``merge="add"``)
        A = [e; r] D²         ∈ R^{2N×s}   (``merge="concat"``, stacked along tokens)
        μ = A m_u,            f = μ + (noise, §"faithful vs clean"),
   tokens independent (per-token marginals; the conditional term K_ff − Q_ff is dropped,
   as in the paper and the code).
7. Output: ``final_weight`` Linear(s → d) shared by all heads; with concatenation a further
   Linear over tokens 2N → N (the paper's O = W₁ᶜᵃᵗ Fᶜᵃᵗ W₂ᶜᵃᵗ); heads reshaped to (B, N, C);
   dropout.  **No output projection** (the official ``self.proj`` is commented out).

Regularisers (per layer), added to the loss as  η_ksvd · J² + η_kl · KL:

    J  = ½ mean_{b,h,n} ‖e_n D‖² + ½ mean_{b,h,n} ‖r_n D‖² − tr( mean_h W̃_eᵀ W̃_r )

(the trace uses the *parameters* W̃, not the data-dependent W = XᵀW̃ — official choice), and
the KL of the mode below.  The KL is not divided by the data-set size (η_kl = 1 in the
paper); η_ksvd = 1 for addition, 10 for concatenation (the official run scripts).

Paper-faithful vs clean mode (``mode=``; default ``"faithful"``)
-----------------------------------------------------------------
Both modes have the same parameters and the same posterior mean; they read the factor
tensor L differently, which changes the sampling noise and the KL.

* ``"faithful"`` — the official code.  L[h, a, i, j] is indexed (inducing feature a, noise
  index i, output dim j) and sampling contracts A with the *first* index:
        f[n, j] = μ[n, j] + Σ_{a,i} A[n, a] · L[h, a, i, j] · ε[n, i],
  with ε ~ N(0, 1) per (sample, head, token, i), **shared across the s output dims** of a
  token.  Hence the per-token covariance over output dims is full:
        Cov(f[n, j], f[n, k]) = Σ_i B[n, i, j] B[n, i, k],   B[n, i, j] = Σ_a A[n, a] L[a, i, j],
  i.e. q(u_j) has covariance S_j = M_j M_jᵀ with M_j[a, i] = L[a, i, j], whose columns
  i < j are zero (S_j is singular for j > 0).  The KL is the official formula
        KL = ½ Σ_{h,a,i,j} D_{h,a}⁴ L[h,a,i,j]² + ½ Σ_{h,j} m_{:,j}ᵀ D_h⁴ m_{:,j}
             − Σ_{h,a,i} ℓ_S[h,a,i] − 2s · Σ_{h,a} ℓ_λ[h,a] − ½ s² h.
  Its trace and mean terms are those of Σ_j KL(N(m_j, S_j) ‖ N(0, D^{-4})), but the
  "−Σ ℓ_S" log-det term treats L[h, a] as a triangular factor, which is not log|S_j|
  (the true KL of a singular S_j is infinite).  Copy this to reproduce the published
  numbers.
* ``"clean"`` — a consistent SVGP.  L[h, j, a, b] is read as a lower-triangular factor
  L_j (rows a = inducing features) of S_j = L_j L_jᵀ for output dim j, and each output dim
  gets its own noise:
        f[n, j] = μ[n, j] + Σ_{a,b} A[n, a] · L_j[a, b] · ε[n, j, b],
  so Cov(f[n, j], f[n, k]) = δ_jk · A_n S_j A_nᵀ (output dims independent, as in SGPA).
  The KL is the true Gaussian KL, summed over heads and output dims,
        KL = Σ_{h,j} KL( N(m_j, S_j) ‖ N(0, K_uu) ),   K_uu = D^{-4},
           = ½ Σ_{h,j} [ tr(D⁴ S_j) + m_jᵀ D⁴ m_j − s + log|D^{-4}| − log|S_j| ]
           = ½ Σ_{h,j,a,b} D_{h,a}⁴ L_j[a,b]² + ½ Σ_{h,j} m_jᵀ D_h⁴ m_j
             − Σ_{h,j,a} ℓ_S[h,j,a] − 2s · Σ_{h,a} ℓ_λ[h,a] − ½ s² h,
  which differs from the faithful formula only in the index that D⁴ weights in the trace
  term (log|S_j| = 2 Σ_a ℓ_S[h, j, a] because L_j is triangular with diagonal exp ℓ_S).

Everything else (η values, no 1/N_data scaling of the KL, logit averaging of the MC
samples) is an option of :class:`KEPSVGP`, not of the mode.  ``docs/fidelity.md`` lists
every difference from the official code with its file and line.  Token subsampling uses the
exact integers ⌊k(N−1)/(N'−1)⌋; the official ``torch.linspace(..., dtype=int)`` computes in
float32 and can be one lower on rare (N, N') pairs (not on CIFAR, where N' = N, nor on
N = 512, N' = 100).

Padding (text; ``mask [B, N]``, True at real tokens)
----------------------------------------------------
``mask=None`` runs the code above unchanged.  With a mask, as the official CoLA code:
queries and keys of padded tokens are zeroed before the normalisation, so e = r = 0 there
(A = 0, so f = 0: no data and no noise at padded tokens).  X_h keeps real
tokens only: with subsampling, N' evenly spaced positions over each sample's real length
L_b, the ⌊k(L_b − 1)/(N' − 1)⌋-th real token (repeated when L_b < N'; the official code
takes "10 evenly spaced tokens, repeated when the sentence is shorter"), gathered per
sample; without subsampling (N' = N) all positions with X_h's padded rows zeroed.  With
concatenation the padded rows are zeroed before the 2N → N token map, so they add nothing
to real tokens' outputs.  J's two means run over the real tokens only (over all real
(b, n) pairs and the heads); the KL does not depend on the tokens.

Methods registered here
-----------------------
* ``kep_svgp``: a ViT whose last ``layers`` blocks use :class:`KEPSVGPAttention`, trained
  with CE + η_ksvd ΣJ² + η_kl ΣKL, predicting with ``samples`` stochastic passes whose
  logits are averaged (the paper's rule).  The GP layer samples in eval mode too.
* ``kep_svgp_ensemble``: the deep-ensemble combinator over stored ``kep_svgp`` predictions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from bench.train.distributed import batch_mean
from bench.core.errors import ConfigError
from bench.train.method import LossTerm, MonteCarlo, TrainedMethod
from bench.core.registry import ATTENTIONS, METHODS
from bench.config.spec import ModelConfig
from methods.deep_ensemble import Ensemble, EnsembleOptions

MERGES = ("add", "concat")
MODES = ("faithful", "clean")


def subsample_index(n_tokens: int, n_keep: int) -> torch.Tensor:
    """``n_keep`` evenly spaced token indices ⌊k(N−1)/(n_keep−1)⌋, k = 0..n_keep−1 (int64)."""
    if n_keep == 1:
        return torch.zeros(1, dtype=torch.long)
    k = torch.arange(n_keep, dtype=torch.long)
    return (k * (n_tokens - 1)) // (n_keep - 1)


def masked_subsample_index(mask: torch.Tensor, n_keep: int) -> torch.Tensor:
    """Per sample, the positions of ``n_keep`` evenly spaced real tokens: the
    ⌊k(L_b − 1)/(n_keep − 1)⌋-th real token (in order), L_b = real tokens of row b, repeated
    when L_b < n_keep.  ``mask [B, N]`` bool (True = real, at least one per row) -> ``[B, n_keep]``."""
    mask = mask.bool()
    real_first = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)  # real positions first, in order
    length = mask.sum(1, keepdim=True)  # [B, 1]
    k = torch.arange(n_keep, dtype=torch.long, device=mask.device)
    rank = torch.zeros_like(k)[None].expand(len(mask), -1) if n_keep == 1 else (k * (length - 1)) // (n_keep - 1)
    return torch.gather(real_first, 1, rank)


@ATTENTIONS.register("kep_svgp")
class KEPSVGPAttention(LossTerm, nn.Module):
    """KEP-SVGP attention layer, ``[B, N, dim] -> [B, N, dim]`` (see the module docstring).

    ``n_tokens`` (N) is fixed at construction: it sets N' = min(N, rank·rank_multi), the
    size of W̃_e, W̃_r, and (concatenation) the 2N → N token map.  ``self.sample = False``
    returns the posterior-mean output (no noise).  After a training-mode forward,
    ``last_ksvd`` (J) and ``last_kl`` hold that pass's regularisers and ``extra_loss()``
    returns ``eta_ksvd · J² + eta_kl · KL``.
    """

    stochastic = True  # samples the GP in every forward pass (bench.train.vit: noise at prediction time)

    def __init__(
        self,
        dim: int,
        heads: int,
        dropout: float = 0.0,
        *,
        n_tokens: int,
        rank: int = 10,
        rank_multi: int = 10,
        merge: str = "add",
        mode: str = "faithful",
        eta_ksvd: float | None = None,
        eta_kl: float = 1.0,
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        if merge not in MERGES:
            raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if min(n_tokens, rank, rank_multi) < 1:
            raise ValueError(f"n_tokens, rank and rank_multi must be >= 1, got {n_tokens}, {rank}, {rank_multi}")
        h, d, s = heads, dim // heads, rank
        self.heads, self.head_dim, self.rank, self.n_tokens = h, d, s, n_tokens
        self.merge, self.mode = merge, mode
        self.eta_ksvd = float(eta_ksvd) if eta_ksvd is not None else (1.0 if merge == "add" else 10.0)
        self.eta_kl = float(eta_kl)
        self.sample = True  # False: posterior mean only

        # §1 queries and keys (no value projection)
        self.qk = nn.Linear(dim, 2 * dim, bias=False)
        # §2 W̃_e, W̃_r: [h, N', s]; N' evenly spaced tokens of the input when N > s·rank_multi
        n_keep = min(n_tokens, rank * rank_multi)
        index = subsample_index(n_tokens, n_keep) if n_keep < n_tokens else None  # [N'] or None (all)
        self.register_buffer("token_index", index, persistent=False)
        # orthogonal_ on [h, N', s] flattens to h × (N'·s), as the official code does
        self.w_e = nn.Parameter(nn.init.orthogonal_(torch.empty(h, n_keep, s)))
        self.w_r = nn.Parameter(nn.init.orthogonal_(torch.empty(h, n_keep, s)))
        # §4 ℓ_λ: [h, s], D = diag(exp ℓ_λ)
        self.log_lambda = nn.Parameter(torch.rand(h, s))
        # §5 variational parameters: m_u [h, s(a), s(j)], ℓ_S [h, s, s], T [h, s, s, s]
        self.m_u = nn.Parameter(torch.randn(h, s, s))
        self.log_s_diag = nn.Parameter(torch.randn(h, s, s))
        self.s_lower = nn.Parameter(torch.randn(h, s, s, s))
        # §7 output maps
        self.final_weight = nn.Linear(s, d)  # shared by all heads
        self.token_map = nn.Linear(2 * n_tokens, n_tokens) if merge == "concat" else None
        self.drop = nn.Dropout(dropout)

        self.last_ksvd: torch.Tensor | None = None
        self.last_kl: torch.Tensor | None = None

    # --- pieces --------------------------------------------------------------------------
    def factors(self) -> torch.Tensor:
        """L[h, x, y, z] = δ_yz exp(ℓ_S[h, x, y]) + 1[z < y] T[h, x, y, z]: [h, s, s, s].

        Faithful reads (x, y, z) = (inducing a, noise i, output j); clean reads
        (output j, inducing a, column b), L_j = L[h, j] lower-triangular."""
        return torch.diag_embed(self.log_s_diag.exp()) + torch.tril(self.s_lower, diagonal=-1)

    def scores(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Projection scores e = φ_q W_e, r = φ_k W_r, each [B, h, N, s] (``mask``: zero at
        padded tokens, W_e and W_r from real tokens only; module docstring)."""
        b, n, c = x.shape
        h, d = self.heads, self.head_dim
        q, k = self.qk(x).view(b, n, 2, h, d).permute(2, 0, 3, 1, 4)  # each [B, h, N, d]
        x_h = x.view(b, n, h, d).transpose(1, 2)  # raw input in heads: [B, h, N, d]
        if mask is not None:
            mask = mask.bool()
            pad = ~mask[:, None, :, None]  # [B, 1, N, 1]
            q, k = q.masked_fill(pad, 0.0), k.masked_fill(pad, 0.0)  # official: q, k of padding zeroed
        with torch.autocast(device_type=x.device.type, enabled=False):  # the kernel projections: float32
            return self._projections(q, k, x_h, mask)

    def _projections(self, q: torch.Tensor, k: torch.Tensor, x_h: torch.Tensor,
                     mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """e, r from the heads' queries/keys/inputs (:meth:`scores`), at float32 or wider."""
        h, d = self.heads, self.head_dim
        q, k, x_h = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (q, k, x_h))
        pad = None if mask is None else ~mask[:, None, :, None]
        phi_q, phi_k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        if self.token_index is not None and mask is None:
            x_h = x_h[:, :, self.token_index]  # [B, h, N', d]
        elif self.token_index is not None:  # N' evenly spaced real tokens per sample
            index = masked_subsample_index(mask, self.token_index.numel())  # [B, N']
            x_h = torch.gather(x_h, 2, index[:, None, :, None].expand(-1, h, -1, d))  # [B, h, N', d]
        elif mask is not None:
            x_h = x_h.masked_fill(pad, 0.0)
        w_e = x_h.transpose(-1, -2) @ self.w_e  # X_hᵀ W̃_e: [B, h, d, s]
        w_r = x_h.transpose(-1, -2) @ self.w_r
        return phi_q @ w_e, phi_k @ w_r  # [B, h, N, s]; zero rows at padded tokens

    def kl_divergence(self) -> torch.Tensor:
        """The mode's KL (module docstring), summed over heads: a scalar.  Elementwise ops
        only, so autocast keeps it in float32."""
        s, h = self.rank, self.heads
        d4 = torch.exp(4 * self.log_lambda)  # D⁴ = K_uu^{-1}: [h, s]
        sq = self.factors().pow(2)  # [h, s, s, s]
        if self.mode == "faithful":
            trace = (d4[:, :, None, None] * sq).sum()  # D⁴ weights L's first index a
        else:
            trace = (d4[:, None, :, None] * sq).sum()  # tr(D⁴ L_j L_jᵀ): D⁴ weights the row a of L_j
        mean = (d4[:, :, None] * self.m_u.pow(2)).sum()  # Σ_{h,j} m_jᵀ D⁴ m_j
        return 0.5 * trace + 0.5 * mean - self.log_s_diag.sum() - 2 * s * self.log_lambda.sum() - 0.5 * s * s * h

    def ksvd_loss(self, e: torch.Tensor, r: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """J = ½ mean‖eD‖² + ½ mean‖rD‖² − tr(mean_h W̃_eᵀ W̃_r): a scalar (§3); with ``mask``
        the means run over real tokens only."""
        d2 = torch.exp(2 * self.log_lambda)[:, None, :]  # D²: [h, 1, s]
        dtype = torch.promote_types(e.dtype, torch.float32)  # bf16 scores (autocast) summed in float32
        real = None if mask is None else mask.to(dtype)[:, None, :]  # [B, 1, N]: weight 1 at real tokens
        # means over the global batch (under DDP too: J² is not linear in them)
        e_term = 0.5 * batch_mean((e.to(dtype).pow(2) * d2).sum(-1), real)
        r_term = 0.5 * batch_mean((r.to(dtype).pow(2) * d2).sum(-1), real)
        trace = (self.w_e * self.w_r).sum() / self.heads  # tr(mean_h W̃_eᵀ W̃_r)
        return e_term + r_term - trace

    def noise(self, a: torch.Tensor, eps: torch.Tensor | None = None) -> torch.Tensor:
        """A reparameterised draw of f − μ given A [B, h, M, s] (M = N or 2N): [B, h, M, s].

        ``eps`` fixes the standard-normal noise: ``[B, h, M, s]`` (faithful: ε[n, i]) or
        ``[B, h, M, s, s]`` (clean: ε[n, j, b]); drawn afresh when None."""
        L = self.factors().to(a.dtype)  # [h, s, s, s]
        if self.mode == "faithful":
            if eps is None:
                eps = torch.randn(a.shape, device=a.device, dtype=a.dtype)  # ε[n, i], shared over j
            return torch.einsum("bhna,haij,bhni->bhnj", a, L, eps.to(a.dtype))
        if eps is None:
            eps = torch.randn(*a.shape, self.rank, device=a.device, dtype=a.dtype)  # ε[n, j, c]: own noise per j
        eps = eps.to(a.dtype)
        l_eps = torch.einsum("hjac,bhnjc->bhnja", L, eps)  # L_j ε_j: [B, h, M, s(j), s(a)]
        return torch.einsum("bhna,bhnja->bhnj", a, l_eps)

    # --- forward -------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, eps: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x [B, N, C]`` -> ``[B, N, C]``; ``eps`` fixes the sample's noise (:meth:`noise`);
        ``mask [B, N]`` (True at real tokens) masks padding (module docstring)."""
        b, n, c = x.shape
        if n != self.n_tokens:
            raise ValueError(f"KEPSVGPAttention was built for {self.n_tokens} tokens, got {n}")
        e, r = self.scores(x, mask)  # [B, h, N, s] each
        with torch.autocast(device_type=x.device.type, enabled=False):  # the posterior of u: float32
            d2 = torch.exp(2 * self.log_lambda)[:, None, :]  # D² = Λ^{-1}: [h, 1, s]
            a = (e + r if self.merge == "add" else torch.cat([e, r], dim=2)) * d2  # A: [B, h, N|2N, s]
            f = a @ self.m_u.to(a.dtype)  # μ = A m_u: [B, h, N|2N, s]
            if self.sample:
                f = f + self.noise(a, eps)
        out = self.final_weight(f)  # [B, h, N|2N, d]
        if self.token_map is not None:
            if mask is not None:  # padded rows (of both halves) add nothing to the token map
                out = out.masked_fill(~mask.bool().repeat(1, 2)[:, None, :, None], 0.0)
            out = self.token_map(out.transpose(-1, -2)).transpose(-1, -2)  # tokens 2N → N: [B, h, N, d]
        out = self.drop(out.transpose(1, 2).reshape(b, n, c))  # [B, N, C]
        if self.training:
            self.last_ksvd, self.last_kl = self.ksvd_loss(e, r, mask), self.kl_divergence()
        else:
            self.last_ksvd = self.last_kl = None
        return out

    def extra_loss(self) -> torch.Tensor | None:
        """η_ksvd · J² + η_kl · KL of the last training-mode forward; None otherwise."""
        if not self.training or self.last_ksvd is None or self.last_kl is None:
            return None
        return self.eta_ksvd * self.last_ksvd.pow(2) + self.eta_kl * self.last_kl

    def loss_terms(self) -> dict:
        """``ksvd`` (J, before squaring and weighting) and ``kl`` of the last training
        forward, for the training log."""
        if not self.training or self.last_ksvd is None or self.last_kl is None:
            return {}
        return {"ksvd": self.last_ksvd, "kl": self.last_kl}

    def extra_repr(self) -> str:
        return (
            f"heads={self.heads}, rank={self.rank}, n_tokens={self.n_tokens}, merge={self.merge!r}, "
            f"mode={self.mode!r}, eta_ksvd={self.eta_ksvd}, eta_kl={self.eta_kl}"
        )


@METHODS.register("kep_svgp")
class KEPSVGP(TrainedMethod):
    """ViT with KEP-SVGP attention in its last ``layers`` blocks (softmax before them).

    Loss: CE + Σ_layers (η_ksvd J² + η_kl KL), through ``extra_loss``.  Prediction:
    ``samples`` stochastic passes (the GP layer keeps sampling in eval mode; dropout is
    off), combined by ``average`` (the paper averages logits, then softmax).
    """

    official = {"mode": "faithful", "samples": 10, "average": "logits"}  # CIFAR/valid.py: 10 passes, logits

    @dataclass(frozen=True)
    class Options(MonteCarlo):
        rank: int = field(default=10, metadata={"min": 1})  # s: singular directions / inducing features
        rank_multi: int = field(default=10, metadata={"min": 1})  # N' = rank·rank_multi tokens form W_e, W_r
        layers: int = field(default=1, metadata={"min": 1})  # the LAST `layers` blocks use KEP-SVGP (<= depth)
        merge: Literal["add", "concat"] = "add"  # A = (e + r)D² or [e; r]D²
        mode: Literal["faithful", "clean"] = "faithful"  # see the module docstring
        eta_ksvd: float | None = field(default=None, metadata={"min": 0.0})  # None: 1 (add) or 10 (concat)
        eta_kl: float = field(default=1.0, metadata={"min": 0.0})  # KL weight (not ÷ data-set size)
        average: Literal["logits", "probs"] = "logits"  # the paper averages logits

    def deviations(self) -> list[str]:
        """What these options change from the official code (``mode = "faithful"`` matches it)."""
        o = self.options
        clean = ["clean SVGP: per-output factors and noise, the exact KL (official: the faithful indexing)"]
        return (clean if o.mode != self.official["mode"] else []) + o.pass_deviations(self.official)

    def attention_layers(self, cfg: ModelConfig) -> dict:
        """KEP-SVGP in the last ``layers`` blocks; the others keep the backbone's attention
        (``cfg.attention`` with ``cfg.attention_options``, exactly as MSP builds them)."""
        o = self.options
        if o.layers > cfg.depth:
            raise ConfigError(f"kep_svgp: layers ({o.layers}) must not exceed model.depth ({cfg.depth})")
        if cfg.attention == "kep_svgp":
            raise ConfigError("kep_svgp: model.attention names the other blocks' attention; "
                              "to use KEP-SVGP in every block set layers = model.depth")
        options = dict(rank=o.rank, rank_multi=o.rank_multi, merge=o.merge, mode=o.mode, eta_ksvd=o.eta_ksvd, eta_kl=o.eta_kl)
        return {block: ("kep_svgp", options) for block in range(cfg.depth - o.layers, cfg.depth)}

    def eval_mode(self, model: nn.Module) -> None:
        """``model.eval()``: dropout off; the GP layers still sample (part of prediction)."""
        model.eval()


@dataclass(frozen=True)
class KEPSVGPEnsembleOptions(EnsembleOptions):
    base: str = "kep_svgp"


@METHODS.register("kep_svgp_ensemble")
class KEPSVGPEnsemble(Ensemble):
    """KEP-SVGP Ensemble: the stored predictions of ``members`` seeds of ``base`` (a
    ``kep_svgp`` method), averaged as ``average`` says (probabilities by default, as for
    Deep Ensembles; the paper does not state its rule).  Nothing is retrained."""

    Options = KEPSVGPEnsembleOptions
