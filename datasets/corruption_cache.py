"""The on-disk cache of generated corruptions: each (source, corruption, severity, seed)
is computed once by an engine and then read back.  Two engines use it: the image engine
(``datasets.corruptions``: uint8 images in, uint8 images out) and the text engine
(``datasets.text_corruptions``: texts in, token ids of the corrupted texts out).

Files are plain ``.npy`` arrays (written atomically, read with ``allow_pickle=False``)
under the data root's ``corruptions/`` folder, in a directory per engine version.
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bench.store import atomic_write_bytes
from datasets import corruptions as engine


def images_fingerprint(images: np.ndarray) -> str:
    """First 16 hex digits of the sha256 of ``images``' shape, dtype and bytes: a cache key
    for a set of source images (e.g. ``f"mnist5k-test-{images_fingerprint(x)}"``)."""
    h = hashlib.sha256()
    h.update(repr(tuple(images.shape)).encode())
    h.update(np.dtype(images.dtype).str.encode())
    h.update(np.ascontiguousarray(images).tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Engine:
    """What the cache needs of a corruption engine: its versioned folder name, the check of
    a (name, severity) pair, the computation, and the shape and dtype of its output for a
    source (a cached file of another shape or dtype is recomputed)."""

    folder: str
    check: Callable[[str, int], None]
    corrupt: Callable[[Any, str, int, int], np.ndarray]
    output_like: Callable[[Any], tuple[tuple[int, ...], np.dtype]]


IMAGES = Engine(f"engine-v{engine.VERSION}", engine.check_name_severity,
                lambda *args: engine.corrupt(*args),  # looked up at call time
                lambda images: (tuple(images.shape), np.dtype(np.uint8)))


class CorruptionCache:
    """Each (source, corruption, severity, seed) computed once, then read from disk.

    Files live at ``<root>/<engine folder>/<key>/<name>/<severity>-s<seed>.npy``
    (``engine-v<VERSION>`` for images): ``key`` names the source (callers include
    :func:`images_fingerprint`), and the engine version in the folder makes a change to
    an engine ignore old files instead of reusing them.  Writes are atomic
    (:func:`bench.store.atomic_write_bytes`); reads use ``allow_pickle=False``.  A file
    whose shape or dtype does not match the engine's output is recomputed and replaced."""

    def __init__(self, root: Path | None = None, engine: Engine = IMAGES) -> None:
        if root is None:
            from bench.data import data_root

            root = data_root() / "corruptions"
        self.root = Path(root)
        self.engine = engine

    def path(self, key: str, name: str, severity: int, seed: int = 0) -> Path:
        if not key or "/" in key or "\\" in key or key in (".", "..") or key.startswith("."):
            raise ValueError(f"cache key must be a plain, non-hidden file name, got {key!r}")
        self.engine.check(name, severity)
        return self.root / self.engine.folder / key / name / f"{int(severity)}-s{int(seed)}.npy"

    def get(self, source, name: str, severity: int, seed: int = 0, *, key: str) -> np.ndarray:
        path = self.path(key, name, severity, seed)
        if path.is_file():
            try:
                cached = np.load(path, allow_pickle=False)
            except (OSError, ValueError):
                cached = None
            if cached is not None and (tuple(cached.shape), cached.dtype) == self.engine.output_like(source):
                return cached
        out = self.engine.corrupt(source, name, severity, seed)
        buf = io.BytesIO()
        np.save(buf, out, allow_pickle=False)
        atomic_write_bytes(path, buf.getvalue())
        return out
