"""2-D pooling on OpenCL (``kernels/pool.cl``): one work-item per output pixel, float32 and
float64, max or average by the shared ``POOL_*`` codes."""

from __future__ import annotations

import numpy as np

from ... import validation as v
from .._common import POOL_CODES
from ._core import OpenCLCore

__all__ = ["PoolOps"]

I32 = np.int32
I64 = np.int64


class PoolOps(OpenCLCore):
    """pool2d."""

    def _exec_pool2d(self, p: v.PoolProblem) -> None:
        size = p.dtype.itemsize
        x, y = self._at(p.x, size), self._at(p.y, size)
        dims = (p.h, p.w, p.oh, p.ow, p.kh, p.kw, p.sh, p.sw, p.pt, p.pl, p.pb, p.pr, p.dh, p.dw)
        local = (min(64, self._max_wg), 1) if self._profile == "gpu" else (16, 1)
        with self._lock:
            kernel = self._kernel("pool.cl", "pool2d", p.dtype)
            self._launch(
                kernel, (p.oh * p.ow, p.n * p.c), local,
                x.buffer, I64(x.offset), y.buffer, I64(y.offset), I32(POOL_CODES[p.op]),
                *(I32(d) for d in dims), I32(int(p.count_include_pad)),
            )  # fmt: skip
