"""Operations along an axis: reductions, softmax, layer / RMS / batch normalisation, LRN."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ._rounding import F64Array

__all__ = ["reduce", "softmax", "layer_norm", "rms_norm", "batch_norm", "lrn"]


def _f64(x: npt.ArrayLike) -> F64Array:
    return np.asarray(x, dtype=np.float64)


def reduce(op: str, x: npt.ArrayLike, axis: int) -> F64Array:
    """``sum`` / ``mean`` / NaN-ignoring ``max`` / ``min`` over ``axis``.

    MAX (MIN) is a fold of ``fmax`` (``fmin``) starting from -inf (+inf): NaN entries
    are skipped, so a slice with no number gives -inf (+inf). An empty axis gives 0
    for SUM and MEAN. SUM and MEAN add one term at a time (IEEE).
    """
    x64 = _f64(x)
    moved = np.moveaxis(x64, axis, -1)
    out = np.empty(moved.shape[:-1])
    for index in np.ndindex(*moved.shape[:-1]):
        values = [float(value) for value in moved[index].tolist()]
        if op in ("sum", "mean"):
            total = 0.0
            for value in values:
                total = total + value
            out[index] = total / len(values) if (op == "mean" and values) else total
        elif op == "max":
            best = -np.inf
            for value in values:
                if value == value and value > best:
                    best = value
            out[index] = best
        elif op == "min":
            best = np.inf
            for value in values:
                if value == value and value < best:
                    best = value
            out[index] = best
        else:
            raise ValueError(f"unknown reduction {op!r}")
    return out


def softmax(x: npt.ArrayLike, axis: int, *, log: bool = False) -> F64Array:
    """``exp(x - m) / sum(exp(x - m))`` along ``axis`` with ``m`` the NaN-ignoring max.

    With ``log`` it is ``x - m - log(sum(exp(x - m)))``. A slice with no number has
    ``m = -inf`` and becomes NaN, as does any slice holding a NaN or a +inf; -inf
    entries of other slices give 0 (softmax) or -inf (log-softmax).
    """
    x64 = _f64(x)
    moved = np.moveaxis(x64, axis, -1)
    out = np.empty_like(moved)
    with np.errstate(all="ignore"):
        for index in np.ndindex(*moved.shape[:-1]):
            row = moved[index]
            numbers = row[~np.isnan(row)]
            peak = numbers.max() if numbers.size else -np.inf
            shifted = row - peak
            e = np.exp(shifted)
            out[index] = shifted - np.log(e.sum()) if log else e / e.sum()
    return np.moveaxis(out, -1, axis)


def _affine(y: F64Array, scale: npt.ArrayLike | None, bias: npt.ArrayLike | None) -> F64Array:
    if scale is not None:
        y = y * _f64(scale)[None, :]
    if bias is not None:
        y = y + _f64(bias)[None, :]
    return y


def layer_norm(
    x: npt.ArrayLike, eps: float, *, scale: npt.ArrayLike | None = None, bias: npt.ArrayLike | None = None
) -> F64Array:
    """Per row of the 2-D ``x``: ``(x - mean) / sqrt(var + eps) * scale + bias`` (biased variance).

    IEEE throughout: a NaN or infinity in a row makes the row NaN.
    """
    x64 = _f64(x)
    with np.errstate(all="ignore"):
        mean = x64.mean(axis=1, keepdims=True)
        centred = x64 - mean
        var = (centred * centred).mean(axis=1, keepdims=True)
        return _affine(centred / np.sqrt(var + eps), scale, bias)


def rms_norm(
    x: npt.ArrayLike, eps: float, *, scale: npt.ArrayLike | None = None, bias: npt.ArrayLike | None = None
) -> F64Array:
    """Per row of the 2-D ``x``: ``x / sqrt(mean(x**2) + eps) * scale + bias`` (IEEE)."""
    x64 = _f64(x)
    with np.errstate(all="ignore"):
        ms = (x64 * x64).mean(axis=1, keepdims=True)
        return _affine(x64 / np.sqrt(ms + eps), scale, bias)


def batch_norm(
    x: npt.ArrayLike,
    scale: npt.ArrayLike,
    bias: npt.ArrayLike,
    mean: npt.ArrayLike,
    var: npt.ArrayLike,
    eps: float,
) -> F64Array:
    """Inference batch norm over axis 1 of [N, C, ...].

    ``(x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c]`` (IEEE).
    """
    x64 = _f64(x)
    n, c = x64.shape[0], x64.shape[1]
    flat = x64.reshape(n, c, int(np.prod(x64.shape[2:])))
    per = [_f64(t)[None, :, None] for t in (scale, bias, mean, var)]
    with np.errstate(all="ignore"):
        y = (flat - per[2]) / np.sqrt(per[3] + eps) * per[0] + per[1]
    return y.reshape(x64.shape)


def lrn(x: npt.ArrayLike, size: int, alpha: float, beta: float, bias: float) -> F64Array:
    """ONNX's LRN across axis 1 of [N, C, ...].

    ``y = x / (bias + alpha / size * s) ** beta`` where ``s`` sums ``x**2`` over channels
    ``max(0, c - (size - 1) // 2)`` to ``min(C - 1, c + size // 2)`` (IEEE).
    """
    x64 = _f64(x)
    n, c = x64.shape[0], x64.shape[1]
    flat = x64.reshape(n, c, int(np.prod(x64.shape[2:])))
    y = np.empty_like(flat)
    with np.errstate(all="ignore"):
        for ch in range(c):
            lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + size // 2)
            window = flat[:, lo : hi + 1]
            s = (window * window).sum(axis=1)
            y[:, ch] = flat[:, ch] / (bias + alpha / size * s) ** beta
    return y.reshape(x64.shape)
