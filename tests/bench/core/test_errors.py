"""Errors once and short, times in sensible units (issue 29, item 10): a bad value in the
suite's ``[train]`` table is named once, where it is written, not again for every method
that inherits it; a split pattern that matches nothing lists the splits there are with the
corruption grid folded; ``status`` gives the time left in seconds, minutes or hours as fits."""
from __future__ import annotations

from bench.run.cli import main
from bench.core.progress import duration
from tests.helpers.synthetic import fake_store, fake_suite

SUITE = """\
seeds = [0]
[train]
epochs = 1
warmup_epochs = 0
lr = "fast"
[datasets.mnist5k]
train_limit = 50
eval_limit = 20
splits = ["test"]
[methods.msp]
[methods.mc_dropout]
[methods.kep_svgp]
"""


def test_a_bad_train_value_is_named_once(tmp_path, capsys):
    (tmp_path / "bad.toml").write_text(SUITE)
    code = main(["--suite", str(tmp_path / "bad.toml"), "--results", str(tmp_path / "results"),
                 "--reports", str(tmp_path / "reports")])
    err = capsys.readouterr().err
    assert code == 2 and "train.lr" in err, err
    assert sum("lr" in line and "fast" in line for line in err.splitlines()) == 1, err
    assert "methods.msp.train.lr" not in err and "methods.kep_svgp.train.lr" not in err, err


def test_a_split_pattern_matching_nothing_lists_the_splits_with_the_corruptions_folded(tmp_path, capsys):
    (tmp_path / "split.toml").write_text(SUITE.replace('lr = "fast"\n', "").replace('["test"]', '["shift/nosuch/*"]'))
    code = main(["--suite", str(tmp_path / "split.toml"), "--results", str(tmp_path / "results"),
                 "--reports", str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "'shift/nosuch/*' matches no split" in err, err
    available = err.split("available: ", 1)[1]
    assert "corruptions>/<1-5>" in available and "shift/fog/1" not in available, err
    assert "fog" in available and "test" in available, err  # each corruption still named, once


def test_status_gives_the_time_left_in_seconds_when_it_is_seconds(tmp_path, capsys):
    suite = tmp_path / "st.toml"
    suite.write_text(fake_suite("st", seeds=(0, 1, 2)))
    fake_store(tmp_path / "results", suite, only={("msp", 0)})  # 1.1 s recorded for the done cell
    assert main(["status", "--suite", str(suite), "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "2 missing" in out and f"to run: {duration(2 * 1.1)}" in out and "hours" not in out, out
    assert duration(2 * 1.1) == "2.2 s"
