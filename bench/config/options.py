"""Turn TOML tables into frozen dataclasses, checking every key, type and range up front.

Every config object in the suite (training budget, backbone, each method's and dataset's
options) is a frozen dataclass.  :func:`parse` builds one from a plain dict and collects
*all* problems with their key paths, so a user sees every mistake in one go.

Ranges are declared in field metadata: ``field(default=1, metadata={"min": 1})``,
``{"min": 0.0, "max": 1.0}``, ``{"exclusive_min": 0.0}`` or ``{"choices": ("a", "b")}``.
``{"soft_max": N}`` is a sanity limit against typos (``epochs = 1000000000000``, ``dim =
100000``) that :func:`allow_large` lifts on purpose, like every other limit on sizes (the
number of cells a run plans, the pixels of an image read from a folder).  Every float must
be finite.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import os
import types
import typing
from typing import Any, Iterator, Literal, TypeVar, Union

from bench.core.errors import ConfigError

T = TypeVar("T")
ALLOW_LARGE_ENV = "UQBENCH_ALLOW_LARGE"  # set (or --allow-large): every sanity limit on sizes is lifted
#: how a message about a sanity limit ends
ALLOW_LARGE_HINT = f"pass --allow-large (or set {ALLOW_LARGE_ENV}=1) to allow more on purpose"


def allow_large() -> bool:
    """Whether the sanity limits on sizes are lifted: ``UQBENCH_ALLOW_LARGE`` is set, which
    ``--allow-large`` does for its command (:func:`allowing_large`)."""
    return bool(os.environ.get(ALLOW_LARGE_ENV))


@contextlib.contextmanager
def allowing_large(on: bool) -> Iterator[None]:
    """``--allow-large``: set ``UQBENCH_ALLOW_LARGE`` while the block runs (worker processes
    started meanwhile inherit it), then restore what was there.  Without ``on``, nothing."""
    if not on:
        yield
        return
    before = os.environ.get(ALLOW_LARGE_ENV)
    os.environ[ALLOW_LARGE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ALLOW_LARGE_ENV, None)
        else:
            os.environ[ALLOW_LARGE_ENV] = before


class Problems(list):
    """A list of ``"key.path: message"`` strings, raised together as one ConfigError."""

    def add(self, path: str, msg: str) -> None:
        self.append(f"{path}: {msg}")

    def raise_if_any(self) -> None:
        if self:
            raise ConfigError("invalid configuration:\n  " + "\n  ".join(self))


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "nothing"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, path: str, problems: Problems) -> Any:
    """Check ``value`` against the annotation ``tp``; return it in canonical form."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            trial = Problems()
            out = _convert(value, arg, path, trial)
            if not trial:
                return out
        problems.add(path, f"expected {_type_name(tp)}, got {value!r}")
        return None
    if origin is Literal:
        if value not in typing.get_args(tp):
            problems.add(path, f"expected one of {', '.join(repr(a) for a in typing.get_args(tp))}, got {value!r}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            problems.add(path, f"expected a list, got {value!r}")
            return ()
        (inner,) = typing.get_args(tp)[:1]
        return tuple(_convert(v, inner, f"{path}[{i}]", problems) for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            problems.add(path, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.add(path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.add(path, f"expected a number, got {value!r}")
            return value
        try:
            out = float(value)
        except OverflowError:  # an integer beyond float range
            out = math.inf
        if not math.isfinite(out):
            problems.add(path, f"expected a finite number, got {value!r}")
        return out
    if tp is str:
        if not isinstance(value, str):
            problems.add(path, f"expected a string, got {value!r}")
        return value
    if tp is dict or typing.get_origin(tp) is dict:
        if not isinstance(value, dict):
            problems.add(path, f"expected a table, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            problems.add(path, f"expected a table, got {value!r}")
            return None
        return _parse(tp, value, path, problems)
    raise TypeError(f"unsupported option type {tp!r} at {path}")


def _check_range(value: Any, meta: typing.Mapping, path: str, problems: Problems) -> None:
    if value is None or isinstance(value, (tuple, list)):
        items = value or ()
    else:
        items = (value,)
    for v in items:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            if "choices" in meta and v not in meta["choices"]:
                problems.add(path, f"expected one of {', '.join(map(repr, meta['choices']))}, got {v!r}")
            continue
        if "min" in meta and v < meta["min"]:
            problems.add(path, f"must be >= {meta['min']}, got {v!r}")
        if "max" in meta and v > meta["max"]:
            problems.add(path, f"must be <= {meta['max']}, got {v!r}")
        if "soft_max" in meta and v > meta["soft_max"] and not allow_large():
            problems.add(path, f"must be <= {meta['soft_max']}, got {v!r} (a sanity limit against typos; "
                               f"{ALLOW_LARGE_HINT})")
        if "exclusive_min" in meta and v <= meta["exclusive_min"]:
            problems.add(path, f"must be > {meta['exclusive_min']}, got {v!r}")


def _parse(cls: type[T], data: dict, path: str, problems: Problems) -> T | None:
    start = len(problems)  # problems found elsewhere must not stop this section's checks
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        sub = f"{path}.{key}" if path else key
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            known = ", ".join(fields) or "none"
            problems.add(sub, f"unknown key{hint}; known keys: {known}")
            continue
        before = len(problems)
        converted = _convert(value, hints[key], sub, problems)
        if len(problems) == before:
            _check_range(converted, fields[key].metadata, sub, problems)
        kwargs[key] = converted
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            problems.add(f"{path}.{name}" if path else name, "required key is missing")
    if len(problems) > start:
        return None
    try:
        return cls(**kwargs)
    except (ValueError, ConfigError) as exc:  # cross-field checks in __post_init__
        problems.add(path or cls.__name__, str(exc))
        return None


def parse(cls: type[T], data: dict | None, path: str = "", problems: Problems | None = None) -> T | None:
    """Build ``cls`` from ``data``.  With ``problems`` given, errors are appended there (and
    ``None`` returned); without it, they are raised at once as a :class:`ConfigError`."""
    own = problems is None
    problems = Problems() if own else problems
    before = len(problems)
    out = _parse(cls, dict(data or {}), path, problems)
    if own:
        problems.raise_if_any()
    return out if len(problems) == before else None


def to_dict(obj: Any) -> Any:
    """A dataclass (possibly nested) as plain JSON-able data, tuples as lists."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
