"""The attention variants (RPC/PAP, Scaled, KDEformer, Optimised/Efficient/Super) against
their formulas computed independently here, plus parameter counts, autocast and the
validation of token-count constraints."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import methods  # noqa: F401  (registers the layers and methods)
from bench.core.errors import ConfigError
from bench.config.options import parse
from bench.core.registry import ATTENTIONS, METHODS
from bench.config.spec import ModelConfig
from bench.train.vit import make_attention

DIM, HEADS, N = 32, 4, 16
D = DIM // HEADS


def build(name: str, **options) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(dim=DIM, heads=HEADS, depth=1, dropout=0.0)
    return make_attention(cfg, N, (name, options)).eval()


def x_input(batch: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, N, DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).float()


def split_heads(t: torch.Tensor) -> torch.Tensor:
    b, n, c = t.shape
    return t.view(b, n, HEADS, c // HEADS).transpose(1, 2)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def attention(q, k, v):
    """Plain softmax(q k^T / sqrt(d)) v over the keys, written out."""
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


def test_pap_with_one_iteration_is_symmetric_attention_on_clipped_keys():
    layer = build("pap", lam=0.5, iters_train=1, iters_test=1)
    x = x_input()
    with torch.no_grad():
        k, v = (split_heads(t) for t in layer.kv(x).chunk(2, dim=-1))
        mu = N * DIM / (4 * k.abs().sum(dim=(-2, -1), keepdim=True))  # full width C, per (batch, head)
        tau = 0.5 * mu
        clipped = torch.maximum(torch.minimum(k, tau), -tau)
        expected = layer.proj(merge_heads(attention(clipped, clipped, v)))
        assert (k.abs() > tau).any() and (k.abs() < tau).any()  # the clip acts, but not everywhere
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)
    # and T = 2 differs from T = 1 (the second iteration acts)
    layer2 = build("pap", lam=0.5, iters_train=1, iters_test=2)
    layer2.load_state_dict(layer.state_dict())
    with torch.no_grad():
        assert not torch.allclose(layer2(x), expected, atol=1e-4)


def test_symmetric_attention_uses_one_projection_for_queries_and_keys():
    layer = build("symmetric")
    x = x_input()
    with torch.no_grad():
        k, v = (split_heads(t) for t in layer.kv(x).chunk(2, dim=-1))
        torch.testing.assert_close(layer(x), layer.proj(merge_heads(attention(k, k, v))), rtol=1e-5, atol=1e-6)
    assert sum(p.numel() for p in layer.parameters()) == 3 * DIM * DIM + 3 * DIM


def test_rpc_logs_the_sparsity_of_s_for_each_pap_block():
    from bench.data import DataBundle

    method = METHODS.get("rpc")(METHODS.get("rpc").Options(lam=0.5, blocks="all"))
    cfg = ModelConfig(dim=DIM, heads=HEADS, depth=2, dropout=0.0, patch_size=7)
    data = DataBundle("toy", 10, (28, 28, 1), (0.5,), (0.5,), {})
    model = method.build_model(cfg, data).train()
    model(torch.randn(2, 1, 28, 28))
    log = method.epoch_log(model)
    assert set(log) == {"pap0_s_nonzero", "pap1_s_nonzero"} and all(0.0 <= v <= 1.0 for v in log.values())
    with pytest.raises(ConfigError, match="blocks"):
        METHODS.get("rpc")(METHODS.get("rpc").Options(blocks="7")).attention_layers(cfg)


def pap_reference(layer, x: torch.Tensor, iters: int) -> torch.Tensor:
    """PAP written out from the module docstring's ADMM: ``iters`` iterations."""
    k, v = (split_heads(t).double() for t in layer.kv(x).chunk(2, dim=-1))
    mu = N * DIM / (4 * k.abs().sum(dim=(-2, -1), keepdim=True))
    tau = layer.lam * mu
    low, dual = torch.zeros_like(k), torch.zeros_like(k)
    for _ in range(iters):
        sparse = torch.sign(k - low + dual / mu) * torch.clamp((k - low + dual / mu).abs() - tau, min=0.0)
        keys = k - sparse - dual / mu
        low = attention(keys, keys, v)
        dual = dual + mu * (k - low - sparse)
    return layer.proj(merge_heads(low).float())


