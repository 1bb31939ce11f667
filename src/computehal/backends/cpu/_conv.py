"""2-D convolution on the CPU: the forward pass and both gradients.

Each hook picks an algorithm of :mod:`._conv_algorithms` for the problem's shape.
"""

from __future__ import annotations

import numpy as np

from ... import validation as v
from .._common import refuse_extensions
from ._blas import gemm_at
from ._conv_algorithms import conv_s1, conv_s1_filter_grad, im2col, windows
from ._plumbing import CpuPlumbing
from ._runtime import parallel_ranges

__all__ = ["ConvOps"]


class ConvOps(CpuPlumbing):
    """``conv2d_forward``, ``conv2d_backward_data`` and ``conv2d_backward_filter``."""

    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        refuse_extensions("cpu", "conv2d_forward", p)
        dt = p.dtype
        x = self._array(p.x, (p.n, p.c, p.h, p.w), dt)
        f = self._array(p.f, (p.k, p.c * p.fh * p.fw), dt)
        if p.sh == p.sw == 1 and not (p.fh == p.fw == 1 and p.ph == p.pw == 0):
            taps = np.ascontiguousarray(f.reshape(p.k, p.c, p.fh, p.fw).transpose(2, 3, 1, 0))
            conv_s1(x, taps, p.ph, p.pw, self._array(p.y, (p.n, p.k, p.oh, p.ow), dt))
            return
        np.matmul(f, im2col(p, x), out=self._array(p.y, (p.n, p.k, p.oh * p.ow), dt))

    def _exec_conv2d_backward_data(self, p: v.ConvProblem) -> None:
        refuse_extensions("cpu", "conv2d_backward_data", p)
        dt = p.dtype
        gx = self._array(p.x, (p.n, p.c, p.h, p.w), dt)
        gy = self._array(p.y, (p.n, p.k, p.oh * p.ow), dt)
        f = self._array(p.f, (p.k, p.c * p.fh * p.fw), dt)
        if p.sh == p.sw == 1 and p.ph < p.fh and p.pw < p.fw and not (p.fh == p.fw == 1):
            # Stride 1: the data gradient is the forward convolution of the output gradient,
            # padded by (F - 1 - pad), with the filter flipped and its K and C swapped.
            taps = np.ascontiguousarray(
                f.reshape(p.k, p.c, p.fh, p.fw)[:, :, ::-1, ::-1].transpose(2, 3, 0, 1)
            )
            conv_s1(gy.reshape(p.n, p.k, p.oh, p.ow), taps, p.fh - 1 - p.ph, p.fw - 1 - p.pw, gx)
            return
        gcols = np.matmul(f.T, gy).reshape(p.n, p.c, p.fh, p.fw, p.oh, p.ow)
        if p.fh == p.fw == p.sh == p.sw == 1 and p.ph == p.pw == 0:
            gx[...] = gcols.reshape(gx.shape)
            return
        gpad = np.zeros((p.n, p.c, p.h + 2 * p.ph, p.w + 2 * p.pw), dtype=dt)

        def accumulate(start: int, stop: int) -> None:
            for r in range(p.fh):
                for s in range(p.fw):
                    windows(p, gpad[start:stop], r, s)[...] += gcols[start:stop, :, r, s]

        parallel_ranges(p.n, accumulate, grain=1)
        gx[...] = gpad[:, :, p.ph : p.ph + p.h, p.pw : p.pw + p.w]

    def _exec_conv2d_backward_filter(self, p: v.ConvProblem) -> None:
        refuse_extensions("cpu", "conv2d_backward_filter", p)
        dt = p.dtype
        gf = self._array(p.f, (p.k, p.c * p.fh * p.fw), dt)
        x = self._array(p.x, (p.n, p.c, p.h, p.w), dt)
        gy = self._array(p.y, (p.n, p.k, p.oh * p.ow), dt)
        if p.sh == p.sw == 1 and not (p.fh == p.fw == 1 and p.ph == p.pw == 0):
            taps = np.empty((p.fh, p.fw, p.k, p.c), dtype=dt)
            grad = gy.reshape(p.n, p.k, p.oh, p.ow)
            if conv_s1_filter_grad(x, grad, p.fh, p.fw, p.ph, p.pw, taps):
                gf.reshape(p.k, p.c, p.fh, p.fw)[...] = taps.transpose(2, 3, 0, 1)
                return
        cols = im2col(p, x)
        crs, spatial = cols.shape[1], cols.shape[2]
        # grad_filter (K x CRS, row-major) = sum_n gy[n] @ cols[n]^T; in column-major terms
        # gf^T = cols[n] @ gy[n]^T, accumulated by BLAS with beta = 1 after the first image.
        cols = np.ascontiguousarray(cols)
        for i in range(p.n):
            gemm_at(
                dt, True, False, crs, p.k, spatial, 1.0,
                cols[i].ctypes.data, spatial, gy[i].ctypes.data, spatial,
                0.0 if i == 0 else 1.0, gf.ctypes.data, crs,
            )  # fmt: skip
