"""docs/add-a-metric.md: its kernel check passes, and its plugin metric is listed and
reported, with values, next to accuracy in a report of a finished run."""
from __future__ import annotations

import shutil

import numpy as np
import pandas as pd

from tests.helpers.docs import example, reader_folder, run_commands


def test_the_plugin_metric_reaches_the_report_of_a_finished_run(tiny_store, tmp_path):
    doc = example("add-a-metric.md")
    with reader_folder(tmp_path):
        doc.write(tmp_path)
        shutil.copytree(tiny_store / "results", tmp_path / "results")  # the doc's "default" run: the tiny store's
        checked, listed, _ = run_commands(doc.commands, rename={"default": "hard"})
    assert "kernel == metric" in checked
    line = next(line for line in listed.splitlines() if line.split()[:1] == ["top3_accuracy"])
    assert line.split(None, 1)[1] == "* [classification] Top-3 ACC (%), higher is better"

    report = tmp_path / "reports" / "hard"
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
