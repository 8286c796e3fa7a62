"""methods/ddu.py: the spectral-normalised ViT with a plain Linear head, its options (the
official CIFAR defaults), the suites' settings, and the method end to end: trained through
the CLI, its cell stores features as msp's do, and the report shows the ``ddu_density``
score for it when ``--scores`` asks.  The density itself is tested against scipy in
``tests/bench/scores/test_scores.py``; the spectral normalisation it shares with SNGP
(``bench/train/spectral_norm.py``) is checked here against an SVD."""
from __future__ import annotations

import csv
import gzip

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from bench.core.errors import ConfigError
from bench.config.options import parse
from bench.core.registry import METHODS
from bench.config.spec import ModelConfig
from bench.train.loop import seed_everything
from methods.ddu import DDU
from tests.helpers.suites import run_in_process, tiny_suite
from tests.helpers.synthetic import squares_bundle

MODEL = ModelConfig(patch_size=5, dim=16, depth=2, heads=2, mlp_ratio=2.0, dropout=0.0)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data():
    return squares_bundle((150, 60, 60), 0)


def method(**options) -> DDU:
    return DDU(parse(DDU.Options, options, "methods.ddu"))


def wrapped(model) -> set[str]:
    return {name for name, mod in model.named_modules() if parametrize.is_parametrized(mod, "weight")}


def test_residual_branches_are_bounded_by_the_coefficient_and_the_head_is_a_plain_linear(data):
    seed_everything(0)
    model = method(coeff=0.5).build_model(MODEL, data).train()
    assert wrapped(model) == {f"blocks.{i}.{n}" for i in range(MODEL.depth) for n in ("attn.proj", "mlp.0", "mlp.3")}
    assert type(model.head) is nn.Linear and not parametrize.is_parametrized(model.head, "weight")
    with torch.no_grad():
        for _ in range(50):  # power iterations on fixed weights: σ̂ converges to σ
            model(torch.randn(4, 1, 10, 10))
    model.eval()
    for name in wrapped(model):
        linear = model.get_submodule(name)
        raw = linear.parametrizations.weight.original.detach()
        sigma = float(torch.linalg.matrix_norm(raw, ord=2))  # an SVD, not the power iteration
        assert sigma > 0.5, "every raw weight exceeds the bound: the check is not vacuous"
        torch.testing.assert_close(linear.weight.detach(), raw * (0.5 / sigma), rtol=1e-4, atol=1e-6)
    # the official coefficient 3 leaves these small initial weights as they are
    model = method().build_model(MODEL, data).train()
    model(torch.randn(4, 1, 10, 10))
    for name in wrapped(model):
        linear = model.get_submodule(name)
        assert torch.equal(linear.weight, linear.parametrizations.weight.original), name


def test_without_spectral_norm_it_is_msps_model_and_other_attentions_are_refused(data):
    seed_everything(0)
    plain = method(spectral_norm=False).build_model(MODEL, data)
    seed_everything(0)
    msp = METHODS.get("msp")(parse(METHODS.get("msp").Options, {}, "methods.msp")).build_model(MODEL, data)
    assert wrapped(plain) == set()
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), msp.state_dict().values()))
    kep = ModelConfig(patch_size=5, dim=16, depth=2, heads=2, attention="kep_svgp")
    with pytest.raises(ConfigError, match="ddu: the attention of block"):
        method().build_model(kep, data)


def test_options_defaults_are_the_official_cifar_ones_and_validate():
    o = DDU.Options()
    assert (o.spectral_norm, o.coeff, o.spectral_norm_iterations) == (True, 3.0, 1)
    assert METHODS.get("ddu") is DDU and DDU(o).samples == 1
    for bad in ({"coeff": 0.0}, {"spectral_norm_iterations": 0}):
        with pytest.raises(ConfigError):
            parse(DDU.Options, bad, "methods.ddu")
    assert any("coefficient 6" in line for line in method(coeff=6.0).deviations())


def test_cifar_suites_run_ddu_with_the_official_settings():
    import datasets  # noqa: F401  (the suites' data sets)
    from bench.config.spec import load_suite

    for name in ("cifar10", "cifar100"):
        (m,) = [m for m in load_suite(name).methods if m.type == "ddu"]
        assert m.options == DDU.Options(), name  # the defaults are those settings, written out in the file


def test_trains_stores_features_and_the_report_shows_ddu_density(tmp_path, capsys):
    suite = tiny_suite("hard", methods="[methods.msp]\n[methods.ddu]\n", data={"splits": ["test", "ood/uniform_noise"]})
    code, err = run_in_process(tmp_path, "--scores", "msp,entropy,mahalanobis,ddu_density", suite=suite, capsys=capsys)
    assert code == 0, err
    store = tmp_path / "results" / "hard"
    cells = {}
    for cell in (c for c in store.iterdir() if (c / "cell.json").is_file()):
        _, info = only_cell_of(cell)
        cells[info["method"]] = cell
        assert info["status"] == "complete"
    assert set(cells) == {"msp", "ddu"}
    train = np.load(cells["ddu"] / "features" / "train.npz", allow_pickle=False)
    test = np.load(cells["ddu"] / "preds" / "test.npz", allow_pickle=False)
    assert train["features"].shape[1] == 16 and test["features"].shape == (64, 16)  # as msp's: width 16
    assert train["head_weight"].shape == (10, 16)
    report = tmp_path / "reports" / "hard"
    with gzip.open(report / "analysis" / "metrics.csv.gz", "rt") as f:
        rows = list(csv.DictReader(f))
    scored = {(r["method"], r["score"]) for r in rows if r.get("score")}
    assert {("ddu", "ddu_density"), ("msp", "ddu_density")} <= scored, sorted(scored)
    readme = (report / "README.md").read_text()
    assert "DDU density" in readme or "ddu_density" in readme


def only_cell_of(cell):
    import json

    return cell, json.loads((cell / "cell.json").read_text())
