"""bench.train.loop (schedule, augmentation, fit, predict), the trained methods' hooks and the ViT.

Everything runs on CPU on a tiny synthetic data set built here: 10x10 grayscale images
whose class is a bright 3x3 square in a class-specific 5x5 patch, on dim noise.
Expected values come from closed forms, numpy/scipy, or models written in this file.
"""
from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch
from scipy.special import log_softmax as sp_log_softmax
from scipy.special import logsumexp as sp_logsumexp
from scipy.special import softmax as sp_softmax
from torch import nn

from bench.data import DataBundle, Split
from bench.core.errors import ConfigError, NonFiniteLoss
from bench.train.method import LossTerm, TrainedMethod
from bench.config.spec import ModelConfig, TrainConfig
from bench.train.loop import augment, decomposition_terms, fit, lr_factor, predict, seed_everything
from bench.train.vit import ViT
from methods.mc_dropout import MCDropout
from methods.msp import MSP
from tests.helpers.synthetic import squares_bundle

CPU = torch.device("cpu")
TINY = ModelConfig(patch_size=5, dim=16, depth=1, heads=2)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- data


def synthetic_bundle(seed: int = 0) -> DataBundle:
    """10x10 squares: 150 train / 60 val / 60 test."""
    return squares_bundle((150, 60, 60), seed)


@pytest.fixture(scope="module")
def data() -> DataBundle:
    return synthetic_bundle()


FIT_CFG = TrainConfig(epochs=12, batch_size=25, lr=1e-2, warmup_epochs=1, min_lr=1e-4, eval_batch_size=32)


def build(method: TrainedMethod, data: DataBundle, seed: int, model_cfg: ModelConfig = TINY) -> nn.Module:
    seed_everything(seed)
    return method.build_model(model_cfg, data)


# ----------------------------------------------------------------------------- lr_factor


@pytest.mark.parametrize("total,warmup,lr,min_lr", [(100, 10, 1e-3, 1e-5), (37, 5, 0.5, 0.0), (20, 0, 1e-2, 1e-3)])
def test_lr_factor_warmup_end_midpoint_and_monotone(total, warmup, lr, min_lr):
    f = [lr_factor(s, total, warmup, lr, min_lr) for s in range(total + 1)]
    # linear warm-up: equal steps of 1/warmup reaching exactly 1 at its last step
    for s in range(warmup):
        assert f[s] == pytest.approx((s + 1) / warmup, rel=1e-12)
    if warmup:
        assert f[warmup - 1] == pytest.approx(1.0)
    assert f[warmup] == pytest.approx(1.0)  # cosine starts at the base lr
    assert f[total] == pytest.approx(min_lr / lr, abs=1e-12)  # ends at min_lr
    assert lr_factor(total + 50, total, warmup, lr, min_lr) == pytest.approx(min_lr / lr, abs=1e-12)
    if (total - warmup) % 2 == 0:
        mid = warmup + (total - warmup) // 2
        assert f[mid] == pytest.approx((min_lr + (lr - min_lr) / 2) / lr, rel=1e-12)
    # a generic point against the closed form  min + (lr-min)(1+cos(pi t))/2
    s = warmup + (total - warmup) // 3
    t = (s - warmup) / (total - warmup)
    assert f[s] == pytest.approx((min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t))) / lr, rel=1e-12)
    after = f[warmup:]
    assert all(b <= a + 1e-15 for a, b in zip(after, after[1:]))
    assert after[0] > after[-1]  # it actually decays


# ----------------------------------------------------------------------------- augment


def random_images(b: int, c: int, h: int, w: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (b, c, h, w), generator=g, dtype=torch.int64).to(torch.uint8)  # no zeros


def crop_offsets(orig: np.ndarray, out: np.ndarray, pad: int = 4, flips=(False,)) -> list[tuple[int, int, bool]]:
    """Every (oy, ox, flipped) such that ``out`` is that window of the zero-padded ``orig``."""
    _, h, w = orig.shape
    padded = np.pad(orig, ((0, 0), (pad, pad), (pad, pad)))
    hits = []
    for oy in range(2 * pad + 1):
        for ox in range(2 * pad + 1):
            win = padded[:, oy : oy + h, ox : ox + w]
            for fl in flips:
                if np.array_equal(win[:, :, ::-1] if fl else win, out):
                    hits.append((oy, ox, fl))
    return hits


