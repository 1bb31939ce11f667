"""2-D convolution on OpenCL as implicit GEMM: operands packed straight into the GEMM
engine's panel layout (no im2col matrix), column gradients folded back for the data
gradient, images processed in chunks whose packed panels fit a scratch budget.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import validation as v
from ...dtypes import F32
from .._common import ceil_div, chunks, refuse_extensions
from ._gemm import GEMM_TILE, GemmOps
from ._runtime import Operand

__all__ = ["ConvOps"]

I32 = np.int32
I64 = np.int64

#: Upper bound for the packed-operand scratch of one convolution chunk, in bytes.
CONV_SCRATCH = 64 << 20


class ConvOps(GemmOps):
    """conv2d_forward and both gradients."""

    def _conv_kernel(self, name: str) -> Any:
        vw, nr = GEMM_TILE[F32]
        return self._kernel("conv.cl", name, F32, VW=vw, NR=nr)

    @staticmethod
    def _conv_dims(p: v.ConvProblem) -> tuple[Any, ...]:
        return (I32(p.c), I32(p.h), I32(p.w), I32(p.fh), I32(p.fw), I32(p.oh), I32(p.ow),
                I32(p.sh), I32(p.sw), I32(p.ph), I32(p.pw))  # fmt: skip

    @staticmethod
    def _image_chunks(total: int, per_item_bytes: int) -> Any:
        return chunks(total, per_item_bytes, budget=CONV_SCRATCH)

    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        refuse_extensions("opencl", "conv2d_forward", p)
        vw, nr = GEMM_TILE[F32]
        mr = 2 * vw
        crs, spatial = p.c * p.fh * p.fw, p.oh * p.ow
        x, f, y = self._at(p.x), self._at(p.f), self._at(p.y)
        # Column-major view per image: out^T (S x K) = cols^T (S x CRS) @ filter^T (CRS x K).
        a_panels, b_panels = ceil_div(spatial, mr), ceil_div(p.k, nr)
        ap_stride, bp_stride = a_panels * mr * crs, b_panels * nr * crs
        with self._lock:
            bp = self._scratch_buffer("bp", bp_stride * 4)
            gk = self._gemm_kernels(F32)
            self._launch(
                gk["pack_b"], (crs, b_panels, 1), None,
                f.buffer, I64(f.offset), I64(0), I32(crs), I32(0), I32(crs), I32(p.k), bp, I64(0), I32(0),
            )  # fmt: skip
            pack = self._conv_kernel("pack_a_im2col")
            for n0, n1 in self._image_chunks(p.n, ap_stride * 4):
                images = n1 - n0
                ap = self._scratch_buffer("ap", ap_stride * images * 4)
                self._launch(
                    pack, (crs, a_panels, images), None,
                    x.buffer, I64(x.offset), I64(n0), *self._conv_dims(p), ap, I64(ap_stride),
                )  # fmt: skip
                out = Operand(y.buffer, y.offset + n0 * p.k * spatial)
                self._panels(
                    F32, (spatial, p.k, crs), 1.0, 0.0, images, (ap, ap_stride), (bp, 0),
                    out, p.k * spatial, spatial,
                )  # fmt: skip

    def _exec_conv2d_backward_data(self, p: v.ConvProblem) -> None:
        refuse_extensions("opencl", "conv2d_backward_data", p)
        vw, nr = GEMM_TILE[F32]
        mr = 2 * vw
        crs, spatial = p.c * p.fh * p.fw, p.oh * p.ow
        gy, f, gx = self._at(p.y), self._at(p.f), self._at(p.x)
        # Column gradients per image: gcols^T (S x CRS) = grad_out^T (S x K) @ filter (K x CRS).
        a_panels, b_panels = ceil_div(spatial, mr), ceil_div(crs, nr)
        ap_stride, bp_stride = a_panels * mr * p.k, b_panels * nr * p.k
        with self._lock:
            gk = self._gemm_kernels(F32)
            bp = self._scratch_buffer("bp", bp_stride * 4)
            self._launch(
                gk["pack_b"], (p.k, b_panels, 1), None,
                f.buffer, I64(f.offset), I64(0), I32(crs), I32(1), I32(p.k), I32(crs), bp, I64(0), I32(0),
            )  # fmt: skip
            fold = self._conv_kernel("col2im")
            per_image = (ap_stride + crs * spatial) * 4
            for n0, n1 in self._image_chunks(p.n, per_image):
                images = n1 - n0
                ap = self._scratch_buffer("ap", ap_stride * images * 4)
                gcols = self._scratch_buffer("cols", crs * spatial * images * 4)
                self._launch(
                    gk["pack_a"], (p.k, a_panels, images), None,
                    gy.buffer, I64(gy.offset + n0 * p.k * spatial), I64(p.k * spatial), I32(spatial), I32(0),
                    I32(spatial), I32(p.k), ap, I64(ap_stride), I32(0),
                )  # fmt: skip
                self._panels(
                    F32, (spatial, crs, p.k), 1.0, 0.0, images, (ap, ap_stride), (bp, 0),
                    Operand(gcols, 0), crs * spatial, spatial,
                )  # fmt: skip
                self._launch(
                    fold, (p.h * p.w, p.c, images), None,
                    gcols, gx.buffer, I64(gx.offset), I64(n0), *self._conv_dims(p),
                )  # fmt: skip

    def _exec_conv2d_backward_filter(self, p: v.ConvProblem) -> None:
        refuse_extensions("opencl", "conv2d_backward_filter", p)
        vw, nr = GEMM_TILE[F32]
        mr = 2 * vw
        crs, spatial = p.c * p.fh * p.fw, p.oh * p.ow
        x, gy, gf = self._at(p.x), self._at(p.y), self._at(p.f)
        # grad_filter^T (CRS x K) = sum over images of cols (CRS x S) @ grad_out^T (S x K):
        # one GEMM with k = images * S per chunk, accumulated with beta = 1 across chunks.
        a_panels, b_panels = ceil_div(crs, mr), ceil_div(p.k, nr)
        per_image = (a_panels * mr + b_panels * nr) * spatial * 4
        with self._lock:
            pack_a = self._conv_kernel("pack_a_cols_t")
            pack_b = self._conv_kernel("pack_b_grad_out")
            for n0, n1 in self._image_chunks(p.n, per_image):
                images = n1 - n0
                kk = images * spatial
                ap = self._scratch_buffer("ap", a_panels * mr * kk * 4)
                bp = self._scratch_buffer("bp", b_panels * nr * kk * 4)
                self._launch(
                    pack_a, (kk, a_panels), None,
                    x.buffer, I64(x.offset), I64(n0), I32(images), *self._conv_dims(p), ap,
                )  # fmt: skip
                self._launch(
                    pack_b, (kk, b_panels), None,
                    gy.buffer, I64(gy.offset), I64(n0), I32(images), I32(p.k), I32(p.oh), I32(p.ow), bp,
                )  # fmt: skip
                beta = 0.0 if n0 == 0 else 1.0
                self._panels(F32, (crs, p.k, kk), 1.0, beta, 1, (ap, 0), (bp, 0), gf, 0, crs)
