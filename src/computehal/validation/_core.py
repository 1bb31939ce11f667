"""What every validator shares: the problem base class, operand roles, argument coercion.

Rules every validator follows, so that a hostile or careless caller cannot get past them:

1. Every caller object is converted first: integers through :func:`~computehal.memory.as_int`
   (``__index__`` runs once), sequences copied into tuples of plain ints, host arrays
   copied into private NumPy arrays. Only the converted copies are used afterwards.
2. Every check runs on those copies.
3. Pointers are resolved last, through the operation's :class:`~computehal.memory.Lease`,
   which pins each allocation until the operation ends.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, dataclass_transform

import numpy as np

from .._args import MAX_COUNT
from ..dtypes import as_float_dtype
from ..errors import InvalidArgumentError
from ..memory import Region, as_count, as_int

__all__ = [
    "BLAS_INT_MAX",
    "INDEX_MAX",
    "MAX_DIMS",
    "Role",
    "Problem",
    "as_scalar",
    "as_finite",
    "as_flag",
    "as_shape",
    "as_ints",
    "float_dtype",
    "matrix_bytes",
    "Operand",
    "record",
]

#: BLAS (and cuBLAS) take dimensions and leading dimensions as 32-bit ints.
BLAS_INT_MAX = 2**31 - 1
#: Kernels index elements with 32-bit ints where they can; larger extents are refused
#: by the operations that say so (convolution, pooling, normalisation windows).
INDEX_MAX = 2**31 - 1
#: Most dimensions a shape may have (``copy_strided``, ``broadcast_binary``).
MAX_DIMS = 6

P = TypeVar("P", bound="Problem")
T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    """``@dataclass(frozen=True)`` with a faster ``__init__`` (same signature and defaults).

    A frozen dataclass's own ``__init__`` sets every field through
    ``object.__setattr__``, one call per field; a problem record is built for every
    operation, so this ``__init__`` stores the fields straight into the instance's
    ``__dict__`` instead (about half the cost). Fields may have plain defaults only.
    """
    made: Any = dataclass(frozen=True)(cls)
    params: list[str] = []
    scope: dict[str, Any] = {}
    lines = ["    d = self.__dict__"]
    for f in dataclasses.fields(made):
        if not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__qualname__}.{f.name}: only plain positional fields are supported")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            scope[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        lines.append(f"    d[{f.name!r}] = {f.name}")
    if hasattr(made, "__post_init__"):
        raise TypeError(f"{cls.__qualname__}: __post_init__ is not supported")
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(lines) + "\n"
    exec(compile(source, f"<computehal record {cls.__qualname__}>", "exec"), scope)  # noqa: S102
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = dict(made.__init__.__annotations__)
    init.__module__ = cls.__module__
    made.__init__ = init
    return cls


class Role(enum.Enum):
    """How an operation uses an operand."""

    IN = "in"  #: read only
    OUT = "out"  #: every byte of the region is overwritten, nothing is read
    INOUT = "inout"  #: read, or only partly written (what is not written must survive)


@dataclass(frozen=True)
class Operand:
    """One operand of a problem: the field holding its region, its role, and whether it
    holds floating-point data of the problem's ``dtype`` (index operands do not)."""

    field: str
    role: Role
    is_float: bool = True


@record
class Problem:
    """Base of every validated problem record.

    Every subclass has a ``dtype`` field (the element type of its floating-point
    operands). Subclasses list their floating-point operands in ``OPERANDS`` (field name, role);
    the shared dispatcher of :class:`~computehal.backends._base.TableBackend` uses it to
    copy an input aside when an output overlaps it, and to run 16-bit storage types
    through float32. ``ALIAS_IDENTICAL_OK`` says that an input may be the very same
    region as an output (element-wise ops), which kernels handle in place;
    ``IDENTICAL_OK`` names the inputs for which that holds.
    """

    OPERANDS: ClassVar[tuple[Operand, ...]] = ()
    ALIAS_IDENTICAL_OK: ClassVar[bool] = False
    #: Inputs that may be the very same region as an output (every input when
    #: ``ALIAS_IDENTICAL_OK``; a convolution's residual, which accumulates in place).
    IDENTICAL_OK: ClassVar[frozenset[str]] = frozenset()
    #: Fields of the read-only operands and of the written ones (derived from OPERANDS).
    INPUTS: ClassVar[tuple[str, ...]] = ()
    OUTPUTS: ClassVar[tuple[str, ...]] = ()
    #: Every (input field, output field) pair, for the overlap test.
    PAIRS: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: True when the class overrides :meth:`constant_output` (the dispatcher asks only then).
    CONSTANT_OUTPUT: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.INPUTS = tuple(o.field for o in cls.OPERANDS if o.role is Role.IN)
        cls.OUTPUTS = tuple(o.field for o in cls.OPERANDS if o.role is not Role.IN)
        cls.PAIRS = tuple((i, o) for i in cls.INPUTS for o in cls.OUTPUTS)
        cls.CONSTANT_OUTPUT = cls.constant_output is not Problem.constant_output
        if cls.ALIAS_IDENTICAL_OK:
            cls.IDENTICAL_OK = frozenset(cls.INPUTS)

    if TYPE_CHECKING:  # every subclass declares the field (a base field would come first)

        @property
        def dtype(self) -> np.dtype[Any]:
            """Element type of the floating-point operands."""

    @property
    def empty(self) -> bool:
        """True when the operation writes nothing at all."""
        fields = self.__dict__  # every operand is a field (cheaper than getattr)
        for name in self.OUTPUTS:
            region = fields[name]
            if region is not None and region.nbytes:
                return False
        return True

    def overlapping(self) -> bool:
        """True when an input shares bytes with an output (other than an allowed identity)."""
        fields = self.__dict__  # every operand is a field (cheaper than getattr)
        for in_name, out_name in self.PAIRS:
            region = fields[in_name]
            out = fields[out_name]
            if region is None or out is None or out.allocation is not region.allocation:
                continue  # the common case: different allocations
            if region.overlaps(out) and not (in_name in self.IDENTICAL_OK and region == out):
                return True
        return False

    def constant_output(self) -> tuple[Region, float] | None:
        """(region, value) when the whole result is one value written everywhere, else None."""
        return None

    def runs_as_is(self) -> bool:
        """True when the hook can take this problem unchanged: something to write, no
        constant result, no input overlapping an output (the dispatcher's common case,
        asked in one call; False sends the problem through every check in turn)."""
        if self.empty or (self.CONSTANT_OUTPUT and self.constant_output() is not None):
            return False
        return not self.overlapping()

    def regions(self) -> list[tuple[Operand, Region]]:
        """The non-empty operand regions with their roles."""
        out = []
        for op in self.OPERANDS:
            region = getattr(self, op.field)
            if region is not None and region.nbytes:
                out.append((op, region))
        return out

    def retyped(self: P, dtype: np.dtype[Any], regions: dict[str, Region]) -> P:
        """A copy with ``dtype`` and some operand regions replaced (for scratch copies)."""
        changes: dict[str, Any] = {"dtype": dtype, **regions}
        return replace(self, **changes)


