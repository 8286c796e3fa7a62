"""The per-cell lock (bench.store.lock): exclusive take, heartbeat, and the break of a stale lock,
judged by the holder's liveness on this machine and by its heartbeat elsewhere, with
several processes breaking the same stale lock at once."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time

import pytest

from bench.store.lock import CellLock

ELSEWHERE = "node-elsewhere.invalid"  # a holder on another host: only its heartbeat tells whether it lives


def _dead_pid() -> int:
    """The pid of a process of this host that has exited."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _plant(path, host: str, pid: int, age: float = 0.0) -> None:
    """A lock file as a runner on ``host`` with ``pid`` leaves it, last refreshed ``age``
    seconds ago (negative: in the future, as a skewed clock would stamp it)."""
    path.write_text(json.dumps({"host": host, "pid": pid, "since": 0}))
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))


# ---------------------------------------------------------------------------- one process


def test_lock_is_exclusive_and_its_heartbeat_keeps_it_fresh(tmp_path):
    path = tmp_path / "cell.lock"
    a = CellLock(path, heartbeat=0.05, stale_after=0.5)
    b = CellLock(path, heartbeat=0.05, stale_after=0.5)
    assert a.acquire() and not b.acquire()
    info = b.holder()
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname() and info["age"] < 0.5
    time.sleep(0.8)  # longer than stale_after: the heartbeat keeps the lock fresh
    assert b.holder()["age"] < 0.5 and not b.stale() and not b.acquire()
    a.release()
    assert not path.exists() and b.acquire()
    b.release()
    assert not path.exists()


def test_a_late_release_never_removes_the_next_holders_lock(tmp_path):
    path = tmp_path / "cell.lock"
    first = CellLock(path)
    assert first.acquire()
    path.unlink()  # broken by another runner (its holder judged dead) and taken again:
    second = CellLock(path)
    assert second.acquire()
    first.release()  # the first holder's release comes late
    assert path.exists() and json.loads(path.read_text())["pid"] == os.getpid()
    assert not CellLock(path).acquire()
    second.release()
    assert not path.exists()


def test_a_lock_left_by_a_killed_process_on_this_host_is_stale_at_once(tmp_path):
    path = tmp_path / "cell.lock"
    _plant(path, socket.gethostname(), _dead_pid())  # fresh heartbeat, but its owner is gone
    lock = CellLock(path)
    assert lock.stale() and lock.acquire()
    lock.release()
    _plant(path, socket.gethostname(), os.getpid(), age=3600)  # a live owner keeps it, whatever its heartbeat
    assert not CellLock(path).stale() and not CellLock(path).acquire()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="process start times come from Linux /proc")
def test_a_pid_now_used_by_a_later_process_does_not_keep_the_lock(tmp_path):
    path = tmp_path / "cell.lock"
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": 1, "since": 0}))
    assert CellLock(path).stale()  # this pid lives, but it is a process started after the owner


def test_a_host_name_shared_by_another_machine_falls_back_to_the_heartbeat(tmp_path):
    path = tmp_path / "cell.lock"
    lock = CellLock(path, heartbeat=1.0, stale_after=60.0)
    twin = {"host": socket.gethostname(), "pid": _dead_pid(), "machine": "another-boot pid:[1]", "since": 0}
    path.write_text(json.dumps(twin))  # its pid means nothing here: a fresh heartbeat holds it
    assert not lock.stale() and not lock.acquire()
    os.utime(path, (time.time() - 600, time.time() - 600))
    assert lock.stale()


def test_a_holder_on_another_host_is_judged_by_its_heartbeat_both_ways(tmp_path):
    path = tmp_path / "cell.lock"
    lock = CellLock(path, heartbeat=1.0, stale_after=60.0)
    _plant(path, ELSEWHERE, 1, age=5)  # beating: held
    assert not lock.stale() and not lock.acquire()
    _plant(path, ELSEWHERE, 1, age=-5)  # a few seconds in the future (clock skew within the limit): held
    assert not lock.stale() and not lock.acquire()
    _plant(path, ELSEWHERE, 1, age=600)  # silent for 10 minutes: its runner died
    assert lock.stale() and lock.acquire()
    lock.release()
    _plant(path, ELSEWHERE, 1, age=-86400)  # a day in the future: no live heartbeat stamps that, it must not hold forever
    assert lock.stale() and lock.acquire()
    lock.release()


# ---------------------------------------------------------------------------- many processes at once

CONTENDERS, ROUNDS = 4, 1000


def _contend(index: int, path: str, rounds: int, dead: int, barrier, won) -> None:
    """One contender: in every round, try to take the lock at the same moment as the
    others; ``won[round * CONTENDERS + index]`` records a success.  Contender 0 plants the
    next round's stale lock, alternately a dead process of this host and a silent holder on
    another host."""
    host = socket.gethostname()
    for r in range(rounds):
        if index == 0:
            _plant_stale(path, host if r % 2 else ELSEWHERE, dead)
        barrier.wait()  # the stale lock is in place
        lock = CellLock(path, heartbeat=3600.0, stale_after=7200.0)
        won[r * CONTENDERS + index] = lock.acquire()
        barrier.wait()  # every contender has tried
        lock.release()
        barrier.wait()  # the holder has let go


def _plant_stale(path: str, host: str, dead: int) -> None:
    with open(path, "w") as f:
        json.dump({"host": host, "pid": dead, "since": 0}, f)
    os.utime(path, (0, 0))  # last heartbeat in 1970


def test_contenders_breaking_one_stale_lock_at_once_never_both_hold_it(tmp_path):
    """4 processes x 1,000 rounds: every round exactly one of them holds the lock."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(CONTENDERS)
    won = ctx.RawArray("b", CONTENDERS * ROUNDS)
    path, dead = str(tmp_path / "cell.lock"), _dead_pid()
    procs = [ctx.Process(target=_contend, args=(i, path, ROUNDS, dead, barrier, won)) for i in range(CONTENDERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0] * CONTENDERS
    holders = [sum(won[r * CONTENDERS:(r + 1) * CONTENDERS]) for r in range(ROUNDS)]
    double = [r for r, n in enumerate(holders) if n > 1]
    none = [r for r, n in enumerate(holders) if n == 0]
    assert not double, f"{len(double)} of {ROUNDS} rounds had two or more holders (first: round {double[0]})"
    assert not none, f"{len(none)} of {ROUNDS} rounds left the stale lock unbroken (first: round {none[0]})"
