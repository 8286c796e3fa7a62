"""The tiny suites the end-to-end tests run, and how they run them: ``run_suite.py`` as a
subprocess of the repository, and the report tables it writes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO


TRAIN = {"epochs": 1, "batch_size": 64, "lr": 3e-3, "warmup_epochs": 0, "eval_batch_size": 500}
MODEL = {"patch_size": 7, "dim": 16, "depth": 1, "heads": 2, "mlp_ratio": 1.0}
DATA = {"train_limit": 256, "eval_limit": 64, "ood_size": 32, "corruption_limit": 32, "splits": ["test"]}


def tiny_suite(name: str | None = "tiny", *, seeds: tuple[int, ...] = (0,), methods: str = "[methods.msp]\n",
               train: dict | None = None, model: dict | None = None, data: dict | None = None) -> str:
    """The suite file every test that runs real cells starts from: msp on the embedded MNIST
    (256 training images, 64 per evaluation split, the test split only), one 1-block ViT of
    width 16, one epoch, seed 0.  ``train`` / ``model`` / ``data`` change or add keys of the
    ``[train]`` / ``[model]`` / ``[datasets.mnist5k]`` tables; ``methods`` is the text of the
    method tables; ``name=None`` leaves the name out (the file's name then names the suite)."""
    def table(values: dict) -> str:
        return "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())

    head = f"name = {json.dumps(name)}\n" if name is not None else ""
    return (f"{head}seeds = {list(seeds)}\n[train]\n{table({**TRAIN, **(train or {})})}"
            f"[model]\n{table({**MODEL, **(model or {})})}[datasets.mnist5k]\n{table({**DATA, **(data or {})})}{methods}")


def run_in_process(tmp_path: Path, *args: str, suite: str | None = None, capsys=None) -> tuple[int, str]:
    """``run_suite.py [args]`` in this process on ``suite`` (default: :func:`tiny_suite` named
    "hard"), written to ``tmp_path/hard.toml``, with results, reports and data under
    ``tmp_path``; returns the exit status and, given ``capsys``, what went to stderr."""
    from bench.run.cli import main

    path = tmp_path / "hard.toml"
    path.write_text(tiny_suite("hard") if suite is None else suite)
    code = main(["--suite", str(path), "--results", str(tmp_path / "results"),
                 "--reports", str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), "--quiet", *args])
    err = capsys.readouterr().err if capsys is not None else ""
    return code, err


def nothing_written(tmp_path: Path) -> bool:
    """No results, reports or data folder under ``tmp_path``: the command wrote nothing."""
    return not any((tmp_path / d).exists() for d in ("results", "reports", "data"))


def minimal(**extra) -> dict:
    """A small valid suite: one dataset, one trained method, two seeds."""
    raw = {
        "name": "mini",
        "seeds": [0, 1],
        "datasets": {"mnist5k": {"train_limit": 50, "eval_limit": 20, "ood_size": 20}},
        "methods": {"msp": {}},
    }
    raw.update(extra)
    return raw


def run_suite(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "run_suite.py", *args], cwd=REPO, capture_output=True, text=True, timeout=600, env=env
    )


def tables(report_dir: Path) -> dict[str, bytes]:
    """Every table file, except the efficiency table, whose timings differ between runs."""
    return {f.name: f.read_bytes() for f in sorted((report_dir / "tables").iterdir())
            if not f.name.startswith("efficiency.")}


def only_cell(store: Path) -> tuple[Path, dict]:
    """The one cell of a store holding a single cell: its folder and its ``cell.json``."""
    (cell,) = [c for c in store.iterdir() if (c / "cell.json").is_file()]
    return cell, json.loads((cell / "cell.json").read_text())
