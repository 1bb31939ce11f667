"""Building blocks shared by the CPU backend's compiled performance kernels (numba).

* :func:`jit`: ``numba.njit`` with the options every kernel here uses: ``nogil`` (the
  backend splits work over its own threads), ``cache=True`` (compiled once per machine,
  then read from numba's on-disk cache), fused multiply-add allowed, nothing else of
  fast-math (NaN and infinity keep their IEEE meaning).
* :func:`sgemm`: single-precision BLAS GEMM called from compiled code on any offsets
  of flat arrays, with BLAS's own transposes, leading dimensions and ``beta``. It goes
  through numba's helper ``numba_xxgemm``, which calls the ``sgemm`` that SciPy
  exports (the same OpenBLAS as :mod:`._blas`, so the BLAS thread limit of
  :mod:`._runtime` applies). Compiled code calling it is cacheable, unlike a ctypes
  function pointer.
* :func:`sgemv`: the same for single-precision ``?gemv`` (``numba_xxgemv``; vectors of
  unit stride).
* :func:`sum32`: the sum of a float32 row in float32 vector partial sums.
* :func:`as_int`: the bits of a float32 as an int32 (a register bit-cast).
* :func:`stream_scaled`: eight float32 products stored with a non-temporal hint
  (no read-for-ownership of the destination line: a softmax's output is written once).
* :func:`transpose8`: an 8 x 8 float32 block transposed in registers (eight vector
  loads, three stages of shuffles, eight vector stores), for the layout changes
  between NCHW and channels-last that LLVM's vectoriser would otherwise turn into
  gathers or scalar stores.

Importing this module needs numba; the kernel modules that use it are loaded through
:func:`._runtime.kernels`, which keeps the NumPy paths where numba is missing.
"""

# The function bodies are numba nopython code: numba types them, and numba's stubs
# cannot describe that to mypy.
# mypy: ignore-errors

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "jit",
    "jit_reassoc",
    "sgemm",
    "sgemv",
    "sum32",
    "as_int",
    "as_float",
    "order_key",
    "prefetch",
    "stream_scaled",
    "stream_shifted",
    "transpose8",
    "wide_vectors",
    "NO",
    "YES",
]


def _compiled(fastmath: set[str]) -> Callable[[Callable[..., Any]], Any]:
    def decorate(fn: Callable[..., Any]) -> Any:
        options: dict[str, Any] = dict(nogil=True, fastmath=fastmath, error_model="numpy")
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # no writable cache location: compile in each process
            return numba.njit(cache=False, **options)(fn)

    return decorate


#: ``njit`` for the kernels: nogil, cached on disk, fused multiply-add only.
jit = _compiled({"contract"})
#: The same, also letting LLVM reassociate (partial sums kept in vectors).
jit_reassoc = _compiled({"contract", "reassoc"})


# Reassociation only lets LLVM keep several partial sums (a vector of them); nothing
# else in this function could change under it.
@jit_reassoc
def sum32(row):
    """Sum of a 1-D float32 array, accumulated in interleaved float32 partial sums."""
    total = np.float32(0.0)
    for i in range(row.shape[0]):
        total += row[i]
    return total


_F32P = types.CPointer(types.float32)
_xxgemm = types.ExternalFunction(
    "numba_xxgemm",
    types.intc(
        types.char,  # kind
        types.char,  # transa
        types.char,  # transb
        types.intp,  # m
        types.intp,  # n
        types.intp,  # k
        _F32P,  # alpha
        _F32P,  # a
        types.intp,  # lda
        _F32P,  # b
        types.intp,  # ldb
        _F32P,  # beta
        _F32P,  # c
        types.intp,  # ldc
    ),
)

_xxgemv = types.ExternalFunction(
    "numba_xxgemv",
    types.intc(
        types.char,  # kind
        types.char,  # trans
        types.intp,  # m
        types.intp,  # n
        _F32P,  # alpha
        _F32P,  # a
        types.intp,  # lda
        _F32P,  # x (unit stride)
        _F32P,  # beta
        _F32P,  # y (unit stride)
    ),
)

#: BLAS transpose flags.
NO = np.int8(ord("N"))
YES = np.int8(ord("T"))
_KIND_S = np.int8(ord("s"))


@intrinsic
def _at(typingctx: Any, arr: Any, offset: Any) -> Any:
    """Pointer to element ``offset`` of a 1-D float32 array's data."""
    if not isinstance(arr, types.Array) or not isinstance(offset, types.Integer):
        return None
    sig = types.CPointer(arr.dtype)(arr, offset)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        off = context.cast(builder, args[1], signature.args[1], types.intp)
        return builder.gep(ary.data, [off])

    return sig, codegen


@intrinsic
def as_int(typingctx: Any, x: Any) -> Any:
    """The bits of a float32 as an int32."""
    if x != types.float32:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@intrinsic
