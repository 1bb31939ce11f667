"""Element-wise operations on the CPU: NumPy ufuncs with ``out=``, split over the worker threads.

Multi-pass functions (GELU, SiLU, sigmoid, ...) run every pass on cache-sized blocks
through a per-thread scratch block, so memory sees one read and one write per element
and the input may be the output. float32 exp, log, tanh, sigmoid, erf, GELU, SiLU,
sin and cos use the compiled kernels of :mod:`._kact` (NumPy's float32 transcendentals
run up to several times slower than memory; its float32 sin / cos about twice as slow
as the compiled ones, measured in cache on one thread). Broadcasting views each
operand with stride 0 along its broadcast dimensions (:mod:`._strided`), so no operand is
ever expanded in memory.

Small calls are mostly per-call cost, so their path is short: below
:data:`DIRECT_LIMIT` elements a one-pass unary op is one ufunc call made straight from
the hook (ReLU against a cached 0-d zero, which a ufunc takes faster than a scalar), on
the allocation's cached typed view when the operand is the whole allocation, and the
floating-point error state is set directly (:func:`._runtime.ignore_fp_errors`) rather
than through ``np.errstate``. One-element relu measured 0.65x, add 0.49x and exp 0.58x
of the CPU time before these paths (interleaved in one process, session 7).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.special

from ... import validation as v
from ...memory import Region
from ...types import BinaryOp, UnaryOp
from ._plumbing import CpuPlumbing, FloatArray
from ._runtime import ignore_fp_errors, kernels, parallel_ranges, restore_fp_errors
from ._strided import simplify, split_run, strided_view

__all__ = ["ElementwiseOps"]

#: Elements per block of a multi-pass element-wise function (several blocks fit in L2).
BLOCK = 1 << 13
#: float32 problems below this many elements stay on NumPy (no kernel dispatch).
KERNEL_THRESHOLD = 1 << 12
#: Below this many elements no compiled kernel applies: a one-pass op is one ufunc call.
DIRECT_LIMIT = KERNEL_THRESHOLD // 4

#: A unary function on one block: ``fn(x, out, tmp, problem)``; ``out`` may be ``x``,
#: ``tmp`` is scratch of the same length.
Block = Callable[[FloatArray, FloatArray, FloatArray, v.ElementwiseProblem], None]

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_GELU_TANH_K = math.sqrt(2.0 / math.pi)
_GELU_TANH_C = 0.044715


def _c(x: FloatArray, value: float) -> Any:
    """``value`` as a scalar of ``x``'s dtype."""
    return x.dtype.type(value)


def _f32_kernel(x: FloatArray, name: str) -> Callable[[FloatArray, FloatArray], None] | None:
    """The compiled float32 kernel ``name`` for ``x``, when it applies."""
    if x.dtype != np.float32 or x.size < DIRECT_LIMIT:
        return None
    compiled = kernels("_kact")
    kernel: Callable[[FloatArray, FloatArray], None] | None = (
        None if compiled is None else getattr(compiled, name)
    )
    return kernel


def _sigmoid_into(x: FloatArray, out: FloatArray) -> None:
    kernel = _f32_kernel(x, "sigmoid_into")
    if kernel is not None:
        kernel(x, out)
        return
    # 1 / (1 + exp(-x)): exp overflows to inf for very negative x, giving exactly 0.
    np.negative(x, out=out)
    np.exp(out, out=out)
    np.add(out, _c(out, 1), out=out)
    np.reciprocal(out, out=out)


def _tanh_into(x: FloatArray, out: FloatArray) -> None:
    kernel = _f32_kernel(x, "tanh_into")
    if kernel is not None:
        kernel(x, out)
    else:
        np.tanh(x, out=out)


def _sigmoid(x: FloatArray, out: FloatArray, tmp: FloatArray, p: v.ElementwiseProblem) -> None:
    _sigmoid_into(x, out)


def _gelu(x: FloatArray, out: FloatArray, tmp: FloatArray, p: v.ElementwiseProblem) -> None:
    # 0.5 * x * (1 + erf(x / sqrt(2)))
    np.multiply(x, _c(x, _SQRT_HALF), out=tmp)
    scipy.special.erf(tmp, out=tmp)
    np.add(tmp, _c(x, 1), out=tmp)
    np.multiply(tmp, x, out=tmp)
    np.multiply(tmp, _c(x, 0.5), out=out)


