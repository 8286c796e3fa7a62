"""What a store holds, read from its folder alone, and the one way to read its predictions.

A store ``<results>/<suite>/`` describes itself: every cell's ``cell.json`` names its
dataset, method and seed (the suite's names) and holds its resolved config, and
``suite.json`` (written by ``run``) records the suite's display order, its reference
method and the options of its derived methods (ensembles, temperature scaling), which
have no cells.  :func:`open_store` turns that into a :class:`Catalog`; a suite, when
given, only selects and orders what is there (and supplies the derived methods' options).
So a store can be analysed after its suite file was edited or deleted.

Which cell is used for a (dataset, method, seed): among the directories whose
``cell.json`` names it, a complete one (manifest verifies, checkpoint not checked) whose
key the suite plans, else the complete one finished last; else a ``failed`` one (its
reason is reported); else an incomplete one, reported as such (``run`` redoes it).

:meth:`Catalog.predictions` is the only function through which anything after analysis
(the report's plots) reads per-sample predictions; derived methods are combined there
from their members' stored predictions.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.errors import ConfigError
from bench.options import Problems, parse, to_dict
from bench.registry import METHODS
from bench.store import (CELL, CHECKPOINT, DAMAGED_MARK, MANIFEST, READ_ERRORS, STORE_SUITE, CellDir,
                         atomic_write_json)

Preds = dict[str, dict[str, np.ndarray]]  # split -> {"log_probs", "labels", optional decomposition terms}


@dataclass(frozen=True)
class MethodEntry:
    """A method as the catalog knows it: ``kind`` ``trained`` or ``derived``; ``method``
    is the derived method's instance (``None`` for trained methods)."""

    name: str
    type: str
    kind: str
    method: object = None

    @property
    def base(self) -> str:
        return self.method.options.base if self.method is not None else ""


