"""Scale-out: two runners on one store, the process-pool executor with 2 workers and the
submitit path with submitit's local executor, for real; and the sbatch script submitit
would write for SLURM.  The per-cell lock itself is tested in test_lock.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from bench.store import CellDir
from tests.helpers import REPO
from tests.helpers.suites import tiny_suite

TWO_METHODS = "[methods.msp]\n[methods.mc_dropout]\nsamples = 2\n"
TINY = tiny_suite(None, seeds=(0, 1), methods=TWO_METHODS,
                  data={"splits": ["test", "shift/digits_box", "ood/uniform_noise"]})  # named by its file: tiny


def _suite(tmp_path: Path, table: str = "") -> Path:
    """The tiny suite, with ``table`` (e.g. an ``[executor]`` table) appended."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY + table)
    return path


def _run(tmp_path: Path, *extra: str, results: str = "results", table: str = "") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "run_suite.py", "--suite", str(_suite(tmp_path, table)), "--results", str(tmp_path / results),
         "--reports", str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _trained(stderr: str) -> list[str]:
    """Cell labels this runner trained (one "complete in" line per trained cell)."""
    return [line.split("] ", 1)[1].split(":")[0] for line in stderr.splitlines() if ": complete in " in line]


# ---------------------------------------------------------------------------- runners and executors


@pytest.fixture(scope="module")
def two_runners(tmp_path_factory) -> tuple[Path, list[tuple[str, str]]]:
    """Two local runners started at once on one store of the tiny suite (4 cells); the
    folder and each runner's (stdout, stderr)."""
    root = tmp_path_factory.mktemp("two_runners")
    first, second = _run(root), _run(root)
    out = [p.communicate(timeout=600) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], out
    return root, out


def test_two_runners_on_one_store_train_every_cell_once(two_runners, capsys):
    from bench.run.cli import main

    root, out = two_runners
    a, b = _trained(out[0][1]), _trained(out[1][1])
    assert sorted(a + b) == sorted({*a, *b}) and len(a + b) == 4, (a, b)  # each of the 4 cells exactly once
    assert main(["verify", "--suite", "tiny", "--results", str(root / "results")]) == 0, capsys.readouterr()
    assert not list((root / "results" / "tiny").glob("*.lock"))


def _summary(reports: Path) -> pd.DataFrame:
    frame = pd.read_csv(reports / "tiny" / "tables" / "summary.csv")
    return frame.sort_values(["method"]).reset_index(drop=True)


POOL_TABLE = '\n[executor]\nkind = "processes"\nworkers = 2\n'


