"""One small generic registry, used for methods, datasets, attention layers, metrics, OOD
scores and executors, and the loading of the modules that fill them (:func:`import_plugins`).

``bench`` never names a concrete method or dataset: modules in ``methods/`` and
``datasets/`` register themselves with a decorator and the core looks them up by name.
Each registry knows the names of the modules whose import registers its built-in
entries and imports them (through importlib, as a plugin is imported) before its first
lookup, so it is complete whichever module a caller imported first: after ``import
methods`` alone, ``ATTENTIONS.get("softmax")`` finds the ViT's own attention layer.
"""
from __future__ import annotations

import difflib
import importlib
import os
import sys
from typing import Callable, Generic, Iterable, Iterator, TypeVar

from bench.core.errors import ConfigError, one_line

T = TypeVar("T")


class DuplicateName(ValueError):
    """A name registered twice (e.g. a plugin reusing a built-in method's name)."""


def _module_of(obj: object) -> str:
    """The module that defined a registered object (a metric's function, a class, ...)."""
    return str(getattr(getattr(obj, "fn", obj), "__module__", "?"))


def closest(name: str, known, aliases: dict[str, str] | None = None) -> str | None:
    """The name of ``known`` a user most likely meant by ``name``: the one an alias of
    which ``name`` is (``aliases``: alias -> name, e.g. a metric's label; any case), else
    the only one ``name`` begins (``acc``: ``accuracy``), else the closest by
    :func:`difflib.get_close_matches`; None when none is close."""
    known = sorted(known)
    lowered = str(name).lower()
    for alias, target in (aliases or {}).items():
        if alias.lower() == lowered and target in known:
            return target
    starting = [k for k in known if k.lower().startswith(lowered)]
    if len(starting) == 1 and lowered:
        return starting[0]
    close = difflib.get_close_matches(str(name), known, n=1)
    return close[0] if close else None


def did_you_mean(name: str, known, aliases: dict[str, str] | None = None) -> str:
    """`` (did you mean 'x'?)`` for :func:`closest`, or "" when no known name is close."""
    match = closest(name, known, aliases)
    return f" (did you mean {match!r}?)" if match is not None else ""


