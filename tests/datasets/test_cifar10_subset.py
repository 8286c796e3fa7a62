"""``python -m datasets.cifar10_subset``: the cifar10_subset data cut from an official
CIFAR-10 copy, here a ``cifar-10-python.tar.gz`` written in tmp_path in exactly the
official format (Python-2 pickles, the official keys) whose batches hold a few images more
than the subset takes."""
from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest

from bench.data import configure_data
from bench.core.errors import ConfigError
from bench.config.options import parse
from bench.core.registry import DATASETS
from datasets import formats, safe_pickle
from datasets.cifar10_subset import main, write_subset
from tests.helpers.official_files import cifar_batch, images, labels_cycle, py2_dumps, rows_of

#: the subset, as docs/reference/data.md states it: the first images of each official batch
FIRST = {"data_batch_1": 1102, "data_batch_2": 1017, "data_batch_3": 1017, "data_batch_4": 1285,
         "data_batch_5": 1017, "test_batch": 1017}
EXTRA = 9  # images after the subset in each batch of the test archive
SMALL = {name: 2 for name in FIRST}  # sizes for the small archives of the error cases
KEYS = [b"batch_label", b"labels", b"data", b"filenames"]  # the official files' keys, in their order
META = py2_dumps({b"num_cases_per_batch": 10000, b"label_names": [b"airplane", b"automobile", b"bird", b"cat",
                  b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"], b"num_vis": 3072})


def official_batches(sizes: dict[str, int]) -> dict[str, dict]:
    batches = {}
    for k, (name, n) in enumerate(sizes.items()):
        title = b"testing batch 1 of 1" if name == "test_batch" else f"training batch {k + 1} of 5".encode()
        batch = cifar_batch(images(n, k), labels_cycle(n, 10, k), title=title)
        assert list(batch) == KEYS
        batches[name] = batch
    return batches


def write_archive(path, batches: dict[str, dict], *, raw: dict[str, bytes] | None = None):
    """A tar.gz with ``cifar-10-batches-py/NAME`` members, in a shuffled order as the
    official archive's are; ``raw`` replaces a member's bytes."""
    files = {name: py2_dumps(batch) for name, batch in batches.items()} | {"batches.meta": META} | (raw or {})
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        tar.addfile(_dir_info())
        for name in sorted(files, reverse=True):
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(files[name])
            tar.addfile(info, io.BytesIO(files[name]))
    return path


def _dir_info() -> tarfile.TarInfo:
    info = tarfile.TarInfo("cifar-10-batches-py")
    info.type = tarfile.DIRTYPE
    return info


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    batches = official_batches({name: n + EXTRA for name, n in FIRST.items()})
    return write_archive(tmp_path_factory.mktemp("official") / "cifar-10-python.tar.gz", batches), batches


def read(folder, name) -> dict:
    return safe_pickle.load((folder / name).read_bytes(), allowed=safe_pickle.NUMPY_RECONSTRUCT)


def test_the_subset_is_the_first_images_of_each_official_batch_and_the_loader_reads_it(official, tmp_path, capsys):
    archive, batches = official
    assert main(["--from", str(archive), str(tmp_path / "data")]) == 0
    out, err = capsys.readouterr()
    folder = tmp_path / "data" / "cifar-10-batches-py"
    assert f"wrote {folder}: 5,438 training and 1,017 test images" in out
    assert "differ from the published files (md5)" in err and len(err.splitlines()) == 1  # not the official bytes
    assert sorted(p.name for p in folder.iterdir()) == sorted([*FIRST, "batches.meta"])
    for name, n in FIRST.items():
        got, full = read(folder, name), batches[name]
        assert list(got) == KEYS
        assert got[b"batch_label"] == full[b"batch_label"]
        assert got[b"data"].dtype == np.uint8 and got[b"data"].shape == (n, 3072)
        np.testing.assert_array_equal(got[b"data"], full[b"data"][:n])
        assert got[b"labels"] == full[b"labels"][:n] and isinstance(got[b"labels"], list)
        assert got[b"filenames"] == full[b"filenames"][:n]
    assert (folder / "batches.meta").read_bytes() == META
    assert not [p for p in (tmp_path / "data").iterdir() if p.name != "cifar-10-batches-py"]  # no staging folder left

    configure_data(tmp_path / "data")
    try:
        cls = DATASETS.get("cifar10")
        with pytest.warns(formats.DataFileWarning, match="md5"):  # a cut copy: not the published bytes
            bundle = cls.load(parse(cls.Options, {"ood": []}))
        train, val, test = (bundle.get(s) for s in ("train", "val", "test"))
    finally:
        configure_data(None)
    assert len(train.y) + len(val.y) == sum(n for name, n in FIRST.items() if name != "test_batch")
    expected = images(FIRST["test_batch"] + EXTRA, list(FIRST).index("test_batch"))[: FIRST["test_batch"]]
    np.testing.assert_array_equal(test.x, expected)
    np.testing.assert_array_equal(rows_of(test.x), batches["test_batch"][b"data"][: FIRST["test_batch"]])


def test_an_extracted_folder_gives_the_same_files_as_the_archive(official, tmp_path):
    archive, _ = official
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "extracted", filter="data")  # our own archive
    written = [write_subset(archive, tmp_path / "a")[0],
               write_subset(tmp_path / "extracted", tmp_path / "b")[0],  # a folder holding cifar-10-batches-py/
               write_subset(tmp_path / "extracted" / "cifar-10-batches-py", tmp_path / "c")[0]]
    for name in [*FIRST, "batches.meta"]:
        assert len({(folder / name).read_bytes() for folder in written}) == 1, name


def test_an_existing_folder_is_never_replaced(official, tmp_path, capsys):
    archive, _ = official
    kept = tmp_path / "data" / "cifar-10-batches-py" / "data_batch_1"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"the user's full copy")
    assert main(["--from", str(archive), str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "already exists" in err and len(err.splitlines()) == 1
    assert kept.read_bytes() == b"the user's full copy" and os.listdir(kept.parent) == ["data_batch_1"]


def small_archive(tmp_path, n: int = 3, **raw: bytes):
    return write_archive(tmp_path / "small.tar.gz", official_batches({name: n for name in FIRST}), raw=raw)


def test_a_batch_shorter_than_the_subset_is_refused_and_nothing_is_written(tmp_path, capsys):
    assert main(["--from", str(small_archive(tmp_path)), str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert "test_batch: holds 3 images, the subset takes its first 1,017" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "data").exists()


def test_smaller_sizes_cut_a_small_archive(tmp_path):
    folder, modified = write_subset(small_archive(tmp_path, n=5), tmp_path / "data", SMALL)
    assert all(len(read(folder, name)[b"labels"]) == 2 for name in FIRST)
    assert modified == [*FIRST, "batches.meta"]  # each named: none is the published file


def test_filenames_that_are_no_list_are_refused_naming_the_batch_and_nothing_is_written(tmp_path):
    """A batch whose b'filenames' is a number, not the list of names the official files
    hold: a ConfigError (main's one line, exit 2) naming the batch and the key."""
    batches = official_batches({name: 5 for name in FIRST})
    batches["data_batch_1"][b"filenames"] = 5
    archive = write_archive(tmp_path / "odd.tar.gz", batches)
    with pytest.raises(ConfigError, match=r"data_batch_1: b'filenames' is of type int, not a list of names"):
        write_subset(archive, tmp_path / "data", SMALL)
    assert not (tmp_path / "data").exists()


class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_pickle_that_would_run_code_is_refused_without_running_it(tmp_path):
    target = tmp_path / "pwned"
    payload = py2_dumps({b"data": Evil(target), b"labels": [1]})
    with pytest.raises(ConfigError, match=r"data_batch_3: not loaded.*refusing to load global \w+\.system") as caught:
        write_subset(small_archive(tmp_path, data_batch_3=payload), tmp_path / "data", SMALL)
    assert len(str(caught.value).splitlines()) == 1
    assert not target.exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize("given, message", [
    ("missing.tar.gz", "no such file or folder"),
    ("not_an_archive", "not a readable tar archive"),
    ("no_test_batch.tar.gz", "the archive has no cifar-10-batches-py/test_batch"),
    ("empty_folder", "no {path}/cifar-10-batches-py/data_batch_1"),
])
def test_a_source_that_is_no_official_copy_is_named(tmp_path, given, message):
    path = tmp_path / given
    if given == "not_an_archive":
        path.write_bytes(b"plain text, no tar")
    elif given == "no_test_batch.tar.gz":
        write_archive(path, official_batches({name: 3 for name in FIRST if name != "test_batch"}))
    elif given == "empty_folder":
        path.mkdir()
    with pytest.raises(ConfigError) as caught:
        write_subset(path, tmp_path / "data", SMALL)
    assert message.format(path=path) in str(caught.value) and len(str(caught.value).splitlines()) == 1
    assert not (tmp_path / "data").exists()


def test_a_destination_that_cannot_be_written_is_one_line_exit_2(official, tmp_path, capsys):
    """DEST an existing file: mkdir fails; the error names it in one line, no traceback."""
    archive, _ = official
    (tmp_path / "afile").write_text("in the way")
    assert main(["--from", str(archive), str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(tmp_path / "afile") in err and len(err.splitlines()) == 1
