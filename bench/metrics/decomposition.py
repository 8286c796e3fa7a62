"""Entropy and the uncertainty decomposition of member (or MC-sample) predictions.

:func:`entropy` and :func:`decompose` (total = H[p-bar], aleatoric = mean member
entropy, epistemic = their difference, :func:`mutual_information`) are plain functions,
not registered metrics: analysis scores OOD detection by predictive entropy and by the
mutual information of the stored terms, and an ensemble stores the decomposition's terms
with its predictions.  This is the decomposition's one numpy definition; its one torch
twin, :func:`bench.train.loop.decomposition_terms`, computes the same two terms on the device
while predicting (``tests/bench/train/test_loop.py`` checks that the two agree).
"""
from __future__ import annotations

import numpy as np

from bench.metrics.inputs import check_probability_values


def entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats over the last axis: H[p] = -sum_k p_k ln p_k, 0 ln 0 = 0.

    ``probs`` [..., C] (finite, in [0, 1]; rows are not renormalised) -> float64 [...],
    e.g. [N, C] -> [N].  Not a registered metric.
    """
    p = np.asarray(probs)
    if p.ndim < 1 or p.shape[-1] == 0 or p.size == 0:
        raise ValueError(f"probs must have a non-empty last (class) axis, got shape {p.shape}")
    check_probability_values(p, "probs")
    p = p.astype(np.float64)
    terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)  # 0 ln 0 = 0
    return 0.0 - terms.sum(axis=-1)  # "0.0 -" turns -0.0 into 0.0 for one-hot rows


def decompose(member_probs: np.ndarray) -> dict[str, np.ndarray]:
    """Total / aleatoric / epistemic uncertainty from member (or sample) probabilities.

    ``member_probs`` [M, N, C] (M members or MC samples).  Returns float64 [N] arrays:
    ``total`` = H[p-bar] with p-bar = (1/M) sum_m p_m (the entropy *of the mean*, the
    "ensemble entropy"), ``aleatoric`` = (1/M) sum_m H[p_m] (the mean *of the entropies*;
    TorchUncertainty once reported this as the ensemble entropy, PR #304),
    ``epistemic`` = total - aleatoric (mutual information), >= 0 for normalised rows by
    Jensen's inequality and clipped at 0 against round-off.  Not a registered metric.
    """
    p = np.asarray(member_probs)
    if p.ndim != 3 or 0 in p.shape:
        raise ValueError(f"member_probs must be a non-empty [M, N, C] array, got shape {p.shape}")
    check_probability_values(p, "member_probs")
    p = p.astype(np.float64)
    total = entropy(p.mean(axis=0))
    aleatoric = entropy(p).mean(axis=0)
    return {"total": total, "aleatoric": aleatoric, "epistemic": mutual_information(total, aleatoric)}


def mutual_information(total: np.ndarray, aleatoric: np.ndarray) -> np.ndarray:
    """The epistemic term, total - aleatoric (nats, float64), clipped at 0 against
    round-off: from :func:`decompose`'s terms, or from the stored ``entropy_of_mean`` and
    ``mean_entropy`` of a prediction set (float32, as :func:`bench.train.loop.predict` writes them)."""
    return np.maximum(np.asarray(total, np.float64) - np.asarray(aleatoric, np.float64), 0.0)
