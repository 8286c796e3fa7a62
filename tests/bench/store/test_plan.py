"""bench.store.plan: one cell per dataset, trained method and seed, each with a key that changes
exactly when what the cell estimates changes.  Expected counts come from the suites
written here and from bench/suites/default.toml."""
from __future__ import annotations

import copy
import re

import pytest

import bench.train.vit  # noqa: F401  (registers the attention layers)
import datasets  # noqa: F401  (registers the datasets)
import methods  # noqa: F401  (registers the methods)
from bench.store.plan import make_plan
from bench.config.spec import build_suite, load_suite
from tests.helpers.suites import minimal


def test_plan_has_one_cell_per_dataset_trained_method_and_seed():
    suite = build_suite(minimal(
        seeds=[0, 1, 2],
        datasets={"a": {"type": "mnist5k", "train_limit": 50}, "b": {"type": "mnist5k", "split_seed": 1}},
        methods={"msp": {}, "mc_dropout": {}, "ts": {"type": "temperature_scaling"}},
    ))
    plan = make_plan(suite)
    assert len(plan.cells) == 2 * 2 * 3  # datasets x trained methods x seeds
    triples = {(c.dataset.name, c.method.name, c.seed) for c in plan.cells}
    assert len(triples) == 12
    assert all(c.method.name != "ts" for c in plan.cells)
    assert len({c.key for c in plan.cells}) == 12  # every cell has its own key
    assert all(re.fullmatch(r"[0-9a-f]+", c.key) for c in plan.cells)


def test_default_plan_trains_only_the_trained_methods_once_per_seed():
    """Ensembles and temperature scaling come from stored predictions: the default plan
    trains mnist5k x {msp, mc_dropout, kep_svgp, sgpa} x the suite's seeds, nothing else."""
    suite = load_suite("default")
    plan = make_plan(suite)
    expected = {("mnist5k", m, s) for m in ("msp", "mc_dropout", "kep_svgp", "sgpa") for s in suite.seeds}
    assert sorted((c.dataset.name, c.method.name, c.seed) for c in plan.cells) == sorted(expected)


def _keys(raw: dict) -> dict[tuple[str, str, int], str]:
    return {(c.dataset.name, c.method.name, c.seed): c.key for c in make_plan(build_suite(raw)).cells}


BASE = minimal(seeds=[0, 1], methods={
    "msp": {}, "mc_dropout": {"samples": 4},
    "ens": {"type": "ensemble", "base": "msp", "members": 2},
})


def test_cell_keys_are_deterministic_across_builds():
    first = _keys(copy.deepcopy(BASE))
    second = _keys(copy.deepcopy(BASE))
    assert first == second
    # the suite's name is not part of a cell's config
    assert _keys({**copy.deepcopy(BASE), "name": "other"}) == first


@pytest.mark.parametrize(
    "change",
    [
        {"train": {"lr": 5e-4}},
        {"train": {"epochs": 4}},
        {"model": {"dropout": 0.2}},
        {"model": {"attention": "softmax", "depth": 3}},
        {"samples": 5},
        {"train": {"precision": "bf16"}},
    ],
    ids=["train.lr", "train.epochs", "model.dropout", "model.depth", "options.samples", "train.precision"],
)
def test_changing_a_methods_option_changes_only_its_keys(change):
    before = _keys(copy.deepcopy(BASE))
    raw = copy.deepcopy(BASE)
    raw["methods"]["mc_dropout"].update(change)
    after = _keys(raw)
    assert set(after) == set(before)
    for cell, key in before.items():
        if cell[1] == "mc_dropout":
            assert after[cell] != key, cell
        else:
            assert after[cell] == key, cell


@pytest.mark.parametrize("train", [{"compile": True}, {"compile": False}, {"batch_passes": True},
                                   {"checkpoint_every": 3}])
def test_how_a_cell_is_executed_is_not_in_its_key(train):
    """Compilation, batched Monte-Carlo passes and checkpointing (like the device and the
    executor) change how a cell runs, not what it estimates: same keys."""
    before = _keys(copy.deepcopy(BASE))
    raw = copy.deepcopy(BASE)
    raw["methods"]["mc_dropout"]["train"] = train
    assert _keys(raw) == before


def test_changing_a_dataset_option_changes_its_keys():
    before = _keys(copy.deepcopy(BASE))
    raw = copy.deepcopy(BASE)
    raw["datasets"]["mnist5k"]["train_limit"] = 60
    after = _keys(raw)
    assert all(after[c] != before[c] for c in before)


def test_the_seed_is_part_of_the_key():
    keys = _keys(copy.deepcopy(BASE))
    assert keys[("mnist5k", "msp", 0)] != keys[("mnist5k", "msp", 1)]
    # seed 1's cell keeps its key when seed 0 is dropped
    raw = copy.deepcopy(BASE)
    raw["seeds"] = [1, 2]
    raw["methods"]["ens"]["members"] = 1
    other = _keys(raw)
    assert other[("mnist5k", "msp", 1)] == keys[("mnist5k", "msp", 1)]
    assert other[("mnist5k", "msp", 2)] not in keys.values()


def test_a_derived_methods_options_do_not_change_trained_keys():
    before = _keys(copy.deepcopy(BASE))
    raw = copy.deepcopy(BASE)
    raw["methods"]["ens"].update({"members": 1, "average": "logits"})
    raw["methods"]["ts"] = {"type": "temperature_scaling"}
    assert _keys(raw) == before


def test_suite_level_train_change_changes_every_trained_key():
    before = _keys(copy.deepcopy(BASE))
    after = _keys({**copy.deepcopy(BASE), "train": {"batch_size": 64}})
    assert all(after[c] != before[c] for c in before)


def test_the_executor_table_changes_no_cell_key():
    table = {"kind": "slurm", "workers": 7, "partition": "gpu", "gpus": 4, "options": {"account": "uq"}}
    assert _keys({**copy.deepcopy(BASE), "executor": table}) == _keys(copy.deepcopy(BASE))


def test_a_two_stage_methods_cells_differ_only_in_their_seed_and_follow_stage_one():
    """cgpt with ``base = "msp"``: its cells of two seeds have the same config but for the
    seed (so a report keeps them in one row, as every method's seeds), each starts from the
    msp cell of its own seed, and changing msp's settings changes cgpt's keys too."""
    raw = minimal(methods={"msp": {}, "cgpt": {"base": "msp", "samples": 2}})
    plan = make_plan(build_suite(raw))
    cgpt = [c for c in plan.cells if c.method.name == "cgpt"]
    msp = {c.seed: c for c in plan.cells if c.method.name == "msp"}
    assert [c.seed for c in cgpt] == [0, 1]
    drop_seed = [{k: v for k, v in c.config.items() if k != "seed"} for c in cgpt]
    assert drop_seed[0] == drop_seed[1]
    assert len({c.key for c in cgpt}) == 2
    for c in cgpt:
        assert c.stage1.key == msp[c.seed].key
    changed = copy.deepcopy(raw)
    changed["methods"]["msp"] = {"train": {"lr": 1e-4}}
    other = make_plan(build_suite(changed))
    assert not {c.key for c in cgpt} & {c.key for c in other.cells if c.method.name == "cgpt"}
