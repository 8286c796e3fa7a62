"""datasets.formats and datasets.cifar on small files written in exactly the official formats:
Python-2 protocol-2 CIFAR pickles, CIFAR-10 binary batches, CIFAR-10-C .npy files, an SVHN
.mat file and a folder of PNG/JPEG/BMP images.  Nothing here touches the network."""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import pickletools
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

from bench.data import OOD_LABEL, configure_data, data_root, set_data_root
from bench.core.errors import ConfigError
from bench.config.options import parse
from bench.core.registry import DATASETS
from bench.data import CORRUPTIONS
from datasets import cifar, formats  # importing cifar registers cifar10 and cifar100

from tests.helpers.official_files import (N_SVHN, N_TEST, cifar_batch, images, labels_cycle, py2_dumps, rows_of,
                                          write, write_cifar10, write_cifar100, write_corruptions, write_image_folder,
                                          write_svhn)


# --------------------------------------------------------------------------- shared roots


@pytest.fixture(scope="module")
def full_root(tmp_path_factory):
    """A data root with everything: CIFAR-10 (python), CIFAR-100, CIFAR-10-C, CIFAR-100-C,
    SVHN and one OOD image folder."""
    root = tmp_path_factory.mktemp("data")
    c10, c100 = write_cifar10(root), write_cifar100(root)
    c10c = write_corruptions(root / "CIFAR-10-C", c10["x_test"], c10["y_test"])
    c100c = write_corruptions(root / "CIFAR-100-C", c100["x_test"], c100["y_test"], names=("contrast",))
    svhn = write_svhn(root / "svhn/test_32x32.mat")
    write_image_folder(root / "ood/textures")
    return root, {"c10": c10, "c100": c100, "c10c": c10c, "c100c": c100c, "svhn": svhn}


@pytest.fixture
def use_root(request):
    """Point ``bench.data.data_root()`` at a directory for one test, and restore it after."""
    request.addfinalizer(lambda: configure_data(None))
    return set_data_root


def load(name: str, *, download: bool = False, strict: bool = False, **options):
    """Load a registered data set with the run-time data settings ``--download`` /
    ``--strict-data``; md5 warnings (fixtures are not the official files) are collected
    and returned."""
    cls = DATASETS.get(name)
    root = data_root()
    configure_data(root, download=download, strict=strict)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            bundle = cls.load(parse(cls.Options, options))
    finally:
        configure_data(root)
    return bundle, [w for w in caught if issubclass(w.category, formats.DataFileWarning)]


def image_set(x: np.ndarray) -> set[bytes]:
    return {img.tobytes() for img in x}


# --------------------------------------------------------------------------- fixture encoding


def test_fixture_pickles_are_encoded_like_the_official_files(full_root):
    root, _ = full_root
    data = (root / "cifar-10-batches-py/data_batch_1").read_bytes()
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(data)]
    names = {n for n, _ in ops}
    assert data[:2] == b"\x80\x02"  # protocol 2
    assert "SHORT_BINSTRING" in names and "BINSTRING" in names
    assert not names & {"SHORT_BINBYTES", "BINBYTES", "BINUNICODE", "SHORT_BINUNICODE", "STACK_GLOBAL"}
    assert {a for n, a in ops if n == "GLOBAL"} == {"numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"}


# --------------------------------------------------------------------------- CIFAR readers


def test_read_cifar_pickle_gives_nhwc_from_the_rgb_planes(tmp_path):
    r = np.arange(1024).reshape(32, 32) % 251
    g, b = (r * 3 + 1) % 256, (r * 7 + 2) % 256
    row = np.concatenate([r.ravel(), g.ravel(), b.ravel()]).astype(np.uint8)  # built by hand, not with rows_of
    path = write(tmp_path / "data_batch_1", py2_dumps({b"data": row[None], b"labels": [7], b"batch_label": b"x",
                                                       b"filenames": [b"a.png"]}))
    x, y = formats.read_cifar_pickle(path, b"labels")
    assert x.shape == (1, 32, 32, 3) and x.dtype == np.uint8 and y.dtype == np.int64
    assert y.tolist() == [7]
    for (i, j) in [(0, 0), (0, 1), (1, 0), (17, 29)]:
        assert x[0, i, j].tolist() == [r[i, j], g[i, j], b[i, j]], (i, j)
        assert x[0, i, j, 0] != x[0, i, j, 1] or (i, j) == (0, 0)


