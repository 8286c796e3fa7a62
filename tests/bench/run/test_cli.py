"""End-to-end tests of the command line (``python run_suite.py ...``) as subprocesses.

None of these trains a model: each command either only lists the registries or fails on
bad input before any work starts.  For bad input the contract is: exit status 2, a
message starting ``error:`` that names the key and the alternatives, no traceback, and
nothing written (neither the results nor the reports directory is created).

All invocations are made by one module-scoped fixture (each in its own directory); the
tests then check one invocation each.  Those with a plugin on the path (``list`` among
them: it must show a fresh interpreter's registries) are subprocesses, started together
in parallel; the bad-input ones run ``bench.run.cli.main`` in this process (what they check is
the exit status, the message and that nothing is written, not a fresh interpreter; a
subprocess each cost ~4 s of torch/scipy import).  The reports of a store (last section) run in this process on
stores written without training, except where a plugin's registrations must not outlive
the test (a separate process each).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.helpers.suites import tiny_suite
from tests.helpers.synthetic import fake_store, fake_suite

TINY_SUITE = tiny_suite(None, train={"epochs": 2})

PLUGIN = '''\
"""A user's plugin: one method and one attention layer, registered from outside the repo."""
from bench.core.registry import ATTENTIONS, METHODS
from bench.train.vit import SoftmaxAttention
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
    ``files`` are written first; ``plugin_path`` puts the plugin module on PYTHONPATH (and
    runs the case as a subprocess, so that no registration outlives it)."""

    args: tuple[str, ...]
    files: dict[str, str | bytes] = field(default_factory=dict)
    plugin_path: bool = False


SUITE = "{dir}/suite.toml"

CASES: dict[str, Case] = {
    "list": Case(("list",), plugin_path=True),  # the plugin is on the path but not asked for
    "unknown_method": Case(("--methods", "bogus", "--quiet")),
    "unknown_dataset": Case(("--datasets", "mnist")),
    "unknown_attention": Case(("--suite", SUITE),
                              {"suite.toml": tiny_suite(None, train={"epochs": 2}, model={"attention": "sofmax"})}),
    "malformed_toml": Case(("--suite", SUITE), {"suite.toml": "seeds = [0,\n[train]\nepochs = 2\n"}),
    "epochs_ten": Case(("--suite", SUITE), {"suite.toml": TINY_SUITE.replace("epochs = 2", 'epochs = "ten"')}),
    "epochs_zero": Case(("--epochs", "0")),
    "seeds_not_int": Case(("--seeds", "a,b")),
    "seeds_x": Case(("--seeds", "x")),
    "close_metric": Case(("report", "--metrics", "acc")),
    "close_command": Case(("reprot",)),
    "close_flag": Case(("report", "--sevrity", "3")),
    "close_choice": Case(("--significance", "seeds_and_sample")),
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


def _args(case: Case, case_dir: Path) -> list[str]:
    return [*(a.replace("{dir}", str(case_dir)) for a in case.args),
            "--results", str(case_dir / "results"), "--reports", str(case_dir / "reports")]


def _run(case: Case, case_dir: Path, plugin_dir: Path) -> Ran:
    cmd = [sys.executable, str(REPO / "run_suite.py"), *_args(case, case_dir)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if case.plugin_path:
        env["PYTHONPATH"] = str(plugin_dir)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return Ran(proc, case_dir)


def _run_in_process(case: Case, case_dir: Path) -> Ran:
    """``run_suite.py ARGS`` as its ``sys.exit(main())``, from the repository root, in this
    process: an argparse error's SystemExit gives the status, an exception escapes (the
    test errors, as a traceback would fail it)."""
    from bench.run.cli import main

    args = _args(case, case_dir)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(REPO), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return Ran(subprocess.CompletedProcess(["run_suite.py", *args], code, out.getvalue(), err.getvalue()), case_dir)


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[str, Ran]:
    plugin_dir = tmp_path_factory.mktemp("plugins")
    (plugin_dir / "mymod.py").write_text(PLUGIN)
    dirs = {}
    for name, case in CASES.items():
        d = dirs[name] = tmp_path_factory.mktemp(name)
        for fname, content in case.files.items():
            (d / fname).write_bytes(content if isinstance(content, bytes) else content.encode())
    separate = [name for name, case in CASES.items() if case.plugin_path]
    with ThreadPoolExecutor(max_workers=len(separate)) as pool:
        futures = {name: pool.submit(_run, CASES[name], dirs[name], plugin_dir) for name in separate}
        here = {name: _run_in_process(case, dirs[name]) for name, case in CASES.items() if name not in futures}
        return {**here, **{name: f.result() for name, f in futures.items()}}


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


def test_list_gives_each_description_whole(ran):
    """A method's description is its docstring's first sentence, whole (wrapped under the
    name), never cut at the first line of the docstring."""
    out = ran["list"].proc.stdout
    block = out.split("methods:\n", 1)[1].split("\ndatasets:", 1)[0]
    entries = {}
    for line in block.splitlines():
        if line[2:3].strip():  # a new entry: "  name  [kind] text"
            name, _, text = line.strip().partition(" ")
            entries[name] = text.strip()
        else:
            entries[name] += " " + line.strip()
    assert "(two-stage recipe)." in entries["cgpt"], entries["cgpt"]
    for name, text in entries.items():
        assert text.endswith((".", ".)")), (name, text)


# --------------------------------------------------------------------------- the default OOD scores


def _backticked_defaults(text: str) -> list[str]:
    """The names in ``default: `a`, `b`, ...`` of the README's ``--scores`` row."""
    import re

    row = next(line for line in text.splitlines() if line.startswith("| `--scores"))
    listed = re.search(r"default: ((?:`[^`]+`(?:, )?)+)", row)
    assert listed, row
    return re.findall(r"`([^`]+)`", listed.group(1))


