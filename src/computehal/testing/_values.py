"""Value cases: every operation against the independent definitions of :mod:`.reference`."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from ..errors import UnsupportedError
from ..types import BackendTranspose
from . import reference as ref
from ._common import EPS32, EPS64, Case, assert_bits_equal, assert_close, colmajor, rng_for
from .workspace import Workspace, expect_error

__all__ = ["value_cases"]

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
#: Value parked in the padding rows of C (between m and ldc) and the gaps between
#: batched matrices; it must survive bit for bit.
SENTINEL = 7777.25
TINY = 2.0**-126  # smallest normal float32: results below it may be flushed to zero

Runner = Callable[[ComputeBackend], float]


def _transposed(t: str) -> bool:
    return t != "N"


# --------------------------------------------------------------------------- GEMM


def _gemm_tol(
    op_a: npt.NDArray[np.float64],
    op_b: npt.NDArray[np.float64],
    c: npt.NDArray[np.float64],
    alpha: float,
    beta: float,
    eps: float,
) -> npt.NDArray[np.float64]:
    k = op_a.shape[1]
    with np.errstate(invalid="ignore"):
        magnitude = abs(alpha) * (np.abs(op_a) @ np.abs(op_b)) if k and alpha else np.zeros(c.shape)
        if beta != 0.0:
            magnitude = magnitude + abs(beta) * np.abs(np.nan_to_num(c))
    tol: npt.NDArray[np.float64] = 2.0 * (k + 2) * eps * magnitude + (TINY if eps == EPS32 else 1e-300)
    return tol


def _check_c(
    what: str,
    got_flat: npt.NDArray[Any],
    c_flat: npt.NDArray[Any],
    m: int,
    n: int,
    ldc: int,
    want: npt.NDArray[np.float64],
    tol: npt.NDArray[np.float64],
    dtype: np.dtype[Any],
) -> float:
    """Check the m x n part of a stored C and that its padding rows are untouched."""
    for j in range(n):
        assert_bits_equal(
            f"{what}: C rows {m}..{ldc - 1} of column {j} (between m and ldc)",
            got_flat[j * ldc + m : (j + 1) * ldc],
            c_flat[j * ldc + m : (j + 1) * ldc],
        )
    got = ref.stored_colmajor(got_flat, m, n, ldc)
    return assert_close(f"{what}: C", got, want, tol, dtype=dtype)


def _gemm_value(
    be: ComputeBackend,
    *,
    label: str,
    ta: str,
    tb: str,
    m: int,
    n: int,
    k: int,
    alpha: float = 1.5,
    beta: float = -0.5,
    dtype: Any = "float32",
    pads: tuple[int, int, int] = (3, 2, 5),
    c_nan: bool = False,
    ab_nan: bool = False,
    as_enums: bool = False,
    offset: int | None = None,
) -> float:
    dt = np.dtype(dtype)
    eps = EPS32 if dt == F32 else EPS64
    rng = rng_for(label)
    a_rows, a_cols = (k, m) if _transposed(ta) else (m, k)
    b_rows, b_cols = (n, k) if _transposed(tb) else (k, n)
    lda, ldb, ldc = max(1, a_rows) + pads[0], max(1, b_rows) + pads[1], max(1, m) + pads[2]
    a = rng.standard_normal((a_rows, a_cols)).astype(dt)
    b = rng.standard_normal((b_rows, b_cols)).astype(dt)
    c = rng.standard_normal((m, n)).astype(dt)
    if ab_nan:
        a[...] = np.nan
        b[...] = np.nan
    if c_nan:
        c[...] = np.nan
    a_flat = colmajor(a, lda, np.nan).astype(dt)
    b_flat = colmajor(b, ldb, np.nan).astype(dt)
    c_flat = colmajor(c, ldc, SENTINEL).astype(dt)
    trans_a: Any = BackendTranspose(ta) if as_enums else ta
    trans_b: Any = BackendTranspose(tb) if as_enums else tb
    with Workspace(be) as ws:
        pa = ws.put(a_flat, dtype=dt, label="A", lo=offset)
        pb = ws.put(b_flat, dtype=dt, label="B", lo=offset)
        pc = ws.put(c_flat, dtype=dt, label="C", lo=offset)

        def call() -> None:
            be.gemm(trans_a, trans_b, m, n, k, alpha, pa, lda, pb, ldb, beta, pc, ldc, dtype=dtype)

        if dt == F64 and not be.capabilities().supports_fp64:
            with expect_error(UnsupportedError, "gemm(dtype=float64) on a backend without float64"):
                call()
            ws.check_unchanged()
            return 0.0
        call()
        got_flat = ws.get(pc, c_flat.size, dt)
        ws.check_unchanged(("A", "B"))
        if m == 0 or n == 0:
            ws.check_unchanged()
    op_a = a.T if _transposed(ta) else a
    op_b = b.T if _transposed(tb) else b
    want = ref.gemm(_transposed(ta), _transposed(tb), alpha, a, b, beta, c)
    tol = _gemm_tol(op_a.astype(F64), op_b.astype(F64), c.astype(F64), alpha, beta, eps)
    return _check_c("gemm", got_flat, c_flat, m, n, ldc, want, tol, dt)


def _gemm_shared_allocation(be: ComputeBackend) -> float:
    """A, B and C at different interior offsets of one allocation."""
    rng = rng_for("gemm-shared")
    m, n, k = 9, 7, 5
    lda, ldb, ldc = m + 1, k + 2, m + 3
    a = rng.standard_normal((m, k)).astype(F32)
    b = rng.standard_normal((k, n)).astype(F32)
    c = rng.standard_normal((m, n)).astype(F32)
    parts = [colmajor(a, lda, np.nan), colmajor(b, ldb, np.nan), colmajor(c, ldc, SENTINEL)]
    gap = 3  # elements between the operands (unaligned to 64 bytes on purpose)
    offsets = []
    cursor = 0
    for part in parts:
        offsets.append(cursor)
        cursor += part.size + gap
    flat = np.full(cursor, -1.0, dtype=F32)
    for off, part in zip(offsets, parts, strict=True):
        flat[off : off + part.size] = part
    with Workspace(be) as ws:
        block = ws.put_bytes(flat.view(np.uint8), label="ABC")
        pa, pb, pc = (block.ptr + 4 * off for off in offsets)
        be.gemm("N", "N", m, n, k, 2.0, pa, lda, pb, ldb, 0.5, pc, ldc, dtype="float32")
        got = ws.get(block.ptr, flat.size, F32)
    assert_bits_equal("gemm shared allocation: A and B", got[: offsets[2]], flat[: offsets[2]])
    assert_bits_equal(
        "gemm shared allocation: gap after C",
        got[offsets[2] + parts[2].size :],
        flat[offsets[2] + parts[2].size :],
    )
    c_got = got[offsets[2] : offsets[2] + parts[2].size]
    want = ref.gemm(False, False, 2.0, a, b, 0.5, c)
    tol = _gemm_tol(a.astype(F64), b.astype(F64), c.astype(F64), 2.0, 0.5, EPS32)
    return _check_c("gemm shared allocation", c_got, parts[2].astype(F32), m, n, ldc, want, tol, F32)


def _gemm_cases() -> list[Case]:
    cases: list[Case] = []

    def add(name: str, runner: Runner) -> None:
        cases.append(Case("gemm", name, runner))

    for ta in "NTC":
        for tb in "NTC":
            add(
                f"{ta}{tb}-ld",
                functools.partial(_gemm_value, label=f"gemm-{ta}{tb}", ta=ta, tb=tb, m=37, n=29, k=23),
            )
    add(
        "NN-enums",
        functools.partial(
            _gemm_value, label="gemm-enums", ta="N", tb="T", m=16, n=16, k=16, dtype=F32, as_enums=True
        ),
    )
    for pair in ("NN", "TN", "NT"):
        add(
            f"{pair}-f64",
            functools.partial(
                _gemm_value,
                label=f"gemm-f64-{pair}",
                ta=pair[0],
                tb=pair[1],
                m=21,
                n=19,
                k=17,
                dtype="float64",
            ),
        )
    add(
        "beta0-nan-in-C",
        functools.partial(
            _gemm_value, label="gemm-b0", ta="N", tb="N", m=13, n=11, k=9, beta=0.0, c_nan=True
        ),
    )
    add(
        "beta0-nan-in-C-f64",
        functools.partial(
            _gemm_value,
            label="gemm-b0-64",
            ta="T",
            tb="N",
            m=13,
            n=11,
            k=9,
            beta=0.0,
            c_nan=True,
            dtype="float64",
        ),
    )
    add("k0", functools.partial(_gemm_value, label="gemm-k0", ta="N", tb="N", m=6, n=5, k=0, beta=-2.0))
    add(
        "k0-beta0-nan-in-C",
        functools.partial(
            _gemm_value, label="gemm-k0b0", ta="T", tb="T", m=6, n=5, k=0, beta=0.0, c_nan=True
        ),
    )
    add(
        "alpha0-nan-in-AB",
        functools.partial(
            _gemm_value, label="gemm-a0", ta="N", tb="T", m=8, n=6, k=7, alpha=0.0, beta=0.5, ab_nan=True
        ),
    )
    add(
        "alpha0-beta0",
        functools.partial(
            _gemm_value,
            label="gemm-a0b0",
            ta="N",
            tb="N",
            m=8,
            n=6,
            k=7,
            alpha=0.0,
            beta=0.0,
            ab_nan=True,
            c_nan=True,
        ),
    )
    add("m0", functools.partial(_gemm_value, label="gemm-m0", ta="N", tb="N", m=0, n=5, k=4))
    add("n0", functools.partial(_gemm_value, label="gemm-n0", ta="T", tb="N", m=5, n=0, k=4))
    add("vector-m1", functools.partial(_gemm_value, label="gemm-m1", ta="T", tb="N", m=1, n=50, k=33))
    add("outer-k1", functools.partial(_gemm_value, label="gemm-k1", ta="N", tb="T", m=40, n=30, k=1))
    add("large-NN", functools.partial(_gemm_value, label="gemm-largeNN", ta="N", tb="N", m=130, n=97, k=200))
    add("large-TT", functools.partial(_gemm_value, label="gemm-largeTT", ta="T", tb="T", m=65, n=129, k=257))
    add(
        "interior-unaligned",
        functools.partial(_gemm_value, label="gemm-off", ta="T", tb="N", m=19, n=17, k=15, offset=68),
    )
    add(
        "interior-unaligned-f64",
        functools.partial(
            _gemm_value, label="gemm-off64", ta="N", tb="T", m=11, n=10, k=9, offset=72, dtype="float64"
        ),
    )
    add("shared-allocation", _gemm_shared_allocation)
    return cases


# --------------------------------------------------------------------------- batched GEMM


def _batched_value(
    be: ComputeBackend,
    *,
    label: str,
    ta: str,
    tb: str,
    m: int,
    n: int,
    k: int,
    batch: int,
    gaps: tuple[int, int, int] = (5, 3, 4),
    broadcast_a: bool = False,
    alpha: float = 0.75,
    beta: float = 1.25,
    c_nan: bool = False,
    dtype: Any = "float32",
) -> float:
    dt = np.dtype(dtype)
    eps = EPS32 if dt == F32 else EPS64
    rng = rng_for(label)
    a_rows, a_cols = (k, m) if _transposed(ta) else (m, k)
    b_rows, b_cols = (n, k) if _transposed(tb) else (k, n)
    lda, ldb, ldc = a_rows + 2, b_rows + 1, m + 3
    stride_a = 0 if broadcast_a else lda * a_cols + gaps[0]
    stride_b = ldb * b_cols + gaps[1]
    stride_c = ldc * n + gaps[2]
    batches_a = 1 if broadcast_a else batch
    a = rng.standard_normal((batches_a, a_rows, a_cols)).astype(dt)
    b = rng.standard_normal((batch, b_rows, b_cols)).astype(dt)
    c = rng.standard_normal((batch, m, n)).astype(dt)
    if c_nan:
        c[...] = np.nan

    def pack(mats: npt.NDArray[Any], ld: int, stride: int, fill: float, count: int) -> npt.NDArray[Any]:
        one = ld * mats.shape[2]
        total = stride * (count - 1) + one if count else 0
        flat = np.full(max(total, 1), fill, dtype=dt)
        for i in range(count):
            flat[i * stride : i * stride + one] = colmajor(mats[min(i, len(mats) - 1)], ld, fill)
        return flat

    a_flat = pack(a, lda, stride_a, np.nan, batches_a if not broadcast_a else 1)
    b_flat = pack(b, ldb, stride_b, np.nan, batch)
    c_flat = pack(c, ldc, stride_c, SENTINEL, batch)
    with Workspace(be) as ws:
        pa = ws.put(a_flat, dtype=dt, label="A")
        pb = ws.put(b_flat, dtype=dt, label="B")
        pc = ws.put(c_flat, dtype=dt, label="C")

        def call() -> None:
            be.batched_gemm(
                ta,
                tb,
                m,
                n,
                k,
                alpha,
                pa,
                lda,
                stride_a,
                pb,
                ldb,
                stride_b,
                beta,
                pc,
                ldc,
                stride_c,
                batch,
                dtype=dtype,
            )

        if dt == F64 and not be.capabilities().supports_fp64:
            with expect_error(UnsupportedError, "batched_gemm(dtype=float64) on a backend without float64"):
                call()
            ws.check_unchanged()
            return 0.0
        call()
        got = ws.get(pc, c_flat.size, dt)
        ws.check_unchanged(("A", "B"))
        if batch == 0:
            ws.check_unchanged()
            return 0.0
    worst = 0.0
    for i in range(batch):
        start = i * stride_c
        if i:
            gap = slice((i - 1) * stride_c + ldc * n, start)
            assert_bits_equal(f"batched_gemm: gap before batch {i}", got[gap], c_flat[gap])
        ai = a[0 if broadcast_a else i]
        want = ref.gemm(_transposed(ta), _transposed(tb), alpha, ai, b[i], beta, c[i])
        op_a = ai.T if _transposed(ta) else ai
        op_b = b[i].T if _transposed(tb) else b[i]
        tol = _gemm_tol(op_a.astype(F64), op_b.astype(F64), c[i].astype(F64), alpha, beta, eps)
        worst = max(
            worst,
            _check_c(
                f"batched_gemm batch {i}",
                got[start : start + ldc * n],
                c_flat[start : start + ldc * n],
                m,
                n,
                ldc,
                want,
                tol,
                dt,
            ),
        )
    return worst


def _batched_cases() -> list[Case]:
    cases: list[Case] = []
    for pair in ("NN", "TN", "NT", "TT", "CN"):
        cases.append(
            Case(
                "batched_gemm",
                f"{pair}-gaps",
                functools.partial(
                    _batched_value, label=f"bg-{pair}", ta=pair[0], tb=pair[1], m=7, n=5, k=6, batch=3
                ),
            )
        )
    extra: list[tuple[str, dict[str, Any]]] = [
        ("broadcast-A-stride0", dict(ta="N", tb="N", m=6, n=4, k=5, batch=4, broadcast_a=True)),
        ("batch0", dict(ta="N", tb="N", m=3, n=3, k=3, batch=0)),
        ("batch1", dict(ta="T", tb="N", m=9, n=8, k=7, batch=1)),
        ("beta0-nan-in-C", dict(ta="N", tb="T", m=5, n=6, k=4, batch=3, beta=0.0, c_nan=True)),
        ("large", dict(ta="N", tb="N", m=70, n=66, k=130, batch=2)),
        ("f64", dict(ta="T", tb="N", m=6, n=5, k=4, batch=3, dtype="float64")),
    ]
    for name, kwargs in extra:
        cases.append(
            Case("batched_gemm", name, functools.partial(_batched_value, label=f"bg-{name}", **kwargs))
        )
    return cases


# --------------------------------------------------------------------------- mixed precision


def _mixed_value(
    be: ComputeBackend,
    *,
    label: str,
    prec: str,
    ta: str,
    tb: str,
    m: int,
    n: int,
    k: int,
    alpha: float = 1.0,
    beta: float = 0.5,
    a_values: npt.ArrayLike | None = None,
    b_values: npt.ArrayLike | None = None,
    c_nan: bool = False,
) -> float:
    rng = rng_for(label)
    a_rows, a_cols = (k, m) if _transposed(ta) else (m, k)
    b_rows, b_cols = (n, k) if _transposed(tb) else (k, n)
    lda, ldb, ldc = max(1, a_rows) + 2, max(1, b_rows) + 1, max(1, m) + 4
    if a_values is None:
        a = (rng.standard_normal((a_rows, a_cols)) * 3).astype(F32)
    else:
        a = np.asarray(a_values, dtype=F32).reshape(a_rows, a_cols)
    if b_values is None:
        b = (rng.standard_normal((b_rows, b_cols)) * 3).astype(F32)
    else:
        b = np.asarray(b_values, dtype=F32).reshape(b_rows, b_cols)
    c = rng.standard_normal((m, n)).astype(F32)
    if c_nan:
        c[...] = np.nan
    a_flat = colmajor(a, lda, np.nan).astype(F32)
    b_flat = colmajor(b, ldb, np.nan).astype(F32)
    c_flat = colmajor(c, ldc, SENTINEL).astype(F32)
    with Workspace(be) as ws:
        pa = ws.put(a_flat, label="A")
        pb = ws.put(b_flat, label="B")
        pc = ws.put(c_flat, label="C")
        be.gemm_mixed_precision(prec, ta, tb, m, n, k, alpha, pa, lda, pb, ldb, beta, pc, ldc)
        got = ws.get(pc, c_flat.size)
        ws.check_unchanged(("A", "B"))
    rounder = ref.round_f16 if prec in ("f16", "F16") else ref.round_bf16
    ar, br = rounder(a), rounder(b)
    want = ref.gemm(_transposed(ta), _transposed(tb), alpha, ar, br, beta, c)
    op_a = (ar.T if _transposed(ta) else ar).astype(F64)
    op_b = (br.T if _transposed(tb) else br).astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        tol = _gemm_tol(np.nan_to_num(op_a), np.nan_to_num(op_b), c.astype(F64), alpha, beta, EPS32)
    return _check_c(f"gemm_mixed_precision({prec})", got, c_flat, m, n, ldc, want, tol, F32)


def _mixed_cases() -> list[Case]:
    cases: list[Case] = []

    def add(name: str, **kwargs: Any) -> None:
        cases.append(
            Case("gemm_mixed_precision", name, functools.partial(_mixed_value, label=f"mp-{name}", **kwargs))
        )

    for prec in ("f16", "bf16"):
        for pair in ("NN", "TN", "NT", "TT"):
            add(f"{prec}-{pair}-ld", prec=prec, ta=pair[0], tb=pair[1], m=23, n=19, k=64)
        add(f"{prec}-large", prec=prec, ta="N", tb="N", m=70, n=65, k=130)
        add(f"{prec}-beta0-nan-in-C", prec=prec, ta="N", tb="N", m=6, n=5, k=8, beta=0.0, c_nan=True)
        add(f"{prec}-k0", prec=prec, ta="N", tb="N", m=6, n=5, k=0, beta=2.0)
        add(f"{prec}-m0", prec=prec, ta="N", tb="N", m=0, n=5, k=3)
    # Ties: halfway values must round to even (a round-half-up or truncating
    # conversion gives a different C). B is the identity, so C = round(A).
    one = np.float32(1.0)
    f16_ties = [
        one + np.float32(2.0**-11),
        one + np.float32(3 * 2.0**-11),
        np.float32(2049.0),
        np.float32(2051.0),
        np.float32(-(1 + 2.0**-11)),
        np.float32(1 + 2.0**-11 + 2.0**-20),
        np.float32(0.1),
        np.float32(1e-8),
    ]
    bf16_ties = [
        one + np.float32(2.0**-8),
        one + np.float32(3 * 2.0**-8),
        np.float32(257.0),
        np.float32(259.0),
        np.float32(-(1 + 2.0**-8)),
        np.float32(1 + 2.0**-8 + 2.0**-20),
        np.float32(0.1),
        np.float32(3e-39),
    ]
    eye = np.eye(8, dtype=F32)
    add(
        "f16-ties-to-even",
        prec="f16",
        ta="N",
        tb="N",
        m=1,
        n=8,
        k=8,
        beta=0.0,
        a_values=np.array(f16_ties, dtype=F32),
        b_values=eye,
    )
    add(
        "f16-ties-columns",
        prec="F16",
        ta="T",
        tb="N",
        m=8,
        n=1,
        k=1,
        beta=0.0,
        a_values=np.array(f16_ties, dtype=F32),
        b_values=[1.0],
    )
    add(
        "bf16-ties-columns",
        prec="BF16",
        ta="T",
        tb="N",
        m=8,
        n=1,
        k=1,
        beta=0.0,
        a_values=np.array(bf16_ties, dtype=F32),
        b_values=[1.0],
    )
    # Overflow to infinity and NaN propagation (k = 1, so no inf * 0 terms).
    add(
        "f16-overflow-nan",
        prec="f16",
        ta="N",
        tb="N",
        m=6,
        n=2,
        k=1,
        beta=0.0,
        a_values=[70000.0, 65520.0, -65520.0, 65504.0, np.nan, 65519.0],
        b_values=[1.0, -2.0],
    )
    add(
        "bf16-overflow-nan",
        prec="bf16",
        ta="N",
        tb="N",
        m=5,
        n=2,
        k=1,
        beta=0.0,
        a_values=[3.4028235e38, -3.4028235e38, 3.3895e38, np.nan, 1e38],
        b_values=[1.0, 0.5],
    )
    return cases


# --------------------------------------------------------------------------- convolution

#: (N, C, H, W, K, Fh, Fw, stride, padding)
CONV_CONFIGS: dict[str, tuple[int, int, int, int, int, int, int, tuple[int, int], tuple[int, int]]] = {
    "3x3-s1-p1": (2, 3, 7, 9, 4, 3, 3, (1, 1), (1, 1)),
    "3x3-s2-p0": (1, 2, 8, 8, 3, 3, 3, (2, 2), (0, 0)),
    "rect-s2x1-p1x2": (2, 3, 9, 7, 2, 2, 3, (2, 1), (1, 2)),
    "1x1": (2, 4, 5, 6, 3, 1, 1, (1, 1), (0, 0)),
    "filter-covers-input": (1, 2, 3, 4, 2, 5, 4, (1, 1), (1, 0)),
    "stride-gt-filter": (1, 2, 10, 11, 2, 2, 2, (3, 4), (0, 1)),
    "5x5-s2-p2": (2, 3, 11, 10, 5, 5, 5, (2, 2), (2, 2)),
    "wide": (1, 8, 16, 20, 16, 3, 3, (1, 1), (1, 1)),
}


def _conv_data(label: str, cfg: tuple[Any, ...]) -> tuple[npt.NDArray[np.float32], ...]:
    n, c, h, w, k, fh, fw, stride, padding = cfg
    rng = rng_for(label)
    x = rng.standard_normal((n, c, h, w)).astype(F32)
    f = rng.standard_normal((k, c, fh, fw)).astype(F32)
    oshape = ref.conv2d_output_shape(x.shape, f.shape, stride, padding)
    gy = rng.standard_normal(oshape).astype(F32)
    return x, f, gy


def _conv_tol(reach: int, magnitude: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return 2.0 * (reach + 2) * EPS32 * magnitude + TINY


def _conv_forward_run(be: ComputeBackend, ws: Workspace, x: Any, f: Any, stride: Any, padding: Any) -> Any:
    oshape = ref.conv2d_output_shape(x.shape, f.shape, stride, padding)
    px, pf = ws.put(x, label="x"), ws.put(f, label="filter")
    py = ws.put(np.full(oshape, np.nan, dtype=F32), label="y")
    be.conv2d_forward(px, list(x.shape), pf, list(f.shape), py, list(oshape), list(stride), list(padding))
    return ws.get(py, oshape)


def _conv_forward_value(be: ComputeBackend, *, name: str) -> float:
    cfg = CONV_CONFIGS[name]
    x, f, _ = _conv_data(f"conv-{name}", cfg)
    stride, padding = cfg[7], cfg[8]
    with Workspace(be) as ws:
        got = _conv_forward_run(be, ws, x, f, tuple(stride), padding)
        ws.check_unchanged(("x", "filter"))
    want = ref.conv2d_forward(x, f, stride, padding)
    mag = ref.conv2d_forward(np.abs(x), np.abs(f), stride, padding)
    reach = cfg[1] * cfg[5] * cfg[6]
    return assert_close("conv2d_forward: y", got, want, _conv_tol(reach, mag))


def _finite_difference(
    loss: Callable[[npt.NDArray[np.float64]], float],
    at: npt.NDArray[np.float64],
    picks: npt.NDArray[np.intp],
    h: float = 0.5,
) -> npt.NDArray[np.float64]:
    """Central differences of ``loss`` at the flat positions ``picks`` (float64)."""
    grads = np.empty(picks.size)
    for i, flat in enumerate(picks):
        plus, minus = at.copy(), at.copy()
        plus.reshape(-1)[flat] += h
        minus.reshape(-1)[flat] -= h
        grads[i] = (loss(plus) - loss(minus)) / (2 * h)
    return grads


def _conv_backward_data_value(be: ComputeBackend, *, name: str) -> float:
    cfg = CONV_CONFIGS[name]
    x, f, gy = _conv_data(f"convbd-{name}", cfg)
    stride, padding = cfg[7], cfg[8]
    with Workspace(be) as ws:
        pgy, pf = ws.put(gy, label="grad_output"), ws.put(f, label="filter")
        pgx = ws.put(np.full(x.shape, np.nan, dtype=F32), label="grad_input")
        be.conv2d_backward_data(pgy, list(gy.shape), pf, list(f.shape), pgx, list(x.shape), stride, padding)
        gx = ws.get(pgx, x.shape)
        ws.check_unchanged(("grad_output", "filter"))
        y = _conv_forward_run(be, ws, x, f, stride, padding)
    reach = cfg[4] * math.ceil(cfg[5] / stride[0]) * math.ceil(cfg[6] / stride[1])
    want = ref.conv2d_backward_data(gy, f, x.shape, stride, padding)
    mag = ref.conv2d_backward_data(np.abs(gy), np.abs(f), x.shape, stride, padding)
    tol = _conv_tol(reach, mag)
    worst = assert_close("conv2d_backward_data: grad_input", gx, want, tol)
    # Finite differences of L(x) = <conv(x), gy> in float64 (exact for a linear map).
    f64, gy64 = f.astype(F64), gy.astype(F64)
    picks = rng_for(f"fd-{name}").permutation(x.size)[:96]

    def loss_x(xx: npt.NDArray[np.float64]) -> float:
        return float(np.sum(ref.conv2d_forward(xx, f64, stride, padding) * gy64))

    worst = max(worst, _check_finite_differences("conv2d_backward_data", gx, loss_x, x, picks, tol))
    # Adjoint identity <conv(x), gy> == <x, backward_data(gy)>, both from the backend.
    _check_adjoint("<x, backward_data(g)>", y, gy, x, gx, f, cfg, reach, stride, padding)
    return worst


def _conv_backward_filter_value(be: ComputeBackend, *, name: str) -> float:
    cfg = CONV_CONFIGS[name]
    x, f, gy = _conv_data(f"convbf-{name}", cfg)
    stride, padding = cfg[7], cfg[8]
    with Workspace(be) as ws:
        px, pgy = ws.put(x, label="x"), ws.put(gy, label="grad_output")
        pgf = ws.put(np.full(f.shape, np.nan, dtype=F32), label="grad_filter")
        be.conv2d_backward_filter(px, list(x.shape), pgy, list(gy.shape), pgf, list(f.shape), stride, padding)
        gf = ws.get(pgf, f.shape)
        ws.check_unchanged(("x", "grad_output"))
        y = _conv_forward_run(be, ws, x, f, stride, padding)
    reach = cfg[0] * gy.shape[2] * gy.shape[3]
    want = ref.conv2d_backward_filter(x, gy, f.shape, stride, padding)
    mag = ref.conv2d_backward_filter(np.abs(x), np.abs(gy), f.shape, stride, padding)
    tol = _conv_tol(reach, mag)
    worst = assert_close("conv2d_backward_filter: grad_filter", gf, want, tol)
    x64, gy64 = x.astype(F64), gy.astype(F64)
    picks = rng_for(f"fdf-{name}").permutation(f.size)[:96]

    def loss_f(ff: npt.NDArray[np.float64]) -> float:
        return float(np.sum(ref.conv2d_forward(x64, ff, stride, padding) * gy64))

    worst = max(worst, _check_finite_differences("conv2d_backward_filter", gf, loss_f, f, picks, tol))
    # <conv(x, f), gy> == <f, backward_filter(x, gy)>.
    _check_adjoint("<f, backward_filter(x, g)>", y, gy, f, gf, f, cfg, reach, stride, padding, x=x)
    return worst


def _check_finite_differences(
    op: str,
    grad: npt.NDArray[np.float32],
    loss: Callable[[npt.NDArray[np.float64]], float],
    at: npt.NDArray[np.float32],
    picks: npt.NDArray[np.int64],
    tol: npt.NDArray[np.float64],
) -> float:
    """Compare the backend's gradient at ``picks`` with central differences of ``loss``."""
    fd = _finite_difference(loss, at.astype(F64), picks)
    return assert_close(
        f"{op} vs finite differences", grad.reshape(-1)[picks], fd, tol.reshape(-1)[picks] + 1e-9
    )


