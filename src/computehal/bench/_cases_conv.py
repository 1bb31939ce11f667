"""Convolution and pooling rows.

* ``conv2d_forward`` / ``conv2d_backward_data`` / ``conv2d_backward_filter`` on the
  default 3x3 stride-1 shape, and (``sizes.conv_stages``) the forward pass of ResNet-50's
  convolutions, as GFLOP/s of the direct convolution against the compute ceiling;
* a depthwise 3x3 convolution (``groups == C``), memory-bound, as GB/s against the
  bandwidth ceiling;
* ``pool2d``: ResNet's 3x3 stride-2 max pool, DenseNet's 2x2 average pool and a global
  average pool, as GB/s (input read + output written) against the bandwidth ceiling.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from ..types import PoolOp
from ._context import BenchContext, relative_error
from ._groups import register_group
from ._harness import Case, compute_case

__all__ = ["conv_cases", "pool_cases"]

F32 = np.float32


def conv_reference(
    x: npt.NDArray[Any], w: npt.NDArray[Any], stride: int, pad: int
) -> npt.NDArray[np.float64]:
    """Cross-correlation of one image ``x`` [C, H, W] with ``w`` [K, C, Fh, Fw] in float64."""
    k, _, fh, fw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad)))
    oh = (xp.shape[1] - fh) // stride + 1
    ow = (xp.shape[2] - fw) // stride + 1
    out = np.zeros((k, oh, ow))
    for i in range(fh):
        for j in range(fw):
            patch = xp[:, i : i + stride * oh : stride, j : j + stride * ow : stride]
            out += np.tensordot(w[:, :, i, j].astype(np.float64), patch, axes=(1, 0))
    return out


def _forward_case(
    ctx: BenchContext, n: int, c: int, k: int, hw: int, f: int, stride: int, label: str, verify: bool = False
) -> Case:
    pad = f // 2
    o = (hw + 2 * pad - f) // stride + 1
    xs, fs, ys = (n, c, hw, hw), (k, c, f, f), (n, k, o, o)
    x = ctx.rng.standard_normal(xs, dtype=F32)
    w = ctx.rng.standard_normal(fs, dtype=F32)
    px, pf, py = ctx.put(x), ctx.put(w), ctx.empty(math.prod(ys) * 4)
    flops = 2.0 * n * k * c * f * f * o * o

    def check() -> float:
        return relative_error(ctx.read(py, ys)[0], conv_reference(x[0], w, stride, pad))

    return compute_case(
        "conv2d_forward",
        f"{label}N={n} C={c} K={k} {hw}x{hw} {f}x{f} s{stride}",
        functools.partial(ctx.backend.conv2d_forward, px, xs, pf, fs, py, ys, (stride, stride), (pad, pad)),
        flops,
        4.0 * (math.prod(xs) + math.prod(fs) + math.prod(ys)),
        ctx.ceilings.compute,
        ctx.target("conv_forward"),
        verify=check if verify else None,
    )


def _gradient_cases(ctx: BenchContext) -> Iterator[Case]:
    be = ctx.backend
    n, c, k, h, w = ctx.sizes.conv
    xs, fs, ys = (n, c, h, w), (k, c, 3, 3), (n, k, h, w)
    px = ctx.put(ctx.rng.standard_normal(xs, dtype=F32))
    pf = ctx.put(ctx.rng.standard_normal(fs, dtype=F32))
    py = ctx.put(ctx.rng.standard_normal(ys, dtype=F32))
    pgx, pgf = ctx.empty(math.prod(xs) * 4), ctx.empty(math.prod(fs) * 4)
    flops = 2.0 * n * k * c * 9 * h * w
    moved = 4.0 * (math.prod(xs) + math.prod(fs) + math.prod(ys))
    params = f"N={n} C={c} K={k} {h}x{w} 3x3 s1"
    one, pad = (1, 1), (1, 1)
    for op, fn in (
        (
            "conv2d_backward_data",
            functools.partial(be.conv2d_backward_data, py, ys, pf, fs, pgx, xs, one, pad),
        ),
        (
            "conv2d_backward_filter",
            functools.partial(be.conv2d_backward_filter, px, xs, py, ys, pgf, fs, one, pad),
        ),
    ):
        yield compute_case(op, params, fn, flops, moved, ctx.ceilings.compute, ctx.target("conv_backward"))


#: ResNet-50's convolutions: (label, C, K, H=W, filter, stride).
RESNET50 = (
    ("stem ", 3, 64, 224, 7, 2),
    ("", 64, 64, 56, 3, 1),
    ("", 128, 128, 28, 3, 1),
    ("", 256, 256, 14, 3, 1),
    ("", 512, 512, 7, 3, 1),
    ("1x1 ", 256, 64, 56, 1, 1),
    ("1x1 ", 64, 256, 56, 1, 1),
    ("1x1 ", 256, 512, 56, 1, 2),
)


def _depthwise_case(ctx: BenchContext) -> Case:
    n, c, h, w = ctx.sizes.depthwise
    xs, fs = (n, c, h, w), (c, 1, 3, 3)
    px = ctx.put(ctx.rng.standard_normal(xs, dtype=F32))
    pf = ctx.put(ctx.rng.standard_normal(fs, dtype=F32))
    py = ctx.empty(math.prod(xs) * 4)
    moved = 4.0 * (2 * math.prod(xs) + math.prod(fs))
    fn = functools.partial(ctx.backend.conv2d_forward, px, xs, pf, fs, py, xs, (1, 1), (1, 1), groups=c)
    return Case(
        "conv2d_forward",
        f"depthwise N={n} C={c} {h}x{w} 3x3",
        fn,
        "GB/s",
        moved,
        ctx.ceilings.bandwidth,
        None,
        flops=18.0 * math.prod(xs),
        bytes_moved=moved,
    )


def conv_cases(ctx: BenchContext) -> Iterator[Case]:
    """The default convolution (forward, both gradients), ResNet-50's set, depthwise."""
    n, c, k, h, _ = ctx.sizes.conv
    yield _forward_case(ctx, n, c, k, h, 3, 1, "", verify=True)
    yield from _gradient_cases(ctx)
    if ctx.sizes.conv_stages:
        for label, cin, cout, hw, f, stride in RESNET50:
            with ctx.scope():
                yield _forward_case(ctx, n, cin, cout, hw, f, stride, f"R50 {label}")
    yield _depthwise_case(ctx)


