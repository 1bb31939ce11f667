"""2-D convolution (forward and both gradients) and pooling over NCHW, by filter taps.

Every definition walks the filter (or pooling window) tap by tap and, for each tap,
the output positions whose tap lands *inside* the input: padding is never multiplied,
so a NaN or infinity reaches exactly the outputs (or gradients) that read it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from ._elementwise import unary
from ._rounding import F64Array

__all__ = [
    "pads4",
    "conv_output_size",
    "conv2d_output_shape",
    "conv2d_forward",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "pool_output_size",
    "pool2d",
]

Pair = Sequence[int]


def _f64(x: npt.ArrayLike) -> F64Array:
    return np.asarray(x, dtype=np.float64)


def pads4(padding: Sequence[int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from two entries [ph, pw] or four in ONNX's order."""
    if len(padding) == 2:
        return padding[0], padding[1], padding[0], padding[1]
    top, left, bottom, right = padding
    return top, left, bottom, right


def conv_output_size(size: int, taps: int, stride: int, pad_lo: int, pad_hi: int, dilation: int = 1) -> int:
    """``(size + pad_lo + pad_hi - dilation * (taps - 1) - 1) // stride + 1``."""
    return (size + pad_lo + pad_hi - dilation * (taps - 1) - 1) // stride + 1


def conv2d_output_shape(
    x_shape: Sequence[int],
    f_shape: Sequence[int],
    stride: Pair,
    padding: Sequence[int],
    dilation: Pair = (1, 1),
) -> tuple[int, int, int, int]:
    """[N, K, Oh, Ow] of a forward convolution."""
    n, _, h, w = x_shape
    k, _, fh, fw = f_shape
    top, left, bottom, right = pads4(padding)
    return (
        n,
        k,
        conv_output_size(h, fh, stride[0], top, bottom, dilation[0]),
        conv_output_size(w, fw, stride[1], left, right, dilation[1]),
    )


