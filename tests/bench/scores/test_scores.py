"""The registered OOD scores against independent references (scipy, scikit-learn, dense
numpy from the papers' formulas) and OpenOOD v1.5's postprocessor formulas, through the
registry (``bench.core.registry.SCORES``) and the plain functions of ``bench.scores``."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from scipy.special import log_softmax, logsumexp
from sklearn.covariance import EmpiricalCovariance
from sklearn.metrics import roc_auc_score
from sklearn.neighbors import NearestNeighbors

from bench.core.errors import ConfigError
from bench.core.registry import SCORES
from bench.store import Predictions
from bench.scores import (ARRAYS, GDA_JITTERS, TRAINING, TrainingFeatures, default_scores, fit_gda, fit_knn, gda_log_density,
                          get_score, knn_k, knn_score, ood_score, validate_scores, vim_dim)


def gaussian_features(n_per_class: int = 40, classes: int = 3, width: int = 8, seed: int = 0):
    """Class-separated features [classes * n, width] with correlated noise, and labels."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(width, width)) / np.sqrt(width)
    centres = 3.0 * rng.normal(size=(classes, width))
    labels = np.repeat(np.arange(classes), n_per_class)
    x = centres[labels] + rng.normal(size=(len(labels), width)) @ mix
    return x, labels


def training(features, labels, weight, bias, train_size=None) -> TrainingFeatures:
    return TrainingFeatures(np.asarray(features, np.float64), labels, np.asarray(weight, np.float64),
                            np.asarray(bias, np.float64), train_size or len(features))


def as_preds(arrays: dict) -> Predictions:
    """A split's predictions holding ``arrays`` alone (the others absent)."""
    return Predictions(**{"log_probs": None, "labels": None, **arrays})


def registered(name, arrays, train=None):
    """The registered score ``name`` on ``arrays``, fitted on ``train`` when it fits."""
    score = get_score(name)
    return score(as_preds(arrays), score.fit(train) if score.fit is not None else None)


@pytest.fixture(scope="module")
def case():
    x, y = gaussian_features(n_per_class=47, seed=0)
    held = np.arange(len(y)) % 47 >= 40  # 7 images per class held out: in-distribution test rows
    x_train, y_train, x_test = x[~held], y[~held], x[held]
    rng = np.random.default_rng(2)
    x_test = np.concatenate([x_test, 4.0 * rng.normal(size=(10, x_train.shape[1]))])  # some far from every class
    w = rng.normal(size=(3, x_train.shape[1]))
    b = rng.normal(size=3)
    return {"train": training(x_train, y_train, w, b), "x": x_test, "w": w, "b": b}


# --- scores of the outputs ---------------------------------------------------------------------------
def test_output_scores_match_their_definitions():
    rng = np.random.default_rng(3)
    z = 4.0 * rng.normal(size=(50, 6))
    lp = log_softmax(z, axis=1).astype(np.float32)
    p = np.exp(lp.astype(np.float64))
    arrays = {"log_probs": lp, "logits": z.astype(np.float32)}
    m = z.max(axis=1, keepdims=True)
    np.testing.assert_allclose(registered("energy", arrays), (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0],
                               rtol=1e-6)
    np.testing.assert_allclose(registered("max_logit", arrays), z.max(axis=1), rtol=1e-6)
    np.testing.assert_allclose(registered("msp", arrays), p.max(axis=1))
    np.testing.assert_allclose(registered("entropy", arrays), (p * np.log(p)).sum(axis=1), atol=1e-12)


