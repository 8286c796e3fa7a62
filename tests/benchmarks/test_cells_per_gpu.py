"""benchmarks/synthetic_cifar.py (official-format synthetic CIFAR/SVHN files) read back
through the repository's CIFAR loader, and a tiny CPU run of benchmarks/cells_per_gpu.py."""
from __future__ import annotations

import math
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import import_benchmarks

import_benchmarks()

import cells_per_gpu  # noqa: E402
import synthetic_cifar  # noqa: E402
from bench.data import OOD_LABEL, configure_data  # noqa: E402
from bench.config.options import parse  # noqa: E402
from bench.core.registry import DATASETS  # noqa: E402
from datasets import cifar, formats  # noqa: E402  (registers cifar10 and cifar100)


def load(root: Path, name: str, **options):
    """A registered CIFAR data set from ``root``, as ``run_suite.py --data-root root`` loads it."""
    cls = DATASETS.get(name)
    configure_data(root)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", formats.DataFileWarning)  # synthetic files: md5s differ
            return cls.load(parse(cls.Options, options))
    finally:
        configure_data(None)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    return root, synthetic_cifar.write_synthetic(root, train=120, test=40, classes=(10, 100), svhn=15, seed=3)


def test_synthetic_files_round_trip_through_the_cifar_loader(written):
    root, d = written
    c10, c100, svhn = d["cifar10"], d["cifar100"], d["svhn"]
    bundle = load(root, "cifar10")
    train_idx, val_idx = cifar.val_split_indices(c10["y_train"], 0.1)
    for split, x, y in (("train", c10["x_train"][train_idx], c10["y_train"][train_idx]),
                        ("val", c10["x_train"][val_idx], c10["y_train"][val_idx]),
                        ("test", c10["x_test"], c10["y_test"])):
        s = bundle.get(split)
        np.testing.assert_array_equal(s.x, x, err_msg=split)
        np.testing.assert_array_equal(s.y, y, err_msg=split)
    # the OOD sets of the cifar10 suite: SVHN and CIFAR-100's test images, pixel for pixel
    np.testing.assert_array_equal(bundle.get("ood/svhn").x, svhn["x"])
    np.testing.assert_array_equal(bundle.get("ood/cifar100").x, c100["x_test"])
    assert (bundle.get("ood/svhn").y == OOD_LABEL).all()
    # CIFAR-100 as the in-distribution set (fine labels), and the raw files' other keys
    b100 = load(root, "cifar100")
    np.testing.assert_array_equal(b100.get("test").x, c100["x_test"])
    np.testing.assert_array_equal(b100.get("test").y, c100["y_test"])
    _, coarse = formats.read_cifar_pickle(root / "cifar-100-python/train", b"coarse_labels")
    np.testing.assert_array_equal(coarse, c100["y_train"] // 5)
    assert formats.read_cifar_meta(root / "cifar-10-batches-py/batches.meta", b"label_names")[0] == "airplane"
    assert len(formats.read_cifar_meta(root / "cifar-100-python/meta", b"fine_label_names")) == 100
    _, y_svhn = formats.read_svhn_mat(root / "svhn/test_32x32.mat")
    np.testing.assert_array_equal(y_svhn, np.where(svhn["y"] == 10, 0, svhn["y"]))
    # the layout: 5 training batches that together hold the training images in order
    parts = [formats.read_cifar_pickle(root / f"cifar-10-batches-py/data_batch_{k}", b"labels") for k in range(1, 6)]
    assert [len(y) for _, y in parts] == [24] * 5
    np.testing.assert_array_equal(np.concatenate([x for x, _ in parts]), c10["x_train"])


def test_synthetic_classes_are_learnable_and_the_bytes_reproducible(written, tmp_path):
    root, d = written
    c10 = d["cifar10"]
    assert np.bincount(c10["y_train"], minlength=10).tolist() == [12] * 10  # balanced
    means = np.stack([c10["x_train"][c10["y_train"] == c].mean(axis=(0, 1, 2)) for c in range(10)])
    pred = np.argmin(((c10["x_test"].mean(axis=(1, 2))[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == c10["y_test"]).mean() >= 0.9  # the nearest class colour already tells the classes apart
    again = tmp_path / "again"
    assert synthetic_cifar.main([str(again), "--train", "120", "--test", "40", "--classes", "10", "--svhn", "0",
                                 "--seed", "3"]) == 0
    for name in ("data_batch_1", "data_batch_5", "test_batch", "batches.meta"):
        rel = f"cifar-10-batches-py/{name}"
        assert (again / rel).read_bytes() == (root / rel).read_bytes(), rel
    assert not (again / "cifar-100-python").exists() and not (again / "svhn").exists()
    assert synthetic_cifar.main([str(tmp_path / "bad"), "--train", "3"]) == 2


def test_suite_file_is_the_cifar10_recipe_on_the_paper_preset(tmp_path):
    args = cells_per_gpu.parse_args(["--cells", "3", "--dim", "16", "--compile", "off", "--all-splits"])
    suite = tomllib.loads(cells_per_gpu.suite_text(args))
    with open(Path(cells_per_gpu.ROOT) / "bench/suites/cifar10.toml", "rb") as f:
        ref = tomllib.load(f)
    assert suite["seeds"] == [0, 1, 2]
    assert suite["model"] == {"preset": "vit_cifar_paper", "dim": 16}
    assert suite["train"] == {**ref["train"], "compile": False}
    assert suite["datasets"]["cifar10"]["splits"] == ref["datasets"]["cifar10"]["splits"]
    assert list(suite["methods"]) == ["msp"]
    assert tomllib.loads(cells_per_gpu.suite_text(cells_per_gpu.parse_args([])))["datasets"]["cifar10"]["splits"] == ["test"]


def table_rows(report: str) -> list[list[str]]:
    lines = [line for line in report.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_cells_per_gpu_runs_on_cpu(tmp_path):
    work, out = tmp_path / "work", tmp_path / "cells.md"
    report, ok = cells_per_gpu.run(["--device", "cpu", "--k", "1,2", "--cells", "2", "--epochs", "1", "--dim", "16",
                                    "--depth", "1", "--heads", "2", "--patch-size", "8", "--train", "256", "--test", "64",
                                    "--work", str(work), "--out", str(out)])
    assert ok and out.read_text() == report
    assert report.startswith("# Cells per CPU worker") and "CPU smoke run, not a GPU measurement" in report
    assert "cuda" not in report.lower()
    rows = table_rows(report)
    assert [r[0] for r in rows] == ["1", "2"]
    for r in rows:
        assert r[2] == "2/2"
        wall, per_hour = float(r[3].replace(",", "")), float(r[4].replace(",", ""))
        assert wall > 0 and math.isfinite(per_hour) and per_hour > 0
        assert math.isclose(per_hour, 2 / wall * 3600, rel_tol=0.01)
    assert rows[0][-1] == "1.00x"
    for k in (1, 2):  # every cell of every store is complete (manifest and sha256 checked)
        done, problems = cells_per_gpu.read_store(work / f"results_k{k}" / cells_per_gpu.SUITE_NAME)
        assert len(done) == 2 and not problems
        assert sorted(c.record.seed for c in done) == [0, 1] and all(c.record.device == "cpu" for c in done)
        assert all(c.record.train_seconds > 0 for c in done)
