"""Element-wise operations: unary, binary, broadcasting binary, and dtype conversion."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from ..dtypes import F32, as_float_dtype
from ..errors import InvalidArgumentError
from ..memory import MAX_COUNT, Lease, Region, as_count, as_pointer
from ..types import BinaryOp, UnaryOp, coerce_enum
from ._attention import broadcast_strides
from ._core import MAX_DIMS, Operand, Problem, Role, as_scalar, as_shape, float_dtype, record

__all__ = [
    "ElementwiseProblem",
    "BroadcastProblem",
    "CastProblem",
    "unary",
    "binary",
    "broadcast_binary",
    "cast",
    "broadcast_shape",
]

#: Each member by its value (``"relu"``): the common spelling of ``op``, one dict probe.
_UNARY_BY_VALUE: dict[str, UnaryOp] = {member.value: member for member in UnaryOp}
_BINARY_BY_VALUE: dict[str, BinaryOp] = {member.value: member for member in BinaryOp}

_IN_OUT = (Operand("a", Role.IN), Operand("b", Role.IN), Operand("out", Role.OUT))


@record
class ElementwiseProblem(Problem):
    """A validated unary (``b`` is ``None``) or binary op over ``n`` elements.

    ``alpha`` is LEAKY_RELU's slope; ``lo`` / ``hi`` are CLIP's bounds.
    """

    OPERANDS: ClassVar[tuple[Operand, ...]] = _IN_OUT
    ALIAS_IDENTICAL_OK: ClassVar[bool] = True

    op: UnaryOp | BinaryOp
    n: int
    a: Region
    b: Region | None
    out: Region
    dtype: np.dtype[Any]
    alpha: float = 0.01
    lo: float = -math.inf
    hi: float = math.inf

    @property
    def empty(self) -> bool:
        """True when there are no elements."""
        return self.n == 0

    def overlapping(self) -> bool:
        """:meth:`Problem.overlapping`, with the common case (operands in different
        allocations) decided without the general loop (it runs on every call)."""
        out = self.out.allocation
        if self.a.allocation is not out and (self.b is None or self.b.allocation is not out):
            return False
        return super().overlapping()

    def runs_as_is(self) -> bool:
        """:meth:`Problem.runs_as_is` written out for the per-call path (no constant output here)."""
        if not self.n:
            return False
        out = self.out.allocation
        if self.a.allocation is not out and (self.b is None or self.b.allocation is not out):
            return True
        return not Problem.overlapping(self)


def _param(op: UnaryOp, owner: UnaryOp, name: str, value: object, default: float) -> float:
    if value is None:
        return default
    if op is not owner:
        raise InvalidArgumentError(f"{name} is a parameter of {owner.value}, not of {op.value}")
    result = as_scalar(name, value)
    if math.isnan(result):
        raise InvalidArgumentError(f"{name} must not be NaN")
    return result


def unary(
    lease: Lease,
    op: object,
    input_ptr: object,
    output_ptr: object,
    n: object,
    *,
    dtype: object = "float32",
    alpha: object = None,
    lo: object = None,
    hi: object = None,
) -> ElementwiseProblem:
    """Validate ``unary``."""
    # Plain arguments (a member or its value, the default dtype, a plain int count and
    # pointers, no parameters) take the fast path; anything else is converted in full.
    uop = op if type(op) is UnaryOp else _UNARY_BY_VALUE.get(op) if type(op) is str else None
    if uop is None:
        uop = coerce_enum(UnaryOp, op, "op")
    dt = F32 if dtype is F32 or (type(dtype) is str and dtype == "float32") else float_dtype(dtype)
    count = n if type(n) is int and 0 <= n <= MAX_COUNT else as_count("n", n)
    if alpha is None and lo is None and hi is None:
        al, low, high = 0.01, -math.inf, math.inf
    else:
        al = _param(uop, UnaryOp.LEAKY_RELU, "alpha", alpha, 0.01)
        low = _param(uop, UnaryOp.CLIP, "lo", lo, -math.inf)
        high = _param(uop, UnaryOp.CLIP, "hi", hi, math.inf)
    # A plain int needs no conversion (resolve checks its value); anything else is converted
    # here, before any pointer is resolved.
    src = input_ptr if type(input_ptr) is int else as_pointer("input_ptr", input_ptr)
    dst = output_ptr if type(output_ptr) is int else as_pointer("output_ptr", output_ptr)
    size = dt.itemsize
    a, out = lease.resolve_pair("input_ptr", src, "output_ptr", dst, count * size, size)
    return ElementwiseProblem(uop, count, a, None, out, dt, al, low, high)


def binary(
    lease: Lease,
    op: object,
    a_ptr: object,
    b_ptr: object,
    output_ptr: object,
    n: object,
    *,
    dtype: object = "float32",
) -> ElementwiseProblem:
    """Validate ``binary``."""
    bop = op if type(op) is BinaryOp else _BINARY_BY_VALUE.get(op) if type(op) is str else None
    if bop is None:
        bop = coerce_enum(BinaryOp, op, "op")
    dt = F32 if dtype is F32 or (type(dtype) is str and dtype == "float32") else float_dtype(dtype)
    count = n if type(n) is int and 0 <= n <= MAX_COUNT else as_count("n", n)
    pa = a_ptr if type(a_ptr) is int else as_pointer("a_ptr", a_ptr)
    pb = b_ptr if type(b_ptr) is int else as_pointer("b_ptr", b_ptr)
    po = output_ptr if type(output_ptr) is int else as_pointer("output_ptr", output_ptr)
    size = dt.itemsize
    a, b = lease.resolve_pair("a_ptr", pa, "b_ptr", pb, count * size, size)
    out = lease.resolve("output_ptr", po, count * size, size)
    return ElementwiseProblem(bop, count, a, b, out, dt)


# --------------------------------------------------------------------------- broadcasting


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """NumPy's broadcast of two shapes, or None when they do not broadcast."""
    rank = max(len(a), len(b))
    pa, pb = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    out = []
    for x, y in zip(pa, pb, strict=False):
        if x != y and x != 1 and y != 1:
            return None
        out.append(y if x == 1 else x)
    return tuple(out)


