"""bench/train/vit.py: one place builds attention; methods only name the blocks they replace.

Models are built from a suite file with ``[model] preset = "vit_cifar_paper"`` exactly as
the runner builds them, and compared block by block with MSP's model; the readout and the
embedding are checked against a hand-written forward pass.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import datasets  # noqa: F401  (registers the datasets)
import methods  # noqa: F401  (registers the methods)
from bench.data import DataBundle
from bench.core.errors import ConfigError
from bench.core.registry import METHODS
from bench.config.spec import ModelConfig, load_suite
from bench.train.vit import SoftmaxAttention, ViT

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CIFAR_LIKE = DataBundle("cifar_like", 10, (32, 32, 3), (0.5,) * 3, (0.25,) * 3, {})

SUITE = """
seeds = [0]
[model]
preset = "vit_cifar_paper"
[datasets.cifar10]
[methods.msp]
[methods.kep_svgp]
[methods.sgpa]
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = tmp_path_factory.mktemp("suite") / "paper.toml"
    path.write_text(SUITE)
    suite = load_suite(str(path))
    out = {}
    for name in ("msp", "kep_svgp", "sgpa"):
        spec = suite.method(name)
        method = METHODS.get(spec.type)(spec.options)
        torch.manual_seed(0)
        out[name] = (method, spec.model, method.build_model(spec.model, CIFAR_LIKE))
    return out


def shapes(module: torch.nn.Module, skip: str | None = None) -> dict:
    return {n: tuple(p.shape) for n, p in module.named_parameters() if skip is None or not n.startswith(skip)}


def without_attention(block: torch.nn.Module) -> str:
    """The block's printed structure (norms, MLP, dropout rates) minus its attention."""
    return "\n".join(f"{n}: {m!r}" for n, m in block.named_children() if n != "attn")


@pytest.mark.parametrize("name", ["kep_svgp", "sgpa"])
def test_blocks_not_replaced_are_identical_to_msp(models, name):
    _, msp_cfg, reference = models["msp"]
    method, cfg, model = models[name]
    assert cfg == msp_cfg  # the same backbone configuration
    replaced = method.attention_layers(cfg)
    assert replaced, "the method replaces at least one block"
    for i, (ours, theirs) in enumerate(zip(model.blocks, reference.blocks, strict=True)):
        assert without_attention(ours) == without_attention(theirs), i
        assert shapes(ours, skip="attn.") == shapes(theirs, skip="attn."), i
        if i in replaced:
            assert type(ours.attn) is not SoftmaxAttention, i
            continue
        assert type(ours.attn) is type(theirs.attn) is SoftmaxAttention, i
        assert ours.attn.extra_repr() == theirs.attn.extra_repr(), i  # heads and softmax scale
        assert ours.attn.scale == pytest.approx(384**-0.5), i  # the preset's "width" scale
        assert shapes(ours.attn) == shapes(theirs.attn), i
    # everything outside the blocks (patches, positions, final norm, head) too
    outside = lambda m: {n: s for n, s in shapes(m).items() if not n.startswith("blocks.")}  # noqa: E731
    assert outside(model) == outside(reference)
    assert repr(model.drop) == repr(reference.drop) and repr(model.norm) == repr(reference.norm)


def test_the_methods_replace_the_blocks_the_paper_says(models):
    kinds = {name: [type(b.attn).__name__ for b in m.blocks] for name, (_, _, m) in models.items()}
    assert kinds["msp"] == ["SoftmaxAttention"] * 7
    assert kinds["kep_svgp"] == ["SoftmaxAttention"] * 6 + ["KEPSVGPAttention"]  # the last block
    assert kinds["sgpa"] == ["SGPAAttention"] * 7  # every block
    gp = models["kep_svgp"][2].blocks[-1].attn
    assert gp.n_tokens == 64 and gp.merge == "add"


def test_paper_preset_readout_is_mean_then_layernorm_then_head_and_no_embedding_dropout(models):
    _, _, model = models["msp"]
    model.train()  # dropout would be active if there were one after the embedding
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        patches = F.conv2d(x, model.patch.weight, model.patch.bias, stride=4).flatten(2).transpose(1, 2)
        torch.testing.assert_close(model.embed(x), patches + model.pos)  # no dropout, no class token
        tokens = torch.randn(2, 64, 384)
        pooled = F.layer_norm(tokens.mean(1), (384,), model.norm.weight, model.norm.bias, model.norm.eps)
        torch.testing.assert_close(model.readout(tokens), pooled @ model.head.weight.T + model.head.bias)
        # LayerNorm per token, then the mean, is a different function (the old readout)
        per_token = F.layer_norm(tokens, (384,), model.norm.weight, model.norm.bias).mean(1)
        assert not torch.allclose(model.readout(tokens), per_token @ model.head.weight.T + model.head.bias, atol=1e-3)


def test_embedding_dropout_stays_on_by_default():
    torch.manual_seed(0)
    model = ViT((8, 8, 1), 3, ModelConfig(patch_size=4, dim=8, depth=1, heads=2, dropout=0.5))
    model.train()
    x = torch.randn(4, 1, 8, 8)
    assert not torch.equal(model.embed(x), model.embed(x))


def test_replaced_block_indices_are_checked_and_bad_options_name_the_layer():
    cfg = ModelConfig(patch_size=4, dim=8, depth=2, heads=2)
    with pytest.raises(ConfigError, match=r"blocks \[2\].*depth is 2"):
        ViT((8, 8, 1), 3, cfg, {2: ("softmax", {})})
    with pytest.raises(ConfigError, match="softmax.*bad options"):
        ViT((8, 8, 1), 3, cfg, {1: ("softmax", {"nonsense": 1})})
    model = ViT((8, 8, 1), 3, cfg, {1: ("softmax", {"scale": "width"})})
    assert model.blocks[0].attn.scale == pytest.approx(4**-0.5) and model.blocks[1].attn.scale == pytest.approx(8**-0.5)
