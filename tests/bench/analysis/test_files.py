"""The analysis files as a cache (``bench/analysis/files.py``): one result set kept per
store content, so reporting another store into the same report folder and coming back
recomputes nothing."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench.cli import main


def _report(tiny_store: Path, results: Path, reports: Path, capsys) -> str:
    """``run_suite.py report`` of the tiny suite on the store under ``results``; its stderr."""
    code = main(["report", "--suite", str(tiny_store / "hard.toml"), "--results", str(results),
                 "--reports", str(reports)])
    assert code == 0
    return capsys.readouterr().err


def test_switching_stores_a_b_a_reuses_the_analysis_of_a(tiny_store, tmp_path, capsys):
    a, b, reports = tmp_path / "a", tmp_path / "b", tmp_path / "reports"
    shutil.copytree(tiny_store / "results", a)
    shutil.copytree(tiny_store / "results", b)
    seed1 = next(d for d in (b / "hard").iterdir()
                 if (d / "cell.json").is_file() and json.loads((d / "cell.json").read_text())["seed"] == 1)
    from bench.store import CellDir

    cell = CellDir(seed1)  # store b: the same cells, seed 1's test predictions in reverse order: other content
    arrays = cell.read_arrays("test")
    cell.write_preds("test", *(arrays.pop(k)[::-1].copy() for k in ("log_probs", "labels")),
                     **{k: v[::-1].copy() for k, v in arrays.items()})
    cell.seal(cell.read_cell())
    analysis = reports / "hard" / "analysis"

    assert "(analysed the store;" in _report(tiny_store, a, reports, capsys)
    key_a = json.loads((analysis / "analysis.json").read_text())["key"]
    metrics_a = (analysis / "metrics.csv.gz").read_bytes()
    written_a = (analysis / "metrics.csv.gz").stat().st_mtime_ns

    assert "(analysed the store;" in _report(tiny_store, b, reports, capsys)
    key_b = json.loads((analysis / "analysis.json").read_text())["key"]
    assert key_b != key_a

    assert "(reused the analysis files;" in _report(tiny_store, a, reports, capsys)
    assert json.loads((analysis / "analysis.json").read_text())["key"] == key_a
    assert (analysis / "metrics.csv.gz").read_bytes() == metrics_a
    assert (analysis / "metrics.csv.gz").stat().st_mtime_ns == written_a  # the file written by a's first report
    assert [p.name for p in (analysis / "cache").iterdir()] == [key_b[:16]]  # b's set, kept in turn

    assert "(reused the analysis files;" in _report(tiny_store, b, reports, capsys)
    assert json.loads((analysis / "analysis.json").read_text())["key"] == key_b
