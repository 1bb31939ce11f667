"""Small mechanisms every backend shares: op codes, launch chunking, integer and view helpers.

Op codes are numbered once here, in enum order, and handed to kernels as generated
``#define`` / ``const`` lines (:func:`c_defines`, :func:`wgsl_consts`), so a kernel and
the Python that launches it can never disagree about what code 3 means.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import UnsupportedError
from ..memory import ceil_div
from ..types import BinaryOp, PoolOp, ReduceOp, UnaryOp

__all__ = [
    "BINARY_CODES",
    "POOL_CODES",
    "REDUCE_CODES",
    "UNARY_CODES",
    "c_defines",
    "ceil_div",
    "chunks",
    "collapse",
    "fill_pattern",
    "head_bucket",
    "refuse_extensions",
    "round_up",
    "strided_outer",
    "wgsl_consts",
]


def _codes(enum_type: type[enum.Enum]) -> dict[Any, int]:
    return {member: i for i, member in enumerate(enum_type)}


#: Kernel op codes, in enum order (stable: new members are appended).
UNARY_CODES: dict[UnaryOp, int] = _codes(UnaryOp)
BINARY_CODES: dict[BinaryOp, int] = _codes(BinaryOp)
REDUCE_CODES: dict[ReduceOp, int] = _codes(ReduceOp)
POOL_CODES: dict[PoolOp, int] = _codes(PoolOp)

_TABLES: tuple[tuple[str, dict[Any, int]], ...] = (
    ("UNARY", UNARY_CODES),
    ("BINARY", BINARY_CODES),
    ("REDUCE", REDUCE_CODES),
    ("POOL", POOL_CODES),
)


def c_defines() -> str:
    """``#define UNARY_RELU 0`` ... for every op code (OpenCL C / CUDA C sources)."""
    return "".join(
        f"#define {prefix}_{member.name} {code}\n"
        for prefix, table in _TABLES
        for member, code in table.items()
    )


def wgsl_consts() -> str:
    """``const UNARY_RELU: u32 = 0u;`` ... for every op code (WGSL sources)."""
    return "".join(
        f"const {prefix}_{member.name}: u32 = {code}u;\n"
        for prefix, table in _TABLES
        for member, code in table.items()
    )


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``value``."""
    return ceil_div(value, multiple) * multiple


def chunks(
    total: int, per_item_bytes: int, *, budget: int = 1 << 28, most: int = 1 << 30
) -> Iterator[tuple[int, int]]:
    """Split ``range(total)`` into ``(start, stop)`` pieces.

    Each piece holds at most ``most`` items and, when ``per_item_bytes`` is given, at most
    ``budget`` bytes of per-item scratch (always at least one item).
    """
    step = max(1, min(most, budget // per_item_bytes if per_item_bytes else most))
    for start in range(0, total, step):
        yield start, min(total, start + step)


def head_bucket(head_dim: int) -> int:
    """The head dimension an attention kernel is built for: ``head_dim`` rounded up to a bucket.

    Multiples of 16 up to 256, of 128 up to 2048, powers of two beyond; the true head
    dimension is a kernel argument, so the number of attention builds stays small.
    """
    if head_dim <= 256:
        return round_up(head_dim, 16)
    if head_dim <= 2048:
        return round_up(head_dim, 128)
    return 1 << (head_dim - 1).bit_length()


def collapse(shape: Sequence[int], *strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Drop extent-1 dimensions and merge neighbours that every stride list walks as one.

    Dimensions ``d`` and ``d + 1`` merge when, for each stride list,
    ``stride[d] == stride[d + 1] * shape[d + 1]`` (zero strides merge with zero
    strides). Returns the new shape (at least one dimension) and stride lists.
    """
    dims = [(e, [s[d] for s in strides]) for d, e in enumerate(shape) if e != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = []
    for extent, ss in dims:
        if out_shape and all(prev == cur * extent for prev, cur in zip(out_strides[-1], ss, strict=True)):
            out_shape[-1] *= extent
            out_strides[-1] = ss
            continue
        out_shape.append(extent)
        out_strides.append(ss)
    if not out_shape:
        return [1], [[0] for _ in strides]
    return out_shape, [[ss[i] for ss in out_strides] for i in range(len(strides))]


def strided_outer(dims: Sequence[int], sa: Sequence[int], sb: Sequence[int]) -> tuple[int, ...]:
    """The ``CHAL_OUTER_PARAMS`` of ``kernels/strided.h`` for all but the innermost dimension.

    Extents ``e1..e5`` (outermost first, padded with unit extents), then the strides of
    the two operands over them. At most six dimensions in all.
    """
    pad = 5 - (len(dims) - 1)
    if pad < 0:
        raise ValueError("at most 6 dimensions")
    return (
        *([1] * pad + list(dims[:-1])),
        *([0] * pad + list(sa[:-1])),
        *([0] * pad + list(sb[:-1])),
    )


_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bf16_bits(value: float) -> int:
    """``value`` rounded to nearest-even bfloat16 (through float32 rounded to odd: one rounding)."""
    with np.errstate(over="ignore"):
        f = np.float32(value)
    bits = int(f.view(np.uint32))
    if math.isnan(value):
        return (bits >> 16) | 0x40
    if float(f) != value:  # inexact: round to odd
        if abs(float(f)) > abs(value):
            bits -= 1
        bits |= 1
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def fill_pattern(value: float, dtype: np.dtype[Any]) -> Any:
    """The bit pattern of ``value`` rounded to ``dtype`` (nearest-even), as an unsigned scalar."""
    if dtype.name == "bfloat16":
        return np.uint16(_bf16_bits(value))
    with np.errstate(over="ignore"):
        return np.array(value, dtype=np.float64).astype(dtype).view(_UINT[dtype.itemsize])[()]


def refuse_extensions(backend: str, op: str, p: Any) -> None:
    """Interim guard: raise UnsupportedError when ``p`` uses a feature this backend lacks.

    Used by backends whose kernels for grouped / dilated / biased convolution, masked or
    grouped-query attention, log-softmax, the extension unary ops and device-side
    indices are not written yet.
    """
    feature = None
    if getattr(p, "is_plain", True) is False:
        feature = "groups, dilation, asymmetric padding, bias, masks or grouped-query heads"
    elif getattr(p, "log", False):
        feature = "log=True"
    elif isinstance(getattr(p, "op", None), UnaryOp) and UNARY_CODES[p.op] > UNARY_CODES[UnaryOp.NEG]:
        feature = f"unary op {p.op.value}"
    elif getattr(p, "op", None) is BinaryOp.POW:
        feature = "binary op pow"
    elif getattr(p, "index", None) is not None:
        feature = "device-side indices"
    if feature is not None:
        raise UnsupportedError(f"{op} with {feature} is not implemented by the {backend} backend yet")
