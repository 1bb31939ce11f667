"""The shared base of every memory-owning backend: lifecycle, pointer table, copies.

:class:`TableBackend` implements ``init`` / ``is_initialized`` / ``alloc`` / ``free``
/ ``copy_htod`` / ``copy_dtoh`` / ``close`` once, on top of four small hooks a
concrete backend provides (:meth:`_open`, :meth:`_allocate`, :meth:`_release`,
:meth:`_write`, :meth:`_read`). Operations get the validated
:class:`~computehal.memory.PointerTable` through :meth:`_memory`, which raises
:class:`~computehal.NotInitializedError` before ``init``.
"""

from __future__ import annotations

import abc
import functools
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from ..backend import ComputeBackend
from ..errors import (
    BackendError,
    DeviceError,
    InvalidArgumentError,
    NotInitializedError,
    OutOfMemoryError,
)
from ..memory import Allocation, PointerTable, Region, as_count
from ..types import TileShape
from ..validation import host_buffer

__all__ = ["TableBackend", "guarded"]

P = ParamSpec("P")
R = TypeVar("R")


def guarded(method: Callable[P, R]) -> Callable[P, R]:
    """Let only :class:`BackendError` escape ``method``.

    ``MemoryError`` becomes :class:`OutOfMemoryError`; any other unexpected
    exception becomes :class:`DeviceError` chained to the original, so a bug
    still shows its traceback but never breaks the error contract.
    """

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except BackendError:
            raise
        except MemoryError as exc:
            raise OutOfMemoryError() from exc
        except Exception as exc:  # noqa: BLE001 - the contract is "only BackendError escapes"
            raise DeviceError(f"{method.__name__} failed: {type(exc).__name__}: {exc}") from exc

    return wrapper


class TableBackend(ComputeBackend):
    """A backend whose allocations live in a :class:`PointerTable`.

    Thread-safe: the table has its own lock, and ``init`` / ``close`` serialise on
    the backend's lock.
    """

    def __init__(self) -> None:
        self._table = PointerTable()
        self._initialized = False
        self._lifecycle_lock = threading.Lock()

    # ------------------------------------------------------------------ hooks

    def _open(self) -> None:
        """Create contexts, queues and compile what is needed; called once by ``init``."""

    @abc.abstractmethod
    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        """Allocate ``nbytes`` bytes; return (64-byte-aligned base address, payload)."""

    @abc.abstractmethod
    def _release(self, allocation: Allocation) -> None:
        """Free the memory behind ``allocation`` (never called for borrowed ranges)."""

    @abc.abstractmethod
    def _write(self, region: Region, data: memoryview) -> None:
        """Copy ``data`` (``region.nbytes`` bytes) into device memory at ``region``."""

    @abc.abstractmethod
    def _read(self, region: Region, out: memoryview) -> None:
        """Copy ``region.nbytes`` bytes of device memory at ``region`` into ``out``."""

    # ------------------------------------------------------------------ lifecycle

    def init(self) -> None:
        with self._lifecycle_lock:
            if self._initialized:
                return
            try:
                self._open()
            except BackendError:
                raise
            except Exception as exc:
                raise DeviceError(f"{self.name()} backend failed to initialise: {exc}") from exc
            self._initialized = True

    def is_initialized(self) -> bool:
        return self._initialized

    def _memory(self) -> PointerTable:
        """The pointer table, after checking that the backend is initialised."""
        if not self._initialized:
            raise NotInitializedError()
        return self._table

    def close(self) -> None:
        """Free every allocation that is still live (borrowed ranges are only forgotten)."""
        for allocation in self._table.drain():
            if not allocation.borrowed:
                self._release(allocation)

    def recommended_tile_for(self, m: int, n: int, k: int) -> TileShape:
        """The default tile heuristic, after checking that the backend is initialised.

        A backend's tiles depend on the device that ``init`` selects, so, like every
        operation other than the introspection methods, this raises
        :class:`~computehal.NotInitializedError` before ``init``.
        """
        self._memory()
        return super().recommended_tile_for(m, n, k)

    def live_allocations(self) -> int:
        """Number of live allocations (owned and borrowed) on this backend."""
        return len(self._table)

    # ------------------------------------------------------------------ memory

    @guarded
    def alloc(self, bytes: int) -> int:
        table = self._memory()
        nbytes = as_count("bytes", bytes)
        if nbytes == 0:
            raise InvalidArgumentError("bytes must be >= 1 (alloc(0) is not allowed)")
        base, payload = self._allocate(nbytes)
        table.insert(Allocation(base, nbytes, payload))
        return base

    @guarded
    def free(self, ptr: int) -> None:
        allocation = self._memory().remove("ptr", ptr)
        if not allocation.borrowed:
            self._release(allocation)

    @guarded
    def copy_htod(self, dst: int, src: Any) -> None:
        table = self._memory()
        data = host_buffer("src", src, writable=False)
        region = table.resolve("dst", dst, data.nbytes)
        if data.nbytes:
            self._write(region, data)

    @guarded
    def copy_dtoh(self, dst: Any, src: int) -> None:
        table = self._memory()
        out = host_buffer("dst", dst, writable=True)
        region = table.resolve("src", src, out.nbytes)
        if out.nbytes:
            self._read(region, out)
