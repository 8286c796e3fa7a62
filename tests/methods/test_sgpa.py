"""methods/sgpa.py: SGPA attention, key passing, KL and its annealing, training.

Expected values are dense GP computations in numpy/scipy written here from the
equations of the reference (``docs/reference/kep_svgp_and_sgpa.md`` §4) and the module docstring, or
torch.distributions for Gaussian KLs; the layer under test only supplies its parameters.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.linalg import cho_factor, cho_solve, cholesky, solve_triangular
from scipy.special import erf
from scipy.special import log_softmax as sp_log_softmax
from torch.distributions import MultivariateNormal, kl_divergence

from bench.data import DataBundle
from bench.core.errors import ConfigError
from bench.config.options import parse
from bench.config.spec import ModelConfig, TrainConfig
from bench.train.loop import fit, predict, seed_everything
from bench.train.vit import ViT
from methods.sgpa import SGPA, SGPAAttention
from tests.helpers.synthetic import squares_bundle

CPU = torch.device("cpu")
JITTER = 1e-6


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- numpy reference


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def ard_np(x, y, log_scale, log_ell):
    """σ·exp(−½ Σ_d ((x_d − y_d)/ℓ_d)²) by explicit differences; x [N, D], y [P, D]."""
    diff = (x[:, None, :] - y[None, :, :]) / np.exp(log_ell)
    return np.exp(log_scale) * np.exp(-0.5 * (diff**2).sum(-1))


def exp_np(x, y, log_scale, log_ell):
    """σ·exp(Σ_d x_d y_d / ℓ_d²)."""
    return np.exp(log_scale) * np.exp(np.einsum("nd,pd,d->np", x, y, np.exp(-2 * log_ell)))


def kernel_np(layer: SGPAAttention, h: int):
    fn = ard_np if type(layer.kernel).__name__ == "ARDKernel" else exp_np
    ls, le = np_(layer.kernel.log_scale)[h], np_(layer.kernel.log_lengthscale)[h]
    return lambda a, b: fn(a, b, ls, le)


def linear_np(x: np.ndarray, lin) -> np.ndarray:
    return x @ np_(lin.weight).T + (0.0 if lin.bias is None else np_(lin.bias))


def qk_np(x: np.ndarray, layer: SGPAAttention) -> np.ndarray:
    """W_qk x: the first C rows of the bias-free [W_qk; W_v] projection (queries = keys)."""
    c = layer.heads * layer.head_dim
    return x @ np_(layer.qkv.weight)[:c].T


def v_np(x: np.ndarray, layer: SGPAAttention) -> np.ndarray:
    """W_v x: the last C rows of the projection."""
    c = layer.heads * layer.head_dim
    return x @ np_(layer.qkv.weight)[c:].T


def head_np(t: np.ndarray, layer: SGPAAttention, h: int) -> np.ndarray:
    """Columns of head h: channels h·D .. (h+1)·D − 1."""
    d = layer.head_dim
    return t[..., h * d : (h + 1) * d]


def s_sqrt_np(layer: SGPAAttention, h: int, d: int) -> np.ndarray:
    """S̃_d^{1/2} of head h: exp(log-diagonal) on the diagonal, the free entries below it."""
    m = layer.v_beta.shape[1]
    s = np.zeros((m, m))
    s[np.tril_indices(m, -1)] = np_(layer.s_offdiag)[h, d]
    s[np.diag_indices(m)] = np.exp(np_(layer.s_log_diag)[h, d])
    return s


def decoupled_np(layer: SGPAAttention, x: np.ndarray, keys: np.ndarray):
    """Dense decoupled-SGPA posterior per (b, h, d) and the KL, from the reference formulas.
    ``keys [H, M, C]``: head h's global keys in hidden space, k_β = W_qk keys[h] (head h's part).

    Returns mean [B, H, T, D], cov [B, H, D, T, T], kl."""
    b_, t_, _ = x.shape
    hh, dd, m = layer.heads, layer.head_dim, keys.shape[1]
    mean = np.zeros((b_, hh, t_, dd))
    cov = np.zeros((b_, hh, dd, t_, t_))
    kl = 0.0
    for h in range(hh):
        k = kernel_np(layer, h)
        kb = head_np(qk_np(keys[h], layer), layer, h)
        kbb = k(kb, kb) + JITTER * np.eye(m)
        c = cho_factor(kbb, lower=True)
        l_inv = solve_triangular(cholesky(kbb, lower=True), np.eye(m), lower=True)
        v_beta = np_(layer.v_beta)[h]
        amortised = np.zeros(dd)
        for b in range(b_):
            q = head_np(qk_np(x[b], layer), layer, h)
            v = head_np(v_np(x[b], layer), layer, h)
            kqq, kqb = k(q, q), k(q, kb)
            mean[b, h] = kqq @ v - kqb @ cho_solve(c, kqb.T @ v) + kqb @ v_beta
            for d in range(dd):
                s = s_sqrt_np(layer, h, d)
                cov[b, h, d] = kqq - kqb @ cho_solve(c, kqb.T) + kqb @ l_inv.T @ s @ s.T @ l_inv @ kqb.T
                amortised[d] += v[:, d] @ (kqq - kqb @ cho_solve(c, kqb.T)) @ v[:, d] / b_
        for d in range(dd):
            s = s_sqrt_np(layer, h, d)
            kl += 0.5 * (v_beta[:, d] @ kbb @ v_beta[:, d] + amortised[d] + (s**2).sum() - m)
            kl -= np.log(np.diag(s)).sum()
    return mean, cov, kl


def standard_np(layer: SGPAAttention, x: np.ndarray):
    """Standard SGPA: mean K v_d, cov K_qq + K (S_d − K̂^{-1}) K with S_d = diag(σ_d²)."""
    b_, t_, _ = x.shape
    hh, dd = layer.heads, layer.head_dim
    mean = np.zeros((b_, hh, t_, dd))
    cov = np.zeros((b_, hh, dd, t_, t_))
    for b in range(b_):
        for h in range(hh):
            k = kernel_np(layer, h)
            q = head_np(qk_np(x[b], layer), layer, h)
            v = head_np(v_np(x[b], layer), layer, h)
            sigma = np.exp(head_np(linear_np(x[b], layer.log_sigma), layer, h))
            kk = k(q, q)
            k_hat_inv = np.linalg.inv(kk + JITTER * np.eye(t_))
            mean[b, h] = kk @ v
            for d in range(dd):
                cov[b, h, d] = kk + kk @ (np.diag(sigma[:, d] ** 2) - k_hat_inv) @ kk
    return mean, cov


def randomise(module: torch.nn.Module, seed: int, scale: float = 0.5) -> None:
    """Every parameter ~ N(0, scale²) (so v_β, S̃ and the kernels are all non-trivial)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def layer64(seed: int = 0, **kw) -> SGPAAttention:
    torch.manual_seed(seed)
    layer = SGPAAttention(4, 2, 0.0, **kw).double()  # head width d = 2
    randomise(layer, seed + 100)
    if kw.get("kernel") == "exponential":  # ℓ ≈ e: exp(q·k/ℓ²) stays far from float64 overflow
        with torch.no_grad():
            layer.kernel.log_lengthscale.add_(1.0)
    layer.sample = False
    return layer


