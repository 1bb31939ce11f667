"""Host objects handed to a backend: byte buffers and index lists, snapshotted before use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError

__all__ = ["host_buffer", "snapshot_indices"]

#: struct-module formats of plain numbers (and raw bytes / chars): the only memoryview
#: formats whose bytes carry no pointers and may be copied to and from a device.
_NUMERIC_FORMATS = frozenset("?bBhHiIlLqQnNefdc") | {"Zf", "Zd", "Zg", "g"}
#: NumPy dtype kinds of plain numbers.
_NUMERIC_KINDS = frozenset("biufc")


def _format_of(view: memoryview) -> str:
    fmt = view.format
    return fmt[1:] if fmt[:1] in "@=<>!" else fmt


def _numeric(dt: np.dtype[Any]) -> bool:
    """Plain numbers: ints, floats, complex, extension number types, and records of them."""
    if dt.hasobject:
        return False
    if dt.fields:
        return all(_numeric(field[0]) for field in dt.fields.values())
    if dt.subdtype is not None:
        return _numeric(dt.subdtype[0])
    return dt.kind in _NUMERIC_KINDS or dt.kind == "V"


def _numpy_bytes(name: str, arr: npt.NDArray[Any], writable: bool) -> memoryview:
    dt = arr.dtype
    if not _numeric(dt):
        raise InvalidArgumentError(
            f"{name} has dtype {dt}, which is not numeric data; only numbers (ints, floats, "
            "bfloat16 and other numeric extension types) can be copied"
        )
    if not arr.flags.c_contiguous:
        raise InvalidArgumentError(f"{name} must be C-contiguous")
    if writable and not arr.flags.writeable:
        raise InvalidArgumentError(f"{name} must be writable")
    flat: memoryview = arr.reshape(-1).view(np.uint8).data
    return flat


def host_buffer(name: str, obj: object, writable: bool) -> memoryview:
    """A flat byte view of a C-contiguous host buffer of numbers.

    Buffers are taken by the buffer protocol; their format must be numeric (object,
    datetime, string and structured data are refused, since raw bytes written over them
    could corrupt the interpreter). NumPy arrays of extension number types that the
    buffer protocol cannot express (ml_dtypes' bfloat16) are read as raw bytes of the
    right size.

    Raises
    ------
    InvalidArgumentError
        For anything that is not a C-contiguous numeric buffer (or not writable when
        ``writable`` is asked).
    """
    if isinstance(obj, np.ndarray):
        if type(obj) is not np.ndarray:
            # Subclasses (masked arrays, matrices, memmaps) may override what their data
            # means; only their raw buffer is copied.
            obj = obj.view(np.ndarray)
        return _numpy_bytes(name, obj, writable)
    try:
        view = memoryview(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError) as exc:
        raise InvalidArgumentError(
            f"{name} must support the buffer protocol (bytes, bytearray, memoryview, ndarray): "
            f"{type(obj).__name__} does not ({exc})"
        ) from None
    if _format_of(view) not in _NUMERIC_FORMATS:
        raise InvalidArgumentError(
            f"{name} has buffer format {view.format!r}, which is not numeric data; only numbers can be copied"
        )
    if not view.c_contiguous:
        raise InvalidArgumentError(f"{name} must be C-contiguous")
    if writable and view.readonly:
        raise InvalidArgumentError(f"{name} must be writable")
    try:
        return view.cast("B")
    except TypeError:  # formats memoryview cannot cast (complex): the same bytes through NumPy
        flat: memoryview = np.frombuffer(view, dtype=np.uint8).data
        return flat


def snapshot_indices(name: str, value: object) -> npt.NDArray[np.int64]:
    """A private, read-only int64 copy of an index list; every check runs on this copy.

    Accepts a sequence of ints (bools refused) or a one-dimensional integer array
    (of any subclass: the raw values are copied, a mask is not honoured).
    """
    if isinstance(value, (str, bytes)):
        raise InvalidArgumentError(f"{name} must be a sequence of integers, got a string")
    if isinstance(value, np.ndarray):
        raw = value.view(np.ndarray) if type(value) is not np.ndarray else value
        if raw.dtype.kind not in "iu":
            if raw.size == 0 and raw.ndim == 1:
                return np.zeros(0, dtype=np.int64)
            raise InvalidArgumentError(f"{name} must have an integer dtype, got {raw.dtype}")
        if raw.ndim != 1:
            raise InvalidArgumentError(f"{name} must be one-dimensional, got {raw.ndim} dimensions")
        if raw.dtype == np.uint64 and raw.size and int(raw.max()) > 2**63 - 1:
            raise InvalidArgumentError(f"an entry of {name} does not fit in 64 bits")
        out = np.array(raw, dtype=np.int64, copy=True)
    else:
        if not isinstance(value, (Sequence, range)):
            raise InvalidArgumentError(
                f"{name} must be a sequence of integers or an integer array, got {type(value).__name__}"
            )
        try:
            items = list(value)
        except Exception as exc:  # noqa: BLE001 - a hostile sequence: report it, never crash
            raise InvalidArgumentError(f"{name} could not be read: {exc}") from None
        for i, item in enumerate(items):
            if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
                raise InvalidArgumentError(f"{name}[{i}] must be an integer, got {type(item).__name__}")
        try:
            out = np.array([int(item) for item in items], dtype=np.int64)
        except OverflowError:
            raise InvalidArgumentError(f"an entry of {name} does not fit in 64 bits") from None
    out.setflags(write=False)
    return out