def test_cifar10_and_100_files_read_back_exactly(full_root):
    root, d = full_root
    x, y = formats.read_cifar_pickle(root / "cifar-10-batches-py/test_batch", "labels")
    np.testing.assert_array_equal(x, d["c10"]["x_test"])
    np.testing.assert_array_equal(y, d["c10"]["y_test"])
    x, y = formats.read_cifar_pickle(root / "cifar-100-python/train", b"fine_labels")
    np.testing.assert_array_equal(x, d["c100"]["x_train"])
    np.testing.assert_array_equal(y, d["c100"]["y_train"])
    _, coarse = formats.read_cifar_pickle(root / "cifar-100-python/train", b"coarse_labels")
    np.testing.assert_array_equal(coarse, d["c100"]["coarse_train"])
    assert formats.read_cifar_meta(root / "cifar-10-batches-py/batches.meta", b"label_names")[:2] == ["airplane", "automobile"]
    names = formats.read_cifar_meta(root / "cifar-100-python/meta", "fine_label_names")
    assert len(names) == 100 and names[0] == "fine0"


def test_read_cifar10_binary(tmp_path):
    x, y = images(7, 1), labels_cycle(7, 10, 1)
    path = write(tmp_path / "data_batch_1.bin", np.column_stack([y.astype(np.uint8), rows_of(x)]).tobytes())
    bx, by = formats.read_cifar10_binary(path)
    np.testing.assert_array_equal(bx, x)
    np.testing.assert_array_equal(by, y)
    short = write(tmp_path / "short.bin", path.read_bytes()[:-5])
    with pytest.raises(ConfigError, match=r"short\.bin.*truncated"):
        formats.read_cifar10_binary(short)
    bad = bytearray(path.read_bytes())
    bad[3073] = 10  # second record's label
    with pytest.raises(ConfigError, match=r"bad\.bin.*contains 10, out of range"):
        formats.read_cifar10_binary(write(tmp_path / "bad.bin", bytes(bad)))


class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_malicious_pickle_is_refused_without_running(tmp_path, use_root):
    target = tmp_path / "pwned"
    payload = py2_dumps({b"data": Evil(target), b"labels": [1]})  # encoded like the real files
    assert b"csystem\n" in payload or b"cposix\nsystem\n" in payload
    path = write(tmp_path / "data_batch_1", payload)
    with pytest.raises(ConfigError, match=r"data_batch_1.*refusing to load global \w+\.system"):
        formats.read_cifar_pickle(path, b"labels")
    assert not target.exists()
    # through the registered data set as well: the file is never executed
    write_cifar10(tmp_path / "root")
    write(tmp_path / "root/cifar-10-batches-py/data_batch_3", payload)
    use_root(tmp_path / "root")
    with pytest.raises(ConfigError, match=r"data_batch_3.*system"):
        load("cifar10")
    assert not target.exists()
    pickle.loads(payload)  # control: the payload is live, the stock unpickler runs it
    assert target.exists()


def _good_batch():
    return cifar_batch(images(4, 0), [0, 1, 2, 3])


@pytest.mark.parametrize(
    "case, make, message",
    [
        ("truncated", lambda: py2_dumps(_good_batch())[:5000], "truncated or corrupt"),
        ("empty", lambda: b"", "truncated or corrupt"),
        ("wrong_shape", lambda: py2_dumps({**_good_batch(), b"data": np.zeros((4, 3000), np.uint8)}), r"shape \(N, 3072\)"),
        ("wrong_dtype", lambda: py2_dumps({**_good_batch(), b"data": np.zeros((4, 3072), np.float32)}), "uint8"),
        ("label_range", lambda: py2_dumps({**_good_batch(), b"labels": [0, 1, 10, 3]}), r"contains 10, out of range \(expected 0\.\.9\)"),
        ("negative_label", lambda: py2_dumps({**_good_batch(), b"labels": [0, -1, 2, 3]}), "contains -1"),
        ("label_count", lambda: py2_dumps({**_good_batch(), b"labels": [0, 1]}), r"shape \(2,\), expected \(4,\)"),
        ("missing_labels", lambda: py2_dumps({k: v for k, v in _good_batch().items() if k != b"labels"}), "missing key b'labels'"),
        ("missing_data", lambda: py2_dumps({k: v for k, v in _good_batch().items() if k != b"data"}), "missing key b'data'"),
        ("not_a_dict", lambda: py2_dumps([1, 2]), "expected a dict"),
    ],
)
def test_bad_cifar_pickles_raise_config_error_naming_the_file(tmp_path, case, make, message):
    path = write(tmp_path / f"batch_{case}", make())
    with pytest.raises(ConfigError, match=message) as info:
        formats.read_cifar_pickle(path, b"labels")
    assert str(path) in str(info.value)


