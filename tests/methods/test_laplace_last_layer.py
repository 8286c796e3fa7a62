"""methods/laplace_last_layer.py: the GGN and its KFAC, the evidence and its maximiser,
the logit covariance, the probit and Monte-Carlo predictives, and the method end to end.

Expected values come from independent computations: the Hessian of Σ CE in the head's
parameters by ``torch.autograd.functional.hessian``; the evidence from a dense
``slogdet(H + δI)`` and its maximum by ``scipy.optimize.minimize_scalar``; the logit
covariance from sampled parameters θ ~ N(θ*, Σ); the probit's constant from Monte Carlo.
Where ``laplace-torch`` imports (not in our environment: it needs torchvision), its
FullLLLaplace is compared too.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import minimize_scalar

from bench.core.errors import ConfigError
from bench.config.options import parse
from bench.core.registry import METHODS
from methods.laplace_last_layer import (LaplaceHead, LastLayerLaplace, augmented, evidence_maximiser, ggn_full,
                                        kron_factors, probit)
from tests.helpers.suites import run_in_process, tiny_suite

pytestmark = pytest.mark.usefixtures("one_torch_thread")
D64 = torch.float64


def problem(n=40, d=3, c=4, seed=0, scale=1.0):
    """A trained-looking linear head on random features: (linear, φ, labels)."""
    g = torch.Generator().manual_seed(seed)
    phi = scale * torch.randn(n, d, generator=g, dtype=D64)
    lin = torch.nn.Linear(d, c).double()
    with torch.no_grad():
        lin.weight.copy_(torch.randn(c, d, generator=g, dtype=D64))
        lin.bias.copy_(0.5 * torch.randn(c, generator=g, dtype=D64))
    y = (phi @ lin.weight.detach().T + lin.bias.detach() + 0.7 * torch.randn(n, c, generator=g, dtype=D64)).argmax(1)
    return lin, phi, y


def autograd_hessian(lin, phi, y) -> torch.Tensor:
    """∂²/∂θ² Σ_n CE(W φ_n + b, y_n) at θ = vec_row([W b]), by autograd."""
    c, d = lin.weight.shape
    theta = torch.cat([lin.weight.detach(), lin.bias.detach()[:, None]], 1).reshape(-1)

    def loss(t):
        wb = t.view(c, d + 1)
        return F.cross_entropy(phi @ wb[:, :d].T + wb[:, d], y, reduction="sum")

    return torch.autograd.functional.hessian(loss, theta)


def dense_precision(head: LaplaceHead, phi, y, hessian: str) -> tuple[torch.Tensor, float]:
    """(H or G ⊗ A, log-likelihood) from the definitions, with loops over the data."""
    c = head.linear.out_features
    a = augmented(phi)
    p = torch.softmax(a @ head.theta().view(c, -1).T, 1)
    if hessian == "full":
        h = sum(torch.kron(torch.diag(pn) - torch.outer(pn, pn), torch.outer(an, an)) for an, pn in zip(a, p))
    else:
        g = sum(torch.diag(pn) - torch.outer(pn, pn) for pn in p)
        h = torch.kron(g, sum(torch.outer(an, an) for an in a) / len(a))
    return h, float(torch.log(p[torch.arange(len(y)), y]).sum())


# ----------------------------------------------------------------------------- curvature


def test_ggn_is_the_autograd_hessian_of_the_cross_entropy():
    lin, phi, y = problem(n=7, d=3, c=4)
    a, p = augmented(phi), torch.softmax(lin(phi), 1).detach()
    torch.testing.assert_close(ggn_full(a, p), autograd_hessian(lin, phi, y), rtol=1e-10, atol=1e-12)


def test_kron_factors_are_exact_when_the_features_are_shared_and_sum_as_defined():
    lin, phi, y = problem(n=9, d=3, c=4)
    same = phi[:1].repeat(9, 1)  # every a_n the same: KFAC = GGN
    a, p = augmented(same), torch.softmax(lin(same) + torch.randn(9, 4, dtype=D64), 1).detach()
    g, fa = kron_factors(a, p)
    torch.testing.assert_close(torch.kron(g, fa), ggn_full(a, p), rtol=1e-10, atol=1e-12)
    a, p = augmented(phi), torch.softmax(lin(phi), 1).detach()
    g, fa = kron_factors(a, p)
    torch.testing.assert_close(g, sum(torch.diag(q) - torch.outer(q, q) for q in p), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fa, sum(torch.outer(r, r) for r in a) / 9, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- evidence


@pytest.mark.parametrize("hessian", ["full", "kron"])
def test_evidence_and_its_maximiser_match_a_dense_computation_and_scipy(hessian):
    lin, phi, y = problem(n=60, d=3, c=3, seed=1)
    head = LaplaceHead(lin, hessian)
    head.fit(phi, y)
    h, log_lik = dense_precision(head, phi, y, hessian)
    theta = head.theta()
    n_params = len(theta)

    def dense_evidence(delta):  # log p(y|θ*) + log N(θ*; 0, δ⁻¹I) + P/2 log 2π − ½ log det(H + δI)
        log_prior = 0.5 * n_params * math.log(delta / (2 * math.pi)) - 0.5 * delta * float(theta @ theta)
        return log_lik + log_prior + 0.5 * n_params * math.log(2 * math.pi) - 0.5 * float(
            torch.linalg.slogdet(h + delta * torch.eye(n_params, dtype=D64))[1])

    assert head.log_evidence == pytest.approx(dense_evidence(head.prior_precision), rel=1e-10)
    res = minimize_scalar(lambda t: -dense_evidence(math.exp(t)), bounds=(-10, 10), method="bounded",
                          options={"xatol": 1e-10})
    assert head.prior_precision == pytest.approx(math.exp(res.x), rel=1e-4)
    assert head.log_evidence >= dense_evidence(math.exp(res.x)) - 1e-9
    # the posterior covariance is (H + δI)⁻¹ in the predictive: the logit covariance of input x
    x = torch.randn(5, 3, dtype=D64)
    cov = torch.linalg.inv(h + head.prior_precision * torch.eye(n_params, dtype=D64))
    jac = torch.stack([torch.kron(torch.eye(3, dtype=D64), ax[None, :]) for ax in augmented(x)])  # [B, C, P]
    _, got = head.logit_distribution(x)
    torch.testing.assert_close(got.double(), jac @ cov @ jac.transpose(1, 2), rtol=1e-4, atol=1e-6)


def test_a_given_prior_precision_is_used_and_extreme_roots_are_clipped():
    lin, phi, y = problem(seed=2)
    head = LaplaceHead(lin, "full")
    head.fit(phi, y, prior_precision=3.5)
    assert head.prior_precision == 3.5
    assert evidence_maximiser(np.array([1.0, 2.0]), theta_sq=0.0) == 1e12  # ‖θ‖ = 0: δ → ∞
    assert evidence_maximiser(np.array([1.0, 2.0]), theta_sq=1e30) == 1e-12


def test_logit_covariance_matches_sampled_parameters():
    """S = J Σ Jᵀ against the sample covariance of the logits of θ ~ N(θ*, Σ)."""
    lin, phi, y = problem(n=30, d=2, c=3, seed=3)
    head = LaplaceHead(lin, "full")
    head.fit(phi, y, prior_precision=0.5)
    h, _ = dense_precision(head, phi, y, "full")
    cov = torch.linalg.inv(h + 0.5 * torch.eye(len(h), dtype=D64))
    g = torch.Generator().manual_seed(0)
    thetas = head.theta() + torch.randn(200_000, len(h), generator=g, dtype=D64) @ torch.linalg.cholesky(cov).T
    x = torch.randn(2, 2, generator=g, dtype=D64)
    logits = torch.einsum("spd,bd->sbp", thetas.view(-1, 3, 3), augmented(x))  # [S, B, C]
    mean, s = head.logit_distribution(x)
    centred = logits - logits.mean(0)
    torch.testing.assert_close(mean.double(), logits.mean(0), rtol=0, atol=0.02)
    torch.testing.assert_close(s.double(), torch.einsum("sbc,sbk->bck", centred, centred) / len(thetas), rtol=0.03,
                               atol=2e-3)


# ----------------------------------------------------------------------------- predictives


def test_probit_is_the_pi_over_8_scaling_and_matches_monte_carlo_for_two_classes():
    mean, var = torch.tensor([[2.0, 0.0], [-1.0, 0.0]], dtype=D64), torch.tensor([[4.0, 0.0], [9.0, 0.0]], dtype=D64)
    torch.testing.assert_close(probit(mean, var), mean / torch.sqrt(1 + math.pi / 8 * var))
    g = torch.Generator().manual_seed(0)
    f = mean[:, 0] + var[:, 0].sqrt() * torch.randn(400_000, 2, generator=g, dtype=D64)
    mc = torch.sigmoid(f).mean(0)  # E[softmax([f, 0])_0]
    got = torch.softmax(probit(mean, var), 1)[:, 0]
    torch.testing.assert_close(got, mc, rtol=0, atol=0.01)  # the probit approximation's own error is < 0.01 here


def test_head_probit_and_monte_carlo_outputs():
    lin, phi, y = problem(n=50, d=3, c=3, seed=4)
    x = torch.randn(4, 3, dtype=D64)
    probit_head = LaplaceHead(lin, "kron")
    probit_head.fit(phi, y, prior_precision=0.3)
    mean, cov = probit_head.logit_distribution(x)
    torch.testing.assert_close(probit_head(x), mean / torch.sqrt(1 + math.pi / 8 * torch.diagonal(cov, dim1=1, dim2=2)))
    assert not probit_head.stochastic
    mc_head = LaplaceHead(lin, "kron", link="mc")
    mc_head.fit(phi, y, prior_precision=0.3)
    assert mc_head.stochastic
    torch.manual_seed(0)
    draws = mc_head(x.repeat(20_000, 1)).double().unflatten(0, (20_000, 4))  # [S, B, C]: one draw per row
    centred = draws - draws.mean(0)
    torch.testing.assert_close(draws.mean(0), mean.double(), rtol=0, atol=0.05)
    torch.testing.assert_close(torch.einsum("sbc,sbk->bck", centred, centred) / len(draws), cov.double(), rtol=0.05,
                               atol=0.01)


def test_unfitted_head_is_the_linear_layer():
    lin, phi, _ = problem()
    torch.testing.assert_close(LaplaceHead(lin)(phi), lin(phi))


# ----------------------------------------------------------------------------- laplace-torch


@pytest.mark.parametrize("hessian", ["full"])
def test_agrees_with_laplace_torch_where_it_imports(hessian):
    laplace = pytest.importorskip("laplace")
    from torch.utils.data import DataLoader, TensorDataset

    lin, phi, y = problem(n=64, d=3, c=3, seed=5)
    model = torch.nn.Sequential(torch.nn.Identity(), lin)
    la = laplace.Laplace(model, "classification", subset_of_weights="last_layer", hessian_structure=hessian)
    la.fit(DataLoader(TensorDataset(phi, y), batch_size=64))
    head = LaplaceHead(lin, hessian)
    head.fit(phi, y, prior_precision=1.0)
    la.prior_precision = 1.0
    assert head.log_evidence == pytest.approx(float(la.log_marginal_likelihood()), rel=1e-6)
    x = torch.randn(5, 3, dtype=D64)
    torch.testing.assert_close(torch.softmax(head(x), 1).double(), la(x, link_approx="probit").double(), rtol=1e-4,
                               atol=1e-5)


# ----------------------------------------------------------------------------- the method


def method(**options) -> LastLayerLaplace:
    return LastLayerLaplace(parse(LastLayerLaplace.Options, options, "methods.laplace_last_layer"))


def test_options_defaults_are_laplace_redux_and_validate():
    o = LastLayerLaplace.Options()
    assert (o.hessian, o.prior_precision, o.link, o.fit_images) == ("kron", None, "probit", None)
    assert METHODS.get("laplace_last_layer") is LastLayerLaplace
    assert method().samples == 1 and method(link="mc", samples=7).samples == 7
    for bad in ({"hessian": "diag"}, {"prior_precision": 0.0}, {"link": "laplace"}, {"samples": 0}):
        with pytest.raises(ConfigError):
            parse(LastLayerLaplace.Options, bad, "methods.laplace_last_layer")
    assert any("full GGN" in line for line in method(hessian="full").deviations())


def test_trains_predicts_and_reports_through_the_cli(tmp_path, capsys):
    suite = tiny_suite("hard", methods="[methods.msp]\n[methods.laplace_last_layer]\n"
                                       "[methods.la_mc]\ntype = \"laplace_last_layer\"\nhessian = \"full\"\n"
                                       "link = \"mc\"\nsamples = 8\nfit_images = 100\n"
                                       "[methods.la_msp]\ntype = \"laplace_last_layer\"\nbase = \"msp\"\n")
    code, err = run_in_process(tmp_path, suite=suite, capsys=capsys)
    assert code == 0, err
    store = tmp_path / "results" / "hard"
    cells = {}
    for cell in store.iterdir():
        if (cell / "cell.json").is_file():
            info = json.loads((cell / "cell.json").read_text())
            cells[info["method"]] = (cell, info)
    assert sorted(cells) == ["la_mc", "la_msp", "laplace_last_layer", "msp"]
    lp = {k: np.load(cell / "preds" / "test.npz")["log_probs"] for k, (cell, _) in cells.items()}
    for k, v in lp.items():
        assert v.shape == (64, 10) and np.isfinite(v).all(), k
    # the same MAP network as msp (same recipe and seed), with a different predictive
    ckpt = {k: torch.load(cells[k][0] / "checkpoint.pt", weights_only=True) for k in cells}
    for k in ("laplace_last_layer", "la_mc"):
        assert ckpt[k].keys() == ckpt["msp"].keys() and all(torch.equal(ckpt[k][n], ckpt["msp"][n]) for n in ckpt[k])
    assert np.abs(lp["laplace_last_layer"] - lp["msp"]).max() > 1e-3
    # probit shrinks every logit towards 0: less confident on average than the MAP net
    assert np.exp(lp["laplace_last_layer"]).max(1).mean() < np.exp(lp["msp"]).max(1).mean()
    assert "entropy_of_mean" in np.load(cells["la_mc"][0] / "preds" / "test.npz")  # 8 passes: the decomposition
    # base = "msp": msp's stored network, not retrained, so the same posterior and predictions
    (la_msp, info), msp_info = cells["la_msp"], cells["msp"][1]
    assert info["stage1"]["reused"] and info["stage1"]["key"] == msp_info["key"]
    assert info["train_seconds"] == 0 and not (la_msp / "train_log.csv").exists()
    assert (info["best_epoch"], info["best_val_acc"]) == (msp_info["best_epoch"], msp_info["best_val_acc"])
    assert all(torch.equal(ckpt["la_msp"][n], ckpt["msp"][n]) for n in ckpt["msp"])
    np.testing.assert_allclose(lp["la_msp"], lp["laplace_last_layer"], rtol=0, atol=1e-6)
    efficiency = pd.read_csv(tmp_path / "reports" / "hard" / "tables" / "efficiency.csv").set_index("method")
    for k in ("laplace_last_layer", "la_mc", "la_msp"):
        assert efficiency.loc[k, "parameters"] == cells[k][1]["parameters"] == msp_info["parameters"]
    # its training time is msp's, counted as its stage 1
    assert efficiency.loc["la_msp", "train_seconds"] == pytest.approx(
        np.mean([json.loads((c / "cell.json").read_text())["train_seconds"] for c in store.iterdir()
                 if (c / "cell.json").is_file() and json.loads((c / "cell.json").read_text())["method"] == "msp"]))


def test_cifar_suites_run_it_with_the_laplace_redux_setting():
    import datasets  # noqa: F401  (the suites' data sets)
    from bench.config.spec import load_suite

    for name in ("cifar10", "cifar100"):
        (m,) = [m for m in load_suite(name).methods if m.type == "laplace_last_layer"]
        # the defaults are that setting, written out, on msp's network of the same seed
        assert m.options == LastLayerLaplace.Options(base="msp"), name


def test_a_post_hoc_laplace_with_another_network_than_its_stage1_is_a_config_error():
    import tomllib

    from bench.config.spec import build_suite

    ok = "[methods.msp]\n[methods.laplace_last_layer]\nbase = \"msp\"\n"
    build_suite(tomllib.loads(tiny_suite("hard", methods=ok)))
    bad = ok + "[methods.laplace_last_layer.model]\ndim = 32\n"
    with pytest.raises(ConfigError, match=r"methods\.laplace_last_layer\.model: .*its base 'msp'"):
        build_suite(tomllib.loads(tiny_suite("hard", methods=bad)))
    # without base it trains its own network, which may differ from msp's
    own = "[methods.msp]\n[methods.laplace_last_layer]\n[methods.laplace_last_layer.model]\ndim = 32\n"
    build_suite(tomllib.loads(tiny_suite("hard", methods=own)))
