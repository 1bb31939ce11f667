"""Non-temporal stores of whole cache lines for the CPU backend's compiled kernels (numba).

A plain store first reads the destination's cache line (read-for-ownership), so a
kernel writing a large output moves each output byte twice. A non-temporal store of a
whole, aligned 64-byte line skips that read and bypasses the caches. These intrinsics
each produce one destination line from a run of source elements:

* :func:`stream_copy`: 64 bytes copied (or a 64-byte pattern repeated, ``s_off`` fixed);
* :func:`stream_to_half`, :func:`stream_from_half`: float32 <-> float16, IEEE
  ``fptrunc`` / ``fpext`` (the CPU's conversion instructions: round to nearest-even,
  subnormals kept, NaN quieted with its sign and high payload bits);
* :func:`stream_to_bfloat`, :func:`stream_from_bfloat`: float32 <-> bfloat16 on bit
  patterns (round to nearest-even, NaN quieted; no flush of subnormals, unlike the
  CPU's own bfloat16 conversion);
* :func:`transpose16_stream`: a 16 x 16 block of 32-bit elements transposed in
  registers, each destination row one line;
* :func:`store_fence`: orders the streamed lines before the kernel returns (other
  threads then read them through the usual synchronisation).

The destination offset of every line store must be 64-byte aligned (the caller peels
the unaligned head and tail with plain stores); sources may be unaligned.
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = [
    "LINE",
    "line_phase",
    "stream_copy",
    "stream_to_half",
    "stream_from_half",
    "stream_to_bfloat",
    "stream_from_bfloat",
    "transpose16_stream",
    "store_fence",
]

#: Bytes per streamed line.
LINE = 64


def line_phase(array: Any) -> int:
    """The first index of 1-D ``array`` whose element starts a 64-byte line, or -1 if none can."""
    address, size = array.ctypes.data, array.dtype.itemsize
    gap = -address % LINE
    return -1 if gap % size else gap // size


_I16, _I32 = ir.IntType(16), ir.IntType(32)


def _vector(element: Any, lanes: int) -> ir.VectorType:
    return ir.VectorType(element, lanes)


def _splat(value: int, lanes: int) -> ir.Constant:
    return ir.Constant(_vector(_I32, lanes), [value] * lanes)


def _store_line(builder: Any, value: Any, address: Any) -> None:
    line = builder.bitcast(value, _vector(_I32, 16))
    store = builder.store(line, builder.bitcast(address, line.type.as_pointer()), align=LINE)
    store.set_metadata("nontemporal", builder.module.add_metadata([_I32(1)]))


def _line_intrinsic(
    element: Any, lanes: int, transform: Callable[[Any, Any], Any], src_bits: int, dst_bits: int
) -> Any:
    """An intrinsic ``f(src, s_off, dst, d_off)``: ``lanes`` source elements -> one streamed line.

    ``element`` is the LLVM type the source run is loaded as; ``src`` / ``dst`` are 1-D
    unsigned-integer arrays of ``src_bits`` / ``dst_bits`` bits.
    """

    def typer(typingctx: Any, src: Any, s_off: Any, dst: Any, d_off: Any) -> Any:
        arrays = ((src, src_bits), (dst, dst_bits))
        if not all(isinstance(a, types.Array) and a.ndim == 1 and a.dtype.bitwidth == b for a, b in arrays):
            return None
        if not all(isinstance(o, types.Integer) for o in (s_off, d_off)):
            return None
        sig = types.void(src, s_off, dst, d_off)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            source = context.make_array(signature.args[0])(context, builder, args[0])
            target = context.make_array(signature.args[2])(context, builder, args[2])
            so = context.cast(builder, args[1], signature.args[1], types.intp)
            do = context.cast(builder, args[3], signature.args[3], types.intp)
            at = builder.bitcast(builder.gep(source.data, [so]), _vector(element, lanes).as_pointer())
            values = builder.load(at, align=src_bits // 8)
            _store_line(builder, transform(builder, values), builder.gep(target.data, [do]))
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(typer)


def _to_half(builder: Any, v: Any) -> Any:
    return builder.fptrunc(builder.bitcast(v, _vector(ir.FloatType(), 32)), _vector(ir.HalfType(), 32))


def _from_half(builder: Any, v: Any) -> Any:
    return builder.fpext(builder.bitcast(v, _vector(ir.HalfType(), 16)), _vector(ir.FloatType(), 16))


def _to_bfloat(builder: Any, x: Any) -> Any:
    """Round the high 16 bits to nearest-even; NaN (magnitude above +inf's bits) is quieted."""
    high = builder.lshr(x, _splat(16, 32))
    bias = builder.add(_splat(0x7FFF, 32), builder.and_(high, _splat(1, 32)))
    rounded = builder.lshr(builder.add(x, bias), _splat(16, 32))
    nan = builder.icmp_unsigned(">", builder.and_(x, _splat(0x7FFFFFFF, 32)), _splat(0x7F800000, 32))
    quiet = builder.or_(high, _splat(0x40, 32))
    return builder.trunc(builder.select(nan, quiet, rounded), _vector(_I16, 32))


def _from_bfloat(builder: Any, v: Any) -> Any:
    return builder.shl(builder.zext(v, _vector(_I32, 16)), _splat(16, 16))


#: ``dst[d_off : d_off + 16] = src[s_off : s_off + 16]`` (32-bit elements), streamed.
stream_copy = _line_intrinsic(_I32, 16, lambda builder, v: v, 32, 32)
#: float32 bits ``src[s_off : s_off + 32]`` -> float16 bits ``dst[d_off : d_off + 32]``, streamed.
stream_to_half = _line_intrinsic(_I32, 32, _to_half, 32, 16)
#: float16 bits ``src[s_off : s_off + 16]`` -> float32 bits ``dst[d_off : d_off + 16]``, streamed.
stream_from_half = _line_intrinsic(_I16, 16, _from_half, 16, 32)
#: float32 bits ``src[s_off : s_off + 32]`` -> bfloat16 bits ``dst[d_off : d_off + 32]``, streamed.
stream_to_bfloat = _line_intrinsic(_I32, 32, _to_bfloat, 32, 16)
#: bfloat16 bits ``src[s_off : s_off + 16]`` -> float32 bits ``dst[d_off : d_off + 16]``, streamed.
stream_from_bfloat = _line_intrinsic(_I16, 16, _from_bfloat, 16, 32)


def _block_swap(builder: Any, rows: list[Any], n: int) -> list[Any]:
    """Transpose ``n`` vectors of ``n`` lanes: swap the off-diagonal blocks at every scale."""
    d = 1
    while d < n:
        low = [j if j & d == 0 else n + j - d for j in range(n)]
        high = [j + d if j & d == 0 else n + j for j in range(n)]
        mask_low, mask_high = (ir.Constant(_vector(_I32, n), m) for m in (low, high))
        out = list(rows)
        for r in range(n):
            if r & d == 0:
                a, b = rows[r], rows[r + d]
                out[r] = builder.shuffle_vector(a, b, mask_low)
                out[r + d] = builder.shuffle_vector(a, b, mask_high)
        rows, d = out, 2 * d
    return rows


@intrinsic
def transpose16_stream(
    typingctx: Any, src: Any, s_off: Any, s_stride: Any, dst: Any, d_off: Any, d_stride: Any
) -> Any:
    """``dst[d_off + j * d_stride + i] = src[s_off + i * s_stride + j]`` for ``i, j < 16``.

    32-bit elements (1-D arrays of one type); each destination row is one streamed line,
    so ``d_off`` and ``d_stride`` keep every row 64-byte aligned.
    """
    if not all(isinstance(a, types.Array) and a.ndim == 1 and a.dtype.bitwidth == 32 for a in (src, dst)):
        return None
    if not all(isinstance(a, types.Integer) for a in (s_off, s_stride, d_off, d_stride)):
        return None
    sig = types.void(src, s_off, s_stride, dst, d_off, d_stride)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        vec = _vector(_I32, 16)
        source = context.make_array(signature.args[0])(context, builder, args[0])
        target = context.make_array(signature.args[3])(context, builder, args[3])
        so, ss, do, ds = (context.cast(builder, args[i], signature.args[i], types.intp) for i in (1, 2, 4, 5))
        i64 = ir.IntType(64)
        rows = []
        for i in range(16):
            at = builder.gep(source.data, [builder.add(so, builder.mul(ss, i64(i)))])
            rows.append(builder.load(builder.bitcast(at, vec.as_pointer()), align=4))
        for j, col in enumerate(_block_swap(builder, rows, 16)):
            _store_line(builder, col, builder.gep(target.data, [builder.add(do, builder.mul(ds, i64(j)))]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def store_fence(typingctx: Any) -> Any:
    """A sequentially consistent fence (``mfence`` on x86): streamed stores are ordered
    before every later memory access."""
    sig = types.void()

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen
