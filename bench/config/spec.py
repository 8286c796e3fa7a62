"""The suite file: TOML parsed into frozen dataclasses and validated before any work starts.

A suite names its seeds, a default training budget (``[train]``) and backbone
(``[model]``), the datasets (``[datasets.<name>]``) and the methods (``[methods.<name>]``).
Each dataset/method table may set ``type`` (the registered name; defaults to the table
name) and its own options; a trained method may override ``train``/``model`` keys in
sub-tables.  Example::

    seeds = [0, 1, 2]
    [train]
    epochs = 15
    [model]
    dim = 64
    [datasets.mnist5k]
    splits = ["test", "shift/*", "ood/*"]
    [methods.msp]
    [methods.deep_ensemble]
    base = "msp"
    members = 3
    [executor]                # optional: where the cells run (command-line flags win)
    kind = "processes"
    workers = 2

Every problem (unknown key or name, wrong type, out-of-range value) is collected with
its key path and raised as one :class:`~bench.core.errors.ConfigError`.  A suite's ``name``
(default: the file's name) is one path component, since it names the folders
``<results>/<name>`` and ``<reports>/<name>``; a suite file nests at most
:data:`MAX_TOML_DEPTH` levels and a run plans at most :data:`MAX_CELLS` cells unless
:func:`~bench.config.options.allow_large`.
"""
from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from bench.core.errors import ConfigError
from bench.config.executor_config import ExecutorConfig, parse_executor
from bench.config.options import ALLOW_LARGE_HINT, Problems, allow_large, parse
from bench.core.registry import ATTENTIONS, DATASETS, METHODS, SCORES, Registry, did_you_mean

SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"
MAX_TOML_DEPTH = 32  # tables and arrays nested in a suite file (a suite needs about 5)
MAX_CELLS = 10_000  # cells one run may plan, a sanity limit against typos (lifted by allow_large)
SUITE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")  # one path component, not hidden
# the longest suite or run name: it names <results>/NAME and <reports>/NAME, and a report is
# written beside its folder as .NAME.new-<12 hex digits> (18 more); most filesystems allow 255
MAX_NAME = 200


@dataclass(frozen=True)
class TrainConfig:
    """One training loop's budget and optimiser (``[train]``)."""

    epochs: int = field(default=15, metadata={"min": 1, "soft_max": 100_000})
    batch_size: int = field(default=128, metadata={"min": 1, "soft_max": 1 << 20})
    optimizer: Literal["adam", "adamw"] = "adamw"
    lr: float = field(default=1e-3, metadata={"exclusive_min": 0.0})
    weight_decay: float = field(default=5e-5, metadata={"min": 0.0})
    warmup_epochs: int = field(default=1, metadata={"min": 0})
    min_lr: float = field(default=1e-5, metadata={"min": 0.0})
    grad_clip: float = field(default=1.0, metadata={"min": 0.0})  # max grad norm; 0 = off
    augment: tuple[str, ...] = field(default=(), metadata={"choices": ("crop", "flip")})
    eval_batch_size: int = field(default=1000, metadata={"min": 1, "soft_max": 1 << 20})
    # torch.compile of the training forward: "auto" = on CUDA only; true = on any device
    # (CPU needs a C++ compiler); a method that does not compile falls back to eager, and
    # the cell records why.  Evaluation always runs eagerly.
    compile: bool | Literal["auto"] = "auto"
    # "auto" = bf16 autocast on CUDA, float32 on CPU; "bf16" = bf16 autocast on any device
    # (CPU too: how CI checks the bf16 path); "fp32" = no autocast.
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    # Monte-Carlo passes at prediction as one forward of the batch repeated S times, for
    # methods whose noise is drawn per input: "auto" = on CUDA (on CPU the passes run one
    # by one, as the committed CPU reference runs were made); true/false = always/never.
    batch_passes: bool | Literal["auto"] = "auto"
    # epochs between resumable training states (a killed cell resumes from the last one);
    # 0 = automatic: after every epoch once an epoch takes over a minute.  Not part of the
    # cell key: resuming ends with the same weights as an uninterrupted run.
    checkpoint_every: int = field(default=0, metadata={"min": 0})

    def __post_init__(self) -> None:
        if self.warmup_epochs >= self.epochs and self.warmup_epochs > 0:
            raise ValueError(f"warmup_epochs ({self.warmup_epochs}) must be smaller than epochs ({self.epochs})")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")


