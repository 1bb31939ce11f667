"""Conversions between float16, bfloat16, float32 and float64, rounded to nearest-even.

NumPy converts between its own float types with one correct rounding (float64 to
float16 included); ml_dtypes gives bfloat16, but rounds float64 through float32 (two
roundings). :func:`convert` therefore narrows float64 to bfloat16 through a float32
rounded *to odd*, which carries enough bits for the second rounding to be the only
one that counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import validation as v
from ...dtypes import F32, F64, bfloat16
from ._plumbing import CpuPlumbing, FloatArray
from ._runtime import kernels, parallel_ranges
from ._strided import STREAM_MIN_BYTES

__all__ = ["CastOps", "convert"]

#: Elements converted per block by NumPy (each block's passes stay in cache).
CAST_BLOCK = 1 << 14


def _f32_round_to_odd(src: FloatArray) -> FloatArray:
    """float64 -> float32, rounded to odd: inexact results get an odd last bit."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = src.astype(F32)
        back = out.astype(F64)
    fix = (back != src) & ((out.view(np.int32) & 1) == 0) & ~np.isnan(src)
    if fix.any():
        toward = np.where(src[fix] > back[fix], np.float32(np.inf), np.float32(-np.inf))
        out[fix] = np.nextafter(out[fix], toward)
    return out


#: (source, target) pairs with a compiled kernel on bit patterns (attribute of :mod:`._kcast`).
_KERNELS = {
    (np.dtype(np.float32), np.dtype(np.float16)): "f32_to_f16",
    (np.dtype(np.float16), np.dtype(np.float32)): "f16_to_f32",
    (np.dtype(np.float32), bfloat16()): "f32_to_bf16",
    (bfloat16(), np.dtype(np.float32)): "bf16_to_f32",
}
_BITS: dict[int, np.dtype[Any]] = {2: np.dtype(np.uint16), 4: np.dtype(np.uint32)}


def _compiled(src: FloatArray, dst: FloatArray) -> Any:
    """The compiled kernel converting ``src`` into ``dst`` (1-D), or None."""
    name = _KERNELS.get((src.dtype, dst.dtype))
    if name is None or src.ndim != 1:
        return None
    compiled = kernels("_kcast")
    return None if compiled is None else getattr(compiled, name)


def convert(src: FloatArray, dst: FloatArray) -> None:
    """``dst[...] = src`` converted to ``dst.dtype`` with one round-to-nearest-even.

    Overflow gives infinities, NaN stays NaN. ``dst`` may be ``src`` (same itemsize).
    Between float32 and the 16-bit types of 1-D arrays, a compiled kernel does it.
    """
    kernel = _compiled(src, dst)
    if kernel is not None:
        n = src.shape[0]
        kernel(src.view(_BITS[src.dtype.itemsize]), dst.view(_BITS[dst.dtype.itemsize]), 0, n, -1)
        return
    with np.errstate(over="ignore", invalid="ignore"):
        if src.dtype == F64 and dst.dtype.itemsize == 2 and dst.dtype != np.float16:
            np.copyto(dst, _f32_round_to_odd(src), casting="unsafe")
        else:
            np.copyto(dst, src, casting="unsafe")


class CastOps(CpuPlumbing):
    """``cast``."""

    def _exec_cast(self, p: v.CastProblem) -> None:
        src = self._flat(p.input, p.dtype)[: p.n]
        dst = self._flat(p.output, p.out_dtype)[: p.n]
        kernel = _compiled(src, dst)
        if kernel is not None:
            # One call per thread; a large output is streamed past the caches.
            s_bits, d_bits = src.view(_BITS[src.dtype.itemsize]), dst.view(_BITS[dst.dtype.itemsize])
            phase = kernels("_kcast").line_phase(d_bits) if dst.nbytes >= STREAM_MIN_BYTES else -1
            parallel_ranges(p.n, lambda start, stop: kernel(s_bits, d_bits, start, stop, phase))
            return

        def run(start: int, stop: int) -> None:
            for lo in range(start, stop, CAST_BLOCK):
                hi = min(stop, lo + CAST_BLOCK)
                convert(src[lo:hi], dst[lo:hi])

        parallel_ranges(p.n, run)
