"""End-to-end tests of the command line (``python run_suite.py ...``) as subprocesses.

None of these trains a model: each command either only lists the registries or fails on
bad input before any work starts.  For bad input the contract is: exit status 2, a
message starting ``error:`` that names the key and the alternatives, no traceback, and
nothing written (neither the results nor the reports directory is created).

Every invocation pays ~2-3 s of torch/scipy import, so all of them are started together,
in parallel, by one module-scoped fixture (each in its own directory); the tests then
check one invocation each.
"""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

TINY_SUITE = """\
seeds = [0]
[train]
epochs = 2
[datasets.mnist5k]
train_limit = 50
eval_limit = 20
ood_size = 20
[methods.msp]
"""

PLUGIN = '''\
"""A user's plugin: one method and one attention layer, registered from outside the repo."""
from bench.registry import ATTENTIONS, METHODS
from bench.vit import SoftmaxAttention
from methods.msp import MSP


@METHODS.register("my_plugin_method")
class MyPluginMethod(MSP):
    """Plugin method for the CLI tests."""


@ATTENTIONS.register("my_plugin_attention")
class MyPluginAttention(SoftmaxAttention):
    """Plugin attention for the CLI tests."""
'''

PLUGIN_SUITE = TINY_SUITE + """\
[methods.my_plugin_method]
model = { attention = "my_plugin_attention" }
"""


@dataclass(frozen=True)
class Case:
    """One invocation: ``args`` may say ``{dir}`` for the case's own directory, where
    ``files`` are written first; ``plugin_path`` puts the plugin module on PYTHONPATH."""

    args: tuple[str, ...]
    files: dict[str, str | bytes] = field(default_factory=dict)
    plugin_path: bool = False


SUITE = "{dir}/suite.toml"

CASES: dict[str, Case] = {
    "list": Case(("list",), plugin_path=True),  # the plugin is on the path but not asked for
    "unknown_method": Case(("--methods", "bogus", "--quiet")),
    "unknown_dataset": Case(("--datasets", "mnist")),
    "unknown_attention": Case(("--suite", SUITE),
                              {"suite.toml": TINY_SUITE + '[model]\nattention = "sofmax"\n'}),
    "malformed_toml": Case(("--suite", SUITE), {"suite.toml": "seeds = [0,\n[train]\nepochs = 2\n"}),
    "epochs_ten": Case(("--suite", SUITE), {"suite.toml": TINY_SUITE.replace("epochs = 2", 'epochs = "ten"')}),
    "epochs_zero": Case(("--epochs", "0")),
    "seeds_not_int": Case(("--seeds", "a,b")),
    "unknown_suite": Case(("--suite", "nonexistent")),
    "missing_plugin": Case(("--plugin", "no_such_module")),
    "unknown_device": Case(("--device", "tpu")),
    "report_no_store": Case(("report",)),
    "plugin_list": Case(("list", "--plugin", "mymod"), plugin_path=True),
    "plugin_suite": Case(("report", "--suite", SUITE, "--plugin", "mymod"),
                         {"suite.toml": PLUGIN_SUITE}, plugin_path=True),
}


@dataclass(frozen=True)
class Ran:
    proc: subprocess.CompletedProcess
    dir: Path  # the case's directory; --results/--reports point at dir/results, dir/reports

    @property
    def out(self) -> str:
        return self.proc.stdout + self.proc.stderr


