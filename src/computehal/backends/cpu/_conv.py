"""2-D convolution on the CPU: the forward pass and both gradients, any groups, dilation,
four-sided padding and bias.

Each hook picks an algorithm for the problem:

* shape-specific algorithms first (:mod:`._conv_select`: Winograd for 3x3 stride-1
  layers, ...), where one applies;
* depthwise convolutions (one input channel per group) have their own kernels: a
  compiled one for the forward pass (:mod:`._kconv`), NumPy over all channels per tap
  for the gradients (:mod:`._conv_exact`);
* GEMM-based algorithms (:mod:`._conv_algorithms`: per-tap GEMMs on the padded image at
  stride 1, im2col or col2im otherwise), one group at a time, where the operands they
  multiply by padding zeros are finite and the padding is not much larger than the
  image;
* otherwise the exact tap-by-tap algorithm of :mod:`._conv_exact`, which never
  multiplies padding, so NaN and infinity reach exactly the results the contract says,
  in memory proportional to the operands whatever the padding.
"""

from __future__ import annotations

import numpy as np

from ... import validation as v
from ...types import UnaryOp
from ._blas import gemm_at
from ._conv_algorithms import Geometry, col2im, conv_s1, conv_s1_filter_grad, im2col
from ._conv_epilogue import apply_epilogue, finish_epilogue
from ._conv_exact import backward_data, backward_filter, forward
from ._conv_select import fast_backward_data, fast_backward_filter, fast_forward
from ._plumbing import CpuPlumbing, FloatArray
from ._runtime import PARALLEL_THRESHOLD, kernels, parallel_ranges

__all__ = ["ConvOps"]


def _geometry(p: v.ConvProblem) -> Geometry:
    return Geometry(p.ph, p.pw, p.pb, p.pr, p.sh, p.sw, p.dh, p.dw)


def _padded(p: v.ConvProblem) -> bool:
    return bool(p.ph or p.pw or p.pb or p.pr)


def _padding_heavy(p: v.ConvProblem) -> bool:
    """True when a zero-padded copy of the input would dwarf the operands."""
    padded = p.n * p.c * (p.h + p.ph + p.pb) * (p.w + p.pw + p.pr)
    return padded > 8 * (p.n * p.c * p.h * p.w + p.n * p.k * p.oh * p.ow) + (1 << 20)


def _finite(a: FloatArray) -> bool:
    return bool(np.isfinite(a).all())


