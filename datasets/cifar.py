"""CIFAR-10 and CIFAR-100 from the official files under the data root (``--data-root``).

Expected layout (``bench.data.data_root()``; only the ID files are required)::

    cifar-10-batches-py/   data_batch_1..5, test_batch, batches.meta   (or cifar-10-batches-bin/)
    cifar-100-python/      train, test, meta
    CIFAR-10-C/            <corruption>.npy ..., labels.npy            (optional; else generated)
    CIFAR-100-C/           <corruption>.npy ..., labels.npy            (optional)
    svhn/test_32x32.mat                                                (optional, OOD)
    ood/<name>/            any image files                             (optional, OOD)

Splits (32x32 RGB, uint8 ``[N, 32, 32, 3]``; labels int64, canonical CIFAR order, the
CIFAR-100 fine labels):

* ``train`` / ``val``: the training files, with ``val_fraction`` of each class held out as
  validation, evenly spaced among that class's images in file order (as KEP-SVGP's
  preprocessing does: 45k / 5k by default).  Deterministic; no seed.
* ``test``: the official test file.
* ``ood/svhn`` (SVHN test set), ``ood/cifar100`` or ``ood/cifar10`` (the other CIFAR's test
  set) when their files are there, and ``ood/<name>`` for every folder under ``ood/``;
  labels ``-1``.  ``ood/uniform_noise`` (``noise_size`` images of uniform RGB noise, fixed
  seed) when ``ood`` lists it: a generated set that needs no file.
* ``shift/<corruption>/<severity>`` for every ``.npy`` file present in ``CIFAR-10-C/`` (for
  CIFAR-100: ``CIFAR-100-C/``), severities 1..5.

Each official file is checked against its published md5 when the data set is loaded: a
mismatch warns (a deliberately reduced copy is fine) or, with ``--strict-data``, is refused.
``--download`` fetches missing files from the official HTTPS URLs (md5-verified) into the
data root; nothing is ever downloaded otherwise.

``train_limit`` / ``eval_limit`` cap the splits for tiny runs: labelled splits keep a
class-balanced subset (the first images of each class, in file order), unlabelled OOD
splits keep evenly spaced images.
"""
from __future__ import annotations

import functools
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from bench.data import (CORRUPTIONS, OOD_LABEL, OOD_PREFIX, SEVERITIES, DataBundle, Split, corruption_split, data_root,
                        data_settings, holdout_size, uniform_noise_split)
from bench.core.errors import ConfigError
from bench.core.registry import DATASETS
from datasets import formats
from datasets.shift import ShiftOptions, add_corruption_splits

SIDE = 32
SVHN_FILE = "svhn/test_32x32.mat"
OOD_FOLDERS = "ood"
NOISE_OOD = "uniform_noise"  # the generated OOD set
NOISE_SEED = 20230101
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

#: Official sources: name -> (URL, md5 of the file, directory under the data root it goes to).
SOURCES: dict[str, tuple[str, str, str]] = {
    "cifar10": ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a", "."),
    "cifar100": ("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85", "."),
    # the official page gives http://; the same host serves it over https
    "svhn": ("https://ufldl.stanford.edu/housenumbers/test_32x32.mat", "eb5a983be6a315427106f1b164d9cef3", "svhn"),
}


@dataclass(frozen=True)
class Family:
    """Where one CIFAR variant's files are and how to read them."""

    name: str
    num_classes: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    pickle_train: tuple[str, ...]  # relative to the data root
    pickle_test: str
    label_key: bytes
    binary_train: tuple[str, ...]  # the binary version, read when the pickles are absent
    binary_test: str | None
    corruptions: str  # CIFAR-C directory


CIFAR10 = Family(
    name="cifar10",
    num_classes=10,
    # KEP-SVGP's constants (docs/reference/kep_svgp_and_sgpa.md section 1.2)
    mean=(0.4914, 0.4822, 0.4465),
    std=(0.2023, 0.1994, 0.2010),
    pickle_train=tuple(f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)),
    pickle_test="cifar-10-batches-py/test_batch",
    label_key=b"labels",
    binary_train=tuple(f"cifar-10-batches-bin/data_batch_{i}.bin" for i in range(1, 6)),
    binary_test="cifar-10-batches-bin/test_batch.bin",
    corruptions="CIFAR-10-C",
)
CIFAR100 = Family(
    name="cifar100",
    num_classes=100,
    mean=(0.5071, 0.4867, 0.4408),
    std=(0.2675, 0.2565, 0.2761),
    pickle_train=("cifar-100-python/train",),
    pickle_test="cifar-100-python/test",
    label_key=b"fine_labels",
    binary_train=(),
    binary_test=None,
    corruptions="CIFAR-100-C",
)
FAMILIES = {f.name: f for f in (CIFAR10, CIFAR100)}
#: Files checked against their md5 at load when present (besides the ones read).
META_FILES = {"cifar10": "cifar-10-batches-py/batches.meta", "cifar100": "cifar-100-python/meta"}


