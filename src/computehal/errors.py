"""The error hierarchy of computehal.

Every backend method raises only :class:`BackendError` subclasses, whatever the
argument values. The ``str()`` of each class matches the Display text of the
original Rust ``BackendError`` enum.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "UnsupportedError",
    "DeviceError",
    "InvalidArgumentError",
    "OutOfMemoryError",
    "NotInitializedError",
]


class BackendError(Exception):
    """Base class of every error a :class:`~computehal.ComputeBackend` raises."""


class _MessageError(BackendError):
    """An error carrying a message ``msg``; ``str()`` is ``"<PREFIX>: <msg>"``."""

    PREFIX = ""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.msg = msg

    def __str__(self) -> str:
        return f"{self.PREFIX}: {self.msg}"


class UnsupportedError(_MessageError):
    """The backend cannot perform this operation or data type at all.

    ``str()`` is ``"unsupported operation: <msg>"``.
    """

    PREFIX = "unsupported operation"


class DeviceError(_MessageError):
    """The device or its driver reported a failure.

    ``str()`` is ``"device error: <msg>"``.
    """

    PREFIX = "device error"


class InvalidArgumentError(_MessageError, ValueError):
    """An argument is out of range, inconsistent, or names invalid memory.

    ``str()`` is ``"invalid argument: <msg>"``.
    """

    PREFIX = "invalid argument"


class OutOfMemoryError(BackendError, MemoryError):
    """An allocation could not be satisfied.

    ``str()`` is ``"out of device memory"``, followed by the requested and free
    byte counts where the backend knows them.
    """

    def __init__(self, requested: int | None = None, available: int | None = None) -> None:
        super().__init__(requested, available)
        self.requested = requested
        self.available = available

    def __str__(self) -> str:
        text = "out of device memory"
        details = []
        if self.requested is not None:
            details.append(f"requested {self.requested} bytes")
        if self.available is not None:
            details.append(f"{self.available} bytes free")
        if details:
            text += " (" + ", ".join(details) + ")"
        return text


class NotInitializedError(BackendError, RuntimeError):
    """An operation was called before :meth:`~computehal.ComputeBackend.init`.

    ``str()`` is ``"backend not initialized"``.
    """

    def __init__(self) -> None:
        super().__init__()

    def __str__(self) -> str:
        return "backend not initialized"
