r"""DDU: Deep Deterministic Uncertainty (Mukhoti, Kirsch, van Amersfoort, Torr & Gal, "Deep
Deterministic Uncertainty: A New Simple Baseline", CVPR 2023, arXiv 2102.11582; official code
omegafragger/DDU f597744).

A single deterministic softmax network whose feature extractor is kept smooth and sensitive
(residual connections with spectral normalisation), trained with plain cross-entropy; after
training a Gaussian discriminant analysis (GDA) of its penultimate features gives the
epistemic uncertainty, the softmax entropy the aleatoric one.

Recipe (B batch, D = model width, C classes)
--------------------------------------------
* **Backbone**: the suite's ViT with every residual branch's dense layers spectral-
  normalised, the same layers and the same mechanism as SNGP (``bench/train/spectral_norm.py``):
  ``attn.proj``, ``mlp.0`` and ``mlp.3`` of every block get
        W_sn = W · min(1, c / σ̂),    σ̂ = uᵀ W v (one power iteration per training step),
  the official ``spectral_norm_fc`` (``net/spectral_normalization/spectral_norm_fc.py:98-101``:
  ``factor = max(1, sigma / coeff); weight = weight / factor``).  c = ``coeff`` = 3.0
  (``utils/args.py:30`` ``sn_coeff = 3.0``; the README's CIFAR-10 command ``--coeff 3.0``),
  one power iteration (``net/wide_resnet.py:73`` ``n_power_iterations=1``).
* **Head and loss**: a plain ``Linear`` softmax head (``net/wide_resnet.py:128``), not
  normalised; cross-entropy (``utils/args.py:19`` ``loss = "cross_entropy"``).  One pass
  at test.  The cell stores logits, probabilities and the penultimate features (the pooled,
  LayerNormed token the head reads) exactly as ``msp``'s do.
* **Feature density** (epistemic), computed by analysis from the store, not by the model:
  the OOD score ``ddu_density`` (``bench/scores/features.py``), fitted on the cell's stored
  training features ``z_i`` with labels ``y_i``:
        mu_c = mean_{y_i = c} z_i,     Sigma_c = sum_{y_i = c} (z_i - mu_c)(z_i - mu_c)ᵀ / (n_c - 1),
        log q(z) = logsumexp_c [ log N(z; mu_c, Sigma_c + j I) + log pi_c ],   pi_c = n_c / n,
  one Gaussian per class with its own covariance (``utils/gmm_utils.py`` ``gmm_fit`` :85-90,
  ``centered_cov_torch`` :9-12); j is the first of ``[0, finfo(double).tiny] + [10^e, e =
  -308..-1]`` (:5-6) with which every ``Sigma_c + j I`` has a Cholesky factor (:93-107),
  rounded to float32 as the official ``eps * torch.eye(D)`` is.  Higher = more
  in-distribution (the paper's uncertainty is ``-log q(z)``).  Class priors: we use the
  paper's ``q(z) = sum_y q(z|y) q(y)`` with the stored subset's proportions; the official
  evaluation takes ``logsumexp`` of ``gmm.log_prob`` without them (``evaluate.py:211-212``),
  the same ranking when the classes are equally frequent.
* **Aleatoric**: the softmax entropy of the network's prediction, the registered score
  ``entropy`` (the paper's Table 1; ``metrics/uncertainty_confidence.py:8-13``).

How the report shows it: ``ddu_density`` is not among the default scores (adding one would
change every committed report's OOD table); ask for it with ``--scores``, which replaces the
default list, e.g. ``--scores msp,entropy,mutual_info,max_logit,energy,mahalanobis,knn,vim,ddu_density``
(on ``run`` or ``report``).  It is computed for every method that stores features, so the OOD
table shows it for ``msp`` (GDA on an unnormalised ViT) beside ``ddu``.

Departures from the paper and the official code
-----------------------------------------------
(1) Backbone: the paper's CIFAR model is a Wide-ResNet-28-10 (``net/wide_resnet.py``) with
spectral normalisation on every convolution, stem and 1x1 shortcuts included (a conv-operator
bound, ``spectral_norm_conv``, for 3x3 kernels), leaky ReLU and average-pooled shortcuts
(``-mod``), dropout 0.3 in the blocks; ours is the suite's ViT with the residual branches'
dense layers normalised (the patch embedding, query/key/value and LayerNorms are not: as SNGP),
its own activations and dropout.  (2) Training: the official recipe is SGD 0.1, momentum 0.9,
weight decay 5e-4, batch 128, 350 epochs, learning rate / 10 at epochs 150 and 250
(``utils/args.py:13-27``); ours is the suite's recipe, the same budget as every other method.
(3) GDA data: the official fit uses the features of the whole training split (45,000 images
after its 10% validation split); ours uses the stored subset, ``[store] train_features``
(10,000 by default, drawn once with seed 0), so CIFAR-100 has about 100 features per class
in width 384: every class covariance is singular and the jitter decides its smallest
eigenvalues; raise ``train_features`` to 45000 to fit on the whole split.  (4) Features are
stored as float16 and the GDA is computed in float64 (the official code: float64 features of
a float32 network).  (5) The class priors of the density (above).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bench.data import DataBundle
from bench.train.method import TrainedMethod
from bench.core.registry import METHODS
from bench.config.spec import ModelConfig
from bench.train.spectral_norm import spectral_normalise_residuals


@METHODS.register("ddu")
class DDU(TrainedMethod):
    """The softmax ViT with spectral-normalised residual branches and a plain Linear head,
    cross-entropy, one pass; epistemic uncertainty = the ``ddu_density`` OOD score computed
    from the stored features (module docstring)."""

    official = {"spectral_norm": True, "coeff": 3.0}  # -sn, sn_coeff (CIFAR)

    @dataclass(frozen=True)
    class Options:
        spectral_norm: bool = True  # wrap attn.proj, mlp.0, mlp.3 of every block
        coeff: float = field(default=3.0, metadata={"exclusive_min": 0.0})  # c (official sn_coeff, CIFAR)
        spectral_norm_iterations: int = field(default=1, metadata={"min": 1})  # power iterations per step

    def build_model(self, cfg: ModelConfig, data: DataBundle, attention_layers: dict | None = None):
        """The backbone (with its plain Linear head) and, with ``spectral_norm``, the residual
        branches' dense layers bounded by ``coeff`` (:mod:`bench.train.spectral_norm`)."""
        o = self.options
        model = super().build_model(cfg, data, attention_layers)
        if o.spectral_norm:
            spectral_normalise_residuals(model, o.coeff, o.spectral_norm_iterations, "ddu")
        return model

    def deviations(self) -> list[str]:
        """Where these options leave the official DDU (module docstring)."""
        o = self.options
        out = ["ViT with spectral norm on attn.proj, mlp.0, mlp.3 (official: Wide-ResNet-28-10, every conv)",
               "GDA on the stored training-feature subset ([store] train_features; official: whole training split)"]
        if o.spectral_norm != self.official["spectral_norm"]:
            out.append("no spectral normalisation (official DDU: -sn)")
        if o.coeff != self.official["coeff"]:
            out.append(f"spectral-norm coefficient {o.coeff:g} (official CIFAR: {self.official['coeff']:g})")
        return out