def _run(case: Case, case_dir: Path, plugin_dir: Path) -> Ran:
    args = [a.replace("{dir}", str(case_dir)) for a in case.args]
    cmd = [sys.executable, str(REPO / "run_suite.py"), *args,
           "--results", str(case_dir / "results"), "--reports", str(case_dir / "reports")]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if case.plugin_path:
        env["PYTHONPATH"] = str(plugin_dir)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return Ran(proc, case_dir)


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[str, Ran]:
    plugin_dir = tmp_path_factory.mktemp("plugins")
    (plugin_dir / "mymod.py").write_text(PLUGIN)
    dirs = {}
    for name, case in CASES.items():
        d = dirs[name] = tmp_path_factory.mktemp(name)
        for fname, content in case.files.items():
            (d / fname).write_bytes(content if isinstance(content, bytes) else content.encode())
    workers = min(len(CASES), 2 * (os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(_run, CASES[name], dirs[name], plugin_dir) for name in CASES}
        return {name: f.result() for name, f in futures.items()}


def assert_bad_input(r: Ran, *needles: str) -> None:
    assert r.proc.returncode == 2, r.out
    assert "error:" in r.proc.stderr, r.out
    assert "Traceback" not in r.out, r.out
    for needle in needles:
        assert needle in r.proc.stderr, f"{needle!r} not in stderr:\n{r.proc.stderr}"
    assert not (r.dir / "results").exists(), "bad input created the results directory"
    assert not (r.dir / "reports").exists(), "bad input created the reports directory"


# --------------------------------------------------------------------------- list


def test_list_prints_every_registry(ran):
    r = ran["list"]
    assert r.proc.returncode == 0, r.out
    out = r.proc.stdout
    for name in ("msp", "mc_dropout", "temperature_scaling", "deep_ensemble",  # methods
                 "mnist5k",  # datasets
                 "softmax",  # attention layers
                 "accuracy", "ece", "nll", "brier", "aurc", "ood_auroc", "ood_fpr95"):  # metrics
        assert name in out, name
    assert "attention" in out and "metrics" in out
    assert "default" in out  # the built-in suites
    assert "my_plugin_method" not in out  # a plugin is imported only when asked for
    assert "my_plugin_attention" not in out
    assert not (r.dir / "results").exists() and not (r.dir / "reports").exists()


# --------------------------------------------------------------------------- bad input


def test_unknown_method(ran):
    assert_bad_input(ran["unknown_method"], "--methods", "'bogus'", "msp", "mc_dropout", "deep_ensemble")


def test_unknown_dataset(ran):
    assert_bad_input(ran["unknown_dataset"], "--datasets", "'mnist'", "mnist5k")


def test_unknown_attention_in_suite_file(ran):
    assert_bad_input(ran["unknown_attention"], "model.attention", "'sofmax'", "softmax")


def test_malformed_toml(ran):
    r = ran["malformed_toml"]
    assert_bad_input(r, str(r.dir / "suite.toml"), "TOML")


def test_wrong_type_in_suite_file(ran):
    assert_bad_input(ran["epochs_ten"], "train.epochs", "'ten'")


def test_epochs_zero(ran):
    assert_bad_input(ran["epochs_zero"], "--epochs")


def test_seeds_not_integers(ran):
    assert_bad_input(ran["seeds_not_int"], "--seeds")


def test_unknown_suite_name(ran):
    assert_bad_input(ran["unknown_suite"], "'nonexistent'", "default")


def test_missing_plugin(ran):
    assert_bad_input(ran["missing_plugin"], "--plugin", "no_such_module")


def test_unknown_device(ran):
    assert_bad_input(ran["unknown_device"], "--device", "tpu", "cpu", "cuda")


def test_report_without_a_store_says_how_to_create_it(ran):
    assert_bad_input(ran["report_no_store"], "no results", "run_suite.py", "--results")


# --------------------------------------------------------------------------- plugins


def test_plugin_registrations_appear_in_list(ran):
    r = ran["plugin_list"]
    assert r.proc.returncode == 0, r.out
    assert "my_plugin_method" in r.proc.stdout
    assert "my_plugin_attention" in r.proc.stdout
    assert "msp" in r.proc.stdout and "softmax" in r.proc.stdout  # built-ins still there


def test_plugin_method_and_attention_take_part_in_a_suite(ran):
    # with the plugin the suite validates; the report then stops only for lack of a store
    r = ran["plugin_suite"]
    assert_bad_input(r, "no results")
    assert "my_plugin" not in r.proc.stderr
