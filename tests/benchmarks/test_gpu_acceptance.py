"""benchmarks/gpu_acceptance.py: its CPU dry run end to end (what CI runs so the GPU command
cannot rot between leases), the projection against a hand computation from the stored
cells, the cap that kills a step's whole process group, resuming, and keeping sections."""
from __future__ import annotations

import csv
import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO, import_benchmarks

import_benchmarks()

import gpu_acceptance as ga  # noqa: E402

#: the cifar10 suite's evaluated images at the official sizes: val (5,000 held out of the
#: 50,000 training images), test 10,000, 15 corruptions x 5 severities of the 10,000 test
#: images, SVHN's 26,032 test images and CIFAR-100's 10,000
N_EVAL = 5_000 + 10_000 + 75 * 10_000 + 26_032 + 10_000
N_TRAIN = 45_000


def section(report: str, number: int) -> str:
    start = report.index(ga.MARK.format(number))
    end = report.find("<!-- gpu_acceptance", start + 10)
    return report[start:end]


def tables(text: str) -> list[list[dict[str, str]]]:
    """Every Markdown table of ``text`` as a list of rows (header -> cell)."""
    found, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif block:
            found.append([dict(zip(block[0], row)) for row in block[2:]])
            block = []
    return found


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_acceptance")
    work, out, back = root / "work", root / "gpu.md", root / "OUT"
    committed = REPO / "reports" / "perf" / "gpu.md"
    before = committed.read_bytes() if committed.exists() else None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OUT", str(back))
        t0 = time.perf_counter()
        code = ga.main(["--dry-run", "--work", str(work), "--out", str(out)])
        seconds = time.perf_counter() - t0
    after = committed.read_bytes() if committed.exists() else None
    return {"code": code, "work": work, "out": out, "back": back, "report": out.read_text(), "seconds": seconds,
            "committed_unchanged": before == after}


def test_dry_run_runs_every_step_and_labels_it(dry_run):
    report = dry_run["report"]
    assert dry_run["code"] == 0, report
    assert dry_run["committed_unchanged"]  # a dry run never writes over the GPU report
    assert report.startswith("# GPU acceptance: CPU dry run")
    for step in ga.STEPS:
        body = section(report, step.number)
        heading = body.splitlines()[1]
        assert heading.startswith(f"## {step.number}. {step.title} (CPU dry run, not a GPU measurement;")
        assert f"torch {torch.__version__}" in heading and time.strftime("%Y-%m-%d", time.gmtime()) in heading
    # the copies the GPU machine sends back
    assert (dry_run["back"] / "gpu.md").read_text() == report
    assert {"tests.log", "training.jsonl", "suite.log", "attention.md"} <= {p.name for p in dry_run["back"].iterdir()}


def test_dry_run_measures_what_the_gpu_run_measures(dry_run):
    report = dry_run["report"]
    # step 1: the cuda-marked tests, all skipped on a CPU with pytest's reason
    counts = tables(section(report, 1))[0][0]
    assert int(counts["skipped"]) > 0 and counts["failed"] == counts["errors"] == "0"
    assert "needs a CUDA device" in section(report, 1)
    # step 2: eager rows of every method, the original-style path of msp and kep_svgp, the speed-up
    ours, ref, speed = tables(section(report, 2))
    assert sorted(r["method"] for r in ours) == sorted(ga.METHODS)
    assert [r["method"] for r in ref] == list(ga.REFERENCE_METHODS)
    for r in speed:
        o = next(x for x in ours if x["method"] == r["method"])
        f = next(x for x in ref if x["method"] == r["method"])
        ratio = float(o["images/s"].replace(",", "")) / float(f["images/s"].replace(",", ""))
        assert float(r["ours eager / original"].rstrip("x")) == pytest.approx(ratio, rel=0.02, abs=0.01)
    assert "torch.compile is not exercised on the CPU" in section(report, 2)
    # step 3: every method's evaluation, S passes each
    evals = tables(section(report, 3))[0]
    assert {r["method"]: int(r["S"]) for r in evals} == {"msp": 1, "kep_svgp": 10, "sgpa": 10}
    # step 5: the attention table
    assert [r["layer"] for r in tables(section(report, 5))[0]] == ["softmax", "kep_svgp"]