@dataclass(frozen=True)
class ModelConfig:
    """The ViT backbone (``[model]``); ``attention`` is looked up in the attention registry
    and built with ``attention_options`` as keyword arguments.  ``preset`` names a set of
    defaults from :data:`MODEL_PRESETS` that the other keys override."""

    preset: str = ""
    patch_size: int = field(default=7, metadata={"min": 1, "soft_max": 1024})
    dim: int = field(default=64, metadata={"min": 1, "soft_max": 8192})
    depth: int = field(default=2, metadata={"min": 1, "soft_max": 256})
    heads: int = field(default=4, metadata={"min": 1, "soft_max": 256})
    mlp_ratio: float = field(default=2.0, metadata={"exclusive_min": 0.0, "soft_max": 64.0})
    dropout: float = field(default=0.1, metadata={"min": 0.0, "max": 0.95})
    attention: str = "softmax"
    attention_options: dict = field(default_factory=dict, hash=False)
    pool: Literal["mean", "cls", "sequence"] = "mean"  # sequence: CCT's learned softmax weights over the tokens
    mlp_final_gelu: bool = False  # GELU after the MLP's second Linear too (the official KEP-SVGP ViT)
    pos_init_std: float = field(default=0.02, metadata={"min": 0.0})  # learned positional embedding init
    embed_dropout: bool = True  # Dropout after patches + positions (the official KEP-SVGP ViT has none)

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by heads ({self.heads})")


@dataclass(frozen=True)
class StoreConfig:
    """What the store keeps besides the predictions (``[store]``; part of every cell's key,
    so changing it re-runs the cells).  ``features``: the penultimate features (the pooled
    token the classifier head reads, float16) of every evaluation split and of at most
    ``train_features`` training images, which the feature-space OOD scores (Mahalanobis,
    KNN, ViM, ...) need; the bytes per cell are in the README."""

    features: bool = True
    train_features: int = field(default=10_000, metadata={"min": 1, "soft_max": 10_000_000})


# Backbone presets: ``[model] preset = "vit_cifar_paper"``.
MODEL_PRESETS: dict[str, dict] = {
    # KEP-SVGP's CIFAR ViT (docs/reference/kep_svgp_and_sgpa.md section 1.1): 4x4 patches
    # -> 64 tokens, depth 7, width 384, 12 heads, MLP ratio 1 with a second GELU, no class
    # token (mean pooling), dropout 0.1, softmax logits divided by sqrt(384) (the full width),
    # positional embedding initialised from randn (std 1), no dropout after the embedding;
    # readout token mean -> LayerNorm -> Linear (bench.train.vit.ViT.readout, for every model).
    "vit_cifar_paper": {
        "patch_size": 4, "dim": 384, "depth": 7, "heads": 12, "mlp_ratio": 1.0, "dropout": 0.1,
        "pool": "mean", "mlp_final_gelu": True, "pos_init_std": 1.0, "embed_dropout": False,
        "attention": "softmax", "attention_options": {"scale": "width"},
    },
    # KEP-SVGP's CoLA Transformer (docs/reference/kep_svgp_and_sgpa.md section 8): 2 layers,
    # 4 heads, hidden 256, MLP 256, dropout 0.1 (the frozen ELMo input is replaced by a
    # learned word embedding).
    "text_cola_paper": {"dim": 256, "depth": 2, "heads": 4, "mlp_ratio": 1.0, "dropout": 0.1},
    # KEP-SVGP's IMDB Transformer: 1 layer, 8 heads, embedding/hidden 128, MLP 128, dropout 0.1.
    "text_imdb_paper": {"dim": 128, "depth": 1, "heads": 8, "mlp_ratio": 1.0, "dropout": 0.1},
}


