"""Winograd F(2x2, 3x3) kernels for float32 (numba): the small-image variant of :mod:`._winograd`.

Each 2x2 output tile is ``A^T [(G g G^T) o (B^T d B)] A`` over a 4x4 input patch (16
transformed positions, 2.25x fewer multiply-adds than the direct definition instead of
F(4x4, 3x3)'s 4x). On small images with many channels (ResNet's 512 channels at 7x7)
it wins over F(4x4, 3x3): four times as many tiles make the per-position GEMMs wide
enough for BLAS, and the transformed filter (16 C K floats instead of 36) costs less
memory traffic. Interpolation points 0, +-1 and infinity (Lavin and Gray, 2016); the
rounding error is smaller than F(4x4, 3x3)'s.

The layout and the conventions are those of :mod:`._winograd` (channels-last
transforms, ``V`` [16, tiles, C], ``M`` [16, tiles, K], the GEMMs by
:func:`._winograd.position_gemms`), and so are the helpers shared with it.
"""

# The function bodies are numba nopython code: numba types them, and numba's stubs
# cannot describe that to mypy.
# mypy: ignore-errors

from __future__ import annotations

import numpy as np

from ._nb import jit, wide_vectors
from ._winograd import _store, _to_channels_last
from ._winograd import filter_transform as _filter_transform

__all__ = [
    "filter_transform",
    "input_item",
    "input_item_scratch",
    "output_item",
    "output_item_scratch",
    "warm_up",
]

_F = np.float32


@jit
def _bt_lines(src, s, ss, dst, d, ds, count):
    """``dst[d + b * ds, i] = (B^T [src[s + j * ss, i] for j < 4])[b]`` for ``i < count``."""
    for i in range(count):
        dst[d, i] = src[s, i] - src[s + 2 * ss, i]
    d += ds
    for i in range(count):
        dst[d, i] = src[s + ss, i] + src[s + 2 * ss, i]
    d += ds
    for i in range(count):
        dst[d, i] = src[s + 2 * ss, i] - src[s + ss, i]
    d += ds
    for i in range(count):
        dst[d, i] = src[s + ss, i] - src[s + 3 * ss, i]


@jit
def _at_lines(src, s, ss, dst, d, ds, count):
    """``dst[d + o * ds, i] = (A^T [src[s + j * ss, i] for j < 4])[o]`` for ``i < count``."""
    for i in range(count):
        dst[d, i] = src[s, i] + src[s + ss, i] + src[s + 2 * ss, i]
    d += ds
    for i in range(count):
        dst[d, i] = (src[s + ss, i] - src[s + 2 * ss, i]) - src[s + 3 * ss, i]


@jit
def filter_transform(ft, u, c0, c1, tmp):
    """:func:`._winograd.filter_transform` for this tile size.

    ``u`` is flat [16, Cin, Kout], ``tmp`` scratch of 12 Kout floats; False if a filter value is not finite.
    """
    return _filter_transform(ft, u, c0, c1, tmp, 2)


@jit
def _input_transform(xp, rows_t, tw_count, cin, tmp, v, t0, tiles):
    """Tiles of ``rows_t`` tile rows packed in ``xp`` ([2 rows_t + 2, (2 TW + 2) C]) into ``v``.

    ``v`` is [16 tiles, C]; ``tmp`` is [4 (2 TW + 2), C].
    """
    wide_vectors()
    width = 2 * tw_count + 2
    strip = tmp.reshape((4, width * cin))
    for lt in range(rows_t):
        _bt_lines(xp, 2 * lt, 1, strip, 0, 1, width * cin)
        for tw in range(tw_count):
            t = t0 + lt * tw_count + tw
            for a in range(4):
                _bt_lines(tmp, a * width + 2 * tw, 1, v, a * 4 * tiles + t, tiles, cin)


@jit
def _output_transform(m, t0, rows_t, tw_count, kout, tiles, tt, yo):
    """Tiles ``t0 ..`` of ``m`` ([16 tiles, K]) into ``yo`` ([2 rows_t 2 TW, K]); ``tt`` is [8, K]."""
    wide_vectors()
    ow_pad = 2 * tw_count
    for lt in range(rows_t):
        for tw in range(tw_count):
            t = t0 + lt * tw_count + tw
            for b in range(4):
                _at_lines(m, b * tiles + t, 4 * tiles, tt, b, 4, kout)
            for i in range(2):
                _at_lines(tt, i * 4, 1, yo, (2 * lt + i) * ow_pad + 2 * tw, 1, kout)


@jit
def input_item(x, n, th0, th1, pt, pl, tw_count, v, tiles, t0, work):
    """V rows ``t0 ..`` (``v`` flat [16, tiles, C]) for tile rows ``[th0, th1)`` of image ``n``.

    Returns 1 when an input value was not finite, else 0.
    """
    cin = x.shape[1]
    rows_t = th1 - th0
    width = 2 * tw_count + 2
    xp_size = (2 * rows_t + 2) * width * cin
    xp = work[:xp_size]
    tmp = work[xp_size : xp_size + 4 * width * cin].reshape((4 * width, cin))
    bad = _to_channels_last(x, n, 2 * th0 - pt, -pl, 2 * rows_t + 2, width, xp.reshape((-1, cin)))
    packed = xp.reshape((2 * rows_t + 2, width * cin))
    _input_transform(packed, rows_t, tw_count, cin, tmp, v.reshape((16 * tiles, cin)), t0, tiles)
    return bad


def input_item_scratch(rows_t: int, tw_count: int, cin: int) -> int:
    """Float32 elements of scratch one :func:`input_item` call needs."""
    return (2 * rows_t + 6) * (2 * tw_count + 2) * cin


@jit
def output_item(m, y, n, th0, th1, tw_count, tiles, t0, bias, flags, work):
    """Output tile rows ``[th0, th1)`` of image ``n`` from M rows ``t0 ..`` (``m`` flat [16, tiles, K]).

    ``flags`` as in :func:`._winograd.output_item`.
    """
    kout = y.shape[1]
    rows_t = th1 - th0
    tt = work[: 8 * kout].reshape((8, kout))
    yo = work[8 * kout : 8 * kout + 4 * rows_t * tw_count * kout].reshape((4 * rows_t * tw_count, kout))
    _output_transform(m.reshape((16 * tiles, kout)), t0, rows_t, tw_count, kout, tiles, tt, yo)
    _store(yo, 2 * tw_count, kout, y, n, 2 * th0, 2 * rows_t, bias, flags)


def output_item_scratch(rows_t: int, tw_count: int, kout: int) -> int:
    """Float32 elements of scratch one :func:`output_item` call needs."""
    return (8 + 4 * rows_t * tw_count) * kout


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel of this module now."""
    x = np.zeros((1, 1, 2, 2), dtype=_F)
    f = np.zeros((1, 3, 3, 1), dtype=_F)
    u = np.zeros(16, dtype=_F)
    y = np.zeros((1, 1, 2, 2), dtype=_F)
    filter_transform(f, u, 0, 1, np.zeros(12, dtype=_F))
    work = np.zeros(input_item_scratch(1, 1, 1) + output_item_scratch(1, 1, 1), dtype=_F)
    v = np.zeros(16, dtype=_F)
    input_item(x, 0, 0, 1, 1, 1, 1, v, 1, 0, work)
    output_item(v, y, 0, 0, 1, 1, 1, 0, np.zeros(1, dtype=_F), 3, work)
