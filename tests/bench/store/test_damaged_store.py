"""A damaged store is named, never fatal: ``report`` lists each damaged or incomplete cell
and exits 1, ``verify`` and ``status`` name the damage, and ``run`` moves a damaged cell
aside and redoes it.  The store is a real run of the tiny suite, damaged by each test in
its own copy."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.run.cli import main
from tests.helpers.suites import run_in_process as run


def copy_store(tiny_store: Path, tmp_path: Path) -> tuple[Path, list[Path]]:
    import shutil

    shutil.copytree(tiny_store / "results", tmp_path / "results")
    (tmp_path / "hard.toml").write_text((tiny_store / "hard.toml").read_text())
    cells = sorted(c for c in (tmp_path / "results" / "hard").iterdir() if c.is_dir())
    return tmp_path / "results" / "hard", cells


def report(tmp_path: Path, capsys, *extra: str) -> tuple[int, str, str]:
    """``report --partial`` of the copied store: a report that names the cells it leaves out."""
    code = main(["report", "--suite", str(tmp_path / "hard.toml"), "--results", str(tmp_path / "results"),
                 "--reports", str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), "--partial", *extra])
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
def test_report_names_every_damaged_cell_and_exits_1(tiny_store, tmp_path, capsys, damage):
    store, cells = copy_store(tiny_store, tmp_path)
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


def test_deleted_manifest_is_named_as_incomplete(tiny_store, tmp_path, capsys):
    store, cells = copy_store(tiny_store, tmp_path)
    (cells[1] / "manifest.json").unlink()
    code, _, readme = report(tmp_path, capsys)
    assert code == 1 and "no manifest" in section(readme, "Failed cells")


def test_run_moves_a_damaged_cell_aside_and_redoes_it(tiny_store, tmp_path, capsys):
    store, cells = copy_store(tiny_store, tmp_path)
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
def test_a_store_only_report_whose_name_is_no_folder_name_is_exit_2(tiny_store, tmp_path, capsys, name, results):
    """``report --results DIR --suite NAME`` with NAME '..', '' or '.' (DIR/NAME a real
    store) would write the report outside --reports or into its root: one line, nothing written."""
    copy_store(tiny_store, tmp_path)
    (tmp_path / "results" / "hard" / "sub").mkdir()
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    code = main(["report", "--suite", name, "--results", str(tmp_path / results), "--reports", str(tmp_path / "reports")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"--suite: {name!r} cannot name a suite" in err, err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before


def test_report_matching_nothing_is_exit_2_and_keeps_the_old_report(tiny_store, tmp_path, capsys):
    store, _ = copy_store(tiny_store, tmp_path)
    code, _, readme = report(tmp_path, capsys)
    assert code == 0
    before = {p: p.read_bytes() for p in (tmp_path / "reports").rglob("*") if p.is_file()}
    code, err, _ = report(tmp_path, capsys, "--seeds", "7")
    assert code == 2 and "no cell for this selection" in err
    assert {p: p.read_bytes() for p in (tmp_path / "reports").rglob("*") if p.is_file()} == before
    # other --epochs than the run: the store's cells are still found (the suite only selects)
    code, _, again = report(tmp_path, capsys, "--epochs", "3")
    assert code == 0 and section(again, "mnist5k") == section(readme, "mnist5k")


def test_disk_full_while_reporting_is_one_line_naming_the_path(tiny_store, tmp_path, capsys, monkeypatch):
    import errno

    import bench.report

    copy_store(tiny_store, tmp_path)

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(bench.report, "atomic_write_text", full)
    code, err, _ = report(tmp_path, capsys)
    assert code == 1 and "No space left on device" in err and "reports" in err and "Traceback" not in err, err


def test_verify_names_damage_and_exits_1(tiny_store, tmp_path, capsys):
    store, cells = copy_store(tiny_store, tmp_path)
    assert main(["verify", "--suite", "hard", "--results", str(tmp_path / "results")]) == 0
    flip_byte(cells[1] / "preds" / "test.npz")
    assert main(["verify", "--suite", "hard", "--results", str(tmp_path / "results")]) == 1
    out = capsys.readouterr().out
    assert f"{cells[1].name}: damaged: preds/test.npz does not match" in out and "1 complete" in out


def test_verify_status_and_run_judge_contents_not_only_hashes(tiny_store, tmp_path, capsys):
    """A prediction file rewritten with object arrays and its new hash in the manifest:
    verify (exit 1) and status call the cell damaged, and run redoes it, saying so."""
    store, cells = copy_store(tiny_store, tmp_path)
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


def test_verify_judges_the_checkpoint_a_two_stage_method_would_start_from(tiny_store, tmp_path, capsys):
    """msp's checkpoint.pt replaced by an empty state dict after the cell completed, its new
    hash written into the manifest: verify calls the cell damaged, naming the checkpoint."""
    import hashlib

    import torch

    store, cells = copy_store(tiny_store, tmp_path)
    torch.save({}, cells[0] / "checkpoint.pt")
    manifest = json.loads((cells[0] / "manifest.json").read_text())
    manifest["files"]["checkpoint.pt"] = hashlib.sha256((cells[0] / "checkpoint.pt").read_bytes()).hexdigest()
    (cells[0] / "manifest.json").write_text(json.dumps(manifest))
    assert main(["verify", "--suite", "hard", "--results", str(tmp_path / "results")]) == 1
    out = capsys.readouterr().out
    assert f"{cells[0].name}: damaged: checkpoint.pt holds no weights (an empty state dict)" in out, out


def test_an_unreadable_cell_directory_is_named_and_the_run_goes_on(tiny_store, tmp_path, capsys, monkeypatch):
    """Simulated with a PermissionError from the cell's files (root bypasses permissions)."""
    from bench.store import CellDir

    store, cells = copy_store(tiny_store, tmp_path)
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


def test_status_names_done_failed_interrupted_damaged_and_missing_cells(tiny_store, tmp_path, capsys):
    """``status`` on a store: one line per cell that is not done, counts, and a time estimate
    from the done cells' recorded timings."""
    store, cells = copy_store(tiny_store, tmp_path)
    flip_byte(cells[0] / "preds" / "test.npz")
    code = main(["status", "--suite", str(tmp_path / "hard.toml"), "--results", str(tmp_path / "results"),
                 "--seeds", "0,1,2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "seed 2: missing" in out and "damaged" in out and "1 done" in out and "1 missing" in out
    info = json.loads((cells[1] / "cell.json").read_text())
    per_cell = info["train_seconds"] + info["predict_seconds"]
    from bench.core.progress import duration

    expected = 2 * per_cell  # the damaged and the missing cell, at the done cell's pace, in seconds
    assert f"to run: {duration(expected)}" in out
