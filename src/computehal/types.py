"""Public value types: enums, capability records, tile shapes, 16-bit rounding."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast, overload

import numpy as np
import numpy.typing as npt

from .errors import BackendError, InvalidArgumentError

__all__ = [
    "BackendTranspose",
    "ReduceOp",
    "UnaryOp",
    "BinaryOp",
    "PoolOp",
    "MixedPrecision",
    "MemoryKind",
    "OpClass",
    "Capabilities",
    "DeviceInfo",
    "TileShape",
    "default_tile_for",
    "round_to_f16",
    "round_to_bf16",
    "coerce_enum",
    "ValueEnum",
]


class ValueEnum(enum.Enum):
    """An enumeration whose ``str()`` is its value (``str(BinaryOp.ADD) == "add"``).

    Members hash by identity (they compare by identity): ``Enum``'s own ``__hash__`` is
    a Python-level call, paid by every dict or set lookup of a member on each operation.
    """

    __hash__ = object.__hash__

    def __str__(self) -> str:
        return str(self.value)


class BackendTranspose(ValueEnum):
    """How a GEMM operand is read: as stored, transposed, or conjugate-transposed.

    For real data ``CONJ_TRANS`` is the same as ``TRANS``.
    """

    NO_TRANS = "N"
    TRANS = "T"
    CONJ_TRANS = "C"

    @property
    def is_transposed(self) -> bool:
        """True for ``TRANS`` and ``CONJ_TRANS``."""
        return self is not BackendTranspose.NO_TRANS


class ReduceOp(ValueEnum):
    """Reduction applied along one axis by :meth:`ComputeBackend.reduce`."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"
    MEAN = "mean"


class UnaryOp(ValueEnum):
    """Element-wise function applied by :meth:`ComputeBackend.unary`."""

    RELU = "relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    ABS = "abs"
    NEG = "neg"
    # computehal extensions
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    SILU = "silu"
    ERF = "erf"
    RECIPROCAL = "reciprocal"
    SQUARE = "square"
    SIN = "sin"
    COS = "cos"
    LEAKY_RELU = "leaky_relu"
    CLIP = "clip"


class BinaryOp(ValueEnum):
    """Element-wise function of two operands applied by :meth:`ComputeBackend.binary`."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    # computehal extension
    POW = "pow"


class PoolOp(ValueEnum):
    """Window function of :meth:`ComputeBackend.pool2d` (a computehal extension)."""

    MAX = "max"
    AVG = "avg"


class MixedPrecision(ValueEnum):
    """16-bit storage format of the operands of a mixed-precision GEMM."""

    F16 = "f16"
    BF16 = "bf16"


class MemoryKind(ValueEnum):
    """Where a device's memory lives, as seen from the host."""

    DEVICE = "device"
    HOST_PINNED = "host-pinned"
    UNIFIED = "unified"
    HOST = "host"


class OpClass(ValueEnum):
    """Families of operations, used by :meth:`BackendRegistry.route`."""

    MATMUL = "matmul"
    CONVOLUTION = "convolution"
    ATTENTION = "attention"
    REDUCTION = "reduction"
    ELEMENTWISE = "elementwise"
    MEMORY = "memory"


E = TypeVar("E", bound=enum.Enum)


_MEMBERS_BY_VALUE: dict[type[enum.Enum], dict[object, enum.Enum]] = {}


def _members_by_value(enum_type: type[E]) -> dict[object, E]:
    """``{value: member}`` of an enum: a dict lookup is much cheaper than ``Enum(value)``."""
    table = _MEMBERS_BY_VALUE.get(enum_type)
    if table is None:
        table = _MEMBERS_BY_VALUE[enum_type] = {member.value: member for member in enum_type}
    return cast(dict[object, E], table)


def coerce_enum(enum_type: type[E], value: object, argument: str) -> E:
    """Return ``value`` as a member of ``enum_type``.

    Accepts a member, its string value (``"N"``, ``"sum"``) or, case-insensitively,
    its member name or value (``"no_trans"``, ``"SUM"``).

    Raises
    ------
    InvalidArgumentError
        If ``value`` names no member.
    """
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        member = _members_by_value(enum_type).get(value)
        if member is not None:
            return member
        folded = value.strip().lower()
        for member in enum_type:
            if folded in (str(member.value).lower(), member.name.lower()):
                return member
    choices = ", ".join(repr(m.value) for m in enum_type)
    raise InvalidArgumentError(
        f"{argument} must be a {enum_type.__name__} or one of {choices}, got {value!r}"
    )


