"""Mixed-precision GEMM value cases: f16 / bf16 rounding of float32 operands, ties, overflow, NaN."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from . import reference as ref
from ._cases_blas import SENTINEL, check_c, finite_abs, gemm_tol, transposed
from ._common import EPS32, Case, call_or_refuse, colmajor, rng_for
from .workspace import Workspace

__all__ = ["mixed_cases"]

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


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
    a_rows, a_cols = (k, m) if transposed(ta) else (m, k)
    b_rows, b_cols = (n, k) if transposed(tb) else (k, n)
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

        def call() -> None:
            be.gemm_mixed_precision(prec, ta, tb, m, n, k, alpha, pa, lda, pb, ldb, beta, pc, ldc)

        if not call_or_refuse(be, ws, "gemm_mixed_precision", "float32", call):
            return 0.0
        got = ws.get(pc, c_flat.size)
        ws.check_unchanged(("A", "B"))
    want = ref.gemm_mixed_precision(prec, transposed(ta), transposed(tb), alpha, a, b, beta, c)
    rounder = ref.round_f16 if prec in ("f16", "F16") else ref.round_bf16
    ar, br = rounder(a), rounder(b)
    op_a = (ar.T if transposed(ta) else ar).astype(F64)
    op_b = (br.T if transposed(tb) else br).astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        tol = gemm_tol(finite_abs(op_a), finite_abs(op_b), c.astype(F64), alpha, beta, EPS32)
    return check_c(f"gemm_mixed_precision({prec})", got, c_flat, m, n, ldc, want, tol, F32)


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
    # NaN and infinities in a real product: k = 3, so inf meets 0 (NaN) and finite terms.
    specials = [np.nan, 1.0, -2.0, np.inf, 0.5, 0.25, -1.0, 3.0, 2.0, -np.inf, 1.5, 0.75]
    for prec in ("f16", "bf16"):
        add(
            f"{prec}-nan-inf",
            prec=prec,
            ta="N",
            tb="N",
            m=4,
            n=3,
            k=3,
            a_values=np.array(specials, dtype=F32).reshape(3, 4).T.reshape(-1),
            b_values=np.array([1.0, 0.0, 2.0, -1.0, 0.5, 0.0, 0.25, 1.0, -0.5], dtype=F32),
        )
    return cases


def mixed_cases() -> list[Case]:
    """Every gemm_mixed_precision value case."""
    return _mixed_cases()
