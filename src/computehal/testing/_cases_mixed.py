"""Mixed-precision GEMM value cases: f16 / bf16 rounding of float32 operands, ties, overflow, NaN."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from . import reference as ref
from ._cases_blas import SENTINEL, check_c, finite_abs, gemm_tol, matmul_case, transposed
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


def _ties(eps: float, tie: float, small: float) -> npt.NDArray[np.float32]:
    """Eight float32 values for a 16-bit format whose unit in the last place at 1 is ``2 * eps``.

    Five lie exactly halfway between two neighbours (``1 + eps``, ``1 + 3 eps``, ``tie``,
    ``tie + 2``, ``-(1 + eps)``: each must round to the even one), one just above a tie (it
    rounds up), then 0.1 and ``small`` (near or below the format's smallest normal number).
    """
    one = np.float32(1.0)
    return np.array(
        [
            one + np.float32(eps),
            one + np.float32(3 * eps),
            np.float32(tie),
            np.float32(tie + 2),
            np.float32(-(1 + eps)),
            np.float32(1 + eps + 2.0**-20),
            np.float32(0.1),
            np.float32(small),
        ],
        dtype=F32,
    )


def _edge_rows() -> list[tuple[str, str, str, tuple[int, int, int], dict[str, Any]]]:
    """Rounding edge cases: (name, precision, op(A) op(B), (m, n, k), other keywords of _mixed_value)."""
    f16_ties, bf16_ties = _ties(2.0**-11, 2049.0, 1e-8), _ties(2.0**-8, 257.0, 3e-39)
    # NaN and infinities in a real product: k = 3, so inf meets 0 (NaN) and finite terms.
    specials = [np.nan, 1.0, -2.0, np.inf, 0.5, 0.25, -1.0, 3.0, 2.0, -np.inf, 1.5, 0.75]
    special_b = [1.0, 0.0, 2.0, -1.0, 0.5, 0.0, 0.25, 1.0, -0.5]
    rows: list[tuple[str, str, str, tuple[int, int, int], dict[str, Any]]] = [
        # Ties: halfway values must round to even (a round-half-up or truncating
        # conversion gives a different C). B is the identity, so C = round(A).
        (
            "f16-ties-to-even", "f16", "NN", (1, 8, 8),
            dict(a_values=f16_ties, b_values=np.eye(8, dtype=F32), beta=0.0),
        ),
        ("f16-ties-columns", "F16", "TN", (8, 1, 1), dict(a_values=f16_ties, b_values=[1.0], beta=0.0)),
        ("bf16-ties-columns", "BF16", "TN", (8, 1, 1), dict(a_values=bf16_ties, b_values=[1.0], beta=0.0)),
        # Overflow to infinity and NaN propagation (k = 1, so no inf * 0 terms).
        (
            "f16-overflow-nan", "f16", "NN", (6, 2, 1),
            dict(a_values=[70000.0, 65520.0, -65520.0, 65504.0, np.nan, 65519.0], b_values=[1.0, -2.0],
                 beta=0.0),
        ),
        (
            "bf16-overflow-nan", "bf16", "NN", (5, 2, 1),
            dict(a_values=[3.4028235e38, -3.4028235e38, 3.3895e38, np.nan, 1e38], b_values=[1.0, 0.5],
                 beta=0.0),
        ),
    ]  # fmt: skip
    for prec in ("f16", "bf16"):
        a_values = np.array(specials, dtype=F32).reshape(3, 4).T.reshape(-1)
        b_values = np.array(special_b, dtype=F32)
        rows.append((f"{prec}-nan-inf", prec, "NN", (4, 3, 3), dict(a_values=a_values, b_values=b_values)))
    return rows


def _mixed_cases() -> list[Case]:
    def case(name: str, prec: str, trans: str, mnk: tuple[int, int, int], **keywords: Any) -> Case:
        return matmul_case(
            "gemm_mixed_precision", _mixed_value, name, f"mp-{name}", trans, mnk, prec=prec, **keywords
        )

    cases: list[Case] = []
    for prec in ("f16", "bf16"):
        cases += [case(f"{prec}-{pair}-ld", prec, pair, (23, 19, 64)) for pair in ("NN", "TN", "NT", "TT")]
        cases += [
            case(f"{prec}-large", prec, "NN", (70, 65, 130)),
            case(f"{prec}-beta0-nan-in-C", prec, "NN", (6, 5, 8), beta=0.0, c_nan=True),
            case(f"{prec}-k0", prec, "NN", (6, 5, 0), beta=2.0),
            case(f"{prec}-m0", prec, "NN", (0, 5, 3)),
        ]
    cases += [case(name, prec, trans, mnk, **keywords) for name, prec, trans, mnk, keywords in _edge_rows()]
    return cases


def mixed_cases() -> list[Case]:
    """Every gemm_mixed_precision value case."""
    return _mixed_cases()