@dataclass(frozen=True)
class CifarOptions(ShiftOptions):
    """Options shared by ``cifar10`` and ``cifar100``."""

    dataset: ClassVar[str] = ""
    builtin_ood: ClassVar[tuple[str, ...]] = ()

    val_fraction: float = field(default=0.1, metadata={"exclusive_min": 0.0})  # < 1, checked below
    train_limit: int | None = field(default=None, metadata={"min": 1})
    eval_limit: int | None = field(default=None, metadata={"min": 1})
    # OOD sets: the built-in ones, or names of folders under <data root>/ood/ (those are
    # also used when not listed); a built-in set whose files are absent is left out
    ood: tuple[str, ...] = ()
    noise_size: int = field(default=1000, metadata={"min": 1})  # images in ood/uniform_noise

    def __post_init__(self) -> None:
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be > 0 and < 1, got {self.val_fraction!r}")
        for name in self.ood:
            if not _NAME.fullmatch(name):
                raise ValueError(f"ood: {name!r} is not a valid OOD set name (letters, digits, _ . -)")
            if name == self.dataset:
                raise ValueError(f"ood: {self.dataset} cannot be its own OOD set")
        if len(set(self.ood)) != len(self.ood):
            raise ValueError(f"ood: names repeat in {list(self.ood)}")


@dataclass(frozen=True)
class Cifar10Options(CifarOptions):
    dataset: ClassVar[str] = "cifar10"
    builtin_ood: ClassVar[tuple[str, ...]] = ("svhn", "cifar100", NOISE_OOD)
    ood: tuple[str, ...] = ("svhn", "cifar100")


@dataclass(frozen=True)
class Cifar100Options(CifarOptions):
    dataset: ClassVar[str] = "cifar100"
    builtin_ood: ClassVar[tuple[str, ...]] = ("svhn", "cifar10", NOISE_OOD)
    ood: tuple[str, ...] = ("svhn", "cifar10")


#: OpenOOD v1.5's groups for the CIFAR benchmarks (near: the other CIFAR, TinyImageNet; far:
#: MNIST, SVHN, Textures, Places365), by OOD set name (folders under <data root>/ood/ by
#: their usual names); uniform noise is far.  The report averages each group's sets.
_FAR = ("svhn", "mnist", "textures", "texture", "dtd", "places365", "places", NOISE_OOD)
_NEAR = ("tin", "tinyimagenet", "tiny_imagenet", "tiny-imagenet")


@DATASETS.register("cifar10")
class Cifar10:
    """CIFAR-10 (official files); OOD SVHN, CIFAR-100 and image folders; shift CIFAR-10-C."""

    Options = Cifar10Options
    ood_groups = {"near": ("cifar100", *_NEAR), "far": _FAR}

    @staticmethod
    def load(options: Cifar10Options) -> DataBundle:
        return load_family(CIFAR10, options)


@DATASETS.register("cifar100")
class Cifar100:
    """CIFAR-100 (official files, fine labels); OOD SVHN, CIFAR-10 and image folders; shift CIFAR-100-C."""

    Options = Cifar100Options
    ood_groups = {"near": ("cifar10", *_NEAR), "far": _FAR}

    @staticmethod
    def load(options: Cifar100Options) -> DataBundle:
        return load_family(CIFAR100, options)


# --------------------------------------------------------------------------- locating files


@dataclass(frozen=True)
class Files:
    """The ID files found for one family: ``kind`` is ``"pickle"`` or ``"binary"``."""

    kind: str
    train: tuple[str, ...]  # absolute paths
    test: str


def find_files(fam: Family, root: Path, *, test_only: bool = False) -> Files | None:
    """The family's pickles if all are there, else its binary batches if all are there."""
    layouts = [("pickle", fam.pickle_train, fam.pickle_test)]
    if fam.binary_test is not None:
        layouts.append(("binary", fam.binary_train, fam.binary_test))
    for kind, train, test in layouts:
        needed = (() if test_only else train) + (test,)
        if all((root / rel).is_file() for rel in needed):
            return Files(kind, tuple(str(root / rel) for rel in train), str(root / test))
    return None


def _fetch(source: str, root: Path) -> None:
    url, md5, sub = SOURCES[source]
    formats.download(url, root / sub, md5)