def test_the_executor_table_runs_a_process_pool_that_matches_the_local_executor(two_runners, tmp_path):
    """The suite file's ``[executor]`` table alone (no flag) runs its pool of 2 workers, and
    the pool stores the numbers of the local executor, cell for cell.  The table is no part
    of any cell: the store holds exactly the keys of the suite without it.  (The
    ``--executor``/``--workers`` flags run the pool in the killed-worker test below.)"""
    from bench.run.cli import main
    from bench.store.plan import make_plan
    from bench.core.registry import import_plugins
    from bench.config.spec import load_suite

    root, _ = two_runners  # trained by local executors
    assert main(["report", "--suite", "tiny", "--results", str(root / "results"), "--reports", str(tmp_path / "local"),
                 "--quiet"]) == 0
    pooled = _run(tmp_path, results="pooled", table=POOL_TABLE)
    _, err = pooled.communicate(timeout=600)
    assert pooled.returncode == 0, err
    # the pool's own lines: its size and the per-outcome queue count (the local executor prints neither)
    assert "executor processes: 2 worker(s)" in err and "queued or running" in err, err
    assert len(_trained(err)) == 4
    pd.testing.assert_frame_equal(_summary(tmp_path / "reports"), _summary(tmp_path / "local"))  # the same numbers
    import_plugins([])  # the built-in registries, as run_suite.py loads them
    plain = make_plan(load_suite(str(_suite(tmp_path))))
    store = tmp_path / "pooled" / "tiny"
    assert {p.name for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")} == \
        {c.key for c in plain.cells}
    assert "executor" not in (store / "suite.json").read_text()


def _kill_first_lock_holder(store: Path, done: threading.Event, killed: list[str]) -> None:
    """SIGKILL the first worker that locks a cell of ``store`` (the lock file names its
    owner's pid); the cell's key goes to ``killed``.  Gives up when ``done`` is set."""
    while not done.is_set():
        for lock in store.glob("*.lock"):
            try:
                pid = json.loads(lock.read_text())["pid"]
            except (OSError, ValueError, KeyError):
                continue  # just created, its owner not yet written
            os.kill(pid, signal.SIGKILL)
            killed.append(lock.name.removesuffix(".lock"))
            return
        time.sleep(0.01)


def test_a_killed_worker_fails_only_its_cell_and_the_next_run_retries_it(tmp_path, capsys):
    """SIGKILL, as the OOM killer sends it, to the worker training one of two cells: that
    cell is failed with the signal named, the other completes, the exit status is 1, and
    running the same command again trains the failed cell alone."""
    from bench.run.cli import main

    suite = tmp_path / "tiny.toml"  # two cells, msp seeds 0 and 1, predicting the test split alone
    suite.write_text(tiny_suite(None, seeds=(0, 1), methods=TWO_METHODS))
    command = ["--suite", str(suite), "--results", str(tmp_path / "results"), "--reports",
               str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"),
               "--executor", "processes", "--workers", "2", "--methods", "msp", "--name", "tiny"]
    store = tmp_path / "results" / "tiny"
    done, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_first_lock_holder, args=(store, done, killed))
    killer.start()
    try:
        code = main(command)
    finally:
        done.set()
        killer.join()
    err = capsys.readouterr().err
    assert killed, err
    key = killed[0]
    assert code == 1, err
    assert f"worker killed by SIGKILL while running {key}" in err, err
    assert len(_trained(err)) == 1, err  # the other worker's cell
    state, reason = CellDir(store / key).condition()
    assert state == "failed" and f"worker killed by SIGKILL while running {key}" in reason
    assert not list(store.glob("*.lock"))
    assert main(command) == 0
    err = capsys.readouterr().err
    assert len(_trained(err)) == 1 and "complete, skipped" in err, err
    assert CellDir(store / key).condition()[0] == "complete"


def test_executor_flags_override_the_table_key_by_key(tmp_path):
    from bench.run.cli import build_parser
    from bench.run.commands.run import executor_settings
    from bench.core.registry import import_plugins
    from bench.config.spec import load_suite

    import_plugins([])
    table = ('\n[executor]\nkind = "slurm"\nworkers = 3\npartition = "gpu"\ntime = 720\n'
             '[executor.options]\naccount = "uq"\nqos = "low"\n')
    suite = load_suite(str(_suite(tmp_path, table)))
    # no flag: the table, and the defaults for the keys it leaves out
    unset = executor_settings(build_parser().parse_args(["--suite", "x"]), suite.executor)
    assert unset == suite.executor
    assert (unset.kind, unset.workers, unset.partition, unset.time, unset.cpus) == ("slurm", 3, "gpu", 720, 8)
    flags = build_parser().parse_args(["--executor", "processes", "--workers", "2", "--slurm-time", "60",
                                       "--slurm-option", "qos=high", "--slurm-option", "mail-type=END"])
    merged = executor_settings(flags, suite.executor)
    assert (merged.kind, merged.workers, merged.partition, merged.time) == ("processes", 2, "gpu", 60)
    assert merged.options == {"account": "uq", "qos": "high", "mail_type": "END"}
    assert merged.slurm_options().time_min == 60