def test_sampling_scores_read_the_stored_terms_and_single_pass_lacks_them():
    rng = np.random.default_rng(4)
    probs = np.stack([np.exp(log_softmax(rng.normal(size=(20, 4)), axis=1)) for _ in range(5)])  # [S, N, C]
    mean = probs.mean(axis=0)
    h = lambda q: -(q * np.log(q)).sum(axis=-1)  # noqa: E731
    arrays = {"log_probs": np.log(mean).astype(np.float32), "entropy_of_mean": h(mean).astype(np.float32),
              "mean_entropy": h(probs).mean(axis=0).astype(np.float32),
              "prob_variance": probs.var(axis=0).sum(axis=1).astype(np.float32)}
    np.testing.assert_allclose(registered("mutual_info", arrays), -(h(mean) - h(probs).mean(axis=0)), atol=1e-5)
    np.testing.assert_allclose(registered("predictive_variance", arrays),
                               -np.var(probs, axis=0, ddof=0).sum(axis=1), atol=1e-6)
    single = {"log_probs": arrays["log_probs"]}
    assert get_score("mutual_info").lacks(as_preds(single), training=False) == "samples"
    assert get_score("energy").lacks(as_preds(single), training=False) == "logits"
    assert get_score("knn").lacks(as_preds({**single, "logits": single["log_probs"]}), training=True) == "features"
    assert get_score("vim").lacks(as_preds({**single, "features": np.zeros((20, 3), np.float16)}), training=False) \
        == "training features"


# --- feature scores against scikit-learn and the papers ----------------------------------------------
def test_mahalanobis_matches_sklearn_empirical_covariance(case):
    t = case["train"]
    classes = np.unique(t.labels)
    means = np.stack([t.features[t.labels == c].mean(axis=0) for c in classes])
    cov = EmpiricalCovariance().fit(t.features - means[t.labels])  # location_ = 0 up to round-off
    expected = -np.min([cov.mahalanobis(case["x"] - mu) for mu in means], axis=0)  # sklearn: squared distances
    np.testing.assert_allclose(registered("mahalanobis", {"features": case["x"]}, t), expected, rtol=1e-8)


def test_relative_mahalanobis_follows_ren_et_al(case):
    """Ren et al. 2021, eq. 3: RMD_k(x) = MD_k(x) - MD_0(x), MD_0 the Mahalanobis distance to
    one Gaussian fitted to all training features; confidence = -min_k RMD_k."""
    t = case["train"]
    means = np.stack([t.features[t.labels == c].mean(axis=0) for c in np.unique(t.labels)])
    md_k = np.stack([EmpiricalCovariance().fit(t.features - means[t.labels]).mahalanobis(case["x"] - mu)
                     for mu in means], axis=1)
    background = EmpiricalCovariance().fit(t.features)
    md_0 = background.mahalanobis(case["x"])  # sklearn subtracts its location_ (the mean) itself
    np.testing.assert_allclose(registered("relative_mahalanobis", {"features": case["x"]}, t),
                               -(md_k - md_0[:, None]).min(axis=1), rtol=1e-7, atol=1e-9)


def test_knn_matches_sklearn_nearest_neighbours(case):
    t = case["train"]
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    for k in (1, 5, 50):
        dist, _ = NearestNeighbors(n_neighbors=k).fit(unit(t.features)).kneighbors(unit(case["x"]))
        np.testing.assert_allclose(knn_score(case["x"], fit_knn(t.features, k)), -dist[:, -1], atol=1e-7)
    # the registered score uses Sun et al.'s k = 50 with the whole training set (120 images here)
    dist, _ = NearestNeighbors(n_neighbors=50).fit(unit(t.features)).kneighbors(unit(case["x"]))
    np.testing.assert_allclose(registered("knn", {"features": case["x"]}, t), -dist[:, -1], atol=1e-7)


def test_knn_k_is_sun_et_al_50_scaled_by_the_stored_fraction():
    assert knn_k(50_000, 50_000) == 50  # CIFAR-10, the whole training set
    assert knn_k(10_000, 45_000) == 11  # a fixed subset of 10k: k scaled by alpha = 10k / 45k
    assert knn_k(3_600, 3_600) == 50
    assert knn_k(20, 20) == 20  # never more neighbours than stored features
    assert knn_k(100, 100_000) == 1


