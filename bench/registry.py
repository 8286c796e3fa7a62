"""One small generic registry, used for methods, datasets, attention layers and metrics.

``bench`` never names a concrete method or dataset: modules in ``methods/`` and
``datasets/`` register themselves with a decorator and the core looks them up by name.
"""
from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

from bench.errors import ConfigError

T = TypeVar("T")


class DuplicateName(ValueError):
    """A name registered twice (e.g. a plugin reusing a built-in method's name)."""


def _module_of(obj: object) -> str:
    """The module that defined a registered object (a metric's function, a class, ...)."""
    return str(getattr(getattr(obj, "fn", obj), "__module__", "?"))


class Registry(Generic[T]):
    """A name -> object map with decorator registration and helpful lookup errors."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@METHODS.register("msp")`` registers the decorated object."""

        def deco(obj: T) -> T:
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
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(self.unknown_message(name, key)) from None

    def unknown_message(self, name: str, key: str | None = None) -> str:
        where = f" (at {key})" if key else ""
        known = ", ".join(self.names()) or "none registered"
        close = difflib.get_close_matches(str(name), self.names(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {name!r}{where}.{hint} Known {self.kind}s: {known}."

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)


METHODS: Registry = Registry("method")
DATASETS: Registry = Registry("dataset")
ATTENTIONS: Registry = Registry("attention")
METRICS: Registry = Registry("metric")
