"""Named runs (issue 29, items 1 and 2): a run's name picks its store and report; a run
never writes into the folders of another plan; the store records the plan, so ``status``,
``report`` and ``verify`` need the name alone; ``runs`` lists the runs of a store root.

One tiny run (one cell, one epoch) trains for the whole module; the other checks read its
store or are refused before any work."""
from __future__ import annotations

import io
import shutil
import sys

import pytest

from bench.cli import main
from bench.runs import default_name, list_runs
from tests.helpers.suites import tiny_suite

SUITE = tiny_suite(None, train={"epochs": 2, "batch_size": 32}, data={"train_limit": 64, "eval_limit": 20})


def tree(root):
    """Every file under ``root`` with its bytes (an absent root: empty)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} \
        if root.exists() else {}


@pytest.fixture(scope="module")
def ran(tmp_path_factory, one_torch_thread):
    """``run_suite.py --suite tiny.toml --epochs 1`` next to a reference report of the plain
    suite (``reports/tiny/``, no record: as the committed ``reports/default/`` is)."""
    root = tmp_path_factory.mktemp("named")
    (root / "tiny.toml").write_text(SUITE)
    reference = root / "reports" / "tiny"
    (reference / "plots").mkdir(parents=True)
    (reference / "README.md").write_text("# the committed reference report\n")
    (reference / "plots" / "reliability.png").write_bytes(b"\x89PNG reference")
    before = tree(reference)
    capture = pytest.MonkeyPatch()  # the run's stderr: a file, not a terminal
    err = io.StringIO()
    capture.setattr(sys, "stderr", err)
    try:
        code = main(["--suite", str(root / "tiny.toml"), "--epochs", "1", "--results", str(root / "results"),
                     "--reports", str(root / "reports"), "--data-root", str(root / "data")])
    finally:
        capture.undo()
    return {"root": root, "code": code, "err": err.getvalue(), "reference": before}


def args(ran, *more):
    return [*more, "--results", str(ran["root"] / "results"), "--reports", str(ran["root"] / "reports")]


def test_an_override_run_is_named_after_its_suite_and_overrides_and_says_so(ran):
    name = default_name("tiny", {"epochs": 1})
    assert ran["code"] == 0, ran["err"]
    assert name.startswith("tiny-epochs1-") and name != default_name("tiny", {"epochs": 2})
    lines = [line for line in ran["err"].splitlines() if line.strip()]
    assert name in lines[0] and name in lines[-1], ran["err"]  # printed at the start and at the end
    assert (ran["root"] / "results" / name).is_dir() and (ran["root"] / "reports" / name / "README.md").is_file()


def test_an_override_run_leaves_the_plain_suites_report_byte_identical(ran):
    assert tree(ran["root"] / "reports" / "tiny") == ran["reference"]
    assert not (ran["root"] / "results" / "tiny").exists()


def test_the_plain_suite_without_overrides_is_named_after_the_suite():
    assert default_name("tiny", {}) == "tiny"


def test_an_override_run_named_after_the_plain_suite_is_refused_and_writes_nothing(ran, capsys):
    root = ran["root"]
    before = tree(root)
    code = main(args(ran, "--suite", str(root / "tiny.toml"), "--epochs", "3", "--name", "tiny",
                     "--data-root", str(root / "data")))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "reports/tiny" in err and "--epochs 3" in err and default_name("tiny", {"epochs": 3}) in err, err
    assert tree(root) == before


def test_a_run_of_another_plan_under_an_existing_name_is_refused(ran, capsys):
    """The store of ``tiny-epochs1-...`` belongs to --epochs 1: --epochs 2 with that name is refused."""
    root = ran["root"]
    name = default_name("tiny", {"epochs": 1})
    before = tree(root / "results")
    code = main(args(ran, "--suite", str(root / "tiny.toml"), "--epochs", "2", "--name", name,
                     "--data-root", str(root / "data")))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--epochs 1" in err and "--name" in err, err
    assert tree(root / "results") == before


def test_status_report_and_verify_need_the_name_alone(ran, capsys, tmp_path):
    name = default_name("tiny", {"epochs": 1})
    assert main(args(ran, "status", name)) == 0
    out = capsys.readouterr().out
    assert "1 done" in out and "0 missing" in out, out
    assert main(args(ran, "verify", name)) == 0
    assert "1 complete" in capsys.readouterr().out
    # the report rebuilt from the store by its name: the same tables as the run wrote
    report = ran["root"] / "reports" / name
    tables = tree(report / "tables")
    shutil.rmtree(report / "tables")
    assert main(args(ran, "report", name, "--quiet")) == 0, capsys.readouterr().err
    assert tree(report / "tables") == tables


def test_a_name_without_a_run_is_one_line_naming_the_runs_there(ran, capsys):
    assert main(args(ran, "status", "nosuch")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nosuch" in err and default_name("tiny", {"epochs": 1}) in err, err


def test_runs_lists_each_run_with_its_suite_overrides_and_cell_counts(ran, capsys):
    assert main(args(ran, "runs")) == 0
    out = capsys.readouterr().out
    header, *rows = out.strip().splitlines()
    assert header.split()[:3] == ["name", "suite", "overrides"] and "last change" in header
    row = next(r for r in rows if r.startswith(default_name("tiny", {"epochs": 1})))
    assert "tiny" in row and "--epochs 1" in row
    listed = {r.name: r for r in list_runs(ran["root"] / "results")}
    run = listed[default_name("tiny", {"epochs": 1})]
    assert (run.suite, run.done, run.failed, run.missing) == ("tiny", 1, 0, 0)
    assert run.changed > 0


def test_status_help_shows_the_options_of_status_only(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["status", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "run_suite.py status" in text and "NAME" in text and "--suite" in text
    assert "--executor" not in text and "--slurm-partition" not in text  # run's options, not status's