@pytest.mark.parametrize("ops", [(), ("crop",), ("flip",), ("crop", "flip")])
@pytest.mark.parametrize("channels", [1, 3])
def test_augment_preserves_shape_and_dtype(ops, channels):
    x = random_images(6, channels, 8, 12, 0)
    out = augment(x, ops, torch.Generator().manual_seed(1))
    assert out.shape == x.shape and out.dtype == torch.uint8
    if not ops:
        assert torch.equal(out, x)


def test_augment_flip_is_exact_mirror_of_flipped_samples():
    x = random_images(200, 3, 6, 7, 2)
    out = augment(x, ("flip",), torch.Generator().manual_seed(3))
    flipped = []
    for i in range(len(x)):
        same, mirror = torch.equal(out[i], x[i]), torch.equal(out[i], x[i].flip(-1))
        assert same != mirror, i  # each sample is exactly one of the two
        flipped.append(mirror)
    assert 0.3 < np.mean(flipped) < 0.7
    # the same generator seed gives the same flips; another seed other flips
    assert torch.equal(augment(x, ("flip",), torch.Generator().manual_seed(3)), out)
    assert not torch.equal(augment(x, ("flip",), torch.Generator().manual_seed(4)), out)


def test_augment_crop_is_window_of_zero_padded_image():
    x = random_images(150, 3, 8, 9, 5)
    out = augment(x, ("crop",), torch.Generator().manual_seed(6)).numpy()
    xs = x.numpy()
    offsets = []
    for i in range(len(xs)):
        hits = crop_offsets(xs[i], out[i])
        assert len(hits) == 1, (i, hits)  # all channels share one offset
        offsets.append(hits[0][:2])
    oy, ox = np.array(offsets).T
    assert oy.min() == 0 and oy.max() == 8 and ox.min() == 0 and ox.max() == 8  # the full +-4 range
    assert len(set(offsets)) > 40  # offsets vary per sample
    assert (oy != ox).any()  # the two axes are drawn independently


def test_augment_crop_of_constant_image_keeps_inside_and_pads_with_zeros():
    x = torch.full((64, 1, 10, 10), 7, dtype=torch.uint8)
    out = augment(x, ("crop",), torch.Generator().manual_seed(0)).numpy()
    for img in out[:, 0]:
        vals = set(np.unique(img).tolist())
        assert vals <= {0, 7}
        # the 7-region is one 10x10 rectangle clipped by the shift: rows and columns are all-0 or contiguous
        rows = np.flatnonzero((img == 7).any(axis=1))
        cols = np.flatnonzero((img == 7).any(axis=0))
        assert len(rows) >= 6 and len(cols) >= 6  # at most 4 pixels shifted out
        assert (img[np.ix_(rows, cols)] == 7).all()
        assert (img == 7).sum() == len(rows) * len(cols)


def test_augment_crop_and_flip_together():
    x = random_images(80, 1, 7, 7, 8)
    out = augment(x, ("crop", "flip"), torch.Generator().manual_seed(9)).numpy()
    xs = x.numpy()
    flips = []
    for i in range(len(xs)):
        hits = crop_offsets(xs[i], out[i], flips=(False, True))
        assert hits, i
        flips.append(hits[0][2])
    assert any(flips) and not all(flips)


# ----------------------------------------------------------------------------- fit


def test_fit_learns_synthetic_task(data):
    method = MSP(MSP.Options())
    model = build(method, data, 0)
    result = fit(method, model, data, FIT_CFG, CPU, seed=0)
    assert len(result.log) == FIT_CFG.epochs
    assert [r["epoch"] for r in result.log] == list(range(1, FIT_CFG.epochs + 1))
    assert result.best_val_acc >= 0.9  # chance is 1/3
    test = data.get("test")
    lp = predict(method, model, test, data, CPU, 32).log_probs
    assert (lp.argmax(1) == test.y).mean() >= 0.85
    assert result.log[-1]["train_loss"] < result.log[0]["train_loss"]
    assert result.log[-1]["lr"] == pytest.approx(FIT_CFG.min_lr)
    for row in result.log:  # msp's objective is the cross-entropy alone: its data term is all of it
        assert row["train_ce"] == pytest.approx(row["train_loss"], rel=1e-5)


