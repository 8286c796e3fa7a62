"""Convergence (``bench/analysis/training.py``): the still-improving and not-learning rules
on hand-made logs, on both sides of each threshold, and the per-method rows of a store whose
training logs (and, where a test needs them, stored test labels) are written here by hand (a
trained, a post-hoc, a two-stage and two derived methods), checked against sums written out
below; and ``training.csv`` of a real tiny run holding every epoch of every cell."""
from __future__ import annotations

import csv
import io
import json

import numpy as np
import pandas as pd
import pytest

import datasets  # noqa: F401  (registers the datasets the suite names)
import methods  # noqa: F401
from bench.analysis.training import IMPROVING, NOT_IMPROVING, NOT_LEARNING, convergence, judge, window
from bench.store.catalog import open_store
from bench.store.plan import make_plan
from bench.config.spec import build_suite
from bench.store import TRAIN_LOG, Store
from bench.store.record import CellRecord, Predictions

FLAT_ACC = [0.99] * 10
FLAT_NLL = [0.40] * 10


# ------------------------------------------------------------------------------------ the rule
@pytest.mark.parametrize("epochs, k", [(2, 1), (3, 1), (7, 1), (8, 2), (12, 2), (13, 3), (20, 4)])
def test_window_is_a_fifth_of_the_epochs_and_at_least_one(epochs, k):
    assert window(epochs) == k


def test_both_windows_fit_in_the_log_whatever_the_fraction(monkeypatch):
    import bench.analysis.training as training

    monkeypatch.setattr(training, "WINDOW_FRACTION", 0.6)  # round(0.6 x 3) = 2 windows of 2 in 3 epochs: 1 each
    assert [window(e) for e in (2, 3, 4, 5)] == [1, 1, 2, 2]
    got = judge([0.5, 0.5, 0.6], [1.0, 1.0, 1.0])
    assert got.window == 1 and got.train_acc_rise == pytest.approx(0.1)


@pytest.mark.parametrize("last_acc, flagged", [(0.9801, True), (0.9799, False)])
def test_training_accuracy_rising_by_more_than_a_point_flags(last_acc, flagged):
    """10 epochs: k = 2; the last two epochs' mean against the two before (0.97)."""
    acc = [0.97] * 8 + [last_acc, last_acc]
    got = judge(acc, FLAT_NLL)
    assert got.window == 2
    assert got.train_acc_rise == pytest.approx(last_acc - 0.97)
    assert got.flagged is flagged and got.verdict == (IMPROVING if flagged else NOT_IMPROVING)


@pytest.mark.parametrize("last_nll, flagged", [(0.849, True), (0.851, False)])
def test_validation_nll_falling_by_more_than_fifteen_percent_flags(last_nll, flagged):
    """10 epochs: the last two epochs' NLL against the two before (1.0): 15.1% and 14.9% lower."""
    nll = [1.0] * 8 + [last_nll, last_nll]
    got = judge(FLAT_ACC, nll)
    assert got.val_nll_drop == pytest.approx(1.0 - last_nll)
    assert got.train_acc_rise == pytest.approx(0.0)
    assert got.flagged is flagged


def test_the_windows_are_means_not_the_last_two_epochs():
    """Accuracy alternating 0.90, 0.92: the last epoch is 2 points above the one before, but
    the means of the last two and of the two before them are equal."""
    acc = [0.90, 0.92] * 5
    got = judge(acc, FLAT_NLL)
    assert got.train_acc_rise == pytest.approx(0.0) and not got.flagged
    assert judge(acc[:-1], FLAT_NLL[:-1]).flagged is False  # 9 epochs, k = 2: (0.92 + 0.90) / 2 vs the same


def test_a_two_epoch_run_whose_second_epoch_is_better_is_flagged():
    got = judge([0.50, 0.60], [1.20, 1.10])
    assert got.window == 1 and got.flagged
    assert got.train_acc_rise == pytest.approx(0.10) and got.val_nll_drop == pytest.approx(0.1 / 1.2)


def test_a_converged_over_confident_run_is_not_flagged():
    """Training accuracy at 0.99+ creeping up by 0.1 point an epoch, validation NLL rising
    (over-confidence): not still improving."""
    acc = [0.90, 0.95, 0.97, 0.980, 0.985, 0.990, 0.991, 0.992, 0.993, 0.994]
    nll = [0.60, 0.45, 0.40, 0.380, 0.370, 0.380, 0.390, 0.400, 0.420, 0.440]
    got = judge(acc, nll)
    assert got.train_acc_rise == pytest.approx(0.002) and got.val_nll_drop < 0
    assert not got.flagged and got.verdict == NOT_IMPROVING


