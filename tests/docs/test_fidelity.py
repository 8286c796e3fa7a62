"""docs/fidelity.md: each method's official option values, declared once (the method's
``official``), are the ones the page states in that method's section, and the ones its
``deviations()`` compares the options with.

The page's values are read as TOML (``key = value``, as a suite file writes an option), so
a value written wrong, a value missing, one too many, or a declared value that
``deviations()`` ignores fails here."""
from __future__ import annotations

import dataclasses
import re
import tomllib
import typing

import pytest

from bench.core.registry import METHODS
from tests.helpers import REPO

WITH_OFFICIAL = [name for name in METHODS.names() if METHODS.get(name).official]


def stated(name: str) -> dict[str, object]:
    """The ``Official values of `name`: `k = v`, ...`` paragraph of ``name``'s section
    (the ``## ...`` heading that names it), read as TOML."""
    text = (REPO / "docs" / "fidelity.md").read_text()
    sections = [s for s in re.split(r"\n(?=## )", text)
                if s.startswith("## ") and name in re.split(r"\W+", s.splitlines()[0])]
    assert len(sections) == 1, f"docs/fidelity.md has {len(sections)} sections named {name!r}"
    paragraphs = [p.replace("\n", " ") for p in sections[0].split("\n\n")]
    (line,) = [p for p in paragraphs if p.startswith(f"Official values of `{name}`")]
    pairs = re.findall(r"`(\w+ = [^`]+)`", line.split(":", 1)[1])
    assert pairs, line
    return tomllib.loads("\n".join(pairs))


def same(a: object, b: object) -> bool:
    """Equal, and a bool only to a bool (True == 1 in Python, not in a suite file)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def test_the_methods_with_official_values_are_the_ones_the_page_covers():
    assert {"sgpa", "kep_svgp", "cgpt", "scgpt", "rff_gp_attention", "sngp", "ddu", "kdeformer",
            "laplace_last_layer"} <= set(WITH_OFFICIAL)


@pytest.mark.parametrize("name", WITH_OFFICIAL)
def test_the_page_states_each_declared_official_value(name):
    declared, page = METHODS.get(name).official, stated(name)
    assert set(page) == set(declared), f"{name}: the page states {sorted(page)}, the method declares {sorted(declared)}"
    wrong = {k: (page[k], declared[k]) for k in declared if not same(page[k], declared[k])}
    assert not wrong, f"{name}: (page, declared) differ: {wrong}"


def _other(value: object, hint: object) -> object:
    """A valid option value other than ``value`` (``hint``: the option's annotation)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return 2 * value + 1
    (choice, *_) = [c for c in typing.get_args(hint) if c != value]  # a Literal's other choice
    return choice


@pytest.mark.parametrize("name", WITH_OFFICIAL)
def test_deviations_compares_each_declared_official_value(name):
    """With every declared option at its official value, setting one other value adds or
    changes a line of ``deviations()``: the declared value is the one compared with."""
    cls = METHODS.get(name)
    hints = typing.get_type_hints(cls.Options)
    fields = {f.name for f in dataclasses.fields(cls.Options)}
    assert set(cls.official) <= fields, f"{name}: official names no option {sorted(set(cls.official) - fields)}"
    at_official = dataclasses.replace(cls.Options(), **cls.official)
    for key, value in cls.official.items():
        off = dataclasses.replace(at_official, **{key: _other(value, hints[key])})
        assert cls(off).deviations() != cls(at_official).deviations(), f"{name}: {key} != official changes nothing"
