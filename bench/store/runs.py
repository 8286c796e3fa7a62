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
  the suite's name and file, the overrides, when the run was first started (``started``,
  kept when it resumes), the suite file's contents (JSON text, in the file's order), the
  plugins and the plan's cells (key, dataset, method, seed, epochs).  ``status NAME``, ``report NAME``
  and ``verify NAME`` need nothing else, and ``runs`` lists the runs of a store root.
* ``<reports>/NAME/run.json``: whose report it is (name, suite, overrides; no time, so the
  same store still gives byte-identical reports).

A run refuses, before any work, a store or report folder recorded for another plan (another
suite or other overrides: :func:`check_owner`), and checks again when it writes its store's
record, under the store's lock (:func:`claim`): of two runs started together under one name
with different plans, the second to claim the name is refused before it trains a cell.  A
folder without a record (made before runs had names, e.g. a committed reference report)
counts as the plain suite's of its name.

A ``run.json`` that is there but is no record (not JSON, truncated, a list where an object
belongs, a cell entry without its key: :func:`record_problem`) is *damaged*: every command
that reads it stops with one line naming it and the run's own ``run`` command, which
rewrites it (:class:`DamagedRecord`); that command replaces a damaged record only when the
store holds no cell of another plan.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from bench.core.errors import ConfigError
from bench.store.lock import guard
from bench.config.spec import PLAN_OVERRIDES, SUITES_DIR, Overrides, RunSpec, suite_name_problem
from bench.store import CELL, DAMAGED_MARK, MANIFEST, STORE_SUITE, CellDir, CellRecord, atomic_write_json, read_json_object

RUN_RECORD = "run.json"
#: how a hint writes the command line, as the README teaches it (from the repository root)
COMMAND = (".venv/bin/python", "run_suite.py")
#: the fields of a store's record (:func:`store_record`) and of a report's (:func:`report_json`), with their types
STORE_FIELDS = {"name": str, "suite": str, "suite_file": str, "overrides": dict, "plugins": list, "source": str,
                "cells": list}
REPORT_FIELDS = {"name": str, "suite": str, "overrides": dict}
CELL_FIELDS = {"key": str, "dataset": str, "method": str, "seed": int, "epochs": int}  # an entry of ``cells``
#: the type of each plan override's value, and of its items for a list
OVERRIDE_TYPES = {"methods": (list, str), "datasets": (list, str), "seeds": (list, int), "epochs": (int, None)}


class DamagedRecord(ConfigError):
    """A ``run.json`` that is there but is no run record (module docstring): ``path``,
    ``why`` (what is wrong) and ``hint`` (the command that rewrites it) make its message."""

    def __init__(self, path: Path, why: str, hint: str) -> None:
        super().__init__(f"{path} is damaged: {why}; {hint}")
        self.path, self.why = path, why


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


def describe(spec: RunSpec) -> str:
    """``suite default with --epochs 1`` (or ``with no overrides``)."""
    return f"suite {spec.suite!r} with {' '.join(spec.overrides.flags()) or 'no overrides'}"


@dataclass(frozen=True)
class PlannedCell:
    """A cell of a run's plan as its record keeps it (an entry of ``cells``)."""

    key: str
    dataset: str
    method: str
    seed: int
    epochs: int

    @property
    def label(self) -> str:
        return f"{self.dataset} / {self.method} / seed {self.seed}"

    @classmethod
    def of(cls, cell) -> "PlannedCell":
        """The entry of a planned cell (:class:`bench.store.plan.Cell`)."""
        return cls(cell.key, cell.dataset.name, cell.method.name, cell.seed, cell.method.train.epochs)


@dataclass(frozen=True)
class RunRecord:
    """A store's ``run.json``: the run (:class:`~bench.config.spec.RunSpec`), its suite
    file's contents (``source``, in the file's order), its plan's cells and when it was
    first started (UTC, ``2026-11-28T09:14:03+00:00``; "" in a record made before runs
    kept it)."""

    spec: RunSpec
    source: dict
    cells: tuple[PlannedCell, ...]
    started: str = ""

    def to_json(self) -> dict:
        spec = self.spec
        return {"name": spec.name, "suite": spec.suite, "suite_file": spec.suite_file,
                "overrides": spec.overrides.to_json(), "plugins": list(spec.plugins),
                **({"started": self.started} if self.started else {}),
                "source": json.dumps(self.source, default=str),  # text: the tables keep their order
                "cells": [{f: getattr(c, f) for f in CELL_FIELDS} for c in self.cells]}

    @classmethod
    def from_json(cls, record: dict) -> RunRecord:
        """A record that :func:`record_problem` passed."""
        spec = RunSpec(record["name"], record["suite"], record["suite_file"], Overrides.from_json(record["overrides"]),
                       tuple(record["plugins"]))
        started = record.get("started")
        return cls(spec, recorded_source(record), tuple(PlannedCell(**{f: c[f] for f in CELL_FIELDS})
                                                        for c in record["cells"]),
                   started if isinstance(started, str) else "")


