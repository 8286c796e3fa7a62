"""Property-based fuzzing of suite files and command lines (hypothesis).

Generated suites mutate a valid one with wrong types, non-finite and out-of-range numbers,
huge integers, unknown keys and names; generated command lines add random options.  For
every input the CLI must end with exit 0, 1 or 2 (or reach the training stage, which the
test replaces by a sentinel so nothing trains), never raise or print a traceback, and
write nothing when it exits 2.  Bounded: 150 examples, no training.
"""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import bench.run.runner
from bench.run.cli import main

BASE = {
    "seeds": [0],
    "train": {"epochs": 1, "batch_size": 64, "warmup_epochs": 0, "lr": 0.001},
    "model": {"patch_size": 7, "dim": 16, "depth": 1, "heads": 2, "dropout": 0.1, "mlp_ratio": 2.0},
    "datasets": {"mnist5k": {"train_limit": 200, "eval_limit": 50, "splits": ["test"]}},
    "methods": {"msp": {}, "mc_dropout": {"samples": 2}, "deep_ensemble": {"members": 1}},
}
KEYS = {  # section -> keys a mutation may set (known ones and a few unknown)
    "": ["seeds", "reference", "name", "bogus"],
    "train": ["epochs", "batch_size", "lr", "weight_decay", "warmup_epochs", "min_lr", "grad_clip", "augment",
              "optimizer", "eval_batch_size", "epohcs"],
    "model": ["patch_size", "dim", "depth", "heads", "mlp_ratio", "dropout", "attention", "preset", "pool", "dmi"],
    "datasets.mnist5k": ["train_limit", "eval_limit", "val_fraction", "splits", "ood_size", "corruption_limit",
                         "split_seed", "limit"],
    "methods.mc_dropout": ["samples", "average", "sampels"],
    "methods.deep_ensemble": ["members", "base", "average"],
}

values = st.one_of(
    st.integers(min_value=-10**30, max_value=10**30),
    st.sampled_from([0, 1, -1, 2**32, 2**63, 10**12]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet="abcxyz_/*.0123456789", max_size=8),
    st.booleans(),
    st.lists(st.one_of(st.integers(-5, 10**20), st.text(alphabet="abc/*", max_size=5)), max_size=3),
)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(toml_value(x) for x in v) + "]"


def toml(suite: dict) -> str:
    lines = [f"{k} = {toml_value(v)}" for k, v in suite.items() if not isinstance(v, dict)]
    for section, table in suite.items():
        if not isinstance(table, dict):
            continue
        for key, value in table.items():
            if isinstance(value, dict):
                lines.append(f"[{section}.{key}]")
                lines += [f"{k} = {toml_value(v)}" for k, v in value.items()]
        plain = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if plain or not table:
            lines.append(f"[{section}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in plain.items()]
    return "\n".join(lines) + "\n"


@st.composite
def suites(draw) -> dict:
    suite = json.loads(json.dumps(BASE))
    for _ in range(draw(st.integers(1, 3))):
        section = draw(st.sampled_from(sorted(KEYS)))
        key = draw(st.sampled_from(KEYS[section]))
        table = suite
        for part in filter(None, section.split(".")):
            table = table.setdefault(part, {})
        table[key] = draw(values)
    return suite


options = st.lists(st.one_of(
    st.tuples(st.sampled_from(["--seeds", "--epochs", "--metrics", "--format", "--methods", "--datasets",
                               "--severity", "--device"]),
              st.text(alphabet="abcdefghijklmnopqrstuvwxyz_,0123456789-.", min_size=1, max_size=12)),
    st.tuples(st.just("--seeds"), st.sampled_from(["99999999999999999999", "-1", "0,0", "1,2"])),
    st.tuples(st.just("--epochs"), st.sampled_from(["0", "1000000000000", "nan", "2"])),
), max_size=3)


class Trained(Exception):
    """Raised instead of training: validation passed."""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(suite=suites(), extra=options, command=st.sampled_from(["run", "report"]))
def test_cli_never_crashes_and_exit_2_writes_nothing(suite, extra, command):
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        root = Path(tmp)
        (root / "fuzz.toml").write_text(toml(suite))

        def no_training(*_a, **_k):
            raise Trained

        mp.setattr(bench.run.runner, "run_plan", no_training)
        argv = [command, "--suite", str(root / "fuzz.toml"), "--results", str(root / "results"),
                "--reports", str(root / "reports"), "--data-root", str(root / "data"), "--quiet"]
        for flag, value in extra:
            argv += [flag, value]
        try:
            code = main(argv)
        except Trained:
            event("validated: training would start")
            return
        except SystemExit as exc:  # argparse rejects a malformed option: usage message, exit 2
            code = exc.code
        event(f"exit {code}")
        assert code in (0, 1, 2)
        if code == 2:
            assert not any((root / d).exists() for d in ("results", "reports", "data")), argv