def inputs(seed: int, b: int = 2, t: int = 4, c: int = 4) -> torch.Tensor:
    return torch.randn(b, t, c, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ----------------------------------------------------------------------------- kernels


@pytest.mark.parametrize("kernel", ["ard", "exponential"])
def test_kernels_match_numpy_and_k_beta_beta_is_pd(kernel):
    layer = layer64(1, kernel=kernel, keys_len=3)
    x = torch.randn(2, 5, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)  # [H, N, D]
    y = torch.randn(2, 3, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    got = layer.kernel(x, y).detach().numpy()
    for h in range(2):
        np.testing.assert_allclose(got[h], kernel_np(layer, h)(x[h].numpy(), y[h].numpy()), rtol=1e-10, atol=1e-12)
    # batched queries broadcast against per-head keys
    xb = torch.randn(3, 2, 5, 2, dtype=torch.float64)
    expected = kernel_np(layer, 1)(xb[2, 1].numpy(), y[1].numpy())
    np.testing.assert_allclose(layer.kernel(xb, y).detach().numpy()[2, 1], expected, rtol=1e-10)
    # K_ββ + jitter·I is symmetric positive definite, even with two identical keys
    keys = y[0].clone()
    keys[1] = keys[0]
    kbb = layer.kernel(keys[None], keys[None])[0].detach().numpy() + JITTER * np.eye(3)
    np.testing.assert_allclose(kbb, kbb.T, rtol=1e-12)
    assert np.linalg.eigvalsh(kbb).min() > 0


def test_init_values_follow_the_reference():
    """Official: log σ = 0 (ARD) / −4 (exponential), log ℓ ~ N(0, 1) / 4 + N(0, 1); v_β, log-diag
    and off-diagonal of S̃^{1/2} ~ N(0, 1); keys per head ~ N(0, 1) in hidden space."""
    torch.manual_seed(0)
    layer = SGPAAttention(64, 4, kernel="ard", keys_len=16)
    ard, expo = layer.kernel, SGPAAttention(64, 4, kernel="exponential").kernel
    assert torch.equal(ard.log_scale, torch.zeros(4))
    assert torch.equal(expo.log_scale, torch.full((4,), -4.0))
    assert ard.log_lengthscale.shape == (4, 16)
    a, e = ard.log_lengthscale.detach(), expo.log_lengthscale.detach()
    assert abs(float(a.mean())) < 0.3 and 0.7 < float(a.std()) < 1.3
    assert abs(float(e.mean()) - 4.0) < 0.3 and 0.7 < float(e.std()) < 1.3
    assert layer.qkv.bias is None and layer.qkv.weight.shape == (128, 64)
    assert layer.keys.shape == (4, 16, 64) and layer.v_beta.shape == (4, 16, 16)
    for p in (layer.keys, layer.v_beta, layer.s_log_diag, layer.s_offdiag):
        p = p.detach()
        assert abs(float(p.mean())) < 0.1 and 0.9 < float(p.std()) < 1.1
    # head_dim lengthscales: ℓ² = D (ARD) and ℓ⁴ = D (exponential: exp(x·y/√D)), D = 16
    hd = SGPAAttention(64, 4, kernel="ard", lengthscale_init="head_dim").kernel.log_lengthscale.detach().exp()
    torch.testing.assert_close(hd**2, torch.full((4, 16), 16.0))
    hd = SGPAAttention(64, 4, kernel="exponential", lengthscale_init="head_dim").kernel.log_lengthscale.detach().exp()
    torch.testing.assert_close(hd**4, torch.full((4, 16), 16.0))
    # prior init: q(u_β) = p(u_β), so the global part of the KL vanishes
    prior = SGPAAttention(64, 4, variational_init="prior")
    assert not prior.v_beta.any() and not prior.s_log_diag.any() and not prior.s_offdiag.any()
    # key passing: the same keys become hidden-space tokens handed over by the backbone
    passing = SGPAAttention(64, 4, key_passing=True)
    assert passing.keys is None and passing.hidden_tokens.shape == (4, 16, 64)
    assert SGPAAttention(64, 4, variant="standard").hidden_tokens is None


# ----------------------------------------------------------------------------- decoupled posterior and KL


@pytest.mark.parametrize("kernel", ["ard", "exponential"])
def test_decoupled_posterior_and_kl_match_dense_numpy(kernel):
    """T = 4 tokens, M = 3 keys, d = 2 per head, 2 heads, batch 2."""
    full = layer64(2, kernel=kernel, keys_len=3, covariance="full")
    diag = layer64(2, kernel=kernel, keys_len=3, covariance="diag")
    diag.load_state_dict(full.state_dict())
    x = inputs(5)
    mean_np, cov_np, kl_np = decoupled_np(full, x.numpy(), np_(full.keys))

    post = full.posterior(x)
    np.testing.assert_allclose(post.mean.detach().numpy(), mean_np, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(post.cov.detach().numpy(), cov_np, rtol=1e-8, atol=1e-10)
    assert post.kl.item() == pytest.approx(kl_np, rel=1e-9)

    dpost = diag.posterior(x)
    var_np = np.diagonal(cov_np, axis1=-2, axis2=-1).transpose(0, 1, 3, 2)  # [B, H, T, D]
    np.testing.assert_allclose(dpost.cov.detach().numpy(), var_np, rtol=1e-8, atol=1e-10)
    full_diag = np.diagonal(post.cov.detach().numpy(), axis1=-2, axis2=-1).transpose(0, 1, 3, 2)
    np.testing.assert_allclose(dpost.cov.detach().numpy(), full_diag, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dpost.mean.detach().numpy(), mean_np, rtol=1e-8, atol=1e-10)
    assert (dpost.cov >= 0).all()
    assert np.linalg.eigvalsh(cov_np).min() > -1e-10  # the reference covariance itself is PSD

    # the layer's output (mean mode) is W_O applied to the concatenated head means
    out = full(x).detach().numpy()
    concat = mean_np.transpose(0, 2, 1, 3).reshape(2, 4, 4)
    np.testing.assert_allclose(out, linear_np(concat, full.proj), rtol=1e-8, atol=1e-10)


def test_s_sqrt_is_lower_triangular_with_positive_diagonal():
    layer = layer64(3, keys_len=4)
    s = layer.s_sqrt().detach().numpy()
    assert s.shape == (2, 2, 4, 4)
    np.testing.assert_array_equal(np.triu(s, 1), 0.0)
    assert (np.diagonal(s, axis1=-2, axis2=-1) > 0).all()
    np.testing.assert_allclose(s[1, 0], s_sqrt_np(layer, 1, 0))


def test_variances_non_negative_at_large_inputs_and_near_keys():
    """Keys at the tokens with S̃ ≈ 0 make the variance k_qq − Q_qq ≈ σ·jitter, which float32
    round-off (σ = e⁵) pushes below 0 unless clamped; large inputs saturate the kernel."""
    torch.manual_seed(0)
    layer = SGPAAttention(8, 2, keys_len=6)  # float32, as in training; keys = all 6 tokens
    x = torch.randn(3, 6, 8)
    with torch.no_grad():
        layer.keys.copy_(x[0].expand(2, 6, 8))  # k_β = W_qk x: the global keys sit at the tokens
        layer.kernel.log_scale.fill_(5.0)
        layer.s_log_diag.fill_(-10.0)
        layer.s_offdiag.zero_()
        var = layer.posterior(x).cov
        draws = layer.rsample(x)
    assert torch.isfinite(var).all() and (var >= 0).all()
    assert float(var[0].max()) < 1e-3  # the regime where cancellation happens
    assert torch.isfinite(draws).all()
    # large inputs: 10x LayerNorm scale and 2-sigma projections for ARD; the exponential
    # kernel exp(q·k/ℓ²) overflows float32 there (as in the official code), so it gets 3x
    for kernel, gain in (("ard", 10.0), ("exponential", 3.0)):
        for variant in ("decoupled", "standard"):
            torch.manual_seed(5)
            layer = SGPAAttention(8, 2, kernel=kernel, variant=variant, keys_len=3)
            for part in (layer.qkv,) + ((layer.kernel,) if kernel == "ard" else ()):
                randomise(part, 6, scale=2.0 if kernel == "ard" else 0.5)  # W_σ stays at σ = 1
            with torch.no_grad():
                var = layer.posterior(gain * torch.randn(3, 6, 8)).cov
            assert torch.isfinite(var).all() and (var >= 0).all(), (kernel, variant)


def test_full_covariance_samples_with_duplicate_tokens():
    """Identical tokens make K_qq − Q_qq singular; the sampler's Cholesky must still work."""
    torch.manual_seed(1)
    for variant in ("decoupled", "standard"):
        layer = SGPAAttention(8, 2, keys_len=3, variant=variant, covariance="full")
        x = torch.randn(2, 5, 8)
        x[:, 1] = x[:, 0]
        with torch.no_grad():
            assert torch.isfinite(layer.rsample(x)).all(), variant


# ----------------------------------------------------------------------------- standard SGPA


@pytest.mark.parametrize("kernel", ["ard", "exponential"])
def test_standard_posterior_matches_numpy_and_kl_matches_torch_distributions(kernel):
    full = layer64(7, kernel=kernel, variant="standard", covariance="full")
    diag = layer64(7, kernel=kernel, variant="standard", covariance="diag")
    diag.load_state_dict(full.state_dict())
    x = inputs(8, b=3)
    mean_np, cov_np = standard_np(full, x.numpy())
    post = full.posterior(x)
    np.testing.assert_allclose(post.mean.detach().numpy(), mean_np, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(post.cov.detach().numpy(), cov_np, rtol=1e-7, atol=1e-9)
    dpost = diag.posterior(x)
    var_np = np.diagonal(cov_np, axis1=-2, axis2=-1).transpose(0, 1, 3, 2)  # [B, H, T, D]
    np.testing.assert_allclose(dpost.cov.detach().numpy(), var_np, rtol=1e-7, atol=1e-9)
    assert (dpost.cov >= 0).all()

    # KL(q(u_d) || p(u_d)) with q = N(K̂ v_d, K̂ diag(σ_d²) K̂), p = N(0, K̂): batch mean, sum over h, d
    xs = x.numpy()
    total = 0.0
    for b in range(3):
        for h in range(2):
            k = kernel_np(full, h)
            q = head_np(qk_np(xs[b], full), full, h)
            v = head_np(v_np(xs[b], full), full, h)
            sigma = np.exp(head_np(linear_np(xs[b], full.log_sigma), full, h))
            k_hat = torch.from_numpy(k(q, q) + JITTER * np.eye(4))
            for d in range(2):
                s_d = torch.diag(torch.from_numpy(sigma[:, d] ** 2))
                qd = MultivariateNormal(k_hat @ torch.from_numpy(v[:, d]), k_hat @ s_d @ k_hat)
                total += float(kl_divergence(qd, MultivariateNormal(torch.zeros(4, dtype=torch.float64), k_hat))) / 3
    assert post.kl.item() == pytest.approx(total, rel=1e-6)
    assert dpost.kl.item() == pytest.approx(total, rel=1e-6)


# ----------------------------------------------------------------------------- sampling


def empirical(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """samples [S, T, D] -> mean [T, D], covariance over tokens per dim [D, T, T]."""
    centred = samples - samples.mean(0)
    return samples.mean(0), np.einsum("std,sud->dtu", centred, centred) / (len(samples) - 1)


@pytest.mark.parametrize("variant", ["decoupled", "standard"])
@pytest.mark.parametrize("covariance", ["diag", "full"])
def test_samples_have_the_posterior_moments(variant, covariance):
    """20 000 copies of one sequence in a batch = 20 000 draws of its posterior."""
    torch.manual_seed(9)
    layer = SGPAAttention(2, 1, keys_len=2, variant=variant, covariance=covariance).double()
    randomise(layer, 10)
    x1 = inputs(11, b=1, t=3, c=2)
    if variant == "decoupled":
        mean_np, cov_np, _ = decoupled_np(layer, x1.numpy(), np_(layer.keys))
    else:
        mean_np, cov_np = standard_np(layer, x1.numpy())
    mean_np, cov_np = mean_np[0, 0], cov_np[0, 0]  # [T, D], [D, T, T]
    if covariance == "diag":
        cov_np = cov_np * np.eye(3)  # tokens are sampled independently
    else:
        cov_np = cov_np + JITTER * np.eye(3)
    torch.manual_seed(12)
    with torch.no_grad():
        draws = layer.rsample(x1.expand(20000, 3, 2))[:, 0].numpy()  # [S, T, D]
    m, c = empirical(draws)
    scale = np.sqrt(np.diagonal(cov_np, axis1=-2, axis2=-1)).T  # [T, D]
    assert np.all(np.abs(m - mean_np) < 5 * scale / np.sqrt(20000) + 1e-12)
    sd = np.einsum("dt,du->dtu", scale.T, scale.T)  # σ_t σ_u: compare correlations
    np.testing.assert_allclose(c / sd, cov_np / sd, atol=0.05)


def sample_np(layer: SGPAAttention, x: np.ndarray, keys, eps):
    """One sample of every head's outputs with fixed noise, densely from the equations.

    diag: f = mean + √diag(Σ_d) · ε.  full: f_d = mean_d + chol(R + jitter·I) ε₁_d + F_dᵀ ε₂_d,
    where Σ_d = R + F_dᵀ F_d splits into the part the inducing set leaves unexplained,
    R = K_qq − K_qu K̂_uu^{-1} K_uq, and the variational part: F_d = S̃_d^{1/2ᵀ} L^{-1} K_βq
    (decoupled) or diag(σ_d) K_kq (standard)."""
    if layer.variant == "decoupled":
        mean, cov, _ = decoupled_np(layer, x, keys)
    else:
        mean, cov = standard_np(layer, x)
    if layer.covariance == "diag":
        return mean + np.sqrt(np.diagonal(cov, axis1=-2, axis2=-1).transpose(0, 1, 3, 2)) * eps.numpy()
    eps1, eps2 = (e.numpy() for e in eps)
    b_, t_, _ = x.shape
    out = mean.copy()
    for b in range(b_):
        for h in range(layer.heads):
            k = kernel_np(layer, h)
            q = head_np(qk_np(x[b], layer), layer, h)
            if layer.variant == "decoupled":
                kb = head_np(qk_np(keys[h], layer), layer, h)
                kbb = k(kb, kb) + JITTER * np.eye(len(kb))
                kbq = k(kb, q)
                l_inv = np.linalg.inv(cholesky(kbb, lower=True))
            else:
                kbq = k(q, q)
                kbb = kbq + JITTER * np.eye(t_)
                sigma = np.exp(head_np(linear_np(x[b], layer.log_sigma), layer, h))
            resid = k(q, q) - kbq.T @ np.linalg.solve(kbb, kbq)
            chol = cholesky(resid + JITTER * np.eye(t_), lower=True)
            for d in range(layer.head_dim):
                if layer.variant == "decoupled":
                    f_d = s_sqrt_np(layer, h, d).T @ l_inv @ kbq
                else:
                    f_d = np.diag(sigma[:, d]) @ kbq
                np.testing.assert_allclose(resid + f_d.T @ f_d, cov[b, h, d], rtol=1e-7, atol=1e-9)
                out[b, h, :, d] += chol @ eps1[b, h, :, d] + f_d.T @ eps2[b, h, d]
    return out


@pytest.mark.parametrize("variant", ["decoupled", "standard"])
@pytest.mark.parametrize("covariance", ["diag", "full"])
@pytest.mark.parametrize("kernel", ["ard", "exponential"])
def test_sample_with_fixed_noise_matches_dense_equations(variant, covariance, kernel):
    """The layer's output with given noise ε = W_O · concat_h(sample_h) + b, to 1e-5."""
    layer = layer64(13, kernel=kernel, variant=variant, covariance=covariance, keys_len=3)
    layer.sample = True
    x = inputs(14, b=2, t=4)
    g = torch.Generator().manual_seed(15)
    eps1 = torch.randn(2, 2, 4, 2, generator=g, dtype=torch.float64)  # [B, H, T, D]
    rows = 3 if variant == "decoupled" else 4  # rows of F_d: M keys or T tokens
    eps = eps1 if covariance == "diag" else (eps1, torch.randn(2, 2, 2, rows, generator=g, dtype=torch.float64))
    keys = np_(layer.keys) if variant == "decoupled" else None
    expected = sample_np(layer, x.numpy(), keys, eps)
    with torch.no_grad():
        np.testing.assert_allclose(layer.rsample(x, eps=eps).numpy(), expected, rtol=1e-5, atol=1e-7)
        out = layer(x, eps=eps).numpy()
    concat = expected.transpose(0, 2, 1, 3).reshape(2, 4, 4)
    np.testing.assert_allclose(out, linear_np(concat, layer.proj), rtol=1e-5, atol=1e-7)
    zero = eps1 * 0 if covariance == "diag" else (eps1 * 0, eps[1] * 0)
    assert np.abs(expected - sample_np(layer, x.numpy(), keys, zero)).max() > 1e-3  # the noise matters


# ----------------------------------------------------------------------------- model: shapes, gradients, key passing


def tiny_bundle(seed: int = 0, n_train: int = 60) -> DataBundle:
    """8x8 squares: ``n_train`` train / 30 val / 30 test."""
    return squares_bundle((n_train, 30, 30), seed, side=8)


TINY = ModelConfig(patch_size=4, dim=8, depth=2, heads=2, mlp_ratio=1.0, dropout=0.0)


def build(options: SGPA.Options, seed: int = 0, cfg: ModelConfig = TINY):
    method = SGPA(options)
    seed_everything(seed)
    return method, method.build_model(cfg, tiny_bundle())


@pytest.mark.parametrize(
    "opts",
    [
        dict(),
        dict(covariance="full", kernel="exponential"),
        dict(key_passing=False),
        dict(variant="standard"),
        dict(variant="standard", covariance="full"),
    ],
)
def test_shapes_and_gradients_reach_every_parameter(opts):
    method, model = build(SGPA.Options(keys_len=3, **opts))
    assert type(model) is ViT  # the plain backbone: SGPA only names the layers it replaces
    assert len(model.blocks) == 2 and all(isinstance(b.attn, SGPAAttention) for b in model.blocks)
    passing = opts.get("key_passing", True) and opts.get("variant", "decoupled") == "decoupled"
    for block in model.blocks:
        assert (block.attn.hidden_tokens is not None) == passing
        if passing:
            assert block.attn.hidden_tokens.shape == (2, 3, 8)  # [H, M, C] per layer
    model.train()
    x = torch.randn(5, 1, 8, 8)
    y = torch.tensor([0, 1, 2, 0, 1])
    out = model(x)
    assert out.shape == (5, 3) and torch.isfinite(out).all()
    loss = method.training_loss(model, out, y)
    extra = sum(b.attn.extra_loss() for b in model.blocks)
    ce = -sp_log_softmax(out.detach().double().numpy(), axis=1)[np.arange(5), y.numpy()].mean()
    assert loss.item() == pytest.approx(ce + extra.item(), rel=1e-5)
    loss.backward()
    names = [n for n, _ in model.named_parameters()]
    expected = {"kernel.log_scale", "kernel.log_lengthscale", "attn.qkv.weight", "proj.weight"}
    expected |= {"v_beta", "s_log_diag", "s_offdiag"} if "variant" not in opts else {"log_sigma.weight"}
    if "variant" not in opts:
        expected |= {"attn.hidden_tokens"} if passing else {"attn.keys"}
    for suffix in expected:
        assert sum(n.endswith(suffix) for n in names) == 2, suffix  # one per block
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def layernorm_np(x, ln):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + ln.eps) * np_(ln.weight) + np_(ln.bias)


def mlp_np(x, mlp):
    """Linear -> GELU (erf) -> Dropout -> Linear -> Dropout, dropout off."""
    h = linear_np(x, mlp[0])
    return linear_np(0.5 * h * (1 + erf(h / np.sqrt(2))), mlp[3])


def test_key_passing_through_the_previous_block():
    """Official SGPA ViT: layer 0 gets its keys z_0 as they are; layer l ≥ 1 gets
    LN_l(z_l + MLP_{l−1}(z_l)), the previous block's MLP on the raw keys plus the residual."""
    torch.manual_seed(0)
    method, model = build(SGPA.Options(keys_len=3), cfg=ModelConfig(patch_size=4, dim=8, depth=3, heads=2, mlp_ratio=2.0))
    randomise(model, 1)  # non-trivial LayerNorm affine parameters too
    model.eval()
    seen = []
    for block in model.blocks:
        block.attn.register_forward_pre_hook(lambda _m, _a, kw: seen.append(np_(kw["tokens"])), with_kwargs=True)
    with torch.no_grad():
        out = model(torch.randn(2, 1, 8, 8))
    assert len(seen) == 3
    np.testing.assert_allclose(seen[0], np_(model.blocks[0].attn.hidden_tokens), rtol=1e-12)
    for prev, block, got in zip(model.blocks, model.blocks[1:], seen[1:]):
        z = np_(block.attn.hidden_tokens)
        np.testing.assert_allclose(got, layernorm_np(z + mlp_np(z, prev.mlp), block.norm1), rtol=1e-5, atol=1e-5)
    # the keys change the output
    with torch.no_grad():
        model.blocks[2].attn.hidden_tokens.add_(1.0)
        assert not torch.allclose(model(torch.randn(2, 1, 8, 8)), out)


def test_layer_owned_keys_live_in_the_layer_input_space():
    method, model = build(SGPA.Options(keys_len=3, key_passing=False))
    model.eval()
    layer = model.blocks[1].attn
    layer.sample = False
    seen = {}
    layer.register_forward_pre_hook(lambda _m, a, kw: seen.update(x=a[0], kw=kw), with_kwargs=True)
    with torch.no_grad():
        model(torch.randn(2, 1, 8, 8))
        assert seen["kw"].get("tokens") is None
        post = layer.posterior(seen["x"])
    mean_np, _, _ = decoupled_np(layer, np_(seen["x"]), np_(layer.keys))
    np.testing.assert_allclose(post.mean.numpy(), mean_np, rtol=1e-4, atol=1e-5)


def test_registered_attention_works_in_the_plain_vit():
    torch.manual_seed(0)
    model = ViT((8, 8, 1), 3, ModelConfig(patch_size=4, dim=8, depth=1, heads=2, attention="sgpa"))
    assert isinstance(model.blocks[0].attn, SGPAAttention)
    assert model(torch.randn(4, 1, 8, 8)).shape == (4, 3)


# ----------------------------------------------------------------------------- KL weighting and annealing


def test_extra_loss_only_after_training_forward_and_kl_weight_scales_it():
    method, model = build(SGPA.Options(keys_len=3, kl_weight=0.25))
    x = torch.randn(3, 1, 8, 8)
    model.eval()
    model(x)
    assert all(b.attn.extra_loss() is None for b in model.blocks)
    model.train()
    torch.manual_seed(0)
    model(x)
    layer = model.blocks[0].attn
    assert layer.extra_loss().item() == pytest.approx(0.25 * layer.last_term.item(), rel=1e-6)
    assert layer.last_term.item() > 0


def test_on_train_step_anneals_the_kl_in_the_training_loss():
    annealed, model = build(SGPA.Options(keys_len=3, kl_anneal=True, kl_weight=2.0))
    model.train()
    torch.manual_seed(0)
    logits = model(torch.randn(4, 1, 8, 8))
    labels = torch.tensor([0, 1, 2, 1])
    ce = -sp_log_softmax(logits.detach().double().numpy(), axis=1)[np.arange(4), labels.numpy()].mean()
    # before any step hook the layers add kl_weight · KL (weight 2, set at build time)
    kl = annealed.training_loss(model, logits, labels).item() - ce
    assert kl == pytest.approx(2.0 * sum(b.attn.last_term.item() for b in model.blocks), rel=1e-5)
    assert kl > 0
    got = []
    for step in range(6):
        annealed.on_train_step(model, step, 8)
        got.append(annealed.training_loss(model, logits, labels).item() - ce)
    np.testing.assert_allclose(got, [w * kl for w in (0.0, 0.25, 0.5, 0.75, 1.0, 1.0)], rtol=1e-5, atol=1e-6)
    # without kl_anneal the hook keeps the full weight
    SGPA(SGPA.Options(keys_len=3)).on_train_step(model, 0, 8)
    assert annealed.training_loss(model, logits, labels).item() - ce == pytest.approx(kl, rel=1e-5)


def test_options_are_validated():
    assert parse(SGPA.Options, {"keys_len": 8, "kernel": "exponential"}).keys_len == 8
    bads = ({"keys_len": 0}, {"kernel": "rbf"}, {"variant": "sparse"}, {"covariance": "low"}, {"jitter": 0.0}, {"samples": 0})
    for bad in bads:
        with pytest.raises(ConfigError):
            parse(SGPA.Options, bad)
    assert SGPA(SGPA.Options()).samples == 10 and SGPA(SGPA.Options()).average == "probs"


# ----------------------------------------------------------------------------- reproducibility and training


def test_seeded_forward_is_reproducible_and_stochastic():
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    outs = []
    for build_seed, draw_seed in ((0, 1), (0, 1), (0, 2), (1, 1)):
        _, model = build(SGPA.Options(keys_len=3), seed=build_seed)
        model.eval()
        torch.manual_seed(draw_seed)
        with torch.no_grad():
            outs.append(model(x))
    assert torch.equal(outs[0], outs[1])
    assert not torch.allclose(outs[0], outs[2])  # test-time samples differ
    assert not torch.allclose(outs[0], outs[3])  # weights differ


class Recording(SGPA):
    """Records the layers' KL weight each time the loop asks for the training loss."""

    def training_loss(self, model, logits, labels):
        self.weights.append(model.blocks[0].attn.anneal_weight)
        return super().training_loss(model, logits, labels)


@pytest.mark.parametrize("anneal", [False, True])
def test_two_epoch_fit_gives_finite_losses(anneal):
    data = tiny_bundle()
    method = Recording(SGPA.Options(keys_len=3, samples=2, kl_anneal=anneal))
    method.weights = []
    seed_everything(0)
    model = method.build_model(TINY, data)
    cfg = TrainConfig(epochs=2, batch_size=20, lr=3e-3, warmup_epochs=0, eval_batch_size=64)
    result = fit(method, model, data, cfg, CPU, seed=0)  # 60 / 20 = 3 steps per epoch
    assert len(result.log) == 2
    for row in result.log:
        assert np.isfinite(row["train_loss"]) and np.isfinite(row["val_nll"])
    expected = [0.0, 1 / 3, 2 / 3, 1.0, 1.0, 1.0] if anneal else [1.0] * 6
    np.testing.assert_allclose(method.weights, expected, rtol=1e-12)
    lp = predict(method, model, data.get("test"), data, CPU, 64).log_probs
    assert lp.shape == (30, 3) and np.isfinite(lp).all()
    np.testing.assert_allclose(np.exp(lp).sum(1), 1.0, rtol=1e-5)


# ----------------------------------------------------------------------------- the official preset

OFFICIAL = {"preset": "official"}
SMALL = {"keys_len": 3, "samples": 2}


def preset_pair(seed: int = 0, cfg: ModelConfig = TINY, data=None, **options):
    """The default and the official-preset SGPA, built from the same seed (options parsed as
    a suite's table)."""
    data = data or tiny_bundle()
    pair = []
    for preset in ({}, OFFICIAL):
        method = SGPA(parse(SGPA.Options, {**SMALL, **options, **preset}, "methods.sgpa"))
        seed_everything(seed)
        pair.append((method, method.build_model(cfg, data)))
    return pair


def test_official_preset_differs_from_the_default_only_in_the_listed_points():
    """Same seed: the same parameters with the same values, except the LayerNorms the
    official model shares (dropped) and its sequence-pooling head (added); the same modules
    except the MLP order, the shared LayerNorms and the head; layer options except the KL's
    jitter; the annealing hooks."""
    (default, dm), (official, om) = preset_pair(cfg=ModelConfig(patch_size=4, dim=8, depth=3, heads=2, mlp_ratio=1.0))
    layers_d, layers_o = default.attention_layers(TINY), official.attention_layers(TINY)
    for block in layers_d:
        diff = {k for k in layers_d[block][1] if layers_d[block][1][k] != layers_o[block][1][k]}
        assert diff == {"kl_jitter"} and layers_o[block][1]["kl_jitter"] is False
    params_d, params_o = dict(dm.named_parameters()), dict(om.named_parameters())  # shared ones once
    dropped = {f"blocks.{i}.{n}.{p}" for i in (1, 2) for n in ("norm1", "norm2") for p in ("weight", "bias")}
    assert set(params_d) - set(params_o) == dropped
    assert set(params_o) - set(params_d) == {"seqpool.weight", "seqpool.bias"}
    for name in set(params_d) & set(params_o):
        torch.testing.assert_close(params_o[name], params_d[name], rtol=0, atol=0)
    assert set(om.state_dict()) == set(dm.state_dict()) | {"seqpool.weight", "seqpool.bias"}  # shared: same keys
    for (name, mod_d), (_, mod_o) in zip(dm.named_modules(remove_duplicate=False), om.named_modules(remove_duplicate=False)):
        if ".mlp" in name or ".norm" in name:
            continue
        assert type(mod_d) is type(mod_o), name
    assert dm.seqpool is None
    mlp = [[type(m).__name__ for m in b.mlp] for b in (dm.blocks[0], om.blocks[0])]
    assert mlp == [["Linear", "GELU", "Dropout", "Linear", "Dropout"], ["Linear", "Dropout", "GELU", "Linear", "Dropout"]]
    assert {type(default).on_train_epoch, type(default).on_train_step} == {SGPA.on_train_epoch, SGPA.on_train_step}


def test_official_mlp_runs_linear_dropout_gelu_linear_dropout():
    (_, dm), (_, om) = preset_pair(cfg=ModelConfig(patch_size=4, dim=8, depth=1, heads=2, mlp_ratio=1.0, dropout=0.3))
    x = torch.randn(5, 4, 8)
    for model, order in ((dm, "default"), (om, "official")):
        mlp = model.blocks[0].mlp.train()
        first, second = (m for m in mlp if isinstance(m, torch.nn.Linear))
        torch.manual_seed(3)
        got = mlp(x)
        torch.manual_seed(3)  # the same dropout masks, drawn in the same order
        drop = lambda t: torch.nn.functional.dropout(t, 0.3, training=True)  # noqa: E731
        gelu = torch.nn.functional.gelu
        h = drop(gelu(first(x))) if order == "default" else gelu(drop(first(x)))
        torch.testing.assert_close(got, drop(second(h)))


def test_official_layernorm_is_shared_by_every_position_but_the_first_attention_input():
    (_, om), = preset_pair(cfg=ModelConfig(patch_size=4, dim=8, depth=3, heads=2, mlp_ratio=1.0))[1:]
    shared = om.blocks[0].norm2
    assert om.blocks[0].norm1 is not shared and om.norm is not shared  # patch embedding's and the head's own
    assert all(b.norm1 is shared and b.norm2 is shared for b in om.blocks[1:])
    om.eval()
    z = om.blocks[2].attn.hidden_tokens  # keys of block 2 through the shared LayerNorm, as the official ViT
    torch.testing.assert_close(om.blocks[2].hidden_tokens(om.blocks[1]), shared(z + om.blocks[1].mlp(z)))


def test_official_readout_is_sequence_pooling_on_images_and_mean_pooling_on_text():
    from bench.data.text import PAD_ID
    from datasets.text_bundle import TextOptions, text_bundle

    (_, dm), (_, om) = preset_pair()
    x = torch.randn(3, 1, 8, 8)
    for model in (dm, om):
        model.eval()
        seen = {}
        model.blocks[-1].register_forward_hook(lambda _m, _i, out: seen.setdefault("tokens", out))
        with torch.no_grad():
            torch.manual_seed(0)
            logits = model(x)
            tokens = seen["tokens"]
            if model is dm:
                pooled = tokens.mean(1)
            else:
                w = torch.softmax(tokens @ model.seqpool.weight.T + model.seqpool.bias, dim=1)  # [B, N, 1]
                pooled = (w * tokens).sum(1)
            torch.testing.assert_close(logits, model.head(model.norm(pooled)))
    texts = (["a b c d", "b c", "d c b a a b", "c"], np.array([0, 1, 0, 1]))
    text = text_bundle("toy", {"train": texts, "val": texts, "test": texts}, 2, TextOptions(max_len=6, min_freq=1))
    (_, tm), = preset_pair(data=text)[1:]
    assert tm.seqpool is None and all(b.norm1 is tm.blocks[0].norm2 for b in tm.blocks[1:])
    ids = torch.tensor([[3, 4, PAD_ID, PAD_ID, PAD_ID, PAD_ID]])
    assert tm.eval()(ids).shape == (1, 2)


def test_sequence_pooling_weights_real_tokens_only():
    from bench.train.vit import TextTransformer

    torch.manual_seed(0)
    model = TextTransformer(10, 5, 3, ModelConfig(dim=8, depth=1, heads=2, dropout=0.0, pool="sequence")).eval()
    ids = torch.tensor([[3, 4, 0, 0, 0], [5, 6, 7, 8, 9]])
    seen = {}
    model.blocks[-1].register_forward_hook(lambda _m, _i, out: seen.setdefault("tokens", out))
    with torch.no_grad():
        logits = model(ids)
        tokens = seen["tokens"]
        pooled = []
        for row, n_real in zip(tokens, (2, 5)):
            w = torch.softmax(row[:n_real] @ model.seqpool.weight.T + model.seqpool.bias, dim=0)
            pooled.append((w * row[:n_real]).sum(0))
        torch.testing.assert_close(logits, model.head(model.norm(torch.stack(pooled))))


def test_official_kl_leaves_the_jitter_out_of_v_beta_k_v_beta():
    """The KLs differ by exactly ½ jitter ‖v_β‖² per layer (large jitter to see it in float32)."""
    (default, dm), (official, om) = preset_pair(jitter=0.05, variational_init="official")
    x = torch.randn(4, 1, 8, 8)
    kls = []
    for model in (dm, om):
        model.train()
        torch.manual_seed(1)
        model(x)
        kls.append([b.attn.last_term.item() for b in model.blocks])
    for block, kl_d, kl_o in zip(om.blocks, *kls):
        expected = 0.5 * 0.05 * block.attn.v_beta.double().square().sum().item()
        assert kl_d - kl_o == pytest.approx(expected, rel=1e-3)


class RecordingAnneal(SGPA):
    """Records the layers' KL weight each time the loop asks for the training loss."""

    def training_loss(self, model, logits, labels):
        self.weights.append(model.blocks[0].attn.anneal_weight)
        return super().training_loss(model, logits, labels)


@pytest.mark.parametrize("preset,expected", [
    ("uqbench", [i / 6 for i in range(6)] + [1.0] * 6),  # per step: 12 steps, ramp over 6
    ("official", [0.0] * 3 + [0.5] * 3 + [1.0] * 6),  # per epoch: 2/4 per epoch of 4
])
def test_kl_annealing_per_step_or_per_epoch_as_the_official(preset, expected):
    data = tiny_bundle()
    method = RecordingAnneal(parse(SGPA.Options, {**SMALL, "kl_anneal": True, "preset": preset}))
    method.weights = []
    seed_everything(0)
    model = method.build_model(TINY, data)
    fit(method, model, data, TrainConfig(epochs=4, batch_size=20, lr=3e-3, warmup_epochs=0, eval_batch_size=64), CPU, seed=0)
    np.testing.assert_allclose(method.weights, expected, rtol=1e-12)


def test_preset_option_and_its_contradictions_are_config_errors():
    with pytest.raises(ConfigError, match=r"methods\.sgpa\.preset: expected one of 'uqbench', 'official', got 'paper'"):
        parse(SGPA.Options, {"preset": "paper"}, "methods.sgpa")
    method = SGPA(parse(SGPA.Options, {**SMALL, **OFFICIAL}))
    for bad, key in (({"mlp_final_gelu": True}, "model.mlp_final_gelu"), ({"pool": "cls"}, "model.pool")):
        with pytest.raises(ConfigError, match=key):
            method.build_model(ModelConfig(patch_size=4, dim=8, depth=2, heads=2, **bad), tiny_bundle())


def test_deviations_name_what_a_configuration_keeps_from_the_official_model():
    official = SGPA(parse(SGPA.Options, {**OFFICIAL, "kl_anneal": True}))
    assert official.deviations() == ["each head projects its global keys with its own query rows (official: fc_qkv "
                                     "rows [:hdim] for every head, an upstream bug with 2 or more heads)"]
    default_suite = SGPA(parse(SGPA.Options, {"samples": 10, "lengthscale_init": "head_dim", "variational_init": "prior",
                                              "keys_len": 4, "kl_weight": 2.8e-4}))
    lines = default_suite.deviations()
    for part in ("MLP Linear, GELU, Dropout", "two LayerNorms", "mean-pooled", "jitter in K_beta_beta",
                 "KL not annealed", "KL weight 0.00028", "lengthscales", "q(u_beta) initialised at the prior"):
        assert sum(part in line for line in lines) == 1, (part, lines)
    assert not any("passes" in line for line in lines)  # 10 passes: the official count
