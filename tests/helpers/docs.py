"""The runnable examples of ``docs/*.md``, as the tests of ``tests/docs/`` run them.

A doc marks its example in the info strings of fenced blocks (Markdown shows only the
language): ```` ```python file=my_metric.py ```` is a file the reader saves,
```` ```toml part=methods ```` a part of a suite file, ```` ```bash example ```` the
commands the reader runs from the repository root, one per line (``\\`` continues a line,
``#`` starts a comment).  :func:`example` reads them; :func:`run_commands` runs the
commands in :func:`reader_folder`, ``run_suite.py`` in this process through the CLI and a
script of the doc as ``python script.py`` would (its folder first on ``sys.path``).
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from tests.helpers import REPO

DOCS = REPO / "docs"
PYTHON = ".venv/bin/python"  # how every command of a doc starts
_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)


@dataclass
class Example:
    """A doc's example: ``files`` (name -> text), ``parts`` (name -> text) and ``commands``
    (each the arguments after ``.venv/bin/python``)."""

    files: dict[str, str] = field(default_factory=dict)
    parts: dict[str, str] = field(default_factory=dict)
    commands: list[list[str]] = field(default_factory=list)

    def write(self, folder: Path) -> None:
        """Save every file of the example in ``folder``, as the doc tells the reader to."""
        for name, text in self.files.items():
            (folder / name).write_text(text)


def example(doc: str) -> Example:
    """The example of ``docs/<doc>``: its marked blocks (an unmarked block is prose)."""
    out = Example()
    for info, body in _FENCE.findall((DOCS / doc).read_text(encoding="utf-8")):
        words = info.split()
        attrs = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        if "file" in attrs:
            out.files[attrs["file"]] = body
        elif "part" in attrs:
            out.parts[attrs["part"]] = body
        elif words[1:2] == ["example"]:
            out.commands += _commands(body, doc)
    assert out.commands, f"docs/{doc} has no ```bash example``` block"
    return out


def _commands(body: str, doc: str) -> list[list[str]]:
    commands = []
    for line in body.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        assert argv[0] == PYTHON, f"docs/{doc}: a command of the example does not start with {PYTHON}: {line!r}"
        commands.append(argv[1:])
    return commands


def run_commands(commands: list[list[str]], extra: dict[str, list[str]] | None = None,
                 rename: dict[str, str] | None = None) -> list[str]:
    """Run each command in the current directory; ``extra`` adds arguments per
    ``run_suite.py`` command (``"run"``, ``"report"``, ...), ``rename`` replaces whole
    arguments (a run's name).  Returns what each command wrote on standard output; fails
    at the first command that does not exit 0, with what it wrote on stderr."""
    from bench.run.cli import COMMANDS, main

    outputs = []
    for argv in commands:
        argv = [(rename or {}).get(a, a) for a in argv]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if argv[0] == "run_suite.py":
                command = argv[1] if len(argv) > 1 and argv[1] in COMMANDS else "run"
                code = main([*argv[1:], *(extra or {}).get(command, [])])
            else:
                code = _script(argv)
        assert code == 0, f"{' '.join(argv)}: exit {code}\n{err.getvalue()}"
        outputs.append(out.getvalue())
    return outputs


@contextlib.contextmanager
def reader_folder(folder: Path) -> Iterator[Path]:
    """``folder`` as the working directory, where a doc's files are saved and its commands
    run (``results/`` and ``reports/`` land there, and ``--plugin`` finds a module there, as
    in the repository root).  Afterwards the working directory, the registries,
    ``sys.path`` and the imported modules are as before: a doc's plugin registers nothing
    for later tests."""
    from bench.core.registry import ATTENTIONS, DATASETS, METHODS, METRICS

    registries = (ATTENTIONS, DATASETS, METHODS, METRICS)
    for registry in registries:
        registry.complete()
    saved = [dict(registry._items) for registry in registries]
    path, cwd = list(sys.path), os.getcwd()
    os.chdir(folder)
    try:
        yield folder
    finally:
        os.chdir(cwd)
        for registry, items in zip(registries, saved):
            registry._items.clear()
            registry._items.update(items)
        sys.path[:] = path
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(folder)):
                del sys.modules[name]


def _script(argv: list[str]) -> int:
    """``python SCRIPT ARGS`` in this process: 0 when it returns, its exit status when it exits."""
    path = Path(argv[0]).resolve()
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = [str(path), *argv[1:]], [str(path.parent)]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
    return 0
