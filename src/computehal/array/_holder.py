"""Ownership of one allocation by a family of arrays, and how they learn it was freed.

Every :class:`~computehal.array.DeviceArray` references one :class:`Holder`, the single
owner of an allocation (or of a borrowed range). The holder frees it exactly once: when
the owning array's ``free()`` runs (directly or on leaving a ``with`` block), or when
the holder is garbage collected (a :func:`weakref.finalize`, never ``__del__``), which
happens once the owning array and every view of it are gone.

The holder also remembers the ``serial`` the backend gave the allocation
(:meth:`~computehal.ComputeBackend.allocation_of`). Asking again later tells whether
the allocation is still the one the arrays were made for: after ``backend.free(ptr)``
or ``backend.close()`` there is no allocation there, or a newer one with another
serial, and every array on the holder reports ``freed`` instead of touching it.
"""

from __future__ import annotations

import weakref
from typing import Any

from ..backend import ComputeBackend
from ..errors import BackendError, UnsupportedError

__all__ = ["Holder", "UNTRACKED", "serial_at"]

#: ``serial_at`` answer of a backend that cannot tell (no ``allocation_of``).
UNTRACKED = -1


def serial_at(backend: ComputeBackend, ptr: int) -> int | None:
    """The serial of the live allocation holding ``ptr``.

    Returns
    -------
    int or None
        The serial; None when no live allocation holds ``ptr`` (it was freed, or the
        backend is closed); :data:`UNTRACKED` when the backend cannot say.
    """
    try:
        info = backend.allocation_of(ptr)
    except UnsupportedError:
        return UNTRACKED
    except BackendError:
        return None  # closed (NotInitializedError) or a pointer it no longer knows
    return None if info is None else int(info.serial)


def _release(backend: ComputeBackend, base: int, serial: int | None, quiet: bool) -> None:
    """Free (or unregister) the allocation at ``base`` if it is still the one we own.

    If the backend now holds no allocation there, or another one (ours was released by
    ``backend.free`` or ``backend.close()`` and the address reused), nothing is freed.
    With ``quiet`` (garbage collection) a :class:`BackendError` is swallowed: the
    backend may be closed or gone already.
    """
    try:
        if serial != UNTRACKED and serial_at(backend, base) != serial:
            return
        backend.free(base)
    except BackendError:
        if not quiet:
            raise


class Holder:
    """Owns (or only watches) one allocation or borrowed range and frees an owned one exactly once.

    Parameters
    ----------
    backend : ComputeBackend
        The backend of the memory.
    base : int
        The pointer the family of arrays was made from (a base pointer when ``owned``).
    owned : bool
        Whether to free the memory when the holder is released or collected.
    keepalive : object, optional
        Anything that must outlive the arrays (the exporter of borrowed memory).
    """

    __slots__ = ("backend", "base", "owned", "keepalive", "serial", "_finalizer", "__weakref__")

    def __init__(self, backend: ComputeBackend, base: int, *, owned: bool, keepalive: Any = None) -> None:
        self.backend = backend
        self.base = base
        self.owned = owned
        self.keepalive = keepalive
        self.serial = serial_at(backend, base)
        self._finalizer: weakref.finalize[Any, Any] | None = None
        if owned:
            finalizer = weakref.finalize(self, _release, backend, base, self.serial, True)
            finalizer.atexit = False
            self._finalizer = finalizer

    @property
    def alive(self) -> bool:
        """False once the memory has been released: by this holder, ``backend.free`` or ``close()``."""
        if self._finalizer is not None and not self._finalizer.alive:
            return False
        if self.serial is None or self.serial == UNTRACKED:
            return True  # nothing to compare with: the backend cannot tell
        return serial_at(self.backend, self.base) == self.serial

    def release(self) -> None:
        """Free the allocation now (idempotent); errors of the backend propagate."""
        if self._finalizer is None:
            return
        detached = self._finalizer.detach()
        if detached is None:
            return
        _, _, args, _ = detached
        backend, base, serial, _quiet = args
        _release(backend, base, serial, False)
