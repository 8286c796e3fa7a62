"""The report's README names its run (``bench/report/readme.py``, :class:`RunTitle`): the
title is the run's name, and the line under it gives the suite, the overrides and the day
the run started (the store's ``run.json``), saying plainly when the run is not the
suite's reference run."""
from __future__ import annotations

import json

from bench.run.cli import main
from bench.report import RunTitle
from tests.helpers.suites import run_in_process


def _head(readme: str) -> tuple[str, str]:
    title, line = readme.split("\n\n")[:2]
    return title, line


def test_the_report_of_a_named_run_with_overrides_names_it_and_says_it_is_no_reference(tmp_path, capsys):
    code, err = run_in_process(tmp_path, "--name", "try1", "--epochs", "1", capsys=capsys)
    assert code == 0, err
    title, line = _head((tmp_path / "reports" / "try1" / "README.md").read_text())
    started = json.loads((tmp_path / "results" / "try1" / "run.json").read_text())["started"]
    assert title == "# uqbench report: try1"
    assert line.startswith("Run `try1`: suite `hard` with `--epochs 1`, started " + started[:10]), line
    assert "**not the suite's reference run**" in line, line


def test_a_resumed_run_keeps_the_day_it_started(tmp_path, capsys):
    code, err = run_in_process(tmp_path, "--name", "try1", "--epochs", "1", capsys=capsys)
    record = tmp_path / "results" / "try1" / "run.json"
    first = json.loads(record.read_text())
    record.write_text(json.dumps({**first, "started": "2020-01-02T03:04:05+00:00"}))
    code, err = run_in_process(tmp_path, "--name", "try1", "--epochs", "1", capsys=capsys)  # nothing to train
    assert code == 0, err
    assert json.loads(record.read_text())["started"] == "2020-01-02T03:04:05+00:00"
    assert "started 2020-01-02;" in (tmp_path / "reports" / "try1" / "README.md").read_text()


def test_the_suites_own_run_is_its_reference_and_a_report_says_what_it_narrows(tiny_store, tmp_path, capsys):
    args = ["report", "--suite", str(tiny_store / "hard.toml"), "--results", str(tiny_store / "results"),
            "--reports", str(tmp_path / "reports"), "--quiet"]
    assert main(args) == 0, capsys.readouterr().err
    title, line = _head((tmp_path / "reports" / "hard" / "README.md").read_text())
    assert title == "# uqbench report: hard"
    assert line.startswith("Run `hard`: suite `hard` with no overrides, started ") and \
        line.endswith("; the suite's reference run (its file's plan, nothing overridden)."), line
    assert main([*args, "--metrics", "accuracy,nll"]) == 0, capsys.readouterr().err  # a view beside it
    (view,) = [p for p in (tmp_path / "reports").iterdir() if p.name.startswith("hard+")]
    assert "This report shows `--metrics accuracy,nll` of it." in _head((view / "README.md").read_text())[1]


def test_a_run_of_the_suites_plan_under_its_own_name_is_not_called_its_reference():
    line = RunTitle("mine", "default", date="2026-11-28").lines()[0]
    assert line == ("Run `mine`: suite `default` with no overrides, started 2026-11-28; the suite's plan, nothing "
                    "overridden, under a name of its own.")
    assert "its last cell finished 2026-11-27" in RunTitle("default", "default", finished="2026-11-27").lines()[0]