def _check_adjoint(
    rhs_text: str,
    y: npt.NDArray[np.float32],
    gy: npt.NDArray[np.float32],
    primal: npt.NDArray[np.float32],
    gradient: npt.NDArray[np.float32],
    f: npt.NDArray[np.float32],
    cfg: Any,
    reach: int,
    stride: Any,
    padding: Any,
    *,
    x: npt.NDArray[np.float32] | None = None,
) -> None:
    """Assert ``<conv(...), gy> == <primal, gradient>`` (both sides computed by the backend).

    ``primal`` is the input (data gradient) or the filter (filter gradient); ``x`` is the
    input when ``primal`` is the filter.
    """
    inputs = primal if x is None else x
    gy64 = gy.astype(F64)
    lhs = float(np.sum(y.astype(F64) * gy64))
    rhs = float(np.sum(primal.astype(F64) * gradient.astype(F64)))
    bound = float(np.sum(ref.conv2d_forward(np.abs(inputs), np.abs(f), stride, padding) * np.abs(gy64)))
    tol_dot = 4.0 * (cfg[1] * cfg[5] * cfg[6] + reach + 4) * EPS32 * bound
    if not abs(lhs - rhs) <= tol_dot:
        raise AssertionError(
            f"adjoint identity: <conv, g> = {lhs!r} but {rhs_text} = {rhs!r} "
            f"(difference {abs(lhs - rhs):.3g} > {tol_dot:.3g})"
        )


