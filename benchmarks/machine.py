"""What machine a benchmark ran on, for the recorded outputs in reports/perf/."""
from __future__ import annotations

import os
import platform
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe() -> str:
    """``"<n> CPUs (<model>), <arch>; python <version>"``."""
    return f"{os.cpu_count()} CPUs ({cpu_model()}), {platform.machine()}; python {platform.python_version()}"


def provenance(script: str, extra: str = "") -> list[str]:
    """The closing lines of a recorded benchmark: the command, the machine, the date."""
    import time

    return [
        f"- command: `.venv/bin/python benchmarks/{script}` (repository root)",
        f"- machine: {describe()}{extra}",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
    ]


def run_section(script: str, argv: list[str] | None, device: str, wall_s: float, on_gpu: bool,
                versions: str = "") -> list[str]:
    """The closing "## Run" section of a benchmark that may run off this repository's venv
    (the GPU machines' ``python3``): the command as started (the interpreter relative to
    the repository when it lives there, else its name), the device, torch (and CUDA)
    versions plus ``versions`` (e.g. ", numpy 2.4.6"), the machine, the date, the wall time."""
    import time

    import torch

    exe = Path(sys.executable)
    exe_text = str(exe.relative_to(ROOT)) if exe.is_relative_to(ROOT) else exe.name  # .venv/bin/python, or python3
    cmd = f"{exe_text} benchmarks/{script}" + ("" if not argv else " " + shlex.join(argv))
    cuda = f", CUDA {torch.version.cuda}" if on_gpu else ""
    return [
        "",
        "## Run",
        "",
        f"- command: `{cmd}` (repository root)",
        f"- device: {device}",
        f"- torch {torch.__version__}{cuda}{versions}, python {platform.python_version()}",
        f"- machine: {describe()}",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- wall time of the whole benchmark: {wall_s:,.0f} s",
    ]