def test_fit_best_epoch_is_first_max_and_model_holds_its_weights(data):
    method = MSP(MSP.Options())
    model = build(method, data, 1)
    result = fit(method, model, data, FIT_CFG, CPU, seed=1)
    accs = [r["val_acc"] for r in result.log]
    assert result.best_val_acc == max(accs)
    assert result.best_epoch == accs.index(max(accs)) + 1  # earliest of ties
    for k, v in model.state_dict().items():  # the model is left with the best weights
        assert torch.equal(v, result.state_dict[k]), k
    val = data.get("val")
    lp = predict(method, model, val, data, CPU, 1000).log_probs
    assert float((lp.argmax(1) == val.y).mean()) == result.best_val_acc
    nll = float(-lp[np.arange(len(val.y)), val.y].mean())
    assert nll == pytest.approx(result.log[result.best_epoch - 1]["val_nll"], rel=1e-5)


def test_fit_best_epoch_ties_keep_earlier(data):
    """A model whose val accuracy is constant: the first epoch must be kept."""

    class Constant(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(3))

        def forward(self, x):  # always predicts class 1; the parameter gets a zero gradient
            return torch.tensor([0.0, 1.0, 0.0]).expand(len(x), 3) + 0 * self.w

    method = MSP(MSP.Options())
    model = Constant()
    cfg = TrainConfig(epochs=3, batch_size=50, lr=1e-3, warmup_epochs=0, min_lr=0.0)
    result = fit(method, model, data, cfg, CPU, seed=0)
    accs = [r["val_acc"] for r in result.log]
    assert accs == [float((data.get("val").y == 1).mean())] * 3
    assert result.best_epoch == 1 and result.best_val_acc == accs[0]


DET_CFG = TrainConfig(epochs=3, batch_size=32, lr=5e-3, warmup_epochs=1, augment=("crop", "flip"), eval_batch_size=25)


def run_seed(data, seed):
    method = MCDropout(MCDropout.Options(samples=2))  # dropout + MC predictions use the global RNG too
    model = build(method, data, seed, ModelConfig(patch_size=5, dim=16, depth=1, heads=2, dropout=0.1))
    return fit(method, model, data, DET_CFG, CPU, seed=seed)


def test_fit_is_deterministic_for_a_seed_and_varies_with_it(data):
    a, b, c = run_seed(data, 7), run_seed(data, 7), run_seed(data, 8)
    assert a.state_dict.keys() == b.state_dict.keys()
    for k in a.state_dict:
        assert torch.equal(a.state_dict[k], b.state_dict[k]), k
    strip = lambda log: [{k: v for k, v in r.items() if k != "seconds"} for r in log]  # noqa: E731
    assert strip(a.log) == strip(b.log)
    assert a.best_epoch == b.best_epoch
    assert any(not torch.equal(a.state_dict[k], c.state_dict[k]) for k in a.state_dict)


def test_fit_seed_alone_changes_training(data):
    """Same initial weights, different ``seed`` of fit (batch order, augmentation)."""
    method = MSP(MSP.Options())
    m1 = build(method, data, 0)
    m2 = build(method, data, 0)
    cfg = TrainConfig(epochs=2, batch_size=32, lr=5e-3, warmup_epochs=0, augment=("flip",))
    r1 = fit(method, m1, data, cfg, CPU, seed=1)
    r2 = fit(method, m2, data, cfg, CPU, seed=2)
    assert any(not torch.equal(r1.state_dict[k], r2.state_dict[k]) for k in r1.state_dict)


class NaNAfter(MSP):
    """Cross-entropy for ``ok`` steps, then a non-finite value."""

    def __init__(self, ok: int, bad: float) -> None:
        super().__init__(MSP.Options())
        self.ok, self.bad, self.calls = ok, bad, 0

    def training_loss(self, model, logits, labels):
        self.calls += 1
        loss = super().training_loss(model, logits, labels)
        return loss if self.calls <= self.ok else loss * torch.tensor(self.bad)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_fit_raises_nonfinite_loss_with_epoch(data, bad):
    cfg = TrainConfig(epochs=3, batch_size=50, lr=1e-3, warmup_epochs=0)  # 150 / 50 = 3 steps per epoch
    method = NaNAfter(ok=4, bad=bad)  # the 5th step is step 2 of epoch 2
    model = build(method, data, 0)
    with pytest.raises(NonFiniteLoss, match=r"epoch 2, step 2 of 3\b"):
        fit(method, model, data, cfg, CPU, seed=0)
    assert method.calls == 6  # the step loop never waits for the flag: it is read at the epoch's end


def test_fit_nan_on_first_step_names_epoch_1(data):
    cfg = TrainConfig(epochs=2, batch_size=50, lr=1e-3, warmup_epochs=0)
    method = NaNAfter(ok=0, bad=float("nan"))
    with pytest.raises(NonFiniteLoss, match=r"epoch 1, step 1\b"):
        fit(method, build(method, data, 0), data, cfg, CPU, seed=0)


