"""Tests for the suite spec (bench.config.spec), in process: every suite here is a plain dict or a
small TOML file.  Option parsing has its own file (test_options.py), the planner too
(test_plan.py).

Expected values come from the suite file bench/suites/default.toml and from the issue's
requirements, never from the code under test.
"""
from __future__ import annotations

import json
import tomllib

import pytest

import bench.train.vit  # noqa: F401  (registers the attention layers)
import datasets  # noqa: F401  (registers the datasets)
import methods  # noqa: F401  (registers the methods)
from bench.core.errors import ConfigError
from bench.train.method import TrainedMethod
from bench.store.plan import make_plan
from bench.core.registry import METHODS
from bench.config.spec import ModelConfig, Overrides, TrainConfig, build_suite, load_suite, select
from tests.helpers import REPO
from tests.helpers.suites import minimal


def config_error(raw: dict, overrides: Overrides = Overrides()) -> str:
    with pytest.raises(ConfigError) as exc:
        build_suite(raw, overrides)
    return str(exc.value)


def problem_lines(message: str) -> dict[str, str]:
    """``key.path -> message`` for each ``  key.path: message`` line of a ConfigError."""
    out = {}
    for line in message.splitlines()[1:]:
        path, _, msg = line.strip().partition(": ")
        out[path] = msg
    return out


# --------------------------------------------------------------------------- default suite


def test_default_suite_loads_with_its_methods_datasets_and_seeds():
    suite = load_suite("default")
    assert suite.name == "default"
    with open(REPO / "bench" / "suites" / "default.toml", "rb") as f:
        assert suite.seeds == tuple(tomllib.load(f)["seeds"])  # as the file lists them, read by tomllib
    assert [d.name for d in suite.datasets] == ["mnist5k"]
    assert [m.name for m in suite.methods] == ["msp", "mc_dropout", "temperature_scaling", "deep_ensemble",
                                               "kep_svgp", "kep_svgp_ensemble", "sgpa"]
    kinds = {m.name: m.kind for m in suite.methods}
    assert kinds == {"msp": "trained", "mc_dropout": "trained", "temperature_scaling": "derived",
                     "deep_ensemble": "derived", "kep_svgp": "trained", "kep_svgp_ensemble": "derived",
                     "sgpa": "trained"}
    msp = suite.method("msp")
    assert msp.train.epochs == 40 and msp.train.lr == pytest.approx(3e-3) and msp.train.batch_size == 128
    sgpa = suite.method("sgpa").train  # per-method override of two fields; the rest is the suite's
    assert sgpa.lr == pytest.approx(5e-3) and sgpa.epochs == 80 and sgpa.batch_size == msp.train.batch_size
    assert sgpa.weight_decay == msp.train.weight_decay and sgpa.warmup_epochs == msp.train.warmup_epochs
    assert msp.model.dim == 64 and msp.model.heads == 4 and msp.model.patch_size == 7
    assert msp.model.attention == "softmax"
    assert suite.method("mc_dropout").options.samples == 10
    ens = suite.method("deep_ensemble")
    assert ens.options.base == "msp" and ens.options.members == 3
    assert suite.method("kep_svgp_ensemble").options.base == "kep_svgp"
    assert ens.train is None and ens.model is None
    assert suite.method("temperature_scaling").options.base == "msp"
    splits = suite.datasets[0].splits
    assert splits[:2] == ("test", "shift/digits_box") and splits[-1] == "ood/*"
    corruptions = [p.split("/")[1] for p in splits[2:-1]]
    assert len(corruptions) == 15 and "gaussian_noise" in corruptions and "speckle_noise" not in corruptions


