"""Padding masks in every registered attention layer (text track).

Contract (bench/train/vit.py, "Padding"): ``forward(x, ..., mask=None)`` with ``mask [B, N]``
bool, True at real tokens.  Checked for every name in the registry (none pinned):

1. real tokens' outputs do not depend on what sits at padded positions;
2. layers without a fixed length (no ``n_tokens``): real outputs of the padded sequence
   equal the outputs of the unpadded (shorter) sequence run without a mask, the independent
   reference (SGPA and random-feature GP attention: posterior mean, variance, KL and a
   fixed-noise sample);
3. ``mask=None`` is the unmasked computation (same as no argument; an all-True mask
   agrees with it);
4. outputs are finite everywhere, padded positions included;
5. KEP-SVGP's masked KSVD objective J equals J computed by hand from the real tokens.
"""
from __future__ import annotations

import copy
import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import bench.train.vit  # noqa: F401  (registers "softmax")
import methods  # noqa: F401  (registers the other layers)
from bench.core.registry import ATTENTIONS
from bench.config.spec import ModelConfig
from bench.train.vit import make_attention
from methods.kep_svgp import KEPSVGPAttention, masked_subsample_index, subsample_index

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DIM, HEADS, N = 32, 4, 12
D = DIM // HEADS
# Real tokens per row: a full row, a prefix of 7, a single token, and real tokens with
# holes (position 0 always real).
MASK = torch.tensor(
    [[True] * 12, [True] * 7 + [False] * 5, [True] + [False] * 11,
     [True, False, True, True, False, False, True, False, False, False, False, False]]
)

# Options worth covering per layer; a layer not listed is built with its defaults.
OPTIONS: dict[str, list[dict]] = {
    "kdeformer": [dict(bucket_size=4, samples=4), dict(bucket_size=3, samples=6, projections=3),
                  dict(bucket_size=12, samples=0)],
    "pap": [dict(lam=0.5, iters_test=3)],
    "optimised": [{}, dict(axis="queries")],
    "efficient": [{}, dict(axis="queries")],
    "super": [{}, dict(axis="queries"), dict(wa_init="xavier")],
    "scaled": [dict(variant="matrix"), dict(variant="scalar")],
    "kep_svgp": [dict(rank=3, rank_multi=2, merge="add", mode="faithful"),  # N' = 6 < N: subsampled
                 dict(rank=3, rank_multi=2, merge="concat", mode="clean"),
                 dict(rank=3, rank_multi=10, merge="add", mode="clean"),  # N' = N: all tokens
                 dict(rank=3, rank_multi=10, merge="concat", mode="faithful")],
    "sgpa": [dict(variant="decoupled", covariance="diag", keys_len=5),
             dict(variant="decoupled", covariance="full", keys_len=5, kernel="exponential"),
             dict(variant="decoupled", covariance="diag", keys_len=5, key_passing=True),
             dict(variant="standard", covariance="diag"),
             dict(variant="standard", covariance="full"),
             dict(variant="standard", covariance="full", kernel="exponential")],
    "rff_gp": [dict(features=3), dict(features=10, kernel="exponential")],  # M/2 = 10 > D = 8: stacked blocks
}


def configs() -> list[tuple[str, dict]]:
    return [(name, opts) for name in ATTENTIONS for opts in OPTIONS.get(name, [{}])]


def ids(config) -> str:
    name, opts = config
    return name + "".join(f"-{k}={v}" for k, v in opts.items())


CONFIGS = configs()


def build(name: str, opts: dict) -> torch.nn.Module:
    """The layer through the one constructor, float64, eval; parameters initialised to a
    neutral zero (Scaled's S and alpha, SGPA's W_sigma) drawn at random so they act."""
    torch.manual_seed(0)
    layer = make_attention(ModelConfig(dim=DIM, heads=HEADS, dropout=0.0), n_tokens=N, choice=(name, opts))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in layer.parameters():
            if not p.any():
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return layer.double().eval()


