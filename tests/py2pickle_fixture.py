"""Kept for the tests that import ``py2_dumps`` from here: the writer itself lives in
``benchmarks/synthetic_cifar.py`` (:class:`Py2Pickler`, :func:`py2_dumps`), shared by the
tests' fixtures and the synthetic-data benchmark, so that it exists once."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from synthetic_cifar import Py2Pickler, py2_dumps  # noqa: E402

__all__ = ["Py2Pickler", "py2_dumps"]
