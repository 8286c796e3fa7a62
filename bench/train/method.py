"""The two shapes a method takes.

**Trained** methods (:class:`TrainedMethod`) are "a ViT whose attention is X, trained
with loss L, predicting with S Monte-Carlo passes"; a subclass overrides only what
differs (``Options``, ``attention_layers``, ``eval_mode``, ``training_loss``).  Two
explicit contracts: options deriving from :class:`MonteCarlo` declare the passes and
their averaging; layers deriving from :class:`LossTerm` add a term to the loss.  Each
(dataset, method, seed) is one cell of the plan, trained by the one loop in
``bench.train.loop``.

**Derived** methods (:class:`DerivedMethod`) are never trained: they are computed in
analysis from the *stored* predictions of member cells of a trained ``base`` method
(temperature scaling fits on the stored validation predictions; ensembles average the
predictions of several seeds).  They are plain numpy, so analysis needs no model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

from bench.data import DataBundle
from bench.config.spec import ModelConfig
from bench.store import Predictions


@dataclass(frozen=True)
class MonteCarlo:
    """Options of a method that predicts with several stochastic passes: a method declares
    them by deriving its ``Options`` from this class (``class Options(MonteCarlo)``), and
    may redeclare a field to change its default.  ``samples`` passes are combined by
    ``average``: ``"probs"`` = the mean predictive probability, ``"logits"`` = softmax of
    the mean logit.  Methods whose options do not derive from it predict with one pass."""

    samples: int = field(default=10, metadata={"min": 1})  # stochastic passes at test
    average: Literal["probs", "logits"] = "probs"

    def pass_deviations(self, official: dict) -> list[str]:
        """Lines for a method's ``deviations()``: where these passes differ from the official
        code's ``official["samples"]`` passes combined by ``official["average"]`` (the
        method's :attr:`TrainedMethod.official`)."""
        names = {"probs": "probabilities", "logits": "logits"}
        samples, average = official["samples"], official["average"]
        out = []
        if self.average != average:
            out.append(f"{names[self.average]} averaged over the passes (official: {names[average]})")
        if self.samples != samples:
            out.append(f"{self.samples} prediction passes (official: {samples})")
        return out


class LossTerm:
    """The protocol of a layer that adds a term to the training loss (KL, KSVD, ...).

    Derive the layer from this class as well as ``nn.Module`` and implement
    :meth:`extra_loss`; :func:`extra_losses` (used by the one training loop) adds the terms
    of every such module of a model.
    """

    def extra_loss(self):
        """The term from the layer's last forward pass (a scalar tensor), or ``None`` when
        it has none (e.g. that pass ran in eval mode)."""
        raise NotImplementedError

    def loss_terms(self) -> dict:
        """The named quantities behind the last term (scalar tensors or numbers), for the
        training log and TensorBoard: the training loop records each one's mean over an
        epoch's steps, summed over the layers that name it.  By default the whole term,
        as ``extra_loss``; a layer names its own parts (KEP-SVGP: ``ksvd`` and ``kl``)."""
        term = self.extra_loss()
        return {} if term is None else {"extra_loss": term}


def extra_losses(model) -> list:
    """The non-``None`` ``extra_loss()`` terms of every :class:`LossTerm` module of ``model``."""
    terms = (m.extra_loss() for m in model.modules() if isinstance(m, LossTerm))
    return [t for t in terms if t is not None]


