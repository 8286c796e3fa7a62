"""The planner: a suite becomes cells (dataset x trained method x seed), each keyed by a
hash of its resolved config.  Derived methods add no cells: analysis computes them from
the cells of their base method.  A two-stage trained method (``TrainedMethod.stage1``)
names the cell of its stage 1 (same dataset and seed): its config holds that cell's key,
and its cells come after every single-stage cell of their dataset, so a local run has
stored the stage 1 when they start."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from bench.config.options import to_dict
from bench.config.spec import DatasetSpec, MethodSpec, StoreConfig, Suite, post_hoc_of, stage1_of
from bench.store import STORE_SCHEMA


@dataclass(frozen=True)
class Cell:
    dataset: DatasetSpec
    method: MethodSpec
    seed: int
    key: str
    config: dict  # the resolved config the key hashes (also stored in cell.json)
    store: StoreConfig = StoreConfig()  # what the cell keeps besides its predictions ([store])
    stage1: "Cell | None" = None  # the cell a two-stage method starts from (its config, less the seed, is in config)

    @property
    def label(self) -> str:
        return f"{self.dataset.name} / {self.method.name} / seed {self.seed}"

    @property
    def post_hoc(self) -> bool:
        """A cell that trains nothing: fitted on its stage-1 cell's network (:func:`post_hoc_of`)."""
        return self.stage1 is not None and post_hoc_of(self.method)


#: training settings left out of a cell's key: how a cell is executed, not what it estimates.
#: Like the device and the executor (not in the key either), they change at most float
#: round-off (compile) or which random numbers a Monte-Carlo estimate draws (batch_passes);
#: resuming from a checkpoint changes nothing.  ``precision`` is in the key.
NOT_IN_KEY = ("checkpoint_every", "compile", "batch_passes")


def cell_config(dataset: DatasetSpec, method: MethodSpec, seed: int, store: StoreConfig = StoreConfig()) -> dict:
    """Everything that determines a cell's predictions and what it stores (suite-level
    names and :data:`NOT_IN_KEY` excluded, so two suites with the same settings share keys)."""
    return {
        "schema": STORE_SCHEMA,
        "store": to_dict(store),
        "dataset": {"type": dataset.type, "options": to_dict(dataset.options), "splits": list(dataset.splits)},
        "method": {
            "type": method.type,
            "options": to_dict(method.options),
            "train": {k: v for k, v in to_dict(method.train).items() if k not in NOT_IN_KEY},
            "model": to_dict(method.model),
        },
        "seed": seed,
    }


def config_key(config: dict) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Plan:
    suite: Suite
    cells: tuple[Cell, ...]

    def find(self, dataset: str, method: str, seed: int) -> Cell:
        for c in self.cells:
            if (c.dataset.name, c.method.name, c.seed) == (dataset, method, seed):
                return c
        raise KeyError((dataset, method, seed))


def make_plan(suite: Suite) -> Plan:
    cells = []
    by_name = {m.name: m for m in suite.methods}
    trained = [m for m in suite.methods if m.kind == "trained"]
    for d in suite.datasets:
        for m in sorted(trained, key=lambda m: bool(stage1_of(m))):  # stable: single-stage methods first
            for seed in suite.seeds:
                first = None
                config = cell_config(d, m, seed, suite.store)
                if base := stage1_of(m):
                    base_config = cell_config(d, by_name[base], seed, suite.store)
                    first = Cell(d, by_name[base], seed, config_key(base_config), base_config, suite.store)
                    # what stage 1 is, not which cell: its config without the seed, so that a
                    # two-stage method's cells of two seeds differ only in their seed (as every
                    # method's do) and its key still changes with the stage-1 settings
                    config["stage1"] = {k: v for k, v in base_config.items() if k != "seed"}
                cells.append(Cell(d, m, seed, config_key(config), config, suite.store, first))
    return Plan(suite, tuple(cells))
