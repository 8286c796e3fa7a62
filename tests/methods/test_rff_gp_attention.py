"""methods/rff_gp_attention.py: the random-feature GP attention layer and its method.

The reference below writes out the official layer's equations (``SGP_LAYER`` of
amirMahfoozi/Random-Feature-Gaussian-Process-Attention ``CIFAR-Dataset/sgp_layer_rff.py``)
head by head in numpy float64, with explicit matrix inverses and log-determinants where
the layer uses Cholesky factors and triangular solves.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench.config.options import parse
from bench.core.registry import ATTENTIONS, METHODS
from bench.config.spec import ModelConfig, TrainConfig
from bench.train.loop import fit, predict, seed_everything
from bench.train.vit import make_attention
from methods.rff_gp_attention import RFFGPAttention, RFFGPAttentionMethod, orthonormal_columns
from tests.helpers.suites import only_cell, run_in_process, tiny_suite
from tests.helpers.synthetic import squares_bundle

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_layer(seed: int = 0, **kw) -> RFFGPAttention:
    """A float64 layer (dim 8, 2 heads) with its GP hyperparameters moved off their init."""
    torch.manual_seed(seed)
    kw = {"features": 3, **kw}
    layer = make_attention(ModelConfig(dim=8, heads=2, dropout=0.0), 5, ("rff_gp", kw)).double().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        layer.log_sf.copy_(0.3 * torch.randn(layer.log_sf.shape, generator=g, dtype=torch.float64))
        layer.log_ls.copy_(0.3 * torch.randn(layer.log_ls.shape, generator=g, dtype=torch.float64))
        layer.log_sigma2.fill_(-1.3)
    return layer


def reference(layer: RFFGPAttention, x: np.ndarray, eps: np.ndarray, jitter: float = 1e-6):
    """(output, mean [B, H, N, D], var [B, H, N], KL) of the official equations."""
    b, n, c = x.shape
    h, d, half = layer.heads, layer.head_dim, layer.features
    m = 2 * half
    qv = x @ layer.qv.weight.detach().double().numpy().T  # [B, N, 2C]
    omega0, phase = layer.omega.double().numpy(), layer.phase.double().numpy()
    sf, ls = np.exp(layer.log_sf.detach().double().numpy()), np.exp(layer.log_ls.detach().double().numpy())
    sigma2 = math.exp(float(layer.log_sigma2.detach()))
    scale = math.sqrt(2.0) if layer.kernel == "ard" else 1.0
    mean, var, kl = np.zeros((b, h, n, d)), np.zeros((b, h, n)), np.zeros((b, h))
    for bb in range(b):
        for hh in range(h):
            q = qv[bb, :, hh * 2 * d : hh * 2 * d + d]  # head hh's [q_h; v_h] block of fc_qv
            v = qv[bb, :, hh * 2 * d + d : (hh + 1) * 2 * d]
            omega = omega0[hh] * (scale / ls[hh])[:, None]  # [D, M/2]
            z = q @ omega + phase[hh]
            phi = math.sqrt(sf[hh, 0]) * np.concatenate([np.cos(z), np.sin(z)], axis=1) / math.sqrt(m)  # [N, M]
            a = phi.T @ phi + (sigma2 + jitter) * np.eye(m)
            a_inv = np.linalg.inv(a)
            w_star = a_inv @ phi.T @ v  # [M, D]
            mean[bb, hh] = phi @ w_star
            var[bb, hh] = sigma2 * np.einsum("ni,ij,nj->n", phi, a_inv, phi)
            kl[bb, hh] = 0.5 * (d * sigma2 * np.trace(a_inv) + (w_star**2).sum() - m * d
                                - d * (m * math.log(sigma2) - np.linalg.slogdet(a)[1]))
    sample = mean + np.sqrt(var)[..., None] * eps  # [B, H, N, D]
    merged = sample.transpose(0, 2, 1, 3).reshape(b, n, c)  # heads concatenated
    w_o, b_o = layer.proj.weight.detach().double().numpy(), layer.proj.bias.detach().double().numpy()
    return merged @ w_o.T + b_o, mean, var, kl.sum(1).mean()


@pytest.mark.parametrize("kernel, features", [("ard", 3), ("exponential", 3), ("ard", 6)])  # 6 > D = 4: stacked blocks
def test_output_posterior_and_kl_match_the_official_equations(kernel, features):
    layer = make_layer(kernel=kernel, features=features)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 5, 8))
    eps = rng.normal(size=(3, 2, 5, 4))
    want_out, want_mean, want_var, want_kl = reference(layer, x, eps)
    xt = torch.from_numpy(x)
    with torch.no_grad():
        mean, var, kl, _ = layer.posterior(xt)
        out = layer(xt, eps=torch.from_numpy(eps))
        layer.sample = False
        out_mean = layer(xt)
    np.testing.assert_allclose(mean.numpy(), want_mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(var[..., 0].numpy(), want_var, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(float(kl), want_kl, rtol=1e-8)
    np.testing.assert_allclose(out.numpy(), want_out, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(out_mean.numpy(), reference(layer, x, 0 * eps)[0], rtol=1e-8, atol=1e-10)
    assert (want_var > 1e-3).all()  # the noise term is not negligible: the sample check can fail


def test_training_forward_adds_the_weighted_kl_and_eval_adds_none():
    layer = make_layer(kl_weight=0.5).train()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    layer(x)
    with torch.no_grad():
        _, _, kl, _ = layer.posterior(x)
    torch.testing.assert_close(layer.extra_loss(), 0.5 * kl)
    layer.anneal_weight = 0.25
    torch.testing.assert_close(layer.extra_loss(), 0.125 * kl)
    assert set(layer.loss_terms()) == {"kl"}
    layer.eval()
    layer(x)
    assert layer.extra_loss() is None and layer.loss_terms() == {}


def test_random_features_are_fixed_orthonormal_columns_and_uniform_phases():
    torch.manual_seed(0)
    omega = orthonormal_columns(3, 8, 5)
    for block in omega:
        torch.testing.assert_close(block.T @ block, torch.eye(5), atol=1e-6, rtol=0)
    wide = orthonormal_columns(1, 4, 10)[0]  # more columns than rows: 4x4 orthogonal blocks
    assert wide.shape == (4, 10)
    torch.testing.assert_close(wide[:, :4].T @ wide[:, :4], torch.eye(4), atol=1e-6, rtol=0)
    torch.testing.assert_close(wide[:, 4:8].T @ wide[:, 4:8], torch.eye(4), atol=1e-6, rtol=0)
    layer = make_layer()
    assert {n for n, _ in layer.named_buffers()} == {"omega", "phase"}
    assert {n for n, _ in layer.named_parameters()} == {"qv.weight", "proj.weight", "proj.bias", "log_sf", "log_ls",
                                                        "log_sigma2"}
    assert ATTENTIONS.get("rff_gp") is RFFGPAttention and RFFGPAttention.stochastic


def test_cost_is_linear_in_tokens_the_feature_system_is_m_by_m():
    """A (the only matrix inverted) is M x M whatever N; N = 1 and N = 300 tokens both run."""
    layer = make_layer(features=3)
    for n in (1, 300):
        x = torch.randn(1, n, 8, dtype=torch.float64)
        with torch.no_grad():
            mean, var, kl, _ = layer.posterior(x)
        assert mean.shape == (1, 2, n, 4) and torch.isfinite(kl)


# ----------------------------------------------------------------------------- the method


@pytest.fixture(scope="module")
def data():
    return squares_bundle((150, 60, 60), 0)


def test_method_puts_the_layer_in_every_block_and_predicts_with_ten_passes(data):
    o = RFFGPAttentionMethod.Options()
    assert (o.samples, o.average, o.features, o.kernel, o.jitter, o.kl_weight, o.kl_anneal) == (
        10, "probs", 16, "ard", 1e-6, 1.0, False)
    method = RFFGPAttentionMethod(parse(RFFGPAttentionMethod.Options, {"features": 4}))
    assert METHODS.get("rff_gp_attention") is RFFGPAttentionMethod
    cfg = ModelConfig(patch_size=5, dim=16, depth=2, heads=2, mlp_ratio=1.0)
    seed_everything(0)
    model = method.build_model(cfg, data)
    assert all(isinstance(b.attn, RFFGPAttention) and b.attn.features == 4 for b in model.blocks)
    method.eval_mode(model)
    assert model.deterministic_depth() == 0  # the first block samples: every pass runs the whole model
    x = torch.randn(3, 1, 10, 10)
    with torch.no_grad():
        assert not torch.equal(model(x), model(x))  # stochastic in eval mode


def test_kl_annealing_ramps_over_the_first_half_of_training(data):
    method = RFFGPAttentionMethod(parse(RFFGPAttentionMethod.Options, {"kl_anneal": True, "features": 2}))
    model = method.build_model(ModelConfig(patch_size=5, dim=16, depth=2, heads=2), data)
    method.on_train_step(model, 5, 20)
    assert {b.attn.anneal_weight for b in model.blocks} == {0.5}
    method.on_train_step(model, 15, 20)
    assert {b.attn.anneal_weight for b in model.blocks} == {1.0}


def test_fit_and_predict_two_epochs(data):
    method = RFFGPAttentionMethod(parse(RFFGPAttentionMethod.Options, {"features": 4, "samples": 3}))
    seed_everything(0)
    model = method.build_model(ModelConfig(patch_size=5, dim=16, depth=2, heads=2), data)
    cfg = TrainConfig(epochs=2, batch_size=30, lr=1e-3, warmup_epochs=0, min_lr=0.0)
    result = fit(method, model, data, cfg, CPU, seed=0)
    assert all(np.isfinite(row["train_loss"]) and row["kl"] > 0 for row in result.log)
    lp = predict(method, model, data.get("test"), data, CPU, 64).log_probs
    assert lp.shape == (60, 3) and np.isfinite(lp).all()


def test_trains_through_the_cli_with_predictions_and_its_parameter_count(tmp_path, capsys):
    from bench.run.cli import main

    suite = tiny_suite("hard", methods="[methods.rff_gp_attention]\nfeatures = 4\nsamples = 2\n")
    code, err = run_in_process(tmp_path, suite=suite, capsys=capsys)
    assert code == 0, err
    cell, info = only_cell(tmp_path / "results" / "hard")
    assert info["status"] == "complete" and info["samples"] == 2
    preds = np.load(cell / "preds" / "test.npz", allow_pickle=False)
    assert preds["log_probs"].shape == (64, 10) and np.isfinite(preds["log_probs"]).all()
    assert "entropy_of_mean" in preds  # several passes: the decomposition terms are stored
    efficiency = (tmp_path / "reports" / "hard" / "tables" / "efficiency.csv").read_text().splitlines()
    row = next(line for line in efficiency if ",rff_gp_attention," in line)
    assert f",{info['parameters']}," in row
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "rff_gp_attention" in out and "rff_gp" in out.replace("rff_gp_attention", "")


def test_cifar_suites_run_it_with_the_official_settings_and_sgpa_annealing():
    import datasets  # noqa: F401  (the suites' data sets)
    from bench.config.spec import load_suite

    for name in ("cifar10", "cifar100"):
        (m,) = [m for m in load_suite(name).methods if m.type == "rff_gp_attention"]
        o = m.options
        assert (o.features, o.kernel, o.jitter, o.kl_weight, o.kl_anneal, o.samples, o.average) == (
            16, "ard", 1e-6, 1.0, True, 10, "probs"), name
