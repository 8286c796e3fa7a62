"""OOD scores of a model's outputs: probabilities, logits and the spread of its passes.

Each score is a plain numpy function of arrays (``msp_score(probs)``,
``energy_score(logits)``, ...) and a registered :class:`~bench.scores.record.Score` that
applies it to a split's stored arrays.  Higher = more in-distribution throughout.

For a method with S Monte-Carlo passes (or an ensemble), the probabilities are the
method's predictive distribution (``log_probs``: the mean probability, or the softmax of
the mean logit, as the method averages), and ``logits`` is the mean logit over the
passes: max logit and energy of a sampling method are those of its mean logit.
"""
from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from bench.metrics.decomposition import entropy, mutual_information
from bench.scores.record import ARRAYS, ood_score


def msp_score(probs: np.ndarray) -> np.ndarray:
    """Maximum softmax probability ``max_c p_c`` of ``probs`` [N, C] -> [N]."""
    return np.asarray(probs, np.float64).max(axis=1)


def max_logit_score(logits: np.ndarray) -> np.ndarray:
    """Maximum logit ``max_c z_c`` of ``logits`` [N, C] -> [N]."""
    return np.asarray(logits, np.float64).max(axis=1)


def energy_score(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Negative free energy ``T logsumexp(z / T)`` of ``logits`` [N, C] -> [N] (Liu et al.
    2020: E(x) = -T logsumexp(z / T); the score is -E, higher = more in-distribution)."""
    z = np.asarray(logits, np.float64)
    return temperature * logsumexp(z / temperature, axis=1)


def _probs(preds) -> np.ndarray:
    return np.exp(preds.log_probs.astype(np.float64))


@ood_score("MSP", "max_c p_c of the predictive distribution (Hendrycks & Gimpel 2017; OpenOOD `msp`).",
           reads=(ARRAYS.log_probs,), reference="Hendrycks & Gimpel, ICLR 2017", default=0)
def msp(preds, _fitted=None):
    return msp_score(_probs(preds))


@ood_score("Entropy", "-H[p̄] = sum_c p_c ln p_c of the predictive distribution, in nats.",
           reads=(ARRAYS.log_probs,), reference="Shannon entropy of the predictive distribution", default=1,
           name="entropy")
def negative_entropy(preds, _fitted=None):
    return -entropy(_probs(preds))


@ood_score("MI", "-(H[p̄] - mean_s H[p_s]): negative mutual information between prediction and model "
           "(the epistemic part of the entropy), for methods with several passes or members.",
           reads=(ARRAYS.entropy_of_mean, ARRAYS.mean_entropy), reference="Depeweg et al., ICML 2018", default=2,
           name="mutual_info")
def mutual_info(preds, _fitted=None):
    return -mutual_information(preds.entropy_of_mean, preds.mean_entropy)


@ood_score("MaxLogit", "max_c z_c of the (mean) logit (Hendrycks et al. 2022; OpenOOD `mls`).",
           reads=(ARRAYS.logits,), reference="Hendrycks et al., ICML 2022", default=3)
def max_logit(preds, _fitted=None):
    return max_logit_score(preds.logits)


@ood_score("Energy", "T logsumexp(z / T) with T = 1 of the (mean) logit, i.e. minus the free energy "
           "(Liu et al. 2020; OpenOOD `ebo`, same sign).",
           reads=(ARRAYS.logits,), reference="Liu et al., NeurIPS 2020", default=4)
def energy(preds, _fitted=None):
    return energy_score(preds.logits, 1.0)


@ood_score("PredVar", "-sum_c Var_s[p_s,c]: minus the variance of the class probabilities over the passes "
           "(population variance over the S passes, or over the members of an ensemble), summed over classes.",
           reads=(ARRAYS.prob_variance,), reference="e.g. Gal 2016, section 3.3 (predictive variance)",
           name="predictive_variance")
def predictive_variance(preds, _fitted=None):
    return -preds.prob_variance.astype(np.float64)
