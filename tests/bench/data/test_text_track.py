"""The text track's model side: token splits, the text Transformer with padding masks in
every block, text bundles with cached shift splits, MCC in the report, and the ``cola``
suite end to end on tiny files in the official ``cola_public`` format."""
from __future__ import annotations

import hashlib
import inspect
import io
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import matthews_corrcoef

import datasets  # noqa: F401  (registers the data sets)
import methods  # noqa: F401  (registers the methods and attention layers)
from bench.data import DataBundle, TokenSplit, configure_data
from bench.core.errors import ConfigError
from bench.metrics import get_metric
from bench.core.registry import DATASETS, METHODS
from bench.config.spec import ModelConfig
from bench.data.text import PAD_ID, WordTokenizer
from bench.train.loop import predict
from bench.train.vit import TextTransformer, backbone
from datasets import formats
from datasets.text_bundle import TextOptions, text_bundle
from tests.helpers import REPO
from tests.helpers.official_files import write_cola
from tests.helpers.suites import run_suite


# ---------------------------------------------------------------------------- token splits


def test_token_split_checks_its_arrays_and_masks_padding():
    ids = np.array([[5, 6, 0, 0], [0, 0, 0, 0]], dtype=np.int64)
    split = TokenSplit(ids, np.array([1, 0]))
    np.testing.assert_array_equal(split.mask, [[True, True, False, False], [True, False, False, False]])
    with pytest.raises(TypeError, match="int64"):
        TokenSplit(ids.astype(np.int32), np.array([1, 0]))
    with pytest.raises(ValueError, match="labels"):
        TokenSplit(ids, np.array([1]))


# ---------------------------------------------------------------------------- padding


def _bundle(max_len: int, texts: list[str], labels: list[int]) -> DataBundle:
    splits = {"train": (texts, np.array(labels)), "val": (texts, np.array(labels)), "test": (texts, np.array(labels))}
    return text_bundle("toy", splits, 2, TextOptions(max_len=max_len, min_freq=1))


TEXTS = ["a b c d e", "b c", "e d c b a a b", "c"]
TRAINED = [name for name in METHODS.names() if METHODS.get(name).kind == "trained"]


def _length_free(model: torch.nn.Module) -> bool:
    """No layer of the model is sized by the sequence length (so it can take a longer one)."""
    return not any("n_tokens" in inspect.signature(type(b.attn)).parameters for b in model.blocks)


@pytest.mark.parametrize("name", TRAINED)
def test_padding_changes_no_prediction(name):
    """Every trained method's model on text ignores padding: (1) noise in place of the
    padded positions' embeddings leaves the logits unchanged (every model); (2) for models
    without length-sized layers, the same texts padded to 8 or to 16 tokens give the same
    logits (KEP-SVGP's projections, Super's W_A, ... are sized by the length)."""
    cfg = ModelConfig(dim=16, depth=2, heads=2, mlp_ratio=1.0, dropout=0.0)
    method = METHODS.get(name)(METHODS.get(name).Options())
    short, long = _bundle(8, TEXTS, [0, 1, 0, 1]), _bundle(16, TEXTS, [0, 1, 0, 1])
    assert short.tokenizer.itos == long.tokenizer.itos
    torch.manual_seed(0)
    model_s = method.build_model(cfg, short)
    method.eval_mode(model_s)
    x_s = torch.from_numpy(short.get("test").x)
    assert (x_s == PAD_ID).any(dim=1).all()  # every text is padded

    def logits(model, x, seed=1):
        torch.manual_seed(seed)  # the same Monte-Carlo noise for both calls
        with torch.no_grad():
            return model(x)

    clean = logits(model_s, x_s)
    gen = torch.Generator().manual_seed(2)  # not the global RNG, which the layers sample from
    hook = model_s.tokens.register_forward_hook(
        lambda _m, inp, out: torch.where((inp[0] == PAD_ID).unsqueeze(-1), 3 * torch.randn(out.shape, generator=gen), out))
    noisy = logits(model_s, x_s)
    hook.remove()
    torch.testing.assert_close(noisy, clean, rtol=1e-5, atol=1e-5)
    assert not torch.equal(logits(model_s, x_s[:, :1].expand_as(x_s).contiguous()), clean)  # the check can fail

    if not _length_free(model_s) or name == "kdeformer":  # kdeformer's key samples depend on the length
        return
    for model in (model_s,):  # GP layers: their noise is drawn per token, so compare the posterior mean
        for m in model.modules():
            if hasattr(m, "sample"):
                m.sample = False
    clean = logits(model_s, x_s)
    model_l = method.build_model(cfg, long)
    for m in model_l.modules():
        if hasattr(m, "sample"):
            m.sample = False
    state = model_s.state_dict()
    state["pos"] = torch.cat([state["pos"], torch.randn(1, 8, 16)], dim=1)  # unseen positions: any value
    model_l.load_state_dict(state)
    method.eval_mode(model_l)
    torch.testing.assert_close(logits(model_l, torch.from_numpy(long.get("test").x)), clean, rtol=1e-5, atol=1e-5)


