"""The metric record: what is said about a metric besides its function.

Every metric is a function decorated with :func:`metric`, which registers a
:class:`Metric` in ``bench.core.registry.METRICS`` carrying everything else that is said
about it: kind, label and unit, direction, the convention sentence reports print, its
vectorised bootstrap kernel (if any) and its place in named selections
(:func:`selection`: ``"paper"`` = the KEP-SVGP Table 1 set, ``"default"`` = what
analysis computes and the summary and OOD tables show by default (the paper's set
with the debiased ECE beside ECE), ``"shift"`` the columns of the shift tables,
``"severity"`` the metrics plotted against corruption severity).  The registry is the
only list of metrics.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from bench.metrics.inputs import read_only
from bench.core.registry import METRICS

_Metric = Callable[..., float]


#: What a metric measures; ``ood`` metrics take ``(scores_id, scores_ood)``, every other
#: kind ``(probs, labels)`` on a labelled split.
KINDS = ("classification", "calibration", "failure", "ood", "text")
#: Reporting units and the scale that turns a raw value into them.
UNITS: dict[str, float] = {"%": 100.0, "x100": 100.0, "x1000": 1000.0, "x10": 10.0, "": 1.0}


@dataclass(frozen=True)
class Metric:
    """A registered metric: its function and everything analysis and reports need.

    ``fn`` returns a raw float (fractions, nats, plain risks); ``kind`` is one of
    :data:`KINDS` and fixes the inputs (:attr:`on_scores`); ``label``/``unit`` make the
    column header (``unit`` in :data:`UNITS`, which gives :attr:`scale`);
    ``higher_is_better`` the good direction (significance marks, bold best);
    ``convention`` the one sentence the report's conventions table prints.
    ``bootstrap`` is the vectorised evaluator over resamples (``(probs, labels, w)`` or
    ``(scores_id, scores_ood, w_id, w_ood)`` -> ``[B]``), or None: then
    ``bench.analysis.bootstrap`` evaluates ``fn`` once per resample (exact, slower).  ``selections``
    maps named selections (:func:`selection`; ``"paper"`` = the KEP-SVGP Table 1 set,
    ``"default"`` = the default columns) to this metric's column position in them.
    ``interval`` says, in one sentence, where the report's 95% intervals of this metric are
    only approximate (empty: their coverage was measured nominal); a calibration error gets
    :data:`APPROXIMATE_CALIBRATION` unless it says more.  ``bounds`` (low <= high): the range of the
    metric's true value (raw scale); the report's 95% intervals are cut to it, as a t
    interval around a value near a bound can reach past it (an AUROC interval past 100%).
    ``bias_corrected``: the metric's estimate is bias-corrected by construction (the
    debiased ECE), so the report's intervals and tests centre on it as it is; every other
    metric is centred on its estimate less the bootstrap's bias estimate (``bench.analysis.bootstrap``).
    """

    name: str
    fn: Callable[..., float]
    kind: str
    label: str
    unit: str
    higher_is_better: bool
    convention: str
    bootstrap: Callable[..., np.ndarray] | None = None
    selections: Mapping[str, float] = field(default_factory=dict)
    interval: str = ""
    bounds: tuple[float, float] = (-np.inf, np.inf)
    bias_corrected: bool = False

    def clip(self, low: float, high: float) -> tuple[float, float]:
        """An interval ``(low, high)`` cut to :attr:`bounds`."""
        lo, hi = self.bounds
        return float(np.clip(low, lo, hi)), float(np.clip(high, lo, hi))

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.unit not in UNITS:
            raise ValueError(f"metric {self.name!r}: unit must be one of {list(UNITS)}, got {self.unit!r}")
        if not self.convention.strip():
            raise ValueError(f"metric {self.name!r}: state its convention in one sentence")
        low, high = self.bounds
        if not low <= high:  # NaN fails too
            raise ValueError(f"metric {self.name!r}: bounds must be (low, high) with low <= high, got {self.bounds!r}")

    @property
    def on_scores(self) -> bool:
        """True for OOD metrics ``(scores_id, scores_ood)``; False for ``(probs, labels)``."""
        return self.kind == "ood"

    @property
    def scale(self) -> float:
        """Raw value x scale = the value in :attr:`unit`."""
        return UNITS[self.unit]

    def __call__(self, *args, **kwargs) -> float:
        """``fn`` on read-only views of the arrays given (:func:`~bench.metrics.inputs.read_only`)."""
        return self.fn(*map(read_only, args), **{k: read_only(v) for k, v in kwargs.items()})


#: The ``interval`` of a calibration error that says nothing more (:class:`Metric`).
APPROXIMATE_CALIBRATION = (
    "Interval approximate: a binned calibration error is biased upward, most near 0, which the "
    "bootstrap's bias correction removes only in part (measured for ECE in reports/perf/coverage.md)."
)


def metric(
    kind: str,
    label: str,
    unit: str,
    higher_is_better: bool,
    convention: str,
    *,
    bootstrap: Callable[..., np.ndarray] | None = None,
    selections: Mapping[str, float] | None = None,
    name: str | None = None,
    interval: str | None = None,
    bounds: tuple[float, float] | None = None,
    bias_corrected: bool = False,
) -> Callable[[_Metric], _Metric]:
    """Decorator: register the function as a :class:`Metric` (named after the function
    unless ``name`` is given) and return the function unchanged.  A plugin module adds a
    metric the same way; it then appears in ``list``, ``--metrics`` and every table of its
    kind.  ``bounds`` defaults to [0, 1] for a metric shown in % (a fraction) and to no
    bound otherwise; ``bias_corrected`` (default False) as in :class:`Metric`."""

    def deco(fn: _Metric) -> _Metric:
        key = name or fn.__name__
        note = interval if interval is not None else APPROXIMATE_CALIBRATION if kind == "calibration" else ""
        lo_hi = bounds if bounds is not None else (0.0, 1.0) if unit == "%" else (-np.inf, np.inf)
        METRICS.register(key)(Metric(key, fn, kind, label, unit, higher_is_better, convention,
                                     bootstrap, dict(selections or {}), note, (float(lo_hi[0]), float(lo_hi[1])),
                                     bias_corrected))
        return fn

    return deco


def get_metric(name: str) -> Metric:
    """The registered :class:`Metric` ``name`` (unknown names raise ``ConfigError``)."""
    return METRICS.get(name)


def selection(name: str, on_scores: bool | None = None) -> list[str]:
    """The metrics of a named selection in column order; ``on_scores`` keeps only OOD
    (True) or only labelled-split (False) metrics.  Unknown selections are empty."""
    members = [(m.selections[name], m.name) for m in map(METRICS.get, METRICS.names())
               if name in m.selections and (on_scores is None or m.on_scores == on_scores)]
    return [n for _, n in sorted(members)]


def registered(on_scores: bool | None = None) -> list[str]:
    """Every registered metric name, sorted (optionally only OOD / only labelled ones)."""
    return [n for n in METRICS.names() if on_scores is None or METRICS.get(n).on_scores == on_scores]
