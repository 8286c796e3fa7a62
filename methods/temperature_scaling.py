"""Temperature scaling (Guo et al., 2017), fitted post hoc on stored validation predictions.

For each seed of ``base``, a single temperature T > 0 minimises the validation NLL of
softmax(z / T); every split's predictions become softmax(z / T).  Because stored
log-probabilities differ from logits only by a per-row constant, dividing them by T and
renormalising gives exactly softmax(z / T).  Accuracy is unchanged.  How the fit compares
with the authors' code (gpleiss/temperature_scaling): ``docs/fidelity.md``.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar

from bench.train.method import DerivedMethod, log_softmax
from bench.core.registry import METHODS


def fit_temperature(log_probs: np.ndarray, labels: np.ndarray) -> float:
    """argmin_T NLL(softmax(log_probs / T)), searched over log T in [-5, 5] (T in [0.0067, 148])."""
    z = log_probs.astype(np.float64)
    rows = np.arange(len(labels))

    def nll(log_t: float) -> float:
        return -float(np.mean(log_softmax(z / np.exp(log_t))[rows, labels]))

    res = minimize_scalar(nll, bounds=(-5.0, 5.0), method="bounded", options={"xatol": 1e-6})
    return float(np.exp(res.x))


@METHODS.register("temperature_scaling")
class TemperatureScaling(DerivedMethod):
    """One temperature per seed of ``base``, fitted by NLL on its stored ``val`` split."""

    def deviations(self) -> list[str]:
        """The authors' fit (LBFGS from T = 1.5 with a fixed step, lr 0.01, at most 200
        iterations) can stop short of the minimum that :func:`fit_temperature` reaches, or
        diverge (``docs/fidelity.md``)."""
        return ["T at the validation-NLL minimum (official: LBFGS from 1.5 with lr 0.01 and 200 iterations, "
                "which can stop short of it or diverge)"]

    def combine(self, members: list[dict[str, np.ndarray]], labels: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (preds,) = members
        t = fit_temperature(preds["val"], labels["val"])
        return {split: log_softmax(lp.astype(np.float64) / t) for split, lp in preds.items()}
