"""Analysis on a synthetic store: every derived table checked against an independent
computation (scikit-learn, scipy, or arithmetic written out here)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.special import log_softmax
from scipy.stats import entropy as sp_entropy
from sklearn.metrics import accuracy_score, roc_auc_score

import bench.train.vit  # noqa: F401
import datasets  # noqa: F401
import methods  # noqa: F401
from bench.analysis import analyse
from bench.store.catalog import open_store
from bench.store.plan import make_plan
from bench.config.spec import build_suite
from bench.store import Store
from bench.store.record import CellRecord, Predictions

SPLITS = ["val", "test", "shift/gaussian_noise/1", "shift/gaussian_noise/2", "shift/contrast/1",
          "shift/contrast/2", "ood/noise"]
N, C = 60, 4
COST = {"msp": (1000, 10.0, 0.5, 100.0, 1), "mc_dropout": (1000, 12.0, 2.5, 110.0, 5)}


def fake_preds(rng, split: str, quality: float) -> dict[str, np.ndarray]:
    labels = rng.integers(0, C, N)
    logits = rng.normal(size=(N, C))
    if not split.startswith("ood/"):
        logits[np.arange(N), labels] += quality
    return {"log_probs": log_softmax(logits, axis=1).astype(np.float32),
            "labels": np.full(N, -1) if split.startswith("ood/") else labels}


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    suite = build_suite({
        "name": "synthetic", "seeds": [0, 1], "reference": "msp",
        "datasets": {"mnist5k": {}},
        "methods": {"msp": {}, "mc_dropout": {"samples": 5}, "deep_ensemble": {"members": 2}},
    })
    plan = make_plan(suite)
    store = Store(tmp_path_factory.mktemp("store") / "synthetic")
    written = {}
    for i, cell in enumerate(plan.cells):
        rng = np.random.default_rng(i)
        cd = store.cell(cell.key)
        cd.reset()
        quality = 2.0 if cell.method.name == "msp" else 3.0
        for split in SPLITS:
            arrays = fake_preds(rng, split, quality)
            extras = {}
            if cell.method.name == "mc_dropout":
                h = sp_entropy(np.exp(arrays["log_probs"].astype(np.float64)), axis=1)
                extras = {"entropy_of_mean": h, "mean_entropy": h * rng.uniform(0.5, 1.0, N)}
            cd.write_preds(split, Predictions(arrays["log_probs"], arrays["labels"], **extras))
            written[(cell.method.name, cell.seed, split)] = {**arrays, **extras}
        params, train_s, pred_s, mem, passes = COST[cell.method.name]
        cd.seal(CellRecord.from_json({"key": cell.key, "dataset": cell.dataset.name, "method": cell.method.name, "seed": cell.seed,
                 "config": cell.config, "parameters": params, "train_seconds": train_s + cell.seed, "predict_seconds_per_1000": pred_s,
                 "peak_memory_mb": mem + cell.seed, "samples": passes}))
    return analyse(open_store(store.root, suite, {c.key for c in plan.cells}), resamples=300), written


def value(results, method, seed, split, metric, score=""):
    m = results.metrics
    sel = m[(m.method == method) & (m.seed == seed) & (m.split == split) & (m.metric == metric) & (m.score == score)]
    assert len(sel) == 1, (method, seed, split, metric, score)
    return float(sel.value.iloc[0])


def test_ood_scores_match_sklearn_and_decomposition_exists_only_with_several_passes(analysed):
    results, written = analysed
    test = written[("mc_dropout", 1, "test")]
    ood = written[("mc_dropout", 1, "ood/noise")]
    msp = lambda a: np.exp(a["log_probs"].astype(np.float64)).max(axis=1)  # noqa: E731
    mi = lambda a: a["entropy_of_mean"].astype(np.float64) - a["mean_entropy"].astype(np.float64)  # noqa: E731
    y = np.r_[np.ones(N), np.zeros(N)]  # ID positive
    assert value(results, "mc_dropout", 1, "ood/noise", "ood_auroc", "msp") == pytest.approx(
        roc_auc_score(y, np.r_[msp(test), msp(ood)]))
    assert value(results, "mc_dropout", 1, "ood/noise", "ood_auroc", "mutual_info") == pytest.approx(
        roc_auc_score(y, -np.r_[mi(test), mi(ood)]))
    scores = set(results.metrics.loc[results.metrics.method == "msp", "score"]) - {""}
    assert scores == {"msp", "entropy"}  # a single pass has no mutual information
    assert "mutual_info" in set(results.metrics.loc[results.metrics.method == "deep_ensemble", "score"])


def test_ensemble_decomposition_is_entropy_of_the_mean_minus_mean_entropy(analysed):
    results, written = analysed
    p = np.stack([np.exp(written[("msp", s, "ood/noise")]["log_probs"].astype(np.float64)) for s in (0, 1)])
    p_test = np.stack([np.exp(written[("msp", s, "test")]["log_probs"].astype(np.float64)) for s in (0, 1)])
    mi = lambda q: sp_entropy(q.mean(axis=0), axis=-1) - sp_entropy(q, axis=-1).mean(axis=0)  # noqa: E731
    expected = roc_auc_score(np.r_[np.ones(N), np.zeros(N)], -np.r_[mi(p_test), mi(p)])
    assert value(results, "deep_ensemble", 0, "ood/noise", "ood_auroc", "mutual_info") == pytest.approx(expected)


def test_summary_mean_std_ci_and_verdicts(analysed):
    results, written = analysed
    s = results.summary
    row = s[(s.method == "mc_dropout") & (s.split == "test") & (s.metric == "accuracy")].iloc[0]
    accs = [accuracy_score(written[("mc_dropout", k, "test")]["labels"],
                           written[("mc_dropout", k, "test")]["log_probs"].argmax(1)) for k in (0, 1)]
    assert row["mean"] == pytest.approx(np.mean(accs)) and row["std"] == pytest.approx(np.std(accs, ddof=1))
    assert row.ci_low <= row["mean"] <= row.ci_high and row.ci_high - row.ci_low > 0
    assert row.table == "in_distribution" and row.p_holm >= row.p_value
    ref = s[(s.method == "msp") & (s.split == "test")]
    assert set(ref.verdict) == {"ref"} and ref.p_value.isna().all()
    # verdicts only where significant after Holm, in the metric's good direction
    sig = s[s.verdict.isin(["better", "worse"])]
    assert (sig.p_holm < 0.05).all()
    shift = s[s.table == "shift"]
    assert shift.ci_low.isna().all() and (shift.verdict.isin(["", "ref"])).all()  # no bootstrap on shift splits


def test_intervals_stay_inside_the_metrics_range(analysed):
    """With 2 seeds (t on 1 df) the intervals of 60-sample accuracies are wider than [0, 1]:
    an interval of a fraction is cut to [0, 1], of NLL to [0, inf), and the rest of the
    interval is kept (the cut side sits on the bound)."""
    from bench.metrics import get_metric

    results, _ = analysed
    rows = pd.concat([results.summary, results.severity], ignore_index=True).dropna(subset=["ci_low"])
    for metric, group in rows.groupby("metric"):
        lo, hi = get_metric(metric).bounds
        assert (group.ci_low >= lo).all() and (group.ci_high <= hi).all(), metric
    acc = rows[rows.metric == "accuracy"]
    assert get_metric("accuracy").bounds == (0.0, 1.0) and get_metric("nll").bounds == (0.0, np.inf)
    assert ((acc.ci_high == 1.0) | (acc.ci_low == 0.0)).any()  # some interval reached past a bound and was cut
    assert (acc.ci_low < acc["mean"]).all() and (acc["mean"] < acc.ci_high).all()


def test_severity_aggregates_and_corruption_errors_by_hand(analysed):
    results, written = analysed

    def acc(method, seed, split):
        a = written[(method, seed, split)]
        return accuracy_score(a["labels"], a["log_probs"].argmax(1))

    sev = results.severity
    row = sev[(sev.method == "msp") & (sev.severity == 2) & (sev.metric == "accuracy")].iloc[0]
    per_seed = [np.mean([acc("msp", k, "shift/gaussian_noise/2"), acc("msp", k, "shift/contrast/2")]) for k in (0, 1)]
    assert row["mean"] == pytest.approx(np.mean(per_seed)) and row["std"] == pytest.approx(np.std(per_seed, ddof=1))
    assert row.ci_low <= row["mean"] <= row.ci_high
    clean = sev[(sev.method == "msp") & (sev.severity == 0) & (sev.metric == "accuracy")].iloc[0]
    assert clean["mean"] == pytest.approx(np.mean([acc("msp", k, "test") for k in (0, 1)]))

    def err(method, corruption):
        return sum(np.mean([1 - acc(method, k, f"shift/{corruption}/{s}") for k in (0, 1)]) for s in (1, 2))

    ce = results.corruption_errors.set_index(["method", "corruption"])["ce"]
    for corruption in ("gaussian_noise", "contrast"):
        assert ce[("mc_dropout", corruption)] == pytest.approx(err("mc_dropout", corruption) / err("msp", corruption))
        assert ce[("msp", corruption)] == pytest.approx(1.0)
    assert ce[("mc_dropout", "mCE")] == pytest.approx(np.mean([ce[("mc_dropout", c)] for c in ("gaussian_noise", "contrast")]))


def test_efficiency_from_cell_json(analysed):
    results, _ = analysed
    eff = results.efficiency.set_index("method")
    assert eff.loc["msp", "train_seconds"] == pytest.approx(10.5)  # seeds 0 and 1: 10 + 0, 10 + 1
    assert eff.loc["mc_dropout", "passes"] == 5 and eff.loc["mc_dropout", "peak_memory_mb"] == pytest.approx(111.0)
    # an ensemble of two msp members costs twice their training and prediction
    assert eff.loc["deep_ensemble", "train_seconds"] == pytest.approx(21.0)
    assert eff.loc["deep_ensemble", "predict_seconds_per_1000"] == pytest.approx(1.0)
    assert eff.loc["deep_ensemble", "parameters"] == 2000 and eff.loc["deep_ensemble", "passes"] == 2


def test_analysis_is_deterministic(analysed, tmp_path):
    results, _ = analysed
    again = results.summary.copy()
    assert results.summary.equals(again)


def _write_cell(store, key: str, dataset: str, method: str, seed: int, finished: str, quality: float,
                seal: bool = True) -> None:
    cd = store.cell(key)
    cd.reset()
    rng = np.random.default_rng(seed)
    for split in ("val", "test"):
        arrays = fake_preds(rng, split, quality)
        cd.write_preds(split, Predictions(arrays["log_probs"], arrays["labels"]))
    info = {"key": key, "dataset": dataset, "method": method, "seed": seed, "finished": finished}
    if seal:
        cd.seal(CellRecord.from_json(info))
    else:
        cd.write_cell(CellRecord.from_json({**info, "status": "running"}))


def test_catalog_picks_the_planned_cell_else_the_newest_and_names_incomplete_ones(tmp_path):
    from bench.store.catalog import open_store, write_store_description

    suite = build_suite({"name": "pick", "seeds": [0, 1], "datasets": {"mnist5k": {}},
                         "methods": {"msp": {}, "ens": "ensemble(msp, 2)"}})
    store = Store(tmp_path / "pick")
    _write_cell(store, "old0", "mnist5k", "msp", 0, "2026-01-01T00:00:00+00:00", 1.0)
    _write_cell(store, "new0", "mnist5k", "msp", 0, "2026-02-01T00:00:00+00:00", 2.0)
    _write_cell(store, "half1", "mnist5k", "msp", 1, "", 2.0, seal=False)  # killed mid-cell
    write_store_description(store.root, suite)

    alone = open_store(store.root)  # no suite: everything found, the newest complete cell
    assert alone.cells[("mnist5k", "msp", 0)].key == "new0"
    assert [m.name for m in alone.methods] == ["msp", "ens"] and alone.seeds == (0, 1)
    assert "incomplete" in alone.problems[("mnist5k", "msp", 1)]
    planned = open_store(store.root, suite, {"old0"})  # the plan's key wins over the newer one
    assert planned.cells[("mnist5k", "msp", 0)].key == "old0"

    results = analyse(alone, resamples=20)
    reasons = dict(zip(zip(results.failures["method"], results.failures["seed"]), results.failures["reason"]))
    assert "incomplete" in reasons[("msp", 1)]
    assert "needs 2 members, the store has 1 (msp seeds 0, 1; seed 1: incomplete" in reasons[("ens", 0)]  # not formed
    probs, labels = alone.predictions("mnist5k", "msp", 0, "test")
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert labels.dtype == np.int64


def test_a_derived_method_costs_and_converges_over_the_replicates_it_formed_only(tmp_path):
    """An ensemble of 2 over seeds 0-3 with msp seed 3 not stored: replicate 0 (seeds 0, 1)
    is formed, replicate 1 (seeds 2, 3) is named as failed; its cost is replicate 0's
    members' summed, and its convergence rows count those 2 seeds, never seed 2's cell."""
    from bench.store.catalog import write_store_description

    suite = build_suite({"name": "part", "seeds": [0, 1, 2, 3], "datasets": {"mnist5k": {}},
                         "methods": {"msp": {}, "ens": "ensemble(msp, 2)"}})
    store = Store(tmp_path / "part")
    for seed in (0, 1, 2):
        cd = store.cell(f"msp{seed}")
        cd.reset()
        rng = np.random.default_rng(seed)
        for split in ("val", "test"):
            arrays = fake_preds(rng, split, 2.0)
            cd.write_preds(split, Predictions(arrays["log_probs"], arrays["labels"]))
        cd.seal(CellRecord.from_json({"key": f"msp{seed}", "dataset": "mnist5k", "method": "msp", "seed": seed, "parameters": 100,
                 "train_seconds": 10.0 ** seed, "predict_seconds_per_1000": 2.0 ** seed, "peak_memory_mb": 50.0 + seed,
                 "samples": 1}))
    write_store_description(store.root, suite)
    results = analyse(open_store(store.root, suite), ["accuracy"], resamples=20)
    assert results.seeds[("mnist5k", "ens")] == [0]
    reasons = dict(zip(zip(results.failures["method"], results.failures["seed"]), results.failures["reason"]))
    assert reasons[("ens", 1)].startswith("needs 2 members, the store has 1 (msp seeds 2, 3; seed 3: not in the store)")
    eff = results.efficiency.set_index("method").loc["ens"]
    assert (eff.train_seconds, eff.predict_seconds_per_1000) == (1.0 + 10.0, 1.0 + 2.0)
    assert (eff.parameters, eff.passes, eff.peak_memory_mb) == (200, 2, 51.0)
    conv = results.convergence_summary.set_index("method").loc["ens"]
    assert conv.n_seeds == 2


def _seed_store(tmp_path, accuracy: dict[str, list[float]], n: int = 2000):
    """msp and mc_dropout, seeds 0-2, on one shared test set of ``n`` images; each cell gets
    exactly the accuracy given, its errors on random images of its own."""
    suite = build_suite({"name": "seeds", "seeds": [0, 1, 2], "reference": "msp", "datasets": {"mnist5k": {}},
                         "methods": {"msp": {}, "mc_dropout": {"samples": 5}}})
    plan = make_plan(suite)
    store = Store(tmp_path / "seeds")
    labels = np.random.default_rng(0).integers(0, C, n)  # the same test images for every cell
    for i, cell in enumerate(plan.cells):
        rng = np.random.default_rng(i + 1)
        correct = rng.permutation(n) < round(accuracy[cell.method.name][cell.seed] * n)
        logits = rng.normal(size=(n, C))
        logits[np.arange(n), np.where(correct, labels, (labels + 1) % C)] += 10.0  # always the argmax
        cd = store.cell(cell.key)
        cd.reset()
        for split in ("val", "test"):
            cd.write_preds(split, Predictions(log_softmax(logits, axis=1).astype(np.float32), labels))
        cd.seal(CellRecord.from_json({"key": cell.key, "dataset": cell.dataset.name, "method": cell.method.name, "seed": cell.seed,
                 "config": cell.config}))
    return open_store(store.root, suite, {c.key for c in plan.cells})


def _accuracy_row(results):
    s = results.summary
    return s[(s.method == "mc_dropout") & (s.split == "test") & (s.metric == "accuracy")].iloc[0]


def test_a_difference_within_the_seeds_spread_gets_no_mark(tmp_path):
    """Seeds that disagree far more than the test samples do: the seeds-fixed test marks the
    mean difference of 3.3 points, the seed-aware default does not (paired over seeds:
    differences 8, -4 and 6 points)."""
    catalog = _seed_store(tmp_path, {"msp": [0.70, 0.80, 0.90], "mc_dropout": [0.78, 0.76, 0.96]})
    fixed = _accuracy_row(analyse(catalog, resamples=200, significance="samples_seeds_fixed"))
    assert fixed.verdict == "better" and fixed.test == "samples, seeds fixed"
    both = _accuracy_row(analyse(catalog, resamples=200))
    assert both.verdict == "" and both.p_value > 0.2 and both.test == "seeds+samples"
    assert both.ci_high - both.ci_low > 3 * (fixed.ci_high - fixed.ci_low)  # the seeds' spread is in it
    assert both.ci_low <= both["mean"] <= both.ci_high


def test_a_difference_that_every_seed_repeats_keeps_its_mark(tmp_path):
    catalog = _seed_store(tmp_path, {"msp": [0.70, 0.80, 0.90], "mc_dropout": [0.75, 0.85, 0.955]})
    row = _accuracy_row(analyse(catalog, resamples=200))
    assert row.verdict == "better" and row.p_holm < 0.05 and row.seeds_needed <= 3


def test_the_debiased_ece_is_centred_on_its_estimate_and_plug_in_ece_on_its_bias_corrected_one(tmp_path):
    """The metric's record says its estimate is bias-corrected (ece_debiased): its interval
    is centred on the seed-mean; plug-in ECE's still moves by the bootstrap's bias estimate."""
    from bench.metrics import get_metric

    assert get_metric("ece_debiased").bias_corrected and not get_metric("ece").bias_corrected
    catalog = _seed_store(tmp_path, {"msp": [0.80, 0.81, 0.80], "mc_dropout": [0.75, 0.76, 0.75]})
    s = analyse(catalog, ["ece", "ece_debiased"], resamples=200).summary
    rows = s[(s.split == "test") & (s.method == "mc_dropout")].set_index("metric")
    assert 0 < rows.at["ece_debiased", "ci_low"] and rows.at["ece_debiased", "ci_high"] < 1  # not cut to the range
    centre = (rows.at["ece_debiased", "ci_low"] + rows.at["ece_debiased", "ci_high"]) / 2
    assert centre == pytest.approx(rows.at["ece_debiased", "mean"], abs=1e-12)
    assert 0 < rows.at["ece", "ci_low"] and rows.at["ece", "ci_high"] < 1
    assert abs((rows.at["ece", "ci_low"] + rows.at["ece", "ci_high"]) / 2 - rows.at["ece", "mean"]) > 1e-6


def test_seeds_needed_asks_for_a_mark_in_the_comparisons_holm_family(tmp_path, monkeypatch):
    """*Seeds needed* is computed for the family the comparison's p-value is Holm-corrected
    in: the paper's metrics of the test table (here 10, one method against the reference),
    and the debiased ECE, analysed on top of them, in a family of its own (1)."""
    import bench.analysis.bootstrap
    from bench.metrics import selection

    asked = []
    real = bench.analysis.bootstrap.seeds_needed

    def recording(*pair, **kwargs):
        asked.append(kwargs["family"])
        return real(*pair, **kwargs)

    monkeypatch.setattr(bench.analysis.bootstrap, "seeds_needed", recording)
    catalog = _seed_store(tmp_path, {"msp": [0.70, 0.80, 0.90], "mc_dropout": [0.75, 0.85, 0.955]})
    s = analyse(catalog, resamples=200).summary
    tested = s[(s.split == "test") & s.p_value.notna()]
    paper = tested[tested.metric.isin(selection("paper"))]
    assert len(paper) == 10 and len(tested) == 11
    assert sorted(asked) == [1] + [10] * 10


def test_a_plugin_that_edits_its_arrays_in_place_changes_nothing_else(tmp_path, monkeypatch):
    """A plugin score that overwrites the stored log-probabilities it is handed, a plugin
    metric that overwrites the probabilities, and one that overwrites the OOD scores (each
    analysed first): every other metric and score gives the values of an analysis without
    them, and each plugin's write is its own error (they receive read-only arrays)."""
    from bench.metrics.record import Metric
    from bench.core.registry import METRICS, SCORES
    from bench.scores.record import Score
    from tests.helpers.synthetic import fake_store, fake_suite

    def flatten(preds, _fitted=None):
        preds.log_probs[:] = -np.log(preds.log_probs.shape[1])  # every image uniform
        return np.zeros(len(preds.labels))

    def flip(probs, labels):
        probs[:] = probs[:, ::-1].copy()
        return 0.0

    def shift(scores_id, scores_ood):
        scores_id += 100.0
        return 0.0

    monkeypatch.setitem(SCORES._items, "test_flatten", Score("test_flatten", flatten, "flat", "Edits in place.",
                                                              ("log_probs",)))
    monkeypatch.setitem(METRICS._items, "test_flip", Metric("test_flip", flip, "calibration", "flip", "", True,
                                                            "Edits in place."))
    monkeypatch.setitem(METRICS._items, "test_shift", Metric("test_shift", shift, "ood", "shift", "", True,
                                                             "Edits in place."))
    path = tmp_path / "inplace.toml"
    path.write_text(fake_suite("inplace"))
    fake_store(tmp_path / "results", path)
    catalog = open_store(tmp_path / "results" / "inplace")
    names = ["accuracy", "nll", "ood_auroc"]
    clean = analyse(catalog, names, resamples=50, scores=["msp"])
    edited = analyse(open_store(tmp_path / "results" / "inplace"), ["test_flip", "test_shift", *names], resamples=50,
                     scores=["test_flatten", "msp"])
    keys = ["method", "seed", "split", "metric", "score"]
    mine = edited.metrics[edited.metrics.metric.isin(names) & (edited.metrics.score != "test_flatten")]
    pd.testing.assert_frame_equal(mine.sort_values(keys).reset_index(drop=True),
                                  clean.metrics.sort_values(keys).reset_index(drop=True))
    columns = ["mean", "std", "ci_low", "ci_high"]
    summary = edited.summary[edited.summary.metric.isin(names) & (edited.summary.score != "test_flatten")]
    pd.testing.assert_frame_equal(summary.sort_values(keys[:1] + keys[2:])[columns].reset_index(drop=True),
                                  clean.summary.sort_values(keys[:1] + keys[2:])[columns].reset_index(drop=True))
    assert set(edited.unscored.reason[edited.unscored.score == "test_flatten"]) == {
        "raised ValueError: assignment destination is read-only"}
    raised = " ".join(edited.failures.reason)
    assert "metric 'test_flip' raised ValueError" in raised and "metric 'test_shift' raised ValueError" in raised
