"""Scale-out: the per-cell lock (atomic take, heartbeat, stale break), two runners on one
store, the process-pool executor with 2 workers and the submitit path with submitit's
local executor, for real; and the sbatch script submitit would write for SLURM."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bench.lock import CellLock

REPO = Path(__file__).resolve().parents[1]

TINY = """
seeds = [0, 1]
[train]
epochs = 1
batch_size = 64
warmup_epochs = 0
eval_batch_size = 500
[model]
patch_size = 7
dim = 16
depth = 1
heads = 2
[datasets.mnist5k]
train_limit = 200
eval_limit = 100
ood_size = 50
corruption_limit = 20
splits = ["test", "shift/digits_box", "ood/uniform_noise"]
[methods.msp]
[methods.mc_dropout]
samples = 2
"""


def _suite(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def _run(tmp_path: Path, *extra: str, results: str = "results") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "run_suite.py", "--suite", str(_suite(tmp_path)), "--results", str(tmp_path / results),
         "--reports", str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _trained(stderr: str) -> list[str]:
    """Cell labels this runner trained (one "complete in" line per trained cell)."""
    return [line.split("] ", 1)[1].split(":")[0] for line in stderr.splitlines() if ": complete in " in line]


# ---------------------------------------------------------------------------- the lock


def test_lock_is_exclusive_beats_and_breaks_only_when_stale(tmp_path):
    path = tmp_path / "cell.lock"
    a = CellLock(path, heartbeat=0.05, stale_after=0.5)
    b = CellLock(path, heartbeat=0.05, stale_after=0.5)
    assert a.acquire() and not b.acquire()
    info = b.holder()
    assert info["pid"] == os.getpid() and info["age"] < 0.5
    time.sleep(0.8)  # longer than stale_after: only the heartbeat keeps it alive
    assert not b.acquire() and b.holder()["age"] < 0.5
    a.release()
    assert not path.exists() and b.acquire()
    b._stop.set()  # a runner that died: no more heartbeats
    b._thread.join()
    old = os.stat(path).st_mtime
    os.utime(path, (old - 10, old - 10))
    c = CellLock(path, heartbeat=0.05, stale_after=0.5)
    assert c.stale() and c.acquire()  # broken and taken
    assert json.loads(path.read_text())["token"] == c._token
    b.held = True
    b.release()  # the dead runner's late release must not remove the new owner's lock
    assert path.exists()
    c.release()
    assert not path.exists()
    with pytest.raises(ValueError):
        CellLock(path, heartbeat=1.0, stale_after=1.0)


def test_a_lock_left_by_a_killed_process_on_this_host_is_stale_at_once(tmp_path):
    path = tmp_path / "cell.lock"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path.write_text(json.dumps({"host": __import__("socket").gethostname(), "pid": int(dead.stdout), "since": 0}))
    lock = CellLock(path)  # fresh mtime, but its owner is gone
    assert lock.stale() and lock.acquire()
    lock.release()
    path.write_text(json.dumps({"host": __import__("socket").gethostname(), "pid": os.getpid(), "since": 0}))
    assert not CellLock(path).stale() and not CellLock(path).acquire()  # a live owner keeps it


# ---------------------------------------------------------------------------- runners and executors


def test_two_runners_on_one_store_train_every_cell_once(tmp_path):
    first, second = _run(tmp_path), _run(tmp_path)
    out = [p.communicate(timeout=600) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], out
    a, b = _trained(out[0][1]), _trained(out[1][1])
    assert sorted(a + b) == sorted({*a, *b}) and len(a + b) == 4, (a, b)  # each of the 4 cells exactly once
    verify = subprocess.run([sys.executable, "run_suite.py", "verify", "--suite", "tiny", "--results", str(tmp_path / "results")],
                            cwd=REPO, capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert not list((tmp_path / "results" / "tiny").glob("*.lock"))


def _summary(tmp_path: Path) -> pd.DataFrame:
    frame = pd.read_csv(tmp_path / "reports" / "tiny" / "tables" / "summary.csv")
    return frame.sort_values(["method"]).reset_index(drop=True)


def test_process_pool_with_two_workers_matches_the_local_run(tmp_path):
    local = _run(tmp_path, "--quiet", results="local")
    assert local.wait(timeout=600) == 0, local.stderr.read()
    reference = _summary(tmp_path)
    pooled = _run(tmp_path, "--executor", "processes", "--workers", "2", results="pooled")
    _, err = pooled.communicate(timeout=600)
    assert pooled.returncode == 0, err
    assert len(_trained(err)) == 4 and "2 worker(s)" in err and "queued or running" in err
    pd.testing.assert_frame_equal(_summary(tmp_path), reference)  # the same numbers, cell for cell


def test_submitit_local_executor_runs_every_cell(tmp_path):
    pytest.importorskip("submitit")
    proc = _run(tmp_path, "--executor", "submitit-local", "--methods", "msp")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert len(_trained(err)) == 2
    assert list((tmp_path / "results" / "tiny" / ".submitit").glob("*_submission.sh")) or \
        list((tmp_path / "results" / "tiny" / ".submitit").glob("*"))


def test_sbatch_script_for_slurm(tmp_path, monkeypatch):
    """The script submitit hands to ``sbatch`` for our options, captured by stand-in
    ``sbatch``/``srun`` programs (no SLURM here): every option reaches its #SBATCH line."""
    pytest.importorskip("submitit")
    from bench.executors import SlurmOptions, submitit_executor

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    copy = tmp_path / "submitted.sh"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nfor last; do :; done\ncp "$last" {copy}\necho "Submitted batch job 4242"\n')
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    options = SlurmOptions(partition="gpu", gpus_per_cell=1, cpus_per_cell=8, mem_gb=40, time_min=600,
                           array_limit=16, extra={"account": "uq", "qos": "high"})
    executor = submitit_executor(tmp_path / "jobs", "slurm", options)
    jobs = executor.map_array(abs, list(range(-20, 0)))
    assert jobs[0].job_id == "4242_0"
    text = copy.read_text()
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1", "#SBATCH --cpus-per-task=8",
                 "#SBATCH --mem=40GB", "#SBATCH --time=600", "#SBATCH --array=0-19%16", "#SBATCH --account=uq",
                 "#SBATCH --qos=high", "#SBATCH --signal=USR2@", "#SBATCH --ntasks-per-node=1"):
        assert line in text, (line, text)
