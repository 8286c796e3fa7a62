"""The prediction store: one directory per cell, every write atomic, completeness by manifest.

``<root>/<cell-key>/`` holds

* ``cell.json``: a :class:`~bench.store.record.CellRecord` (resolved config, versions,
  status ``running``/``complete``/``failed``, timings, seed, the failure reason if any);
* ``train_log.csv``: one row per epoch;
* ``checkpoint.pt``: the best-on-validation weights (``torch.load(weights_only=True)``);
* ``preds/<split>.npz``: the arrays of a :class:`~bench.store.record.Predictions`
  (log-probabilities and labels; the decomposition terms for methods with several passes;
  on the ``val``, ``test`` and ``ood/...`` splits, those OOD scores read, also the mean
  logits and, where the suite stores features, the features).  Split names map to paths
  (``shift/x/3`` -> ``preds/shift/x/3.npz``);
* ``features/train.npz`` (where the suite stores features): a
  :class:`~bench.store.record.TrainingFeatures`, the features of a fixed subset of the
  training images (at most ``[store] train_features``) with the classifier head;
* ``manifest.json``: sha256 of every other file and the shape ``[N, C]`` of every
  prediction file, written last.

``<root>/suite.json`` describes the suite (display order, reference, derived methods'
options) so the store can be analysed without its suite file (``bench.store.catalog``).

A cell is complete only when its manifest exists and every listed file verifies: it lies
inside the cell, matches its sha256, each prediction file holds what
:meth:`CellDir.write_preds` writes (:func:`arrays_problem`) and the checkpoint is a state
dict (:func:`checkpoint_problem`).  Every file is written to a
temporary name, fsynced and renamed, so a run killed at any moment leaves either the old
file or the new one, never half of one.  Nothing in a complete cell is ever deleted; an
incomplete cell's directory is cleared before it is redone.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import zipfile

import numpy as np

from bench.store.record import (STORE_SCHEMA, CellRecord, Predictions, Stage1Record, TrainingFeatures,  # noqa: F401
                                arrays_problem, training_features_problem)


TRAIN_FEATURES = "features/train.npz"  # the training features and classifier head of a cell (module docstring)
MANIFEST = "manifest.json"
CELL = "cell.json"
CHECKPOINT = "checkpoint.pt"
TRAIN_LOG = "train_log.csv"  # one row per epoch (bench.train.loop.fit's log); none for a cell that trained nothing
DAMAGED_MARK = ".damaged-"  # <key>.damaged-<time>/: a damaged cell moved aside by reset()
STORE_SUITE = "suite.json"  # <results>/<suite>/suite.json: the suite's description (bench.store.catalog)
#: what reading a prediction file may raise when it is damaged (np.load without pickles)
READ_ERRORS = (OSError, ValueError, KeyError, EOFError, MemoryError, zipfile.BadZipFile)


def _umask() -> int:
    """The process umask (read by setting and restoring it; the runner is single-threaded)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one.
    An OSError that names no file (a full disk or the file-size limit: ``write`` and
    ``fsync`` raise ENOSPC or EFBIG without a name) is raised naming ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; files honour the umask like open()
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json_object(path: Path) -> dict | None:
    """A JSON object from ``path``, or None when it is missing or damaged in any way
    (truncated, not UTF-8, not an object): a damaged cell reads as incomplete."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    return obj if isinstance(obj, dict) else None


def checkpoint_problem(path: Path) -> str | None:
    """Why the file at ``path`` is not a ``checkpoint.pt`` as a cell writes it (None when
    it is one): it must load with ``torch.load(weights_only=True)`` (no pickled code) as a
    non-empty table of named tensors, a network's state dict.  Whether the names and
    shapes fit a network is the reader's check (``bench.train.cell.stage1_state``)."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever a damaged or foreign file raises
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return f"cannot be read as weights ({type(exc).__name__}: {first})"
    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not a table of named tensors"
    if not state:
        return "holds no weights (an empty state dict)"
    wrong = next((k for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)
    if wrong is not None:
        return f"entry {wrong!r} is not a named tensor ({type(state[wrong]).__name__})"
    return None


def _load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file, never unpickling (an object array raises ValueError)."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def split_relpath(split: str) -> str:
    parts = split.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"bad split name {split!r}")
    return "preds/" + "/".join(parts) + ".npz"