def as_scalar(name: str, value: object) -> float:
    """Return a real scalar argument as ``float`` (NaN and inf are allowed)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name} must be a real number, got {type(value).__name__}")
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):
        raise InvalidArgumentError(f"{name} = {value!r} does not fit a float64") from None


def as_finite(name: str, value: object) -> float:
    """A real scalar that must be finite."""
    result = as_scalar(name, value)
    if not math.isfinite(result):
        raise InvalidArgumentError(f"{name} must be finite, got {result}")
    return result


def as_flag(name: str, value: object) -> bool:
    """A ``bool`` (or NumPy bool) argument."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _items(name: str, value: object) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray, range)):
        raise InvalidArgumentError(f"{name} must be a sequence of integers, got {type(value).__name__}")
    try:
        items = list(value)
    except Exception as exc:  # noqa: BLE001 - a hostile sequence: report it, never crash
        raise InvalidArgumentError(f"{name} could not be read as a sequence: {exc}") from None
    return items


def _plain(value: object, low: int, high: int) -> tuple[int, ...] | None:
    """``value`` as a tuple when it is an exact tuple or list of plain ints in [low, high].

    The common case of every shape argument, checked without running caller code (exact
    built-in types only: no ``__index__``, ``__iter__`` or ``__len__`` of a subclass is
    called) and without building a name per entry; anything else returns None and goes
    the long way, with its error messages.
    """
    kind = type(value)
    if kind is tuple:
        items: tuple[Any, ...] = value  # type: ignore[assignment]
    elif kind is list:
        items = tuple(value)  # type: ignore[arg-type]
    else:
        return None
    for item in items:
        if type(item) is not int or not low <= item <= high:
            return None
    return items


def as_shape(name: str, value: object, length: int | tuple[int, ...] | None = None) -> tuple[int, ...]:
    """A tuple of non-negative ints copied from ``value``; ``length`` is the allowed length(s)."""
    plain = _plain(value, 0, MAX_COUNT)
    if plain is not None and (
        length is None or (len(plain) == length if isinstance(length, int) else len(plain) in length)
    ):
        return plain
    items = _items(name, value)
    if length is not None:
        allowed = (length,) if isinstance(length, int) else length
        if len(items) not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise InvalidArgumentError(f"{name} must have {want} entries, got {len(items)}")
    return tuple(as_count(f"{name}[{i}]", v) for i, v in enumerate(items))


def as_ints(name: str, value: object, length: int) -> tuple[int, ...]:
    """A tuple of ``length`` ints (negative allowed) copied from ``value``."""
    plain = _plain(value, -(2**62), 2**62)
    if plain is not None and len(plain) == length:
        return plain
    items = _items(name, value)
    if len(items) != length:
        raise InvalidArgumentError(f"{name} must have {length} entries, got {len(items)}")
    out = tuple(as_int(f"{name}[{i}]", v) for i, v in enumerate(items))
    for i, v in enumerate(out):
        if abs(v) > 2**62:
            raise InvalidArgumentError(f"{name}[{i}] = {v} is too large")
    return out


def float_dtype(value: object) -> np.dtype[Any]:
    """The ``dtype`` keyword of a compute op: one of float16, bfloat16, float32, float64."""
    return as_float_dtype(value, "dtype")


def matrix_bytes(rows: int, cols: int, ld: int, itemsize: int) -> int:
    """Bytes spanned by a column-major ``rows x cols`` matrix with leading dimension ``ld``."""
    if rows == 0 or cols == 0:
        return 0
    return (ld * (cols - 1) + rows) * itemsize
