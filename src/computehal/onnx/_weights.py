"""Weights on the device, uploaded once per session and backend, shared by every plan.

A plan is made per set of input shapes; the constants it reads are mostly the model's own
initializers, which do not change between plans. They are keyed by name (the model's
load-time constants) or, for constants a specialisation computed (a slice of a position
table for one sequence length), by content; each key is uploaded once per backend,
frozen (``ComputeBackend.freeze``: read-only, so the backend may keep data derived from
it, such as transformed convolution filters) and freed when the session closes.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from ..backend import ComputeBackend
from ..errors import UnsupportedError
from ._tensors import Storage

__all__ = ["WeightStore", "content_key"]


def content_key(array: np.ndarray) -> str:
    """A key naming an array by its dtype, shape and bytes."""
    data = np.ascontiguousarray(array)
    digest = hashlib.blake2b(data.reshape(-1).view(np.uint8).data, digest_size=16).hexdigest()
    return f"content:{data.dtype.str}:{data.shape}:{digest}"


def _freeze(backend: ComputeBackend, ptr: int) -> None:
    """Freeze a weight's allocation where the backend can (it may then keep derived data)."""
    try:
        backend.freeze(ptr)
    except UnsupportedError:
        pass


class WeightStore:
    """Device copies of weights, per backend, keyed by :attr:`Storage.key`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._copies: dict[int, tuple[ComputeBackend, dict[str, tuple[int, int]]]] = {}

    def address(self, backend: ComputeBackend, storage: Storage) -> int:
        """The device address of ``storage``'s data on ``backend`` (uploaded on first use)."""
        assert storage.data is not None and storage.key is not None
        with self._lock:
            _, table = self._copies.setdefault(id(backend), (backend, {}))
            found = table.get(storage.key)
            if found is None:
                data = np.ascontiguousarray(storage.data)
                ptr = backend.alloc(max(1, data.nbytes))
                if data.nbytes:
                    backend.copy_htod(ptr, data.reshape(-1).view(np.uint8))
                _freeze(backend, ptr)
                found = table[storage.key] = (ptr, data.nbytes)
            return found[0]

    def nbytes(self, backend: ComputeBackend) -> int:
        """Bytes of weights held on ``backend``."""
        with self._lock:
            entry = self._copies.get(id(backend))
            return sum(n for _, n in entry[1].values()) if entry else 0

    def close(self) -> None:
        """Free every device copy."""
        with self._lock:
            for backend, table in self._copies.values():
                for ptr, _ in table.values():
                    try:
                        backend.free(ptr)
                    except Exception:  # noqa: BLE001 - the backend may already be closed
                        pass
            self._copies.clear()
