"""One lock per cell, so that several runners (two terminals, two SLURM arrays, a process
pool) on one store never train the same cell at once.  No lock server: a lock is a file
next to the cell directory, ``<store>/<key>.lock``, holding its owner (host, pid, ...).

* **Take**: ``os.open(<key>.lock, O_CREAT | O_EXCL)``, atomic on local filesystems and on
  NFSv3+, Lustre, GPFS and BeeGFS, so two runners never both create it; then the owner is
  written into it.
* **Heartbeat**: while the cell runs, a daemon thread refreshes the file's modification
  time every ``heartbeat`` seconds.
* **Stale**: a lock whose owner is gone.  An owner on *this* machine (same host name, same
  boot and pid namespace) is judged by its process alone: a lock is stale at once when its
  pid no longer exists or now belongs to a process started later (a reused pid), and never
  while its process lives, whatever the clock says.  An owner on another host is judged by
  its heartbeat: stale when the file's modification time is more than ``stale_after``
  seconds from now, in the past (its runner died: killed, preempted, node lost) or in the
  future (no live heartbeat stamps that; a clock skewed by more than ``stale_after`` must
  not hold a cell forever).  "Now" is read from the filesystem's own clock (the mtime of
  the guard file, touched), the clock that stamped the heartbeat, so a client's skew
  against an NFS server does not count.
* **Break** and **release**: under an OS lock, ``flock`` on the guard file
  ``<store>/.locks.guard``, a runner checks that the lock is stale (or, releasing, still
  its own) and removes it; breaking runners then take it as above.  Check and removal are
  one step for every runner that flocks the same guard, so two runners breaking one stale
  lock never both take it.  A run claims its store's name under the same guard
  (:func:`guard`, :func:`bench.store.runs.claim`).

What is guaranteed where: taking a free lock is exclusive wherever ``O_EXCL`` is (every
filesystem above).  Breaking a stale lock is atomic among runners on one host wherever
``flock`` works, and across hosts where ``flock`` reaches the file server: NFSv4 and NFSv3 with
lockd (Linux maps ``flock`` to NFS byte-range locks), Lustre mounted with ``-o flock``; for
other cluster filesystems see whether their ``flock`` is cluster-wide (BeeGFS: only with
``tuneUseGlobalFileLocks``).  Where ``flock`` is local to each client (NFS mounted
``local_lock=flock`` or ``nolock``, Lustre ``-o localflock``) two hosts that break the same
stale lock in the same instant may both take it; where ``flock`` fails outright (Lustre
without either option), breaking goes on without the guard, with a warning.  A holder on
another host is known dead by its heartbeat alone; where the filesystem stamps times by
its clients' clocks, those must agree within ``stale_after`` (NTP).

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
import warnings
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no flock; breaking goes on unguarded
    fcntl = None

LOCK_SUFFIX = ".lock"
GUARD = ".locks.guard"  # flocked (in the locks' directory) while a lock there is broken or released
HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 120.0  # a lock of another host not refreshed for this long belongs to a dead runner


def _machine() -> str | None:
    """This machine as its kernel names it: boot id and pid namespace (Linux; None
    elsewhere).  A pid means the same process only where both are the same: two machines
    or containers may share a host name, and a machine rebooted forgets its pids."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
        return f"{boot} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _started(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux ``/proc/<pid>/stat``
    field 22; None where unknown).  A pid reused by a later process starts later."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def owner() -> dict:
    """Who takes a lock: host, pid, and what tells this process apart from a later one
    with its pid (``machine``, ``started``: see :func:`_machine`, :func:`_started`)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time(),
            "machine": _machine(), "started": _started(os.getpid())}


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


def _owner_alive(info: dict) -> bool | None:
    """Whether the owner recorded in a lock still runs; None when this process cannot tell
    (the owner ran on another host, or records no usable pid)."""
    if info.get("host") != socket.gethostname() or not isinstance(info.get("pid"), int):
        return None
    if info.get("machine") is not None and info["machine"] != _machine():
        return None  # same host name, another machine (or container, or boot)
    if not _alive(info["pid"]):
        return False
    started = _started(info["pid"])
    return info.get("started") is None or started is None or started == info["started"]


@contextmanager
def guard(directory: Path, unguarded: str):
    """Hold ``flock`` on the guard file :data:`GUARD` of ``directory`` (a store); yields its
    descriptor.  The one store-wide lock: cell locks are broken and released under it, and a
    run claims its store's name under it (:func:`bench.store.runs.claim`).  Where the filesystem
    has no flock, goes on unguarded with a warning saying what (``unguarded``: e.g. "stale
    cell locks are broken") is then done without it."""
    fd = os.open(Path(directory) / GUARD, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:  # a filesystem without flock: unguarded (module docstring)
                warnings.warn(f"{directory}: no flock ({exc.strerror}); {unguarded} without a guard",
                              RuntimeWarning, stacklevel=3)
        yield fd
    finally:
        os.close(fd)  # and with it the flock


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
    def holder(self, guard: int | None = None) -> dict | None:
        """The owner recorded in the lock file (with ``age``: seconds since its last
        heartbeat, by the filesystem's clock), or None when the cell is not locked.
        ``guard``: the open guard file, when the caller holds it."""
        try:
            with open(self.path, "rb") as f:  # stat the open file: on NFS, opening revalidates it
                mtime = os.fstat(f.fileno()).st_mtime
                text = f.read()
        except FileNotFoundError:
            return None
        except OSError:
            return {"age": 0.0}
        try:
            info = json.loads(text.decode("utf-8") or "{}")
        except ValueError:
            info = {}
        return {**(info if isinstance(info, dict) else {}), "age": self._now(guard) - mtime}

    def stale(self, guard: int | None = None) -> bool:
        """Whether the lock belongs to a runner that is gone (module docstring, **Stale**)."""
        info = self.holder(guard)
        if info is None:
            return False
        alive = _owner_alive(info)
        return not alive if alive is not None else abs(info["age"]) > self.stale_after

    # --- take and give back --------------------------------------------------------------
    def acquire(self) -> bool:
        """Take the lock (breaking a stale one); False when a live runner holds it."""
        if self.held:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self._create():
            with self._guard() as guard:  # judged and broken in one step among breakers
                if self.stale(guard):
                    self.path.unlink(missing_ok=True)
                if not self._create():
                    return False
        self.held = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {self.path.name}", daemon=True)
        self._thread.start()
        return True

    def release(self) -> None:
        if not self.held:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.held = False
        try:
            with self._guard():
                if json.loads(self.path.read_text(encoding="utf-8")).get("token") == self._token:
                    self.path.unlink()
        except (OSError, ValueError):
            pass  # broken by another runner as stale (we were too slow), or its directory removed: not ours any more

    def _create(self) -> bool:
        """Create the lock file with this process as its owner; False when it exists."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({**owner(), "token": self._token}, f)
        return True

    def _guard(self):
        """Hold ``flock`` on the guard file of the lock's directory (:func:`guard`)."""
        return guard(self.path.parent, "stale cell locks are broken")

    def _now(self, guard: int | None = None) -> float:
        """The time by the clock that stamps modification times in the lock's directory
        (the guard file, touched); this host's clock where the guard cannot be written."""
        try:
            fd = guard if guard is not None else os.open(self.path.parent / GUARD, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError:
            return time.time()
        try:
            os.utime(fd)
            return os.fstat(fd).st_mtime
        except OSError:
            return time.time()
        finally:
            if fd != guard:
                os.close(fd)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            try:
                os.utime(self.path)
            except OSError:
                return

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
