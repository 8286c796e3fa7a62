"""Readers and checks for the standard on-disk formats of image data sets (no registration).

Every reader validates the structure of what it reads and raises
:class:`~bench.core.errors.ConfigError` naming the file and the problem (missing key, wrong
shape or dtype, label out of range, truncated or corrupt file): a bad data file is a user
error, not a bug.  Shapes returned are NHWC uint8 images ``[N, H, W, 3]`` and int64 labels
``[N]``.

* CIFAR-10/100 python batches (:func:`read_cifar_pickle`, :func:`read_cifar_batch`,
  :func:`read_cifar_meta`): Python-2 protocol-2 pickles, read through
  :mod:`datasets.safe_pickle` with only the three numpy globals they need, because
  unpickling runs code.
* CIFAR-10 binary batches (:func:`read_cifar10_binary`).
* CIFAR-10-C / CIFAR-100-C ``.npy`` files (:func:`read_corruption_npy`), never unpickled.
* SVHN ``.mat`` files (:func:`read_svhn_mat`).
* A folder of image files (:func:`read_image_folder`), e.g. an OOD set.
* md5 checks against the published values (:data:`OFFICIAL_MD5`, :func:`check_md5`), the
  message for missing data (:func:`missing_data_error`) and an opt-in, md5-verified
  download that extracts archives safely and atomically (:func:`download`).
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import posixpath
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import warnings
import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np

from bench.data import SEVERITIES, check_severity
from bench.core.errors import ConfigError
from bench.config.options import ALLOW_LARGE_HINT, allow_large
from datasets import safe_pickle

CIFAR_SIDE = 32
CIFAR_ROW = 3 * CIFAR_SIDE * CIFAR_SIDE  # 3072 bytes: the R plane, then G, then B, each row-major

#: Number of classes behind each CIFAR label key; used for the range check.
CIFAR_LABEL_CLASSES: dict[bytes, int] = {b"labels": 10, b"fine_labels": 100, b"coarse_labels": 20}


IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".ppm"})
#: the most pixels an image of an image folder may declare: a larger one is refused from its
#: header, before decoding (a few bytes of PNG can declare gigabytes of pixels)
MAX_IMAGE_SIDE = 4096
MAX_IMAGE_PIXELS = MAX_IMAGE_SIDE * MAX_IMAGE_SIDE

#: Published md5 of each official file, by its path relative to the data root.
OFFICIAL_MD5: dict[str, str] = {
    "cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a",
    "cifar-10-batches-py/data_batch_1": "c99cafc152244af753f735de768cd75f",
    "cifar-10-batches-py/data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "cifar-10-batches-py/data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "cifar-10-batches-py/data_batch_4": "634d18415352ddfa80567beed471001a",
    "cifar-10-batches-py/data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "cifar-10-batches-py/test_batch": "40351d587109b95175f43aff81a1287e",
    "cifar-10-batches-py/batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
    "cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85",
    "cifar-100-python/train": "16019d7e3df5f24257cddd939b257f8d",
    "cifar-100-python/test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    "cifar-100-python/meta": "7973b15100ade9c7d40fb424638fde48",
    "svhn/train_32x32.mat": "e26dedcc434d2e4c54c9b2d4a06d8373",
    "svhn/test_32x32.mat": "eb5a983be6a315427106f1b164d9cef3",
    "svhn/extra_32x32.mat": "a93ce644f1a588dc4d68dda5feec44a7",
    "cola_public_1.1.zip": "9f6d88c3558ec424cd9d66ea03589aba",
    "cola_public/raw/in_domain_train.tsv": "0017f72718b43d880cd9050d8107f811",
    "cola_public/raw/in_domain_dev.tsv": "26b4107fdf8eeb4aa04436a3d6d8367c",
    "cola_public/raw/out_of_domain_dev.tsv": "2f23640e335e0f7e2dd50f76298315a9",
    "aclImdb_v1.tar.gz": "7c2ac02c03563afcf9b574c7e56c153a",
}


class DataFileWarning(UserWarning):
    """A data file differs from the published one (e.g. a deliberately reduced copy)."""


# --------------------------------------------------------------------------- CIFAR


def _key(key: bytes | str) -> bytes:
    return key.encode("ascii") if isinstance(key, str) else key


def _check_labels(
    path: Path | str, what: str, labels: np.ndarray, n: int, num_classes: int | None, *, first: int = 0
) -> np.ndarray:
    """``labels`` as int64 ``[n]`` in ``first .. first + num_classes - 1`` (no upper bound when
    ``num_classes`` is None), or a ConfigError naming ``path``."""
    if labels.ndim != 1 or len(labels) != n:
        raise ConfigError(f"{path}: {what} has shape {labels.shape}, expected ({n},) to match the images")
    if n and labels.dtype.kind not in "iu":
        raise ConfigError(f"{path}: {what} must be integers, got dtype {labels.dtype}")
    labels = labels.astype(np.int64)
    last = first + num_classes - 1 if num_classes is not None else None
    bad = (labels < first) | (labels > last) if last is not None else labels < first
    if bad.any():
        allowed = f"{first}..{last}" if last is not None else f">= {first}"
        raise ConfigError(f"{path}: {what} contains {int(labels[bad][0])}, out of range (expected {allowed})")
    return labels


def _planes_to_nhwc(rows: np.ndarray) -> np.ndarray:
    """``[N, 3072]`` rows (R plane, G plane, B plane; each 32x32 row-major) -> ``[N, 32, 32, 3]``."""
    return np.ascontiguousarray(rows.reshape(-1, 3, CIFAR_SIDE, CIFAR_SIDE).transpose(0, 2, 3, 1))


def _load_py2_pickle(path: Path | str, raw: bytes | None = None) -> object:
    """One object from an official-format (Python 2) pickle, with only numpy's array globals
    allowed: the file ``path``, or ``raw``, its bytes read elsewhere (an archive member that
    ``path`` names in messages)."""
    try:
        if raw is not None:
            return safe_pickle.load(raw, encoding="bytes", allowed=safe_pickle.NUMPY_RECONSTRUCT)
        with open(path, "rb") as f:
            return safe_pickle.load(f, encoding="bytes", allowed=safe_pickle.NUMPY_RECONSTRUCT)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except pickle.UnpicklingError as exc:
        if "refusing to load global" in str(exc):
            raise ConfigError(f"{path}: not loaded, it is not a plain CIFAR data pickle: {exc}") from None
        raise ConfigError(f"{path}: cannot be unpickled, the file is truncated or corrupt ({exc})") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError, MemoryError) as exc:
        raise ConfigError(
            f"{path}: cannot be unpickled, the file is truncated or corrupt ({type(exc).__name__}: {exc})"
        ) from None


def read_cifar_pickle(
    path: Path | str, label_key: bytes | str, *, num_classes: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read one official CIFAR python batch (``data_batch_1``, ``test_batch``, CIFAR-100 ``train``...).

    The file is a dict with ``b"data"`` (uint8 ``[N, 3072]``, R, G, B planes) and
    ``label_key`` (``b"labels"`` for CIFAR-10, ``b"fine_labels"``/``b"coarse_labels"`` for
    CIFAR-100; a list of N ints).  Labels are checked against ``num_classes``, by default the
    class count of ``label_key``.  Returns ``x`` uint8 ``[N, 32, 32, 3]`` and ``y`` int64 ``[N]``.
    """
    obj, y = read_cifar_batch(path, label_key, num_classes=num_classes)
    return _planes_to_nhwc(obj[b"data"]), y


