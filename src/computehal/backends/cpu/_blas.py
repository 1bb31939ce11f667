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

__all__ = ["gemm_at"]

_c_int_p = ctypes.POINTER(ctypes.c_int)


@functools.cache
def _routine(name: str) -> Callable[..., None]:
    import scipy.linalg.cython_blas as cython_blas

    capsule = cython_blas.__pyx_capi__[name]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = get_pointer(capsule, get_name(capsule))
    scalar = ctypes.c_double if name.startswith("d") else ctypes.c_float
    prototype = ctypes.CFUNCTYPE(
        None,
        ctypes.c_char_p,
        ctypes.c_char_p,
        _c_int_p,
        _c_int_p,
        _c_int_p,
        ctypes.POINTER(scalar),
        ctypes.c_void_p,
        _c_int_p,
        ctypes.c_void_p,
        _c_int_p,
        ctypes.POINTER(scalar),
        ctypes.c_void_p,
        _c_int_p,
    )
    function: Callable[..., None] = prototype(address)
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
    routine = _routine("dgemm" if dtype == np.float64 else "sgemm")
    scalar = ctypes.c_double if dtype == np.float64 else ctypes.c_float
    routine(
        b"T" if trans_a else b"N",
        b"T" if trans_b else b"N",
        ctypes.byref(ctypes.c_int(m)),
        ctypes.byref(ctypes.c_int(n)),
        ctypes.byref(ctypes.c_int(k)),
        ctypes.byref(scalar(alpha)),
        a,
        ctypes.byref(ctypes.c_int(lda)),
        b,
        ctypes.byref(ctypes.c_int(ldb)),
        ctypes.byref(scalar(beta)),
        c,
        ctypes.byref(ctypes.c_int(ldc)),
    )
