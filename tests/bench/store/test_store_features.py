"""What the store keeps for post-hoc OOD scores (logits, penultimate features, training
features and the head; ``[store] features``) and how analysis and the report use it:
scores computed from the store only, and a store without them still reports, naming the
scores it cannot compute."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import log_softmax
from sklearn.covariance import EmpiricalCovariance
from sklearn.metrics import roc_auc_score

import datasets  # noqa: F401
import methods  # noqa: F401
from bench.analysis import analyse
from bench.store.catalog import open_store
from bench.core.errors import ConfigError
from bench.store.plan import make_plan
from bench.core.registry import METHODS
from bench.config.spec import ModelConfig, build_suite
from bench.store import STORE_SCHEMA, Store
from bench.train.loop import predict
from bench.train.vit import ViT
from tests.helpers.synthetic import fake_store, fake_suite, squares_bundle
from bench.store.record import CellRecord, Predictions, TrainingFeatures

CPU = torch.device("cpu")
N, C, D = 80, 3, 6


@pytest.mark.parametrize("batch_passes", [False, True])
def test_predict_keeps_mean_logits_and_the_heads_input_averaged_over_passes(batch_passes):
    """features = the input of the Linear head (read here from the final LayerNorm's
    output), averaged over the passes; logits = the mean logit = head(features), as the
    head is linear; prob_variance = sum_c Var_s p_s,c over the passes."""
    torch.manual_seed(0)
    data = squares_bundle(sizes=(24, 24, 24), side=8)
    model = ViT((8, 8, 1), 3, ModelConfig(patch_size=4, dim=8, depth=1, heads=2, dropout=0.3))
    method = METHODS.get("mc_dropout")(METHODS.get("mc_dropout").Options(samples=4, average="logits"))
    normed, logits_seen = [], []
    model.norm.register_forward_hook(lambda _m, _i, out: normed.append(out.detach().clone()))
    model.head.register_forward_hook(lambda _m, _i, out: logits_seen.append(out.detach().clone()))
    extras = predict(method, model, data.get("test"), data, CPU, 12, extras=True, batch_passes=batch_passes,
                     features=True)
    lp = extras.log_probs
    n = len(data.get("test"))
    feats = torch.cat([t.reshape(-1, 8) for t in normed]).numpy()  # per batch: S x B rows, pass-major
    outs = torch.cat([t.reshape(-1, 3) for t in logits_seen]).numpy()
    per_batch = [(i, min(12 // (4 if batch_passes else 1), n - i)) for i in range(0, n, 12 // (4 if batch_passes else 1))]
    want_f, want_z = [], []
    row = 0
    for _, b in per_batch:
        want_f.append(feats[row : row + 4 * b].reshape(4, b, 8).mean(axis=0))
        want_z.append(outs[row : row + 4 * b].reshape(4, b, 3))
        row += 4 * b
    z = np.concatenate(want_z, axis=1)  # [S, N, C]
    np.testing.assert_allclose(extras.features, np.concatenate(want_f), atol=1e-6)
    np.testing.assert_allclose(extras.logits, z.mean(axis=0), atol=1e-5)
    w, b = model.head.weight.detach().numpy(), model.head.bias.detach().numpy()
    np.testing.assert_allclose(extras.logits, extras.features @ w.T + b, atol=1e-5)
    np.testing.assert_allclose(lp, log_softmax(z.mean(axis=0), axis=1), atol=1e-5)
    p = np.exp(log_softmax(z, axis=-1))
    np.testing.assert_allclose(extras.prob_variance, p.var(axis=0).sum(axis=-1), atol=1e-6)
    assert extras.features.shape == (n, 8) and extras.logits.shape == (n, 3)


def test_store_features_is_a_suite_option_in_the_cell_key():
    raw = {"name": "s", "datasets": {"mnist5k": {}}, "methods": {"msp": {}}}
    on, off = (make_plan(build_suite({**raw, "store": store})).cells[0] for store in ({}, {"features": False}))
    assert on.store.features and not off.store.features
    assert on.key != off.key and on.config["schema"] == STORE_SCHEMA == 3
    with pytest.raises(ConfigError, match=r"store\.features"):
        build_suite({**raw, "store": {"features": "yes"}})
    with pytest.raises(ConfigError, match=r"store\.bogus"):
        build_suite({**raw, "store": {"bogus": 1}})


def test_training_features_round_trip_and_bad_ones_are_refused(tmp_path):
    cd = Store(tmp_path).cell("k")
    cd.reset()
    assert cd.read_training_features() is None
    rng = np.random.default_rng(0)
    f = rng.normal(size=(10, D))
    cd.write_training_features(TrainingFeatures(f, rng.integers(0, C, 10), rng.normal(size=(C, D)), np.zeros(C), 50))
    got = cd.read_training_features()
    assert got.features.dtype == np.float16 and int(got.train_size) == 50
    np.testing.assert_allclose(got.features, f, atol=1e-2)
    with pytest.raises(ValueError, match="not stored"):
        cd.write_training_features(TrainingFeatures(f, np.full(10, C), rng.normal(size=(C, D)), np.zeros(C), 50))  # label C
    with pytest.raises(ValueError, match="not stored"):
        cd.write_preds("test", Predictions(log_softmax(rng.normal(size=(4, C)), axis=1), np.zeros(4), logits=np.zeros((4, C + 1))))


def test_a_real_run_stores_logits_features_and_the_head_of_its_checkpoint(tiny_store):
    """The cells of a real run of the tiny suite (features on by default): the test split
    keeps the logits whose softmax is the stored prediction and the float16 features the
    head maps to them; the training features carry the checkpoint's head."""
    store = Store(tiny_store / "results" / "hard")
    keys = [p.name for p in store.root.iterdir() if (p / "cell.json").is_file()]
    assert keys
    for key in keys:
        cd = store.cell(key)
        assert cd.condition()[0] == "complete"
        with np.load(cd.path / "preds" / "test.npz", allow_pickle=False) as z:
            lp, logits, feats = z["log_probs"], z["logits"], z["features"]
        assert feats.dtype == np.float16 and len(feats) == len(logits) == len(lp)
        np.testing.assert_allclose(lp, log_softmax(logits.astype(np.float64), axis=1), atol=1e-4)
        train = cd.read_training_features()
        weights = torch.load(cd.path / "checkpoint.pt", weights_only=True)
        np.testing.assert_array_equal(train.head_weight, weights["head.weight"].float().numpy())
        np.testing.assert_array_equal(train.head_bias, weights["head.bias"].float().numpy())
        head = feats.astype(np.float64) @ train.head_weight.T + train.head_bias
        np.testing.assert_allclose(head, logits, atol=0.05)  # features rounded to float16
        assert train.features.shape[1] == feats.shape[1] and int(train.train_size) >= len(train.labels)


