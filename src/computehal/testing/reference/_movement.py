"""Data movement: byte copies, fills, strided copies, row gather and scatter (bit copies)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ._rounding import F64Array, storage

__all__ = ["copy_dtod", "fill", "copy_strided", "gather", "scatter"]


def copy_dtod(memory: npt.ArrayLike, dst: int, src: int, nbytes: int) -> npt.NDArray[np.uint8]:
    """``memory`` (bytes) after ``memmove(memory + dst, memory + src, nbytes)``."""
    data = np.array(memory, dtype=np.uint8).reshape(-1)
    moved = data[src : src + nbytes].copy()  # read first
    data[dst : dst + nbytes] = moved
    return data


def fill(count: int, value: float, dtype: Any) -> npt.NDArray[Any]:
    """``count`` copies of ``value`` rounded (nearest even) to ``dtype``, in its storage type."""
    return storage(np.full(count, value, dtype=np.float64), dtype)


def copy_strided(
    dst: npt.NDArray[Any],
    dst_origin: int,
    src: npt.NDArray[Any],
    src_origin: int,
    shape: Sequence[int],
    src_strides: Sequence[int],
    dst_strides: Sequence[int],
) -> npt.NDArray[Any]:
    """``dst`` (a flat array of elements) after ``dst[idx] = src[idx]`` for every ``idx`` of ``shape``.

    Element ``idx`` is read at ``src_origin + sum(idx * src_strides)`` of ``src`` and
    written at ``dst_origin + sum(idx * dst_strides)`` of ``dst``. The source is read
    completely before anything is written (``src`` may be ``dst``). Elements are moved
    as raw bits.
    """
    source = np.array(src).reshape(-1).view(np.uint8).reshape(np.asarray(src).size, -1).copy()
    out = np.array(dst).reshape(-1)
    target = out.view(np.uint8).reshape(out.size, -1)
    for index in np.ndindex(*shape):
        s = src_origin + sum(i * st for i, st in zip(index, src_strides, strict=True))
        d = dst_origin + sum(i * st for i, st in zip(index, dst_strides, strict=True))
        target[d] = source[s]
    return out


def gather(table: npt.ArrayLike, indices: Sequence[int]) -> F64Array:
    """``out[i] = table[indices[i]]``, one row at a time."""
    t = np.asarray(table)
    out = np.empty((len(indices), t.shape[1]), dtype=t.dtype)
    for i, index in enumerate(indices):
        out[i] = t[int(index)]
    return out


def scatter(rows_in: npt.ArrayLike, indices: Sequence[int], out: npt.ArrayLike) -> F64Array:
    """``out[indices[i]] = rows_in[i]`` in order, so the last duplicate wins."""
    result = np.array(out)
    src = np.asarray(rows_in)
    for i, index in enumerate(indices):
        result[int(index)] = src[i]
    return result
