"""Convolution on CUDA (float32 and float64): operands packed by ``kernels/conv.cl``, products by cuBLAS.

Per group g (Cg = C / groups input and Kg = K / groups output channels, CRS = Cg * Fh * Fw,
S = Oh * Ow):

* forward: per image, the group's output (S x Kg, column-major with ld S) is the im2col
  panels of the group's channels (S x CRS) times its filter transposed;
* data gradient: per chunk of images, one strided-batched GEMM per group writes the
  group's column gradients next to the others'; ``col2im`` folds every channel at once;
* filter gradient: per image, the group's im2col panels times the output gradient,
  accumulated by cuBLAS (beta = 1 after the first image).

Depthwise convolutions (one input channel per group) run as direct kernels. Padding is
never multiplied: the packed GEMM multiplies zeros for padding positions, which is exact
unless the filter (forward) or the output gradient (filter gradient) holds a NaN or an
infinity there; a flag computed on the device then makes the direct kernels recompute
the outputs whose window touches the padding, skipping it. Bias is added by a kernel
after the GEMMs. Images go in chunks whose packed panels stay under 256 MiB.
"""

from __future__ import annotations

from ... import validation as v
from ...errors import InvalidArgumentError
from ...memory import Region
from .._common import ceil_div, chunks
from .._conv_args import conv_border, conv_dims
from ._core import I32, I64, CudaCore, Ptr
from ._device import GRID_YZ_MAX, Batch
from ._programs import CONV_LS, KernelSource, conv_unit, real_of

__all__ = ["ConvOps"]

#: Threads per block of the direct convolution kernels.
_BLOCK = 128


def _check_int32(name: str, value: int) -> None:
    if value > v.BLAS_INT_MAX:
        raise InvalidArgumentError(
            f"{name} = {value} exceeds the 32-bit limit of the CUDA kernels and cuBLAS"
        )