class CellDir:
    """Reads and writes one cell's directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def key(self) -> str:
        return self.path.name

    # --- state -------------------------------------------------------------------------
    def read_cell(self) -> CellRecord | None:
        """The cell's ``cell.json`` (:class:`CellRecord`), or None when it is missing,
        damaged or not a cell record (:meth:`read_cell_problem` says which)."""
        return self.read_cell_problem()[0]

    def read_cell_problem(self) -> tuple[CellRecord | None, str | None]:
        """``(record, None)``, or ``(None, why)``: ``cell.json`` is missing, unreadable or
        truncated, or is JSON but not a cell record (:meth:`CellRecord.from_json` says why:
        an unknown key, a value of the wrong type)."""
        obj = read_json_object(self.path / CELL)
        if obj is None:
            return None, "its cell.json is unreadable or truncated"
        try:
            return CellRecord.from_json(obj), None
        except ValueError as exc:
            return None, f"its cell.json is not a cell record: {exc}"

    def seconds(self) -> float:
        """What the cell cost to run, training and prediction (``cell.json``; 0 unrecorded)."""
        return (self.read_cell() or CellRecord()).seconds

    def condition(self, skip: tuple[str, ...] = ()) -> tuple[str, str | None]:
        """``(state, reason)``, the one classification of a cell directory:

        * ``complete``: its manifest lists every file, each matches its sha256, no stray
          prediction file is there and ``cell.json`` says complete (reason None);
        * ``missing``: no directory;
        * ``failed``: ``cell.json`` records a failure (reason: ``failed: ...``);
        * ``interrupted``: never sealed, no failure recorded (a run stopped in it);
        * ``damaged``: sealed once but no longer verifies (a manifest path outside the cell,
          a changed, missing or extra file, a prediction file whose arrays are not what
          :meth:`write_preds` writes: :func:`arrays_problem`, a checkpoint that is no
          state dict: :func:`checkpoint_problem`), or unreadable.

        This is the one definition of a damaged cell: ``verify``, ``run``, ``status`` and
        the report (:mod:`bench.store.catalog`) all ask it.

        ``skip`` names manifest entries not to check (neither their digest nor their
        contents): analysis passes ``(CHECKPOINT,)`` because it never reads weights (a
        store whose checkpoints were pruned stays usable)."""
        if not self.path.exists():
            return "missing", "missing"
        try:
            cell = self.read_cell()
            if cell is not None and cell.failed:  # recorded by the run, sealed or not
                return "failed", f"failed: {cell.reason or 'failed'}"
            manifest = read_json_object(self.path / MANIFEST)
            files = manifest.get("files") if manifest is not None else None
            if not isinstance(files, dict):
                if self.sealed():
                    return "damaged", "its manifest.json is unreadable or truncated"
                return "interrupted", ("incomplete: no manifest (the run was interrupted in this cell, "
                                       "or its manifest was deleted)")
            for rel, digest in sorted(files.items()):
                if (outside := self._outside(rel)) is not None:
                    return "damaged", f"its manifest lists {rel!r}, {outside}"
                if rel in skip:
                    continue
                f = self.path / rel
                if not f.is_file():
                    return "damaged", f"{rel} is listed in its manifest but missing"
                if sha256_file(f) != digest:
                    return "damaged", f"{rel} does not match the sha256 in its manifest (changed or corrupted)"
            extra = sorted(r for r in set(self._files()) - set(files) if r.startswith("preds/"))
            if extra:
                return "damaged", f"{extra[0]} is not in its manifest (a prediction file added after the cell was sealed)"
            if (wrong := self._contents_problem(sorted(set(files) - set(skip)), manifest.get("shapes"))) is not None:
                return "damaged", wrong
            cell, why = self.read_cell_problem()
            if cell is None:
                return "damaged", why
            if not cell.complete:
                return "damaged", f"its cell.json says status {cell.status!r}, not 'complete'"
        except OSError as exc:  # an unreadable directory or file
            return "damaged", f"unreadable: {exc.strerror or exc} ({exc.filename or self.path})"
        return "complete", None

    def status(self, skip: tuple[str, ...] = ()) -> str:
        """``complete``, ``failed``, ``incomplete`` (interrupted or damaged) or ``missing``."""
        state = self.condition(skip)[0]
        return "incomplete" if state in ("interrupted", "damaged") else state

    def verify(self, skip: tuple[str, ...] = ()) -> bool:
        return self.condition(skip)[0] == "complete"

    def problem(self, skip: tuple[str, ...] = ()) -> str | None:
        """Why the cell is not complete, in one sentence (None when it is): the reason of
        :meth:`condition`."""
        return self.condition(skip)[1]

    def _outside(self, rel: object) -> str | None:
        """Why a manifest entry is not a path inside this cell (None when it is one): not a
        relative path of plain components, or resolving elsewhere through a symlink."""
        if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel \
                or any(part in ("", ".", "..") for part in rel.split("/")):
            return "not a relative path inside the cell"
        if not (self.path / rel).resolve().is_relative_to(self.path.resolve()):
            return "which resolves outside the cell (a symlink)"
        return None

    def _contents_problem(self, rels: list[str], shapes: object) -> str | None:
        """Why a file among ``rels`` does not hold what the cell writes, or None: the
        checkpoint (:func:`checkpoint_problem`), the training features, and the prediction
        files (:meth:`write_preds`; every file of one cell has the same number of classes)."""
        shapes = shapes if isinstance(shapes, dict) else {}
        classes: dict[int, str] = {}
        if CHECKPOINT in rels and (why := checkpoint_problem(self.path / CHECKPOINT)) is not None:
            return f"{CHECKPOINT} {why}"
        if TRAIN_FEATURES in rels:
            try:
                why = training_features_problem(_load_arrays(self.path / TRAIN_FEATURES))
            except READ_ERRORS as exc:
                why = f"cannot be read as plain arrays ({type(exc).__name__}: {exc})"
            if why is not None:
                return f"{TRAIN_FEATURES}: {why}"
        for rel in rels:
            if not (rel.startswith("preds/") and rel.endswith(".npz")):
                continue
            try:
                arrays = _load_arrays(self.path / rel)
            except READ_ERRORS as exc:
                return f"{rel} cannot be read as plain arrays ({type(exc).__name__}: {exc})"
            shape = shapes.get(rel)
            valid = isinstance(shape, list) and len(shape) == 2 and all(type(v) is int for v in shape)
            if (why := arrays_problem(arrays, tuple(shape) if valid else None)) is not None:
                return f"{rel}: {why}"
            classes.setdefault(Predictions.from_arrays(arrays).log_probs.shape[1], rel)
        if len(classes) > 1:
            (c1, r1), (c2, r2) = sorted(classes.items())[:2]
            return f"its prediction files disagree on the number of classes ({r1}: {c1}, {r2}: {c2})"
        return None

    def sealed(self) -> bool:
        """The cell was completed once (it has a manifest), whether or not it still verifies."""
        return (self.path / MANIFEST).exists()

    def says_complete(self) -> bool:
        """Sealed, and ``cell.json`` says complete: the cheap reading of "done" that lists
        and progress lines use (no file is hashed; :meth:`condition` verifies)."""
        return self.sealed() and (self.read_cell() or CellRecord()).complete

    def _files(self) -> list[str]:
        """Relative paths of every non-hidden file of the cell (temporary files are hidden)."""
        return [p.relative_to(self.path).as_posix() for p in self.path.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(self.path).parts)]

    def reset(self, keep: tuple[str, ...] = ()) -> Path | None:
        """Prepare the directory for (re)doing the cell; never deletes a complete cell.

        An interrupted or failed cell is cleared, except the top-level files named in
        ``keep`` (an interrupted cell's resumable training state).  A cell that was sealed once but no longer
        verifies (damaged: a changed, missing or extra file) is moved aside to
        ``<key>.damaged-<UTC time>/`` for inspection; that path is returned."""
        if self.verify():
            raise RuntimeError(f"refusing to clear complete cell {self.path}")
        moved = None
        if self.sealed():
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
            moved = self.path.with_name(f"{self.path.name}{DAMAGED_MARK}{stamp}")
            os.replace(self.path, moved)
        elif self.path.exists():
            kept = {name: (self.path / name).read_bytes() for name in keep if (self.path / name).is_file()}
            shutil.rmtree(self.path)
            self.path.mkdir(parents=True)
            for name, data in kept.items():
                atomic_write_bytes(self.path / name, data)
            return None
        self.path.mkdir(parents=True)
        return moved

    # --- writes ------------------------------------------------------------------------
    def write_cell(self, record: CellRecord) -> None:
        atomic_write_json(self.path / CELL, record.to_json())

    def mark_failed(self, record: CellRecord, reason: str) -> tuple[str, str]:
        """Record the cell as failed with ``reason`` (``record``: its ``cell.json`` so far);
        returns the outcome ``("failed", reason)``."""
        self.write_cell(record.replace(status="failed", reason=reason,
                                       finished=datetime.now(timezone.utc).isoformat(timespec="seconds")))
        return "failed", reason

    def write_preds(self, split: str, preds: Predictions) -> None:
        """Store one split's predictions, each array in its declared dtype
        (:meth:`Predictions.stored`: ``features`` as float16, half the bytes, ample for
        distances in feature space).  Raises ValueError, writing nothing, for arrays a
        verified cell may not hold (:func:`arrays_problem`: e.g. non-finite log-probabilities)."""
        rel = split_relpath(split)
        arrays = preds.stored().arrays()
        if (why := arrays_problem(arrays)) is not None:
            raise ValueError(f"predictions of split {split!r} not stored: {why}")
        self._write_npz(rel, arrays)

    def write_training_features(self, training: TrainingFeatures) -> None:
        """Store the training features :data:`TRAIN_FEATURES` in their declared dtypes
        (:meth:`TrainingFeatures.stored`); ValueError, writing nothing, for arrays that fail
        :func:`training_features_problem`."""
        arrays = training.stored().arrays()
        if (why := training_features_problem(arrays)) is not None:
            raise ValueError(f"training features not stored: {why}")
        self._write_npz(TRAIN_FEATURES, arrays)

    def _write_npz(self, rel: str, arrays: dict[str, np.ndarray]) -> None:
        """``arrays`` as the uncompressed ``.npz`` at ``rel``, written atomically."""
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        atomic_write_bytes(self.path / rel, buf.getvalue())

    def read_training_features(self) -> TrainingFeatures | None:
        """The cell's :data:`TRAIN_FEATURES`, or None when it has none (stored without
        features, or before the store kept them); ValueError when they are not what
        :meth:`write_training_features` writes."""
        path = self.path / TRAIN_FEATURES
        if not path.is_file():
            return None
        arrays = _load_arrays(path)
        if (why := training_features_problem(arrays)) is not None:
            raise ValueError(f"{TRAIN_FEATURES}: {why}")
        return TrainingFeatures.from_arrays(arrays)

    def write_checkpoint(self, data: bytes) -> None:
        atomic_write_bytes(self.path / CHECKPOINT, data)

    def write_bytes(self, rel: str, data: bytes) -> None:
        atomic_write_bytes(self.path / rel, data)

    def seal(self, record: CellRecord) -> None:
        """Mark complete: write the final ``cell.json``, then the manifest over every file,
        with the shape ``[N, C]`` of every prediction file (what verifying checks it against)."""
        self.write_cell(record.replace(status="complete"))
        files = sorted(
            p.relative_to(self.path).as_posix()
            for p in self.path.rglob("*")
            if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")
        )
        shapes = {rel: list(Predictions.from_arrays(_load_arrays(self.path / rel)).log_probs.shape)
                  for rel in files if rel.startswith("preds/") and rel.endswith(".npz")}
        manifest = {"schema": STORE_SCHEMA, "files": {rel: sha256_file(self.path / rel) for rel in files},
                    "shapes": shapes}
        atomic_write_json(self.path / MANIFEST, manifest)

    # --- reads -------------------------------------------------------------------------
    def read_preds(self, split: str) -> Predictions:
        """Every array stored for ``split``; ValueError when they are not what
        :meth:`write_preds` writes (:func:`arrays_problem`)."""
        rel = split_relpath(split)
        arrays = _load_arrays(self.path / rel)
        if (why := arrays_problem(arrays)) is not None:
            raise ValueError(f"{rel}: {why}")
        return Predictions.from_arrays(arrays)

    def splits(self) -> list[str]:
        """The stored splits: those of the manifest for a sealed cell (a stray file is never
        read), else every ``preds/**/*.npz`` written so far."""
        manifest = read_json_object(self.path / MANIFEST)
        files = manifest.get("files") if manifest is not None else None
        if isinstance(files, dict):
            rels = [r for r in files if r.startswith("preds/") and r.endswith(".npz")]
        else:
            rels = [p.relative_to(self.path).as_posix() for p in (self.path / "preds").rglob("*.npz")]
        return sorted(r[len("preds/"):-len(".npz")] for r in rels)


class Store:
    """``<results>/<suite>/``: a directory of cells keyed by config hash."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def cell(self, key: str) -> CellDir:
        return CellDir(self.root / key)