def _conv_cases() -> list[Case]:
    cases: list[Case] = []
    for name in CONV_CONFIGS:
        cases.append(Case("conv2d_forward", name, functools.partial(_conv_forward_value, name=name)))
    for name in CONV_CONFIGS:
        cases.append(
            Case("conv2d_backward_data", name, functools.partial(_conv_backward_data_value, name=name))
        )
    for name in CONV_CONFIGS:
        cases.append(
            Case("conv2d_backward_filter", name, functools.partial(_conv_backward_filter_value, name=name))
        )
    return cases


# --------------------------------------------------------------------------- attention


def _attention_value(
    be: ComputeBackend,
    *,
    label: str,
    batch: int,
    heads: int,
    seq_q: int,
    seq_kv: int,
    head_dim: int,
    causal: bool,
    scale: float | None = None,
    magnitude: float = 1.0,
) -> float:
    rng = rng_for(label)
    q = (rng.standard_normal((batch, heads, seq_q, head_dim)) * magnitude).astype(F32)
    k = (rng.standard_normal((batch, heads, seq_kv, head_dim)) * magnitude).astype(F32)
    v = rng.standard_normal((batch, heads, seq_kv, head_dim)).astype(F32)
    sc = 1.0 / math.sqrt(head_dim) if scale is None else scale
    with Workspace(be) as ws:
        pq, pk, pv = ws.put(q, label="q"), ws.put(k, label="k"), ws.put(v, label="v")
        po = ws.put(np.full(q.shape, np.nan, dtype=F32), label="o")
        be.attention(pq, pk, pv, po, batch, heads, seq_q, seq_kv, head_dim, sc, causal)
        got = ws.get(po, q.shape)
        ws.check_unchanged(("q", "k", "v"))
    want = ref.attention(q, k, v, sc, causal)
    score_mag = np.einsum("bhid,bhjd->bhij", np.abs(q).astype(F64), np.abs(k).astype(F64)) * abs(sc)
    score_err = (head_dim + 2) * EPS32 * score_mag.max(axis=-1) + 8 * EPS32  # per query row
    vmax = float(np.abs(v).max())
    tol = (4.0 * score_err + 4.0 * (seq_kv + head_dim + 8) * EPS32)[..., None] * vmax + TINY
    worst = assert_close("attention: o", got, want, tol)
    if causal and seq_q > seq_kv:
        blind = got[:, :, : seq_q - seq_kv, :]
        if np.any(blind != 0):
            raise AssertionError(
                f"attention: the first {seq_q - seq_kv} query rows see no key and must be exactly zero"
            )
    return worst