def test_rpc_trains_and_predicts_with_four_admm_iterations_by_default():
    """The official README's recipe: one count, 4, for training and prediction."""
    from bench.data import DataBundle

    cls = METHODS.get("rpc")
    method = cls(parse(cls.Options, {"lam": 0.5}, "methods.rpc"))
    cfg = ModelConfig(dim=DIM, heads=HEADS, depth=2, dropout=0.0, patch_size=7)
    model = method.build_model(cfg, DataBundle("toy", 10, (28, 28, 1), (0.5,), (0.5,), {}))
    layer = model.blocks[0].attn
    assert type(layer).__name__ == "PAPAttention" and type(model.blocks[1].attn).__name__ == "SymmetricAttention"
    x = x_input()
    with torch.no_grad():
        expected = pap_reference(layer, x, 4)
        assert not torch.allclose(expected, pap_reference(layer, x, 1), atol=1e-4)  # the count matters here
        torch.testing.assert_close(layer.train()(x), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer.eval()(x), expected, rtol=1e-5, atol=1e-6)
    assert method.deviations() == []


def test_rpc_mismatched_iterations_only_when_named():
    cls = METHODS.get("rpc")
    with pytest.raises(ConfigError, match=r"methods\.rpc: iters_train \(1\) and iters_test \(4\) differ.*"
                                          r"mismatched_iters = true"):
        parse(cls.Options, {"iters_train": 1}, "methods.rpc")
    method = cls(parse(cls.Options, {"iters_train": 1, "mismatched_iters": True}, "methods.rpc"))
    options = method.attention_layers(ModelConfig(dim=DIM, heads=HEADS, depth=1))[0][1]
    assert (options["iters_train"], options["iters_test"]) == (1, 4)
    assert method.deviations() == ["PAP trained with 1 ADMM iteration(s), evaluated with 4 "
                                   "(official: one count for both)"]


def test_every_builtin_suite_runs_rpc_with_one_iteration_count():
    import datasets  # noqa: F401  (the suites' data sets)
    from bench.config.spec import available_suites, load_suite

    seen = 0
    for name in available_suites():
        for m in load_suite(name).methods:
            if m.type == "rpc":
                seen += 1
                assert m.options.iters_train == m.options.iters_test == 4, (name, m.options)
    assert seen >= 3  # variants, cifar10, cifar100


def test_scaled_attention_with_s_zero_is_softmax_attention():
    for variant in ("matrix", "scalar"):
        scaled, softmax = build("scaled", variant=variant), build("softmax")
        softmax.load_state_dict({k: v for k, v in scaled.state_dict().items() if k in softmax.state_dict()})
        x = x_input()
        with torch.no_grad():
            torch.testing.assert_close(scaled(x), softmax(x), rtol=1e-5, atol=1e-6)
            if variant == "matrix":
                scaled.s.normal_()  # a non-zero S changes the output: (I - S) V
            else:
                scaled.alpha.fill_(0.7)
            assert not torch.allclose(scaled(x), softmax(x), atol=1e-4)


def test_scaled_matrix_attention_formula():
    layer = build("scaled")
    with torch.no_grad():
        layer.s.normal_(std=0.1)
        x = x_input()
        q, k, v = (split_heads(t) for t in layer.qkv(x).chunk(3, dim=-1))
        eye = torch.eye(N)
        expected = merge_heads(torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D), -1) @ ((eye - layer.s) @ v))
        torch.testing.assert_close(layer(x), layer.proj(expected), rtol=1e-5, atol=1e-6)


def test_kdeformer_with_one_bucket_and_no_samples_is_exact_attention():
    kde, softmax = build("kdeformer", bucket_size=N, samples=0), build("softmax")
    kde.load_state_dict(softmax.state_dict())  # same names and shapes: a softmax state dict loads
    x = x_input()
    with torch.no_grad():
        torch.testing.assert_close(kde(x), softmax(x), rtol=1e-4, atol=1e-5)


def test_kdeformer_error_falls_as_residual_samples_grow():
    softmax = build("softmax")
    x = x_input(batch=4)
    with torch.no_grad():
        exact = softmax(x)
        errors = []
        for m in (0, 8, 64):
            kde = build("kdeformer", bucket_size=4, samples=m)
            kde.load_state_dict(softmax.state_dict())
            torch.manual_seed(123)
            draws = [((kde(x) - exact).norm() / exact.norm()).item() for _ in range(20)]
            errors.append(sum(draws) / len(draws))
    assert errors[0] > errors[1] > errors[2] > 0, errors