def test_a_real_run_keeps_its_detectors_cost_and_the_efficiency_table_sums_it(tiny_store):
    """Each cell measures the fit and scoring time of every registered score with a fit
    (``ood_detectors`` in cell.json) and the efficiency table shows their sums, averaged
    over the seeds, for the trained method (computed here from the cells' json)."""
    from bench.core.registry import SCORES
    from bench.config.spec import load_suite

    fitted = {n for n in SCORES.names() if SCORES.get(n).fit is not None}
    assert {"mahalanobis", "relative_mahalanobis", "knn", "vim", "residual"} <= fitted
    store = Store(tiny_store / "results" / "hard")
    infos = [store.cell(p.name).read_cell() for p in store.root.iterdir() if (p / "cell.json").is_file()]
    assert len(infos) == 2
    for info in infos:
        assert set(info.ood_detectors) == fitted
        for cost in info.ood_detectors.values():
            assert cost["fit_seconds"] >= 0 and cost["score_seconds_per_1000"] > 0
    suite = load_suite(str(tiny_store / "hard.toml"))
    results = analyse(open_store(store.root, suite, {i.key for i in infos}), resamples=20)
    row = results.efficiency[results.efficiency.method == "msp"].iloc[0]
    for field, column in (("fit_seconds", "detector_fit_seconds"),
                          ("score_seconds_per_1000", "detector_score_seconds_per_1000")):
        expected = np.mean([sum(c[field] for c in i.ood_detectors.values()) for i in infos])
        assert row[column] == pytest.approx(expected, rel=1e-9)


def gaussian_cell_arrays(rng, split: str, means: np.ndarray, w: np.ndarray, b: np.ndarray):
    """A split whose features are drawn around the class means (ID) or far from them (OOD);
    logits = head(features), as a trained cell stores them."""
    ood = split.startswith("ood/")
    labels = rng.integers(0, C, N)
    x = (rng.normal(scale=4.0, size=(N, D)) if ood else means[labels] + rng.normal(size=(N, D))).astype(np.float16)
    z = x.astype(np.float64) @ w.T + b
    return x, z, (np.full(N, -1) if ood else labels)


