"""What the tests share: the repository's paths, synthetic predictions and stores
(:mod:`.synthetic`), the tiny suite every end-to-end test runs (:mod:`.suites`) and
writers of data files in their official formats (:mod:`.official_files`).

The tests form a package (``tests``, mirroring ``bench/``, ``methods/``, ``datasets/``
and ``benchmarks/``), so a helper is imported as ``from tests.helpers.suites import ...``
from any folder, and test files of the same name may live in different folders."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root: the working directory of every ``run_suite.py`` subprocess."""

BENCHMARKS = REPO / "benchmarks"


def import_benchmarks() -> None:
    """Make the scripts of ``benchmarks/`` importable by their file names (they are no
    package: each runs as ``python benchmarks/NAME.py``)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
