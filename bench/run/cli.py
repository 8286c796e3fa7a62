"""Command line: ``python run_suite.py [COMMAND] [options]`` (``COMMAND --help``: its options).

Each command is a module of :mod:`bench.run.commands` (its subparser, ``add``, beside its
handler, ``main``); the options several commands take are declared once in
:mod:`bench.run.flags`.  This module builds the parser from them and dispatches.

* ``run`` (the default command): name the run (:mod:`bench.store.runs`: ``--name``, else the
  suite's name, with a tag and hash of the plan overrides when there are any), train and
  predict every incomplete cell into its store ``<results>/NAME/``, then write its report
  ``<reports>/NAME/``.  A store or report folder of another plan is refused.  Progress
  (:mod:`bench.core.progress`) shows as bars on a terminal and as lines elsewhere.  Ctrl-C
  (or SIGTERM) stops with one line saying what is done and saved (exit 130; 143); a second
  one at once.
* ``report [NAME]``: rebuild every table and plot from the store alone (no model is built
  and no checkpoint read).  Analysis files under ``<reports>/NAME/analysis/`` are reused
  while the store and the analysis options are unchanged.  The store describes itself: when
  ``--suite NAME`` is no suite file but ``<results>/NAME/`` is a store, that store is
  reported on its own.
* ``status [NAME]``, ``verify [NAME]``: a run's cells (by name, or by ``--suite`` and the
  flags it ran with); ``runs``: the runs of a store root.
* ``compare NAME REFERENCE``: whether the run reproduces a reference report within stated
  tolerances (:mod:`bench.run.compare`): exit 0 with one line, 1 listing what is outside,
  2 for a reference of another plan.
* ``list``: the registered methods, datasets, attention layers, metrics, OOD scores and suites.

A report that leaves out cells of its run is written only with ``--partial``, and never
replaces a report of the run showing more cells (:mod:`bench.run.report`); ``report``
with ``--metrics``, ``--scores`` or a plugin adding metrics or scores writes a view beside
the run's report, ``<reports>/NAME+ADDITION/`` (:func:`bench.run.commands.report.additions`).

Exit status: 0 success, 1 some cells failed (a ``--partial`` report marks them; with
``--strict`` also when it leaves out any cell), a report was not written as it would leave
out cells or replace a report showing more (the cells and the completing command on
stderr), or the report could not be written (the previous one is kept), 2 bad input
(nothing written), 130 interrupted (Ctrl-C), 143 stopped by SIGTERM (a report so ended
leaves no staging folder).
"""
from __future__ import annotations

import argparse
import difflib
import re
import signal
import sys

from bench.core.errors import ConfigError, one_line
from bench.core.registry import did_you_mean
from bench.run.commands import compare, listing, report, run, runs, status, verify
from bench.run.flags import option_groups
from bench.run.interrupt import CtrlC, Interrupted

#: each command's module (:mod:`bench.run.commands`), in the order ``run_suite.py --help`` lists them
COMMAND_MODULES = {"run": run, "report": report, "status": status, "verify": verify, "compare": compare,
                   "runs": runs, "list": listing}
#: the commands, with the one line ``run_suite.py --help`` shows for each
COMMANDS = {name: module.HELP for name, module in COMMAND_MODULES.items()}