# ----------------------------------------------------------------------------- training_loss


class Regulariser(LossTerm, nn.Module):
    def __init__(self, value):
        super().__init__()
        self.value = value
        self.w = nn.Parameter(torch.tensor([1.5, -2.0]))

    def extra_loss(self):
        if self.value is None:
            return None
        if self.value == "param":
            return (self.w**2).sum()
        return torch.tensor(self.value)


def ce_numpy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(-sp_log_softmax(logits.astype(np.float64), axis=1)[np.arange(len(labels)), labels].mean())


def test_training_loss_is_cross_entropy_plus_extra_losses():
    rng = np.random.default_rng(0)
    logits_np = rng.normal(size=(9, 4)).astype(np.float32)
    labels_np = rng.integers(0, 4, 9)
    logits, labels = torch.from_numpy(logits_np), torch.from_numpy(labels_np)
    method = MSP(MSP.Options())
    ce = ce_numpy(logits_np, labels_np)

    plain = nn.Sequential(nn.Linear(2, 2))
    assert method.training_loss(plain, logits, labels).item() == pytest.approx(ce, abs=1e-6)

    c = 0.625
    one = nn.Sequential(nn.Linear(2, 2), Regulariser(c))
    assert method.training_loss(one, logits, labels).item() == pytest.approx(ce + c, abs=1e-6)
    diff = method.training_loss(one, logits, labels) - method.training_loss(plain, logits, labels)
    assert diff.item() == pytest.approx(c, abs=1e-6)

    # nested modules are found, every term is added, None contributes nothing
    nested = nn.Sequential(Regulariser(c), nn.Sequential(nn.Linear(2, 2), Regulariser(3.0)), Regulariser(None))
    assert method.training_loss(nested, logits, labels).item() == pytest.approx(ce + c + 3.0, abs=1e-5)


def test_extra_loss_is_differentiated():
    logits = torch.zeros(2, 3, requires_grad=True)
    labels = torch.tensor([0, 2])
    reg = Regulariser("param")
    loss = MSP(MSP.Options()).training_loss(nn.Sequential(reg), logits, labels)
    assert loss.item() == pytest.approx(math.log(3) + 1.5**2 + 2.0**2, abs=1e-6)
    loss.backward()
    np.testing.assert_allclose(reg.w.grad.numpy(), [3.0, -4.0], rtol=1e-6)  # d/dw sum w^2 = 2w


# ----------------------------------------------------------------------------- predict


class Scripted(nn.Module):
    """Pass k of each batch returns ``table[k % S, i]`` for sample i, read from pixel (0,0).

    With mean 0 and std 1/255 the normalised input equals the raw pixel value, so the
    sample index can be carried in the image."""

    def __init__(self, table: np.ndarray) -> None:
        super().__init__()
        self.table = torch.from_numpy(table)
        self.calls = 0  # passes run (over all batches)
        self.passes_per_image: collections.Counter = collections.Counter()
        self.modes: list[bool] = []

    def forward(self, x):
        """One call may hold several passes of a batch (the batch repeated): row j is pass
        j // B of its call, B = the rows before the first image comes round again."""
        idx = x[:, 0, 0, 0].round().long()
        again = (idx[1:] == idx[0]).nonzero()
        b = int(again[0]) + 1 if len(again) else len(idx)
        passes = torch.arange(len(idx)) // b
        out = self.table[(self.calls + passes) % len(self.table), idx]
        self.calls += len(idx) // b
        self.passes_per_image.update(idx.tolist())
        self.modes.append(self.training)
        return out


def index_bundle(n: int) -> DataBundle:
    x = np.zeros((n, 4, 4), dtype=np.uint8)
    x[:, 0, 0] = np.arange(n)
    split = Split(x, np.zeros(n, dtype=np.int64))
    return DataBundle("idx", 4, (4, 4, 1), (0.0,), (1.0 / 255.0,), {"val": lambda: split})