def report_json(spec: RunSpec) -> dict:
    """The record a run's report keeps: whose report it is (nothing that changes between
    two reports of one store)."""
    return {"name": spec.name, **spec.identity()}


def _json_kind(value: object) -> str:
    """What a JSON value is, in JSON's words (``an array``, ``a string``, ...)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return {dict: "an object", list: "an array", str: "a string"}.get(type(value), "a number")


def record_problem(record: object, kind: str) -> str | None:
    """Why ``record`` (a parsed ``run.json`` of a ``kind``: store or report) is not what
    :func:`store_record` or :func:`report_json` writes, or None: every field there with
    its type, plan overrides of :data:`OVERRIDE_TYPES`, every cell entry with the fields of
    :data:`CELL_FIELDS`, the suite's source an object in JSON text."""
    if not isinstance(record, dict):
        return f"it holds {_json_kind(record)}, not an object"
    for key, wanted in (STORE_FIELDS if kind == "store" else REPORT_FIELDS).items():
        if key not in record:
            return f"it has no {key!r}"
        if not isinstance(record[key], wanted) or isinstance(record[key], bool):
            return f"its {key!r} is {_json_kind(record[key])}, not {_json_kind(wanted())}"
    if (why := _overrides_problem(record["overrides"])) is not None:
        return why
    if kind != "store":
        return None
    if not all(isinstance(p, str) for p in record["plugins"]):
        return "its 'plugins' are not all strings"
    if recorded_source(record) is None:
        return "its 'source' is not a suite's contents (an object in JSON text)"
    for i, cell in enumerate(record["cells"]):
        if not isinstance(cell, dict):
            return f"its cells[{i}] is {_json_kind(cell)}, not an object"
        for key, wanted in CELL_FIELDS.items():
            if key not in cell:
                return f"its cells[{i}] has no {key!r}"
            if not isinstance(cell[key], wanted) or isinstance(cell[key], bool):
                return f"its cells[{i}] {key!r} is {_json_kind(cell[key])}, not {_json_kind(wanted())}"
    return None


def _overrides_problem(overrides: object) -> str | None:
    """Why a record's ``overrides`` are not plan overrides (:data:`OVERRIDE_TYPES`), or None."""
    if not isinstance(overrides, dict):
        return f"its 'overrides' is {_json_kind(overrides)}, not an object"
    for key, value in overrides.items():
        if key not in OVERRIDE_TYPES:
            return f"its 'overrides' name {key!r}, no plan override ({', '.join(PLAN_OVERRIDES)})"
        outer, inner = OVERRIDE_TYPES[key]
        if not isinstance(value, outer) or isinstance(value, bool) or (inner is not None and not (
                value and all(isinstance(v, inner) and not isinstance(v, bool) for v in value))):
            return f"its 'overrides' {key!r} is {json.dumps(value)[:40]}, not " + (
                f"a non-empty array of {'strings' if inner is str else 'integers'}" if inner else "an integer")
    return None


def read_record(folder: Path) -> RunRecord | None:
    """A store's ``run.json``, or None when it has none; :class:`DamagedRecord` when it is
    there but unreadable or no record (:func:`record_problem`)."""
    record = _read(folder, "store")
    return RunRecord.from_json(record) if record is not None else None