def _pool_case(
    ctx: BenchContext, op: PoolOp, shape: tuple[int, int, int, int], kernel: int, stride: int, pad: int
) -> Case:
    n, c, h, w = shape
    oh, ow = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    x = ctx.rng.standard_normal(shape, dtype=F32)
    px, py = ctx.put(x), ctx.empty(n * c * oh * ow * 4)
    moved = 4.0 * (x.size + n * c * oh * ow)
    fn = functools.partial(
        ctx.backend.pool2d, op, px, shape, py, (n, c, oh, ow), (kernel, kernel), (stride, stride), (pad, pad)
    )
    label = "global" if kernel == h else f"{kernel}x{kernel} s{stride} p{pad}"
    return Case(
        "pool2d",
        f"{op.value} {label} {n}x{c}x{h}x{w}",
        fn,
        "GB/s",
        moved,
        ctx.ceilings.bandwidth,
        ctx.target("pool"),
        flops=float(n * c * oh * ow * kernel * kernel),
        bytes_moved=moved,
    )


def pool_cases(ctx: BenchContext) -> Iterator[Case]:
    """Max 3x3 stride 2, average 2x2 stride 2, global average."""
    n, c, h, w = ctx.sizes.pool
    yield _pool_case(ctx, PoolOp.MAX, (n, c, h, w), 3, 2, 1)
    yield _pool_case(ctx, PoolOp.AVG, (n, c, h, w), 2, 2, 0)
    small = max(1, h // 16)
    yield _pool_case(ctx, PoolOp.AVG, (n, c * 32, small, small), small, 1, 0)


register_group(
    "conv", conv_cases, description="conv2d forward / gradients, ResNet-50's set, depthwise", default=True
)
register_group("pool", pool_cases, description="pool2d max / avg / global avg", default=True)