def read_cifar_batch(
    path: Path | str, label_key: bytes | str, *, num_classes: int | None = None, raw: bytes | None = None
) -> tuple[dict, np.ndarray]:
    """One official CIFAR python batch as its dict, checked as :func:`read_cifar_pickle`
    checks it, and its labels (int64 ``[N]``); ``raw``: the file's bytes, read elsewhere
    (e.g. from an archive; ``path`` then only names it in messages)."""
    key = _key(label_key)
    num_classes = num_classes if num_classes is not None else CIFAR_LABEL_CLASSES.get(key)
    obj = _load_py2_pickle(path, raw)
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}: expected a dict (a CIFAR batch), got {type(obj).__name__}")
    for k in (b"data", key):
        if k not in obj:
            found = ", ".join(repr(v) for v in obj) or "none"
            raise ConfigError(f"{path}: missing key {k!r} (keys found: {found})")
    data = obj[b"data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != CIFAR_ROW:
        desc = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise ConfigError(f"{path}: b'data' must be a uint8 array of shape (N, {CIFAR_ROW}), got {desc}")
    try:
        labels = np.asarray(obj[key])
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: {key!r} is not a list of integers ({exc})") from None
    return obj, _check_labels(path, repr(key), labels, len(data), num_classes)


def read_cifar10_binary(path: Path | str) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 binary batch (``data_batch_1.bin``, ``test_batch.bin``).

    Each record is 1 label byte (0..9) then 3072 pixel bytes (R, G, B planes, row-major).
    Returns ``x`` uint8 ``[N, 32, 32, 3]`` and ``y`` int64 ``[N]``.
    """
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    record = 1 + CIFAR_ROW
    if raw.size == 0 or raw.size % record:
        raise ConfigError(
            f"{path}: {raw.size} bytes is not a whole number of {record}-byte CIFAR-10 records; "
            f"the file is truncated or not a CIFAR-10 binary batch"
        )
    rows = raw.reshape(-1, record)
    y = _check_labels(path, "label byte", rows[:, 0], len(rows), 10)
    return _planes_to_nhwc(rows[:, 1:]), y


def read_cifar_meta(path: Path | str, key: bytes | str, *, raw: bytes | None = None) -> list[str]:
    """Class names from a CIFAR meta file: ``batches.meta`` with ``b"label_names"``, or
    CIFAR-100 ``meta`` with ``b"fine_label_names"`` / ``b"coarse_label_names"`` (``raw``:
    the file's bytes, read elsewhere, as for :func:`read_cifar_batch`)."""
    k = _key(key)
    obj = _load_py2_pickle(path, raw)
    if not isinstance(obj, dict) or k not in obj:
        found = ", ".join(repr(v) for v in obj) if isinstance(obj, dict) else type(obj).__name__
        raise ConfigError(f"{path}: missing key {k!r} (found: {found or 'none'})")
    names = obj[k]
    if not isinstance(names, list) or not all(isinstance(n, (bytes, str)) for n in names):
        raise ConfigError(f"{path}: {k!r} must be a list of names, got {type(names).__name__}")
    return [n.decode("latin1") if isinstance(n, bytes) else n for n in names]


# --------------------------------------------------------------------------- CIFAR-10-C


def read_corruption_npy(
    directory: Path | str, name: str, *, num_classes: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read ``<directory>/<name>.npy`` and ``<directory>/labels.npy`` (official CIFAR-10-C/100-C).

    ``x`` is uint8 ``[M, 32, 32, 3]`` with M a multiple of 5 (officially 50000): rows
    ``(s-1)*M/5 .. s*M/5 - 1`` are severity ``s`` (see :func:`severity_rows`).  ``x`` is a
    read-only memory map, so taking one severity reads only its rows; ``y`` is int64 ``[M]``.
    """
    directory = Path(directory)
    x_path, y_path = directory / f"{name}.npy", directory / "labels.npy"
    x = _load_npy(x_path, mmap=True)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != (CIFAR_SIDE, CIFAR_SIDE, 3):
        raise ConfigError(f"{x_path}: expected a uint8 array of shape (M, 32, 32, 3), got {x.dtype} {x.shape}")
    if len(x) == 0 or len(x) % len(SEVERITIES):
        raise ConfigError(f"{x_path}: {len(x)} images is not a positive multiple of {len(SEVERITIES)} severities")
    y = _check_labels(y_path, "labels", _load_npy(y_path, mmap=False), len(x), num_classes)
    return x, y


def severity_rows(n_rows: int, severity: int) -> slice:
    """Rows of severity ``severity`` (1..5) in a CIFAR-C array of ``n_rows`` rows."""
    severity = check_severity(severity)
    block = n_rows // len(SEVERITIES)
    return slice((severity - 1) * block, severity * block)


def _load_npy(path: Path, *, mmap: bool) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except (ValueError, OSError, EOFError) as exc:
        raise ConfigError(f"{path}: not a readable .npy array, the file is truncated or corrupt ({exc})") from None
    if not isinstance(arr, np.ndarray):
        raise ConfigError(f"{path}: expected one .npy array, got {type(arr).__name__}")
    return arr


# --------------------------------------------------------------------------- SVHN


def read_svhn_mat(path: Path | str) -> tuple[np.ndarray, np.ndarray]:
    """Read an SVHN cropped-digits file (``test_32x32.mat``): ``X`` uint8 ``(32, 32, 3, N)``,
    ``y`` ``(N, 1)`` with labels 1..10 where 10 means the digit 0.

    Returns ``x`` uint8 ``[N, 32, 32, 3]`` and ``y`` int64 ``[N]`` in 0..9.
    """
    import scipy.io  # imported here: only SVHN needs it

    try:
        mat = scipy.io.loadmat(path, variable_names=["X", "y"])
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except Exception as exc:  # scipy raises ValueError, MatReadError, TypeError... for bad files
        raise ConfigError(f"{path}: not a readable .mat file, it is truncated or corrupt ({exc})") from None
    for k in ("X", "y"):
        if k not in mat:
            raise ConfigError(f"{path}: missing variable {k!r}")
    x, y = mat["X"], mat["y"]
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (CIFAR_SIDE, CIFAR_SIDE, 3):
        raise ConfigError(f"{path}: 'X' must be uint8 of shape (32, 32, 3, N), got {x.dtype} {x.shape}")
    n = x.shape[3]
    if y.shape not in ((n, 1), (n,)):
        raise ConfigError(f"{path}: 'y' has shape {y.shape}, expected ({n}, 1)")
    y = _check_labels(path, "'y'", y.reshape(-1), n, 10, first=1)
    y[y == 10] = 0  # SVHN's label 10 is the digit 0
    return np.ascontiguousarray(x.transpose(3, 0, 1, 2)), y


# --------------------------------------------------------------------------- image folders


def image_files(path: Path | str) -> list[Path]:
    """Every image file under ``path`` (recursive; png/jpg/jpeg/bmp/ppm, any case), sorted by
    relative path so that the order is the same on every machine."""
    root = Path(path)
    files = [p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def read_image_folder(path: Path | str, size: int, *, limit: int | None = None) -> np.ndarray:
    """Every image under ``path`` as uint8 ``[N, size, size, 3]``.

    Each image is converted to RGB, centre-cropped to a square (the shorter side) and resized
    to ``size`` x ``size`` (bilinear).  With ``limit``, only ``limit`` evenly spaced files
    (in sorted order) are decoded.  An image declaring more than :data:`MAX_IMAGE_PIXELS`
    pixels is a ConfigError before it is decoded, unless :func:`~bench.config.options.allow_large`.
    """
    from PIL import Image, UnidentifiedImageError

    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"{root}: image folder not found")
    files = image_files(root)
    if not files:
        raise ConfigError(f"{root}: no image files (extensions {', '.join(sorted(IMAGE_SUFFIXES))})")
    if limit is not None and limit < len(files):
        files = [files[i] for i in evenly_spaced(len(files), limit)]
    out = np.empty((len(files), size, size, 3), dtype=np.uint8)
    for i, f in enumerate(files):
        try:
            with Image.open(f) as im:  # reads the header only
                w, h = im.size
                if w * h > MAX_IMAGE_PIXELS and not allow_large():
                    raise ConfigError(f"{f}: {w} x {h} = {w * h:,} pixels, more than the {MAX_IMAGE_PIXELS:,} "
                                      f"({MAX_IMAGE_SIDE} x {MAX_IMAGE_SIDE}) an image may have (a guard against "
                                      f"decompression bombs); downscale it, or {ALLOW_LARGE_HINT}")
                rgb = im.convert("RGB")
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as exc:
            raise ConfigError(f"{f}: cannot be read as an image ({exc})") from None
        w, h = rgb.size
        side = min(w, h)
        left, top = (w - side) // 2, (h - side) // 2
        square = rgb.crop((left, top, left + side, top + side))
        out[i] = np.asarray(square.resize((size, size), Image.Resampling.BILINEAR))
    return out


def evenly_spaced(n: int, k: int) -> np.ndarray:
    """``k`` (<= n) evenly spaced indices into ``range(n)``, starting at 0, increasing."""
    k = min(k, n)
    return (np.arange(k, dtype=np.int64) * n) // max(k, 1)


# --------------------------------------------------------------------------- md5


@functools.lru_cache(maxsize=64)
def _md5_of(path: str, size: int, mtime_ns: int) -> str:  # size and mtime invalidate the cache
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_md5(path: Path | str) -> str:
    """md5 of a file (hex), cached by path, size and modification time."""
    st = os.stat(path)
    return _md5_of(str(path), st.st_size, st.st_mtime_ns)


def check_md5(path: Path | str, expected: str, strict: bool) -> bool:
    """Compare ``path``'s md5 with the published ``expected``; True when they match.

    A mismatch warns (:class:`DataFileWarning`, naming the file and both md5s) and returns
    False: a deliberately reduced or re-encoded copy is allowed.  With ``strict`` it raises
    a :class:`ConfigError` instead.
    """
    actual = file_md5(path)
    if actual == expected.lower():
        return True
    msg = f"{path}: md5 {actual} differs from the official file's md5 {expected}"
    if strict:
        raise ConfigError(f"{msg}; strict data checking is on, so the file is refused (re-extract or re-download it)")
    warnings.warn(f"{msg}; using it anyway (a reduced or modified copy; pass --strict-data to refuse it)",
                  DataFileWarning, stacklevel=2)
    return False


# --------------------------------------------------------------------------- missing data, download


def missing_data_error(name: str, expected_files: Sequence[str], searched_dir: Path | str) -> ConfigError:
    """The error for a data set whose files are not there: what is expected, where it was
    looked for, and the two ways to provide it."""
    files = "\n  ".join(str(f) for f in expected_files)
    return ConfigError(
        f"data set {name!r}: required files not found in {searched_dir}.\n"
        f"Expected (relative to that directory):\n  {files}\n"
        f"Either put the official files there (or pass --data-root DIR to use a directory that "
        f"holds them), or run with --download to fetch them (an md5-verified HTTPS download)."
    )


def _safe_members(tar: tarfile.TarFile, archive: str) -> list[tarfile.TarInfo]:
    """All members of ``tar``, or a ConfigError if any could write outside the extraction
    directory (absolute path, ``..``, a link pointing outside) or is a device/FIFO."""
    members = tar.getmembers()
    for m in members:
        name = m.name
        parts = name.replace("\\", "/").split("/")
        if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or ".." in parts:
            raise ConfigError(f"{archive}: unsafe archive member {name!r} (absolute path or '..'); nothing extracted")
        if m.issym() or m.islnk():
            target = m.linkname
            base = posixpath.dirname(name) if m.issym() else ""
            resolved = posixpath.normpath(posixpath.join(base, target))
            if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
                raise ConfigError(
                    f"{archive}: archive member {name!r} links outside the archive ({target!r}); nothing extracted"
                )
        elif not (m.isfile() or m.isdir()):
            raise ConfigError(f"{archive}: archive member {name!r} is a device or FIFO; nothing extracted")
    return members


def _extract_tar(archive: Path, label: str, work: Path) -> None:
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = _safe_members(tar, label)
            if hasattr(tarfile, "data_filter"):  # defence in depth where Python has extraction filters
                tar.extractall(work, members=members, filter="data")
            else:  # pragma: no cover - Python without extraction filters
                tar.extractall(work, members=members)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ConfigError(f"{label}: cannot extract the archive ({exc}); nothing extracted") from None


def _extract_zip(archive: Path, label: str, work: Path) -> None:
    """Extract a zip after checking every member name (no absolute paths, no ``..``)."""
    try:
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                parts = name.replace("\\", "/").split("/")
                if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or ".." in parts:
                    raise ConfigError(f"{label}: unsafe archive member {name!r} (absolute path or '..'); nothing extracted")
            zf.extractall(work)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ConfigError(f"{label}: cannot extract the archive ({exc}); nothing extracted") from None


def _is_archive_name(name: str) -> bool:
    return name.endswith((".tar", ".tar.gz", ".tgz", ".zip"))


def download(url: str, dest_dir: Path | str, md5: str, *, extract: bool = True) -> Path:
    """Fetch ``url`` into ``dest_dir``, verify its md5, and (for a .tar/.tar.gz/.zip with
    ``extract``) extract it there.  Opt-in only: nothing calls this unless the user asks.

    Only ``https://`` (and ``file://``, for local mirrors) URLs are accepted.  The download
    goes to a temporary file in ``dest_dir``; a wrong md5 removes it and raises ConfigError.
    Archives are checked member by member (no absolute paths, no ``..``, no links outside,
    no devices), extracted into a temporary directory, and each top-level entry is then
    renamed into place, so a failure never leaves a half-extracted tree.  The archive
    itself is not kept.  Returns ``dest_dir`` for an extracted archive, else the file path.
    """
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("https", "file"):
        raise ConfigError(f"refusing to download {url}: only https:// URLs are used (got {parsed.scheme or 'no'} scheme)")
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    name = posixpath.basename(urllib.parse.unquote(parsed.path))
    if not name or name in (".", ".."):
        raise ConfigError(f"cannot tell the file name from the URL {url}")
    fd, tmp_name = tempfile.mkstemp(dir=dest, prefix=f".{name}.", suffix=".part")
    tmp = Path(tmp_name)
    work: Path | None = None
    try:
        print(f"downloading {url} -> {dest}", file=sys.stderr)
        h = hashlib.md5()
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:
                for chunk in iter(lambda: resp.read(1 << 20), b""):
                    h.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, OSError) as exc:
            raise ConfigError(
                f"could not download {url} ({exc}); download it by hand and put it (extracted) in {dest}"
            ) from None
        actual = h.hexdigest()
        if actual != md5.lower():
            raise ConfigError(
                f"downloaded {url} has md5 {actual}, expected {md5}: the download is corrupt or the "
                f"file has changed; it was deleted and nothing was extracted"
            )
        if not (extract and _is_archive_name(name)):
            final = dest / name
            os.replace(tmp, final)
            return final
        work = Path(tempfile.mkdtemp(dir=dest, prefix=f".{name}.", suffix=".extract"))
        (_extract_zip if name.endswith(".zip") else _extract_tar)(tmp, url, work)
        entries = sorted(work.iterdir())
        clash = [e.name for e in entries if (dest / e.name).exists() or (dest / e.name).is_symlink()]
        if clash:
            raise ConfigError(
                f"cannot extract {url} into {dest}: {', '.join(clash)} already exists there (incomplete?); "
                f"move or remove it and run again"
            )
        for e in entries:
            os.rename(e, dest / e.name)
        return dest
    finally:
        tmp.unlink(missing_ok=True)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