def test_cifar100_label_range_uses_the_label_key(tmp_path):
    path = write(tmp_path / "train", py2_dumps(cifar_batch(images(2, 0), [5, 99], key=b"fine_labels",
                                                          extra={b"coarse_labels": [1, 20]})))
    assert formats.read_cifar_pickle(path, b"fine_labels")[1].tolist() == [5, 99]
    with pytest.raises(ConfigError, match=r"train.*contains 20.*0\.\.19"):
        formats.read_cifar_pickle(path, b"coarse_labels")
    with pytest.raises(ConfigError, match="missing key b'label_names'"):
        formats.read_cifar_meta(path, b"label_names")


# --------------------------------------------------------------------------- CIFAR-C, SVHN, image folders


def test_read_corruption_npy(full_root, tmp_path):
    root, d = full_root
    x, y = formats.read_corruption_npy(root / "CIFAR-10-C", "brightness", num_classes=10)
    assert x.shape == (5 * N_TEST, 32, 32, 3) and x.dtype == np.uint8 and y.dtype == np.int64
    np.testing.assert_array_equal(x, d["c10c"]["brightness"])
    rows = formats.severity_rows(len(x), 3)
    assert (rows.start, rows.stop) == (2 * N_TEST, 3 * N_TEST)
    np.testing.assert_array_equal(y[rows], d["c10"]["y_test"])
    assert formats.severity_rows(50000, 5) == slice(40000, 50000)

    bad = tmp_path / "bad"
    bad.mkdir()
    np.save(bad / "labels.npy", np.zeros(12, np.int64))
    np.save(bad / "rows.npy", np.zeros((12, 32, 32, 3), np.uint8))  # not a multiple of 5
    np.save(bad / "shape.npy", np.zeros((10, 32, 32), np.uint8))
    np.save(bad / "objects.npy", np.array([{"a": 1}] * 10, dtype=object), allow_pickle=True)
    (bad / "cut.npy").write_bytes((root / "CIFAR-10-C/brightness.npy").read_bytes()[:4000])
    for name, msg in [("rows", "multiple of 5"), ("shape", r"shape \(M, 32, 32, 3\)"),
                      ("objects", "truncated or corrupt"), ("cut", "truncated or corrupt"), ("absent", "not found")]:
        with pytest.raises(ConfigError, match=msg) as info:
            formats.read_corruption_npy(bad, name)
        assert f"{name}.npy" in str(info.value)
    np.save(bad / "ten.npy", np.zeros((10, 32, 32, 3), np.uint8))
    with pytest.raises(ConfigError, match=r"labels\.npy.*expected \(10,\)"):
        formats.read_corruption_npy(bad, "ten")


def test_read_svhn_mat_maps_10_to_0(full_root, tmp_path):
    root, d = full_root
    x, y = formats.read_svhn_mat(root / "svhn/test_32x32.mat")
    assert x.shape == (N_SVHN, 32, 32, 3) and x.dtype == np.uint8 and y.dtype == np.int64
    np.testing.assert_array_equal(x, d["svhn"]["x"])
    assert x[0, 1, 2].tolist() == d["svhn"]["x"][0, 1, 2].tolist()
    assert y.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 3]
    scipy.io.savemat(tmp_path / "no_y.mat", {"X": d["svhn"]["x"].transpose(1, 2, 3, 0)})
    with pytest.raises(ConfigError, match=r"no_y\.mat: missing variable 'y'"):
        formats.read_svhn_mat(tmp_path / "no_y.mat")
    scipy.io.savemat(tmp_path / "zero.mat", {"X": d["svhn"]["x"].transpose(1, 2, 3, 0), "y": np.zeros((N_SVHN, 1), np.uint8)})
    with pytest.raises(ConfigError, match=r"zero\.mat.*contains 0.*1\.\.10"):
        formats.read_svhn_mat(tmp_path / "zero.mat")
    write(tmp_path / "cut.mat", (root / "svhn/test_32x32.mat").read_bytes()[:300])
    with pytest.raises(ConfigError, match=r"cut\.mat"):
        formats.read_svhn_mat(tmp_path / "cut.mat")


