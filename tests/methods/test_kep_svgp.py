"""methods/kep_svgp.py: the KEP-SVGP attention layer, its regularisers and the methods.

Expected values are recomputed here from the equations of the reference
(``docs/reference/kep_svgp_and_sgpa.md`` §2-3) with plain per-head loops in float64,
from ``torch.distributions`` (clean KL), or from empirical moments of many samples.
Everything is tiny and runs on CPU.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.distributions import MultivariateNormal, kl_divergence

from bench.data import DataBundle
from bench.core.errors import ConfigError
from bench.config.options import parse
from bench.core.registry import ATTENTIONS, METHODS
from bench.config.spec import ModelConfig, TrainConfig
from bench.train.loop import fit, predict, seed_everything
from bench.train.vit import SoftmaxAttention
from methods.kep_svgp import KEPSVGP, KEPSVGPAttention, KEPSVGPEnsemble
from tests.helpers.synthetic import squares_bundle

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_layer(seed: int = 0, **kw) -> KEPSVGPAttention:
    torch.manual_seed(seed)
    kw = {"dim": 8, "heads": 2, "n_tokens": 5, "rank": 3, "rank_multi": 4, **kw}
    return KEPSVGPAttention(**kw).double()


# ----------------------------------------------------------------------------- reference


def ref_L(layer: KEPSVGPAttention, hh: int) -> np.ndarray:
    """L[x, y, z] = exp(ℓ_S[x, y]) if y == z, T[x, y, z] if z < y, else 0 (head hh), loops."""
    ls = layer.log_s_diag.detach().double().numpy()[hh]
    t = layer.s_lower.detach().double().numpy()[hh]
    s = ls.shape[0]
    out = np.zeros((s, s, s))
    for x in range(s):
        for y in range(s):
            for z in range(s):
                out[x, y, z] = math.exp(ls[x, y]) if y == z else (t[x, y, z] if z < y else 0.0)
    return out


def ref_scores(layer: KEPSVGPAttention, x: torch.Tensor):
    """(e, r, A, μ, posterior-mean output) from the reference equations, head by head."""
    x = x.detach().double()
    b, n, c = x.shape
    h, s = layer.heads, layer.rank
    d = c // h
    w_qk = layer.qk.weight.detach().double()  # [2C, C]
    q_all, k_all = (x @ w_qk.T)[..., :c], (x @ w_qk.T)[..., c:]
    n_keep = layer.w_e.shape[1]  # N' (the W̃ shape is checked in test_output_shapes...)
    idx = list(range(n)) if n_keep == n else [(j * (n - 1)) // (n_keep - 1) for j in range(n_keep)]
    e = torch.zeros(b, h, n, s, dtype=torch.float64)
    r = torch.zeros_like(e)
    for bb in range(b):
        for hh in range(h):
            sl = slice(hh * d, (hh + 1) * d)
            q, k = q_all[bb, :, sl], k_all[bb, :, sl]  # [N, d]
            q = q / q.norm(dim=1, keepdim=True)
            k = k / k.norm(dim=1, keepdim=True)
            x_h = x[bb][idx][:, sl]  # [N', d]
            w_e = x_h.T @ layer.w_e.detach().double()[hh]  # [d, s]
            w_r = x_h.T @ layer.w_r.detach().double()[hh]
            e[bb, hh], r[bb, hh] = q @ w_e, k @ w_r
    d2 = torch.exp(2 * layer.log_lambda.detach().double())  # [h, s]
    m_u = layer.m_u.detach().double()
    wf, bf = layer.final_weight.weight.detach().double(), layer.final_weight.bias.detach().double()
    A, mu = [], []
    out = torch.zeros(b, n, c, dtype=torch.float64)
    for bb in range(b):
        A.append([]), mu.append([])
        for hh in range(h):
            if layer.merge == "add":
                a = (e[bb, hh] + r[bb, hh]) * d2[hh]
            else:
                a = torch.cat([e[bb, hh], r[bb, hh]], dim=0) * d2[hh]  # [2N, s]
            m = a @ m_u[hh]
            o = m @ wf.T + bf  # [N|2N, d]
            if layer.merge == "concat":
                o = layer.token_map.weight.detach().double() @ o + layer.token_map.bias.detach().double()[:, None]
            out[bb, :, hh * d : (hh + 1) * d] = o
            A[-1].append(a)
            mu[-1].append(m)
    return e, r, A, mu, out


def ref_faithful_kl(layer: KEPSVGPAttention) -> float:
    """The official KL (reference §3), with loops."""
    h, s = layer.heads, layer.rank
    ll = layer.log_lambda.detach().double().numpy()
    m = layer.m_u.detach().double().numpy()
    kl = 0.0
    for hh in range(h):
        L = ref_L(layer, hh)
        D = np.exp(ll[hh])
        for a in range(s):
            for i in range(s):
                for j in range(s):
                    kl += 0.5 * D[a] ** 4 * L[a, i, j] ** 2
        for j in range(s):
            kl += 0.5 * sum(m[hh, a, j] * D[a] ** 4 * m[hh, a, j] for a in range(s))
    kl -= layer.log_s_diag.detach().double().sum().item()
    kl -= 2 * s * ll.sum()
    kl -= 0.5 * s * s * h
    return kl


def ref_ksvd(layer: KEPSVGPAttention, e: torch.Tensor, r: torch.Tensor) -> float:
    """J = ½ mean_{b,h,n} ‖e_n D‖² + ½ mean ‖r_n D‖² − tr(mean_h W̃_eᵀ W̃_r), loops."""
    b, h, n, s = e.shape
    D = np.exp(layer.log_lambda.detach().double().numpy())
    e, r = e.numpy(), r.numpy()
    se = sr = 0.0
    for bb in range(b):
        for hh in range(h):
            for nn_ in range(n):
                se += sum((e[bb, hh, nn_, a] * D[hh, a]) ** 2 for a in range(s))
                sr += sum((r[bb, hh, nn_, a] * D[hh, a]) ** 2 for a in range(s))
    we, wr = layer.w_e.detach().double().numpy(), layer.w_r.detach().double().numpy()
    mean_mat = sum(we[hh].T @ wr[hh] for hh in range(h)) / h
    return 0.5 * se / (b * h * n) + 0.5 * sr / (b * h * n) - float(np.trace(mean_mat))


# ----------------------------------------------------------------------------- shapes, gradients


@pytest.mark.parametrize("merge", ["add", "concat"])
@pytest.mark.parametrize("n,rank,rank_multi,index", [(5, 3, 4, None), (16, 2, 2, [0, 5, 10, 15]), (7, 2, 2, [0, 2, 4, 6])])
def test_output_shapes_and_token_subsampling(merge, n, rank, rank_multi, index):
    layer = make_layer(n_tokens=n, rank=rank, rank_multi=rank_multi, merge=merge)
    out = layer(torch.randn(3, n, 8, dtype=torch.float64))
    assert out.shape == (3, n, 8)
    n_keep = n if index is None else len(index)
    assert layer.w_e.shape == layer.w_r.shape == (2, n_keep, rank)
    assert layer.m_u.shape == (2, rank, rank) and layer.s_lower.shape == (2, rank, rank, rank)
    assert (layer.token_index is None) == (index is None)
    if index is not None:
        assert layer.token_index.tolist() == index
    assert (layer.token_map is not None) == (merge == "concat")
    if merge == "concat":
        assert (layer.token_map.in_features, layer.token_map.out_features) == (2 * n, n)
    assert layer.eta_ksvd == (1.0 if merge == "add" else 10.0)
    with pytest.raises(ValueError, match="tokens"):
        layer(torch.randn(1, n + 1, 8, dtype=torch.float64))


def test_no_value_or_output_projection_and_registry():
    layer = make_layer()
    assert layer.qk.bias is None and layer.qk.weight.shape == (16, 8)
    names = {n for n, _ in layer.named_parameters()}
    assert names == {"qk.weight", "w_e", "w_r", "log_lambda", "m_u", "log_s_diag", "s_lower",
                     "final_weight.weight", "final_weight.bias"}
    assert ATTENTIONS.get("kep_svgp") is KEPSVGPAttention
    # W̃ orthogonal init: each head's flattened N'·s row has unit norm and rows are orthogonal
    w = layer.w_e.detach().reshape(2, -1)
    assert torch.allclose(w @ w.T, torch.eye(2, dtype=w.dtype), atol=1e-6)
    ll = layer.log_lambda.detach()
    assert (ll >= 0).all() and (ll <= 1).all()


@pytest.mark.parametrize("merge", ["add", "concat"])
@pytest.mark.parametrize("mode", ["faithful", "clean"])
def test_gradients_reach_every_parameter(merge, mode):
    layer = make_layer(n_tokens=6, rank=2, rank_multi=2, merge=merge, mode=mode)
    layer.train()
    out = layer(torch.randn(4, 6, 8, dtype=torch.float64))
    extra = layer.extra_loss()
    assert extra is not None
    (out.pow(2).sum() + extra).backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if name == "s_lower":  # only the strictly lower triangle (last two indices) is used
            below = torch.ones(2, 2).tril(-1).bool().expand_as(p.grad)
            assert p.grad[below].abs().sum() > 0 and (p.grad[~below] == 0).all()
        else:
            assert p.grad.abs().sum() > 0, name


# ----------------------------------------------------------------------------- posterior mean


@pytest.mark.parametrize("merge", ["add", "concat"])
@pytest.mark.parametrize("n,rank,rank_multi", [(5, 3, 4), (9, 2, 2)])
def test_posterior_mean_output_matches_reference(merge, n, rank, rank_multi):
    layer = make_layer(seed=1, n_tokens=n, rank=rank, rank_multi=rank_multi, merge=merge, dropout=0.5)
    layer.eval()  # dropout off
    layer.sample = False
    x = torch.randn(3, n, 8, dtype=torch.float64)
    *_, expected = ref_scores(layer, x)
    torch.testing.assert_close(layer(x), expected, rtol=1e-10, atol=1e-10)
    layer.sample = True
    assert not torch.allclose(layer(x), expected)  # sampling is on by default, in eval mode too


# ----------------------------------------------------------------------------- sampling covariance


def sampled_f(layer: KEPSVGPAttention, x1: torch.Tensor, m: int) -> torch.Tensor:
    """``m`` samples of f for one input (final_weight = identity, d = s): [m, N, h, s]."""
    with torch.no_grad():
        layer.final_weight.weight.copy_(torch.eye(layer.rank))
        layer.final_weight.bias.zero_()
    layer.eval()
    torch.manual_seed(123)
    with torch.no_grad():
        out = layer(x1.expand(m, -1, -1))  # the batch rows are independent draws
    return out.view(m, x1.shape[1], layer.heads, layer.rank)


def empirical_cov(f: torch.Tensor) -> torch.Tensor:
    fc = f - f.mean(0)
    return fc.T @ fc / (len(f) - 1)


def shrink_params(layer: KEPSVGPAttention) -> None:
    """Moderate scales so that no one direction dominates the covariance."""
    with torch.no_grad():
        layer.log_lambda.mul_(0.3)
        layer.log_s_diag.mul_(0.3)


@pytest.mark.parametrize("mode", ["faithful", "clean"])
def test_sample_covariance_per_token_matches_formula(mode):
    layer = make_layer(seed=2, dim=6, heads=2, n_tokens=3, rank=3, mode=mode)  # d = s = 3
    shrink_params(layer)
    x1 = torch.randn(1, 3, 6, dtype=torch.float64)
    f = sampled_f(layer, x1, 20000)
    _, _, A, mu, _ = ref_scores(layer, x1)
    s = layer.rank
    for hh in range(layer.heads):
        L = ref_L(layer, hh)
        for n in range(3):
            a = A[0][hh][n].numpy()
            if mode == "faithful":  # Σ[j, k] = Σ_i B[i, j] B[i, k], B[i, j] = Σ_a A[a] L[a, i, j]
                Bm = np.einsum("a,aij->ij", a, L)
                sigma = Bm.T @ Bm
            else:  # Σ = diag_j(A S_j Aᵀ), S_j = L_j L_jᵀ, L_j = L[j]
                sigma = np.diag([a @ L[j] @ L[j].T @ a for j in range(s)])
            emp = empirical_cov(f[:, n, hh]).numpy()
            scale = np.sqrt(np.outer(np.diag(sigma), np.diag(sigma)))
            assert (np.abs(emp - sigma) <= 0.06 * scale + 1e-9).all(), (mode, hh, n, emp, sigma)
            se_mean = np.sqrt(np.diag(sigma) / len(f))
            assert (np.abs(f[:, n, hh].mean(0).numpy() - mu[0][hh][n].numpy()) <= 5 * se_mean + 1e-9).all()
            if mode == "faithful":  # shared noise: output dims are correlated (clean: they are not)
                off = np.abs(sigma - np.diag(np.diag(sigma))) / scale
                assert off.max() > 0.2


@pytest.mark.parametrize("merge", ["add", "concat"])
@pytest.mark.parametrize("mode", ["faithful", "clean"])
def test_sample_with_fixed_noise_matches_reference(mode, merge):
    """f[n, j] = μ[n, j] + Σ_{a,i} A[n, a] L[a, i, j] ε[n, i]   (faithful: the official code
    contracts A with L's first index; one ε per token, shared by the output dims), or
    f[n, j] = μ[n, j] + Σ_{a,b} A[n, a] L_j[a, b] ε[n, j, b]    (clean: own noise per output
    dim); then final_weight (and the 2N → N token map for concat), per head, to 1e-5."""
    layer = make_layer(seed=5, n_tokens=5, rank=3, merge=merge, mode=mode)
    layer.eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    _, _, A, mu, _ = ref_scores(layer, x)
    rows = 5 if merge == "add" else 10
    shape = (2, 2, rows, 3) if mode == "faithful" else (2, 2, rows, 3, 3)
    eps = torch.randn(shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    wf, bf = layer.final_weight.weight.detach().double(), layer.final_weight.bias.detach().double()
    expected = torch.zeros(2, 5, 8, dtype=torch.float64)
    s = layer.rank
    for bb in range(2):
        for hh in range(2):
            L = torch.from_numpy(ref_L(layer, hh))
            a, f = A[bb][hh], mu[bb][hh].clone()  # [rows, s]
            for n in range(rows):
                for j in range(s):
                    for k in range(s):
                        for i in range(s):
                            if mode == "faithful":  # a = k (inducing feature), i = noise index
                                f[n, j] += a[n, k] * L[k, i, j] * eps[bb, hh, n, i]
                            else:  # L_j[a=k, b=i]
                                f[n, j] += a[n, k] * L[j, k, i] * eps[bb, hh, n, j, i]
            o = f @ wf.T + bf
            if merge == "concat":
                o = layer.token_map.weight.detach().double() @ o + layer.token_map.bias.detach().double()[:, None]
            expected[bb, :, hh * 4 : (hh + 1) * 4] = o
    with torch.no_grad():
        got = layer(x, eps=eps)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    layer.sample = False
    with torch.no_grad():
        assert (got - layer(x)).abs().max() > 1e-3  # the noise matters


# ----------------------------------------------------------------------------- KL


def test_faithful_kl_equals_official_formula():
    for seed in range(3):
        layer = make_layer(seed=seed, rank=3)
        assert layer.kl_divergence().item() == pytest.approx(ref_faithful_kl(layer), rel=1e-10)
    layer.train()
    layer(torch.randn(2, 5, 8, dtype=torch.float64))
    assert layer.last_kl.item() == pytest.approx(ref_faithful_kl(layer), rel=1e-10)


def clean_kl_torch(layer: KEPSVGPAttention) -> float:
    """Σ_{h,j} KL(N(m_j, L_j L_jᵀ) ‖ N(0, D^{-4})) by torch.distributions."""
    total = 0.0
    m = layer.m_u.detach().double()
    ll = layer.log_lambda.detach().double()
    for hh in range(layer.heads):
        L = torch.from_numpy(ref_L(layer, hh))
        prior = MultivariateNormal(torch.zeros(layer.rank, dtype=torch.float64), torch.diag(torch.exp(-4 * ll[hh])))
        for j in range(layer.rank):
            total += kl_divergence(MultivariateNormal(m[hh, :, j], scale_tril=L[j]), prior).item()
    return total


@pytest.mark.parametrize("seed,rank", [(0, 1), (1, 2), (2, 3), (3, 4)])
def test_clean_kl_equals_gaussian_kl(seed, rank):
    layer = make_layer(seed=seed, rank=rank, mode="clean")
    assert layer.kl_divergence().item() == pytest.approx(clean_kl_torch(layer), rel=1e-9)
    if rank > 1:  # the faithful formula weights another index of L by D⁴: the modes differ
        assert abs(ref_faithful_kl(layer) - clean_kl_torch(layer)) > 1e-6


# ----------------------------------------------------------------------------- KSVD and extra_loss


@pytest.mark.parametrize("merge", ["add", "concat"])
def test_ksvd_and_extra_loss_match_hand_computation(merge):
    layer = make_layer(seed=4, n_tokens=4, rank=2, rank_multi=1, merge=merge, eta_kl=0.5)  # N' = 2 < N
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    assert layer.extra_loss() is None  # no forward yet
    layer.train()
    layer(x)
    e, r, *_ = ref_scores(layer, x)
    j = ref_ksvd(layer, e, r)
    assert layer.last_ksvd.item() == pytest.approx(j, rel=1e-10)
    eta = 1.0 if merge == "add" else 10.0
    assert layer.extra_loss().item() == pytest.approx(eta * j**2 + 0.5 * ref_faithful_kl(layer), rel=1e-10)
    layer.eval()
    assert layer.extra_loss() is None
    layer(x)
    layer.train()
    assert layer.extra_loss() is None  # the last forward was in eval mode


# ----------------------------------------------------------------------------- methods


@pytest.fixture(scope="module")
def data() -> DataBundle:
    return squares_bundle((100, 40, 40))


CFG = ModelConfig(patch_size=5, dim=12, depth=3, heads=2, mlp_ratio=1.0, dropout=0.1)  # 4 tokens


def test_method_builds_vit_with_last_blocks_kep_svgp_and_adds_extra_losses(data):
    method = KEPSVGP(KEPSVGP.Options(rank=2, rank_multi=1, layers=2, samples=3))
    seed_everything(0)
    model = method.build_model(CFG, data)
    kinds = [type(b.attn) for b in model.blocks]
    assert kinds == [SoftmaxAttention, KEPSVGPAttention, KEPSVGPAttention]
    gp = [b.attn for b in model.blocks[1:]]
    assert all(layer.n_tokens == 4 and layer.rank == 2 and layer.w_e.shape == (2, 2, 2) for layer in gp)
    assert all(layer.token_index.tolist() == [0, 3] for layer in gp)
    assert method.samples == 3 and method.average == "logits"

    x = torch.randn(5, 1, 10, 10)
    y = torch.tensor([0, 1, 2, 0, 1])
    model.train()
    logits = model(x)
    loss = method.training_loss(model, logits, y)
    terms = [layer.eta_ksvd * layer.last_ksvd**2 + layer.eta_kl * layer.last_kl for layer in gp]
    for layer in gp:
        assert layer.last_kl.item() == pytest.approx(ref_faithful_kl(layer), rel=1e-5)
    expected = F.cross_entropy(logits, y) + sum(terms)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert abs(loss.item() - F.cross_entropy(logits, y).item()) > 1.0


def test_predictions_reproducible_for_a_seed_and_stochastic_in_eval(data):
    method = KEPSVGP(KEPSVGP.Options(rank=2, rank_multi=2, layers=1, samples=2, merge="concat", mode="clean"))
    seed_everything(0)
    model = method.build_model(CFG, data)
    test = data.get("test")

    def run(seed):
        torch.manual_seed(seed)
        return predict(method, model, test, data, CPU, 16).log_probs

    a, b, c = run(3), run(3), run(4)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)  # the GP layer samples in eval mode
    assert not model.training
    assert np.allclose(np.exp(a).sum(1), 1.0, atol=1e-5)


def test_layers_must_not_exceed_depth(data):
    method = KEPSVGP(KEPSVGP.Options(layers=4))
    with pytest.raises(ConfigError, match="depth"):
        method.build_model(CFG, data)
    every = KEPSVGP(KEPSVGP.Options(layers=3, rank=2))
    assert all(isinstance(b.attn, KEPSVGPAttention) for b in every.build_model(CFG, data).blocks)


def test_options_parse_and_validate():
    o = parse(KEPSVGP.Options, {"rank": 5, "merge": "concat", "mode": "clean", "eta_ksvd": 2})
    assert (o.rank, o.merge, o.mode, o.eta_ksvd, o.layers, o.samples, o.average) == (5, "concat", "clean", 2.0, 1, 10, "logits")
    assert parse(KEPSVGP.Options, {}).eta_ksvd is None
    for bad in ({"merge": "sum"}, {"mode": "exact"}, {"rank": 0}, {"layers": 0}, {"eta_kl": -1.0}, {"samples": 0}):
        with pytest.raises(ConfigError):
            parse(KEPSVGP.Options, bad)
    assert METHODS.get("kep_svgp") is KEPSVGP


def test_ensemble_defaults_to_kep_svgp_and_averages_members():
    cls = METHODS.get("kep_svgp_ensemble")
    assert cls is KEPSVGPEnsemble and cls.kind == "derived"
    opts = parse(cls.Options, {"members": 2})
    assert (opts.base, opts.members) == ("kep_svgp", 2)
    ens = cls(opts)
    assert ens.members_per_replicate() == 2
    p1, p2 = np.array([[0.7, 0.2, 0.1]]), np.array([[0.1, 0.6, 0.3]])
    out = ens.combine([{"test": np.log(p1)}, {"test": np.log(p2)}], {"test": np.array([0])})
    np.testing.assert_allclose(np.exp(out["test"]), (p1 + p2) / 2, rtol=1e-12)


def test_fit_end_to_end_two_epochs(data):
    method = KEPSVGP(KEPSVGP.Options(rank=2, rank_multi=2, samples=2))
    seed_everything(0)
    model = method.build_model(ModelConfig(patch_size=5, dim=12, depth=2, heads=2, mlp_ratio=1.0), data)
    cfg = TrainConfig(epochs=2, batch_size=25, lr=3e-3, warmup_epochs=1, min_lr=1e-4, eval_batch_size=40)
    result = fit(method, model, data, cfg, CPU, seed=0)
    assert len(result.log) == 2
    assert all(math.isfinite(row["train_loss"]) and math.isfinite(row["val_nll"]) for row in result.log)
    lp = predict(method, model, data.get("test"), data, CPU, 40).log_probs
    assert lp.shape == (40, 3) and np.isfinite(lp).all()


def test_deviations_name_the_options_that_leave_the_official_code():
    from bench.config.options import parse
    from methods.kep_svgp import KEPSVGP

    assert KEPSVGP(parse(KEPSVGP.Options, {"samples": 10})).deviations() == []  # faithful, logits, 10 passes
    lines = KEPSVGP(parse(KEPSVGP.Options, {"mode": "clean", "average": "probs", "samples": 5})).deviations()
    assert lines == ["clean SVGP: per-output factors and noise, the exact KL (official: the faithful indexing)",
                     "probabilities averaged over the passes (official: logits)", "5 prediction passes (official: 10)"]