def as_float(typingctx: Any, x: Any) -> Any:
    """The float32 whose bits are the low 32 bits of an integer."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        value = args[0]
        if x.bitwidth > 32:
            value = builder.trunc(value, ir.IntType(32))
        elif x.bitwidth < 32:
            value = builder.sext(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())

    return types.float32(x), codegen


@intrinsic
def order_key(typingctx: Any, x: Any) -> Any:
    """An int32 that orders like the float32 ``x`` (its own inverse, as bits of a float).

    ``bits ^ ((bits >> 31) & 0x7FFFFFFF)`` in 32-bit integer arithmetic (numba would
    widen it to 64 bits, which AVX2 cannot shift arithmetically in vectors). A NaN
    sorts above +inf (sign bit clear) or below -inf (set).
    """
    if x not in (types.float32, types.int32):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i32 = ir.IntType(32)
        bits = args[0] if x == types.int32 else builder.bitcast(args[0], i32)
        mask = builder.and_(builder.ashr(bits, i32(31)), i32(0x7FFFFFFF))
        key = builder.xor(bits, mask)
        return key if x == types.float32 else builder.bitcast(key, ir.FloatType())

    return (types.int32 if x == types.float32 else types.float32)(x), codegen


@intrinsic
def prefetch(typingctx: Any, arr: Any, offset: Any) -> Any:
    """Hint the CPU to bring element ``offset`` of a 1-D array into L2 (no fault if outside)."""
    if not isinstance(arr, types.Array) or not isinstance(offset, types.Integer):
        return None
    sig = types.void(arr, offset)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        off = context.cast(builder, args[1], signature.args[1], types.intp)
        address = builder.bitcast(builder.gep(ary.data, [off]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [address.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [address, i32(0), i32(2), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@jit
def sgemm(ta, tb, m, n, k, alpha, a, a_off, lda, b, b_off, ldb, beta, c, c_off, ldc):
    """Column-major ``C = alpha op(A) op(B) + beta C`` on float32 arrays at element offsets.

    ``ta`` / ``tb`` are :data:`NO` or :data:`YES`; ``a``, ``b``, ``c`` are 1-D float32
    arrays holding the matrices from the given offsets. The caller keeps every operand
    inside its array and skips empty products.
    """
    scalars = np.empty(2, dtype=np.float32)
    scalars[0] = alpha
    scalars[1] = beta
    _xxgemm(
        _KIND_S, ta, tb, m, n, k,
        _at(scalars, 0), _at(a, a_off), lda, _at(b, b_off), ldb, _at(scalars, 1), _at(c, c_off), ldc,
    )  # fmt: skip


@jit
def sgemv(trans, m, n, alpha, a, a_off, lda, x, x_off, beta, y, y_off):
    """Column-major ``y = alpha op(A) x + beta y`` on float32 arrays at element offsets.

    ``A`` is ``m x n`` at ``a[a_off]`` with leading dimension ``lda``; ``trans`` is
    :data:`NO` or :data:`YES`; ``x`` and ``y`` have unit stride (numba's helper
    ``numba_xxgemv`` calls SciPy's ``sgemv`` with increments of 1). The caller keeps
    every operand inside its array and skips empty products.
    """
    scalars = np.empty(2, dtype=np.float32)
    scalars[0] = alpha
    scalars[1] = beta
    _xxgemv(
        _KIND_S,
        trans,
        m,
        n,
        _at(scalars, 0),
        _at(a, a_off),
        lda,
        _at(x, x_off),
        _at(scalars, 1),
        _at(y, y_off),
    )


def _shuffle(builder: Any, a: Any, b: Any, mask: list[int]) -> Any:
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), 8), mask))


def _offsets(context: Any, builder: Any, signature: Any, args: Any, first: int) -> tuple[Any, Any]:
    return tuple(  # type: ignore[return-value]
        context.cast(builder, args[i], signature.args[i], types.intp) for i in (first, first + 1)
    )


@intrinsic
def transpose8(
    typingctx: Any, src: Any, s_off: Any, s_stride: Any, dst: Any, d_off: Any, d_stride: Any
) -> Any:
    """``dst[d_off + j * d_stride + i] = src[s_off + i * s_stride + j]`` for ``i, j < 8``.

    ``src`` and ``dst`` are 1-D float32 arrays; the caller keeps every element inside them.
    """
    f32 = types.float32
    if not all(isinstance(a, types.Array) and a.dtype == f32 and a.ndim == 1 for a in (src, dst)):
        return None
    if not all(isinstance(a, types.Integer) for a in (s_off, s_stride, d_off, d_stride)):
        return None
    sig = types.void(src, s_off, s_stride, dst, d_off, d_stride)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        vec = ir.VectorType(ir.FloatType(), 8)
        i64 = ir.IntType(64)
        source = context.make_array(signature.args[0])(context, builder, args[0])
        target = context.make_array(signature.args[3])(context, builder, args[3])
        so, ss = _offsets(context, builder, signature, args, 1)
        do, ds = _offsets(context, builder, signature, args, 4)
        rows = []
        for i in range(8):
            at = builder.gep(source.data, [builder.add(so, builder.mul(ss, ir.Constant(i64, i)))])
            rows.append(builder.load(builder.bitcast(at, vec.as_pointer()), align=4))
        # Pairs of rows interleaved by 32-bit lanes, then by 64-bit pairs, then by halves.
        t = []
        for i in range(0, 8, 2):
            t.append(_shuffle(builder, rows[i], rows[i + 1], [0, 8, 2, 10, 4, 12, 6, 14]))
            t.append(_shuffle(builder, rows[i], rows[i + 1], [1, 9, 3, 11, 5, 13, 7, 15]))
        u = []
        for i in (0, 4):
            u.append(_shuffle(builder, t[i], t[i + 2], [0, 1, 8, 9, 4, 5, 12, 13]))
            u.append(_shuffle(builder, t[i + 1], t[i + 3], [0, 1, 8, 9, 4, 5, 12, 13]))
            u.append(_shuffle(builder, t[i], t[i + 2], [2, 3, 10, 11, 6, 7, 14, 15]))
            u.append(_shuffle(builder, t[i + 1], t[i + 3], [2, 3, 10, 11, 6, 7, 14, 15]))
        cols = [_shuffle(builder, u[j], u[j + 4], [0, 1, 2, 3, 8, 9, 10, 11]) for j in range(4)]
        cols += [_shuffle(builder, u[j], u[j + 4], [4, 5, 6, 7, 12, 13, 14, 15]) for j in range(4)]
        for j in range(8):
            at = builder.gep(target.data, [builder.add(do, builder.mul(ds, ir.Constant(i64, j)))])
            builder.store(cols[j], builder.bitcast(at, vec.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


def _stream_codegen(combine: Callable[[Any, Any, Any, Any], Any]) -> Any:
    """Codegen of ``dst[d_off + i] = combine(src[s_off + i], a, b)`` for ``i < 8``, non-temporal store."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        vec = ir.VectorType(ir.FloatType(), 8)
        source = context.make_array(signature.args[0])(context, builder, args[0])
        target = context.make_array(signature.args[4])(context, builder, args[4])
        so = context.cast(builder, args[1], signature.args[1], types.intp)
        do = context.cast(builder, args[5], signature.args[5], types.intp)
        values = builder.load(builder.bitcast(builder.gep(source.data, [so]), vec.as_pointer()), align=4)
        splat = []
        for scalar in (args[2], args[3]):
            one = builder.insert_element(ir.Constant(vec, ir.Undefined), scalar, ir.IntType(32)(0))
            splat.append(
                builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8))
            )
        where = builder.bitcast(builder.gep(target.data, [do]), vec.as_pointer())
        store = builder.store(combine(builder, values, splat[0], splat[1]), where, align=32)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.IntType(32)(1)]))
        return context.get_dummy_value()

    return codegen