def test_readme_lists_the_registrys_default_ood_scores():
    from bench.scores import default_scores

    assert _backticked_defaults((REPO / "README.md").read_text()) == default_scores()


def test_scores_help_gives_the_registrys_default_scores_a_default_score_of_a_plugin_included():
    """A score registered with a ``default`` place before the parser is built (as a plugin
    module imported first would) appears in ``--scores``'s help at that place."""
    code = ("from bench.scores import ood_score\n"
            "ood_score('Mine', 'higher = in-distribution', reads=('log_probs',), default=2.5, name='mine_score')"
            "(lambda arrays, fitted=None: arrays['log_probs'].max(1))\n"
            "from bench.run.cli import main\nmain(['run', '--help'])\n")
    ran = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "1000"})
    assert ran.returncode == 0, ran.stderr
    line = next(line for line in ran.stdout.splitlines() if line.lstrip().startswith("--scores"))
    assert ("(default: msp, entropy, mutual_info, mine_score, max_logit, energy, mahalanobis, knn, vim; "
            in line), line


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
    assert_bad_input(ran["epochs_zero"], "--epochs", "'0'")
    assert one_line(ran["epochs_zero"])


def test_seeds_not_integers(ran):
    assert_bad_input(ran["seeds_not_int"], "--seeds")
    assert_bad_input(ran["seeds_x"], "--seeds", "'x'", "0,1,2")
    assert one_line(ran["seeds_not_int"]) and one_line(ran["seeds_x"])


@pytest.mark.parametrize("case,hint", [  # a registry name in the registry's shape (Registry.validate), others argparse's
    ("close_metric", "(at --metrics). Did you mean 'accuracy'?"), ("close_command", "(did you mean 'report'?)"),
    ("close_flag", "(did you mean '--severity'?)"), ("close_choice", "(did you mean 'seeds_and_samples'?)")])
