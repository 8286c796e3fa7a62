"""``list``: the registered methods, datasets, attention layers, metrics, OOD scores and
suites; ``list --suite NAME``: a suite's data sets, seeds and methods (:func:`method_lines`,
also under ``status``)."""
from __future__ import annotations

import argparse
import inspect
import re
import sys
import textwrap

from bench.run.flags import OptionGroups, load_plugins

HELP = "the registered methods, datasets, attention layers, metrics, OOD scores and suites (--suite: a suite's methods)"


def add(sub, groups: OptionGroups) -> None:
    listing = sub.add_parser("list", parents=[groups.results, groups.reports, groups.common], help=HELP,
                             description=HELP + "; with --suite, a suite's methods.")
    listing.add_argument("--suite", default=None,
                         help="list this suite's data sets, seeds and methods, derived ones included (a built-in "
                              "suite's name or a .toml path)")


def main(args: argparse.Namespace) -> int:
    load_plugins(args)
    return cmd_list() if args.suite is None else cmd_suite(args.suite)


def method_lines(suite) -> list[str]:
    """One line per method of a suite (a :class:`bench.config.spec.Suite`), in its order, derived
    ones included: what it is and where its numbers come from (trained: epochs, a
    two-stage or post-hoc method's stage 1; derived: the base whose cells it is computed
    from in analysis, nothing trained)."""
    from bench.core.registry import METHODS
    from bench.config.spec import post_hoc_of, stage1_of

    lines = []
    for m in suite.methods:
        if m.kind == "derived":
            members = METHODS.get(m.type)(m.options).members_per_replicate()
            what = (f"derived: {members} seeds of {m.options.base} per replicate" if members > 1
                    else f"derived: from each seed of {m.options.base}") + ", computed in analysis (nothing trained)"
        elif (base := stage1_of(m)) and post_hoc_of(m):
            what = f"trained post hoc: fitted on {base}'s cell of each seed (no training of its own)"
        elif base:
            what = f"trained: {m.train.epochs} epochs, starting from {base}'s cell of each seed"
        else:
            what = f"trained: {m.train.epochs} epochs"
        lines.append(f"  {m.name:<22} {f'[{m.type}] ' if m.type != m.name else ''}{what}")
    return lines


def cmd_suite(name: str) -> int:
    """``list --suite NAME``: a suite's data sets, seeds and methods, derived ones included
    (:func:`method_lines`)."""
    from bench.config.spec import load_suite

    suite = load_suite(name)
    print(f"suite {suite.name}" + (f": {suite.description}" if suite.description else ""))
    print(f"datasets: {', '.join(d.name for d in suite.datasets)}")
    print(f"seeds: {', '.join(map(str, suite.seeds))}")
    print(f"methods ({len(suite.methods)}; reference {suite.reference_method}):")
    print("\n".join(method_lines(suite)))
    return 0


def first_sentence(obj) -> str:
    """The first sentence of an object's docstring (else of its module's), whole: the
    first paragraph up to a sentence end followed by two spaces (the docstrings' style),
    its lines joined and its double backquotes single."""
    doc = inspect.cleandoc(obj.__doc__ or sys.modules[obj.__module__].__doc__ or "")
    paragraph = " ".join(doc.split("\n\n", 1)[0].splitlines()).strip().replace("``", "`")
    return re.split(r"(?<=[.!?])\s{2,}", paragraph, maxsplit=1)[0]


def _described(name: str, text: str, width: int = 100) -> str:
    """``  name   text`` wrapped to ``width`` columns, continued under the text."""
    return textwrap.fill(" ".join(text.split()), width=width, initial_indent=f"  {name:<22} ",
                         subsequent_indent=" " * 25, break_on_hyphens=False, break_long_words=False)


def cmd_list() -> int:
    from bench.core.registry import ATTENTIONS, DATASETS, METHODS, METRICS, SCORES
    from bench.config.spec import available_suites

    print("methods:")
    for name in METHODS.names():
        cls = METHODS.get(name)
        print(_described(name, f"[{cls.kind}] {first_sentence(cls)}"))
    print("datasets:")
    for name in DATASETS.names():
        print(_described(name, first_sentence(DATASETS.get(name))))
    print("attention layers:")
    for name in ATTENTIONS.names():
        print(_described(name, first_sentence(ATTENTIONS.get(name))))
    print("metrics (name [kind] label (unit), higher/lower is better; * = a default column):")
    for name in METRICS.names():
        m = METRICS.get(name)
        unit = f" ({m.unit})" if m.unit else ""
        star = "*" if "default" in m.selections else " "
        print(f"  {name:<28}{star} [{m.kind}] {m.label}{unit}, {'higher' if m.higher_is_better else 'lower'} is better")
    print("OOD scores (name, label, needs; * = a default score; higher = more in-distribution):")
    for name in SCORES.names():
        sc = SCORES.get(name)
        star = "*" if sc.default is not None else " "
        print(f"  {name:<28}{star} {sc.label}, needs {', '.join(sc.needs)}")
    print("suites:")
    print("  " + ", ".join(available_suites()))
    return 0