def _gelu_tanh(x: FloatArray, out: FloatArray, tmp: FloatArray, p: v.ElementwiseProblem) -> None:
    # 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))
    np.multiply(x, x, out=tmp)
    np.multiply(tmp, x, out=tmp)
    np.multiply(tmp, _c(x, _GELU_TANH_C), out=tmp)
    np.add(tmp, x, out=tmp)
    np.multiply(tmp, _c(x, _GELU_TANH_K), out=tmp)
    _tanh_into(tmp, tmp)
    np.add(tmp, _c(x, 1), out=tmp)
    np.multiply(tmp, x, out=tmp)
    np.multiply(tmp, _c(x, 0.5), out=out)


def _silu(x: FloatArray, out: FloatArray, tmp: FloatArray, p: v.ElementwiseProblem) -> None:
    _sigmoid_into(x, tmp)
    np.multiply(x, tmp, out=out)


def _leaky_relu(x: FloatArray, out: FloatArray, tmp: FloatArray, p: v.ElementwiseProblem) -> None:
    # x if x >= 0 else alpha * x (NaN: alpha * NaN = NaN)
    keep = np.greater_equal(x, _c(x, 0))
    np.multiply(x, _c(x, p.alpha), out=tmp)
    np.copyto(tmp, x, where=keep)
    np.copyto(out, tmp)


def _clip(x: FloatArray, out: FloatArray, tmp: FloatArray, p: v.ElementwiseProblem) -> None:
    # min(max(x, lo), hi); NaN propagates (maximum / minimum, not fmax / fmin).
    np.maximum(x, _c(x, p.lo), out=out)
    np.minimum(out, _c(x, p.hi), out=out)


def _ufunc(fn: Callable[..., object], kernel: str | None = None) -> Block:
    """A one-pass function from a ufunc (and, for float32, a compiled kernel)."""

    def apply(x: FloatArray, out: FloatArray, tmp: FloatArray, p: v.ElementwiseProblem) -> None:
        compiled = _f32_kernel(x, kernel) if kernel is not None else None
        if compiled is not None:
            compiled(x, out)
        else:
            fn(x, out=out)

    return apply


#: 0 as a 0-d array of each dtype: a ufunc takes one about 0.3 us faster than a NumPy
#: scalar, which it converts to an array on every call.
_ZERO_ARRAYS: dict[np.dtype[Any], FloatArray] = {}


def _zero(dtype: np.dtype[Any]) -> FloatArray:
    zero = _ZERO_ARRAYS.get(dtype)
    if zero is None:
        zero = np.zeros((), dtype=dtype)
        zero.flags.writeable = False
        _ZERO_ARRAYS[dtype] = zero
    return zero


def _relu(x: FloatArray, out: FloatArray, tmp: FloatArray, p: v.ElementwiseProblem) -> None:
    np.fmax(x, _zero(x.dtype), out)  # NaN -> 0; ``out`` positional: a keyword costs more


#: The one-pass ops that are a ufunc (with, for float32, the compiled kernel of
#: :mod:`._kact` that replaces it from :data:`DIRECT_LIMIT` elements), and ReLU.
_UFUNCS: dict[UnaryOp, tuple[Callable[..., object], str | None]] = {
    UnaryOp.TANH: (np.tanh, "tanh_into"),
    UnaryOp.EXP: (np.exp, "exp_into"),
    UnaryOp.LOG: (np.log, "log_into"),
    UnaryOp.SQRT: (np.sqrt, None),
    UnaryOp.ABS: (np.absolute, None),
    UnaryOp.NEG: (np.negative, None),
    UnaryOp.ERF: (scipy.special.erf, None),
    UnaryOp.RECIPROCAL: (np.reciprocal, None),
    UnaryOp.SQUARE: (np.square, None),
    UnaryOp.SIN: (np.sin, None),
    UnaryOp.COS: (np.cos, None),
}

_UNARY: dict[UnaryOp, Block] = {
    UnaryOp.RELU: _relu,
    UnaryOp.SIGMOID: _sigmoid,
    UnaryOp.GELU: _gelu,
    UnaryOp.GELU_TANH: _gelu_tanh,
    UnaryOp.SILU: _silu,
    UnaryOp.LEAKY_RELU: _leaky_relu,
    UnaryOp.CLIP: _clip,
    **{op: _ufunc(fn, kernel) for op, (fn, kernel) in _UFUNCS.items()},
}

#: One-pass functions that raise no floating-point flag (no np.errstate needed).
_QUIET = frozenset({UnaryOp.RELU, UnaryOp.ABS, UnaryOp.NEG})
_NO_SCRATCH = np.empty(0, dtype=np.float32)

