"""MC Dropout (Gal & Ghahramani, 2016): the softmax ViT trained with dropout, and dropout
kept on at test time; the predictive is the average of S stochastic passes.  No authors'
code exists for a ViT (``docs/fidelity.md``)."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from bench.train.method import MonteCarlo, TrainedMethod
from bench.core.registry import METHODS


@METHODS.register("mc_dropout")
class MCDropout(TrainedMethod):
    """Softmax ViT with dropout kept on at test; averages ``samples`` stochastic passes."""

    @dataclass(frozen=True)
    class Options(MonteCarlo):
        """``samples`` passes with dropout on, probabilities averaged."""

    @classmethod
    def model_defaults(cls) -> dict:
        return {"dropout": 0.1}

    def eval_mode(self, model: nn.Module) -> None:
        """Eval mode everywhere except dropout layers, which keep sampling masks."""
        model.eval()
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.train()
