"""The OOD score record: what is said about a post-hoc OOD score besides its function.

Every score is a function decorated with :func:`ood_score`, which registers a
:class:`Score` in ``bench.core.registry.SCORES``: its label, the one sentence of its
convention, the stored arrays it reads (which give what it *needs*: probabilities,
logits, several passes, features, training features), its reference and its place in the
default selection.  The registry is the only list of scores: analysis, the OOD table, the
README's notes and ``python run_suite.py list`` read it.

Convention shared by every score: a score is a float64 ``[N]`` array where **higher
means more in-distribution** (OpenOOD v1.5's ``conf``), so the OOD metrics
(:mod:`bench.metrics.ood`) take it as it is.  A score that fits on in-distribution data
(Mahalanobis, KNN, ViM, ...) has a ``fit`` function that takes the cell's stored
:class:`TrainingFeatures` and returns what the score function reads; fitting is
deterministic (no random state).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from bench.metrics.inputs import read_only
from bench.core.registry import SCORES
from bench.store import Predictions, TrainingFeatures
from bench.store.record import ARRAYS, needs  # noqa: F401  (ARRAYS: how a score names what it reads)

#: What a score may need, and the stored prediction arrays that provide it (declared with
#: the arrays: :func:`bench.store.record.needs`).
NEEDS: dict[str, tuple[str, ...]] = needs()
TRAINING = "training features"  # a score with a ``fit``: the cell's ``features/train.npz``
FEATURES = "features"  # the need of the scores that read the stored features
LOGITS = "logits"  # the need of the scores that read the stored logits


def fitting_view(stored: TrainingFeatures) -> TrainingFeatures:
    """What a fitted score fits on: the cell's stored :class:`TrainingFeatures`
    (:meth:`bench.store.CellDir.read_training_features`) with its arrays as float64 (labels
    int64) read-only views (every fitted score of a cell fits on the same arrays)."""
    return TrainingFeatures(*(read_only(np.asarray(a, t)) for a, t in (
        (stored.features, np.float64), (stored.labels, np.int64), (stored.head_weight, np.float64),
        (stored.head_bias, np.float64))), int(stored.train_size))


@dataclass(frozen=True)
class Score:
    """A registered OOD score.

    ``fn(preds, fitted)`` maps one split's stored :class:`~bench.store.Predictions`
    (read-only) and what ``fit`` returned (None for a score without ``fit``) to the
    score ``[N]`` (float64, higher = more in-distribution).  ``reads``: the arrays it
    reads, named through :data:`ARRAYS` (e.g. ``(ARRAYS.logits,)``; a name the record does
    not declare is refused).  A score is computed only where all of them are stored
    (``entropy_of_mean``, ``mean_entropy`` and ``prob_variance`` exist only for methods with
    several passes or members).  ``fit(training)``: for scores fitted on :class:`TrainingFeatures`
    (:func:`fitting_view`: float64).
    ``label``: the short name reports print; ``convention``: the one sentence the README
    prints (formula, sign, and where it differs from OpenOOD v1.5); ``reference``: the
    paper.  ``default``: the score's position among the scores analysis computes unless
    ``--scores`` names others (None: computed on request only)."""

    name: str
    fn: Callable[[Predictions, Any], np.ndarray]
    label: str
    convention: str
    reads: tuple[str, ...]
    reference: str = ""
    fit: Callable[[TrainingFeatures], Any] | None = None
    default: float | None = None

    def __post_init__(self) -> None:
        known = {a for arrays in NEEDS.values() for a in arrays}
        if unknown := [a for a in self.reads if a not in known]:
            raise ValueError(f"OOD score {self.name!r}: reads unknown array(s) {unknown}; known: {sorted(known)}")
        if not self.convention.strip():
            raise ValueError(f"OOD score {self.name!r}: state its convention in one sentence")

    @property
    def needs(self) -> tuple[str, ...]:
        """What the score needs, in the words of :data:`NEEDS` (plus :data:`TRAINING`)."""
        out = [need for need, arrays in NEEDS.items() if set(arrays) & set(self.reads)]
        return tuple(out + ([TRAINING] if self.fit is not None else []))

    @property
    def needs_stored_features(self) -> bool:
        """Whether it needs what ``[store] features`` keeps: the features or the training features."""
        return bool({FEATURES, TRAINING} & set(self.needs))

    def lacks(self, preds: Predictions, training: bool) -> str | None:
        """What of its needs a prediction set lacks (``"features"``, ...), or None when the
        score can be computed; ``training``: whether training features are stored."""
        for need, names in NEEDS.items():
            if any(a in self.reads and not preds.has(a) for a in names):
                return need
        return TRAINING if self.fit is not None and not training else None

    def __call__(self, preds: Predictions, fitted: Any = None) -> np.ndarray:
        """``fn`` on a read-only view of the split's arrays (:func:`bench.metrics.inputs.read_only`)."""
        return np.asarray(self.fn(preds.map(read_only), fitted), dtype=np.float64)


