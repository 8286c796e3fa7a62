"""Pickles encoded as the official CIFAR python files are (Python 2, pickle protocol 2).

The published ``cifar-10-batches-py`` and ``cifar-100-python`` files were written by Python
2: their byte strings are Python-2 ``str`` opcodes and their arrays name numpy 1's
``numpy.core.multiarray._reconstruct``.  :func:`py2_dumps` writes that encoding, for the
data this repository writes in the official format (``datasets/cifar10_subset.py``), the
synthetic files of ``benchmarks/synthetic_cifar.py`` and the tests' fixtures; they are read
back, like the real files, through :mod:`datasets.safe_pickle`.
"""
from __future__ import annotations

import io
import pickle
import struct


class Py2Pickler(pickle._Pickler):
    """Pickles as the official CIFAR files were written (Python 2, protocol 2).

    Byte strings, and ASCII text, become Python-2 ``str`` opcodes (``SHORT_BINSTRING`` /
    ``BINSTRING``), and numpy arrays refer to ``numpy.core.multiarray._reconstruct``,
    ``numpy.ndarray`` and ``numpy.dtype`` under numpy 1's module name, as in the published
    ``cifar-10-batches-py`` and ``cifar-100-python`` files.  A loader tested only on Python
    3's default pickles could accept those and still refuse the real files.
    """

    def __init__(self, f):
        super().__init__(f, protocol=2)
        self.dispatch = dict(pickle._Pickler.dispatch)
        self.dispatch[bytes] = Py2Pickler.save_py2_str
        self.dispatch[str] = Py2Pickler.save_text

    def save_py2_str(self, obj):
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    def save_text(self, obj):
        if obj.isascii():  # a Python-2 str; only unicode objects were written as unicode
            self.save_py2_str(obj.encode("ascii"))
        else:
            pickle._Pickler.save_str(self, obj)

    def save_global(self, obj, name=None):
        module = obj.__module__
        name = name or obj.__qualname__
        if module.startswith("numpy._core"):
            module = module.replace("numpy._core", "numpy.core")
        self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())
        self.memoize(obj)


def py2_dumps(obj) -> bytes:
    """``obj`` pickled as the official CIFAR files are (see :class:`Py2Pickler`)."""
    buf = io.BytesIO()
    Py2Pickler(buf).dump(obj)
    return buf.getvalue()
