"""The data interface every dataset family in ``datasets/`` implements.

A registered dataset is a class with a frozen ``Options`` dataclass (its TOML options)
and a static ``load(options) -> DataBundle``; it may set ``headline_metrics = {"accuracy":
"mcc"}`` to have the report show a metric in another's column for it (CoLA's MCC),
``report_note`` (text) for what the report must say about its protocol, and
``ood_groups = {"near": (names...), "far": (names...)}`` to have the report average its
OOD sets ``ood/<name>`` by group (OpenOOD v1.5's near and far OOD).  A bundle names its splits:

* ``train``, ``val``, ``test``: in-distribution;
* ``shift/<name>``, among them ``shift/<corruption>/<severity>`` (:func:`corruption_split`):
  covariate shift, same labels; a corruption split holds the first N images of ``test``
  (N = its size), corrupted, so the analysis compares it with those N images clean;
* ``ood/<name>``: out-of-distribution; labels are ``-1``.

Images are uint8 arrays ``[N, H, W]`` (grayscale) or ``[N, H, W, C]`` (:class:`Split`);
texts are token ids int64 ``[N, max_len]``, ``<pad>`` = 0 after the text
(:class:`TokenSplit`, with the bundle's ``tokenizer``); labels int64 ``[N]``.
Splits are loaded lazily (a CIFAR-C grid does not fit in memory at once) and cached.
"""
from __future__ import annotations

import fnmatch
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from bench.core.errors import ConfigError
from bench.data.text import PAD_ID, WordTokenizer

OOD_LABEL = -1

#: The corruption types of ``shift/<corruption>/<severity>`` splits, defined once for the
#: engine, the official CIFAR-C readers, the planner and the report: CIFAR-10-C's 15
#: (Hendrycks & Dietterich, 2019) in their canonical order, then its 4 extras.
CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise",
    "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness", "contrast",
    "elastic_transform", "pixelate", "jpeg_compression",
    "speckle_noise", "gaussian_blur", "spatter", "saturate",
)
BENCHMARK_CORRUPTIONS: tuple[str, ...] = CORRUPTIONS[:15]  # the 15 of CIFAR-10-C
SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)


def check_severity(severity, what: str = "severity", error: type[Exception] = ValueError) -> int:
    """``severity`` as an int when it is one of :data:`SEVERITIES` (an int or numpy integer,
    not a bool, float or string), else ``error`` naming ``what`` and the allowed values:
    the one severity check of the corruption engines, the data readers and the report."""
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or severity not in SEVERITIES:
        raise error(f"{what} must be one of {', '.join(map(str, SEVERITIES))}, got {severity!r}")
    return int(severity)