@pytest.fixture(scope="module")
def feature_store(tmp_path_factory):
    """msp (2 seeds, features stored) and its temperature scaling, on Gaussian features."""
    suite = build_suite({"name": "feat", "seeds": [0, 1], "datasets": {"mnist5k": {}},
                         "methods": {"msp": {}, "temperature_scaling": {}}})
    plan = make_plan(suite)
    store = Store(tmp_path_factory.mktemp("store") / "feat")
    written = {}
    for cell in plan.cells:
        rng = np.random.default_rng(cell.seed)
        means, w, b = 3.0 * rng.normal(size=(C, D)), rng.normal(size=(C, D)), rng.normal(size=C)
        cd = store.cell(cell.key)
        cd.reset()
        for split in ("val", "test", "ood/far"):
            x, z, y = gaussian_cell_arrays(rng, split, means, w, b)
            cd.write_preds(split, Predictions(log_softmax(z, axis=1), y, logits=z, features=x))
            written[(cell.seed, split)] = x.astype(np.float64)
        y_train = np.repeat(np.arange(C), 30)
        x_train = (means[y_train] + rng.normal(size=(len(y_train), D))).astype(np.float16)
        cd.write_training_features(TrainingFeatures(x_train, y_train, w, b, len(y_train)))
        written[(cell.seed, "train")] = (x_train.astype(np.float64), y_train)
        cd.seal(CellRecord.from_json({"key": cell.key, "dataset": "mnist5k", "method": "msp", "seed": cell.seed, "config": cell.config,
                 "samples": 1}))
    return store, suite, plan, written


def test_analysis_computes_feature_scores_from_the_store_only(feature_store):
    store, suite, plan, written = feature_store
    results = analyse(open_store(store.root, suite, {c.key for c in plan.cells}), resamples=50)
    m = results.metrics
    msp = m[(m.method == "msp") & (m.metric == "ood_auroc")]
    assert {"msp", "entropy", "max_logit", "energy", "mahalanobis", "knn", "vim"} <= set(msp.score)
    for seed in (0, 1):  # Mahalanobis AUROC against scikit-learn on the stored (float16) features
        x_train, y_train = written[(seed, "train")]
        means = np.stack([x_train[y_train == c].mean(axis=0) for c in range(C)])
        cov = EmpiricalCovariance().fit(x_train - means[y_train])
        score = {sp: -np.min([cov.mahalanobis(written[(seed, sp)] - mu) for mu in means], axis=0)
                 for sp in ("test", "ood/far")}
        expected = roc_auc_score(np.r_[np.ones(N), np.zeros(N)], np.r_[score["test"], score["ood/far"]])
        got = msp[(msp.seed == seed) & (msp.score == "mahalanobis")].value.item()
        assert got == pytest.approx(expected, abs=1e-12)
        assert got > 0.9
    # the derived method has probabilities only: its feature and logit scores are named, not failed
    ts = results.unscored[results.unscored.method == "temperature_scaling"]
    assert set(ts.score) == {"max_logit", "energy", "mahalanobis", "knn", "vim"}
    assert ts.reason.str.contains("combined from its members' stored probabilities").all()
    assert results.failures.empty
    assert results.scores == ["msp", "entropy", "mutual_info", "max_logit", "energy", "mahalanobis", "knn", "vim"]


def test_scores_option_picks_the_ood_rows(feature_store):
    store, suite, plan, _ = feature_store
    results = analyse(open_store(store.root, suite, {c.key for c in plan.cells}), resamples=20,
                      scores=["relative_mahalanobis", "msp"])
    assert set(results.metrics.loc[results.metrics.split == "ood/far", "score"]) == {"relative_mahalanobis", "msp"}
    assert set(results.summary.loc[results.summary.table == "ood", "score"]) == {"relative_mahalanobis", "msp"}