def test_masked_mean_pooling_and_empty_texts():
    cfg = ModelConfig(dim=8, depth=1, heads=2, dropout=0.0)
    model = TextTransformer(10, 5, 3, cfg).eval()
    ids = torch.tensor([[3, 4, 0, 0, 0], [0, 0, 0, 0, 0]])
    seen = {}
    model.blocks[-1].register_forward_hook(lambda _m, _i, out: seen.setdefault("tokens", out))
    logits = model(ids)
    tokens = seen["tokens"]
    pooled = torch.stack([tokens[0, :2].mean(0), tokens[1, :1].mean(0)])  # an empty text = one real <pad>
    torch.testing.assert_close(logits, model.head(model.norm(pooled)))
    assert torch.isfinite(logits).all()
    with pytest.raises(ValueError, match=r"\[B, 5\]"):
        model(ids[:, :4])


def test_backbone_follows_the_data():
    cfg = ModelConfig(dim=8, depth=1, heads=2, patch_size=2)
    text = _bundle(6, TEXTS, [0, 1, 0, 1])
    assert isinstance(backbone(text, cfg), TextTransformer)
    assert backbone(text, cfg).tokens.num_embeddings == text.tokenizer.vocab_size
    image = DataBundle("img", 3, (4, 4, 1), (0.5,), (0.5,), {})
    assert type(backbone(image, cfg)).__name__ == "ViT"


# ---------------------------------------------------------------------------- bundles


def test_text_bundle_vocabulary_from_train_and_cached_shift(tmp_path):
    configure_data(tmp_path)
    try:
        splits = {"train": (["good film", "bad film", "good good"], np.array([1, 0, 1])),
                  "val": (["good"], np.array([1])),
                  "test": (["unseen good film words", "bad"], np.array([1, 0])),
                  "ood/x": (["zzz"], np.array([-1]))}
        bundle = text_bundle("toy", splits, 2, TextOptions(max_len=6, min_freq=1, corruption_seed=3))
        assert set(bundle.tokenizer.itos) == {"<pad>", "<unk>", "good", "film", "bad"}  # train only
        assert bundle.image_shape is None
        test = bundle.get("test")
        assert test.x.shape == (2, 6) and test.x.dtype == np.int64 and test.y.tolist() == [1, 0]
        assert bundle.tokenizer.decode(test.x[0]) == "<unk> good film <unk>"
        shifted = bundle.get("shift/word_drop/5")
        cached = list((tmp_path / "corruptions").rglob("*.npy"))
        assert len(cached) == 1 and "text-v" in cached[0].as_posix()
        from datasets.text_corruptions import corrupt_texts
        expected = bundle.tokenizer.encode(corrupt_texts(splits["test"][0], "word_drop", 5, seed=3))
        np.testing.assert_array_equal(shifted.x, expected)
        np.save(cached[0], expected + 1)  # a second bundle reads the cached file, not recomputing
        again = text_bundle("toy", splits, 2, TextOptions(max_len=6, min_freq=1, corruption_seed=3))
        np.testing.assert_array_equal(again.get("shift/word_drop/5").x, expected + 1)
    finally:
        configure_data(None)


