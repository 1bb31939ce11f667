"""GEMM-based convolution algorithms of the CPU backend (NCHW, one group at a time).

Stride-1 convolutions are per-filter-tap GEMMs on the zero-padded image, with no im2col
buffer. A stride-1 convolution over a zero-padded image is, for each filter tap (r, s),
one GEMM on the padded image shifted by ``r * dh * Wp + s * dw`` pixels: output row
``oh``, column ``ow`` of the "padded-width" output (``Oh * Wp`` positions) reads input
``(oh + r * dh, ow + s * dw)``. The columns ``ow >= Ow`` of each output row wrap into the
next padded row and are discarded. So the only copies are the padding and the output,
and the taps accumulate in BLAS (``beta = 1``). The padded image is stored channels-last
(``[Hp * Wp, C]``) so that the filter is BLAS's small A operand (K x C) and the image
its B operand (C x positions, leading dimension C), the faster shape for OpenBLAS.
Other strides use im2col (:func:`im2col`) and one GEMM per image.

These algorithms multiply padding zeros by filter taps (and by gradients): the caller
uses them only where those operands are finite, so that no ``0 * inf`` or ``0 * NaN``
reaches a result (:mod:`._conv_exact` computes the other cases).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from ._blas import gemm_at
from ._plumbing import FloatArray
from ._runtime import parallel_pull, parallel_ranges, single_threaded_blas

__all__ = ["Geometry", "col2im", "conv_s1", "conv_s1_filter_grad", "im2col", "padded"]


class Geometry(NamedTuple):
    """Where filter taps land: padding (top, left, bottom, right), strides and dilations."""

    pt: int
    pl: int
    pb: int
    pr: int
    sh: int = 1
    sw: int = 1
    dh: int = 1
    dw: int = 1

    def output(self, h: int, w: int, fh: int, fw: int) -> tuple[int, int]:
        """Output height and width for an ``h x w`` image and an ``fh x fw`` filter."""
        eh, ew = self.dh * (fh - 1) + 1, self.dw * (fw - 1) + 1
        return (h + self.pt + self.pb - eh) // self.sh + 1, (w + self.pl + self.pr - ew) // self.sw + 1


def padded(x: FloatArray, g: Geometry) -> FloatArray:
    """``x`` [N, C, H, W] with the geometry's zero rows and columns around it."""
    if not (g.pt or g.pl or g.pb or g.pr):
        return x
    n, c, h, w = x.shape
    out = np.zeros((n, c, h + g.pt + g.pb, w + g.pl + g.pr), dtype=x.dtype)
    out[:, :, g.pt : g.pt + h, g.pl : g.pl + w] = x
    return out


def _windows(image: FloatArray, g: Geometry, r: int, s: int, oh: int, ow: int) -> FloatArray:
    """The positions of the padded ``image`` that filter tap (r, s) reads, [N, C, Oh, Ow]."""
    i0, j0 = r * g.dh, s * g.dw
    return image[:, :, i0 : i0 + g.sh * (oh - 1) + 1 : g.sh, j0 : j0 + g.sw * (ow - 1) + 1 : g.sw]


def im2col(x: FloatArray, fh: int, fw: int, g: Geometry) -> FloatArray:
    """Columns [N, C*Fh*Fw, Oh*Ow] such that ``output[n] = filter @ columns[n]``."""
    n, c, h, w = x.shape
    oh, ow = g.output(h, w, fh, fw)
    if fh == fw == 1 and g == Geometry(0, 0, 0, 0):
        return np.ascontiguousarray(x).reshape(n, c, h * w)
    image = padded(x, g)
    cols = np.empty((n, c, fh, fw, oh, ow), dtype=x.dtype)

    def fill(start: int, stop: int) -> None:
        for r in range(fh):
            for s in range(fw):
                cols[start:stop, :, r, s] = _windows(image[start:stop], g, r, s, oh, ow)

    parallel_ranges(n, fill, grain=1)
    return cols.reshape(n, c * fh * fw, oh * ow)


def col2im(gcols: FloatArray, out: FloatArray, g: Geometry) -> None:
    """``out`` [N, C, H, W] = the sum of columns [N, C, Fh, Fw, Oh, Ow] at the positions they read.

    Columns that land in the padding are dropped.
    """
    n, c, h, w = out.shape
    fh, fw, oh, ow = gcols.shape[2:]
    image = np.zeros((n, c, h + g.pt + g.pb, w + g.pl + g.pr), dtype=out.dtype)

    def accumulate(start: int, stop: int) -> None:
        for r in range(fh):
            for s in range(fw):
                _windows(image[start:stop], g, r, s, oh, ow)[...] += gcols[start:stop, :, r, s]

    parallel_ranges(n, accumulate, grain=1)
    out[...] = image[:, :, g.pt : g.pt + h, g.pl : g.pl + w]