def test_predict_rgb_channels_reach_the_model_in_nchw_order():
    """[N, H, W, C] uint8 images arrive as [N, C, H, W]; channel 2 carries the index."""
    n = 9
    x = np.zeros((n, 4, 6, 3), dtype=np.uint8)
    x[:, 0, 0, 0] = 200  # other channels hold distractors
    x[:, 0, 0, 1] = 100
    x[:, 0, 0, 2] = np.arange(n)
    split = Split(x, np.zeros(n, dtype=np.int64))
    data = DataBundle("rgb", 3, (4, 6, 3), (0.0, 0.0, 0.0), (1 / 255,) * 3, {"val": lambda: split})
    table = np.random.default_rng(0).normal(size=(1, n, 3)).astype(np.float32)

    class Channel2(Scripted):
        def forward(self, x):
            assert x.shape[1:] == (3, 4, 6)
            return super().forward(x[:, 2:])

    lp = predict(MSP(MSP.Options()), Channel2(table), split, data, CPU, 4).log_probs
    np.testing.assert_allclose(lp, sp_log_softmax(table[0].astype(np.float64), axis=-1), atol=1e-5)


@pytest.mark.parametrize("batch_passes", [False, True])  # S forwards, or one of the batch repeated S times
@pytest.mark.parametrize("average", ["logits", "probs"])
@pytest.mark.parametrize("samples,batch", [(5, 4), (1, 100), (3, 11)])
def test_predict_averaging_rules(average, samples, batch, batch_passes):
    n, c = 11, 4
    rng = np.random.default_rng(samples * 10 + batch)
    table = (3.0 * rng.normal(size=(samples, n, c))).astype(np.float32)
    data = index_bundle(n)
    model = Scripted(table)
    model.train()
    method = MCDropout(MCDropout.Options(samples=samples, average=average))
    lp = predict(method, model, data.get("val"), data, CPU, batch, batch_passes=batch_passes).log_probs

    t = table.astype(np.float64)
    if average == "logits":
        expected = sp_log_softmax(t.mean(axis=0), axis=-1)
    else:
        expected = np.log(sp_softmax(t, axis=-1).mean(axis=0))
    assert lp.dtype == np.float32 and lp.shape == (n, c)
    np.testing.assert_allclose(lp, expected, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(sp_logsumexp(lp.astype(np.float64), axis=1), 0.0, atol=1e-5)
    assert model.passes_per_image == {i: samples for i in range(n)}
    assert not any(model.modes)  # eval mode for every pass (no Dropout modules here)


def test_predict_probs_and_logits_differ_when_passes_disagree():
    table = np.array([[[4.0, 0.0]], [[0.0, 4.0]], [[0.0, 4.0]]], dtype=np.float32)
    data = index_bundle(1)
    out = {}
    for avg in ("logits", "probs"):
        method = MCDropout(MCDropout.Options(samples=3, average=avg))
        out[avg] = predict(method, Scripted(table), data.get("val"), data, CPU, 8).log_probs
    # logits: mean logit (4/3, 8/3); probs: mean of (s, 1-s), (1-s, s), (1-s, s), s = sigmoid(4)
    s = 1 / (1 + math.exp(-4))
    np.testing.assert_allclose(np.exp(out["logits"][0]), sp_softmax([4 / 3, 8 / 3]), rtol=1e-5)
    np.testing.assert_allclose(np.exp(out["probs"][0]), [(s + 2 * (1 - s)) / 3, (1 - s + 2 * s) / 3], rtol=1e-5)


def test_mc_dropout_eval_mode_keeps_only_dropout_on():
    method = MCDropout(MCDropout.Options())
    model = ViT((10, 10, 1), 3, ModelConfig(patch_size=5, dim=16, depth=2, heads=2, dropout=0.3))
    model.eval()
    method.eval_mode(model)
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    others = [m for m in model.modules() if not isinstance(m, nn.Dropout)]
    assert len(dropouts) >= 3 and others
    assert all(m.training for m in dropouts)
    assert not any(m.training for m in others)
    # and it holds when starting from train mode too
    model.train()
    method.eval_mode(model)
    assert all(m.training for m in dropouts) and not any(m.training for m in others)


def test_msp_predict_deterministic_and_mc_dropout_stochastic(data):
    cfg = ModelConfig(patch_size=5, dim=16, depth=1, heads=2, dropout=0.3)
    val = data.get("val")
    msp = MSP(MSP.Options())
    model = build(msp, data, 0, cfg)
    model.train()
    a = predict(msp, model, val, data, CPU, 16).log_probs
    b = predict(msp, model, val, data, CPU, 60).log_probs
    np.testing.assert_array_equal(a, b)
    assert not model.training and not any(m.training for m in model.modules())
    assert msp.samples == 1

    mc = MCDropout(MCDropout.Options(samples=4))
    c = predict(mc, model, val, data, CPU, 60).log_probs
    d = predict(mc, model, val, data, CPU, 60).log_probs
    assert not np.array_equal(c, d)  # dropout really samples at test time


# ----------------------------------------------------------------------------- ViT


@pytest.mark.parametrize("shape", [(10, 10, 1), (8, 12, 3)])
@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_vit_output_shape(shape, pool):
    h, w, c = shape
    model = ViT(shape, 7, ModelConfig(patch_size=2, dim=16, depth=2, heads=4, pool=pool))
    out = model(torch.randn(5, c, h, w))
    assert out.shape == (5, 7)
    assert torch.isfinite(out).all()
    assert (model.cls is not None) == (pool == "cls")


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_vit_pooling_reads_the_right_tokens(pool):
    """The head sees LayerNorm(class token) (prepended, index 0) or LayerNorm(mean of the tokens)."""
    torch.manual_seed(1)
    model = ViT((8, 8, 1), 3, ModelConfig(patch_size=4, dim=8, depth=1, heads=2, dropout=0.0, pool=pool)).eval()
    with torch.no_grad():
        model.norm.weight.normal_()  # a non-trivial affine map: norm-then-pool would differ
        model.norm.bias.normal_()
    seen = {}
    model.blocks[-1].register_forward_hook(lambda _m, _i, out: seen.setdefault("tokens", out))
    with torch.no_grad():
        out = model(torch.randn(3, 1, 8, 8))
        tokens = seen["tokens"]
        assert tokens.shape == (3, 4 + (pool == "cls"), 8)  # 2x2 patches (+ class token)
        pooled = tokens[:, 0] if pool == "cls" else tokens.mean(dim=1)
        normed = nn.functional.layer_norm(pooled, (8,), model.norm.weight, model.norm.bias, model.norm.eps)
        torch.testing.assert_close(out, model.head(normed))


@pytest.mark.parametrize("shape", [(10, 10, 1), (10, 12, 3), (12, 10, 3)])
def test_vit_patch_size_must_divide_image(shape):
    with pytest.raises(ConfigError, match="patch_size"):
        ViT(shape, 3, ModelConfig(patch_size=4, dim=16, depth=1, heads=2))


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_vit_gradients_reach_every_parameter(pool):
    torch.manual_seed(0)
    model = ViT((8, 8, 3), 4, ModelConfig(patch_size=4, dim=16, depth=2, heads=2, dropout=0.0, pool=pool))
    out = model(torch.randn(6, 3, 8, 8))
    nn.functional.cross_entropy(out, torch.tensor([0, 1, 2, 3, 0, 1])).backward()
    names = [n for n, _ in model.named_parameters()]
    assert "pos" in names and ("cls" in names) == (pool == "cls")
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("batch_passes", [False, True])
@pytest.mark.parametrize("average", ["logits", "probs"])
def test_predict_stores_the_decomposition_terms(average, batch_passes):
    """entropy_of_mean = H[mean_s p_s] and mean_entropy = mean_s H[p_s] (scipy), whatever
    the predictive's averaging rule; their difference (mutual information) is >= 0."""
    from scipy.stats import entropy as sp_entropy

    n, c, samples = 9, 5, 4
    table = (2.5 * np.random.default_rng(7).normal(size=(samples, n, c))).astype(np.float32)
    data = index_bundle(n)
    method = MCDropout(MCDropout.Options(samples=samples, average=average))
    extras = predict(method, Scripted(table), data.get("val"), data, CPU, 4, extras=True, batch_passes=batch_passes)
    p = sp_softmax(table.astype(np.float64), axis=-1)  # [S, N, C]
    np.testing.assert_allclose(extras.entropy_of_mean, sp_entropy(p.mean(axis=0), axis=-1), atol=1e-5)
    np.testing.assert_allclose(extras.mean_entropy, sp_entropy(p, axis=-1).mean(axis=0), atol=1e-5)
    assert (extras.entropy_of_mean - extras.mean_entropy >= -1e-6).all()
    # a single pass has no decomposition (only its logits)
    single = predict(MSP(MSP.Options()), Scripted(table[:1]), data.get("val"), data, CPU, 4, extras=True)
    assert set(single.arrays()) == {"log_probs", "labels", "logits"}


def test_the_torch_decomposition_terms_agree_with_the_numpy_decomposition():
    """bench.train.loop.decomposition_terms (torch, on the device while predicting) and
    bench.metrics.decompose (numpy, analysis) are one formula: the same total and
    aleatoric terms, one-hot rows (0 log 0) included."""
    from bench.metrics import decompose, mutual_information

    samples, n, c = 6, 11, 7
    logits = 3.0 * np.random.default_rng(3).normal(size=(samples, n, c))
    logits[:, 0] = [-np.inf] * (c - 1) + [0.0]  # a one-hot row in every pass
    sample_lp = torch.log_softmax(torch.tensor(logits), dim=-1)
    mean_lp = torch.logsumexp(sample_lp, dim=0) - math.log(samples)
    total, aleatoric = decomposition_terms(sample_lp, mean_lp)
    expected = decompose(np.exp(sample_lp.numpy()))
    np.testing.assert_allclose(total.numpy(), expected["total"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(aleatoric.numpy(), expected["aleatoric"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mutual_information(total.numpy(), aleatoric.numpy()), expected["epistemic"],
                               rtol=1e-12, atol=1e-12)
    assert total[0] == 0.0 and aleatoric[0] == 0.0


def test_only_declared_loss_terms_and_monte_carlo_options_count():
    """The two method contracts are explicit: a module with an ``extra_loss`` attribute that
    does not derive from LossTerm adds nothing, and passes come only from MonteCarlo options
    (a misspelt option in a suite is a validation error, not a silent single pass)."""
    from dataclasses import dataclass

    from bench.train.method import MonteCarlo
    from bench.config.spec import build_suite

    class Lookalike(nn.Module):
        def extra_loss(self):
            return torch.tensor(100.0)

    logits, labels = torch.zeros(2, 3), torch.tensor([0, 1])
    method = MSP(MSP.Options())
    assert method.training_loss(nn.Sequential(Lookalike()), logits, labels).item() == pytest.approx(math.log(3))

    class Stochastic(TrainedMethod):
        @dataclass(frozen=True)
        class Options(MonteCarlo):
            samples: int = 4

    assert (Stochastic(Stochastic.Options()).samples, Stochastic(Stochastic.Options()).average) == (4, "probs")
    assert MSP(MSP.Options()).samples == 1
    with pytest.raises(ConfigError, match="sampels"):
        build_suite({"name": "x", "datasets": {"mnist5k": {}}, "methods": {"mc_dropout": {"sampels": 5}}})


def test_a_resumed_fit_ends_with_the_uninterrupted_weights(data):
    """Checkpoint every 2 epochs; resuming from each saved state (through torch.save and
    torch.load(weights_only=True), as the runner does) ends bit for bit where the
    uninterrupted run ends: weights, best epoch, log and predictions, and the resumed run's
    later checkpoints hold what the uninterrupted run's do (the same entries, in the same
    order, with the same contents; only the seconds differ).  MC Dropout, with
    augmentation, so the global RNG, the data generator and the schedule all matter."""
    import dataclasses
    import io

    from bench.train.state import state_digest

    cfg = dataclasses.replace(DET_CFG, epochs=6, checkpoint_every=2)
    mcfg = ModelConfig(patch_size=5, dim=16, depth=1, heads=2, dropout=0.1)
    method = MCDropout(MCDropout.Options(samples=2))

    def saver(states: list[bytes]):
        def save(state):
            buf = io.BytesIO()
            torch.save(state, buf)
            states.append(buf.getvalue())
        return save

    def contents(blob: bytes) -> tuple[list[str], str]:
        state = torch.load(io.BytesIO(blob), weights_only=True)
        names = list(state)
        del state["seconds"]
        state["log"] = strip(state["log"])
        return names, state_digest(state)

    def test_predictions(model) -> np.ndarray:
        torch.manual_seed(7)
        return predict(method, model, data.get("test"), data, CPU, 32).log_probs

    strip = lambda log: [{k: v for k, v in r.items() if k != "seconds"} for r in log]  # noqa: E731
    states: list[bytes] = []
    full_model = build(method, data, 3, mcfg)
    full = fit(method, full_model, data, cfg, CPU, seed=3, on_checkpoint=saver(states))
    full_lp = test_predictions(full_model)
    assert [torch.load(io.BytesIO(s), weights_only=True)["epoch"] for s in states] == list(range(2, cfg.epochs, 2))
    for i in (0, len(states) - 1):
        state = torch.load(io.BytesIO(states[i]), weights_only=True)
        seed_everything(99)  # a different process state: everything must come from the checkpoint
        later: list[bytes] = []
        model = build(method, data, 99, mcfg)
        resumed = fit(method, model, data, cfg, CPU, seed=3, resume=state, on_checkpoint=saver(later))
        for k in full.state_dict:
            assert torch.equal(full.state_dict[k], resumed.state_dict[k]), k
        assert resumed.best_epoch == full.best_epoch and strip(resumed.log) == strip(full.log)
        np.testing.assert_array_equal(test_predictions(model), full_lp)
        assert [contents(b) for b in later] == [contents(b) for b in states[i + 1:]]


# ------------------------------------------------------- Monte-Carlo passes share the trunk

from bench.core.registry import METHODS  # noqa: E402
from bench.train.loop import Normalize, passes, to_tensor  # noqa: E402

TRAINED = [name for name in METHODS.names() if METHODS.get(name).kind == "trained"]
PASS_MODEL = ModelConfig(patch_size=5, dim=32, depth=3, heads=2, mlp_ratio=2.0, dropout=0.1)


def _in_prediction_mode(name: str, data):
    method = METHODS.get(name)(METHODS.get(name).Options())
    seed_everything(0)
    model = method.build_model(PASS_MODEL, data)
    method.eval_mode(model)
    x = Normalize(data, torch.device("cpu"))(to_tensor(data.get("test"), torch.device("cpu"))[0][:24])
    return method, model, x


@pytest.mark.parametrize("name", TRAINED)
def test_passes_draw_what_whole_forwards_draw(name, one_torch_thread):
    """For every trained method, S passes that share the deterministic trunk give what S
    whole forwards give with the same seed (the trunk draws no random numbers), one by one
    and batched (the batch repeated S times through the whole model)."""
    method, model, x = _in_prediction_mode(name, squares_bundle((60, 30, 30), 0))
    s = max(method.samples, 3)
    with torch.no_grad():
        torch.manual_seed(5)
        whole = torch.stack([model(x) for _ in range(s)])
        torch.manual_seed(5)
        torch.testing.assert_close(passes(model, x, s, batched=False), whole, rtol=0, atol=0)
        torch.manual_seed(5)
        whole = model(x.repeat(s, 1, 1, 1)).unflatten(0, (s, len(x)))
        torch.manual_seed(5)
        torch.testing.assert_close(passes(model, x, s, batched=True), whole, rtol=1e-5, atol=1e-6)


def _block_calls(model) -> list[int]:
    calls = [0] * len(model.blocks)
    for i, block in enumerate(model.blocks):
        block.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


@pytest.mark.parametrize("name,once", [("kep_svgp", 2), ("msp", 3), ("mc_dropout", 0), ("sgpa", 0)])
def test_blocks_before_the_first_noisy_one_run_once(name, once, one_torch_thread):
    """KEP-SVGP samples in its last block only: its first two of three blocks run once per
    batch, the last S times; MC Dropout (dropout everywhere, embedding included) and SGPA
    (a GP in every block) keep S whole passes; a deterministic model runs once."""
    method, model, x = _in_prediction_mode(name, squares_bundle((60, 30, 30), 0))
    calls = _block_calls(model)
    with torch.no_grad():
        passes(model, x, 10, batched=False)
    assert calls == [1] * once + [10] * (len(calls) - once)


def test_a_layer_that_does_not_say_whether_it_samples_is_taken_to(one_torch_thread):
    class PluginLayer(nn.Module):  # a plugin's attention without the ``stochastic`` declaration
        def forward(self, x, mask=None):
            return x

    _, model, _ = _in_prediction_mode("msp", squares_bundle((60, 30, 30), 0))
    assert model.deterministic_depth() == 3
    model.blocks[1].attn = PluginLayer()
    assert model.deterministic_depth() == 1


def test_training_flushes_denormals_on_cpu_and_leaves_them_after(one_torch_thread):
    """Inside fit (its per-epoch callback runs there) a product in float32's denormal range
    is flushed to zero; after fit returns the default holds again (so later numpy and
    analysis code computes as usual)."""
    def tiny_product() -> float:
        return float(torch.tensor(1e-30) * torch.tensor(1e-10))  # 1e-40: a float32 denormal

    assert tiny_product() > 0
    inside = []
    data = squares_bundle((60, 30, 30), 0)
    cfg = TrainConfig(epochs=1, batch_size=30, lr=1e-3, warmup_epochs=0, min_lr=0.0)
    fit(MSP(MSP.Options()), build(MSP(MSP.Options()), data, 0), data, cfg, CPU, seed=0,
        on_epoch=lambda _: inside.append(tiny_product()))
    assert inside == [0.0] and tiny_product() > 0