def _check_official(root: Path, paths: list[str], strict: bool) -> None:
    """md5 of every official file among ``paths`` (those with a published md5)."""
    for p in paths:
        rel = Path(p).relative_to(root).as_posix() if Path(p).is_relative_to(root) else None
        if rel in formats.OFFICIAL_MD5:
            formats.check_md5(p, formats.OFFICIAL_MD5[rel], strict)


def _ood_folders(root: Path) -> list[str]:
    base = root / OOD_FOLDERS
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.is_dir() and _NAME.fullmatch(p.name))


# --------------------------------------------------------------------------- reading (cached)


def _stamp(paths: tuple[str, ...]) -> tuple[tuple[str, int, int], ...]:
    """Path, size and mtime of each file: the cache key, so a changed file is re-read."""
    return tuple((p, (st := os.stat(p)).st_size, st.st_mtime_ns) for p in paths)


@functools.lru_cache(maxsize=4)
def _read_cached(kind: str, stamp: tuple, label_key: bytes, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for path, _, _ in stamp:
        if kind == "pickle":
            x, y = formats.read_cifar_pickle(path, label_key, num_classes=num_classes)
        else:
            x, y = formats.read_cifar10_binary(path)
        xs.append(x)
        ys.append(y)
    x, y = np.concatenate(xs), np.concatenate(ys)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def read_files(fam: Family, kind: str, paths: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Images ``[N, 32, 32, 3]`` and labels of the given batches, concatenated (read-only, cached)."""
    return _read_cached(kind, _stamp(paths), fam.label_key, fam.num_classes)


# --------------------------------------------------------------------------- split rules


def val_split_indices(labels: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Train and validation row numbers: for each class with n images (in file order),
    ``round(val_fraction * n)`` (at least 1, at most n - 1) evenly spaced ones are held
    out: positions ``floor(k * n / n_val)`` for k = 0.. n_val - 1 (every 10th image, from
    the first, at 10%).  Both index arrays are increasing."""
    is_val = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        n = len(members)
        if n < 2:
            continue
        n_val = holdout_size(n, val_fraction)
        is_val[members[formats.evenly_spaced(n, n_val)]] = True
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def balanced_subset(labels: np.ndarray, limit: int | None) -> np.ndarray:
    """Row numbers of at most ``limit`` images, as class-balanced as possible: the first
    images of each class in file order, classes taking turns in proportion to their size.
    Increasing, so the subset keeps file order.  ``None`` keeps everything."""
    if limit is None or limit >= len(labels):
        return np.arange(len(labels))
    keys = np.empty(len(labels))
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        keys[members] = (np.arange(len(members)) + 0.5) / len(members)
    return np.sort(np.argsort(keys, kind="stable")[:limit])


def _ood(x: np.ndarray, limit: int | None) -> Split:
    if limit is not None and limit < len(x):
        x = x[formats.evenly_spaced(len(x), limit)]
    return Split(np.ascontiguousarray(x), np.full(len(x), OOD_LABEL, dtype=np.int64))


# --------------------------------------------------------------------------- loaders


def load_family(fam: Family, options: CifarOptions) -> DataBundle:
    """Find (or, with ``download``, fetch) the files, check them, and return lazy split loaders.

    The ID files are read now (format and md5 errors surface before any training);
    OOD and shift files are read when their split is first asked for.
    """
    root, settings = data_root(), data_settings()
    files = find_files(fam, root)
    if files is None and settings.download:
        _fetch(fam.name, root)
        files = find_files(fam, root)
    if files is None:
        raise missing_data_error_for(fam, [*fam.pickle_train, fam.pickle_test], root)
    # OOD sets
    folders = _ood_folders(root)
    loaders_ood: dict[str, object] = {}
    to_check = list(files.train) + [files.test]
    for name in options.ood:
        if name == "svhn":
            path = root / SVHN_FILE
            if not path.is_file() and settings.download:
                _fetch("svhn", root)
            if path.is_file():
                loaders_ood[name] = functools.partial(_svhn_split, str(path), options.eval_limit)
                to_check.append(str(path))
        elif name == NOISE_OOD:
            loaders_ood[name] = functools.partial(_noise_split, options)
        elif name in FAMILIES and name in options.builtin_ood:
            other = FAMILIES[name]
            found = find_files(other, root, test_only=True)
            if found is None and settings.download:
                _fetch(name, root)
                found = find_files(other, root, test_only=True)
            if found is not None:
                loaders_ood[name] = functools.partial(_other_cifar_split, name, found.kind, found.test, options.eval_limit)
                to_check.append(found.test)
        elif name in folders:
            loaders_ood[name] = functools.partial(_folder_split, str(root / OOD_FOLDERS / name), options.eval_limit)
        else:
            raise ConfigError(
                f"{fam.name}: unknown OOD set {name!r} in ood; the built-in ones are "
                f"{', '.join(options.builtin_ood)}, and a folder set is a directory of images at "
                f"{root / OOD_FOLDERS / name} (found: {', '.join(folders) or 'none'})"
            )
    for name in folders:
        if name not in loaders_ood and name not in options.builtin_ood and name not in FAMILIES:
            loaders_ood[name] = functools.partial(_folder_split, str(root / OOD_FOLDERS / name), options.eval_limit)
    meta = root / META_FILES[fam.name]
    if files.kind == "pickle" and meta.is_file():
        to_check.append(str(meta))
    _check_official(root, to_check, settings.strict)
    read_files(fam, files.kind, files.train)  # validates the training files now
    read_files(fam, files.kind, (files.test,))

    loaders: dict[str, object] = {
        "train": functools.partial(_id_split, fam, files, options, "train"),
        "val": functools.partial(_id_split, fam, files, options, "val"),
        "test": functools.partial(_id_split, fam, files, options, "test"),
    }
    loaders.update({f"{OOD_PREFIX}{name}": fn for name, fn in loaders_ood.items()})
    loaders.update(_shift_loaders(fam, root / fam.corruptions, options.eval_limit))
    bundle = DataBundle(
        name=fam.name,
        num_classes=fam.num_classes,
        image_shape=(SIDE, SIDE, 3),
        mean=fam.mean,
        std=fam.std,
        loaders=loaders,  # type: ignore[arg-type]
    )
    return add_corruption_splits(bundle, options)  # generated where no official file is present


def missing_data_error_for(fam: Family, expected: list[str], root: Path) -> ConfigError:
    """:func:`formats.missing_data_error`, plus the binary alternative where there is one."""
    err = formats.missing_data_error(fam.name, expected, root)
    if fam.binary_test is not None:
        alt = ", ".join([*fam.binary_train, fam.binary_test])
        err = ConfigError(f"{err}\n(The binary version is read too when the python one is absent: {alt}.)")
    return err


def _id_split(fam: Family, files: Files, options: CifarOptions, name: str) -> Split:
    if name == "test":
        x, y = read_files(fam, files.kind, (files.test,))
        idx = balanced_subset(y, options.eval_limit)
        return Split(x[idx], y[idx])
    x, y = read_files(fam, files.kind, files.train)
    train_idx, val_idx = val_split_indices(y, options.val_fraction)
    idx = train_idx if name == "train" else val_idx
    idx = idx[balanced_subset(y[idx], options.train_limit if name == "train" else options.eval_limit)]
    return Split(x[idx], y[idx])


def _svhn_split(path: str, limit: int | None) -> Split:
    x, _ = formats.read_svhn_mat(path)
    return _ood(x, limit)


def _other_cifar_split(name: str, kind: str, path: str, limit: int | None) -> Split:
    x, _ = read_files(FAMILIES[name], kind, (path,))
    return _ood(x, limit)


def _noise_split(options: CifarOptions) -> Split:
    return uniform_noise_split(options.noise_size, (SIDE, SIDE, 3), np.random.default_rng(NOISE_SEED), options.eval_limit)


def _folder_split(path: str, limit: int | None) -> Split:
    return _ood(formats.read_image_folder(path, SIDE, limit=limit), None)


def _shift_loaders(fam: Family, directory: Path, limit: int | None) -> dict[str, object]:
    """``shift/<corruption>/<severity>`` for each ``<corruption>.npy`` in ``directory``
    (known corruptions in the canonical order, then any others, sorted)."""
    if not directory.is_dir():
        return {}
    present = sorted(p.stem for p in directory.glob("*.npy") if p.stem != "labels" and _NAME.fullmatch(p.stem))
    if not present:
        return {}
    if not (directory / "labels.npy").is_file():
        warnings.warn(
            f"{directory} has corruption files but no labels.npy; its shift splits are left out",
            formats.DataFileWarning, stacklevel=3,
        )
        return {}
    known = [c for c in CORRUPTIONS if c in present]
    ordered = known + [c for c in present if c not in known]
    return {
        corruption_split(c, s): functools.partial(_shift_split, str(directory), c, s, fam.num_classes, limit)
        for c in ordered
        for s in SEVERITIES
    }


def _shift_split(directory: str, corruption: str, severity: int, num_classes: int, limit: int | None) -> Split:
    x, y = formats.read_corruption_npy(directory, corruption, num_classes=num_classes)
    rows = formats.severity_rows(len(x), severity)
    y = y[rows]
    idx = balanced_subset(y, limit)
    return Split(np.array(x[rows][idx]), y[idx])
