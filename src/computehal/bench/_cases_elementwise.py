"""Element-wise rows: every ``unary`` and ``binary`` op, ``broadcast_binary``, ``cast``.

Each is memory-bound: GB/s of bytes read + written, against the bandwidth ceiling.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np

from ..types import BinaryOp, UnaryOp
from ._context import BenchContext
from ._groups import register_group
from ._harness import Case

__all__ = ["elementwise_cases"]

F32 = np.float32

#: Keywords of the parametrised unary ops.
_UNARY_KEYWORDS: dict[UnaryOp, dict[str, Any]] = {
    UnaryOp.LEAKY_RELU: {"alpha": 0.1},
    UnaryOp.CLIP: {"lo": -1.0, "hi": 1.0},
}


def _broadcast_shapes(n: int) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    cols = min(1024, n)
    rows = max(1, n // cols)
    channels = 64 if n >= 64 * 8 else 1
    batch = 8 if n >= 64 * 8 else 1
    spatial = max(1, n // (channels * batch))
    return [
        ("add", (rows, cols), (1, cols)),
        ("mul", (rows, cols), (rows, 1)),
        ("add", (batch, channels, spatial), (1, channels, 1)),
    ]


def elementwise_cases(ctx: BenchContext) -> Iterator[Case]:
    """Every unary op, every binary op, three broadcasts and three casts."""
    be = ctx.backend
    n = ctx.sizes.elementwise
    size = f"2^{int(math.log2(n))}" if n & (n - 1) == 0 else str(n)
    x = ctx.rng.standard_normal(n, dtype=F32)
    pa, pb, pout = (
        ctx.put(np.abs(x) + F32(0.5)),
        ctx.put(ctx.rng.standard_normal(n, dtype=F32)),
        ctx.empty(4 * n),
    )
    for op in UnaryOp:
        fn = functools.partial(be.unary, op, pa, pout, n, **_UNARY_KEYWORDS.get(op, {}))
        yield ctx.bandwidth_case("unary", f"{op.value} {size} f32", fn, 8.0 * n, n)
    for bop in BinaryOp:
        fn = functools.partial(be.binary, bop, pa, pb, pout, n)
        yield ctx.bandwidth_case("binary", f"{bop.value} {size} f32", fn, 12.0 * n, n)
    for name, a_shape, b_shape in _broadcast_shapes(n):
        count = math.prod(a_shape)
        fn = functools.partial(be.broadcast_binary, name, pa, a_shape, pb, b_shape, pout, a_shape)
        moved = 4.0 * (2 * count + math.prod(b_shape))
        params = f"{name} {_dims(a_shape)} {_dims(b_shape)}"
        yield ctx.bandwidth_case("broadcast_binary", params, fn, moved, count)
    p16 = ctx.put(x.astype(np.float16))
    pbf = ctx.put(x.astype(ml_dtypes.bfloat16))
    for src, dst, ptr in (
        ("float32", "float16", pa),
        ("float16", "float32", p16),
        ("float32", "bfloat16", pa),
        ("bfloat16", "float32", pbf),
    ):
        fn = functools.partial(be.cast, ptr, pout, n, dtype=src, out_dtype=dst)
        moved = float(n * (np.dtype(_np(src)).itemsize + np.dtype(_np(dst)).itemsize))
        yield ctx.bandwidth_case("cast", f"{src} -> {dst} {size}", fn, moved, n)


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _np(name: str) -> Any:
    return ml_dtypes.bfloat16 if name == "bfloat16" else name


register_group(
    "elementwise", elementwise_cases, description="unary, binary, broadcast_binary, cast", default=True
)
