"""Per-cell peak memory on CPU: the window restarts at every cell instead of growing
with the process's lifetime peak."""
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.cell import peak_memory_mb, reset_peak_memory

CPU = torch.device("cpu")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_peak_memory_window_restarts_at_each_cell():
    reset_peak_memory(CPU)
    big = np.ones(40_000_000)  # 320 MB, touched
    del big
    after_big = peak_memory_mb(CPU)
    reset_peak_memory(CPU)
    small = np.ones(2_000_000)  # 16 MB
    del small
    after_small = peak_memory_mb(CPU)
    assert after_big > 300
    assert after_small < after_big - 250  # the 320 MB peak is not carried into the next window
