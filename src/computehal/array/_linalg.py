"""Matrix products of arrays: one ``gemm`` or ``batched_gemm`` call, without copies."""

from __future__ import annotations

from ..dtypes import FLOAT_DTYPES
from ..errors import InvalidArgumentError
from ._checks import arrays, overlap, run
from ._core import DeviceArray
from ._create import empty

__all__ = ["matmul"]


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


def _batch_stride(name: str, x: DeviceArray) -> int:
    if x.ndim == 2:
        return 0
    stride = x.strides[0]
    if stride < 0 or stride % x.itemsize:
        raise InvalidArgumentError(f"{name} has a batch stride of {stride} bytes that BLAS cannot address")
    return stride // x.itemsize


def _product_shape(a: DeviceArray, b: DeviceArray, out: DeviceArray | None) -> tuple[int, ...]:
    """The shape of ``a @ b`` (checking operands, dtypes and shapes)."""
    arrays(a=a, b=b, out=out)
    if a.dtype.name not in FLOAT_DTYPES:
        raise InvalidArgumentError(f"a has dtype {a.dtype}; matmul takes {', '.join(FLOAT_DTYPES)}")
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
    return (batch, m, n) if batched else (m, n)


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
        One floating dtype (passed to the backend's GEMM as it is); 2-D
        (``m x k`` @ ``k x n``) or batched: 3-D operands of equal batch size, or one
        3-D and one 2-D operand (the 2-D one is used for every batch, stride 0).
        Row-major operands, transposed views (``.T``) and column slices are all
        addressed in place through BLAS leading dimensions.
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
    shape = _product_shape(a, b, out)
    if out is None and beta != 0:
        raise InvalidArgumentError("beta != 0 scales an existing output: pass out=")
    if out is None:
        c, fresh = empty(shape, a.backend, dtype=a.dtype), True
    else:
        if out.shape != shape:
            raise InvalidArgumentError(f"out has shape {out.shape}, expected {shape}")
        if out.dtype != a.dtype:
            raise InvalidArgumentError(f"out has dtype {out.dtype}, expected {a.dtype}")
        c, fresh = out, False
    if not fresh and (overlap(c, a) or overlap(c, b)):
        raise InvalidArgumentError("out must not share memory with a or b (BLAS reads them while writing)")
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
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
    if len(shape) == 2:

        def call() -> None:
            backend.gemm(*args, first.ptr, ld1, second.ptr, ld2, beta, c.ptr, ldc, dtype=dtype)

    else:
        sc, batch = _batch_stride("out", c), shape[0]

        def call() -> None:
            backend.batched_gemm(
                *args, first.ptr, ld1, s1, second.ptr, ld2, s2, beta, c.ptr, ldc, sc, batch, dtype=dtype
            )

    return run(c, fresh, call)