def test_kdeformer_bucket_must_divide_the_tokens_at_validation():
    with pytest.raises(ConfigError, match="bucket_size 5 must divide the 16 tokens.*1, 2, 4, 8, 16"):
        build("kdeformer", bucket_size=5)


def gray_sequence(bits: int) -> np.ndarray:
    """The reflected Gray sequence by reflection: [0, 1], then the sequence followed by its
    mirror image with the top bit set (how the official code builds ``perm``)."""
    seq = np.array([0, 1])
    for b in range(1, bits):
        seq = np.concatenate([seq, seq[::-1] + 2**b])
    return seq


@pytest.mark.parametrize("bits", range(1, 8))
def test_kdeformer_ranks_codes_as_the_official_perm_by_default_and_gray_index_on_request(bits):
    """Default: code c at perm[c] (perm = the Gray sequence), i.e. c XOR (c >> 1); the
    ``gray_index`` option: c's position in that sequence.  Equal for r <= 2 only."""
    codes = torch.arange(2**bits)
    perm = gray_sequence(bits)
    official = build("kdeformer", projections=bits).rank(codes).numpy()
    np.testing.assert_array_equal(official, perm[codes.numpy()])
    np.testing.assert_array_equal(official, (codes ^ (codes >> 1)).numpy())
    old = build("kdeformer", projections=bits, ranking="gray_index").rank(codes).numpy()
    np.testing.assert_array_equal(old, np.argsort(perm)[codes.numpy()])  # the index of c in the sequence
    assert (official == old).all() == (bits <= 2)


