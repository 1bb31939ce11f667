"""Convolution on CUDA: operands packed by ``kernels/conv.cl``, products by cuBLAS.

Forward: per image, the output (S x K, column-major with ld S, S = Oh * Ow) is the
im2col panels (S x CRS, CRS = C * Fh * Fw) times the filter transposed. Data gradient:
column gradients per image from one strided-batched GEMM, folded onto the input by
``col2im``. Filter gradient: im2col panels of each image times the output gradient,
accumulated by cuBLAS (beta = 1 after the first image). Images are processed in chunks
whose scratch stays under 256 MiB.
"""

from __future__ import annotations

from typing import Any

from ... import validation as v
from ...dtypes import F32
from ...errors import InvalidArgumentError
from .._common import ceil_div, chunks, refuse_extensions
from ._core import I32, I64, CudaCore, Ptr
from ._device import GRID_YZ_MAX, Batch
from ._programs import conv_unit

__all__ = ["ConvOps"]


def _check_int32(name: str, value: int) -> None:
    if value > v.BLAS_INT_MAX:
        raise InvalidArgumentError(
            f"{name} = {value} exceeds the 32-bit limit of the CUDA kernels and cuBLAS"
        )


def _dims(p: v.ConvProblem) -> tuple[Any, ...]:
    return tuple(I32(x) for x in (p.c, p.h, p.w, p.fh, p.fw, p.oh, p.ow, p.sh, p.sw, p.ph, p.pw))


class ConvOps(CudaCore):
    """conv2d_forward, conv2d_backward_data and conv2d_backward_filter."""

    def _sgemm(
        self, tb: bool, shape: tuple[int, int, int], a: tuple[int, int], b: tuple[int, int], beta: float,
        c: tuple[int, int], batch: Batch | None = None,
    ) -> None:  # fmt: skip
        """Float32 cuBLAS GEMM with alpha = 1 and A not transposed."""
        self._dev.gemm(F32, False, tb, shape, 1.0, a, b, beta, c, batch)

    def _panel_gemm(
        self, mr: int, rows: int, nk: tuple[int, int], ap: int, b: tuple[int, int], tb: bool, beta: float,
        c: tuple[int, int],
    ) -> None:  # fmt: skip
        """C (rows x n) = Ap @ op(B) where Ap holds ceil(rows / mr) packed mr x k panels.

        Full panels run as one strided-batched GEMM writing straight into C; a partial
        last panel runs as one more GEMM with only its valid rows.
        """
        n, k = nk
        full, rest = divmod(rows, mr)
        if full:
            self._sgemm(tb, (mr, n, k), (ap, mr), b, beta, c, Batch(k * mr, 0, mr, full))
        if rest:
            self._sgemm(tb, (rest, n, k), (ap + full * k * mr * 4, mr), b, beta, (c[0] + full * mr * 4, c[1]))

    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        refuse_extensions("cuda", "conv2d_forward", p)
        crs, spatial = p.c * p.fh * p.fw, p.oh * p.ow
        _check_int32("C * Fh * Fw", crs)
        vw = 64 if spatial >= 128 else 8
        mr = 2 * vw
        panels = ceil_div(spatial, mr)
        ap_stride = panels * mr * crs
        unit = conv_unit(vw)
        # Per image: out (S x K, ld S) = im2col^T (S x CRS) @ filter^T (CRS x K); the filter
        # stored K x CRS row-major is exactly filter^T column-major with ld CRS.
        with self._scratches() as held:
            for n0, n1 in chunks(p.n, ap_stride * 4, most=GRID_YZ_MAX):
                images = n1 - n0
                ap = self._scratch_range(ap_stride * images * 4)
                held.append(ap)
                self._launch(
                    unit, "pack_a_im2col", (ceil_div(crs, 64), panels, images), (64,),
                    Ptr(p.x.ptr), I64(0), I64(n0), *_dims(p), Ptr(ap.ptr), I64(ap_stride),
                )  # fmt: skip
                for b in range(images):
                    out = p.y.ptr + (n0 + b) * p.k * spatial * 4
                    panel = ap.ptr + b * ap_stride * 4
                    self._panel_gemm(
                        mr, spatial, (p.k, crs), panel, (p.f.ptr, crs), False, 0.0, (out, spatial)
                    )

    def _exec_conv2d_backward_data(self, p: v.ConvProblem) -> None:
        refuse_extensions("cuda", "conv2d_backward_data", p)
        crs, spatial = p.c * p.fh * p.fw, p.oh * p.ow
        _check_int32("C * Fh * Fw", crs)
        unit = conv_unit(8)
        # Column gradients per image: gcols (S x CRS, ld S) = grad_out (S x K, ld S) @ filter (K x CRS),
        # one strided-batched GEMM per chunk of images; col2im then folds them onto the input.
        with self._scratches() as held:
            for n0, n1 in chunks(p.n, crs * spatial * 4, most=GRID_YZ_MAX):
                images = n1 - n0
                gcols = self._scratch_range(crs * spatial * images * 4)
                held.append(gcols)
                gy = p.y.ptr + n0 * p.k * spatial * 4
                self._sgemm(
                    True, (spatial, crs, p.k), (gy, spatial), (p.f.ptr, crs), 0.0,
                    (gcols.ptr, spatial), Batch(p.k * spatial, 0, crs * spatial, images),
                )  # fmt: skip
                self._launch(
                    unit, "col2im", (ceil_div(p.h * p.w, 64), p.c, images), (64,),
                    Ptr(gcols.ptr), Ptr(p.x.ptr), I64(0), I64(n0), *_dims(p),
                )  # fmt: skip

    def _exec_conv2d_backward_filter(self, p: v.ConvProblem) -> None:
        refuse_extensions("cuda", "conv2d_backward_filter", p)
        crs, spatial = p.c * p.fh * p.fw, p.oh * p.ow
        _check_int32("Oh * Ow", spatial)
        vw = 64 if crs >= 128 else 8
        mr = 2 * vw
        panels = ceil_div(crs, mr)
        unit = conv_unit(vw)
        # grad_filter^T (CRS x K, ld CRS) = sum over images of im2col (CRS x S) @ grad_out^T (S x K),
        # accumulated by cuBLAS with beta = 1 after the first image.
        with self._scratches() as held:
            ap = self._scratch_range(panels * mr * spatial * 4)
            held.append(ap)
            for b in range(p.n):
                self._launch(
                    unit, "pack_a_cols_t", (ceil_div(spatial, 64), panels), (64,),
                    Ptr(p.x.ptr), I64(0), I64(b), I32(1), *_dims(p), Ptr(ap.ptr),
                )  # fmt: skip
                out_b = p.y.ptr + b * p.k * spatial * 4
                beta = 0.0 if b == 0 else 1.0
                self._panel_gemm(
                    mr, crs, (p.k, spatial), ap.ptr, (out_b, spatial), False, beta, (p.f.ptr, crs)
                )