def test_read_image_folder(tmp_path):
    order = write_image_folder(tmp_path / "imgs")
    assert [p.relative_to(tmp_path / "imgs").as_posix() for p in formats.image_files(tmp_path / "imgs")] == order
    x = formats.read_image_folder(tmp_path / "imgs", 16)
    assert x.shape == (5, 16, 16, 3) and x.dtype == np.uint8
    assert (x[0] == [200, 10, 10]).all()  # a.png, 40x20 -> centre 20x20 -> 16x16
    assert (x[3] == 77).all()  # grayscale -> RGB
    assert (x[4] == [1, 2, 3]).all()  # BMP, upscaled
    assert np.abs(x[2].astype(int) - [90, 160, 30]).max() <= 3  # JPEG, lossy
    assert formats.read_image_folder(tmp_path / "imgs", 8, limit=2).shape == (2, 8, 8, 3)

    # the crop is centred: only the middle square of a wide image survives
    wide = np.zeros((32, 64, 3), np.uint8)
    wide[:, :16] = (255, 0, 0)
    wide[:, 16:48] = (0, 255, 0)
    wide[:, 48:] = (0, 0, 255)
    (tmp_path / "wide").mkdir()
    Image.fromarray(wide).save(tmp_path / "wide/w.png")
    assert (formats.read_image_folder(tmp_path / "wide", 8) == (0, 255, 0)).all()

    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="empty: no image files"):
        formats.read_image_folder(tmp_path / "empty", 8)
    write(tmp_path / "broken/x.png", b"\x89PNG not really")
    with pytest.raises(ConfigError, match=r"x\.png: cannot be read as an image"):
        formats.read_image_folder(tmp_path / "broken", 8)


# --------------------------------------------------------------------------- md5, missing data


def test_check_md5(tmp_path):
    path = write(tmp_path / "data_batch_1", b"reduced copy")
    actual = hashlib.md5(b"reduced copy").hexdigest()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert formats.check_md5(path, actual, strict=True)
    expected = formats.OFFICIAL_MD5["cifar-10-batches-py/data_batch_1"]
    with pytest.warns(formats.DataFileWarning) as record:
        assert formats.check_md5(path, expected, strict=False) is False
    msg = str(record[0].message)
    assert str(path) in msg and expected in msg and actual in msg
    with pytest.raises(ConfigError, match=f"data_batch_1: md5 {actual} differs .* {expected}.*strict"):
        formats.check_md5(path, expected, strict=True)


def test_official_md5_table():
    assert formats.OFFICIAL_MD5["cifar-10-batches-py/test_batch"] == "40351d587109b95175f43aff81a1287e"
    assert formats.OFFICIAL_MD5["cifar-100-python/train"] == "16019d7e3df5f24257cddd939b257f8d"
    assert formats.OFFICIAL_MD5["svhn/test_32x32.mat"] == "eb5a983be6a315427106f1b164d9cef3"
    # published with the official archives (torchtext's CoLA and IMDB loaders use the same)
    assert formats.OFFICIAL_MD5["cola_public_1.1.zip"] == "9f6d88c3558ec424cd9d66ea03589aba"
    assert formats.OFFICIAL_MD5["aclImdb_v1.tar.gz"] == "7c2ac02c03563afcf9b574c7e56c153a"


def test_missing_data_names_files_directory_and_both_remedies(tmp_path, use_root):
    use_root(tmp_path)
    for name, files in [("cifar10", ["cifar-10-batches-py/data_batch_1", "cifar-10-batches-py/data_batch_5",
                                     "cifar-10-batches-py/test_batch"]),
                        ("cifar100", ["cifar-100-python/train", "cifar-100-python/test"])]:
        with pytest.raises(ConfigError) as info:
            load(name)
        msg = str(info.value)
        assert all(f in msg for f in files), msg
        assert str(tmp_path) in msg and "--data-root DIR" in msg and "--download" in msg
        assert "official files" in msg
    assert not any(tmp_path.iterdir())  # nothing downloaded or created
    err = formats.missing_data_error("x", ["a/b"], "/somewhere")
    assert isinstance(err, ConfigError) and "a/b" in str(err) and "/somewhere" in str(err)


# --------------------------------------------------------------------------- split rules


