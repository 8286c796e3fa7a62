"""Session-wide test settings and fixtures."""
import os
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n N (``make test``: two workers on two cores): each worker, and every process
    # a test starts, runs torch on one thread; two workers of two threads each would
    # oversubscribe the cores, and tiny models gain nothing from a second thread.
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def isolated_data_root(tmp_path_factory):
    """Generated data (the corruption cache) goes to a temporary data root, never to the
    user's ~/.cache/uqbench; subprocesses inherit it through the environment."""
    root = tmp_path_factory.mktemp("data_root")
    old = os.environ.get("UQBENCH_DATA_ROOT")
    os.environ["UQBENCH_DATA_ROOT"] = str(root)
    yield root
    if old is None:
        os.environ.pop("UQBENCH_DATA_ROOT", None)
    else:
        os.environ["UQBENCH_DATA_ROOT"] = old


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run fastest (and are immune to CPU contention) on one thread."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory) -> Path:
    """One real run of the tiny suite (``tests.helpers.suites.tiny_suite("hard")`` with seeds
    0 and 1: two msp cells) in a session-wide folder holding ``hard.toml``, ``results/hard``
    and ``reports/hard``; trained once per session.  Tests copy it before changing anything."""
    from bench.run.cli import main
    from tests.helpers.suites import tiny_suite

    root = tmp_path_factory.mktemp("tiny_store")
    (root / "hard.toml").write_text(tiny_suite("hard", seeds=(0, 1)))
    code = main(["--suite", str(root / "hard.toml"), "--results", str(root / "results"),
                 "--reports", str(root / "reports"), "--data-root", str(root / "data"), "--quiet"])
    assert code == 0
    return root
