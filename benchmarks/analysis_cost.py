"""How long analysis takes on a store the size of one CIFAR-10 method/seed.

Writes a synthetic store in a temporary directory: one ``msp`` cell of the ``cifar10``
suite with predictions on ``val`` (5,000), ``test`` (10,000), the 75 CIFAR-10-C splits
(10,000 each) and OOD SVHN (26,032) and CIFAR-100 (10,000): 801,032 predictions of 10
classes.  Then times :func:`bench.analysis.analyse` (every default metric on every split, 1,000
paired bootstrap resamples on ``test`` and the OOD splits) and the report.

Usage (repository root)::

    .venv/bin/python benchmarks/analysis_cost.py [--out reports/perf/analysis.md]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench.train.vit  # noqa: E402,F401
import datasets  # noqa: E402,F401
import methods  # noqa: E402,F401
from bench.analysis import analyse  # noqa: E402
from bench.store.catalog import open_store  # noqa: E402
from bench.store.plan import make_plan  # noqa: E402
from bench.report import write_report  # noqa: E402
from bench.config.spec import load_suite, select  # noqa: E402
from bench.store import CellRecord, Predictions, Store  # noqa: E402
from bench.data import BENCHMARK_CORRUPTIONS, SEVERITIES, corruption_split, is_ood  # noqa: E402
from machine import provenance  # noqa: E402

CLASSES = 10


def fake_split(rng: np.random.Generator, n: int, ood: bool) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.integers(0, CLASSES, n)
    logits = rng.normal(size=(n, CLASSES)) * 2.0
    if not ood:
        logits[np.arange(n), labels] += rng.uniform(0.0, 4.0, n)  # mostly right, some wrong
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return log_probs.astype(np.float32), (np.full(n, -1) if ood else labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/perf/analysis.md"))
    args = parser.parse_args()
    suite = select(load_suite("cifar10"), ("msp",), to_run=False)
    suite = type(suite)(suite.name, (0,), suite.datasets, suite.methods, suite.description, suite.reference)
    plan = make_plan(suite)
    (cell,) = plan.cells
    rng = np.random.default_rng(0)
    splits = {"val": 5000, "test": 10000, "ood/svhn": 26032, "ood/cifar100": 10000}
    splits.update({corruption_split(c, s): 10000 for c in BENCHMARK_CORRUPTIONS for s in SEVERITIES})
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "cifar10")
        cd = store.cell(cell.key)
        cd.reset()
        for split, n in splits.items():
            cd.write_preds(split, Predictions(*fake_split(rng, n, is_ood(split))))
        cd.seal(CellRecord(key=cell.key, dataset=cell.dataset.name, method=cell.method.name, seed=cell.seed,
                           config=cell.config, parameters=6268042, train_seconds=1.0,
                           predict_seconds_per_1000=1.0, peak_memory_mb=1.0, samples=1))
        n_preds = sum(splits.values())
        t0 = time.perf_counter()
        results = analyse(open_store(store.root, suite, {cell.key}))
        t_collect = time.perf_counter() - t0
        t0 = time.perf_counter()
        write_report(results, Path(tmp) / "report")  # every format (bench.report.FORMATS)
        t_report = time.perf_counter() - t0
    lines = [
        "# Analysis cost: one CIFAR-10 method/seed",
        "",
        f"{n_preds:,} stored predictions of {CLASSES} classes ({len(splits)} splits: val, test, 75 CIFAR-10-C, "
        "2 OOD sets); every default metric on every split, 1,000 paired bootstrap resamples on test and the OOD "
        "splits (3 OOD scores x 4 OOD metrics each).",
        "",
        "| stage | seconds |",
        "|---|---:|",
        f"| analysis (`bench.analysis.analyse`) | {t_collect:.1f} |",
        f"| report (tables + plots) | {t_report:.1f} |",
        f"| total | {t_collect + t_report:.1f} |",
        "",
        *provenance("analysis_cost.py", f", numpy {np.__version__}"),
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