def vim_reference(train, w, b, x, dim):
    """ViM (Wang et al. 2022, section 4) written densely from the paper: origin o = -pinv(W) b;
    principal space P = span of the top-D right singular vectors of X - o (the eigenvectors
    of (X - o)^T (X - o)); residual x^P⊥ = (x - o) - P P^T (x - o); alpha = sum max logit /
    sum ||x^P⊥|| over the training set; score = logsumexp(W x + b) - alpha ||x^P⊥||."""
    o = -np.linalg.pinv(w) @ b
    _, _, vt = np.linalg.svd(train - o, full_matrices=False)
    p = vt[:dim].T

    def residual(a):
        c = a - o
        return np.linalg.norm(c - c @ p @ p.T, axis=1)

    alpha = (train @ w.T + b).max(axis=1).sum() / residual(train).sum()
    z = x @ w.T + b
    m = z.max(axis=1, keepdims=True)
    energy = (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0]
    return energy - alpha * residual(x), -residual(x)


def test_vim_and_residual_match_the_papers_formulas_computed_densely(case):
    t = case["train"]
    dim = vim_dim(t.features.shape[1])
    assert dim == 4  # N = 8 < 768: half the width
    vim, resid = vim_reference(t.features, case["w"], case["b"], case["x"], dim)
    np.testing.assert_allclose(registered("vim", {"features": case["x"]}, t), vim, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(registered("residual", {"features": case["x"]}, t), resid, rtol=1e-7, atol=1e-9)


def test_vim_principal_dimension_is_the_official_codes():
    """haoqiwang/vim ``benchmark.py:230-235``: 1000 if N >= 2048, 512 if N >= 768, else N // 2;
    widths 1500-2047 get 512 (not 1000), at each threshold and either side of it."""
    expected = {4096: 1000, 2048: 1000, 2047: 512, 1500: 512, 1024: 512, 768: 512, 767: 383, 512: 256, 384: 192, 64: 32}
    assert {width: vim_dim(width) for width in expected} == expected


# --- OpenOOD v1.5 conformance ------------------------------------------------------------------------
def openood_mds(train_x, train_y, x):
    """OpenOOD ``MDSPostprocessor`` (v1.5): class means; EmpiricalCovariance(assume_centered=False)
    of the class-centred features; conf = max_c -(x - mu_c) P (x - mu_c)^T."""
    means = np.stack([train_x[train_y == c].mean(axis=0) for c in np.unique(train_y)])
    prec = EmpiricalCovariance(assume_centered=False).fit(train_x - means[train_y]).precision_
    return np.max([-np.diag((x - mu) @ prec @ (x - mu).T) for mu in means], axis=0)


def openood_knn(train_x, x, k):
    """OpenOOD ``KNNPostprocessor``: normalizer(x) = x / ||x|| + 1e-10; faiss IndexFlatL2 returns
    squared L2 distances; conf = -D[:, k-1]."""
    norm = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True) + 1e-10  # noqa: E731
    d2 = ((norm(x)[:, None, :] - norm(train_x)[None]) ** 2).sum(axis=-1)
    return -np.sort(d2, axis=1)[:, k - 1]


def openood_vim(train_x, w, b, x, dim):
    """OpenOOD ``VIMPostprocessor``: u = -pinv(w) b; EmpiricalCovariance(assume_centered=True) of
    train - u; np.linalg.eig; NS = eigenvectors past the top ``dim``; alpha = mean max train
    logit / mean ||(train - u) NS||; conf = logsumexp(x w^T + b) - alpha ||(x - u) NS||."""
    from scipy.special import logsumexp

    u = -np.matmul(np.linalg.pinv(w), b)
    ec = EmpiricalCovariance(assume_centered=True).fit(train_x - u)
    vals, vecs = np.linalg.eig(ec.covariance_)
    ns = np.ascontiguousarray((vecs.T[np.argsort(vals * -1)[dim:]]).T)
    alpha = (train_x @ w.T + b).max(axis=-1).mean() / np.linalg.norm((train_x - u) @ ns, axis=-1).mean()
    return logsumexp(x @ w.T + b, axis=-1) - alpha * np.linalg.norm((x - u) @ ns, axis=-1)


