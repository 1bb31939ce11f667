"""2-D convolution on OpenCL (``kernels/conv.cl``), float32 and float64.

Convolutions run as implicit GEMM, one group at a time: operands are packed straight into
the GEMM engine's panel layout (no im2col matrix), column gradients are folded back for the
data gradient, and images go in chunks whose packed panels fit a scratch budget.
Depthwise convolutions (one input channel per group) run as direct kernels instead.

Padding is never multiplied. The packed GEMM multiplies zeros for padding positions, which
is exact unless the filter (forward) or the output gradient (filter gradient) holds a NaN or
an infinity there; a device-side flag then makes direct kernels recompute the outputs whose
window touches the padding, skipping it. col2im only folds (tap, position) pairs that
exist, so the data gradient is exact as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import validation as v
from .._common import ceil_div, chunks
from .._conv_args import conv_border, conv_dims
from ._gemm import GEMM_TILE, GemmOps
from ._runtime import Operand

__all__ = ["ConvOps"]

I32 = np.int32
I64 = np.int64

#: Upper bound for the packed-operand scratch of one convolution chunk, in bytes.
CONV_SCRATCH = 64 << 20


class ConvOps(GemmOps):
    """conv2d_forward and both gradients, with groups, dilation, four-sided padding and bias."""

    def _conv_kernel(self, name: str, dtype: np.dtype[Any]) -> Any:
        vw, nr = GEMM_TILE[dtype]
        return self._kernel("conv.cl", name, dtype, VW=vw, NR=nr, LS=self._pow2_group(64))

    @staticmethod
    def _direct(p: v.ConvProblem) -> bool:
        """Depthwise convolutions (one input channel per group) run as direct kernels."""
        return p.groups > 1 and p.cg == 1

    def _image_chunks(self, total: int, per_item_bytes: int) -> Any:
        return chunks(total, per_item_bytes, budget=CONV_SCRATCH)

    def _flags(self, count: int) -> Any:
        return self._scratch_buffer("conv_flags", count * 4)

    # ------------------------------------------------------------------ forward

    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        size = p.dtype.itemsize
        x, f, y = self._at(p.x, size), self._at(p.f, size), self._at(p.y, size)
        bias = self._at(p.bias, size) if p.bias is not None else Operand(None, 0)
        count, bounds = conv_border(p)
        with self._lock:
            direct = self._conv_kernel("conv_fwd_direct", p.dtype)
            head = (x.buffer, I64(x.offset), f.buffer, I64(f.offset), bias.buffer, I64(bias.offset),
                    I32(p.bias is not None), y.buffer, I64(y.offset), I32(p.k), *conv_dims(p))  # fmt: skip
            if self._direct(p):
                flag = self._flags(1)
                self._launch(direct, (p.oh * p.ow, p.k, p.n), (16, 1, 1), *head, I32(0), *bounds, flag)
                return
            self._forward_gemm(p, x, f, y)
            if p.bias is not None:
                self._launch(
                    self._conv_kernel("conv_bias", p.dtype), (p.oh * p.ow, p.k, p.n), (16, 1, 1),
                    y.buffer, I64(y.offset), bias.buffer, I64(bias.offset), I32(p.k), I64(p.oh * p.ow),
                )  # fmt: skip
            if count:  # recompute the border if the filter holds a NaN or an infinity
                flag = self._flags(1)
                ls = self._pow2_group(64)
                self._launch(
                    self._conv_kernel("nonfinite_rows", p.dtype), (ls,), (ls,),
                    f.buffer, I64(f.offset), I64(p.k * p.cg * p.fh * p.fw), flag,
                )  # fmt: skip
                self._launch(direct, (count, p.k, p.n), (16, 1, 1), *head, I32(1), *bounds, flag)

    def _forward_gemm(self, p: v.ConvProblem, x: Operand, f: Operand, y: Operand) -> None:
        """Per group and chunk of images: out^T (S x Kg) = cols^T (S x CRSg) @ filter_g^T (CRSg x Kg)."""
        size = p.dtype.itemsize
        vw, nr = GEMM_TILE[p.dtype]
        mr = 2 * vw
        crs, spatial, kg = p.cg * p.fh * p.fw, p.oh * p.ow, p.kg
        a_panels, b_panels = ceil_div(spatial, mr), ceil_div(kg, nr)
        ap_stride, bp_stride = a_panels * mr * crs, b_panels * nr * crs
        gk = self._gemm_kernels(p.dtype)
        pack = self._conv_kernel("pack_a_im2col", p.dtype)
        for g in range(p.groups):
            bp = self._scratch_buffer("bp", bp_stride * size)
            self._launch(
                gk["pack_b"], (crs, b_panels, 1), None,
                f.buffer, I64(f.offset + g * kg * crs), I64(0), I32(crs), I32(0), I32(crs), I32(kg),
                bp, I64(0), I32(0),
            )  # fmt: skip
            for n0, n1 in self._image_chunks(p.n, ap_stride * size):
                images = n1 - n0
                ap = self._scratch_buffer("ap", ap_stride * images * size)
                self._launch(
                    pack, (crs, a_panels, images), None,
                    x.buffer, I64(x.offset), I64(n0), *conv_dims(p, g * p.cg), ap, I64(ap_stride),
                )  # fmt: skip
                out = Operand(y.buffer, y.offset + (n0 * p.k + g * kg) * spatial)
                self._panels(
                    p.dtype, (spatial, kg, crs), 1.0, 0.0, images, (ap, ap_stride), (bp, 0),
                    out, p.k * spatial, spatial,
                )  # fmt: skip

    # ------------------------------------------------------------------ data gradient

    def _exec_conv2d_backward_data(self, p: v.ConvProblem) -> None:
        size = p.dtype.itemsize
        gy, f, gx = self._at(p.y, size), self._at(p.f, size), self._at(p.x, size)
        with self._lock:
            if self._direct(p):
                self._launch(
                    self._conv_kernel("conv_bwd_data_direct", p.dtype), (p.h * p.w, p.c, p.n), (16, 1, 1),
                    gy.buffer, I64(gy.offset), f.buffer, I64(f.offset), gx.buffer, I64(gx.offset), I32(p.k),
                    *conv_dims(p),
                )  # fmt: skip
                return
            self._data_gemm(p, gy, f, gx)

    def _data_gemm(self, p: v.ConvProblem, gy: Operand, f: Operand, gx: Operand) -> None:
        """Per chunk of images and group: gcols^T (S x CRSg) = grad_out_g^T (S x Kg) @ filter_g
        (Kg x CRSg), into the group's columns; then col2im folds every channel at once."""
        size = p.dtype.itemsize
        vw, nr = GEMM_TILE[p.dtype]
        mr = 2 * vw
        crs, spatial, kg = p.cg * p.fh * p.fw, p.oh * p.ow, p.kg
        crs_all = p.c * p.fh * p.fw
        a_panels, b_panels = ceil_div(spatial, mr), ceil_div(crs, nr)
        ap_stride, bp_stride = a_panels * mr * kg, b_panels * nr * kg
        gk = self._gemm_kernels(p.dtype)
        fold = self._conv_kernel("col2im", p.dtype)
        for n0, n1 in self._image_chunks(p.n, (ap_stride + crs_all * spatial) * size):
            images = n1 - n0
            gcols = self._scratch_buffer("cols", crs_all * spatial * images * size)
            for g in range(p.groups):
                bp = self._scratch_buffer("bp", bp_stride * size)
                ap = self._scratch_buffer("ap", ap_stride * images * size)
                self._launch(
                    gk["pack_b"], (kg, b_panels, 1), None,
                    f.buffer, I64(f.offset + g * kg * crs), I64(0), I32(crs), I32(1), I32(kg), I32(crs),
                    bp, I64(0), I32(0),
                )  # fmt: skip
                self._launch(
                    gk["pack_a"], (kg, a_panels, images), None,
                    gy.buffer, I64(gy.offset + (n0 * p.k + g * kg) * spatial), I64(p.k * spatial),
                    I32(spatial), I32(0), I32(spatial), I32(kg), ap, I64(ap_stride), I32(0),
                )  # fmt: skip
                self._panels(
                    p.dtype, (spatial, crs, kg), 1.0, 0.0, images, (ap, ap_stride), (bp, 0),
                    Operand(gcols, g * crs * spatial), crs_all * spatial, spatial,
                )  # fmt: skip
            self._launch(
                fold, (p.h * p.w, p.c, images), None,
                gcols, gx.buffer, I64(gx.offset), I64(n0), *conv_dims(p, 0, p.c),
            )  # fmt: skip

    # ------------------------------------------------------------------ filter gradient

    def _exec_conv2d_backward_filter(self, p: v.ConvProblem) -> None:
        size = p.dtype.itemsize
        x, gy, gf = self._at(p.x, size), self._at(p.y, size), self._at(p.f, size)
        count, bounds = conv_border(p)
        ls = self._pow2_group(64)
        elements = p.k * p.cg * p.fh * p.fw
        with self._lock:
            direct = self._conv_kernel("conv_bwd_filter_direct", p.dtype)
            args = (x.buffer, I64(x.offset), gy.buffer, I64(gy.offset), gf.buffer, I64(gf.offset),
                    I32(p.n), I32(p.k), *conv_dims(p))  # fmt: skip
            flags = self._flags(p.k)
            if self._direct(p):
                self._launch(direct, (elements * ls,), (ls,), *args, flags, I32(0))
                return
            self._filter_gemm(p, x, gy, gf)
            if count:  # recompute the channels whose border gradient holds a NaN or an infinity
                self._launch(
                    self._conv_kernel("nonfinite_border", p.dtype), (p.k * ls,), (ls,),
                    gy.buffer, I64(gy.offset), I32(p.n), I32(p.k), I32(p.oh), I32(p.ow), *bounds, flags,
                )  # fmt: skip
                self._launch(direct, (elements * ls,), (ls,), *args, flags, I32(1))

    def _filter_gemm(self, p: v.ConvProblem, x: Operand, gy: Operand, gf: Operand) -> None:
        """Per group: grad_filter_g^T (CRSg x Kg) = the sum over images of cols_g (CRSg x S) @
        grad_out_g^T (S x Kg): one GEMM with k = images * S per chunk, accumulated (beta = 1)."""
        size = p.dtype.itemsize
        vw, nr = GEMM_TILE[p.dtype]
        mr = 2 * vw
        crs, spatial, kg = p.cg * p.fh * p.fw, p.oh * p.ow, p.kg
        a_panels, b_panels = ceil_div(crs, mr), ceil_div(kg, nr)
        pack_a = self._conv_kernel("pack_a_cols_t", p.dtype)
        pack_b = self._conv_kernel("pack_b_grad_out", p.dtype)
        per_image = (a_panels * mr + b_panels * nr) * spatial * size
        for g in range(p.groups):
            for n0, n1 in self._image_chunks(p.n, per_image):
                images = n1 - n0
                kk = images * spatial
                ap = self._scratch_buffer("ap", a_panels * mr * kk * size)
                bp = self._scratch_buffer("bp", b_panels * nr * kk * size)
                self._launch(
                    pack_a, (kk, a_panels), None,
                    x.buffer, I64(x.offset), I64(n0), I32(images), *conv_dims(p, g * p.cg), ap,
                )  # fmt: skip
                self._launch(
                    pack_b, (kk, b_panels), None,
                    gy.buffer, I64(gy.offset), I64(n0), I32(images), I32(g * kg), I32(kg), I32(p.k),
                    I32(p.oh), I32(p.ow), bp,
                )  # fmt: skip
                out = Operand(gf.buffer, gf.offset + g * kg * crs)
                beta = 0.0 if n0 == 0 else 1.0
                self._panels(p.dtype, (crs, kg, kk), 1.0, beta, 1, (ap, 0), (bp, 0), out, 0, crs)
