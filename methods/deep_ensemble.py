"""Deep Ensembles as a combinator over stored predictions (Lakshminarayanan et al., 2017).

Nothing is retrained: replicate r of ``deep_ensemble`` averages the stored predictions of
seeds ``seeds[r*M:(r+1)*M]`` of its ``base`` method (``msp`` by default).  ``ensemble``
is the same combinator for any trained method of a suite, e.g.::

    [methods.sgpa_ensemble]
    type = "ensemble"
    base = "sgpa"
    members = 5

The authors published no code; ``docs/fidelity.md`` says what the combination follows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from bench.train.method import DerivedMethod, log_mean_exp, log_softmax
from bench.core.registry import METHODS


@dataclass(frozen=True)
class EnsembleOptions:
    base: str = "msp"
    members: int = field(default=5, metadata={"min": 1})
    average: Literal["probs", "logits"] = "probs"


@METHODS.register("ensemble")
@METHODS.register("deep_ensemble")
class Ensemble(DerivedMethod):
    """Average the stored predictions of ``members`` seeds of ``base`` (nothing retrained).

    ``average = "probs"`` is the usual deep-ensemble predictive (1/M) sum_m p_m;
    ``"logits"`` averages log-probabilities and renormalises, i.e. softmax of the mean
    logit (the KEP-SVGP sample-averaging rule).
    """

    Options = EnsembleOptions

    def members_per_replicate(self) -> int:
        return self.options.members

    def combine(self, members: list[dict[str, np.ndarray]], labels: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for split in members[0]:
            stack = np.stack([m[split].astype(np.float64) for m in members])
            out[split] = log_mean_exp(stack) if self.options.average == "probs" else log_softmax(stack.mean(axis=0))
        return out
