"""Hostile but realistic input to the command line: every bad value (a number, a plugin,
a suite name, a path, a metric, a read-only directory) is exit 2 with one message, before
anything is written."""
from __future__ import annotations

import json
import os

import pytest

from bench.run.cli import main
from tests.helpers.suites import nothing_written, run_in_process as run, tiny_suite

SUITE = tiny_suite("hard")


@pytest.mark.parametrize("key,value", [
    ("train.lr", "nan"), ("train.weight_decay", "nan"), ("train.lr", "inf"), ("model.dropout", "nan"),
    ("model.mlp_ratio", "nan"), ("train.epochs", "1000000000000"), ("model.dim", "100000"),
    ("seeds", "[99999999999999999999]"),
])
def test_bad_numbers_are_exit_2_before_anything_is_written(tmp_path, capsys, key, value):
    section, _, name = key.rpartition(".")
    if section:
        suite = SUITE.replace(f"[{section}]\n", f"[{section}]\n{name} = {value}\n", 1)
        suite = "\n".join(ln for ln in suite.splitlines()
                          if not (ln.startswith(f"{name} = ") and ln != f"{name} = {value}"))
    else:
        suite = SUITE.replace("seeds = [0]", f"seeds = {value}")
    code, err = run(tmp_path, suite=suite, capsys=capsys)
    assert code == 2 and name in err and "Traceback" not in err, err
    assert nothing_written(tmp_path)


def test_huge_cli_seed_and_epochs_are_exit_2(tmp_path, capsys):
    code, err = run(tmp_path, "--seeds", "99999999999999999999", capsys=capsys)
    assert code == 2 and "seeds" in err and nothing_written(tmp_path)
    code, err = run(tmp_path, "--epochs", "1000000000000", capsys=capsys)
    assert code == 2 and "epochs" in err and "UQBENCH_ALLOW_LARGE" in err and nothing_written(tmp_path)


