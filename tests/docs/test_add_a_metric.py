"""docs/add-a-metric.md: its kernel check passes, and its plugin metric is listed and
reported, with values, next to accuracy in a report of a finished run."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from tests.helpers.docs import example, reader_folder, run_commands


def snapshot(root: Path) -> dict[Path, bytes]:
    """Every file under ``root`` with its bytes."""
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_plugin_metric_reaches_the_report_of_a_finished_run(tiny_store, tmp_path):
    """The report with the plugin is written beside the run's report, which stays byte for
    byte (issue 43: a --plugin re-report of the reference run writes only what it adds)."""
    doc = example("add-a-metric.md")
    with reader_folder(tmp_path):
        doc.write(tmp_path)
        shutil.copytree(tiny_store / "results", tmp_path / "results")  # the doc's "default" run: the tiny store's
        shutil.copytree(tiny_store / "reports", tmp_path / "reports")  # ... and its report
        (tmp_path / "reports" / "hard" / "NOTES.md").write_text("Hand-written notes on the run.\n")
        before = snapshot(tmp_path / "reports" / "hard")
        checked, listed, _ = run_commands(doc.commands, rename={"default": "hard"})
    assert "kernel == metric" in checked
    line = next(line for line in listed.splitlines() if line.split()[:1] == ["top3_accuracy"])
    assert line.split(None, 1)[1] == "* [classification] Top-3 ACC (%), higher is better"
    assert snapshot(tmp_path / "reports" / "hard") == before
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["hard", "hard+my_metric"]

    report = tmp_path / "reports" / "hard+my_metric"
    assert len(list((report / "plots").glob("*.png"))) == len(list((tmp_path / "reports" / "hard" / "plots").glob("*.png")))
    assert "Hand-written notes" not in (report / "README.md").read_text()
    header = (report / "tables" / "summary.md").read_text().splitlines()[0]
    assert header.index("ACC (%)") < header.index("Top-3 ACC (%)") < header.index("AURC")
    summary = pd.read_csv(report / "tables" / "summary.csv")
    assert summary["top3_accuracy_mean"].between(0, 1).all() and summary["top3_accuracy_ci_low"].notna().all()
    assert (summary["top3_accuracy_mean"] >= summary["accuracy_mean"]).all()
    # the value of the doc's own function on the stored predictions, mean over seeds
    metrics = pd.read_csv(report / "analysis" / "metrics.csv.gz")
    values = metrics[(metrics["metric"] == "top3_accuracy") & (metrics["split"] == "test")]
    expected = []
    for npz in sorted((tmp_path / "results" / "hard").glob("*/preds/test.npz")):
        with np.load(npz) as z:
            top3 = np.argsort(-z["log_probs"], axis=1, kind="stable")[:, :3]
            expected.append((top3 == z["labels"][:, None]).any(axis=1).mean())
    assert sorted(values["value"]) == sorted(expected)
    assert "`top3_accuracy`" in (report / "README.md").read_text()  # its line in Conventions


def test_the_plugin_report_of_a_partial_store_writes_nothing(tiny_store, tmp_path, capsys):
    """Issue 43 row 2, as a user met it: the run stopped before its last cell, then the
    doc's ``report default --plugin my_metric``: exit 1 naming the missing cell, and
    neither the run's report nor a report beside it is written."""
    from bench.run.cli import main

    doc = example("add-a-metric.md")
    with reader_folder(tmp_path):
        doc.write(tmp_path)
        shutil.copytree(tiny_store / "results", tmp_path / "results")
        shutil.copytree(tiny_store / "reports", tmp_path / "reports")
        before = snapshot(tmp_path / "reports")
        cells = sorted(p for p in (tmp_path / "results" / "hard").iterdir() if (p / "cell.json").is_file())
        shutil.rmtree(cells[-1])  # the cell the run did not reach
        capsys.readouterr()
        code = main(["report", "hard", "--plugin", "my_metric", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"({cells[-1].name}): missing" in err and "--partial" in err, err
    assert snapshot(tmp_path / "reports") == before
