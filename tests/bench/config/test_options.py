"""bench.config.options.parse: a table of a suite file becomes a frozen dataclass, every value
checked against its field's type and choices."""
from __future__ import annotations

import dataclasses

import pytest

from bench.core.errors import ConfigError
from bench.config.options import parse
from bench.config.spec import TrainConfig


def test_parse_builds_the_frozen_dataclass():
    cfg = parse(TrainConfig, {"epochs": 4, "lr": 1, "augment": ["crop"]})
    assert cfg == TrainConfig(epochs=4, lr=1.0, augment=("crop",))
    assert isinstance(cfg.lr, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.epochs = 5


def test_parse_rejects_unknown_choice_in_a_list():
    with pytest.raises(ConfigError) as exc:
        parse(TrainConfig, {"augment": ["crop", "rotate"]}, "train")
    assert "train.augment" in str(exc.value) and "'rotate'" in str(exc.value)
