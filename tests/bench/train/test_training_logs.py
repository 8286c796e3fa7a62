"""Training logs a user reads (issue 29, item 4): ``train_log.csv`` holds each epoch's
loss, accuracy, learning rate and the method's own loss terms (KEP-SVGP: its KSVD loss
and KL); ``--log tensorboard`` writes the same as TensorBoard events, one TensorBoard run
per cell, and is refused in one line when the optional ``tensorboard`` package is missing."""
from __future__ import annotations

import csv
import importlib.util
import math

import pytest

from bench.train.cell import epoch_losses
from bench.run.cli import main
from tests.helpers.suites import tiny_suite

SUITE = tiny_suite(None, train={"batch_size": 32}, data={"train_limit": 64, "eval_limit": 20},
                   methods="[methods.kep_svgp]\nsamples = 2\n")

HAVE_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


def command(tmp_path, *more):
    (tmp_path / "logs.toml").write_text(SUITE)
    return ["--suite", str(tmp_path / "logs.toml"), "--results", str(tmp_path / "results"), "--reports",
            str(tmp_path / "reports"), "--data-root", str(tmp_path / "data"), "--format", "csv", "--quiet", *more]


@pytest.fixture(scope="module")
def ran(tmp_path_factory, one_torch_thread):
    """One KEP-SVGP cell, with TensorBoard events when the package is there."""
    tmp_path = tmp_path_factory.mktemp("logs")
    code = main(command(tmp_path, *(["--log", "tensorboard"] if HAVE_TENSORBOARD else [])))
    return tmp_path, code


def test_train_log_holds_the_methods_own_loss_terms(ran):
    tmp_path, code = ran
    assert code == 0
    (log,) = (tmp_path / "results" / "logs").glob("*/train_log.csv")
    rows = list(csv.DictReader(log.open()))
    assert rows and {"epoch", "lr", "train_loss", "train_ce", "train_acc", "val_acc", "ksvd", "kl"} <= set(rows[0])
    for row in rows:
        assert math.isfinite(float(row["ksvd"])) and float(row["kl"]) > 0, row


def test_the_progress_line_gives_the_cross_entropy_and_names_each_method_term(ran):
    """KEP-SVGP's objective is dominated by its KL: the epoch's line leads with the data
    term (cross-entropy, from the log's ``train_ce``) and names ``ksvd`` and ``kl`` apart
    from it, so a large objective does not read as a diverging fit (issue 39 row 3)."""
    tmp_path, _ = ran
    (log,) = (tmp_path / "results" / "logs").glob("*/train_log.csv")
    for row in csv.DictReader(log.open()):
        row = {k: float(v) for k, v in row.items()}
        assert 0 < row["train_ce"] < 10 < row["train_loss"], row  # ln 10 = 2.3 at chance; the KL is large
        line = epoch_losses(row)
        assert line.startswith(f"cross-entropy {row['train_ce']:.4f}; "), line
        assert f"ksvd {row['ksvd']:.4g}" in line and f"kl {row['kl']:.4g}" in line, line
        assert line.endswith(f"objective {row['train_loss']:.4g}") and "loss" not in line, line


@pytest.mark.skipif(not HAVE_TENSORBOARD, reason="the optional tensorboard package is not installed")
def test_tensorboard_events_hold_one_run_per_cell_with_the_logs_columns(ran):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tmp_path, _ = ran
    (folder,) = {p.parent for p in (tmp_path / "results" / "logs" / "tensorboard").rglob("events.out.tfevents.*")}
    assert folder.relative_to(tmp_path / "results" / "logs" / "tensorboard").parts == ("mnist5k", "kep_svgp", "seed0")
    events = EventAccumulator(str(folder))
    events.Reload()
    assert {"loss/train", "loss/train_cross_entropy", "accuracy/train", "accuracy/val", "learning_rate", "method/ksvd",
            "method/kl"} <= \
        set(events.Tags()["scalars"])


@pytest.mark.skipif(HAVE_TENSORBOARD, reason="tensorboard is installed: the refusal cannot be shown")
def test_log_tensorboard_without_the_package_is_one_line_saying_how_to_install_it(tmp_path, capsys):
    code = main(command(tmp_path, "--log", "tensorboard"))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "pip install tensorboard" in err, err
    assert not (tmp_path / "results").exists() and not (tmp_path / "reports").exists()


BROKEN_TENSORBOARD = '''raise TypeError("Descriptors cannot be created directly.\\n"
                "If this call came from a _pb2.py file, your generated code is out of date and must be regenerated "
                "with protoc >= 3.19.0.")
'''


def test_log_tensorboard_with_a_broken_package_is_one_line_naming_it_and_the_fix(tmp_path, capsys, monkeypatch):
    """A ``tensorboard`` whose import raises (its protobuf modules against another protobuf:
    a TypeError), installed or not: one line naming the package, its error and how to
    reinstall it; nothing written (issue 43, row 11)."""
    import sys

    site = tmp_path / "site"
    (site / "tensorboard").mkdir(parents=True)
    (site / "tensorboard" / "__init__.py").write_text(BROKEN_TENSORBOARD)
    monkeypatch.syspath_prepend(str(site))
    for name in [m for m in sys.modules if m.split(".")[0] == "tensorboard" or m.startswith("torch.utils.tensorboard")]:
        monkeypatch.delitem(sys.modules, name)
    code = main(command(tmp_path, "--log", "tensorboard"))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "tensorboard package is installed but fails on import (TypeError: Descriptors cannot be created" in err, err
    assert "pip install --force-reinstall tensorboard" in err, err
    assert not (tmp_path / "results").exists() and not (tmp_path / "reports").exists()