def _attention_cases() -> list[Case]:
    configs: list[tuple[str, dict[str, Any]]] = [
        ("square", dict(batch=2, heads=2, seq_q=8, seq_kv=8, head_dim=16, causal=False)),
        ("square-causal", dict(batch=2, heads=2, seq_q=8, seq_kv=8, head_dim=16, causal=True)),
        ("q-lt-kv", dict(batch=1, heads=2, seq_q=5, seq_kv=12, head_dim=8, causal=False)),
        ("q-lt-kv-causal", dict(batch=1, heads=2, seq_q=5, seq_kv=12, head_dim=8, causal=True)),
        ("q-gt-kv", dict(batch=1, heads=2, seq_q=12, seq_kv=5, head_dim=8, causal=False)),
        ("q-gt-kv-causal", dict(batch=1, heads=2, seq_q=12, seq_kv=5, head_dim=8, causal=True)),
        ("single", dict(batch=1, heads=1, seq_q=1, seq_kv=1, head_dim=1, causal=True)),
        ("odd-dims", dict(batch=2, heads=3, seq_q=33, seq_kv=47, head_dim=72, causal=False)),
        ("odd-dims-causal", dict(batch=2, heads=3, seq_q=47, seq_kv=33, head_dim=24, causal=True)),
        (
            "large-scores",
            dict(batch=1, heads=2, seq_q=16, seq_kv=20, head_dim=16, causal=False, scale=1.0, magnitude=4.0),
        ),
        ("negative-scale", dict(batch=1, heads=1, seq_q=9, seq_kv=9, head_dim=8, causal=True, scale=-0.7)),
        ("long-600", dict(batch=1, heads=1, seq_q=600, seq_kv=600, head_dim=32, causal=False)),
        ("long-600-causal", dict(batch=1, heads=2, seq_q=600, seq_kv=600, head_dim=32, causal=True)),
        ("long-kv-1100", dict(batch=1, heads=1, seq_q=40, seq_kv=1100, head_dim=16, causal=True)),
        ("long-q-1100", dict(batch=1, heads=1, seq_q=1100, seq_kv=70, head_dim=16, causal=True)),
    ]
    return [
        Case("attention", name, functools.partial(_attention_value, label=f"attn-{name}", **kwargs))
        for name, kwargs in configs
    ]


