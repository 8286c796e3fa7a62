"""Data set families; importing this package registers every one of them in
``bench.core.registry.DATASETS``.

This top-level package is named ``datasets`` and so shadows the Hugging Face
``datasets`` package if both are installed: the suite does not use Hugging Face, is not
installed into site-packages, and runs from the repository root, where this package
comes first on ``sys.path``.
"""
from datasets import cifar, cola, embedded, imdb, rotten_tomatoes  # noqa: F401
