"""GEMM value cases: plain, strided batched and mixed precision, in every dtype."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from ..types import BackendTranspose
from . import reference as ref
from ._common import (
    DTYPES,
    EPS32,
    SHORT,
    Case,
    assert_bits_equal,
    assert_close,
    call_or_refuse,
    colmajor,
    eps_of,
    rng_for,
    storage_tol,
    value_case,
)
from .reference import storage
from .workspace import Workspace

__all__ = ["blas_cases", "check_c", "gemm_tol", "matmul_case", "transposed", "finite_abs", "SENTINEL"]

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
#: Value parked in the padding rows of C (between m and ldc) and the gaps between
#: batched matrices; it must survive bit for bit.
SENTINEL = 7777.25


def finite_abs(a: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """``|a|`` with NaN and infinities as 0: the magnitude of the finite terms."""
    return np.abs(np.nan_to_num(np.asarray(a, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0))


def transposed(t: str) -> bool:
    return t != "N"


# --------------------------------------------------------------------------- GEMM


def gemm_tol(
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
            magnitude = magnitude + abs(beta) * finite_abs(c)
    tol: npt.NDArray[np.float64] = 2.0 * (k + 2) * eps * magnitude + (
        2.0**-126 if eps == EPS32 else 2.0**-1022
    )
    return tol


def check_c(
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
    return assert_close(f"{what}: C", got, want, storage_tol(tol, want, dtype), dtype=dtype)


def _gemm_operands(
    label: str, a_shape: tuple[int, int], b_shape: tuple[int, int], c_shape: tuple[int, int], dtype: Any
) -> tuple[npt.NDArray[np.float64], ...]:
    """Random A, B, C already rounded to ``dtype`` (as float64)."""
    rng = rng_for(label)
    return tuple(ref.round_to(rng.standard_normal(shape), dtype) for shape in (a_shape, b_shape, c_shape))


def _inject_specials(
    a: npt.NDArray[np.float64], b: npt.NDArray[np.float64], c: npt.NDArray[np.float64]
) -> None:
    """NaN and infinities in A, B and C, and a zero meeting an infinity (``inf * 0``)."""
    if a.size >= 2:
        a.reshape(-1)[0] = np.nan
        a.reshape(-1)[-1] = np.inf
    if b.size >= 2:
        b.reshape(-1)[1] = -np.inf
        b.reshape(-1)[-1] = 0.0
    if c.size >= 2:
        c.reshape(-1)[1] = np.inf
        c.reshape(-1)[0] = np.nan


def _want_and_tol(
    ta: str,
    tb: str,
    alpha: float,
    a: npt.NDArray[np.float64],
    b: npt.NDArray[np.float64],
    beta: float,
    c: npt.NDArray[np.float64],
    eps: float,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The exact ``alpha op(A) op(B) + beta C`` and its float32 (float64) error bound."""
    op_a = a.T if transposed(ta) else a
    op_b = b.T if transposed(tb) else b
    want = ref.gemm(transposed(ta), transposed(tb), alpha, a, b, beta, c)
    with np.errstate(invalid="ignore"):
        tol = gemm_tol(finite_abs(op_a), finite_abs(op_b), c, alpha, beta, eps)
    return want, tol


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
    specials: bool = False,
    as_enums: bool = False,
    offset: int | None = None,
) -> float:
    a_rows, a_cols = (k, m) if transposed(ta) else (m, k)
    b_rows, b_cols = (n, k) if transposed(tb) else (k, n)
    lda, ldb, ldc = max(1, a_rows) + pads[0], max(1, b_rows) + pads[1], max(1, m) + pads[2]
    a, b, c = _gemm_operands(label, (a_rows, a_cols), (b_rows, b_cols), (m, n), dtype)
    if ab_nan:
        a[...] = np.nan
        b[...] = np.nan
    if c_nan:
        c[...] = np.nan
    if specials:
        _inject_specials(a, b, c)
    a_flat = storage(colmajor(a, lda, np.nan), dtype)
    b_flat = storage(colmajor(b, ldb, np.nan), dtype)
    c_flat = storage(colmajor(c, ldc, SENTINEL), dtype)
    trans_a: Any = BackendTranspose(ta) if as_enums else ta
    trans_b: Any = BackendTranspose(tb) if as_enums else tb
    with Workspace(be) as ws:
        pa = ws.put(a_flat, label="A", lo=offset)
        pb = ws.put(b_flat, label="B", lo=offset)
        pc = ws.put(c_flat, label="C", lo=offset)

        def call() -> None:
            be.gemm(trans_a, trans_b, m, n, k, alpha, pa, lda, pb, ldb, beta, pc, ldc, dtype=dtype)

        if not call_or_refuse(be, ws, "gemm", dtype, call):
            return 0.0
        got_flat = ws.get(pc, c_flat.size, c_flat.dtype)
        ws.check_unchanged(("A", "B"))
        if m == 0 or n == 0:
            ws.check_unchanged()
    want, tol = _want_and_tol(ta, tb, alpha, a, b, beta, c, eps_of(dtype))
    return check_c("gemm", got_flat, c_flat, m, n, ldc, want, tol, dtype)


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
    tol = gemm_tol(a.astype(F64), b.astype(F64), c.astype(F64), 2.0, 0.5, EPS32)
    return check_c("gemm shared allocation", c_got, parts[2].astype(F32), m, n, ldc, want, tol, F32)