def test_a_store_without_logits_or_features_reports_and_names_what_it_cannot_score(tmp_path, capsys):
    """Cells as the store wrote them before (log-probabilities only): the report is written,
    the probability scores are in its OOD table, and the README and stderr name each
    score it could not compute with the rerun it needs."""
    from bench.run.report import ReportOptions, report_suite
    from bench.config.spec import load_suite

    suite_file = tmp_path / "old.toml"
    suite_file.write_text(fake_suite("old"))
    fake_store(tmp_path / "results", suite_file)
    options = ReportOptions(results=tmp_path / "results", formats=("md",))
    status = report_suite(load_suite(str(suite_file)), tmp_path / "results" / "old", tmp_path / "reports", options)
    err = capsys.readouterr().err
    assert status == 0, err
    lines = err.splitlines()  # one line per method and reason, naming every score it left out
    assert ("report: OOD scores 'mahalanobis', 'knn', 'vim' not computed for mnist5k / msp: needs features: "
            "rerun with `[store] features = true` (this cell stored none)") in lines
    assert ("report: OOD scores 'max_logit', 'energy' not computed for mnist5k / msp: needs logits: rerun the suite "
            "(this cell was stored before the store kept logits)") in lines
    readme = (tmp_path / "reports" / "README.md").read_text()
    assert "Scores not computed" in readme and "needs features: rerun with `[store] features = true`" in readme
    ood = (tmp_path / "reports" / "tables" / "ood.md").read_text()
    assert "| msp " in ood and "| entropy " in ood and "knn" not in ood


def test_unknown_score_option_is_a_config_error_with_did_you_mean(tmp_path):
    from bench.run.report import ReportOptions

    with pytest.raises(ConfigError, match="Did you mean 'energy'"):
        ReportOptions(scores=("enrgy",))


def test_the_readme_averages_openood_near_and_far_groups_of_a_cifar_store(tmp_path):
    """CIFAR-10 declares OpenOOD v1.5's groups: near = CIFAR-100, far = SVHN and uniform
    noise; the README shows each group's mean of the seed-mean AUROC under the OOD table."""
    from bench.run.report import ReportOptions, write_suite_report

    suite = build_suite({"name": "c10", "seeds": [0], "datasets": {"cifar10": {"ood": ["svhn", "cifar100"]}},
                         "methods": {"msp": {}}})
    cell = make_plan(suite).cells[0]
    cd = Store(tmp_path / "results" / "c10").cell(cell.key)
    cd.reset()
    rng = np.random.default_rng(0)
    shift = {"test": 2.0, "ood/cifar100": 1.0, "ood/svhn": 0.0, "ood/uniform_noise": -1.0}
    for split, mean in shift.items():
        z = rng.normal(size=(N, C))
        z[:, 0] += mean
        y = np.zeros(N, np.int64) if split == "test" else np.full(N, -1)
        cd.write_preds(split, Predictions(log_softmax(z, axis=1), y))
    cd.seal(CellRecord.from_json({"key": cell.key, "dataset": "cifar10", "method": "msp", "seed": 0, "config": cell.config, "samples": 1}))
    options = ReportOptions(results=tmp_path / "results", formats=("md",))
    reported = write_suite_report(suite, tmp_path / "results" / "c10", tmp_path / "reports", options)
    readme = reported.readme.read_text()
    assert "OOD groups (OpenOOD v1.5's near and far OOD" in readme
    assert "near: `ood/cifar100`; far: `ood/svhn`, `ood/uniform_noise`" in readme
    summary = __import__("pandas").read_csv(tmp_path / "reports" / "analysis" / "summary.csv")
    auroc = summary[(summary.metric == "ood_auroc") & (summary.score == "msp")].set_index("split")["mean"]
    far = (auroc["ood/svhn"] + auroc["ood/uniform_noise"]) / 2
    groups = readme[readme.index("OOD groups ("):]
    row = next(line for line in groups.splitlines() if line.startswith("| msp ") and "| `msp` " in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == f"{100 * auroc['ood/cifar100']:.1f}" and cells[3] == f"{100 * far:.1f}"
    # and which score wins each OOD set, with its AUROC
    best = readme[readme.index("Best OOD score per method and OOD set"):]
    ood = summary[(summary.metric == "ood_auroc") & (summary.split == "ood/svhn")]
    winner = ood.loc[ood["mean"].idxmax()]
    assert f"`{winner.score}` ({100 * winner['mean']:.1f})" in best.split("\n\n")[1]


def test_a_score_that_gives_non_finite_values_is_named_not_a_failed_metric(feature_store):
    from bench.scores import ood_score

    @ood_score("Broken", "NaN everywhere: a test plugin's score.", reads=("logits",), name="test_broken_nan")
    def broken(preds, _fitted=None):
        return np.full(len(preds.logits), np.nan)

    store, suite, plan, _ = feature_store
    results = analyse(open_store(store.root, suite, {c.key for c in plan.cells}), resamples=20,
                      scores=["msp", "test_broken_nan"])
    why = results.unscored.set_index(["method", "score"])["reason"]
    assert why[("msp", "test_broken_nan")] == "gave non-finite values on test"
    assert results.failures.empty and "test_broken_nan" not in set(results.metrics.score)
