"""The typed records of what a cell stores, each declared once: :class:`Predictions` (one
split's ``preds/<split>.npz``), :class:`TrainingFeatures` (``features/train.npz``) and
:class:`CellRecord` (``cell.json``, with :class:`Stage1Record`).

Every stored array is a field whose metadata (:class:`ArraySpec`) gives its dtypes and
shape; the checks a verified cell passes (:func:`arrays_problem`,
:func:`training_features_problem`), the dtypes written and what each OOD score may need
(:func:`needs`) are read from there.  Only the store package (this module and the
files it reads and writes, :mod:`bench.store`) spells a stored array name or a
``cell.json`` key: every other module reads and writes fields, and names a prediction
array through :data:`ARRAYS` (an OOD score's ``reads``), so a misspelt name is an
AttributeError or a TypeError, never a silent NaN.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Mapping

import numpy as np

STORE_SCHEMA = 3  # 2: decomposition terms stored for multi-pass methods; 3: logits, features, training features
NORMALISED_ATOL = 1e-3  # how far a row's sum of exp(log_probs) may be from 1 (float32 round-off)


@dataclass(frozen=True)
class ArraySpec:
    """What one stored array is: ``dtypes`` (the first is what is written; the others are
    read too), ``shape`` in symbols (``N`` images, ``C`` classes, ``D`` feature width,
    ``()`` a scalar) and, for a prediction array, the ``need`` of an OOD score it serves
    (:func:`needs`)."""

    dtypes: tuple[type, ...]
    shape: tuple[str, ...]
    need: str | None = None

    def describe(self, dims: Mapping[str, int] | None = None) -> str:
        """``float32 [N, C]``; with ``dims``, the sizes fixed so far in place of their symbols."""
        shape = [str(dims[s]) if dims and s in dims else s for s in self.shape]
        return f"{'/'.join(np.dtype(t).name for t in self.dtypes)} [{', '.join(shape)}]"


def _array(dtypes: tuple[type, ...], shape: tuple[str, ...], need: str | None = None, optional: bool = True):
    spec = {"array": ArraySpec(dtypes, shape, need)}
    return field(default=None, metadata=spec) if optional else field(metadata=spec)


def _specs(cls) -> dict[str, ArraySpec]:
    return {f.name: f.metadata["array"] for f in fields(cls)}


def _stored(record):
    """``record`` (a :class:`Predictions` or :class:`TrainingFeatures`) with each array in
    the dtype the store writes (its field's first dtype)."""
    specs = _specs(type(record))
    return type(record)(**{k: np.asarray(a, dtype=specs[k].dtypes[0]) for k, a in record.arrays().items()})


def _described(name: str, a: np.ndarray, spec: ArraySpec, dims: dict[str, int]) -> str:
    return f"{name} is {a.dtype}{list(a.shape)}, not {spec.describe(dims)}"


def _array_problem(name: str, a: np.ndarray, spec: ArraySpec, dims: dict[str, int]) -> str | None:
    """Why ``a`` is not the array ``spec`` declares, given the sizes ``dims`` fixed so far
    (``N``, ``C``, ...: a symbol not yet fixed is fixed by ``a``; every size but ``N`` is at
    least 1), or None."""
    known = dict(dims)
    if a.dtype not in spec.dtypes or a.ndim != len(spec.shape):
        return _described(name, a, spec, known)
    for symbol, size in zip(spec.shape, a.shape):
        if dims.setdefault(symbol, size) != size or (size < 1 and symbol != "N"):
            return _described(name, a, spec, known)
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        return f"{name} holds non-finite values"
    return None


@dataclass(frozen=True)
class Predictions:
    """One split's stored predictions (``preds/<split>.npz``).

    ``log_probs`` float32 [N, C] (log predictive probabilities, C >= 2, each row
    normalised) and ``labels`` int64 [N] (``-1`` on OOD splits); on the splits OOD scores
    read, ``logits`` float32 [N, C] (the mean logit over the method's passes) and, where
    the suite stores features, ``features`` float16 [N, D] (the pooled token the
    classifier head reads, averaged over the passes); for methods with several passes or
    members the per-image terms ``entropy_of_mean`` = H[mean_s p_s], ``mean_entropy`` =
    mean_s H[p_s] (nats) and ``prob_variance`` = sum_c Var_s[p_s,c] (float32 [N]).
    Absent arrays are None."""

    log_probs: np.ndarray = _array((np.float32,), ("N", "C"), "probabilities", optional=False)
    labels: np.ndarray = _array((np.int64,), ("N",), optional=False)
    logits: np.ndarray | None = _array((np.float32,), ("N", "C"), "logits")
    features: np.ndarray | None = _array((np.float16, np.float32), ("N", "D"), "features")
    entropy_of_mean: np.ndarray | None = _array((np.float32,), ("N",), "samples")
    mean_entropy: np.ndarray | None = _array((np.float32,), ("N",), "samples")
    prob_variance: np.ndarray | None = _array((np.float32,), ("N",), "samples")

    def arrays(self) -> dict[str, np.ndarray]:
        """The stored arrays by name (absent ones left out)."""
        return {f.name: a for f in fields(self) if (a := getattr(self, f.name)) is not None}

    def stored(self) -> "Predictions":
        """The arrays as the store writes them (each field's first dtype)."""
        return _stored(self)

    def has(self, name: str) -> bool:
        """Whether the array ``name`` is stored (a name the record does not declare: ValueError)."""
        if name not in _specs(Predictions):
            raise ValueError(f"no stored prediction array is called {name!r}; known: {', '.join(_specs(Predictions))}")
        return getattr(self, name) is not None

    def replace(self, **arrays: np.ndarray | None) -> "Predictions":
        return dataclasses.replace(self, **arrays)

    def head(self, n: int) -> "Predictions":
        """The first ``n`` images' log-probabilities and labels."""
        return Predictions(self.log_probs[:n], self.labels[:n])

    def map(self, fn) -> "Predictions":
        """Every stored array passed through ``fn`` (e.g. a read-only view)."""
        return dataclasses.replace(self, **{k: fn(a) for k, a in self.arrays().items()})

    def __len__(self) -> int:
        return len(self.labels)

    @classmethod
    def concat(cls, parts: list["Predictions"], join) -> "Predictions":
        """The predictions of consecutive batches as one: ``join(arrays)`` of each field,
        for the fields every part holds."""
        names = [f.name for f in fields(cls) if all(getattr(p, f.name) is not None for p in parts)]
        return cls(**{k: join([getattr(p, k) for p in parts]) for k in names})

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "Predictions":
        """From the arrays of a prediction file; ValueError naming what is missing or unknown."""
        return cls(**_named(cls, arrays, "a prediction file"))


#: The names of the :class:`Predictions` arrays as attributes, taken from its fields
#: (``ARRAYS.logits == "logits"``; a name it lacks is an AttributeError): how a module
#: outside the store names a stored array, e.g. in an OOD score's ``reads``.
ARRAYS = make_dataclass("PredictionArrays", [(f.name, str, f.name) for f in fields(Predictions)], frozen=True)()


def _named(cls, arrays: Mapping[str, Any], what: str) -> dict[str, Any]:
    specs = _specs(cls)
    if unknown := sorted(set(arrays) - set(specs)):
        raise ValueError(f"{what} holds {', '.join(unknown)}, which the store does not write (it writes "
                         f"{', '.join(specs)})")
    required = [f.name for f in fields(cls) if f.default is dataclasses.MISSING]
    if missing := [k for k in required if k not in arrays]:
        raise ValueError(f"it lacks {', '.join(missing)} (has {', '.join(sorted(arrays)) or 'nothing'})")
    return dict(arrays)


def arrays_problem(arrays: Mapping[str, np.ndarray], shape: tuple[int, int] | None = None) -> str | None:
    """Why a split's arrays are not a :class:`Predictions` as the store writes it, or None:
    each array of the dtype and shape its field declares, floats finite, ``log_probs``
    with C >= 2 and each row's probabilities summing to 1, ``labels`` in [-1, C); and,
    when ``shape`` is given (the manifest's record), [N, C] equal to it."""
    try:
        _named(Predictions, arrays, "it")
    except ValueError as exc:
        return str(exc)
    lp, labels = arrays["log_probs"], arrays["labels"]
    specs = _specs(Predictions)
    if lp.dtype != np.float32 or lp.ndim != 2 or lp.shape[1] < 2:
        return f"log_probs is {lp.dtype}{list(lp.shape)}, not {specs['log_probs'].describe()} with C >= 2"
    n, c = lp.shape
    if shape is not None and (n, c) != tuple(shape):
        return f"log_probs is [{n}, {c}] but the manifest records [{shape[0]}, {shape[1]}] for it"
    dims = {"N": n, "C": c}
    for name, spec in specs.items():
        if name in arrays and (why := _array_problem(name, arrays[name], spec, dims)) is not None:
            return why
    sums = np.exp(lp).sum(axis=1, dtype=np.float64)
    if n and np.abs(sums - 1.0).max() > NORMALISED_ATOL:
        return f"its probabilities are not normalised (a row sums to {sums[np.abs(sums - 1.0).argmax()]:.6g}, not 1)"
    if n and (labels.min() < -1 or labels.max() >= c):
        return f"labels holds values outside [-1, {c}) (from {labels.min()} to {labels.max()})"
    return None


def needs() -> dict[str, tuple[str, ...]]:
    """What an OOD score may need (``probabilities``, ``logits``, ``samples``,
    ``features``) and the prediction arrays that provide it, from the fields' declarations."""
    out: dict[str, tuple[str, ...]] = {}
    for name, spec in _specs(Predictions).items():
        if spec.need is not None:
            out[spec.need] = (*out.get(spec.need, ()), name)
    return out


@dataclass(frozen=True)
class TrainingFeatures:
    """A cell's training features (``features/train.npz``): ``features`` float16 [n, D]
    of a fixed subset of the training images (predicted like a test split), their
    ``labels`` int64 [n], the classifier head ``head_weight`` float32 [C, D] and
    ``head_bias`` float32 [C] (logits = features @ head_weight.T + head_bias), and
    ``train_size``, how many training images the subset was drawn from (an int64 scalar
    on disk)."""

    features: np.ndarray = _array((np.float16, np.float32), ("n", "D"), optional=False)
    labels: np.ndarray = _array((np.int64,), ("n",), optional=False)
    head_weight: np.ndarray = _array((np.float32,), ("C", "D"), optional=False)
    head_bias: np.ndarray = _array((np.float32,), ("C",), optional=False)
    train_size: Any = _array((np.int64,), (), optional=False)

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def stored(self) -> "TrainingFeatures":
        """The arrays as the store writes them (each field's first dtype)."""
        return _stored(self)

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "TrainingFeatures":
        return cls(**_named(cls, arrays, "a training-features file"))


def training_features_problem(arrays: Mapping[str, np.ndarray]) -> str | None:
    """Why arrays are not a :class:`TrainingFeatures` as the store writes it, or None:
    each array of the dtype and shape its field declares (n, D >= 1), finite, and the
    labels in [0, C)."""
    try:
        _named(TrainingFeatures, arrays, "it")
    except ValueError as exc:
        return str(exc)
    dims: dict[str, int] = {}
    for name, spec in _specs(TrainingFeatures).items():
        if (why := _array_problem(name, np.asarray(arrays[name]), spec, dims)) is not None:
            return why
    y, c = arrays["labels"], dims["C"]
    if y.min() < 0 or y.max() >= c:
        return f"labels holds values outside [0, {c})"
    return None


# --- cell.json ------------------------------------------------------------------------------
_FLOAT = "float"  # an int or float in JSON (not a bool); NaN allowed


def _key(kind: Any, required: bool = False):
    """A ``cell.json`` key: a dataclass field declaring the JSON ``kind`` of its value
    (``str``, ``int``, ``bool``, ``dict`` or :data:`_FLOAT`), which :func:`_checked`
    reads; a ``required`` key has no default."""
    metadata = {"json": kind, "required": required}
    return field(metadata=metadata) if required else field(default=None, metadata=metadata)


def _value_problem(name: str, value: Any, kind: Any) -> str | None:
    if kind == _FLOAT:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    return None if ok else f"{name} is {value!r}, not {'a number' if kind == _FLOAT else kind.__name__}"


@dataclass(frozen=True)
class Stage1Record:
    """A two-stage cell's stage 1 (``stage1`` in ``cell.json``): its method and cell
    key, whether the stored cell was ``reused`` (else trained in this cell), and its
    training seconds, best epoch and best validation accuracy (None where the stored
    cell recorded none)."""

    method: str = _key(str, required=True)
    key: str = _key(str, required=True)
    reused: bool = _key(bool, required=True)
    train_seconds: float | None = _key(_FLOAT)
    best_epoch: int | None = _key(int)
    best_val_acc: float | None = _key(_FLOAT)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # every key, null included

    @classmethod
    def from_json(cls, obj: Any) -> "Stage1Record":
        return cls(**_checked(cls, obj, "stage1"))


def _checked(cls, obj: Any, where: str) -> dict:
    """``obj``'s keys and values checked against the JSON kinds ``cls``'s fields declare
    (:func:`_key`); ValueError naming the first unknown or missing key or wrong value (null
    is an absent value)."""
    kinds = {f.name: f.metadata["json"] for f in fields(cls)}
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is {type(obj).__name__}, not an object")
    if unknown := sorted(set(obj) - set(kinds)):
        raise ValueError(f"{where} holds unknown key(s) {', '.join(unknown)} (known: {', '.join(kinds)})")
    if missing := [f.name for f in fields(cls) if f.metadata["required"] and obj.get(f.name) is None]:
        raise ValueError(f"{where} lacks {', '.join(missing)}")
    for k, v in obj.items():
        if v is not None and (why := _value_problem(k, v, kinds[k])) is not None:
            raise ValueError(f"{where}: {why}")
    return dict(obj)


@dataclass(frozen=True)
class CellRecord:
    """A cell's ``cell.json``: who it is (``key``, ``dataset``, ``method``, ``seed``, the
    resolved ``config``), its ``status`` (``running``/``complete``/``failed``, with the
    failure ``reason``), where and with what it ran (``device``, ``versions``, ``started``,
    ``finished``), the method's ``samples`` and ``average``, and once complete its costs
    and results: ``train_seconds``, ``predict_seconds``, ``predict_seconds_per_1000``,
    ``parameters``, ``best_epoch``, ``compile``, ``best_val_acc``, ``test_acc``,
    ``peak_memory_mb`` and ``ood_detectors`` (score -> ``fit_seconds``,
    ``score_seconds_per_1000``); ``resumed_from_epoch``, ``stage1``
    (:class:`Stage1Record`) and ``no_features`` (why no features were stored) where
    they apply.  None = not recorded (left out of the file).  The store's schema version
    (:data:`STORE_SCHEMA`) is in ``config`` and the manifest."""

    key: str | None = _key(str)
    dataset: str | None = _key(str)
    method: str | None = _key(str)
    seed: int | None = _key(int)
    config: dict | None = _key(dict)
    status: str | None = _key(str)
    reason: str | None = _key(str)
    device: str | None = _key(str)
    versions: dict | None = _key(dict)
    started: str | None = _key(str)
    finished: str | None = _key(str)
    samples: int | None = _key(int)
    average: str | None = _key(str)
    resumed_from_epoch: int | None = _key(int)
    stage1: Stage1Record | None = _key(dict)
    no_features: str | None = _key(str)
    train_seconds: float | None = _key(_FLOAT)
    predict_seconds: float | None = _key(_FLOAT)
    predict_seconds_per_1000: float | None = _key(_FLOAT)
    parameters: int | None = _key(int)
    best_epoch: int | None = _key(int)
    compile: str | None = _key(str)
    best_val_acc: float | None = _key(_FLOAT)
    test_acc: float | None = _key(_FLOAT)
    peak_memory_mb: float | None = _key(_FLOAT)
    ood_detectors: dict[str, dict[str, float]] | None = _key(dict)

    def replace(self, **changes: Any) -> "CellRecord":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        """The ``cell.json`` object: every recorded field (None ones left out)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        if self.stage1 is not None:
            out["stage1"] = self.stage1.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "CellRecord":
        """From a ``cell.json`` object; ValueError naming an unknown key or a wrong value."""
        values = _checked(cls, obj, "cell.json")
        if values.get("stage1") is not None:
            values["stage1"] = Stage1Record.from_json(values["stage1"])
        return cls(**values)

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def seconds(self) -> float:
        """What the cell cost to run, training and prediction (0 where unrecorded)."""
        return float(self.train_seconds or 0.0) + float(self.predict_seconds or 0.0)