def test_a_name_close_to_a_known_one_is_one_line_with_did_you_mean(ran, case, hint):
    assert_bad_input(ran[case], hint)
    assert one_line(ran[case])


def one_line(r: Ran) -> bool:
    """The error is one line on stderr (no argparse usage block before it)."""
    return r.proc.stderr.count("\n") == 1 and not r.proc.stderr.startswith("usage:")


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


@pytest.mark.parametrize("body,what", [("import sys\n\nsys.exit(0)\n", "called sys.exit(0)"),
                                       ("raise SystemExit('bye')\n", "called sys.exit('bye')"),
                                       ("raise KeyboardInterrupt\n", "raised KeyboardInterrupt")])
def test_a_plugin_that_exits_at_import_is_one_line_exit_2(tmp_path, monkeypatch, capsys, body, what):
    """In process: nothing is registered before the module stops."""
    from bench.run.cli import main

    module = f"stops_at_import_{abs(hash(body)) % 10**8}"
    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        code = main(["list", "--plugin", module])
    except BaseException as exc:  # noqa: BLE001  (the plugin's exit escaped the command line)
        pytest.fail(f"{type(exc).__name__}({exc}) escaped main()")
    err = capsys.readouterr().err
    assert code == 2 and f"error: --plugin {module}: importing it {what}" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_plugin_method_and_attention_take_part_in_a_suite(ran):
    # with the plugin the suite validates; the report then stops only for lack of a store
    r = ran["plugin_suite"]
    assert_bad_input(r, "no results")
    assert "my_plugin" not in r.proc.stderr


# --------------------------------------------------------------------------- reports of a store
# In process (bench.run.cli.main) on stores written by synthetic.fake_store: no training; few
# cells of 40 samples, so that a report takes a second or two.


@pytest.fixture
def rep(tmp_path):
    """A suite file ``rep.toml`` (msp and mc_dropout, seeds 0 and 1) in ``tmp_path``."""
    path = tmp_path / "rep.toml"
    path.write_text(fake_suite("rep", "[methods.mc_dropout]\n"))
    return path


def report(tmp_path: Path, suite: str | Path, *args: str) -> int:
    from bench.run.cli import main

    return main(["report", "--suite", str(suite), "--results", str(tmp_path / "results"),
                 "--reports", str(tmp_path / "reports"), "--format", "md", "--quiet", *args])


def snapshot(*roots: Path) -> dict[Path, bytes]:
    """Every file under ``roots`` (hidden ones included) with its bytes."""
    return {p: p.read_bytes() for root in roots if root.exists() for p in sorted(root.rglob("*")) if p.is_file()}


def test_report_of_a_method_without_cells_is_exit_2_and_changes_nothing(tmp_path, rep, capsys):
    fake_store(tmp_path / "results", rep, only={("msp", 0)})
    assert report(tmp_path, rep, "--partial") == 0
    before = snapshot(tmp_path / "reports", tmp_path / "results")
    capsys.readouterr()
    for suite in (rep, "rep"):  # with the suite file, and the store reported alone
        assert report(tmp_path, suite, "--methods", "mc_dropout") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"no cells of method mc_dropout in {tmp_path / 'results' / 'rep'}; methods with cells: msp" in err, err
        assert snapshot(tmp_path / "reports", tmp_path / "results") == before


def test_a_store_reported_alone_shows_only_the_methods_asked_for(tmp_path, rep):
    fake_store(tmp_path / "results", rep, only={("msp", 0), ("mc_dropout", 0)})
    assert report(tmp_path, "rep", "--methods", "mc_dropout") == 0
    summary = (tmp_path / "reports" / "rep" / "tables" / "summary.md").read_text()
    rows = [line.split("|")[2].strip() for line in summary.splitlines()[2:]]
    assert rows == ["mc_dropout"], summary


