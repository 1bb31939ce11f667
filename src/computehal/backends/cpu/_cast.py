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
from ...dtypes import F32, F64
from ._plumbing import CpuPlumbing, FloatArray
from ._runtime import parallel_ranges

__all__ = ["CastOps", "convert", "rounded_scalar"]

#: Elements converted per block (each block's passes stay in cache).
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


def convert(src: FloatArray, dst: FloatArray) -> None:
    """``dst[...] = src`` converted to ``dst.dtype`` with one round-to-nearest-even.

    Overflow gives infinities, NaN stays NaN. ``dst`` may be ``src`` (same itemsize).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        if src.dtype == F64 and dst.dtype.itemsize == 2 and dst.dtype != np.float16:
            np.copyto(dst, _f32_round_to_odd(src), casting="unsafe")
        else:
            np.copyto(dst, src, casting="unsafe")


def rounded_scalar(value: float, dtype: np.dtype[Any]) -> Any:
    """``value`` rounded once to ``dtype`` (a 0-d array)."""
    out = np.empty((), dtype=dtype)
    convert(np.asarray(value, dtype=F64), out)
    return out


class CastOps(CpuPlumbing):
    """``cast``."""

    def _exec_cast(self, p: v.CastProblem) -> None:
        src = self._flat(p.input, p.dtype)[: p.n]
        dst = self._flat(p.output, p.out_dtype)[: p.n]

        def run(start: int, stop: int) -> None:
            for lo in range(start, stop, CAST_BLOCK):
                hi = min(stop, lo + CAST_BLOCK)
                convert(src[lo:hi], dst[lo:hi])

        parallel_ranges(p.n, run)
