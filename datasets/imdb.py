"""IMDB reviews (Maas et al., 2011) from the official archive as it unpacks:
``<data-root>/aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt`` (label 1 = pos, 0 = neg;
``<br />`` tags removed; files read in sorted order, so the splits are deterministic).

Splits (:func:`load_imdb`): ``train``/``val`` from ``train`` (seeded, stratified hold-out),
``test`` = ``test``.  ``paper_split=True``: KEP-SVGP's protocol, the 25k + 25k reviews
merged, shuffled with seed 0 and split 70/10/20 into train, val and test.

The registered data set ``imdb`` reads ``<data-root>/aclImdb`` (``--download`` fetches and
unpacks the official archive, md5-verified), tokenises, and adds the generated text shift
(:mod:`datasets.text_bundle`).  IMDB has no OOD set in the paper.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.data import DataBundle, data_root, data_settings, stratified_holdout
from bench.core.errors import ConfigError
from bench.core.registry import DATASETS
from datasets import formats
from datasets.text_bundle import TOKENS_NOTE, TextOptions, TextSplit, max_len_option, text_bundle

URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"  # md5 in datasets.formats.OFFICIAL_MD5


@DATASETS.register("imdb")
class IMDB:
    """IMDB movie-review sentiment with generated text shift."""

    report_note = TOKENS_NOTE + (
        " Departures from KEP-SVGP's IMDB protocol: bert-base-uncased WordPiece cannot be obtained offline "
        "and is replaced by the word vocabulary; positions are learned (the paper's sinusoidal table is "
        "indexed by the batch axis, a bug) and pooling is masked; the split is the official 25k/25k "
        "(validation held out from train) unless paper_split = true (merged, 70/10/20 with seed 0).")

    @dataclass(frozen=True)
    class Options(TextOptions):
        max_len: int = max_len_option(512)  # the paper's 512 (WordPiece there)
        paper_split: bool = False  # KEP-SVGP's protocol: 25k + 25k merged, shuffled (seed 0), 70/10/20

    @staticmethod
    def load(options: IMDB.Options) -> DataBundle:
        root = data_root()
        if data_settings().download and not (root / "aclImdb" / "test" / "pos").is_dir():
            formats.download(URL, root, formats.OFFICIAL_MD5["aclImdb_v1.tar.gz"])  # the archive unpacks into aclImdb/
        splits = load_imdb(root, options.val_fraction, options.split_seed, options.paper_split)
        return text_bundle("imdb", splits, 2, options)


def read_part(folder: Path) -> TextSplit:
    """Every review of ``folder/{neg,pos}`` (negatives first, files sorted)."""
    texts: list[str] = []
    labels: list[int] = []
    for label, name in ((0, "neg"), (1, "pos")):
        for f in sorted((folder / name).glob("*.txt")):
            try:
                texts.append(f.read_text(encoding="utf-8").replace("<br />", " "))
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"IMDB: cannot read {f} ({exc})") from None
            labels.append(label)
    return texts, np.asarray(labels, dtype=np.int64)


def load_imdb(root: Path, val_fraction: float = 0.1, seed: int = 0, paper_split: bool = False) -> dict[str, TextSplit]:
    """The IMDB splits from ``<root>/aclImdb`` (module docstring)."""
    folder = Path(root) / "aclImdb"
    expected = [folder / part / name for part in ("train", "test") for name in ("pos", "neg")]
    empty = [str(p.relative_to(Path(root))) for p in expected if not p.is_dir() or not any(p.glob("*.txt"))]
    if empty:
        raise ConfigError(
            f"IMDB: no reviews in {', '.join(empty)} under {Path(root)}; unpack the official aclImdb_v1.tar.gz "
            f"(https://ai.stanford.edu/~amaas/data/sentiment/) into {Path(root)} so that {folder} exists "
            f"(pass --data-root DIR for another directory), or run with --download")
    train, test = read_part(folder / "train"), read_part(folder / "test")
    if paper_split:
        texts, labels = train[0] + test[0], np.concatenate([train[1], test[1]])
        order = np.random.default_rng(0).permutation(len(texts))
        a, b = int(round(0.7 * len(texts))), int(round(0.8 * len(texts)))
        pick = lambda idx: ([texts[i] for i in idx], labels[idx])  # noqa: E731
        return {"train": pick(order[:a]), "val": pick(order[a:b]), "test": pick(order[b:])}
    keep, held = stratified_holdout(train[1], val_fraction, seed)
    return {
        "train": ([train[0][i] for i in keep], train[1][keep]),
        "val": ([train[0][i] for i in held], train[1][held]),
        "test": test,
    }
