"""Synthetic CIFAR-10 / CIFAR-100 / SVHN files, laid out and encoded as the official releases.

For machines with no copy of the real data (and no network), e.g. a GPU run of the
``cifar10`` suite or the cells-per-GPU measurement (``benchmarks/cells_per_gpu.py``)::

    python3 benchmarks/synthetic_cifar.py DIR [--train N] [--test M] [--classes 10,100] [--svhn K] [--seed S]
    python3 run_suite.py --suite cifar10 --data-root DIR --epochs 2 --device cuda

writes, under ``DIR`` (what ``datasets/cifar.py`` reads; every file is replaced atomically)::

    cifar-10-batches-py/  data_batch_1..5, test_batch, batches.meta     (--classes 10)
    cifar-100-python/     train, test, meta                             (--classes 100)
    svhn/test_32x32.mat                                                 (--svhn K > 0)

* CIFAR batches are Python-2, protocol-2 pickles (``datasets/py2_pickle.py``: byte strings as
  Python-2 ``str`` opcodes, arrays through ``numpy.core.multiarray._reconstruct``), exactly
  as the published files are encoded, with the official keys: ``b"batch_label"``,
  ``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` and ``b"coarse_labels"`` (CIFAR-100),
  ``b"data"`` (uint8 ``[N, 3072]``: the R, G and B planes, each 32x32 row-major) and
  ``b"filenames"``; ``batches.meta`` holds ``b"label_names"``, ``b"num_cases_per_batch"``
  and ``b"num_vis"``, CIFAR-100's ``meta`` ``b"fine_label_names"`` and
  ``b"coarse_label_names"``.  The N training images are split over the 5 CIFAR-10 batches
  in order (sizes differ by at most one).
* ``svhn/test_32x32.mat`` (scipy ``savemat``, MATLAB 5): ``X`` uint8 ``[32, 32, 3, K]`` and
  ``y`` uint8 ``[K, 1]`` in 1..10 (10 = the digit 0), as the official file.
* Images: each class has its own mean colour (a seeded palette) and every pixel adds
  uniform noise, so a model learns the classes within an epoch or two while the pixels stay
  random; labels are class-balanced, in random order.  The same ``--seed`` and sizes give
  the same bytes.  Defaults are the official sizes (50,000 / 10,000, SVHN 26,032).

The md5 of every file differs from the official one, so loading warns (a reduced copy is
allowed); ``--strict-data`` would refuse them.  The cifar10 suite also evaluates the 75
CIFAR-10-C splits, which it generates from the test images into ``DIR``'s corruption cache
(about 55 CPU-seconds per 10,000 test images, once), and the OOD sets ``svhn`` and
``cifar100``, present when this script wrote them.

The writers (:func:`cifar_batch`, :func:`write_cifar10`, :func:`write_cifar100`,
:func:`write_svhn`) are the ones the tests use for their fixtures
(``tests/helpers/official_files.py``).
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for datasets/
from datasets.py2_pickle import py2_dumps  # noqa: E402  (the official files' encoding)

SIDE = 32
ROW = 3 * SIDE * SIDE  # 3072 bytes per image in a CIFAR batch
OFFICIAL_SIZES = {"train": 50_000, "test": 10_000, "svhn": 26_032}
CIFAR10_LABEL_NAMES = (b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship",
                       b"truck")
NOISE = 48  # pixel = class colour + uniform integer noise in [-NOISE, NOISE]
_UMASK = os.umask(0o022)
os.umask(_UMASK)


# --------------------------------------------------------------------------- official layouts


def cifar_rows(x: np.ndarray) -> np.ndarray:
    """NHWC uint8 images -> the official ``[N, 3072]`` rows (R plane, G plane, B plane)."""
    x = np.asarray(x)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != (SIDE, SIDE, 3):
        raise ValueError(f"expected uint8 images of shape (N, 32, 32, 3), got {x.dtype} {x.shape}")
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2).reshape(len(x), ROW))


def cifar_batch(x, labels, key=b"labels", title=b"training batch 1 of 5", extra: dict | None = None) -> dict:
    """One CIFAR python batch as the official files hold it: ``b"batch_label"``, the labels
    under ``key`` (a list of ints), ``b"data"`` (:func:`cifar_rows`), ``b"filenames"``, then
    ``extra`` (e.g. CIFAR-100's ``b"coarse_labels"``)."""
    batch = {b"batch_label": title, key: [int(v) for v in labels], b"data": cifar_rows(x),
             b"filenames": [f"img_{i:05d}.png".encode() for i in range(len(x))]}
    batch.update(extra or {})
    return batch


def write_file(path: Path | str, data: bytes) -> Path:
    """Write ``data`` to ``path`` (parents created) through a temporary file and a rename, so
    a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # as open() would create it (mkstemp makes it private)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _labels(y, n: int, classes: int, first: int = 0) -> np.ndarray:
    y = np.asarray(y)
    if y.shape != (n,) or y.dtype.kind not in "iu" or (n and (y.min() < first or y.max() >= first + classes)):
        raise ValueError(f"expected {n} integer labels in {first}..{first + classes - 1}, got {y.dtype} {y.shape}")
    return y.astype(np.int64)


def write_cifar10(root: Path | str, x_train, y_train, x_test, y_test, *, binary: bool = False,
                  batches: int = 5) -> list[Path]:
    """CIFAR-10 under ``root`` in the official layout: ``cifar-10-batches-py/`` (``data_batch_1``
    .. ``data_batch_5``, ``test_batch``, ``batches.meta``) or, with ``binary``,
    ``cifar-10-batches-bin/`` (``data_batch_k.bin``, ``test_batch.bin``: records of one label
    byte and 3072 pixel bytes).  The training images go to the ``batches`` files in order."""
    root = Path(root)
    y_train, y_test = _labels(y_train, len(x_train), 10), _labels(y_test, len(x_test), 10)
    parts = np.array_split(np.arange(len(x_train)), batches)
    written = []
    for k, idx in enumerate(parts, 1):
        x, y = x_train[idx], y_train[idx]
        if binary:
            written.append(write_file(root / f"cifar-10-batches-bin/data_batch_{k}.bin",
                                      np.column_stack([y.astype(np.uint8), cifar_rows(x)]).tobytes()))
        else:
            written.append(write_file(root / f"cifar-10-batches-py/data_batch_{k}",
                                      py2_dumps(cifar_batch(x, y, title=f"training batch {k} of {batches}".encode()))))
    if binary:
        written.append(write_file(root / "cifar-10-batches-bin/test_batch.bin",
                                  np.column_stack([y_test.astype(np.uint8), cifar_rows(x_test)]).tobytes()))
    else:
        written.append(write_file(root / "cifar-10-batches-py/test_batch",
                                  py2_dumps(cifar_batch(x_test, y_test, title=b"testing batch 1 of 1"))))
        written.append(write_file(root / "cifar-10-batches-py/batches.meta", py2_dumps(
            {b"label_names": list(CIFAR10_LABEL_NAMES), b"num_cases_per_batch": len(parts[0]), b"num_vis": ROW})))
    return written


def write_cifar100(root: Path | str, x_train, fine_train, x_test, fine_test, *, coarse_train=None,
                   coarse_test=None) -> list[Path]:
    """CIFAR-100 under ``root`` in the official layout: ``cifar-100-python/{train,test,meta}``
    with fine labels (0..99) and coarse labels (0..19; default ``fine // 5``)."""
    root = Path(root)
    written = []
    for split, x, fine, coarse in (("train", x_train, fine_train, coarse_train), ("test", x_test, fine_test, coarse_test)):
        fine = _labels(fine, len(x), 100)
        coarse = fine // 5 if coarse is None else _labels(coarse, len(x), 20)
        written.append(write_file(root / f"cifar-100-python/{split}", py2_dumps(cifar_batch(
            x, fine, key=b"fine_labels", title=f"{split}ing batch 1 of 1".encode(),
            extra={b"coarse_labels": [int(v) for v in coarse]}))))
    written.append(write_file(root / "cifar-100-python/meta", py2_dumps({
        b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
        b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]})))
    return written


def write_svhn(path: Path | str, x, y) -> Path:
    """An SVHN cropped-digits ``.mat`` file as the official ``test_32x32.mat``: ``X`` uint8
    ``[32, 32, 3, K]`` from NHWC images ``x``, ``y`` uint8 ``[K, 1]`` with the stored labels
    ``y`` in 1..10 (10 is the digit 0)."""
    import scipy.io

    x = np.asarray(x)
    cifar_rows(x)  # shape and dtype check
    y = _labels(np.asarray(y).reshape(-1), len(x), 10, first=1).astype(np.uint8).reshape(-1, 1)
    buf = io.BytesIO()
    scipy.io.savemat(buf, {"X": np.ascontiguousarray(x.transpose(1, 2, 3, 0)), "y": y})
    return write_file(path, buf.getvalue())


# --------------------------------------------------------------------------- synthetic images


def class_colours(classes: int, rng: np.random.Generator) -> np.ndarray:
    """One mean RGB colour per class (int16 ``[classes, 3]``, channels in NOISE..255-NOISE)."""
    return rng.integers(NOISE, 256 - NOISE, size=(classes, 3)).astype(np.int16)


def synthetic_images(n: int, colours: np.ndarray, rng: np.random.Generator,
                     chunk: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images (uint8 NHWC) and labels (int64, class-balanced, random order): each
    image is its class colour plus uniform noise in [-NOISE, NOISE] per pixel and channel
    (drawn ``chunk`` images at a time, so memory stays ~2 bytes x chunk x 3072)."""
    classes = len(colours)
    y = rng.permutation(np.arange(n) % classes).astype(np.int64)
    x = np.empty((n, SIDE, SIDE, 3), dtype=np.uint8)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        noise = rng.integers(-NOISE, NOISE + 1, size=(stop - start, SIDE, SIDE, 3), dtype=np.int16)
        x[start:stop] = np.clip(noise + colours[y[start:stop]][:, None, None, :], 0, 255).astype(np.uint8)
    return x, y


def write_synthetic(root: Path | str, *, train: int = OFFICIAL_SIZES["train"], test: int = OFFICIAL_SIZES["test"],
                    classes: Sequence[int] = (10, 100), svhn: int = OFFICIAL_SIZES["svhn"],
                    seed: int = 0) -> dict[str, dict]:
    """Write synthetic CIFAR-10 (``10 in classes``), CIFAR-100 (``100 in classes``), each with
    ``train`` / ``test`` images, and an SVHN test file of ``svhn`` images (0: none) under
    ``root``.  Returns what was written: ``{"cifar10": {"x_train", "y_train", "x_test",
    "y_test", "files"}, "cifar100": {...}, "svhn": {"x", "y", "files"}}`` (``y`` of SVHN as
    stored, 1..10)."""
    root = Path(root)
    if train < 10 or test < 1 or svhn < 0:
        raise ValueError(f"need --train >= 10 (5 batches, every class), --test >= 1, --svhn >= 0; "
                         f"got {train}, {test}, {svhn}")
    unknown = sorted(set(classes) - {10, 100})
    if unknown or not classes:
        raise ValueError(f"classes must be 10 and/or 100, got {list(classes)}")
    out: dict[str, dict] = {}
    for k, c in enumerate(sorted(set(classes))):
        rng = np.random.default_rng([seed, c])
        colours = class_colours(c, rng)
        x_train, y_train = synthetic_images(train, colours, rng)
        x_test, y_test = synthetic_images(test, colours, rng)
        write = write_cifar10 if c == 10 else write_cifar100
        files = write(root, x_train, y_train, x_test, y_test)
        out[f"cifar{c}"] = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test, "files": files}
    if svhn:
        rng = np.random.default_rng([seed, 1])
        x, digits = synthetic_images(svhn, class_colours(10, rng), rng)
        y = np.where(digits == 0, 10, digits)  # SVHN stores the digit 0 as label 10
        out["svhn"] = {"x": x, "y": y, "files": [write_svhn(root / "svhn/test_32x32.mat", x, y)]}
    return out


def _classes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or set(values) - {10, 100}:
        raise argparse.ArgumentTypeError(f"expected 10, 100 or 10,100, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    from bench.run.flags import int_at_least

    _count = int_at_least(0)
    p = argparse.ArgumentParser(
        description="Write synthetic CIFAR-10/100 and SVHN files in the official layout and encoding under DIR "
                    "(a --data-root for run_suite.py).")
    p.add_argument("root", type=Path, metavar="DIR", help="data root to write into (created if needed)")
    p.add_argument("--train", type=_count, default=OFFICIAL_SIZES["train"],
                   help="training images per CIFAR family (default: 50000, the official size)")
    p.add_argument("--test", type=_count, default=OFFICIAL_SIZES["test"],
                   help="test images per CIFAR family (default: 10000)")
    p.add_argument("--classes", type=_classes, default=(10, 100),
                   help="which families: 10 (cifar-10-batches-py), 100 (cifar-100-python) or 10,100 (default: both; "
                        "each suite uses the other as an OOD set)")
    p.add_argument("--svhn", type=_count, default=OFFICIAL_SIZES["svhn"],
                   help="images in svhn/test_32x32.mat (default: 26032, the official size; 0: no SVHN file)")
    p.add_argument("--seed", type=_count, default=0, help="random seed (default: 0); same seed and sizes, same bytes")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = write_synthetic(args.root, train=args.train, test=args.test, classes=args.classes, svhn=args.svhn,
                              seed=args.seed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, d in out.items():
        sizes = (f"{len(d['x_train'])} train, {len(d['x_test'])} test" if "x_train" in d else f"{len(d['x'])} test")
        print(f"{name}: {sizes} images -> " + ", ".join(str(Path(f).relative_to(args.root)) for f in d["files"]))
    print(f"data root {args.root}: synthetic files (md5s differ from the official ones: loading warns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
