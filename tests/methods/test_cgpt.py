"""methods/cgpt.py: the correlated-GP attention layers (CGPT, sparse CGPT) and their methods.

The references below write out the official layers (``CGP_LAYER.forward`` of
MinhLong210/CGP-Transformers ``CIFAR10/cgp_layer_vit.py`` and ``SCGP_LAYER.forward`` of
``CIFAR10/scgp_layer_vit.py``, b1257a5) head by head in numpy float64, step for step as
there: explicit inverses (``torch.linalg.inv``), f_K = (K_kk + jI) v carried through
(K_kk + jI)^{-1} f_K f_Kᵀ (K_kk + jI)^{-1}, triangular solves against the Cholesky factors
where the official code uses them, and the regulariser's D×D sums and absolute log-det.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bench.core.registry import ATTENTIONS, METHODS
from bench.config.spec import ModelConfig
from bench.train.vit import make_attention
from methods.cgpt import CGPAttention, SparseCGPAttention, init_from_stage1
from tests.helpers.suites import run_in_process, tiny_suite

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DIM, HEADS, N = 8, 2, 5
J = 1e-6


def kern(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The official ``kernel_std``: exp(-0.5 * sum_d (a_id - b_jd)^2)."""
    return np.exp(-0.5 * ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))


def weights(layer) -> dict[str, np.ndarray]:
    return {n: p.detach().double().numpy() for n, p in layer.named_parameters()}


