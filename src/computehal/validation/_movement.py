"""Data movement on the device: copies, fills, strided copies, row gather and scatter."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ..dtypes import as_index_dtype
from ..errors import InvalidArgumentError
from ..memory import Lease, Region, as_count, as_pointer
from ._core import MAX_DIMS, Operand, Problem, Role, as_ints, as_scalar, as_shape, float_dtype, record
from ._host import snapshot_indices

__all__ = [
    "CopyProblem",
    "FillProblem",
    "StridedProblem",
    "RowsProblem",
    "GatherProblem",
    "ScatterProblem",
    "copy_dtod",
    "fill",
    "copy_strided",
    "gather",
    "scatter",
    "last_occurrences",
    "check_no_self_overlap",
]

BYTES = np.dtype(np.uint8)


@record
class CopyProblem(Problem):
    """A validated ``copy_dtod`` of ``nbytes`` bytes (``dtype`` is uint8: raw bytes)."""

    OPERANDS: ClassVar[tuple[Operand, ...]] = (
        Operand("src", Role.IN, False),
        Operand("dst", Role.OUT, False),
    )
    ALIAS_IDENTICAL_OK: ClassVar[bool] = True

    dst: Region
    src: Region
    nbytes: int
    dtype: np.dtype[Any] = BYTES

    @property
    def empty(self) -> bool:
        """True when nothing changes: no bytes, or a range copied onto itself."""
        return self.nbytes == 0 or (
            self.dst.allocation is self.src.allocation and self.dst.offset == self.src.offset
        )


def copy_dtod(lease: Lease, dst_ptr: object, src_ptr: object, nbytes: object) -> CopyProblem:
    """Validate ``copy_dtod``."""
    count = as_count("nbytes", nbytes)
    dp, sp = as_pointer("dst_ptr", dst_ptr), as_pointer("src_ptr", src_ptr)
    dst = lease.resolve("dst_ptr", dp, count)
    src = lease.resolve("src_ptr", sp, count)
    return CopyProblem(dst, src, count)


@record
class FillProblem(Problem):
    """A validated ``fill``: ``count`` elements of ``dtype`` set to ``value`` (rounded to ``dtype``)."""

    OPERANDS: ClassVar[tuple[Operand, ...]] = (Operand("region", Role.OUT),)

    region: Region
    count: int
    value: float
    dtype: np.dtype[Any]


def fill(
    lease: Lease, ptr: object, count: object, value: object, *, dtype: object = "float32"
) -> FillProblem:
    """Validate ``fill``."""
    dt = float_dtype(dtype)
    n = as_count("count", count)
    val = as_scalar("value", value)
    p = as_pointer("ptr", ptr)
    region = lease.resolve("ptr", p, n * dt.itemsize, align=dt.itemsize)
    return FillProblem(region, n, val, dt)


# --------------------------------------------------------------------------- strided copies


@record
class StridedProblem(Problem):
    """A validated ``copy_strided``.

    Element ``idx`` of ``shape`` is read at element ``src_origin + sum(idx * src_strides)``
    of region ``src`` and written at element ``dst_origin + sum(idx * dst_strides)`` of
    ``dst``; the regions span exactly the elements addressed (strides may be negative,
    and a zero source stride broadcasts).
    """

    OPERANDS: ClassVar[tuple[Operand, ...]] = (Operand("src", Role.IN), Operand("dst", Role.INOUT))

    shape: tuple[int, ...]
    src_strides: tuple[int, ...]
    dst_strides: tuple[int, ...]
    src: Region
    dst: Region
    src_origin: int
    dst_origin: int
    dtype: np.dtype[Any]

    @property
    def size(self) -> int:
        """Number of elements copied."""
        return math.prod(self.shape)

    @property
    def empty(self) -> bool:
        """True when no element is copied."""
        return self.size == 0


def _extent(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int]:
    """(lowest, highest) element offset addressed, relative to element 0."""
    low = sum(min(0, (e - 1) * s) for e, s in zip(shape, strides, strict=False))
    high = sum(max(0, (e - 1) * s) for e, s in zip(shape, strides, strict=False))
    return low, high


def check_no_self_overlap(name: str, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
    """Refuse strides under which two elements of ``shape`` share one address.

    A sufficient test: sorted by ``|stride|``, each dimension of extent > 1 must step past
    everything the smaller dimensions span.
    """
    spanned = 0
    for e, s in sorted(
        ((e, abs(s)) for e, s in zip(shape, strides, strict=False) if e > 1), key=lambda t: t[1]
    ):
        if s <= spanned:
            raise InvalidArgumentError(
                f"{name} {list(strides)} make several elements of shape {list(shape)} share one "
                "destination address"
            )
        spanned += (e - 1) * s


def _strided_region(
    lease: Lease,
    name: str,
    ptr: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    size: int,
    empty: bool,
) -> tuple[Region, int]:
    if empty:
        return lease.resolve(name, ptr, 0, align=size), 0
    low, high = _extent(shape, strides)
    start = ptr + low * size
    if start <= 0:
        raise InvalidArgumentError(f"{name} = {ptr:#x} with these strides reaches below address 0")
    region = lease.resolve(name, start, (high - low + 1) * size, align=size)
    return region, -low


def copy_strided(
    lease: Lease,
    dst_ptr: object,
    src_ptr: object,
    shape: object,
    src_strides: object,
    dst_strides: object,
    *,
    dtype: object = "float32",
) -> StridedProblem:
    """Validate ``copy_strided``."""
    dt = float_dtype(dtype)
    dims = as_shape("shape", shape)
    if len(dims) > MAX_DIMS:
        raise InvalidArgumentError(f"shape has {len(dims)} dimensions; at most {MAX_DIMS} are supported")
    ss = as_ints("src_strides", src_strides, len(dims))
    ds = as_ints("dst_strides", dst_strides, len(dims))
    dp, sp = as_pointer("dst_ptr", dst_ptr), as_pointer("src_ptr", src_ptr)
    empty = math.prod(dims) == 0
    if not empty:
        check_no_self_overlap("dst_strides", dims, ds)
    size = dt.itemsize
    src, src_origin = _strided_region(lease, "src_ptr", sp, dims, ss, size, empty)
    dst, dst_origin = _strided_region(lease, "dst_ptr", dp, dims, ds, size, empty)
    return StridedProblem(dims, ss, ds, src, dst, src_origin, dst_origin, dt)


# --------------------------------------------------------------------------- gather / scatter


@record
class RowsProblem(Problem):
    """A validated gather or scatter of rows of ``cols`` elements.

    With host indices, ``indices`` is a read-only int64 array (every entry in
    ``[0, rows)``, checked) and ``index`` is None. With device indices, ``indices`` is
    None and ``index`` is the region of ``count`` entries of ``index_dtype``: the
    backend checks their range on the device before anything is written, and raises
    :class:`~computehal.InvalidArgumentError` ("index {i} is out of range for {rows}
    rows" / "index {i} is negative") like the host path.
    """

    indices: npt.NDArray[np.int64] | None
    rows: int
    cols: int
    input: Region
    output: Region
    dtype: np.dtype[Any]
    count: int = 0
    index: Region | None = None
    index_dtype: np.dtype[Any] | None = None

    @property
    def empty(self) -> bool:
        """True when nothing is written and no device index is left to check.

        Device indices are checked even when rows have no columns (``cols == 0``), so
        an out-of-range index raises on every path, as host indices do.
        """
        if self.index is not None and self.count:
            return False
        return self.count == 0 or self.cols == 0


@record
class GatherProblem(RowsProblem):
    """``gather``: output row ``i`` = input row ``indices[i]``."""

    OPERANDS: ClassVar[tuple[Operand, ...]] = (
        Operand("input", Role.IN),
        Operand("index", Role.IN, False),
        Operand("output", Role.OUT),
    )


@record
class ScatterProblem(RowsProblem):
    """``scatter``: output row ``indices[i]`` = input row ``i``; other rows keep their values."""

    OPERANDS: ClassVar[tuple[Operand, ...]] = (
        Operand("input", Role.IN),
        Operand("index", Role.IN, False),
        Operand("output", Role.INOUT),
    )


def _rows(
    lease: Lease,
    scatter_: bool,
    input_ptr: object,
    indices: object,
    output_ptr: object,
    rows: object,
    cols: object,
    dtype: object,
    indices_ptr: object,
    index_dtype: object,
) -> RowsProblem:
    dt = float_dtype(dtype)
    r, c = as_count("rows", rows), as_count("cols", cols)
    src, dst = as_pointer("input_ptr", input_ptr), as_pointer("output_ptr", output_ptr)
    idx: npt.NDArray[np.int64] | None = None
    index_region: Region | None = None
    idt = None
    if indices_ptr is None:
        idx = snapshot_indices("indices", indices)
        count = int(idx.size)
        if count:
            low, high = int(idx.min()), int(idx.max())
            if low < 0:
                raise InvalidArgumentError(f"index {low} is negative")
            if high >= r:
                raise InvalidArgumentError(f"index {high} is out of range for {r} rows")
    else:
        idt = as_index_dtype(index_dtype)
        count = as_count("indices (the number of device indices)", indices)
        ip = as_pointer("indices_ptr", indices_ptr)
    size = dt.itemsize
    in_rows, out_rows = (count, r) if scatter_ else (r, count)
    x = lease.resolve("input_ptr", src, in_rows * c * size, align=size)
    y = lease.resolve("output_ptr", dst, out_rows * c * size, align=size)
    if idt is not None:
        index_region = lease.resolve("indices_ptr", ip, count * idt.itemsize, align=idt.itemsize)
    cls = ScatterProblem if scatter_ else GatherProblem
    return cls(idx, r, c, x, y, dt, count, index_region, idt)


def gather(
    lease: Lease,
    input_ptr: object,
    indices: object,
    output_ptr: object,
    rows: object,
    cols: object,
    *,
    dtype: object = "float32",
    indices_ptr: object = None,
    index_dtype: object = "int64",
) -> RowsProblem:
    """Validate ``gather``: input is ``rows x cols``, output ``len(indices) x cols``."""
    return _rows(lease, False, input_ptr, indices, output_ptr, rows, cols, dtype, indices_ptr, index_dtype)


def scatter(
    lease: Lease,
    input_ptr: object,
    indices: object,
    output_ptr: object,
    rows: object,
    cols: object,
    *,
    dtype: object = "float32",
    indices_ptr: object = None,
    index_dtype: object = "int64",
) -> RowsProblem:
    """Validate ``scatter``: input is ``len(indices) x cols``, output ``rows x cols``."""
    return _rows(lease, True, input_ptr, indices, output_ptr, rows, cols, dtype, indices_ptr, index_dtype)


def last_occurrences(indices: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """For scatter: the distinct destination rows and, for each, the last source row naming it."""
    reversed_idx = indices[::-1]
    unique, first_in_reversed = np.unique(reversed_idx, return_index=True)
    return unique, (indices.size - 1 - first_in_reversed).astype(np.int64)