def ood_score(label: str, convention: str, *, reads: tuple[str, ...], reference: str = "",
              fit: Callable[[TrainingFeatures], Any] | None = None, default: float | None = None,
              name: str | None = None) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn(preds, fitted) -> [N]`` as a :class:`Score` (named after the
    function unless ``name`` is given) and return the function unchanged.  A plugin module
    adds a score the same way; ``--scores NAME`` then computes it and the OOD table shows it."""

    def deco(fn: Callable) -> Callable:
        key = name or fn.__name__
        SCORES.register(key)(Score(key, fn, label, convention, tuple(reads), reference, fit, default))
        return fn

    return deco


def get_score(name: str) -> Score:
    """The registered :class:`Score` ``name`` (unknown names raise ``ConfigError`` with the
    closest known name)."""
    return SCORES.get(name)


def default_scores() -> list[str]:
    """The scores analysis computes when ``--scores`` is not given, in display order."""
    chosen = [(s.default, s.name) for s in map(SCORES.get, SCORES.names()) if s.default is not None]
    return [n for _, n in sorted(chosen)]


def score_order(names: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Every registered score in display order: the default ones first (in their order),
    then the others by name; ``names`` first restricts to those."""
    order = default_scores() + [n for n in SCORES.names() if n not in default_scores()]
    return [n for n in order if not names or n in names]


def score_key(name: str) -> tuple:
    """The sort key of display order (:func:`score_order`); a name not registered now (a
    plugin's score in analysis files read without the plugin) sorts after them, by name."""
    order = score_order()
    return (order.index(name) if name in order else len(order), name)


def sort_scores(names) -> list[str]:
    """``names`` in display order (:func:`score_key`)."""
    return sorted(names, key=score_key)


def validate_scores(names) -> list[str]:
    """``names`` checked against the registry (:meth:`bench.core.registry.Registry.validate`:
    repeats dropped, order kept; an unknown name is a ConfigError naming the closest
    registered one).  Called where scores enter (``--scores``)."""
    return SCORES.validate(names, "--scores")


def detector_cost(training: TrainingFeatures, test: Predictions,
                  names: list[str] | None = None) -> dict[str, dict[str, float]]:
    """What each fitted score (every registered score with a ``fit``, or ``names``) costs on
    this machine: ``{name: {"fit_seconds": s, "score_seconds_per_1000": s}}``, its
    ``fit`` on ``training`` (the stored ``features/train.npz``) and its scoring of the
    ``test`` split's predictions, wall-clock.  The cell measures it once, where it was trained,
    and keeps it in ``cell.json`` (the efficiency table reads it there, so two reports of
    one store agree); analysis fits the same scores again, with the same results (fitting
    is deterministic).  A score whose inputs the arrays lack, or that raises, is left out."""
    fitted_on = fitting_view(training)
    out: dict[str, dict[str, float]] = {}
    for name in names if names is not None else SCORES.names():
        score = SCORES.get(name)
        if score.fit is None or score.lacks(test, True) is not None:
            continue
        try:
            t0 = time.perf_counter()
            fitted = score.fit(fitted_on)
            t1 = time.perf_counter()
            score(test, fitted)
            t2 = time.perf_counter()
        except Exception:  # noqa: BLE001  (a plugin's bug is named by analysis, not here)
            continue
        out[name] = {"fit_seconds": round(t1 - t0, 6),
                     "score_seconds_per_1000": round(1000 * (t2 - t1) / max(1, len(test)), 6)}
    return out
