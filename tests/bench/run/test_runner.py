"""bench.run.runner: a plan's cells run and stored one by one; a training state that belongs to
another cell, or was edited, is discarded and the cell starts over; a cell that runs out of
memory fails alone, with a hint."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.suites import run_in_process as run, tiny_suite

RESUME_SUITE = tiny_suite("hard", seeds=(0, 1), train={"epochs": 2, "checkpoint_every": 1},
                          methods="[methods.msp]\n[methods.mc_dropout]\nsamples = 2\n")


def run_cells(suite: Path, store: Path, methods: tuple[str, ...], seeds: tuple[int, ...]):
    """Train, predict and store these cells of the suite (``bench.run.runner.run_plan``, no report)."""
    import torch

    from bench.train.telemetry import Console
    from bench.store.plan import make_plan
    from bench.core.registry import import_plugins
    from bench.run.runner import run_plan
    from bench.config.spec import Overrides, load_suite, select
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
            for name, array in clean.read_preds(split).arrays().items():
                np.testing.assert_array_equal(getattr(resumed.read_preds(split), name), array,
                                              err_msg=f"{method} seed {seed}: {split} {name}")
    for cell, why in [(("msp", 0), f"belongs to cell {key[('msp', 1)]}"),
                      (("msp", 1), f"belongs to cell {key[('mc_dropout', 0)]}"),
                      (("mc_dropout", 0), "do not match its checksum")]:
        warning = [ln for ln in err.splitlines() if f"({key[cell]}): train_state.pt not resumed" in ln]
        assert len(warning) == 1 and why in warning[0] and "starts over" in warning[0], err
    assert "resuming" not in err


def test_out_of_memory_fails_only_its_cell_with_a_hint(tmp_path, capsys, monkeypatch):
    import bench.train.cell

    def oom(*_a, **_k):
        raise MemoryError("cannot allocate 120 GB")

    monkeypatch.setattr(bench.train.cell, "fit", oom)
    code, err = run(tmp_path, capsys=capsys)
    assert code == 1 and "Traceback" not in err, err  # the run finished, with a failed cell
    cells = [p for p in (tmp_path / "results" / "hard").iterdir() if p.is_dir()]
    info = json.loads((cells[0] / "cell.json").read_text())
    assert info["status"] == "failed" and "out of memory" in info["reason"] and "batch_size 64" in info["reason"]


def test_a_post_hoc_cell_says_it_was_fitted_not_trained(tmp_path, capsys, one_torch_thread):
    """Last-layer Laplace on msp's stored cell trains nothing: its line says what it was
    fitted on, not a best epoch (its stage 1's), and the run counts it apart from the
    cells trained (issue 39 row 7)."""
    from bench.run.cli import main

    suite = tmp_path / "hard.toml"
    suite.write_text(tiny_suite("hard", methods='[methods.msp]\n[methods.laplace_last_layer]\nbase = "msp"\n'))
    code = main(["--suite", str(suite), "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"),
                 "--data-root", str(tmp_path / "data"), "--format", "csv"])
    err = capsys.readouterr().err
    assert code == 0, err
    (line,) = [ln for ln in err.splitlines() if "laplace_last_layer / seed 0: complete" in ln]
    assert "fitted on msp's stored cell" in line and "best epoch" not in line, line
    (msp,) = [ln for ln in err.splitlines() if "/ msp / seed 0: complete" in ln]
    assert "best epoch" in msp, msp
    assert "done: 1 trained, 1 fitted on a stored cell (post hoc), 0 skipped, 0 failed" in err, err


def test_a_resumed_run_counts_every_cell_and_says_the_time_left_at_each_methods_cost(tiny_store, tmp_path, capsys,
                                                                                     monkeypatch, one_torch_thread):
    """The tiny store's run with seeds 0-3, seeds 0 and 1 done: the lines count 4 cells
    from the skipped ones on ([3/4], [4/4]), the bar counts the same (total 4, from 2),
    and the time left after the third cell is the fourth at msp's measured cost, which the
    bar shows too; none after the last (issue 39 row 9)."""
    import shutil

    from bench.core import progress
    from bench.run.cli import main

    shutil.copytree(tiny_store / "results", tmp_path / "results")
    (tmp_path / "hard.toml").write_text(tiny_suite("hard", seeds=(0, 1, 2, 3)))
    bars: list[dict] = []
    real = progress.Task

    class Spy(real):
        def __init__(self, desc, total, unit, done, detail=False, initial=0, rate=True):
            super().__init__(desc, total, unit, done, detail, initial, rate)
            if desc == "cells":
                bars.append({"total": total, "initial": initial, "rate": rate, "suffixes": []})

        def suffix(self, text):
            if self.desc == "cells":
                bars[-1]["suffixes"].append(text)
            super().suffix(text)

    monkeypatch.setattr(progress, "Task", Spy)
    code = main(["--suite", str(tmp_path / "hard.toml"), "--results", str(tmp_path / "results"),
                 "--reports", str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), "--format", "csv"])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = err.splitlines()
    assert [ln.split("] ")[0] + "]" for ln in lines if ln.startswith("[")] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    (third,) = [ln for ln in lines if ln.startswith("[3/4]")]
    (fourth,) = [ln for ln in lines if ln.startswith("[4/4]")]
    assert third.split("; ")[-1].startswith("about ") and third.endswith(" left"), third
    assert "left" not in fourth, fourth
    (bar,) = bars
    assert (bar["total"], bar["initial"], bar["rate"]) == (4, 2, False)  # tqdm's own rate-based time left is off
    assert bar["suffixes"] == [third.split("; ")[-1], ""]
