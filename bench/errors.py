"""User-facing errors.

A :class:`ConfigError` means the *input* is wrong (unknown name, bad value, missing
data): the CLI prints its message and exits with status 2, without a traceback and
without writing anything.  Everything else is a bug or a run-time failure.
"""


class ConfigError(Exception):
    """Bad user input: the message names the problem and how to fix it."""


class NonFiniteLoss(RuntimeError):
    """Training produced a NaN/inf loss; the cell is marked ``failed``."""


def one_line(exc: BaseException) -> str:
    """An exception in one line: an OS error's text and path, else its type and the first
    line of its message."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