# --------------------------------------------------------------------------- reduce / softmax


def _special_tensor(label: str, shape: tuple[int, ...], axis: int) -> npt.NDArray[np.float32]:
    """Random data with NaN, +-inf, all-NaN and all-(-inf) slices along ``axis``."""
    rng = rng_for(label)
    x = rng.standard_normal(shape).astype(F32)
    flat = x.reshape(-1)
    picks = rng.permutation(flat.size)
    specials = [np.nan, np.inf, -np.inf, np.nan, -np.inf]
    for i, value in enumerate(specials):
        if i < flat.size:
            flat[picks[i]] = value
    moved = np.moveaxis(x, axis, -1)
    if moved.shape[-1] and moved.size // moved.shape[-1] >= 4:
        index = np.unravel_index(0, moved.shape[:-1])
        moved[index] = np.nan
        index = np.unravel_index(1, moved.shape[:-1])
        moved[index] = -np.inf
        index = np.unravel_index(2, moved.shape[:-1])
        moved[index] = np.where(np.arange(moved.shape[-1]) % 2, np.nan, -np.inf)
        index = np.unravel_index(3, moved.shape[:-1])
        moved[index] = np.where(np.arange(moved.shape[-1]) % 2, np.inf, -np.inf)
    return x


def _reduce_value(
    be: ComputeBackend, *, label: str, op: str, shape: tuple[int, ...], axis: int, special: bool = False
) -> float:
    x = _special_tensor(label, shape, axis) if special else rng_for(label).standard_normal(shape).astype(F32)
    out_shape = shape[:axis] + shape[axis + 1 :]
    with Workspace(be) as ws:
        px = ws.put(x, label="input")
        po = ws.put(np.full(out_shape, np.nan, dtype=F32), label="output")
        be.reduce(op, px, po, list(shape), axis)
        got = ws.get(po, out_shape)
        ws.check_unchanged(("input",))
    want = ref.reduce(op.lower(), x, axis)
    length = shape[axis]
    if op.lower() in ("sum", "mean"):
        with np.errstate(invalid="ignore"):
            mag = ref.reduce("sum", np.abs(np.nan_to_num(x, posinf=0.0, neginf=0.0)), axis)
        tol = 2.0 * (length + 2) * EPS32 * mag
        if op.lower() == "mean" and length:
            tol = tol / length + 2 * EPS32 * np.abs(np.nan_to_num(want))
        tol = tol + TINY
    else:
        tol = np.zeros(out_shape)
    return assert_close(f"reduce({op}, axis={axis}): output", got, want, tol)