def test_val_split_is_ten_percent_per_class_evenly_spaced_and_deterministic():
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 50))
    train, val = cifar.val_split_indices(labels, 0.1)
    assert len(np.intersect1d(train, val)) == 0 and len(train) + len(val) == 500
    assert np.bincount(labels[val]).tolist() == [5] * 10
    for c in range(10):  # every 10th image of the class, from its first
        np.testing.assert_array_equal(val[labels[val] == c], np.flatnonzero(labels == c)[::10])
    again = cifar.val_split_indices(labels.copy(), 0.1)
    np.testing.assert_array_equal(again[1], val)
    _, val25 = cifar.val_split_indices(labels, 0.25)
    assert np.bincount(labels[val25]).tolist() == [13] * 10  # round(12.5) = 13 (half up)


def test_balanced_subset_keeps_file_order_and_class_balance():
    labels = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2])
    idx = cifar.balanced_subset(labels, 6)
    assert (np.diff(idx) > 0).all() and len(idx) == 6
    assert sorted(np.bincount(labels[idx]).tolist()) == [1, 2, 3]  # proportional to 4, 2, 6
    assert cifar.balanced_subset(labels, None).tolist() == list(range(12))


# --------------------------------------------------------------------------- registered data sets


def test_options_defaults_and_validation():
    o10, o100 = DATASETS.get("cifar10").Options(), DATASETS.get("cifar100").Options()
    assert (o10.val_fraction, o10.train_limit, o10.eval_limit) == (0.1, None, None)
    assert o10.ood == ("svhn", "cifar100") and o100.ood == ("svhn", "cifar10")
    for bad, msg in [({"val_fraction": 1.0}, "val_fraction"), ({"val_fraction": 0}, "val_fraction"),
                     ({"ood": ["cifar10"]}, "own OOD"), ({"ood": ["a/b"]}, "valid OOD set name"),
                     ({"eval_limit": 0}, "eval_limit"), ({"download": True}, "unknown key")]:
        with pytest.raises(ConfigError, match=msg):
            parse(DATASETS.get("cifar10").Options, bad)


def generated_shifts(official: tuple[str, ...]) -> list[str]:
    """The corruption-engine splits a bundle adds for corruptions without an official file."""
    return [f"shift/{c}/{s}" for c in CORRUPTIONS if c not in official for s in range(1, 6)]


