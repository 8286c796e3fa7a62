"""The devices a test runs on, and the ``cuda`` mark.

Every check that needs CUDA carries the ``cuda`` mark (registered in ``pytest.ini``), so
``pytest -m cuda`` selects exactly the GPU checks (``benchmarks/gpu_acceptance.py`` runs
them first on a GPU machine); where no CUDA device is visible they are skipped with the
reason :data:`NO_CUDA`."""
from __future__ import annotations

import pytest
import torch

CUDA_OK = torch.cuda.is_available()
NO_CUDA = "needs a CUDA device (run on the GPU machine)"

def needs_cuda(test):
    """Decorator for a test that runs on CUDA only: the ``cuda`` mark, skipped without CUDA."""
    return pytest.mark.cuda(pytest.mark.skipif(not CUDA_OK, reason=NO_CUDA)(test))


def device_params(*, as_torch: bool = False) -> list:
    """``cpu`` and ``cuda`` for ``@pytest.mark.parametrize("device", ...)``: the ``cuda``
    case carries the ``cuda`` mark and is skipped without a CUDA device (``as_torch``:
    ``torch.device`` values instead of names)."""
    cpu, cuda = ("cpu", "cuda") if not as_torch else (torch.device("cpu"), torch.device("cuda"))
    return [pytest.param(cpu, id="cpu"),
            pytest.param(cuda, id="cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA_OK, reason=NO_CUDA)])]