def _stream_signature(src: Any, s_off: Any, a: Any, b: Any, dst: Any, d_off: Any) -> Any:
    f32 = types.float32
    if not all(isinstance(t, types.Array) and t.dtype == f32 and t.ndim == 1 for t in (src, dst)):
        return None
    if a != f32 or b != f32 or not all(isinstance(t, types.Integer) for t in (s_off, d_off)):
        return None
    return types.void(src, s_off, a, b, dst, d_off)


@intrinsic
def stream_scaled(typingctx: Any, src: Any, s_off: Any, a: Any, b: Any, dst: Any, d_off: Any) -> Any:
    """``dst[d_off + i] = src[s_off + i] * a`` for ``i < 8``, stored non-temporally (``b`` unused).

    ``dst + d_off`` must be 32-byte aligned; ``src`` and ``dst`` are 1-D float32 arrays.
    """
    sig = _stream_signature(src, s_off, a, b, dst, d_off)
    return None if sig is None else (sig, _stream_codegen(lambda bld, v, x, y: bld.fmul(v, x)))


@intrinsic
def stream_shifted(typingctx: Any, src: Any, s_off: Any, a: Any, b: Any, dst: Any, d_off: Any) -> Any:
    """``dst[d_off + i] = (src[s_off + i] - a) - b`` for ``i < 8``, stored non-temporally.

    ``dst + d_off`` must be 32-byte aligned; ``src`` and ``dst`` are 1-D float32 arrays.
    """
    sig = _stream_signature(src, s_off, a, b, dst, d_off)
    return None if sig is None else (sig, _stream_codegen(lambda bld, v, x, y: bld.fsub(bld.fsub(v, x), y)))


@intrinsic
def wide_vectors(typingctx: Any) -> Any:
    """Let LLVM vectorise the calling function with the widest vectors the CPU has.

    LLVM's tuning for Intel server CPUs prefers 256-bit vectors even where AVX-512
    exists (``prefer-vector-width``), and numba offers no per-function override. This
    sets the function attributes ``"prefer-vector-width"="512"`` and
    ``"min-legal-vector-width"="512"`` on the enclosing function (a no-op on CPUs
    without 512-bit vectors). Call it at the top of a kernel that Python calls; the
    helpers it inlines are vectorised under its attributes.
    """
    sig = types.void()

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        attributes = builder.function.attributes
        # llvmlite accepts only known keyword attributes; string attributes go in as written.
        set.add(attributes, '"prefer-vector-width"="512"')
        set.add(attributes, '"min-legal-vector-width"="512"')
        return context.get_dummy_value()

    return sig, codegen
