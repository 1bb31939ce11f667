"""Convolution algorithms of the CPU backend (NCHW images, any float dtype BLAS takes).

Stride-1 convolutions are per-filter-tap GEMMs on the zero-padded image, with no im2col
buffer. A stride-1 convolution over a zero-padded image is, for each filter tap (r, s),
one GEMM on the padded image shifted by ``r * Wp + s`` pixels: output row ``oh``,
column ``ow`` of the "padded-width" output (``Oh * Wp`` positions) reads input
``(oh + r, ow + s)``. The columns ``ow >= Ow`` of each output row wrap into the next
padded row and are discarded. So the only copies are the padding and the output, and
the taps accumulate in BLAS (``beta = 1``). The padded image is stored channels-last
(``[Hp * Wp, C]``) so that the filter is BLAS's small A operand (K x C) and the image
its B operand (C x positions, leading dimension C), the faster shape for OpenBLAS.

Other strides use im2col (:func:`im2col`) and one GEMM per image.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ... import validation as v
from ._blas import gemm_at
from ._plumbing import FloatArray
from ._runtime import parallel_pull, parallel_ranges, single_threaded_blas

__all__ = ["conv_s1", "conv_s1_filter_grad", "im2col", "padded", "windows"]


def padded(x: FloatArray, ph: int, pw: int) -> FloatArray:
    """``x`` [N, C, H, W] with ``ph`` / ``pw`` zero rows / columns on each side."""
    if ph == 0 and pw == 0:
        return x
    n, c, h, w = x.shape
    out = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=x.dtype)
    out[:, :, ph : ph + h, pw : pw + w] = x
    return out


def windows(p: v.ConvProblem, image: FloatArray, r: int, s: int) -> FloatArray:
    """The positions of the padded ``image`` that filter tap (r, s) reads, shape [N, C, Oh, Ow]."""
    return image[:, :, r : r + p.sh * (p.oh - 1) + 1 : p.sh, s : s + p.sw * (p.ow - 1) + 1 : p.sw]


def im2col(p: v.ConvProblem, x: FloatArray) -> FloatArray:
    """Columns [N, C*Fh*Fw, Oh*Ow] such that ``output[n] = filter @ columns[n]``."""
    if p.fh == p.fw == p.sh == p.sw == 1 and p.ph == p.pw == 0:
        return x.reshape(p.n, p.c, p.h * p.w)
    image = padded(x, p.ph, p.pw)
    cols = np.empty((p.n, p.c, p.fh, p.fw, p.oh, p.ow), dtype=x.dtype)

    def fill(start: int, stop: int) -> None:
        for r in range(p.fh):
            for s in range(p.fw):
                cols[start:stop, :, r, s] = windows(p, image[start:stop], r, s)

    parallel_ranges(p.n, fill, grain=1)
    return cols.reshape(p.n, p.c * p.fh * p.fw, p.oh * p.ow)


def _pad_flat(image: FloatArray, ph: int, pw: int, fw: int, buffer: FloatArray) -> FloatArray:
    """Write ``image`` [C, H, W] zero-padded into ``buffer`` (flat, [C, Hp, Wp] + fw spare)."""
    c, h, w = image.shape
    hp, wp = h + 2 * ph, w + 2 * pw
    body = buffer[: c * hp * wp].reshape(c, hp, wp)
    if ph:
        body[:, :ph] = 0
        body[:, ph + h :] = 0
    if pw:
        body[:, ph : ph + h, :pw] = 0
        body[:, ph : ph + h, pw + w :] = 0
    body[:, ph : ph + h, pw : pw + w] = image
    buffer[c * hp * wp :] = 0
    return buffer


def conv_s1(images: FloatArray, taps: FloatArray, ph: int, pw: int, out: FloatArray) -> None:
    """Stride-1 convolution of ``images`` [N, Cin, H, W] with ``taps`` [Fh, Fw, Cin, Kout].

    ``out`` is [N, Kout, Oh, Ow]; images are split across the worker threads, each
    running single-threaded BLAS (one image alone uses the threaded BLAS instead).
    """
    n, cin, h, w = images.shape
    fh, fw, kout = taps.shape[0], taps.shape[1], taps.shape[3]
    hp, wp = h + 2 * ph, w + 2 * pw
    oh, ow = out.shape[2], out.shape[3]
    span = oh * wp
    dtype: Any = images.dtype
    size = dtype.itemsize

    def run(items: Iterator[int]) -> None:
        # Channels-last padded image with fw spare pixels for the last taps' overrun;
        # the borders stay zero, only the interior is rewritten per image.
        image = np.zeros((hp * wp + fw, cin), dtype=dtype)
        interior = image[: hp * wp].reshape(hp, wp, cin)[ph : ph + h, pw : pw + w]
        wide = np.empty((span, kout), dtype=dtype)
        base = image.ctypes.data
        for i in items:
            interior[...] = images[i].transpose(1, 2, 0)
            first = True
            for r in range(fh):
                for s in range(fw):
                    # wide (col-major Kout x span) (+)= tap (Kout x Cin) @ shifted (Cin x span).
                    gemm_at(
                        dtype, False, False, kout, span, cin, 1.0,
                        taps[r, s].ctypes.data, kout, base + size * cin * (r * wp + s), cin,
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
    images: FloatArray, grad: FloatArray, fh: int, fw: int, ph: int, pw: int, out: FloatArray
) -> bool:
    """Filter gradient of a stride-1 convolution; ``out`` is [Fh, Fw, K, C] (row-major).

    ``images`` [N, C, H, W], ``grad`` [N, K, Oh, Ow]. For tap (r, s):
    ``out[r, s] = sum_n grad'[n] @ shifted[n]^T`` where ``grad'`` is the gradient spread
    to the padded width with zeros in the wrapped columns. Those zeros multiply real
    input values, which is exact only when they are finite: returns False (leaving
    ``out`` unspecified) when an image holds inf or NaN, so the caller can take the
    exact im2col route.
    """
    n, c, h, w = images.shape
    k, oh, ow = grad.shape[1], grad.shape[2], grad.shape[3]
    hp, wp = h + 2 * ph, w + 2 * pw
    span = oh * wp
    dtype: Any = images.dtype
    size = dtype.itemsize
    partials: list[FloatArray] = []
    finite = [True]
    lock = threading.Lock()

    def run(items: Iterator[int]) -> None:
        image = np.empty(c * hp * wp + fw, dtype=dtype)
        wide = np.zeros((k, oh, wp), dtype=dtype)
        acc = np.zeros((fh, fw, k, c), dtype=dtype)
        with lock:
            partials.append(acc)
        for i in items:
            _pad_flat(images[i], ph, pw, fw, image)
            if not np.isfinite(image).all():
                finite[0] = False
                return
            wide[:, :, :ow] = grad[i]
            base = image.ctypes.data
            for r in range(fh):
                for s in range(fw):
                    # acc[r, s]^T [C x K] += shifted [C x span] @ wide^T [span x K], column-major.
                    gemm_at(
                        dtype, True, False, c, k, span, 1.0,
                        base + size * (r * wp + s), hp * wp, wide.ctypes.data, span,
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
