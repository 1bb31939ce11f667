"""Direct calls into BLAS on raw addresses.

``scipy.linalg.blas.dgemm`` copies any operand that is not a contiguous Fortran
array, which would break the zero-copy contract with leading dimensions. The Fortran
entry points themselves run exactly the BLAS routine the caller asked for, on the
caller's memory, with the caller's leading dimensions; ctypes releases the GIL for the
call. Two builds of OpenBLAS are at hand, and the faster one is taken:

* NumPy's (the ``scipy-openblas64`` build its wheels ship, 64-bit integers), found by
  its file in ``numpy.libs`` and checked on a small product when first loaded. It ran
  the convolutions' shapes 1.1-1.3x faster than SciPy's on one core (ResNet's 256 -> 64
  1x1 layer: 108 vs 87 GFLOP/s; the 7x7 stem's 64 x 147 x 1783 blocks: 127 vs 98);
  square products alike (153 vs 152 at 2048).
* SciPy's, through the PyCapsules of ``scipy.linalg.cython_blas.__pyx_capi__`` (32-bit
  integers), wherever NumPy's is not found or fails the check.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
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


def _prototype(name: str, flags: int, sizes: int, integer: Any) -> Any:
    """The ctypes prototype of Fortran ``name``: ``flags`` char arguments (transposes), ``sizes``
    integer sizes, then ``alpha, A, lda, B, ldb, beta, C, ldc`` (gemv: ``x, incx`` and ``y, incy``)."""
    pointer = ctypes.POINTER(integer)
    scalar = ctypes.POINTER(ctypes.c_double if name.startswith("d") else ctypes.c_float)
    return ctypes.CFUNCTYPE(
        None,
        *(ctypes.c_char_p,) * flags,
        *(pointer,) * sizes,
        scalar,
        ctypes.c_void_p,
        pointer,
        ctypes.c_void_p,
        pointer,
        scalar,
        ctypes.c_void_p,
        pointer,
    )


@functools.cache
def _numpy_blas() -> ctypes.CDLL | None:
    """NumPy's own OpenBLAS (64-bit integers), or None where it is not found or gives wrong results."""
    folder = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in sorted(glob.glob(os.path.join(folder, "libscipy_openblas64_*.so"))):
        try:
            library = ctypes.CDLL(path)
            library.scipy_sgemm_64_  # noqa: B018  (the symbol must be there)
        except (OSError, AttributeError):
            continue
        if _checked(library):
            return library
    return None


def _checked(library: ctypes.CDLL) -> bool:
    """True when ``library``'s sgemm multiplies a 2 x 3 by a 3 x 2 matrix correctly."""
    a = np.arange(1, 7, dtype=np.float32).reshape(3, 2, order="F").T.copy(order="F")
    b = np.arange(1, 7, dtype=np.float32).reshape(3, 2, order="F")
    c = np.zeros((2, 2), dtype=np.float32, order="F")
    function = _prototype("sgemm", 2, 3, ctypes.c_int64)(("scipy_sgemm_64_", library))
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    sizes = [ctypes.c_int64(v) for v in (2, 2, 3, 2, 3, 2)]
    function(
        b"N", b"N", *(ctypes.byref(v) for v in sizes[:3]), ctypes.byref(one),
        a.ctypes.data, ctypes.byref(sizes[3]), b.ctypes.data, ctypes.byref(sizes[4]),
        ctypes.byref(zero), c.ctypes.data, ctypes.byref(sizes[5]),
    )  # fmt: skip
    return bool(np.array_equal(c, a @ b))


@functools.cache
def _routine(name: str, flags: int, sizes: int) -> tuple[Callable[..., None], Any]:
    """The Fortran BLAS routine ``name`` (see :func:`_prototype`) and its integer type."""
    library = _numpy_blas()
    if library is not None:
        try:
            function: Callable[..., None] = _prototype(name, flags, sizes, ctypes.c_int64)(
                (f"scipy_{name}_64_", library)
            )
            return function, ctypes.c_int64
        except AttributeError:
            pass
    function = _prototype(name, flags, sizes, ctypes.c_int)(_address(name))
    return function, ctypes.c_int


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
    routine, integer = _routine(("d" if double else "s") + name, len(flags), len(sizes))
    scalar = ctypes.c_double if double else ctypes.c_float
    routine(
        *(b"T" if flag else b"N" for flag in flags),
        *(ctypes.byref(integer(size)) for size in sizes),
        ctypes.byref(scalar(alpha)),
        a,
        ctypes.byref(integer(lda)),
        b,
        ctypes.byref(integer(ldb)),
        ctypes.byref(scalar(beta)),
        c,
        ctypes.byref(integer(ldc)),
    )
