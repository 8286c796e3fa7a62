"""Ctrl-C (issue 29, item 5): a real ``run_suite.py`` process gets SIGINT while it trains.
The first one ends it with one line saying what is done and where training was saved,
exit 130, no traceback; a second one stops it at once; the cell in progress resumes from
its saved epoch (``status`` shows it).  SIGTERM does the same (exit 143), stopping a
process pool's workers too."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.run.cli import main
from tests.helpers import REPO
from tests.helpers.suites import tiny_suite


# msp trains 1 epoch and is done; mc_dropout has 300 epochs, saved after each one
SUITE = tiny_suite(None, train={"batch_size": 32, "checkpoint_every": 1}, data={"train_limit": 64, "eval_limit": 20},
                   methods="[methods.msp]\ntrain = { epochs = 1 }\n[methods.mc_dropout]\nsamples = 2\ntrain = { epochs = 300 }\n")


def start(tmp_path: Path, *more: str) -> tuple[subprocess.Popen, list[str]]:
    """The run, once its second cell has finished 2 epochs (stderr is a pipe and --verbose:
    a line per epoch); returns the process and the stderr lines read so far."""
    (tmp_path / "i.toml").write_text(SUITE)
    proc = subprocess.Popen(
        [sys.executable, "run_suite.py", "--suite", str(tmp_path / "i.toml"), "--name", "ctrlc",
         "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"),
         "--data-root", str(tmp_path / "data"), "--verbose", *more],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "mc_dropout / seed 0: training: epoch 2/300" in line:
            return proc, lines
    proc.kill()
    raise AssertionError("the run never reached epoch 2 of its second cell:\n" + "".join(lines))


def test_ctrl_c_prints_one_line_exits_130_and_the_cell_resumes_from_its_saved_epoch(tmp_path, capsys):
    proc, lines = start(tmp_path)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(lines) + rest
    assert "Traceback" not in rest, rest
    last = rest.strip().splitlines()[-1]
    match = re.fullmatch(r"interrupted: 1 cell done, 1 in progress saved at epoch (\d+); "
                         r"run the same command to resume", last)
    assert match and int(match.group(1)) >= 1, rest
    # the store knows it: status shows the cell in progress with its saved epoch
    assert main(["status", "ctrlc", "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert f"interrupted: last saved epoch {match.group(1)}/300" in out and "1 done" in out, out


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    proc, lines = start(tmp_path, "--methods", "mc_dropout")
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(lines) + rest
    assert "Traceback" not in rest, rest
    assert time.monotonic() - started < 30
    assert rest.strip().splitlines()[-1].startswith(("interrupted again: stopped at once", "interrupted: ")), rest


WIND_DOWN = """
import sys, time
from bench.run.interrupt import CtrlC
with CtrlC():
    try:
        print("running", flush=True)
        time.sleep(120)
    except KeyboardInterrupt:
        print("winding down", flush=True)  # a slow wind-down: a second Ctrl-C must not wait for it
        time.sleep(120)
        print("wound down", flush=True)
"""


def test_a_second_ctrl_c_during_a_slow_wind_down_stops_at_once():
    """The run above winds down faster than a second signal can reliably land in it; here the
    wind-down after the first Ctrl-C lasts two minutes, and the second ends the process at
    once with exit 130 and its one line."""
    proc = subprocess.Popen([sys.executable, "-c", WIND_DOWN], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "running"
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline().strip() == "winding down"
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - started < 30, (out, err)
    assert "wound down" not in out and err.strip().splitlines()[-1] == "interrupted again: stopped at once", err


def test_sigterm_stops_the_pool_workers_and_releases_their_cells_locks(tmp_path):
    """SIGTERM to a runner whose two pool workers each train a cell: it ends as Ctrl-C does
    (one line, exit 143), and its workers stop with it, each releasing its cell's lock
    (issue 43, row 10); before, both went on training, holding their locks."""
    (tmp_path / "t.toml").write_text(tiny_suite(None, seeds=(0, 1), train={"epochs": 300, "batch_size": 32},
                                                data={"train_limit": 64, "eval_limit": 20}))
    proc = subprocess.Popen(
        [sys.executable, "run_suite.py", "--suite", str(tmp_path / "t.toml"), "--name", "term",
         "--executor", "processes", "--workers", "2", "--results", str(tmp_path / "results"),
         "--reports", str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), "--verbose"],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store, lines, training, workers = tmp_path / "results" / "term", [], set(), []
    try:
        for line in proc.stderr:  # the workers' epoch lines (--verbose) come through the runner's stderr
            lines.append(line)
            training |= {seed for seed in (0, 1) if f"seed {seed}: training: epoch 1/300" in line}
            if training == {0, 1}:
                break
        assert training == {0, 1}, "".join(lines)
        workers = [json.loads(lock.read_text())["pid"] for lock in store.glob("*.lock")]
        assert len(workers) == 2, "".join(lines)
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=120)
        assert proc.returncode == 143 and "Traceback" not in rest, "".join(lines) + rest
        assert rest.strip().splitlines()[-1].startswith("interrupted: 0 cells done, 2 in progress"), rest
        assert not list(store.glob("*.lock"))
        assert not [pid for pid in workers if alive(pid)]
    finally:
        proc.kill()
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
