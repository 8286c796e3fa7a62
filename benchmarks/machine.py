"""What machine a benchmark ran on, for the recorded outputs in reports/perf/."""
from __future__ import annotations

import os
import platform
from pathlib import Path


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
