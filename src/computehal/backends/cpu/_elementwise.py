"""Element-wise operations on the CPU: NumPy ufuncs with ``out=``, split over the worker threads.

float32 exp, log, tanh and sigmoid use the compiled kernels of :mod:`._kmath` (NumPy's
float32 transcendentals run several times slower than memory).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ... import validation as v
from ...types import BinaryOp, UnaryOp
from .._common import refuse_extensions
from ._axis import AXIS_BLOCK, KERNEL_THRESHOLD
from ._plumbing import CpuPlumbing, FloatArray
from ._runtime import PARALLEL_THRESHOLD, kernels, parallel_ranges

__all__ = ["ElementwiseOps"]


def _relu(x: FloatArray, out: FloatArray) -> object:
    return np.fmax(x, x.dtype.type(0), out=out)


def _sigmoid(x: FloatArray, out: FloatArray) -> None:
    # 1 / (1 + exp(-x)): exp overflows to inf for very negative x, giving exactly 0.
    np.negative(x, out=out)
    np.exp(out, out=out)
    np.add(out, out.dtype.type(1), out=out)
    np.reciprocal(out, out=out)


_UNARY: dict[UnaryOp, Callable[..., object]] = {
    UnaryOp.RELU: _relu,
    UnaryOp.SIGMOID: _sigmoid,
    UnaryOp.TANH: np.tanh,
    UnaryOp.EXP: np.exp,
    UnaryOp.LOG: np.log,
    UnaryOp.SQRT: np.sqrt,
    UnaryOp.ABS: np.abs,
    UnaryOp.NEG: np.negative,
}

#: Unary ops with a compiled float32 kernel (attribute of :mod:`._kmath`).
_UNARY_KERNELS = {
    UnaryOp.EXP: "exp_into",
    UnaryOp.LOG: "log_into",
    UnaryOp.TANH: "tanh_into",
    UnaryOp.SIGMOID: "sigmoid_into",
}

_BINARY: dict[BinaryOp, Callable[..., object]] = {
    BinaryOp.ADD: np.add,
    BinaryOp.SUB: np.subtract,
    BinaryOp.MUL: np.multiply,
    BinaryOp.DIV: np.divide,
    BinaryOp.MAX: np.fmax,
    BinaryOp.MIN: np.fmin,
}


class ElementwiseOps(CpuPlumbing):
    """``unary`` and ``binary``."""

    def _elementwise(
        self,
        p: v.ElementwiseProblem,
        apply: Callable[..., object],
        block: int = 0,
        kernel: Callable[[FloatArray, FloatArray], None] | None = None,
    ) -> None:
        """Run ``apply(*inputs, out=out)`` over the problem, split across threads when large.

        ``block`` > 0 also cuts each thread's range into blocks of that many elements, so
        that multi-pass operations (sigmoid) run every pass on cache-resident data.
        ``kernel(x, out)``, a compiled unary kernel, replaces ``apply``. Inputs are the
        output itself or do not overlap it (the dispatcher copies others aside).
        """
        a = self._flat(p.a, p.dtype)
        out = self._flat(p.out, p.dtype)
        operands = [a] if p.b is None else [a, self._flat(p.b, p.dtype)]
        if p.n < PARALLEL_THRESHOLD:
            with np.errstate(all="ignore"):
                apply(*operands, out=out)
            return
        if kernel is not None:
            compiled = kernel

            def run_kernel(start: int, stop: int) -> None:
                compiled(a[start:stop], out[start:stop])

            parallel_ranges(p.n, run_kernel)
            return
        step = block if block > 0 else p.n

        def run(start: int, stop: int) -> None:
            with np.errstate(all="ignore"):
                for lo in range(start, stop, step):
                    hi = min(stop, lo + step)
                    apply(*(x[lo:hi] for x in operands), out=out[lo:hi])

        parallel_ranges(p.n, run)

    def _exec_unary(self, p: v.ElementwiseProblem) -> None:
        refuse_extensions("cpu", "unary", p)
        assert isinstance(p.op, UnaryOp)
        kernel = None
        if p.op in _UNARY_KERNELS and p.dtype == np.float32 and p.n >= KERNEL_THRESHOLD:
            compiled = kernels("_kmath")
            kernel = None if compiled is None else getattr(compiled, _UNARY_KERNELS[p.op])
        self._elementwise(p, _UNARY[p.op], block=AXIS_BLOCK if p.op is UnaryOp.SIGMOID else 0, kernel=kernel)

    def _exec_binary(self, p: v.ElementwiseProblem) -> None:
        refuse_extensions("cpu", "binary", p)
        assert isinstance(p.op, BinaryOp)
        self._elementwise(p, _BINARY[p.op])
