"""Word-level tokenisation for the text track (the paper's frozen ELMo and WordPiece cannot
be obtained offline; a vocabulary built on the training split replaces them).

:class:`WordTokenizer` lower-cases, splits into words and punctuation marks, keeps the
words seen at least ``min_freq`` times in the *training* texts (at most ``max_vocab``,
most frequent first, ties alphabetical), and maps every text to ``max_len`` ids: ``<pad>``
= 0 after the text, ``<unk>`` = 1 for words outside the vocabulary, longer texts cut.  It
is a pure function of the training texts and its settings, serialisable with
:meth:`to_dict` / :meth:`from_dict` so a cell stores the exact vocabulary its predictions
used.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

PAD, UNK = "<pad>", "<unk>"
PAD_ID, UNK_ID = 0, 1
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")  # words (with 's, n't ...) or single marks


def words(text: str) -> list[str]:
    """Lower-cased words and punctuation marks of ``text`` (``<br />`` tags removed)."""
    return _WORD.findall(text.replace("<br />", " ").lower())


@dataclass(frozen=True)
class WordTokenizer:
    """A vocabulary (``itos``: id -> word, ``<pad>`` and ``<unk>`` first) and a length."""

    itos: tuple[str, ...]
    max_len: int
    index: dict = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.itos[:2] != (PAD, UNK):
            raise ValueError(f"the vocabulary must start with {PAD!r}, {UNK!r}")
        if self.max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {self.max_len}")
        object.__setattr__(self, "index", {w: i for i, w in enumerate(self.itos)})

    @classmethod
    def fit(cls, texts: Iterable[str], max_len: int, min_freq: int = 2, max_vocab: int | None = 20000) -> WordTokenizer:
        """Build the vocabulary from training ``texts`` only."""
        counts = Counter(w for t in texts for w in words(t))
        kept = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        if max_vocab is not None:
            kept = kept[: max(0, max_vocab - 2)]
        return cls((PAD, UNK, *kept), max_len)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Token ids ``[len(texts), max_len]`` (int64), padded with 0 and cut at ``max_len``."""
        out = np.full((len(texts), self.max_len), PAD_ID, dtype=np.int64)
        for row, text in enumerate(texts):
            ids = [self.index.get(w, UNK_ID) for w in words(text)][: self.max_len]
            out[row, : len(ids)] = ids
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Words of one encoded row, padding dropped (for inspection)."""
        return " ".join(self.itos[i] for i in ids if i != PAD_ID)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def to_dict(self) -> dict:
        return {"itos": list(self.itos), "max_len": self.max_len}

    @classmethod
    def from_dict(cls, d: dict) -> WordTokenizer:
        return cls(tuple(d["itos"]), int(d["max_len"]))