def matmul_case(
    op: str,
    run: Callable[..., float],
    name: str,
    label: str,
    trans: str,
    mnk: tuple[int, int, int],
    **keywords: Any,
) -> Case:
    """A GEMM-family value case: ``run(be, label=, ta=, tb=, m=, n=, k=, **keywords)``."""
    m, n, k = mnk
    return value_case(op, name, run, label=label, ta=trans[0], tb=trans[1], m=m, n=n, k=k, **keywords)


#: GEMM edge cases: (name, data label, op(A) op(B), (m, n, k), other keywords of _gemm_value).
_GEMM_EDGES: tuple[tuple[str, str, str, tuple[int, int, int], dict[str, Any]], ...] = (
    ("beta0-nan-in-C", "gemm-b0", "NN", (13, 11, 9), dict(beta=0.0, c_nan=True)),
    ("beta0-nan-in-C-f64", "gemm-b0-64", "TN", (13, 11, 9), dict(beta=0.0, c_nan=True, dtype="float64")),
    ("k0", "gemm-k0", "NN", (6, 5, 0), dict(beta=-2.0)),
    ("k0-beta0-nan-in-C", "gemm-k0b0", "TT", (6, 5, 0), dict(beta=0.0, c_nan=True)),
    ("alpha0-nan-in-AB", "gemm-a0", "NT", (8, 6, 7), dict(alpha=0.0, beta=0.5, ab_nan=True)),
    ("alpha0-beta0", "gemm-a0b0", "NN", (8, 6, 7), dict(alpha=0.0, beta=0.0, ab_nan=True, c_nan=True)),
    ("m0", "gemm-m0", "NN", (0, 5, 4), {}),
    ("n0", "gemm-n0", "TN", (5, 0, 4), {}),
    ("vector-m1", "gemm-m1", "TN", (1, 50, 33), {}),
    ("outer-k1", "gemm-k1", "NT", (40, 30, 1), {}),
    ("large-NN", "gemm-largeNN", "NN", (130, 97, 200), {}),
    ("large-TT", "gemm-largeTT", "TT", (65, 129, 257), {}),
    ("interior-unaligned", "gemm-off", "TN", (19, 17, 15), dict(offset=68)),
    ("interior-unaligned-f64", "gemm-off64", "NT", (11, 10, 9), dict(offset=72, dtype="float64")),
)


