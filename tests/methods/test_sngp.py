"""methods/sngp.py: the random-feature GP head, its Laplace covariance, the mean-field
logits, the spectral normalisation of the residual branches, and the method end to end.

Expected values are written out here from the paper's equations in numpy (float64):
φ = s·cos(W·LN₀(h) + b), P = ridge·I + Σ φφᵀ, var = ridge·φᵀP⁻¹φ (an explicit matrix
inverse, not the layer's Cholesky), logits / √(1 + λ·var); spectral norms from
``torch.linalg.matrix_norm(ord=2)`` (an SVD), not from the layer's power iteration.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch.nn.utils import parametrize

from bench.core.errors import ConfigError
from bench.config.options import parse
from bench.core.registry import METHODS
from bench.config.spec import ModelConfig, TrainConfig
from bench.train.loop import fit, seed_everything
from methods.sngp import SNGP, RandomFeatureGP
from tests.helpers.suites import only_cell, run_in_process, tiny_suite
from tests.helpers.synthetic import squares_bundle

CPU = torch.device("cpu")
MODEL = ModelConfig(patch_size=5, dim=16, depth=2, heads=2, mlp_ratio=2.0, dropout=0.0)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data():
    return squares_bundle((150, 60, 60), 0)


def method(**options) -> SNGP:
    return SNGP(parse(SNGP.Options, options, "methods.sngp"))


# ----------------------------------------------------------------------------- reference


def ref_features(head: RandomFeatureGP, h: np.ndarray, normalize: bool, scale: float) -> np.ndarray:
    """φ(h) = scale · cos(W h̃ + b), h̃ the parameter-free LayerNorm of h (ε = 1e-6)."""
    if normalize:
        h = (h - h.mean(1, keepdims=True)) / np.sqrt(h.var(1, keepdims=True) + 1e-6)
    w, b = head.rff_weight.double().numpy(), head.rff_bias.double().numpy()
    return scale * np.cos(h @ w.T + b)


def ref_mean_field(head: RandomFeatureGP, train: list[np.ndarray], test: np.ndarray, ridge: float, lam: float,
                   normalize: bool, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(mean-field logits, var) of ``test`` after the precision saw the ``train`` batches."""
    m = head.rff_weight.shape[0]
    precision = ridge * np.eye(m)
    for batch in train:
        phi = ref_features(head, batch, normalize, scale)
        precision += phi.T @ phi
    cov = ridge * np.linalg.inv(precision)  # s·(s·I + Σ φφᵀ)⁻¹
    phi = ref_features(head, test, normalize, scale)
    var = np.einsum("bi,ij,bj->b", phi, cov, phi)
    beta, beta0 = head.output.weight.detach().double().numpy(), head.output.bias.detach().double().numpy()
    logits = phi @ beta.T + beta0
    return logits / np.sqrt(1.0 + lam * var)[:, None], var


# ----------------------------------------------------------------------------- the GP head


@pytest.mark.parametrize("normalize, scale_features, kernel_scale, ridge, lam",
                         [(True, False, None, 1.0, 20.0), (False, True, 1.5, 0.3, math.pi / 8)])
