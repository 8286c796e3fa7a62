"""The analysis files: :func:`save`, :func:`load` and the cache :func:`analyse_store`.

:func:`save` writes the analysis under ``<reports>/<suite>/analysis/`` (:data:`FILES`:
tidy CSV tables a researcher loads with ``pandas.read_csv``, and ``analysis.json`` with
the schema version, the options, the fingerprint of the store and the display orders);
:func:`load` reads them back into an :class:`~bench.analysis.results.AnalysisResults`,
which is all the report renders from. :func:`analyse_store` reuses the files when the
fingerprint (the manifests' digests of the cells used, the selection, the analysis
options, the analysis code, the source of every module defining a metric, kernel, OOD
score or derived method it calls and of the helper modules beside them, a plugin's
included (:func:`module_digests`), the data sets' report settings and the methods'
differences from their authors' code) is unchanged, and recomputes them otherwise. It
keeps one result set per fingerprint: the set a new fingerprint replaces moves to
``cache/<key>/`` under the same folder (the :data:`CACHE_KEEP` most recent are kept), and
comes back when its fingerprint does, so reporting another store's content or other
options and then returning recomputes nothing.

Why CSV and not Parquet: the tables are small (the default store's per-seed table is
about 1 MB gzipped), CSV needs no further dependency in a suite whose fresh install is
measured against a time budget, it diffs in review, and floats are written with
``repr`` precision so reading them back gives the same bits (the report renders from
the reloaded files, so a cached and a fresh report are byte-identical).
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

import pandas as pd

from bench.analysis.evaluate import (DAMAGED_COLUMNS, FAILURE_COLUMNS, METRIC_COLUMNS, UNSCORED_COLUMNS,
                                     analysed_metrics, analysed_scores)
from bench.analysis.results import AnalysisResults, analyse
from bench.analysis.summary import (BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CE_COLUMNS, EFFICIENCY_COLUMNS,
                                       SEVERITY_COLUMNS, SIGNIFICANCE, SUMMARY_COLUMNS, check_significance)
from bench.analysis.training import CONVERGENCE_COLUMNS, CONVERGENCE_SUMMARY_COLUMNS, TRAINING_COLUMNS
from bench.store.catalog import Catalog
from bench.metrics import get_metric
from bench.scores import get_score
from bench.store import atomic_write_bytes, atomic_write_json

ANALYSIS_SCHEMA = 6  # bump when the files' columns or meaning change
ANALYSIS_DIR = "analysis"
CACHE_DIR = "cache"  # under the analysis folder: the earlier result sets, one folder per key
CACHE_KEEP = 8  # result sets kept there, the most recently replaced first
#: file -> (AnalysisResults field, columns, string columns)
FILES: dict[str, tuple[str, list[str], tuple[str, ...]]] = {
    "metrics.csv.gz": ("metrics", METRIC_COLUMNS, ("dataset", "method", "split", "metric", "score")),
    "summary.csv": ("summary", SUMMARY_COLUMNS, ("dataset", "method", "split", "table", "metric", "score", "verdict",
                                                 "test")),
    "severity.csv": ("severity", SEVERITY_COLUMNS, ("dataset", "method", "metric")),
    "corruption_errors.csv": ("corruption_errors", CE_COLUMNS, ("dataset", "method", "corruption")),
    "efficiency.csv": ("efficiency", EFFICIENCY_COLUMNS, ("dataset", "method")),
    "failures.csv": ("failures", FAILURE_COLUMNS, ("dataset", "method", "reason")),
    "damaged.csv": ("damaged", DAMAGED_COLUMNS, ("cell", "dataset", "method", "reason")),
    "unscored.csv": ("unscored", UNSCORED_COLUMNS, ("dataset", "method", "score", "reason")),
    "training.csv": ("training", TRAINING_COLUMNS, ("dataset", "method")),
    "convergence.csv": ("convergence", CONVERGENCE_COLUMNS, ("dataset", "method", "source", "verdict")),
    "convergence_summary.csv": ("convergence_summary", CONVERGENCE_SUMMARY_COLUMNS,
                                ("dataset", "method", "source", "unjudged")),
}
#: The code the analysis files depend on, as paths under ``bench/`` (a folder stands for
#: every ``.py`` file below it); their text is in the fingerprint.
_CODE = ("metrics", "scores", "analysis", "store/catalog.py", "store/record.py", "train/method.py")


def fingerprint(catalog: Catalog, metrics: list[str], resamples: int, seed: int,
                significance: str = SIGNIFICANCE, scores: list[str] | None = None) -> str:
    """sha256 of everything the analysis files depend on (see the module docstring)."""
    code = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in _code_files().items()}
    scores = analysed_scores(scores)
    called = [f for name in metrics for f in (get_metric(name).fn, get_metric(name).bootstrap)]
    called += [f for name in scores for f in (get_score(name).fn, get_score(name).fit)]
    called += [type(m.method) for m in catalog.methods if m.method is not None]  # derived methods combine
    deviations = {m.name: catalog.method_deviations(m.name) for m in catalog.methods}  # the methods' code decides
    classes = {d: catalog.dataset_class(d) for d in catalog.datasets}
    datasets = {d: [repr(getattr(c, a, None)) for a in ("headline_metrics", "report_note", "ood_groups")]
                for d, c in classes.items()}
    blob = json.dumps({"schema": ANALYSIS_SCHEMA, "metrics": metrics, "scores": scores, "resamples": resamples, "seed": seed,
                       "significance": significance, "code": code, "modules": module_digests(called),
                       "store": catalog.fingerprint(), "deviations": deviations, "datasets": datasets},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def module_digests(objects: list) -> dict[str, str]:
    """What the code of ``objects`` (functions, classes: a plugin's metric, kernel, score,
    fit, a derived method) is, by module name: the sha256 of the source file of each
    module defining one, and of every module that file imports (at its top or inside a
    function) whose file lies in the same folder or below it (a plugin's helpers), followed
    through those files in turn; files are found without importing anything
    (:func:`_spec_file`).  The ``bench`` package (its analysis code is :data:`_CODE`) and
    installed packages (the environment's) are left out; an object without a source file
    counts by its source text, or its repr."""
    bench = Path(__file__).parent.parent.resolve()
    installed = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}

    def own(path: Path) -> bool:
        return not (path.is_relative_to(bench) or any(path.is_relative_to(p) for p in installed)
                    or "site-packages" in path.parts or "dist-packages" in path.parts)

    out: dict[str, str] = {}
    todo: list[tuple[str, Path]] = []
    for obj in objects:
        if obj is None:
            continue
        module = inspect.getmodule(obj)
        path = _file_of(module)
        if path is None:
            out[f"<{getattr(obj, '__qualname__', repr(obj))}>"] = hashlib.sha256(_source(obj).encode()).hexdigest()
        elif own(path):
            todo.append((module.__name__, path))
    while todo:
        name, path = todo.pop()
        if name in out:
            continue
        data = path.read_bytes()
        out[name] = hashlib.sha256(data).hexdigest()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for imported in _imports(data, package):
            found = _file_of(sys.modules.get(imported)) or _spec_file(imported)
            if found is not None and found.is_relative_to(path.parent) and own(found):
                todo.append((imported, found))
    return out


def _imports(source: bytes, package: str) -> list[str]:
    """The absolute names of the modules a module's source imports (``from a import b``
    gives ``a`` and ``a.b``: ``b`` may be a module), relative imports resolved in ``package``."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                    else node.module or ""
            except (ImportError, ValueError):
                continue
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return [n for n in dict.fromkeys(names) if n]


def _file_of(module) -> Path | None:
    """The resolved source file of a module, or None (a built-in or a module without a ``.py``)."""
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if isinstance(file, str) and file.endswith(".py") else None


def _spec_file(name: str) -> Path | None:
    """The source file of a module not imported yet (None when there is none), found as the
    import system's path finder finds it, but without importing anything: each parent
    package is looked up in turn (its ``__path__`` when it is imported already, else the
    folders its spec names), so no package's ``__init__`` runs."""
    parts = name.split(".")
    search = None  # sys.path, for a top-level name
    for depth in range(1, len(parts)):
        prefix = ".".join(parts[:depth])
        if (parent := sys.modules.get(prefix)) is not None:
            search = getattr(parent, "__path__", None)
        else:
            search = getattr(_path_spec(prefix, search), "submodule_search_locations", None)
        if search is None:  # no such package, or a module (it has no submodules)
            return None
    origin = getattr(_path_spec(name, search), "origin", None)
    return Path(origin).resolve() if isinstance(origin, str) and origin.endswith(".py") else None


def _path_spec(name: str, search):
    """The path finder's spec of ``name`` in the folders ``search`` (None: ``sys.path``),
    or None; nothing is imported."""
    try:
        return importlib.machinery.PathFinder.find_spec(name, search)
    except (ImportError, ValueError):
        return None


def _code_files() -> dict[str, Path]:
    """Every file of :data:`_CODE`, by its path under ``bench/`` (``analysis/files.py``)."""
    bench = Path(__file__).parent.parent
    paths = []
    for entry in _CODE:
        path = bench / entry
        paths += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return {path.relative_to(bench).as_posix(): path for path in paths}


def _source(fn) -> str:
    """A function's source text (for one defined where no source file is)."""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return repr(fn)


def save(results: AnalysisResults, out: Path, key: str, options: dict) -> None:
    """Write the analysis files under ``out`` (``analysis.json`` last, so a run killed
    midway leaves files whose key does not match and is recomputed)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    digests = {}
    for name, (attr, columns, _) in FILES.items():
        frame = getattr(results, attr)
        frame = frame[columns] if len(frame) else pd.DataFrame(columns=columns)
        text = frame.to_csv(index=False, na_rep="nan", lineterminator="\n")
        data = text.encode("utf-8")
        if name.endswith(".gz"):
            data = _gzip(data)
        atomic_write_bytes(out / name, data)
        digests[name] = hashlib.sha256(data).hexdigest()
    atomic_write_json(out / "analysis.json", {
        "schema": ANALYSIS_SCHEMA,
        "key": key,
        "options": options,
        "suite": results.suite,
        "reference": results.reference,
        "datasets": results.datasets,
        "methods": results.methods,
        "metrics": results.analysed_metrics,
        "scores": results.scores,
        "headlines": results.headlines,
        "notes": results.notes,
        "ood_groups": results.ood_groups,
        "deviations": results.deviations,
        "splits": results.splits,
        "seeds": [[d, m, s] for (d, m), s in sorted(results.seeds.items())],
        "files": digests,
        "columns": {name: columns for name, (_, columns, _) in FILES.items()},
    })


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=6, mtime=0)  # mtime 0: the same bytes every time


def read_manifest(out: Path) -> dict | None:
    """``analysis.json`` of ``out`` when it and every file it lists verify, else None."""
    try:
        meta = json.loads((Path(out) / "analysis.json").read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or meta.get("schema") != ANALYSIS_SCHEMA:
            return None
        for name, digest in meta["files"].items():
            if hashlib.sha256((Path(out) / name).read_bytes()).hexdigest() != digest:
                return None
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return None
    return meta


def load(out: Path, load_predictions: Callable | None = None) -> AnalysisResults:
    """The analysis files under ``out`` as :class:`AnalysisResults` (what the report reads)."""
    meta = read_manifest(out)
    if meta is None:
        raise FileNotFoundError(f"no valid analysis files under {out}")
    frames = {}
    for name, (attr, columns, strings) in FILES.items():
        frame = pd.read_csv(Path(out) / name, keep_default_na=False, na_values={c: ["nan"] for c in columns if c not in strings},
                            dtype={c: str for c in strings})
        frames[attr] = frame[columns]

    def missing(*_args):
        raise KeyError("these analysis files were loaded without a store to read predictions from")

    return AnalysisResults(
        suite=meta["suite"],
        datasets=list(meta["datasets"]),
        methods=list(meta["methods"]),
        splits={d: list(v) for d, v in meta["splits"].items()},
        seeds={(d, m): list(s) for d, m, s in meta["seeds"]},
        load_predictions=load_predictions or missing,
        reference=meta["reference"],
        analysed_metrics=list(meta["metrics"]),
        scores=list(meta.get("scores", [])),
        significance=str(meta["options"].get("significance", SIGNIFICANCE)),
        headlines={d: dict(v) for d, v in meta.get("headlines", {}).items()},
        notes=dict(meta.get("notes", {})),
        ood_groups={d: {g: list(n) for g, n in v.items()} for d, v in meta.get("ood_groups", {}).items()},
        deviations={m: list(lines) for m, lines in meta.get("deviations", {}).items()},
        **frames,
    )


def analyse_store(catalog: Catalog, out: Path, metrics: list[str] | None = None,
                  resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                  significance: str = SIGNIFICANCE, scores: list[str] | None = None) -> tuple[AnalysisResults, bool]:
    """The analysis of ``catalog`` as written under ``out``: reused when its key matches
    the files there or a set kept under ``out/cache/`` (which then comes back to ``out``),
    else recomputed and written; the set it replaces is kept under ``out/cache/``.
    ``metrics``: registered metric names computed on top of the default selection (checked
    where they entered: :func:`bench.report.validate_metrics`); ``scores``: the OOD scores
    (``--scores``, checked where they entered: :func:`bench.scores.validate_scores`;
    default: the default scores).  Returns ``(results read from the files, reused)``."""
    names = analysed_metrics(metrics)
    key = fingerprint(catalog, names, resamples, seed, check_significance(significance), scores)
    out = Path(out)
    meta = read_manifest(out)
    reused = meta is not None and meta.get("key") == key
    if not reused:
        if meta is not None:
            _move_set(out, out / CACHE_DIR / _folder(meta["key"]), meta)
        kept = out / CACHE_DIR / _folder(key)
        kept_meta = read_manifest(kept)
        reused = kept_meta is not None and kept_meta.get("key") == key
        if reused:
            _move_set(kept, out, kept_meta)
            shutil.rmtree(kept, ignore_errors=True)
        else:
            save(analyse(catalog, names, resamples, seed, significance, scores), out, key,
                 {"resamples": resamples, "seed": seed, "significance": significance})
        _prune(out / CACHE_DIR)
    return load(out, catalog.predictions), reused


def _folder(key: str) -> str:
    """The cache folder name of a result set: the start of its key (the key itself is
    checked against ``analysis.json`` before a set is reused)."""
    return str(key)[:16]


def _move_set(src: Path, dst: Path, meta: dict) -> None:
    """Move the result set of ``meta`` from ``src`` to ``dst`` by renames (no file is
    rewritten in place: a report folder shares its files with the previous report by hard
    links).  ``analysis.json`` leaves ``src`` first and reaches ``dst`` last, so a move cut
    short leaves no folder whose manifest verifies with missing files."""
    dst.mkdir(parents=True, exist_ok=True)
    os.replace(src / "analysis.json", dst / ".analysis.json.moving")
    for name in meta["files"]:
        os.replace(src / name, dst / name)
    os.replace(dst / ".analysis.json.moving", dst / "analysis.json")


def _prune(cache: Path) -> None:
    """Keep the :data:`CACHE_KEEP` most recently stored sets under ``cache``."""
    if not cache.is_dir():
        return
    sets = sorted((p for p in cache.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in sets[CACHE_KEEP:]:
        shutil.rmtree(old, ignore_errors=True)

