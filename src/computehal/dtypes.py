"""The element types of computehal operations, and their names.

Every compute operation takes a keyword-only ``dtype``: one of ``"float16"``,
``"bfloat16"``, ``"float32"`` or ``"float64"`` (the strings, or the NumPy / ml_dtypes
dtype objects). float16 and bfloat16 are storage types: operands are widened to
float32, computed in float32, and rounded to nearest-even when stored. Index
operands (``gather`` / ``scatter`` with ``indices_ptr``) are ``"int32"`` or ``"int64"``.

ml_dtypes (which gives NumPy a bfloat16) is imported only when bfloat16 is named,
so ``import computehal`` stays cheap.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .errors import InvalidArgumentError, UnsupportedError

__all__ = [
    "FLOAT_DTYPES",
    "INDEX_DTYPES",
    "F16",
    "F32",
    "F64",
    "I32",
    "I64",
    "bfloat16",
    "as_dtype",
    "as_float_dtype",
    "as_index_dtype",
    "is_16bit",
]

#: The floating-point dtype names every operation understands, narrowest first.
FLOAT_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64")
#: Index dtype names for device-side indices.
INDEX_DTYPES: tuple[str, ...] = ("int32", "int64")

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I32 = np.dtype(np.int32)
I64 = np.dtype(np.int64)

_BY_OBJECT: dict[object, np.dtype[Any]] = {
    "float16": F16,
    "float32": F32,
    "float64": F64,
    "int32": I32,
    "int64": I64,
    F16: F16,
    F32: F32,
    F64: F64,
    I32: I32,
    I64: I64,
    np.float16: F16,
    np.float32: F32,
    np.float64: F64,
    np.int32: I32,
    np.int64: I64,
    float: F64,
}


@functools.cache
def bfloat16() -> np.dtype[Any]:
    """The NumPy dtype of bfloat16 (from ml_dtypes, imported on first use)."""
    import ml_dtypes

    dt: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
    return dt


def _lookup(value: object) -> np.dtype[Any] | None:
    try:
        found = _BY_OBJECT.get(value)
    except TypeError:  # unhashable
        found = None
    if found is not None:
        return found
    if isinstance(value, str) and value.strip().lower() in ("bfloat16", "bf16"):
        return bfloat16()
    if getattr(value, "__name__", None) == "bfloat16" or str(value) == "bfloat16":
        return bfloat16()
    try:
        dt: np.dtype[Any] = np.dtype(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return dt


def as_dtype(value: object, argument: str, allowed: tuple[str, ...]) -> np.dtype[Any]:
    """Normalise a dtype argument to one of the ``allowed`` names.

    Raises
    ------
    InvalidArgumentError
        If ``value`` is not a dtype at all.
    UnsupportedError
        If it is a dtype, but not one of ``allowed``.
    """
    dt = _lookup(value)
    if dt is None:
        raise InvalidArgumentError(f"{argument} must be one of {', '.join(allowed)}; got {value!r}")
    if dt.name not in allowed:
        raise UnsupportedError(f"{argument} {dt.name} (this operation takes {', '.join(allowed)})")
    return dt


def as_float_dtype(value: object, argument: str = "dtype") -> np.dtype[Any]:
    """``value`` as one of :data:`FLOAT_DTYPES`."""
    if value is F32 or value == "float32":
        return F32
    return as_dtype(value, argument, FLOAT_DTYPES)


def as_index_dtype(value: object, argument: str = "index_dtype") -> np.dtype[Any]:
    """``value`` as one of :data:`INDEX_DTYPES`."""
    return as_dtype(value, argument, INDEX_DTYPES)


def is_16bit(dtype: np.dtype[Any]) -> bool:
    """True for the storage-only types float16 and bfloat16."""
    return dtype.itemsize == 2