def test_a_one_epoch_log_cannot_be_judged():
    got = judge([0.5], [1.0])
    assert got.verdict == "n/a: 1 epoch" and not got.flagged and np.isnan(got.train_acc_rise)


def test_a_missing_validation_nll_leaves_the_accuracy_to_decide():
    assert judge([0.5, 0.6], [np.nan, np.nan]).flagged
    assert not judge([0.5, 0.5], [np.nan, np.nan]).flagged


@pytest.mark.parametrize("last_acc, verdict", [(0.577, NOT_LEARNING), (0.586, NOT_LEARNING),
                                               (0.597, NOT_IMPROVING)])
def test_a_flat_log_at_the_larger_class_share_is_not_learning(last_acc, verdict):
    """Training accuracy flat at the larger class's share (57.7%, KEP-SVGP on the text suite),
    0.9 point above it, and 2 points above it: the first two never learned, the last converged."""
    got = judge([last_acc] * 10, FLAT_NLL, majority=0.577)
    assert got.verdict == verdict and got.flagged is (verdict == NOT_LEARNING)
    assert got.majority_share == pytest.approx(0.577) and got.train_acc_rise == pytest.approx(0.0)


def test_not_learning_outranks_improving_and_needs_a_share_and_two_epochs():
    """A validation NLL falling by 40% (improving) at the majority share is not learning;
    without a share the old verdicts stand, and one epoch still cannot be judged."""
    nll = [1.0] * 8 + [0.6, 0.6]
    assert judge([0.5] * 10, nll, majority=0.5).verdict == NOT_LEARNING
    assert judge([0.5] * 10, nll).verdict == IMPROVING
    assert judge([0.5] * 10, FLAT_NLL, majority=np.nan).verdict == NOT_IMPROVING
    assert judge([0.5], [1.0], majority=0.5).verdict == "n/a: 1 epoch"


# ------------------------------------------------------------------------------------ a hand-written store
# per (method, seed): the log (train_acc, train_loss, val_acc, val_nll per epoch) and best_epoch
LOGS = {
    ("msp", 0): ([0.5, 0.7, 0.8], [1.5, 1.0, 0.8], [0.45, 0.6, 0.7], [1.6, 1.2, 1.0], 3),  # acc +10 points: flagged
    ("msp", 1): ([0.6, 0.7, 0.702], [1.2, 1.0, 0.9], [0.5, 0.65, 0.66], [1.2, 1.0, 1.01], 2),  # +0.2 point, NLL up
    ("cgpt", 0): ([0.8, 0.81], [0.9, 0.85], [0.7, 0.72], [1.0, 0.99], 2),  # +1 point: flagged
    ("cgpt", 1): ([0.7, 0.702], [0.95, 0.94], [0.66, 0.67], [1.0, 0.99], 1),  # +0.2 point, NLL -1%
}
SUITE = {
    "name": "logs", "seeds": [0, 1], "datasets": {"mnist5k": {}},
    "methods": {"msp": {}, "cgpt": {"base": "msp"}, "laplace_last_layer": {"base": "msp"},
                "temperature_scaling": {"base": "msp"}, "deep_ensemble": {"base": "msp", "members": 2}},
}


def log_csv(acc, loss, val_acc, nll) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["epoch", "lr", "train_loss", "train_acc", "val_acc", "val_nll", "seconds", "cgp_reg"])
    for e in range(len(acc)):
        writer.writerow([e + 1, 0.001, loss[e], acc[e], val_acc[e], nll[e], 0.5, 3.0])
    return out.getvalue().encode()


def labels_with_share(share: float, n: int = 500) -> np.ndarray:
    """``n`` labels of 2 classes, class 0 holding ``share`` of them (a multiple of 1/n)."""
    zeros = round(share * n)
    return np.array([0] * zeros + [1] * (n - zeros), dtype=np.int64)