def kde_blocks_reference(layer, q, k, v, g, ranks) -> torch.Tensor:
    """The block part of the estimator (no residual samples) written out: LSH codes from
    the directions ``g``, ``ranks`` [2^r] the bucket order, stable sorts, blocks of b,
    softmax over the keys of each query's block."""
    s = layer.logit_scale**0.5
    q, k, v = (t.double().numpy() for t in (q * s, k * s, v))
    g, ranks = g.double().numpy(), np.asarray(ranks)
    weights = 2 ** np.arange(g.shape[1])
    out = np.zeros_like(v)
    for bi, hi in np.ndindex(*q.shape[:2]):
        rank_q = ranks[((q[bi, hi] @ g > 0) * weights).sum(-1)]
        rank_k = ranks[((k[bi, hi] @ g > 0) * weights).sum(-1)]
        order_q, order_k = np.argsort(rank_q, kind="stable"), np.argsort(rank_k, kind="stable")
        for blk in range(len(order_q) // layer.bucket):
            rows, cols = (o[blk * layer.bucket:(blk + 1) * layer.bucket] for o in (order_q, order_k))
            w = np.exp(q[bi, hi, rows] @ k[bi, hi, cols].T)
            out[bi, hi, rows] = (w / w.sum(1, keepdims=True)) @ v[bi, hi, cols]
    return torch.from_numpy(out)


def test_kdeformer_forward_sorts_buckets_in_the_official_order_and_the_option_restores_the_old():
    """With r = 4 hash bits the two orders give different blocks: the default layer's
    output is the official order's blocks, ``ranking = "gray_index"`` the old order's."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, HEADS, N, D, generator=gen) for _ in range(3))
    perm = gray_sequence(4)
    torch.manual_seed(11)
    g = torch.randn(D, 4)  # the forward's one random draw after this seed: its LSH directions [D, r]
    outs = {}
    for ranking, ranks in (("gray_code", perm), ("gray_index", np.argsort(perm))):
        layer = build("kdeformer", bucket_size=4, samples=0, projections=4,
                      **({} if ranking == "gray_code" else {"ranking": ranking}))  # gray_code: the default
        torch.manual_seed(11)
        outs[ranking] = layer.estimate(q, k, v).double()
        torch.testing.assert_close(outs[ranking], kde_blocks_reference(layer, q, k, v, g, ranks), rtol=1e-5, atol=1e-6)
    assert (outs["gray_code"] - outs["gray_index"]).abs().max() > 1e-2  # different blocks, different outputs


def test_kdeformer_ranking_option_is_validated_and_reaches_every_layer():
    cls = METHODS.get("kdeformer")
    with pytest.raises(ConfigError, match=r"methods\.kdeformer\.ranking: expected one of 'gray_code', 'gray_index'"):
        parse(cls.Options, {"ranking": "gray"}, "methods.kdeformer")
    with pytest.raises(ConfigError, match="ranking must be one of"):
        build("kdeformer", ranking="gray")
    cfg = ModelConfig(dim=DIM, heads=HEADS, depth=2, dropout=0.0)
    for options, expected in (({}, "gray_code"), ({"ranking": "gray_index"}, "gray_index")):
        for train_attention in ("kdeformer", "softmax"):
            method = cls(parse(cls.Options, {**options, "train_attention": train_attention}))
            layers = method.kde_layers(cfg)
            assert {opts["ranking"] for _, opts in layers.values()} == {expected}


def test_kdeformer_swapped_in_for_prediction_keeps_the_trained_weights():
    from bench.data import DataBundle

    method = METHODS.get("kdeformer")(METHODS.get("kdeformer").Options(train_attention="softmax"))
    cfg = ModelConfig(dim=DIM, heads=HEADS, depth=2, dropout=0.0, patch_size=7)
    data = DataBundle("toy", 10, (28, 28, 1), (0.5,), (0.5,), {})
    trained = method.build_model(cfg, data)
    assert all(type(b.attn).__name__ == "SoftmaxAttention" for b in trained.blocks)
    swapped = method.prediction_model(trained, cfg, data)
    assert all(type(b.attn).__name__ == "KDEformerAttention" for b in swapped.blocks)
    for key, value in trained.state_dict().items():
        torch.testing.assert_close(swapped.state_dict()[key], value)


def pay_reference(layer, x: torch.Tensor, kind: str) -> torch.Tensor:
    """Optimised / Efficient / Super written out head by head from their formulas."""
    b, n, c = x.shape
    d_h = c // HEADS
    wq = layer.qk.weight[:c].T if kind == "optimised" else layer.qk.weight.T
    bq = layer.qk.bias[:c] if kind == "optimised" else layer.qk.bias
    heads = []
    for i in range(HEADS):
        cols = slice(i * d_h, (i + 1) * d_h)
        q_i = x @ wq[:, cols] + bq[cols]
        if kind == "optimised":
            k_i = x @ layer.qk.weight[c:].T[:, cols] + layer.qk.bias[c:][cols]
        else:
            k_i = x[..., cols]
        values = (layer.wa @ x)[..., cols] if kind == "super" else x[..., cols]
        heads.append(torch.softmax(q_i @ k_i.transpose(-2, -1) / math.sqrt(d_h), dim=-1) @ values)
    return layer.proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("kind,params", [
    ("optimised", 3 * DIM * DIM + 3 * DIM),
    ("efficient", 2 * DIM * DIM + 2 * DIM),
    ("super", 2 * DIM * DIM + 2 * DIM + N * N),
])
def test_pay_better_attention_formulas_and_parameter_counts(kind, params):
    layer = build(kind)
    x = x_input()
    with torch.no_grad():
        torch.testing.assert_close(layer(x), pay_reference(layer, x, kind), rtol=1e-5, atol=1e-6)
    assert sum(p.numel() for p in layer.parameters()) == params
    softmax_params = sum(p.numel() for p in build("softmax").parameters())
    assert softmax_params == 4 * DIM * DIM + 4 * DIM


NEW_LAYERS = [("symmetric", {}), ("pap", {"iters_train": 2}), ("scaled", {}), ("scaled", {"variant": "scalar"}),
              ("kdeformer", {"bucket_size": 4, "samples": 4}), ("optimised", {}), ("efficient", {}), ("super", {})]


@pytest.mark.parametrize("name,options", NEW_LAYERS)
@pytest.mark.parametrize("autocast", [False, True])
def test_every_new_layer_runs_forward_and_backward(name, options, autocast):
    assert name in ATTENTIONS
    layer = build(name, **options).train()
    x = x_input().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = layer(x)
    assert out.shape == x.shape and torch.isfinite(out.float()).all()
    out.float().square().mean().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters() if p.requires_grad)


def test_kdeformer_width_scale_matches_softmax_width_scale():
    kde, softmax = build("kdeformer", bucket_size=N, samples=0, scale="width"), build("softmax", scale="width")
    kde.load_state_dict(softmax.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(kde(x_input()), softmax(x_input()), rtol=1e-4, atol=1e-5)


def test_query_axis_ablation_normalises_over_the_queries():
    layer = build("efficient", axis="queries")
    x = x_input()
    with torch.no_grad():
        q = split_heads(layer.qk(x))
        k = split_heads(x)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D), dim=-2)  # columns sum to 1
        expected = layer.proj(merge_heads(weights @ split_heads(x)))
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)