def _read(folder: Path, kind: str) -> dict | None:
    """A folder's ``run.json`` (a ``kind``: store or report record) as checked JSON, or
    None when it has none (:func:`read_record`)."""
    path = Path(folder) / RUN_RECORD
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DamagedRecord(path, f"it cannot be read ({exc.strerror or exc})", rewrite_hint(folder, None, kind)) \
            from None
    try:
        record = json.loads(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise DamagedRecord(path, "it is not UTF-8 text", rewrite_hint(folder, None, kind)) from None
    except json.JSONDecodeError as exc:
        why = ("it is empty" if not text.strip() else "it ends in the middle (truncated)"
               if exc.pos >= len(exc.doc.rstrip()) else f"it is not JSON ({exc})")
        raise DamagedRecord(path, why, rewrite_hint(folder, None, kind)) from None
    if (why := record_problem(record, kind)) is not None:
        raise DamagedRecord(path, why, rewrite_hint(folder, record, kind))
    return record


def suite_argument(given: str) -> str:
    """``--suite`` as a user types it: a built-in suite by its name (a run records its
    file's absolute path), any other suite file as given."""
    path = Path(given)
    if path.suffix == ".toml" and path.resolve().parent == SUITES_DIR and path.is_file():
        return path.stem
    return given


def rewrite_hint(folder: Path, record: object, kind: str) -> str:
    """How a damaged record of ``folder`` is rewritten: the run's own ``run`` command, with
    what the damaged record still tells of it (its suite file and overrides) and
    ``--name``; it keeps every complete cell."""
    known = record if isinstance(record, dict) else {}
    suite_file = known.get("suite_file") if isinstance(known.get("suite_file"), str) else "SUITE.toml"
    overrides = known.get("overrides")
    flags_known = _overrides_problem(overrides) is None
    parts = [*COMMAND, "--suite", suite_argument(suite_file)]
    if flags_known:
        parts += Overrides.from_json(overrides).flags()
    parts += ["--name", Path(folder).name]
    root = Path(folder).parent
    if root != Path("results" if kind == "store" else "reports"):
        parts += ["--results" if kind == "store" else "--reports", str(root)]
    unknown = [what for what, missing in (("SUITE.toml: the suite file it ran", suite_file == "SUITE.toml"),
                                          ("add the --methods/--datasets/--seeds/--epochs it ran with",
                                           not flags_known)) if missing]
    notes = f" ({'; '.join(unknown)})" if unknown else ""
    return f"rewrite it with the run's own command, `{shlex.join(parts)}`{notes}, which keeps every complete cell"


def owner(folder: Path, kind: str = "store", record: RunRecord | None = None) -> RunSpec | None:
    """The run a store or report folder (``kind``) belongs to: its record's (``record``: a
    store's record already read, else it is read here); for a folder without one that
    holds anything, the plain suite of the folder's name; None for an absent or empty
    folder.  :class:`DamagedRecord` for a damaged record."""
    folder = Path(folder)
    if record is None and kind == "store":
        record = read_record(folder)
    if record is not None:
        return record.spec
    if kind != "store" and (given := _read(folder, kind)) is not None:
        return RunSpec(given["name"], given["suite"], overrides=Overrides.from_json(given["overrides"]))
    if folder.is_dir() and any(not p.name.startswith(".") for p in folder.iterdir()):
        return RunSpec(folder.name, folder.name)
    return None


def foreign_cells(store: Path, keys) -> list[str]:
    """The cell folders of the store ``store`` that are no cell of ``keys`` (another plan's
    cells; a damaged cell moved aside counts as its cell)."""
    if not Path(store).is_dir():
        return []
    keys = set(keys)
    return sorted(p.name for p in Path(store).iterdir()
                  if p.is_dir() and (p / CELL).is_file() and p.name.split(DAMAGED_MARK)[0] not in keys)


def check_owner(folder: Path, kind: str, mine: RunSpec, rewritable: bool = False) -> str | None:
    """A ConfigError when ``folder`` (a ``kind``: store or report) belongs to another plan
    than ``mine``; nothing is written either way.  A damaged record is a
    :class:`DamagedRecord` unless it is ``rewritable`` (this run's store holds no cell of
    another plan: :func:`foreign_cells`); then what is wrong with it is returned."""
    try:
        theirs = owner(folder, kind)
    except DamagedRecord as exc:
        if not rewritable:
            raise
        return f"{exc.path} was damaged ({exc.why})"
    if theirs is None or mine.same_plan(theirs):
        return None
    name = mine.name
    suggestion = default_name(mine.suite, mine.overrides.to_json())
    hint = (f"leave --name out (this plan's own name is {suggestion!r})" if suggestion != name
            else "give another --name")
    raise ConfigError(f"run {name!r}: the {kind} {folder} holds the run of {describe(theirs)}, and this command is "
                      f"{describe(mine)}; a run never overwrites another plan's {kind}: {hint}")


def store_record(spec: RunSpec, source: dict, plan) -> RunRecord:
    """The record a run keeps in its store (``plan``: a :class:`bench.store.plan.Plan`); its
    ``started`` (UTC, to the second) is now, and :func:`claim` keeps the first run's."""
    return RunRecord(spec, source, tuple(PlannedCell.of(c) for c in plan.cells),
                     datetime.now(timezone.utc).isoformat(timespec="seconds"))


def recorded_source(record: dict) -> dict | None:
    """The suite file's contents a store record's JSON keeps (None when it keeps none)."""
    try:
        source = json.loads(record["source"])
    except (KeyError, TypeError, ValueError):
        return None
    return source if isinstance(source, dict) else None


def implied(spec: RunSpec, folder_name: str) -> bool:
    """Whether a run says only what a folder without a record counts as (:func:`owner`):
    the plain suite of the folder's name.  Such a report keeps no ``run.json``, so the
    plain suite's report (a committed reference among them) stays as it was."""
    return report_json(spec) == report_json(RunSpec(folder_name, folder_name))


def resume_flags(spec: RunSpec) -> list[str]:
    """The flags that name a run on the ``run`` command line after ``--suite``: its
    overrides, and ``--name`` unless the name is their default."""
    flags = spec.overrides.flags()
    if spec.name != default_name(spec.suite, spec.overrides.to_json()):
        flags += ["--name", spec.name]
    return flags


def write_record(folder: Path, record: RunRecord | RunSpec) -> None:
    """Write a store's record, or a report's (a :class:`RunSpec`: :func:`report_json`)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = record.to_json() if isinstance(record, RunRecord) else report_json(record)
    atomic_write_json(folder / RUN_RECORD, json.loads(json.dumps(text, default=str)))


def claim(folder: Path, record: RunRecord) -> tuple[RunRecord, str | None]:
    """Make ``record`` (:func:`store_record`) the record of the store ``folder``, unless the
    store belongs to another plan (a ConfigError, and nothing is written).  Check and write
    are one step under the store's lock (:func:`bench.store.lock.guard`), so of two runs that
    passed :func:`check_owner` together under one name with different plans, the second to
    claim the name reads the first one's record and is refused.  A damaged record is
    replaced when the store holds no cell of another plan (:func:`foreign_cells`).  A run
    resumed keeps the ``started`` of the record it finds (the date its report gives).
    Returns the record written and what was wrong with a damaged one (None otherwise)."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = {c.key for c in record.cells}
    with guard(folder, "a run claims its store"):
        damage = check_owner(folder, "store", record.spec, rewritable=not foreign_cells(folder, keys))
        if damage is None and (earlier := read_record(folder)) is not None and earlier.started:
            record = replace(record, started=earlier.started)
        write_record(folder, record)
    return record, damage


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
    damaged: str | None = None  # the run record is damaged: the DamagedRecord's message


def list_runs(root: Path) -> list[RunRow]:
    """Every run under the store root ``root``, by name: from its record, or (a store made
    before runs had names) from its ``suite.json`` and cell folders.  A cell counts as done
    when it is sealed and says complete (``verify NAME`` checks its files too)."""
    rows = []
    if not Path(root).is_dir():
        return rows
    for folder in sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            record, damaged = read_record(folder), None
        except DamagedRecord as exc:
            record, damaged = None, str(exc)
        states: dict[str, str] = {}
        newest = [_mtime(folder / RUN_RECORD)]
        for cell in (p for p in folder.iterdir() if p.is_dir() and (p / CELL).is_file()):
            cd = CellDir(cell)
            state = "failed" if (cd.read_cell() or CellRecord()).failed else (
                "done" if cd.says_complete() else "other")
            states[cell.name] = state
            newest += [_mtime(cell / CELL), _mtime(cell / MANIFEST)]
        if damaged is not None:
            rows.append(RunRow(folder.name, "?", "damaged run.json", list(states.values()).count("done"),
                               list(states.values()).count("failed"), None, max(newest), damaged))
            continue
        if record is None and not states and not (folder / STORE_SUITE).is_file():
            continue  # not a store
        if record is not None:
            picked = [states.get(c.key, "missing") for c in record.cells]
            overrides = describe(record.spec).partition(" with ")[2]
            rows.append(RunRow(folder.name, record.spec.suite, overrides, picked.count("done"),
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
