"""Compiled conversions between float32 and the 16-bit storage types (numba), on bit patterns.

NumPy converts float32 to float16 in software, element by element (several ns each),
and every float16 operation of the backend widens and narrows its operands, so these
conversions must run at memory speed. float16 goes through IEEE ``fptrunc`` /
``fpext``, which LLVM turns into the CPU's conversion instructions; bfloat16 through
integer operations on the bit patterns (selects only, vectorised). Rounding is to
nearest-even; values beyond the target's range become infinities; NaN stays NaN
(quiet, sign and high payload bits kept); subnormals are produced and read exactly.
Large outputs are written by whole streamed lines (:mod:`._kstream`), which skips
reading the destination before writing it.
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._kmath import _as_float, _as_int, _iand, _int32_op
from ._kstream import (
    line_phase,
    store_fence,
    stream_from_bfloat,
    stream_from_half,
    stream_to_bfloat,
    stream_to_half,
)
from ._nb import jit, wide_vectors

_iadd = _int32_op("add", "``a + b`` in int32.")
_ior = _int32_op("or_", "``a | b`` in int32.")
_isrl = _int32_op("lshr", "``a >> b`` (logical) in int32.")
_i32 = np.int32

__all__ = ["f32_to_f16", "f16_to_f32", "f32_to_bf16", "bf16_to_f32", "line_phase", "warm_up"]


_jit = jit


@intrinsic
def _to_half(typingctx: Any, x: Any) -> Any:
    """The float16 bits (uint16) of a float32 rounded to nearest-even: an IEEE ``fptrunc``.

    LLVM vectorises it into the CPU's conversion instruction (F16C ``vcvtps2ph``,
    AVX-512 FP16), which rounds by the default mode, keeps subnormal results and
    quiets NaN keeping its sign and high payload bits; elsewhere LLVM calls its
    runtime's exact conversion.
    """
    if x != types.float32:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@intrinsic
def _from_half(typingctx: Any, h: Any) -> Any:
    """The float32 of float16 bits (uint16), exactly: an IEEE ``fpext`` (``vcvtph2ps``)."""
    if h != types.uint16:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@_jit
def _plan(start: int, stop: int, phase: int, lanes: int) -> tuple[int, int]:
    """``[head, body)``: the whole streamed lines inside ``[start, stop)`` (none when ``phase < 0``).

    Element ``i`` starts a 64-byte line of the destination when ``i % lanes == phase``.
    """
    if phase < 0:
        return stop, stop
    head = min(stop, start + (phase - start) % lanes)
    return head, head + (stop - head) // lanes * lanes


@_jit
def _bfloat(x: Any) -> Any:
    """float32 bits (int32) -> bfloat16 bits, rounded to nearest-even, NaN quieted."""
    high = _isrl(x, 16)
    rounded = _isrl(_iadd(_iadd(x, 0x7FFF), _iand(high, 1)), 16)
    quiet = _ior(high, 0x40)
    return np.uint16(quiet if _iand(x, 0x7FFFFFFF) > 0x7F800000 else rounded)


@_jit
def f32_to_f16(src: Any, dst: Any, start: int, stop: int, phase: int) -> None:
    """float32 bits ``src`` (uint32) -> float16 bits ``dst`` (uint16) over ``[start, stop)``.

    Round to nearest-even. Whole destination lines are streamed from the element at
    ``phase`` (mod 32) on; ``phase = -1`` stores plainly (the output stays in cache).
    """
    wide_vectors()
    head, body = _plan(start, stop, phase, 32)
    for i in range(start, head):
        dst[i] = _to_half(_as_float(src[i]))
    for i in range(head, body, 32):
        stream_to_half(src, i, dst, i)
    for i in range(body, stop):
        dst[i] = _to_half(_as_float(src[i]))
    if body > head:
        store_fence()


@_jit
def f16_to_f32(src: Any, dst: Any, start: int, stop: int, phase: int) -> None:
    """float16 bits ``src`` (uint16) -> float32 bits ``dst`` (uint32), exactly (lines: mod 16)."""
    wide_vectors()
    head, body = _plan(start, stop, phase, 16)
    for i in range(start, head):
        dst[i] = np.uint32(_as_int(_from_half(src[i])))
    for i in range(head, body, 16):
        stream_from_half(src, i, dst, i)
    for i in range(body, stop):
        dst[i] = np.uint32(_as_int(_from_half(src[i])))
    if body > head:
        store_fence()


@_jit
def f32_to_bf16(src: Any, dst: Any, start: int, stop: int, phase: int) -> None:
    """float32 bits ``src`` (uint32) -> bfloat16 bits ``dst`` (uint16), nearest-even (lines: mod 32)."""
    wide_vectors()
    head, body = _plan(start, stop, phase, 32)
    for i in range(start, head):
        dst[i] = _bfloat(_i32(src[i]))
    for i in range(head, body, 32):
        stream_to_bfloat(src, i, dst, i)
    for i in range(body, stop):
        dst[i] = _bfloat(_i32(src[i]))
    if body > head:
        store_fence()


@_jit
def bf16_to_f32(src: Any, dst: Any, start: int, stop: int, phase: int) -> None:
    """bfloat16 bits ``src`` (uint16) -> float32 bits ``dst`` (uint32), exactly (lines: mod 16)."""
    wide_vectors()
    head, body = _plan(start, stop, phase, 16)
    for i in range(start, head):
        dst[i] = np.uint32(src[i]) << np.uint32(16)
    for i in range(head, body, 16):
        stream_from_bfloat(src, i, dst, i)
    for i in range(body, stop):
        dst[i] = np.uint32(src[i]) << np.uint32(16)
    if body > head:
        store_fence()


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel."""
    wide = np.zeros(100, dtype=np.uint32)
    narrow = np.zeros(100, dtype=np.uint16)
    f32_to_f16(wide, narrow, 1, 99, line_phase(narrow))
    f16_to_f32(narrow, wide, 1, 99, line_phase(wide))
    f32_to_bf16(wide, narrow, 1, 99, line_phase(narrow))
    bf16_to_f32(narrow, wide, 1, 99, line_phase(wide))
