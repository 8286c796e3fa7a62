"""OOD scores in feature space, fitted on a cell's stored training features.

The features are the penultimate ones: the pooled token the classifier head reads
(``bench.vit.Backbone.readout``: after the final LayerNorm), averaged over a method's
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
  of ``x - u`` over the training features, with D = 1000 for feature width N >= 1500, 512
  for N >= 768 (the paper's choices) and N / 2 below (OpenOOD's CIFAR setting: 256 of
  512); ``alpha = mean max-logit / mean ||residual||`` on the training features; score =
  ``logsumexp(z) - alpha ||(x - u) R||`` with R the residual (non-principal) eigenvectors
  and z recomputed from the features (as OpenOOD does).
* Residual (Wang et al. 2022; OpenOOD ``residual``): ``-||(x - u) R||``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import pinvh
from scipy.special import logsumexp

from bench.scores.record import TrainingFeatures, ood_score

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
           reads=("features",), fit=_fit_gaussians, reference="Lee et al., NeurIPS 2018", default=5)
def mahalanobis(arrays, fitted: Gaussians):
    return mahalanobis_score(arrays["features"], fitted)


@ood_score("RelMahalanobis", "max_c -(MD_c(x) - MD_0(x)): Mahalanobis minus the distance to one Gaussian "
           "of all training features (Ren et al. 2021; OpenOOD `rmds`, same sign).",
           reads=("features",), fit=_fit_gaussians, reference="Ren et al., arXiv:2106.09022 (2021)",
           name="relative_mahalanobis")
def relative_mahalanobis(arrays, fitted: Gaussians):
    return relative_mahalanobis_score(arrays["features"], fitted)


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
           reads=("features",), fit=_fit_knn, reference="Sun et al., ICML 2022", default=6)
def knn(arrays, fitted: Neighbours):
    return knn_score(arrays["features"], fitted)


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
    """The principal subspace's dimension D for feature width N (module docstring)."""
    return 1000 if width >= 1500 else 512 if width >= 768 else width // 2


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
           reads=("features",), fit=_fit_vim, reference="Wang et al., CVPR 2022", default=7)
def vim(arrays, fitted: VirtualLogit):
    return vim_score(arrays["features"], fitted)


@ood_score("Residual", "-||(x - u) R||: minus the norm of ViM's residual (Wang et al. 2022; OpenOOD "
           "`residual`, same sign).",
           reads=("features",), fit=_fit_vim, reference="Wang et al., CVPR 2022")
def residual(arrays, fitted: VirtualLogit):
    return -residual_norm(arrays["features"], fitted)
