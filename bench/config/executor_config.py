"""The ``[executor]`` table of a suite and the ``--executor``/``--slurm-*`` flags: which
executor runs the cells and what each cell's SLURM job asks for.

Only the settings and their checks live here (:class:`ExecutorConfig`,
:func:`parse_executor`, :class:`SlurmOptions`, the sbatch option checks), so the suite
spec (:mod:`bench.config.spec`) can parse and validate them without the executors themselves
(:mod:`bench.run.executors`).  Each SLURM setting becomes one ``#SBATCH --name=value`` line of
the batch script, so a control character or an odd option name is refused here, before
any work.  Neither the table nor the flags enter a cell's key or the store: they decide
where a cell runs, not what it computes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from bench.core.errors import ConfigError
from bench.config.options import Problems, parse
from bench.core.registry import EXECUTORS


@dataclass
class SlurmOptions:
    """``--slurm-*`` flags: what each cell's job asks SLURM for."""

    partition: str | None = None
    gpus_per_cell: int = 1
    cpus_per_cell: int = 8
    mem_gb: float = 32.0
    time_min: int = 24 * 60
    array_limit: int = 64  # at most this many cells at once (sbatch --array=...%limit)
    extra: dict[str, str] = field(default_factory=dict)  # further sbatch options, e.g. {"account": "x"}

    def parameters(self) -> dict:
        """submitit ``update_parameters`` keywords for SLURM; a partition or extra option that
        would not stay on its own ``#SBATCH`` line (:func:`sbatch_option_problem`) is a
        ConfigError."""
        for key, value in self.extra.items():
            if problem := sbatch_option_problem(key, value):
                raise ConfigError(f"sbatch option {shown(key)}: {problem}")
        if problem := sbatch_text_problem(self.partition or ""):
            raise ConfigError(f"SLURM partition: {problem}")
        params = {"timeout_min": self.time_min, "slurm_array_parallelism": self.array_limit,
                  "gpus_per_node": self.gpus_per_cell, "cpus_per_task": self.cpus_per_cell,
                  "mem_gb": self.mem_gb, "tasks_per_node": 1, "nodes": 1}
        if self.partition:
            params["slurm_partition"] = self.partition
        if self.extra:
            params["slurm_additional_parameters"] = dict(self.extra)
        return params


def sbatch_option_name(key: str) -> str:
    """An extra sbatch option's name as submitit takes it: ``--mail-type`` -> ``mail_type``."""
    return key.strip().lstrip("-").replace("-", "_")


_SBATCH_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # an option name as sbatch_option_name leaves it


def shown(text: str) -> str:
    """``text`` as one line of a message: itself when printable, else its repr (``'a\\nb'``)."""
    return text if text.isprintable() else repr(text)


def sbatch_text_problem(text: str) -> str | None:
    """Why ``text`` cannot go into the batch script (None: it can).  Each SLURM setting
    becomes one line ``#SBATCH --name=value`` of the script: a newline (or any other
    control character) would begin a line of its own, a shell command."""
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is None:
        return None
    return (f"{text!r} contains the control character U+{ord(bad):04X}; each sbatch setting is one "
            "line of printable text in the batch script, so remove it")


def sbatch_option_problem(key: str, value: str) -> str | None:
    """Why the extra sbatch option ``key = value`` cannot be used (None: it can): a control
    character in either (:func:`sbatch_text_problem`), or a name unlike sbatch's option
    names (letters, digits, ``-``, ``_``)."""
    problem = sbatch_text_problem(key) or sbatch_text_problem(value)
    if problem is None and not _SBATCH_NAME.fullmatch(sbatch_option_name(key)):
        problem = (f"{key!r} is not an sbatch option name: letters, digits, '-' and '_', starting with a letter "
                   "(e.g. account, mail-type)")
    return problem


@dataclass(frozen=True)
class ExecutorConfig:
    """Where the cells run: a suite's ``[executor]`` table.  Each key stands for the flag
    named beside it, and a flag given on the command line wins over the key.  Example::

        [executor]
        kind = "slurm"
        partition = "gpu"
        time = 720             # minutes
        [executor.options]     # further sbatch options
        account = "myproject"
    """

    kind: str = "local"  # --executor: a name of bench.core.registry.EXECUTORS
    workers: int = field(default=2, metadata={"min": 1, "soft_max": 4096})  # --workers (CPU pool size)
    cells_per_gpu: int = field(default=1, metadata={"min": 1, "soft_max": 1024})  # --cells-per-gpu
    partition: str = ""  # --slurm-partition; "" = the cluster's default partition
    gpus: int = field(default=SlurmOptions.gpus_per_cell, metadata={"min": 0, "soft_max": 64})  # --slurm-gpus, per cell
    cpus: int = field(default=SlurmOptions.cpus_per_cell, metadata={"min": 1, "soft_max": 4096})  # --slurm-cpus, per cell
    mem_gb: float = field(default=SlurmOptions.mem_gb, metadata={"exclusive_min": 0.0, "soft_max": 1 << 16})  # --slurm-mem-gb
    time: int = field(default=SlurmOptions.time_min, metadata={"min": 1, "soft_max": 366 * 24 * 60})  # --slurm-time, minutes
    array_limit: int = field(default=SlurmOptions.array_limit, metadata={"min": 1, "soft_max": 1 << 20})  # --slurm-array-limit
    options: dict = field(default_factory=dict, hash=False)  # --slurm-option KEY=VALUE; name -> value (strings)

    def slurm_options(self) -> SlurmOptions:
        return SlurmOptions(self.partition or None, self.gpus, self.cpus, self.mem_gb, self.time, self.array_limit,
                            dict(self.options))


def parse_executor(table: object, path: str = "executor", problems: Problems | None = None) -> ExecutorConfig | None:
    """An ``[executor]`` table as an :class:`ExecutorConfig`; every problem is reported with
    its key path (``executor.workers``), like the rest of the suite.  Option names are
    normalised as ``--slurm-option`` does (``mail-type`` -> ``mail_type``), integer values
    become strings."""
    own = problems is None
    problems = Problems() if own else problems
    before = len(problems)
    if not isinstance(table, dict):
        problems.add(path, f"expected a table of executor settings (kind, workers, partition, ...), got {table!r}")
        table = None
    elif isinstance(table.get("time"), str):  # "24:00:00", sbatch's own notation
        problems.add(f"{path}.time", f"the time limit per cell in minutes, an integer (e.g. time = 1440 for "
                                     f"24 hours), got {table['time']!r}")
        table = {k: v for k, v in table.items() if k != "time"}
    if table is not None and isinstance(table.get("kind"), str):  # a name of the registry, told as its names are
        EXECUTORS.validate(table["kind"], f"{path}.kind", problems=problems)
    config = parse(ExecutorConfig, table, path, problems) if table is not None else None
    if config is not None:
        options = {}
        for key, value in config.options.items():
            sub = f"{path}.options.{shown(key)}"
            name = sbatch_option_name(key)
            if not name:
                problems.add(sub, "an sbatch option needs a name, e.g. account = \"myproject\"")
            elif isinstance(value, bool) or not isinstance(value, (str, int)):
                problems.add(sub, f"expected a string or an integer (the sbatch option's value), got {value!r}")
            elif problem := sbatch_option_problem(key, str(value)):
                problems.add(sub, problem)
            else:
                options[name] = str(value)
        if problem := sbatch_text_problem(config.partition):
            problems.add(f"{path}.partition", problem)
        config = replace(config, options=options)
    if own:
        problems.raise_if_any()
    return config if len(problems) == before else None
