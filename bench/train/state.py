"""A cell's resume file (``train_state.pt``): a :func:`bench.train.loop.fit` checkpoint
(:meth:`bench.train.loop.Trainer.state`) written
with the key of the cell it belongs to and a checksum of its contents, and read back only
when it may continue training the model it is offered (same cell, intact, tensors that fit
the model, epoch inside the schedule); otherwise :class:`UnusableState` says why.
"""
from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from pathlib import Path

import torch

from bench.config.spec import TrainConfig
from bench.store import CellDir


class UnusableState(ValueError):
    """A saved training state that must not be resumed; the message says why."""


def state_digest(state: Mapping) -> str:
    """sha256 of a training state's contents: every tensor's dtype, shape and bytes and
    every plain value, tables in sorted key order (the same before :func:`torch.save` and
    after :func:`torch.load`, on any device)."""
    h = hashlib.sha256()

    def feed(obj: object) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().cpu().contiguous()
            h.update(f"tensor {t.dtype} {tuple(t.shape)}\n".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(obj, Mapping):
            h.update(f"table {len(obj)}\n".encode())
            for k in sorted(obj, key=lambda k: (type(k).__name__, repr(k))):
                h.update(f"key {k!r}\n".encode())
                feed(obj[k])
        elif isinstance(obj, (list, tuple)):
            h.update(f"list {len(obj)}\n".encode())
            for v in obj:
                feed(v)
        elif isinstance(obj, float):
            h.update(f"float {obj.hex()}\n".encode())
        else:  # None, bool, int, str
            h.update(f"{type(obj).__name__} {obj!r}\n".encode())

    feed(state)
    return h.hexdigest()


def training_state_bytes(state: dict, cell_key: str) -> bytes:
    """A :func:`bench.train.loop.fit` checkpoint as the file a cell keeps (``train_state.pt``): the state's
    entries plus ``cell`` (the key of the cell it belongs to) and ``sha256``
    (:func:`state_digest` of everything else), one :func:`torch.save` archive, so the key
    and checksum are written (atomically, by the store) with the state they vouch for."""
    payload = {**state, "cell": cell_key}
    payload["sha256"] = state_digest(payload)
    buf = io.BytesIO()
    torch.save(payload, buf)
    return buf.getvalue()


def read_training_state(path: Path, cell_key: str, model: torch.nn.Module, cfg: TrainConfig) -> dict:
    """The state of :func:`training_state_bytes` at ``path`` if it may continue training
    ``model`` (built for the cell ``cell_key`` and not trained yet) under ``cfg``; else
    :class:`UnusableState` naming the first reason: unreadable, no key and checksum, a
    checksum that does not match (changed or corrupted), another cell's key, or contents
    that do not fit (:func:`training_state_problem`)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever a damaged file raises
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise UnusableState(f"it cannot be read ({type(exc).__name__}: {first})") from None
    if not isinstance(state, dict) or not isinstance(state.get("cell"), str) or "sha256" not in state:
        raise UnusableState("it carries no cell key and checksum")
    digest = state.pop("sha256")
    if digest != state_digest(state):
        raise UnusableState("its contents do not match its checksum (changed or corrupted)")
    if state["cell"] != cell_key:
        raise UnusableState(f"it belongs to cell {state['cell']}, not to this one")
    if (why := training_state_problem(state, model, cfg)) is not None:
        raise UnusableState(why)
    return state


#: the entries of a :func:`bench.train.loop.fit` checkpoint that every resume needs
STATE_ENTRIES = ("epoch", "model", "opt", "sched", "gen", "torch_rng", "best_state", "best_epoch", "best_val_acc",
                 "log")


def training_state_problem(state: dict, model: torch.nn.Module, cfg: TrainConfig) -> str | None:
    """Why a checkpoint cannot continue training ``model`` under ``cfg`` (None when it can):
    an entry missing, its epoch outside ``[0, cfg.epochs)``, a log of another length, or
    tensors that do not fit the model (names, shapes, dtypes of the weights, the best
    weights and the optimiser's moments; the random generators' state sizes)."""
    missing = [k for k in STATE_ENTRIES if k not in state]
    if missing:
        return f"it lacks {', '.join(missing)}"
    epoch = state["epoch"]
    if type(epoch) is not int or not 0 <= epoch < cfg.epochs:
        return f"its epoch {epoch!r} is outside [0, {cfg.epochs})"
    if not isinstance(state["log"], list) or len(state["log"]) != epoch:
        return f"its log does not hold one row for each of its {epoch} epochs"
    if type(state["best_epoch"]) is not int or not -1 <= state["best_epoch"] <= epoch:
        return f"its best epoch {state['best_epoch']!r} is not one of its {epoch} epochs"
    expected = {k: (v.dtype, tuple(v.shape)) for k, v in model.state_dict().items()}
    for part in ("model", "best_state"):
        if (why := state_dict_problem(state[part], expected)) is not None:
            return f"its {part} does not fit the model: {why}"
    params = list(model.parameters())
    try:
        ids = [i for group in state["opt"]["param_groups"] for i in group["params"]]
        moments = {i: dict(state["opt"]["state"].get(i, {})) for i in ids}
    except (KeyError, TypeError, AttributeError, ValueError):
        return "its optimiser state is malformed"
    if len(ids) != len(params):
        return f"its optimiser holds {len(ids)} parameters, the model has {len(params)}"
    for i, p in zip(ids, params):
        for name, t in moments[i].items():
            if isinstance(t, torch.Tensor) and t.dim() > 0 and (t.dtype, t.shape) != (p.dtype, p.shape):
                return (f"its optimiser's {name} of parameter {i} is {t.dtype}{list(t.shape)}, "
                        f"the parameter {p.dtype}{list(p.shape)}")
    cpu_rng = torch.Generator().get_state()
    for name in ("gen", "torch_rng"):
        t = state[name]
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.shape != cpu_rng.shape:
            return f"its {name} is not the state of a CPU random generator"
    return None


def state_dict_problem(tensors: object, expected: dict[str, tuple]) -> str | None:
    """Why ``tensors`` is not a state dict of the model whose ``name -> (dtype, shape)`` is
    ``expected`` (None when it is one): a resume file's weights, a stage-1 checkpoint
    (``bench.train.cell.stage1_state``)."""
    if not isinstance(tensors, Mapping):
        return "not a table of tensors"
    if (absent := sorted(set(expected) - set(tensors))):
        return f"it lacks {absent[0]}" + (f" and {len(absent) - 1} more" if len(absent) > 1 else "")
    if (extra := sorted(set(tensors) - set(expected))):
        return f"the model has no {extra[0]}" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
    for name, (dtype, shape) in expected.items():
        t = tensors[name]
        if not isinstance(t, torch.Tensor) or (t.dtype, tuple(t.shape)) != (dtype, shape):
            got = f"{t.dtype}{list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            return f"{name} is {got}, the model's {dtype}{list(shape)}"
    return None


TRAIN_STATE = "train_state.pt"  # the resumable training state of a cell in progress


def saved_epoch(cd: CellDir) -> int | None:
    """The epoch a cell's resumable training state was saved at (None: no state, or one
    that cannot be read); the file is mapped, not read whole."""
    path = cd.path / TRAIN_STATE
    if not path.is_file():
        return None
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["epoch"])
    except Exception:  # noqa: BLE001  (a state being written or damaged)
        return None