def test_openood_conformance_energy_max_logit_mahalanobis_vim_values_and_knn_ranking(case):
    """Same sign and values as OpenOOD v1.5's ``ebo`` (T = 1), ``mls``, ``mds`` and ``vim``
    on small fixed features; ``knn`` differs by a monotone map (OpenOOD: minus the squared
    distance, 1e-10 added after normalising) and gives the same ranking and AUROC."""
    t, x = case["train"], case["x"]
    z = x @ case["w"].T + case["b"]
    from scipy.special import logsumexp

    np.testing.assert_allclose(registered("energy", {"logits": z}), 1.0 * logsumexp(z / 1.0, axis=1), rtol=1e-12)
    np.testing.assert_allclose(registered("max_logit", {"logits": z}), z.max(axis=1), rtol=1e-12)
    np.testing.assert_allclose(registered("mahalanobis", {"features": x}, t), openood_mds(t.features, t.labels, x),
                               rtol=1e-6)
    np.testing.assert_allclose(registered("vim", {"features": x}, t),
                               openood_vim(t.features, case["w"], case["b"], x, vim_dim(x.shape[1])).real, rtol=1e-6)
    ours, theirs = registered("knn", {"features": x}, t), openood_knn(t.features, x, 50)
    assert np.array_equal(np.argsort(np.argsort(ours)), np.argsort(np.argsort(theirs)))
    is_id = np.arange(len(x)) < 21  # the first 21 rows come from the training classes
    assert roc_auc_score(is_id, ours) == pytest.approx(roc_auc_score(is_id, theirs))
    assert roc_auc_score(is_id, registered("mahalanobis", {"features": x}, t)) > 0.9  # higher = more ID


# --- the registry --------------------------------------------------------------------------------------
# --- DDU's feature density (Gaussian discriminant analysis) --------------------------------------
def ddu_case(seed: int = 5):
    """Three classes of unequal size (40, 23, 11) and unequal covariances in width 6, and test
    rows near and far from them: a shared covariance or a missing log prior changes the density."""
    rng = np.random.default_rng(seed)
    sizes, width = (40, 23, 11), 6
    x, y = [], []
    for c, n in enumerate(sizes):
        mix = rng.normal(size=(width, width)) * (1.0 + c)  # each class its own covariance
        x.append(2.0 * c + rng.normal(size=(n, width)) @ mix)
        y.append(np.full(n, c))
    x, y = np.concatenate(x), np.concatenate(y)
    test = np.concatenate([x[::7] + 0.1 * rng.normal(size=x[::7].shape), 30.0 + 10.0 * rng.normal(size=(8, width))])
    return x, y, test


def qda_reference(x, y, test, jitter: float = 0.0):
    """log sum_c pi_c N(test; mu_c, Sigma_c + jitter I) with the class means and class
    proportions of scikit-learn's QDA, the per-class covariances by hand (``np.cov``, /(n_c - 1):
    QDA's ``covariance_`` is /n_c since scikit-learn 1.9, /(n_c - 1) before), the densities
    from scipy's multivariate_normal and the sum by scipy's logsumexp."""
    from scipy.stats import multivariate_normal
    from sklearn.discriminant_analysis import QuadraticDiscriminantAnalysis

    qda = QuadraticDiscriminantAnalysis().fit(x, y)
    eye = np.eye(x.shape[1])
    covs = [np.cov(x[y == c], rowvar=False, ddof=1) for c in qda.classes_]
    per_class = np.stack([multivariate_normal(mu, cov + jitter * eye).logpdf(test) + np.log(prior)
                          for mu, cov, prior in zip(qda.means_, covs, qda.priors_)], axis=1)
    return logsumexp(per_class, axis=1)


