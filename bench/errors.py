"""User-facing errors.

A :class:`ConfigError` means the *input* is wrong (unknown name, bad value, missing
data): the CLI prints its message and exits with status 2, without a traceback and
without writing anything.  Everything else is a bug or a run-time failure.
"""


class ConfigError(Exception):
    """Bad user input: the message names the problem and how to fix it."""


class NonFiniteLoss(RuntimeError):
    """Training produced a NaN/inf loss; the cell is marked ``failed``."""
