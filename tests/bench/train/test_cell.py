"""One cell (``bench/train/cell.py``): the per-cell peak memory on CPU restarts at every cell
instead of growing with the process's lifetime peak; a two-stage cell refuses a stage-1
cell whose weights are unusable; a cell whose file cannot be written fails naming it."""
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.train.telemetry import peak_memory_mb, reset_peak_memory
from bench.store import CellDir
from tests.helpers import REPO
from tests.helpers.suites import tiny_suite
from bench.store.record import CellRecord

CPU = torch.device("cpu")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_peak_memory_window_restarts_at_each_cell():
    reset_peak_memory(CPU)
    big = np.ones(40_000_000)  # 320 MB, touched
    del big
    after_big = peak_memory_mb(CPU)
    reset_peak_memory(CPU)
    small = np.ones(2_000_000)  # 16 MB
    del small
    after_small = peak_memory_mb(CPU)
    assert after_big > 300
    assert after_small < after_big - 250  # the 320 MB peak is not carried into the next window


# ----------------------------------------------------------------- a two-stage cell's stage 1

def _two_stage(tmp_path, method: str, checkpoint: dict):
    """A tiny suite of msp and ``method`` (two-stage on msp), the store holding msp's cell of
    seed 0 sealed with ``checkpoint`` as its weights (its manifest vouches for them), and
    the two-stage cell with its data (squares images: no data set is read)."""
    import json

    import tomllib

    from bench.store.plan import make_plan
    from bench.config.spec import build_suite
    from bench.store import Store
    from tests.helpers.suites import tiny_suite
    from tests.helpers.synthetic import squares_bundle

    raw = tomllib.loads(tiny_suite("two", methods=f'[methods.msp]\n[methods.{method}]\nbase = "msp"\n',
                                   model={"patch_size": 5}))
    first, cell = make_plan(build_suite(raw)).cells
    store = Store(tmp_path / "two")
    stage1 = store.cell(first.key)
    stage1.reset()
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    stage1.write_checkpoint(buf.getvalue())
    stage1.seal(CellRecord.from_json({"key": first.key, "dataset": "mnist5k", "method": "msp", "seed": 0, "config": first.config,
                 "train_seconds": 1.0, "best_epoch": 1, "best_val_acc": 0.5}))
    assert json.loads((stage1.path / "manifest.json").read_text())["files"]["checkpoint.pt"]
    return store, first, cell, squares_bundle()


@pytest.mark.parametrize("method, checkpoint, why", [
    ("cgpt", {}, "is damaged: checkpoint.pt holds no weights (an empty state dict)"),
    ("cgpt", {"weight": torch.zeros(3)}, "holds a checkpoint.pt that does not fit msp's network (it lacks "),
    ("laplace_last_layer", {"weight": torch.zeros(3)}, "holds a checkpoint.pt that does not fit msp's network"),
])
def test_a_stage1_cell_whose_weights_are_unusable_is_refused_naming_it(tmp_path, method, checkpoint, why):
    """msp's stored checkpoint emptied, or holding weights of another network, under a
    sealed manifest: the two-stage cell (CGPT fine-tuning, last-layer Laplace post hoc) is
    stored as failed with a reason naming the stage-1 cell and what is wrong; nothing is
    trained from those weights and no load_state_dict error escapes."""
    import json

    import methods  # noqa: F401  (registers cgpt and laplace_last_layer)
    from bench.train.cell import run_cell
    from bench.train.telemetry import Console

    store, first, cell, data = _two_stage(tmp_path, method, checkpoint)
    cd = store.cell(cell.key)
    status, detail = run_cell(cell, data, cd, CPU, Console(quiet=True))
    assert status == "failed", detail
    assert detail.startswith(f"its stage-1 cell {first.key} (mnist5k / msp / seed 0) {why}"), detail
    info = json.loads((cd.path / "cell.json").read_text())
    assert info["status"] == "failed" and info["reason"] == detail
    assert not (cd.path / "checkpoint.pt").exists() and not (cd.path / "train_log.csv").exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="sets the child's file-size limit (POSIX)")
def test_a_cell_whose_training_features_exceed_the_file_size_limit_fails_in_one_line_naming_the_file(tmp_path, capsys):
    """The training features (41 kB here: 1,024 images) are the cell's largest file; under a
    30 kB file-size limit (``ulimit -f``) writing them raises EFBIG, which names no file.  The
    cell fails in one line naming it, with no traceback; the same command without the limit
    redoes the cell (issue 43, row 9)."""
    from bench.run.cli import main

    suite = tmp_path / "big.toml"
    suite.write_text(tiny_suite("big", data={"train_limit": 1024}))
    argv = ["--suite", str(suite), "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"),
            "--data-root", str(tmp_path / "data"), "--quiet"]

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (30_000, 30_000))

    done = subprocess.run([sys.executable, "run_suite.py", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=600, preexec_fn=limit)
    (cell,) = [p for p in (tmp_path / "results" / "big").iterdir() if (p / "cell.json").is_file()]
    features = cell / "features" / "train.npz"
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if "FAILED" in ln]
    assert f"File too large ({features})" in line and "ulimit -f" in line, done.stderr
    assert CellDir(cell).condition()[0] == "failed"
    assert main(argv) == 0, capsys.readouterr().err
    assert CellDir(cell).condition()[0] == "complete" and features.is_file()


def test_a_two_stage_cell_that_fails_loading_its_stage1_weights_keeps_the_stage1_record(tmp_path):
    """A failure while the stage-1 weights go into the network (after they were checked):
    the failed cell's cell.json still says which stage-1 cell it started from."""
    import methods  # noqa: F401  (registers cgpt)
    from bench.core.registry import METHODS
    from bench.train.cell import run_cell
    from bench.train.telemetry import Console
    from methods.cgpt import CGPT

    if "_cgpt_fails_loading" not in METHODS:
        @METHODS.register("_cgpt_fails_loading")
        class _FailsLoading(CGPT):
            def init_from_stage1(self, model, state):
                raise RuntimeError("no room for the stage-1 weights")

    import tomllib

    from bench.config.spec import build_suite
    from bench.store.plan import make_plan
    from tests.helpers.synthetic import squares_bundle

    # msp's real weights for this suite's model, so that every check of the stage-1 cell passes
    raw = tomllib.loads(tiny_suite("two", methods='[methods.msp]\n[methods._cgpt_fails_loading]\nbase = "msp"\n',
                                   model={"patch_size": 5}))
    msp = make_plan(build_suite(raw)).cells[0]
    weights = METHODS.get("msp")(msp.method.options).build_model(msp.method.model, squares_bundle()).state_dict()
    store, first, cell, data = _two_stage(tmp_path, "_cgpt_fails_loading", weights)
    cd = store.cell(cell.key)
    status, detail = run_cell(cell, data, cd, CPU, Console(quiet=True))
    assert status == "failed" and "no room for the stage-1 weights" in detail, detail
    record = cd.read_cell()
    assert record.failed and record.stage1 is not None and record.stage1.key == first.key