class TrainedMethod:
    kind: ClassVar[str] = "trained"
    #: The authors' value of each option that has one (option name -> value): what
    #: :meth:`deviations` compares the options with, declared once; ``docs/fidelity.md``
    #: states each (``Official values of `name`: ...``, checked by a test).
    official: ClassVar[dict[str, object]] = {}
    #: A registered attention used in every block (None: the backbone's own), with the
    #: options :meth:`attention_options` gives: "a ViT whose attention is X" in one line.
    attention: ClassVar[str | None] = None

    @dataclass(frozen=True)
    class Options:
        """A deterministic single-pass predictor has no options."""

    def __init__(self, options) -> None:
        self.options = options

    # --- model -------------------------------------------------------------------------
    @classmethod
    def model_defaults(cls) -> dict:
        """Backbone settings this method wants unless the suite overrides them."""
        return {}

    def build_model(self, cfg: ModelConfig, data: DataBundle, attention_layers: dict | None = None):
        """The backbone of ``cfg`` for ``data`` (a ViT for images, the text Transformer for
        token data: :func:`bench.train.vit.backbone`) with this method's :meth:`attention_layers`
        (or the ``attention_layers`` given, e.g. the layers a prediction model swaps in)."""
        from bench.train.vit import backbone

        layers = self.attention_layers(cfg) if attention_layers is None else attention_layers
        return backbone(data, cfg, layers)

    def attention_layers(self, cfg: ModelConfig) -> dict:
        """The blocks whose attention this method replaces: ``{block index: (registered
        attention name, options)}``; by default every block when :attr:`attention` is set.
        Every other block uses ``cfg.attention`` with ``cfg.attention_options``, built by the
        same function (``bench.train.vit.make_attention``)."""
        if self.attention is None:
            return {}
        return {block: (self.attention, self.attention_options()) for block in range(cfg.depth)}

    def attention_options(self) -> dict:
        """Options of :attr:`attention` (default: none)."""
        return {}

    def deviations(self) -> list[str]:
        """How this method, with its options, differs from its authors' code: one short line
        each, empty when it has none or there is no such code (``docs/fidelity.md`` has the
        full list with the official lines).  A report names them in a footnote."""
        return []

    def stage1(self) -> str:
        """Two-stage recipes: the suite name of a trained method whose cell of the same
        dataset and seed this one starts from ("" for none, the default).  That cell is found
        in the store as a derived method's members are (``bench.store.catalog``); its stored
        ``checkpoint.pt`` is handed to :meth:`init_from_stage1` before training, or, when the
        store holds no complete cell of it, it is trained first inside this cell."""
        return ""

    def init_from_stage1(self, model, state: dict) -> None:
        """Start ``model`` from the stage-1 weights ``state`` (a state dict); methods whose
        :meth:`stage1` names a method implement it."""
        raise NotImplementedError(f"{type(self).__name__} names a stage 1 but does not implement init_from_stage1")

    def post_hoc(self) -> bool:
        """Whether this method trains nothing after its stage 1 (default False): its cell's
        network is the stage-1 network as stored, and only its prediction differs (last-layer
        Laplace fitted on msp's network).  Such a cell trains for 0 seconds, writes no
        ``train_log.csv``, and takes its best epoch and validation accuracy from stage 1."""
        return False

    def prediction_model(self, model, cfg: ModelConfig, data: DataBundle):
        """The model that predicts, given the trained one (default: itself).  A method that
        swaps an attention at test time (KDEformer into a softmax-trained ViT) builds it
        here and loads the trained weights."""
        return model

    def epoch_log(self, model) -> dict[str, float]:
        """Extra columns of the training log after each epoch (e.g. RPC's sparsity of S)."""
        return {}

    # --- training ----------------------------------------------------------------------
    def training_loss(self, model, logits, labels):
        """Cross-entropy plus the term of every :class:`LossTerm` layer (KL, KSVD, ...)."""
        import torch.nn.functional as F

        loss = F.cross_entropy(logits.float(), labels)
        for term in extra_losses(model):
            loss = loss + term
        return loss

    def on_train_step(self, model, step: int, total_steps: int) -> None:
        """Called by the training loop before every optimisation step (``step`` counts from
        0 to ``total_steps - 1``): e.g. a KL-annealing weight that ramps with progress."""

    def on_train_epoch(self, model, epoch: int, epochs: int) -> None:
        """Called by the training loop before the first step of every epoch (``epoch``
        counts from 0 to ``epochs - 1``): e.g. a KL-annealing weight set once per epoch."""

    # --- prediction --------------------------------------------------------------------
    @property
    def samples(self) -> int:
        """Stochastic forward passes per prediction: ``options.samples`` when the method's
        options derive from :class:`MonteCarlo`, else 1."""
        return self.options.samples if isinstance(self.options, MonteCarlo) else 1

    #: Whether every random draw of a prediction pass is independent per input (dropout
    #: masks, per-sample GP noise), so that :func:`bench.train.loop.predict` may run the S passes
    #: as one forward of the batch repeated S times.  A method whose noise is shared across
    #: a batch (e.g. one hash projection per forward) sets it to False.
    batched_samples: ClassVar[bool] = True

    @property
    def average(self) -> str:
        """How passes are combined: ``"logits"`` (then softmax) or ``"probs"``."""
        return self.options.average if isinstance(self.options, MonteCarlo) else "probs"

    def eval_mode(self, model) -> None:
        """Put the model in its prediction mode (MC Dropout keeps dropout on)."""
        model.eval()


