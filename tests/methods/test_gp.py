"""methods/_gp.py: what the GP attention layers share: the annealing schedules, the
annealed loss term of ``sgpa``, ``rff_gp_attention`` and ``cgpt``/``scgpt``, and the
jitter-raising Cholesky.

Expected schedules are written out by hand; the loss terms are checked as the training
loss minus a cross-entropy computed here with scipy, against weight x (hand-computed
annealing weight) x each layer's unweighted term.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import log_softmax

from bench.config.options import parse
from bench.core.registry import METHODS
from bench.config.spec import ModelConfig
from bench.train.loop import seed_everything
from methods._gp import kl_anneal_weight, kl_anneal_weight_per_epoch, linear_anneal_weight, psd_cholesky
from tests.helpers.devices import device_params
from tests.helpers.synthetic import squares_bundle

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ModelConfig(patch_size=4, dim=8, depth=2, heads=2, mlp_ratio=1.0, dropout=0.0)


# ----------------------------------------------------------------------------- schedules


def test_per_step_ramp_reaches_one_at_half_of_the_steps():
    # 8 steps: the ramp spans steps 0..4 (half = 4), w = step / 4, then stays 1
    assert [kl_anneal_weight(s, 8) for s in range(10)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert kl_anneal_weight(0, 1) == 0.0 and kl_anneal_weight(1, 1) == 1.0
    assert kl_anneal_weight(0, 0) == 1.0  # no steps: the full weight


def test_per_epoch_ramp_adds_two_over_epochs_after_each_epoch():
    # E = 4: 0, 2/4, 4/4, then capped at 1; E = 3: 0, 2/3, min(1, 4/3); E = 5: 0, .4, .8, 1, 1
    assert [kl_anneal_weight_per_epoch(e, 4) for e in range(4)] == [0.0, 0.5, 1.0, 1.0]
    assert [kl_anneal_weight_per_epoch(e, 3) for e in range(3)] == [0.0, 2 / 3, 1.0]
    np.testing.assert_allclose([kl_anneal_weight_per_epoch(e, 5) for e in range(5)], [0.0, 0.4, 0.8, 1.0, 1.0],
                               rtol=1e-15)


def test_linear_ramp_is_epoch_over_epochs():
    assert [linear_anneal_weight(e, 4) for e in range(4)] == [0.0, 0.25, 0.5, 0.75]
    assert linear_anneal_weight(0, 0) == 0.0


# ----------------------------------------------------------------------------- the loss term


def _model(name: str, options: dict):
    method = METHODS.get(name)(parse(METHODS.get(name).Options, options))
    data = squares_bundle((20, 10, 10), 0, side=8)
    seed_everything(0)
    return method, method.build_model(TINY, data).train()


# (method, options, hook, (step or epoch, of), hand-computed annealing weight, term weight, log name)
CASES = [
    ("sgpa", {"keys_len": 3, "kl_anneal": True, "kl_weight": 0.5}, "on_train_step", (3, 8), 0.75, 0.5, "kl"),
    ("sgpa", {"keys_len": 3, "kl_anneal": True, "preset": "official"}, "on_train_epoch", (1, 4), 0.5, 1.0, "kl"),
    ("sgpa", {"keys_len": 3, "kl_weight": 2.0}, "on_train_step", (0, 8), 1.0, 2.0, "kl"),  # not annealed
    ("rff_gp_attention", {"features": 4, "kl_anneal": True, "kl_weight": 0.3}, "on_train_step", (2, 8), 0.5, 0.3, "kl"),
    ("cgpt", {"reg_anneal": True}, "on_train_epoch", (1, 4), 0.25, 0.7, "cgp_reg"),
    ("cgpt", {}, "on_train_epoch", (1, 4), 1.0, 0.7, "cgp_reg"),  # official cgpt: fixed weight
    ("scgpt", {}, "on_train_epoch", (3, 4), 0.75, 1.0, "cgp_reg"),  # official scgpt: annealed
]


@pytest.mark.parametrize("name,options,hook,when,anneal,weight,log_name", CASES)
def test_training_loss_adds_weight_times_annealing_times_each_layers_term(name, options, hook, when, anneal, weight,
                                                                           log_name):
    method, model = _model(name, options)
    getattr(method, hook)(model, *when)
    torch.manual_seed(1)
    x, y = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    logits = model(x)
    ce = -log_softmax(logits.detach().double().numpy(), axis=1)[np.arange(6), y.numpy()].mean()
    terms = [m.loss_terms() for m in model.modules() if hasattr(m, "anneal_weight")]
    assert len(terms) == TINY.depth and all(set(t) == {log_name} for t in terms)
    want = weight * anneal * sum(float(t[log_name].detach()) for t in terms)
    got = method.training_loss(model, logits, y).item() - ce
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert abs(sum(float(t[log_name].detach()) for t in terms)) > 1e-3  # the term is not trivially zero
    model.eval()
    model(x)
    assert all(m.extra_loss() is None and m.loss_terms() == {} for m in model.modules() if hasattr(m, "anneal_weight"))


# ----------------------------------------------------------------------------- Cholesky


@pytest.mark.parametrize("sync_free", [False, True])  # True: every try at once, picked on the device (CUDA's way)
def test_psd_cholesky_escalates_the_jitter_only_when_needed(sync_free):
    ok = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    chol, j = psd_cholesky(ok, 1e-6, sync_free=sync_free)
    assert float(j) == pytest.approx(1e-6, rel=1e-12)
    np.testing.assert_allclose((chol @ chol.T).numpy(), ok.numpy() + 1e-6 * np.eye(2), rtol=1e-12)
    bad = torch.diag(torch.tensor([1.0, 1.0, -5e-6], dtype=torch.float64))  # needs jitter > 5e-6
    chol, j = psd_cholesky(bad, 1e-6, sync_free=sync_free)
    assert float(j) == pytest.approx(1e-5, rel=1e-12)
    np.testing.assert_allclose((chol @ chol.T).numpy(), bad.numpy() + 1e-5 * np.eye(3), rtol=1e-12)
    # a batch takes the first jitter that works for every matrix in it
    both = torch.stack([torch.diag(torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)), bad])
    chol, j = psd_cholesky(both, 1e-6, sync_free=sync_free)
    assert float(j) == pytest.approx(1e-5, rel=1e-12)
    np.testing.assert_allclose((chol @ chol.transpose(-1, -2)).numpy(), both.numpy() + 1e-5 * np.eye(3), rtol=1e-12)
    if sync_free:  # no host read: a NaN factor, which the training loop's non-finite check catches
        assert torch.isnan(psd_cholesky(-torch.eye(2, dtype=torch.float64), 1e-6, sync_free=True)[0]).all()
    else:
        with pytest.raises(RuntimeError, match="not positive definite"):
            psd_cholesky(-torch.eye(2, dtype=torch.float64), 1e-6)


@pytest.mark.parametrize("device", device_params())
def test_psd_cholesky_gradient_when_the_first_jitter_fails(device):
    """The gradient through an escalated jitter is the one of chol(mat + j·I) at that j:
    finite, and equal between the one-by-one and the sync-free paths (on CUDA a failed
    try's factor is NaN, which must not reach the gradient)."""
    base = torch.tensor([[1.0, 0.3, 0.0], [0.3, 1.0, 0.0], [0.0, 0.0, -5e-6]], dtype=torch.float64, device=device)
    grads = []
    for sync_free in (False, True):
        mat = base.clone().requires_grad_()
        chol, j = psd_cholesky(mat, 1e-6, sync_free=sync_free)
        assert float(j) == pytest.approx(1e-5, rel=1e-12)
        (chol * torch.arange(1.0, 10.0, dtype=torch.float64, device=device).view(3, 3)).sum().backward()
        grads.append(mat.grad)
    assert torch.isfinite(grads[1]).all()
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-12)
