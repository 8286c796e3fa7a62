"""The tiny suites the end-to-end tests run, and how they run them: ``run_suite.py`` as a
subprocess of the repository, and the report tables it writes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO


def one_cell_suite(name: str, train: str = "", model: str = "") -> str:
    """The smallest real suite: one msp cell (seed 0, 2 epochs) on 256 embedded MNIST images,
    predicting the test split; ``train`` / ``model`` add lines to those tables."""
    return f"""
name = "{name}"
seeds = [0]
[train]
epochs = 2
batch_size = 64
lr = 3e-3
warmup_epochs = 0
{train}
[model]
patch_size = 7
dim = 16
depth = 1
heads = 2
mlp_ratio = 1.0
{model}
[datasets.mnist5k]
train_limit = 256
eval_limit = 64
ood_size = 32
corruption_limit = 32
splits = ["test"]
[methods.msp]
"""


def run_suite(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "run_suite.py", *args], cwd=REPO, capture_output=True, text=True, timeout=600, env=env
    )


def tables(report_dir: Path) -> dict[str, bytes]:
    """Every table file, except the efficiency table, whose timings differ between runs."""
    return {f.name: f.read_bytes() for f in sorted((report_dir / "tables").iterdir())
            if not f.name.startswith("efficiency.")}