class ConvOps(CudaCore):
    """conv2d_forward, conv2d_backward_data and conv2d_backward_filter."""

    def _unit(self, p: v.ConvProblem, vw: int = 8) -> KernelSource:
        return conv_unit(real_of(p.dtype.name), vw)

    def _gemm(
        self, p: v.ConvProblem, tb: bool, shape: tuple[int, int, int], a: tuple[int, int], b: tuple[int, int],
        beta: float, c: tuple[int, int], batch: Batch | None = None,
    ) -> None:  # fmt: skip
        """cuBLAS GEMM of the convolution's dtype with alpha = 1 and A not transposed."""
        self._session.gemm(p.dtype.name, False, tb, shape, 1.0, a, b, beta, c, batch)

    def _panel_gemm(
        self, p: v.ConvProblem, mr: int, rows: int, nk: tuple[int, int], ap: int, b: tuple[int, int],
        beta: float, c: tuple[int, int],
    ) -> None:  # fmt: skip
        """C (rows x n) = Ap @ B where Ap holds ceil(rows / mr) packed mr x k panels.

        Full panels run as one strided-batched GEMM writing straight into C; a partial
        last panel runs as one more GEMM with only its valid rows.
        """
        n, k = nk
        size = p.dtype.itemsize
        full, rest = divmod(rows, mr)
        if full:
            self._gemm(p, False, (mr, n, k), (ap, mr), b, beta, c, Batch(k * mr, 0, mr, full))
        if rest:
            self._gemm(
                p,
                False,
                (rest, n, k),
                (ap + full * k * mr * size, mr),
                b,
                beta,
                (c[0] + full * mr * size, c[1]),
            )

    @staticmethod
    def _direct(p: v.ConvProblem) -> bool:
        """Depthwise convolutions (one input channel per group) run as direct kernels."""
        return p.groups > 1 and p.cg == 1

    def _flags(self, held: list[Region], count: int) -> Region:
        flags = self._scratch_range(count * 4)
        held.append(flags)
        return flags

    # ------------------------------------------------------------------ forward

    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        _check_int32("C * Fh * Fw", p.cg * p.fh * p.fw)
        unit = self._unit(p)
        bias = p.bias.ptr if p.bias is not None else p.y.ptr  # not read without a bias
        count, bounds = conv_border(p)
        with self._scratches() as held:
            flag = self._flags(held, 1)

            def direct(positions: int, border: int) -> None:
                for n0, n1 in chunks(p.n, 0, most=GRID_YZ_MAX):
                    self._launch(
                        unit, "conv_fwd_direct", (ceil_div(positions, _BLOCK), p.k, n1 - n0), (_BLOCK,),
                        Ptr(p.x.ptr), I64(n0 * p.c * p.h * p.w), Ptr(p.f.ptr), I64(0), Ptr(bias), I64(0),
                        I32(p.bias is not None), Ptr(p.y.ptr), I64(n0 * p.k * p.oh * p.ow), I32(p.k),
                        *conv_dims(p), I32(border), *bounds, Ptr(flag.ptr),
                    )  # fmt: skip

            if self._direct(p):
                direct(p.oh * p.ow, 0)
                return
            self._forward_gemm(p, held)
            if p.bias is not None:
                for n0, n1 in chunks(p.n, 0, most=GRID_YZ_MAX):
                    self._launch(
                        unit, "conv_bias", (ceil_div(p.oh * p.ow, _BLOCK), p.k, n1 - n0), (_BLOCK,),
                        Ptr(p.y.ptr), I64(n0 * p.k * p.oh * p.ow), Ptr(p.bias.ptr), I64(0), I32(p.k),
                        I64(p.oh * p.ow),
                    )  # fmt: skip
            if count:  # recompute the border when the filter holds a NaN or an infinity
                self._launch(
                    unit, "nonfinite_rows", (1,), (CONV_LS,),
                    Ptr(p.f.ptr), I64(0), I64(p.k * p.cg * p.fh * p.fw), Ptr(flag.ptr),
                )  # fmt: skip
                direct(count, 1)

    def _forward_gemm(self, p: v.ConvProblem, held: list[Region]) -> None:
        """Per group and image: out_g^T (S x Kg) = cols_g^T (S x CRS) @ filter_g^T (CRS x Kg)."""
        size = p.dtype.itemsize
        crs, spatial, kg = p.cg * p.fh * p.fw, p.oh * p.ow, p.kg
        vw = 64 if spatial >= 128 else 8
        mr = 2 * vw
        panels = ceil_div(spatial, mr)
        ap_stride = panels * mr * crs
        unit = self._unit(p, vw)
        for n0, n1 in chunks(p.n, ap_stride * size, most=GRID_YZ_MAX):
            images = n1 - n0
            ap = self._scratch_range(ap_stride * images * size)
            held.append(ap)
            for g in range(p.groups):
                self._launch(
                    unit, "pack_a_im2col", (ceil_div(crs, 64), panels, images), (64,),
                    Ptr(p.x.ptr), I64(0), I64(n0), *conv_dims(p, g * p.cg), Ptr(ap.ptr), I64(ap_stride),
                )  # fmt: skip
                # The filter of group g, stored Kg x CRS row-major, is filter_g^T column-major (ld CRS).
                filt = (p.f.ptr + g * kg * crs * size, crs)
                for b in range(images):
                    out = p.y.ptr + ((n0 + b) * p.k + g * kg) * spatial * size
                    panel = ap.ptr + b * ap_stride * size
                    self._panel_gemm(p, mr, spatial, (kg, crs), panel, filt, 0.0, (out, spatial))
            self._drop(held, ap)

    def _drop(self, held: list[Region], scratch: Region) -> None:
        """Release ``scratch`` now (the next chunk's pool block may reuse it: same stream)."""
        held.remove(scratch)
        self._drop_scratch(scratch)

    # ------------------------------------------------------------------ data gradient

    def _exec_conv2d_backward_data(self, p: v.ConvProblem) -> None:
        _check_int32("C * Fh * Fw", p.c * p.fh * p.fw)
        unit = self._unit(p)
        if self._direct(p):
            for n0, n1 in chunks(p.n, 0, most=GRID_YZ_MAX):
                self._launch(
                    unit, "conv_bwd_data_direct", (ceil_div(p.h * p.w, _BLOCK), p.c, n1 - n0), (_BLOCK,),
                    Ptr(p.y.ptr), I64(n0 * p.k * p.oh * p.ow), Ptr(p.f.ptr), I64(0),
                    Ptr(p.x.ptr), I64(n0 * p.c * p.h * p.w), I32(p.k), *conv_dims(p),
                )  # fmt: skip
            return
        size = p.dtype.itemsize
        crs, crs_all, spatial, kg = p.cg * p.fh * p.fw, p.c * p.fh * p.fw, p.oh * p.ow, p.kg
        # Column gradients per image: gcols (S x C*Fh*Fw, ld S); group g's columns come from
        # grad_out_g (S x Kg, ld S) @ filter_g (Kg x CRS), one strided-batched GEMM per group.
        with self._scratches() as held:
            for n0, n1 in chunks(p.n, crs_all * spatial * size, most=GRID_YZ_MAX):
                images = n1 - n0
                gcols = self._scratch_range(crs_all * spatial * images * size)
                held.append(gcols)
                for g in range(p.groups):
                    gy = p.y.ptr + (n0 * p.k + g * kg) * spatial * size
                    self._gemm(
                        p, True, (spatial, crs, kg), (gy, spatial), (p.f.ptr + g * kg * crs * size, crs), 0.0,
                        (gcols.ptr + g * crs * spatial * size, spatial),
                        Batch(p.k * spatial, 0, crs_all * spatial, images),
                    )  # fmt: skip
                self._launch(
                    unit, "col2im", (ceil_div(p.h * p.w, 64), p.c, images), (64,),
                    Ptr(gcols.ptr), Ptr(p.x.ptr), I64(0), I64(n0), *conv_dims(p, 0, p.c),
                )  # fmt: skip
                self._drop(held, gcols)

    # ------------------------------------------------------------------ filter gradient

    def _exec_conv2d_backward_filter(self, p: v.ConvProblem) -> None:
        _check_int32("Oh * Ow", p.oh * p.ow)
        unit = self._unit(p)
        count, bounds = conv_border(p)
        elements = p.k * p.cg * p.fh * p.fw
        with self._scratches() as held:
            flags = self._flags(held, p.k)

            def direct(use_flags: int) -> None:  # a block per filter element
                self._launch(
                    unit, "conv_bwd_filter_direct", (elements,), (CONV_LS,),
                    Ptr(p.x.ptr), I64(0), Ptr(p.y.ptr), I64(0), Ptr(p.f.ptr), I64(0),
                    I32(p.n), I32(p.k), *conv_dims(p), Ptr(flags.ptr), I32(use_flags),
                )  # fmt: skip

            if self._direct(p):
                direct(0)
                return
            self._filter_gemm(p, held)
            if count:  # recompute the channels whose border gradient holds a NaN or an infinity
                self._launch(
                    unit, "nonfinite_border", (p.k,), (CONV_LS,),
                    Ptr(p.y.ptr), I64(0), I32(p.n), I32(p.k), I32(p.oh), I32(p.ow), *bounds, Ptr(flags.ptr),
                )  # fmt: skip
                direct(1)

    def _filter_gemm(self, p: v.ConvProblem, held: list[Region]) -> None:
        """Per group: grad_filter_g^T (CRS x Kg, ld CRS) = the sum over images of cols_g (CRS x S)
        @ grad_out_g^T (S x Kg), accumulated by cuBLAS (beta = 1 after the first image)."""
        size = p.dtype.itemsize
        crs, spatial, kg = p.cg * p.fh * p.fw, p.oh * p.ow, p.kg
        vw = 64 if crs >= 128 else 8
        mr = 2 * vw
        panels = ceil_div(crs, mr)
        unit = self._unit(p, vw)
        ap = self._scratch_range(panels * mr * spatial * size)
        held.append(ap)
        for g in range(p.groups):
            out = (p.f.ptr + g * kg * crs * size, crs)
            for b in range(p.n):
                self._launch(
                    unit, "pack_a_cols_t", (ceil_div(spatial, 64), panels), (64,),
                    Ptr(p.x.ptr), I64(0), I64(b), I32(1), *conv_dims(p, g * p.cg), Ptr(ap.ptr),
                )  # fmt: skip
                grad_out = (p.y.ptr + (b * p.k + g * kg) * spatial * size, spatial)
                self._panel_gemm(p, mr, crs, (kg, spatial), ap.ptr, grad_out, 0.0 if b == 0 else 1.0, out)
