"""Transformed Winograd filters kept between forward convolutions, checked byte for byte.

A filter is a weight: inference and the benchmark convolve with the same one call after
call, and its Winograd transform ``U`` ((tile + 2)^2 C K floats) then costs a sizeable
part of each call (ResNet-50's 512-channel 3x3 layer at batch 8, F(4x4, 3x3), one core:
35.9 ms with the transform, 19.8 ms without; im2col 25.9 ms).

No write to device memory is tracked (host views, borrowed memory and DLPack exports
can change a filter behind the backend's back), so an entry is never trusted by its
address: it holds a copy of the filter's bytes, and :func:`lookup` hands ``U`` out only
after comparing the filter with that copy (``memcmp``, a read of twice the filter,
about a twentieth of the transform's cost). Whatever happened to the memory in between
(written, freed, reallocated), ``U`` is used only for exactly the filter it was made
from.

A filter is stored only when it has been seen unchanged before (the same address,
shape and a sample of its values on the previous call, :func:`seen_before`), so a
training loop, whose filters change every step, pays a sample and an early-exit
comparison per call rather than a copy of every filter. Entries live in one process-wide
LRU table of at most :data:`CACHE_BYTES`.

A filter in a frozen allocation (``ComputeBackend.freeze``: no operation may write it
any more) is different: its bytes cannot change, so its ``U`` is kept at once, under
the allocation's serial (unique in the process, never reused) and the filter's offset
and shape, with no copy of the filter and no comparison. ResNet-50 at batch 1 through
the ONNX runner, which freezes its weights, took 0.966 of the time without the
comparisons (paired runs in one process): the 256-channel layers' filters and their
copies were read from memory on every call.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # (the CPU backend's plumbing imports this module: no cycle at run time)
    from ._plumbing import FloatArray

__all__ = ["CACHE_BYTES", "clear", "forget_frozen", "lookup", "seen_before", "store"]

#: Most bytes of filter copies and transformed filters held (ResNet-50's 3x3 layers at
#: F(4x4, 3x3) take about 230 MB).
CACHE_BYTES = 256 << 20
#: Values of a filter sampled to tell a filter seen on the previous call.
SAMPLES = 64

Key = tuple[int, tuple[int, ...], str, int]
#: A frozen filter: (allocation serial, byte offset in it), as the backend knows them.
Frozen = tuple[int, int]

_lock = threading.Lock()
_entries: OrderedDict[Any, tuple[FloatArray | None, FloatArray]] = OrderedDict()
_samples: OrderedDict[Key, bytes] = OrderedDict()
_held = [0]
_memcmp = ctypes.CDLL(None).memcmp
_memcmp.restype = ctypes.c_int
_memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]


def _key(f: FloatArray, tile: int, frozen: Frozen | None = None) -> Any:
    return (f.ctypes.data if frozen is None else frozen, f.shape, f.dtype.str, tile)


def _sample(f: FloatArray) -> bytes:
    flat = f.reshape(-1)
    return flat[:: max(1, flat.size // SAMPLES)].tobytes()


def lookup(f: FloatArray, tile: int, frozen: Frozen | None = None) -> FloatArray | None:
    """The stored ``U`` of filter ``f`` (C-contiguous) for ``tile``, if ``f`` holds exactly its bytes.

    ``frozen``: where ``f`` lies when its allocation is frozen (its bytes then need no check).
    """
    key = _key(f, tile, frozen)
    with _lock:
        entry = _entries.get(key)
        if entry is not None:
            _entries.move_to_end(key)
    if entry is None:
        return None
    copy, u = entry
    if copy is not None and _memcmp(copy.ctypes.data, f.ctypes.data, f.nbytes) != 0:
        return None
    return u


def seen_before(f: FloatArray, tile: int) -> bool:
    """True when ``f`` looked the same (address, shape, sampled values) on the previous call."""
    key, sample = _key(f, tile), _sample(f)
    with _lock:
        before = _samples.get(key)
        _samples[key] = sample
        _samples.move_to_end(key)
        while len(_samples) > 4096:
            _samples.popitem(last=False)
    return before == sample


def store(f: FloatArray, tile: int, u: FloatArray, frozen: Frozen | None = None) -> None:
    """Keep ``u`` (not to be written afterwards) as the transform of ``f``'s current bytes.

    ``frozen`` as for :func:`lookup`: then no copy of ``f`` is kept.
    """
    size = u.nbytes + (0 if frozen is not None else f.nbytes)
    if size > CACHE_BYTES:
        return
    entry = (None if frozen is not None else np.array(f, copy=True), u)
    key = _key(f, tile, frozen)
    with _lock:
        old = _entries.pop(key, None)
        if old is not None:
            _held[0] -= (0 if old[0] is None else old[0].nbytes) + old[1].nbytes
        _entries[key] = entry
        _held[0] += size
        while _held[0] > CACHE_BYTES:
            _, (copy, u_old) = _entries.popitem(last=False)
            _held[0] -= (0 if copy is None else copy.nbytes) + u_old.nbytes


def forget_frozen(serial: int) -> None:
    """Drop the entries of filters in the frozen allocation ``serial`` (it is being released)."""
    with _lock:
        for key in [key for key in _entries if isinstance(key[0], tuple) and key[0][0] == serial]:
            copy, u = _entries.pop(key)
            _held[0] -= (0 if copy is None else copy.nbytes) + u.nbytes


def clear() -> None:
    """Drop every entry (tests; a process that wants the memory back)."""
    with _lock:
        _entries.clear()
        _samples.clear()
        _held[0] = 0