def write_store(root, reused: bool = True, labels: dict | None = None):
    """The suite's trained cells as ``run`` leaves them, training logs from :data:`LOGS`
    (laplace_last_layer is post-hoc: a stage-1 record, no log); ``labels``: (method, seed)
    -> {split: labels} stored as that cell's predictions of those splits (none by default)."""
    suite = build_suite(SUITE)
    plan = make_plan(suite)
    store = Store(root / suite.name)
    keys = {(c.method.name, c.seed): c.key for c in plan.cells}
    for cell in plan.cells:
        m, s = cell.method.name, cell.seed
        cd = store.cell(cell.key)
        cd.reset()
        info = {"key": cell.key, "dataset": cell.dataset.name, "method": m, "seed": s, "config": cell.config}
        if m in ("cgpt", "laplace_last_layer"):
            info["stage1"] = {"method": "msp", "key": keys[("msp", s)], "reused": reused,
                              "best_epoch": LOGS[("msp", s)][4]}
        if (m, s) in LOGS:
            cd.write_bytes(TRAIN_LOG, log_csv(*LOGS[(m, s)][:4]))
        for split, y in (labels or {}).get((m, s), {}).items():
            cd.write_preds(split, Predictions(np.full((len(y), 2), np.log(0.5), dtype=np.float32), y))
        best = LOGS[(m if m != "laplace_last_layer" else "msp", s)][4]
        cd.seal(CellRecord.from_json({**info, "best_epoch": best}))
    return open_store(store.root, suite, set(keys.values())), keys


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    catalog, _ = write_store(tmp_path_factory.mktemp("logs"))
    return convergence(catalog)


def summary_row(judged, method: str, stage: int) -> pd.Series:
    s = judged.summary
    rows = s[(s["method"] == method) & (s["stage"] == stage)]
    assert len(rows) == 1, (method, stage)
    return rows.iloc[0]


MSP_MEANS = {"epochs": 3, "best_epoch": (3 + 2) / 2, "train_acc": (0.8 + 0.702) / 2, "train_loss": (0.8 + 0.9) / 2,
             "val_acc": (0.7 + 0.66) / 2, "val_nll": (1.0 + 1.01) / 2}
CGPT_MEANS = {"epochs": 2, "best_epoch": (2 + 1) / 2, "train_acc": (0.81 + 0.702) / 2, "train_loss": (0.85 + 0.94) / 2,
              "val_acc": (0.72 + 0.67) / 2, "val_nll": (0.99 + 0.99) / 2}


def assert_means(row: pd.Series, means: dict, source: str, flagged: int) -> None:
    for field, value in means.items():
        assert row[field] == pytest.approx(value), field
    assert (row["source"], row["n_seeds"], row["n_flagged"], row["n_unjudged"]) == (source, 2, flagged, 0)


def test_a_trained_methods_row_is_the_mean_of_its_seeds_last_epochs(judged):
    assert_means(summary_row(judged, "msp", 1), MSP_MEANS, "msp", 1)
    assert set(judged.summary.loc[judged.summary["method"] == "msp", "stage"]) == {1}


@pytest.mark.parametrize("method", ["laplace_last_layer", "temperature_scaling", "deep_ensemble"])
def test_post_hoc_and_derived_methods_show_their_bases_log(judged, method):
    assert_means(summary_row(judged, method, 1), MSP_MEANS, "msp", 1)
    assert set(judged.summary.loc[judged.summary["method"] == method, "stage"]) == {1}


def test_a_two_stage_method_shows_its_bases_cell_as_stage_1_and_its_own_log_as_stage_2(judged):
    assert_means(summary_row(judged, "cgpt", 1), MSP_MEANS, "msp", 1)
    assert_means(summary_row(judged, "cgpt", 2), CGPT_MEANS, "cgpt", 1)


def test_each_cell_and_stage_has_its_verdict(judged):
    cells = judged.cells.set_index(["method", "seed", "stage"])
    expected = {("msp", 0, 1): IMPROVING, ("msp", 1, 1): NOT_IMPROVING,
                ("laplace_last_layer", 0, 1): IMPROVING, ("laplace_last_layer", 1, 1): NOT_IMPROVING,
                ("cgpt", 0, 1): IMPROVING, ("cgpt", 1, 1): NOT_IMPROVING,
                ("cgpt", 0, 2): IMPROVING, ("cgpt", 1, 2): NOT_IMPROVING}
    assert dict(cells["verdict"]) == expected  # derived methods have no cells
    assert cells.loc[("cgpt", 0, 2), "train_acc_rise"] == pytest.approx(0.01)
    assert cells.loc[("msp", 1, 1), "val_nll_drop"] == pytest.approx((1.0 - 1.01) / 1.0)


