"""End-to-end: real runs of ``run_suite.py`` on a tiny suite over the embedded data.

Covers: a run writes the store and a report with every default method; ``report``
rebuilds byte-identical tables from the store alone (no model, no checkpoint); a re-run
skips complete cells; a run killed at arbitrary moments and restarted ends with the same
tables as an uninterrupted run; a non-finite loss fails only its own cells.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.helpers.suites import run_suite, tables, tiny_suite

METHODS = "[methods.msp]\n[methods.mc_dropout]\nsamples = 2\n[methods.temperature_scaling]\n[methods.deep_ensemble]\nmembers = 2\n"
DATA = {"train_limit": 600, "eval_limit": 100, "ood_size": 100, "corruption_limit": 50,
        "splits": ["test", "shift/digits_box", "shift/gaussian_noise/*", "shift/contrast/5", "ood/*"]}
TINY_SUITE = tiny_suite("tiny", seeds=(0, 1), methods=METHODS, train={"epochs": 4}, model={"dim": 32}, data=DATA)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """One uninterrupted run of the tiny suite."""
    root = tmp_path_factory.mktemp("reference")
    suite = root / "tiny.toml"
    suite.write_text(TINY_SUITE)
    proc = run_suite("--suite", str(suite), "--results", str(root / "results"), "--reports", str(root / "reports"))
    assert proc.returncode == 0, proc.stderr
    return {"root": root, "suite": suite, "proc": proc, "tables": tables(root / "reports" / "tiny")}


def test_run_writes_store_and_report_with_every_method(reference):
    root = reference["root"]
    cells = sorted(c for c in (root / "results" / "tiny").iterdir() if c.is_dir())
    assert len(cells) == 4  # 2 trained methods x 2 seeds; derived methods add no cells
    for cell in cells:
        info = json.loads((cell / "cell.json").read_text())
        assert info["status"] == "complete"
        for rel in ("manifest.json", "train_log.csv", "checkpoint.pt", "preds/test.npz", "preds/val.npz",
                    "preds/shift/digits_box.npz", "preds/shift/gaussian_noise/1.npz", "preds/shift/gaussian_noise/5.npz",
                    "preds/shift/contrast/5.npz", "preds/ood/animal_mnist.npz", "preds/ood/uniform_noise.npz"):
            assert (cell / rel).is_file(), rel
        # exactly the splits the suite's patterns select: 1 + 5 + 1 shift, 2 OOD, test, val
        assert len(list((cell / "preds").rglob("*.npz"))) == 11
        assert info["test_acc"] > 0.2  # chance is 0.1
    readme = (root / "reports" / "tiny" / "README.md").read_text()
    for method in ("msp (ref)", "mc_dropout", "temperature_scaling", "deep_ensemble"):
        assert f"| {method} " in readme
    for split in ("shift/digits_box", "ood/animal_mnist", "ood/uniform_noise", "mutual_info", "mCE"):
        assert split in readme
    grid = (root / "reports" / "tiny" / "tables" / "shift_splits.csv").read_text()
    for split in ("shift/gaussian_noise/1", "shift/gaussian_noise/5", "shift/contrast/5", "shift/digits_box"):
        assert split in grid
    for name in ("summary", "shift_severity", "shift_corruption", "shift_splits", "ood", "efficiency"):
        for ext in ("md", "tex", "csv"):
            assert (root / "reports" / "tiny" / "tables" / f"{name}.{ext}").is_file()
    assert list((root / "reports" / "tiny" / "plots").glob("reliability_*.png"))
    # one log line per finished cell, with its time
    assert reference["proc"].stderr.count("complete in") == 4


def test_report_rebuilds_identical_tables_without_models(reference, tmp_path, monkeypatch):
    """``report`` never builds a model or reads a checkpoint, and is byte-reproducible."""
    import torch

    import bench.train.vit
    from bench.run.cli import main

    root = reference["root"]
    for ckpt in (root / "results" / "tiny").rglob("checkpoint.pt"):
        ckpt.rename(ckpt.with_suffix(".moved"))  # no checkpoint to touch
    try:
        def forbidden(*a, **k):
            raise AssertionError("report must not build a model or load a checkpoint")

        monkeypatch.setattr(bench.train.vit.ViT, "__init__", forbidden)
        monkeypatch.setattr(torch, "load", forbidden)
        out = []
        for i in range(2):
            reports = tmp_path / f"r{i}"
            args = ["report", "--suite", str(reference["suite"]), "--results", str(root / "results"),
                    "--reports", str(reports), "--quiet"]
            assert main(args) == 0
            out.append(tables(reports / "tiny"))
            out[-1]["README.md"] = (reports / "tiny" / "README.md").read_bytes()
    finally:
        for moved in (root / "results" / "tiny").rglob("checkpoint.moved"):
            moved.rename(moved.with_suffix(".pt"))
    assert out[0] == out[1]
    assert {k: v for k, v in out[0].items() if k != "README.md"} == reference["tables"]


def test_rerun_skips_complete_cells(reference, capsys, monkeypatch):
    """(In this process: what is tested is the store's skip, not a fresh interpreter.)"""
    from bench.run.cli import main

    monkeypatch.chdir(REPO)
    root = reference["root"]
    code = main(["--suite", str(reference["suite"]), "--results", str(root / "results"), "--reports", str(root / "reports")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert err.count("complete, skipped") == 4
    assert "complete in" not in err
    assert tables(root / "reports" / "tiny") == reference["tables"]


def test_killed_runs_resume_to_identical_tables(reference, tmp_path):
    """SIGKILL a run at several arbitrary moments; restarting redoes only the unfinished
    cells and the final tables equal those of the uninterrupted run."""
    results, reports = tmp_path / "results", tmp_path / "reports"
    args = [sys.executable, "run_suite.py", "--suite", str(reference["suite"]),
            "--results", str(results), "--reports", str(reports)]
    rng = random.Random(1234)
    store = results / "tiny"
    kills = 0
    for _ in range(4):
        proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # wait until the run is inside a cell (its directory exists but is not sealed), then
        # let it go on for a random while, so the kill lands mid-training or mid-write
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if store.exists() and any(not (c / "manifest.json").exists() for c in store.iterdir() if c.is_dir()):
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 1.5))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 2, "the run finished before it could be killed; make the suite slower"
    complete_before = {c.name for c in store.iterdir() if (c / "manifest.json").exists()}

    final = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr
    assert final.stderr.count("complete, skipped") == len(complete_before)
    assert final.stderr.count("complete in") == 4 - len(complete_before)
    assert tables(reports / "tiny") == reference["tables"]
    # no temporary files left behind in sealed cells
    assert not [p for p in store.rglob(".*.tmp")]


NAN_PLUGIN = '''
from methods.msp import MSP
from bench.core.registry import METHODS


@METHODS.register("nan_loss")
class NanLoss(MSP):
    """MSP whose loss turns NaN on the third step."""

    calls = 0

    def training_loss(self, model, logits, labels):
        NanLoss.calls += 1
        loss = super().training_loss(model, logits, labels)
        return loss * float("nan") if NanLoss.calls >= 3 else loss
'''


def test_nonfinite_loss_fails_only_its_cells(tmp_path):
    (tmp_path / "nanplugin.py").write_text(NAN_PLUGIN)
    suite = tmp_path / "nan.toml"
    suite.write_text(tiny_suite("nan", methods="[methods.msp]\n[methods.nan_loss]\n[methods.temperature_scaling]\n"
                                "[methods.nan_ensemble]\ntype = \"ensemble\"\nbase = \"nan_loss\"\nmembers = 1\n",
                                train={"epochs": 4}, model={"dim": 32}, data={**DATA, "splits": ["test"]}))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = run_suite("--suite", str(suite), "--plugin", "nanplugin", "--results", str(tmp_path / "results"),
                     "--reports", str(tmp_path / "reports"), "--partial", env=env)
    assert proc.returncode == 1, proc.stderr  # finished, with a failed cell (--partial: reported all the same)
    infos = [json.loads((c / "cell.json").read_text()) for c in (tmp_path / "results" / "nan").iterdir() if c.is_dir()]
    by_method = {i["method"]: i for i in infos}
    assert by_method["msp"]["status"] == "complete"
    assert by_method["nan_loss"]["status"] == "failed"
    assert "non-finite" in by_method["nan_loss"]["reason"]
    readme = (tmp_path / "reports" / "nan" / "README.md").read_text()
    failed_section = readme.split("Failed cells", 1)[1]
    assert "nan_loss" in failed_section and "non-finite" in failed_section
    assert "nan_ensemble" in failed_section  # its member failed
    assert "| msp " in readme


# ------------------------------------------------- analysis files, store-only reports, plugins

PLUGIN_METRIC = '''
import numpy as np
from bench.metrics import metric


@metric("calibration", "Top2", "%", True, "Mean probability mass of the two most likely classes.")
def top2_mass(probs, labels):
    """Mean of p_(1) + p_(2) per sample (a metric defined outside the repository)."""
    return float(np.sort(np.asarray(probs, dtype=np.float64), axis=1)[:, -2:].sum(axis=1).mean())
'''


def test_plugin_metric_appears_in_every_table_of_its_kind(reference, tmp_path):
    """A metric registered by a --plugin module shows up in the report with no other change,
    with the value of its own function on the stored predictions."""
    import numpy as np

    (tmp_path / "top2plugin.py").write_text(PLUGIN_METRIC)
    root = reference["root"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = run_suite("report", "--suite", str(reference["suite"]), "--results", str(root / "results"),
                     "--reports", str(tmp_path / "reports"), "--plugin", "top2plugin",
                     "--metrics", "accuracy,top2_mass", env=env)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "reports" / "tiny+top2plugin+metrics-accuracy.top2_mass"  # a view beside the run's report
    for name in ("summary", "shift_severity", "shift_corruption", "shift_splits"):
        assert "Top2 (%)" in (out / "tables" / f"{name}.md").read_text().splitlines()[0], name
    csv = pd_read(out / "tables" / "summary.csv")
    assert "top2_mass_mean" in csv.columns and csv["top2_mass_mean"].notna().all()
    # independent check: the msp mean over seeds from the stored predictions
    expected = []
    for cell in (root / "results" / "tiny").iterdir():
        if cell.is_dir() and json.loads((cell / "cell.json").read_text())["method"] == "msp":
            with np.load(cell / "preds" / "test.npz") as z:
                p = np.exp(z["log_probs"].astype(np.float64))
            expected.append(np.sort(p, axis=1)[:, -2:].sum(axis=1).mean())
    got = csv.loc[csv["method"] == "msp", "top2_mass_mean"].iloc[0]
    assert abs(got - np.mean(expected)) < 1e-9  # the table CSV keeps 10 significant digits
    assert "`top2_mass`" in (out / "README.md").read_text()
    assert "ood" not in {p.stem for p in (out / "tables").glob("*.md")}  # no OOD metric picked


def pd_read(path: Path):
    import pandas as pd

    return pd.read_csv(path)


def report(capsys, *args: str) -> tuple[int, str]:
    """``run_suite.py report ARGS`` in this process, from the repository root (what is tested
    is what the report reads and writes, not a fresh interpreter); exit status and stderr."""
    from bench.run.cli import main

    code = main(["report", *args])
    return code, capsys.readouterr().err


def test_store_reports_from_its_folder_alone_and_reuses_its_analysis(reference, tmp_path, capsys, monkeypatch):
    """After the suite file is gone, ``report --suite NAME`` reports the store under
    --results/NAME with the same tables; a second report reuses the analysis files and is
    byte-identical; a changed store is analysed again."""
    import shutil

    monkeypatch.chdir(REPO)
    results = tmp_path / "results"
    shutil.copytree(reference["root"] / "results", results)
    with_suite = tmp_path / "with_suite"
    code, err = report(capsys, "--suite", str(reference["suite"]), "--results", str(results), "--reports", str(with_suite))
    assert code == 0 and "analysed the store" in err, err
    # no suite file: the name of the store's folder
    alone = tmp_path / "alone"
    code, err = report(capsys, "--suite", "tiny", "--results", str(results), "--reports", str(alone))
    assert code == 0, err
    assert tables(alone / "tiny") == tables(with_suite / "tiny")
    assert (alone / "tiny" / "README.md").read_bytes() == (with_suite / "tiny" / "README.md").read_bytes()
    # unchanged store: the analysis files are reused and the output is byte-identical
    before = {p: p.read_bytes() for p in sorted((alone / "tiny").rglob("*")) if p.is_file()}
    code, err = report(capsys, "--suite", "tiny", "--results", str(results), "--reports", str(alone))
    assert code == 0 and "reused the analysis files" in err, err
    assert {p: p.read_bytes() for p in sorted((alone / "tiny").rglob("*")) if p.is_file()} == before
    # the analysis table is tidy and loads with pandas
    per_seed = pd_read(alone / "tiny" / "analysis" / "metrics.csv.gz")
    assert list(per_seed.columns) == ["dataset", "method", "seed", "split", "metric", "score", "value"]
    assert {"msp", "mc_dropout", "temperature_scaling", "deep_ensemble"} == set(per_seed["method"])
    # a re-sealed cell (new manifest) makes the analysis stale: recomputed, not reused
    cell = next(c for c in (results / "tiny").iterdir() if c.is_dir())
    manifest = json.loads((cell / "manifest.json").read_text())
    info = json.loads((cell / "cell.json").read_text())
    info["train_seconds"] = info.get("train_seconds", 0) + 1.0
    (cell / "cell.json").write_text(json.dumps(info))
    from bench.store import sha256_file

    manifest["files"]["cell.json"] = sha256_file(cell / "cell.json")
    (cell / "manifest.json").write_text(json.dumps(manifest))
    code, err = report(capsys, "--suite", "tiny", "--results", str(results), "--reports", str(alone))
    assert code == 0 and "analysed the store" in err, err
    assert tables(alone / "tiny") == tables(with_suite / "tiny")  # timings are not in these tables


def test_derived_method_with_missing_members_is_named(reference, tmp_path, capsys, monkeypatch):
    """An ensemble whose member cell is gone from the store is listed among the failed cells
    with the reason, not silently dropped."""
    import shutil

    monkeypatch.chdir(REPO)
    results = tmp_path / "results"
    shutil.copytree(reference["root"] / "results", results)
    for cell in (results / "tiny").iterdir():
        if cell.is_dir():
            info = json.loads((cell / "cell.json").read_text())
            if info["method"] == "msp" and info["seed"] == 1:
                shutil.rmtree(cell)
    code, err = report(capsys, "--suite", "tiny", "--results", str(results), "--reports", str(tmp_path / "r"))
    assert code == 1, err  # a report that leaves something out says so
    failed = readme_failures(tmp_path / "r" / "tiny" / "README.md")
    assert "deep_ensemble" in failed
    assert "needs 2 members, the store has 1 (msp seeds 0, 1; seed 1: not in the store)" in failed


def readme_failures(path: Path) -> str:
    return path.read_text().split("## Failed cells", 1)[1].split("## Plots", 1)[0]


def test_a_cell_killed_mid_training_resumes_to_the_same_weights(tmp_path):
    """SIGKILL a run right after a training state was saved; the next run resumes the cell
    from that epoch (cell.json says so) and ends with exactly the weights and tables of an
    uninterrupted run."""
    import torch

    suite = tmp_path / "resume.toml"
    # the reference run's model and data, predicting the test split alone: the kill must land
    # between the third epoch's state and the end of training, which no other split changes
    suite.write_text(tiny_suite("resume", train={"epochs": 12, "checkpoint_every": 1}, model={"dim": 32},
                                data={**DATA, "splits": ["test"]}))
    whole = run_suite("--suite", str(suite), "--results", str(tmp_path / "a"), "--reports", str(tmp_path / "ra"))
    assert whole.returncode == 0, whole.stderr

    args = [sys.executable, "run_suite.py", "--suite", str(suite), "--results", str(tmp_path / "b"),
            "--reports", str(tmp_path / "rb")]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        states = list((tmp_path / "b").rglob("train_state.pt"))
        if states and torch.load(states[0], weights_only=True)["epoch"] >= 3:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    again = run_suite(*args[2:])
    assert again.returncode == 0, again.stderr
    assert "resuming from epoch" in again.stderr

    def cell(root: Path) -> Path:
        (c,) = [p for p in (root / "resume").iterdir() if p.is_dir()]
        return c

    info = json.loads((cell(tmp_path / "b") / "cell.json").read_text())
    assert info["resumed_from_epoch"] >= 3
    a = torch.load(cell(tmp_path / "a") / "checkpoint.pt", weights_only=True)
    b = torch.load(cell(tmp_path / "b") / "checkpoint.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert tables(tmp_path / "ra" / "resume") == tables(tmp_path / "rb" / "resume")
    assert not (cell(tmp_path / "b") / "train_state.pt").exists()  # a finished cell keeps no state
