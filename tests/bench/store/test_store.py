"""bench.store: atomic writes, the cell state machine, manifest verification, preds files.

Every expected value is computed here (hashlib, numpy, file bytes written by the test);
failures are injected by monkeypatching ``os`` so the atomicity claims are exercised.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import store as store_mod
from bench.store import CHECKPOINT, CellDir, Store, atomic_write_bytes, split_relpath
from bench.store.record import CellRecord, Predictions

# ----------------------------------------------------------------------------- helpers


def listing(root: Path) -> list[str]:
    """Every file under ``root`` (hidden ones included), as sorted posix paths."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def random_preds(n: int, c: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, c))
    lp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))  # float64 on purpose
    return lp, rng.integers(0, c, n).astype(np.int32)  # int32 on purpose


SPLITS = ("val", "test", "shift/gaussian_noise/3", "ood/x")


def complete_cell(tmp_path: Path) -> CellDir:
    """A sealed cell with preds for nested split names, a log and a checkpoint."""
    cd = Store(tmp_path / "results" / "suite").cell("abc123")
    cd.reset()
    cd.write_cell(CellRecord.from_json({"key": "abc123", "status": "running", "seed": 0}))
    for i, split in enumerate(SPLITS):
        lp, y = random_preds(7, 3, i)
        if split.startswith("ood/"):
            y = np.full(7, -1)
        cd.write_preds(split, Predictions(lp, y))
    cd.write_bytes("train_log.csv", b"epoch,val_acc\n1,0.5\n")
    cd.write_checkpoint(state_dict_bytes({"head.weight": torch.ones(3, 2), "head.bias": torch.zeros(3)}))
    cd.seal(CellRecord.from_json({"key": "abc123", "status": "running", "seed": 0}))
    return cd


