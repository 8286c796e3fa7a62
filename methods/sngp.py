r"""SNGP: spectral-normalised residual branches and a random-feature Gaussian-process output
layer (Liu et al., "Simple and Principled Uncertainty Estimation with Deterministic Deep
Learning via Distance Awareness", NeurIPS 2020, arXiv 2006.10108).

A distance-aware classifier from two changes to the softmax ViT: (1) every residual
branch h of x + h(x) gets weights of bounded spectral norm, so the hidden map keeps input
distances (bi-Lipschitz); (2) the dense output layer becomes an approximate GP with an RBF
kernel, through random Fourier features, whose posterior variance grows away from the
training data and damps the logits there.

Equations (B batch, d = model width, M = ``random_features``, C classes)
---------------------------------------------------------------------------
* **Spectral normalisation** (every block).  Wrapped: the attention's output projection
  ``attn.proj`` and both Linear layers of the MLP, ``mlp[0]`` and ``mlp[3]`` — the dense
  layers BERT-SNGP wraps (uncertainty-baselines ``bert_sngp.py``: the attention's
  ``_output_dense`` and the feed-forward's ``_intermediate_dense`` and ``_output_dense``).
  Query/key/value projections, patch embedding and LayerNorms are not wrapped.  For a
  weight W, one power iteration per training forward (u, v buffers, 15 at construction)
  estimates σ̂ = uᵀ W v, and the layer uses
        W_sn = W · min(1, c / σ̂),       c = ``spectral_norm_bound``
  (edward2 ``SpectralNormalization``: W is rescaled only when σ̂ exceeds c).  In eval mode
  u and v stay as they are.  (The mechanism is shared with DDU: ``bench/train/spectral_norm.py``.)
* **GP layer** (replaces the readout's Linear; its input is the pooled, LayerNormed token
  ``h ∈ R^d``):
        h̃ = LN₀(h)                              (parameter-free LayerNorm, ``normalize_input``)
        φ(h) = s · cos(W h̃ + b) ∈ R^M,  W_{m,:} ~ N(0, I/ℓ²),  b_m ~ U(0, 2π)  (fixed buffers)
        logits = β φ + β₀                         (β ∈ R^{C×M}, β₀ ∈ R^C trained)
  with ℓ = ``kernel_scale`` (None: ℓ² = d/2, i.e. W ~ N(0, 2/d), edward2.jax's he-normal
  random features) and s = 1 (edward2.jax) or √(2/M) (``scale_features``; the paper's
  Φ = √(2/M) cos(·)).
* **Laplace covariance** (Gaussian likelihood, shared by the classes, ridge s_r = ``ridge``):
        P = s_r · I + Σ_{i ∈ epoch} φ_i φ_iᵀ,        var(h) = s_r · φ(h)ᵀ P^{-1} φ(h)
  P is reset to s_r·I at the start of every epoch (``on_train_epoch``) and accumulated over
  that epoch's training batches (features without gradient, float32, summed over the ranks
  under DDP), so after training it holds the last epoch's features — with best-checkpoint
  selection, the kept epoch's (the buffer is part of the checkpoint).  s_r·P^{-1} =
  (I + ΦᵀΦ/s_r)^{-1}: a GP with unit prior variance and noise variance s_r.
* **Mean-field logits** at test (eval mode):  logits / √(1 + λ · var),  λ = ``mean_field_factor``.
  One deterministic pass; the argmax is that of the plain logits.

Recipe and defaults
-------------------
The defaults are uncertainty-baselines' ViT-SNGP (``baselines/jft/sngp.py`` with
``uncertainty_baselines/models/vit_gp.py``, edward2.jax ``RandomFeatureGaussianProcess``
defaults, and the CIFAR fine-tuning config
``baselines/jft/experiments/imagenet21k_vit_base16_sngp_finetune_cifar.py``; google/
uncertainty-baselines 163351d, google/edward2 ee02560): M = 1024 random features; a
parameter-free LayerNorm on the GP input; W ~ N(0, 2/d) and s = 1 (edward2.jax since
8de4e03: "he-normal" random features, the RBF kernel of length-scale √(d/2)); ridge 1; the
exact precision matrix over the last epoch (``covmat_momentum = -1``); mean-field factor
λ = 20; output layer with a trained bias, weights truncated-normal with variance 1/M
(flax ``Dense``), bias 0.  The spectral-norm bound c = 0.95 and one power iteration are
BERT-SNGP's (``baselines/clinc_intent/sngp.py``), the one Transformer of
uncertainty-baselines with spectral normalisation.

Departures from the paper and the official code: (1) ViT-SNGP itself applies no spectral
normalisation (``vit_gp.py`` has a TODO for it); we follow the paper and BERT-SNGP
(``spectral_norm = false`` gives ViT-SNGP's backbone).  (2) Gradients flow through
W·c/σ̂ (torch's ``spectral_norm`` convention, u and v held fixed); edward2 overwrites the
kernel with the rescaled one each step, so its gradient is the unnormalised layer's.
(3) The paper's λ is π/8 (``mean_field_factor = 0.3927``); ViT-SNGP's CIFAR config uses 20.
(4) The paper's Algorithm 1 weights each class's precision by p̂(1 − p̂); like every
uncertainty-baselines SNGP we use the Gaussian-likelihood precision shared by the classes.
(5) The backbone is the suite's ViT (mean pooling by default), trained from scratch with the
suite's recipe; ViT-SNGP fine-tunes a pre-trained ViT-B/16 with its class token.  No
Monte-Carlo sampling of the logits (uncertainty-baselines' ``gp_mc_sampling = -1``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from bench.train import distributed
from bench.data import DataBundle
from bench.train.method import TrainedMethod
from bench.core.registry import METHODS
from bench.config.spec import ModelConfig
from bench.train.spectral_norm import spectral_normalise_residuals


class RandomFeatureGP(nn.Module):
    """The random-feature GP output layer with its Laplace covariance (module docstring).

    Training mode: returns ``logits [B, C]`` and adds Σ φφᵀ of the batch to ``precision``.
    Eval mode: returns the mean-field logits ``logits / sqrt(1 + λ · var)``."""

    def __init__(self, dim: int, num_classes: int, random_features: int = 1024, kernel_scale: float | None = None,
                 scale_features: bool = False, normalize_input: bool = True, ridge: float = 1.0,
                 mean_field_factor: float = 20.0) -> None:
        super().__init__()
        m = random_features
        self.ridge, self.mean_field_factor = float(ridge), float(mean_field_factor)
        self.normalize_input = normalize_input
        self.feature_scale = math.sqrt(2.0 / m) if scale_features else 1.0
        std = 1.0 / kernel_scale if kernel_scale is not None else math.sqrt(2.0 / dim)
        self.register_buffer("rff_weight", std * torch.randn(m, dim))  # W: [M, d], fixed
        self.register_buffer("rff_bias", 2 * math.pi * torch.rand(m))  # b: [M], fixed
        self.output = nn.Linear(m, num_classes)  # β, β₀
        with torch.no_grad():  # flax Dense: lecun_normal (truncated normal, variance 1/M), zero bias
            std_out = math.sqrt(1.0 / m) / 0.87962566103423978
            nn.init.trunc_normal_(self.output.weight, std=std_out, a=-2 * std_out, b=2 * std_out)
            self.output.bias.zero_()
        self.register_buffer("precision", self.ridge * torch.eye(m))  # P: [M, M]
        self._cov_factor: tuple[tuple, torch.Tensor] | None = None  # (key of P, L^{-T})

    def features(self, h: torch.Tensor) -> torch.Tensor:
        """φ(h) ``[B, M]`` in float32 (or wider) from the pooled features ``h [B, d]``."""
        h = h.to(torch.promote_types(h.dtype, torch.float32))
        if self.normalize_input:
            h = F.layer_norm(h, h.shape[-1:], eps=1e-6)  # flax LayerNorm's epsilon
        return self.feature_scale * torch.cos(h @ self.rff_weight.t().to(h.dtype) + self.rff_bias.to(h.dtype))

    def reset_precision(self) -> None:
        """P = ridge · I (the start of an epoch)."""
        with torch.no_grad():
            self.precision.copy_(self.ridge * torch.eye(len(self.precision), dtype=self.precision.dtype,
                                                        device=self.precision.device))

    def covariance_factor(self) -> torch.Tensor:
        """F = L^{-T} with P = L Lᵀ (a float64 Cholesky, returned in P's dtype), so that
        var = ridge · ‖φ F‖²; cached until P changes."""
        key = (self.precision.data_ptr(), self.precision._version, self.precision.device)
        if self._cov_factor is None or self._cov_factor[0] != key:
            chol = torch.linalg.cholesky(self.precision.double())
            eye = torch.eye(len(chol), dtype=chol.dtype, device=chol.device)
            inv_t = torch.linalg.solve_triangular(chol, eye, upper=False).t()  # L^{-T}
            self._cov_factor = (key, inv_t.to(self.precision.dtype))
        return self._cov_factor[1]

    def variance(self, phi: torch.Tensor) -> torch.Tensor:
        """Posterior variance ``[B]`` = ridge · φᵀ P^{-1} φ of features ``phi [B, M]``."""
        return self.ridge * (phi @ self.covariance_factor().to(phi.dtype)).pow(2).sum(-1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=h.device.type, enabled=False):
            phi = self.features(h)
            logits = self.output(phi)
            if self.training:
                with torch.no_grad():
                    batch = (phi.t() @ phi).to(self.precision.dtype)
                    if distributed.active():  # every rank adds the global batch's features
                        distributed.all_sum_(batch)
                    self.precision.add_(batch)
                return logits
            return logits / torch.sqrt(1.0 + self.mean_field_factor * self.variance(phi))[:, None]

    def extra_repr(self) -> str:
        return (f"random_features={len(self.rff_bias)}, ridge={self.ridge}, mean_field_factor={self.mean_field_factor}, "
                f"normalize_input={self.normalize_input}, feature_scale={self.feature_scale:.4g}")


@METHODS.register("sngp")
class SNGP(TrainedMethod):
    """The softmax ViT with spectral-normalised residual branches and a random-feature GP
    output layer; one mean-field pass at test (module docstring)."""

    # ViT-SNGP's (its CIFAR fine-tuning config for the mean-field factor); ViT-SNGP sets no kernel_scale
    official = {"spectral_norm": False, "mean_field_factor": 20.0, "random_features": 1024, "scale_features": False,
                "normalize_input": True, "ridge": 1.0}

    @dataclass(frozen=True)
    class Options:
        random_features: int = field(default=1024, metadata={"min": 1, "soft_max": 1 << 16})  # M
        kernel_scale: float | None = field(default=None, metadata={"exclusive_min": 0.0})  # ℓ; None: ℓ² = d/2
        scale_features: bool = False  # φ = sqrt(2/M) cos(·) (paper) instead of cos(·) (ViT-SNGP)
        normalize_input: bool = True  # parameter-free LayerNorm on the GP input
        ridge: float = field(default=1.0, metadata={"exclusive_min": 0.0})  # P = ridge·I + Σ φφᵀ
        mean_field_factor: float = field(default=20.0, metadata={"min": 0.0})  # λ (paper: π/8)
        spectral_norm: bool = True  # wrap attn.proj, mlp.0, mlp.3 of every block
        spectral_norm_bound: float = field(default=0.95, metadata={"exclusive_min": 0.0})  # c
        spectral_norm_iterations: int = field(default=1, metadata={"min": 1})  # power iterations per step

    def build_model(self, cfg: ModelConfig, data: DataBundle, attention_layers: dict | None = None):
        """The backbone with its readout Linear replaced by :class:`RandomFeatureGP` and, with
        ``spectral_norm``, the residual branches' dense layers wrapped
        (:func:`bench.train.spectral_norm.residual_linears`)."""
        o = self.options
        model = super().build_model(cfg, data, attention_layers)
        model.head = RandomFeatureGP(cfg.dim, data.num_classes, o.random_features, o.kernel_scale, o.scale_features,
                                     o.normalize_input, o.ridge, o.mean_field_factor)
        if o.spectral_norm:
            spectral_normalise_residuals(model, o.spectral_norm_bound, o.spectral_norm_iterations, "sngp")
        return model

    def on_train_epoch(self, model: nn.Module, epoch: int, epochs: int) -> None:
        """Reset the GP layer's precision matrix: it accumulates this epoch's features."""
        for m in model.modules():
            if isinstance(m, RandomFeatureGP):
                m.reset_precision()

    def deviations(self) -> list[str]:
        """Where these options leave uncertainty-baselines' ViT-SNGP (module docstring)."""
        o, ref = self.options, self.official
        out = []
        if o.spectral_norm != ref["spectral_norm"]:
            out.append(f"spectral norm <= {o.spectral_norm_bound:g} on attn.proj, mlp.0, mlp.3 (ViT-SNGP: none; "
                       "BERT-SNGP's layers)")
        if o.mean_field_factor != ref["mean_field_factor"]:
            out.append(f"mean-field factor {o.mean_field_factor:g} (ViT-SNGP CIFAR: {ref['mean_field_factor']:g})")
        if o.random_features != ref["random_features"]:
            out.append(f"{o.random_features} random features (ViT-SNGP: {ref['random_features']})")
        if o.kernel_scale is not None or o.scale_features != ref["scale_features"]:  # ViT-SNGP sets no length scale
            out.append("random features scaled as the paper (ViT-SNGP: W ~ N(0, 2/d), cos unscaled)")
        if o.normalize_input != ref["normalize_input"]:
            out.append("no LayerNorm on the GP input (ViT-SNGP: parameter-free LayerNorm)")
        if o.ridge != ref["ridge"]:
            out.append(f"ridge {o.ridge:g} (ViT-SNGP: {ref['ridge']:g})")
        return out
