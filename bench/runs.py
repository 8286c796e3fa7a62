"""Named runs: what a run is called, the record of its plan, and the runs of a store root.

A *run* is a suite with the command line's plan overrides (``--methods``, ``--datasets``,
``--seeds``, ``--epochs``: :data:`PLAN_OVERRIDES`).  Its name picks its store
``<results>/NAME/`` and its report ``<reports>/NAME/``: ``--name NAME``, or by default
(:func:`default_name`) the suite's name when nothing is overridden, else the suite's name,
a short tag of the overrides and a hash of them (``default-epochs1-a3f9``).  The same
command therefore always finds the same run (and resumes it), and a run with overrides
never lands in the folders of the plain suite, whose report may be a committed reference.

Records, both ``run.json`` (:data:`RUN_RECORD`):

* ``<results>/NAME/run.json`` (written when the run starts, after its checks): the name,
  the suite's name and file, the overrides, the suite file's contents (JSON text, in the
  file's order), the plugins and
  the plan's cells (key, dataset, method, seed, epochs).  ``status NAME``, ``report NAME``
  and ``verify NAME`` need nothing else, and ``runs`` lists the runs of a store root.
* ``<reports>/NAME/run.json``: whose report it is (name, suite, overrides; no time, so the
  same store still gives byte-identical reports).

A run refuses, before any work, a store or report folder recorded for another plan (another
suite or other overrides: :func:`check_owner`).  A folder without a record (made before
runs had names, e.g. a committed reference report) counts as the plain suite's of its name.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench.errors import ConfigError
from bench.spec import suite_name_problem
from bench.store import CELL, MANIFEST, STORE_SUITE, CellDir, atomic_write_json, read_json_object

RUN_RECORD = "run.json"
PLAN_OVERRIDES = ("methods", "datasets", "seeds", "epochs")  # the flags that change a run's plan, in tag order


def plan_overrides(methods=None, datasets=None, seeds=None, epochs=None) -> dict:
    """The plan overrides given (None = not given), as plain JSON values."""
    given = {"methods": methods, "datasets": datasets, "seeds": seeds, "epochs": epochs}
    return {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in given.items() if v is not None}


def default_name(suite: str, overrides: dict) -> str:
    """The suite's name without overrides; else ``<suite>-<tag>-<hash>``: the tag names each
    override briefly (``epochs1``, ``seeds0.1``, ``msp.sgpa``, ``3methods``) and the hash
    (4 hex digits of the overrides) tells apart tags that coincide."""
    if not overrides:
        return suite

    def listed(values: list, noun: str) -> str:
        return ".".join(map(str, values)) if len(values) <= 2 else f"{len(values)}{noun}"

    parts = []
    for key in PLAN_OVERRIDES:
        if key not in overrides:
            continue
        value = overrides[key]
        if key == "epochs":
            parts.append(f"epochs{value}")
        elif key == "seeds":
            parts.append("seeds" + ".".join(map(str, value)) if len(value) <= 3 else f"{len(value)}seeds")
        else:
            parts.append(listed(value, key))
    digest = hashlib.sha256(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:4]
    return f"{suite}-{'-'.join(parts)[:48]}-{digest}"


def view_name(name: str, plugins=(), metrics=(), scores=()) -> str:
    """The report folder of a view of run ``name`` with additions: ``NAME+PLUGIN...``, then
    ``+metrics-A.B`` and ``+scores-C`` for ``--metrics`` / ``--scores`` (over 48 characters,
    cut and told apart by a hash of them).  The ``+`` keeps it apart from every run's name."""
    parts = [*plugins] + [f"{key}-{'.'.join(values)}" for key, values in (("metrics", metrics), ("scores", scores))
                          if values]
    tag = "+".join(parts)
    if len(tag) > 48:
        digest = hashlib.sha256(json.dumps([list(plugins), list(metrics), list(scores)]).encode()).hexdigest()[:4]
        tag = f"{tag[:43]}-{digest}"
    return f"{name}+{tag}"


def check_name(name: str, flag: str = "--name") -> None:
    """A ConfigError unless ``name`` can name a run (one folder name)."""
    if (why := suite_name_problem(name, "run")) is not None:
        raise ConfigError(f"{flag}: {why}")


