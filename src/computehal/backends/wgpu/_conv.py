"""2-D convolution and its two gradients (wgpu_conv.wgsl): one invocation per element written.

Groups, dilation, four-sided padding and a bias are parameters of the same kernels;
depthwise forward convolutions (one input channel per group) run ``conv_depthwise``,
whose workgroups stage the input patch of a 16 x 16 output tile in workgroup memory.
One dispatch covers the whole sum unless an invocation would exceed llvmpipe's loop
budget; then the outer summed dimension (and, for the filter gradient, the output rows)
is cut so that each dispatch stays within it, consecutive dispatches accumulating.
"""

from __future__ import annotations

from ... import validation as v
from .._common import ceil_div
from ._device import Gpu
from ._queue import MAX_GROUPS, Step, grid_1d, pack

__all__ = ["conv2d_backward_data", "conv2d_backward_filter", "conv2d_forward"]

Ranges = list[tuple[int, int, int, int]]

#: Floats of workgroup memory conv_depthwise stages (its `tile_in` array).
PATCH = 2304


def _ranges(gpu: Gpu, kernel: str, p: v.ConvProblem) -> Ranges:
    """The (r_lo, r_hi, q_lo, q_hi) ranges of the dispatches of one convolution."""
    budget = gpu.loop_budget
    if kernel == "conv_forward":
        outer, per = p.cg, 2 + p.fh * (2 + p.fw)
    elif kernel == "conv_backward_data":
        outer, per = p.kg, 0
    else:
        outer, per = p.n, 2 + p.oh * (2 + p.ow)
    whole = [(0, outer, 0, p.oh)]
    if kernel == "conv_backward_data":
        # Loops: 1 + fh * (2 + fw * (2 + filters)); cut the filters.
        if budget is None or 1 + p.fh * (2 + p.fw * (2 + outer)) <= budget:
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


def _params(p: v.ConvProblem, offsets: tuple[int, int, int, int], extra: tuple[int, ...]) -> bytes:
    return pack(
        p.n, p.c, p.h, p.w, p.k, p.fh, p.fw, p.oh, p.ow, p.sh, p.sw, p.ph, p.pw, p.dh, p.dw,
        p.cg, p.kg, *offsets, p.bias is not None, *extra,
    )  # fmt: skip


def _conv(gpu: Gpu, kernel: str, p: v.ConvProblem, total: int) -> None:
    ranges = _ranges(gpu, kernel, p)
    bx = gpu.bind("input_ptr", p.x)
    bf = gpu.bind("filter_ptr", p.f)
    by = gpu.bind("output_ptr", p.y)
    bb = gpu.dummy() if p.bias is None else gpu.bind("bias_ptr", p.bias)
    offsets = (bx.elem, bf.elem, by.elem, bb.elem)
    grid = grid_1d(total, 256)
    bindings = (bx, bf, by, bb)
    steps = [
        Step(kernel, _params(p, offsets, (total, r_lo, r_hi, q_lo, q_hi, i > 0, 0, 0)), bindings, grid)
        for i, (r_lo, r_hi, q_lo, q_hi) in enumerate(ranges)
    ]
    gpu.run(steps)


def _depthwise(gpu: Gpu, p: v.ConvProblem) -> bool:
    """Run a depthwise forward convolution with conv_depthwise; False when it does not fit."""
    patch_w = 15 * p.sw + (p.fw - 1) * p.dw + 1
    patch_h = 15 * p.sh + (p.fh - 1) * p.dh + 1
    planes = p.n * p.k
    taps = p.fh * (2 + p.fw) + patch_w * patch_h // 256 + 4
    budget_ok = gpu.loop_budget is None or taps <= gpu.loop_budget
    if not (p.depthwise and patch_w * patch_h <= PATCH and planes <= MAX_GROUPS and budget_ok):
        return False
    bx, bf, by = gpu.bind("input_ptr", p.x), gpu.bind("filter_ptr", p.f), gpu.bind("output_ptr", p.y)
    bb = gpu.dummy() if p.bias is None else gpu.bind("bias_ptr", p.bias)
    offsets = (bx.elem, bf.elem, by.elem, bb.elem)
    params = _params(p, offsets, (0, 0, 0, 0, 0, 0, patch_w, patch_h))
    grid = (ceil_div(p.ow, 16), ceil_div(p.oh, 16), planes)
    gpu.run([Step("conv_depthwise", params, (bx, bf, by, bb), grid)])
    return True


def conv2d_forward(gpu: Gpu, p: v.ConvProblem) -> None:
    """Run a validated forward convolution."""
    if not _depthwise(gpu, p):
        _conv(gpu, "conv_forward", p, p.n * p.k * p.oh * p.ow)


def conv2d_backward_data(gpu: Gpu, p: v.ConvProblem) -> None:
    """Run a validated input gradient."""
    _conv(gpu, "conv_backward_data", p, p.n * p.c * p.h * p.w)


def conv2d_backward_filter(gpu: Gpu, p: v.ConvProblem) -> None:
    """Run a validated filter gradient."""
    _conv(gpu, "conv_backward_filter", p, p.k * p.cg * p.fh * p.fw)