def _apply_preset(model_raw: dict, path: str, problems: Problems) -> dict:
    name = model_raw.get("preset", "")
    if not isinstance(name, str):
        problems.add(f"{path}.preset", f"must be a preset name (a string), got {name!r}; known presets: "
                     f"{', '.join(MODEL_PRESETS)}")
        return {k: v for k, v in model_raw.items() if k != "preset"}
    if not name:
        return model_raw
    if name not in MODEL_PRESETS:
        problems.add(f"{path}.preset", f"unknown preset {name!r}; known presets: {', '.join(MODEL_PRESETS)}")
        return model_raw
    return {**MODEL_PRESETS[name], **model_raw}


@dataclass(frozen=True)
class DatasetSpec:
    name: str  # the suite's name for it (table name)
    type: str  # registered dataset name
    options: Any  # the dataset's frozen Options instance
    splits: tuple[str, ...]  # glob patterns of evaluation splits


@dataclass(frozen=True)
class MethodSpec:
    name: str
    type: str
    kind: str  # "trained" or "derived"
    options: Any  # the method's frozen Options instance
    train: TrainConfig | None  # None for derived methods
    model: ModelConfig | None


@dataclass(frozen=True)
class Suite:
    name: str
    seeds: tuple[int, ...]
    datasets: tuple[DatasetSpec, ...]
    methods: tuple[MethodSpec, ...]
    description: str = ""
    reference: str = ""  # the method significance tests and corruption errors compare against
    # where the cells run ([executor]); in no cell key and not in the store
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    store: StoreConfig = field(default_factory=StoreConfig)  # what the store keeps ([store]); in every cell key
    # the OOD scores its report shows (``scores = [...]``; ``--scores`` overrides; () = the
    # default scores); not in any cell key: analysis computes them from the store
    scores: tuple[str, ...] = ()

    @property
    def reference_method(self) -> str:
        """``reference`` if set, else the suite's first method."""
        return self.reference or (self.methods[0].name if self.methods else "")

    def method(self, name: str) -> MethodSpec:
        for m in self.methods:
            if m.name == name:
                return m
        raise KeyError(name)


@dataclass(frozen=True)
class _Top:
    """Top-level keys of a suite file (sub-tables are parsed separately)."""

    name: str = ""
    description: str = ""
    reference: str = ""
    seeds: tuple[int, ...] = field(default=(0,), metadata={"min": 0, "max": 2**32 - 1})  # numpy's seed range
    train: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    datasets: dict = field(default_factory=dict)
    methods: dict = field(default_factory=dict)
    executor: dict = field(default_factory=dict)
    store: dict = field(default_factory=dict)
    scores: tuple[str, ...] = ()


@dataclass(frozen=True)
class Overrides:
    """The plan overrides of the command line, applied on top of the suite file
    (``--methods``, ``--datasets``, ``--seeds``, ``--epochs``; None: not given).  The
    datasets only select (:func:`select`); the others also change the suite built."""

    seeds: tuple[int, ...] | None = None
    epochs: int | None = None
    methods: tuple[str, ...] | None = None  # registered methods missing from the suite are added
    datasets: tuple[str, ...] | None = None

    def to_json(self) -> dict:
        """The overrides given as plain JSON values, in :data:`PLAN_OVERRIDES` order (a run
        record's ``overrides``; a run's default name and tag are made from it)."""
        given = {key: getattr(self, key) for key in PLAN_OVERRIDES}
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in given.items() if v is not None}

    @classmethod
    def from_json(cls, given: dict | None) -> Overrides:
        """The overrides a run record keeps (:meth:`to_json`)."""
        given = given or {}
        listed = {k: tuple(given[k]) for k in ("seeds", "methods", "datasets") if given.get(k) is not None}
        return cls(**listed, epochs=given.get("epochs"))

    def flags(self) -> list[str]:
        """The overrides as the command line gives them: ``["--epochs", "1", "--seeds", "0,1"]``."""
        return [part for key, value in self.to_json().items()
                for part in (f"--{key}", ",".join(map(str, value)) if isinstance(value, list) else str(value))]


#: the flags that change a run's plan, in the order a run's tag and record name them
PLAN_OVERRIDES = ("methods", "datasets", "seeds", "epochs")