def test_report_on_an_empty_or_missing_store_writes_nothing(tmp_path, rep, capsys):
    store = tmp_path / "results" / "rep"
    for suite in (rep, "rep"):
        store.mkdir(parents=True, exist_ok=True)  # an empty store
        assert report(tmp_path, suite) == 2
        assert "no cell" in capsys.readouterr().err
        assert not any(store.iterdir()) and not (tmp_path / "reports").exists()
    store.rmdir()  # no store at all
    assert report(tmp_path, rep) == 2 and "no results" in capsys.readouterr().err
    assert not store.exists() and not (tmp_path / "reports").exists()


def test_report_names_missing_failed_and_running_cells(tmp_path, rep, capsys):
    """Seed 0 of msp complete, 1 failed, 2 missing, 3 in progress under a live runner's
    lock: the README opens with the three (keys and states, the lock's owner, the command
    that completes them) and stderr lists the same; the running cell is not 'failed'."""
    import socket

    from bench.store.lock import LOCK_SUFFIX, CellLock

    rep.write_text(fake_suite("rep", seeds=(0, 1, 2, 3)))
    keys = fake_store(tmp_path / "results", rep, only={("msp", s) for s in (0, 1, 3)},
                      failed={("msp", 1)}, unsealed={("msp", 3)})
    lock = CellLock(tmp_path / "results" / "rep" / f"{keys[('msp', 3)]}{LOCK_SUFFIX}")
    assert lock.acquire()  # this test process is the runner training seed 3
    try:
        assert report(tmp_path, rep, "--partial") == 1  # a failed cell
    finally:
        lock.release()
    err = capsys.readouterr().err
    readme = (tmp_path / "reports" / "rep" / "README.md").read_text()
    head = readme.split("## Incomplete\n", 1)[1].split("\n## ", 1)[0]
    assert "3 cell(s) are not in this report (1 missing, 1 running, 1 failed)" in head
    for seed, state in ((1, "failed"), (2, "missing"), (3, "running")):
        key = keys[("msp", seed)]
        assert f"| {state} " in next(line for line in head.splitlines() if key in line)
        assert state in next(line for line in err.splitlines() if key in line), err
    running = next(line for line in head.splitlines() if keys[("msp", 3)] in line)
    assert f"locked by {socket.gethostname()} pid {os.getpid()} since " in running
    assert f"python run_suite.py --suite {rep}" in head and f"python run_suite.py --suite {rep}" in err
    assert keys[("msp", 0)] not in head  # the complete cell
    failed = readme.split("## Failed cells\n", 1)[1].split("\n## ", 1)[0]
    assert "| 3 |" not in failed and keys[("msp", 3)] not in failed, failed  # running is not failed

    assert report(tmp_path, rep, "--partial") == 1  # the runner is gone: the cell is interrupted now
    head = (tmp_path / "reports" / "rep" / "README.md").read_text().split("\n## ", 2)[1]
    assert "| interrupted " in next(line for line in head.splitlines() if keys[("msp", 3)] in line)


def test_a_first_report_of_a_partial_store_is_written_only_with_partial(tmp_path, rep, capsys):
    """No earlier report, cells missing: exit 1, nothing written, stderr names each missing
    cell and the command that trains them; --partial writes it (exit 0; with --strict 1)."""
    keys = fake_store(tmp_path / "results", rep, only={("msp", 0)})
    assert report(tmp_path, rep) == 1
    err = capsys.readouterr().err
    assert not (tmp_path / "reports").exists()
    for method, seed in (("msp", 1), ("mc_dropout", 0), ("mc_dropout", 1)):
        assert f"mnist5k / {method} / seed {seed} ({keys[(method, seed)]}): missing" in err, err
    assert keys[("msp", 0)] not in err
    assert f"to complete them: .venv/bin/python run_suite.py --suite {rep} --results {tmp_path / 'results'}" in err
    assert "--partial" in err
    assert report(tmp_path, rep, "--partial") == 0
    assert "## Incomplete" in (tmp_path / "reports" / "rep" / "README.md").read_text()
    assert report(tmp_path, rep, "--partial", "--strict") == 1