class _OneLineErrors(argparse.ArgumentParser):
    """A parser whose errors are one line on stderr, exit 2, as every other bad input's:
    the message, a "did you mean" where a name given is close to a valid one (a choice,
    a command, a flag), and where ``--help`` lists the options (no usage block)."""

    def error(self, message: str):
        hint = ""
        if (choice := re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$", message)):
            known = re.findall(r"'([^']*)'", choice.group(3))
            hint = did_you_mean(choice.group(2), known)
        elif message.startswith("unrecognized arguments: "):
            flags = {f for a in self._actions for f in a.option_strings}
            commands = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
            owners: dict[str, list[str]] = {}  # a flag -> the commands that take it
            for command, parser in (commands.choices.items() if commands is not None else ()):
                for f in {f for a in parser._actions for f in a.option_strings}:
                    owners.setdefault(f, []).append(command)
            flags |= set(owners)  # the top-level parser: the flags of every command
            given = [g.split("=")[0] for g in message.split(": ", 1)[1].split() if g.startswith("--")]
            if (known := next((g for g in given if g in owners), None)) is not None:  # a real flag, another command's
                hint = f" ({known} is an option of {', '.join(sorted(owners[known]))} only)"
            else:
                bare = {f.lstrip("-"): f for f in flags if f.startswith("--")}  # compared without the dashes
                hint = next((f" (did you mean {bare[c]!r}?)" for g in given
                             for c in difflib.get_close_matches(g.lstrip("-"), sorted(bare), n=1, cutoff=0.7)), "")
        self.exit(2, f"error: {message}{hint} (`{self.prog} --help` lists the options)\n")


class _CommandLine(_OneLineErrors):
    """The top-level parser: it reads a command line through :func:`_with_command` (the
    command moved to the front, ``run`` when there is none) before parsing it."""

    def parse_known_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(_with_command(self, argv), namespace)


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand each (``run_suite.py COMMAND --help`` shows a
    command's own options), added by its module with the shared option groups
    (:func:`bench.run.flags.option_groups`); :func:`main` reads a command line without a
    command as ``run``, as the options of today's flat command line keep working."""
    p = _CommandLine(
        prog="run_suite.py",
        description="uqbench: train, evaluate and report uncertainty methods for Transformers.",
        epilog="Without a command, run is meant (run_suite.py --epochs 1 = run_suite.py run --epochs 1). "
               "run_suite.py COMMAND --help shows the options of a command.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands", parser_class=_OneLineErrors)
    groups = option_groups()
    for module in COMMAND_MODULES.values():
        module.add(sub, groups)
    return p


def _with_command(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with its command first: a command given after options moves to the front
    (``--quiet report`` = ``report --quiet``), and ``run`` is put there when there is none."""
    if not argv:
        return ["run"]
    if argv[0] in COMMANDS or argv[0] in ("-h", "--help"):
        return argv
    # the flags that take a value, of any command (argparse keeps its actions in _actions)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    valued = {flag for q in commands.choices.values() for a in q._actions if a.nargs != 0 for flag in a.option_strings}
    flags = {flag for q in commands.choices.values() for a in q._actions for flag in a.option_strings}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-"):  # the first positional: the command (or a misspelt one)
            return [token, *argv[:i], *argv[i + 1:]]
        # a flag taking a value, also abbreviated as argparse allows (--epoch 3)
        takes_value = token in valued or (token not in flags and any(f.startswith(token) for f in valued))
        i += 2 if takes_value else 1
    return ["run", *argv]


def main(argv: list[str] | None = None) -> int:
    from bench.core import progress
    from bench.config.options import allowing_large

    parser = build_parser()
    args = parser.parse_args(argv)
    before = progress.mode(), progress.verbose()
    progress.configure(progress.auto(args.quiet), verbose=args.verbose)
    stop = CtrlC()
    try:
        with stop, allowing_large(args.allow_large):
            return COMMAND_MODULES[args.command].main(args)
    except ConfigError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, permissions, ... outside a cell: one line naming the path
        if args.debug:
            raise
        print(f"error: {one_line(exc)}; complete cells in the store are intact "
              "(run again once the problem is fixed; --debug shows the traceback)", file=sys.stderr)
        return 1
    except Interrupted as exc:
        print(f"\n{exc}", file=sys.stderr)
        return stop.code
    except KeyboardInterrupt:
        print("\nterminated (SIGTERM)" if stop.signum == signal.SIGTERM else "\ninterrupted", file=sys.stderr)
        return stop.code
    finally:
        progress.configure(*before)
