"""Convolution by filter tap over the output rectangle each tap reaches (exact, no padding).

For tap (r, s) the outputs whose input position lies inside the image form a rectangle,
and the input positions they read form a strided window of the same size. Summing tap
by tap over those rectangles never multiplies padding, so a NaN or infinity in a filter
tap or a gradient reaches exactly the results the contract says, and memory stays
proportional to the operands whatever the padding. Dense groups multiply each tap's
``K x C`` matrix with its window (BLAS); depthwise convolutions (one input channel per
group) scale windows channel by channel, all channels in one NumPy call per tap.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from ._conv_algorithms import Geometry
from ._plumbing import FloatArray
from ._pool import tap_outputs
from ._runtime import parallel_ranges

__all__ = ["Tap", "taps", "forward", "backward_data", "backward_filter"]


class Tap(NamedTuple):
    """Filter tap (r, s), the output rectangle it reaches, and the input window it reads."""

    r: int
    s: int
    out_rows: slice
    out_cols: slice
    in_rows: slice
    in_cols: slice


def taps(g: Geometry, fh: int, fw: int, h: int, w: int, oh: int, ow: int) -> Iterator[Tap]:
    """Every tap that reaches at least one output, with its rectangle and window."""
    for r in range(fh):
        i0, i1 = tap_outputs(r, g.sh, g.pt, g.dh, oh, h)
        if i0 >= i1:
            continue
        first_row = i0 * g.sh - g.pt + r * g.dh
        in_rows = slice(first_row, first_row + (i1 - i0 - 1) * g.sh + 1, g.sh)
        for s in range(fw):
            j0, j1 = tap_outputs(s, g.sw, g.pl, g.dw, ow, w)
            if j0 >= j1:
                continue
            first_col = j0 * g.sw - g.pl + s * g.dw
            in_cols = slice(first_col, first_col + (j1 - j0 - 1) * g.sw + 1, g.sw)
            yield Tap(r, s, slice(i0, i1), slice(j0, j1), in_rows, in_cols)


def forward(x: FloatArray, f: FloatArray, y: FloatArray, g: Geometry, groups: int) -> None:
    """``y`` [N, K, Oh, Ow] = convolution of ``x`` [N, C, H, W] with ``f`` [K, C / groups, Fh, Fw]."""
    n, c, h, w = x.shape
    k, cg, fh, fw = f.shape
    oh, ow = y.shape[2:]
    plan = list(taps(g, fh, fw, h, w, oh, ow))
    depthwise = cg == 1 and groups == c
    kg = k // groups

    def run(start: int, stop: int) -> None:
        ys = y[start:stop]
        ys[...] = 0
        for t in plan:
            if depthwise:
                y5 = ys.reshape(stop - start, c, kg, oh, ow)
                window = x[start:stop, :, None, t.in_rows, t.in_cols]
                y5[:, :, :, t.out_rows, t.out_cols] += (
                    f.reshape(c, kg, fh, fw)[None, :, :, t.r, t.s, None, None] * window
                )
                continue
            for grp in range(groups):
                window = x[start:stop, grp * cg : (grp + 1) * cg, t.in_rows, t.in_cols]
                rows, cols = window.shape[2], window.shape[3]
                part = np.matmul(
                    f[grp * kg : (grp + 1) * kg, :, t.r, t.s], window.reshape(stop - start, cg, -1)
                )
                ys[:, grp * kg : (grp + 1) * kg, t.out_rows, t.out_cols] += part.reshape(
                    stop - start, kg, rows, cols
                )

    parallel_ranges(n, run, grain=1)


def backward_data(gy: FloatArray, f: FloatArray, gx: FloatArray, g: Geometry, groups: int) -> None:
    """``gx`` [N, C, H, W] = gradient of the convolution with respect to its input."""
    n, c, h, w = gx.shape
    k, cg, fh, fw = f.shape
    oh, ow = gy.shape[2:]
    plan = list(taps(g, fh, fw, h, w, oh, ow))
    depthwise = cg == 1 and groups == c
    kg = k // groups

    def run(start: int, stop: int) -> None:
        gxs = gx[start:stop]
        gxs[...] = 0
        for t in plan:
            grad = gy[start:stop, :, t.out_rows, t.out_cols]
            if depthwise:
                g5 = grad.reshape(stop - start, c, kg, *grad.shape[2:])
                taps_ck = f.reshape(c, kg, fh, fw)[None, :, :, t.r, t.s, None, None]
                gxs[:, :, t.in_rows, t.in_cols] += (taps_ck * g5).sum(axis=2)
                continue
            for grp in range(groups):
                part = grad[:, grp * kg : (grp + 1) * kg]
                rows, cols = part.shape[2], part.shape[3]
                back = np.matmul(
                    f[grp * kg : (grp + 1) * kg, :, t.r, t.s].T, part.reshape(stop - start, kg, -1)
                )
                gxs[:, grp * cg : (grp + 1) * cg, t.in_rows, t.in_cols] += back.reshape(
                    stop - start, cg, rows, cols
                )

    parallel_ranges(n, run, grain=1)


def backward_filter(x: FloatArray, gy: FloatArray, gf: FloatArray, g: Geometry, groups: int) -> None:
    """``gf`` [K, C / groups, Fh, Fw] = gradient of the convolution with respect to the filter."""
    n, c, h, w = x.shape
    k, cg, fh, fw = gf.shape
    oh, ow = gy.shape[2:]
    depthwise = cg == 1 and groups == c
    kg = k // groups
    gf[...] = 0
    for t in taps(g, fh, fw, h, w, oh, ow):
        grad = gy[:, :, t.out_rows, t.out_cols]
        if depthwise:
            g5 = grad.reshape(n, c, kg, *grad.shape[2:])
            window = x[:, :, None, t.in_rows, t.in_cols]
            gf.reshape(c, kg, fh, fw)[:, :, t.r, t.s] = (g5 * window).sum(axis=(0, 3, 4))
            continue
        for grp in range(groups):
            part = grad[:, grp * kg : (grp + 1) * kg].reshape(n, kg, -1)
            window = x[:, grp * cg : (grp + 1) * cg, t.in_rows, t.in_cols].reshape(n, cg, -1)
            gf[grp * kg : (grp + 1) * kg, :, t.r, t.s] = np.tensordot(part, window, axes=([0, 2], [0, 2]))
