"""Generated text shift: typos and word-order noise at 5 severities, seeded and deterministic.

``corrupt_texts(texts, name, severity, seed)`` returns new strings.  Every call draws from
one ``numpy.random.Generator``, ``bench.data.corruption_rng(name, severity, seed)`` (never
the global RNG, as the image corruptions), in text order, so a call is a pure function of
its arguments.  Corruptions
(:data:`TEXT_CORRUPTIONS`):

* ``char_swap``, ``char_delete``, ``char_insert``, ``keyboard``: each letter is hit with
  probability p = :data:`CHAR_RATES` [severity - 1] and swapped with its right neighbour,
  deleted, followed by a random lower-case letter, or replaced by a QWERTY neighbour;
* ``word_drop``: each word is dropped with probability :data:`WORD_RATES` [severity - 1]
  (a text keeps at least one word);
* ``word_shuffle``: words are permuted within consecutive windows of
  :data:`SHUFFLE_WINDOWS` [severity - 1] words.

Only letters are typo'd (digits, spaces and punctuation stay), so word boundaries are
preserved except by ``char_delete`` of a one-letter word.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from bench.data import check_severity, corruption_rng

VERSION = 1  # bump on any change that alters outputs: it is part of every cache path
CHAR_RATES = (0.02, 0.04, 0.07, 0.10, 0.15)  # per-letter probability of a typo
WORD_RATES = (0.05, 0.10, 0.15, 0.20, 0.30)  # per-word probability of a drop
SHUFFLE_WINDOWS = (2, 3, 4, 6, 8)  # words permuted within windows of this size

_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")


def _neighbours(r: int, i: int) -> str:
    """QWERTY neighbours of key i of row r: each row sits half a key right of the row above,
    so the row above touches keys i and i+1, the row below keys i-1 and i."""
    cells = [(r - 1, i), (r - 1, i + 1), (r, i - 1), (r, i + 1), (r + 1, i - 1), (r + 1, i)]
    return "".join(_ROWS[rr][ii] for rr, ii in cells if 0 <= rr < 3 and 0 <= ii < len(_ROWS[rr]))


KEYBOARD_NEIGHBOURS: dict[str, str] = {c: _neighbours(r, i) for r, row in enumerate(_ROWS) for i, c in enumerate(row)}
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _typos(text: str, p: float, rng: np.random.Generator, kind: str) -> str:
    chars = list(text)
    hit = rng.random(len(chars)) < p
    out: list[str] = []
    i = 0
    while i < len(chars):
        c = chars[i]
        if not (hit[i] and c.isalpha()):
            out.append(c)
            i += 1
            continue
        if kind == "char_swap" and i + 1 < len(chars) and chars[i + 1].isalpha():
            out += [chars[i + 1], c]
            i += 2
            continue
        if kind == "char_delete":
            pass
        elif kind == "char_insert":
            out += [c, _LETTERS[rng.integers(len(_LETTERS))]]
        elif kind == "keyboard" and c.lower() in KEYBOARD_NEIGHBOURS:
            near = KEYBOARD_NEIGHBOURS[c.lower()]
            sub = near[rng.integers(len(near))]
            out.append(sub.upper() if c.isupper() else sub)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _word_drop(text: str, p: float, rng: np.random.Generator) -> str:
    ws = text.split()
    if len(ws) <= 1:
        return text
    keep = rng.random(len(ws)) >= p
    if not keep.any():
        keep[rng.integers(len(ws))] = True
    return " ".join(w for w, k in zip(ws, keep) if k)


def _word_shuffle(text: str, window: int, rng: np.random.Generator) -> str:
    ws = text.split()
    out: list[str] = []
    for start in range(0, len(ws), window):
        chunk = ws[start:start + window]
        out += [chunk[j] for j in rng.permutation(len(chunk))]
    return " ".join(out)


_CORRUPTIONS: dict[str, Callable[[str, int, np.random.Generator], str]] = {
    "char_swap": lambda t, s, rng: _typos(t, CHAR_RATES[s - 1], rng, "char_swap"),
    "char_delete": lambda t, s, rng: _typos(t, CHAR_RATES[s - 1], rng, "char_delete"),
    "char_insert": lambda t, s, rng: _typos(t, CHAR_RATES[s - 1], rng, "char_insert"),
    "keyboard": lambda t, s, rng: _typos(t, CHAR_RATES[s - 1], rng, "keyboard"),
    "word_drop": lambda t, s, rng: _word_drop(t, WORD_RATES[s - 1], rng),
    "word_shuffle": lambda t, s, rng: _word_shuffle(t, SHUFFLE_WINDOWS[s - 1], rng),
}
TEXT_CORRUPTIONS: tuple[str, ...] = tuple(_CORRUPTIONS)


def check_name_severity(name: str, severity: int) -> None:
    if name not in _CORRUPTIONS:
        raise ValueError(f"unknown text corruption {name!r}; known: {', '.join(TEXT_CORRUPTIONS)}")
    check_severity(severity)


def corrupt_texts(texts: Sequence[str], name: str, severity: int, seed: int = 0) -> list[str]:
    """``texts`` corrupted by ``name`` at ``severity`` (1..5); deterministic (module docstring)."""
    check_name_severity(name, severity)
    rng = corruption_rng(name, severity, seed)
    fn = _CORRUPTIONS[name]
    return [fn(t, int(severity), rng) for t in texts]