def test_registered_text_datasets_have_options_and_errors(tmp_path):
    for name in ("cola", "imdb", "rotten_tomatoes"):
        assert name in DATASETS
    configure_data(tmp_path)
    try:
        with pytest.raises(ConfigError, match="--download"):
            DATASETS.get("cola").load(DATASETS.get("cola").Options())
        with pytest.raises(ConfigError, match="--download"):
            DATASETS.get("imdb").load(DATASETS.get("imdb").Options())
    finally:
        configure_data(None)
    with pytest.raises(ValueError, match="val_fraction"):
        TextOptions(val_fraction=1.0)


def test_zip_download_is_md5_checked_and_extracted(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("cola_public/raw/in_domain_train.tsv", "gj04\t1\t\tA.\n")
    archive = tmp_path / "cola_public_1.1.zip"
    archive.write_bytes(buf.getvalue())
    md5 = hashlib.md5(buf.getvalue()).hexdigest()
    with pytest.raises(ConfigError, match="md5"):
        formats.download(archive.as_uri(), tmp_path / "bad", "0" * 32)
    assert not (tmp_path / "bad" / "cola_public").exists()
    formats.download(archive.as_uri(), tmp_path / "root", md5)
    assert (tmp_path / "root" / "cola_public" / "raw" / "in_domain_train.tsv").read_text() == "gj04\t1\t\tA.\n"
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../escape.txt", "x")
    (tmp_path / "evil.zip").write_bytes(evil.getvalue())
    with pytest.raises(ConfigError, match="unsafe"):
        formats.download((tmp_path / "evil.zip").as_uri(), tmp_path / "e", hashlib.md5(evil.getvalue()).hexdigest())
    assert not (tmp_path / "escape.txt").exists()


# ---------------------------------------------------------------------------- metrics


def test_per_batch_mcc_is_the_mean_of_sklearn_mcc_over_batches_of_32():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 100)
    probs = rng.dirichlet([1, 1], 100)
    pred = probs.argmax(1)
    expected = np.mean([matthews_corrcoef(labels[i:i + 32], pred[i:i + 32]) for i in range(0, 100, 32)])
    assert get_metric("mcc_per_batch")(probs, labels) == pytest.approx(expected, abs=1e-12)
    assert get_metric("mcc")(probs, labels) == pytest.approx(matthews_corrcoef(labels, pred), abs=1e-12)


# ---------------------------------------------------------------------------- end to end


def _write_bigger_cola(root: Path) -> None:
    """The official layout with enough sentences for a stratified hold-out per class."""
    write_cola(root)
    raw = root / "cola_public" / "raw"
    dev = [f"gj04\t{i % 2}\t{'' if i % 2 else '*'}\tDev sentence {i} is {'good' if i % 2 else 'bad'} here."
           for i in range(40)]
    (raw / "in_domain_dev.tsv").write_text("\n".join(dev) + "\n")


