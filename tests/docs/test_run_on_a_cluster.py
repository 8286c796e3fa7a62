"""docs/run-on-a-cluster.md: its [executor] table in a suite, and the dry run with
submitit's local executor, whose job trains the cell in a process of its own."""
from __future__ import annotations

import json

import pytest

from tests.helpers import REPO
from tests.helpers.docs import example, reader_folder, run_commands
from tests.helpers.suites import tiny_suite


def test_the_submitit_dry_run_completes_its_cell(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the job's process imports bench, as from the repository root
    doc = example("run-on-a-cluster.md")
    with reader_folder(tmp_path):
        (tmp_path / "my_cluster.toml").write_text(tiny_suite(None) + doc.parts["executor"])
        _, status = run_commands(doc.commands)
    store = tmp_path / "results" / "cluster-try"
    (cell,) = [json.loads(p.read_text()) for p in store.glob("*/cell.json")]
    assert (cell["method"], cell["status"]) == ("msp", "complete")
    assert list((store / ".submitit").glob("*_log.out"))  # submitit ran it as a job
    assert "| msp (ref)" in (tmp_path / "reports" / "cluster-try" / "README.md").read_text()
    assert ": 1 done, 0 failed, 0 running, 0 interrupted, 0 damaged, 0 missing;" in status, status