def test_cifar10_end_to_end(full_root, use_root):
    root, d = full_root
    use_root(root)
    bundle, warned = load("cifar10")
    shifts = [f"shift/{c}/{s}" for c in ("gaussian_noise", "brightness") for s in range(1, 6)]  # canonical order
    assert bundle.split_names() == ["train", "val", "test", "ood/svhn", "ood/cifar100", "ood/textures", *shifts,
                                    *generated_shifts(("gaussian_noise", "brightness"))]
    assert (bundle.name, bundle.num_classes, bundle.image_shape) == ("cifar10", 10, (32, 32, 3))
    assert bundle.mean == (0.4914, 0.4822, 0.4465) and bundle.std == (0.2023, 0.1994, 0.2010)
    # every fixture file read differs from the official one: one warning each, naming it
    # (5 train batches, test_batch, batches.meta, SVHN, CIFAR-100 test)
    assert len(warned) == 9 and all("differs from the official" in str(w.message) for w in warned)
    assert {str(w.message).split(":")[0] for w in warned} == {
        str(root / rel) for rel in formats.OFFICIAL_MD5 if rel.startswith("cifar-10-batches-py/")
    } | {str(root / "svhn/test_32x32.mat"), str(root / "cifar-100-python/test")}

    train, val, test = (bundle.get(n) for n in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (180, 20, N_TEST)
    assert np.bincount(val.y).tolist() == [2] * 10 and np.bincount(train.y).tolist() == [18] * 10
    assert not image_set(train.x) & image_set(val.x)
    assert image_set(train.x) | image_set(val.x) == image_set(d["c10"]["x_train"])
    np.testing.assert_array_equal(test.x, d["c10"]["x_test"])
    np.testing.assert_array_equal(test.y, d["c10"]["y_test"])

    np.testing.assert_array_equal(bundle.get("ood/cifar100").x, d["c100"]["x_test"])
    np.testing.assert_array_equal(bundle.get("ood/svhn").x, d["svhn"]["x"])
    assert bundle.get("ood/textures").x.shape == (5, 32, 32, 3)
    for name in ("ood/svhn", "ood/cifar100", "ood/textures"):
        assert (bundle.get(name).y == OOD_LABEL).all()
    s = bundle.get("shift/brightness/2")
    np.testing.assert_array_equal(s.x, d["c10c"]["brightness"][N_TEST : 2 * N_TEST])
    np.testing.assert_array_equal(s.y, d["c10"]["y_test"])

    again, _ = load("cifar10")  # deterministic
    np.testing.assert_array_equal(again.get("val").x, val.x)
    np.testing.assert_array_equal(again.get("train").y, train.y)


def test_limits_and_ood_selection(full_root, use_root):
    root, d = full_root
    use_root(root)
    bundle, _ = load("cifar10", train_limit=30, eval_limit=10, ood=["textures"])
    assert bundle.split_names()[:4] == ["train", "val", "test", "ood/textures"]
    assert not any(n in bundle.split_names() for n in ("ood/svhn", "ood/cifar100"))
    assert np.bincount(bundle.get("train").y).tolist() == [3] * 10
    assert np.bincount(bundle.get("test").y).tolist() == [1] * 10
    assert len(bundle.get("ood/textures")) == 5 and len(bundle.get("shift/brightness/5")) == 10
    # the shift subset is the same images as the test subset, corrupted
    assert bundle.get("shift/brightness/1").y.tolist() == bundle.get("test").y.tolist()
    with pytest.raises(ConfigError, match="unknown OOD set 'txtures'.*textures"):
        load("cifar10", ood=["txtures"])


def test_generated_uniform_noise_ood_set(full_root, use_root):
    root, _ = full_root
    use_root(root)
    bundle, _ = load("cifar10", ood=["uniform_noise"], noise_size=40)
    assert "ood/uniform_noise" in bundle.split_names() and "ood/svhn" not in bundle.split_names()
    noise = bundle.get("ood/uniform_noise")
    assert noise.x.shape == (40, 32, 32, 3) and noise.x.dtype == np.uint8 and (noise.y == OOD_LABEL).all()
    # uniform over 0..255: mean ≈ 127.5 (sd of the mean of 122880 values ≈ 0.2), both ends hit
    assert abs(noise.x.mean() - 127.5) < 1.5 and noise.x.min() == 0 and noise.x.max() == 255
    again, _ = load("cifar10", ood=["uniform_noise"], noise_size=40, eval_limit=10)
    np.testing.assert_array_equal(again.get("ood/uniform_noise").x, noise.x[:10])  # fixed seed; a prefix


def test_cifar100_end_to_end_with_binary_cifar10_as_ood(tmp_path, use_root):
    c100 = write_cifar100(tmp_path)
    c10 = write_cifar10(tmp_path, binary=True)
    write_corruptions(tmp_path / "CIFAR-100-C", c100["x_test"], c100["y_test"], names=("contrast", "zzz_custom"))
    use_root(tmp_path)
    bundle, warned = load("cifar100")
    assert bundle.split_names() == ["train", "val", "test", "ood/cifar10",
                                    *[f"shift/{c}/{s}" for c in ("contrast", "zzz_custom") for s in range(1, 6)],
                                    *generated_shifts(("contrast",))]
    assert bundle.num_classes == 100 and bundle.mean == (0.5071, 0.4867, 0.4408)
    assert len(warned) == 3  # train, test, meta
    train, val = bundle.get("train"), bundle.get("val")
    assert len(train) == 100 and len(val) == 100  # 2 per class: one each (val keeps >= 1, train >= 1)
    assert image_set(train.x) | image_set(val.x) == image_set(c100["x_train"])
    np.testing.assert_array_equal(bundle.get("test").y, c100["y_test"])  # canonical fine labels
    ood = bundle.get("ood/cifar10")
    np.testing.assert_array_equal(ood.x, c10["x_test"])
    assert (ood.y == OOD_LABEL).all()
    assert bundle.get("shift/contrast/4").y.tolist() == c100["y_test"].tolist()


def test_cifar10_reads_the_binary_version_when_the_pickles_are_absent(tmp_path, use_root):
    c10 = write_cifar10(tmp_path, binary=True)
    use_root(tmp_path)
    bundle, warned = load("cifar10")
    assert bundle.split_names() == ["train", "val", "test", *generated_shifts(())] and not warned  # no md5 published
    np.testing.assert_array_equal(bundle.get("test").x, c10["x_test"])
    assert image_set(bundle.get("train").x) | image_set(bundle.get("val").x) == image_set(c10["x_train"])


def test_strict_data_refuses_files_that_differ_from_the_official_ones(full_root, use_root):
    root, _ = full_root
    use_root(root)
    with pytest.raises(ConfigError, match=r"data_batch_1: md5 .* differs .*strict"):
        load("cifar10", strict=True)


# --------------------------------------------------------------------------- download


def make_tar(path: Path, members: dict[str, bytes], *, gz: bool = True) -> str:
    with tarfile.open(path, "w:gz" if gz else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_download_extracts_a_verified_archive(tmp_path):
    archive = tmp_path / "src" / "pack.tar.gz"
    archive.parent.mkdir()
    md5 = make_tar(archive, {"pack/a.txt": b"alpha", "pack/sub/b.txt": b"beta"})
    dest = tmp_path / "dest"
    assert formats.download(archive.as_uri(), dest, md5) == dest
    assert (dest / "pack/a.txt").read_bytes() == b"alpha" and (dest / "pack/sub/b.txt").read_bytes() == b"beta"
    assert sorted(p.name for p in dest.iterdir()) == ["pack"]  # no temp files, archive not kept
    # a plain file is placed as is
    plain = write(tmp_path / "src/test_32x32.mat", b"matfile")
    out = formats.download(plain.as_uri(), dest / "svhn", hashlib.md5(b"matfile").hexdigest())
    assert out == dest / "svhn/test_32x32.mat" and out.read_bytes() == b"matfile"
    # an existing, possibly incomplete target is never merged into or replaced
    with pytest.raises(ConfigError, match="pack already exists"):
        formats.download(archive.as_uri(), dest, md5)
    assert sorted(p.name for p in dest.iterdir()) == ["pack", "svhn"]


def test_download_with_wrong_md5_keeps_nothing(tmp_path):
    archive = tmp_path / "pack.tar.gz"
    make_tar(archive, {"pack/a.txt": b"alpha"})
    dest = tmp_path / "dest"
    with pytest.raises(ConfigError, match="md5 .* expected 0123.*nothing was extracted"):
        formats.download(archive.as_uri(), dest, "0123456789abcdef0123456789abcdef")
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize("member", ["../evil.txt", "pack/../../evil.txt", "/tmp/evil.txt", "link"])
def test_download_rejects_members_that_escape(tmp_path, member):
    archive = tmp_path / "src" / "bad.tar"
    archive.parent.mkdir()
    with tarfile.open(archive, "w") as tar:
        tar.addfile(_info("pack/ok.txt", 2), io.BytesIO(b"ok"))
        if member == "link":
            link = tarfile.TarInfo("pack/link")
            link.type, link.linkname = tarfile.SYMTYPE, "../../outside"
            tar.addfile(link)
        else:
            tar.addfile(_info(member, 4), io.BytesIO(b"evil"))
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    dest = tmp_path / "a" / "dest"
    with pytest.raises(ConfigError, match="unsafe archive member|links outside"):
        formats.download(archive.as_uri(), dest, md5)
    assert list(dest.iterdir()) == []
    assert not (tmp_path / "a" / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def test_download_refuses_plain_http(tmp_path):
    with pytest.raises(ConfigError, match="only https"):
        formats.download("http://example.invalid/x.tar.gz", tmp_path, "0" * 32)
    assert list(tmp_path.iterdir()) == []


def test_cifar10_download_option_fetches_the_missing_archive(tmp_path, use_root, monkeypatch):
    src = tmp_path / "mirror"
    write_cifar10(src)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    monkeypatch.setitem(cifar.SOURCES, "cifar10", (archive.as_uri(), md5, "."))
    root = tmp_path / "root"
    use_root(root)
    with pytest.raises(ConfigError, match="--download"):
        load("cifar10", ood=[])  # not without asking
    bundle, _ = load("cifar10", ood=[], download=True)
    assert bundle.split_names() == ["train", "val", "test", *generated_shifts(())]
    assert (root / "cifar-10-batches-py/test_batch").is_file()


def test_holdout_size_is_the_one_rounding_rule_of_every_family():
    from bench.data import holdout_size

    assert [holdout_size(n, 0.1) for n in (10, 14, 15, 25)] == [1, 1, 2, 3]  # half up: 1.5 -> 2, 2.5 -> 3
    assert holdout_size(100, 0.001) == 1 and holdout_size(3, 0.99) == 2  # both sides keep the class
