r"""CGPT and sparse CGPT: attention as the cross-covariance of two correlated Gaussian
processes (Bui, Tran Huu, Dinh, Nguyen, Hoang, "Revisiting Kernel Attention with Correlated
Gaussian Process Representation", UAI 2025, arXiv 2502.20525; official code
MinhLong210/CGP-Transformers at b1257a5, ``CIFAR10/cgp_layer_vit.py`` (``CGP_LAYER``),
``CIFAR10/scgp_layer_vit.py`` (``SCGP_LAYER``), ``CIFAR10/util.py`` (``kernel_std``),
``CIFAR10/vit.py`` / ``vit_scgp.py`` (loss, evaluation) and ``CIFAR10/scripts/*.sh``).

A GP-based attention with a symmetric kernel needs queries = keys.  CGPT lets them differ:
the query GP z_q and the key GP z_k are both correlated with a shared latent GP z_0 on a
third projection x_0 of the tokens, so their cross-covariance K_qk = K_q0 K_00^{-1} K_0k is
asymmetric.  The attention output is the posterior of z_q given z_k = K_kk v (a sample of it,
in training and at test), and the loss adds a regulariser of the joint of (z_q, z_k) given
z_0.  Sparse CGPT (``scgpt``) puts M inducing points (learned linear combinations of the
tokens) between the GPs (the official ``SCGP_LAYER``; the paper's DTC approximation).

Equations, per head (B batch, N tokens, C = H·D channels)
--------------------------------------------------------
x ∈ R^{B×N×C} is the block's LayerNorm output.  Four bias-free Linear C → C, laid out per
head: q = W_q x, k = W_k x, x₀ = W₀ x, v = W_v x ∈ R^{N×D}.  Kernel (``kernel_std``): the
unit RBF κ(a, b)_ij = exp(−½ ‖a_i − b_j‖²), no length scale or amplitude.  j = ``jitter``.

**CGP layer** (``cgp``, ``CGP_LAYER.forward`` with ``flag_cgp`` and ``kernel_type="std"``):

    K_qq = σ_q² κ(q, q),  K_kk = σ_k² κ(k, k),  K_00 = κ(x₀, x₀)   (σ_q, σ_k: trained scalars per
    layer, init 1; the cross-kernels κ(q, x₀), κ(x₀, k) carry no σ)
    K_qk = κ(q, x₀) (K_00 + jI)^{-1} κ(x₀, k)
    mean = K_qk v                                     (z_k = f_K = (K_kk + jI) v, so mean = K_qk (K_kk + jI)^{-1} z_k)
    E    = K_00 − κ(x₀, k)(K_kk + jI)^{-1}κ(k, x₀) + κ(x₀, k) v vᵀ κ(k, x₀)
           (official: …(K_kk+jI)^{-1} f_K f_Kᵀ (K_kk+jI)^{-1}…, the same matrix)
    Σ    = K_qq − κ(q, x₀)(K_00 + jI)^{-1}κ(x₀, q) + κ(q, x₀)(K_00 + jI)^{-1} E (K_00 + jI)^{-1}κ(x₀, q) − mean meanᵀ
    f    = mean + chol(Σ + jI) ε,   ε ∈ R^{N×D} ~ N(0, 1)  (one N×N covariance over tokens, the D
           columns independent: official ``samples = mean + chol_covar @ randn``)

  Regulariser (official "log joint q" / "log joint k"), with z₀ = chol(K_00 + jI) ε₀ a fresh
  N(0, K_00) sample (ε₀ ∈ R^{N×D}):

    μ_q = κ(q, x₀)(K_00 + jI)^{-1} z₀,   C_q = K_qq − κ(q, x₀)(K_00 + jI)^{-1}κ(x₀, q),   L_q = chol(C_q + jI)
    R_q = L_q^{-1}(mean − μ_q)
    μ_k = κ(k, x₀)(K_00 + jI)^{-1} z₀,   C_k = K_kk − κ(k, x₀)(K_00 + jI)^{-1}κ(x₀, k),   L_k = chol(C_k + jI)
    R_k = L_k^{-1}(f_K − μ_k)
    reg = Σ_{t∈{q,k}} [ mean_b Σ_h Σ_{d,d'} (R_tᵀ R_t)_{dd'}  +  2 · | mean_{b,h} Σ_n log (L_t)_nn | ]

  i.e. the *sum of all D×D entries* of R_tᵀR_t (``torch.sum(q_term, (-1,-2,-3))``; not its
  trace) and the absolute value of the mean log-determinant, exactly as the official code.

**Sparse CGP layer** (``scgp``, ``SCGP_LAYER.forward``; s = 1/σ², σ = ``noise``, M = ``inducing``):

    x_m = (W_m xᵀ + b_m)ᵀ viewed per head ∈ R^{M×D}  (``fc_induce_m``: Linear N → M over the
          token axis of the raw block input, weights N(0, 10⁻⁴), bias 0; the same points for both GPs)
    K_mm = κ(x_m, x_m),  K_qm = κ(q, x_m),  K_0m = κ(x₀, x_m),  K_km = κ(k, x_m)
    P_m = (K_mm + s K_m0 K_0m)^{-1},   P_l = (K_mm + s K_mk K_km)^{-1}
    K_qk = s² K_qm P_m K_m0 K_0m P_l K_mk,   mean = K_qk v
    Q_0 = σ² I + K_0m (P_l + s² P_l K_mk v vᵀ K_km P_l) K_m0
    Σ   = σ² I + K_qm (P_m + s² P_m K_m0 Q_0 K_0m P_m) K_mq − mean meanᵀ
    f   = mean + chol(Σ + jI) ε
    reg = s² tr(K_0m P₂ K_mq K_qm P₂ K_m0 K_00) + tr(K_qm P₂ K_mq)
        + s² tr(K_0m P₂ K_mk K_km P₂ K_m0 K_00) + tr(K_km P₂ K_mk),   P₂ = (K_mm + s I)^{-1}
          (each trace averaged over batch and heads)

  The official sparse layer also creates σ_q, σ_k and computes K_qq, K_kk but never uses them;
  they are not created here.

Both layers end with W_O (Linear C → C with bias) and dropout, heads concatenated.  The
training loss is CE + w · Σ_layers reg (``model.loss``: ``neg_ElogPyGf + anneal_kl*total_kl``;
reg not divided by the data size), the layer in every block (official ViT), and prediction
averages the softmax probabilities of Monte-Carlo passes (``acc_nll``: 10 passes for CGPT,
5 for sparse CGPT).

Recipe (official CIFAR scripts) and departures
----------------------------------------------
``scripts/cgpt.sh``: w = 0.7 fixed (``anneal_kl``, ``flag_adaptive_anneal=False``), jitter 1e-7,
ViT depth 5, width 128, 4 heads, dropout 0.1, batch 25, Adam re-created every epoch with
lr 5e-4 decayed linearly to 1e-5 over 395 epochs, 400 epochs.  ``scripts/scgpt.sh``: M = 8,
σ = 0.1, jitter 1e-7, w annealed linearly per epoch, w_e = e / E (from 0 towards 1.0,
``anneal_scheduler``), batch 100, lr 1e-5 → 1e-6 over 495 of 500 epochs.  Both scripts
fine-tune from a maximum-likelihood checkpoint (``flag_mle=True``, ``ckpt_dir``): the
**two-stage recipe**, option ``base``: stage 1 is the suite's ``msp`` cell of the same
dataset and seed (reused from the store when complete, else trained inside this cell with
msp's settings), stage 2 trains this method from its weights (:func:`init_from_stage1`).

Departures: (1) the backbone and training recipe are the suite's (as for every method);
the official ViT is depth 5, width 128 with sequence pooling and a shared LayerNorm, and its
per-layer ``keys`` and the layers' unused ARD/variational parameters are not created.
(2) Stage 1 is our softmax ViT (``msp``); the official stage 1 is the same ViT with
asymmetric RBF-kernel attention (``flag_cgp=False``), and the official loader keeps only
state-dict entries whose names contain ``fc_qk`` or ``ard`` (``train_cifar.py``), which match
nothing of the released checkpoint ``pretrained/08022024.MLE_ASYM_STD.seed_0/best_epoch.ckpt``
(verified: no such key), so the official stage 2 in effect starts from scratch.  Ours
copies every stage-1 weight whose name and shape match (embedding, positions, norms, MLPs,
head), q/k/v from the softmax ``qkv`` (its biases dropped: the CGP projections are
bias-free) and W_O from ``proj``; W₀, σ_q, σ_k and the inducing map start fresh.
(3) A failed Cholesky raises that factorisation's jitter ×10 (up to ``tries`` times; the
official loop is unbounded and carries the raised jitter on to its later explicit
inverses); the kernel matrices, factorisations and regulariser run in float32 (or wider)
under bf16 autocast (the sparse layer's projections and inducing points too: at the official
initialisation the inducing points nearly coincide and K_mm is near-singular).  (4) Padding (text): padded tokens are removed from the keys, x₀, the
values and the inducing map, and their rows/columns of Σ and C_q, C_k are replaced by the
identity, so real tokens' outputs do not depend on them; the official CIFAR layers have no
mask.  (5) The official regulariser's z₀ sample and the output noise are drawn per forward
pass as there; our Monte-Carlo passes are batched (independent noise per image).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from bench.train.method import MonteCarlo, TrainedMethod
from bench.core.registry import ATTENTIONS, METHODS
from methods._gp import AnnealedTerm, linear_anneal_weight, psd_cholesky, set_anneal_weight

CHOLESKY_TRIES = 20  # jitter, 10·jitter, ... up to 1e19·jitter (official: an unbounded ×10 loop)


def rbf(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The official ``kernel_std``: exp(−½‖a_i − b_j‖²) for ``a [..., N, D]``, ``b [..., M, D]``."""
    sq = a.pow(2).sum(-1)[..., :, None] + b.pow(2).sum(-1)[..., None, :] - 2 * a @ b.transpose(-1, -2)
    return torch.exp(-0.5 * sq.clamp_min(0))


