"""Convergence end to end: a real tiny run of 2 epochs (``--epochs 2``: the second epoch
clearly better than the first) flags every trained method through the report -- msp, its
post-hoc last-layer Laplace, its derived temperature scaling and the two-stage CGPT
fine-tuned from it -- in the convergence table, the summary table and the README's header,
with ``analysis/training.csv`` holding every epoch of every cell and the training-curves
plot drawn; and the session's one-epoch run says that it could not be judged."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from bench.run.cli import main
from bench.store import TRAIN_LOG
from tests.bench.report.test_report import md_rows
from tests.helpers.suites import tiny_suite

METHODS = ('[methods.msp]\n[methods.temperature_scaling]\nbase = "msp"\n'
           '[methods.laplace_last_layer]\nbase = "msp"\n[methods.cgpt]\nbase = "msp"\nsamples = 2\n')


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory, one_torch_thread):
    """The tiny suite with those four methods, seeds 0 and 1, run with ``--epochs 2``."""
    root = tmp_path_factory.mktemp("two_epochs")
    (root / "two.toml").write_text(tiny_suite("two", seeds=(0, 1), methods=METHODS))
    code = main(["--suite", str(root / "two.toml"), "--epochs", "2", "--results", str(root / "results"),
                 "--reports", str(root / "reports"), "--data-root", str(root / "data"), "--name", "two", "--quiet"])
    assert code == 0
    return root


def test_every_trained_method_of_a_two_epoch_run_is_flagged_in_every_table(two_epochs):
    report = two_epochs / "reports" / "two"
    rows = md_rows(report / "tables" / "convergence.md")
    shown = [(r["Method"], r["Stage"], r["Log"], r["Still improving (seeds)"], r["Epochs"]) for r in rows]
    assert shown == [("msp †", "", "own", "2 of 2", "2"),
                     ("temperature_scaling †", "", "base msp", "2 of 2", "2"),
                     ("laplace_last_layer †", "", "base msp", "2 of 2", "2"),
                     ("cgpt †", "1", "base msp", "2 of 2", "2"),
                     ("cgpt †", "2", "own", "2 of 2", "2")]
    summary = md_rows(report / "tables" / "summary.md")
    assert [r["Method"] for r in summary] == ["msp (ref) †", "temperature_scaling †", "laplace_last_layer †", "cgpt †"]
    readme = (report / "README.md").read_text(encoding="utf-8")
    assert readme.split("\n\n")[2].startswith(
        "**Still improving when training ended** (the rule is under *Convergence* in the note below): "
        "mnist5k / msp, seeds 0, 1; mnist5k / cgpt (stage 2), seeds 0, 1. Marked `†` in the summary and "
        "convergence tables: msp, temperature_scaling, laplace_last_layer, cgpt;")
    assert "![Training curves: mnist5k" in readme


def test_training_csv_holds_both_epochs_of_every_cell_and_the_curves_are_drawn(two_epochs):
    report = two_epochs / "reports" / "two"
    expected = []
    for cell in (two_epochs / "results" / "two").iterdir():
        if not (cell / "cell.json").is_file():
            continue
        info = json.loads((cell / "cell.json").read_text())
        if info["method"] == "laplace_last_layer":
            assert not (cell / TRAIN_LOG).exists()  # post-hoc: it trained nothing
            continue
        log = pd.read_csv(cell / TRAIN_LOG)
        assert list(log["epoch"]) == [1, 2]
        stage = 2 if info["method"] == "cgpt" else 1
        expected += [(info["method"], info["seed"], stage, r.epoch, r.train_acc, r.train_loss, r.val_nll)
                     for r in log.itertuples()]
    training = pd.read_csv(report / "analysis" / "training.csv")
    got = [(r.method, r.seed, r.stage, r.epoch, r.train_acc, r.train_loss, r.val_nll) for r in training.itertuples()]
    assert len(expected) == 8 and sorted(got) == sorted(expected)  # msp and cgpt, 2 seeds x 2 epochs
    png = report / "plots" / "training_mnist5k.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_one_epoch_run_says_it_could_not_be_judged(tiny_store):
    report = tiny_store / "reports" / "hard"
    readme = (report / "README.md").read_text(encoding="utf-8")
    assert readme.split("\n\n")[2] == ("**Convergence** could not be judged for any training log: "
                                       "mnist5k / msp, seeds 0, 1 (1 epoch).")
    (row,) = md_rows(report / "tables" / "convergence.md")
    assert (row["Method"], row["Still improving (seeds)"], row["Epochs"]) == ("msp", "n/a: 1 epoch", "1")
    assert "†" not in (report / "tables" / "summary.md").read_text(encoding="utf-8")


def test_the_committed_default_report_compares_converged_models():
    """The reference run (reports/default) is of models that finished learning: every
    trained cell's last-epoch training accuracy is at least 0.98, none is still improving
    under the rule, and msp's test accuracy is at least 93.0% (mean of its seeds), read
    from the report's own analysis files (issue 38's acceptance)."""
    from tests.helpers import REPO

    analysis = REPO / "reports" / "default" / "analysis"
    cells = pd.read_csv(analysis / "convergence.csv")
    assert len(cells) >= 12 and set(cells["method"]) >= {"msp", "mc_dropout", "kep_svgp", "sgpa"}
    assert (cells["train_acc"] >= 0.98).all(), cells[["method", "seed", "train_acc"]]
    assert (cells["verdict"] == "not improving").all(), cells[["method", "seed", "verdict"]]
    summary = pd.read_csv(analysis / "summary.csv")
    msp = summary[(summary.method == "msp") & (summary.split == "test") & (summary.metric == "accuracy")
                  & summary.score.isna()]
    assert len(msp) == 1 and msp["n_seeds"].iloc[0] == 3 and msp["mean"].iloc[0] >= 0.930
    assert "no training log was still improving" in (analysis.parent / "README.md").read_text()