def test_the_completing_command_is_written_as_the_readme_teaches_it(tmp_path, monkeypatch, capsys):
    """A partial store of the default suite in the default folders: the command that
    completes it is ``make suite``; with a plan flag, ``.venv/bin/python run_suite.py`` and
    the flag, the suite by its name (issue 39 row 5)."""
    from bench.run.cli import main
    from bench.config.spec import SUITES_DIR

    monkeypatch.chdir(tmp_path)
    fake_store(tmp_path / "results", SUITES_DIR / "default.toml", only={("msp", 0)})
    assert main(["report", "--suite", "default", "--quiet"]) == 1
    assert "  to complete them: make suite\n" in capsys.readouterr().err
    assert main(["report", "--suite", "default", "--seeds", "0", "--quiet"]) == 1
    assert "  to complete them: .venv/bin/python run_suite.py --seeds 0\n" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


def test_a_partial_store_never_replaces_the_report_of_more_cells(tmp_path, rep, capsys):
    """Issue 43 row 2: a complete report of msp and mc_dropout at seeds 0 and 1, then one
    mc_dropout cell folder removed: ``report`` and ``report --partial`` exit 1 naming the
    cell and the command that trains it, and the report stays byte for byte; ``--partial
    --reports DIR`` writes the partial report there, with the Incomplete banner and
    without the hand-written notes."""
    import shutil

    keys = fake_store(tmp_path / "results", rep)
    out = tmp_path / "reports" / "rep"
    out.mkdir(parents=True)
    (out / "NOTES.md").write_text("msp and mc_dropout agree.\n")
    assert report(tmp_path, rep) == 0
    before = snapshot(tmp_path / "reports")
    gone = keys[("mc_dropout", 1)]
    shutil.rmtree(tmp_path / "results" / "rep" / gone)
    capsys.readouterr()
    for extra in ((), ("--partial",)):
        assert report(tmp_path, rep, *extra) == 1
        err = capsys.readouterr().err
        assert f"mnist5k / mc_dropout / seed 1 ({gone}): missing" in err, err
        assert f"to complete them: .venv/bin/python run_suite.py --suite {rep}" in err, err
        assert snapshot(tmp_path / "reports") == before
    assert "--partial --reports DIR" in err
    elsewhere = tmp_path / "elsewhere" / "rep"
    elsewhere.mkdir(parents=True)
    shutil.copy(out / "NOTES.md", elsewhere / "NOTES.md")
    assert report(tmp_path, rep, "--partial", "--reports", str(elsewhere.parent)) == 0
    readme = (elsewhere / "README.md").read_text()
    banner = readme.split("\n## ", 2)[1]
    assert banner.startswith("Incomplete") and "This report is incomplete" in banner and gone in banner, readme
    assert "msp and mc_dropout agree" not in readme and "`NOTES.md`, written by hand, describes the complete run" in readme


def test_a_run_that_ends_with_a_failed_cell_keeps_the_report_of_more_cells(tiny_store, tmp_path, monkeypatch,
                                                                           capsys):
    """The report step of ``run``: the tiny run reported, one cell folder removed, and its
    retraining fails: exit 1 naming the cell, the report byte for byte as it was, with
    ``--partial`` too (the report shows the cell)."""
    import shutil

    import bench.train.cell
    from bench.core.errors import NonFiniteLoss
    from tests.helpers.suites import run_in_process

    for part in ("results", "reports"):
        shutil.copytree(tiny_store / part, tmp_path / part)
    before = snapshot(tmp_path / "reports")
    gone = sorted(p for p in (tmp_path / "results" / "hard").iterdir() if (p / "cell.json").is_file())[0]
    shutil.rmtree(gone)

    def nan(*_args, **_kwargs):
        raise NonFiniteLoss("loss became nan at epoch 1")

    monkeypatch.setattr(bench.train.cell, "fit", nan)
    suite = (tiny_store / "hard.toml").read_text()
    for extra in ((), ("--partial",)):
        code, err = run_in_process(tmp_path, *extra, suite=suite, capsys=capsys)
        assert code == 1, err
        assert f"({gone.name}): failed: loss became nan" in err, err
        assert snapshot(tmp_path / "reports") == before


