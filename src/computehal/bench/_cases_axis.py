"""Rows over an axis: ``reduce``, ``softmax`` (and log-softmax), and the normalisations.

All memory-bound: GB/s of bytes read + written against the bandwidth ceiling.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import numpy as np

from ..types import ReduceOp
from ._context import BenchContext
from ._groups import register_group
from ._harness import Case

__all__ = ["norm_cases", "reduce_cases"]

F32 = np.float32


def reduce_cases(ctx: BenchContext) -> Iterator[Case]:
    """Softmax and log-softmax over both axes, sum / max / mean reductions over both axes."""
    be = ctx.backend
    m = ctx.sizes.matrix
    pm, pout, pr = ctx.put(ctx.rng.standard_normal((m, m), dtype=F32)), ctx.empty(4 * m * m), ctx.empty(4 * m)
    for log in (False, True):
        for axis in (0, 1):
            fn = functools.partial(be.softmax, pm, pout, (m, m), axis, log=log)
            label = "log-softmax" if log else "softmax"
            yield ctx.bandwidth_case("softmax", f"{label} {m}x{m} axis {axis}", fn, 8.0 * m * m, 5.0 * m * m)
    for rop in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MEAN):
        for axis in (0, 1):
            fn = functools.partial(be.reduce, rop, pm, pr, (m, m), axis)
            moved = 4.0 * m * (m + 1)
            yield ctx.bandwidth_case("reduce", f"{rop.value} {m}x{m} axis {axis}", fn, moved, m * m)


def norm_cases(ctx: BenchContext) -> Iterator[Case]:
    """Layer and RMS normalisation (with scale and bias), batch normalisation, LRN."""
    be = ctx.backend
    rows, cols = ctx.sizes.norm
    with ctx.scope():
        px = ctx.put(ctx.rng.standard_normal((rows, cols), dtype=F32))
        py = ctx.empty(4 * rows * cols)
        scale = ctx.put(ctx.rng.uniform(0.5, 1.5, cols).astype(F32))
        bias = ctx.put(ctx.rng.standard_normal(cols, dtype=F32))
        moved = 4.0 * (2 * rows * cols + 2 * cols)
        for op in ("layer_norm", "rms_norm"):
            fn = functools.partial(getattr(be, op), px, py, rows, cols, 1e-5, scale_ptr=scale, bias_ptr=bias)
            yield ctx.bandwidth_case(op, f"{rows}x{cols} scale+bias", fn, moved, 5.0 * rows * cols)
    shape = ctx.sizes.pool
    count, channels = math.prod(shape), shape[1]
    with ctx.scope():
        px, py = ctx.put(ctx.rng.standard_normal(shape, dtype=F32)), ctx.empty(4 * count)
        scale, bias, mean, var = (ctx.put(ctx.rng.uniform(0.5, 1.5, channels).astype(F32)) for _ in range(4))
        fn = functools.partial(be.batch_norm, px, shape, scale, bias, mean, var, py, 1e-5)
        yield ctx.bandwidth_case(
            "batch_norm", "x".join(map(str, shape)), fn, 4.0 * (2 * count + 4 * channels), 2.0 * count
        )
    shape = ctx.sizes.lrn
    count = math.prod(shape)
    with ctx.scope():
        px, py = ctx.put(ctx.rng.standard_normal(shape, dtype=F32)), ctx.empty(4 * count)
        fn = functools.partial(be.lrn, px, py, shape, 5, 1e-4, 0.75, 2.0)
        yield ctx.bandwidth_case("lrn", "x".join(map(str, shape)) + " size 5", fn, 8.0 * count, 12.0 * count)


register_group("reduce", reduce_cases, description="reduce sum/max/mean, softmax, log-softmax", default=True)
register_group("norm", norm_cases, description="layer_norm, rms_norm, batch_norm, lrn", default=True)
