"""Which cells a store's catalog aggregates: only cells of one configuration, ever.

The stores are written in the real on-disk format by ``synthetic.fake_store`` (random
predictions, no training): the same suite file run twice, with ``epochs`` 1 and 2.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import bench.train.vit  # noqa: F401  (registers the attention layers the suite names)
import datasets  # noqa: F401
import methods  # noqa: F401
from bench.analysis import analyse
from bench.analysis.summary import efficiency
from bench.run.report import cells_record
from bench.store.catalog import open_store
from bench.store.plan import make_plan
from bench.core.registry import DATASETS, METHODS
from bench.config.spec import Overrides, load_suite
from tests.helpers.synthetic import fake_store, fake_suite

SUITE = fake_suite("mix", '[methods.ens]\ntype = "deep_ensemble"\nbase = "msp"\nmembers = 2\n')


@pytest.fixture
def suite_file(tmp_path):
    path = tmp_path / "mix.toml"
    path.write_text(SUITE)
    return path


def test_a_store_alone_shows_each_configuration_as_its_own_row(tmp_path, suite_file):
    """Cells of msp trained for 1 and for 2 epochs are two rows named by the setting that
    differs; each row (and its ensemble) holds only cells of its configuration."""
    results = tmp_path / "results"
    one = fake_store(results, suite_file)
    two = fake_store(results, suite_file, overrides=Overrides(epochs=2))
    catalog = open_store(results / "mix")
    names = [m.name for m in catalog.methods]
    assert names == ["msp (epochs=1)", "msp (epochs=2)", "ens (epochs=1)", "ens (epochs=2)"]
    for row, keys in (("msp (epochs=1)", one), ("msp (epochs=2)", two)):
        used = {s: catalog.cells[("mnist5k", row, s)].key for s in (0, 1)}
        assert used == {s: keys[("msp", s)] for s in (0, 1)}
        epochs = {json.loads((catalog.cells[("mnist5k", row, s)].path / "cell.json").read_text())
                  ["config"]["method"]["train"]["epochs"] for s in (0, 1)}
        assert len(epochs) == 1, epochs
    assert catalog.reference == "msp (epochs=1)"

    analysed = analyse(catalog, ["accuracy"], resamples=20)
    s = analysed.summary
    acc = s[(s.split == "test") & (s.metric == "accuracy")].set_index("method")["mean"]
    for row, keys in (("msp (epochs=1)", one), ("msp (epochs=2)", two)):
        expected = np.mean([_test_accuracy(results / "mix" / keys[("msp", seed)]) for seed in (0, 1)])
        assert acc[row] == pytest.approx(expected)
    assert set(acc.index) == set(names) and analysed.failures.empty  # both ensembles formed


def test_an_ensemble_never_combines_members_of_two_configurations(tmp_path, suite_file):
    """Seed 0 trained with 1 epoch, seed 1 with 2: no msp row averages them and the
    ensemble of 2 members cannot be formed in either configuration (named as failed)."""
    results = tmp_path / "results"
    fake_store(results, suite_file, only={("msp", 0)})
    fake_store(results, suite_file, overrides=Overrides(epochs=2), only={("msp", 1)})
    analysed = analyse(open_store(results / "mix"), ["accuracy"], resamples=20)
    assert analysed.seeds == {("mnist5k", "msp (epochs=1)"): [0], ("mnist5k", "msp (epochs=2)"): [1]}
    reasons = dict(zip(analysed.failures["method"], analysed.failures["reason"]))
    assert ("needs 2 members, the store has 1 (msp (epochs=1) seeds 0, 1; seed 1: not in the store in this "
            "configuration") in reasons["ens (epochs=1)"]
    assert ("needs 2 members, the store has 1 (msp (epochs=2) seeds 0, 1; seed 0: not in the store in this "
            "configuration") in reasons["ens (epochs=2)"]


def test_with_a_suite_only_its_configuration_is_used(tmp_path, suite_file):
    """The suite plans epochs=1: seed 1, stored only with 2 epochs, is left out (missing),
    never mixed into the row; a store without any planned cell is still shown."""
    results = tmp_path / "results"
    one = fake_store(results, suite_file, only={("msp", 0)})
    fake_store(results, suite_file, overrides=Overrides(epochs=2))
    suite = load_suite(str(suite_file))
    plan = make_plan(suite)
    catalog = open_store(results / "mix", suite, {c.key for c in plan.cells})
    assert [m.name for m in catalog.methods] == ["msp", "ens"]
    assert {k: cd.key for k, cd in catalog.cells.items()} == {("mnist5k", "msp", 0): one[("msp", 0)]}
    left = catalog.left_out([(c.key, c.dataset.name, c.method.name, c.seed) for c in plan.cells])
    assert [(c.key, c.seed, c.state) for c in left] == [(one[("msp", 1)], 1, "missing")]


def test_every_reader_takes_the_cell_records_the_scan_read(tmp_path, suite_file):
    """Each ``cell.json`` is read once per catalog: replaced by garbage after the store was
    opened, the costs (trained and derived rows), the report's cells record and the
    dataset's class still come from what ``open_store`` read."""
    results = tmp_path / "results"
    fake_store(results, suite_file)  # every cell: 1000 parameters, 1 s training, 10 MB
    catalog = open_store(results / "mix")
    for cd in catalog.cells.values():
        (cd.path / "cell.json").write_text("{not json")
    costs = efficiency(catalog).set_index("method")
    assert costs.loc["msp", ["parameters", "train_seconds", "peak_memory_mb"]].tolist() == [1000, 1.0, 10.0]
    assert costs.loc["ens", ["parameters", "train_seconds"]].tolist() == [2000, 2.0]  # two members
    configurations = {c["configuration"] for c in cells_record(catalog, {"msp"})}
    assert len(configurations) == 1 and None not in configurations
    assert catalog.dataset_class("mnist5k") is DATASETS.get("mnist5k")


