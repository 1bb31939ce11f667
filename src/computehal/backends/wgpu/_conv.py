"""2-D convolution and its two gradients (wgpu_conv.wgsl): one invocation per element written.

One dispatch covers the whole sum unless an invocation would exceed llvmpipe's loop
budget; then the outer summed dimension (and, for the filter gradient, the output rows)
is cut so that each dispatch stays within it, consecutive dispatches accumulating.
"""

from __future__ import annotations

from ... import validation as v
from .._common import refuse_extensions
from ._device import Gpu
from ._queue import Step, grid_1d, pack

__all__ = ["conv2d_backward_data", "conv2d_backward_filter", "conv2d_forward"]

Ranges = list[tuple[int, int, int, int]]


def _ranges(gpu: Gpu, kernel: str, p: v.ConvProblem) -> Ranges:
    """The (r_lo, r_hi, q_lo, q_hi) ranges of the dispatches of one convolution."""
    budget = gpu.loop_budget
    if kernel == "conv_forward":
        outer, per = p.c, 2 + p.fh * (2 + p.fw)
    elif kernel == "conv_backward_data":
        outer, per = p.k, 0
    else:
        outer, per = p.n, 2 + p.oh * (2 + p.ow)
    whole = [(0, outer, 0, p.oh)]
    if kernel == "conv_backward_data":
        # Loops: 1 + fh * (2 + fw * (2 + filters)); cut the filters.
        if budget is None or 1 + p.fh * (2 + p.fw * (2 + p.k)) <= budget:
            return whole
        step = ((budget - 1) // max(1, p.fh) - 2) // max(1, p.fw) - 2
        gpu.check_loops("conv2d backward data (one filter per dispatch)", 1 + p.fh * (2 + p.fw * 3))
        return [(lo, min(outer, lo + step), 0, p.oh) for lo in range(0, outer, step)] or whole
    if budget is None or 1 + outer * per <= budget:
        return whole
    if 3 + per <= budget:
        step = (budget - 1) // per
        return [(lo, min(outer, lo + step), 0, p.oh) for lo in range(0, outer, step)]
    if kernel == "conv_forward":
        gpu.check_loops("conv2d forward (one channel per dispatch)", 3 + per)
    # The filter gradient: one image and a band of output rows per dispatch.
    rows = (budget - 4) // (2 + p.ow)
    gpu.check_loops("conv2d backward filter (one output row per dispatch)", 6 + p.ow)
    return [(n, n + 1, q, min(p.oh, q + rows)) for n in range(outer) for q in range(0, p.oh, rows)]


def _conv(gpu: Gpu, kernel: str, p: v.ConvProblem, total: int) -> None:
    ranges = _ranges(gpu, kernel, p)
    bx = gpu.bind("input_ptr", p.x)
    bf = gpu.bind("filter_ptr", p.f)
    by = gpu.bind("output_ptr", p.y)
    grid = grid_1d(total, 256)
    steps = []
    for i, (r_lo, r_hi, q_lo, q_hi) in enumerate(ranges):
        params = pack(
            p.n, p.c, p.h, p.w, p.k, p.fh, p.fw, p.oh, p.ow, p.sh, p.sw, p.ph, p.pw,
            bx.elem, bf.elem, by.elem, total, r_lo, r_hi, q_lo, q_hi, i > 0,
        )  # fmt: skip
        steps.append(Step(kernel, params, (bx, bf, by), grid))
    gpu.run(steps)


def conv2d_forward(gpu: Gpu, p: v.ConvProblem) -> None:
    """Run a validated forward convolution."""
    refuse_extensions("wgpu", "conv2d_forward", p)
    _conv(gpu, "conv_forward", p, p.n * p.k * p.oh * p.ow)


def conv2d_backward_data(gpu: Gpu, p: v.ConvProblem) -> None:
    """Run a validated input gradient."""
    refuse_extensions("wgpu", "conv2d_backward_data", p)
    _conv(gpu, "conv_backward_data", p, p.n * p.c * p.h * p.w)


def conv2d_backward_filter(gpu: Gpu, p: v.ConvProblem) -> None:
    """Run a validated filter gradient."""
    refuse_extensions("wgpu", "conv2d_backward_filter", p)
    _conv(gpu, "conv_backward_filter", p, p.k * p.c * p.fh * p.fw)