def test_load_suite_accepts_a_path(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text('seeds = [3]\n[datasets.mnist5k]\ntrain_limit = 50\n[methods.msp]\n')
    suite = load_suite(str(path))
    assert suite.name == "tiny"  # defaults to the file's stem
    assert suite.seeds == (3,)
    assert suite.datasets[0].options.train_limit == 50


# --------------------------------------------------------------------------- overrides


def test_per_method_train_and_model_overrides_merge_over_suite_defaults():
    raw = minimal(
        train={"epochs": 9, "lr": 2e-3, "batch_size": 64},
        model={"dim": 32, "heads": 4, "dropout": 0.2},
        methods={
            "msp": {"train": {"lr": 5e-4}, "model": {"depth": 3}},
            "mc_dropout": {"samples": 4, "model": {"dropout": 0.3}},
        },
    )
    suite = build_suite(raw)
    msp, mcd = suite.method("msp"), suite.method("mc_dropout")
    # overridden keys
    assert msp.train.lr == pytest.approx(5e-4)
    assert msp.model.depth == 3
    assert mcd.model.dropout == pytest.approx(0.3)
    assert mcd.options.samples == 4
    # suite defaults kept for everything else
    assert msp.train.epochs == 9 and msp.train.batch_size == 64
    assert msp.model.dim == 32 and msp.model.dropout == pytest.approx(0.2)
    assert mcd.train.lr == pytest.approx(2e-3) and mcd.train.epochs == 9
    assert mcd.model.depth == ModelConfig().depth and mcd.model.dim == 32
    # a key the suite does not set falls back to the dataclass default
    assert msp.train.optimizer == TrainConfig().optimizer


@METHODS.register("_test_spec_wide_model")
class _WideModel(TrainedMethod):
    """Test-only method whose backbone defaults differ from ModelConfig's."""

    @classmethod
    def model_defaults(cls) -> dict:
        return {"dim": 96, "heads": 6, "depth": 5}


def test_model_default_precedence_method_then_suite_then_table():
    raw = minimal(model={"depth": 4}, methods={"_test_spec_wide_model": {"model": {"heads": 3}}})
    m = build_suite(raw).method("_test_spec_wide_model")
    assert m.model.dim == 96  # the method's own default (suite and table silent)
    assert m.model.depth == 4  # suite [model] beats the method's default
    assert m.model.heads == 3  # the method table beats both


def test_epochs_override_replaces_every_trained_methods_epochs():
    raw = minimal(train={"epochs": 20, "warmup_epochs": 1},
                  methods={"msp": {"train": {"epochs": 7}}, "mc_dropout": {}})
    suite = build_suite(raw, Overrides(epochs=3))
    assert suite.method("msp").train.epochs == 3
    assert suite.method("mc_dropout").train.epochs == 3


def test_seeds_override_replaces_the_suite_seeds():
    suite = build_suite(minimal(seeds=[0, 1, 2]), Overrides(seeds=(7, 11)))
    assert suite.seeds == (7, 11)


def test_bad_seed_override_is_checked_like_the_file():
    msg = config_error(minimal(), Overrides(seeds=(1, 1)))
    assert "seeds" in msg
    msg = config_error(minimal(), Overrides(seeds=(-1,)))
    assert "seeds" in problem_lines(msg) and "-1" in msg


def test_methods_override_adds_a_registered_method_with_defaults():
    suite = build_suite(minimal(), Overrides(methods=("mc_dropout",)))
    assert {m.name for m in suite.methods} == {"msp", "mc_dropout"}


# --------------------------------------------------------------------------- problems


def test_every_problem_is_reported_at_once_with_its_key_path():
    raw = minimal(train={"epochs": "ten"}, model={"dropuot": 0.2},
                  methods={"msp": {}, "mc_dropout": {"samples": 0}})
    lines = problem_lines(config_error(raw))
    assert "train.epochs" in lines and "'ten'" in lines["train.epochs"]
    assert "model.dropuot" in lines and "'dropout'" in lines["model.dropuot"]
    assert "methods.mc_dropout.samples" in lines


def test_problems_in_datasets_and_methods_are_reported_together():
    raw = minimal(datasets={"mnist5k": {"train_limt": 50}}, methods={"mc_dropout": {"sample": 3}})
    lines = problem_lines(config_error(raw))
    assert "datasets.mnist5k.train_limt" in lines
    assert "'train_limit'" in lines["datasets.mnist5k.train_limt"]
    assert "methods.mc_dropout.sample" in lines
    assert "'samples'" in lines["methods.mc_dropout.sample"]


def test_unknown_key_suggests_the_closest_and_lists_known_keys():
    msg = problem_lines(config_error(minimal(train={"epoch": 3})))["train.epoch"]
    assert "unknown key" in msg
    assert "did you mean 'epochs'" in msg
    for known in ("epochs", "batch_size", "lr", "warmup_epochs"):
        assert known in msg


def test_unknown_top_level_key_is_reported():
    lines = problem_lines(config_error(minimal(sedes=[0])))
    assert "sedes" in lines and "'seeds'" in lines["sedes"]


@pytest.mark.parametrize(
    "section, key, value, path",
    [
        ("train", "epochs", "10", "train.epochs"),  # string for int
        ("train", "epochs", True, "train.epochs"),  # bool for int
        ("train", "batch_size", 32.5, "train.batch_size"),  # float for int
        ("train", "epochs", 10.0, "train.epochs"),  # an integral float is still not an int
        ("train", "lr", "fast", "train.lr"),  # string for float
        ("train", "compile", 1, "train.compile"),  # int for bool
        ("train", "optimizer", "sgd", "train.optimizer"),  # not one of the literals
        ("model", "attention", 5, "model.attention"),  # int for str
    ],
)
def test_wrong_types_are_rejected(section, key, value, path):
    lines = problem_lines(config_error(minimal(**{section: {key: value}})))
    assert path in lines
    assert repr(value) in lines[path]


def test_seeds_as_list_of_strings_is_rejected():
    lines = problem_lines(config_error(minimal(seeds=["0", "1"])))
    assert "seeds[0]" in lines and "seeds[1]" in lines
    assert "integer" in lines["seeds[0]"]


def test_dataset_option_wrong_type():
    lines = problem_lines(config_error(minimal(datasets={"mnist5k": {"train_limit": "50"}})))
    assert "datasets.mnist5k.train_limit" in lines


@pytest.mark.parametrize(
    "section, key, value, path, bound",
    [
        ("train", "epochs", 0, "train.epochs", ">= 1"),
        ("model", "dropout", 1.5, "model.dropout", "<= 0.95"),
        ("train", "lr", 0, "train.lr", "> 0"),
        ("train", "lr", -1e-3, "train.lr", "> 0"),
        ("model", "heads", 0, "model.heads", ">= 1"),
    ],
)
def test_out_of_range_values_are_rejected(section, key, value, path, bound):
    lines = problem_lines(config_error(minimal(**{section: {key: value}})))
    assert path in lines
    assert bound in lines[path]


def test_out_of_range_method_and_dataset_options():
    raw = minimal(datasets={"mnist5k": {"train_limit": 0}},
                  methods={"msp": {}, "deep_ensemble": {"members": 0}})
    lines = problem_lines(config_error(raw))
    assert "datasets.mnist5k.train_limit" in lines
    assert "methods.deep_ensemble.members" in lines


def test_dim_must_be_divisible_by_heads():
    msg = config_error(minimal(model={"dim": 30, "heads": 4}))
    assert "model" in msg and "dim" in msg and "heads" in msg
    assert "30" in msg and "4" in msg


def test_warmup_must_be_shorter_than_training():
    msg = config_error(minimal(train={"epochs": 5, "warmup_epochs": 5}))
    assert "warmup_epochs" in msg and "epochs" in msg
    build_suite(minimal(train={"epochs": 5, "warmup_epochs": 4}))  # one less is fine


def test_cross_field_check_applies_to_a_per_method_override():
    raw = minimal(model={"dim": 64, "heads": 4}, methods={"msp": {"model": {"heads": 5}}})
    msg = config_error(raw)
    assert "methods.msp.model" in msg and "divisible" in msg


# --------------------------------------------------------------------------- names


def test_unknown_dataset_lists_known_and_closest():
    msg = config_error(minimal(datasets={"mnist5": {}}))
    assert "datasets.mnist5" in msg
    assert "'mnist5'" in msg
    assert "Did you mean 'mnist5k'" in msg
    assert "mnist5k" in msg.split("Known")[-1]


def test_unknown_method_lists_known_and_closest():
    msg = config_error(minimal(methods={"mc_dropuot": {}}))
    assert "methods.mc_dropuot" in msg
    assert "Did you mean 'mc_dropout'" in msg
    known = msg.split("Known")[-1]
    for name in ("msp", "mc_dropout", "temperature_scaling", "deep_ensemble"):
        assert name in known


def test_unknown_method_type_names_the_type_key():
    msg = config_error(minimal(methods={"mine": {"type": "mps"}}))
    assert "methods.mine.type" in msg and "Did you mean 'msp'" in msg


def test_unknown_attention_lists_known_and_closest():
    msg = config_error(minimal(model={"attention": "sofmax"}))
    assert "methods.msp.model.attention" in msg
    assert "'sofmax'" in msg
    assert "Did you mean 'softmax'" in msg


def test_derived_method_with_unknown_base():
    raw = minimal(methods={"msp": {}, "ts": {"type": "temperature_scaling", "base": "mps"}})
    lines = problem_lines(config_error(raw))
    assert "methods.ts.base" in lines
    assert "msp" in lines["methods.ts.base"]  # the suite's methods are listed


def test_derived_method_whose_base_is_derived():
    raw = minimal(methods={"msp": {}, "ts": {"type": "temperature_scaling", "base": "msp"},
                           "ens": {"type": "ensemble", "base": "ts", "members": 1}})
    lines = problem_lines(config_error(raw))
    assert "methods.ens.base" in lines
    assert "'ts'" in lines["methods.ens.base"] and "trained" in lines["methods.ens.base"]


def test_derived_method_rejects_train_settings():
    raw = minimal(methods={"msp": {}, "ts": {"type": "temperature_scaling", "train": {"epochs": 3}}})
    assert "methods.ts" in config_error(raw)


def test_empty_suite_is_rejected():
    msg = config_error({"seeds": [0]})
    assert "datasets" in msg and "methods" in msg


# --------------------------------------------------------------------------- select


def _suite_with_ensemble(seeds=(0, 1, 2)) -> object:
    raw = minimal(seeds=list(seeds), methods={
        "msp": {}, "mc_dropout": {},
        "ts": {"type": "temperature_scaling", "base": "msp"},
        "ens": {"type": "ensemble", "base": "msp", "members": 5},
    })
    return build_suite(raw)


def test_select_raises_for_a_combinator_with_too_few_seeds_only_when_selected():
    suite = _suite_with_ensemble()
    with pytest.raises(ConfigError) as exc:
        select(suite)  # everything, including "ens" (5 members, 3 seeds)
    assert "methods.ens" in str(exc.value) and "5" in str(exc.value)
    with pytest.raises(ConfigError):
        select(suite, ("ens",))
    chosen = select(suite, ("msp", "ts"))  # ens not selected: fine
    assert [m.name for m in chosen.methods] == ["msp", "ts"]


def test_select_to_run_false_does_not_check_members():
    suite = _suite_with_ensemble()
    chosen = select(suite, to_run=False)
    assert [m.name for m in chosen.methods] == ["msp", "mc_dropout", "ts", "ens"]


def test_select_with_enough_seeds_passes():
    suite = _suite_with_ensemble(seeds=range(5))
    assert len(select(suite).methods) == 4


def test_select_pulls_in_the_base_of_a_derived_method():
    suite = _suite_with_ensemble()
    chosen = select(suite, ("ts",))
    assert {m.name for m in chosen.methods} == {"ts", "msp"}
    assert make_plan(chosen).cells  # the base is trained, so there are cells


def test_select_unknown_method_lists_the_suites_methods():
    with pytest.raises(ConfigError) as exc:
        select(_suite_with_ensemble(), ("bogus",))
    msg = str(exc.value)
    assert "'bogus'" in msg
    for name in ("msp", "mc_dropout", "ts", "ens"):
        assert name in msg


def test_a_registered_method_a_run_lacks_is_named_as_absent_from_the_run_not_unknown():
    """``report NAME --methods sngp`` where run NAME has no sngp: sngp is a registered method,
    so the error says the run was made without it (and lists the run's methods)."""
    assert "sngp" in METHODS and "sngp" not in {m.name for m in _suite_with_ensemble().methods}
    with pytest.raises(ConfigError) as exc:
        select(_suite_with_ensemble(), ("sngp",), run="r1")
    msg = str(exc.value)
    assert "run 'r1' has no method 'sngp'" in msg and "unknown" not in msg
    assert all(name in msg for name in ("msp", "mc_dropout", "ts", "ens"))


def test_select_unknown_dataset_lists_the_suites_datasets():
    with pytest.raises(ConfigError) as exc:
        select(_suite_with_ensemble(), None, ("cifar10",))
    assert "'cifar10'" in str(exc.value) and "mnist5k" in str(exc.value)


# --------------------------------------------------------------------------- files


def test_malformed_toml_gives_config_error_with_the_path(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("seeds = [0, 1\n[train]\n")
    with pytest.raises(ConfigError) as exc:
        load_suite(str(path))
    assert str(path) in str(exc.value)
    assert "TOML" in str(exc.value)


def test_missing_suite_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_suite(str(tmp_path / "absent.toml"))
    assert "absent.toml" in str(exc.value)


def test_unknown_suite_name_lists_available_suites():
    with pytest.raises(ConfigError) as exc:
        load_suite("no_such_suite")
    msg = str(exc.value)
    assert "'no_such_suite'" in msg and "default" in msg


SUITE_TOML = 'seeds = [0]\n[datasets.mnist5k]\n[methods.msp]\n'


@pytest.mark.parametrize("name", ["../escaped", "/tmp/absolute", "", ".hidden", "a/b", "a b", "x\ny", "..", "."])
def test_a_suite_name_is_one_path_component(tmp_path, name):
    """The name becomes <results>/NAME and <reports>/NAME: anything but one plain folder
    name (letters, digits, '-', '_', '.', not first) is one line naming the key."""
    path = tmp_path / "s.toml"
    path.write_text(f"name = {json.dumps(name)}\n" + SUITE_TOML)  # a TOML basic string
    with pytest.raises(ConfigError) as exc:
        load_suite(str(path))
    msg = str(exc.value)
    assert msg.startswith(f"name: {name!r} cannot name a suite") and "\n" not in msg, msg


@pytest.mark.parametrize("name", ["default", "my-suite_2.v1", "A"])
def test_plain_suite_names_and_file_names_are_accepted(tmp_path, name):
    (tmp_path / "s.toml").write_text(f'name = "{name}"\n' + SUITE_TOML)
    assert load_suite(str(tmp_path / "s.toml")).name == name
    (tmp_path / "file-name.toml").write_text(SUITE_TOML)
    assert load_suite(str(tmp_path / "file-name.toml")).name == "file-name"


@pytest.mark.parametrize("levels", [40, 100_000])
def test_toml_nested_too_deep_is_a_config_error(tmp_path, levels):
    """Beyond the documented 32 levels (and far beyond, where the parser itself would exceed
    Python's recursion limit) a suite file is refused in one line naming the file."""
    path = tmp_path / "deep.toml"
    path.write_text(SUITE_TOML.replace("[methods.msp]\n", f"[methods.msp]\nsamples = {'[' * levels}{']' * levels}\n"))
    with pytest.raises(ConfigError) as exc:
        load_suite(str(path))
    assert str(exc.value) == f"{path}: tables or arrays nested more than 32 levels deep; a suite needs a handful"


def test_a_selection_of_more_than_max_cells_needs_allow_large(monkeypatch):
    """10,002 cells (2 trained methods x 5,001 seeds) are refused in one line that says how
    to go on; UQBENCH_ALLOW_LARGE (what --allow-large sets) lifts the limit."""
    from bench.config.options import ALLOW_LARGE_ENV

    monkeypatch.delenv(ALLOW_LARGE_ENV, raising=False)
    suite = build_suite(minimal(seeds=list(range(5001)), methods={"msp": {}, "mc_dropout": {}}))
    with pytest.raises(ConfigError) as exc:
        select(suite)
    msg = str(exc.value)
    assert "plans 10,002 cells" in msg and "more than 10,000" in msg and "--allow-large" in msg, msg
    assert len(select(suite, ("msp",)).seeds) == 5001  # 5,001 cells: within the limit
    with pytest.raises(ConfigError, match="--allow-large"):
        build_suite(minimal(seeds=list(range(10_001))))  # refused before each seed is checked
    monkeypatch.setenv(ALLOW_LARGE_ENV, "1")
    assert len(select(suite).seeds) == 5001


def test_max_len_is_bounded_unless_allowed(monkeypatch):
    from bench.config.options import ALLOW_LARGE_ENV

    monkeypatch.delenv(ALLOW_LARGE_ENV, raising=False)
    for dataset in ("cola", "imdb", "rotten_tomatoes"):
        msg = config_error(minimal(datasets={dataset: {"max_len": 8192}}))
        assert f"datasets.{dataset}.max_len: must be <= 1024, got 8192" in msg and "--allow-large" in msg, msg
    monkeypatch.setenv(ALLOW_LARGE_ENV, "1")
    assert build_suite(minimal(datasets={"cola": {"max_len": 8192}})).datasets[0].options.max_len == 8192


# --------------------------------------------------------------------------- regressions (bugs found in review)


def test_unknown_attention_reported_together_with_another_problem():
    msg = config_error(minimal(train={"epoch": 3}, model={"attention": "sofmax"}))
    assert "train.epoch" in msg
    assert "sofmax" in msg


def test_cross_field_problem_reported_together_with_another_problem():
    msg = config_error(minimal(train={"epoch": 3}, model={"dim": 30, "heads": 4}))
    assert "train.epoch" in msg
    assert "divisible" in msg


@pytest.mark.parametrize("key, value", [("train", 5), ("model", "big")])
def test_non_table_train_or_model_of_a_method_is_rejected(key, value):
    msg = config_error(minimal(methods={"msp": {key: value}}))
    assert f"methods.msp.{key}" in msg


def test_unknown_dataset_type_names_the_type_key():
    msg = config_error(minimal(datasets={"mine": {"type": "mnist5kk"}}))
    assert "datasets.mine.type" in msg


@pytest.mark.parametrize("section", ["methods", "datasets"])
def test_list_valued_type_is_a_config_error(section):
    raw = minimal()
    raw[section] = {"mine": {"type": ["msp"]}}
    config_error(raw)


def test_non_utf8_suite_file_is_a_config_error(tmp_path):
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfe seeds = [0]\n")
    with pytest.raises(ConfigError) as exc:
        load_suite(str(path))
    assert str(path) in str(exc.value)


def test_epochs_override_shortens_a_warmup_that_no_longer_fits():
    suite = build_suite(minimal(train={"epochs": 10, "warmup_epochs": 3}), Overrides(epochs=1))
    assert suite.methods[0].train.epochs == 1 and suite.methods[0].train.warmup_epochs == 0
    # a suite file with such a warm-up is still an error
    msg = config_error(minimal(train={"epochs": 2, "warmup_epochs": 3}))
    assert "warmup_epochs" in msg


def test_unknown_selection_suggests_the_closest_name():
    suite = build_suite(minimal())
    with pytest.raises(ConfigError, match="Did you mean 'msp'"):
        select(suite, methods=("mps",))


def test_combinator_shorthand_ensembles_any_method_by_name():
    suite = build_suite(minimal(methods={"msp": {}, "msp_ens": "ensemble(msp, 2)", "ts": "temperature_scaling(msp)"}))
    ens, ts = suite.method("msp_ens"), suite.method("ts")
    assert (ens.type, ens.kind, ens.options.base, ens.options.members) == ("ensemble", "derived", "msp", 2)
    assert (ts.type, ts.options.base) == ("temperature_scaling", "msp")
    assert "cannot read" in config_error(minimal(methods={"msp": {}, "bad": "ensemble msp 2"}))
    assert "names no method" in config_error(minimal(methods={"msp": {}, "e": "ensemble(nope, 2)"}))


def test_a_preset_that_is_not_a_string_is_a_config_error(tmp_path):
    """Found by the CLI fuzz test: ``preset = [0]`` crashed with TypeError (unhashable)."""
    path = tmp_path / "preset.toml"
    path.write_text('seeds = [0]\n[model]\npreset = [0]\n[datasets.mnist5k]\n[methods.msp]\n')
    with pytest.raises(ConfigError, match=r"model\.preset: must be a preset name \(a string\), got \[0\]"):
        load_suite(str(path))


# --------------------------------------------------------------------------- [executor]


def test_executor_table_of_a_suite_file_gives_the_executor_settings(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text('seeds = [0]\n[datasets.mnist5k]\n[methods.msp]\n'
                    '[executor]\nkind = "slurm"\npartition = "gpu"\ngpus = 2\ncpus = 4\nmem_gb = 40\n'
                    'time = 720\narray_limit = 16\n'
                    '[executor.options]\naccount = "uq"\nmail-type = "END"\nnice = 10\n')
    executor = load_suite(str(path)).executor
    assert (executor.kind, executor.partition, executor.gpus, executor.cpus, executor.mem_gb, executor.time,
            executor.array_limit) == ("slurm", "gpu", 2, 4, 40.0, 720, 16)
    # option names as --slurm-option writes them, values as sbatch receives them
    assert executor.options == {"account": "uq", "mail_type": "END", "nice": "10"}
    slurm = executor.slurm_options()
    assert (slurm.partition, slurm.gpus_per_cell, slurm.time_min, slurm.extra["account"]) == ("gpu", 2, 720, "uq")


def test_a_suite_without_executor_table_runs_locally_with_the_flag_defaults():
    executor = build_suite(minimal()).executor
    assert (executor.kind, executor.workers, executor.cells_per_gpu, executor.partition, executor.gpus,
            executor.cpus, executor.mem_gb, executor.time, executor.array_limit, executor.options) == \
        ("local", 2, 1, "", 1, 8, 32.0, 1440, 64, {})
    assert select(build_suite(minimal(executor={"kind": "processes"})), ("msp",)).executor.kind == "processes"


@pytest.mark.parametrize(
    "table, path, needle",
    [
        ({"workers": 0}, "executor.workers", "must be >= 1, got 0"),
        ({"kind": "ray"}, "executor.kind", "unknown executor 'ray'. Known executors: local, processes, slurm, "
                                           "submitit-local."),
        ({"kind": "slrum"}, "executor.kind", "unknown executor 'slrum'. Did you mean 'slurm'?"),
        ({"worker": 2}, "executor.worker", "did you mean 'workers'?"),
        ({"type": "slurm"}, "executor.type", "known keys: kind,"),
        ({"mem_gb": -1}, "executor.mem_gb", "must be > 0"),
        ({"gpus": -1}, "executor.gpus", "must be >= 0"),
        ({"time": "24:00:00"}, "executor.time", "in minutes, an integer (e.g. time = 1440"),
        ({"cells_per_gpu": 2.5}, "executor.cells_per_gpu", "expected an integer"),
        ({"options": {"account": ["a", "b"]}}, "executor.options.account", "expected a string or an integer"),
        ({"options": "account=uq"}, "executor.options", "expected a table"),
        ("slurm", "executor", "expected a table"),
    ],
)
def test_a_bad_executor_table_names_the_key(table, path, needle):
    lines = problem_lines(config_error(minimal(executor=table)))
    assert path in lines, lines
    assert needle in lines[path]


def test_executor_problems_are_reported_with_the_others():
    lines = problem_lines(config_error(minimal(train={"epochs": 0}, executor={"workers": 0, "kind": "ray"})))
    assert {"train.epochs", "executor.workers", "executor.kind"} <= set(lines)


def test_a_suite_names_the_ood_scores_its_report_shows():
    """``scores = [...]``: the report's OOD scores unless --scores says otherwise (repeats
    dropped, order kept); an unknown score is a ConfigError naming it and the known ones."""
    suite = build_suite(minimal(scores=["knn", "ddu_density", "knn"]))
    assert suite.scores == ("knn", "ddu_density")
    assert build_suite(minimal()).scores == ()
    with pytest.raises(ConfigError, match=r"scores: unknown OOD score 'knnn'\. Did you mean 'knn'\? Known OOD scores: .*\bknn\b"):
        build_suite(minimal(scores=["knnn"]))
    zoo = load_suite("zoo")
    assert "ddu_density" in zoo.scores and "ddu" in [m.name for m in zoo.methods]


def test_scores_that_need_features_the_suite_does_not_store_are_refused_at_load():
    """Mahalanobis and KNN read the stored features, which ``[store] features = false``
    leaves out: refused when the suite is read, naming the key, the scores and the fix,
    instead of training every cell and reporting them "not computed" (issue 43, row 12).
    Scores of the probabilities and logits stay allowed."""
    unstored = minimal(scores=["msp", "mahalanobis", "knn"], store={"features": False})
    with pytest.raises(ConfigError) as refused:
        build_suite(unstored)
    text = str(refused.value)
    assert "scores: 'mahalanobis', 'knn' need the stored features" in text, text
    assert "[store] features = true" in text and "'msp'" not in text, text
    assert build_suite(minimal(scores=["msp", "energy"], store={"features": False})).scores == ("msp", "energy")
    assert build_suite(minimal(scores=["mahalanobis", "knn"])).scores == ("mahalanobis", "knn")