def test_a_report_made_before_reports_recorded_their_cells_is_judged_by_its_analysis_files(tmp_path, rep, capsys):
    """The committed reference reports hold no cells.json: their analysis.json (the seeds
    of each method) tells the cells, so a partial store does not replace them either."""
    import shutil

    keys = fake_store(tmp_path / "results", rep)
    assert report(tmp_path, rep) == 0
    (tmp_path / "reports" / "rep" / "cells.json").unlink()
    before = snapshot(tmp_path / "reports")
    shutil.rmtree(tmp_path / "results" / "rep" / keys[("msp", 1)])
    capsys.readouterr()
    assert report(tmp_path, rep, "--partial") == 1
    assert "mnist5k / msp / seed 1: missing" in capsys.readouterr().err
    assert snapshot(tmp_path / "reports") == before


def test_a_report_of_another_configuration_is_no_report_of_more_cells(tmp_path, rep, capsys):
    """The suite file edited to 2 epochs after a complete 1-epoch report: the one cell of
    the new configuration is a partial report (refused without --partial), which the
    report of the old configuration's two cells does not hold back."""
    from bench.config.spec import Overrides

    rep.write_text(fake_suite("rep"))  # msp alone, seeds 0 and 1
    fake_store(tmp_path / "results", rep)
    assert report(tmp_path, rep) == 0
    before = snapshot(tmp_path / "reports")
    keys = fake_store(tmp_path / "results", rep, overrides=Overrides(epochs=2), only={("msp", 0)})
    text = rep.read_text()
    assert "epochs = 1\n" in text
    rep.write_text(text.replace("epochs = 1\n", "epochs = 2\n"))
    capsys.readouterr()
    assert report(tmp_path, rep) == 1 and snapshot(tmp_path / "reports") == before
    assert report(tmp_path, rep, "--partial") == 0, capsys.readouterr().err
    readme = (tmp_path / "reports" / "rep" / "README.md").read_text()
    assert "1 cell(s) are not in this report (1 missing)" in readme and keys[("msp", 1)] in readme
    assert [c["key"] for c in json.loads((tmp_path / "reports" / "rep" / "cells.json").read_text())["cells"]] == \
        [keys[("msp", 0)]]


def test_a_narrower_selection_never_replaces_the_report_of_more_cells(tmp_path, rep, capsys):
    """``report --seeds 0`` or ``--methods msp`` after the report of the whole run: exit 1,
    the cells it would drop named, the report unchanged."""
    fake_store(tmp_path / "results", rep)
    assert report(tmp_path, rep) == 0
    before = snapshot(tmp_path / "reports")
    capsys.readouterr()
    for flags, dropped in ((("--seeds", "0"), "mnist5k / msp / seed 1"), (("--methods", "msp"), "mnist5k / mc_dropout")):
        assert report(tmp_path, rep, *flags) == 1
        err = capsys.readouterr().err
        line = next(line for line in err.splitlines() if dropped in line)
        assert "not selected" in line, err
        assert snapshot(tmp_path / "reports") == before


SLOW_METRIC = '''\
"""A user's plugin with a metric that waits (a long analysis), marking when it starts."""
import os
import time
from pathlib import Path

from bench.metrics import metric


@metric("calibration", "Slow", "%", True, "A metric that takes a minute.")
def slow(probs, labels):
    Path(os.environ["SLOW_METRIC_STARTED"]).touch()
    time.sleep(60)
    return 0.5
'''


