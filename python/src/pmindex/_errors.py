"""Exceptions of pmindex, one per pmindex::Status code.

Each also derives from the built-in exception a Python programmer would catch
for it: NotFoundError is a KeyError, InvalidArgumentError a ValueError,
UnsupportedError a NotImplementedError, IOError and PoolFullError are OSErrors.
"""


class Error(Exception):
    """Base of every pmindex error; .code is the status name."""

    code = "Unknown"


class NotFoundError(Error, KeyError):
    code = "NotFound"


class AlreadyExistsError(Error):
    code = "AlreadyExists"


class InvalidArgumentError(Error, ValueError):
    code = "InvalidArgument"


class PoolFullError(Error, OSError):
    code = "PoolFull"


class CorruptError(Error):
    code = "Corrupt"


class UnsupportedError(Error, NotImplementedError):
    code = "Unsupported"


class IOError(Error, OSError):  # noqa: A001 - the status code's own name
    code = "IOError"


class BusyError(Error):
    code = "Busy"


_BY_CODE = {c.code: c for c in (NotFoundError, AlreadyExistsError, InvalidArgumentError, PoolFullError,
                                CorruptError, UnsupportedError, IOError, BusyError)}


def from_status(code, message):
    """The exception object for a failed status (called by the native layer)."""
    cls = _BY_CODE.get(code, Error)
    return cls(f"{code}: {message}" if message else code)
