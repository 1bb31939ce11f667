"""Array-level operations: shapes, leading dimensions and one backend call each.

Nothing here computes a number. Each function checks its operands (same backend,
dtype, layout, shapes: :class:`~computehal.InvalidArgumentError` otherwise), works out
the output shape and the pointer-level arguments, allocates the output unless ``out=``
is given, and makes one call of the :class:`~computehal.ComputeBackend` API.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..types import BinaryOp, ReduceOp, UnaryOp, coerce_enum
from ._core import DeviceArray, _as_shape, _span, empty

__all__ = [
    "matmul",
    "conv2d",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "attention",
    "softmax",
    "reduce",
    "sum",
    "max",
    "min",
    "mean",
    "unary",
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "sqrt",
    "abs",
    "neg",
    "binary",
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "take",
    "put",
]

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


# --------------------------------------------------------------------------- checks


def _arrays(**named: Any) -> None:
    """Every operand is a live DeviceArray, all on one backend."""
    backend = None
    first = ""
    for name, x in named.items():
        if x is None:
            continue
        if not isinstance(x, DeviceArray):
            raise InvalidArgumentError(f"{name} must be a DeviceArray, got {type(x).__name__}")
        if x.freed:
            raise InvalidArgumentError(f"{name} has been freed")
        if backend is None:
            backend, first = x.backend, name
        elif x.backend is not backend:
            raise InvalidArgumentError(
                f"{name} is on the {x.backend.name()} backend {x.backend!r} but {first} is on "
                f"{backend!r}; move it with to_device() first"
            )


def _check_dtype(name: str, x: DeviceArray, allowed: Sequence[np.dtype[Any]]) -> None:
    if x.dtype not in allowed:
        wanted = " or ".join(str(d) for d in allowed)
        raise InvalidArgumentError(f"{name} has dtype {x.dtype}; this operation takes {wanted}")


def _check_contiguous(name: str, x: DeviceArray) -> None:
    if not x.is_contiguous:
        raise InvalidArgumentError(f"{name} must be C-contiguous (strides {x.strides}); copy() it first")


def _inputs(dtype: Sequence[np.dtype[Any]], **named: DeviceArray) -> None:
    _arrays(**named)
    for name, x in named.items():
        _check_dtype(name, x, dtype)
        _check_contiguous(name, x)


def _output(
    out: DeviceArray | None, like: DeviceArray, shape: tuple[int, ...], dtype: np.dtype[Any]
) -> tuple[DeviceArray, bool]:
    """The output array (given and checked, or freshly allocated) and whether it is fresh."""
    if out is None:
        return empty(shape, like.backend, dtype=dtype), True
    _arrays(out=out, input=like)
    if out.shape != shape:
        raise InvalidArgumentError(f"out has shape {out.shape}, expected {shape}")
    _check_dtype("out", out, [dtype])
    _check_contiguous("out", out)
    return out, False


def _run(out: DeviceArray, fresh: bool, call: Callable[[], None]) -> DeviceArray:
    """Make the backend call; a freshly allocated output is freed if it fails."""
    try:
        call()
    except BaseException:
        if fresh:
            out.free()
        raise
    return out


def _axis(axis: object, ndim: int) -> int:
    if isinstance(axis, bool):
        raise InvalidArgumentError("axis must be an integer, got a bool")
    try:
        ax = operator.index(axis)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"axis must be an integer, got {type(axis).__name__}") from None
    if not -ndim <= ax < ndim:
        raise InvalidArgumentError(f"axis {ax} is out of range for a {ndim}-d array")
    return int(ax % ndim)


def _pair(name: str, value: object) -> tuple[int, int]:
    items = list(value) if isinstance(value, (Sequence, np.ndarray)) else [value, value]
    if len(items) != 2:
        raise InvalidArgumentError(f"{name} must be an integer or a pair, got {value!r}")
    result = []
    for item in items:
        if isinstance(item, bool):
            raise InvalidArgumentError(f"{name} must contain integers, got a bool")
        try:
            result.append(operator.index(item))  # type: ignore[arg-type]
        except TypeError:
            raise InvalidArgumentError(f"{name} must contain integers, got {type(item).__name__}") from None
    return result[0], result[1]


# --------------------------------------------------------------------------- matmul


def _layout(name: str, x: DeviceArray) -> tuple[bool, int]:
    """How the last two axes of ``x`` sit in memory: (column_major, leading dimension).

    Row-major with ``ld`` (element ``(i, j)`` at ``i * ld + j``) or column-major with
    ``ld`` (at ``i + j * ld``); both are what BLAS can address without a copy.
    """
    rows, cols = x.shape[-2:]
    s0, s1 = x.strides[-2:]
    e = x.itemsize
    if rows == 0 or cols == 0:
        return False, cols if cols > 1 else 1
    if (cols == 1 or s1 == e) and (rows == 1 or (s0 > 0 and s0 % e == 0 and s0 // e >= cols)):
        return False, s0 // e if rows > 1 else cols
    if (rows == 1 or s0 == e) and (cols == 1 or (s1 > 0 and s1 % e == 0 and s1 // e >= rows)):
        return True, s1 // e if cols > 1 else rows
    raise InvalidArgumentError(
        f"{name} (shape {x.shape}, strides {x.strides}) is neither row- nor column-major with unit "
        "element stride; copy() it first"
    )


def _overlap(x: DeviceArray, y: DeviceArray) -> bool:
    """True when the byte ranges the two arrays span intersect."""
    if not x.size or not y.size:
        return False
    xlo, xhi = _span(x.shape, x.strides, x.itemsize)
    ylo, yhi = _span(y.shape, y.strides, y.itemsize)
    return x.ptr + xlo < y.ptr + yhi and y.ptr + ylo < x.ptr + xhi


def _batch_stride(name: str, x: DeviceArray) -> int:
    if x.ndim == 2:
        return 0
    stride = x.strides[0]
    if stride < 0 or stride % x.itemsize:
        raise InvalidArgumentError(f"{name} has a batch stride of {stride} bytes that BLAS cannot address")
    return stride // x.itemsize


def matmul(
    a: DeviceArray,
    b: DeviceArray,
    *,
    out: DeviceArray | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> DeviceArray:
    """Matrix product ``out = alpha * a @ b + beta * out`` of row-major arrays, without copies.

    Parameters
    ----------
    a, b : DeviceArray
        float32 or float64 (the same), 2-D (``m x k`` @ ``k x n``) or batched: 3-D
        operands of equal batch size, or one 3-D and one 2-D operand (the 2-D one is
        used for every batch, stride 0). Row-major operands, transposed views (``.T``)
        and column slices are all addressed in place through BLAS leading dimensions.
    out : DeviceArray, optional
        Output of shape ``(m, n)`` / ``(batch, m, n)``, row- or column-major.
    alpha, beta : float, optional
        Scale factors; ``beta`` needs ``out`` (whose contents it scales).

    Notes
    -----
    A row-major ``C = A @ B`` is the column-major product ``C^T = B^T A^T``, and a
    row-major matrix read as column-major *is* its transpose. So with all three
    operands row-major the call is ``gemm("N", "N", n, m, k, alpha, B, ldb, A, lda,
    beta, C, ldc)``; column-major operands flip the corresponding transpose flag.
    Batches go to ``batched_gemm`` with element strides.
    """
    _arrays(a=a, b=b, out=out)
    _check_dtype("a", a, [F32, F64])
    if b.dtype != a.dtype:
        raise InvalidArgumentError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.ndim not in (2, 3) or b.ndim not in (2, 3):
        raise InvalidArgumentError(
            f"matmul takes 2-D or 3-D arrays, got shapes {a.shape} and {b.shape} (reshape vectors to "
            "(1, k) or (k, 1))"
        )
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2:
        raise InvalidArgumentError(f"matmul shapes {a.shape} and {b.shape} do not align ({k} != {k2})")
    batched = a.ndim == 3 or b.ndim == 3
    batch = a.shape[0] if a.ndim == 3 else b.shape[0]
    if a.ndim == 3 and b.ndim == 3 and a.shape[0] != b.shape[0]:
        raise InvalidArgumentError(f"batch sizes differ: {a.shape[0]} and {b.shape[0]}")
    shape = (batch, m, n) if batched else (m, n)
    if out is None and beta != 0:
        raise InvalidArgumentError("beta != 0 scales an existing output: pass out=")
    if out is None:
        c, fresh = empty(shape, a.backend, dtype=a.dtype), True
    else:
        if out.shape != shape:
            raise InvalidArgumentError(f"out has shape {out.shape}, expected {shape}")
        _check_dtype("out", out, [a.dtype])
        c, fresh = out, False
    if not fresh and (_overlap(c, a) or _overlap(c, b)):
        raise InvalidArgumentError("out must not share memory with a or b (BLAS reads them while writing)")
    a_col, lda = _layout("a", a)
    b_col, ldb = _layout("b", b)
    c_col, ldc = _layout("out", c)
    dtype = str(a.dtype)
    if c_col:
        # Column-major C = op(A) op(B): a column-major operand is used as stored.
        args = ("T" if not a_col else "N", "T" if not b_col else "N", m, n, k, alpha)
        first, ld1, s1 = a, lda, _batch_stride("a", a)
        second, ld2, s2 = b, ldb, _batch_stride("b", b)
    else:
        # Row-major C: compute C^T = B^T A^T; a row-major operand *is* its transpose.
        args = ("T" if b_col else "N", "T" if a_col else "N", n, m, k, alpha)
        first, ld1, s1 = b, ldb, _batch_stride("b", b)
        second, ld2, s2 = a, lda, _batch_stride("a", a)
    backend = a.backend
    if not batched:

        def call() -> None:
            backend.gemm(*args, first.ptr, ld1, second.ptr, ld2, beta, c.ptr, ldc, dtype=dtype)

    else:
        sc = _batch_stride("out", c)

        def call() -> None:
            backend.batched_gemm(
                *args, first.ptr, ld1, s1, second.ptr, ld2, s2, beta, c.ptr, ldc, sc, batch, dtype=dtype
            )

    return _run(c, fresh, call)


# --------------------------------------------------------------------------- convolution


def _conv_out(
    h: int, w: int, fh: int, fw: int, stride: tuple[int, int], padding: tuple[int, int]
) -> tuple[int, int]:
    (sh, sw), (ph, pw) = stride, padding
    if sh < 1 or sw < 1:
        raise InvalidArgumentError(f"stride must be >= 1, got {stride}")
    if ph < 0 or pw < 0:
        raise InvalidArgumentError(f"padding must be >= 0, got {padding}")
    if fh < 1 or fw < 1:
        raise InvalidArgumentError(f"filter height and width must be >= 1, got ({fh}, {fw})")
    if h + 2 * ph < fh or w + 2 * pw < fw:
        raise InvalidArgumentError(
            f"padded input {h + 2 * ph}x{w + 2 * pw} is smaller than the filter {fh}x{fw}"
        )
    return (h + 2 * ph - fh) // sh + 1, (w + 2 * pw - fw) // sw + 1


def _four(name: str, x: DeviceArray) -> tuple[int, int, int, int]:
    if x.ndim != 4:
        raise InvalidArgumentError(f"{name} must be 4-D, got shape {x.shape}")
    n, c, h, w = x.shape
    return n, c, h, w


def conv2d(
    x: DeviceArray,
    weight: DeviceArray,
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """2-D cross-correlation of an NCHW float32 input with a KCHW filter (``conv2d_forward``).

    Returns the ``(N, K, Oh, Ow)`` output with ``Oh = (H + 2*ph - Fh) // sh + 1``.
    """
    _inputs([F32], x=x, weight=weight)
    n, c, h, w = _four("x", x)
    k, fc, fh, fw = _four("weight", weight)
    if fc != c:
        raise InvalidArgumentError(f"weight has {fc} input channels but x has {c}")
    st, pad = _pair("stride", stride), _pair("padding", padding)
    oh, ow = _conv_out(h, w, fh, fw, st, pad)
    y, fresh = _output(out, x, (n, k, oh, ow), F32)
    backend = x.backend
    return _run(
        y,
        fresh,
        lambda: backend.conv2d_forward(
            x.ptr, list(x.shape), weight.ptr, list(weight.shape), y.ptr, list(y.shape), list(st), list(pad)
        ),
    )


def conv2d_backward_data(
    grad_output: DeviceArray,
    weight: DeviceArray,
    input_shape: Sequence[int],
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Gradient of :func:`conv2d` with respect to its input, of shape ``input_shape`` (NCHW)."""
    _inputs([F32], grad_output=grad_output, weight=weight)
    shape = _as_shape(input_shape, "input_shape")
    if len(shape) != 4:
        raise InvalidArgumentError(f"input_shape must have 4 entries, got {shape}")
    _four("grad_output", grad_output)
    _four("weight", weight)
    st, pad = _pair("stride", stride), _pair("padding", padding)
    gx, fresh = _output(out, grad_output, shape, F32)
    backend = grad_output.backend
    return _run(
        gx,
        fresh,
        lambda: backend.conv2d_backward_data(
            grad_output.ptr,
            list(grad_output.shape),
            weight.ptr,
            list(weight.shape),
            gx.ptr,
            list(gx.shape),
            list(st),
            list(pad),
        ),
    )


