"""The ``cifar10`` suite end to end on a data root of official-format files (fixture-sized):
every corruption x severity split (official ``.npy`` where present, generated otherwise)
and every OOD set present reach the report.

The suite is the shipped ``bench/suites/cifar10.toml`` (its splits, recipe and methods)
with the paper preset shrunk to the tiny suite's one block of width 16: what is checked is the loaders, the
formats and the pipeline, which the width of the ViT does not change (a 384-wide, 7-block
ViT made this the slowest test of the suite)."""
from __future__ import annotations

import subprocess
import sys
import tomllib

import pandas as pd

from tests.helpers import REPO
from tests.helpers.official_files import write_cifar10, write_cifar100, write_corruptions, write_image_folder, write_svhn
from tests.helpers.suites import MODEL

BENCHMARK = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
             "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
             "jpeg_compression")
SHIPPED = REPO / "bench" / "suites" / "cifar10.toml"
PAPER_MODEL = '[model]\npreset = "vit_cifar_paper"\n'
SHRUNK = {k: MODEL[k] for k in ("dim", "depth", "heads")}  # the tiny suite's; the paper's patches and pooling stay


def shipped_suite_with_a_tiny_model() -> str:
    text = SHIPPED.read_text()
    assert text.count(PAPER_MODEL) == 1, "the shipped cifar10 suite's [model] table changed"
    tiny = text.replace(PAPER_MODEL, PAPER_MODEL + "".join(f"{k} = {v}\n" for k, v in SHRUNK.items()))
    shipped, shrunk = tomllib.loads(text), tomllib.loads(tiny)
    assert shrunk["model"] == {**shipped["model"], **SHRUNK}
    assert {k: v for k, v in shrunk.items() if k != "model"} == {k: v for k, v in shipped.items() if k != "model"}
    return tiny


def test_cifar10_suite_on_official_format_files(tmp_path):
    root = tmp_path / "data"
    c10 = write_cifar10(root)
    write_cifar100(root)
    write_corruptions(root / "CIFAR-10-C", c10["x_test"], c10["y_test"])  # brightness, gaussian_noise
    write_svhn(root / "svhn" / "test_32x32.mat")
    write_image_folder(root / "ood" / "textures")
    suite = tmp_path / "cifar10.toml"
    suite.write_text(shipped_suite_with_a_tiny_model())
    proc = subprocess.run(
        [sys.executable, "run_suite.py", "--suite", str(suite), "--data-root", str(root), "--epochs", "1",
         "--seeds", "0", "--methods", "msp,temperature_scaling", "--name", "cifar10", "--results", str(tmp_path / "results"),
         "--reports", str(tmp_path / "reports"), "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    assert "md5" in proc.stderr  # fixture files are not the official ones: warned, not refused
    tables = tmp_path / "reports" / "cifar10" / "tables"
    shift = pd.read_csv(tables / "shift_splits.csv")
    for method in ("msp", "temperature_scaling"):
        splits = set(shift.loc[shift["method"] == method, "split"])
        assert splits == {f"shift/{c}/{s}" for c in BENCHMARK for s in range(1, 6)}
    ood = pd.read_csv(tables / "ood.csv")
    assert set(ood["split"]) == {"ood/svhn", "ood/cifar100", "ood/textures"}
    in_dist = pd.read_csv(tables / "summary.csv")
    assert set(in_dist["method"]) == {"msp", "temperature_scaling"}