def test_sigterm_during_a_report_leaves_no_staging_folder(tmp_path, rep):
    """Issue 43 row 10: SIGTERM while the analysis is written into the staging folder: the
    process ends (exit 143) with the folder removed and the previous report unchanged."""
    import signal
    import time

    fake_store(tmp_path / "results", rep, only={("msp", 0), ("msp", 1)})
    rep.write_text(fake_suite("rep"))
    assert report(tmp_path, rep) == 0
    before = snapshot(tmp_path / "reports")
    (tmp_path / "slow_metric.py").write_text(SLOW_METRIC)
    started = tmp_path / "started"
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(tmp_path),
           "SLOW_METRIC_STARTED": str(started)}
    proc = subprocess.Popen([sys.executable, str(REPO / "run_suite.py"), "report", "--suite", str(rep), "--results",
                             str(tmp_path / "results"), "--reports", str(tmp_path / "reports"), "--quiet",
                             "--plugin", "slow_metric", "--metrics", "accuracy,slow"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), proc.communicate(timeout=60)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "terminated (SIGTERM)" in err, err
    assert [p.name for p in (tmp_path / "reports").iterdir()] == ["rep"]  # no .NAME.new-... beside it
    assert snapshot(tmp_path / "reports") == before


def test_status_shows_a_cell_locked_by_a_live_runner_as_running(tmp_path, rep, capsys):
    """A runner holds seed 1's lock and has not created its directory yet: running, not missing."""
    import socket

    from bench.run.cli import main
    from bench.store.lock import LOCK_SUFFIX, CellLock

    keys = fake_store(tmp_path / "results", rep, only={("msp", 0), ("mc_dropout", 0), ("mc_dropout", 1)})
    lock = CellLock(tmp_path / "results" / "rep" / f"{keys[('msp', 1)]}{LOCK_SUFFIX}")
    assert lock.acquire()
    try:
        assert main(["status", "--suite", str(rep), "--results", str(tmp_path / "results")]) == 0
    finally:
        lock.release()
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if keys[("msp", 1)] in ln)
    assert "msp / seed 1: running: locked by " + socket.gethostname() in line and f"pid {os.getpid()}" in line
    assert "3 done, 0 failed, 1 running, 0 interrupted, 0 damaged, 0 missing" in out


