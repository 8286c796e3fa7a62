"""Named runs (issue 29, items 1 and 2): a run's name picks its store and report; a run
never writes into the folders of another plan; the store records the plan, so ``status``,
``report`` and ``verify`` need the name alone; ``runs`` lists the runs of a store root.

One tiny run (one cell, one epoch) trains for the whole module; the other checks read its
store or are refused before any work."""
from __future__ import annotations

import io
import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from bench.run.cli import main
from bench.store.runs import default_name, list_runs
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


# ---------------------------------------------------------------------------- damaged records (issue 43, row 7)

def damage_lists(record: dict) -> dict:
    return {**record, "overrides": [], "cells": {"0": record["cells"][0]}}  # arrays and objects swapped


def damage_cell_entry(record: dict) -> dict:
    cells = [dict(c) for c in record["cells"]]
    del cells[1]["dataset"]
    return {**record, "cells": cells}


DAMAGES = {"lists where objects belong": damage_lists, "a cell entry without its dataset": damage_cell_entry,
           "truncated": None}


def damaged_store(tiny_store, tmp_path, damage: str) -> tuple[list[str], Path]:
    """A copy of the tiny store (run ``hard``) whose ``run.json`` is damaged as ``damage``
    says; the flags that point a command at it, and the record's path."""
    shutil.copytree(tiny_store / "results", tmp_path / "results")
    path = tmp_path / "results" / "hard" / "run.json"
    text = path.read_text()
    path.write_text(text[:len(text) // 2] if DAMAGES[damage] is None else json.dumps(DAMAGES[damage](json.loads(text))))
    return ["--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports")], path


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_run_record_is_named_by_every_command_that_reads_it(tiny_store, tmp_path, capsys, damage):
    """``runs``, ``status``, ``report`` and ``verify``: exit 2 and one line naming the file as
    damaged with the command that rewrites it (not a Python error, not "not recorded")."""
    flags, path = damaged_store(tiny_store, tmp_path, damage)
    for command in (["runs"], ["status", "hard"], ["report", "hard"], ["verify", "hard"]):
        code = main([*command, *flags, "--quiet"])
        captured = capsys.readouterr()
        assert code == 2, (command, captured.err)
        assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, (command, captured.err)
        assert f"{path} is damaged" in captured.err and ".venv/bin/python run_suite.py --suite" in captured.err, \
            captured.err
    assert "not recorded" not in main_out(["runs", *flags], capsys)
    assert not (tmp_path / "reports").exists()


def main_out(argv: list[str], capsys) -> str:
    main(argv)
    return capsys.readouterr().out


def test_the_command_a_damaged_record_names_rewrites_it_and_trains_nothing(tiny_store, tmp_path, capsys):
    flags, path = damaged_store(tiny_store, tmp_path, "a cell entry without its dataset")
    manifests = {p: p.read_bytes() for p in path.parent.glob("*/manifest.json")}
    assert main(["status", "hard", *flags]) == 2
    command = capsys.readouterr().err.split("`")[1]  # .venv/bin/python run_suite.py --suite FILE --name hard --results DIR
    argv = shlex.split(command)[2:]
    assert main([*argv, "--reports", str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), "--quiet"]) == 0
    assert f"{path} was damaged" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in path.parent.glob("*/manifest.json")} == manifests and len(manifests) == 2
    assert main(["status", "hard", *flags]) == 0
    assert "2 done" in capsys.readouterr().out


