"""Progress of a run (issue 29, item 3) and durations in words (item 10): bars on a
terminal (training per step, prediction per pass), a line per epoch and per split when
stderr is a file, nothing with ``--quiet``."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run.cli import main
from tests.helpers import REPO
from bench.core.progress import duration
from tests.helpers.suites import tiny_suite


SUITE = tiny_suite(None, train={"epochs": 2, "batch_size": 32}, data={"train_limit": 64, "eval_limit": 20},
                   methods="[methods.mc_dropout]\nsamples = 2\n")


def command(tmp_path: Path, *more: str) -> list[str]:
    (tmp_path / "p.toml").write_text(SUITE)
    return ["--suite", str(tmp_path / "p.toml"), "--results", str(tmp_path / "results"), "--reports",
            str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), "--format", "csv", *more]


def test_a_run_whose_stderr_is_a_file_prints_a_line_per_epoch_and_split_when_verbose(tmp_path, monkeypatch,
                                                                                      one_torch_thread):
    err = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", err)
    assert main(command(tmp_path, "--verbose")) == 0
    lines = err.getvalue().splitlines()
    assert "\r" not in err.getvalue()  # no bar redrawn in a log file
    for epoch in (1, 2):
        assert any(f"training: epoch {epoch}/2" in line and "cross-entropy" in line for line in lines), lines
    for split in ("val", "test"):
        assert any(f"predict {split}:" in line and "2 passes" in line for line in lines), lines
    assert any(line.startswith("analysis:") for line in lines) and any(line.startswith("plots:") for line in lines)


def test_a_run_whose_stderr_is_a_file_prints_one_line_per_cell_by_default(tmp_path, monkeypatch, one_torch_thread):
    """Without --verbose a log file gets the cell's outcome, not its epochs and splits
    (90 lines for one 1-epoch cell before); a training whose epochs take longer than
    bench.core.progress.HEARTBEAT still shows its latest epoch now and then (issue 39 row 8)."""
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(command(tmp_path)) == 0
    lines = err.getvalue().splitlines()
    assert not any("predict" in line or "training: epoch" in line for line in lines), lines
    assert sum(": complete in " in line for line in lines) == 1, lines
    assert len(lines) <= 8, lines  # the run, its cell, done, analysis, plots, report, the end


def test_a_long_training_shows_its_latest_epoch_once_a_heartbeat(monkeypatch):
    from bench.core import progress

    clock = iter([0.0, 10.0, 70.0, 80.0, 200.0])  # the task's start, then each note's time
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    shown: list[str] = []
    monkeypatch.setattr(progress, "write", shown.append)
    before = progress.mode(), progress.verbose()
    progress.configure("lines")
    try:
        with progress.task("cell: training") as task:
            for epoch in (1, 2, 3, 4):
                task.note(f"epoch {epoch}")
    finally:
        progress.configure(*before)
    assert shown == ["cell: training: epoch 2", "cell: training: epoch 4"]


def test_quiet_prints_nothing(tmp_path, capsys, one_torch_thread):
    assert main(command(tmp_path, "--quiet")) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_a_run_on_a_terminal_shows_bars_for_training_steps_and_prediction_passes(tmp_path):
    """stderr on a pseudo-terminal: bars count the training steps (2 per epoch here) and
    the predicted images of every pass."""
    pty = pytest.importorskip("pty")
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))  # a terminal 160 columns wide
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "run_suite.py", *command(tmp_path)], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closed: the run ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=300) == 0
    text = b"".join(chunks).decode(errors="replace")
    # bars drawn as they go (a bar is cleared when done): training counts 2 epochs x 2 steps,
    # prediction 20 images x 2 passes
    assert re.search(r"training: +\d+%\|.*\| \d/4 \[.*step", text), text
    assert re.search(r"predict test: +\d+%\|.*\| \d+/40 \[.*img", text), text


@pytest.mark.parametrize("seconds,words", [(0.04, "0.0 s"), (4.2, "4.2 s"), (40, "40 s"), (725, "12 min 5 s"),
                                           (3600 * 3 + 1200, "3 h 20 min")])
def test_durations_are_in_words_a_person_reads(seconds, words):
    assert duration(seconds) == words
