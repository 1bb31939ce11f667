"""Independent NumPy definitions of every operation, used as the conformance oracle.

These functions are written from SPEC section 4 alone, in float64 and in the most
literal form (``einsum``, explicit loops over filter taps and rows), deliberately
sharing no code with any backend: a backend is never checked against itself.
Each returns the exact (float64) result; callers round or compare with tolerances.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "F64Array",
    "stored_colmajor",
    "gemm",
    "conv2d_forward",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "conv2d_output_shape",
    "attention",
    "reduce",
    "softmax",
    "unary",
    "binary",
    "gather",
    "scatter",
    "round_f16",
    "round_bf16",
]

F64Array = npt.NDArray[np.float64]


def _f64(x: npt.ArrayLike) -> F64Array:
    return np.asarray(x, dtype=np.float64)


def stored_colmajor(flat: npt.ArrayLike, rows: int, cols: int, ld: int) -> F64Array:
    """The ``rows x cols`` matrix held column-major with leading dimension ``ld`` in ``flat``."""
    data = _f64(flat).reshape(-1)
    out = np.empty((rows, cols), dtype=np.float64)
    for j in range(cols):
        out[:, j] = data[j * ld : j * ld + rows]
    return out


def gemm(
    trans_a: bool,
    trans_b: bool,
    alpha: float,
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    beta: float,
    c: npt.ArrayLike,
) -> F64Array:
    """``alpha * op(A) @ op(B) + beta * C`` with reference-BLAS special cases.

    ``a`` and ``b`` are the matrices as stored (before ``op``); ``c`` is m x n.
    When ``beta == 0`` C is not read (NaN in C does not survive); when ``k == 0`` or
    ``alpha == 0`` A and B are not read.
    """
    c64 = _f64(c)
    m, n = c64.shape
    a64 = _f64(a)
    b64 = _f64(b)
    op_a = a64.T if trans_a else a64
    op_b = b64.T if trans_b else b64
    k = op_a.shape[1]
    base = np.zeros((m, n)) if beta == 0.0 else beta * c64
    if k == 0 or alpha == 0.0:
        return base
    with np.errstate(all="ignore"):
        product: F64Array = alpha * np.einsum("il,lj->ij", op_a, op_b) + base
    return product


def conv2d_output_shape(
    x_shape: Sequence[int], f_shape: Sequence[int], stride: Sequence[int], padding: Sequence[int]
) -> tuple[int, int, int, int]:
    """[N, K, Oh, Ow] of a forward convolution (SPEC section 4)."""
    n, _, h, w = x_shape
    k, _, fh, fw = f_shape
    return (
        n,
        k,
        (h + 2 * padding[0] - fh) // stride[0] + 1,
        (w + 2 * padding[1] - fw) // stride[1] + 1,
    )


def conv2d_forward(
    x: npt.ArrayLike, f: npt.ArrayLike, stride: Sequence[int], padding: Sequence[int]
) -> F64Array:
    """Cross-correlation, NCHW input, KCHW filter, zero padding.

    ``y[n, k, i, j] = sum_{c, r, s} xpad[n, c, i*sh + r, j*sw + s] * f[k, c, r, s]``,
    computed as a sum over filter taps of one ``einsum`` each.
    """
    x64, f64 = _f64(x), _f64(f)
    n, c, h, w = x64.shape
    k, _, fh, fw = f64.shape
    sh, sw = stride
    ph, pw = padding
    _, _, oh, ow = conv2d_output_shape(x64.shape, f64.shape, stride, padding)
    xpad = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    xpad[:, :, ph : ph + h, pw : pw + w] = x64
    y = np.zeros((n, k, oh, ow))
    for r in range(fh):
        for s in range(fw):
            rows = [i * sh + r for i in range(oh)]
            cols = [j * sw + s for j in range(ow)]
            patch = xpad[:, :, rows, :][:, :, :, cols]
            y += np.einsum("ncij,kc->nkij", patch, f64[:, :, r, s])
    return y


def conv2d_backward_data(
    gy: npt.ArrayLike,
    f: npt.ArrayLike,
    x_shape: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
) -> F64Array:
    """Gradient of :func:`conv2d_forward` with respect to its input.

    Every output position scatters ``gy * f`` back to the input positions it read;
    padded positions are dropped, and positions never read get zero.
    """
    gy64, f64 = _f64(gy), _f64(f)
    n, c, h, w = x_shape
    k, _, fh, fw = f64.shape
    sh, sw = stride
    ph, pw = padding
    _, _, oh, ow = gy64.shape
    gpad = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    for i in range(oh):
        for j in range(ow):
            # contribution[n, c, r, s] = sum_k gy[n, k, i, j] * f[k, c, r, s]
            contribution = np.einsum("nk,kcrs->ncrs", gy64[:, :, i, j], f64)
            gpad[:, :, i * sh : i * sh + fh, j * sw : j * sw + fw] += contribution
    return gpad[:, :, ph : ph + h, pw : pw + w].copy()


def conv2d_backward_filter(
    x: npt.ArrayLike,
    gy: npt.ArrayLike,
    f_shape: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
) -> F64Array:
    """Gradient of :func:`conv2d_forward` with respect to the filter.

    ``gf[k, c, r, s] = sum_{n, i, j} gy[n, k, i, j] * xpad[n, c, i*sh + r, j*sw + s]``.
    """
    x64, gy64 = _f64(x), _f64(gy)
    n, c, h, w = x64.shape
    k, _, fh, fw = f_shape
    sh, sw = stride
    ph, pw = padding
    _, _, oh, ow = gy64.shape
    xpad = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    xpad[:, :, ph : ph + h, pw : pw + w] = x64
    gf = np.zeros((k, c, fh, fw))
    for i in range(oh):
        for j in range(ow):
            window = xpad[:, :, i * sh : i * sh + fh, j * sw : j * sw + fw]
            gf += np.einsum("nk,ncrs->kcrs", gy64[:, :, i, j], window)
    return gf


def attention(q: npt.ArrayLike, k: npt.ArrayLike, v: npt.ArrayLike, scale: float, causal: bool) -> F64Array:
    """``softmax(Q K^T * scale) V`` per (batch, head), with the bottom-right causal mask.

    Query ``i`` may see key ``j`` iff ``j <= i + (seq_kv - seq_q)``; a query that sees
    no key gets an all-zero row. The full score matrix is formed (this is the oracle).
    """
    q64, k64, v64 = _f64(q), _f64(k), _f64(v)
    seq_q, seq_kv = q64.shape[-2], k64.shape[-2]
    scores = np.einsum("bhid,bhjd->bhij", q64, k64) * scale
    visible = np.ones((seq_q, seq_kv), dtype=bool)
    if causal:
        i = np.arange(seq_q)[:, None]
        j = np.arange(seq_kv)[None, :]
        visible = j <= i + (seq_kv - seq_q)
    masked = np.where(visible, scores, -np.inf)
    peak = masked.max(axis=-1, keepdims=True)
    sees_any = visible.any(axis=-1)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    weights = np.where(visible, np.exp(masked - peak), 0.0)
    total = weights.sum(axis=-1, keepdims=True)
    total = np.where(total > 0, total, 1.0)
    out: F64Array = np.einsum("bhij,bhjd->bhid", weights / total, v64)
    out[..., ~sees_any, :] = 0.0
    return out


def reduce(op: str, x: npt.ArrayLike, axis: int) -> F64Array:
    """``sum`` / ``mean`` / NaN-ignoring ``max`` / ``min`` over ``axis``.

    MAX (MIN) is a fold of ``fmax`` (``fmin``) starting from -inf (+inf): NaN entries
    are skipped, so a slice with no number gives -inf (+inf). An empty axis gives 0
    for SUM and MEAN.
    """
    x64 = _f64(x)
    moved = np.moveaxis(x64, axis, -1)
    out = np.empty(moved.shape[:-1])
    for index in np.ndindex(*moved.shape[:-1]):
        values = [float(value) for value in moved[index].tolist()]
        if op == "sum" or op == "mean":
            total = 0.0
            for value in values:
                total = total + value
            out[index] = total / len(values) if (op == "mean" and values) else total
        elif op == "max":
            best = -np.inf
            for value in values:
                if value == value and value > best:
                    best = value
            out[index] = best
        elif op == "min":
            best = np.inf
            for value in values:
                if value == value and value < best:
                    best = value
            out[index] = best
        else:
            raise ValueError(f"unknown reduction {op!r}")
    return out


def softmax(x: npt.ArrayLike, axis: int) -> F64Array:
    """``exp(x - m) / sum(exp(x - m))`` along ``axis`` with ``m`` the NaN-ignoring max.

    A slice with no number has ``m = -inf``, so it becomes NaN, as does any slice
    holding a NaN or a +inf.
    """
    x64 = _f64(x)
    moved = np.moveaxis(x64, axis, -1)
    out = np.empty_like(moved)
    with np.errstate(all="ignore"):
        for index in np.ndindex(*moved.shape[:-1]):
            row = moved[index]
            numbers = row[~np.isnan(row)]
            peak = numbers.max() if numbers.size else -np.inf
            e = np.exp(row - peak)
            out[index] = e / e.sum()
    return np.moveaxis(out, -1, axis)


def unary(op: str, x: npt.ArrayLike) -> F64Array:
    """Element-wise ``op`` in float64; RELU maps NaN to 0, LOG / SQRT of negatives give NaN."""
    x64 = _f64(x)
    with np.errstate(all="ignore"):
        if op == "relu":
            return np.where(x64 > 0, x64, 0.0)
        if op == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x64))
        if op == "tanh":
            return np.tanh(x64)
        if op == "exp":
            return np.exp(x64)
        if op == "log":
            return np.log(x64)
        if op == "sqrt":
            return np.sqrt(x64)
        if op == "abs":
            return np.abs(x64)
        if op == "neg":
            return -x64
    raise ValueError(f"unknown unary op {op!r}")


def binary(op: str, a: npt.ArrayLike, b: npt.ArrayLike) -> F64Array:
    """Element-wise ``op`` in float64; MAX / MIN return the other operand when one is NaN."""
    a64, b64 = _f64(a), _f64(b)
    with np.errstate(all="ignore"):
        if op == "add":
            return a64 + b64
        if op == "sub":
            return a64 - b64
        if op == "mul":
            return a64 * b64
        if op == "div":
            return a64 / b64
        if op in ("max", "min"):
            pick = a64 > b64 if op == "max" else a64 < b64
            out = np.where(pick, a64, b64)
            out = np.where(np.isnan(a64), b64, out)
            return np.where(np.isnan(b64), a64, out)
    raise ValueError(f"unknown binary op {op!r}")


def gather(table: npt.ArrayLike, indices: Sequence[int]) -> F64Array:
    """``out[i] = table[indices[i]]``, one row at a time."""
    t = _f64(table)
    out = np.empty((len(indices), t.shape[1]))
    for i, index in enumerate(indices):
        out[i] = t[int(index)]
    return out


def scatter(rows_in: npt.ArrayLike, indices: Sequence[int], out: npt.ArrayLike) -> F64Array:
    """``out[indices[i]] = rows_in[i]`` in order, so the last duplicate wins."""
    result = _f64(out).copy()
    src = _f64(rows_in)
    for i, index in enumerate(indices):
        result[int(index)] = src[i]
    return result


def _round_via_bits(x: npt.ArrayLike, to_narrow: Any) -> npt.NDArray[np.float32]:
    with np.errstate(all="ignore"):
        return np.asarray(np.asarray(x, dtype=np.float32).astype(to_narrow).astype(np.float32))


def round_f16(x: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """float32 -> IEEE half (round to nearest even) -> float32, through NumPy's float16."""
    return _round_via_bits(x, np.float16)


def round_bf16(x: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """float32 -> bfloat16 (round to nearest even) -> float32, through ml_dtypes."""
    import ml_dtypes

    return _round_via_bits(x, ml_dtypes.bfloat16)
