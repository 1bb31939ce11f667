"""Compiled conversions between float32 and the 16-bit storage types (numba), on bit patterns.

NumPy converts float32 to float16 in software, element by element (several ns each),
and every float16 operation of the backend widens and narrows its operands, so these
conversions must run at memory speed. Each kernel works on the integer bit patterns
with selects only, so LLVM vectorises it. Rounding is to nearest-even; values beyond
the target's range become infinities; NaN stays NaN (quiet, sign and high payload bits
kept); float16 subnormals are produced and read exactly.
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numpy as np

from ._kmath import _as_float, _as_int, _iand, _int32_op, _isra, _isub
from ._nb import jit

_iadd = _int32_op("add", "``a + b`` in int32.")
_ior = _int32_op("or_", "``a | b`` in int32.")
_i32 = np.int32

__all__ = ["f32_to_f16", "f16_to_f32", "f32_to_bf16", "bf16_to_f32", "warm_up"]


_jit = jit


@_jit
def f32_to_f16(src: Any, dst: Any) -> None:
    """float32 bits ``src`` (uint32) -> float16 bits ``dst`` (uint16), round to nearest-even.

    All in int32 (numba would widen to int64, halving the vector width).
    """
    half = np.float32(0.5)
    for i in range(src.shape[0]):
        x = src[i]
        sign = _iand(_isra(x, 16), 0x8000)
        ax = _iand(x, 0x7FFFFFFF)
        # Normal results: rebias the exponent, round away 13 mantissa bits to even.
        v = _isub(ax, 0x38000000)
        normal = _isra(_iadd(_iadd(v, 0xFFF), _iand(_isra(v, 13), 1)), 13)
        # Subnormal results: adding 0.5 makes the FPU round at 2**-24, the half's last bit.
        tiny = _isub(_as_int(_as_float(ax) + half), 0x3F000000)
        nan = _ior(_iand(_isra(ax, 13), 0x3FF), 0x7E00)
        h = tiny if ax < 0x38800000 else normal
        h = _i32(0x7C00) if ax >= 0x477FF000 else h
        h = nan if ax > 0x7F800000 else h
        dst[i] = np.uint16(_ior(h, sign))


@_jit
def f16_to_f32(src: Any, dst: Any) -> None:
    """float16 bits ``src`` (uint16) -> float32 bits ``dst`` (uint32), exactly."""
    scale = np.float32(2.0**-24)
    for i in range(src.shape[0]):
        h = np.int64(src[i])
        sign = (h & 0x8000) << 16
        e = (h >> 10) & 0x1F
        m = h & 0x3FF
        normal = ((e + 112) << 23) | (m << 13)
        special = 0x7F800000 | (m << 13)
        tiny = np.int64(_as_int(np.float32(m) * scale))
        bits = normal if e != 0 else tiny
        bits = special if e == 31 else bits
        dst[i] = np.uint32(bits | sign)


@_jit
def f32_to_bf16(src: Any, dst: Any) -> None:
    """float32 bits ``src`` (uint32) -> bfloat16 bits ``dst`` (uint16), round to nearest-even."""
    for i in range(src.shape[0]):
        x = np.int64(src[i])
        rounded = (x + 0x7FFF + ((x >> 16) & 1)) >> 16
        quiet = (x >> 16) | 0x40
        dst[i] = np.uint16(quiet if (x & 0x7FFFFFFF) > 0x7F800000 else rounded)


@_jit
def bf16_to_f32(src: Any, dst: Any) -> None:
    """bfloat16 bits ``src`` (uint16) -> float32 bits ``dst`` (uint32), exactly."""
    for i in range(src.shape[0]):
        dst[i] = np.uint32(src[i]) << np.uint32(16)


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel."""
    wide = np.zeros(4, dtype=np.uint32)
    narrow = np.zeros(4, dtype=np.uint16)
    f32_to_f16(wide, narrow)
    f16_to_f32(narrow, wide)
    f32_to_bf16(wide, narrow)
    bf16_to_f32(narrow, wide)