class ConvOps(CpuPlumbing):
    """``conv2d_forward``, ``conv2d_backward_data`` and ``conv2d_backward_filter``."""

    def _operands(self, p: v.ConvProblem) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Input (or its gradient), filter (or its gradient), output (or its gradient)."""
        dt = p.dtype
        x = self._array(p.x, (p.n, p.c, p.h, p.w), dt)
        f = self._array(p.f, (p.k, p.cg, p.fh, p.fw), dt)
        y = self._array(p.y, (p.n, p.k, p.oh, p.ow), dt)
        return x, f, y

    # ------------------------------------------------------------------ forward

    #: The residual and the activation run in this backend's own pass (:mod:`._conv_epilogue`).
    fuses_conv_epilogue = True

    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        x, f, y = self._operands(p)
        bias = None if p.bias is None else self._flat(p.bias, p.dtype)
        if not isinstance(p, v.ConvForwardProblem) or not p.has_epilogue:
            self._forward_into(p, x, f, y, bias)
            return
        if p.residual is not None and p.residual == p.y:
            # Accumulate in place: the convolution goes to scratch, then y = act(y + conv).
            conv = np.empty_like(y)
            self._forward_into(p, x, f, conv, bias)
            apply_epilogue(y.reshape(-1), conv.reshape(-1), p)
            return
        residual = None if p.residual is None else self._flat(p.residual, p.dtype)
        if p.activation in (None, UnaryOp.RELU) and kernels("_kepilogue") is not None:
            # The shape-specific algorithms apply it as they store each block where they can.
            self._forward_into(p, x, f, y, bias, (residual, p.activation is UnaryOp.RELU))
            return
        self._forward_into(p, x, f, y, bias)
        apply_epilogue(y.reshape(-1), residual, p)

    def _forward_into(
        self,
        p: v.ConvProblem,
        x: FloatArray,
        f: FloatArray,
        y: FloatArray,
        bias: FloatArray | None,
        epilogue: tuple[FloatArray | None, bool] = (None, False),
    ) -> None:
        """``y`` = the convolution of ``x`` and ``f`` plus ``bias`` (``y`` may be scratch), then ``epilogue``.

        ``epilogue``: ``(residual, relu)``: ``y = relu(y + residual)`` (a 1-D residual laid out
        as ``y``, or None); the shape-specific algorithms fuse it where they can.
        """
        if p.c == 0:
            y[...] = bias[None, :, None, None] if bias is not None else 0
            finish_epilogue(y, *epilogue)
            return
        if fast_forward(p, x, f, y, bias, epilogue):
            return
        if p.depthwise and self._depthwise_forward(p, x, f, y, bias):
            finish_epilogue(y, *epilogue)
            return
        g = _geometry(p)
        if p.depthwise or _padding_heavy(p) or (_padded(p) and not _finite(f)):
            forward(x, f, y, g, p.groups)
        else:
            for grp in range(p.groups):
                self._forward_group(
                    p,
                    x[:, grp * p.cg : (grp + 1) * p.cg],
                    f[grp * p.kg : (grp + 1) * p.kg],
                    y[:, grp * p.kg : (grp + 1) * p.kg],
                )
        if bias is not None:
            y += bias[None, :, None, None]
        finish_epilogue(y, *epilogue)

    @staticmethod
    def _forward_group(p: v.ConvProblem, x: FloatArray, f: FloatArray, y: FloatArray) -> None:
        g = _geometry(p)
        if p.sh == p.sw == 1 and not (p.fh == p.fw == 1 and not _padded(p)):
            conv_s1(x, np.ascontiguousarray(f.transpose(2, 3, 1, 0)), g, y)
            return
        cols = im2col(x, p.fh, p.fw, g)
        np.matmul(f.reshape(f.shape[0], -1), cols, out=y.reshape(p.n, -1, p.oh * p.ow))

    @staticmethod
    def _depthwise_forward(
        p: v.ConvProblem, x: FloatArray, f: FloatArray, y: FloatArray, bias: FloatArray | None
    ) -> bool:
        """The compiled depthwise kernel; False where numba is unusable."""
        compiled = kernels("_kconv")
        if compiled is None:
            return False
        planes_in = x.reshape(p.n * p.c, p.h, p.w)
        taps = f.reshape(p.k, p.fh, p.fw)
        planes_out = y.reshape(p.n * p.k, p.oh, p.ow)
        extra = np.empty(0, dtype=p.dtype) if bias is None else bias
        geometry = np.array([p.sh, p.sw, p.ph, p.pw, p.dh, p.dw], dtype=np.int64)

        def run(start: int, stop: int) -> None:
            compiled.depthwise_planes(planes_in, taps, extra, planes_out[start:stop], start, p.c, geometry)

        per_plane = p.oh * p.ow * p.fh * p.fw
        parallel_ranges(p.n * p.k, run, grain=max(1, PARALLEL_THRESHOLD // max(1, per_plane)))
        return True

    # ------------------------------------------------------------------ gradients

    def _exec_conv2d_backward_data(self, p: v.ConvProblem) -> None:
        gx, f, gy = self._operands(p)
        if fast_backward_data(p, gy, f, gx):
            return
        g = _geometry(p)
        if p.depthwise or _padding_heavy(p):
            backward_data(gy, f, gx, g, p.groups)
            return
        for grp in range(p.groups):
            cs, ks = slice(grp * p.cg, (grp + 1) * p.cg), slice(grp * p.kg, (grp + 1) * p.kg)
            self._data_group(p, gy[:, ks], f[ks], gx[:, cs])

    @staticmethod
    def _data_group(p: v.ConvProblem, gy: FloatArray, f: FloatArray, gx: FloatArray) -> None:
        g = _geometry(p)
        eh, ew = p.dh * (p.fh - 1) + 1, p.dw * (p.fw - 1) + 1
        full = Geometry(eh - 1 - p.ph, ew - 1 - p.pw, eh - 1 - p.pb, ew - 1 - p.pr, 1, 1, p.dh, p.dw)
        if p.sh == p.sw == 1 and min(full[:4]) >= 0 and not (p.fh == p.fw == 1) and _finite(f):
            # Stride 1: the data gradient is the forward convolution of the output gradient,
            # padded by (dilated filter - 1 - pad), with the filter flipped and K and C swapped.
            conv_s1(gy, np.ascontiguousarray(f[:, :, ::-1, ::-1].transpose(2, 3, 0, 1)), full, gx)
            return
        kg = f.shape[0]
        gcols = np.matmul(f.reshape(kg, -1).T, gy.reshape(p.n, kg, -1))
        col2im(gcols.reshape(p.n, f.shape[1], p.fh, p.fw, p.oh, p.ow), gx, g)

    def _exec_conv2d_backward_filter(self, p: v.ConvProblem) -> None:
        x, gf, gy = self._operands(p)
        if fast_backward_filter(p, x, gy, gf):
            return
        g = _geometry(p)
        if p.depthwise or _padding_heavy(p) or (_padded(p) and not _finite(gy)):
            backward_filter(x, gy, gf, g, p.groups)
            return
        for grp in range(p.groups):
            cs, ks = slice(grp * p.cg, (grp + 1) * p.cg), slice(grp * p.kg, (grp + 1) * p.kg)
            self._filter_group(p, x[:, cs], gy[:, ks], gf[ks])

    @staticmethod
    def _filter_group(p: v.ConvProblem, x: FloatArray, gy: FloatArray, gf: FloatArray) -> None:
        g = _geometry(p)
        kg, cg = gf.shape[0], gf.shape[1]
        if p.sh == p.sw == 1 and not (p.fh == p.fw == 1 and not _padded(p)):
            taps = np.empty((p.fh, p.fw, kg, cg), dtype=p.dtype)
            if conv_s1_filter_grad(x, gy, p.fh, p.fw, g, taps):
                gf[...] = taps.transpose(2, 3, 0, 1)
                return
        cols = im2col(x, p.fh, p.fw, g)
        crs, spatial = cols.shape[1], cols.shape[2]
        grad = np.ascontiguousarray(gy).reshape(p.n, kg, spatial)
        # grad_filter (K x CRS, row-major) = sum_n gy[n] @ cols[n]^T; in column-major terms
        # gf^T = cols[n] @ gy[n]^T, accumulated by BLAS with beta = 1 after the first image.
        cols = np.ascontiguousarray(cols)
        target = np.empty((kg, crs), dtype=p.dtype)
        for i in range(p.n):
            gemm_at(
                p.dtype, True, False, crs, kg, spatial, 1.0,
                cols[i].ctypes.data, spatial, grad[i].ctypes.data, spatial,
                0.0 if i == 0 else 1.0, target.ctypes.data, crs,
            )  # fmt: skip
        gf[...] = target.reshape(gf.shape)