#: Functions of one pass over memory: no blocking needed.
_ONE_PASS = frozenset({UnaryOp.RELU, *_UFUNCS})
#: The small-call path of each one-pass op: (function, whether it may raise a floating-point
#: flag).
_SMALL: dict[UnaryOp | BinaryOp, tuple[Block, bool]] = {
    op: (_UNARY[op], op not in _QUIET) for op in _ONE_PASS
}
#: The direct form of each one-pass op, for calls below :data:`DIRECT_LIMIT` elements:
#: (ufunc, whether 0 is its second operand, whether it may raise a floating-point flag).
#: Called straight from the hook: no Python frame between it and the ufunc.
_DIRECT: dict[UnaryOp | BinaryOp, tuple[Callable[..., object], bool, bool]] = {
    UnaryOp.RELU: (np.fmax, True, False),  # NaN -> 0
    **{op: (fn, False, op not in _QUIET) for op, (fn, _) in _UFUNCS.items()},
}

_BINARY: dict[BinaryOp, Callable[..., object]] = {
    BinaryOp.ADD: np.add,
    BinaryOp.SUB: np.subtract,
    BinaryOp.MUL: np.multiply,
    BinaryOp.DIV: np.divide,
    BinaryOp.MAX: np.fmax,
    BinaryOp.MIN: np.fmin,
    BinaryOp.POW: np.power,
}


#: Unary ops with a compiled float32 kernel ``kernel(x, out, stream)`` of :mod:`._kact`.
_F32_KERNELS = {
    UnaryOp.EXP: "exp_into",
    UnaryOp.LOG: "log_into",
    UnaryOp.TANH: "tanh_into",
    UnaryOp.SIGMOID: "sigmoid_into",
    UnaryOp.GELU: "gelu_into",
    UnaryOp.GELU_TANH: "gelu_tanh_into",
    UnaryOp.SILU: "silu_into",
    UnaryOp.ERF: "erf_into",
    UnaryOp.SIN: "sin_into",
    UnaryOp.COS: "cos_into",
}
#: Outputs from this many bytes on are written with non-temporal stores (far beyond L2).
STREAM_BYTES = 8 << 20
#: In-place compiled kernels run through scratch blocks of this many elements.
IN_PLACE_BLOCK = 4096


def _compiled_unary(
    p: v.ElementwiseProblem, in_place: bool
) -> Callable[[FloatArray, FloatArray], None] | None:
    """A one-pass compiled kernel for ``p`` (float32 functions, parametrised ReLU / clip), or None.

    Outputs of :data:`STREAM_BYTES` or more are written with non-temporal stores (one
    write per element, no read of the output's lines first), unless ``in_place``: then
    the kernel writes small scratch blocks that stay in cache.

    Below :data:`KERNEL_THRESHOLD` elements only the multi-pass functions (GELU, SiLU,
    sigmoid, ...) take it: their NumPy form is several ufunc passes (GELU's with SciPy's
    scalar ``erf``), which the one compiled call beats at every size (GELU on 3072
    elements, a GPT-2-small step's activation, hot, per call: 11-20 us against 65-75 us
    on NumPy's passes).
    """
    if p.n < KERNEL_THRESHOLD and p.op in _ONE_PASS:
        return None
    if p.op in (UnaryOp.LEAKY_RELU, UnaryOp.CLIP):
        compiled = kernels("_kact")
        if compiled is None:
            return None
        if p.op is UnaryOp.LEAKY_RELU:
            alpha = np.array([p.alpha], dtype=p.dtype)
            return lambda x, out: compiled.leaky_relu_into(x, out, alpha)
        bounds = np.array([p.lo, p.hi], dtype=p.dtype)
        return lambda x, out: compiled.clip_into(x, out, bounds)
    op = p.op
    assert isinstance(op, UnaryOp)
    found = _F32_KERNELS.get(op) if p.dtype == np.float32 else None
    compiled = None if found is None else kernels("_kact")
    if compiled is None or found is None:
        return None
    kernel = getattr(compiled, found)
    stream = not in_place and p.n * 4 >= STREAM_BYTES
    return lambda x, out: kernel(x, out, stream)


def _operand(backend: CpuPlumbing, region: Region, dtype: np.dtype[Any]) -> FloatArray:
    """``backend._flat(region, dtype)``; a whole-allocation operand takes the allocation's
    cached view (what ``_flat`` returns for it) without the call."""
    view: FloatArray | None = region.allocation.view
    if view is None or region is not region.allocation.whole or view.dtype is not dtype:
        return backend._flat(region, dtype)
    return view


