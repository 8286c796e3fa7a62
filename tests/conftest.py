"""Session-wide test settings."""
import os

import pytest


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
