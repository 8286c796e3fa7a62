"""Small data files in exactly the official formats, written by the tests that read them
back: CIFAR-10/100 (Python-2 pickles or binary batches), CIFAR-10-C ``.npy`` files, an SVHN
``.mat`` file, a folder of PNG/JPEG/BMP images and the CoLA ``cola_public`` TSV files.

The CIFAR/SVHN layouts live in ``benchmarks/synthetic_cifar.py``, shared with the
synthetic-data benchmark, and the official files' pickle encoding in
``datasets/py2_pickle.py``, so that each format is written in one place."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from tests.helpers import import_benchmarks

import_benchmarks()
import synthetic_cifar  # noqa: E402  (the official-format writers, shared with benchmarks/)
from datasets.py2_pickle import py2_dumps  # noqa: E402
from synthetic_cifar import cifar_batch  # noqa: E402

__all__ = ["cifar_batch", "py2_dumps", "rows_of", "write"]

rows_of = synthetic_cifar.cifar_rows  # NHWC -> the official [N, 3072] rows (R plane, G plane, B plane)
write = synthetic_cifar.write_file
PER_BATCH, N_TEST = 40, 30  # CIFAR-10 fixture: 5 x 40 train (20 per class), 30 test
C100_TRAIN, C100_TEST = 200, 50
N_SVHN = 12


def images(n: int, seed: int) -> np.ndarray:
    """``n`` random (hence distinct) NHWC uint8 images."""
    return np.random.default_rng(seed).integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)


def labels_cycle(n: int, k: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.arange(n) % k).astype(np.int64)


def write_cifar10(root: Path, *, binary: bool = False) -> dict:
    """Official CIFAR-10 layout (python pickles, or the binary batches); returns the arrays."""
    xs, ys = zip(*[(images(PER_BATCH, k), labels_cycle(PER_BATCH, 10, k)) for k in range(1, 6)])
    out = {"x_train": np.concatenate(xs), "y_train": np.concatenate(ys),
           "x_test": images(N_TEST, 10), "y_test": labels_cycle(N_TEST, 10, 10)}
    synthetic_cifar.write_cifar10(root, out["x_train"], out["y_train"], out["x_test"], out["y_test"], binary=binary)
    return out


def write_cifar100(root: Path) -> dict:
    out = {}
    for split, n, seed in (("train", C100_TRAIN, 20), ("test", C100_TEST, 21)):
        x, fine = images(n, seed), labels_cycle(n, 100, seed)
        out[f"x_{split}"], out[f"y_{split}"], out[f"coarse_{split}"] = x, fine, fine // 5
    synthetic_cifar.write_cifar100(root, out["x_train"], out["y_train"], out["x_test"], out["y_test"],
                                   coarse_train=out["coarse_train"], coarse_test=out["coarse_test"])
    return out


def write_corruptions(directory: Path, x_test: np.ndarray, y_test: np.ndarray, names=("brightness", "gaussian_noise")) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for i, name in enumerate(names):
        x = np.concatenate([np.clip(x_test.astype(int) + 10 * (s + 1) * (i + 1), 0, 255).astype(np.uint8) for s in range(5)])
        np.save(directory / f"{name}.npy", x)
        out[name] = x
    np.save(directory / "labels.npy", np.tile(y_test, 5))
    return out


def write_svhn(path: Path) -> dict:
    x = images(N_SVHN, 30)
    y = np.array([10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 3], dtype=np.uint8).reshape(-1, 1)
    synthetic_cifar.write_svhn(path, x, y)
    return {"x": x, "y": y}


def write_image_folder(directory: Path) -> list[str]:
    """Mixed sizes, modes and formats; returns the image paths in sorted order."""
    sub = directory / "b_sub"
    sub.mkdir(parents=True)
    Image.new("RGB", (40, 20), (200, 10, 10)).save(directory / "a.png")
    Image.new("L", (25, 25), 77).save(directory / "c_gray.PNG")
    Image.new("RGBA", (32, 48), (0, 0, 255, 128)).save(sub / "d_rgba.png")
    Image.new("RGB", (30, 50), (90, 160, 30)).save(sub / "e.jpg", quality=95)
    Image.new("RGB", (16, 16), (1, 2, 3)).save(directory / "f.bmp")
    (directory / "notes.txt").write_text("not an image")
    return ["a.png", "b_sub/d_rgba.png", "b_sub/e.jpg", "c_gray.PNG", "f.bmp"]


def write_cola(root: Path) -> None:
    """Official cola_public 1.1 layout: no header, 4 tab-separated columns, a sentence with
    a double quote (why quoting must be disabled), marks such as ``*`` and ``?*``."""
    raw = root / "cola_public" / "raw"
    raw.mkdir(parents=True)
    train = [f"gj04\t{i % 2}\t{'' if i % 2 else '*'}\tSentence number {i} is here." for i in range(40)]
    train[3] = 'bc01\t1\t\tShe said "hello" to them.'
    (raw / "in_domain_train.tsv").write_text("\n".join(train) + "\n")
    (raw / "in_domain_dev.tsv").write_text("gj04\t1\t\tThe dev one.\nks08\t0\t?*\tDev two the.\n")
    (raw / "out_of_domain_dev.tsv").write_text("clc95\t1\t\tAn out-of-domain one.\nc-05\t0\t*\tOod two.\n")