def _pad_channels_last(image: FloatArray, g: Geometry, buffer: FloatArray) -> None:
    """Write ``image`` [C, H, W] into the interior of ``buffer`` ([Hp * Wp + spare, C], zero borders)."""
    c, h, w = image.shape
    wp = w + g.pl + g.pr
    body = buffer[: (h + g.pt + g.pb) * wp].reshape(h + g.pt + g.pb, wp, c)
    body[g.pt : g.pt + h, g.pl : g.pl + w] = image.transpose(1, 2, 0)


def conv_s1(images: FloatArray, taps: FloatArray, g: Geometry, out: FloatArray) -> None:
    """Stride-1 convolution of ``images`` [N, Cin, H, W] with ``taps`` [Fh, Fw, Cin, Kout].

    ``out`` is [N, Kout, Oh, Ow] (a view is fine); images are split across the worker
    threads, each running single-threaded BLAS (one image alone uses threaded BLAS).
    """
    n, cin, h, w = images.shape
    fh, fw, kout = taps.shape[0], taps.shape[1], taps.shape[3]
    hp, wp = h + g.pt + g.pb, w + g.pl + g.pr
    oh, ow = out.shape[2], out.shape[3]
    span, spare = oh * wp, (fw - 1) * g.dw + 1
    dtype: Any = images.dtype
    size = dtype.itemsize

    def run(items: Iterator[int]) -> None:
        # Channels-last padded image with spare pixels for the last taps' overrun; the
        # borders stay zero, only the interior is rewritten per image.
        image = np.zeros((hp * wp + spare, cin), dtype=dtype)
        wide = np.empty((span, kout), dtype=dtype)
        base = image.ctypes.data
        for i in items:
            _pad_channels_last(images[i], g, image)
            first = True
            for r in range(fh):
                for s in range(fw):
                    # wide (col-major Kout x span) (+)= tap (Kout x Cin) @ shifted (Cin x span).
                    shift = r * g.dh * wp + s * g.dw
                    gemm_at(
                        dtype, False, False, kout, span, cin, 1.0,
                        taps[r, s].ctypes.data, kout, base + size * cin * shift, max(1, cin),
                        0.0 if first else 1.0, wide.ctypes.data, kout,
                    )  # fmt: skip
                    first = False
            out[i] = wide.reshape(oh, wp, kout)[:, :ow, :].transpose(2, 0, 1)

    if n >= 2:
        with single_threaded_blas():
            parallel_pull(n, run)
    else:
        run(iter(range(n)))


def conv_s1_filter_grad(
    images: FloatArray, grad: FloatArray, fh: int, fw: int, g: Geometry, out: FloatArray
) -> bool:
    """Filter gradient of a stride-1 convolution; ``out`` is [Fh, Fw, K, C] (row-major).

    ``images`` [N, C, H, W], ``grad`` [N, K, Oh, Ow]. For tap (r, s):
    ``out[r, s] = sum_n grad'[n] @ shifted[n]^T`` where ``grad'`` is the gradient spread
    to the padded width with zeros in the wrapped columns. Those zeros multiply real
    input values, which is exact only when they are finite: returns False (leaving
    ``out`` unspecified) when an image holds inf or NaN, so the caller can take another
    route.
    """
    n, c, h, w = images.shape
    k, oh, ow = grad.shape[1], grad.shape[2], grad.shape[3]
    hp, wp = h + g.pt + g.pb, w + g.pl + g.pr
    span, spare = oh * wp, (fw - 1) * g.dw + 1
    dtype: Any = images.dtype
    size = dtype.itemsize
    partials: list[FloatArray] = []
    finite = [True]
    lock = threading.Lock()

    def run(items: Iterator[int]) -> None:
        image = np.zeros((c, hp * wp + spare), dtype=dtype)
        planes = image[:, : hp * wp].reshape(c, hp, wp)
        wide = np.zeros((k, oh, wp), dtype=dtype)
        acc = np.zeros((fh, fw, k, c), dtype=dtype)
        with lock:
            partials.append(acc)
        for i in items:
            planes[:, g.pt : g.pt + h, g.pl : g.pl + w] = images[i]
            if not np.isfinite(images[i]).all():
                finite[0] = False
                return
            wide[:, :, :ow] = grad[i]
            base = image.ctypes.data
            for r in range(fh):
                for s in range(fw):
                    # acc[r, s]^T [C x K] += shifted [C x span] @ wide^T [span x K], column-major.
                    shift = r * g.dh * wp + s * g.dw
                    gemm_at(
                        dtype, True, False, c, k, span, 1.0,
                        base + size * shift, hp * wp + spare, wide.ctypes.data, span,
                        1.0, acc[r, s].ctypes.data, c,
                    )  # fmt: skip

    if n >= 2:
        with single_threaded_blas():
            parallel_pull(n, run)
    else:
        run(iter(range(n)))
    if not finite[0]:
        return False
    np.sum(partials, axis=0, out=out)
    return True