def test_cola_suite_end_to_end_shows_mcc_and_the_out_of_domain_split(tmp_path):
    """The shipped cola suite file (its preset, max_len and methods' options) predicting the
    test split, the out-of-domain split and one of its 30 text-corruption splits (the
    corruptions and their cache are tested in tests/datasets/test_text_data.py and by
    test_text_bundle_vocabulary_from_train_and_cached_shift)."""
    root = tmp_path / "data"
    _write_bigger_cola(root)
    cola = (REPO / "bench" / "suites" / "cola.toml").read_text()
    assert 'splits = ["test", "shift/*"]' in cola
    suite = tmp_path / "cola.toml"  # the file names the suite: cola, as the built-in one
    suite.write_text(cola.replace('splits = ["test", "shift/*"]',
                                  'splits = ["test", "shift/out_of_domain", "shift/word_drop/5"]'))
    proc = run_suite("--suite", str(suite), "--data-root", str(root), "--epochs", "1", "--seeds", "0",
                     "--methods", "msp,kep_svgp", "--name", "cola", "--results", str(tmp_path / "results"),
                     "--reports", str(tmp_path / "reports"), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "md5" in proc.stderr  # fixture files are not the official ones: warned, not refused
    report = tmp_path / "reports" / "cola"
    readme = (report / "README.md").read_text()
    assert "MCC (x100)" in readme and "ACC" not in readme.split("## cola", 1)[1].split("## Failed cells")[0]
    assert "For cola this column takes the place of ACC" in readme  # the conventions say what it replaces
    assert "No OOD split: CoLA has no out-of-distribution set." in readme  # why the OOD table is empty
    assert (report / "plots" / "severity_cola_mcc.png").is_file()
    summary = pd.read_csv(report / "tables" / "summary.csv")
    assert {"ece_mean", "nll_mean", "aurc_mean"} <= set(summary.columns)
    shift = pd.read_csv(report / "tables" / "shift_other.csv")
    assert "shift/out_of_domain" in set(shift["split"])
    # the MCC column holds the whole-split MCC of the stored test predictions
    from bench.store.catalog import open_store
    catalog = open_store(tmp_path / "results" / "cola")
    for method in ("msp", "kep_svgp"):
        probs, labels = catalog.predictions("cola", method, 0, "test")
        row = summary[summary["method"] == method].iloc[0]
        assert row["mcc_mean"] == pytest.approx(matthews_corrcoef(labels, probs.argmax(1)), abs=1e-9)
    cell = next((tmp_path / "results" / "cola").glob("*/tokenizer.json"))
    assert WordTokenizer.from_dict(__import__("json").loads(cell.read_text())).max_len == 100


def test_text_predictions_use_the_token_ids_unchanged():
    """``predict`` feeds token ids to the model as they are (no image normalisation)."""
    bundle = _bundle(6, TEXTS, [0, 1, 0, 1])
    method = METHODS.get("msp")(METHODS.get("msp").Options())
    torch.manual_seed(0)
    model = method.build_model(ModelConfig(dim=8, depth=1, heads=2, dropout=0.0), bundle).eval()
    split = bundle.get("test")
    lp = predict(method, model, split, bundle, torch.device("cpu"), batch_size=3).log_probs
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.from_numpy(split.x)), -1).numpy()
    np.testing.assert_allclose(lp, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["kep_svgp", "mc_dropout"])
def test_passes_on_padded_text_draw_what_whole_forwards_draw(name):
    """The shared trunk on a padded text batch (its mask goes to the trunk and, repeated,
    to the batched tails): the same logits as S whole forwards with the same seed."""
    from bench.train.loop import passes

    cfg = ModelConfig(dim=16, depth=2, heads=2, mlp_ratio=1.0, dropout=0.1)
    method = METHODS.get(name)(METHODS.get(name).Options())
    bundle = _bundle(8, TEXTS, [0, 1, 0, 1])
    torch.manual_seed(0)
    model = method.build_model(cfg, bundle)
    method.eval_mode(model)
    ids = torch.as_tensor(bundle.get("test").x)
    with torch.no_grad():
        torch.manual_seed(3)
        whole = torch.stack([model(ids) for _ in range(4)])
        torch.manual_seed(3)
        torch.testing.assert_close(passes(model, ids, 4, batched=False), whole, rtol=0, atol=0)
        torch.manual_seed(3)
        whole = model(ids.repeat(4, 1)).unflatten(0, (4, len(ids)))
        torch.manual_seed(3)
        torch.testing.assert_close(passes(model, ids, 4, batched=True), whole, rtol=1e-5, atol=1e-6)
