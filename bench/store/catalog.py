"""What a store holds, read from its folder alone, and the one way to read its predictions.

A store ``<results>/<suite>/`` describes itself: every cell's ``cell.json`` names its
dataset, method and seed (the suite's names) and holds its resolved config, and
``suite.json`` (written by ``run``) records the suite's display order, its reference
method and the options of its derived methods (ensembles, temperature scaling), which
have no cells.  :func:`open_store` turns that into a :class:`Catalog`; a suite, when
given, only selects and orders what is there (and supplies the derived methods' options).
So a store can be analysed after its suite file was edited or deleted.

Only cells of one configuration are aggregated.  A method's cells on a dataset are
grouped by their resolved config without the seed (``cell.json``'s ``config``).  With a
suite, the group holding a cell whose key the suite plans is used alone; without one (or
when the store holds none of the planned cells) every group is used, and when there are
several, each becomes its own row named by the settings in which the groups differ,
e.g. ``msp (epochs=1)`` and ``msp (epochs=2)``; a derived method (ensemble, temperature
scaling) gets one row per configuration of its base, so its members always share one.

Which cell is used for a (dataset, method row, seed): among the group's directories, a
complete one (manifest verifies, checkpoint not checked) whose key the suite plans, else
the complete one finished last; else a ``failed`` one (its reason is reported); else an
incomplete one, reported as running when a live runner holds its lock, else as
interrupted (``run`` redoes it).

:meth:`Catalog.predictions` is the only function through which anything after analysis
(the report's plots) reads per-sample predictions; derived methods are combined there
from their members' stored predictions.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

import numpy as np

from bench.core.errors import ConfigError
from bench.store.lock import LOCK_SUFFIX, CellLock
from bench.config.options import Problems, parse, to_dict
from bench.core.registry import METHODS
from bench.store import (CELL, CHECKPOINT, DAMAGED_MARK, MANIFEST, READ_ERRORS, STORE_SUITE, CellDir, CellRecord,
                         Predictions, TrainingFeatures,
                         atomic_write_json)

Preds = dict[str, Predictions]  # split -> its stored predictions


@dataclass(frozen=True)
class MethodEntry:
    """A method row as the catalog knows it: ``kind`` ``trained`` or ``derived``; ``method``
    is the derived method's instance (``None`` for trained methods).  A row that is one of
    several configurations of a method (``msp (epochs=1)``) names that method in ``of``; a
    derived row names the row of its base it combines in ``member`` (both ``""`` otherwise)."""

    name: str
    type: str
    kind: str
    method: object = None
    of: str = ""
    member: str = ""

    @property
    def base(self) -> str:
        """The row whose cells a derived method combines (``""`` for trained methods)."""
        if self.method is None:
            return ""
        return self.member or self.method.options.base

    @property
    def suite_name(self) -> str:
        """The suite's (or ``suite.json``'s) name of the method this row shows."""
        return self.of or self.name


@dataclass(frozen=True)
class LeftOut:
    """A cell the tables leave out: ``state`` is ``missing``, ``failed``, ``damaged``,
    ``interrupted`` or ``running``; ``detail`` says why (or who runs it)."""

    key: str
    dataset: str
    method: str
    seed: int
    state: str
    detail: str

    @property
    def label(self) -> str:
        return f"{self.dataset} / {self.method} / seed {self.seed}"


@dataclass
class Catalog:
    """The cells of one store chosen for analysis, and the suite-level facts around them.

    ``cells`` maps ``(dataset, method row, seed)`` to the complete cell used; ``problems``
    maps the same keys to why a wanted cell has no usable predictions (``failed: ...``,
    ``incomplete ...``); ``running`` to ``(cell key, who runs it)`` for cells a live runner
    holds (not problems: they are not used yet); ``left`` to ``(cell key, state, why)`` for
    every one of these; ``elsewhere`` to the cell keys of a seed the store holds only in a
    configuration the row does not use; ``seeds`` are the seeds analysed (the suite's when
    given, else every seed found).
    """

    name: str
    root: Path
    datasets: list[str]
    methods: list[MethodEntry]
    seeds: tuple[int, ...]
    reference: str
    cells: dict[tuple[str, str, int], CellDir] = field(default_factory=dict)
    problems: dict[tuple[str, str, int], str] = field(default_factory=dict)
    damaged: dict[tuple[str, str, int], tuple[str, str]] = field(default_factory=dict)  # -> (directory, reason)
    unnamed: dict[str, str] = field(default_factory=dict)  # directory -> why it names no cell
    running: dict[tuple[str, str, int], tuple[str, str]] = field(default_factory=dict)
    left: dict[tuple[str, str, int], tuple[str, str, str]] = field(default_factory=dict)
    # (dataset, row, seed) -> cell key(s) of that seed in a configuration the row does not use
    elsewhere: dict[tuple[str, str, int], str] = field(default_factory=dict)
    _preds: dict[tuple[str, str, int], Preds] = field(default_factory=dict, repr=False)
    _records: dict[str, CellRecord] = field(default_factory=dict, repr=False)  # cell key -> its cell.json

    def record(self, cd: CellDir) -> CellRecord:
        """The ``cell.json`` of a cell of this store as the scan of :func:`open_store` read it
        (read here, once, for a cell the scan did not read); an empty record where it is
        unreadable.  Every reader after the scan (analysis, report, ``compare``) takes a
        cell's record from here, so each ``cell.json`` is read once per catalog."""
        if cd.key in self._records:
            return self._records[cd.key]
        record = cd.read_cell()
        if record is None:
            return CellRecord()  # not kept: a later reader tries the file again
        self._records[cd.key] = record
        return record

    def dataset_class(self, dataset: str) -> type | None:
        """The registered class of a dataset (its type from a cell's ``cell.json``), or None
        when no cell names a registered type.  Its optional ``headline_metrics`` and
        ``report_note`` (:mod:`bench.data`) shape the report."""
        from bench.core.registry import DATASETS

        for (d, _, _), cd in self.cells.items():
            if d != dataset:
                continue
            try:
                kind = self.record(cd).config["dataset"]["type"]
            except (KeyError, TypeError):
                continue
            return DATASETS.get(kind) if kind in DATASETS else None
        return None

    def method_deviations(self, method: str) -> list[str]:
        """How a method row differs from its authors' code: its class's ``deviations()``
        (:mod:`bench.train.method`) for the options in its cells' ``cell.json`` (a derived row: its
        own options), plus a line when those options lack fields the code has now (cells
        of an earlier version) or no longer parse; [] when no cell names a registered method."""
        entry = self.method(method)
        if entry.kind == "derived":
            return list(entry.method.deviations())
        for (_, m, _), cd in self.cells.items():
            if m != method:
                continue
            try:
                config = self.record(cd).config["method"]
                kind, stored = config["type"], dict(config["options"])
            except (KeyError, TypeError, ValueError):
                continue
            if kind not in METHODS:
                return []
            cls = METHODS.get(kind)
            problems = Problems()
            options = parse(cls.Options, stored, "", problems)
            if options is None:
                return [f"trained with options this code does not accept ({'; '.join(problems)})"]
            unrecorded = [f for f in to_dict(options) if f not in stored]
            old = [f"trained before the option(s) {', '.join(unrecorded)} existed"] if unrecorded else []
            return list(cls(options).deviations()) + old
        return []

    # --- predictions ---------------------------------------------------------------------
    def load_or_mark_damaged(self, dataset: str, method: str, seed: int) -> Preds | None:
        """Load and check every stored split of a trained cell (cached after the first
        call), or None when it has none.  A file that does not read as the store writes it
        (:meth:`bench.store.CellDir.read_preds`; changed since the cell was chosen) marks
        the cell damaged: it moves from :attr:`cells` to :attr:`problems`, :attr:`damaged`
        and :attr:`left`, and None is returned."""
        key = (dataset, method, seed)
        if key not in self._preds:
            cd = self.cells.get(key)
            if cd is None:
                return None
            try:
                self._preds[key] = {split: cd.read_preds(split) for split in cd.splits()}
            except READ_ERRORS as exc:
                del self.cells[key]
                why = f"damaged cell {cd.key}: {exc}; `run` moves it aside and redoes it"
                self.problems[key] = why
                self.damaged[key] = (cd.key, why)
                self.left[key] = (cd.key, "damaged", why)
                return None
        return self._preds[key]

    def training_features(self, dataset: str, method: str, seed: int) -> TrainingFeatures | None:
        """The stored training features and classifier head of a trained cell
        (:meth:`bench.store.CellDir.read_training_features`), or None when it has none
        (stored without features or before the store kept them) or is not used."""
        cd = self.cells.get((dataset, method, seed))
        return cd.read_training_features() if cd is not None else None

    def replicates(self, dataset: str, entry: MethodEntry) -> list[tuple[int, tuple[int, ...]]]:
        """``(seed or replicate id, member seeds)`` of a method on a dataset."""
        if entry.kind == "trained":
            return [(s, (s,)) for s in self.seeds]
        return entry.method.replicates(self.seeds)

    def formed(self, dataset: str, entry: MethodEntry) -> list[tuple[int, tuple[int, ...]]]:
        """The replicates of a derived method on a dataset whose every member is a used cell
        of its base (:attr:`cells`; cells found damaged have left it): the only ones that
        get numbers, in predictions, efficiency and convergence alike."""
        return [(rid, members) for rid, members in self.replicates(dataset, entry)
                if all((dataset, entry.base, s) in self.cells for s in members)]

    def unformed(self, dataset: str, entry: MethodEntry) -> dict[int, str]:
        """Replicate id -> why it cannot be formed (``needs N members, the store has M``: the
        members that are not used cells, each with why), for a derived method whose base
        has a cell on ``dataset`` (used, left out or running; a base never run there gives
        none: its own cells are what is missing).  When the seeds analysed are fewer than
        one replicate's members, replicate 0 says so."""
        base = entry.base
        if not any(d == dataset and m == base for d, m, _ in [*self.cells, *self.problems, *self.running]):
            return {}
        out = {rid: self._shortfall(dataset, entry, members) for rid, members in self.replicates(dataset, entry)}
        need = entry.method.members_per_replicate()
        if need > len(self.seeds):
            have = [s for s in self.seeds if (dataset, base, s) in self.cells]
            out[0] = (f"needs {need} members, the store has {len(have)} (analysed: {_seeds(self.seeds)}; "
                      f"usable {base} cells: {_seeds(have) if have else 'none'}); add seeds to the run "
                      f"(at least {need}) and run the suite to train them")
        return {rid: why for rid, why in out.items() if why}

    def _shortfall(self, dataset: str, entry: MethodEntry, members: tuple[int, ...]) -> str:
        """Why a derived replicate of ``members`` cannot be formed ("" when it can)."""
        base = entry.base
        missing = [s for s in members if (dataset, base, s) not in self.cells]
        if not missing:
            return ""
        why = "; ".join(f"seed {s}: {self._why_not_used((dataset, base, s))}" for s in missing)
        return (f"needs {len(members)} member{'s' if len(members) > 1 else ''}, the store has "
                f"{len(members) - len(missing)} ({base} {_seeds(members)}; {why}); run the suite to train them")

    def combined(self, dataset: str, entry: MethodEntry, rid: int, members: tuple[int, ...]) -> Preds | str:
        """A derived replicate's predictions, or the reason it cannot be formed."""
        key = (dataset, entry.name, rid)
        if key in self._preds:
            return self._preds[key]
        why = self._shortfall(dataset, entry, members)
        if why:
            return why
        preds = entry.method.predict_from([self.load_or_mark_damaged(dataset, entry.base, s) for s in members])
        self._preds[key] = preds
        return preds

    def predictions(self, dataset: str, method: str, seed: int, split: str) -> tuple[np.ndarray, np.ndarray]:
        """``(probs [N, C] float64, labels [N] int64)`` of one split; labels are ``-1`` on OOD
        splits.  ``seed`` is a replicate id for ensembles.  The one documented way to read
        per-sample predictions from the store (the report's plots use it)."""
        entry = self.method(method)
        if entry.kind == "trained":
            preds = self.load_or_mark_damaged(dataset, method, seed)
        else:
            members = dict(entry.method.replicates(self.seeds)).get(seed)
            preds = self.combined(dataset, entry, seed, members) if members is not None else None
        if not isinstance(preds, dict) or split not in preds:
            raise KeyError(f"no stored predictions for {dataset} / {method} / {seed} / {split}")
        arrays = preds[split]
        return np.exp(arrays.log_probs.astype(np.float64)), arrays.labels

    def method(self, name: str) -> MethodEntry:
        for m in self.methods:
            if m.name == name:
                return m
        raise KeyError(name)

    # --- selection and what is left out ---------------------------------------------------
    def rows(self, names: Iterable[str], bases: bool = False) -> list[str]:
        """The rows, in display order, that show the methods ``names`` (suite names: every
        configuration of each); with ``bases`` also the rows of the trained methods the
        derived ones among them are combined from."""
        wanted = set(names)
        if bases:
            wanted |= {m.method.options.base for m in self.methods if m.kind == "derived" and m.suite_name in wanted}
        return [m.name for m in self.methods if m.suite_name in wanted]

    def with_cells(self) -> list[str]:
        """The methods (suite names, display order) that have a cell in the store, found or
        left out; a derived method counts when its base does."""
        used = {m for _, m, _ in [*self.cells, *self.problems, *self.running]}
        names = []
        for m in self.methods:
            if (m.name in used or m.base in used) and m.suite_name not in names:
                names.append(m.suite_name)
        return names

    def left_out(self, planned: Iterable[tuple[str, str, str, int]] | None = None,
                 damaged: dict[str, str] | None = None) -> list[LeftOut]:
        """The cells the tables leave out.  ``planned`` (``(key, dataset, method, seed)`` of
        a suite's plan, in order): every planned cell that is not used, ``missing`` when the
        store has no directory for it; without a plan, the store's own cells that are
        failed, damaged, interrupted or running.  ``damaged`` (cell key -> why; the
        analysis' damaged cells) marks cells found unusable after the store was opened.  A
        missing or interrupted cell whose lock a live runner holds is ``running``."""
        damaged = dict(damaged or {})
        if planned is None:
            items = [(key, d, m, s, state, why) for (d, m, s), (key, state, why) in self.left.items()]
        else:
            known = {key: (state, why) for key, state, why in self.left.values()}
            known.update({key: ("damaged", why) for key, why in self.unnamed.items()})
            used = {cd.key for cd in self.cells.values()}
            items = [(key, d, m, s, *known.get(key, ("missing", "not in the store")))
                     for key, d, m, s in planned if key not in used or key in damaged]
        out = []
        for key, d, m, s, state, why in items:
            if key in damaged:
                state, why = "damaged", damaged[key]
            elif state in ("missing", "interrupted") and (who := live_runner(self.root, key)) is not None:
                state, why = "running", describe_runner(who)
            out.append(LeftOut(key, d, m, s, state, why))
        return out

    def _use(self, key: tuple[str, str, int], candidates: list[CellDir], planned: set[str]) -> None:
        """Record the cell used for ``key`` (dataset, row, seed), or why none is; the
        records of the complete candidates become those read once they verified (:func:`_choose`)."""
        cd, state, problem, directory = _choose(candidates, planned, self._records)
        if cd is not None:
            self.cells[key] = cd
            return
        who = live_runner(self.root, directory) if state == "interrupted" else None
        if who is not None:
            self.running[key] = (directory, describe_runner(who))
            self.left[key] = (directory, "running", self.running[key][1])
            return
        self.problems[key] = problem
        if directory:
            self.left[key] = (directory, state, problem)
        if state == "damaged":
            self.damaged[key] = (directory, problem)

    def _why_not_used(self, key: tuple[str, str, int]) -> str:
        if key in self.problems:
            return self.problems[key]
        if key in self.running:
            return f"running, {self.running[key][1]}"
        if key in self.elsewhere:
            return f"not in the store in this configuration (it holds a cell of another one: {self.elsewhere[key]})"
        return "not in the store"

    # --- identity ------------------------------------------------------------------------
    def fingerprint(self) -> dict:
        """What analysis results depend on in the store: the selection and, per used cell,
        the digest of its manifest (which pins every file's sha256) or its problem (or
        the cells of another configuration it has instead)."""
        cells = {f"{d}|{m}|{s}": hashlib.sha256((cd.path / MANIFEST).read_bytes()).hexdigest()
                 for (d, m, s), cd in sorted(self.cells.items())}
        problems = {f"{d}|{m}|{s}": why for (d, m, s), why in sorted(self.problems.items())}
        problems.update({f"{d}|{m}|{s}": f"elsewhere: {keys}" for (d, m, s), keys in sorted(self.elsewhere.items())})
        methods = [{"name": m.name, "type": m.type, "kind": m.kind,
                    "options": to_dict(m.method.options) if m.method is not None else None} for m in self.methods]
        return {"suite": self.name, "datasets": self.datasets, "methods": methods, "seeds": list(self.seeds),
                "reference": self.reference, "cells": cells, "problems": problems}


