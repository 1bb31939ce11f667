"""Normalisation on the CPU: layer and RMS norm over rows, batch norm and LRN over channels.

The compiled kernels of :mod:`._knorm` read each row or channel plane once (and write
outputs far larger than the caches with non-temporal stores); float32 LRN with
``beta = 0.75`` and an output that fits the caches runs :mod:`._klrn`'s vector kernel
(16 pixels through 8 channels at a time in registers). Where numba is unusable, NumPy
computes the same formulas on cache-sized blocks. Rows and planes split over the
worker threads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import validation as v
from .._common import ceil_div, round_up
from ._plumbing import CpuPlumbing, FloatArray
from ._runtime import PARALLEL_THRESHOLD, kernels, parallel_ranges, workers

__all__ = ["NormOps"]

#: Elements per block of the NumPy paths.
NORM_BLOCK = 1 << 15
#: Columns a piece of the float32 LRN kernel with a running window sum (a few channel rows
#: of this width are in use at a time, whatever the channel count).
LRN_WIDTH = 2048
#: The narrowest piece of a channel plane the vector LRN kernel is given.
LRN_MIN_WIDTH = 512
#: Blocks of pieces per thread of the vector LRN kernel's pulled loop (:mod:`._kpull`):
#: 8 x 64 x 56 x 56 after a 128 MB copy, paired with static halves: 0.82-0.93 of the time.
LRN_BLOCKS_PER_THREAD = 4
#: Outputs from this many bytes on are written with non-temporal stores (far beyond L2).
STREAM_BYTES = 8 << 20


def _norm_rows_numpy(
    x: FloatArray, out: FloatArray, scale: FloatArray | None, bias: FloatArray | None, eps: float, rms: bool
) -> None:
    wide = x.astype(np.float64)
    mean = 0.0 if rms else wide.mean(axis=1, keepdims=True)
    centred = wide - mean
    inv = 1.0 / np.sqrt((centred * centred).mean(axis=1, keepdims=True) + eps)
    y = centred * inv
    if scale is not None:
        y *= scale
    if bias is not None:
        y += bias
    out[...] = y


def _lrn_numpy(x: FloatArray, out: FloatArray, p: v.LrnProblem) -> None:
    """ONNX LRN of one image [C, S] (float64 sums of squares over the channel window)."""
    wide = x.astype(np.float64)
    squares = np.concatenate([np.zeros((1, x.shape[1])), np.cumsum(wide * wide, axis=0)])
    below, above = (p.size - 1) // 2, p.size // 2
    c = np.arange(x.shape[0])
    total = squares[np.minimum(c + above, x.shape[0] - 1) + 1] - squares[np.maximum(c - below, 0)]
    out[...] = wide / (p.bias + p.alpha / p.size * total) ** p.beta


class NormOps(CpuPlumbing):
    """``layer_norm``, ``rms_norm``, ``batch_norm`` and ``lrn``."""

    def _optional(self, region: Any, dtype: np.dtype[Any]) -> FloatArray | None:
        return None if region is None else self._flat(region, dtype)

    def _norm_rows(self, p: v.NormProblem) -> None:
        x = self._array(p.input, (p.rows, p.cols), p.dtype)
        out = self._array(p.output, (p.rows, p.cols), p.dtype)
        scale, bias = self._optional(p.scale, p.dtype), self._optional(p.bias, p.dtype)
        compiled = kernels("_knorm")
        ones, zeros = np.ones(p.cols, dtype=p.dtype), np.zeros(p.cols, dtype=p.dtype)
        block = max(1, NORM_BLOCK // max(1, p.cols))
        factor, shift = (ones if scale is None else scale), (zeros if bias is None else bias)
        f32 = p.dtype == np.float32
        stream = out.nbytes >= STREAM_BYTES

        def run(start: int, stop: int) -> None:
            if compiled is not None and f32:
                # One call per thread: the kernel keeps each row in cache itself.
                compiled.norm_rows_f32(x[start:stop], out[start:stop], factor, shift, p.eps, p.rms, stream)
                return
            with np.errstate(all="ignore"):
                for lo in range(start, stop, block):
                    hi = min(stop, lo + block)
                    if compiled is not None:
                        compiled.norm_rows(x[lo:hi], out[lo:hi], factor, shift, p.eps, p.rms)
                    else:
                        _norm_rows_numpy(x[lo:hi], out[lo:hi], scale, bias, p.eps, p.rms)

        parallel_ranges(p.rows, run, grain=max(1, PARALLEL_THRESHOLD // max(1, p.cols)))

    def _exec_layer_norm(self, p: v.NormProblem) -> None:
        self._norm_rows(p)

    def _exec_rms_norm(self, p: v.NormProblem) -> None:
        self._norm_rows(p)

    def _exec_batch_norm(self, p: v.BatchNormProblem) -> None:
        planes = p.n * p.c
        x = self._array(p.input, (planes, p.spatial), p.dtype)
        out = self._array(p.output, (planes, p.spatial), p.dtype)
        mean, var, scale, bias = (
            self._flat(r, p.dtype).astype(np.float64) for r in (p.mean, p.var, p.scale, p.bias)
        )
        with np.errstate(all="ignore"):
            # y = (x - mean) / sqrt(var + eps) * scale + bias, the division folded into one factor.
            factor = scale / np.sqrt(var + p.eps)
        compiled = kernels("_knorm")

        def run(start: int, stop: int) -> None:
            with np.errstate(all="ignore"):
                if compiled is not None:
                    compiled.affine_planes(x[start:stop], out[start:stop], start, mean, factor, bias)
                    return
                for plane in range(start, stop):
                    c = plane % p.c
                    out[plane] = (x[plane] - mean[c]) * factor[c] + bias[c]

        parallel_ranges(planes, run, grain=max(1, PARALLEL_THRESHOLD // max(1, p.spatial)))

    def _exec_lrn(self, p: v.LrnProblem) -> None:
        x = self._array(p.input, (p.n, p.c, p.spatial), p.dtype)
        out = self._array(p.output, (p.n, p.c, p.spatial), p.dtype)
        compiled = kernels("_knorm")
        # float32 with ONNX's default beta: the kernels without divisions or square roots.
        fast = compiled is not None and p.dtype == np.float32 and p.beta == 0.75
        stream = out.nbytes >= STREAM_BYTES
        lanes = kernels("_klrn") if fast and not stream else None
        if lanes is not None:
            # Whole channel planes, split only where there are too few images for the threads.
            split = max(1, min(ceil_div(2 * workers(), p.n), p.spatial // LRN_MIN_WIDTH))
            per_piece = round_up(ceil_div(p.spatial, split), lanes.LANES)
            count = p.n * ceil_div(p.spatial, per_piece)
            # Pieces pulled in blocks by one compiled call per thread (a late worker takes fewer).
            blocks = min(count, LRN_BLOCKS_PER_THREAD * workers(), max(1, x.size // PARALLEL_THRESHOLD))
            lanes.lrn_all(x, out, count, per_piece, p.size, p.alpha, p.bias, blocks)
            return
        width = LRN_WIDTH if fast and not stream else max(1, NORM_BLOCK // max(1, p.c))
        pieces = [(i, s0) for i in range(p.n) for s0 in range(0, p.spatial, width)]

        def run(start: int, stop: int) -> None:
            if fast:
                # One call per thread for its range of pieces.
                total = np.empty(width, dtype=np.float32)
                compiled.lrn_pieces_f32(x, out, start, stop, width, p.size, p.alpha, p.bias, stream, total)
                return
            with np.errstate(all="ignore"):
                for i, s0 in pieces[start:stop]:
                    s1 = min(p.spatial, s0 + width)
                    if compiled is not None:
                        compiled.lrn_planes(x[i], out[i], s0, s1, p.size, p.alpha, p.beta, p.bias)
                    else:
                        _lrn_numpy(x[i, :, s0:s1], out[i, :, s0:s1], p)

        parallel_ranges(len(pieces), run, grain=max(1, PARALLEL_THRESHOLD // (p.c * width)))
