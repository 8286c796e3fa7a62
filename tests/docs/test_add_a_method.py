"""docs/add-a-method.md: its trained and derived plugin methods are listed, train, predict
with the doc's options and reach the report next to the reference."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd


def test_the_plugin_methods_are_listed(method_run):
    _, (listed, _, _) = method_run
    methods, attention = listed.split("attention layers:")
    assert "noisy_attention" in methods and "fixed_temperature" in methods
    assert "noisy_softmax" in attention.split("metrics")[0]


def test_the_plugin_method_trains_with_the_suite_options_and_reaches_the_report(method_run):
    root, _ = method_run
    cells = [json.loads(p.read_text()) for p in (root / "results" / "noisy").glob("*/cell.json")]
    assert sorted((c["method"], c["status"]) for c in cells) == [("msp", "complete"), ("noisy_attention", "complete")]
    noisy = next(p.parent for p in (root / "results" / "noisy").glob("*/cell.json")
                 if json.loads(p.read_text())["method"] == "noisy_attention")
    assert json.loads((noisy / "cell.json").read_text())["config"]["method"]["options"]["sigma"] == 0.3
    with np.load(noisy / "preds" / "test.npz") as z:  # the passes differ: the noisy layer samples at test
        assert (z["entropy_of_mean"] - z["mean_entropy"]).max() > 1e-4
    efficiency = pd.read_csv(root / "reports" / "noisy" / "analysis" / "efficiency.csv").set_index("method")
    assert efficiency.loc["noisy_attention", "passes"] == 4  # samples = 4 in the suite part

    readme = (root / "reports" / "noisy" / "README.md").read_text()
    summary = readme.split("### Summary", 1)[1].split("###", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in summary.splitlines() if line.startswith("| ")}
    assert {"msp (ref)", "noisy_attention", "soft_msp"} <= set(rows), summary
    assert not any("failed" in rows[m] for m in ("noisy_attention", "soft_msp")), summary


def test_the_derived_method_rescales_the_stored_predictions(method_run):
    root, _ = method_run
    summary = pd.read_csv(root / "reports" / "noisy" / "analysis" / "summary.csv")
    test = summary[summary["split"] == "test"].pivot_table(index="metric", columns="method", values="mean")
    assert test.loc["accuracy", "soft_msp"] == test.loc["accuracy", "msp"]  # softmax(z / T) keeps the argmax
    assert test.loc["nll", "soft_msp"] != test.loc["nll", "msp"]
