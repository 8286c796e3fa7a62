r"""Last-layer Laplace (Daxberger et al., "Laplace Redux -- Effortless Bayesian Deep
Learning", NeurIPS 2021, arXiv 2106.14806; official code: aleximmer/Laplace, the
``laplace-torch`` package).

A Gaussian posterior over the weights of the readout Linear (the classifier head) of a
network trained as MSP (the MAP estimate), fitted after training: the rest of the network
is a fixed feature map.  The Hessian is the generalised Gauss-Newton (GGN) of the softmax
cross-entropy over the training split, the prior precision is chosen by maximising the
Laplace evidence, and the predictive is the probit approximation (or Monte-Carlo samples
of the logits).

Equations (N training images, φ_n ∈ R^D the head's input, a_n = [φ_n; 1] ∈ R^{D+1},
C classes, θ = vec_row([W b]) ∈ R^P, P = C(D+1), p_n = softmax(W φ_n + b) at the MAP)
--------------------------------------------------------------------------------------
* **GGN** (exact for a linear head: the logits are linear in θ, so it is the Hessian of
  Σ_n CE):
        H = Σ_n B_n ⊗ a_n a_nᵀ,        B_n = diag(p_n) − p_n p_nᵀ
  (row-major θ: index c·(D+1) + d).  ``hessian = "full"`` keeps H (P × P).
* **KFAC** (``hessian = "kron"``, the default): H ≈ G ⊗ A with
        G = Σ_n B_n  (C × C),          A = (1/N) Σ_n a_n a_nᵀ  ((D+1) × (D+1)),
  exact when every a_n or every B_n is the same.  Eigendecompositions G = U_G Λ_G U_Gᵀ,
  A = U_A Λ_A U_Aᵀ give the eigenvalues λ_{ij} = λ^G_i λ^A_j of H.
* **Posterior**: N(θ*, Σ),  Σ = (H + δ I)^{-1}, δ the isotropic prior precision (prior
  N(0, δ^{-1} I)).
* **Evidence** (the Laplace approximation of log p(D | δ), laplace-torch's
  ``log_marginal_likelihood``):
        log Z(δ) = Σ_n log p(y_n | x_n, θ*) − ½ [ Σ_k log(λ_k + δ) − P log δ + δ ‖θ*‖² ]
  with λ_k the eigenvalues of H (or of its KFAC).  Its derivative vanishes where
  δ‖θ*‖² = γ(δ) = Σ_k λ_k / (λ_k + δ); the left side increases and γ decreases in δ, so the
  maximiser is unique; we find it by bisection on log δ to machine precision
  (``prior_precision = None``, the default) or take a given δ.
* **Logit distribution** of an input: f ~ N(μ, S), μ = W φ + b and S = J Σ Jᵀ,
  J = I_C ⊗ aᵀ.  KFAC: S = U_G diag_i(Σ_j (U_Aᵀ a)_j² / (λ^G_i λ^A_j + δ)) U_Gᵀ; full:
  S_{cc'} = aᵀ Σ_{[c],[c']} a (the (D+1) × (D+1) blocks of Σ).
* **Predictive**: ``link = "probit"`` (default, one deterministic pass):
        p = softmax(μ_c / √(1 + π/8 · S_cc))
  ``link = "mc"``: each of the ``samples`` passes draws f = μ + L ε, L Lᵀ = S, ε ~ N(0, I)
  per input, and the probabilities softmax(f) are averaged (so the store also gets the
  entropy decomposition).

Where it runs, and what the store keeps
---------------------------------------
A derived method (temperature scaling) runs in analysis on stored predictions; analysis
never loads a model.  The Laplace fit needs the trained weights and the training images,
so it runs where both are at hand: in the cell's prediction stage, through the
:meth:`~bench.train.method.TrainedMethod.prediction_model` hook.  With ``base = "msp"`` (the
suites' setting) the MAP network is msp's cell of the same dataset and seed: the cell
loads its stored ``checkpoint.pt`` (or trains msp inside the cell when the store has
none yet) and trains nothing itself (a post-hoc method:
:meth:`~bench.train.method.TrainedMethod.post_hoc`).  Without ``base`` the cell trains the MAP
network exactly as ``msp`` (same model, recipe and seed, so on a deterministic device its
``checkpoint.pt`` is msp's).  Either way it stores those best-on-validation weights as
``checkpoint.pt`` like every cell, then replaces the head by :class:`LaplaceHead` and fits it before the
first split is predicted (:meth:`LastLayerLaplace.eval_mode`, so the runner's preflight
check, which builds every prediction model from an untrained one, fits nothing).  The
posterior is a deterministic function of ``checkpoint.pt`` and the training split and is
not stored; the predictions are stored as every cell's, and analysis stays model-free.

Cost (the efficiency table): the parameter count is the network's (the posterior is held
in buffers, not parameters: KFAC C² + (D+1)² + C + D + 1 numbers, full P² + P); the fit
(one forward pass over the fitted training images, the curvature, two small
eigendecompositions or one P × P one) is timed with the predictions, in "Predict time /
1,000 images"; training time is msp's (with ``base``, msp's cell's, counted as its stage 1).

Recipe and departures
---------------------
Laplace Redux's recommended default and CIFAR setting: last layer, KFAC GGN, isotropic
prior precision by post-hoc evidence maximisation, probit predictive (laplace-torch 0.3:
``Laplace(model, "classification", subset_of_weights="last_layer",
hessian_structure="kron")``, ``optimize_prior_precision(method="marglik")``,
``la(x, link_approx="probit")``).  Departures: (1) laplace-torch maximises the evidence
with 100 Adam steps on log δ (lr 0.1, from δ = 1), which can stop short of the maximum;
we solve for it (measured on small heads: its δ within 0.05% of ours).  (2) laplace-torch's
KFAC keeps W and b as separate blocks, G ⊗ A_φ (A_φ over φ alone) and G for the bias, with
no W-b cross terms; ours is one Kronecker pair over a = [φ; 1] (measured: evidence 0.04-0.07
nats apart of about 190 and probit probabilities within 1.5e-3 on the heads first compared,
0.65-2.98 nats and 1.2e-3 to 3.4e-3 on small confident heads; docs/fidelity.md).  The
full GGN, evidence and probit agree with laplace-torch's ``FullLLLaplace`` to float
round-off.  (3) The fit runs in eval mode in float32 features / float64 curvature; the MAP
net is the suite's ViT trained from scratch (the paper used pre-trained WRNs).  (4) ``fit_images``
fits on a random subset of the training split (default: all of it, as the paper).
laplace-torch itself is not used: it declares torchvision as a dependency, which does not
import with our CPU torch and, unpinned, pulls a CUDA torch (docs/reference/data.md
section 4).  ``tests/methods/test_laplace_last_layer.py`` checks this implementation
against closed forms, autograd and Monte Carlo, and against laplace-torch where it imports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.data import DataBundle
from bench.train.method import TrainedMethod
from bench.core.registry import METHODS
from bench.config.spec import ModelConfig

PROBIT = math.pi / 8  # λ of the probit approximation E[sigmoid(f)] ≈ sigmoid(μ / √(1 + λ σ²))


# ----------------------------------------------------------------------------- closed forms


def augmented(phi: torch.Tensor) -> torch.Tensor:
    """a = [φ; 1]: the head's input with a 1 for the bias, ``[N, D + 1]``."""
    return torch.cat([phi, phi.new_ones(len(phi), 1)], dim=1)