def conv2d_backward_filter(
    x: DeviceArray,
    grad_output: DeviceArray,
    filter_shape: Sequence[int],
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Gradient of :func:`conv2d` with respect to its filter.

    ``filter_shape`` is the full ``(K, C, Fh, Fw)`` or just ``(Fh, Fw)`` (K and C then
    come from ``grad_output`` and ``x``).
    """
    _inputs([F32], x=x, grad_output=grad_output)
    _four("x", x)
    _four("grad_output", grad_output)
    dims = _as_shape(filter_shape, "filter_shape")
    if len(dims) == 2:
        dims = (grad_output.shape[1], x.shape[1], *dims)
    if len(dims) != 4:
        raise InvalidArgumentError(f"filter_shape must have 4 (or 2) entries, got {dims}")
    st, pad = _pair("stride", stride), _pair("padding", padding)
    gw, fresh = _output(out, x, dims, F32)
    backend = x.backend
    return _run(
        gw,
        fresh,
        lambda: backend.conv2d_backward_filter(
            x.ptr,
            list(x.shape),
            grad_output.ptr,
            list(grad_output.shape),
            gw.ptr,
            list(gw.shape),
            list(st),
            list(pad),
        ),
    )


# --------------------------------------------------------------------------- attention


def attention(
    q: DeviceArray,
    k: DeviceArray,
    v: DeviceArray,
    *,
    scale: float | None = None,
    causal: bool = False,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Scaled dot-product attention ``softmax(q @ k^T * scale) @ v`` (float32).

    ``q`` is ``(batch, heads, seq_q, head_dim)``, ``k`` and ``v`` are
    ``(batch, heads, seq_kv, head_dim)``; ``scale`` defaults to ``1 / sqrt(head_dim)``.
    Causal masking is bottom-right aligned (see ``ComputeBackend.attention``).
    """
    _inputs([F32], q=q, k=k, v=v)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise InvalidArgumentError(f"q, k, v must be 4-D, got {q.shape}, {k.shape}, {v.shape}")
    batch, heads, seq_q, head_dim = q.shape
    if k.shape != v.shape:
        raise InvalidArgumentError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    if (k.shape[0], k.shape[1], k.shape[3]) != (batch, heads, head_dim):
        raise InvalidArgumentError(
            f"k shape {k.shape} does not match q shape {q.shape} in batch, heads, head_dim"
        )
    seq_kv = k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    o, fresh = _output(out, q, q.shape, F32)
    backend = q.backend
    return _run(
        o,
        fresh,
        lambda: backend.attention(
            q.ptr, k.ptr, v.ptr, o.ptr, batch, heads, seq_q, seq_kv, head_dim, scale, bool(causal)
        ),
    )


# --------------------------------------------------------------------------- reductions


def softmax(x: DeviceArray, axis: int = -1, *, out: DeviceArray | None = None) -> DeviceArray:
    """Numerically stable softmax of a float32 array along ``axis`` (``out`` may be ``x``)."""
    _inputs([F32], x=x)
    if x.ndim == 0:
        raise InvalidArgumentError("softmax needs at least one dimension")
    ax = _axis(axis, x.ndim)
    y, fresh = _output(out, x, x.shape, F32)
    backend = x.backend
    return _run(y, fresh, lambda: backend.softmax(x.ptr, y.ptr, list(x.shape), ax))


def reduce(
    op: ReduceOp | str,
    x: DeviceArray,
    axis: int | None = None,
    *,
    keepdims: bool = False,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Reduce a float32 array with ``op`` (sum, max, min, mean) along ``axis``.

    ``axis=None`` reduces every element (the contiguous array is viewed as 1-D).
    MAX / MIN ignore NaN; an empty axis gives 0 (sum, mean), -inf (max), +inf (min).
    """
    rop = coerce_enum(ReduceOp, op, "op")
    _inputs([F32], x=x)
    if axis is None:
        shape_in, ax = [x.size], 0
        shape_out: tuple[int, ...] = (1,) * x.ndim if keepdims else ()
    else:
        if x.ndim == 0:
            raise InvalidArgumentError("cannot reduce a 0-d array along an axis")
        ax = _axis(axis, x.ndim)
        shape_in = list(x.shape)
        kept = (
            [1 if i == ax else d for i, d in enumerate(x.shape)]
            if keepdims
            else [d for i, d in enumerate(x.shape) if i != ax]
        )
        shape_out = tuple(kept)
    y, fresh = _output(out, x, shape_out, F32)
    backend = x.backend
    return _run(y, fresh, lambda: backend.reduce(rop, x.ptr, y.ptr, shape_in, ax))


def sum(  # noqa: A001 - NumPy's name
    x: DeviceArray, axis: int | None = None, *, keepdims: bool = False, out: DeviceArray | None = None
) -> DeviceArray:
    """Sum along ``axis`` (all elements when None); see :func:`reduce`."""
    return reduce(ReduceOp.SUM, x, axis, keepdims=keepdims, out=out)


def max(  # noqa: A001 - NumPy's name
    x: DeviceArray, axis: int | None = None, *, keepdims: bool = False, out: DeviceArray | None = None
) -> DeviceArray:
    """Maximum along ``axis``, ignoring NaN; see :func:`reduce`."""
    return reduce(ReduceOp.MAX, x, axis, keepdims=keepdims, out=out)


def min(  # noqa: A001 - NumPy's name
    x: DeviceArray, axis: int | None = None, *, keepdims: bool = False, out: DeviceArray | None = None
) -> DeviceArray:
    """Minimum along ``axis``, ignoring NaN; see :func:`reduce`."""
    return reduce(ReduceOp.MIN, x, axis, keepdims=keepdims, out=out)


def mean(
    x: DeviceArray, axis: int | None = None, *, keepdims: bool = False, out: DeviceArray | None = None
) -> DeviceArray:
    """Mean along ``axis``; see :func:`reduce`."""
    return reduce(ReduceOp.MEAN, x, axis, keepdims=keepdims, out=out)


# --------------------------------------------------------------------------- element-wise


def unary(op: UnaryOp | str, x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """Apply a :class:`~computehal.UnaryOp` to every element of a float32 array (``out`` may be ``x``)."""
    uop = coerce_enum(UnaryOp, op, "op")
    _inputs([F32], x=x)
    y, fresh = _output(out, x, x.shape, F32)
    backend = x.backend
    return _run(y, fresh, lambda: backend.unary(uop, x.ptr, y.ptr, x.size))


def relu(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``max(x, 0)`` (NaN gives 0)."""
    return unary(UnaryOp.RELU, x, out=out)


def sigmoid(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``1 / (1 + exp(-x))``."""
    return unary(UnaryOp.SIGMOID, x, out=out)


def tanh(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """Hyperbolic tangent."""
    return unary(UnaryOp.TANH, x, out=out)


def exp(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``e ** x``."""
    return unary(UnaryOp.EXP, x, out=out)


def log(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """Natural logarithm."""
    return unary(UnaryOp.LOG, x, out=out)


def sqrt(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """Square root."""
    return unary(UnaryOp.SQRT, x, out=out)


def abs(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:  # noqa: A001 - NumPy's name
    """Absolute value."""
    return unary(UnaryOp.ABS, x, out=out)


def neg(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``-x``."""
    return unary(UnaryOp.NEG, x, out=out)


def binary(
    op: BinaryOp | str, a: DeviceArray, b: DeviceArray, *, out: DeviceArray | None = None
) -> DeviceArray:
    """Apply a :class:`~computehal.BinaryOp` element-wise to two float32 arrays of one shape.

    There is no broadcasting; ``out`` may be ``a`` or ``b``.
    """
    bop = coerce_enum(BinaryOp, op, "op")
    _inputs([F32], a=a, b=b)
    if a.shape != b.shape:
        raise InvalidArgumentError(f"shapes {a.shape} and {b.shape} differ (no broadcasting)")
    y, fresh = _output(out, a, a.shape, F32)
    backend = a.backend
    return _run(y, fresh, lambda: backend.binary(bop, a.ptr, b.ptr, y.ptr, a.size))


def add(a: DeviceArray, b: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``a + b``."""
    return binary(BinaryOp.ADD, a, b, out=out)


def sub(a: DeviceArray, b: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``a - b``."""
    return binary(BinaryOp.SUB, a, b, out=out)


def mul(a: DeviceArray, b: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``a * b``."""
    return binary(BinaryOp.MUL, a, b, out=out)


def div(a: DeviceArray, b: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``a / b`` (IEEE: x/0 is inf, 0/0 is NaN)."""
    return binary(BinaryOp.DIV, a, b, out=out)


def maximum(a: DeviceArray, b: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """Element-wise maximum, ignoring NaN (like ``numpy.fmax``)."""
    return binary(BinaryOp.MAX, a, b, out=out)


def minimum(a: DeviceArray, b: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """Element-wise minimum, ignoring NaN (like ``numpy.fmin``)."""
    return binary(BinaryOp.MIN, a, b, out=out)


# --------------------------------------------------------------------------- gather / scatter


def _index_count(indices: Any) -> int:
    if isinstance(indices, np.ndarray) and indices.ndim != 1:
        raise InvalidArgumentError(f"indices must be one-dimensional, got {indices.ndim} dimensions")
    try:
        return len(indices)
    except TypeError:
        raise InvalidArgumentError(
            f"indices must be a sequence of integers or an integer array, got {type(indices).__name__}"
        ) from None


def _rows(name: str, x: DeviceArray) -> tuple[int, int]:
    if x.ndim == 0:
        raise InvalidArgumentError(f"{name} needs at least one dimension (rows)")
    return x.shape[0], math.prod(x.shape[1:])


def take(x: DeviceArray, indices: Any, *, out: DeviceArray | None = None) -> DeviceArray:
    """Rows ``x[indices]`` of a float32 array (``gather``); output shape ``(len(indices), *x.shape[1:])``."""
    _inputs([F32], x=x)
    rows, cols = _rows("x", x)
    count = _index_count(indices)
    y, fresh = _output(out, x, (count, *x.shape[1:]), F32)
    backend = x.backend
    return _run(y, fresh, lambda: backend.gather(x.ptr, indices, y.ptr, rows, cols))


def put(x: DeviceArray, indices: Any, values: DeviceArray) -> DeviceArray:
    """Write ``values`` row ``i`` into row ``indices[i]`` of ``x`` in place (``scatter``); returns ``x``.

    Rows not named keep their values; with duplicate indices the last one wins. A bad
    index raises before anything is written.
    """
    _inputs([F32], x=x, values=values)
    rows, cols = _rows("x", x)
    count = _index_count(indices)
    if values.shape != (count, *x.shape[1:]):
        raise InvalidArgumentError(f"values has shape {values.shape}, expected {(count, *x.shape[1:])}")
    x.backend.scatter(values.ptr, indices, x.ptr, rows, cols)
    return x