def _gemm_cases() -> list[Case]:
    def case(name: str, label: str, trans: str, mnk: tuple[int, int, int], **keywords: Any) -> Case:
        return matmul_case("gemm", _gemm_value, name, label, trans, mnk, **keywords)

    cases = [case(f"{ta}{tb}-ld", f"gemm-{ta}{tb}", ta + tb, (37, 29, 23)) for ta in "NTC" for tb in "NTC"]
    cases.append(case("NN-enums", "gemm-enums", "NT", (16, 16, 16), dtype=F32, as_enums=True))
    cases += [
        case(f"{pair}-{SHORT[dt]}", f"gemm-{SHORT[dt]}-{pair}", pair, (21, 19, 17), dtype=dt)
        for pair in ("NN", "TN", "NT")
        for dt in DTYPES
    ]
    cases += [case(name, label, trans, mnk, **keywords) for name, label, trans, mnk, keywords in _GEMM_EDGES]
    cases.append(Case("gemm", "shared-allocation", _gemm_shared_allocation))
    cases += [
        case(f"nan-inf-{SHORT[dt]}", f"gemm-nan-{dt}", "TN", (7, 6, 5), specials=True, dtype=dt)
        for dt in DTYPES
    ]
    return cases


# --------------------------------------------------------------------------- batched GEMM


def _pack_batches(
    mats: npt.NDArray[Any], ld: int, stride: int, fill: float, count: int, dtype: Any
) -> npt.NDArray[Any]:
    """``count`` column-major matrices ``stride`` elements apart (``fill`` between them) as ``dtype``."""
    one = ld * mats.shape[2]
    total = stride * (count - 1) + one if count else 0
    flat = np.full(max(total, 1), fill, dtype=np.float64)
    for i in range(count):
        flat[i * stride : i * stride + one] = colmajor(mats[min(i, len(mats) - 1)], ld, fill)
    return storage(flat, dtype)


#: A flat array of stored values (in the storage dtype of the case).
StoredFlat = npt.NDArray[Any]


@dataclass(frozen=True)
class _BatchedCall:
    """The arguments of one ``batched_gemm`` call but its pointers."""

    ta: str
    tb: str
    mnk: tuple[int, int, int]
    alpha: float
    beta: float
    lds: tuple[int, int, int]
    strides: tuple[int, int, int]
    batch: int

    def round_trip(
        self, be: ComputeBackend, dtype: Any, a_flat: StoredFlat, b_flat: StoredFlat, c_flat: StoredFlat
    ) -> npt.NDArray[Any] | None:
        """Put A, B and C, run the call, return C as stored after it (None: the backend
        refuses ``dtype``, as its capabilities say). A and B must keep their bits, and C
        too when there is no batch."""
        (m, n, k), (lda, ldb, ldc), (sa, sb, sc) = self.mnk, self.lds, self.strides
        with Workspace(be) as ws:
            pa, pb = ws.put(a_flat, label="A"), ws.put(b_flat, label="B")
            pc = ws.put(c_flat, label="C")

            def call() -> None:
                be.batched_gemm(
                    self.ta, self.tb, m, n, k, self.alpha, pa, lda, sa, pb, ldb, sb, self.beta, pc, ldc, sc,
                    self.batch, dtype=dtype,
                )  # fmt: skip

            if not call_or_refuse(be, ws, "batched_gemm", dtype, call):
                return None
            got = ws.get(pc, c_flat.size, c_flat.dtype)
            ws.check_unchanged(("A", "B"))
            if self.batch == 0:
                ws.check_unchanged()
        return got


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
    specials: bool = False,
    dtype: Any = "float32",
) -> float:
    rng = rng_for(label)
    a_rows, a_cols = (k, m) if transposed(ta) else (m, k)
    b_rows, b_cols = (n, k) if transposed(tb) else (k, n)
    lda, ldb, ldc = a_rows + 2, b_rows + 1, m + 3
    stride_a = 0 if broadcast_a else lda * a_cols + gaps[0]
    stride_b = ldb * b_cols + gaps[1]
    stride_c = ldc * n + gaps[2]
    batches_a = 1 if broadcast_a else batch
    a, b, c = (
        ref.round_to(rng.standard_normal(shape), dtype)
        for shape in ((batches_a, a_rows, a_cols), (batch, b_rows, b_cols), (batch, m, n))
    )
    if c_nan:
        c[...] = np.nan
    if specials and batch:
        _inject_specials(a[-1], b[-1], c[-1])
    a_flat = _pack_batches(a, lda, stride_a, np.nan, batches_a, dtype)
    b_flat = _pack_batches(b, ldb, stride_b, np.nan, batch, dtype)
    c_flat = _pack_batches(c, ldc, stride_c, SENTINEL, batch, dtype)
    strides = (stride_a, stride_b, stride_c)
    call = _BatchedCall(ta, tb, (m, n, k), alpha, beta, (lda, ldb, ldc), strides, batch)
    got = call.round_trip(be, dtype, a_flat, b_flat, c_flat)
    if got is None or batch == 0:
        return 0.0
    worst = 0.0
    for i in range(batch):
        start, end = i * stride_c, i * stride_c + ldc * n
        if i:
            gap = slice((i - 1) * stride_c + ldc * n, start)
            assert_bits_equal(f"batched_gemm: gap before batch {i}", got[gap], c_flat[gap])
        want, tol = _want_and_tol(ta, tb, alpha, a[0 if broadcast_a else i], b[i], beta, c[i], eps_of(dtype))
        what = f"batched_gemm batch {i}"
        worst = max(worst, check_c(what, got[start:end], c_flat[start:end], m, n, ldc, want, tol, dtype))
    return worst


