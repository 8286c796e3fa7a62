"""The typed records of a cell (:mod:`bench.store.record`) against files written by hand
in the store's on-disk format (``cell.json`` as JSON text, ``.npz`` by ``np.savez``):
they read, round-trip to the same bytes, and a misspelt or missing name is a clear error."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from bench.store import CellDir, CellRecord, Predictions, Stage1Record, TrainingFeatures
from bench.store.record import needs

#: a complete two-stage cell's cell.json as the store writes it (keys sorted, indent 2)
CELL_JSON = """{
  "average": "probs",
  "best_epoch": 3,
  "best_val_acc": 0.75,
  "compile": "off",
  "config": {
    "schema": 3,
    "seed": 1
  },
  "dataset": "mnist5k",
  "device": "cpu",
  "finished": "2026-02-01T00:00:10+00:00",
  "key": "abc123",
  "method": "cgpt",
  "ood_detectors": {
    "knn": {
      "fit_seconds": 0.5,
      "score_seconds_per_1000": 0.25
    }
  },
  "parameters": 1000,
  "peak_memory_mb": 12.5,
  "predict_seconds": 1.5,
  "predict_seconds_per_1000": 2.0,
  "samples": 10,
  "seed": 1,
  "stage1": {
    "best_epoch": null,
    "best_val_acc": 0.5,
    "key": "def456",
    "method": "msp",
    "reused": true,
    "train_seconds": 4.0
  },
  "started": "2026-02-01T00:00:00+00:00",
  "status": "complete",
  "test_acc": NaN,
  "train_seconds": 8,
  "versions": {
    "python": "3.12.0"
  }
}
"""


def test_cell_json_written_by_hand_reads_as_a_record_and_is_written_back_byte_for_byte(tmp_path):
    cd = CellDir(tmp_path / "abc123")
    cd.path.mkdir()
    (cd.path / "cell.json").write_text(CELL_JSON)
    record = cd.read_cell()
    assert (record.key, record.method, record.seed, record.samples) == ("abc123", "cgpt", 1, 10)
    assert record.stage1 == Stage1Record("msp", "def456", True, 4.0, None, 0.5)
    assert record.complete and not record.failed and np.isnan(record.test_acc)
    assert record.seconds == 9.5 and record.ood_detectors["knn"]["fit_seconds"] == 0.5
    (cd.path / "cell.json").unlink()
    cd.write_cell(record)
    assert (cd.path / "cell.json").read_text() == CELL_JSON


def test_a_misspelt_or_wrong_cell_json_key_is_a_clear_error_and_reads_as_no_record(tmp_path):
    with pytest.raises(ValueError, match="unknown key.*predcit_seconds"):
        CellRecord.from_json({"status": "complete", "predcit_seconds": 1.0})
    with pytest.raises(ValueError, match="seed is 'one', not int"):
        CellRecord.from_json({"seed": "one"})
    with pytest.raises(ValueError, match="stage1 lacks reused"):
        CellRecord.from_json({"stage1": {"method": "msp", "key": "k"}})
    with pytest.raises(TypeError, match="predcit_seconds"):
        CellRecord(predcit_seconds=1.0)
    with pytest.raises(AttributeError):
        CellRecord().predcit_seconds  # noqa: B018
    cd = CellDir(tmp_path / "c")
    cd.path.mkdir()
    (cd.path / "cell.json").write_text('{"status": "complete", "sed": 1}')
    assert cd.read_cell() is None  # not a cell record: read as a damaged cell.json


def _npz(path, **arrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(buf.getvalue())


def test_a_prediction_file_written_by_hand_reads_as_predictions_and_writes_back_the_same_bytes(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 3))
    lp = (z - np.log(np.exp(z).sum(1, keepdims=True))).astype(np.float32)
    hand = dict(log_probs=lp, labels=np.array([0, 1, 2, 0, -1], np.int64), logits=z.astype(np.float32),
                features=rng.normal(size=(5, 4)).astype(np.float16),
                entropy_of_mean=np.ones(5, np.float32), mean_entropy=np.zeros(5, np.float32),
                prob_variance=np.full(5, 0.1, np.float32))
    cd = CellDir(tmp_path / "c")
    _npz(cd.path / "preds" / "ood" / "x.npz", **hand)
    got = cd.read_preds("ood/x")
    for name, array in hand.items():
        assert getattr(got, name).dtype == array.dtype
        np.testing.assert_array_equal(getattr(got, name), array)
    written = (cd.path / "preds" / "ood" / "x.npz").read_bytes()
    cd.write_preds("ood/x", got)
    assert (cd.path / "preds" / "ood" / "x.npz").read_bytes() == written
    old = CellDir(tmp_path / "old")  # a schema-1 file: log_probs and labels only
    _npz(old.path / "preds" / "test.npz", log_probs=lp, labels=hand["labels"].clip(0))
    assert old.read_preds("test").logits is None and not old.read_preds("test").has("features")


def test_a_prediction_file_with_an_unknown_or_missing_array_is_refused_naming_it(tmp_path):
    lp = np.log(np.full((2, 2), 0.5, np.float32))
    cd = CellDir(tmp_path / "c")
    _npz(cd.path / "preds" / "test.npz", log_probs=lp, labels=np.zeros(2, np.int64), logit=lp)
    with pytest.raises(ValueError, match="holds logit, which the store does not write"):
        cd.read_preds("test")
    _npz(cd.path / "preds" / "val.npz", log_probs=lp)
    with pytest.raises(ValueError, match="lacks labels"):
        cd.read_preds("val")
    with pytest.raises(ValueError, match="no stored prediction array is called 'logit'"):
        Predictions(lp, np.zeros(2, np.int64)).has("logit")


def test_training_features_written_by_hand_read_as_the_record(tmp_path):
    cd = CellDir(tmp_path / "c")
    hand = dict(features=np.ones((3, 2), np.float16), labels=np.array([0, 1, 1], np.int64),
                head_weight=np.ones((2, 2), np.float32), head_bias=np.zeros(2, np.float32), train_size=np.int64(9))
    _npz(cd.path / "features" / "train.npz", **hand)
    got = cd.read_training_features()
    assert isinstance(got, TrainingFeatures) and int(got.train_size) == 9 and got.features.dtype == np.float16
    _npz(cd.path / "features" / "train.npz", **{**hand, "head_weight": np.ones((2, 3), np.float32)})
    with pytest.raises(ValueError, match="head_weight is float32\\[2, 3\\], not float32 \\[C, 2\\]"):
        cd.read_training_features()


def test_the_scores_needs_come_from_the_declared_arrays():
    from bench.scores import NEEDS

    assert NEEDS == needs() == {"probabilities": ("log_probs",), "logits": ("logits",), "features": ("features",),
                                "samples": ("entropy_of_mean", "mean_entropy", "prob_variance")}
    assert json.loads(json.dumps(CellRecord(status="running").to_json())) == {"status": "running"}


def test_a_sealed_cell_whose_cell_json_is_no_record_is_damaged_saying_what_is_wrong(tmp_path):
    """A cell.json edited after sealing (an unknown key), its manifest digest updated to
    match: the cell is damaged, and the reason names the key rather than calling the file
    unreadable."""
    import hashlib

    from tests.bench.store.test_store import random_preds

    cd = CellDir(tmp_path / "c")
    cd.reset()
    lp, y = random_preds(5, 3, 0)
    cd.write_preds("test", Predictions(lp, y))
    cd.seal(CellRecord(key="c", dataset="d", method="m", seed=0, config={}))
    assert cd.condition() == ("complete", None)
    info = json.loads((cd.path / "cell.json").read_text())
    info["note"] = "hand-edited"
    (cd.path / "cell.json").write_text(json.dumps(info))
    manifest = json.loads((cd.path / "manifest.json").read_text())
    manifest["files"]["cell.json"] = hashlib.sha256((cd.path / "cell.json").read_bytes()).hexdigest()
    (cd.path / "manifest.json").write_text(json.dumps(manifest))
    state, why = cd.condition()
    assert state == "damaged" and "not a cell record" in why and "note" in why, why