def _reduce_cases() -> list[Case]:
    cases: list[Case] = []
    for op in ("sum", "max", "min", "mean"):
        for axis in range(3):
            cases.append(
                Case(
                    "reduce",
                    f"{op}-axis{axis}",
                    functools.partial(
                        _reduce_value, label=f"red-{op}-{axis}", op=op, shape=(4, 5, 6), axis=axis
                    ),
                )
            )
        cases.append(
            Case(
                "reduce",
                f"{op}-nan-inf",
                functools.partial(
                    _reduce_value, label=f"red-{op}-sp", op=op, shape=(6, 7, 3), axis=1, special=True
                ),
            )
        )
        cases.append(
            Case(
                "reduce",
                f"{op}-empty-axis",
                functools.partial(_reduce_value, label=f"red-{op}-e", op=op, shape=(3, 0, 2), axis=1),
            )
        )
        cases.append(
            Case(
                "reduce",
                f"{op}-1d-long",
                functools.partial(_reduce_value, label=f"red-{op}-1d", op=op, shape=(5003,), axis=0),
            )
        )
        cases.append(
            Case(
                "reduce",
                f"{op}-wide",
                functools.partial(_reduce_value, label=f"red-{op}-w", op=op, shape=(70, 1031), axis=0),
            )
        )
    cases.append(
        Case(
            "reduce",
            "sum-empty-output",
            functools.partial(_reduce_value, label="red-eo", op="sum", shape=(0, 5), axis=1),
        )
    )
    cases.append(
        Case(
            "reduce",
            "MAX-uppercase",
            functools.partial(_reduce_value, label="red-up", op="MAX", shape=(3, 4), axis=1),
        )
    )
    return cases


