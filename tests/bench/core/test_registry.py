"""The registries are complete whichever module a plugin (or a notebook) imports first,
and a name reused from a built-in is refused at once (each such case runs in a fresh
interpreter: in this one every registry is filled already).  A bad name wherever a user
writes one (suite file, ``--scores``, ``--metrics``) is one line in one shape: the name,
where it was written, the closest known name and the known ones (``Registry.validate``)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

NAMES = """
import json
from bench.core.registry import ATTENTIONS, DATASETS, METHODS, METRICS
print(json.dumps({r.kind: r.names() for r in (ATTENTIONS, DATASETS, METHODS, METRICS)}))
"""


def fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def every_name() -> dict[str, list[str]]:
    """The registries as the command line fills them (every built-in module imported)."""
    ran = fresh("from bench.core.registry import import_plugins\nimport_plugins([])\n" + NAMES)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


@pytest.mark.parametrize("first", ["methods", "datasets", "bench.core.registry", "methods.kep_svgp"])
def test_every_registry_is_complete_whichever_module_comes_first(first, every_name):
    ran = fresh(f"import {first}\n" + NAMES)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == every_name


def test_import_methods_gives_every_attention_layer_softmax_included(every_name):
    ran = fresh("import methods\nfrom bench.core.registry import ATTENTIONS\n"
                "print(ATTENTIONS.get('softmax').__module__, ATTENTIONS.get('kep_svgp').__module__)")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["bench.train.vit", "methods.kep_svgp"]
    assert {"softmax", "kep_svgp", "sgpa"} <= set(every_name["attention"])


def test_a_plugin_reusing_a_built_in_name_is_refused_before_any_lookup():
    """Registering comes first here (no lookup has loaded the built-ins yet): the error
    still names the built-in module that owns the name."""
    ran = fresh("from bench.core.registry import ATTENTIONS, DuplicateName\n"
                "try:\n    ATTENTIONS.register('softmax')(type('Mine', (), {}))\n"
                "except DuplicateName as exc:\n    print(exc)\n")
    assert ran.returncode == 0, ran.stderr
    assert "attention 'softmax' is already registered by module 'bench.train.vit'" in ran.stdout, ran.stdout


# one check, one message shape: a bad name in each place the user writes one


@pytest.mark.parametrize("where,suite,flags,bad,meant", [
    ("methods.mc_dropuot", {"methods": "[methods.mc_dropuot]\n"}, (), "mc_dropuot", "mc_dropout"),
    ("methods.mine.type", {"methods": "[methods.mine]\ntype = \"mps\"\n"}, (), "mps", "msp"),
    ("datasets.mnist5k.type", {"data": {"type": "mnist5"}}, (), "mnist5", "mnist5k"),
    ("methods.msp.model.attention", {"model": {"attention": "sofmax"}}, (), "sofmax", "softmax"),
    ("scores", {"methods": "[methods.msp]\n", "scores": ["enrgy"]}, (), "enrgy", "energy"),
    ("--scores", {}, ("--scores", "msp,enrgy"), "enrgy", "energy"),
    ("--metrics", {}, ("--metrics", "accuracy,ece_debaised"), "ece_debaised", "ece_debiased"),
    ("--metrics", {}, ("--metrics", "nll,Brier"), "Brier", "brier"),  # a metric's label means that metric
])
def test_a_bad_registry_name_is_one_line_with_the_close_name_and_the_known_ones(tmp_path, capsys, where, suite,
                                                                                 flags, bad, meant):
    from tests.helpers.suites import run_in_process, tiny_suite

    scores = suite.pop("scores", None)
    text = tiny_suite("hard", **suite)
    if scores is not None:
        text = f"scores = {json.dumps(scores)}\n" + text
    code, err = run_in_process(tmp_path, *flags, suite=text, capsys=capsys)
    assert code == 2, err
    (line,) = [line for line in err.splitlines() if repr(bad) in line]
    assert where in line and f"Did you mean {meant!r}?" in line, line
    assert meant in line.split("Known ", 1)[1].rstrip(".").split(", "), line  # the fix: every known name
    assert not (tmp_path / "results").exists()
