"""Per-thread scratch arrays of the CPU backend's performance kernels, kept between calls."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ._plumbing import FloatArray

__all__ = ["KEEP_BYTES", "thread_scratch"]

#: Largest scratch array kept by a thread between calls.
KEEP_BYTES = 32 << 20

_local = threading.local()


def thread_scratch(name: str, size: int, dtype: Any = np.float32) -> FloatArray:
    """An array of at least ``size`` elements owned by this thread (grown, never shrunk).

    Kept between calls, so that a convolution does not fault in fresh pages for its
    scratch each time; arrays above :data:`KEEP_BYTES` are allocated per call instead
    (their page faults cost little beside the work that needs them, and memory held
    for good stays bounded per thread and name).
    """
    if size * np.dtype(dtype).itemsize > KEEP_BYTES:
        return np.empty(size, dtype=dtype)
    buffers: dict[tuple[str, Any], FloatArray] | None = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    key = (name, np.dtype(dtype))
    buf = buffers.get(key)
    if buf is None or buf.size < size:
        buf = buffers[key] = np.empty(max(size, 1), dtype=dtype)
    return buf
