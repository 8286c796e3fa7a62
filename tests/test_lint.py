"""`make test` lints before it tests: its recipe runs `ruff check` (the F rules of
`ruff.toml`) ahead of pytest, ruff is pinned in `requirements.txt` (which `make setup`,
and so CI's `make test`, installs), and the repository passes it."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib

import pytest

from tests.helpers import REPO


def recipe(target: str) -> list[str]:
    """The commands of a Makefile target, in order."""
    lines = (REPO / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    commands = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        commands.append(line.strip())
    return commands


def test_make_test_runs_ruff_check_before_pytest():
    commands = recipe("test")
    ruff = [i for i, c in enumerate(commands) if re.search(r"-m ruff check\b", c)]
    tests = [i for i, c in enumerate(commands) if "-m pytest" in c]
    assert ruff and tests and ruff[0] < tests[0], commands


def test_ruff_is_pinned_and_selects_the_pyflakes_rules():
    pins = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()]
    assert any(re.fullmatch(r"ruff==\d+\.\d+\.\d+", p) for p in pins)
    config = tomllib.loads((REPO / "ruff.toml").read_text(encoding="utf-8"))
    assert "F" in config["lint"]["select"]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                    reason="ruff is not installed here (make setup installs requirements.txt)")
def test_the_repository_passes_ruff_check():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


MAX_FUNCTION_LINES = 80  # a function of bench/ longer than this is split into named steps


def test_no_function_in_bench_is_longer_than_80_lines():
    """Every function and method of ``bench/``, decorators left out and docstring included,
    spans at most MAX_FUNCTION_LINES lines: a longer one does several jobs that want names."""
    import ast

    long = []
    for path in sorted((REPO / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 80 lines:\n  " + "\n  ".join(long)