def test_projection_matches_a_hand_computation_from_the_stored_cells(dry_run):
    """cell seconds = C + E x T_epoch + N_eval x P, hours = seeds x cell / 3600, with T_epoch
    scaled from the run's 90 training images (100 written, 10 held out) to 45,000."""
    from bench.store import CellDir

    store = dry_run["work"] / "results" / "gpu_acceptance"
    cells = {}
    for path in store.iterdir():
        if (path / "cell.json").exists():
            record = CellDir(path).read_cell()
            cells[record.method] = (record, list(csv.DictReader((path / "train_log.csv").open())))
    assert set(cells) == set(ga.METHODS)
    proj = {r["method"]: r for r in tables(section(dry_run["report"], 4))[1]}
    for name, (record, log) in cells.items():
        e1, e2 = float(log[0]["seconds"]), float(log[-1]["seconds"])
        hours = 5 * (max(0.0, e1 - e2) + 300 * e2 * N_TRAIN / 90 + N_EVAL * record.predict_seconds_per_1000 / 1000) / 3600
        assert float(proj[name]["CPU-hours"]) == pytest.approx(hours, abs=0.006), name
    # a method not run borrows msp's rates, its prediction scaled by its passes, and says so
    msp, _ = cells["msp"]
    p = msp.predict_seconds_per_1000 / 1000 * 10
    assert float(proj["mc_dropout"]["eval (s/cell)"].replace(",", "")) == pytest.approx(N_EVAL * p, rel=0.01, abs=1)
    assert proj["mc_dropout"]["note"] == "rates of msp (not run here)"
    total = next(line for line in section(dry_run["report"], 4).splitlines() if line.startswith("**Total:"))
    # the total is rounded to 0.1 (error <= 0.05) and each row to 0.01 (error <= 0.005 each)
    assert float(total.split()[1]) == pytest.approx(sum(float(r["CPU-hours"]) for r in proj.values()),
                                                    abs=0.05 + 0.005 * len(proj) + 1e-9)


def test_rerunning_one_step_keeps_the_other_sections(dry_run, tmp_path):
    out = tmp_path / "gpu.md"
    out.write_text(dry_run["report"])
    assert ga.main(["--dry-run", "--steps", "3", "--work", str(tmp_path / "w"), "--out", str(out)]) == 0
    again = out.read_text()
    for n in (1, 2, 4, 5):
        assert section(again, n) == section(dry_run["report"], n)
    assert "Steps 1, 2, 4, 5 kept from an earlier run" in again
    assert tables(section(again, 3))[0] and section(again, 3) != section(dry_run["report"], 3)


def test_resume_measures_only_what_is_missing(tmp_path):
    """A rows file holding the plan and one measurement (with a value no real run gives):
    ``--resume`` keeps that row as it is and measures the rest."""
    work = tmp_path / "w"
    work.mkdir()
    plan = {"kind": "plan", "items": ["ours msp B=4 compile off"], "params": {"msp": 1}}
    kept = {"item": "ours msp B=4 compile off", "kind": "ours", "steps": 2, "method": "msp", "batch": 4,
            "compile": "off", "status": "off", "step_ms": 1.0, "images_s": 123456789.0, "epoch1_s": 1.0,
            "epoch2_s": 1.0, "val_s": 0.1, "peak_mib": None, "data_mib": 0.1}
    (work / "training.jsonl").write_text(json.dumps(plan) + "\n" + json.dumps(kept) + "\n")
    code = ga.main(["--dry-run", "--steps", "2", "--resume", "--work", str(work), "--out", str(tmp_path / "g.md")])
    assert code == 0
    rows = ga.read_rows(work / "training.jsonl")
    assert [r for r in rows if r.get("item") == kept["item"]] == [kept]  # not measured again
    assert sum(r.get("kind") == "plan" for r in rows) == 1
    ours = {r["method"]: r for r in tables(section((tmp_path / "g.md").read_text(), 2))[0]}
    assert ours["msp"]["images/s"] == "123,456,789"
    assert set(ours) == set(ga.METHODS)
    assert "Resumed (`--resume`)" in (tmp_path / "g.md").read_text()


def test_the_cap_kills_the_whole_process_group(tmp_path):
    """A step's process and the processes it started (torch.compile workers, DataLoader
    workers) are killed at the cap; what it printed before stays in its log."""
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time; "
              f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    rc, timed_out, seconds = ga.run_capped([sys.executable, "-c", script], 3.0, tmp_path / "log")
    assert timed_out and rc is None and seconds < 20
    assert "started" in (tmp_path / "log").read_text()
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # reaped by init shortly after the kill
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        state = Path(f"/proc/{grandchild}/stat").read_text().split()[2] if Path(f"/proc/{grandchild}").exists() else "gone"
        assert state in ("Z", "gone"), f"the grandchild {grandchild} is still running ({state})"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_only_the_dry_run_runs(tmp_path, capsys):
    out = tmp_path / "gpu.md"
    assert ga.main(["--out", str(out)]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not out.exists()
    with pytest.raises(SystemExit) as exc:
        ga.main(["--dry-run", "--steps", "6"])
    assert exc.value.code == 2
    assert ga.main(["--dry-run", "--resume"]) == 2  # resume needs the earlier run's --work


def test_cuda_marked_tests_are_found():
    """Every test file that uses the cuda helpers is in step 1's list."""
    using = {str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
             if any(line.startswith("from tests.helpers.devices import")
                    for line in p.read_text(encoding="utf-8").splitlines())}
    assert {"tests/bench/train/test_gpu_path.py", "tests/methods/test_gp.py"} <= using
    assert using <= set(ga.cuda_test_files())