@dataclass
class Catalog:
    """The cells of one store chosen for analysis, and the suite-level facts around them.

    ``cells`` maps ``(dataset, method, seed)`` to the complete cell used; ``problems``
    maps the same keys to why a wanted cell has no usable predictions (``failed: ...``,
    ``incomplete ...``); ``seeds`` are the seeds analysed (the suite's when given, else
    every seed found).
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
    _preds: dict[tuple[str, str, int], Preds] = field(default_factory=dict, repr=False)

    def dataset_class(self, dataset: str) -> type | None:
        """The registered class of a dataset (its type from a cell's ``cell.json``), or None
        when no cell names a registered type.  Its optional ``headline_metrics`` and
        ``report_note`` (:mod:`bench.data`) shape the report."""
        from bench.registry import DATASETS

        for (d, _, _), cd in self.cells.items():
            if d != dataset:
                continue
            try:
                kind = (cd.read_cell() or {})["config"]["dataset"]["type"]
            except (OSError, KeyError, TypeError):
                continue
            return DATASETS.get(kind) if kind in DATASETS else None
        return None

    # --- predictions ---------------------------------------------------------------------
    def stored(self, dataset: str, method: str, seed: int) -> Preds | None:
        """Every stored split of a trained cell (cached), or None when it has none.  A file
        that no longer reads as the store writes it (:meth:`bench.store.CellDir.read_arrays`;
        changed since the cell was chosen) makes the cell damaged: it moves from
        :attr:`cells` to :attr:`problems` and None is returned."""
        key = (dataset, method, seed)
        if key not in self._preds:
            cd = self.cells.get(key)
            if cd is None:
                return None
            try:
                self._preds[key] = {split: cd.read_arrays(split) for split in cd.splits()}
            except READ_ERRORS as exc:
                del self.cells[key]
                why = f"damaged cell {cd.key}: {exc}; `run` moves it aside and redoes it"
                self.problems[key] = why
                self.damaged[key] = (cd.key, why)
                return None
        return self._preds[key]

    def replicates(self, dataset: str, entry: MethodEntry) -> list[tuple[int, tuple[int, ...]]]:
        """``(seed or replicate id, member seeds)`` of a method on a dataset."""
        if entry.kind == "trained":
            return [(s, (s,)) for s in self.seeds]
        return entry.method.replicates(self.seeds)

    def combined(self, dataset: str, entry: MethodEntry, rid: int, members: tuple[int, ...]) -> Preds | str:
        """A derived replicate's predictions, or the reason it cannot be formed."""
        key = (dataset, entry.name, rid)
        if key in self._preds:
            return self._preds[key]
        base = entry.base
        missing = [s for s in members if (dataset, base, s) not in self.cells]
        if missing:
            why = "; ".join(f"seed {s}: {self.problems.get((dataset, base, s), 'not in the store')}" for s in missing)
            return f"member {base} seed(s) {missing} unusable ({why}); run the suite to train them"
        preds = entry.method.predict_from([self.stored(dataset, base, s) for s in members])
        self._preds[key] = preds
        return preds

    def predictions(self, dataset: str, method: str, seed: int, split: str) -> tuple[np.ndarray, np.ndarray]:
        """``(probs [N, C] float64, labels [N] int64)`` of one split; labels are ``-1`` on OOD
        splits.  ``seed`` is a replicate id for ensembles.  The one documented way to read
        per-sample predictions from the store (the report's plots use it)."""
        entry = self.method(method)
        if entry.kind == "trained":
            preds = self.stored(dataset, method, seed)
        else:
            members = dict(entry.method.replicates(self.seeds)).get(seed)
            preds = self.combined(dataset, entry, seed, members) if members is not None else None
        if not isinstance(preds, dict) or split not in preds:
            raise KeyError(f"no stored predictions for {dataset} / {method} / {seed} / {split}")
        arrays = preds[split]
        return np.exp(arrays["log_probs"].astype(np.float64)), arrays["labels"]

    def method(self, name: str) -> MethodEntry:
        for m in self.methods:
            if m.name == name:
                return m
        raise KeyError(name)

    # --- identity ------------------------------------------------------------------------
    def fingerprint(self) -> dict:
        """What analysis results depend on in the store: the selection and, per used cell,
        the digest of its manifest (which pins every file's sha256) or its problem."""
        cells = {f"{d}|{m}|{s}": hashlib.sha256((cd.path / MANIFEST).read_bytes()).hexdigest()
                 for (d, m, s), cd in sorted(self.cells.items())}
        problems = {f"{d}|{m}|{s}": why for (d, m, s), why in sorted(self.problems.items())}
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


def _scan(root: Path) -> tuple[dict[tuple[str, str, int], list[CellDir]], dict[str, str]]:
    """Every cell directory of the store, grouped by the (dataset, method, seed) its
    ``cell.json`` names, and the directories that cannot be attributed (unreadable, or no
    usable ``cell.json``) with the reason.  Damaged cells moved aside by ``run`` are skipped."""
    found: dict[tuple[str, str, int], list[CellDir]] = {}
    unnamed: dict[str, str] = {}
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
        if info is None or not {"dataset", "method", "seed"} <= set(info):
            if info is not None or has_manifest or (path / CELL).exists():
                unnamed[path.name] = "its cell.json is missing, truncated or not a cell record"
            continue
        try:
            key = (str(info["dataset"]), str(info["method"]), int(info["seed"]))
        except (TypeError, ValueError):
            unnamed[path.name] = "its cell.json names no valid dataset, method and seed"
            continue
        found.setdefault(key, []).append(cd)
    return found, unnamed


def _choose(candidates: list[CellDir], planned: set[str]) -> tuple[CellDir | None, str, str]:
    """``(cell to use, problem, directory)`` among directories naming one (dataset, method,
    seed); ``directory`` is set when the problem is damage (not a failure or interruption)."""
    conditions = {cd.key: cd.condition(skip=(CHECKPOINT,)) for cd in candidates}
    complete = [cd for cd in candidates if conditions[cd.key][0] == "complete"]
    if complete:
        mine = [cd for cd in complete if cd.key in planned]
        if mine:
            return mine[0], "", ""
        return max(complete, key=lambda cd: (str((cd.read_cell() or {}).get("finished", "")), cd.key)), "", ""
    for state in ("damaged", "failed", "interrupted"):
        for cd in candidates:
            kind, why = conditions[cd.key]
            if kind == state == "damaged":
                return None, f"damaged cell {cd.key}: {why}; `run` moves it aside and redoes it", cd.key
            if kind == state == "failed":
                return None, why, ""
            if kind == state == "interrupted":
                return None, f"{why}; cell {cd.key}; run the suite again to redo it", ""
    return None, "no usable cell", ""


def open_store(root: Path, suite=None, planned: set[str] = frozenset()) -> Catalog:
    """The catalog of the store at ``root``.

    With ``suite`` (a :class:`bench.spec.Suite`, already narrowed to what is reported) its
    datasets, methods, seeds and reference select and order the cells; ``planned`` are the
    cell keys its plan expects (preferred when a store holds several cells for one
    (dataset, method, seed), e.g. after the suite was edited).  Without a suite everything
    found is used, in the order of ``suite.json``.
    """
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"no store at {root}: run the suite first, or pass --results DIR and --suite NAME "
                          "for a store under DIR/NAME")
    found, unnamed = _scan(root)
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
    catalog = Catalog(name, root, datasets, entries, seeds, reference, unnamed=unnamed)
    for d in datasets:
        for e in entries:
            if e.kind != "trained":
                continue
            for s in seeds:
                candidates = found.get((d, e.name, s))
                if not candidates:
                    continue
                cd, problem, damaged_dir = _choose(candidates, set(planned))
                if cd is not None:
                    catalog.cells[(d, e.name, s)] = cd
                else:
                    catalog.problems[(d, e.name, s)] = problem
                    if damaged_dir:
                        catalog.damaged[(d, e.name, s)] = (damaged_dir, problem)
    return catalog


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


__all__ = ["Catalog", "MethodEntry", "open_store", "describe_suite", "write_store_description"]