def test_mean_field_logits_and_laplace_covariance_match_the_equations(normalize, scale_features, kernel_scale, ridge, lam):
    torch.manual_seed(0)
    d, m, c = 6, 40, 3
    head = RandomFeatureGP(d, c, m, kernel_scale, scale_features, normalize, ridge, lam).double()
    head.reset_precision()  # as every epoch starts (the float32 buffer held ridge rounded to float32)
    with torch.no_grad():
        head.output.bias.copy_(torch.tensor([0.3, -0.2, 0.1]))
    rng = np.random.default_rng(1)
    train = [rng.normal(size=(16, d)) for _ in range(3)]
    test = np.concatenate([rng.normal(size=(5, d)), 4 + 3 * rng.normal(size=(5, d))])  # near and far from the data
    head.train()
    for batch in train:
        head(torch.from_numpy(batch))
    head.eval()
    with torch.no_grad():
        got = head(torch.from_numpy(test)).numpy()
        var = head.variance(head.features(torch.from_numpy(test))).numpy()
    scale = math.sqrt(2.0 / m) if scale_features else 1.0
    want, want_var = ref_mean_field(head, train, test, ridge, lam, normalize, scale)
    np.testing.assert_allclose(var, want_var, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert (want_var > 0).all() and not np.allclose(got, want * np.sqrt(1 + lam * want_var)[:, None])  # it adjusts


def test_precision_starts_at_the_ridge_and_resets():
    torch.manual_seed(0)
    head = RandomFeatureGP(4, 2, 8, ridge=0.5).double().train()
    torch.testing.assert_close(head.precision, 0.5 * torch.eye(8, dtype=torch.float64))
    head(torch.randn(10, 4, dtype=torch.float64))
    assert not torch.allclose(head.precision, 0.5 * torch.eye(8, dtype=torch.float64))
    head.reset_precision()
    torch.testing.assert_close(head.precision, 0.5 * torch.eye(8, dtype=torch.float64))


def test_random_features_are_fixed_and_drawn_as_vit_sngp():
    """W ~ N(0, 2/d) (edward2.jax's he-normal features), b ~ U(0, 2π), neither trained;
    with ``kernel_scale = ℓ``, W ~ N(0, 1/ℓ²)."""
    torch.manual_seed(0)
    head = RandomFeatureGP(50, 3, 4000)
    assert {n for n, _ in head.named_parameters()} == {"output.weight", "output.bias"}
    assert abs(float(head.rff_weight.var()) - 2 / 50) < 0.02 * 2 / 50
    assert 0 <= float(head.rff_bias.min()) and float(head.rff_bias.max()) <= 2 * math.pi
    assert abs(float(RandomFeatureGP(50, 3, 4000, kernel_scale=2.0).rff_weight.std()) - 0.5) < 0.01


# ----------------------------------------------------------------------------- spectral normalisation


def wrapped(model) -> set[str]:
    return {name for name, mod in model.named_modules() if parametrize.is_parametrized(mod, "weight")}


def test_spectral_norm_wraps_exactly_the_residual_branches_and_bounds_them(data):
    seed_everything(0)
    sngp = method(spectral_norm_bound=0.5)
    model = sngp.build_model(MODEL, data).train()
    assert wrapped(model) == {f"blocks.{i}.{n}" for i in range(MODEL.depth) for n in ("attn.proj", "mlp.0", "mlp.3")}
    x = torch.randn(4, 1, 10, 10)
    with torch.no_grad():
        for _ in range(50):  # power iterations on fixed weights: σ̂ converges to σ
            model(x)
    model.eval()
    for name in wrapped(model):
        linear = model.get_submodule(name)
        raw = linear.parametrizations.weight.original.detach()
        sigma = float(torch.linalg.matrix_norm(raw, ord=2))
        effective = linear.weight.detach()
        assert float(torch.linalg.matrix_norm(effective, ord=2)) <= 0.5 * (1 + 1e-4), name
        assert sigma > 0.5, "every raw weight exceeds the bound: the check is not vacuous"
        torch.testing.assert_close(effective, raw * (0.5 / sigma), rtol=1e-4, atol=1e-6)


def test_a_weight_within_the_bound_is_left_unchanged(data):
    seed_everything(0)
    model = method(spectral_norm_bound=100.0).build_model(MODEL, data).train()
    model(torch.randn(4, 1, 10, 10))
    for name in wrapped(model):
        linear = model.get_submodule(name)
        assert torch.equal(linear.weight, linear.parametrizations.weight.original), name


def test_without_spectral_norm_nothing_is_wrapped_and_other_attentions_are_refused(data):
    assert wrapped(method(spectral_norm=False).build_model(MODEL, data)) == set()
    kep = ModelConfig(patch_size=5, dim=16, depth=2, heads=2, attention="kep_svgp")
    with pytest.raises(ConfigError, match="output projection"):
        method().build_model(kep, data)


# ----------------------------------------------------------------------------- training


def head_inputs(model, x) -> torch.Tensor:
    """What the GP head receives (pooled, LayerNormed tokens) for images ``x``, in eval mode."""
    seen = []
    hook = model.head.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    model.eval()
    with torch.no_grad():
        model(x)
    hook.remove()
    return seen[0]


def test_fit_leaves_the_precision_of_the_last_epoch(data):
    """Only the output weights train (the features stay fixed): after two epochs P is
    ridge·I plus the features of one pass over the training set, not two."""
    from bench.train.loop import Normalize, to_tensor

    sngp = method(spectral_norm_bound=1e3, ridge=2.0)
    seed_everything(0)
    model = sngp.build_model(MODEL, data)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("head.output"))
    cfg = TrainConfig(epochs=2, batch_size=30, lr=1e-2, warmup_epochs=0, min_lr=0.0)  # 150 images: 5 whole batches
    at_epoch_end = []  # P after each epoch (before best-checkpoint selection)
    fit(sngp, model, data, cfg, CPU, seed=0, on_epoch=lambda _row: at_epoch_end.append(model.head.precision.clone()))
    x = Normalize(data, CPU)(to_tensor(data.get("train"), CPU)[0])
    phi = model.head.features(head_inputs(model, x)).double()
    want = 2.0 * torch.eye(1024, dtype=torch.float64) + phi.T @ phi
    assert len(at_epoch_end) == 2
    for precision in (*at_epoch_end, model.head.precision):  # the kept checkpoint's too
        torch.testing.assert_close(precision.double(), want, rtol=1e-4, atol=1e-3)


