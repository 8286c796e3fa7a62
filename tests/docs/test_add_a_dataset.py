"""docs/add-a-dataset.md: its plugin data set, named by its suite file, trains a cell,
is evaluated on every split the suite picks and gets its own section of the report."""
from __future__ import annotations

import json

import numpy as np

from tests.helpers.docs import example, reader_folder, run_commands

#: one cell, one epoch: the doc's suite as a quick try (its own name kept)
QUICK = ["--epochs", "1", "--seeds", "0", "--methods", "msp", "--name", "digits"]


def test_the_plugin_dataset_trains_and_reaches_the_report(tmp_path, one_torch_thread):
    doc = example("add-a-dataset.md")
    with reader_folder(tmp_path):
        doc.write(tmp_path)
        _, status = run_commands(doc.commands, extra={"run": QUICK})
    (cell,) = (p.parent for p in (tmp_path / "results" / "digits").glob("*/cell.json"))
    info = json.loads((cell / "cell.json").read_text())
    assert (info["dataset"], info["method"], info["status"]) == ("sk_digits", "msp", "complete")
    splits = {str(p.relative_to(cell / "preds"))[:-4] for p in (cell / "preds").rglob("*.npz")}
    assert splits == {"val", "test", "shift/upside_down", "ood/uniform_noise",
                      *(f"shift/{c}/{s}" for c in ("gaussian_noise", "contrast") for s in range(1, 6))}
    with np.load(cell / "preds" / "test.npz") as z:
        assert z["log_probs"].shape[1] == 10 and set(z["labels"]) == set(range(10))
    with np.load(cell / "preds" / "shift" / "contrast" / "5.npz") as z:
        assert z["log_probs"].shape == (200, 10)  # corruption_limit = 200
    readme = (tmp_path / "reports" / "digits" / "README.md").read_text()
    section = readme.split("## sk_digits", 1)[1]
    assert "| msp (ref)" in section and "shift/upside_down" in section and "ood/uniform_noise" in section
    assert ": 1 done, 0 failed, 0 running, 0 interrupted, 0 damaged, 0 missing;" in status, status