def call(layer, x, mask=None, eps=None, seed=0):
    """``layer(x, ...)`` with the RNG reseeded (stochastic layers draw the same noise)."""
    kwargs = {}
    if getattr(layer, "hidden_tokens", None) is not None:
        kwargs["tokens"] = layer.hidden_tokens
    if eps is not None:
        kwargs["eps"] = eps
    if mask is not None:
        kwargs["mask"] = mask
    torch.manual_seed(seed)
    with torch.no_grad():
        return layer(x, **kwargs)


def inputs(seed: int = 0) -> torch.Tensor:
    return torch.randn(len(MASK), N, DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def repadded(x: torch.Tensor, seed: int) -> torch.Tensor:
    """``x`` with new random content at the padded positions."""
    noise = 2.0 * torch.randn(x.shape, generator=torch.Generator().manual_seed(seed), dtype=x.dtype)
    return torch.where(MASK[..., None], x, noise)


def sampling_modes(layer) -> list[bool | None]:
    """``self.sample`` settings to test: both paths where the layer has the switch."""
    return [True, False] if hasattr(layer, "sample") else [None]


def real(out: torch.Tensor) -> torch.Tensor:
    return out[MASK]  # [real tokens, C]


def test_every_registered_layer_takes_a_mask_keyword():
    assert "softmax" in ATTENTIONS and "sgpa" in ATTENTIONS
    for name in ATTENTIONS:
        params = inspect.signature(ATTENTIONS.get(name).forward).parameters
        assert "mask" in params and params["mask"].default is None, name
        assert params["mask"].kind in (params["mask"].KEYWORD_ONLY, params["mask"].POSITIONAL_OR_KEYWORD), name
        assert list(params)[-1] == "mask", f"{name}: mask must come after the existing arguments"


@pytest.mark.parametrize("config", CONFIGS, ids=ids)
def test_real_outputs_ignore_padded_content_and_all_outputs_are_finite(config):
    layer = build(*config)
    x = inputs()
    for sample in sampling_modes(layer):
        if sample is not None:
            layer.sample = sample
        out = call(layer, x, MASK)
        assert torch.isfinite(out).all()
        for seed in (1, 2):
            other = call(layer, repadded(x, seed), MASK)
            assert torch.isfinite(other).all()
            torch.testing.assert_close(real(other), real(out), rtol=1e-10, atol=1e-12)
        # without the mask the padded content does change real outputs (the check can fail)
        assert not torch.allclose(real(call(layer, x)), real(call(layer, repadded(x, 1))), atol=1e-6)


VARIABLE_LENGTH = [c for c in CONFIGS if c[0] not in ("sgpa", "rff_gp")
                   and "n_tokens" not in inspect.signature(ATTENTIONS.get(c[0])).parameters]


def tolerance(name: str) -> dict:
    """Comparisons of two different computations: float64 round-off, or float32 for PAP
    (its ADMM runs in float32 whatever the input dtype)."""
    return dict(rtol=1e-5, atol=1e-6) if name == "pap" else dict(rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("config", VARIABLE_LENGTH, ids=ids)
def test_padded_equals_unpadded_for_layers_without_a_fixed_length(config):
    """A sampling layer (CGPT's) is compared on its mean path: its noise is drawn per token,
    so a padded and an unpadded call draw different numbers for the same real token."""
    layer = build(*config)
    if hasattr(layer, "sample"):
        layer.sample = False
    x = repadded(inputs(3), 4)
    out = call(layer, x, MASK)
    for b in range(len(MASK)):
        alone = call(layer, x[b : b + 1, MASK[b]])  # the real tokens only, no mask
        torch.testing.assert_close(out[b, MASK[b]], alone[0], **tolerance(config[0]))


SGPA_CONFIGS = [c for c in CONFIGS if c[0] == "sgpa"]


@pytest.mark.parametrize("config", SGPA_CONFIGS, ids=ids)
def test_sgpa_posterior_and_fixed_noise_sample_equal_those_of_the_unpadded_sequence(config):
    layer = build(*config)
    tokens = layer.hidden_tokens
    x = repadded(inputs(5), 6)
    g = torch.Generator().manual_seed(7)
    eps1 = torch.randn(len(MASK), HEADS, N, D, generator=g, dtype=torch.float64)
    n_factor = layer.v_beta.shape[1] if layer.variant == "decoupled" else N  # rows of F_d
    eps2 = torch.randn(len(MASK), HEADS, D, n_factor, generator=g, dtype=torch.float64)
    full = layer.covariance == "full"
    eps = (eps1, eps2) if full else eps1

    layer.sample = False
    mean = call(layer, x, MASK)
    layer.sample = True
    sample = call(layer, x, MASK, eps=eps)
    assert not torch.allclose(mean, sample)
    with torch.no_grad():
        post = layer.posterior(x, tokens, mask=MASK)
    for b in range(len(MASK)):
        pos = MASK[b].nonzero().squeeze(1)
        xb = x[b : b + 1, pos]
        e1 = eps1[b : b + 1, :, pos]
        e2 = eps2[b : b + 1] if layer.variant == "decoupled" else eps2[b : b + 1, ..., pos]
        layer.sample = False
        torch.testing.assert_close(mean[b, pos], call(layer, xb)[0], rtol=1e-9, atol=1e-12)
        layer.sample = True
        torch.testing.assert_close(sample[b, pos], call(layer, xb, eps=(e1, e2) if full else e1)[0],
                                   rtol=1e-9, atol=1e-12)
        with torch.no_grad():
            alone = layer.posterior(xb, tokens)
            row = layer.posterior(x[b : b + 1], tokens, mask=MASK[b : b + 1])  # the KL averages the batch
        torch.testing.assert_close(post.mean[b, :, pos], alone.mean[0], rtol=1e-9, atol=1e-12)
        cov = post.cov[b][..., pos][..., pos, :] if full else post.cov[b, :, pos]
        torch.testing.assert_close(cov, alone.cov[0], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(row.kl, alone.kl, rtol=1e-9, atol=1e-10)


RFF_GP_CONFIGS = [c for c in CONFIGS if c[0] == "rff_gp"]


@pytest.mark.parametrize("config", RFF_GP_CONFIGS, ids=ids)
def test_rff_gp_posterior_and_fixed_noise_sample_equal_those_of_the_unpadded_sequence(config):
    layer = build(*config)
    x = repadded(inputs(11), 12)
    eps = torch.randn(len(MASK), HEADS, N, D, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    sample = call(layer, x, MASK, eps=eps)
    with torch.no_grad():
        mean, var, _, _ = layer.posterior(x, MASK)
    for b in range(len(MASK)):
        pos = MASK[b].nonzero().squeeze(1)
        xb = x[b : b + 1, pos]
        torch.testing.assert_close(sample[b, pos], call(layer, xb, eps=eps[b : b + 1, :, pos])[0], rtol=1e-9, atol=1e-12)
        with torch.no_grad():
            alone_mean, alone_var, alone_kl, _ = layer.posterior(xb)
            _, _, row_kl, _ = layer.posterior(x[b : b + 1], MASK[b : b + 1])  # the KL averages the batch
        torch.testing.assert_close(mean[b, :, pos], alone_mean[0], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(var[b, :, pos], alone_var[0], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(row_kl, alone_kl, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("config", CONFIGS, ids=ids)
def test_mask_none_is_the_unmasked_computation(config):
    layer = build(*config)
    twin = copy.deepcopy(layer)
    x = inputs(8)
    everything = torch.ones(len(MASK), N, dtype=torch.bool)
    for sample in sampling_modes(layer):
        if sample is not None:
            layer.sample = twin.sample = sample
        without = call(layer, x)
        assert torch.equal(call(twin, x, mask=None), without)  # bit for bit
        torch.testing.assert_close(call(layer, x, everything), without, **tolerance(config[0]))


@pytest.mark.parametrize("config", CONFIGS, ids=ids)
def test_training_mode_with_a_mask_is_finite_and_backpropagates(config):
    layer = build(*config).train()
    x = repadded(inputs(9), 10).requires_grad_(True)
    kwargs = {"mask": MASK}
    if getattr(layer, "hidden_tokens", None) is not None:
        kwargs["tokens"] = layer.hidden_tokens
    out = layer(x, **kwargs)
    loss = out[MASK].sum()
    extra = getattr(layer, "extra_loss", lambda: None)()
    if extra is not None:
        loss = loss + extra
    loss.backward()
    assert torch.isfinite(out).all() and torch.isfinite(loss)
    assert torch.isfinite(x.grad).all()
    # real outputs send no gradient to the padded inputs (the regularisers neither)
    assert not x.grad[~MASK].any()


# ----------------------------------------------------------------------------- KDEformer


@pytest.mark.parametrize("bucket, samples", [(4, 4), (3, 6), (4, 0)])
def test_kdeformer_real_tokens_are_bucketed_and_sampled_as_without_the_padding(bucket, samples):
    """Padded tokens sort after the real ones and are never sampled, so (same seed) a row's
    real outputs are those of its real tokens alone whenever the bucket divides their count.
    With residual samples this leans on CPU multinomial drawing by inverting the CDF, which
    zero-probability padding at the end leaves unchanged."""
    layer = build("kdeformer", dict(bucket_size=bucket, samples=samples))
    x = repadded(inputs(15), 16)
    for length in range(bucket, N + 1, bucket):
        mask = (torch.arange(N) < length)[None]
        padded = call(layer, x[:1], mask, seed=length)
        alone = call(layer, x[:1, :length], seed=length)
        torch.testing.assert_close(padded[0, :length], alone[0], rtol=1e-5, atol=1e-6)  # float32 inside


# ----------------------------------------------------------------------------- KEP-SVGP


@pytest.mark.parametrize("opts", OPTIONS["kep_svgp"], ids=lambda o: f"{o['merge']}-{o['mode']}-x{o['rank_multi']}")
def test_kep_svgp_padded_tokens_carry_nothing(opts):
    """e = r = 0 at padded tokens (official: their q and k are zeroed), and with
    concatenation the token map's columns at padded tokens play no part."""
    layer = build("kep_svgp", opts)
    x = repadded(inputs(17), 18)
    with torch.no_grad():
        e, r = layer.scores(x, MASK)
        assert not e[:, :, ~MASK[0]].any() and not (e.transpose(1, 2)[~MASK] != 0).any()
        assert not (r.transpose(1, 2)[~MASK] != 0).any()
        assert (e.transpose(1, 2)[MASK] != 0).all()
        if layer.token_map is None:
            return
        pad = ~MASK.repeat(1, 2)  # [B, 2N]: both halves
        for b in range(1, len(MASK)):
            row, mask = x[b : b + 1], MASK[b : b + 1]
            other = copy.deepcopy(layer)
            other.token_map.weight[:, pad[b]] = torch.randn(N, int(pad[b].sum()), dtype=torch.float64)
            torch.testing.assert_close(call(other, row, mask)[0, MASK[b]], call(layer, row, mask)[0, MASK[b]],
                                       rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- KEP-SVGP's J


def ksvd_by_hand(layer: KEPSVGPAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """J = ½ mean‖e D‖² + ½ mean‖r D‖² − tr(mean_h W̃_eᵀ W̃_r), the means over the real
    (b, n) pairs and the heads; W_e from N' evenly spaced real tokens of each row."""
    h = layer.heads
    n_keep = layer.w_e.shape[1]
    d2 = torch.exp(2 * layer.log_lambda)  # [h, s]
    w_qk = layer.qk.weight  # [2C, C]
    total, count = x.new_zeros(()), 0
    for b in range(len(x)):
        pos = mask[b].nonzero().squeeze(1).tolist()
        length = len(pos)
        if n_keep < N:
            keep = [pos[0 if n_keep == 1 else math.floor(k * (length - 1) / (n_keep - 1))] for k in range(n_keep)]
            rows = list(range(n_keep))  # every row of W̃
        else:
            keep, rows = pos, pos  # all positions; padded rows of X_h are zero
        for head in range(h):
            sl = slice(head * D, (head + 1) * D)
            x_h = x[b, keep, sl]  # [N' or L, d]
            w_e = x_h.T @ layer.w_e[head, rows]  # [d, s]
            w_r = x_h.T @ layer.w_r[head, rows]
            for n in pos:
                q = x[b, n] @ w_qk[: DIM].T
                k = x[b, n] @ w_qk[DIM:].T
                e = (q[sl] / q[sl].norm()) @ w_e
                r = (k[sl] / k[sl].norm()) @ w_r
                total = total + 0.5 * (e.pow(2) * d2[head]).sum() + 0.5 * (r.pow(2) * d2[head]).sum()
                count += 1
    trace = sum((layer.w_e[i].T @ layer.w_r[i]).trace() for i in range(h)) / h
    return total / count - trace


@pytest.mark.parametrize("opts", OPTIONS["kep_svgp"], ids=lambda o: f"{o['merge']}-{o['mode']}-x{o['rank_multi']}")
def test_kep_svgp_masked_ksvd_equals_the_real_tokens_by_hand(opts):
    layer = build("kep_svgp", opts).train()
    x = repadded(inputs(11), 12)
    with torch.no_grad():
        layer(x, mask=MASK)
        masked = layer.last_ksvd
        expected = ksvd_by_hand(layer, x, MASK)
        torch.testing.assert_close(masked, expected, rtol=1e-10, atol=1e-12)
        layer(repadded(x, 13), mask=MASK)  # J ignores the padded content
        torch.testing.assert_close(layer.last_ksvd, masked, rtol=1e-12, atol=1e-12)
        layer(x)  # without the mask J counts every token: different here
        assert not torch.allclose(layer.last_ksvd, masked)
        layer(x, mask=torch.ones_like(MASK))  # an all-True mask is the unmasked J
        everything = layer.last_ksvd
        torch.testing.assert_close(everything, ksvd_by_hand(layer, x, torch.ones_like(MASK)), rtol=1e-10, atol=1e-12)


def test_kep_svgp_subsamples_evenly_over_each_rows_real_tokens():
    index = masked_subsample_index(MASK, 6)
    assert index.tolist() == [[0, 2, 4, 6, 8, 11], [0, 1, 2, 3, 4, 6], [0] * 6, [0, 0, 2, 2, 3, 6]]
    full = torch.ones(2, 20, dtype=torch.bool)
    assert torch.equal(masked_subsample_index(full, 7), subsample_index(20, 7).expand(2, -1))
    assert masked_subsample_index(MASK, 1).tolist() == [[0]] * 4


def test_masked_softmax_attends_to_real_keys_only():
    """Sanity of the reference itself: masked softmax attention = attention over real keys."""
    layer = build("softmax", {})
    x = inputs(14)
    out = call(layer, x, MASK)
    with torch.no_grad():
        q, k, v = layer.qkv(x).view(len(x), N, 3, HEADS, D).permute(2, 0, 3, 1, 4)
        logits = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~MASK[:, None, None, :], float("-inf"))
        expected = layer.proj((F.softmax(logits, -1) @ v).transpose(1, 2).reshape(len(x), N, DIM))
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


def test_every_registered_layer_is_covered():
    covered = {name for name, _ in CONFIGS}
    assert covered == set(ATTENTIONS)
    assert set(OPTIONS) <= set(ATTENTIONS), "options listed for a layer that is not registered"