def _softmax_value(
    be: ComputeBackend,
    *,
    label: str,
    shape: tuple[int, ...],
    axis: int,
    special: bool = False,
    in_place: bool = False,
    magnitude: float = 1.0,
) -> float:
    if special:
        x = _special_tensor(label, shape, axis)
    else:
        x = (rng_for(label).standard_normal(shape) * magnitude).astype(F32)
    with Workspace(be) as ws:
        px = ws.put(x, label="input")
        po = px if in_place else ws.put(np.full(shape, np.nan, dtype=F32), label="output")
        be.softmax(px, po, list(shape), axis)
        got = ws.get(po, shape)
        if not in_place:
            ws.check_unchanged(("input",))
    want = ref.softmax(x, axis)
    length = shape[axis]
    with np.errstate(invalid="ignore"):
        peak = np.nan_to_num(
            np.fmax.reduce(x.astype(F64), axis=axis, keepdims=True, initial=-np.inf), neginf=0.0, posinf=0.0
        )
        spread = np.abs(np.nan_to_num(x.astype(F64), posinf=0.0, neginf=0.0) - peak)
    tol = EPS32 * (16 + 4 * length + 4 * spread) * np.abs(np.nan_to_num(want)) + TINY
    return assert_close(f"softmax(axis={axis}): output", got, want, tol)


def _softmax_cases() -> list[Case]:
    configs: list[tuple[str, dict[str, Any]]] = [
        ("axis0", dict(shape=(4, 5, 6), axis=0)),
        ("axis1", dict(shape=(4, 5, 6), axis=1)),
        ("axis2", dict(shape=(4, 5, 6), axis=2)),
        ("long-rows", dict(shape=(7, 1000), axis=1)),
        ("long-columns", dict(shape=(1000, 7), axis=0)),
        ("large-values", dict(shape=(5, 9), axis=1, magnitude=400.0)),
        ("nan-inf", dict(shape=(6, 7, 3), axis=1, special=True)),
        ("nan-inf-last-axis", dict(shape=(8, 5), axis=1, special=True)),
        ("in-place", dict(shape=(6, 33), axis=1, in_place=True)),
        ("in-place-axis0", dict(shape=(33, 6), axis=0, in_place=True)),
        ("length-1", dict(shape=(5, 1), axis=1)),
        ("empty-axis", dict(shape=(3, 0), axis=1)),
    ]
    return [
        Case("softmax", name, functools.partial(_softmax_value, label=f"sm-{name}", **kwargs))
        for name, kwargs in configs
    ]


# --------------------------------------------------------------------------- element-wise

_UNARY_DOMAIN: dict[str, tuple[float, float]] = {
    "relu": (-10, 10),
    "sigmoid": (-30, 30),
    "tanh": (-8, 8),
    "exp": (-20, 20),
    "log": (1e-3, 1e3),
    "sqrt": (0, 1e4),
    "abs": (-100, 100),
    "neg": (-100, 100),
}
_SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-20, 3e38, -3e38]