def describe(identity: dict) -> str:
    """``suite default with --epochs 1`` (or ``with no overrides``)."""
    overrides = identity.get("overrides") or {}
    flags = " ".join(f"--{k} {','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in overrides.items())
    return f"suite {identity.get('suite')!r} with {flags or 'no overrides'}"


def identity(record: dict) -> dict:
    """What makes two runs the same plan: the suite's name and the overrides."""
    return {"suite": record.get("suite"), "overrides": record.get("overrides") or {}}


def read_record(folder: Path) -> dict | None:
    """A folder's ``run.json``, or None when it has none (or it is unreadable)."""
    return read_json_object(Path(folder) / RUN_RECORD)


def owner(folder: Path) -> dict | None:
    """The identity of the run a store or report folder belongs to: its record's; for a
    folder without one that holds anything, the plain suite of the folder's name; None
    for an absent or empty folder."""
    folder = Path(folder)
    record = read_record(folder)
    if record is not None:
        return identity(record)
    if folder.is_dir() and any(not p.name.startswith(".") for p in folder.iterdir()):
        return {"suite": folder.name, "overrides": {}}
    return None


def check_owner(folder: Path, kind: str, name: str, mine: dict) -> None:
    """A ConfigError when ``folder`` (a ``kind``: store or report) belongs to another plan
    than ``mine``; nothing is written either way."""
    theirs = owner(folder)
    if theirs is None or theirs == mine:
        return
    suggestion = default_name(str(mine["suite"]), mine["overrides"])
    hint = (f"leave --name out (this plan's own name is {suggestion!r})" if suggestion != name
            else "give another --name")
    raise ConfigError(f"run {name!r}: the {kind} {folder} holds the run of {describe(theirs)}, and this command is "
                      f"{describe(mine)}; a run never overwrites another plan's {kind}: {hint}")


def store_record(name: str, suite: str, suite_file: str, overrides: dict, source: dict, plugins, plan) -> dict:
    """The record a run keeps in its store (``plan``: a :class:`bench.plan.Plan`)."""
    return {
        "name": name, "suite": suite, "suite_file": suite_file, "overrides": overrides, "plugins": list(plugins),
        "source": json.dumps(source, default=str),  # text: the tables keep their order (the methods' order)
        "cells": [{"key": c.key, "dataset": c.dataset.name, "method": c.method.name, "seed": c.seed,
                   "epochs": c.method.train.epochs} for c in plan.cells],
    }


def recorded_source(record: dict) -> dict | None:
    """The suite file's contents a store record keeps (None when it keeps none)."""
    try:
        source = json.loads(record["source"])
    except (KeyError, TypeError, ValueError):
        return None
    return source if isinstance(source, dict) else None


def report_record(name: str, ident: dict) -> dict:
    """The record a run's report keeps: whose report it is (nothing that changes between
    two reports of one store)."""
    return {"name": name, **ident}


def implied(record: dict, folder_name: str) -> bool:
    """Whether a report record (:func:`report_record`) says only what a folder without
    one counts as (:func:`owner`): the plain suite of the folder's name.  Such a report
    keeps no ``run.json``, so the plain suite's report (a committed reference among them)
    stays as it was."""
    return record == report_record(folder_name, {"suite": folder_name, "overrides": {}})


def resume_flags(record: dict) -> list[str]:
    """The flags that name a run (:func:`report_record`) on the ``run`` command line after
    ``--suite``: its overrides, and ``--name`` unless the name is their default."""
    overrides = record.get("overrides") or {}
    flags = [part for key, value in overrides.items()
             for part in (f"--{key}", ",".join(map(str, value)) if isinstance(value, list) else str(value))]
    if record.get("name") != default_name(str(record.get("suite")), overrides):
        flags += ["--name", str(record.get("name"))]
    return flags


def write_record(folder: Path, record: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / RUN_RECORD, json.loads(json.dumps(record, default=str)))


@dataclass(frozen=True)
class RunRow:
    """One line of ``runs``."""

    name: str
    suite: str
    overrides: str
    done: int
    failed: int
    missing: int | None  # None: the plan is not recorded
    changed: float  # seconds since the epoch, of the newest cell record or run record


def list_runs(root: Path) -> list[RunRow]:
    """Every run under the store root ``root``, by name: from its record, or (a store made
    before runs had names) from its ``suite.json`` and cell folders.  A cell counts as done
    when it is sealed and says complete (``verify NAME`` checks its files too)."""
    rows = []
    if not Path(root).is_dir():
        return rows
    for folder in sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith(".")):
        record = read_record(folder)
        states: dict[str, str] = {}
        newest = [_mtime(folder / RUN_RECORD)]
        for cell in (p for p in folder.iterdir() if p.is_dir() and (p / CELL).is_file()):
            cd = CellDir(cell)
            state = "failed" if (cd.read_cell() or {}).get("status") == "failed" else (
                "done" if cd.says_complete() else "other")
            states[cell.name] = state
            newest += [_mtime(cell / CELL), _mtime(cell / MANIFEST)]
        if record is None and not states and not (folder / STORE_SUITE).is_file():
            continue  # not a store
        if record is not None:
            keys = [str(c.get("key")) for c in record.get("cells", []) if isinstance(c, dict)]
            picked = [states.get(k, "missing") for k in keys]
            overrides = describe(identity(record)).partition(" with ")[2]
            rows.append(RunRow(folder.name, str(record.get("suite", "?")), overrides, picked.count("done"),
                               picked.count("failed"), len(picked) - picked.count("done") - picked.count("failed"),
                               max(newest)))
        else:
            suite = str((read_json_object(folder / STORE_SUITE) or {}).get("name", folder.name))
            rows.append(RunRow(folder.name, suite, "not recorded", list(states.values()).count("done"),
                               list(states.values()).count("failed"), None, max(newest)))
    return rows


def runs_table(rows: list[RunRow]) -> str:
    """The ``runs`` listing: one aligned line per run."""
    head = ("name", "suite", "overrides", "done", "failed", "missing", "last change")
    lines = [head] + [(r.name, r.suite, r.overrides, str(r.done), str(r.failed),
                       "?" if r.missing is None else str(r.missing),
                       datetime.fromtimestamp(r.changed).strftime("%Y-%m-%d %H:%M") if r.changed else "-")
                      for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in lines)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
