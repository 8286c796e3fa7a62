"""A restricted unpickler for data files that are pickles of numpy arrays.

Unpickling runs code: a pickle names any importable callable (``os.system``,
``builtins.eval``, ...) and the stock unpickler imports and calls it.  Some data sets
exist only as pickles (Animal-MNIST inside its wheel, the official CIFAR-10/100 python
batches), so they are read here, where a global is resolved only if it is on an
allow-list; anything else raises :class:`pickle.UnpicklingError` naming the refused
global, before its module is even imported (importing also runs code).

The allow-lists, as ``(module, name)`` pairs written in the pickle:

* :data:`NUMPY_RECONSTRUCT`: ``_reconstruct``, ``ndarray`` and ``dtype``, under both
  spellings of numpy's core module (``numpy.core`` before numpy 2, ``numpy._core`` since;
  a pickle keeps the spelling of the numpy that wrote it).  Exactly what the official
  CIFAR files (Python 2, protocol 2) and protocol-3/4 pickles of arrays use.
* :data:`NUMPY_FROMBUFFER`: ``_frombuffer``, which numpy uses for protocol-5 pickles.
* :data:`PY3_PROTOCOL2_BYTES`: Python 3 writes ``bytes`` into protocol 0-2 pickles as
  ``_codecs.encode(text, "latin1")`` (``bytes()`` when empty); these resolve to stand-ins
  that accept only that form, not to the real functions.
* :data:`NUMPY_SCALAR`: numpy scalars; not allowed by default.

:data:`DEFAULT_ALLOWED` is the first three: any numpy array pickled by any protocol.
"""
from __future__ import annotations

import importlib
import io
import pickle
from typing import Any, BinaryIO, Callable

Global = tuple[str, str]  # (module, qualified name), as written in the pickle

NUMPY_RECONSTRUCT: frozenset[Global] = frozenset(
    {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }
)
NUMPY_FROMBUFFER: frozenset[Global] = frozenset(
    {("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer")}
)
PY3_PROTOCOL2_BYTES: frozenset[Global] = frozenset(
    {("_codecs", "encode"), ("__builtin__", "bytes"), ("builtins", "bytes")}
)
NUMPY_SCALAR: frozenset[Global] = frozenset(
    {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}
)
DEFAULT_ALLOWED: frozenset[Global] = NUMPY_RECONSTRUCT | NUMPY_FROMBUFFER | PY3_PROTOCOL2_BYTES


def _latin1_encode(text: object, encoding: object) -> bytes:
    """Stand-in for ``_codecs.encode`` that does only what pickle uses it for."""
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError(
            f"_codecs.encode is allowed only as encode(str, 'latin1'), got encoding {encoding!r}"
        )
    return text.encode("latin1")


def _empty_bytes(*args: object) -> bytes:
    """Stand-in for ``bytes``: pickle calls it with no arguments for ``b""``."""
    if args:
        raise pickle.UnpicklingError("bytes(...) is allowed only without arguments")
    return b""


_STAND_INS: dict[Global, Callable[..., bytes]] = {
    ("_codecs", "encode"): _latin1_encode,
    ("__builtin__", "bytes"): _empty_bytes,
    ("builtins", "bytes"): _empty_bytes,
}


def _module_candidates(module: str) -> list[str]:
    """Where to import ``module`` from.  numpy 2 renamed ``numpy.core`` to ``numpy._core``
    and keeps the old name as a deprecated alias (importing it warns), so the current
    name is tried first; numpy 1 has only ``numpy.core``."""
    if module == "numpy.core" or module.startswith("numpy.core."):
        return ["numpy._core" + module[len("numpy.core"):], module]
    if module == "numpy._core" or module.startswith("numpy._core."):
        return [module, "numpy.core" + module[len("numpy._core"):]]
    return [module]


def _resolve(module: str, name: str) -> Any:
    for candidate in _module_candidates(module):
        try:
            obj: Any = importlib.import_module(candidate)
            for part in name.split("."):
                obj = getattr(obj, part)
            return obj
        except (ImportError, AttributeError):
            continue
    raise pickle.UnpicklingError(f"allowed global {module}.{name} cannot be found in this environment")