@dataclass(frozen=True)
class Capabilities:
    """What a backend's device can do.

    Every field defaults to the conservative CPU profile (see :meth:`cpu`).
    The extension fields are additions of computehal: ``supports_fp64`` (whether
    float64 is possible at all), ``native_ops`` (the operations the backend runs
    natively rather than through a default composition) and ``op_dtypes`` (for each
    operation, the dtype names it takes on this device; see :meth:`supports`).
    """

    supports_fp16: bool = False
    supports_bf16: bool = False
    supports_fp8: bool = False
    tensor_cores: bool = False
    peer_access: bool = False
    unified_memory: bool = True
    cluster_launch: bool = False
    async_copy: bool = False
    max_threads_per_block: int = 1024
    max_shared_mem_per_block: int = 49152
    warp_size: int = 1
    supports_fp64: bool = True
    native_ops: frozenset[str] = field(default_factory=frozenset)
    op_dtypes: tuple[tuple[str, frozenset[str]], ...] = ()

    @classmethod
    def cpu(cls) -> Capabilities:
        """The conservative host-CPU profile: no 16-bit or tensor hardware, unified memory."""
        return cls()

    def dtypes(self, op: str) -> frozenset[str]:
        """The dtype names ``op`` takes on this device (empty when unknown or not offered)."""
        for name, names in self.op_dtypes:
            if name == op:
                return names
        return frozenset()

    def supports(self, op: str, dtype: object = "float32") -> bool:
        """True when operation ``op`` takes ``dtype`` (a name or NumPy dtype) on this device."""
        from .dtypes import as_float_dtype

        try:
            name = as_float_dtype(dtype).name
        except BackendError:
            return False
        return name in self.dtypes(op)


@dataclass(frozen=True)
class DeviceInfo:
    """One device a backend exposes, in a backend-agnostic shape."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int] = (0, 0)
    total_memory_bytes: int = 0
    memory_kind: MemoryKind = MemoryKind.HOST
    capabilities: Capabilities = field(default_factory=Capabilities.cpu)


@dataclass(frozen=True)
class TileShape:
    """A GEMM tile: the block of C (tile_m x tile_n) and the k-step (tile_k)."""

    tile_m: int
    tile_n: int
    tile_k: int


def default_tile_for(m: int, n: int, k: int, caps: Capabilities) -> TileShape:
    """The default GEMM tile heuristic of the original system.

    With tensor cores and ``m``, ``n``, ``k`` all multiples of 16 the tile snaps to a
    WMMA-aligned shape: 128x128x32 when ``min(m, n, k) >= 512``, else 64x64x16.
    Otherwise 16x16x16 for ``min <= 64``, 64x64x16 for ``min <= 512``, else 128x128x8.
    """
    smallest = min(m, n, k)
    if caps.tensor_cores and m % 16 == 0 and n % 16 == 0 and k % 16 == 0:
        return TileShape(128, 128, 32) if smallest >= 512 else TileShape(64, 64, 16)
    if smallest <= 64:
        return TileShape(16, 16, 16)
    if smallest <= 512:
        return TileShape(64, 64, 16)
    return TileShape(128, 128, 8)


FloatLike = float | np.floating


@overload
def round_to_f16(x: float) -> float: ...
@overload
def round_to_f16(x: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
def round_to_f16(x: object) -> object:
    """Round float32 value(s) through IEEE half precision and back.

    Round-to-nearest-even; values beyond the f16 range become +-inf; NaN stays NaN.
    A Python scalar gives a Python float, anything else a float32 NumPy array.
    """
    return _round_through(x, np.float16)


@overload
def round_to_bf16(x: float) -> float: ...
@overload
def round_to_bf16(x: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
def round_to_bf16(x: object) -> object:
    """Round float32 value(s) through bfloat16 and back.

    Round-to-nearest-even (via ml_dtypes); overflow goes to +-inf; NaN stays NaN.
    A Python scalar gives a Python float, anything else a float32 NumPy array.
    """
    import ml_dtypes

    return _round_through(x, ml_dtypes.bfloat16)


def _round_through(x: object, narrow: type[Any]) -> object:
    scalar = isinstance(x, (int, float, np.integer, np.floating))
    try:
        wide = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"cannot round {type(x).__name__} values: {exc}") from None
    with np.errstate(over="ignore", invalid="ignore"):
        out = wide.astype(narrow).astype(np.float32)
    if scalar:
        return float(out)
    return out
