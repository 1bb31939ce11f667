"""The CPU backend's pulled float32 GEMV (one matrix-vector product split over two threads).

A ``gemm`` with one row or one column of C, large enough to split (``SPLIT_MACS``), with
unit-stride vectors, goes to :mod:`computehal.backends.cpu._kgemv`: the caller and a
worker take blocks of the matrix's columns. These tests make such calls through the
public ``gemm`` (both shapes of C, every transpose, alpha and beta, widths that are not
a multiple of the blocks' alignment, a NaN in C where ``beta`` is 0, several threads at
once) and compare them with a float64 product; a fixture counts the calls that reach the
kernel, so no case can pass on another path.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import computehal.backends.cpu._gemm as gemm_module
from computehal.backends.cpu import CpuBackend

F32 = np.float32


@pytest.fixture(scope="module")
def cpu() -> Any:
    be = CpuBackend()
    be.init()
    yield be
    be.close()


@pytest.fixture
def pulled(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records, for each GEMV that reaches the split, whether the pulled kernel ran it."""
    calls: list[bool] = []
    real = gemm_module._pulled_gemv

    def counted(p: Any) -> bool:
        done = real(p)
        calls.append(done)
        return done

    monkeypatch.setattr(gemm_module, "_pulled_gemv", counted)
    return calls


def _column_major(rng: np.random.Generator, rows: int, cols: int, ld: int) -> tuple[np.ndarray, np.ndarray]:
    """A random rows x cols matrix and its column-major storage with leading dimension ld."""
    storage = rng.standard_normal(ld * cols).astype(F32)
    return storage.reshape(cols, ld).T[:rows, :cols].astype(np.float64), storage


def _gemm(
    be: Any, ta: str, tb: str, m: int, n: int, k: int, alpha: float, beta: float, seed: int, pad: int = 0
) -> None:
    """Run one GEMV-shaped gemm through ``be`` (leading dimensions ``pad`` past the rows) and check it."""
    rng = np.random.default_rng(seed)
    a_rows, a_cols = (k, m) if ta == "T" else (m, k)
    b_rows, b_cols = (n, k) if tb == "T" else (k, n)
    lda, ldb, ldc = a_rows + pad, b_rows + pad, m
    a, a_store = _column_major(rng, a_rows, a_cols, lda)
    b, b_store = _column_major(rng, b_rows, b_cols, ldb)
    c0 = rng.standard_normal(m * n).astype(F32)
    if beta == 0:
        c0[::7] = np.nan  # beta 0: C is not read
    ptrs = [be.alloc(x.nbytes) for x in (a_store, b_store, c0)]
    try:
        for ptr, x in zip(ptrs, (a_store, b_store, c0), strict=True):
            be.copy_htod(ptr, x)
        be.gemm(ta, tb, m, n, k, alpha, ptrs[0], lda, ptrs[1], ldb, beta, ptrs[2], ldc, dtype="float32")
        got = np.empty_like(c0)
        be.copy_dtoh(got, ptrs[2])
    finally:
        for ptr in ptrs:
            be.free(ptr)
    op_a = a.T if ta == "T" else a
    op_b = b.T if tb == "T" else b
    start = c0.astype(np.float64).reshape(n, m).T
    want = alpha * (op_a @ op_b) + (0.0 if beta == 0 else beta * start)
    got_cm = got.astype(np.float64).reshape(n, m).T
    scale = np.abs(op_a) @ np.abs(op_b) * abs(alpha) + abs(beta) * np.nan_to_num(np.abs(start))
    assert np.all(np.abs(got_cm - want) <= 64 * np.finfo(F32).eps * (scale + 1e-30)), (ta, tb, m, n, k)


SHAPES = [(1, 3000, 700), (3000, 1, 700), (1, 771, 1203), (2305, 1, 517)]


@pytest.mark.parametrize(("m", "n", "k"), SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
@pytest.mark.parametrize(("ta", "tb"), [("N", "N"), ("T", "N"), ("N", "T"), ("T", "T")])
@pytest.mark.parametrize(("alpha", "beta"), [(1.0, 0.0), (-0.5, 1.0), (2.0, 0.25)])
def test_pulled_gemv_matches_float64(
    cpu: Any, pulled: list[bool], m: int, n: int, k: int, ta: str, tb: str, alpha: float, beta: float
) -> None:
    _gemm(cpu, ta, tb, m, n, k, alpha, beta, seed=m + 3 * n + 7 * k)
    assert pulled == [True]


@pytest.mark.parametrize(("m", "n", "k", "ta", "tb"), [(1, 3000, 700, "N", "N"), (3000, 1, 700, "N", "T")])
def test_strided_vectors_stay_on_the_blas_split(
    cpu: Any, pulled: list[bool], m: int, n: int, k: int, ta: str, tb: str
) -> None:
    """A one-row operand stored with a leading dimension above 1 is a vector of stride > 1."""
    _gemm(cpu, ta, tb, m, n, k, 1.5, 0.5, seed=5, pad=3)
    assert pulled == [False]


def test_small_gemv_is_not_split(cpu: Any, pulled: list[bool]) -> None:
    _gemm(cpu, "N", "N", 1, 64, 64, 1.0, 0.0, seed=1)
    assert pulled == []


def test_pulled_gemv_from_several_threads(cpu: Any, pulled: list[bool]) -> None:
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(4):
                _gemm(cpu, "N", "N", 2048, 1, 600 + i, 1.0, 0.0, seed=seed * 10 + i)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]
    assert pulled and all(pulled)