def identity_at_padding(mat: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    """``mat [B, H, N, N]`` with the rows and columns of padded tokens replaced by those of I
    (``m [B, 1, N, 1]``: 1 at real tokens); unchanged without a mask."""
    if m is None:
        return mat
    eye = torch.eye(mat.shape[-1], dtype=mat.dtype, device=mat.device)
    return mat * (m * m.transpose(-1, -2)) + eye * (1 - m)


class _CorrelatedGP(AnnealedTerm, nn.Module):
    """What both CGP layers share: the four projections, W_O, the sampling and the
    regulariser as an annealed loss term (:class:`methods._gp.AnnealedTerm`, named
    ``cgp_reg`` in the training log).  A subclass implements :meth:`posterior`."""

    term_name = "cgp_reg"
    stochastic = True  # samples the GP output in every forward pass, in eval mode too

    def __init__(self, dim: int, heads: int, dropout: float, jitter: float, reg_weight: float) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        self.heads, self.head_dim = heads, dim // heads
        self.jitter = float(jitter)
        self.init_term(reg_weight)
        self.sample = True
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.x0 = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim)  # W_O
        self.drop = nn.Dropout(dropout)

    def heads_of(self, t: torch.Tensor) -> torch.Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)  # [B, H, N, D]

    def chol(self, mat: torch.Tensor) -> torch.Tensor:
        return psd_cholesky(mat, self.jitter, tries=CHOLESKY_TRIES)[0]

    def posterior(self, x, mask=None, eps0=None, with_reg=True):
        """``(mean [B, H, N, D], chol(Σ + jI) [B, H, N, N], reg or None)``."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, eps: torch.Tensor | None = None, eps0: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x [B, N, C]`` -> ``[B, N, C]``; ``eps [B, H, N, D]`` fixes the output noise and
        ``eps0`` (same shape) the regulariser's z₀ draw (dense layer); ``mask [B, N]``: True
        at real tokens."""
        b, n, c = x.shape
        mean, chol, reg = self.posterior(x, mask, eps0, with_reg=self.training)
        f = mean
        if self.sample:
            if eps is None:
                eps = torch.randn(mean.shape, device=mean.device, dtype=mean.dtype)
            f = mean + chol @ eps.to(mean.dtype)
        self.last_term = reg
        return self.drop(self.proj(f.transpose(1, 2).reshape(b, n, c).to(x.dtype)))