def state_dict_bytes(state: object) -> bytes:
    """``state`` as ``torch.save`` writes it (what a cell's ``checkpoint.pt`` holds)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


# ----------------------------------------------------------------------------- atomic_write_bytes


def test_atomic_write_creates_parents_and_writes_content(tmp_path):
    target = tmp_path / "a" / "b" / "f.bin"
    data = bytes(range(256)) * 3
    atomic_write_bytes(target, data)
    assert target.read_bytes() == data
    atomic_write_bytes(target, b"second")
    assert target.read_bytes() == b"second"
    assert listing(tmp_path) == ["a/b/f.bin"]  # no temp file left behind


@pytest.mark.parametrize("fail", ["replace", "fsync", "mid_write"])
def test_atomic_write_failure_keeps_old_content_and_no_temp(tmp_path, monkeypatch, fail):
    target = tmp_path / "d" / "f.txt"
    atomic_write_bytes(target, b"old content")

    class Boom(OSError):
        pass

    if fail == "replace":

        def boom(*a, **k):
            raise Boom("disk full")

        monkeypatch.setattr(store_mod.os, "replace", boom)
    elif fail == "fsync":

        def boom(*a, **k):
            raise Boom("fsync failed")

        monkeypatch.setattr(store_mod.os, "fsync", boom)
    else:  # half of the bytes reach the temp file, then the write fails
        real_fdopen = os.fdopen

        class HalfWriter:
            def __init__(self, f):
                self.f = f

            def write(self, data):
                self.f.write(data[: len(data) // 2])
                self.f.flush()
                raise Boom("device error mid-way")

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()
                return False

        monkeypatch.setattr(store_mod.os, "fdopen", lambda fd, mode: HalfWriter(real_fdopen(fd, mode)))

    with pytest.raises(Boom):
        atomic_write_bytes(target, b"NEW CONTENT THAT MUST NOT APPEAR" * 100)
    monkeypatch.undo()
    assert target.read_bytes() == b"old content"
    assert listing(tmp_path) == ["d/f.txt"]


def test_atomic_write_failure_on_first_write_leaves_nothing(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise OSError("no")

    monkeypatch.setattr(store_mod.os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(tmp_path / "new.bin", b"data")
    monkeypatch.undo()
    assert listing(tmp_path) == []


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EFBIG])
def test_a_write_failing_for_want_of_room_names_the_file(tmp_path, monkeypatch, error):
    """``fsync`` (like ``write``) raises ENOSPC or EFBIG naming no file; the error that
    leaves the store names the file (issue 43, row 9)."""
    def full(fd):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(store_mod.os, "fsync", full)
    with pytest.raises(OSError) as raised:
        atomic_write_bytes(tmp_path / "cell" / "preds" / "test.npz", b"data")
    monkeypatch.undo()
    assert raised.value.errno == error and raised.value.filename == str(tmp_path / "cell" / "preds" / "test.npz")
    assert listing(tmp_path) == []


# ----------------------------------------------------------------------------- status


def test_status_transitions_missing_incomplete_complete(tmp_path):
    cd = CellDir(tmp_path / "cell")
    assert cd.status() == "missing"
    assert not cd.verify()
    cd.reset()
    assert cd.status() == "incomplete"  # directory exists, nothing written
    cd.write_cell(CellRecord.from_json({"status": "running"}))
    assert cd.status() == "incomplete"
    assert cd.read_cell() == CellRecord(status="running")
    lp, y = random_preds(4, 2, 0)
    cd.write_preds("val", Predictions(lp, y))
    assert cd.status() == "incomplete"  # preds but no manifest
    cd.seal(CellRecord.from_json({"status": "running", "seed": 3}))
    assert cd.status() == "complete"
    assert cd.verify()
    assert cd.read_cell() == CellRecord(status="complete", seed=3)


def test_cell_json_saying_complete_without_manifest_is_incomplete(tmp_path):
    cd = CellDir(tmp_path / "cell")
    cd.reset()
    cd.write_cell(CellRecord.from_json({"status": "complete"}))
    assert cd.status() == "incomplete"


def test_failed_status(tmp_path):
    cd = CellDir(tmp_path / "cell")
    cd.reset()
    cd.write_cell(CellRecord.from_json({"status": "failed", "reason": "non-finite training loss nan at epoch 2"}))
    assert cd.status() == "failed"
    assert cd.read_cell().reason.startswith("non-finite")


def test_manifest_with_failed_cell_json_is_not_complete(tmp_path):
    cd = complete_cell(tmp_path)
    # a run that failed after sealing rewrote cell.json: hash mismatch and status failed
    cd.write_cell(CellRecord.from_json({"status": "failed", "reason": "x"}))
    assert not cd.verify()
    assert cd.status() == "failed"


# ----------------------------------------------------------------------------- verify


def test_manifest_lists_every_file_with_sha256(tmp_path):
    cd = complete_cell(tmp_path)
    manifest = json.loads((cd.path / "manifest.json").read_text())
    expected_files = {"cell.json", "train_log.csv", CHECKPOINT} | {f"preds/{s}.npz" for s in SPLITS}
    assert set(manifest["files"]) == expected_files
    for rel, digest in manifest["files"].items():
        assert digest == sha(cd.path / rel), rel
    assert set(listing(cd.path)) == expected_files | {"manifest.json"}  # no stray temp files


@pytest.mark.parametrize("rel", ["preds/shift/gaussian_noise/3.npz", "preds/val.npz", "cell.json", "train_log.csv"])
def test_verify_fails_after_one_byte_changed(tmp_path, rel):
    cd = complete_cell(tmp_path)
    f = cd.path / rel
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    assert not cd.verify()
    assert cd.status() == "incomplete"


@pytest.mark.parametrize("rel", ["preds/ood/x.npz", "preds/test.npz", "cell.json", CHECKPOINT])
def test_verify_fails_after_file_deleted(tmp_path, rel):
    cd = complete_cell(tmp_path)
    (cd.path / rel).unlink()
    assert not cd.verify()
    assert cd.status() != "complete"


@pytest.mark.parametrize("keep", [0, 1, 10, "half", -2])
def test_verify_fails_when_manifest_truncated(tmp_path, keep):
    cd = complete_cell(tmp_path)
    m = cd.path / "manifest.json"
    data = m.read_bytes()
    n = len(data) // 2 if keep == "half" else keep % len(data)
    m.write_bytes(data[:n])
    assert not cd.verify()
    assert cd.status() == "incomplete"


def test_verify_fails_when_manifest_deleted(tmp_path):
    cd = complete_cell(tmp_path)
    (cd.path / "manifest.json").unlink()
    assert cd.status() == "incomplete"


def test_verify_is_false_for_manifest_with_invalid_utf8_byte(tmp_path):
    cd = complete_cell(tmp_path)
    m = cd.path / "manifest.json"
    data = bytearray(m.read_bytes())
    data[len(data) // 2] = 0xFF
    m.write_bytes(bytes(data))
    assert not cd.verify()
    assert cd.status() == "incomplete"


@pytest.mark.parametrize("name", ["manifest.json", "cell.json"])
@pytest.mark.parametrize("content", [b"[]", b'"text"', b"\xff\xfe", b'{"files": 3}'])
def test_damaged_or_non_object_json_reads_as_incomplete(tmp_path, name, content):
    cd = complete_cell(tmp_path)
    (cd.path / name).write_bytes(content)
    assert not cd.verify()
    assert cd.status() == "incomplete"


def test_skip_ignores_only_the_named_file(tmp_path):
    cd = complete_cell(tmp_path)
    (cd.path / CHECKPOINT).write_bytes(b"pruned")
    assert not cd.verify()
    assert cd.status() == "incomplete"
    assert cd.verify(skip=(CHECKPOINT,))
    assert cd.status(skip=(CHECKPOINT,)) == "complete"
    (cd.path / CHECKPOINT).unlink()
    assert cd.status(skip=(CHECKPOINT,)) == "complete"
    # other files are still checked when the checkpoint is skipped
    (cd.path / "preds" / "val.npz").write_bytes(b"junk")
    assert not cd.verify(skip=(CHECKPOINT,))


@pytest.mark.parametrize("state, why", [
    ({}, "holds no weights (an empty state dict)"),
    ([torch.ones(2)], "holds a list, not a table of named tensors"),
    ({"head.weight": 3}, "entry 'head.weight' is not a named tensor (int)"),
    (None, "holds a NoneType, not a table of named tensors"),
])
def test_a_checkpoint_that_is_no_state_dict_is_damage_even_under_a_matching_manifest(tmp_path, state, why):
    """A checkpoint replaced after the cell completed and the manifest re-sealed over it:
    the digests match, the contents are checked (unless skipped, as analysis skips them)."""
    cd = complete_cell(tmp_path)
    cd.write_checkpoint(state_dict_bytes(state))
    cd.seal(cd.read_cell())
    assert cd.condition() == ("damaged", f"{CHECKPOINT} {why}")
    assert cd.condition(skip=(CHECKPOINT,)) == ("complete", None)
    cd.write_checkpoint(b"PK\x03\x04 not a zip")
    cd.seal(cd.read_cell())
    assert cd.condition()[1].startswith(f"{CHECKPOINT} cannot be read as weights (")


# ----------------------------------------------------------------------------- reset


def test_reset_refuses_complete_cell_and_leaves_it_intact(tmp_path):
    cd = complete_cell(tmp_path)
    before = {rel: (cd.path / rel).read_bytes() for rel in listing(cd.path)}
    with pytest.raises(RuntimeError):
        cd.reset()
    after = {rel: (cd.path / rel).read_bytes() for rel in listing(cd.path)}
    assert after == before
    assert cd.status() == "complete"


def test_reset_clears_incomplete_cell(tmp_path):
    cd = CellDir(tmp_path / "cell")
    cd.reset()
    cd.write_cell(CellRecord.from_json({"status": "running"}))
    lp, y = random_preds(3, 2, 1)
    cd.write_preds("shift/a/1", Predictions(lp, y))
    (cd.path / ".cell.json.abc.tmp").write_bytes(b"left by a killed run")
    cd.reset()
    assert cd.path.is_dir()
    assert list(cd.path.iterdir()) == []
    assert cd.status() == "incomplete"


def test_reset_clears_broken_complete_cell_and_failed_cell(tmp_path):
    cd = complete_cell(tmp_path)
    (cd.path / "preds" / "test.npz").unlink()
    cd.reset()  # no longer complete: may be redone
    assert list(cd.path.iterdir()) == []
    cd.write_cell(CellRecord.from_json({"status": "failed", "reason": "r"}))
    cd.reset()
    assert list(cd.path.iterdir()) == []


# ----------------------------------------------------------------------------- preds


def test_preds_round_trip_nested_split_names(tmp_path):
    cd = CellDir(tmp_path / "cell")
    cd.reset()
    written = {}
    for i, split in enumerate(SPLITS):
        lp, y = random_preds(5 + i, 4, 10 + i)
        cd.write_preds(split, Predictions(lp, y))
        written[split] = (lp, y)
    assert (cd.path / "preds" / "shift" / "gaussian_noise" / "3.npz").is_file()
    assert (cd.path / "preds" / "ood" / "x.npz").is_file()
    assert cd.splits() == sorted(SPLITS)
    for split, (lp, y) in written.items():
        got = cd.read_preds(split)
        got_lp, got_y = got.log_probs, got.labels
        assert got_lp.dtype == np.float32 and got_y.dtype == np.int64
        assert got_lp.shape == lp.shape and got_y.shape == y.shape
        np.testing.assert_array_equal(got_lp, lp.astype(np.float32))
        np.testing.assert_array_equal(got_y, y.astype(np.int64))


def cell_with_preds(tmp_path, split: str, n: int, c: int, seed: int) -> tuple[CellDir, np.ndarray, np.ndarray]:
    """A fresh cell holding random predictions of ``n`` samples and ``c`` classes for ``split``."""
    cd = CellDir(tmp_path / "cell")
    cd.reset()
    lp, y = random_preds(n, c, seed)
    cd.write_preds(split, Predictions(lp, y))
    return cd, lp, y


def test_npz_loads_without_pickle_and_holds_exactly_two_arrays(tmp_path):
    cd, lp, y = cell_with_preds(tmp_path, "shift/gaussian_noise/3", 6, 3, 5)
    path = cd.path / "preds" / "shift" / "gaussian_noise" / "3.npz"
    with np.load(path, allow_pickle=False) as z:
        assert sorted(z.files) == ["labels", "log_probs"]
        assert z["log_probs"].dtype == np.float32 and z["log_probs"].shape == (6, 3)
        assert z["labels"].dtype == np.int64
        np.testing.assert_array_equal(z["labels"], y)
    with zipfile.ZipFile(path) as zf:  # a real npz archive of plain .npy members
        assert sorted(zf.namelist()) == ["labels.npy", "log_probs.npy"]
        arr = np.lib.format.read_array(io.BytesIO(zf.read("log_probs.npy")), allow_pickle=False)
        np.testing.assert_array_equal(arr, lp.astype(np.float32))


@pytest.mark.parametrize("bad", ["../x", "a//b", "", "/abs", "x/", "a/./b", "a/../../b", ".", ".."])
def test_bad_split_names_rejected(tmp_path, bad):
    cd = CellDir(tmp_path / "store" / "cell")
    cd.reset()
    lp, y = random_preds(2, 2, 0)
    with pytest.raises(ValueError):
        split_relpath(bad)
    with pytest.raises(ValueError):
        cd.write_preds(bad, Predictions(lp, y))
    assert listing(tmp_path) == []  # nothing written anywhere


def test_split_relpath_maps_to_nested_path():
    assert split_relpath("shift/gaussian_noise/3") == "preds/shift/gaussian_noise/3.npz"
    assert split_relpath("ood/x") == "preds/ood/x.npz"
    assert split_relpath("val") == "preds/val.npz"


def test_store_cells_are_keyed_directories(tmp_path):
    s = Store(tmp_path / "r")
    cd = s.cell("k1")
    assert cd.path == tmp_path / "r" / "k1"
    assert cd.key == "k1"


# ----------------------------------------------------------------------------- contents


def forge(cd: CellDir, rel: str, data: bytes | None = None, **arrays: np.ndarray) -> None:
    """Replace ``rel`` as a forger would: new bytes (or an ``.npz`` of ``arrays``, objects
    allowed) with their sha256 written into the manifest, so every hash still matches."""
    if data is None:
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # np.savez pickles object arrays
        data = buf.getvalue()
    (cd.path / rel).write_bytes(data)
    manifest = json.loads((cd.path / "manifest.json").read_text())
    manifest["files"][rel] = hashlib.sha256(data).hexdigest()
    (cd.path / "manifest.json").write_text(json.dumps(manifest))


def good_arrays(n: int = 7, c: int = 3, seed: int = 9) -> dict[str, np.ndarray]:
    lp, y = random_preds(n, c, seed)
    return {"log_probs": lp.astype(np.float32), "labels": y.astype(np.int64)}


FORGERIES = {
    "object array (a pickle)": dict(log_probs=np.array([{"evil": 1}] * 7, dtype=object), labels=np.zeros(7, np.int64)),
    "float64 log_probs": {**good_arrays(), "log_probs": good_arrays()["log_probs"].astype(np.float64)},
    "int32 labels": {**good_arrays(), "labels": good_arrays()["labels"].astype(np.int32)},
    "fewer rows than the split": good_arrays(n=5),
    "other number of classes": good_arrays(c=4),
    "labels and log_probs of different lengths": {**good_arrays(), "labels": np.zeros(6, np.int64)},
    "a NaN": {**good_arrays(), "log_probs": np.where(np.arange(21).reshape(7, 3) == 4, np.nan,
                                                     good_arrays()["log_probs"]).astype(np.float32)},
    "unnormalised": {**good_arrays(), "log_probs": (good_arrays()["log_probs"] + 0.5).astype(np.float32)},
    "label out of range": {**good_arrays(), "labels": np.array([0, 1, 2, 3, 0, 1, 2], np.int64)},
    "no labels": {"log_probs": good_arrays()["log_probs"]},
    "an extra of the wrong shape": {**good_arrays(), "mean_entropy": np.zeros(3, np.float32)},
}


@pytest.mark.parametrize("what", list(FORGERIES))
def test_a_forged_prediction_file_with_a_matching_hash_is_damaged(tmp_path, what):
    """Hashes prove a file is the one sealed; a file replaced together with its hash must
    still hold what write_preds writes (float32 [N, C] normalised log-probabilities, int64
    labels [N], N and C as sealed), read without unpickling."""
    cd = complete_cell(tmp_path)
    forge(cd, "preds/test.npz", **FORGERIES[what])
    state, why = cd.condition()
    assert state == "damaged" and why.startswith("preds/test.npz"), (state, why)
    assert not cd.verify()


def test_an_honest_rewrite_with_its_hash_still_verifies(tmp_path):
    """The content checks accept what write_preds writes (here: other valid values)."""
    cd = complete_cell(tmp_path)
    forge(cd, "preds/test.npz", **good_arrays(seed=123))
    assert cd.condition() == ("complete", None)


@pytest.mark.parametrize("entry", ["../outside.npz", "preds/../../outside.npz", "ABSOLUTE", "symlink"])
def test_a_manifest_path_outside_the_cell_is_damaged(tmp_path, entry):
    """A manifest entry must name a file inside the cell: not absolute, no '..', and not
    a symlink resolving elsewhere -- even when the file there matches the hash."""
    cd = complete_cell(tmp_path)
    outside = cd.path.parent / "outside.npz"
    outside.write_bytes((cd.path / "preds" / "test.npz").read_bytes())
    if entry == "symlink":
        (cd.path / "preds" / "test.npz").unlink()
        (cd.path / "preds" / "test.npz").symlink_to(outside)
        rel = "preds/test.npz"
    else:
        rel = str(outside) if entry == "ABSOLUTE" else entry
        forge(cd, rel, outside.read_bytes())
    state, why = cd.condition()
    assert state == "damaged" and repr(rel) in why, (state, why)


def test_write_preds_refuses_what_a_verified_cell_may_not_hold(tmp_path):
    cd = CellDir(tmp_path / "cell")
    cd.reset()
    lp, y = random_preds(4, 3, 0)
    lp[1, 2] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        cd.write_preds("test", Predictions(lp, y))
    with pytest.raises(ValueError, match="not normalised"):
        cd.write_preds("test", Predictions(np.zeros((4, 3)), y))
    assert listing(tmp_path) == []


def test_files_honour_the_umask(tmp_path):
    from bench.store import atomic_write_text

    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "f.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o640