class _ArrayBudget:
    """Refuses numpy arrays larger than the pickle itself: a pickle holds its arrays' bytes,
    so an array that declares more (e.g. ``ndarray((1000000, 3072), 'B')`` in 82 bytes)
    would only allocate memory from nothing."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget

    def check(self, shape: object, dtype: object) -> None:
        import numpy as np

        try:
            dims = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
            itemsize = np.dtype(dtype).itemsize
        except (TypeError, ValueError) as exc:
            raise pickle.UnpicklingError(f"pickle declares an array with an unusable shape or dtype ({exc})") from None
        if any(d < 0 for d in dims):
            raise pickle.UnpicklingError(f"pickle declares an array of negative shape {dims}")
        nbytes = int(np.prod(dims, dtype=object)) * itemsize
        if self.budget is not None and nbytes > max(self.budget, 1 << 16):
            raise pickle.UnpicklingError(
                f"pickle declares an array of shape {dims} ({nbytes:,} bytes), more than the file's "
                f"{self.budget:,} bytes can hold; refusing to allocate it (damaged or malicious file)"
            )

    def ndarray(self, shape: object = (0,), dtype: object = float, *args: object, **kwargs: object) -> Any:
        import numpy as np

        self.check(shape, dtype)
        return np.ndarray(shape, dtype, *args, **kwargs)

    def reconstruct(self, subtype: object, shape: object, dtype: object) -> Any:
        import numpy as np

        if subtype != self.ndarray and subtype is not np.ndarray:
            raise pickle.UnpicklingError("numpy _reconstruct is allowed only for numpy.ndarray")
        self.check(shape, dtype)
        return _resolve("numpy._core.multiarray", "_reconstruct")(np.ndarray, shape, dtype)


class RestrictedUnpickler(pickle.Unpickler):
    """An :class:`pickle.Unpickler` that resolves only the globals in ``allowed``, and
    bounds the arrays a pickle may declare by ``budget`` bytes (its own size)."""

    def __init__(self, file: BinaryIO, *, encoding: str = "bytes", allowed: frozenset[Global] = DEFAULT_ALLOWED,
                 budget: int | None = None):
        super().__init__(file, encoding=encoding)
        self.allowed = frozenset(allowed)
        self.arrays = _ArrayBudget(budget)

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.allowed:
            allowed = ", ".join(f"{m}.{n}" for m, n in sorted(self.allowed)) or "none"
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name} from a pickle (pickles can run code); "
                f"allowed globals: {allowed}"
            )
        if (module, name) in _STAND_INS:
            return _STAND_INS[(module, name)]
        if (module, name) == ("numpy", "ndarray"):
            return self.arrays.ndarray
        if name == "_reconstruct":
            return self.arrays.reconstruct
        return _resolve(module, name)


def load(
    fileobj_or_bytes: BinaryIO | bytes | bytearray | memoryview,
    *,
    encoding: str = "bytes",
    allowed: frozenset[Global] = DEFAULT_ALLOWED,
) -> Any:
    """Unpickle one object, resolving only ``allowed`` globals.

    ``encoding`` applies to Python-2 ``str`` opcodes, as in :func:`pickle.load`:
    ``"bytes"`` keeps them as bytes (the official CIFAR dictionaries then have keys such as
    ``b"data"``), ``"latin1"`` decodes them.
    """
    if isinstance(fileobj_or_bytes, (bytes, bytearray, memoryview)):
        fileobj_or_bytes = io.BytesIO(fileobj_or_bytes)
    return RestrictedUnpickler(fileobj_or_bytes, encoding=encoding, allowed=allowed,
                               budget=_size(fileobj_or_bytes)).load()


def _size(f: BinaryIO) -> int | None:
    """Bytes from the current position to the end of ``f`` (None if it cannot seek)."""
    try:
        here = f.tell()
        end = f.seek(0, io.SEEK_END)
        f.seek(here)
        return end - here
    except (OSError, AttributeError, ValueError):
        return None
