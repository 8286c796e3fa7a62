"""MSP: the plain softmax-attention ViT; confidence = maximum softmax probability
(Hendrycks & Gimpel, 2017).  One deterministic forward pass per prediction.  How the
backbone compares with the official KEP-SVGP ViT it follows: ``docs/fidelity.md``."""
from __future__ import annotations

from bench.train.method import TrainedMethod
from bench.core.registry import METHODS


@METHODS.register("msp")
class MSP(TrainedMethod):
    """Softmax-attention ViT, cross-entropy, one pass; confidence = max softmax probability."""
