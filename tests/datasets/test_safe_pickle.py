"""datasets.safe_pickle: numpy arrays and CIFAR-style Python-2 pickles load; any other
global is refused without being run."""
from __future__ import annotations

import collections
import io
import os
import pickle
import pickletools

import numpy as np
import pytest

from datasets import safe_pickle
from tests.helpers.official_files import py2_dumps


def globals_in(data: bytes) -> set[str]:
    """Module and name of every GLOBAL / STACK_GLOBAL in a pickle."""
    found, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            found.add(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            found.add(f"{strings[-2]}.{strings[-1]}")
        elif isinstance(arg, str):
            strings.append(arg)
    return found


ARRAYS = [
    np.arange(28 * 28 * 3, dtype=np.uint8).reshape(3, 28, 28),
    np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4).T,  # not C-contiguous
    np.array([3, 1, 4], dtype=np.int64),
    np.zeros((0, 28, 28), dtype=np.uint8),
]


@pytest.mark.parametrize("protocol", sorted({2, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL}))
@pytest.mark.parametrize("array", ARRAYS, ids=["uint8", "float32_T", "int64", "empty"])
def test_numpy_array_round_trips(array, protocol):
    data = pickle.dumps(array, protocol=protocol)
    out = safe_pickle.load(data)
    assert isinstance(out, np.ndarray)
    assert out.dtype == array.dtype and out.shape == array.shape
    np.testing.assert_array_equal(out, array)
    # file objects work as well as bytes
    np.testing.assert_array_equal(safe_pickle.load(io.BytesIO(data)), array)


class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("protocol", [2, pickle.DEFAULT_PROTOCOL])
def test_malicious_pickle_is_refused_without_running(tmp_path, protocol):
    target = tmp_path / "pwned"
    payload = pickle.dumps(Evil(target), protocol=protocol)
    with pytest.raises(pickle.UnpicklingError, match=r"refusing to load global \w+\.system"):
        safe_pickle.load(payload)
    assert not target.exists()
    # control: the payload is live, the stock unpickler does run it
    pickle.loads(payload)
    assert target.exists()


def test_malicious_global_inside_an_allowed_structure_is_refused(tmp_path):
    target = tmp_path / "pwned"
    payload = pickle.dumps({"data": np.zeros(3), "x": [Evil(target)]}, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="system"):
        safe_pickle.load(payload)
    assert not target.exists()


@pytest.mark.parametrize("obj", [eval, np.load, collections.OrderedDict(a=1)], ids=["eval", "np.load", "OrderedDict"])
def test_other_globals_are_refused(obj):
    with pytest.raises(pickle.UnpicklingError, match="refusing to load global"):
        safe_pickle.load(pickle.dumps(obj, protocol=2))


def test_allow_list_is_a_parameter():
    data = pickle.dumps(collections.OrderedDict(a=1), protocol=2)
    allowed = safe_pickle.DEFAULT_ALLOWED | {("collections", "OrderedDict")}
    assert safe_pickle.load(data, allowed=allowed) == collections.OrderedDict(a=1)
    with pytest.raises(pickle.UnpicklingError, match=r"numpy\.ndarray|_reconstruct"):
        safe_pickle.load(pickle.dumps(np.zeros(2), protocol=2), allowed=frozenset())


@pytest.mark.parametrize("args", [("x", "rot13"), ("x", "utf-16")])
def test_codecs_encode_only_as_pickle_uses_it(args):
    payload = b"\x80\x02c_codecs\nencode\n" + pickle.dumps(args, protocol=2)[2:-1] + b"R."
    assert pickle.loads(payload) is not None  # the stock unpickler runs any codec
    with pytest.raises(pickle.UnpicklingError, match="only as encode"):
        safe_pickle.load(payload)


def test_numpy_scalar_needs_its_global():
    data = pickle.dumps(np.float64(2.5), protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="scalar"):
        safe_pickle.load(data)
    assert safe_pickle.load(data, allowed=safe_pickle.DEFAULT_ALLOWED | safe_pickle.NUMPY_SCALAR) == 2.5


def cifar_batch():
    rng = np.random.default_rng(0)
    return {
        b"batch_label": b"training batch 1 of 5",
        b"labels": [6, 9, 9, 4, 1],
        b"data": rng.integers(0, 256, size=(5, 3072), dtype=np.uint8),
        b"filenames": [f"img_{i}.png".encode() for i in range(5)],
    }


def test_cifar_style_python2_pickle_round_trips():
    batch = cifar_batch()
    data = py2_dumps(batch)
    # the fixture is encoded like the official files: protocol 2, Python-2 str opcodes,
    # and exactly the pre-numpy-2 array globals
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert data[:2] == b"\x80\x02"
    assert "SHORT_BINSTRING" in ops and "BINSTRING" in ops
    assert not ops & {"SHORT_BINBYTES", "BINBYTES", "BINUNICODE", "SHORT_BINUNICODE"}
    assert globals_in(data) == {"numpy.core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype"}

    out = safe_pickle.load(data, encoding="bytes", allowed=safe_pickle.NUMPY_RECONSTRUCT)
    assert set(out) == set(batch)
    assert out[b"batch_label"] == batch[b"batch_label"]
    assert out[b"labels"] == batch[b"labels"]
    assert out[b"filenames"] == batch[b"filenames"]
    assert out[b"data"].dtype == np.uint8
    np.testing.assert_array_equal(out[b"data"], batch[b"data"])

    text = safe_pickle.load(data, encoding="latin1")
    assert set(text) == {"batch_label", "labels", "data", "filenames"}
    np.testing.assert_array_equal(text["data"], batch[b"data"])


def test_numpy2_module_spelling_is_allowed_too():
    data = pickle.dumps(np.arange(4), protocol=2)
    assert "numpy._core.multiarray._reconstruct" in globals_in(data)  # numpy >= 2 writes this one
    np.testing.assert_array_equal(safe_pickle.load(data), np.arange(4))
