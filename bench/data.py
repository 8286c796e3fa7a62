"""The data interface every dataset family in ``datasets/`` implements.

A registered dataset is a class with a frozen ``Options`` dataclass (its TOML options)
and a static ``load(options) -> DataBundle``.  A bundle names its splits:

* ``train``, ``val``, ``test``: in-distribution;
* ``shift/<name>`` (and later ``shift/<corruption>/<severity>``): covariate shift, same labels;
* ``ood/<name>``: out-of-distribution; labels are ``-1``.

Images are uint8 arrays ``[N, H, W]`` (grayscale) or ``[N, H, W, C]``; labels int64 ``[N]``.
Splits are loaded lazily (a CIFAR-C grid does not fit in memory at once) and cached.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from bench.errors import ConfigError

OOD_LABEL = -1


@dataclass(frozen=True)
class Split:
    """One evaluation or training split: images ``x`` (uint8) and labels ``y`` (int64)."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if self.x.dtype != np.uint8:
            raise TypeError(f"split images must be uint8, got {self.x.dtype}")
        if self.x.ndim not in (3, 4):
            raise ValueError(f"split images must be [N,H,W] or [N,H,W,C], got shape {self.x.shape}")
        if self.y.shape != (len(self.x),):
            raise ValueError(f"labels shape {self.y.shape} does not match {len(self.x)} images")

    def __len__(self) -> int:
        return len(self.x)


@dataclass
class DataBundle:
    """A dataset's splits plus what a model needs to know about its inputs."""

    name: str
    num_classes: int
    image_shape: tuple[int, int, int]  # (H, W, C); C = 1 for grayscale
    mean: tuple[float, ...]  # per channel, on the [0, 1] pixel scale
    std: tuple[float, ...]
    loaders: dict[str, Callable[[], Split]]
    _cache: dict[str, Split] = field(default_factory=dict, repr=False)

    def split_names(self) -> list[str]:
        return list(self.loaders)

    def get(self, name: str) -> Split:
        if name not in self.loaders:
            raise ConfigError(
                f"dataset {self.name!r} has no split {name!r}; it has: {', '.join(self.loaders)}"
            )
        if name not in self._cache:
            self._cache[name] = self.loaders[name]()
        return self._cache[name]

    def eval_splits(self, patterns: tuple[str, ...]) -> list[str]:
        """Evaluation splits matching any glob pattern (``val`` is always evaluated first:
        post-hoc methods such as temperature scaling fit on it)."""
        names = [n for n in self.loaders if n != "train" and any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        return ["val"] + [n for n in names if n != "val"]


def is_ood(split: str) -> bool:
    return split.startswith("ood/")


def is_shift(split: str) -> bool:
    return split.startswith("shift/")
