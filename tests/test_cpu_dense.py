"""The CPU backend's compiled product for batched GEMMs sharing B (weights stored as panels).

Checked against float64 NumPy products on the stored matrices, with every byte of C
outside the batches' matrices compared to what was there before (sentinels).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

RNG = np.random.default_rng(7)


def _upload(be: Any, array: np.ndarray) -> int:
    ptr = be.alloc(array.nbytes)
    be.copy_htod(ptr, array)
    return int(ptr)


def _column_major(flat: np.ndarray, at: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The column-major ``rows x cols`` matrix with leading dimension ``ld`` at element ``at``."""
    return flat[at + np.arange(rows)[:, None] + ld * np.arange(cols)[None, :]]


CASES = [
    # m, n, k, batch, trans_b, beta, c_nan, lda pad, ldc pad, stride_c (None: packed)
    (64, 128, 96, 6, False, 0.0, False, 0, 0, None),  # head-major: 6 rows tiles, 64-column panels
    (64, 37, 70, 3, False, 1.0, False, 0, 0, None),  # accumulate; rows 6 * 6 + 1
    (53, 29, 19, 5, True, 0.0, False, 3, 2, None),  # masked last vector, transposed B
    (16, 9, 16, 2, True, 1.0, False, 0, 0, None),
    (100, 40, 33, 4, False, 0.0, True, 0, 0, None),  # C all NaN with beta = 0: never read
    (70, 20, 800, 2, False, 1.0, False, 0, 5, None),  # depth over one slice of a panel
    (64, 50, 40, 4, False, 1.0, False, 0, 192, 64),  # panels side by side: one row-major product
    (32, 12, 20, 3, True, 0.0, True, 0, 70, 34),  # side by side with gaps between the panels
]


@pytest.mark.parametrize(("m", "n", "k", "batch", "trans_b", "beta", "c_nan", "pa", "pc", "sc_arg"), CASES)
def test_batched_gemm_with_shared_b_matches_numpy(
    cpu_backend: Any,
    m: int,
    n: int,
    k: int,
    batch: int,
    trans_b: bool,
    beta: float,
    c_nan: bool,
    pa: int,
    pc: int,
    sc_arg: int | None,
) -> None:
    be = cpu_backend
    lda, ldc = m + pa, m + pc
    ldb = (n if trans_b else k) + 3
    sa, sc = lda * k + 5, sc_arg if sc_arg is not None else ldc * n + 7
    a = RNG.standard_normal(sa * batch).astype(np.float32)
    c_size = max(sc * batch, sc * (batch - 1) + ldc * n) + 11
    b = RNG.standard_normal(ldb * (k if trans_b else n)).astype(np.float32)
    c = np.full(c_size, np.nan, np.float32) if c_nan else RNG.standard_normal(c_size)
    c = c.astype(np.float32)
    pa_, pb_, pc_ = (_upload(be, x) for x in (a, b, c))
    try:
        be.batched_gemm(
            "N", "T" if trans_b else "N", m, n, k, 1.0, pa_, lda, sa, pb_, ldb, 0, beta, pc_, ldc, sc, batch
        )
        out = np.empty_like(c)
        be.copy_dtoh(out, pc_)
    finally:
        for p in (pa_, pb_, pc_):
            be.free(p)
    op_b = _column_major(b, 0, n, k, ldb).T if trans_b else _column_major(b, 0, k, n, ldb)
    written = np.zeros(c.size, bool)
    for j in range(batch):
        a_j = _column_major(a, j * sa, m, k, lda).astype(np.float64)
        want = a_j @ op_b.astype(np.float64)
        if beta:
            want += beta * _column_major(c, j * sc, m, n, ldc)
        got = _column_major(out, j * sc, m, n, ldc)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))
        index = j * sc + np.arange(m)[:, None] + ldc * np.arange(n)[None, :]
        written[index.ravel()] = True
    np.testing.assert_array_equal(out[~written], c[~written])  # nothing else touched (NaN == NaN here)


def test_non_finite_operands_propagate_like_blas(cpu_backend: Any) -> None:
    be = cpu_backend
    m, n, k, batch = 64, 12, 32, 2
    a = RNG.standard_normal(m * k * batch).astype(np.float32)
    b = RNG.standard_normal(k * n).astype(np.float32)
    a[5] = np.inf  # A[5, 0] of batch 0: row 5 of C gets inf or NaN in every column where B[0, :] != 0
    b[k * 3 + 1] = np.nan  # B[1, 3]: column 3 of C is NaN in every batch
    c = np.zeros(m * n * batch, np.float32)
    ptrs = [_upload(be, x) for x in (a, b, c)]
    try:
        pa, pb, pc = ptrs
        be.batched_gemm("N", "N", m, n, k, 1.0, pa, m, m * k, pb, k, 0, 0.0, pc, m, m * n, batch)
        out = np.empty_like(c)
        be.copy_dtoh(out, ptrs[2])
    finally:
        for p in ptrs:
            be.free(p)
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(batch):
            a_j = a[j * m * k : (j + 1) * m * k].reshape(k, m).T.astype(np.float64)
            want = a_j @ b.reshape(n, k).T.astype(np.float64)
            got = out[j * m * n : (j + 1) * m * n].reshape(n, m).T
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_array_equal(np.isinf(got), np.isinf(want))


def test_panels_that_would_overlap_are_refused(cpu_backend: Any) -> None:
    from computehal.errors import InvalidArgumentError

    be = cpu_backend
    m, n, k, batch = 16, 4, 8, 3
    ptrs = [_upload(be, np.zeros(size, np.float32)) for size in (m * k * batch, k * n, 64 * n)]
    pa, pb, pc = ptrs
    try:
        # Side by side needs stride_c >= m and every batch inside a column of ldc.
        for stride_c, ldc in ((m - 1, 64), (m, 2 * m)):
            with pytest.raises(InvalidArgumentError):
                be.batched_gemm("N", "N", m, n, k, 1.0, pa, m, m * k, pb, k, 0, 0.0, pc, ldc, stride_c, batch)
        be.batched_gemm("N", "N", m, n, k, 1.0, pa, m, m * k, pb, k, 0, 0.0, pc, 3 * m, m, batch)
    finally:
        for p in ptrs:
            be.free(p)
