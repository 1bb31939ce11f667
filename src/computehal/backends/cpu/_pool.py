"""2-D max / average pooling on the CPU (NCHW), one channel plane at a time.

The compiled kernel of :mod:`._kpool` pools each plane in one pass; where numba is
unusable, NumPy folds one strided view per filter tap over the output rectangle that
tap reaches. Taps outside the image are never read, so padding never meets a NaN.
"""

from __future__ import annotations

import numpy as np

from ... import validation as v
from ...types import PoolOp
from ._plumbing import CpuPlumbing, FloatArray
from ._runtime import PARALLEL_THRESHOLD, kernels, parallel_ranges

__all__ = ["PoolOps", "tap_outputs"]

#: Global pooling of fewer input elements runs on the calling thread: the compiled
#: reduction reads about 22 GB/s on one core (nearly this host's copy bandwidth), so a
#: second thread saves little on a few MiB while waking it costs tens of microseconds
#: (8 x 2048 x 7 x 7 with other processes running: 206 us a call on one thread, 237 us
#: on two; the benchmark row went from 0.60-0.95 to 1.20-1.22 of the copy ceiling).
#: Measured again on the quiet 2-vCPU VM: a worker whose vCPU had halted started 185 us
#: after the call; blocks of 1344 rows pulled by whichever thread is free took 144-220 us
#: in cache and 510-590 us after a 128 MB copy, against 124-144 and 320-385 on one
#: thread (the two vCPUs share one core's caches and memory queue).
GLOBAL_SERIAL_ELEMENTS = 1 << 22


def tap_outputs(tap: int, stride: int, pad: int, dil: int, outputs: int, size: int) -> tuple[int, int]:
    """Outputs ``[o0, o1)`` whose tap ``tap`` reads inside ``[0, size)``.

    That is, ``0 <= o * stride - pad + tap * dil < size``.
    """
    offset = tap * dil - pad
    o0 = 0 if offset >= 0 else -(offset // stride)
    last = size - 1 - offset
    o1 = 0 if last < 0 else min(outputs, last // stride + 1)
    return o0, max(o0, o1)


def _counts(outputs: int, stride: int, pad: int, dil: int, taps: int, size: int) -> FloatArray:
    """Per output position, how many taps land inside ``[0, size)`` (``pad`` before it)."""
    count = np.zeros(outputs)
    for t in range(taps):
        o0, o1 = tap_outputs(t, stride, pad, dil, outputs, size)
        count[o0:o1] += 1
    return count


def _pool_numpy(p: v.PoolProblem, x: FloatArray, out: FloatArray) -> None:
    """Pool planes ``x`` [P, H, W] into ``out`` [P, Oh, Ow], one strided view per tap."""
    is_max = p.op is PoolOp.MAX
    acc = np.full(out.shape, -np.inf if is_max else 0.0, dtype=out.dtype)
    for r in range(p.kh):
        i0, i1 = tap_outputs(r, p.sh, p.pt, p.dh, p.oh, p.h)
        for s in range(p.kw):
            j0, j1 = tap_outputs(s, p.sw, p.pl, p.dw, p.ow, p.w)
            if i0 >= i1 or j0 >= j1:
                continue
            rows = slice(i0 * p.sh - p.pt + r * p.dh, (i1 - 1) * p.sh - p.pt + r * p.dh + 1, p.sh)
            cols = slice(j0 * p.sw - p.pl + s * p.dw, (j1 - 1) * p.sw - p.pl + s * p.dw + 1, p.sw)
            target = acc[:, i0:i1, j0:j1]
            (np.fmax if is_max else np.add)(target, x[:, rows, cols], out=target)
    if is_max:
        out[...] = acc
        return
    if p.count_include_pad:
        rows_n = _counts(p.oh, p.sh, 0, p.dh, p.kh, p.h + p.pt + p.pb)
        cols_n = _counts(p.ow, p.sw, 0, p.dw, p.kw, p.w + p.pl + p.pr)
    else:
        rows_n = _counts(p.oh, p.sh, p.pt, p.dh, p.kh, p.h)
        cols_n = _counts(p.ow, p.sw, p.pl, p.dw, p.kw, p.w)
    np.divide(acc, rows_n[:, None] * cols_n[None, :], out=out, casting="unsafe")


class PoolOps(CpuPlumbing):
    """``pool2d``."""

    @staticmethod
    def _pool_global(p: v.PoolProblem, x: FloatArray, out: FloatArray) -> bool:
        """Global pooling (one window covering each whole image): a reduction per plane."""
        if (p.kh, p.kw, p.oh, p.ow, p.dh, p.dw) != (p.h, p.w, 1, 1, 1, 1) or p.pt or p.pl or p.pb or p.pr:
            return False
        flat, result = x.reshape(x.shape[0], -1), out.reshape(-1)
        compiled = kernels("_kpool")
        is_max = p.op is PoolOp.MAX

        def run(start: int, stop: int) -> None:
            if compiled is not None and not is_max and flat.dtype == np.float32:
                compiled.global_means_f32(flat[start:stop], result[start:stop])
                return
            if compiled is not None:  # (compiled code raises no floating-point warnings)
                compiled.global_planes(flat[start:stop], result[start:stop], is_max)
                return
            with np.errstate(all="ignore"):
                if is_max:
                    np.fmax.reduce(flat[start:stop], axis=1, initial=-np.inf, out=result[start:stop])
                else:
                    np.add.reduce(flat[start:stop], axis=1, out=result[start:stop])
                    result[start:stop] /= result.dtype.type(p.h * p.w)

        if flat.size < GLOBAL_SERIAL_ELEMENTS:
            run(0, flat.shape[0])
        else:
            parallel_ranges(flat.shape[0], run, grain=max(1, PARALLEL_THRESHOLD // max(1, flat.shape[1])))
        return True

    def _exec_pool2d(self, p: v.PoolProblem) -> None:
        planes = p.n * p.c
        x = self._array(p.x, (planes, p.h, p.w), p.dtype)
        out = self._array(p.y, (planes, p.oh, p.ow), p.dtype)
        if self._pool_global(p, x, out):
            return
        compiled = kernels("_kpool")
        geometry = np.array([p.kh, p.kw, p.sh, p.sw, p.pt, p.pl, p.pb, p.pr, p.dh, p.dw], dtype=np.int64)
        is_max = p.op is PoolOp.MAX

        def run(start: int, stop: int) -> None:
            if compiled is not None:
                compiled.pool_planes(x[start:stop], out[start:stop], geometry, is_max, p.count_include_pad)
                return
            with np.errstate(all="ignore"):
                _pool_numpy(p, x[start:stop], out[start:stop])

        per_plane = p.h * p.w + p.oh * p.ow
        parallel_ranges(planes, run, grain=max(1, PARALLEL_THRESHOLD // max(1, per_plane)))
