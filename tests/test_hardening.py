"""Hostile but realistic input: every bad value is exit 2 with one message and nothing
written; a damaged store is named (report exit 1), never fatal, and ``run`` moves a
damaged cell aside and redoes it.  One test per row of the hardening issue that is covered
here; the store rows use a synthetic store in the real on-disk format."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from bench.cli import main

SUITE = """
name = "hard"
seeds = [0]
[train]
epochs = 1
batch_size = 64
warmup_epochs = 0
[model]
patch_size = 7
dim = 16
depth = 1
heads = 2
[datasets.mnist5k]
train_limit = 200
eval_limit = 50
splits = ["test"]
[methods.msp]
"""


def run(tmp_path: Path, *args: str, suite: str = SUITE, capsys=None) -> tuple[int, str]:
    path = tmp_path / "hard.toml"
    path.write_text(suite)
    code = main(["--suite", str(path), "--results", str(tmp_path / "results"),
                 "--reports", str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), "--quiet", *args])
    err = capsys.readouterr().err if capsys is not None else ""
    return code, err


def nothing_written(tmp_path: Path) -> bool:
    return not any((tmp_path / d).exists() for d in ("results", "reports", "data"))


@pytest.mark.parametrize("key,value", [
    ("train.lr", "nan"), ("train.weight_decay", "nan"), ("train.lr", "inf"), ("model.dropout", "nan"),
    ("model.mlp_ratio", "nan"), ("train.epochs", "1000000000000"), ("model.dim", "100000"),
    ("seeds", "[99999999999999999999]"),
])
def test_bad_numbers_are_exit_2_before_anything_is_written(tmp_path, capsys, key, value):
    section, _, name = key.rpartition(".")
    if section:
        suite = SUITE.replace(f"[{section}]\n", f"[{section}]\n{name} = {value}\n", 1)
        suite = "\n".join(ln for ln in suite.splitlines()
                          if not (ln.startswith(f"{name} = ") and ln != f"{name} = {value}"))
    else:
        suite = SUITE.replace("seeds = [0]", f"seeds = {value}")
    code, err = run(tmp_path, suite=suite, capsys=capsys)
    assert code == 2 and name in err and "Traceback" not in err, err
    assert nothing_written(tmp_path)


def test_huge_cli_seed_and_epochs_are_exit_2(tmp_path, capsys):
    code, err = run(tmp_path, "--seeds", "99999999999999999999", capsys=capsys)
    assert code == 2 and "seeds" in err and nothing_written(tmp_path)
    code, err = run(tmp_path, "--epochs", "1000000000000", capsys=capsys)
    assert code == 2 and "epochs" in err and "UQBENCH_ALLOW_LARGE" in err and nothing_written(tmp_path)


@pytest.mark.parametrize("body,expect", [
    ("raise RuntimeError('plugin exploded')", "RuntimeError: plugin exploded"),
    ("def broken(:\n    pass", "syntax error"),
    ("from bench.registry import METHODS\nfrom methods.msp import MSP\n"
     "@METHODS.register('msp')\nclass Again(MSP):\n    pass", "already registered by module 'methods.msp'"),
])
def test_plugin_errors_are_one_line_exit_2(tmp_path, capsys, monkeypatch, body, expect):
    name = f"badplugin_{abs(hash(body)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err = run(tmp_path, "--plugin", name, capsys=capsys)
    assert code == 2 and f"--plugin {name}" in err and expect in err and "Traceback" not in err, err
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("name", ["../escaped", "ABSOLUTE", ""])
def test_a_suite_name_that_is_no_folder_name_is_exit_2_and_writes_nothing(tmp_path, capsys, name):
    """The name would put the store and report outside --results/--reports (or the report
    straight into the report root): one line, nothing written anywhere."""
    name = str(tmp_path / "absolute") if name == "ABSOLUTE" else name
    code, err = run(tmp_path, suite=f"name = {json.dumps(name)}\n" + SUITE.replace('name = "hard"\n', ""), capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and f"name: {name!r} cannot name a suite" in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["hard.toml"]


def test_allow_large_is_the_switch_uqbench_allow_large_is(tmp_path, capsys, monkeypatch):
    """--allow-large lifts the sanity limits (here: epochs) for its command only, as
    UQBENCH_ALLOW_LARGE=1 does; the cell-count limit (over 10,000 cells) is one of them."""
    from bench.options import ALLOW_LARGE_ENV

    monkeypatch.delenv(ALLOW_LARGE_ENV, raising=False)
    path = tmp_path / "hard.toml"
    path.write_text(SUITE.replace("epochs = 1\n", "epochs = 1000000\n"))
    status = ["status", "--suite", str(path), "--results", str(tmp_path / "results")]
    assert main(status) == 2 and "--allow-large" in capsys.readouterr().err
    assert main([*status, "--allow-large"]) == 0 and "1 missing" in capsys.readouterr().out
    assert ALLOW_LARGE_ENV not in os.environ  # the flag's setting ends with its command
    monkeypatch.setenv(ALLOW_LARGE_ENV, "1")
    assert main(status) == 0
    monkeypatch.delenv(ALLOW_LARGE_ENV)
    path.write_text(SUITE)
    many = ",".join(map(str, range(10_001)))
    code, err = run(tmp_path, "--seeds", many, capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "more than 10,000 cells" in err and "--allow-large" in err, err
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("flag", ["--results", "--reports", "--data-root"])
def test_a_file_where_a_directory_is_needed_is_exit_2(tmp_path, capsys, flag):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    path = tmp_path / "hard.toml"
    path.write_text(SUITE)
    args = {"--results": str(tmp_path / "results"), "--reports": str(tmp_path / "reports"),
            "--data-root": str(tmp_path / "data")}
    args[flag] = str(blocker)
    code = main(["--suite", str(path), "--quiet", *[x for kv in args.items() for x in kv]])
    err = capsys.readouterr().err
    assert code == 2 and flag in err and "not a directory" in err, err
    assert nothing_written(tmp_path)


def test_unknown_metric_is_exit_2_before_training(tmp_path, capsys):
    code, err = run(tmp_path, "--metrics", "accuracy,nope", capsys=capsys)
    assert code == 2 and "nope" in err and nothing_written(tmp_path)


def test_debug_shows_the_traceback(tmp_path):
    from bench.errors import ConfigError

    with pytest.raises(ConfigError):
        run(tmp_path, "--metrics", "nope", "--debug")


# ------------------------------------------------------------------------ damaged stores


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One real run of the tiny suite (2 seeds of msp), reused by the store tests."""
    root = tmp_path_factory.mktemp("hard")
    (root / "hard.toml").write_text(SUITE.replace("seeds = [0]", "seeds = [0, 1]"))
    code = main(["--suite", str(root / "hard.toml"), "--results", str(root / "results"),
                 "--reports", str(root / "reports"), "--data-root", str(root / "data"), "--quiet"])
    assert code == 0
    return root