@record
class BroadcastProblem(Problem):
    """A validated ``broadcast_binary``: ``out = op(a, b)`` with NumPy broadcasting.

    ``shape`` is the output shape; ``a_strides`` / ``b_strides`` are element strides
    over it (0 along broadcast dimensions). All three have the same length (<= 6).
    """

    OPERANDS: ClassVar[tuple[Operand, ...]] = _IN_OUT
    ALIAS_IDENTICAL_OK: ClassVar[bool] = True

    op: BinaryOp
    shape: tuple[int, ...]
    a_strides: tuple[int, ...]
    b_strides: tuple[int, ...]
    a: Region
    b: Region
    out: Region
    dtype: np.dtype[Any]

    @property
    def size(self) -> int:
        """Number of output elements."""
        return math.prod(self.shape)

    @property
    def out_strides(self) -> tuple[int, ...]:
        """Element strides of the (row-major, contiguous) output over ``shape``."""
        strides = [1] * len(self.shape)
        for axis in range(len(self.shape) - 2, -1, -1):
            strides[axis] = strides[axis + 1] * self.shape[axis + 1]
        return tuple(strides)


def broadcast_binary(
    lease: Lease,
    op: object,
    a_ptr: object,
    a_shape: object,
    b_ptr: object,
    b_shape: object,
    out_ptr: object,
    out_shape: object,
    *,
    dtype: object = "float32",
) -> BroadcastProblem:
    """Validate ``broadcast_binary``."""
    bop = coerce_enum(BinaryOp, op, "op")
    dt = float_dtype(dtype)
    sa, sb, so = (
        as_shape(n, s) for n, s in (("a_shape", a_shape), ("b_shape", b_shape), ("out_shape", out_shape))
    )
    pa, pb, po = as_pointer("a_ptr", a_ptr), as_pointer("b_ptr", b_ptr), as_pointer("out_ptr", out_ptr)
    for name, s in (("a_shape", sa), ("b_shape", sb), ("out_shape", so)):
        if len(s) > MAX_DIMS:
            raise InvalidArgumentError(f"{name} has {len(s)} dimensions; at most {MAX_DIMS} are supported")
    expected = broadcast_shape(sa, sb)
    if expected is None:
        raise InvalidArgumentError(f"a_shape {list(sa)} and b_shape {list(sb)} do not broadcast together")
    if expected != so:
        raise InvalidArgumentError(f"out_shape {list(so)} is not the broadcast shape {list(expected)}")
    a_strides = broadcast_strides("a_shape", sa, so)
    b_strides = broadcast_strides("b_shape", sb, so)
    size = dt.itemsize
    empty = math.prod(so) == 0
    a = lease.resolve("a_ptr", pa, 0 if empty else math.prod(sa) * size, align=size)
    b = lease.resolve("b_ptr", pb, 0 if empty else math.prod(sb) * size, align=size)
    out = lease.resolve("out_ptr", po, math.prod(so) * size, align=size)
    return BroadcastProblem(bop, so, a_strides, b_strides, a, b, out, dt)


# --------------------------------------------------------------------------- conversion


@record
class CastProblem(Problem):
    """A validated ``cast`` of ``n`` elements from ``dtype`` to ``out_dtype`` (round to nearest even)."""

    OPERANDS: ClassVar[tuple[Operand, ...]] = (Operand("input", Role.IN), Operand("output", Role.OUT))
    ALIAS_IDENTICAL_OK: ClassVar[bool] = True

    n: int
    input: Region
    output: Region
    dtype: np.dtype[Any]
    out_dtype: np.dtype[Any]


def cast(
    lease: Lease,
    input_ptr: object,
    output_ptr: object,
    n: object,
    *,
    dtype: object = "float32",
    out_dtype: object = "float32",
) -> CastProblem:
    """Validate ``cast``."""
    src_dt = float_dtype(dtype)
    dst_dt = as_float_dtype(out_dtype, "out_dtype")
    count = as_count("n", n)
    src, dst = as_pointer("input_ptr", input_ptr), as_pointer("output_ptr", output_ptr)
    x = lease.resolve("input_ptr", src, count * src_dt.itemsize, align=src_dt.itemsize)
    y = lease.resolve("output_ptr", dst, count * dst_dt.itemsize, align=dst_dt.itemsize)
    return CastProblem(count, x, y, src_dt, dst_dt)