@dataclass(frozen=True)
class RunSpec:
    """One run, built once from the command line (or read back from its ``run.json``,
    :mod:`bench.store.runs`) and handed whole to the runner and the report step: its
    ``name`` (its store ``<results>/NAME`` and report ``<reports>/NAME``), its ``suite``'s
    name, the ``suite_file`` it was given (a built-in suite's name or a file's path; a run
    records the file's absolute path; "" when unknown: a store reported alone, a report's
    record), its plan ``overrides`` and its ``plugins``."""

    name: str
    suite: str
    suite_file: str = ""
    overrides: Overrides = Overrides()
    plugins: tuple[str, ...] = ()

    def identity(self) -> dict:
        """What makes two runs the same plan: the suite's name and the overrides (JSON)."""
        return {"suite": self.suite, "overrides": self.overrides.to_json()}

    def same_plan(self, other: RunSpec | None) -> bool:
        return other is not None and self.identity() == other.identity()


def available_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml"))


def resolve_suite_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ConfigError(f"suite file {str(path)!r} does not exist")
        return path
    builtin = SUITES_DIR / f"{name_or_path}.toml"
    if not builtin.is_file():
        raise ConfigError(
            f"unknown suite {name_or_path!r}{did_you_mean(name_or_path, available_suites())}: neither a built-in "
            f"suite ({', '.join(available_suites())}) nor a path to a .toml file"
        )
    return builtin


def suite_name_problem(name: object, what: str = "suite") -> str | None:
    """Why ``name`` cannot name a suite (or, with ``what="run"``, a run: ``--name``; None
    when it can): it must be one path component of letters, digits, ``-``, ``_`` and
    ``.``, not starting with ``.``, of at most :data:`MAX_NAME` characters."""
    default = "; a suite file's name defaults to its file name" if what == "suite" else ""
    if isinstance(name, str) and SUITE_NAME.fullmatch(name):
        if len(name) <= MAX_NAME:
            return None
        return (f"{name[:24]!r}... ({len(name)} characters) is too long to name a {what}: at most {MAX_NAME}, as it "
                f"names the folders <results>/NAME and <reports>/NAME{default}")
    return (f"{name!r} cannot name a {what}: a {what} name is one folder name of letters, digits, '-', '_' and '.', "
            f"not starting with '.' (it becomes <results>/NAME and <reports>/NAME{default})")


def load_suite(name_or_path: str = "default", overrides: Overrides = Overrides()) -> Suite:
    """Read, override and validate a suite; raises ConfigError listing every problem."""
    return build_suite(suite_source(name_or_path), overrides)


def suite_source(name_or_path: str = "default") -> dict:
    """A suite file (a built-in name or a path) as parsed TOML, its ``name`` set (default:
    the file's name): what :func:`build_suite` validates, and what a run records."""
    path = resolve_suite_path(name_or_path)
    too_deep = ConfigError(f"{path}: tables or arrays nested more than {MAX_TOML_DEPTH} levels deep; "
                           "a suite needs a handful")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: malformed TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file ({exc}); a suite must be TOML") from None
    except RecursionError:  # the parser recurses once per level
        raise too_deep from None
    if _nesting(raw) > MAX_TOML_DEPTH:
        raise too_deep
    raw.setdefault("name", path.stem)
    return raw


def _nesting(value: object) -> int:
    """How many levels of tables and arrays ``value`` has (counted level by level, without
    recursion; stops once past :data:`MAX_TOML_DEPTH`)."""
    depth, level = 0, [value]
    while depth <= MAX_TOML_DEPTH:
        inner = [x for x in level if isinstance(x, (dict, list))]
        if not inner:
            break
        depth += 1
        level = [v for x in inner for v in (x.values() if isinstance(x, dict) else x)]
    return depth


def _override_epochs(train_raw: dict, epochs: int | None) -> dict:
    """``--epochs N`` replaces the budget; a warm-up that no longer fits is shortened to
    N - 1 epochs (a suite *file* with such a warm-up is still an error)."""
    if epochs is None:
        return train_raw
    warmup = train_raw.get("warmup_epochs", TrainConfig.warmup_epochs)
    if isinstance(warmup, int) and not isinstance(warmup, bool):
        train_raw["warmup_epochs"] = min(warmup, epochs - 1)
    return {**train_raw, "epochs": epochs}


def _merge(base: dict, over: dict) -> dict:
    return {**base, **over}