#: Batched GEMM cases beyond the plain ones: (name, op(A) op(B), (m, n, k), other keywords of _batched_value).
_BATCHED_EDGES: tuple[tuple[str, str, tuple[int, int, int], dict[str, Any]], ...] = (
    ("broadcast-A-stride0", "NN", (6, 4, 5), dict(batch=4, broadcast_a=True)),
    ("batch0", "NN", (3, 3, 3), dict(batch=0)),
    ("batch1", "TN", (9, 8, 7), dict(batch=1)),
    ("beta0-nan-in-C", "NT", (5, 6, 4), dict(batch=3, beta=0.0, c_nan=True)),
    ("large", "NN", (70, 66, 130), dict(batch=2)),
)


def _batched_cases() -> list[Case]:
    def case(name: str, label: str, trans: str, mnk: tuple[int, int, int], **keywords: Any) -> Case:
        return matmul_case("batched_gemm", _batched_value, name, label, trans, mnk, **keywords)

    cases = [
        case(f"{pair}-gaps", f"bg-{pair}", pair, (7, 5, 6), batch=3)
        for pair in ("NN", "TN", "NT", "TT", "CN")
    ]
    cases += [
        case(name, f"bg-{name}", trans, mnk, **keywords) for name, trans, mnk, keywords in _BATCHED_EDGES
    ]
    for dt in DTYPES:
        cases.append(case(SHORT[dt], f"bg-{SHORT[dt]}", "TN", (6, 5, 4), batch=3, dtype=dt))
        name = f"nan-inf-{SHORT[dt]}"
        cases.append(case(name, f"bg-{name}", "NT", (5, 4, 3), batch=2, specials=True, dtype=dt))
    return cases


# ----------------------------------------------------- batched GEMM writing one C side by side