def test_a_report_that_fails_half_way_leaves_the_previous_one_intact(tmp_path, rep, capsys, monkeypatch):
    """Disk full while the README is written, after the tables and plots of a report with
    other columns: every file of the previous report (NOTES.md and analysis/ included)
    stays byte-identical, nothing is left beside it, and one line names the path and the
    OS error."""
    import errno

    import bench.report
    fake_store(tmp_path / "results", rep, only={("msp", 0), ("msp", 1)})
    rep.write_text(fake_suite("rep"))
    out = tmp_path / "reports" / "rep"
    out.mkdir(parents=True)
    (out / "NOTES.md").write_text("Written by hand.\n")
    assert report(tmp_path, rep, "--strict") == 0  # complete: no list of missing cells, as before
    readme = (out / "README.md").read_text()
    title, run, convergence, notes, reference = readme.split("\n\n")[:5]  # the run, convergence, then NOTES
    assert (title, notes) == ("# uqbench report: rep", "Written by hand.") and reference.startswith("Reference method:")
    assert run.startswith("Run `rep`: suite `rep` with no overrides")
    assert convergence.startswith("**Convergence**")
    before = snapshot(tmp_path / "reports")
    assert out / "NOTES.md" in before and out / "analysis" / "analysis.json" in before
    real = bench.report.atomic_write_text

    def full(path, text):
        if Path(path).name == "README.md":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, text)

    monkeypatch.setattr(bench.report, "atomic_write_text", full)
    capsys.readouterr()
    assert report(tmp_path, rep, "--significance", "samples_seeds_fixed") == 1  # other intervals and marks
    assert snapshot(tmp_path / "reports") == before
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["rep"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"the report {out} was not written: No space left on device" in err, err


RAISING_METRICS = '''\
"""A user's plugin with three broken metrics."""
from bench.metrics import metric


@metric("calibration", "Boom", "%", True, "A metric whose code raises.")
def boom(probs, labels):
    raise RuntimeError("kaboom in a plugin metric")


def _boom_kernel(probs, labels, w):
    raise RuntimeError("kaboom in a bootstrap kernel")


@metric("calibration", "BootBoom", "%", True, "A metric whose bootstrap kernel raises.", bootstrap=_boom_kernel)
def boot_boom(probs, labels):
    return 0.25


@metric("calibration", "Cost $\\\\nosuchmacro$", "%", False, "A metric whose label no plot can draw.",
        selections={"severity": 99})
def badly_labelled(probs, labels):
    return 0.5
'''


def run_with_plugin(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``run_suite.py report`` on the rep store with the RAISING_METRICS plugin (a separate
    process: a plugin's registrations would stay in this one's registry)."""
    (tmp_path / "raising_metrics.py").write_text(RAISING_METRICS)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, str(REPO / "run_suite.py"), "report", "--suite", str(tmp_path / "rep.toml"),
           "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"), "--format", "md",
           "--quiet", "--plugin", "raising_metrics", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_a_plugin_metric_that_raises_shows_error_and_the_report_goes_on(tmp_path, rep):
    fake_store(tmp_path / "results", rep, only={("msp", 0), ("msp", 1)})
    rep.write_text(fake_suite("rep"))
    proc = run_with_plugin(tmp_path, "--metrics", "accuracy,boom,boot_boom")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("kaboom in a plugin") == 1, proc.stderr  # named once
    (out,) = (tmp_path / "reports").iterdir()  # a view of the run, beside where its own report goes
    assert out.name.startswith("rep+raising_metrics+metrics-"), out
    summary = (out / "tables" / "summary.md").read_text().splitlines()
    header = [c.strip() for c in summary[0].strip("|").split("|")]
    cells = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in summary[2:]]
    assert [c["Method"] for c in cells] == ["msp (ref)"]
    assert cells[0]["Boom (%)"] == "error" and cells[0]["ACC (%)"][0].isdigit(), cells
    readme = (out / "README.md").read_text()
    assert readme.count("kaboom in a plugin") == 1 and "metric 'boom' raised RuntimeError: kaboom" in readme
    # a metric whose bootstrap raises keeps its value, without interval or mark, and is named once
    assert cells[0]["BootBoom (%)"].startswith("25.00") and "[" not in cells[0]["BootBoom (%)"], cells
    assert proc.stderr.count("kaboom in a bootstrap") == 1 and readme.count("kaboom in a bootstrap") == 1


def test_a_plot_that_raises_leaves_the_previous_report_intact(tmp_path, rep):
    fake_store(tmp_path / "results", rep, only={("msp", 0)}, splits=("val", "test", "shift/gaussian_noise/1"))
    rep.write_text(fake_suite("rep", seeds=(0,)))
    assert report(tmp_path, rep) == 0
    before = snapshot(tmp_path / "reports")
    proc = run_with_plugin(tmp_path, "--metrics", "accuracy,badly_labelled")
    assert snapshot(tmp_path / "reports") == before
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "ValueError" in proc.stderr, proc.stderr
    assert f"the report {tmp_path / 'reports' / 'rep+raising_metrics+metrics-'}" in proc.stderr
    assert "was not written" in proc.stderr


def test_building_the_parser_imports_no_torch():
    """``--help``, ``list``, ``runs`` and argparse's errors build the parser: the executor
    names it shows come from the executor registry, whose module imports the training
    stack (and torch) only where a cell runs."""
    code = ("import sys; from bench.run.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'bench.train.cell', 'bench.train.loop') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
