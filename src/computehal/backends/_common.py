"""Small mechanisms every backend shares: op codes, launch chunking, integer helpers.

Op codes are numbered once here, in enum order, and handed to kernels as generated
``#define`` / ``const`` lines (:func:`c_defines`, :func:`wgsl_consts`), so a kernel and
the Python that launches it can never disagree about what code 3 means.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any

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
    "refuse_extensions",
    "round_up",
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
