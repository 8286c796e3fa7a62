"""benchmarks/train_throughput.py: a tiny CPU run of the whole report, the FLOP count
against a closed form, and the original recipe's per-image transform against a hand-made crop."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import import_benchmarks

import_benchmarks()

import train_throughput as tt  # noqa: E402
from bench.core.registry import METHODS  # noqa: E402
from bench.config.spec import ModelConfig  # noqa: E402

METHODS_RUN = ("msp", "kep_svgp")
BATCHES = (4, 8)
STEPS = 2


def table(report: str, heading: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table after the line starting with ``heading``."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    first = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("|"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    header, body = rows[0], rows[2:]
    assert set(rows[1][0]) <= {"-", ":"}
    return [dict(zip(header, r)) for r in body]


def num(text: str) -> float:
    value = float(text.replace(",", "").rstrip("x%"))
    assert math.isfinite(value) and value > 0, text
    return value


@pytest.fixture(scope="module")
def report(one_torch_thread, tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp("perf") / "throughput.md"
    argv = ["--methods", ",".join(METHODS_RUN), "--batch-sizes", ",".join(map(str, BATCHES)), "--compile", "off",
            "--dim", "16", "--depth", "1", "--heads", "2", "--patch-size", "8", "--steps", str(STEPS),
            "--warmup-steps", "1", "--val-size", "8", "--loader-workers", "0", "--eval-splits", "2",
            "--eval-size", "8", "--eval-batch-size", "8", "--flop-batch", "2", "--device", "cpu", "--out", str(out)]
    return tt.main(argv), out


def test_report_has_every_measurement(report):
    text, out = report
    assert out.read_text() == text
    ours = table(text, "## Our training loop")
    assert sorted((r["method"], int(r["B"]), r["compile"]) for r in ours) == sorted(
        (m, b, "off") for m in METHODS_RUN for b in BATCHES)
    for r in ours:
        assert r["compile status"] == "off"
        num(r["step (ms)"]), num(r["images/s"])  # measured: positive and finite
        num(r["epoch 1 (s)"]), num(r["epoch 2 (s)"]), num(r["of which validation (s)"])
        assert r["peak alloc (MiB)"] == "n/a"  # CPU: no CUDA peak
        assert num(r["train set on device (MiB)"]) == pytest.approx(STEPS * int(r["B"]) * (3072 + 8) / 2**20, abs=0.006)
    ref = table(text, "## Original recipe")
    assert sorted((r["method"], int(r["B"])) for r in ref) == sorted((m, b) for m in METHODS_RUN for b in BATCHES)
    for r in ref:
        num(r["step (ms)"]), num(r["images/s"])
    speed = table(text, "## Speed-up")
    assert len(speed) == len(ref) and all(num(r["ours compile off / reference"]) for r in speed)
    evals = {r["method"]: r for r in table(text, "## Evaluation")}
    assert set(evals) == set(METHODS_RUN)
    assert evals["msp"]["S"] == "1" and evals["kep_svgp"]["S"] == "10"  # the cifar10 suite's 10 passes
    for r in evals.values():
        num(r["images/s"])
    mfu = table(text, "## Model FLOPs utilisation")
    assert {r["loop"] for r in mfu} == {"ours", "original recipe"} and all(r["MFU"] == "n/a" for r in mfu)
    proj = {r["method"]: r for r in table(text, "## Projection")}
    for m in METHODS_RUN:
        assert proj[m]["note"].startswith("measured at B=8")  # the suite's B = 128: nearest measured
        assert num(proj[m]["CPU-hours (this CPU; not a GPU estimate)"])
    assert "rates of msp (not measured)" in proj["sgpa"]["note"]
    assert "GPU-hours" not in text and "device: CPU" in text  # CPU numbers are never called GPU numbers
    assert "--compile off" in text  # the exact command


def hand_flops(image: tuple[int, int, int], patch: int, dim: int, depth: int, hidden: int, classes: int) -> int:
    """Training FLOPs of one image of the plain softmax ViT, derived by hand.

    Multiply-adds count 2 FLOPs.  Per image, N = (H/p)(W/p) tokens:
    * patch embedding (a p x p, stride p convolution = a linear map of c p^2 inputs to dim
      outputs per token): forward 2 N dim c p^2; backward only the weight gradient (the
      image needs no gradient), the same again;
    * per block, forward: qkv 2 N dim 3dim, output projection 2 N dim dim, MLP 2 N dim hidden
      twice, attention scores Q K^T 2 N N dim and weights x V 2 N N dim (summed over heads);
      backward: gradients of both operands of every product, twice the forward;
    * head: 2 dim classes forward, twice that backward.
    """
    h, w, c = image
    n = (h // patch) * (w // patch)
    patch_fwd = 2 * n * dim * c * patch * patch
    block_fwd = 2 * n * (3 * dim * dim + dim * dim + 2 * dim * hidden) + 2 * 2 * n * n * dim
    head_fwd = 2 * dim * classes
    return 2 * patch_fwd + 3 * (depth * block_fwd + head_fwd)


@pytest.mark.parametrize("dim,depth,heads,mlp_ratio,patch", [(16, 2, 2, 2.0, 8), (24, 1, 3, 1.0, 4)])
def test_flops_per_image_match_closed_form(one_torch_thread, dim, depth, heads, mlp_ratio, patch):
    cfg = ModelConfig(patch_size=patch, dim=dim, depth=depth, heads=heads, mlp_ratio=mlp_ratio,
                      attention_options={"scale": "width"})
    method = METHODS.get("msp")(METHODS.get("msp").Options())
    rng = np.random.default_rng(0)
    data = tt.synthetic_bundle(tt.synthetic_images(2, rng), tt.synthetic_images(1, rng))
    model = method.build_model(cfg, data)
    counted = tt.training_flops_per_image(method, model, tt.IMAGE_SHAPE, 3, torch.device("cpu"))
    assert counted == hand_flops(tt.IMAGE_SHAPE, patch, dim, depth, int(round(dim * mlp_ratio)), tt.CLASSES)
    assert all(p.grad is None for p in model.parameters())  # the counting step leaves no gradients


def test_reference_transform_is_pad_crop_flip_normalise():
    h, w, c = 9, 10, 2  # larger than the padding, distinct non-zero pixels: every (oy, ox, flip) differs
    img = (np.arange(h * w * c) % 251 + 1).astype(np.uint8).reshape(h, w, c)
    mean, std = (0.5, 0.25), (0.5, 0.125)
    ds = tt.ReferenceImages(img[None], np.array([7]), mean, std)

    def by_hand(oy: int, ox: int, flip: bool) -> np.ndarray:
        out = np.zeros((c, h, w), dtype=np.float64)
        for ch in range(c):
            for i in range(h):
                for j in range(w):
                    jj = (w - 1 - j) if flip else j  # the flip mirrors the cropped window
                    si, sj = i + oy - 4, jj + ox - 4  # window offset in the 4-pixel zero padding
                    v = img[si, sj, ch] if 0 <= si < h and 0 <= sj < w else 0
                    out[ch, i, j] = (v / 255.0 - mean[ch]) / std[ch]
        return out

    candidates = {}
    for oy in range(9):
        for ox in range(9):
            for flip in (False, True):
                got = ds.transform(img, oy, ox, flip)
                assert got.dtype == torch.float32 and got.shape == (c, h, w)
                np.testing.assert_allclose(got.numpy(), by_hand(oy, ox, flip), rtol=1e-6, atol=1e-6)
                candidates[(oy, ox, flip)] = got
    # centred, unflipped: the image itself, normalised
    np.testing.assert_allclose(ds.transform(img, 4, 4, False)[0, 1, 2].item(), (img[1, 2, 0] / 255 - 0.5) / 0.5, rtol=1e-6)

    torch.manual_seed(0)
    seen = set()
    for _ in range(300):
        x, y = ds[0]
        assert y == 7
        match = [k for k, v in candidates.items() if torch.equal(v, x)]
        assert len(match) == 1, "a drawn item is no pad-crop-flip of the image"
        seen.add(match[0])
    assert {k[2] for k in seen} == {False, True}
    assert {k[0] for k in seen} >= {0, 8} and {k[1] for k in seen} >= {0, 8}  # offsets span 0..8
