"""One lock per cell, so that several runners (two terminals, two SLURM arrays, a process
pool) on one store never train the same cell at once.  No lock server: a lock is a file
next to the cell directory, taken atomically on the shared filesystem.

* **Take**: ``os.open(<store>/<key>.lock, O_CREAT | O_EXCL)`` (atomic on local
  filesystems and NFSv3+), then the owner (host, pid, time) is written into it.
* **Heartbeat**: while the cell runs, a daemon thread refreshes the file's modification
  time every ``heartbeat`` seconds.
* **Stale**: a lock whose modification time is older than ``stale_after`` seconds belongs
  to a runner that died (killed, preempted, node lost); so does, at once, a lock taken on
  this host by a process that no longer exists (a killed run restarted at once resumes).  Another runner breaks it by
  renaming it to a unique name first (only one rename of a path can succeed, so two
  runners never both break it and both take it), then takes the lock as above.
* **Release**: the owner removes the file (only if it still holds it).

A runner that finds a cell locked by a live owner leaves it alone and says so; the cell's
own state (complete, resumable training state) is checked again after the lock is taken,
so a cell finished by another runner in the meantime is not redone.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

LOCK_SUFFIX = ".lock"
HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 120.0  # a lock not refreshed for this long belongs to a dead runner


def owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}


def _alive(pid) -> bool:
    """Whether a process ``pid`` exists on this host (unknown pids count as alive)."""
    if not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. no permission to signal it: it exists
        return True
    return True


class CellLock:
    """The lock of one cell (module docstring): ``with CellLock(path) as got: ...`` or
    :meth:`acquire` / :meth:`release`."""

    def __init__(self, path: Path, heartbeat: float = HEARTBEAT_SECONDS, stale_after: float = STALE_SECONDS) -> None:
        if stale_after <= heartbeat:
            raise ValueError(f"stale_after ({stale_after}) must exceed the heartbeat ({heartbeat})")
        self.path = Path(path)
        self.heartbeat, self.stale_after = heartbeat, stale_after
        self.held = False
        self._token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- state ---------------------------------------------------------------------------
    def holder(self) -> dict | None:
        """The owner recorded in the lock file (with ``age``: seconds since its last
        heartbeat), or None when the cell is not locked."""
        try:
            age = time.time() - self.path.stat().st_mtime
            info = json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            info = {}
        return {**(info if isinstance(info, dict) else {}), "age": age}

    def stale(self) -> bool:
        info = self.holder()
        if info is None:
            return False
        return info["age"] > self.stale_after or (info.get("host") == socket.gethostname() and not _alive(info.get("pid")))

    # --- take and give back --------------------------------------------------------------
    def acquire(self) -> bool:
        """Take the lock (breaking a stale one); False when a live runner holds it."""
        if self.held:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self.stale():
                    return False
                try:  # only one runner's rename of the stale file succeeds
                    os.rename(self.path, self.path.with_name(f"{self.path.name}.stale-{uuid.uuid4().hex[:8]}"))
                except FileNotFoundError:
                    pass  # another runner broke it first; try to take it (once more)
                else:
                    self._discard_stale()
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({**owner(), "token": self._token}, f)
            self.held = True
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat, name=f"heartbeat {self.path.name}", daemon=True)
            self._thread.start()
            return True
        return False

    def release(self) -> None:
        if not self.held:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.held = False
        try:
            if json.loads(self.path.read_text(encoding="utf-8")).get("token") == self._token:
                self.path.unlink()
        except (OSError, ValueError):
            pass  # broken by another runner as stale (we were too slow): not ours any more

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            try:
                os.utime(self.path)
            except OSError:
                return

    def _discard_stale(self) -> None:
        for old in self.path.parent.glob(f"{self.path.name}.stale-*"):
            old.unlink(missing_ok=True)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
