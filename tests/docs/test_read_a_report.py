"""docs/read-a-report.md: its pandas snippet runs on the analysis files of a real run (the
one of docs/add-a-method.md: three methods, two corruption splits) and names the method
with the lowest ECE on the shift splits."""
from __future__ import annotations

import pandas as pd

from tests.helpers.docs import example, reader_folder, run_commands


def test_the_snippet_answers_its_question_from_the_analysis_files(method_run):
    root, _ = method_run
    doc = example("read-a-report.md")
    with reader_folder(root):
        doc.write(root)
        (printed,) = run_commands(doc.commands, rename={"reports/default": "reports/noisy"})
    metrics = pd.read_csv(root / "reports" / "noisy" / "analysis" / "metrics.csv.gz")
    shifted = metrics[(metrics["metric"] == "ece") & metrics["split"].str.startswith("shift/")]
    assert set(shifted["split"]) == {"shift/gaussian_noise/5", "shift/contrast/5"}
    ece = shifted.groupby("method")["value"].mean() * 100  # one seed: mean over the splits
    assert sorted(ece.index) == ["msp", "noisy_attention", "soft_msp"]
    best = ece.idxmin()
    assert f"mnist5k: lowest ECE on the shift splits: {best} ({ece[best]:.2f}%)" in printed, printed
    for method in ece.index:
        assert method in printed.split("lowest")[0]