class Registry(Generic[T]):
    """A name -> object map with decorator registration and helpful lookup errors.

    ``builtins``: the modules (by name) whose import registers the built-in entries.  They
    are imported before the first lookup, and before the first registration from any
    other module, so a plugin that reuses a built-in name is told so at once."""

    def __init__(self, kind: str, builtins: tuple[str, ...] = (), scope: str = "") -> None:
        self.kind = kind
        self.builtins = builtins
        self.scope = scope  # whose names these are, in the message of an unknown one: "run 'x'"
        self._items: dict[str, T] = {}
        self._complete = not builtins

    @classmethod
    def of(cls, kind: str, names: Iterable[str], scope: str = "") -> "Registry[None]":
        """A registry of just ``names`` (a suite's or a run's datasets or methods, given by
        ``--datasets``/``--methods``), so that a name it lacks is checked and told as every
        other registry name is (:meth:`validate`); ``scope`` says whose names they are."""
        names_only: Registry = cls(kind, scope=scope)
        names_only._items = dict.fromkeys(names)
        return names_only

    def complete(self) -> None:
        """Import the built-in modules, once.  A lookup made while they are being imported
        (the first one started it) sees the entries registered so far."""
        if self._complete:
            return
        self._complete = True
        try:
            for name in self.builtins:
                importlib.import_module(name)
        except BaseException:
            self._complete = False
            raise

    def _builtin(self, module: str) -> bool:
        return any(module == b or module.startswith(f"{b}.") for b in self.builtins)

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@METHODS.register("msp")`` registers the decorated object."""

        def deco(obj: T) -> T:
            if not self._builtin(_module_of(obj)):
                self.complete()
            if name in self._items and self._items[name] is not obj:
                raise DuplicateName(
                    f"{self.kind} {name!r} is already registered by module {_module_of(self._items[name])!r}; "
                    f"the new one comes from {_module_of(obj)!r}: choose another name"
                )
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str, *, key: str | None = None) -> T:
        """Look a name up; unknown names raise :class:`ConfigError` listing the known ones.

        ``key`` is the config path the name came from, quoted in the message.
        """
        self.complete()
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(self.unknown_message(name, key)) from None

    def validate(self, names: str | Iterable[str], key: str | None = None, *, aliases: dict[str, str] | None = None,
                 problems=None) -> list[str]:
        """The one check of a registry name a user gave (a suite file's methods, datasets,
        attention layers and OOD scores; ``--scores``, ``--metrics``): ``names`` (one name or
        several) returned as a list, repeats dropped, order kept.  An unknown name is
        :meth:`unknown_message` (the closest known name, also through ``aliases``: alias ->
        name, e.g. a metric's label; and every known name): raised as a ConfigError naming
        ``key``, the flag or key path the names came from, or, given ``problems`` (a suite
        file's :class:`bench.config.options.Problems`), added there at ``key`` for each unknown name
        and left out of what is returned, so that a suite's problems are reported together."""
        self.complete()
        out: list[str] = []
        for name in [names] if isinstance(names, str) else names:
            if isinstance(name, str) and name in self._items:
                if name not in out:
                    out.append(name)
            elif problems is None:
                raise ConfigError(self.unknown_message(name, key, aliases))
            else:
                problems.add(key, self.unknown_message(name, aliases=aliases))
        return out

    def unknown_message(self, name: str, key: str | None = None, aliases: dict[str, str] | None = None) -> str:
        """``unknown <kind> 'name' (at key). Did you mean 'x'? Known <kind>s[ of scope]: ...``:
        the one message of an unknown name (:func:`closest` finds ``x``)."""
        where = f" (at {key})" if key else ""
        known = ", ".join(self.names()) or "none registered"
        match = closest(str(name), self.names(), aliases)
        hint = f" Did you mean {match!r}?" if match is not None else ""
        scope = f" of {self.scope}" if self.scope else ""
        return f"unknown {self.kind} {name!r}{where}.{hint} Known {self.kind}s{scope}: {known}."

    def names(self) -> list[str]:
        self.complete()
        return sorted(self._items)

    def names_from(self, module: str) -> list[str]:
        """The names registered by ``module`` or a module inside it (a plugin's entries)."""
        return [name for name in self.names()
                if _module_of(self._items[name]) == module or _module_of(self._items[name]).startswith(f"{module}.")]

    def __contains__(self, name: object) -> bool:
        self.complete()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self.complete()
        return len(self._items)


METHODS: Registry = Registry("method", builtins=("methods",))
DATASETS: Registry = Registry("dataset", builtins=("datasets",))
# attention layers: the ViT's own (softmax), and each other one with the method that introduces it
ATTENTIONS: Registry = Registry("attention", builtins=("bench.train.vit", "methods"))
METRICS: Registry = Registry("metric", builtins=("bench.metrics",))
# post-hoc OOD scores (bench.scores): what OOD metrics rank the in-distribution and OOD images by
SCORES: Registry = Registry("OOD score", builtins=("bench.scores",))
# where a run's cells run (bench.run.executors.Executor): local, processes, slurm, submitit-local
EXECUTORS: Registry = Registry("executor", builtins=("bench.run.executors",))


def import_plugins(names: list[str]) -> None:
    """Fill every registry: the built-in modules, then each plugin module of ``names``
    (``--plugin``; the current directory is on the module path).  The CLI, a pool worker
    and a SLURM job all start here.  A plugin that cannot be imported, raises or reuses a
    registered name is a one-line ConfigError naming it."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for registry in (ATTENTIONS, METRICS, SCORES, METHODS, DATASETS, EXECUTORS):
        registry.complete()
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                raise ConfigError(
                    f"--plugin {name}: no such module ({exc}); give an importable module name "
                    "(a .py file or package in the current directory or on PYTHONPATH)"
                ) from None
            raise ConfigError(f"--plugin {name}: importing it failed: {type(exc).__name__}: {exc}") from None
        except SyntaxError as exc:
            raise ConfigError(f"--plugin {name}: syntax error in {exc.filename}, line {exc.lineno}: {exc.msg}") from None
        except DuplicateName as exc:
            raise ConfigError(f"--plugin {name}: {exc}") from None
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001  (a plugin's own error, in one line)
            what = f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit) else f"raised {one_line(exc)}"
            raise ConfigError(f"--plugin {name}: importing it {what}; a plugin module should only define and "
                              "register (methods, datasets, attention layers, metrics, OOD scores)") from None