# ------------------------------------------------------------------------ the store side


def describe_suite(suite) -> dict:
    """The suite facts a store keeps in ``suite.json`` (written by ``run``)."""
    return {
        "name": suite.name,
        "description": suite.description,
        "reference": suite.reference_method,
        "datasets": [d.name for d in suite.datasets],
        "methods": [{"name": m.name, "type": m.type, "kind": m.kind,
                     **({"options": to_dict(m.options)} if m.kind == "derived" else {})}
                    for m in suite.methods],
    }


def write_store_description(root: Path, suite) -> None:
    """Record the suite in the store (merging the methods of earlier runs into its list)."""
    root.mkdir(parents=True, exist_ok=True)
    new = describe_suite(suite)
    old = _read_description(root)
    if old is not None:
        names = {m["name"] for m in new["methods"]}
        new["methods"] += [m for m in old.get("methods", []) if m.get("name") not in names]
        new["datasets"] += [d for d in old.get("datasets", []) if d not in new["datasets"]]
    atomic_write_json(root / STORE_SUITE, new)


def _read_description(root: Path) -> dict | None:
    try:
        obj = json.loads((root / STORE_SUITE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _scan(root: Path) -> tuple[dict[tuple[str, str, int], list[CellDir]], dict[str, str], dict[str, CellRecord]]:
    """Every cell directory of the store, grouped by the (dataset, method, seed) its
    ``cell.json`` names, the directories that cannot be attributed (unreadable, or no
    usable ``cell.json``) with the reason, and the record (``cell.json``) of every grouped
    cell by key.  Damaged cells moved aside by ``run`` are skipped."""
    found: dict[tuple[str, str, int], list[CellDir]] = {}
    unnamed: dict[str, str] = {}
    records: dict[str, CellRecord] = {}
    for path in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if DAMAGED_MARK in path.name:
            continue
        cd = CellDir(path)
        try:
            info = cd.read_cell()
            has_manifest = cd.sealed()
        except OSError as exc:
            unnamed[path.name] = f"unreadable directory: {exc.strerror or exc}"
            continue
        if info is None or None in (info.dataset, info.method, info.seed):
            if info is not None or has_manifest or (path / CELL).exists():
                unnamed[path.name] = "its cell.json is missing, truncated or not a cell record"
            continue
        found.setdefault((info.dataset, info.method, info.seed), []).append(cd)
        records[cd.key] = info
    return found, unnamed, records


def _choose(candidates: list[CellDir], planned: set[str],
            records: dict[str, CellRecord]) -> tuple[CellDir | None, str, str, str]:
    """``(cell to use, state, problem, directory)`` among directories naming one (dataset,
    method, seed): a complete one (state ``complete``; among several unplanned ones the one
    finished last by its record), else the first damaged, failed or interrupted one, with
    why and its directory.  A complete candidate's record in ``records`` is replaced by the
    one read right after it verified (the scan's may be of a directory since moved aside and
    redone, or of a cell still running then)."""
    conditions = {cd.key: cd.condition(skip=(CHECKPOINT,)) for cd in candidates}
    # the records of what was just verified, not of what the scan saw before
    verified = {cd.key: cd.read_cell() for cd in candidates if conditions[cd.key][0] == "complete"}
    records.update({key: record for key, record in verified.items() if record is not None})
    complete = [cd for cd in candidates if verified.get(cd.key) is not None]
    if complete:
        mine = [cd for cd in complete if cd.key in planned]
        if mine:
            return mine[0], "complete", "", mine[0].key
        chosen = max(complete, key=lambda cd: (records[cd.key].finished or "", cd.key))
        return chosen, "complete", "", chosen.key
    for state in ("damaged", "failed", "interrupted"):
        for cd in candidates:
            kind, why = conditions[cd.key]
            if kind == state == "damaged":
                return None, state, f"damaged cell {cd.key}: {why}; `run` moves it aside and redoes it", cd.key
            if kind == state == "failed":
                return None, state, why, cd.key
            if kind == state == "interrupted":
                return None, state, f"{why}; cell {cd.key}; run the suite again to redo it", cd.key
    return None, "", "no usable cell", ""


def open_store(root: Path, suite=None, planned: set[str] = frozenset()) -> Catalog:
    """The catalog of the store at ``root``.

    With ``suite`` (a :class:`bench.config.spec.Suite`, already narrowed to what is reported) its
    datasets, methods, seeds and reference select and order the cells; ``planned`` are the
    cell keys its plan expects (their configuration is used alone when the store holds
    several, e.g. after the suite was edited).  Without a suite everything found is used,
    in the order of ``suite.json``, one row per configuration of a method (module
    docstring).
    """
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"no store at {root}: run the suite first, or pass --results DIR and --suite NAME "
                          "for a store under DIR/NAME")
    found, unnamed, records = _scan(root)
    if suite is not None:
        datasets = [d.name for d in suite.datasets]
        entries = [_entry(m.name, m.type, m.kind, m.options) for m in suite.methods]
        seeds = tuple(suite.seeds)
        name, reference = suite.name, suite.reference_method
    else:
        desc = _read_description(root) or {}
        name = str(desc.get("name", root.name))
        datasets = [str(d) for d in desc.get("datasets", [])]
        datasets += sorted({d for d, _, _ in found} - set(datasets))
        entries = []
        for i, m in enumerate(desc.get("methods", [])):
            entries.append(_described_entry(m, f"{root / STORE_SUITE}: methods[{i}]"))
        known = {e.name for e in entries}
        entries += [MethodEntry(m, m, "trained") for m in sorted({m for _, m, _ in found} - known)]
        seeds = tuple(sorted({s for _, _, s in found}))
        reference = str(desc.get("reference", ""))
        if reference not in {e.name for e in entries}:
            reference = entries[0].name if entries else ""
    catalog = Catalog(name, root, datasets, [], seeds, reference, unnamed=unnamed, _records=records)
    planned = set(planned)
    rows: dict[str, list[str]] = {}  # trained method -> its rows (configurations) on any dataset
    for d in datasets:
        for e in entries:
            if e.kind != "trained":
                continue
            by_seed = {s: found[(d, e.name, s)] for s in seeds if (d, e.name, s) in found}
            for label, group in _configurations(by_seed, planned, records):
                row = f"{e.name} ({label})" if label else e.name
                if row not in rows.setdefault(e.name, []):
                    rows[e.name].append(row)
                for s, candidates in group.items():
                    catalog._use((d, row, s), candidates, planned)
                for s in by_seed.keys() - group.keys():
                    catalog.elsewhere[(d, row, s)] = ", ".join(cd.key for cd in by_seed[s])
    for e in entries:
        mine = rows.get(e.name if e.kind == "trained" else e.base, [])
        base = e.name if e.kind == "trained" else e.base
        if not mine or mine == [base]:
            catalog.methods.append(e)
        elif e.kind == "trained":
            catalog.methods += [MethodEntry(row, e.type, e.kind, of=e.name) for row in sorted(mine, key=_natural)]
        else:
            catalog.methods += [MethodEntry(e.name + row[len(base):], e.type, e.kind, e.method, of=e.name, member=row)
                                for row in sorted(mine, key=_natural)]
    if reference not in {m.name for m in catalog.methods}:  # its configurations: the first is the reference
        catalog.reference = next((m.name for m in catalog.methods if m.of == reference), "")
    return catalog


def _configurations(by_seed: dict[int, list[CellDir]], planned: set[str],
                    records: dict[str, CellRecord]) -> list[tuple[str, dict[int, list[CellDir]]]]:
    """The configuration groups of one method's cells on one dataset, as ``(label, seed ->
    candidates)``: the group of a planned cell alone when there is one, else every group;
    ``label`` names the settings in which the groups differ (``""`` for a single group).
    ``records``: the cells' ``cell.json`` by key."""
    groups: dict[str, dict[int, list[CellDir]]] = {}
    configs: dict[str, dict] = {}
    for s, candidates in by_seed.items():
        for cd in candidates:
            config = _configuration(records[cd.key])
            ident = json.dumps(config, sort_keys=True)
            configs[ident] = config
            groups.setdefault(ident, {}).setdefault(s, []).append(cd)
    mine = {i: g for i, g in groups.items() if any(cd.key in planned for c in g.values() for cd in c)}
    groups = mine or groups
    if len(groups) == 1:
        return [("", next(iter(groups.values())))]
    labels = _labels({i: configs[i] for i in groups})
    return [(labels[i], g) for i, g in groups.items()]


def _configuration(record: CellRecord) -> dict:
    """A cell's resolved config without its seed (``{}`` when its ``cell.json`` records none)."""
    config = record.config
    return {k: v for k, v in config.items() if k != "seed"} if isinstance(config, dict) else {}


def _flatten(obj, prefix: str = "") -> Iterable[tuple[str, object]]:
    if isinstance(obj, dict) and obj:
        for k in sorted(obj):
            yield from _flatten(obj[k], f"{prefix}{k}.")
    else:
        yield prefix[:-1], obj


def _labels(configs: dict[str, dict]) -> dict[str, str]:
    """Per configuration, the settings in which it differs from the others, e.g.
    ``epochs=1, lr=0.003``: each by the shortest unambiguous end of its key path."""
    flat = {i: dict(_flatten(c)) for i, c in configs.items()}
    paths = sorted({p for f in flat.values() for p in f})
    differ = [p for p in paths if len({json.dumps(f[p], sort_keys=True) if p in f else None for f in flat.values()}) > 1]

    def short(path: str) -> str:
        parts = path.split(".")
        for n in range(1, len(parts)):
            tail = ".".join(parts[-n:])
            if sum(q == tail or q.endswith("." + tail) for q in differ) == 1:
                return tail
        return path

    def text(f: dict, path: str) -> str:
        if path not in f:
            return "unset"
        value = f[path]
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))

    return {i: ", ".join(f"{short(p)}={text(f, p)}" for p in differ) for i, f in flat.items()}