def build_suite(raw: dict, overrides: Overrides = Overrides()) -> Suite:
    """Validate a suite given as a plain dict (the parsed TOML).  A ``name``, when given,
    must pass :func:`suite_name_problem`; more than :data:`MAX_CELLS` seeds are refused at
    once (every suite has a dataset and a trained method)."""
    if "name" in raw and (why := suite_name_problem(raw["name"])) is not None:  # load_suite always sets one
        raise ConfigError(f"name: {why}")
    seeds = overrides.seeds if overrides.seeds is not None else raw.get("seeds", ())
    if isinstance(seeds, (list, tuple)) and len(seeds) > MAX_CELLS and not allow_large():  # before checking each
        raise ConfigError(f"seeds: {len(seeds):,} seeds plan more than {MAX_CELLS:,} cells (a sanity limit against "
                          f"typos); give fewer, or {ALLOW_LARGE_HINT}")
    raw = copy.deepcopy(raw)
    problems = Problems()
    if overrides.seeds is not None:
        raw["seeds"] = list(overrides.seeds)
    top = parse(_Top, raw, "", problems)
    if top is None:
        problems.raise_if_any()
    if not top.seeds:
        problems.add("seeds", "needs at least one seed")
    if len(set(top.seeds)) != len(top.seeds):
        problems.add("seeds", f"seeds must be distinct, got {list(top.seeds)}")

    base_train = _override_epochs(dict(top.train), overrides.epochs)
    parse(TrainConfig, base_train, "train", problems)
    parse(ModelConfig, _apply_preset(dict(top.model), "model", problems), "model", problems)
    executor = parse_executor(dict(top.executor), "executor", problems)
    store = parse(StoreConfig, dict(top.store), "store", problems)

    method_tables = dict(top.methods)
    if overrides.methods is not None:
        for name in overrides.methods:  # a registered method not in the suite runs with defaults
            if name not in method_tables and name in METHODS:
                method_tables[name] = {}

    datasets = tuple(_parse_dataset(n, t, problems) for n, t in top.datasets.items())
    methods = tuple(
        _parse_method(n, t, base_train, top.model, overrides, problems) for n, t in method_tables.items()
    )
    if not datasets:
        problems.add("datasets", "the suite names no dataset; add a [datasets.<name>] table")
    if not methods:
        problems.add("methods", "the suite names no method; add a [methods.<name>] table")
    problems.raise_if_any()

    by_name = {m.name: m for m in methods}
    for m in methods:
        if m.kind == "derived":
            _check_derived(m, by_name, problems)
        elif stage1_of(m):
            _check_stage1(m, by_name, problems)
    problems.raise_if_any()

    if top.reference and top.reference not in by_name:
        problems.add("reference", f"names no method of this suite; known: {', '.join(by_name)}")
    SCORES.validate(top.scores, "scores", problems=problems)
    if (why := unstored_scores_problem(top.scores, store)) is not None:
        problems.add("scores", why)
    problems.raise_if_any()
    return Suite(top.name, top.seeds, datasets, methods, top.description, top.reference, executor, store,
                 tuple(dict.fromkeys(top.scores)))


def unstored_scores_problem(names, store: StoreConfig) -> str | None:
    """Why the OOD scores ``names`` cannot be computed from a store kept as ``store``
    says, or None: a score that needs the features or the training features (its
    :attr:`bench.scores.Score.needs_stored_features`) where ``[store] features = false``."""
    if store.features:
        return None
    unstored = [n for n in dict.fromkeys(names) if n in SCORES and SCORES.get(n).needs_stored_features]
    if not unstored:
        return None
    listed = ", ".join(map(repr, unstored))
    return (f"{listed} need{'s' if len(unstored) == 1 else ''} the stored features, which [store] features = false "
            f"leaves out: set [store] features = true (the cells then train again), or leave {listed} out")


def _parse_dataset(name: str, table: Any, problems: Problems) -> DatasetSpec | None:
    path = f"datasets.{name}"
    if not isinstance(table, dict):
        problems.add(path, f"expected a table, got {table!r}")
        return None
    table = dict(table)
    type_path = f"{path}.type" if "type" in table else path
    type_ = table.pop("type", name)
    splits = table.pop("splits", ["test", "shift/*", "ood/*"])
    if not isinstance(type_, str):
        problems.add(type_path, f"expected a registered dataset name, got {type_!r}")
        return None
    if not DATASETS.validate(type_, type_path, problems=problems):
        return None
    if not isinstance(splits, list) or not splits or not all(isinstance(s, str) for s in splits):
        problems.add(f"{path}.splits", f"expected a non-empty list of split patterns, got {splits!r}")
    options = parse(DATASETS.get(type_).Options, table, path, problems)
    return DatasetSpec(name, type_, options, tuple(splits) if isinstance(splits, list) else ())


