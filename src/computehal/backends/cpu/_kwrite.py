"""Streamed (non-temporal) output of the CPU backend's compiled memory-bound kernels (numba).

An ordinary store to a line that is not in cache first reads that line from memory
(read for ownership): a kernel that reads ``n`` bytes and writes ``n`` bytes then
moves ``3n``. Whole-line non-temporal stores (:func:`._kstream.stream_copy`) skip that
read. They only pay where the output is much larger than the caches (a small output is
better left in cache for its next reader), so every kernel using this takes a
``stream`` flag and its caller sets it from the size.

The pattern: :func:`stream_head` elements are computed straight into the output, up to
its first 64-byte aligned element; from there, blocks of :data:`BLOCK` elements are
computed into a small scratch block in L1 and copied out with :func:`stream_block`
(small blocks keep loads and streaming stores interleaved: long runs of either leave
the other's memory traffic idle). The kernel ends with :func:`._kstream.store_fence`.
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numpy as np

from ._kstream import store_fence, stream_copy
from ._nb import jit

__all__ = ["BLOCK", "stream_head", "stream_block", "store_fence", "warm_up"]

#: Elements per scratch block (1 KiB of float32: 16 lines).
BLOCK = 256


@jit
def stream_head(out: Any, stream: bool) -> int:
    """Elements of 1-D float32 ``out`` before its first 64-byte aligned one (all without ``stream``)."""
    n = out.shape[0]
    address = out.ctypes.data
    if not stream or address % 4 != 0:
        return n
    return min(n, ((64 - address % 64) % 64) // 4)


@jit
def stream_block(buf: Any, m: int, out: Any, at: int) -> None:
    """``out[at:at + m] = buf[:m]`` for float32, ``out[at]`` 64-byte aligned: whole lines streamed."""
    body = m // 16 * 16
    for i in range(0, body, 16):
        stream_copy(buf, i, out, at + i)
    for i in range(body, m):
        out[at + i] = buf[i]


def warm_up() -> None:
    """Compile (or load from numba's cache) the helpers."""
    a = np.zeros(64, dtype=np.float32)
    b = np.zeros(64, dtype=np.float32)
    at = stream_head(b, True)  # the streamed lines must start on a 64-byte boundary
    stream_block(a, 35, b, at)