def _tap(size: int, outputs: int, stride: int, pad_lo: int, dilation: int, tap: int) -> tuple[slice, slice]:
    """For one tap: (output positions, input positions) where the tap lands inside the input.

    Output ``i`` reads input position ``i * stride - pad_lo + tap * dilation``; the
    positions inside ``[0, size)`` form one contiguous run of outputs, returned as two
    slices (empty when the tap never lands inside).
    """
    offset = tap * dilation - pad_lo
    first = max(0, -(offset // stride) if offset < 0 else 0)
    while first < outputs and first * stride + offset < 0:
        first += 1
    last = min(outputs - 1, (size - 1 - offset) // stride) if size - 1 - offset >= 0 else -1
    if last < first:
        return slice(0, 0), slice(0, 0)
    start = first * stride + offset
    return slice(first, last + 1), slice(start, start + (last - first) * stride + 1, stride)


_Tap = tuple[slice, slice, int, int, tuple[slice, slice], tuple[slice, slice]]


def _group_taps(
    x_hw: Pair,
    out_hw: Pair,
    f_shape: Sequence[int],
    groups: int,
    stride: Pair,
    padding: Sequence[int],
    dilation: Pair,
) -> Iterator[_Tap]:
    """Every (group, tap) that lands inside the input at least once.

    Yields ``(ks, cs, r, s, (oi, oj), (xi, xj))``: the group's filters ``ks`` and input
    channels ``cs``, the tap ``(r, s)``, and the output and input positions it joins.
    """
    k, cg, fh, fw = f_shape
    top, left, _, _ = pads4(padding)
    kg = k // groups
    for g in range(groups):
        ks, cs = slice(g * kg, (g + 1) * kg), slice(g * cg, (g + 1) * cg)
        for r in range(fh):
            oi, xi = _tap(x_hw[0], out_hw[0], stride[0], top, dilation[0], r)
            for s in range(fw):
                oj, xj = _tap(x_hw[1], out_hw[1], stride[1], left, dilation[1], s)
                if oi.stop > oi.start and oj.stop > oj.start:
                    yield ks, cs, r, s, (oi, oj), (xi, xj)


def conv2d_forward(
    x: npt.ArrayLike,
    f: npt.ArrayLike,
    stride: Pair,
    padding: Sequence[int],
    *,
    groups: int = 1,
    dilation: Pair = (1, 1),
    bias: npt.ArrayLike | None = None,
    residual: npt.ArrayLike | None = None,
    activation: str | None = None,
) -> F64Array:
    """Grouped, dilated cross-correlation with zero padding that is never multiplied.

    ``y[n, k, i, j] = bias[k] + sum over taps (r, s) landing inside the input and over
    the ``C / groups`` channels ``c`` of group ``k // (K / groups)`` of
    ``x[n, c, i*sh - top + r*dh, j*sw - left + s*dw] * f[k, c - group start, r, s]``.
    The epilogue then adds ``residual`` (the output's shape) and applies the unary
    ``activation`` (:func:`unary`'s definition): ``activation(y + residual)``.
    """
    x64, f64 = _f64(x), _f64(f)
    y = np.zeros(conv2d_output_shape(x64.shape, f64.shape, stride, padding, dilation))
    with np.errstate(all="ignore"):
        for ks, cs, r, s, (oi, oj), (xi, xj) in _group_taps(
            x64.shape[2:], y.shape[2:], f64.shape, groups, stride, padding, dilation
        ):
            patch = x64[:, cs, xi, xj]
            y[:, ks, oi, oj] += np.einsum("ncij,kc->nkij", patch, f64[ks, :, r, s])
        if bias is not None:
            y += _f64(bias)[None, :, None, None]
        if residual is not None:
            y = y + _f64(residual)
    return y if activation is None else unary(activation, y)


def conv2d_backward_data(
    gy: npt.ArrayLike,
    f: npt.ArrayLike,
    x_shape: Sequence[int],
    stride: Pair,
    padding: Sequence[int],
    *,
    groups: int = 1,
    dilation: Pair = (1, 1),
) -> F64Array:
    """Gradient of :func:`conv2d_forward` with respect to its input.

    Each (output position, tap) pair that read an input position in the forward pass
    adds ``gy * f`` to it; input positions never read get zero.
    """
    gy64, f64 = _f64(gy), _f64(f)
    gx = np.zeros(tuple(x_shape))
    with np.errstate(all="ignore"):
        for ks, cs, r, s, (oi, oj), (xi, xj) in _group_taps(
            x_shape[2:], gy64.shape[2:], f64.shape, groups, stride, padding, dilation
        ):
            g_out = gy64[:, ks, oi, oj]
            gx[:, cs, xi, xj] += np.einsum("nkij,kc->ncij", g_out, f64[ks, :, r, s])
    return gx


def conv2d_backward_filter(
    x: npt.ArrayLike,
    gy: npt.ArrayLike,
    f_shape: Sequence[int],
    stride: Pair,
    padding: Sequence[int],
    *,
    groups: int = 1,
    dilation: Pair = (1, 1),
) -> F64Array:
    """Gradient of :func:`conv2d_forward` with respect to the filter.

    ``gf[k, c, r, s]`` sums ``gy[n, k, i, j] * x[n, c', i*sh - top + r*dh, ...]`` over the
    images and output positions whose tap lands inside the input (``c'`` the group's
    channel ``c``).
    """
    x64, gy64 = _f64(x), _f64(gy)
    gf = np.zeros(tuple(f_shape))
    with np.errstate(all="ignore"):
        for ks, cs, r, s, (oi, oj), (xi, xj) in _group_taps(
            x64.shape[2:], gy64.shape[2:], f_shape, groups, stride, padding, dilation
        ):
            window = x64[:, cs, xi, xj]
            g_out = gy64[:, ks, oi, oj]
            gf[ks, :, r, s] = np.einsum("ncij,nkij->kc", window, g_out)
    return gf


# --------------------------------------------------------------------------- pooling


def pool_output_size(
    size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, dilation: int, ceil_mode: bool
) -> int:
    """Output length of one pooled dimension.

    ``(size + pad_lo + pad_hi - dilation*(kernel-1) - 1) / stride + 1`` rounded down, or
    up in ceil mode, where a last window that would start at or after the end of the
    input plus the leading padding is dropped.
    """
    span = size + pad_lo + pad_hi - dilation * (kernel - 1) - 1
    if span < 0:
        return 0
    count = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (count - 1) * stride >= size + pad_lo:
        count -= 1
    return count


def _window(
    size: int, index: int, stride: int, pad_lo: int, pad_hi: int, dilation: int, kernel: int
) -> tuple[list[int], int]:
    """(input positions inside the input, number of taps inside the padded input)."""
    taps = [index * stride - pad_lo + t * dilation for t in range(kernel)]
    inside = [p for p in taps if 0 <= p < size]
    padded = sum(1 for p in taps if -pad_lo <= p < size + pad_hi)
    return inside, padded


def pool2d(
    op: str,
    x: npt.ArrayLike,
    kernel: Pair,
    stride: Pair,
    padding: Sequence[int],
    *,
    dilation: Pair = (1, 1),
    ceil_mode: bool = False,
    count_include_pad: bool = False,
) -> F64Array:
    """Max or average pooling over NCHW.

    MAX folds ``fmax`` from -inf over the window's taps inside the input (padding and
    NaN ignored; no input gives -inf). AVG sums those taps (NaN propagates) and divides
    by their number, or with ``count_include_pad`` by the number of taps inside the
    padded input (a ceil-mode overhang never counts); 0 / 0 is NaN.
    """
    x64 = _f64(x)
    n, c, h, w = x64.shape
    top, left, bottom, right = pads4(padding)
    oh = pool_output_size(h, kernel[0], stride[0], top, bottom, dilation[0], ceil_mode)
    ow = pool_output_size(w, kernel[1], stride[1], left, right, dilation[1], ceil_mode)
    y = np.empty((n, c, oh, ow))
    with np.errstate(all="ignore"):
        for i in range(oh):
            rows, padded_rows = _window(h, i, stride[0], top, bottom, dilation[0], kernel[0])
            for j in range(ow):
                cols, padded_cols = _window(w, j, stride[1], left, right, dilation[1], kernel[1])
                window = x64[:, :, rows][:, :, :, cols].reshape(n, c, -1)
                if op == "max":
                    y[:, :, i, j] = np.fmax.reduce(window, axis=-1, initial=-np.inf)
                elif op == "avg":
                    count = padded_rows * padded_cols if count_include_pad else len(rows) * len(cols)
                    y[:, :, i, j] = window.sum(axis=-1) / np.float64(count)
                else:
                    raise ValueError(f"unknown pooling {op!r}")
    return y