def copy_store(trained: Path, tmp_path: Path) -> tuple[Path, list[Path]]:
    import shutil

    shutil.copytree(trained / "results", tmp_path / "results")
    (tmp_path / "hard.toml").write_text((trained / "hard.toml").read_text())
    cells = sorted(c for c in (tmp_path / "results" / "hard").iterdir() if c.is_dir())
    return tmp_path / "results" / "hard", cells


def report(tmp_path: Path, capsys, *extra: str) -> tuple[int, str, str]:
    code = main(["report", "--suite", str(tmp_path / "hard.toml"), "--results", str(tmp_path / "results"),
                 "--reports", str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), *extra])
    err = capsys.readouterr().err
    readme = tmp_path / "reports" / "hard" / "README.md"
    return code, err, readme.read_text() if readme.exists() else ""


def section(readme: str, title: str) -> str:
    return readme.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def forge_object_array(cell: Path, tmp_path: Path) -> None:
    """Replace the cell's test predictions by an ``.npz`` of object arrays (pickles) and
    write its new sha256 into the manifest, as a forger would."""
    import zipfile

    from bench.store import sha256_file

    np.save(tmp_path / "x.npy", np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(cell / "preds" / "test.npz", "w") as z:
        z.write(tmp_path / "x.npy", "log_probs.npy")
        z.write(tmp_path / "x.npy", "labels.npy")
    manifest = json.loads((cell / "manifest.json").read_text())
    manifest["files"]["preds/test.npz"] = sha256_file(cell / "preds" / "test.npz")
    (cell / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage", ["flipped byte", "stray file", "object array", "truncated cell.json"])
def test_report_names_every_damaged_cell_and_exits_1(trained, tmp_path, capsys, damage):
    store, cells = copy_store(trained, tmp_path)
    cell = cells[0]
    if damage == "flipped byte":
        flip_byte(cell / "preds" / "test.npz")
    elif damage == "stray file":
        np.savez(cell / "preds" / "injected.npz", log_probs=np.zeros((2, 10), np.float32), labels=np.zeros(2, np.int64))
    elif damage == "object array":
        forge_object_array(cell, tmp_path)
    else:
        (cell / "cell.json").write_text((cell / "cell.json").read_text()[:40])
    code, err, readme = report(tmp_path, capsys)
    assert code == 1 and "Traceback" not in err, err
    damaged = section(readme, "Damaged cells")
    assert cell.name in damaged and "None." not in damaged, damaged
    # the other cell is still reported
    assert "| msp" in section(readme, "mnist5k")


def test_deleted_manifest_is_named_as_incomplete(trained, tmp_path, capsys):
    store, cells = copy_store(trained, tmp_path)
    (cells[1] / "manifest.json").unlink()
    code, _, readme = report(tmp_path, capsys)
    assert code == 1 and "no manifest" in section(readme, "Failed cells")


def test_run_moves_a_damaged_cell_aside_and_redoes_it(trained, tmp_path, capsys):
    store, cells = copy_store(trained, tmp_path)
    flip_byte(cells[0] / "preds" / "test.npz")
    code = main(["--suite", str(tmp_path / "hard.toml"), "--results", str(tmp_path / "results"),
                 "--reports", str(tmp_path / "reports"), "--data-root", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert code == 0 and "damaged" in err, err
    aside = [p for p in store.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].name.startswith(cells[0].name)
    from bench.store import CellDir

    assert CellDir(cells[0]).verify() and CellDir(cells[1]).verify()  # redone; the other untouched


@pytest.mark.parametrize("name,results", [("..", "results/hard/sub"), ("", "results/hard"), (".", "results/hard")])
def test_a_store_only_report_whose_name_is_no_folder_name_is_exit_2(trained, tmp_path, capsys, name, results):
    """``report --results DIR --suite NAME`` with NAME '..', '' or '.' (DIR/NAME a real
    store) would write the report outside --reports or into its root: one line, nothing written."""
    copy_store(trained, tmp_path)
    (tmp_path / "results" / "hard" / "sub").mkdir()
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    code = main(["report", "--suite", name, "--results", str(tmp_path / results), "--reports", str(tmp_path / "reports")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"--suite: {name!r} cannot name a suite" in err, err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before


def test_report_matching_nothing_is_exit_2_and_keeps_the_old_report(trained, tmp_path, capsys):
    store, _ = copy_store(trained, tmp_path)
    code, _, readme = report(tmp_path, capsys)
    assert code == 0
    before = {p: p.read_bytes() for p in (tmp_path / "reports").rglob("*") if p.is_file()}
    code, err, _ = report(tmp_path, capsys, "--seeds", "7")
    assert code == 2 and "no cell for this selection" in err
    assert {p: p.read_bytes() for p in (tmp_path / "reports").rglob("*") if p.is_file()} == before
    # other --epochs than the run: the store's cells are still found (the suite only selects)
    code, _, again = report(tmp_path, capsys, "--epochs", "3")
    assert code == 0 and section(again, "mnist5k") == section(readme, "mnist5k")


def test_files_honour_the_umask(tmp_path):
    from bench.store import atomic_write_text

    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "f.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o640


# ----------------------------------------------------------------- data, pickles, disk


BREAKAGES = ["svhn text", "corruption npy shape", "corruption npy truncated", "corruption npy objects",
             "text named .png", "zero-byte .jpg", "empty OOD folder", "decompression bomb"]


def png_declaring(width: int, height: int) -> bytes:
    """A valid, tiny PNG whose header declares width x height 1-bit pixels."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


@pytest.mark.filterwarnings("ignore:.*differs from the official file's md5")  # fixture-sized copies
@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_data_file_is_exit_2_before_the_first_cell(tmp_path, capsys, breakage):
    from test_cifar_formats import write_cifar10, write_cifar100, write_corruptions, write_image_folder, write_svhn

    root = tmp_path / "data"
    c10 = write_cifar10(root)
    write_cifar100(root)
    write_corruptions(root / "CIFAR-10-C", c10["x_test"], c10["y_test"])
    write_svhn(root / "svhn" / "test_32x32.mat")
    textures = root / "ood" / "textures"
    write_image_folder(textures)
    npy = root / "CIFAR-10-C" / "brightness.npy"
    if breakage == "svhn text":
        (root / "svhn" / "test_32x32.mat").write_text("this is not a MATLAB file\n")
    elif breakage == "corruption npy shape":
        np.save(npy, np.zeros((7, 32, 32, 3), np.uint8))
    elif breakage == "corruption npy truncated":
        npy.write_bytes(npy.read_bytes()[:200])
    elif breakage == "corruption npy objects":
        np.save(npy, np.array([{"x": 1}] * 5, dtype=object), allow_pickle=True)
    elif breakage == "text named .png":
        (textures / "a.png").write_text("not a PNG")
    elif breakage == "decompression bomb":
        (textures / "a.png").write_bytes(png_declaring(40000, 40000))  # 1.6e9 pixels in ~60 bytes
    elif breakage == "zero-byte .jpg":
        (textures / "b_sub" / "e.jpg").write_bytes(b"")
    else:
        import shutil

        shutil.rmtree(textures)
        textures.mkdir()
    code = main(["--suite", "cifar10", "--data-root", str(root), "--epochs", "1", "--seeds", "0",
                 "--methods", "msp", "--results", str(tmp_path / "results"),
                 "--reports", str(tmp_path / "reports"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    store = tmp_path / "results" / "cifar10"
    assert not store.exists() or not any(p.is_dir() for p in store.iterdir())  # no cell started
    assert not (tmp_path / "reports").exists()


def test_an_image_declaring_too_many_pixels_is_refused_before_decoding(tmp_path, monkeypatch):
    """A 5000 x 5000 PNG (under Pillow's own bomb limit) whose pixel data is missing: the
    refusal names the pixel count, so it came from the header, before any decoding (which
    would fail on the missing data).  UQBENCH_ALLOW_LARGE lets it be decoded."""
    from bench.errors import ConfigError
    from bench.options import ALLOW_LARGE_ENV
    from datasets.formats import read_image_folder

    monkeypatch.delenv(ALLOW_LARGE_ENV, raising=False)
    (tmp_path / "big.png").write_bytes(png_declaring(5000, 5000))
    with pytest.raises(ConfigError) as exc:
        read_image_folder(tmp_path, 32)
    assert "5000 x 5000 = 25,000,000 pixels, more than the 16,777,216 (4096 x 4096)" in str(exc.value), exc.value
    monkeypatch.setenv(ALLOW_LARGE_ENV, "1")
    with pytest.raises(ConfigError, match="cannot be read as an image"):  # decoded: the data are missing
        read_image_folder(tmp_path, 32)


def test_a_tiny_pickle_cannot_declare_a_huge_array():
    import pickle

    from datasets import safe_pickle

    # protocol 2: numpy.ndarray((1000000, 3072), 'B') through the allowed ndarray global
    payload = b"\x80\x02cnumpy\nndarray\nq\x00J@B\x0f\x00M\x00\x0c\x86q\x01X\x01\x00\x00\x00Bq\x02\x86q\x03Rq\x04."
    assert len(payload) < 100
    with pytest.raises(pickle.UnpicklingError, match="more than the file"):
        safe_pickle.load(payload)
    real = {b"data": np.arange(3 * 3072, dtype=np.uint8).reshape(3, 3072)}
    for protocol in (2, 4, 5):  # honest arrays of any protocol still load
        np.testing.assert_array_equal(safe_pickle.load(pickle.dumps(real, protocol=protocol))[b"data"], real[b"data"])


def test_disk_full_while_reporting_is_one_line_naming_the_path(trained, tmp_path, capsys, monkeypatch):
    import errno

    import bench.report

    copy_store(trained, tmp_path)

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(bench.report, "atomic_write_text", full)
    code, err, _ = report(tmp_path, capsys)
    assert code == 1 and "No space left on device" in err and "reports" in err and "Traceback" not in err, err


def test_verify_names_damage_and_exits_1(trained, tmp_path, capsys):
    store, cells = copy_store(trained, tmp_path)
    assert main(["verify", "--suite", "hard", "--results", str(tmp_path / "results")]) == 0
    flip_byte(cells[1] / "preds" / "test.npz")
    assert main(["verify", "--suite", "hard", "--results", str(tmp_path / "results")]) == 1
    out = capsys.readouterr().out
    assert f"{cells[1].name}: damaged: preds/test.npz does not match" in out and "1 complete" in out


def test_verify_status_and_run_judge_contents_not_only_hashes(trained, tmp_path, capsys):
    """A prediction file rewritten with object arrays and its new hash in the manifest:
    verify (exit 1) and status call the cell damaged, and run redoes it, saying so."""
    store, cells = copy_store(trained, tmp_path)
    forge_object_array(cells[0], tmp_path)
    assert main(["verify", "--suite", "hard", "--results", str(tmp_path / "results")]) == 1
    out = capsys.readouterr().out
    assert f"{cells[0].name}: damaged: preds/test.npz cannot be read as plain arrays" in out, out
    assert main(["status", "--suite", str(tmp_path / "hard.toml"), "--results", str(tmp_path / "results")]) == 0
    assert "damaged: preds/test.npz cannot be read" in capsys.readouterr().out
    code, err = run(tmp_path, suite=(tmp_path / "hard.toml").read_text(), capsys=capsys)
    assert code == 0 and "damaged (preds/test.npz cannot be read" in err and "redoing it" in err, err
    from bench.store import CellDir

    assert CellDir(cells[0]).verify() and [p.name for p in store.iterdir() if ".damaged-" in p.name]
    assert main(["verify", "--suite", "hard", "--results", str(tmp_path / "results")]) == 0


# ------------------------------------------------------------------------ resumable states


RESUME_SUITE = (SUITE.replace("epochs = 1\n", "epochs = 2\ncheckpoint_every = 1\n").replace("seeds = [0]", "seeds = [0, 1]")
                + "[methods.mc_dropout]\nsamples = 2\n")


def run_cells(suite: Path, store: Path, methods: tuple[str, ...], seeds: tuple[int, ...]):
    """Train, predict and store these cells of the suite (``bench.runner.run_plan``, no report)."""
    import torch

    from bench.cell import Console
    from bench.plan import make_plan
    from bench.registry import import_plugins
    from bench.runner import run_plan
    from bench.spec import Overrides, load_suite, select
    from bench.store import Store

    import_plugins([])  # the built-in methods and datasets
    plan = make_plan(select(load_suite(str(suite), Overrides(seeds=seeds, methods=methods)), methods))
    return plan, run_plan(plan, Store(store), torch.device("cpu"), Console(quiet=True))


@pytest.mark.usefixtures("one_torch_thread")
def test_a_foreign_or_edited_training_state_is_discarded_and_the_cell_starts_over(tmp_path, capsys, monkeypatch):
    """Resumable states taken from real interrupted runs (the process stops the moment its
    first state is on disk) are put where they do not belong: msp seed 0 gets msp seed 1's
    (other seed), msp seed 1 gets mc_dropout seed 0's (other method), and mc_dropout
    seed 0 gets its own with one weight changed.  Each is discarded with one warning naming
    the cell and why, and every cell ends with the predictions of a clean run."""
    import io

    import torch

    suite = tmp_path / "resume.toml"
    suite.write_text(RESUME_SUITE)
    plan, summary = run_cells(suite, tmp_path / "clean", ("msp", "mc_dropout"), (0, 1))
    key = {(c.method.name, c.seed): c.key for c in plan.cells}
    assert len(summary.done) == 4 and len(key) == 4
    store = tmp_path / "resumed"
    real_replace = os.replace

    def replace_then_die(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        if Path(dst).name == "train_state.pt":
            raise KeyboardInterrupt  # killed right after the state reached the disk

    states = {}
    for cell in [("msp", 1), ("mc_dropout", 0)]:
        with monkeypatch.context() as m:
            m.setattr(os, "replace", replace_then_die)
            with pytest.raises(KeyboardInterrupt):
                run_cells(suite, store, (cell[0],), (cell[1],))
        states[cell] = (store / key[cell] / "train_state.pt").read_bytes()
    edited = torch.load(io.BytesIO(states[("mc_dropout", 0)]), weights_only=True)
    weight = next(v for v in edited["model"].values() if v.is_floating_point() and v.numel() > 1)
    weight.view(-1)[0] += 0.25
    buf = io.BytesIO()
    torch.save(edited, buf)
    for cell, data in [(("msp", 0), states[("msp", 1)]), (("msp", 1), states[("mc_dropout", 0)]),
                       (("mc_dropout", 0), buf.getvalue())]:
        (store / key[cell]).mkdir(exist_ok=True)
        (store / key[cell] / "train_state.pt").write_bytes(data)
    capsys.readouterr()

    _, summary = run_cells(suite, store, ("msp", "mc_dropout"), (0, 1))
    err = capsys.readouterr().err
    assert sorted(summary.done) == sorted(key.values()) and not summary.failed, err
    from bench.store import CellDir

    for (method, seed), k in key.items():
        clean, resumed = CellDir(tmp_path / "clean" / k), CellDir(store / k)
        assert resumed.verify() and clean.splits() == resumed.splits()
        for split in clean.splits():
            for name, array in clean.read_arrays(split).items():
                np.testing.assert_array_equal(resumed.read_arrays(split)[name], array,
                                              err_msg=f"{method} seed {seed}: {split} {name}")
    for cell, why in [(("msp", 0), f"belongs to cell {key[('msp', 1)]}"),
                      (("msp", 1), f"belongs to cell {key[('mc_dropout', 0)]}"),
                      (("mc_dropout", 0), "do not match its checksum")]:
        warning = [ln for ln in err.splitlines() if f"({key[cell]}): train_state.pt not resumed" in ln]
        assert len(warning) == 1 and why in warning[0] and "starts over" in warning[0], err
    assert "resuming" not in err


def test_out_of_memory_fails_only_its_cell_with_a_hint(tmp_path, capsys, monkeypatch):
    import bench.cell

    def oom(*_a, **_k):
        raise MemoryError("cannot allocate 120 GB")

    monkeypatch.setattr(bench.cell, "fit", oom)
    code, err = run(tmp_path, capsys=capsys)
    assert code == 1 and "Traceback" not in err, err  # the run finished, with a failed cell
    cells = [p for p in (tmp_path / "results" / "hard").iterdir() if p.is_dir()]
    info = json.loads((cells[0] / "cell.json").read_text())
    assert info["status"] == "failed" and "out of memory" in info["reason"] and "batch_size 64" in info["reason"]


def test_read_only_directories_are_exit_2(tmp_path, capsys, monkeypatch):
    """A read-only filesystem (simulated: os.access denies writing; the tests run as root,
    for whom permissions do not apply) is found before any work."""
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if mode & os.W_OK else real_access(p, mode, **kw))
    code, err = run(tmp_path, capsys=capsys)
    assert code == 2 and "not writable" in err and "--results" in err and nothing_written(tmp_path)


def test_an_unreadable_cell_directory_is_named_and_the_run_goes_on(trained, tmp_path, capsys, monkeypatch):
    """Simulated with a PermissionError from the cell's files (root bypasses permissions)."""
    from bench.store import CellDir

    store, cells = copy_store(trained, tmp_path)
    locked = cells[0]
    real_read = CellDir.read_cell

    def read_cell(self):
        if self.path == locked:
            raise PermissionError(13, "Permission denied", str(self.path / "cell.json"))
        return real_read(self)

    monkeypatch.setattr(CellDir, "read_cell", read_cell)
    code, err, readme = report(tmp_path, capsys)
    assert code == 1 and "Traceback" not in err
    assert locked.name in section(readme, "Damaged cells") and "Permission denied" in section(readme, "Damaged cells")


def test_status_names_done_failed_interrupted_damaged_and_missing_cells(trained, tmp_path, capsys):
    """``status`` on a store: one line per cell that is not done, counts, and a time estimate
    from the done cells' recorded timings."""
    store, cells = copy_store(trained, tmp_path)
    flip_byte(cells[0] / "preds" / "test.npz")
    code = main(["status", "--suite", str(tmp_path / "hard.toml"), "--results", str(tmp_path / "results"),
                 "--seeds", "0,1,2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "seed 2: missing" in out and "damaged" in out and "1 done" in out and "1 missing" in out
    info = json.loads((cells[1] / "cell.json").read_text())
    per_cell = info["train_seconds"] + info["predict_seconds"]
    from bench.progress import duration

    expected = 2 * per_cell  # the damaged and the missing cell, at the done cell's pace, in seconds
    assert f"to run: {duration(expected)}" in out