def _test_accuracy(cell) -> float:
    with np.load(cell / "preds" / "test.npz") as z:
        return float((z["log_probs"].argmax(1) == z["labels"]).mean())


def test_report_footnotes_name_what_each_method_keeps_from_its_authors_code(tmp_path, monkeypatch):
    """Each method's deviations for the options in its cells travel through the analysis
    files (analysis.json) to a footnote of the README; methods without any get none."""
    import bench.report as report_mod
    from bench.analysis import analyse_store, load
    from bench.report import write_report

    monkeypatch.setattr(report_mod, "write_plots", lambda *args: [])  # tables and README only
    toml = ('[methods.rpc]\niters_train = 1\nmismatched_iters = true\n[methods.symvit]\n'
            '[methods.kdeformer]\nranking = "gray_index"\ntrain_attention = "softmax"\n'
            '[methods.ens]\ntype = "deep_ensemble"\nbase = "msp"\nmembers = 2\n')
    path = tmp_path / "fid.toml"
    path.write_text(fake_suite("fid", toml))
    results = tmp_path / "results"
    fake_store(results, path)
    suite = load_suite(str(path))
    catalog = open_store(results / "fid", suite, {c.key for c in make_plan(suite).cells})
    analysed, _ = analyse_store(catalog, tmp_path / "analysis", ["accuracy"], resamples=20)
    meta = json.loads((tmp_path / "analysis" / "analysis.json").read_text())
    kde = METHODS.get("kdeformer")(suite.method("kdeformer").options).deviations()
    assert meta["deviations"] == {
        "rpc": ["PAP trained with 1 ADMM iteration(s), evaluated with 4 (official: one count for both)"],
        "kdeformer": kde}
    assert kde[0].startswith("ranking = 'gray_index'") and len(kde) == 3  # swapped in: no training line
    readme = tmp_path / "report" / "README.md"
    write_report(load(tmp_path / "analysis"), tmp_path / "report")
    text = readme.read_text()
    assert "differences from their authors' code: `rpc`[^1], `kdeformer`[^2] (" in text
    assert text.rstrip().endswith("[^1]: `rpc`: PAP trained with 1 ADMM iteration(s), evaluated with 4 (official: one "
                                  "count for both).\n[^2]: `kdeformer`: " + "; ".join(kde) + ".")
    assert "`msp`[^" not in text and "`symvit`[^" not in text and "`ens`[^" not in text

    # a cell of an earlier version, without the option `ranking`, says so
    for cd in catalog.cells.values():
        info = cd.read_cell()
        if info.method == "kdeformer":
            del info.config["method"]["options"]["ranking"]
            cd.seal(info)
    again = open_store(results / "fid")
    assert again.method_deviations("kdeformer")[-1] == "trained before the option(s) ranking existed"


def _rows_of(path, method: str) -> list[dict]:
    """The rows of a report's CSV file (gzipped or not) that name ``method``."""
    import pandas as pd

    frame = pd.read_csv(path, keep_default_na=False, dtype=str)
    return frame[frame["method"] == method].to_dict("records") if "method" in frame.columns else []


@pytest.mark.parametrize("seeds", [(0,), (0, 1)])
def test_an_ensemble_short_of_members_gets_no_numbers_anywhere(tmp_path, capsys, seeds):
    """msp stored at seed 0 (then seeds 0 and 1), reported with an ensemble of 5 members: the
    ensemble is named as failed ("needs 5 members, the store has N") in the README, on
    stderr and in failures.csv, and no table or analysis file gives it a number (the
    efficiency table once showed 5 x msp's cost, the convergence table msp's log)."""
    from bench.run.cli import main

    results, reports = tmp_path / "results", tmp_path / "reports"
    stored = tmp_path / "stored.toml"
    stored.write_text(fake_suite("short", seeds=seeds))
    fake_store(results, stored)
    path = tmp_path / "short.toml"
    path.write_text(fake_suite("short", "[methods.deep_ensemble]\n", seeds=seeds))
    code = main(["report", "--suite", str(path), "--methods", "deep_ensemble", "--results", str(results),
                 "--reports", str(reports), "--format", "csv", "--quiet"])
    err = capsys.readouterr().err
    why = f"needs 5 members, the store has {len(seeds)}"
    assert code == 1 and f"failed: mnist5k / deep_ensemble / seed 0: {why}" in err, err
    report = reports / "short"
    assert why in (report / "README.md").read_text()
    assert [r["reason"][:len(why)] for r in _rows_of(report / "analysis" / "failures.csv", "deep_ensemble")] == [why]
    files = sorted((report / "tables").glob("*.csv")) + sorted((report / "analysis").glob("*.csv*"))
    assert any(f.name == "efficiency.csv" for f in files)
    for f in files:
        if f.name == "failures.csv":
            continue
        for row in _rows_of(f, "deep_ensemble"):
            numbers = {k: v for k, v in row.items()
                       if k not in ("dataset", "method", "n_seeds") and v not in ("", "nan")}
            assert numbers == {}, (f.name, numbers)
            assert row.get("n_seeds", "0") == "0", (f.name, row)
