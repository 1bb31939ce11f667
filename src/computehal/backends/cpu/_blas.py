"""Direct calls into SciPy's BLAS on raw addresses.

``scipy.linalg.blas.dgemm`` copies any operand that is not a contiguous Fortran
array, which would break the zero-copy contract with leading dimensions. SciPy
also exports the Fortran BLAS entry points as PyCapsules
(``scipy.linalg.cython_blas.__pyx_capi__``); calling those through ``ctypes``
runs exactly the BLAS routine the caller asked for, on the caller's memory, with
the caller's leading dimensions. ctypes releases the GIL for the call.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["gemm_at", "gemv_at"]

_c_int_p = ctypes.POINTER(ctypes.c_int)


def _address(name: str) -> int:
    import scipy.linalg.cython_blas as cython_blas

    capsule = cython_blas.__pyx_capi__[name]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address: int = get_pointer(capsule, get_name(capsule))
    return address


@functools.cache
def _routine(name: str, flags: int, sizes: int) -> Callable[..., None]:
    """The Fortran BLAS routine ``name``: ``flags`` char arguments (transposes), ``sizes`` integer
    sizes, then ``alpha, A, lda, B, ldb, beta, C, ldc`` (gemv: ``x, incx`` and ``y, incy``)."""
    scalar = ctypes.POINTER(ctypes.c_double if name.startswith("d") else ctypes.c_float)
    prototype = ctypes.CFUNCTYPE(
        None,
        *(ctypes.c_char_p,) * flags,
        *(_c_int_p,) * sizes,
        scalar,
        ctypes.c_void_p,
        _c_int_p,
        ctypes.c_void_p,
        _c_int_p,
        scalar,
        ctypes.c_void_p,
        _c_int_p,
    )
    function: Callable[..., None] = prototype(_address(name))
    return function


def gemm_at(
    dtype: np.dtype[Any],
    trans_a: bool,
    trans_b: bool,
    m: int,
    n: int,
    k: int,
    alpha: float,
    a: int,
    lda: int,
    b: int,
    ldb: int,
    beta: float,
    c: int,
    ldc: int,
) -> None:
    """Call Fortran ``?gemm`` on raw addresses (column-major, validated by the caller).

    The caller guarantees the BLAS quick-return cases are handled and that every
    operand range is inside live memory; this function only marshals arguments.
    """
    _call("gemm", dtype, (trans_a, trans_b), (m, n, k), alpha, a, lda, b, ldb, beta, c, ldc)


def gemv_at(
    dtype: np.dtype[Any],
    trans: bool,
    rows: int,
    cols: int,
    alpha: float,
    a: int,
    lda: int,
    x: int,
    incx: int,
    beta: float,
    y: int,
    incy: int,
) -> None:
    """Call Fortran ``?gemv`` on raw addresses: ``y = alpha * op(A) @ x + beta * y``.

    ``A`` is stored ``rows x cols`` column-major with leading dimension ``lda``; like
    :func:`gemm_at`, the caller has validated every range and handled quick returns.
    """
    _call("gemv", dtype, (trans,), (rows, cols), alpha, a, lda, x, incx, beta, y, incy)


def _call(
    name: str,
    dtype: np.dtype[Any],
    flags: tuple[bool, ...],
    sizes: tuple[int, ...],
    alpha: float,
    a: int,
    lda: int,
    b: int,
    ldb: int,
    beta: float,
    c: int,
    ldc: int,
) -> None:
    """Call ``d<name>`` or ``s<name>`` (by ``dtype``) with its transposes, sizes and operands."""
    double = dtype == np.float64
    routine = _routine(("d" if double else "s") + name, len(flags), len(sizes))
    scalar = ctypes.c_double if double else ctypes.c_float
    routine(
        *(b"T" if flag else b"N" for flag in flags),
        *(ctypes.byref(ctypes.c_int(size)) for size in sizes),
        ctypes.byref(scalar(alpha)),
        a,
        ctypes.byref(ctypes.c_int(lda)),
        b,
        ctypes.byref(ctypes.c_int(ldb)),
        ctypes.byref(scalar(beta)),
        c,
        ctypes.byref(ctypes.c_int(ldc)),
    )