def _parse_method(
    name: str, table: Any, base_train: dict, base_model: dict, overrides: Overrides, problems: Problems
) -> MethodSpec | None:
    path = f"methods.{name}"
    if isinstance(table, str):
        table = _shorthand(table, path, problems)
    if not isinstance(table, dict):
        if table is not None:
            problems.add(path, f"expected a table or a shorthand like \"ensemble(sgpa, 5)\", got {table!r}")
        return None
    table = dict(table)
    type_path = f"{path}.type" if "type" in table else path
    type_ = table.pop("type", name)
    if not isinstance(type_, str):
        problems.add(type_path, f"expected a registered method name, got {type_!r}")
        return None
    if not METHODS.validate(type_, type_path, problems=problems):
        return None
    cls = METHODS.get(type_)
    train_over, model_over = table.pop("train", {}), table.pop("model", {})
    for key, value in (("train", train_over), ("model", model_over)):
        if not isinstance(value, dict):
            problems.add(f"{path}.{key}", f"expected a table of {key} settings, got {value!r}")
    if not isinstance(train_over, dict) or not isinstance(model_over, dict):
        return None
    options = parse(cls.Options, table, path, problems)
    if cls.kind == "derived":
        if train_over or model_over:
            problems.add(path, f"{type_!r} is computed from stored predictions and takes no train/model settings")
        return MethodSpec(name, type_, cls.kind, options, None, None)
    train_raw = _override_epochs(_merge(base_train, train_over), overrides.epochs)
    model_raw = _merge(cls.model_defaults(), _merge(base_model, model_over))
    own = Problems()
    train = parse(TrainConfig, train_raw, f"{path}.train", own)
    model = parse(ModelConfig, _apply_preset(model_raw, f"{path}.model", own), f"{path}.model", own)
    problems += _not_inherited(own, path, problems)
    if model is not None:
        ATTENTIONS.validate(model.attention, f"{path}.model.attention", problems=problems)
    return MethodSpec(name, type_, cls.kind, options, train, model)


def _not_inherited(own: Problems, path: str, problems: Problems) -> list[str]:
    """A method's ``train``/``model`` problems less those it inherits from the suite's
    ``[train]``/``[model]`` tables, already reported there: a bad value is named once, where
    it is written, not again for every method."""
    prefix = f"{path}."
    return [p for p in own if not (p.startswith(prefix) and p[len(prefix):] in problems)]


_SHORTHAND = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*\(\s*([A-Za-z_][\w.-]*)\s*(?:,\s*(\d+)\s*)?\)\s*")


def _shorthand(text: str, path: str, problems: Problems) -> dict | None:
    """``sgpa_ens = "ensemble(sgpa, 5)"`` means ``{type = "ensemble", base = "sgpa", members = 5}``;
    ``"temperature_scaling(msp)"`` means ``{type = "temperature_scaling", base = "msp"}``."""
    match = _SHORTHAND.fullmatch(text)
    if match is None:
        problems.add(path, f"cannot read {text!r}: write a table, or a combinator call like \"ensemble(sgpa, 5)\"")
        return None
    type_, base, members = match.groups()
    return {"type": type_, "base": base, **({"members": int(members)} if members else {})}


def _check_derived(m: MethodSpec, by_name: dict[str, MethodSpec], problems: Problems) -> None:
    base = m.options.base
    if base not in by_name:
        problems.add(f"methods.{m.name}.base", f"names no method of this suite; known: {', '.join(by_name)}")
    elif by_name[base].kind != "trained":
        problems.add(f"methods.{m.name}.base", f"{base!r} must be a trained method, not a derived one")


def stage1_of(m: MethodSpec) -> str:
    """The trained method a two-stage trained method starts from (``TrainedMethod.stage1``),
    "" for none and for derived methods."""
    return "" if m.kind != "trained" else METHODS.get(m.type)(m.options).stage1()