def test_a_bad_executor_table_stops_the_run_before_any_work(tmp_path, capsys):
    from bench.run.cli import main

    suite = _suite(tmp_path, '\n[executor]\nkind = "ray"\nworker = 2\n')
    code = main(["--suite", str(suite), "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"),
                 "--data-root", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "executor.kind: unknown executor 'ray'. Known executors: local, processes, slurm, submitit-local." in err
    assert "executor.worker: unknown key (did you mean 'workers'?)" in err
    assert not (tmp_path / "results").exists()


def test_submitit_local_executor_runs_every_cell(tmp_path):
    pytest.importorskip("submitit")
    proc = _run(tmp_path, "--executor", "submitit-local", "--methods", "msp", "--name", "tiny")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert len(_trained(err)) == 2
    assert list((tmp_path / "results" / "tiny" / ".submitit").glob("*_submission.sh")) or \
        list((tmp_path / "results" / "tiny" / ".submitit").glob("*"))


def test_sbatch_script_for_slurm(tmp_path, monkeypatch):
    """The script submitit hands to ``sbatch`` for our options, captured by stand-in
    ``sbatch``/``srun`` programs (no SLURM here): every option reaches its #SBATCH line."""
    pytest.importorskip("submitit")
    from bench.config.executor_config import SlurmOptions
    from bench.run.executors import submitit_executor

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


def test_slurm_jobs_resolve_the_device_on_their_own_node(tmp_path, monkeypatch, capsys):
    """A login node often has no GPU: with ``--executor slurm`` the submitting process does
    not resolve ``--device`` (``cuda`` is not refused there, ``auto`` does not become its
    CPU); each job carries the device asked for, and ``run_job`` resolves ``auto`` on the
    machine that runs it."""
    pytest.importorskip("submitit")
    from dataclasses import replace

    import torch

    from bench.run import executors
    from bench.run.cli import main
    from bench.run.executors import Outcome, run_job

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "srun"):  # stand-ins: require_executor wants SLURM on PATH; nothing is submitted
        (bin_dir / tool).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    submitted = []

    def submit(jobs, folder, kind, slurm):
        submitted.extend(jobs)
        return iter([Outcome(j.cell.key, j.cell.label, "failed", "not submitted (test)", 0.0) for j in jobs])

    monkeypatch.setattr(executors, "submitit_run", submit)
    for device in ("cuda", "auto"):
        submitted.clear()
        code = main(["--suite", str(_suite(tmp_path)), "--results", str(tmp_path / "results"), "--reports",
                     str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), "--methods", "msp",
                     "--executor", "slurm", "--device", device, "--quiet"])
        err = capsys.readouterr().err
        assert code != 0 and "not submitted (test)" in err, err  # the jobs reached the executor: nothing refused
        assert [j.device for j in submitted] == [device, device]
    outcome = run_job(replace(submitted[0], device="auto"))  # on this machine, as a job on its node
    assert outcome.status == "complete", outcome.detail
    cell = json.loads(next((tmp_path / "results").glob(f"*/{outcome.key}/cell.json")).read_text())
    assert cell["device"] == ("cuda" if torch.cuda.is_available() else "cpu")


# ---------------------------------------------------------------------------- SLURM settings, checked before any work


def _main_without_slurm(tmp_path: Path, monkeypatch, capsys, *extra: str, table: str = "") -> tuple[int, str]:
    """``run_suite.py`` in this process, on a PATH without SLURM's programs."""
    from bench.run.cli import main

    empty = tmp_path / "no-slurm-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    code = main(["--suite", str(_suite(tmp_path, table)), "--results", str(tmp_path / "results"), "--reports",
                 str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), "--methods", "msp", *extra])
    return code, capsys.readouterr().err


def _nothing_written(tmp_path: Path) -> bool:
    return not any((tmp_path / d).exists() for d in ("results", "reports", "data"))


@pytest.mark.parametrize("table, named", [
    ('[executor.options]\nqos = "normal\\ntouch X"\n', "executor.options.qos: 'normal\\ntouch X' contains"),
    ('[executor.options]\n"qos\\ntouch X" = "normal"\n', "executor.options.'qos\\ntouch X': 'qos\\ntouch X' contains"),
    ('[executor.options]\n"qos;touch X" = "normal"\n', "executor.options.qos;touch X: 'qos;touch X' is not an sbatch"),
    ('[executor]\npartition = "gpu\\rtouch X"\n', "executor.partition: 'gpu\\rtouch X' contains"),
])
def test_sbatch_settings_of_the_suite_that_would_leave_their_line_are_exit_2(tmp_path, monkeypatch, capsys,
                                                                            table, named):
    """Each ``[executor]`` setting becomes a line ``#SBATCH --key=value`` of the batch
    script: a newline in a key or value would make the rest a shell command of its own."""
    code, err = _main_without_slurm(tmp_path, monkeypatch, capsys, "--executor", "slurm", table="\n" + table)
    assert code == 2 and named in err, err
    assert not any(line.lstrip().startswith("touch X") for line in err.splitlines()), err
    assert _nothing_written(tmp_path)