def corruption_rng(name: str, severity: int, seed: int) -> np.random.Generator:
    """The one generator a call of a generated corruption (image or text) draws from:
    seeded by ``(seed, crc32(name), severity)``, never the global RNG, so a call is a pure
    function of its arguments and two corruptions or severities draw independent streams.
    ``seed`` must be a non-negative integer (ValueError)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng([int(seed), zlib.crc32(name.encode()), int(severity)])


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


@dataclass(frozen=True)
class TokenSplit:
    """A text split: token ids ``x`` (int64 ``[N, max_len]``, ``<pad>`` = 0 after each text)
    and labels ``y`` (int64)."""

    x: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        if self.x.dtype != np.int64 or self.x.ndim != 2:
            raise TypeError(f"token ids must be int64 [N, max_len], got {self.x.dtype} {self.x.shape}")
        if self.y.shape != (len(self.x),):
            raise ValueError(f"labels shape {self.y.shape} does not match {len(self.x)} texts")

    def __len__(self) -> int:
        return len(self.x)

    @property
    def mask(self) -> np.ndarray:
        """``[N, max_len]`` bool, True at real tokens (position 0 always: an empty text is
        one ``<pad>`` token), as the text backbone masks them."""
        mask = self.x != PAD_ID
        mask[:, 0] = True
        return mask


@dataclass
class DataBundle:
    """A dataset's splits plus what a model needs to know about its inputs: the image
    shape and pixel statistics (images), or the tokenizer (texts; ``image_shape`` None)."""

    name: str
    num_classes: int
    image_shape: tuple[int, int, int] | None  # (H, W, C); C = 1 for grayscale; None for texts
    mean: tuple[float, ...]  # per channel, on the [0, 1] pixel scale (images)
    std: tuple[float, ...]
    loaders: dict[str, Callable[[], Split | TokenSplit]]
    tokenizer: WordTokenizer | None = None  # texts: the vocabulary and length of every split
    _cache: dict[str, Split | TokenSplit] = field(default_factory=dict, repr=False)

    def split_names(self) -> list[str]:
        return list(self.loaders)

    def get(self, name: str) -> Split | TokenSplit:
        if name not in self.loaders:
            raise ConfigError(f"dataset {self.name!r} has no split {name!r}; it has: {split_summary(self.loaders)}")
        if name not in self._cache:
            self._cache[name] = self.loaders[name]()
        return self._cache[name]

    def release(self, name: str) -> None:
        """Drop a loaded split from memory (a CIFAR-C grid does not fit at once)."""
        self._cache.pop(name, None)

    def eval_splits(self, patterns: tuple[str, ...]) -> list[str]:
        """Evaluation splits matching any glob pattern (``val`` is always evaluated first:
        post-hoc methods such as temperature scaling fit on it)."""
        names = [n for n in self.loaders if n != "train" and any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        return ["val"] + [n for n in names if n != "val"]


def uniform_noise_split(
    n: int, image_shape: tuple[int, ...], rng: np.random.Generator, limit: int | None = None
) -> Split:
    """The generated OOD set ``ood/uniform_noise``: ``n`` images of i.i.d. uniform uint8
    pixels of ``image_shape`` (``(H, W)`` grayscale or ``(H, W, C)``), labelled OOD; with
    ``limit``, the first ``limit`` of those same images."""
    x = rng.integers(0, 256, size=(n, *image_shape), dtype=np.uint8)[:limit]
    return Split(x, np.full(len(x), OOD_LABEL, dtype=np.int64))


OOD_PREFIX = "ood/"
SHIFT_PREFIX = "shift/"


def is_ood(split: str) -> bool:
    """An ``ood/<name>`` split: out-of-distribution, labels ``-1``."""
    return split.startswith(OOD_PREFIX)


def is_shift(split: str) -> bool:
    """A ``shift/...`` split: covariate shift, same labels (a corruption split or another)."""
    return split.startswith(SHIFT_PREFIX)


def corruption_split(corruption: str, severity: int) -> str:
    """The name ``shift/<corruption>/<severity>`` of a corruption split (:func:`corruption_of` reads it)."""
    return f"{SHIFT_PREFIX}{corruption}/{severity}"


def split_summary(names) -> str:
    """Split names for a message, in their order but with the corruption splits that share
    their severities in one item: ``shift/<19 corruptions>/<1-5>``, those corruptions named
    once at the end (``shift/fog/<1-5>`` for a single one)."""
    severities: dict[str, list[int]] = {}  # corruption -> its severities, in order
    items: list[str | tuple[str]] = []  # a split name, or (corruption,): where its grid stands
    for name in names:
        if (found := corruption_of(name)) is None:
            items.append(name)
            continue
        if found[0] not in severities:
            items.append((found[0],))
        severities.setdefault(found[0], []).append(found[1])
    grids: dict[tuple[int, ...], list[str]] = {}  # severities -> the corruptions with exactly these
    for corruption, levels in severities.items():
        grids.setdefault(tuple(levels), []).append(corruption)

    def levels_text(levels: tuple[int, ...]) -> str:
        ordered = sorted(levels)
        if len(ordered) == 1:
            return str(ordered[0])
        contiguous = len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1))
        return "<" + (f"{ordered[0]}-{ordered[-1]}" if contiguous else ",".join(map(str, ordered))) + ">"

    out, named, shown = [], [], set()
    for item in items:
        if isinstance(item, str):
            out.append(item)
            continue
        levels = tuple(severities[item[0]])
        if levels in shown:
            continue
        shown.add(levels)
        corruptions = grids[levels]
        if len(corruptions) == 1:
            out.append(f"{SHIFT_PREFIX}{corruptions[0]}/{levels_text(levels)}")
        else:
            out.append(f"{SHIFT_PREFIX}<{len(corruptions)} corruptions>/{levels_text(levels)}")
            named.append(", ".join(corruptions))
    return ", ".join(out) + "".join(f" (corruptions: {n})" for n in named)


def corruption_of(split: str) -> tuple[str, int] | None:
    """``(corruption, severity)`` of a ``shift/<corruption>/<severity>`` split
    (:func:`corruption_split`), else None."""
    parts = split.split("/")
    if len(parts) == 3 and is_shift(split) and parts[2].isdigit():
        return parts[1], int(parts[2])
    return None


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(keep, held_out)`` row numbers, both increasing: per class, :func:`holdout_size`
    rows of a seeded permutation are held out (a seeded, class-balanced validation split)."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    held = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        if len(members) >= 2:
            held[members[: holdout_size(len(members), fraction)]] = True
    return np.flatnonzero(~held), np.flatnonzero(held)


def holdout_size(n: int, fraction: float) -> int:
    """How many of a class's ``n`` items a validation (or other) hold-out takes:
    ``fraction * n`` rounded half up, at least 1 and at most ``n - 1`` (so both sides keep
    every class).  The one rule every data family's class-balanced split uses."""
    return min(max(int(np.floor(fraction * n + 0.5)), 1), n - 1)


DATA_ROOT_ENV = "UQBENCH_DATA_ROOT"


@dataclass(frozen=True)
class DataSettings:
    """Where on-disk data sets live and how they may be obtained (``--data-root``,
    ``--download``, ``--strict-data``).  Run-time settings, never part of a cell key:
    they change where the bytes come from, not what they are."""

    root: Path | None = None  # None: $UQBENCH_DATA_ROOT, else ~/.cache/uqbench
    download: bool = False  # fetch missing official archives (md5-verified); never by default
    strict: bool = False  # a file whose md5 differs from the official one is an error, not a warning


_settings = DataSettings()


def configure_data(root: str | Path | None = None, *, download: bool = False, strict: bool = False) -> None:
    global _settings
    _settings = DataSettings(Path(root).expanduser() if root is not None else None, download, strict)


def set_data_root(path: str | Path | None) -> None:
    """Set the data root only (keeps the other settings); None restores the default."""
    global _settings
    _settings = DataSettings(Path(path).expanduser() if path is not None else None, _settings.download, _settings.strict)


def data_settings() -> DataSettings:
    return _settings


def data_root() -> Path:
    """``--data-root`` if given, else ``$UQBENCH_DATA_ROOT``, else ``~/.cache/uqbench``."""
    if _settings.root is not None:
        return _settings.root
    env = os.environ.get(DATA_ROOT_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "uqbench"