def test_options_defaults_are_vit_sngp_and_validate():
    o = SNGP.Options()
    assert (o.random_features, o.kernel_scale, o.scale_features, o.normalize_input, o.ridge, o.mean_field_factor,
            o.spectral_norm_bound, o.spectral_norm_iterations) == (1024, None, False, True, 1.0, 20.0, 0.95, 1)
    assert METHODS.get("sngp") is SNGP and SNGP(o).samples == 1
    for bad in ({"ridge": 0.0}, {"random_features": 0}, {"mean_field_factor": -1.0}, {"spectral_norm_bound": 0.0}):
        with pytest.raises(ConfigError):
            parse(SNGP.Options, bad, "methods.sngp")
    assert any("pi" in line or "mean-field" in line for line in method(mean_field_factor=math.pi / 8).deviations())


def test_trains_through_the_cli_with_predictions_and_its_parameter_count(tmp_path, capsys):
    from bench.run.cli import main

    suite = tiny_suite("hard", methods="[methods.sngp]\nrandom_features = 128\n")
    code, err = run_in_process(tmp_path, suite=suite, capsys=capsys)
    assert code == 0, err
    cell, info = only_cell(tmp_path / "results" / "hard")
    assert info["status"] == "complete" and info["method"] == "sngp"
    preds = np.load(cell / "preds" / "test.npz", allow_pickle=False)
    assert preds["log_probs"].shape == (64, 10) and np.isfinite(preds["log_probs"]).all()
    # parameters = the model's (the head: 128 x 10 weights + 10 biases in place of 16 x 10 + 10)
    params = info["parameters"]
    efficiency = (tmp_path / "reports" / "hard" / "tables" / "efficiency.csv").read_text().splitlines()
    row = next(line for line in efficiency if ",sngp," in line)
    assert f",{params}," in row
    # no feature scores: the report says why (its readout is not a Linear), not "rerun with features on"
    unscored = pd.read_csv(tmp_path / "reports" / "hard" / "analysis" / "unscored.csv")
    assert set(unscored["score"]) >= {"mahalanobis", "knn", "vim"}
    assert all("(RandomFeatureGP) is not a Linear layer" in r and "rerun" not in r for r in unscored["reason"]), unscored
    assert main(["list"]) == 0
    assert "sngp" in capsys.readouterr().out


def test_cifar_suites_run_sngp_with_the_vit_sngp_settings():
    import datasets  # noqa: F401  (the suites' data sets)
    from bench.config.spec import load_suite

    for name in ("cifar10", "cifar100"):
        (m,) = [m for m in load_suite(name).methods if m.type == "sngp"]
        assert m.options == SNGP.Options(), name  # the defaults are those settings, written out in the file
