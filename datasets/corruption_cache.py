"""The on-disk cache of generated corruptions: each (source images, corruption, severity,
seed) is computed once by the engine (``datasets.corruptions``) and then read back.

Files are plain ``.npy`` arrays (written atomically, read with ``allow_pickle=False``)
under the data root's ``corruptions/`` folder, in a directory per engine version.
"""
from __future__ import annotations

import hashlib
import io
from pathlib import Path

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


class CorruptionCache:
    """Each (source images, corruption, severity, seed) computed once, then read from disk.

    Files live at ``<root>/engine-v<VERSION>/<key>/<name>/<severity>-s<seed>.npy``: ``key``
    names the source images (callers include :func:`images_fingerprint`), and the engine
    version directory makes a change to this module ignore old files instead of reusing
    them.  Writes are atomic (:func:`bench.store.atomic_write_bytes`); reads use
    ``allow_pickle=False``.  A file whose shape or dtype does not match the images is
    recomputed and replaced."""

    def __init__(self, root: Path | None = None) -> None:
        if root is None:
            from bench.data import data_root

            root = data_root() / "corruptions"
        self.root = Path(root)

    def path(self, key: str, name: str, severity: int, seed: int = 0) -> Path:
        if not key or "/" in key or "\\" in key or key in (".", "..") or key.startswith("."):
            raise ValueError(f"cache key must be a plain, non-hidden file name, got {key!r}")
        engine.check_name_severity(name, severity)
        return self.root / f"engine-v{engine.VERSION}" / key / name / f"{int(severity)}-s{int(seed)}.npy"

    def get(self, images: np.ndarray, name: str, severity: int, seed: int = 0, *, key: str) -> np.ndarray:
        path = self.path(key, name, severity, seed)
        if path.is_file():
            try:
                cached = np.load(path, allow_pickle=False)
            except (OSError, ValueError):
                cached = None
            if cached is not None and cached.shape == images.shape and cached.dtype == np.uint8:
                return cached
        out = engine.corrupt(images, name, severity, seed)
        buf = io.BytesIO()
        np.save(buf, out, allow_pickle=False)
        atomic_write_bytes(path, buf.getvalue())
        return out
