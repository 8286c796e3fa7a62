"""One cell: its peak memory on CPU (the window restarts at every cell instead of growing
with the process's lifetime peak), and a cell whose file cannot be written."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.cell import peak_memory_mb, reset_peak_memory
from bench.store import CellDir
from tests.helpers import REPO
from tests.helpers.suites import tiny_suite

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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="sets the child's file-size limit (POSIX)")
def test_a_cell_whose_training_features_exceed_the_file_size_limit_fails_in_one_line_naming_the_file(tmp_path, capsys):
    """The training features (41 kB here: 1,024 images) are the cell's largest file; under a
    30 kB file-size limit (``ulimit -f``) writing them raises EFBIG, which names no file.  The
    cell fails in one line naming it, with no traceback; the same command without the limit
    redoes the cell (issue 43, row 9)."""
    from bench.cli import main

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
