"""What every text data family shares: its options, the tokenizer fitted on its training
texts, lazily encoded splits, and the generated ``shift/<corruption>/<severity>`` splits.

A family's reader returns ``{split: (texts, labels)}`` (``train``, ``val``, ``test``,
``shift/<name>``, ``ood/<name>``); :func:`text_bundle` turns that into a
:class:`~bench.data.DataBundle` of :class:`~bench.data.TokenSplit` loaders:

* the :class:`~bench.data.text.WordTokenizer` is fitted on the ``train`` texts only
  (``max_len``, ``min_freq``, ``max_vocab``) and kept on the bundle (the runner stores it
  with each cell, so the predictions can be reproduced);
* every split is encoded when first asked for;
* ``shift/<corruption>/<severity>`` for each text corruption
  (:data:`datasets.text_corruptions.TEXT_CORRUPTIONS`) and severity: the first
  ``corruption_limit`` test texts, corrupted (seeded by ``corruption_seed``) and encoded,
  through the on-disk corruption cache (keyed by the texts and the vocabulary).
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from bench.data import SEVERITIES, DataBundle, TokenSplit, corruption_split
from bench.data.text import WordTokenizer
from datasets.corruption_cache import CorruptionCache, Engine
from datasets.text_corruptions import TEXT_CORRUPTIONS, VERSION, check_name_severity, corrupt_texts

TextSplit = tuple[list[str], np.ndarray]  # (texts, labels int64); labels -1 on OOD

#: What every text data set's report says about its input (the start of its ``report_note``).
TOKENS_NOTE = ("Text input: a word vocabulary built on the training split only (lower-cased words and "
               "punctuation marks, `<unk>` for the rest, cut or padded to max_len, stored with each cell "
               "as `tokenizer.json`) feeding a learned embedding trained from scratch; padded tokens are "
               "masked in every attention layer and in the mean pooling. Shift: generated typos, word "
               "drops and word shuffles (`datasets/text_corruptions.py`) at 5 severities.")


#: the largest ``max_len`` without --allow-large: a sanity limit (attention costs max_len^2
#: per text, and every text is padded to it; KEP-SVGP's longest is IMDB's 512)
MAX_LEN_LIMIT = 1024


def max_len_option(default: int):
    """The ``max_len`` option (tokens per text, cut or padded) of a text data set."""
    return field(default=default, metadata={"min": 1, "soft_max": MAX_LEN_LIMIT})


@dataclass(frozen=True)
class TextOptions:
    """Options every text data set shares (dataset ``Options`` classes inherit them)."""

    max_len: int = max_len_option(64)  # tokens per text (cut, padded)
    min_freq: int = field(default=2, metadata={"min": 1})  # a word needs this many training occurrences
    max_vocab: int = field(default=20000, metadata={"min": 3, "soft_max": 1 << 22})  # incl. <pad>, <unk>
    split_seed: int = field(default=0, metadata={"min": 0})  # the seeded, stratified hold-outs
    val_fraction: float = field(default=0.1, metadata={"exclusive_min": 0.0})  # < 1, checked below
    corruption_limit: int | None = field(default=None, metadata={"min": 1})  # corrupt only the first N test texts
    corruption_seed: int = field(default=0, metadata={"min": 0})

    def __post_init__(self) -> None:
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be > 0 and < 1, got {self.val_fraction!r}")


def text_fingerprint(texts: Sequence[str], tokenizer: WordTokenizer) -> str:
    """First 16 hex digits of the sha256 of the texts and the tokenizer: a cache key."""
    h = hashlib.sha256()
    for part in (*texts, "\x00vocab", *tokenizer.itos, str(tokenizer.max_len)):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()[:16]


def text_engine(tokenizer: WordTokenizer) -> Engine:
    """The text corruptions as the corruption cache runs them: texts in, token ids of the
    corrupted texts out (int64 ``[N, max_len]``)."""
    return Engine(
        f"text-v{VERSION}", check_name_severity,
        lambda texts, name, severity, seed: tokenizer.encode(corrupt_texts(texts, name, severity, seed)),
        lambda texts: ((len(texts), tokenizer.max_len), np.dtype(np.int64)),
    )


def text_bundle(name: str, splits: dict[str, TextSplit], num_classes: int, options: TextOptions) -> DataBundle:
    """The bundle of a text family's raw splits (module docstring)."""
    tokenizer = WordTokenizer.fit(splits["train"][0], options.max_len, options.min_freq, options.max_vocab)
    loaders = {split: functools.partial(_encoded, tokenizer, texts, labels) for split, (texts, labels) in splits.items()}
    bundle = DataBundle(name, num_classes, None, (), (), loaders, tokenizer=tokenizer)
    test_texts, test_labels = splits["test"]
    texts, labels = test_texts[: options.corruption_limit], test_labels[: options.corruption_limit]
    cache = functools.partial(_corrupted, tokenizer, texts, labels, f"{name}-test-{text_fingerprint(texts, tokenizer)}",
                              options.corruption_seed)
    for corruption in TEXT_CORRUPTIONS:
        for severity in SEVERITIES:
            bundle.loaders.setdefault(corruption_split(corruption, severity), functools.partial(cache, corruption, severity))
    return bundle


def _encoded(tokenizer: WordTokenizer, texts: list[str], labels: np.ndarray) -> TokenSplit:
    return TokenSplit(tokenizer.encode(texts), np.array(labels, dtype=np.int64))  # a writable copy


def _corrupted(tokenizer: WordTokenizer, texts: list[str], labels: np.ndarray, key: str, seed: int,
               corruption: str, severity: int) -> TokenSplit:
    ids = CorruptionCache(engine=text_engine(tokenizer)).get(texts, corruption, severity, seed, key=key)
    return TokenSplit(ids, np.array(labels, dtype=np.int64))