def _unary_tol(op: str, x: npt.NDArray[np.float64], want: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    mag = np.abs(np.nan_to_num(want, posinf=0.0, neginf=0.0))
    ax = np.abs(np.nan_to_num(x, posinf=0.0, neginf=0.0))
    if op in ("relu", "abs", "neg"):
        return np.zeros_like(mag)
    if op == "exp":
        return 2 * (3 + 2 * ax) * EPS32 * mag + TINY
    if op == "sigmoid":
        return 2 * (8 + 2 * np.minimum(ax, 100)) * EPS32 * mag + TINY
    if op == "tanh":
        return 8 * EPS32 * mag + 4 * EPS32 * np.minimum(ax, 1) + TINY
    if op == "log":
        return 4 * EPS32 * mag + 2.0**-21 + TINY
    return 4 * EPS32 * mag + TINY  # sqrt


def _unary_value(be: ComputeBackend, *, op: str, n: int = 1003, in_place: bool = False) -> float:
    rng = rng_for(f"unary-{op}-{n}")
    lo, hi = _UNARY_DOMAIN[op.lower()]
    x = rng.uniform(lo, hi, size=n).astype(F32)
    x[: len(_SPECIALS)] = np.asarray(_SPECIALS[:n], dtype=F32)
    with Workspace(be) as ws:
        px = ws.put(x, label="input")
        po = px if in_place else ws.put(np.full(n, 123.0, dtype=F32), label="output")
        be.unary(op, px, po, n)
        got = ws.get(po, (n,))
        if not in_place:
            ws.check_unchanged(("input",))
    want = ref.unary(op.lower(), x)
    return assert_close(f"unary({op})", got, want, _unary_tol(op.lower(), x.astype(F64), want))


def _binary_inputs(op: str, n: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    rng = rng_for(f"binary-{op}-{n}")
    a = (rng.standard_normal(n) * 10).astype(F32)
    b = (rng.standard_normal(n) * 10).astype(F32)
    if op == "div":
        b[np.abs(b) < 1e-3] = 1.0
    special_a = [np.nan, 1.0, np.nan, np.inf, -np.inf, np.inf, 0.0, 1.0, -1.0, 0.0, -0.0, 5.0, -np.inf]
    special_b = [1.0, np.nan, np.nan, np.inf, np.inf, -np.inf, 0.0, 0.0, 0.0, -1.0, 0.0, np.inf, 2.0]
    count = min(n, len(special_a))
    a[:count] = special_a[:count]
    b[:count] = special_b[:count]
    return a, b


def _binary_value(be: ComputeBackend, *, op: str, n: int = 1003, alias: str = "") -> float:
    a, b = _binary_inputs(op.lower(), n)
    if alias == "a=b=out":
        b = a.copy()
    with Workspace(be) as ws:
        pa = ws.put(a, label="a")
        pb = pa if alias == "a=b=out" else ws.put(b, label="b")
        if alias in ("out=a", "a=b=out"):
            po = pa
        elif alias == "out=b":
            po = pb
        else:
            po = ws.put(np.full(n, 123.0, dtype=F32), label="output")
        be.binary(op, pa, pb, po, n)
        got = ws.get(po, (n,))
        untouched = tuple(label for label, ptr in (("a", pa), ("b", pb)) if ptr != po)
        ws.check_unchanged(untouched)
    want = ref.binary(op.lower(), a, b)
    if op.lower() == "div":
        tol = 3 * EPS32 * np.abs(np.nan_to_num(want, posinf=0.0, neginf=0.0)) + TINY
    else:
        tol = np.zeros(n)
    return assert_close(f"binary({op})", got, want, tol)


def _elementwise_cases() -> list[Case]:
    cases: list[Case] = []
    for op in _UNARY_DOMAIN:
        cases.append(Case("unary", op, functools.partial(_unary_value, op=op)))
        cases.append(Case("unary", f"{op}-in-place", functools.partial(_unary_value, op=op, in_place=True)))
    cases.append(Case("unary", "RELU-uppercase-small", functools.partial(_unary_value, op="RELU", n=5)))
    cases.append(Case("unary", "exp-n1", functools.partial(_unary_value, op="exp", n=1)))
    cases.append(Case("unary", "tanh-large", functools.partial(_unary_value, op="tanh", n=300_007)))
    cases.append(Case("unary", "n0", _unary_n0))
    for op in ("add", "sub", "mul", "div", "max", "min"):
        cases.append(Case("binary", op, functools.partial(_binary_value, op=op)))
        cases.append(Case("binary", f"{op}-out-is-a", functools.partial(_binary_value, op=op, alias="out=a")))
        cases.append(Case("binary", f"{op}-out-is-b", functools.partial(_binary_value, op=op, alias="out=b")))
    cases.append(
        Case("binary", "mul-a-b-out-same", functools.partial(_binary_value, op="mul", alias="a=b=out"))
    )
    cases.append(Case("binary", "add-large", functools.partial(_binary_value, op="add", n=300_007)))
    cases.append(Case("binary", "n0", _binary_n0))
    return cases


def _unary_n0(be: ComputeBackend) -> float:
    with Workspace(be) as ws:
        px = ws.put(np.ones(4, dtype=F32), label="input")
        po = ws.put(np.full(4, 5.0, dtype=F32), label="output")
        be.unary("exp", px, po, 0)
        ws.check_unchanged()
    return 0.0


def _binary_n0(be: ComputeBackend) -> float:
    with Workspace(be) as ws:
        pa = ws.put(np.ones(4, dtype=F32), label="a")
        pb = ws.put(np.ones(4, dtype=F32), label="b")
        po = ws.put(np.full(4, 5.0, dtype=F32), label="output")
        be.binary("add", pa, pb, po, 0)
        ws.check_unchanged()
    return 0.0


# --------------------------------------------------------------------------- gather / scatter


def _as_indices(kind: str, values: Sequence[int]) -> Any:
    if kind == "list":
        return list(values)
    if kind == "tuple":
        return tuple(values)
    if kind == "int32":
        return np.asarray(values, dtype=np.int32)
    if kind == "uint16":
        return np.asarray(values, dtype=np.uint16)
    if kind == "numpy-ints":
        return [np.int64(v) for v in values]
    return np.asarray(values, dtype=np.int64)


def _gather_value(be: ComputeBackend, *, rows: int, cols: int, indices: Sequence[int], kind: str) -> float:
    rng = rng_for(f"gather-{rows}-{cols}-{len(indices)}")
    table = rng.standard_normal((rows, cols)).astype(F32)
    out_shape = (len(indices), cols)
    with Workspace(be) as ws:
        pt = ws.put(table, label="input")
        po = ws.put(np.full(out_shape, np.nan, dtype=F32), label="output")
        be.gather(pt, _as_indices(kind, indices), po, rows, cols)
        got = ws.get(po, out_shape)
        ws.check_unchanged(("input",))
        if not indices or not cols:
            ws.check_unchanged()
            return 0.0
    return assert_close("gather: output", got, ref.gather(table, indices), 0.0)


def _scatter_value(be: ComputeBackend, *, rows: int, cols: int, indices: Sequence[int], kind: str) -> float:
    rng = rng_for(f"scatter-{rows}-{cols}-{len(indices)}")
    src = rng.standard_normal((len(indices), cols)).astype(F32)
    before = rng.standard_normal((rows, cols)).astype(F32)
    with Workspace(be) as ws:
        ps = ws.put(src, label="input")
        po = ws.put(before, label="output")
        be.scatter(ps, _as_indices(kind, indices), po, rows, cols)
        got = ws.get(po, (rows, cols))
        ws.check_unchanged(("input",))
    return assert_close("scatter: output", got, ref.scatter(src, indices, before), 0.0)


def _rows_cases() -> list[Case]:
    rng = rng_for("rows-indices")
    many = [int(i) for i in rng.integers(0, 300, size=2000)]
    dup = [3, 1, 3, 0, 7, 1, 3, 9, 9, 2]
    configs: list[tuple[str, dict[str, Any]]] = [
        ("duplicates-list", dict(rows=10, cols=7, indices=dup, kind="list")),
        ("duplicates-int32", dict(rows=10, cols=7, indices=dup, kind="int32")),
        ("tuple", dict(rows=10, cols=3, indices=(9, 0, 4), kind="tuple")),
        ("uint16", dict(rows=12, cols=5, indices=[11, 0, 5, 5], kind="uint16")),
        ("numpy-int-items", dict(rows=12, cols=5, indices=[2, 11, 2], kind="numpy-ints")),
        ("single-column", dict(rows=40, cols=1, indices=[39, 0, 20, 20, 1], kind="int64")),
        ("many-rows", dict(rows=300, cols=33, indices=many, kind="int64")),
        ("empty-indices", dict(rows=5, cols=4, indices=[], kind="list")),
        ("empty-array", dict(rows=5, cols=4, indices=[], kind="int64")),
        ("zero-columns", dict(rows=5, cols=0, indices=[1, 2], kind="list")),
    ]
    cases: list[Case] = []
    for name, kwargs in configs:
        cases.append(Case("gather", name, functools.partial(_gather_value, **kwargs)))
    for name, kwargs in configs:
        cases.append(Case("scatter", name, functools.partial(_scatter_value, **kwargs)))
    return cases


def value_cases() -> list[Case]:
    """Every value case, grouped by operation."""
    return (
        _gemm_cases()
        + _batched_cases()
        + _mixed_cases()
        + _conv_cases()
        + _attention_cases()
        + _reduce_cases()
        + _softmax_cases()
        + _elementwise_cases()
        + _rows_cases()
    )
