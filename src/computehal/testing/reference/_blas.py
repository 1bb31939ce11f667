"""GEMM definitions: plain, strided batched and mixed precision (column-major storage)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ._rounding import F64Array, round_to

__all__ = ["stored_colmajor", "gemm", "batched_gemm", "gemm_mixed_precision"]


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
    ``alpha == 0`` A and B are not read. Otherwise IEEE: the dot products are formed
    term by term (``einsum``), so a NaN or infinity reaches every entry that reads it
    and ``inf * 0`` is NaN.
    """
    c64 = _f64(c)
    m, n = c64.shape
    op_a = _f64(a).T if trans_a else _f64(a)
    op_b = _f64(b).T if trans_b else _f64(b)
    k = op_a.shape[1]
    with np.errstate(all="ignore"):
        base = np.zeros((m, n)) if beta == 0.0 else beta * c64
        if k == 0 or alpha == 0.0:
            return base
        product: F64Array = alpha * np.einsum("il,lj->ij", op_a, op_b) + base
    return product


def batched_gemm(
    trans_a: bool,
    trans_b: bool,
    alpha: float,
    a: Sequence[npt.ArrayLike],
    b: Sequence[npt.ArrayLike],
    beta: float,
    c: Sequence[npt.ArrayLike],
) -> list[F64Array]:
    """:func:`gemm` per batch: ``C_i = alpha * op(A_i) @ op(B_i) + beta * C_i``."""
    return [gemm(trans_a, trans_b, alpha, ai, bi, beta, ci) for ai, bi, ci in zip(a, b, c, strict=True)]


def gemm_mixed_precision(
    prec: str,
    trans_a: bool,
    trans_b: bool,
    alpha: float,
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    beta: float,
    c: npt.ArrayLike,
) -> F64Array:
    """:func:`gemm` on A and B first rounded to ``prec`` ("f16" / "bf16", nearest even)."""
    target = "float16" if prec.lower() == "f16" else "bfloat16"
    ar = round_to(np.asarray(a, dtype=np.float32), target)
    br = round_to(np.asarray(b, dtype=np.float32), target)
    return gemm(trans_a, trans_b, alpha, ar, br, beta, c)
