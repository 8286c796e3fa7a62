"""CoLA (Warstadt et al., 2019) from the official ``cola_public`` 1.1 release, read as it
unpacks: ``<data-root>/cola_public/raw/{in_domain_train,in_domain_dev,out_of_domain_dev}.tsv``
(no header; 4 tab-separated columns: source, label 0/1, the author's original mark,
sentence; read with quoting disabled, since two training sentences contain ``"``).

Splits (:func:`load_cola`): ``train``/``val`` = in_domain_train with a seeded, stratified
hold-out, ``test`` = in_domain_dev, ``shift/out_of_domain`` = out_of_domain_dev (the public
test sets have no labels).  ``paper_split=True`` reproduces KEP-SVGP's protocol instead:
in-domain train + dev merged, shuffled with seed 0 and split 80/20 into train and test (the
validation hold-out then comes from those 80%).

The registered data set ``cola`` reads ``<data-root>/cola_public`` (md5 of each file
checked against the official release; ``--download`` fetches and unpacks the official
zip), tokenises, and adds the generated text shift (:mod:`datasets.text_bundle`).  Its
summary tables show MCC in place of accuracy, as the paper does (``headline_metrics``).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench.data import DataBundle, data_root, data_settings, stratified_holdout
from bench.core.errors import ConfigError
from bench.core.registry import DATASETS
from datasets import formats
from datasets.text_bundle import TOKENS_NOTE, TextOptions, TextSplit, text_bundle

FILES = {"train": "raw/in_domain_train.tsv", "dev": "raw/in_domain_dev.tsv", "ood": "raw/out_of_domain_dev.tsv"}
URL = "https://nyu-mll.github.io/CoLA/cola_public_1.1.zip"  # md5 in datasets.formats.OFFICIAL_MD5


@DATASETS.register("cola")
class CoLA:
    """CoLA acceptability (in-domain train/dev) with the out-of-domain dev set as shift."""

    #: The summary's accuracy column shows MCC for this data set (the paper's CoLA column).
    headline_metrics = {"accuracy": "mcc"}

    report_note = TOKENS_NOTE + (
        " Departures from KEP-SVGP's CoLA protocol: the paper's frozen ELMo embeddings (1024-d, allennlp) cannot "
        "be obtained offline and are replaced by the learned word embedding; checkpoints are chosen on a "
        "validation hold-out of in_domain_train (the paper selects on the test split); the split is the "
        "official one (train = in_domain_train, test = in_domain_dev, shift/out_of_domain = out_of_domain_dev) "
        "unless paper_split = true (train + dev merged, shuffled with seed 0, 80/20). The MCC column (where other "
        "data sets show accuracy) is the whole-split MCC; the paper averages sklearn's MCC over test batches of 32 "
        "(metric `mcc_per_batch`). "
        "No OOD split: CoLA has no out-of-distribution set. out_of_domain_dev holds labelled acceptability "
        "judgements of sentences from other sources, so it is a covariate shift (`shift/out_of_domain`, scored "
        "as the test split) and not OOD; KEP-SVGP's code loads it as OOD but its evaluation is commented "
        "out, and the paper reports no OOD result for CoLA.")

    @dataclass(frozen=True)
    class Options(TextOptions):
        paper_split: bool = False  # KEP-SVGP's protocol: train + dev merged, shuffled (seed 0), 80/20

    @staticmethod
    def load(options: CoLA.Options) -> DataBundle:
        root, settings = data_root(), data_settings()
        if settings.download and not all((root / "cola_public" / f).is_file() for f in FILES.values()):
            formats.download(URL, root, formats.OFFICIAL_MD5["cola_public_1.1.zip"])  # the zip unpacks into cola_public/
        for rel in FILES.values():
            path = root / "cola_public" / rel
            if path.is_file():
                formats.check_md5(path, formats.OFFICIAL_MD5[f"cola_public/{rel}"], settings.strict)
        splits = load_cola(root, options.val_fraction, options.split_seed, options.paper_split)
        return text_bundle("cola", splits, 2, options)


def read_tsv(path: Path) -> TextSplit:
    """Sentences and labels of one official CoLA ``.tsv``; a malformed file is a ConfigError
    naming the file and the line."""
    try:
        frame = pd.read_csv(path, sep="\t", header=None, quoting=csv.QUOTE_NONE, dtype=str,
                            keep_default_na=False, on_bad_lines="error", encoding="utf-8")
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: not an official CoLA .tsv ({exc})") from None
    if frame.shape[1] != 4:
        raise ConfigError(f"{path}: expected 4 tab-separated columns (source, label, mark, sentence), "
                          f"got {frame.shape[1]}")
    bad = ~frame[1].isin(["0", "1"])
    if bad.any():
        line = int(np.flatnonzero(bad.to_numpy())[0]) + 1
        raise ConfigError(f"{path}, line {line}: label must be 0 or 1, got {frame[1][bad].iloc[0]!r}")
    return frame[3].tolist(), frame[1].astype(np.int64).to_numpy()


def load_cola(root: Path, val_fraction: float = 0.1, seed: int = 0, paper_split: bool = False) -> dict[str, TextSplit]:
    """The CoLA splits from ``<root>/cola_public`` (module docstring)."""
    folder = Path(root) / "cola_public"
    missing = [rel for rel in FILES.values() if not (folder / rel).is_file()]
    if missing:
        raise ConfigError(
            f"CoLA: missing {', '.join(missing)} under {folder}; unpack the official cola_public_1.1.zip "
            f"(https://nyu-mll.github.io/CoLA/) into {Path(root)} so that {folder / FILES['train']} exists "
            f"(pass --data-root DIR for another directory), or run with --download")
    train, dev, ood = (read_tsv(folder / FILES[k]) for k in ("train", "dev", "ood"))
    if paper_split:
        texts, labels = train[0] + dev[0], np.concatenate([train[1], dev[1]])
        order = np.random.default_rng(0).permutation(len(texts))
        cut = int(round(0.8 * len(texts)))
        train = ([texts[i] for i in order[:cut]], labels[order[:cut]])
        dev = ([texts[i] for i in order[cut:]], labels[order[cut:]])
    keep, held = stratified_holdout(train[1], val_fraction, seed)
    return {
        "train": ([train[0][i] for i in keep], train[1][keep]),
        "val": ([train[0][i] for i in held], train[1][held]),
        "test": dev,
        "shift/out_of_domain": ood,
    }