def _panels_value(
    be: ComputeBackend,
    *,
    label: str,
    ta: str,
    tb: str,
    m: int,
    n: int,
    k: int,
    batch: int,
    gap: int = 0,
    share_b: bool = True,
    alpha: float = 1.0,
    beta: float = 0.0,
    c_nan: bool = False,
    specials: bool = False,
    dtype: Any = "float32",
) -> float:
    """Batches whose C matrices lie side by side in each column (``stride_c = m + gap < ldc``).

    How a runner writes one row-major product from a weight stored as column panels: batch
    ``i`` writes rows ``[i * stride_c, i * stride_c + m)`` of every column of one ``ldc``-long
    C; with ``share_b`` every batch reads the same B (``stride_b = 0``). Every element of C
    that no batch owns (the gaps, the rows after the last batch) must keep its bits.
    """
    rng = rng_for(label)
    a_rows, a_cols = (k, m) if transposed(ta) else (m, k)
    b_rows, b_cols = (n, k) if transposed(tb) else (k, n)
    lda, ldb = a_rows + 1, b_rows + 2
    stride_a, stride_b, stride_c = lda * a_cols + 3, 0 if share_b else ldb * b_cols + 2, m + gap
    ldc = (batch - 1) * stride_c + m + 2
    batches_b = 1 if share_b else batch
    a, b, c = (
        ref.round_to(rng.standard_normal(shape), dtype)
        for shape in ((batch, a_rows, a_cols), (batches_b, b_rows, b_cols), (batch, m, n))
    )
    if c_nan:
        c[...] = np.nan
    if specials:
        _inject_specials(a[-1], b[-1], c[-1])
    whole = np.full(ldc * n, SENTINEL, dtype=np.float64)
    owned = np.zeros(ldc * n, dtype=bool)
    spots = [i * stride_c + np.arange(m)[:, None] + ldc * np.arange(n)[None, :] for i in range(batch)]
    for i, spot in enumerate(spots):
        whole[spot], owned[spot] = c[i], True
    c_flat = storage(whole, dtype)
    a_flat = _pack_batches(a, lda, stride_a, np.nan, batch, dtype)
    b_flat = _pack_batches(b, ldb, stride_b, np.nan, batches_b, dtype)
    strides = (stride_a, stride_b, stride_c)
    call = _BatchedCall(ta, tb, (m, n, k), alpha, beta, (lda, ldb, ldc), strides, batch)
    got = call.round_trip(be, dtype, a_flat, b_flat, c_flat)
    if got is None:
        return 0.0
    assert_bits_equal("batched_gemm: C outside every batch's rows", got[~owned], c_flat[~owned])
    worst = 0.0
    for i, spot in enumerate(spots):
        want, tol = _want_and_tol(ta, tb, alpha, a[i], b[0 if share_b else i], beta, c[i], eps_of(dtype))
        stored = ref.stored_colmajor(got[spot.reshape(-1, order="F")], m, n, m)
        what = f"batched_gemm side-by-side batch {i}"
        worst = max(worst, assert_close(what, stored, want, storage_tol(tol, want, dtype), dtype=dtype))
    return worst


#: (name, op(A) op(B), (m, n, k), keywords of _panels_value). The float32 cases with a
#: shared B, alpha 1 and beta 0 or 1 are the weight-panel products a model runner issues.
_PANEL_CASES: tuple[tuple[str, str, tuple[int, int, int], dict[str, Any]], ...] = (
    ("panels-shared-B-accumulate", "NN", (13, 9, 17), dict(batch=3, beta=1.0)),
    ("panels-shared-B-gaps-nan-C", "NT", (20, 8, 18), dict(batch=4, gap=3, c_nan=True)),
    ("panels-shared-B-specials", "NN", (16, 10, 16), dict(batch=2, specials=True)),
    ("panels-general", "TN", (5, 6, 7), dict(batch=3, gap=1, share_b=False, alpha=0.75, beta=1.25)),
)


def _panel_cases() -> list[Case]:
    cases = [
        matmul_case("batched_gemm", _panels_value, name, f"bgp-{name}", trans, mnk, **keywords)
        for name, trans, mnk, keywords in _PANEL_CASES
    ]
    for dt in DTYPES:
        name = f"panels-{SHORT[dt]}"
        keywords: dict[str, Any] = dict(batch=3, gap=1, alpha=0.75, beta=1.25, dtype=dt)
        cases.append(
            matmul_case("batched_gemm", _panels_value, name, f"bgp-{name}", "NT", (6, 5, 4), **keywords)
        )
    return cases


def blas_cases() -> list[Case]:
    """Every gemm and batched_gemm value case."""
    return _gemm_cases() + _batched_cases() + _panel_cases()