class ElementwiseOps(CpuPlumbing):
    """``unary``, ``binary`` and ``broadcast_binary``."""

    def _exec_unary(self, p: v.ElementwiseProblem) -> None:
        dt = p.dtype
        x, out = _operand(self, p.a, dt), _operand(self, p.out, dt)
        if p.n < DIRECT_LIMIT:
            direct = _DIRECT.get(p.op)
            if direct is not None:
                # The smallest calls: the ufunc itself; functions that cannot raise
                # floating-point flags skip the error state.
                ufunc, with_zero, flags = direct
                if with_zero:
                    zero = _ZERO_ARRAYS.get(dt)
                    ufunc(x, _zero(dt) if zero is None else zero, out)  # positional out: cheaper
                elif flags:
                    token = ignore_fp_errors()
                    try:
                        ufunc(x, out)
                    finally:
                        restore_fp_errors(token)
                else:
                    ufunc(x, out)
                return
        small = _SMALL.get(p.op) if p.n < KERNEL_THRESHOLD else None
        if small is not None:
            # Small calls: one ufunc call on this thread, no closures or thread split.
            fn, flags = small
            token = ignore_fp_errors() if flags else None
            try:
                fn(x, out, _NO_SCRATCH, p)
            finally:
                if flags:
                    restore_fp_errors(token)
            return
        self._unary_large(p, x, out)

    def _unary_large(self, p: v.ElementwiseProblem, x: FloatArray, out: FloatArray) -> None:
        """A unary call too large for one ufunc call: compiled kernels or blocks, split over threads."""
        assert isinstance(p.op, UnaryOp)
        in_place = p.a.ptr == p.out.ptr
        kernel = _compiled_unary(p, in_place)
        if kernel is not None:
            compiled = kernel

            def run_kernel(start: int, stop: int) -> None:
                if not in_place:
                    compiled(x[start:stop], out[start:stop])
                    return
                # The compiled loops vectorise only when input and output do not alias
                # (LLVM's runtime overlap check falls back to scalar code: 4-7x slower),
                # so an in-place call goes through a block of scratch held in L1.
                tmp = np.empty(min(IN_PLACE_BLOCK, stop - start), dtype=p.dtype)
                for lo in range(start, stop, IN_PLACE_BLOCK):
                    hi = min(stop, lo + IN_PLACE_BLOCK)
                    compiled(x[lo:hi], tmp[: hi - lo])
                    out[lo:hi] = tmp[: hi - lo]

            parallel_ranges(p.n, run_kernel)
            return
        fn = _UNARY[p.op]
        step = p.n if p.op in _ONE_PASS else BLOCK

        def run(start: int, stop: int) -> None:
            tmp = np.empty(0 if p.op in _ONE_PASS else min(step, stop - start), dtype=p.dtype)
            with np.errstate(all="ignore"):
                for lo in range(start, stop, step):
                    hi = min(stop, lo + step)
                    fn(x[lo:hi], out[lo:hi], tmp[: hi - lo], p)

        parallel_ranges(p.n, run)

    def _exec_binary(self, p: v.ElementwiseProblem) -> None:
        assert p.b is not None
        fn = _BINARY[p.op]  # type: ignore[index]
        dt = p.dtype
        a, b, out = _operand(self, p.a, dt), _operand(self, p.b, dt), _operand(self, p.out, dt)
        if p.n < KERNEL_THRESHOLD:
            token = ignore_fp_errors()
            try:
                fn(a, b, out)  # positional out: cheaper
            finally:
                restore_fp_errors(token)
            return

        def run(start: int, stop: int) -> None:
            with np.errstate(all="ignore"):
                fn(a[start:stop], b[start:stop], out=out[start:stop])

        parallel_ranges(p.n, run)

    def _exec_broadcast_binary(self, p: v.BroadcastProblem) -> None:
        fn = _BINARY[p.op]
        shape, (sa, sb, so) = simplify(p.shape, (p.a_strides, p.b_strides, p.out_strides))
        a = strided_view(self._flat(p.a, p.dtype), 0, shape, sa)
        b = strided_view(self._flat(p.b, p.dtype), 0, shape, sb)
        out = strided_view(self._flat(p.out, p.dtype), 0, shape, so)

        def run(index: tuple[slice, ...]) -> None:
            with np.errstate(all="ignore"):
                fn(a[index], b[index], out=out[index])

        split_run(shape, 0, run)