@dataclass(frozen=True)
class DerivedOptions:
    base: str = "msp"  # the trained method of the suite whose stored predictions are used


class DerivedMethod:
    kind: ClassVar[str] = "derived"
    official: ClassVar[dict[str, object]] = {}  # as TrainedMethod.official
    Options: ClassVar[type] = DerivedOptions

    def __init__(self, options) -> None:
        self.options = options

    def members_per_replicate(self) -> int:
        return 1

    def deviations(self) -> list[str]:
        """As :meth:`TrainedMethod.deviations`: how this method differs from its authors' code."""
        return []

    def replicates(self, seeds: tuple[int, ...]) -> list[tuple[int, tuple[int, ...]]]:
        """``(replicate id, member seeds)`` pairs.  A one-member method (post-hoc) has one
        replicate per seed, identified by that seed; a combinator of M members uses
        consecutive disjoint blocks of M seeds, identified 0, 1, ..."""
        m = self.members_per_replicate()
        blocks = [tuple(seeds[r * m : (r + 1) * m]) for r in range(len(seeds) // m)]
        return [(block[0] if m == 1 else r, block) for r, block in enumerate(blocks)]

    def combine(self, members: list[dict[str, np.ndarray]], labels: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Map the members' ``split -> log_probs [N, C]`` dicts (and the splits' labels,
        ``-1`` on OOD) to this method's ``split -> log_probs``."""
        raise NotImplementedError

    def predict_from(self, members: list[dict[str, Predictions]]) -> dict[str, Predictions]:
        """One replicate's stored-format predictions from its members' (each ``split ->``
        :class:`~bench.store.Predictions`): :meth:`combine` on the splits every member has,
        plus the decomposition terms ``entropy_of_mean``/``mean_entropy`` of the members'
        predictive distributions and their spread ``prob_variance`` (sum over classes of the
        members' population variance) when there are several members.  Logits and
        features are not combined: the members' feature spaces differ.  :meth:`combine`
        receives read-only views (:func:`bench.metrics.inputs.read_only`): the members'
        arrays are the stored predictions every other method row and metric reads."""
        from bench.metrics import decompose
        from bench.metrics.inputs import read_only

        common = sorted(set.intersection(*(set(m) for m in members)))
        labels = {sp: members[0][sp].labels for sp in common}
        combined = self.combine([read_only({sp: m[sp].log_probs for sp in common}) for m in members],
                                read_only(labels))
        preds = {sp: Predictions(combined[sp], labels[sp]) for sp in combined}
        if len(members) > 1:
            for sp in combined:
                probs = np.stack([np.exp(m[sp].log_probs.astype(np.float64)) for m in members])
                terms = decompose(probs)
                preds[sp] = preds[sp].replace(entropy_of_mean=terms["total"], mean_entropy=terms["aleatoric"],
                                              prob_variance=probs.var(axis=0).sum(axis=-1))
        return preds


def log_mean_exp(log_probs: np.ndarray, axis: int = 0) -> np.ndarray:
    """log(mean(exp(x))) along ``axis``, stably: averaging probabilities in log space."""
    m = np.max(log_probs, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    out = m + np.log(np.mean(np.exp(log_probs - m), axis=axis, keepdims=True))
    return np.squeeze(out, axis=axis)


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - np.max(z, axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))