@pytest.mark.parametrize("flag, named", [
    (("--slurm-option", "qos=normal\ntouch X"), "--slurm-option 'qos=normal\\ntouch X': 'normal\\ntouch X' contains"),
    (("--slurm-option", "q\tos=normal"), "--slurm-option 'q\\tos=normal': 'q\\tos' contains"),
    (("--slurm-option", "--qos x=normal"), "--slurm-option '--qos x=normal': '--qos x' is not an sbatch option name"),
    (("--slurm-partition", "gpu\ntouch X"), "--slurm-partition: 'gpu\\ntouch X' contains"),
])
def test_sbatch_flags_that_would_leave_their_line_are_one_line_exit_2(tmp_path, monkeypatch, capsys, flag, named):
    code, err = _main_without_slurm(tmp_path, monkeypatch, capsys, "--executor", "slurm", *flag)
    assert code == 2 and err.count("\n") == 1 and named in err, err
    assert _nothing_written(tmp_path)


def test_slurm_options_given_to_the_api_are_checked_where_the_script_is_made():
    from bench.core.errors import ConfigError
    from bench.config.executor_config import SlurmOptions

    with pytest.raises(ConfigError, match=r"sbatch option qos: 'high\\ntouch X' contains the control character U\+000A"):
        SlurmOptions(extra={"qos": "high\ntouch X"}).parameters()
    assert SlurmOptions(extra={"qos": "high"}).parameters()["slurm_additional_parameters"] == {"qos": "high"}


def test_slurm_executor_on_a_machine_without_slurm_is_one_line_exit_2_before_any_write(tmp_path, monkeypatch, capsys):
    code, err = _main_without_slurm(tmp_path, monkeypatch, capsys, "--executor", "slurm")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: --executor slurm: no sbatch or srun on PATH"), err
    assert _nothing_written(tmp_path)


def test_a_pool_hands_out_longer_cells_first_and_two_stage_cells_last():
    """dispatch_order: single-stage cells by epochs, most first, in plan order among equals;
    then the two-stage cells (their stage-1 cells are stored first), likewise."""
    from types import SimpleNamespace

    from bench.run.executors import Job, dispatch_order

    def job(name: str, epochs: int, two_stage: bool = False) -> Job:
        method = SimpleNamespace(name=name, train=SimpleNamespace(epochs=epochs))
        return Job(SimpleNamespace(method=method, stage1=object() if two_stage else None), "store", "cpu")

    plan = [job("msp", 40), job("cgpt", 10, True), job("mc", 40), job("sgpa", 80), job("scgpt", 30, True),
            job("kep", 40)]
    assert [j.cell.method.name for j in dispatch_order(plan)] == ["sgpa", "msp", "mc", "kep", "scgpt", "cgpt"]


def test_the_executors_are_a_registry_filled_where_they_are_defined():
    from bench.config.executor_config import ExecutorConfig
    from bench.core.errors import ConfigError
    from bench.core.registry import EXECUTORS

    assert EXECUTORS.names() == ["local", "processes", "slurm", "submitit-local"]
    assert EXECUTORS.names_from("bench.run.executors") == EXECUTORS.names()
    assert EXECUTORS.get("local")(ExecutorConfig()).in_process and EXECUTORS.get("slurm").other_nodes
    with pytest.raises(ConfigError, match=r"unknown executor 'proceses' \(at --executor\)\. Did you mean 'processes'\?"):
        EXECUTORS.get("proceses", key="--executor")