def test_ddu_density_matches_per_class_gaussians_from_sklearn_qda_and_scipy():
    x, y, test = ddu_case()
    fitted = fit_gda(x, y)
    assert fitted.jitter_eps == 0.0 and fitted.jitter == 0.0  # well-conditioned: the official loop stops at 0
    for c, (mu, cov) in enumerate(zip(fitted.means, fitted.inv_chol)):  # hand computation of each class's Gaussian
        xc = x[y == c]
        hand = (xc - xc.mean(axis=0)).T @ (xc - xc.mean(axis=0)) / (len(xc) - 1)
        np.testing.assert_allclose(mu, xc.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(np.linalg.inv(cov.T @ cov), hand, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fitted.log_prior, np.log(np.array([40, 23, 11]) / 74), rtol=1e-12)
    want = qda_reference(x, y, test)
    got = registered("ddu_density", {"features": test.astype(np.float16)}, training(x, y, np.zeros((3, 6)), np.zeros(3)))
    np.testing.assert_allclose(got, qda_reference(x, y, test.astype(np.float16).astype(np.float64)), rtol=1e-10)
    np.testing.assert_allclose(gda_log_density(test, fitted), want, rtol=1e-10)
    # the test rows far from every class score lower (higher = more in-distribution)
    assert want[-8:].max() < np.median(want[:-8])
    score = get_score("ddu_density")
    assert score.needs == ("features", TRAINING) and score.default is None and "ddu_density" not in default_scores()


def official_jitters() -> list[float]:
    """omegafragger/DDU utils/gmm_utils.py:6, written out: [0, finfo(double).tiny] + [10 ** exp for exp in range(-308, 0)]."""
    return [0.0, float(np.finfo(np.float64).tiny)] + [10.0**e for e in range(-308, 0)]


def first_jitter(covs: np.ndarray) -> float:
    """The official loop: the first jitter eps whose ``eps * torch.eye`` (float32) makes every
    covariance Cholesky-factorisable, here with scipy's Cholesky."""
    from scipy.linalg import LinAlgError, cholesky

    for eps in official_jitters():
        try:
            for cov in covs:
                cholesky(cov + float(np.float32(eps)) * np.eye(len(cov)), lower=True)
        except LinAlgError:
            continue
        return eps
    raise AssertionError("no jitter")


def test_ddu_density_jitter_follows_the_official_sequence_on_singular_covariances():
    assert list(GDA_JITTERS) == official_jitters() and len(GDA_JITTERS) == 310
    # (1) a feature constant within one class: its covariance has an exact zero row.  The
    # official float32 eye rounds every entry below 1e-45 to 0, so 1e-45 (added as 1.4e-45) is
    # the first that works.
    x, y, test = ddu_case()
    x[y == 1, 2] = 0.5
    fitted = fit_gda(x, y)
    assert (fitted.jitter_eps, fitted.jitter) == (1e-45, 1.401298464324817e-45)
    covs = np.stack([np.cov(x[y == c], rowvar=False) for c in range(3)])
    assert first_jitter(covs) == 1e-45
    got = gda_log_density(test, fitted)
    assert np.isfinite(got).all()
    on_plane = test[:, 2] == 0.5  # none: every test row leaves the plane of class 1, whose density vanishes
    assert not on_plane.any()
    without_1 = qda_reference(x[y != 1], y[y != 1], test)  # class 1 contributes exp(-huge) = 0; the others
    np.testing.assert_allclose(got, without_1 + np.log(51 / 74), rtol=1e-9)  # keep their priors n_c / 74, not / 51
    # (2) rank-deficient classes (fewer features than dimensions) of very different scales:
    # one jitter for every class, the first with which all of them factorise.
    rng = np.random.default_rng(7)
    big = 1e4 * rng.normal(size=(4, 3)) @ rng.normal(size=(3, 8))  # 4 features of rank 3 in width 8, large
    small = 1e-3 * rng.normal(size=(30, 8))  # full rank, small: a jitter meant for `big` changes it
    xs, ys = np.concatenate([big, small]), np.repeat([0, 1], [4, 30])
    fitted = fit_gda(xs, ys)
    covs = np.stack([np.cov(xs[ys == c], rowvar=False) for c in (0, 1)])
    assert fitted.jitter_eps == first_jitter(covs) > 1e-45 and fitted.jitter == float(np.float32(fitted.jitter_eps))
    probe = 1e-3 * rng.normal(size=(5, 8))
    want_small = multivariate_logpdf(probe, covs[1] + fitted.jitter * np.eye(8), xs[ys == 1].mean(axis=0))
    got_small = gda_log_density(probe, fitted)  # class 0's density at these rows is negligible
    np.testing.assert_allclose(got_small, want_small + np.log(30 / 34), rtol=1e-9)
    # (3) a class with one stored feature has no covariance (the official code divides by 0)
    with pytest.raises(ValueError, match="fewer than 2"):
        fit_gda(np.concatenate([xs, np.ones((1, 8))]), np.append(ys, 2))


def multivariate_logpdf(x, cov, mean):
    from scipy.stats import multivariate_normal

    return multivariate_normal(mean, cov).logpdf(x)


def test_scores_name_the_arrays_they_read_through_the_store_record():
    """``reads`` names stored arrays through ``ARRAYS`` (the fields of ``Predictions``): a
    misspelt name is an AttributeError where the score is declared, and no score of
    ``bench/`` spells an array name as a string."""
    with pytest.raises(AttributeError, match="logit"):
        ARRAYS.logit  # noqa: B018

    @ood_score("Neg. max prob", "-max_c p_c: a test plugin's score.", reads=(ARRAYS.log_probs, ARRAYS.logits),
               name="test_plugin_two_arrays")
    def two(preds, _fitted=None):
        return -preds.log_probs.max(axis=1)

    assert get_score("test_plugin_two_arrays").needs == ("probabilities", "logits")
    assert get_score("test_plugin_two_arrays").lacks(as_preds({"log_probs": np.zeros((2, 2))}), False) == "logits"
    spelt = []
    for path in sorted((Path(__file__).resolve().parents[3] / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "reads":
                spelt += [f"{path.name}:{c.lineno}" for c in ast.walk(node.value)
                          if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    assert not spelt, f"array names spelt as strings in reads=: {spelt}"


def test_unknown_score_names_the_closest_one():
    with pytest.raises(ConfigError, match=r"unknown OOD score 'mahalanobs' \(at --scores\)\. Did you mean 'mahalanobis'\?"):
        validate_scores(["msp", "mahalanobs"])
    assert validate_scores(["knn", "msp", "knn"]) == ["knn", "msp"]


def test_default_scores_include_the_issues_four_and_keep_the_old_three_first():
    defaults = default_scores()
    assert defaults[:3] == ["msp", "entropy", "mutual_info"]
    assert {"msp", "energy", "mahalanobis", "knn"} <= set(defaults)
    for name in SCORES.names():
        score = get_score(name)
        assert score.convention and score.label and score.needs


def test_a_plugin_registers_a_score_like_a_metric():
    @ood_score("Neg. L1", "-sum |x|: a test plugin's score.", reads=("features",), name="test_plugin_l1")
    def l1(preds, _fitted=None):
        return -np.abs(preds.features).sum(axis=1)

    assert "test_plugin_l1" in SCORES and get_score("test_plugin_l1").needs == ("features",)
    assert validate_scores(["test_plugin_l1"]) == ["test_plugin_l1"]
    np.testing.assert_allclose(registered("test_plugin_l1", {"features": np.array([[1.0, -2.0]])}), [-3.0])
    with pytest.raises(ValueError, match="already registered"):
        ood_score("x", "y.", reads=("features",), name="test_plugin_l1")(lambda a, f=None: a)


def test_the_need_constants_are_needs_the_store_declares():
    """FEATURES and LOGITS (the needs analysis words its rerun hints by) are needs that the
    store's Predictions record declares, with the arrays that provide them."""
    from bench.scores.record import FEATURES, LOGITS, NEEDS

    assert {FEATURES, LOGITS} <= set(NEEDS)
    assert NEEDS[LOGITS] and NEEDS[FEATURES]