def test_training_holds_every_epoch_of_every_log_and_a_two_stage_cells_as_stage_2(judged):
    t = judged.training
    assert len(t) == sum(len(log[0]) for log in LOGS.values())
    for (method, seed), (acc, loss, val_acc, nll, _) in LOGS.items():
        mine = t[(t["method"] == method) & (t["seed"] == seed)].sort_values("epoch")
        assert list(mine["epoch"]) == list(range(1, len(acc) + 1))
        assert set(mine["stage"]) == {2 if method == "cgpt" else 1}
        np.testing.assert_allclose(mine[["train_acc", "train_loss", "val_acc", "val_nll"]].to_numpy(),
                                   np.array([acc, loss, val_acc, nll]).T)


def test_a_stage_1_trained_inside_the_cell_is_not_judged(tmp_path):
    catalog, _ = write_store(tmp_path, reused=False)
    got = convergence(catalog)
    row = summary_row(got, "cgpt", 1)
    assert (row["n_seeds"], row["n_flagged"], row["n_unjudged"]) == (2, 0, 2)
    assert "trained inside the cell" in row["unjudged"] and np.isnan(row["train_acc"])
    assert_means(summary_row(got, "cgpt", 2), CGPT_MEANS, "cgpt", 1)  # its own log still is


@pytest.mark.parametrize("share, verdict", [(0.702, NOT_LEARNING), (0.682, NOT_IMPROVING)])
def test_a_cell_at_its_test_labels_majority_share_is_flagged_not_learning(tmp_path, share, verdict):
    """msp seed 1 ends at training accuracy 0.702, flat: with stored test labels whose larger
    class holds 70.2% it is not learning, and so are the post-hoc and two-stage rows whose
    stage 1 is that cell; at 68.2% (2 points below) it is not flagged.  msp seed 0 (0.8,
    rising 10 points, larger class 78.2%) stays improving."""
    labels = {("msp", 1): {"test": labels_with_share(share)}, ("msp", 0): {"test": labels_with_share(0.782)}}
    catalog, _ = write_store(tmp_path, labels=labels)
    got = convergence(catalog)
    cells = got.cells.set_index(["method", "seed", "stage"])
    for row in (("msp", 1, 1), ("laplace_last_layer", 1, 1), ("cgpt", 1, 1)):
        assert cells.loc[row, "verdict"] == verdict, row
        assert cells.loc[row, "majority_share"] == pytest.approx(share)
    assert cells.loc[("msp", 0, 1), "verdict"] == IMPROVING
    assert cells.loc[("cgpt", 1, 2), "verdict"] == NOT_IMPROVING  # cgpt's own cell stores no test split
    stuck = int(verdict == NOT_LEARNING)
    for method in ("msp", "laplace_last_layer", "temperature_scaling", "deep_ensemble", "cgpt"):
        row = summary_row(got, method, 1)
        assert (row["n_flagged"], row["n_not_learning"], row["n_unjudged"]) == (1 + stuck, stuck, 0), method
    assert summary_row(got, "cgpt", 2)["n_not_learning"] == 0


def test_a_cell_without_stored_test_labels_keeps_its_verdict(tmp_path):
    """msp seed 1's validation labels would put it at its majority share, but it stores no
    test split: not checked, its verdict stays ``not improving`` and its share is NaN."""
    catalog, _ = write_store(tmp_path, labels={("msp", 1): {"val": labels_with_share(0.702)}})
    cells = convergence(catalog).cells.set_index(["method", "seed", "stage"])
    assert cells.loc[("msp", 1, 1), "verdict"] == NOT_IMPROVING
    assert np.isnan(cells.loc[("msp", 1, 1), "majority_share"])


# ------------------------------------------------------------------------------------ a real run
def test_training_csv_of_a_real_run_holds_every_epoch_of_every_cell(tiny_store):
    analysis = tiny_store / "reports" / "hard" / "analysis"
    training = pd.read_csv(analysis / "training.csv")
    expected = []
    for cell in (tiny_store / "results" / "hard").iterdir():
        if not (cell / "cell.json").is_file():
            continue
        info = json.loads((cell / "cell.json").read_text())
        log = pd.read_csv(cell / TRAIN_LOG)
        expected += [(info["dataset"], info["method"], info["seed"], int(r.epoch), r.train_acc, r.val_nll)
                     for r in log.itertuples()]
    assert len(expected) == 2  # two msp cells of one epoch each
    got = [(r.dataset, r.method, r.seed, r.epoch, r.train_acc, r.val_nll) for r in training.itertuples()]
    assert sorted(got) == sorted(expected)
    cells = pd.read_csv(analysis / "convergence.csv")
    assert list(cells["verdict"]) == ["n/a: 1 epoch", "n/a: 1 epoch"]
