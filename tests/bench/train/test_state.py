"""bench.train.state: a cell's resume file is written with its cell key and checksum and
read back only when it may continue training the model offered, else refused with why."""
from __future__ import annotations

import copy
import io
import re

import pytest
import torch

from bench.data import DataBundle
from bench.config.spec import ModelConfig, TrainConfig
from bench.train.loop import fit, seed_everything
from bench.train.state import UnusableState, read_training_state, training_state_bytes, training_state_problem
from methods.msp import MSP
from tests.helpers.synthetic import squares_bundle

CPU = torch.device("cpu")
TINY = ModelConfig(patch_size=5, dim=16, depth=1, heads=2)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data() -> DataBundle:
    """10x10 squares: 150 train / 60 val / 60 test."""
    return squares_bundle((150, 60, 60), 0)


def build(method, data: DataBundle, seed: int, model_cfg: ModelConfig = TINY) -> torch.nn.Module:
    seed_everything(seed)
    return method.build_model(model_cfg, data)


STATE_CFG = TrainConfig(epochs=3, batch_size=32, lr=5e-3, warmup_epochs=1, eval_batch_size=25, checkpoint_every=1)


@pytest.fixture(scope="module")
def saved_state(data, tmp_path_factory):
    """A real checkpoint of a 3-epoch MSP fit (after epoch 1) as the file a cell keeps."""
    files = []  # each state is written when it is handed over (as the runner does): it holds live tensors
    method = MSP(MSP.Options())
    fit(method, build(method, data, 0), data, STATE_CFG, CPU, seed=0,
        on_checkpoint=lambda state: files.append(training_state_bytes(state, "cell-a")))
    path = tmp_path_factory.mktemp("state") / "train_state.pt"
    path.write_bytes(files[0])
    return path


def test_a_saved_training_state_carries_its_cell_and_checksum_and_reads_back(saved_state, data):
    state = read_training_state(saved_state, "cell-a", build(MSP(MSP.Options()), data, 5), STATE_CFG)
    raw = torch.load(saved_state, weights_only=True)
    assert raw["cell"] == "cell-a" and len(raw["sha256"]) == 64 and state["epoch"] == raw["epoch"] == 1
    assert all(torch.equal(state["model"][k], raw["model"][k]) for k in raw["model"])


def wrong_state(what: str, path, tmp_path):
    """A copy of the state file at ``path`` made wrong: truncated, or loaded, changed and
    saved again -- with torch.save alone (as a user editing the file would), or, for the
    forgeries, through training_state_bytes (key and checksum made to match)."""

    out = tmp_path / "wrong.pt"
    if what == "truncated":
        out.write_bytes(path.read_bytes()[:3000])
        return out
    state = torch.load(path, weights_only=True)
    first = next(k for k, v in state["model"].items() if v.is_floating_point() and v.numel() > 1)
    if what == "one weight edited":
        state["model"][first].view(-1)[0] += 0.25
    elif what == "without key and checksum":
        del state["cell"], state["sha256"]
    elif what == "epoch past the budget":
        state["epoch"] = STATE_CFG.epochs
    elif what == "a weight of another shape":
        state["model"][first] = torch.zeros(2, 2)
    elif what == "a best weight missing":
        del state["best_state"][first]
    if what in ("one weight edited", "without key and checksum"):
        buf = io.BytesIO()
        torch.save(state, buf)
        out.write_bytes(buf.getvalue())
    else:
        out.write_bytes(training_state_bytes({k: v for k, v in state.items() if k not in ("cell", "sha256")}, "cell-a"))
    return out


@pytest.mark.parametrize("what,reason", [
    ("truncated", "it cannot be read"),
    ("one weight edited", "its contents do not match its checksum"),
    ("without key and checksum", "it carries no cell key and checksum"),
    ("epoch past the budget", "its epoch 3 is outside [0, 3)"),
    ("a weight of another shape", "its model does not fit the model: "),
    ("a best weight missing", "its best_state does not fit the model: it lacks "),
])
def test_a_training_state_that_was_changed_or_does_not_fit_is_refused(saved_state, data, tmp_path, what, reason):
    with pytest.raises(UnusableState, match=re.escape(reason)):
        read_training_state(wrong_state(what, saved_state, tmp_path), "cell-a", build(MSP(MSP.Options()), data, 5),
                            STATE_CFG)


def test_a_training_state_of_another_cell_is_refused(saved_state, data):
    with pytest.raises(UnusableState, match="it belongs to cell cell-a, not to this one"):
        read_training_state(saved_state, "cell-b", build(MSP(MSP.Options()), data, 5), STATE_CFG)


def test_a_training_state_of_another_architecture_does_not_fit(data):
    """With key and checksum forged to match, the tensors themselves are checked against
    the model: names, shapes, dtypes."""

    method = MSP(MSP.Options())
    small, wide = (build(method, data, 0, ModelConfig(patch_size=5, dim=d, depth=1, heads=2)) for d in (16, 32))
    states = []
    fit(method, wide, data, STATE_CFG, CPU, seed=0, on_checkpoint=lambda state: states.append(copy.deepcopy(state)))
    why = training_state_problem(states[0], small, STATE_CFG)
    assert why is not None and why.startswith("its model does not fit the model:") and "32" in why, why
    assert training_state_problem(states[0], wide, STATE_CFG) is None