def _natural(text: str) -> list:
    """Sort key ordering the numbers in ``text`` by value (``epochs=2`` before ``epochs=10``)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def _seeds(seeds: Iterable[int]) -> str:
    """``seed 0`` or ``seeds 0, 1, 2``: seeds as a message names them."""
    seeds = list(seeds)
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def live_runner(root: Path, key: str) -> dict | None:
    """The runner holding cell ``key``'s lock in the store ``root`` (its ``host``, ``pid``,
    ``since`` and heartbeat ``age``), or None when the cell is not locked or its lock is
    stale (its runner died)."""
    lock = CellLock(Path(root) / f"{key}{LOCK_SUFFIX}")
    who = lock.holder()
    return None if who is None or lock.stale() else who


def describe_runner(who: dict) -> str:
    """``locked by HOST pid PID since TIME`` for a lock holder (:func:`live_runner`)."""
    since = who.get("since")
    when = (datetime.fromtimestamp(since, timezone.utc).isoformat(timespec="seconds")
            if isinstance(since, (int, float)) and not isinstance(since, bool) else "an unknown time")
    return f"locked by {who.get('host', '?')} pid {who.get('pid', '?')} since {when}"


def _entry(name: str, type_: str, kind: str, options) -> MethodEntry:
    return MethodEntry(name, type_, kind, METHODS.get(type_)(options) if kind == "derived" else None)


def _described_entry(m: dict, where: str) -> MethodEntry:
    """A method from ``suite.json``; a derived one's options are validated like a suite's."""
    if not isinstance(m, dict) or not isinstance(m.get("name"), str):
        raise ConfigError(f"{where}: not a method description; delete {STORE_SUITE} or re-run the suite")
    type_, kind = str(m.get("type", m["name"])), str(m.get("kind", "trained"))
    if kind != "derived":
        return MethodEntry(m["name"], type_, "trained")
    problems = Problems()
    options = parse(METHODS.get(type_, key=f"{where}.type").Options, dict(m.get("options", {})), where, problems)
    problems.raise_if_any()
    return _entry(m["name"], type_, kind, options)


__all__ = ["Catalog", "MethodEntry", "LeftOut", "open_store", "describe_suite", "write_store_description",
           "live_runner", "describe_runner"]
