"""2-D max and average pooling (wgpu_pool.wgsl): one invocation per output element.

On llvmpipe a window too large for one invocation's loop budget (global pooling of a
large image) runs in several dispatches over bands of window rows, each continuing
from the partial maximum or sum in the output; the last one divides an average.
"""

from __future__ import annotations

from ... import validation as v
from .._common import POOL_CODES
from ._device import Gpu
from ._queue import Step, grid_1d, pack

__all__ = ["pool2d"]


def pool2d(gpu: Gpu, p: v.PoolProblem) -> None:
    """Run a validated pool2d."""
    bx, by = gpu.bind("input_ptr", p.x), gpu.bind("output_ptr", p.y)
    total = p.n * p.c * p.oh * p.ow
    rows = p.kh
    if gpu.loop_budget is not None and 2 + p.kh * (2 + p.kw) > gpu.loop_budget:
        gpu.check_loops(f"pool2d with a window {p.kw} wide", 5 + p.kw)
        rows = (gpu.loop_budget - 2) // (2 + p.kw)
    bands = [(lo, min(p.kh, lo + rows)) for lo in range(0, p.kh, rows)]
    head = (
        p.n, p.c, p.h, p.w, p.oh, p.ow, p.kh, p.kw, p.sh, p.sw, p.pt, p.pl, p.pb, p.pr, p.dh, p.dw,
        POOL_CODES[p.op], p.count_include_pad, bx.elem, by.elem, total,
    )  # fmt: skip
    grid = grid_1d(total, 256)
    steps = [
        Step("pool2d", pack(*head, lo, hi, i > 0, i == len(bands) - 1), (bx, by), grid)
        for i, (lo, hi) in enumerate(bands)
    ]
    gpu.run(steps)
