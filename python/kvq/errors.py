"""kvq's status codes (kvq/common.h) as Python exceptions carrying kvq's message."""
from __future__ import annotations

from typing import Dict, Type


class KvqError(Exception):
    """An error reported by libkvq (or by this package on its behalf).

    Attributes: ``status`` (the kvq_status number, stable; 0 when the error is this
    package's own) and ``message`` (kvq's one-line message, naming the file and the
    problem)."""

    status: int = 0

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        if status:
            self.status = status


class LibraryNotFoundError(KvqError, ImportError):
    """libkvq.so could not be loaded."""


class KvqIOError(KvqError, OSError):
    """KVQ_E_IO / NOT_FOUND / EXISTS (100-199)."""


class FormatError(KvqError, ValueError):
    """A corrupt or malformed file (KVQ_E_BAD_MAGIC ... KVQ_E_CORRUPT, 200-299)."""


class VersionError(KvqError):
    """KVQ_E_VERSION: an unknown or future format version."""


class UnsupportedError(KvqError):
    """KVQ_E_UNSUPPORTED: well-formed but not supported (dtype, architecture, ...)."""


class InvalidArgumentError(KvqError, ValueError):
    """KVQ_E_INVALID_ARG: a bad argument or parameter value."""


class MismatchError(KvqError, ValueError):
    """KVQ_E_MISMATCH: two inputs that must agree do not (model vs artifact)."""


class NumericError(KvqError, ArithmeticError):
    """KVQ_E_NUMERIC: NaN/Inf in data or a numeric failure."""


class KvqMemoryError(KvqError, MemoryError):
    """KVQ_E_NOMEM."""


class BackendError(KvqError):
    """KVQ_E_BACKEND / NO_DEVICE (700-799)."""


class CancelledError(KvqError):
    """KVQ_E_CANCELLED."""


_EXACT: Dict[int, Type[KvqError]] = {
    300: VersionError, 400: UnsupportedError, 500: InvalidArgumentError, 501: MismatchError,
    502: NumericError, 600: KvqMemoryError, 800: CancelledError,
}
_BLOCKS: Dict[int, Type[KvqError]] = {1: KvqIOError, 2: FormatError, 7: BackendError}


def error_for_status(status: int, message: str) -> KvqError:
    """The exception for a kvq_status (KvqError for an unknown one)."""
    cls = _EXACT.get(status) or _BLOCKS.get(status // 100) or KvqError
    return cls(message, status)
