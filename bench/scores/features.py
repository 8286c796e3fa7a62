"""OOD scores in feature space, fitted on a cell's stored training features.

The features are the penultimate ones: the pooled token the classifier head reads
(``bench.train.vit.Backbone.readout``: after the final LayerNorm), averaged over a method's
passes, stored as float16 and computed with here in float64.  Each score has a plain
numpy fit/score pair (``fit_mahalanobis`` / ``mahalanobis_score``, ...) and a registered
:class:`~bench.scores.record.Score`.  Higher = more in-distribution throughout, with
OpenOOD v1.5's sign; where our value differs from OpenOOD's by a monotone map (same
AUROC, FPR95, AUPR) the convention says so.

* Mahalanobis (Lee et al. 2018; OpenOOD ``mds``): class means and one shared covariance
  (maximum likelihood, /n) of the class-centred training features; its pseudo-inverse
  (``scipy.linalg.pinvh``, as scikit-learn's ``EmpiricalCovariance.precision_``); score
  ``max_c -(x - mu_c)^T P (x - mu_c)``.
* Relative Mahalanobis (Ren et al. 2021; OpenOOD ``rmds``): the same minus a background
  Gaussian's distance (mean and covariance of all training features):
  ``max_c -(MD_c(x) - MD_0(x))``.
* KNN (Sun et al. 2022; OpenOOD ``knn``): features divided by their L2 norm; score = minus
  the Euclidean distance to the k-th nearest normalised training feature.  Sun et al. use
  k = 50 for CIFAR-10 with the whole training set, and for a sampled fraction alpha of it
  k scaled by alpha (ImageNet: k = 1000 with all, 10 with 1%); we use
  ``k = max(1, round(50 * n / train_size))`` for n stored of ``train_size`` images (all
  of them in the default suite: k = 50).  OpenOOD returns the negative *squared* distance
  (faiss ``IndexFlatL2``) and adds 1e-10 after normalising: the same ranking.
* ViM (Wang et al. 2022; OpenOOD ``vim``): origin ``u = -pinv(W) b`` of the head
  ``z = W x + b``; principal subspace = the top-D eigenvectors of the uncentred covariance
  of ``x - u`` over the training features (``eigh``: orthonormal eigenvectors; OpenOOD's
  ``eig`` is not orthonormal when there are fewer features than the width, docs/fidelity.md),
  with D = 1000 for feature width N >= 2048, 512 for N >= 768 and N / 2 below, the official
  code's rule (haoqiwang/vim ``benchmark.py:230-235``; OpenOOD's CIFAR setting: 256 of 512);
  ``alpha = mean max-logit / mean ||residual||`` on the training features; score =
  ``logsumexp(z) - alpha ||(x - u) R||`` with R the residual (non-principal) eigenvectors
  and z recomputed from the features (as OpenOOD does).
* Residual (Wang et al. 2022; OpenOOD ``residual``): ``-||(x - u) R||``, fitted as ViM on
  the training features with ViM's D, as the ViM code does (OpenOOD fits it on the ID
  validation split with D = 512; docs/fidelity.md).
* DDU feature density (Mukhoti et al. 2023, "Deep Deterministic Uncertainty"; official
  code omegafragger/DDU f597744): Gaussian discriminant analysis, one Gaussian per class
  with its *own* mean and covariance (unlike Mahalanobis' shared one), fitted on the stored
  training features; score = the log density of the mixture with the class proportions,
  ``log q(x) = logsumexp_c [log N(x; mu_c, Sigma_c + j I) + log pi_c]``, higher = more
  in-distribution (the paper's epistemic uncertainty is its negative).  Exactly as the
  official ``utils/gmm_utils.py``: ``mu_c`` the class mean (``gmm_fit``, :87), ``Sigma_c``
  the class-centred scatter divided by ``n_c - 1`` (``centered_cov_torch``, :9-12,
  ``gmm_fit`` :88-90), and one jitter ``j`` for every class, the first of
  ``JITTERS = [0, finfo(double).tiny] + [10^e for e in -308..-1]`` (:5-6) for which every
  ``Sigma_c + j I`` has a Cholesky factor (``gmm_fit`` :93-107: ``MultivariateNormal``
  factorises the covariance and the loop moves on when that fails).  The official code
  multiplies the jitter by ``torch.eye``, which is float32, so the value added is the
  float32 rounding of ``10^e``: 0 up to ``1e-46``, ``1.4e-45`` for ``1e-45`` (the smallest
  float32 subnormal); we add the same values (:func:`gda_jitter`).  Class priors: the
  paper's ``q(z) = sum_y q(z|y) q(y)`` with ``pi_c = n_c / n`` (the proportions of the
  stored subset); the official evaluation leaves ``log pi_c`` out (``evaluate.py``
  :211-212 takes ``logsumexp`` of ``gmm.log_prob``, ``gmm_utils.py`` :52), which ranks
  images the same when the classes are equally frequent and differs by ``log(n_c / n)``
  per class otherwise.  A class with fewer than 2 stored features has no covariance (the
  official code would divide by 0): the fit raises and analysis names the reason.  With
  ``n_c <= D`` (e.g. CIFAR-100's 10,000 stored features, about 100 per class, in width
  384) every ``Sigma_c`` is singular and the jitter decides its small eigenvalues; the
  official fit uses all 45,000 training images (450 per class).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import pinvh, solve_triangular
from scipy.special import logsumexp

from bench.scores.record import ARRAYS, TrainingFeatures, ood_score

KNN_K = 50  # Sun et al. 2022, CIFAR-10 with the full training set
KNN_CHUNK = 1024  # test rows per distance block (a block is chunk x n float64)


# --- Mahalanobis and relative Mahalanobis ---------------------------------------------------
@dataclass(frozen=True)
class Gaussians:
    """Class means ``means`` [K, D] (of the K classes present, ``classes`` [K]), the shared
    precision ``precision`` [D, D], and the background mean ``mean0`` [D] and precision
    ``precision0`` [D, D] of all training features."""

    classes: np.ndarray
    means: np.ndarray
    precision: np.ndarray
    mean0: np.ndarray
    precision0: np.ndarray


def _precision(centred: np.ndarray) -> np.ndarray:
    """Pseudo-inverse of the maximum-likelihood covariance (/n) of centred rows [n, D]."""
    return pinvh(centred.T @ centred / len(centred))


def fit_gaussians(features: np.ndarray, labels: np.ndarray) -> Gaussians:
    """Class-conditional Gaussians with a shared covariance, and the background Gaussian,
    of training ``features`` [n, D] with ``labels`` [n] (module docstring)."""
    x = np.asarray(features, np.float64)
    classes = np.unique(labels)
    means = np.stack([x[labels == c].mean(axis=0) for c in classes])
    centred = x - means[np.searchsorted(classes, labels)]
    mean0 = x.mean(axis=0)
    return Gaussians(classes, means, _precision(centred - centred.mean(axis=0)), mean0, _precision(x - mean0))


def _squared_distances(x: np.ndarray, means: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """``(x_i - m_k)^T P (x_i - m_k)`` for rows ``x`` [N, D] and ``means`` [K, D] -> [N, K]."""
    out = np.empty((len(x), len(means)))
    for k, m in enumerate(means):
        d = x - m
        out[:, k] = np.einsum("nd,de,ne->n", d, precision, d)
    return out


def mahalanobis_score(features: np.ndarray, fit: Gaussians) -> np.ndarray:
    """``max_c -(x - mu_c)^T P (x - mu_c)`` of ``features`` [N, D] -> [N]."""
    return -_squared_distances(np.asarray(features, np.float64), fit.means, fit.precision).min(axis=1)


def relative_mahalanobis_score(features: np.ndarray, fit: Gaussians) -> np.ndarray:
    """``max_c -(MD_c(x) - MD_0(x))`` of ``features`` [N, D] -> [N] (Ren et al. 2021)."""
    x = np.asarray(features, np.float64)
    background = _squared_distances(x, fit.mean0[None], fit.precision0)[:, 0]
    return -(_squared_distances(x, fit.means, fit.precision).min(axis=1) - background)


def _fit_gaussians(training: TrainingFeatures) -> Gaussians:
    return fit_gaussians(training.features, training.labels)


@ood_score("Mahalanobis", "max_c -(x - mu_c)^T P (x - mu_c): class means and shared covariance (/n, "
           "pseudo-inverted) of the stored training features (Lee et al. 2018; OpenOOD `mds`, same sign).",
           reads=(ARRAYS.features,), fit=_fit_gaussians, reference="Lee et al., NeurIPS 2018", default=5)
def mahalanobis(preds, fitted: Gaussians):
    return mahalanobis_score(preds.features, fitted)


@ood_score("RelMahalanobis", "max_c -(MD_c(x) - MD_0(x)): Mahalanobis minus the distance to one Gaussian "
           "of all training features (Ren et al. 2021; OpenOOD `rmds`, same sign).",
           reads=(ARRAYS.features,), fit=_fit_gaussians, reference="Ren et al., arXiv:2106.09022 (2021)",
           name="relative_mahalanobis")
def relative_mahalanobis(preds, fitted: Gaussians):
    return relative_mahalanobis_score(preds.features, fitted)


# --- KNN -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Neighbours:
    """Normalised training features ``bank`` [n, D] and the neighbour rank ``k``."""

    bank: np.ndarray
    k: int


def normalise(features: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (a zero row stays zero)."""
    x = np.asarray(features, np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def knn_k(stored: int, train_size: int) -> int:
    """Sun et al.'s k = 50 scaled by the stored fraction of the training set, at most ``stored``."""
    return int(min(stored, max(1, round(KNN_K * stored / max(train_size, stored)))))


def fit_knn(features: np.ndarray, k: int) -> Neighbours:
    """The normalised bank of training ``features`` [n, D] and ``k`` (1 <= k <= n)."""
    bank = normalise(features)
    if not 1 <= k <= len(bank):
        raise ValueError(f"k must lie in [1, {len(bank)}], got {k}")
    return Neighbours(bank, int(k))


def knn_score(features: np.ndarray, fit: Neighbours) -> np.ndarray:
    """Minus the Euclidean distance from each normalised row of ``features`` [N, D] to its
    k-th nearest row of the bank -> [N] (exact, in blocks of :data:`KNN_CHUNK` rows)."""
    x = normalise(features)
    bank_sq = (fit.bank**2).sum(axis=1)
    out = np.empty(len(x))
    for i in range(0, len(x), KNN_CHUNK):
        q = x[i : i + KNN_CHUNK]
        d2 = (q**2).sum(axis=1)[:, None] + bank_sq[None] - 2.0 * q @ fit.bank.T
        kth = np.partition(d2, fit.k - 1, axis=1)[:, fit.k - 1]
        out[i : i + KNN_CHUNK] = -np.sqrt(np.maximum(kth, 0.0))
    return out


def _fit_knn(training: TrainingFeatures) -> Neighbours:
    return fit_knn(training.features, knn_k(len(training.features), training.train_size))


@ood_score("KNN", "-||x/|x| - b_(k)||: minus the distance to the k-th nearest normalised training feature, "
           "k = 50 x (stored / all training images) (Sun et al. 2022; OpenOOD `knn` gives minus the squared "
           "distance: same ranking).",
           reads=(ARRAYS.features,), fit=_fit_knn, reference="Sun et al., ICML 2022", default=6)
def knn(preds, fitted: Neighbours):
    return knn_score(preds.features, fitted)


# --- ViM and residual ------------------------------------------------------------------------
@dataclass(frozen=True)
class VirtualLogit:
    """ViM's fit: origin ``u`` [D], residual basis ``residual`` [D, D - d], ``alpha``, and
    the head ``weight`` [C, D], ``bias`` [C]."""

    u: np.ndarray
    residual: np.ndarray
    alpha: float
    weight: np.ndarray
    bias: np.ndarray


def vim_dim(width: int) -> int:
    """The principal subspace's dimension D for feature width N: the official code's rule
    (haoqiwang/vim ``benchmark.py:230-235``; module docstring)."""
    return 1000 if width >= 2048 else 512 if width >= 768 else width // 2


def fit_vim(features: np.ndarray, weight: np.ndarray, bias: np.ndarray, dim: int | None = None) -> VirtualLogit:
    """ViM on training ``features`` [n, D] and the head ``weight`` [C, D], ``bias`` [C];
    ``dim``: the principal dimension (default :func:`vim_dim`)."""
    x = np.asarray(features, np.float64)
    w, b = np.asarray(weight, np.float64), np.asarray(bias, np.float64)
    dim = vim_dim(x.shape[1]) if dim is None else dim
    if not 0 < dim < x.shape[1]:
        raise ValueError(f"the principal dimension must lie in (0, {x.shape[1]}), got {dim}")
    u = -np.linalg.pinv(w) @ b
    centred = x - u
    values, vectors = np.linalg.eigh(centred.T @ centred / len(x))
    residual = np.ascontiguousarray(vectors[:, np.argsort(-values, kind="stable")[dim:]])
    alpha = (x @ w.T + b).max(axis=1).mean() / np.linalg.norm(centred @ residual, axis=1).mean()
    return VirtualLogit(u, residual, float(alpha), w, b)


def residual_norm(features: np.ndarray, fit: VirtualLogit) -> np.ndarray:
    """``||(x - u) R||`` of ``features`` [N, D] -> [N]."""
    return np.linalg.norm((np.asarray(features, np.float64) - fit.u) @ fit.residual, axis=1)


def vim_score(features: np.ndarray, fit: VirtualLogit) -> np.ndarray:
    """``logsumexp(W x + b) - alpha ||(x - u) R||`` of ``features`` [N, D] -> [N]."""
    x = np.asarray(features, np.float64)
    return logsumexp(x @ fit.weight.T + fit.bias, axis=1) - fit.alpha * residual_norm(x, fit)


def _fit_vim(training: TrainingFeatures) -> VirtualLogit:
    return fit_vim(training.features, training.head_weight, training.head_bias)


@ood_score("ViM", "logsumexp(z) - alpha ||(x - u) R||: energy minus the scaled norm of the feature's "
           "residual outside the principal subspace of the training features (Wang et al. 2022; OpenOOD `vim`, "
           "same sign).",
           reads=(ARRAYS.features,), fit=_fit_vim, reference="Wang et al., CVPR 2022", default=7)
def vim(preds, fitted: VirtualLogit):
    return vim_score(preds.features, fitted)


@ood_score("Residual", "-||(x - u) R||: minus the norm of ViM's residual (Wang et al. 2022; OpenOOD "
           "`residual`, same sign).",
           reads=(ARRAYS.features,), fit=_fit_vim, reference="Wang et al., CVPR 2022")
def residual(preds, fitted: VirtualLogit):
    return -residual_norm(preds.features, fitted)


# --- DDU: Gaussian discriminant analysis, feature density ---------------------------------------
#: omegafragger/DDU ``utils/gmm_utils.py:6``: ``[0, torch.finfo(torch.double).tiny] + [10 ** exp for exp in range(-308, 0, 1)]``
GDA_JITTERS: tuple[float, ...] = (0.0, float(np.finfo(np.float64).tiny)) + tuple(10.0 ** e for e in range(-308, 0))


def gda_jitter(eps: float) -> float:
    """What the official ``gmm_fit`` adds to the diagonal for jitter ``eps``: ``eps *
    torch.eye(D)`` is float32 (torch's default dtype), so ``eps`` rounded to float32."""
    return float(np.float32(eps))


@dataclass(frozen=True)
class ClassGaussians:
    """DDU's GDA: classes ``classes`` [K], means ``means`` [K, D], the inverse Cholesky
    factors ``inv_chol`` [K, D, D] of ``Sigma_c + jitter I`` (so that the squared
    Mahalanobis distance is ``||inv_chol_c (x - mu_c)||^2``), their log-determinants
    ``log_det`` [K], the log class proportions ``log_prior`` [K], the official jitter
    ``jitter_eps`` (an entry of :data:`GDA_JITTERS`) and the value ``jitter`` it added."""

    classes: np.ndarray
    means: np.ndarray
    inv_chol: np.ndarray
    log_det: np.ndarray
    log_prior: np.ndarray
    jitter_eps: float
    jitter: float


def class_covariances(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(classes [K], means [K, D], covariances [K, D, D])`` of training ``features`` [n, D]
    per class present in ``labels`` [n]: the class mean and the class-centred scatter
    divided by ``n_c - 1`` (official ``centered_cov_torch``)."""
    x = np.asarray(features, np.float64)
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    if (few := classes[counts < 2]).size:
        raise ValueError(f"class(es) {few.tolist()} have fewer than 2 stored training features: no covariance")
    means = np.stack([x[labels == c].mean(axis=0) for c in classes])
    covs = np.stack([(x[labels == c] - m).T @ (x[labels == c] - m) / (n - 1) for c, m, n in zip(classes, means, counts)])
    return classes, means, covs


def fit_gda(features: np.ndarray, labels: np.ndarray) -> ClassGaussians:
    """DDU's Gaussian discriminant analysis of training ``features`` [n, D] with ``labels``
    [n] (module docstring): per-class means and covariances, one jitter for all classes,
    the first of :data:`GDA_JITTERS` for which every jittered covariance has a Cholesky
    factor; raises ``ValueError`` when none has (the official loop would end without a
    model)."""
    labels = np.asarray(labels)
    classes, means, covs = class_covariances(features, labels)
    counts = np.array([(labels == c).sum() for c in classes])
    eye = np.eye(covs.shape[1])
    tried: set[float] = set()
    for eps in GDA_JITTERS:
        jitter = gda_jitter(eps)
        if jitter in tried:  # the same matrices as an earlier entry (float32 rounding to 0)
            continue
        tried.add(jitter)
        try:
            chol = np.stack([np.linalg.cholesky(cov + jitter * eye) for cov in covs])
        except np.linalg.LinAlgError:
            continue
        inv_chol = np.stack([solve_triangular(lower, eye, lower=True) for lower in chol])
        log_det = 2.0 * np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(axis=1)
        return ClassGaussians(classes, means, inv_chol, log_det, np.log(counts / counts.sum()), float(eps), jitter)
    raise ValueError(f"no jitter up to {GDA_JITTERS[-1]:g} makes every class covariance positive definite")


def gda_log_density(features: np.ndarray, fit: ClassGaussians) -> np.ndarray:
    """``log q(x) = logsumexp_c [log N(x; mu_c, Sigma_c + j I) + log pi_c]`` of
    ``features`` [N, D] -> [N]."""
    x = np.asarray(features, np.float64)
    d = x.shape[1]
    joint = np.empty((len(x), len(fit.classes)))
    for k in range(len(fit.classes)):
        whitened = (x - fit.means[k]) @ fit.inv_chol[k].T
        joint[:, k] = -0.5 * (d * np.log(2 * np.pi) + fit.log_det[k] + (whitened**2).sum(axis=1)) + fit.log_prior[k]
    return logsumexp(joint, axis=1)


def _fit_gda(training: TrainingFeatures) -> ClassGaussians:
    return fit_gda(training.features, training.labels)


@ood_score("DDU density", "log q(x) = logsumexp_c [log N(x; mu_c, Sigma_c) + log pi_c]: a Gaussian per class, its own "
           "mean and covariance (/(n_c - 1), plus the official jitter until positive definite), pi_c = n_c / n, fitted "
           "on the stored training features (Mukhoti et al. 2023, DDU's feature density; the official code leaves out "
           "log pi_c).",
           reads=(ARRAYS.features,), fit=_fit_gda, reference="Mukhoti et al., CVPR 2023")
def ddu_density(preds, fitted: ClassGaussians):
    return gda_log_density(preds.features, fitted)