@pytest.mark.parametrize("body,expect", [
    ("raise RuntimeError('plugin exploded')", "RuntimeError: plugin exploded"),
    ("def broken(:\n    pass", "syntax error"),
    ("from bench.core.registry import METHODS\nfrom methods.msp import MSP\n"
     "@METHODS.register('msp')\nclass Again(MSP):\n    pass", "already registered by module 'methods.msp'"),
])
def test_plugin_errors_are_one_line_exit_2(tmp_path, capsys, monkeypatch, body, expect):
    name = f"badplugin_{abs(hash(body)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, err = run(tmp_path, "--plugin", name, capsys=capsys)
    assert code == 2 and f"--plugin {name}" in err and expect in err and "Traceback" not in err, err
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("name", ["../escaped", "ABSOLUTE", ""])
def test_a_suite_name_that_is_no_folder_name_is_exit_2_and_writes_nothing(tmp_path, capsys, name):
    """The name would put the store and report outside --results/--reports (or the report
    straight into the report root): one line, nothing written anywhere."""
    name = str(tmp_path / "absolute") if name == "ABSOLUTE" else name
    code, err = run(tmp_path, suite=f"name = {json.dumps(name)}\n" + SUITE.replace('name = "hard"\n', ""), capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and f"name: {name!r} cannot name a suite" in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["hard.toml"]


def test_a_run_name_longer_than_a_file_name_is_exit_2_and_writes_nothing(tmp_path, capsys):
    """300 characters (most filesystems allow 255): refused in one line before any folder
    is made (issue 43, row 8)."""
    code, err = run(tmp_path, "--name", "r" * 300, capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "--name" in err and "300 characters" in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["hard.toml"]


def test_run_scores_that_need_features_the_suite_does_not_store_are_exit_2_before_training(tmp_path, capsys):
    """``run --scores knn`` on a suite with ``[store] features = false`` (issue 43, row 12)."""
    code, err = run(tmp_path, "--scores", "msp,knn", suite=SUITE + "[store]\nfeatures = false\n", capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "--scores: 'knn' needs the stored features" in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["hard.toml"]


def test_allow_large_is_the_switch_uqbench_allow_large_is(tmp_path, capsys, monkeypatch):
    """--allow-large lifts the sanity limits (here: epochs) for its command only, as
    UQBENCH_ALLOW_LARGE=1 does; the cell-count limit (over 10,000 cells) is one of them."""
    from bench.config.options import ALLOW_LARGE_ENV

    monkeypatch.delenv(ALLOW_LARGE_ENV, raising=False)
    path = tmp_path / "hard.toml"
    path.write_text(SUITE.replace("epochs = 1\n", "epochs = 1000000\n"))
    status = ["status", "--suite", str(path), "--results", str(tmp_path / "results")]
    assert main(status) == 2 and "--allow-large" in capsys.readouterr().err
    assert main([*status, "--allow-large"]) == 0 and "1 missing" in capsys.readouterr().out
    assert ALLOW_LARGE_ENV not in os.environ  # the flag's setting ends with its command
    monkeypatch.setenv(ALLOW_LARGE_ENV, "1")
    assert main(status) == 0
    monkeypatch.delenv(ALLOW_LARGE_ENV)
    path.write_text(SUITE)
    many = ",".join(map(str, range(10_001)))
    code, err = run(tmp_path, "--seeds", many, capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "more than 10,000 cells" in err and "--allow-large" in err, err
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("flag", ["--results", "--reports", "--data-root"])
def test_a_file_where_a_directory_is_needed_is_exit_2(tmp_path, capsys, flag):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    path = tmp_path / "hard.toml"
    path.write_text(SUITE)
    args = {"--results": str(tmp_path / "results"), "--reports": str(tmp_path / "reports"),
            "--data-root": str(tmp_path / "data")}
    args[flag] = str(blocker)
    code = main(["--suite", str(path), "--quiet", *[x for kv in args.items() for x in kv]])
    err = capsys.readouterr().err
    assert code == 2 and flag in err and "not a directory" in err, err
    assert nothing_written(tmp_path)


def test_unknown_metric_is_exit_2_before_training(tmp_path, capsys):
    code, err = run(tmp_path, "--metrics", "accuracy,nope", capsys=capsys)
    assert code == 2 and "nope" in err and nothing_written(tmp_path)


def test_debug_shows_the_traceback(tmp_path):
    from bench.core.errors import ConfigError

    with pytest.raises(ConfigError):
        run(tmp_path, "--metrics", "nope", "--debug")


def test_read_only_directories_are_exit_2(tmp_path, capsys, monkeypatch):
    """A read-only filesystem (simulated: os.access denies writing; the tests run as root,
    for whom permissions do not apply) is found before any work."""
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if mode & os.W_OK else real_access(p, mode, **kw))
    code, err = run(tmp_path, capsys=capsys)
    assert code == 2 and "not writable" in err and "--results" in err and nothing_written(tmp_path)


def test_a_flag_of_another_command_names_the_commands_that_take_it(tmp_path, capsys):
    """``status NAME --data-root DIR``: --data-root is a real flag (of run and report), so
    the error says so, where it answered "did you mean '--data-root'?" to --data-root."""
    with pytest.raises(SystemExit) as stop:
        main(["status", "default", "--results", str(tmp_path), "--data-root", str(tmp_path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert "--data-root is an option of report, run only" in err and "did you mean" not in err


@pytest.mark.parametrize("flag,given,message", [
    ("--methods", "mps", "error: unknown method 'mps' (at --methods). Did you mean 'msp'? Known methods of suite "
                         "'hard' or registered: "),
    ("--datasets", "mnist", "error: unknown dataset 'mnist' (at --datasets). Did you mean 'mnist5k'? Known datasets of "
                            "suite 'hard': mnist5k.\n"),
    ("--executor", "slrum", "error: unknown executor 'slrum' (at --executor). Did you mean 'slurm'? Known executors: "
                            "local, processes, slurm, submitit-local.\n"),
])
def test_a_misspelt_name_is_the_registrys_one_message_and_writes_nothing(tmp_path, capsys, flag, given, message):
    code, err = run(tmp_path, flag, given, capsys=capsys)
    assert code == 2 and err.startswith(message), err
    assert nothing_written(tmp_path)