def split_heads(t: np.ndarray, h: int) -> np.ndarray:
    n, c = t.shape
    return t.reshape(n, h, c // h).transpose(1, 0, 2)  # [H, N, D]


def make_dense(seed: int = 0) -> CGPAttention:
    torch.manual_seed(seed)
    layer = make_attention(ModelConfig(dim=DIM, heads=HEADS, dropout=0.0), N, ("cgp", {"jitter": J, "reg_weight": 0.7}))
    layer = layer.double()
    with torch.no_grad():
        for lin in (layer.q, layer.k, layer.x0, layer.v):
            lin.weight.mul_(0.8)
        layer.sigma_q.fill_(1.3)  # off their init, and different: a swapped σ shows
        layer.sigma_k.fill_(1.15)
    return layer


def dense_reference(layer: CGPAttention, x: np.ndarray, eps: np.ndarray, eps0: np.ndarray):
    """(output [B, N, C], regulariser) of the official ``CGP_LAYER.forward``."""
    w = weights(layer)
    b_, n, c = x.shape
    h = layer.heads
    sq, sk = float(w["sigma_q"][0]), float(w["sigma_k"][0])
    inv, chol, solve = np.linalg.inv, np.linalg.cholesky, np.linalg.solve
    eye = np.eye(n)
    out = np.zeros((b_, n, c))
    q_terms, k_terms, q_logs, k_logs = np.zeros(b_), np.zeros(b_), [], []
    for bb in range(b_):
        q, k, x0, v = (split_heads(x[bb] @ w[f"{name}.weight"].T, h) for name in ("q", "k", "x0", "v"))
        heads = []
        for hh in range(h):
            qh, kh, x0h, vh = q[hh], k[hh], x0[hh], v[hh]
            K_kk = sk**2 * kern(kh, kh)
            K_qq = sq**2 * kern(qh, qh)
            K_0 = kern(x0h, x0h)
            K_qk = kern(qh, x0h) @ inv(K_0 + J * eye) @ kern(x0h, kh)
            f_K = (K_kk + J * eye) @ vh
            chol_K_0 = chol(K_0 + J * eye)
            z0 = chol_K_0 @ eps0[bb, hh]
            chol_K_kk = chol(K_kk + J * eye)
            mean = K_qk @ vh
            v0 = solve(chol_K_kk, kern(kh, x0h))
            E = K_0 - v0.T @ v0
            E = E + kern(x0h, kh) @ inv(K_kk + J * eye) @ f_K @ f_K.T @ inv(K_kk + J * eye) @ kern(kh, x0h)
            v1 = solve(chol_K_0, kern(qh, x0h).T)
            covar = K_qq - v1.T @ v1
            covar = covar + kern(qh, x0h) @ inv(K_0 + J * eye) @ E @ inv(K_0 + J * eye) @ kern(x0h, qh)
            covar = covar - mean @ mean.T
            assert np.linalg.eigvalsh(covar).min() > 0  # no jitter escalation in either code
            heads.append(mean + chol(covar + J * eye) @ eps[bb, hh])

            def log_joint(xh, f, K_xx):
                """(quadratic term, log-det half) of f under the GP conditioned on z0 at x0."""
                mean_0 = kern(xh, x0h) @ inv(K_0 + J * eye) @ z0
                vx = solve(chol_K_0, kern(xh, x0h).T)
                L = chol(K_xx - vx.T @ vx + J * eye)
                Lf = solve(L, f - mean_0)
                return (Lf.T @ Lf).sum(), np.log(np.diag(L)).sum()

            for terms, logs, (quad, logdet) in ((q_terms, q_logs, log_joint(qh, mean, K_qq)),
                                                (k_terms, k_logs, log_joint(kh, f_K, K_kk))):
                terms[bb] += quad
                logs.append(logdet)
        merged = np.concatenate(heads, axis=1)  # [N, H*D], head-major
        out[bb] = merged @ w["proj.weight"].T + w["proj.bias"]
    reg = (q_terms.mean() + 2 * abs(np.mean(q_logs))) + (k_terms.mean() + 2 * abs(np.mean(k_logs)))
    return out, reg


def make_sparse(seed: int = 0, inducing: int = 3, noise: float = 0.5) -> SparseCGPAttention:
    torch.manual_seed(seed)
    opts = {"jitter": J, "inducing": inducing, "noise": noise, "reg_weight": 1.0}
    layer = make_attention(ModelConfig(dim=DIM, heads=HEADS, dropout=0.0), N, ("scgp", opts)).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # spread the inducing points (their init puts them all near 0)
        layer.induce.weight.copy_(0.6 * torch.randn(layer.induce.weight.shape, generator=g, dtype=torch.float64))
        layer.induce.bias.copy_(0.3 * torch.randn(layer.induce.bias.shape, generator=g, dtype=torch.float64))
        for lin in (layer.q, layer.k, layer.x0, layer.v):
            lin.weight.mul_(0.8)
    return layer


def sparse_reference(layer: SparseCGPAttention, x: np.ndarray, eps: np.ndarray):
    """(output [B, N, C], regulariser) of the official ``SCGP_LAYER.forward``."""
    w = weights(layer)
    b_, n, c = x.shape
    h, d, m = layer.heads, layer.head_dim, layer.inducing
    noise = layer.noise
    inv, chol = np.linalg.inv, np.linalg.cholesky
    out = np.zeros((b_, n, c))
    fq, sq_, fk, sk_ = (np.zeros((b_, h)) for _ in range(4))
    for bb in range(b_):
        q, k, x0, v = (split_heads(x[bb] @ w[f"{name}.weight"].T, h) for name in ("q", "k", "x0", "v"))
        xm_all = (w["induce.weight"] @ x[bb] + w["induce.bias"][:, None]).T  # fc_induce_m(x^T): [C, M]
        heads = []
        for hh in range(h):
            qh, kh, x0h, vh = q[hh], k[hh], x0[hh], v[hh]
            xm = xm_all[hh * d:(hh + 1) * d].T  # .view(b, h, d, M).permute(0, 1, 3, 2): [M, D]
            xl = xm
            z_K = vh
            K_0 = kern(x0h, x0h)
            K_mm = kern(xm, xm)
            K_qm = kern(qh, xm)
            K_mq = K_qm.T
            K_0m = kern(x0h, xm)
            K_m0 = K_0m.T
            K_mm_inv = inv(K_mm + 1 / noise**2 * K_m0 @ K_0m)
            K_ll = kern(xl, xl)
            K_0l = kern(x0h, xl)
            K_l0 = K_0l.T
            K_kl = kern(kh, xl)
            K_lk = K_kl.T
            K_ll_inv = inv(K_ll + 1 / noise**2 * K_lk @ K_kl)
            K_qk = (1 / noise**4) * K_qm @ K_mm_inv @ K_m0 @ K_0l @ K_ll_inv @ K_lk
            mean = K_qk @ vh
            quad_z0_zk = noise**2 * np.eye(n) + K_0l @ (
                K_ll_inv + 1 / noise**4 * K_ll_inv @ K_lk @ z_K @ z_K.T @ K_kl @ K_ll_inv) @ K_l0
            quad_zq_zk = noise**2 * np.eye(n) + K_qm @ (
                K_mm_inv + 1 / noise**4 * K_mm_inv @ K_m0 @ quad_z0_zk @ K_0m @ K_mm_inv) @ K_mq
            covar = quad_zq_zk - mean @ mean.T
            assert np.linalg.eigvalsh(covar).min() > 0
            heads.append(mean + chol(covar + J * np.eye(n)) @ eps[bb, hh])
            K_mm_inv2 = inv(K_mm + 1 / noise**2 * np.eye(m))
            K_ll_inv2 = inv(K_ll + 1 / noise**2 * np.eye(m))
            fq[bb, hh] = 1 / noise**4 * np.trace(K_0m @ K_mm_inv2 @ K_mq @ K_qm @ K_mm_inv2 @ K_m0 @ K_0)
            sq_[bb, hh] = np.trace(K_qm @ K_mm_inv2 @ K_mq)
            fk[bb, hh] = 1 / noise**4 * np.trace(K_0l @ K_ll_inv2 @ K_lk @ K_kl @ K_ll_inv2 @ K_l0 @ K_0)
            sk_[bb, hh] = np.trace(K_kl @ K_ll_inv2 @ K_lk)
        out[bb] = np.concatenate(heads, axis=1) @ w["proj.weight"].T + w["proj.bias"]
    return out, fq.mean() + sq_.mean() + fk.mean() + sk_.mean()


def inputs(seed: int = 3, b: int = 3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(b, N, DIM))
    return x, rng.normal(size=(b, HEADS, N, DIM // HEADS)), rng.normal(size=(b, HEADS, N, DIM // HEADS))


def test_dense_layer_output_and_regulariser_match_the_official_equations():
    layer = make_dense().train()
    x, eps, eps0 = inputs()
    want_out, want_reg = dense_reference(layer, x, eps, eps0)
    out = layer(torch.from_numpy(x), eps=torch.from_numpy(eps), eps0=torch.from_numpy(eps0))
    np.testing.assert_allclose(out.detach().numpy(), want_out, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(float(layer.last_term.detach()), want_reg, rtol=1e-7)
    np.testing.assert_allclose(float(layer.extra_loss().detach()), 0.7 * want_reg, rtol=1e-7)
    mean_only, _ = dense_reference(layer, x, 0 * eps, eps0)
    assert np.abs(want_out - mean_only).max() > 1e-2  # the sampled noise is not negligible


def test_sparse_layer_output_and_regulariser_match_the_official_equations():
    layer = make_sparse().train()
    x, eps, _ = inputs()
    want_out, want_reg = sparse_reference(layer, x, eps)
    out = layer(torch.from_numpy(x), eps=torch.from_numpy(eps))
    np.testing.assert_allclose(out.detach().numpy(), want_out, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(float(layer.last_term.detach()), want_reg, rtol=1e-7)
    mean_only, _ = sparse_reference(layer, x, 0 * eps)
    assert np.abs(want_out - mean_only).max() > 1e-2


def test_attention_is_asymmetric_and_the_regulariser_trains_every_parameter():
    layer = make_dense().train()
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    with torch.no_grad():
        mean, _, _ = layer.posterior(x, with_reg=False)
        q, k = layer.q.weight.clone(), layer.k.weight.clone()
        layer.q.weight.copy_(k)
        layer.k.weight.copy_(q)
        swapped, _, _ = layer.posterior(x, with_reg=False)
        layer.q.weight.copy_(q)
        layer.k.weight.copy_(k)
    assert (mean - swapped).abs().max() > 1e-3  # K_qk is not K_kq: queries and keys play different parts
    layer.sample = False
    layer(x).sum().backward()  # the mean K_qk v: every projection, not the σ's
    assert {n for n, p in layer.named_parameters() if p.grad is not None} == {
        "q.weight", "k.weight", "x0.weight", "v.weight", "proj.weight", "proj.bias"}
    layer.zero_grad()
    layer(x)
    layer.extra_loss().backward()  # the regulariser reaches σ_q and σ_k too
    assert all(p.grad is not None and p.grad.abs().sum() > 0
               for n, p in layer.named_parameters() if not n.startswith("proj."))


@pytest.mark.parametrize("name", ["cgp", "scgp"])
def test_padded_tokens_change_nothing_at_real_tokens(name):
    layer = (make_dense() if name == "cgp" else make_sparse()).train()
    x, eps, eps0 = (torch.from_numpy(a) for a in inputs(b=2))
    mask = torch.tensor([[True, True, True, False, False], [True, True, True, True, False]])
    other = x.clone()
    other[0, 3:] = 5 * torch.randn(2, DIM, dtype=torch.float64)
    other[1, 4:] = -3.0
    a = layer(x, mask=mask, eps=eps, eps0=eps0)
    reg_a = layer.last_term
    b = layer(other, mask=mask, eps=eps, eps0=eps0)
    torch.testing.assert_close(a[0, :3], b[0, :3])
    torch.testing.assert_close(a[1, :4], b[1, :4])
    torch.testing.assert_close(reg_a, layer.last_term)
    if name == "cgp":  # and equal the layer on the real tokens alone
        alone = layer(x[:1, :3], eps=eps[:1, :, :3], eps0=eps0[:1, :, :3])
        torch.testing.assert_close(a[:1, :3], alone)


@pytest.mark.parametrize("name", ["cgp", "scgp"])
def test_layers_sample_in_eval_mode_add_no_term_there_and_run_under_bf16_autocast(name):
    opts = {"inducing": 4} if name == "scgp" else {}
    layer = make_attention(ModelConfig(dim=16, heads=2, dropout=0.0), 6, (name, opts)).eval()
    assert type(layer).stochastic is True
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        assert not torch.equal(layer(x), layer(x))
    assert layer.extra_loss() is None and layer.loss_terms() == {}
    layer.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x.bfloat16())
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert torch.isfinite(layer.extra_loss()) and set(layer.loss_terms()) == {"cgp_reg"}


def test_methods_registered_with_the_official_cifar_defaults_and_annealing():
    assert {"cgpt", "scgpt"} <= set(METHODS.names()) and {"cgp", "scgp"} <= set(ATTENTIONS.names())
    cgpt, scgpt = METHODS.get("cgpt"), METHODS.get("scgpt")
    o, s = cgpt.Options(), scgpt.Options()
    assert (o.samples, o.jitter, o.reg_weight, o.reg_anneal, o.average) == (10, 1e-7, 0.7, False, "probs")
    assert (s.samples, s.inducing, s.noise, s.reg_weight, s.reg_anneal) == (5, 8, 0.1, 1.0, True)
    cfg = ModelConfig(dim=8, heads=2, depth=3)
    layers = scgpt(s).attention_layers(cfg)
    assert sorted(layers) == [0, 1, 2] and layers[0][0] == "scgp" and layers[0][1]["inducing"] == 8
    model = torch.nn.Sequential(make_attention(cfg, 4, layers[0]), make_attention(cfg, 4, layers[1]))
    scgpt(s).on_train_epoch(model, 3, 10)
    assert [m.anneal_weight for m in model] == [0.3, 0.3]
    cgpt(o).on_train_epoch(model, 3, 10)
    assert [m.anneal_weight for m in model] == [1.0, 1.0]
    assert any("from scratch" in line for line in cgpt(o).deviations())


def test_stage1_weights_are_copied_where_they_match():
    from bench.config.spec import ModelConfig as MC
    from tests.helpers.synthetic import squares_bundle

    data = squares_bundle()
    cfg = MC(dim=8, heads=2, depth=2, patch_size=5)
    msp = METHODS.get("msp")(METHODS.get("msp").Options()).build_model(cfg, data)
    cg = METHODS.get("cgpt")
    model = cg(cg.Options(base="msp")).build_model(cfg, data)
    fresh = init_from_stage1(model, msp.state_dict())
    state = msp.state_dict()
    torch.testing.assert_close(model.blocks[1].attn.k.weight, state["blocks.1.attn.qkv.weight"][8:16])
    torch.testing.assert_close(model.blocks[0].attn.proj.bias, state["blocks.0.attn.proj.bias"])
    torch.testing.assert_close(model.head.weight, state["head.weight"])
    assert sorted(fresh) == [f"blocks.{i}.attn.{n}" for i in (0, 1) for n in ("sigma_k", "sigma_q", "x0.weight")]


def cells(store) -> dict[str, dict]:
    """method name -> cell.json of every cell of a store."""
    out = {}
    for c in store.iterdir():
        if (c / "cell.json").is_file():
            info = json.loads((c / "cell.json").read_text())
            out[info["method"]] = info
    return out


def test_both_methods_and_the_two_stage_recipe_train_predict_and_report(tmp_path, capsys):
    methods = ("[methods.msp]\n"
               "[methods.cgpt]\nsamples = 2\n"
               "[methods.cgpt_2stage]\ntype = \"cgpt\"\nbase = \"msp\"\nsamples = 2\n"
               "[methods.scgpt]\ninducing = 4\nsamples = 2\n")
    suite = tiny_suite("hard", methods=methods)
    code, err = run_in_process(tmp_path, suite=suite, capsys=capsys)
    assert code == 0, err
    store = tmp_path / "results" / "hard"
    info = cells(store)
    assert {m: i["status"] for m, i in info.items()} == dict.fromkeys(("msp", "cgpt", "cgpt_2stage", "scgpt"), "complete")
    assert info["cgpt_2stage"]["stage1"] == {"method": "msp", "key": info["msp"]["key"], "reused": True,
                                             **{k: info["msp"][k] for k in ("train_seconds", "best_epoch", "best_val_acc")}}
    assert info["cgpt_2stage"]["config"]["stage1"] == {k: v for k, v in info["msp"]["config"].items() if k != "seed"}
    assert "stage1" not in info["cgpt"] and "stage1" not in info["cgpt"]["config"]
    for name in ("cgpt", "scgpt"):
        preds = np.load(store / info[name]["key"] / "preds" / "test.npz", allow_pickle=False)
        assert preds["log_probs"].shape == (64, 10) and np.isfinite(preds["log_probs"]).all()
        assert "entropy_of_mean" in preds  # several passes: the decomposition terms are stored
    log = (store / info["cgpt"]["key"] / "train_log.csv").read_text().splitlines()
    assert "cgp_reg" in log[0].split(",")
    efficiency = (tmp_path / "reports" / "hard" / "tables" / "efficiency.csv").read_text().splitlines()
    for name in ("cgpt", "cgpt_2stage", "scgpt"):
        row = next(line for line in efficiency if f",{name}," in line)
        assert f",{info[name]['parameters']}," in row
    # a two-stage method's training time includes its stage 1 (msp's stored cell, one seed)
    row = next(line.split(",") for line in efficiency if ",cgpt_2stage," in line)
    seconds = float(row[efficiency[0].split(",").index("train_seconds")])
    assert seconds == pytest.approx(info["cgpt_2stage"]["train_seconds"] + info["msp"]["train_seconds"])


def test_a_missing_stage1_is_trained_in_the_cell_and_a_stored_one_is_reused(tmp_path):
    import torch as th

    from bench.train.cell import stage1_state
    from bench.train.telemetry import Console
    from bench.store.plan import make_plan
    from bench.config.spec import build_suite
    from bench.store import CHECKPOINT
    from bench.train.loop import seed_everything
    from tests.helpers.synthetic import squares_bundle

    import tomllib

    raw = tomllib.loads(tiny_suite("two", methods="[methods.msp]\n[methods.cgpt]\nbase = \"msp\"\n",
                                   model={"patch_size": 5}))
    plan = make_plan(build_suite(raw))
    assert [c.method.name for c in plan.cells] == ["msp", "cgpt"]
    cell = plan.cells[1]
    data = squares_bundle()
    (tmp_path / "store").mkdir()
    seed_everything(0)
    state, how = stage1_state(cell, tmp_path / "store", data, th.device("cpu"), Console(quiet=True))
    assert how.reused is False and how.key == plan.cells[0].key
    assert "blocks.0.attn.qkv.weight" in state
    # the same triple stored under another key (another msp configuration) is not taken for it
    other = tmp_path / "store" / "0123456789abcdef"
    other.mkdir()
    (other / "cell.json").write_text(json.dumps({"dataset": "mnist5k", "method": "msp", "seed": 0}))
    (other / CHECKPOINT).write_bytes(b"")
    _, how = stage1_state(cell, tmp_path / "store", data, th.device("cpu"), Console(quiet=True))
    assert how.reused is False


def test_the_suite_checks_the_stage1_and_select_adds_it():
    from bench.core.errors import ConfigError
    from bench.config.spec import build_suite, select

    import tomllib

    raw = tomllib.loads(tiny_suite("two", methods="[methods.msp]\n[methods.cgpt]\nbase = \"msp\"\n"))
    suite = build_suite(raw)
    assert [m.name for m in select(suite, ("cgpt",)).methods] == ["msp", "cgpt"]
    for bad in ("nope", "cgpt"):
        raw = tomllib.loads(tiny_suite("two", methods=f"[methods.msp]\n[methods.cgpt]\nbase = \"{bad}\"\n"))
        with pytest.raises(ConfigError, match="methods.cgpt.base"):
            build_suite(raw)


def test_cifar_suites_run_both_with_the_official_settings_as_two_stage_recipes():
    import datasets  # noqa: F401  (the suites' data sets)
    from bench.config.spec import load_suite

    for name in ("cifar10", "cifar100"):
        by_type = {m.type: m.options for m in load_suite(name).methods if m.type in ("cgpt", "scgpt")}
        c, s = by_type["cgpt"], by_type["scgpt"]
        assert (c.samples, c.jitter, c.reg_weight, c.reg_anneal, c.base, c.average) == (10, 1e-7, 0.7, False, "msp", "probs")
        assert (s.samples, s.jitter, s.reg_weight, s.reg_anneal, s.inducing, s.noise, s.base) == (
            5, 1e-7, 1.0, True, 8, 0.1, "msp"), name
