"""Generated shift splits for image data families: every ``shift/<corruption>/<severity>``
split a bundle does not already have (e.g. from official CIFAR-10-C files) is made lazily
from its clean ``test`` images by the corruption engine, through the on-disk cache.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from bench.data import CORRUPTIONS, SEVERITIES, DataBundle, Split, corruption_split
from datasets.corruption_cache import CorruptionCache, images_fingerprint


@dataclass(frozen=True)
class ShiftOptions:
    """Options every image dataset shares for its generated corruption splits (dataset
    ``Options`` classes inherit them)."""

    corruption_limit: int | None = field(default=None, metadata={"min": 1})  # corrupt only the first N test images
    corruption_seed: int = field(default=0, metadata={"min": 0})


def add_corruption_splits(bundle: DataBundle, options: ShiftOptions, source: str = "test") -> DataBundle:
    """Give ``bundle`` a lazy ``shift/<corruption>/<severity>`` split for every corruption
    and severity, generated from its ``source`` split through the on-disk cache.  Splits
    the bundle already has (e.g. the official CIFAR-10-C files) are kept as they are.
    A suite picks which of them it evaluates with its split patterns."""
    for name in CORRUPTIONS:
        for severity in SEVERITIES:
            split = corruption_split(name, severity)
            if split not in bundle.loaders:
                bundle.loaders[split] = functools.partial(_generated_split, bundle, source, name, severity, options)
    return bundle


def _generated_split(bundle: DataBundle, source: str, name: str, severity: int, options: ShiftOptions) -> Split:
    clean = bundle.get(source)
    x, y = clean.x[: options.corruption_limit], clean.y[: options.corruption_limit]
    key = f"{bundle.name}-{source}-{images_fingerprint(x)}"
    return Split(CorruptionCache().get(x, name, severity, options.corruption_seed, key=key), y)


# ======================================================================================
# Helpers
# ======================================================================================