def post_hoc_of(m: MethodSpec) -> bool:
    """Whether a trained method trains nothing of its own: a two-stage method fitted on
    its stage 1's stored network (``TrainedMethod.post_hoc``: last-layer Laplace on msp)."""
    return bool(stage1_of(m)) and METHODS.get(m.type)(m.options).post_hoc()


def _check_stage1(m: MethodSpec, by_name: dict[str, MethodSpec], problems: Problems) -> None:
    """A stage 1 is checked as a derived method's ``base`` is, and must be single-stage."""
    base = stage1_of(m)
    if base not in by_name:
        problems.add(f"methods.{m.name}.base", f"names no method of this suite; known: {', '.join(by_name)}")
    elif by_name[base].kind != "trained" or stage1_of(by_name[base]):
        problems.add(f"methods.{m.name}.base", f"{base!r} must be a single-stage trained method")
    elif METHODS.get(m.type)(m.options).post_hoc() and m.model != by_name[base].model:
        problems.add(f"methods.{m.name}.model", f"a post-hoc method uses the network of its base {base!r} as stored, so "
                                               "its [model] must equal that method's: drop its own model settings or set "
                                               "them on both")


def select(
    suite: Suite, methods: tuple[str, ...] | None = None, datasets: tuple[str, ...] | None = None, *, to_run: bool = True,
    run: str = "",
) -> Suite:
    """The part of a suite to run (or report): only these datasets and methods, plus the
    trained methods that the selected derived ones are computed from.  ``to_run`` also
    checks that every selected combinator has enough seeds for one replicate.  A selection
    of more than :data:`MAX_CELLS` cells is an error unless :func:`~bench.config.options.allow_large`.
    ``run``: the run whose datasets and methods ``suite`` holds (a report of it), whose
    names alone ``--methods`` may give; "" names the suite, and a method it lacks may be any
    registered one.  An unknown name is the registry's message
    (:meth:`bench.core.registry.Registry.validate`)."""
    whose = f"run {run!r}" if run else f"suite {suite.name!r}"
    if datasets is not None:
        Registry.of("dataset", [d.name for d in suite.datasets], whose).validate(datasets, "--datasets")
    chosen_methods = suite.methods
    if methods is not None:
        known = [m.name for m in suite.methods]  # a report shows what the run has: only its methods can be meant
        if run and (absent := [m for m in methods if m not in known and m in METHODS]):
            raise ConfigError(f"--methods: run {run!r} has no method {absent[0]!r}. It has: {', '.join(known)}")
        Registry.of("method", known if run else dict.fromkeys(known + METHODS.names()),
                    whose if run else f"{whose} or registered").validate(methods, "--methods")
        wanted = set(methods)
        wanted |= {m.options.base for m in suite.methods if m.name in wanted and m.kind == "derived"}
        wanted |= {stage1_of(m) for m in suite.methods if m.name in wanted and stage1_of(m)}
        chosen_methods = tuple(m for m in suite.methods if m.name in wanted)
    for m in chosen_methods:
        need = METHODS.get(m.type)(m.options).members_per_replicate() if m.kind == "derived" else 0
        if to_run and need > len(suite.seeds):
            raise ConfigError(
                f"methods.{m.name}: needs {need} member seeds but the run has {len(suite.seeds)} "
                f"({list(suite.seeds)}); add seeds, lower 'members', or leave it out with --methods"
            )
    chosen_datasets = tuple(d for d in suite.datasets if datasets is None or d.name in datasets)
    trained = sum(m.kind == "trained" for m in chosen_methods)
    cells = len(chosen_datasets) * trained * len(suite.seeds)
    if cells > MAX_CELLS and not allow_large():
        raise ConfigError(f"this selection plans {cells:,} cells ({len(chosen_datasets)} dataset(s) x {trained} trained "
                          f"method(s) x {len(suite.seeds):,} seed(s)), more than {MAX_CELLS:,} (a sanity limit against "
                          f"typos); narrow --seeds, --methods or --datasets, or {ALLOW_LARGE_HINT}")
    return replace(suite, datasets=chosen_datasets, methods=chosen_methods)
