"""The exceptions isotrope raises on purpose, in one place.

Every one derives from :class:`IsotropeError`, so a library user can catch them all::

    from isotrope.errors import IsotropeError, EncoderMismatchError

    try:
        collection = Collection.open("faiss:store", encoder=encoder)
    except EncoderMismatchError as error:
        ...

Each also keeps the built-in base it always had (``ValueError``, ``RuntimeError``,
``FileNotFoundError``), so existing ``except ValueError`` clauses still catch it. Messages are
one line naming what is wrong (file, line, id, field); :func:`one_line` is how the command line
prints any error. This module imports nothing from isotrope: every other module may import it.
"""

from __future__ import annotations


class IsotropeError(Exception):
    """Base class of the errors isotrope raises on purpose."""


# ----------------------------------------------------------------------------- stores


class StoreFormatError(IsotropeError, ValueError):
    """A path does not hold a valid store of the expected kind, or mismatches its arguments."""


class StoreLockedError(IsotropeError, RuntimeError):
    """Another process is writing to the store."""


class ReshapeInProgressError(IsotropeError, RuntimeError):
    """The store is being reshaped by another process (or another handle in this one)."""


class StoreCapabilityError(IsotropeError, ValueError):
    """A store was asked for something it does not do (e.g. raw vectors from a store that keeps none)."""


# ----------------------------------------------------------------------------- encoders


class NotFittedError(IsotropeError, RuntimeError):
    """A transform (or encoder) is used before it was fitted."""


class ConfigError(IsotropeError, ValueError):
    """An encoder recipe (``EncoderConfig``) with an unknown or ill-typed field; ``field`` names it."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class EncoderFormatError(IsotropeError, ValueError):
    """A saved encoder that cannot be read: corrupt, incomplete or of another format version."""


class EncoderMismatchError(IsotropeError, ValueError):
    """A store opened with an encoder other than the one that wrote it."""


class EncoderMissingError(IsotropeError, FileNotFoundError):
    """A store folder holds vectors but not the encoder that shaped them."""


class BackendMismatchError(IsotropeError, ValueError):
    """A store's vectors and the query/append vectors come from incompatible numeric classes."""


class FoldError(IsotropeError, ValueError):
    """An encoder whose chain cannot be folded into one table."""


# ----------------------------------------------------------------------------- data


class DataFormatError(IsotropeError, ValueError):
    """A data file does not have the expected layout (the message names file and line)."""


#: built-in errors whose message is written for a user (bad input, missing file, missing extra)
_USER_FACING = (ValueError, TypeError, KeyError, OSError, ImportError, RuntimeError)


def one_line(error: BaseException) -> str:
    """The one line the command line prints for ``error`` (after ``error: ``).

    An isotrope error, or a built-in one raised on bad input, prints its message; a ``KeyError``
    its message without the quotes ``str`` adds; an OS error its reason and file; anything else
    (a bug or a library's internal error) its type before the message, so it can be reported.
    Several lines are joined by ``" | "``.
    """
    if isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], str):
        message = error.args[0]
    elif isinstance(error, OSError) and error.strerror and error.filename is not None and not isinstance(error, IsotropeError):
        message = f"{error.strerror}: {error.filename}"
    else:
        message = str(error)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    message = " | ".join(lines)
    if not isinstance(error, (IsotropeError, *_USER_FACING)) or not message:
        message = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return message


__all__ = [
    "BackendMismatchError",
    "DataFormatError",
    "EncoderFormatError",
    "EncoderMismatchError",
    "EncoderMissingError",
    "FoldError",
    "IsotropeError",
    "NotFittedError",
    "ReshapeInProgressError",
    "StoreCapabilityError",
    "StoreFormatError",
    "StoreLockedError",
    "one_line",
]
