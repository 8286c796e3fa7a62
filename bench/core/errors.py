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



def require_package(module: str, package: str, purpose: str, install: str | None = None, otherwise: str = "") -> None:
    """Import ``module`` (of the optional ``package``, which ``purpose``, e.g. ``--log
    tensorboard``, needs), or raise a one-line ConfigError saying how to fix it: the package
    missing, how to install it (``install``: the pip requirement, default ``package``);
    installed but failing on import with any error (a broken or mismatched install, such as
    a tensorboard whose protobuf modules raise TypeError), that error and how to reinstall
    it.  ``otherwise``: what the user may do instead, appended."""
    import importlib

    try:
        importlib.import_module(module)
        return
    except ModuleNotFoundError as exc:
        if exc.name == package:
            raise ConfigError(f"{purpose} needs the optional {package} package: install it with "
                              f"`.venv/bin/python -m pip install {install or package}`{otherwise}") from None
        error = one_line(exc)
    except Exception as exc:  # noqa: BLE001  (whatever a broken install raises on import)
        error = one_line(exc)
    raise ConfigError(f"{purpose}: the {package} package is installed but fails on import ({error}); reinstall "
                      f"it with `.venv/bin/python -m pip install --force-reinstall {install or package}`{otherwise}")
