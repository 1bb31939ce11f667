"""Pooling on CUDA (float32 and float64): ``kernels/pool.cl``, a thread per output pixel.

The output pixel index goes in grid x, (image, channel) in grid y, at most 65535 per
launch.
"""

from __future__ import annotations

from ... import validation as v
from .._common import POOL_CODES, ceil_div, chunks
from ._core import I32, I64, CudaCore, Ptr
from ._device import GRID_YZ_MAX
from ._programs import pool_unit, real_of

__all__ = ["PoolOps"]

_BLOCK = 128


class PoolOps(CudaCore):
    """pool2d."""

    def _exec_pool2d(self, p: v.PoolProblem) -> None:
        dims = (p.h, p.w, p.oh, p.ow, p.kh, p.kw, p.sh, p.sw, p.pt, p.pl, p.pb, p.pr, p.dh, p.dw)
        unit, positions = pool_unit(real_of(p.dtype.name)), p.oh * p.ow
        for r0, r1 in chunks(p.n * p.c, 0, most=GRID_YZ_MAX):
            self._launch(
                unit, "pool2d", (ceil_div(positions, _BLOCK), r1 - r0), (_BLOCK, 1),
                Ptr(p.x.ptr), I64(r0 * p.h * p.w), Ptr(p.y.ptr), I64(r0 * positions), I32(POOL_CODES[p.op]),
                *(I32(d) for d in dims), I32(int(p.count_include_pad)),
            )  # fmt: skip