@ATTENTIONS.register("cgp")
class CGPAttention(_CorrelatedGP):
    """Correlated-GP attention (module docstring, "CGP layer"), ``[B, N, dim] -> [B, N, dim]``."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, *, jitter: float = 1e-7,
                 reg_weight: float = 0.7) -> None:
        super().__init__(dim, heads, dropout, jitter, reg_weight)
        self.sigma_q = nn.Parameter(torch.ones(1))
        self.sigma_k = nn.Parameter(torch.ones(1))

    def posterior(self, x, mask=None, eps0=None, with_reg=True):
        q, k, x0, v = (self.heads_of(lin(x)) for lin in (self.q, self.k, self.x0, self.v))
        with torch.autocast(device_type=x.device.type, enabled=False):
            dtype = torch.promote_types(q.dtype, torch.float32)
            q, k, x0, v = q.to(dtype), k.to(dtype), x0.to(dtype), v.to(dtype)
            m = None if mask is None else mask[:, None, :, None].to(dtype)  # [B, 1, N, 1]
            n = q.shape[-2]
            eye = torch.eye(n, dtype=dtype, device=x.device)
            k_qq = self.sigma_q.to(dtype).pow(2) * rbf(q, q)
            k_kk = identity_at_padding(self.sigma_k.to(dtype).pow(2) * rbf(k, k), m)
            k_00 = identity_at_padding(rbf(x0, x0), m)
            a_0q = rbf(x0, q)  # κ(x₀, q) [B, H, N₀, N_q]
            a_0k = rbf(x0, k)
            if m is not None:  # padded x₀ and keys take no part; padded values are zero
                a_0q = a_0q * m
                a_0k = a_0k * m * m.transpose(-1, -2)
                v = v * m
            l_0 = self.chol(k_00)  # K_00 + jI = L₀L₀ᵀ
            b_0q = torch.linalg.solve_triangular(l_0, a_0q, upper=False)  # L₀^{-1} κ(x₀, q)
            b_0k = torch.linalg.solve_triangular(l_0, a_0k, upper=False)
            k_qk = b_0q.transpose(-1, -2) @ b_0k  # κ(q,x₀)(K_00+jI)^{-1}κ(x₀,k)
            mean = k_qk @ v
            l_k = self.chol(k_kk)  # K_kk + jI = L_kL_kᵀ
            c_k0 = torch.linalg.solve_triangular(l_k, a_0k.transpose(-1, -2), upper=False)  # L_k^{-1} κ(k, x₀)
            u = a_0k @ v  # κ(x₀, k) v
            e = k_00 - c_k0.transpose(-1, -2) @ c_k0 + u @ u.transpose(-1, -2)
            g = torch.linalg.solve_triangular(l_0.transpose(-1, -2), b_0q, upper=True)  # (K_00+jI)^{-1} κ(x₀, q)
            c_q = k_qq - b_0q.transpose(-1, -2) @ b_0q  # C_q (before padding)
            covar = c_q + g.transpose(-1, -2) @ e @ g - mean @ mean.transpose(-1, -2)
            chol = self.chol(identity_at_padding(covar, m))
            if not with_reg:
                return mean, chol, None
            if eps0 is None:
                eps0 = torch.randn(x0.shape, device=x.device, dtype=dtype)
            eps0 = eps0.to(dtype)  # z₀ = L₀ ε₀, so (K_00+jI)^{-1} z₀ = L₀^{-T} ε₀
            mu_q = b_0q.transpose(-1, -2) @ eps0
            mu_k = b_0k.transpose(-1, -2) @ eps0
            f_k = (k_kk + self.jitter * eye) @ v
            c_k = k_kk - b_0k.transpose(-1, -2) @ b_0k
            reg = (self._joint_term(identity_at_padding(c_q, m), mean - mu_q, m)
                   + self._joint_term(identity_at_padding(c_k, m), f_k - mu_k, m))
        return mean, chol, reg

    def _joint_term(self, cov: torch.Tensor, resid: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        """mean_b Σ_{h,d,d'} (RᵀR)_{dd'} + 2 |mean_{b,h} Σ_n log L_nn|,  L = chol(cov + jI), R = L^{-1} resid."""
        low = self.chol(cov)
        if m is not None:
            resid = resid * m
        r = torch.linalg.solve_triangular(low, resid, upper=False)  # [B, H, N, D]
        quad = r.sum(-1).pow(2).sum((-2, -1)).mean()  # Σ_{d,d'} RᵀR = Σ_n (Σ_d R_nd)², summed over heads
        logdet = torch.log(torch.diagonal(low, dim1=-2, dim2=-1)).sum(-1).mean()
        return quad + 2 * logdet.abs()

    def extra_repr(self) -> str:
        return f"heads={self.heads}, jitter={self.jitter:g}, reg_weight={self.term_weight:g}"


@ATTENTIONS.register("scgp")
class SparseCGPAttention(_CorrelatedGP):
    """Sparse correlated-GP attention with ``inducing`` points made from the tokens (module
    docstring, "Sparse CGP layer"); needs the sequence length ``n_tokens``."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, *, n_tokens: int, inducing: int = 8,
                 noise: float = 0.1, jitter: float = 1e-7, reg_weight: float = 1.0) -> None:
        super().__init__(dim, heads, dropout, jitter, reg_weight)
        if inducing < 1 or noise <= 0:
            raise ValueError(f"need inducing >= 1 and noise > 0, got {inducing}, {noise}")
        self.inducing, self.noise = inducing, float(noise)
        self.induce = nn.Linear(n_tokens, inducing)  # official fc_induce_m: over the token axis
        nn.init.normal_(self.induce.weight, std=1e-2)
        nn.init.zeros_(self.induce.bias)

    def inducing_points(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x_m ``[B, H, M, D]`` from the raw block input ``x [B, N, C]``."""
        if mask is not None:
            x = x * mask[..., None].to(x.dtype)
        b = x.shape[0]
        xm = F.linear(x.transpose(1, 2), self.induce.weight.to(x.dtype), self.induce.bias.to(x.dtype))  # [B, C, M]
        return xm.view(b, self.heads, self.head_dim, self.inducing).transpose(-1, -2)

    def posterior(self, x, mask=None, eps0=None, with_reg=True):
        with torch.autocast(device_type=x.device.type, enabled=False):
            # projections and inducing points in float32 too: at the official initialisation the
            # inducing points nearly coincide, K_mm is near-singular and bf16 inputs would show
            dtype = torch.promote_types(x.dtype, torch.float32)
            xf = x.to(dtype)
            q, k, x0, v = (self.heads_of(F.linear(xf, lin.weight.to(dtype))) for lin in (self.q, self.k, self.x0, self.v))
            xm = self.inducing_points(xf, mask)
            m = None if mask is None else mask[:, None, :, None].to(dtype)
            n = q.shape[-2]
            s = 1.0 / self.noise**2
            k_mm = rbf(xm, xm)
            k_qm, k_0m, k_km = rbf(q, xm), rbf(x0, xm), rbf(k, xm)
            if m is not None:
                k_qm, k_0m, k_km, v = k_qm * m, k_0m * m, k_km * m, v * m
            p_m = torch.linalg.inv(k_mm + s * k_0m.transpose(-1, -2) @ k_0m)
            p_l = torch.linalg.inv(k_mm + s * k_km.transpose(-1, -2) @ k_km)
            k_qk = s**2 * k_qm @ p_m @ k_0m.transpose(-1, -2) @ k_0m @ p_l @ k_km.transpose(-1, -2)
            mean = k_qk @ v
            eye = torch.eye(n, dtype=dtype, device=x.device)
            w = p_l @ (k_km.transpose(-1, -2) @ v)  # P_l K_mk v
            q_0 = self.noise**2 * eye + k_0m @ (p_l + s**2 * w @ w.transpose(-1, -2)) @ k_0m.transpose(-1, -2)
            inner = p_m + s**2 * p_m @ k_0m.transpose(-1, -2) @ q_0 @ k_0m @ p_m
            covar = self.noise**2 * eye + k_qm @ inner @ k_qm.transpose(-1, -2) - mean @ mean.transpose(-1, -2)
            chol = self.chol(identity_at_padding(covar, m))
            if not with_reg:
                return mean, chol, None
            k_00 = rbf(x0, x0)
            p_2 = torch.linalg.inv(k_mm + s * torch.eye(self.inducing, dtype=dtype, device=x.device))
            reg = 0.0
            for k_tm in (k_qm, k_km):
                a = k_0m @ p_2 @ k_tm.transpose(-1, -2)  # K_0m P₂ K_mt  [B, H, N, N]
                first = s**2 * (a @ a.transpose(-1, -2) @ k_00).diagonal(dim1=-2, dim2=-1).sum(-1).mean()
                second = (k_tm @ p_2 @ k_tm.transpose(-1, -2)).diagonal(dim1=-2, dim2=-1).sum(-1).mean()
                reg = reg + first + second
        return mean, chol, reg

    def extra_repr(self) -> str:
        return (f"heads={self.heads}, inducing={self.inducing}, noise={self.noise:g}, jitter={self.jitter:g}, "
                f"reg_weight={self.term_weight:g}")


def init_from_stage1(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Load a stage-1 softmax ViT's ``state`` into ``model`` (module docstring, departure 2):
    every entry whose name and shape match, and per CGP layer q/k/v from the softmax
    ``qkv`` weight (biases dropped) and W_O from ``proj``.  Returns the names of ``model``'s
    parameters left at their fresh initialisation."""
    own = model.state_dict()
    new = {name: t for name, t in state.items() if name in own and own[name].shape == t.shape}
    for prefix, layer in model.named_modules():
        if not isinstance(layer, _CorrelatedGP) or f"{prefix}.qkv.weight" not in state:
            continue
        q, k, v = state[f"{prefix}.qkv.weight"].chunk(3, dim=0)
        new.update({f"{prefix}.q.weight": q, f"{prefix}.k.weight": k, f"{prefix}.v.weight": v})
    model.load_state_dict(new, strict=False)
    return [name for name, _ in model.named_parameters() if name not in new]


@dataclass(frozen=True)
class CGPTOptions(MonteCarlo):
    samples: int = field(default=10, metadata={"min": 1})  # official acc_nll: 10 passes, probabilities averaged
    jitter: float = field(default=1e-7, metadata={"exclusive_min": 0.0})
    reg_weight: float = field(default=0.7, metadata={"min": 0.0})  # official anneal_kl (cgpt.sh)
    reg_anneal: bool = False  # w·e/E in epoch e of E (official flag_adaptive_anneal)
    base: str = ""  # two-stage recipe: the trained method (e.g. "msp") whose same-seed cell is stage 1


@METHODS.register("cgpt")
class CGPT(TrainedMethod):
    """A ViT with correlated-GP attention in every block (official ViT), trained with
    CE + w·Σ reg, predicting with the mean probability of ``samples`` passes; with ``base``
    fine-tuned from that method's cell (two-stage recipe)."""

    attention = "cgp"
    Options = CGPTOptions
    official = {"samples": 10, "average": "probs", "reg_weight": 0.7, "reg_anneal": False}

    def attention_options(self) -> dict:
        return {"jitter": self.options.jitter, "reg_weight": self.options.reg_weight}

    def stage1(self) -> str:
        return self.options.base

    def init_from_stage1(self, model: nn.Module, state: dict) -> None:
        init_from_stage1(model, state)

    def on_train_epoch(self, model: nn.Module, epoch: int, epochs: int) -> None:
        """The regulariser's weight for this epoch: ``reg_weight`` × (e / E with ``reg_anneal``,
        the official ``anneal_scheduler`` from 0; else 1)."""
        set_anneal_weight(model, _CorrelatedGP, linear_anneal_weight(epoch, epochs) if self.options.reg_anneal else 1.0)

    def deviations(self) -> list[str]:
        o, ref = self.options, self.official
        out = o.pass_deviations(ref)
        if o.reg_weight != ref["reg_weight"] or o.reg_anneal != ref["reg_anneal"]:
            out.append(f"regulariser weight {o.reg_weight:g}{' annealed from 0' if o.reg_anneal else ''} (official: "
                       f"{ref['reg_weight']:g}{' annealed from 0' if ref['reg_anneal'] else ' fixed'})")
        if not o.base:
            out.append("trained from scratch (official: fine-tuned from a maximum-likelihood checkpoint)")
        else:
            out.append(f"stage 1 is the softmax ViT {o.base!r}, its weights copied where they match (official: "
                       "an RBF-kernel-attention ViT, whose weights the official loader in effect does not load)")
        return out


@dataclass(frozen=True)
class SCGPTOptions(CGPTOptions):
    samples: int = field(default=5, metadata={"min": 1})  # official vit_scgp acc_nll: 5 passes
    reg_weight: float = field(default=1.0, metadata={"min": 0.0})  # scgpt.sh anneal_kl 1.0 ...
    reg_anneal: bool = True  # ... annealed from 0 (flag_adaptive_anneal=True)
    inducing: int = field(default=8, metadata={"min": 1})  # scgpt.sh keys_len
    noise: float = field(default=0.1, metadata={"exclusive_min": 0.0})  # scgpt.sh noise


@METHODS.register("scgpt")
class SparseCGPT(CGPT):
    """Sparse CGPT: CGPT with the inducing-point layer ``scgp`` (M points from the tokens) in every block."""

    attention = "scgp"
    Options = SCGPTOptions
    official = {"samples": 5, "average": "probs", "reg_weight": 1.0, "reg_anneal": True}

    def attention_options(self) -> dict:
        o = self.options
        return {"jitter": o.jitter, "reg_weight": o.reg_weight, "inducing": o.inducing, "noise": o.noise}