def ggn_full(a: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """H = Σ_n (diag(p_n) − p_n p_nᵀ) ⊗ a_n a_nᵀ, ``[P, P]`` (row-major θ), from ``a [N, D+1]``
    and ``p [N, C]``: block-diagonal Σ_n p_nc a_n a_nᵀ minus VᵀV with V_n = p_n ⊗ a_n."""
    n, d1 = a.shape
    c = p.shape[1]
    diag = torch.einsum("nc,nd,ne->cde", p, a, a)  # [C, D+1, D+1]
    h = torch.block_diag(*diag)
    v = (p[:, :, None] * a[:, None, :]).reshape(n, c * d1)
    return h - v.T @ v


def kron_factors(a: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The KFAC of :func:`ggn_full`: G = Σ_n (diag(p_n) − p_n p_nᵀ) ``[C, C]`` and
    A = (1/N) Σ_n a_n a_nᵀ ``[D+1, D+1]``, so that H ≈ G ⊗ A."""
    g = torch.diag(p.sum(0)) - p.T @ p
    return g, a.T @ a / len(a)


def log_evidence(delta: float, eigenvalues: np.ndarray, log_lik: float, theta_sq: float) -> float:
    """log Z(δ) = log_lik − ½ [Σ log(λ + δ) − P log δ + δ ‖θ*‖²] (module docstring)."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    return float(log_lik - 0.5 * (np.sum(np.log(lam + delta)) - lam.size * math.log(delta) + delta * theta_sq))


def evidence_maximiser(eigenvalues: np.ndarray, theta_sq: float, lo: float = 1e-12, hi: float = 1e12) -> float:
    """The δ that maximises :func:`log_evidence`: the root of δ‖θ*‖² − Σ λ/(λ + δ), increasing
    in δ, by bisection on log δ within [lo, hi] (a root outside is clipped to the bound)."""
    lam = np.clip(np.asarray(eigenvalues, dtype=np.float64), 0.0, None)

    def slope(log_delta: float) -> float:
        delta = math.exp(log_delta)
        return delta * theta_sq - float(np.sum(lam / (lam + delta)))

    a, b = math.log(lo), math.log(hi)
    if slope(a) >= 0:
        return lo
    if slope(b) <= 0:
        return hi
    for _ in range(200):
        mid = 0.5 * (a + b)
        if slope(mid) < 0:
            a = mid
        else:
            b = mid
        if b - a < 1e-13:
            break
    return math.exp(0.5 * (a + b))


def probit(mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """Probit-approximated predictive logits μ_c / √(1 + π/8 · σ²_c) (softmax of them is the
    predictive), from the logits' means and marginal variances ``[B, C]``."""
    return mean / torch.sqrt(1.0 + PROBIT * var)


# ----------------------------------------------------------------------------- the head


class LaplaceHead(nn.Module):
    """The trained readout Linear with a last-layer Laplace posterior (module docstring).

    Before :meth:`fit`: the plain logits.  After it: probit logits (``link = "probit"``) or
    one draw of the logits per input and pass (``link = "mc"``)."""

    def __init__(self, linear: nn.Linear, hessian: str = "kron", link: str = "probit") -> None:
        super().__init__()
        self.linear, self.hessian, self.link = linear, hessian, link
        self.stochastic = link == "mc"  # draws noise at prediction (bench.train.vit.draws_noise)
        self.fitted = False
        self.prior_precision = float("nan")
        self.log_evidence = float("nan")

    def theta(self) -> torch.Tensor:
        """θ* = vec_row([W b]) ``[P]``, float64."""
        w, b = self.linear.weight.detach().double(), self.linear.bias.detach().double()
        return torch.cat([w, b[:, None]], dim=1).reshape(-1)

    @torch.no_grad()
    def fit(self, phi: torch.Tensor, labels: torch.Tensor, prior_precision: float | None = None) -> None:
        """The posterior from the training features ``phi [N, D]`` and labels ``[N]``: the GGN
        (or its KFAC) at the MAP, δ by evidence maximisation (or ``prior_precision``)."""
        a = augmented(phi.double())
        logits = a @ self.theta().view(self.linear.out_features, -1).T
        log_p = F.log_softmax(logits, dim=1)
        p = log_p.exp()
        log_lik = float(log_p.gather(1, labels.long()[:, None]).sum())
        theta_sq = float(self.theta().pow(2).sum())
        if self.hessian == "full":
            lam, vecs = torch.linalg.eigh(ggn_full(a, p))
            lam = lam.clamp_min(0.0)
            eig = lam.cpu().numpy()
        else:
            g, a_factor = kron_factors(a, p)
            lam_g, u_g = torch.linalg.eigh(g)
            lam_a, u_a = torch.linalg.eigh(a_factor)
            lam_g, lam_a = lam_g.clamp_min(0.0), lam_a.clamp_min(0.0)
            eig = torch.outer(lam_g, lam_a).reshape(-1).cpu().numpy()
        delta = evidence_maximiser(eig, theta_sq) if prior_precision is None else float(prior_precision)
        self.prior_precision, self.log_evidence = delta, log_evidence(delta, eig, log_lik, theta_sq)
        dtype = torch.float32
        if self.hessian == "full":
            cov = (vecs / (lam + delta)) @ vecs.T  # Σ = U diag(1/(λ+δ)) Uᵀ
            c = self.linear.out_features
            self.register_buffer("cov", cov.view(c, -1, c, cov.shape[0] // c).to(dtype))  # [C, D+1, C, D+1]
        else:
            self.register_buffer("u_g", u_g.to(dtype))
            self.register_buffer("u_a", u_a.to(dtype))
            self.register_buffer("inv_eig", (1.0 / (torch.outer(lam_g, lam_a) + delta)).to(dtype))  # [C, D+1]
        self.fitted = True

    def logit_distribution(self, phi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(μ ``[B, C]``, S ``[B, C, C]``) of the logits of features ``phi [B, D]``, float32."""
        phi = phi.float()
        mean = F.linear(phi, self.linear.weight.float(), self.linear.bias.float())
        a = augmented(phi)
        if self.hessian == "full":
            cov = torch.einsum("bd,cdke,be->bck", a, self.cov, a)
        else:
            s = (a @ self.u_a).pow(2) @ self.inv_eig.T  # [B, C]: Σ_j (U_Aᵀa)_j² / (λ^G_i λ^A_j + δ)
            cov = torch.einsum("ci,bi,ki->bck", self.u_g, s, self.u_g)
        return mean, 0.5 * (cov + cov.transpose(1, 2))

    def forward(self, phi: torch.Tensor) -> torch.Tensor:
        if not self.fitted:
            return self.linear(phi)
        with torch.autocast(device_type=phi.device.type, enabled=False):
            mean, cov = self.logit_distribution(phi)
            if self.link == "probit":
                return probit(mean, torch.diagonal(cov, dim1=1, dim2=2))
            eye = torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
            chol, _ = torch.linalg.cholesky_ex(cov + 1e-6 * eye * cov.diagonal(dim1=1, dim2=2).mean(-1)[:, None, None]
                                               + 1e-10 * eye)
            return mean + (chol @ torch.randn_like(mean)[:, :, None])[:, :, 0]

    def extra_repr(self) -> str:
        return f"hessian={self.hessian}, link={self.link}, prior_precision={self.prior_precision:.4g}"


@torch.no_grad()
def head_inputs(model: nn.Module, data: DataBundle, indices: np.ndarray | None, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(φ ``[N, D]``, labels ``[N]``): what ``model.head`` receives for the training images
    (all, or ``indices``), in eval mode, in float32."""
    from bench.train.loop import Normalize, to_tensor

    device = next(model.parameters()).device
    x_all, y_all = to_tensor(data.get("train"), device)
    if indices is not None:
        idx = torch.from_numpy(indices).to(device)
        x_all, y_all = x_all[idx], y_all[idx]
    norm, seen = Normalize(data, device), []
    hook = model.head.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().float()))
    try:
        model.eval()
        for i in range(0, len(x_all), batch_size):
            model(norm(x_all[i : i + batch_size]))
    finally:
        hook.remove()
    return torch.cat(seen), y_all


@METHODS.register("laplace_last_layer")
class LastLayerLaplace(TrainedMethod):
    """MSP's network, then a last-layer Laplace posterior fitted on the training split before
    prediction; probit (or Monte-Carlo) predictive (module docstring)."""

    official = {"hessian": "kron", "link": "probit"}  # laplace-torch's defaults; a prior precision by marglik

    @dataclass(frozen=True)
    class Options:
        hessian: Literal["kron", "full"] = "kron"  # KFAC GGN (Laplace Redux default) or the full GGN
        prior_precision: float | None = field(default=None, metadata={"exclusive_min": 0.0})  # None: max evidence
        link: Literal["probit", "mc"] = "probit"  # predictive approximation
        samples: int = field(default=100, metadata={"min": 1, "soft_max": 100_000})  # logit draws with link = "mc"
        fit_images: int | None = field(default=None, metadata={"min": 1})  # None: the whole training split
        fit_batch_size: int = field(default=500, metadata={"min": 1})
        base: str = ""  # the method whose same-seed cell is the MAP network (e.g. "msp"); "": train it here

    @property
    def samples(self) -> int:
        return self.options.samples if self.options.link == "mc" else 1

    def stage1(self) -> str:
        return self.options.base

    def post_hoc(self) -> bool:
        return bool(self.options.base)

    def init_from_stage1(self, model: nn.Module, state: dict) -> None:
        """The MAP network is the stage-1 network, every weight of it (same backbone)."""
        model.load_state_dict(state)

    @property
    def average(self) -> str:
        return "probs"

    def prediction_model(self, model, cfg: ModelConfig, data: DataBundle):
        """The trained model with its readout replaced by an (unfitted) :class:`LaplaceHead`;
        :meth:`eval_mode` fits it before the first prediction."""
        if not isinstance(model.head, nn.Linear):
            raise TypeError(f"laplace_last_layer needs a Linear readout, got {type(model.head).__name__}")
        model.head = LaplaceHead(model.head, self.options.hessian, self.options.link)
        self._fit_data = data
        return model

    def eval_mode(self, model) -> None:
        """Eval mode and, the first time for a prediction model, the Laplace fit on the
        training split (all of it, or ``fit_images`` drawn with generator seed 0)."""
        model.eval()
        head = getattr(model, "head", None)
        if isinstance(head, LaplaceHead) and not head.fitted:
            o = self.options
            n = len(self._fit_data.get("train"))
            indices = None
            if o.fit_images is not None and o.fit_images < n:
                indices = np.sort(np.random.default_rng(0).choice(n, o.fit_images, replace=False))
            phi, labels = head_inputs(model, self._fit_data, indices, o.fit_batch_size)
            head.fit(phi, labels, o.prior_precision)

    def deviations(self) -> list[str]:
        """Where these options leave Laplace Redux's default (module docstring)."""
        o = self.options
        out = ["prior precision at the evidence maximum (official: 100 Adam steps on log delta, which can stop short)"]
        if o.hessian != self.official["hessian"]:
            out.append("full GGN of the last layer (official default: KFAC)")
        if o.prior_precision is not None:
            out.append(f"fixed prior precision {o.prior_precision:g} (official: marginal likelihood)")
        if o.link != self.official["link"]:
            out.append(f"Monte-Carlo predictive with {o.samples} logit draws (official default: probit)")
        if o.fit_images is not None:
            out.append(f"curvature from {o.fit_images} training images (official: the whole training set)")
        return out