def test_a_run_of_another_plan_does_not_take_over_a_store_with_a_damaged_record(tiny_store, tmp_path, capsys):
    """The damaged record cannot say whose the store is, but its cells can: they are not
    cells of --epochs 2, so that run is refused and the store is left as it was."""
    flags, path = damaged_store(tiny_store, tmp_path, "truncated")
    before = tree(tmp_path / "results")
    code = main(["--suite", str(tiny_store / "hard.toml"), "--epochs", "2", "--name", "hard", *flags,
                 "--data-root", str(tmp_path / "data"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{path} is damaged" in err, err
    assert tree(tmp_path / "results") == before


# ---------------------------------------------------------------------------- one name, one plan (issue 43, row 8)

def test_two_runs_claiming_one_name_at_once_for_two_plans_leave_one_plan_in_the_store(tmp_path, capsys, monkeypatch):
    """``run --name race --epochs 3 --seeds 1`` has passed its checks (no store yet) when
    ``run --name race --epochs 2`` claims the name and completes; the second is then
    refused where it would write its record, before it trains a cell."""
    import bench.run.runner

    suite = tmp_path / "hard.toml"
    suite.write_text(tiny_suite("hard", train={"batch_size": 128}))
    common = ["--suite", str(suite), "--name", "race", "--results", str(tmp_path / "results"),
              "--reports", str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), "--quiet"]
    preflight, started, first = bench.run.runner.preflight, [], []

    def the_other_run_meanwhile(*args, **kwargs):
        preflight(*args, **kwargs)
        if not started:  # once: the other run's own preflight comes through here too
            started.append(True)
            first.append(main([*common, "--epochs", "2"]))

    monkeypatch.setattr(bench.run.runner, "preflight", the_other_run_meanwhile)
    second = main([*common, "--epochs", "3", "--seeds", "1"])
    err = capsys.readouterr().err
    assert first == [0], err
    assert second == 2 and "Traceback" not in err and "--epochs 2" in err.strip().splitlines()[-1], err
    store = tmp_path / "results" / "race"
    record = json.loads((store / "run.json").read_text())
    assert record["overrides"] == {"epochs": 2}
    stored = sorted(p.name for p in store.iterdir() if (p / "cell.json").is_file())
    assert stored == [c["key"] for c in record["cells"]]  # the first plan's one cell, none of the second's


# ---------------------------------------------------------------------------- hints as a user types them (issue 39 row 5)

def test_a_rewrite_hint_names_a_built_in_suite_by_its_name_in_the_readmes_command():
    from bench.store.runs import rewrite_hint
    from bench.config.spec import SUITES_DIR

    record = {"suite_file": str((SUITES_DIR / "default.toml").resolve()), "overrides": {"epochs": 1}}
    hint = rewrite_hint(Path("results") / "try1", record, "store")
    assert "`.venv/bin/python run_suite.py --suite default --epochs 1 --name try1`" in hint, hint
    assert str(SUITES_DIR) not in hint


def test_report_of_a_run_names_the_run_and_its_methods_for_a_method_it_lacks(tmp_path, capsys, one_torch_thread):
    """``report try1 --methods mc_dropout`` of a run made with ``--methods msp`` of a suite
    with both: the error names the run and the methods it has (not "Suite 'hard' has: msp")."""
    (tmp_path / "two.toml").write_text(tiny_suite("hard", methods="[methods.msp]\n[methods.mc_dropout]\nsamples = 2\n"))
    where = ["--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"), "--quiet"]
    assert main(["--suite", str(tmp_path / "two.toml"), "--methods", "msp", "--name", "try1", *where,
                 "--data-root", str(tmp_path / "data"), "--format", "csv"]) == 0
    capsys.readouterr()
    assert main(["report", "try1", "--methods", "mc_dropout", *where]) == 2
    err = capsys.readouterr().err
    assert err == "error: --methods: run 'try1' has no method 'mc_dropout'. It has: msp\n", err
    assert main(["report", "--suite", "zoo", *where]) == 2  # no store of the zoo: how to make one, as typed
    assert "(`.venv/bin/python run_suite.py --suite zoo`)" in capsys.readouterr().err


# A store's run.json as runs wrote it before they kept when they started (the committed reference stores' kind).
OLD_RECORD = {
    "cells": [{"dataset": "mnist5k", "epochs": 40, "key": "1e575a86ae7dfaa7", "method": "msp", "seed": 0},
              {"dataset": "mnist5k", "epochs": 80, "key": "4007df5aa518fe5e", "method": "sgpa", "seed": 0}],
    "name": "default-sgpa.msp-1b2c", "overrides": {"methods": ["sgpa", "msp"], "epochs": 3}, "plugins": ["my_plugin"],
    "source": "{\"seeds\": [0], \"datasets\": {\"mnist5k\": {}}, \"methods\": {\"msp\": {}, \"sgpa\": {}}, "
              "\"name\": \"default\"}",
    "suite": "default", "suite_file": "/somewhere/bench/suites/default.toml",
}


def test_an_old_run_json_is_read_into_its_run_spec_and_cells(tmp_path):
    from bench.config.spec import Overrides, RunSpec
    from bench.store.runs import PlannedCell, read_record

    (tmp_path / "run.json").write_text(json.dumps(OLD_RECORD, indent=2, sort_keys=True))
    record = read_record(tmp_path)
    assert record.spec == RunSpec("default-sgpa.msp-1b2c", "default", "/somewhere/bench/suites/default.toml",
                                  Overrides(methods=("sgpa", "msp"), epochs=3), ("my_plugin",))
    assert record.cells[1] == PlannedCell("4007df5aa518fe5e", "mnist5k", "sgpa", 0, 80)
    assert list(record.source["methods"]) == ["msp", "sgpa"] and record.started == ""


def test_a_run_record_round_trips_through_run_json_in_the_format_runs_read(tmp_path):
    """Written and read back, a record is the same; on disk it has the fields an old
    record has (plus ``started``), so older code paths read it as before."""
    from dataclasses import replace

    from bench.config.spec import Overrides, RunSpec
    from bench.store.runs import read_record, write_record

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "run.json").write_text(json.dumps(OLD_RECORD))
    old = read_record(tmp_path / "old")
    record = replace(old, spec=replace(old.spec, overrides=Overrides(seeds=(1, 2), datasets=("mnist5k",))),
                     started="2026-01-02T03:04:05+00:00")
    write_record(tmp_path / "new", record)
    assert read_record(tmp_path / "new") == record
    written = json.loads((tmp_path / "new" / "run.json").read_text())
    assert set(written) == set(OLD_RECORD) | {"started"}
    assert written["overrides"] == {"datasets": ["mnist5k"], "seeds": [1, 2]}
    assert json.loads(written["source"]) == json.loads(OLD_RECORD["source"])
    assert isinstance(old.spec, RunSpec)
