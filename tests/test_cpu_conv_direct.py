"""The CPU backend's direct convolution (the stem's kernel) against independent definitions.

The compiled phase split against NumPy's padding and strided slicing; whole convolutions
cut into bands of output rows (one or many per image, any stride and padding, odd
sizes, a last block of rows shorter than the others) against the float64 definition;
NaN in the input reaching exactly the outputs that read it, and ReLU applied as the
blocks are stored (NaN -> 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from test_cpu_conv_fast import _strided_forward64
from test_cpu_perf import F32, _within_kit_tolerance


@pytest.mark.parametrize(
    "c, h, w, stride, pads, r0, hq, wq",
    [
        (3, 17, 23, 2, (3, 3), 0, 12, 15),
        (3, 17, 23, 2, (3, 3), 5, 9, 15),  # a band from row 5, running past the image
        (3, 17, 24, 2, (3, 3), 5, 9, 15),  # even rows: read as pixel pairs
        (2, 10, 30, 2, (2, 1), 0, 7, 11),  # even rows, fewer columns than the image
        (2, 10, 30, 2, (0, 0), 3, 6, 18),
        (2, 9, 11, 3, (1, 2), 1, 4, 6),
        (1, 8, 40, 1, (0, 2), 2, 5, 44),
        (4, 5, 6, 2, (0, 0), 0, 2, 2),  # fewer columns than the image
    ],
)
def test_split_phases_matches_padded_slices(
    c: int, h: int, w: int, stride: int, pads: tuple[int, int], r0: int, hq: int, wq: int
) -> None:
    """Phase (a, b) holds padded pixel ((r0 + u) s + a, v s + b) at (u, v), zero outside the image.

    Stride 2 on rows of even width takes the pixel-pair path, any other the general loops.
    """
    from computehal.backends.cpu import _kdirect

    pt, pl = pads
    rng = np.random.default_rng(c * h + w)
    x = rng.standard_normal((2, c, h, w)).astype(F32)
    out = np.full(c * stride * stride * hq * wq + 16, np.nan, dtype=F32)
    _kdirect.split_phases(x.reshape(-1), c * h * w, c, h, w, stride, stride, pt, pl, r0, hq, wq, out)
    big = 4 * (h + w + hq * stride + wq * stride)
    padded = np.zeros((c, big, big), dtype=F32)
    padded[:, pt : pt + h, pl : pl + w] = x[1]
    want = np.empty((c, stride, stride, hq, wq), dtype=F32)
    for a in range(stride):
        for b in range(stride):
            rows = slice(r0 * stride + a, (r0 + hq) * stride + a, stride)
            want[:, a, b] = padded[:, rows, b : b + wq * stride : stride]
    assert np.array_equal(out[: want.size].reshape(want.shape), want)
    assert np.isnan(out[want.size :]).all()  # nothing written past the layout


@pytest.mark.parametrize(
    "n, c, k, hw, fhw, stride, pads",
    [
        (3, 3, 19, (45, 70), (7, 7), (2, 2), (3, 3, 3, 3)),  # the stem's geometry, odd channel count
        (1, 2, 8, (23, 66), (5, 3), (2, 1), (2, 1, 0, 1)),
        (2, 4, 17, (31, 35), (3, 3), (1, 1), (1, 1, 1, 1)),
    ],
)
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("tasks_per_thread", [1, 8, 64])
def test_direct_bands_match_float64(
    monkeypatch: pytest.MonkeyPatch,
    n: int,
    c: int,
    k: int,
    hw: tuple[int, int],
    fhw: tuple[int, int],
    stride: Any,
    pads: Any,
    relu: bool,
    tasks_per_thread: int,
) -> None:
    """Bands of output rows (whole images to a block each), bias, fused ReLU; NaN reaches what reads it."""
    from computehal.backends.cpu import _conv_direct

    monkeypatch.setattr(_conv_direct, "TASKS_PER_THREAD", tasks_per_thread)
    rng = np.random.default_rng(n * k + c)
    x = rng.standard_normal((n, c, *hw)).astype(F32)
    x[n - 1, c - 1, hw[0] // 2, hw[1] // 3] = np.nan
    f = rng.standard_normal((k, c, *fhw)).astype(F32)
    bias = rng.standard_normal(k).astype(F32)
    want = _strided_forward64(x, f, bias, pads, stride)
    mag = _strided_forward64(np.nan_to_num(np.abs(x)), np.abs(f), np.abs(bias), pads, stride)
    if relu:
        want = np.where(want > 0, want, 0.0)  # NaN -> 0, as the unary RELU
    guarded = np.full(want.size + 64, 7.0, dtype=F32)
    y = guarded[: want.size].reshape(want.shape)
    _conv_direct.direct_forward(x, f, bias, y, (pads[0], pads[1], stride[0], stride[1]), relu)
    assert np.array_equal(np.isnan(y), np.isnan(want))
    assert np.isnan(want).any() != relu  # the NaN pixel is read by some output
    finite = ~np.isnan(want)
    _within_kit_tolerance(y[finite], want[finite], mag[finite], c * fhw[0] * fhw[1])
    assert (guarded[want.size :] == 7.0).all()  # nothing stored past the output


def test_block_rows_fill_the_last_tile() -> None:
    """The stem's blocks: at most BLOCK_PIXELS pixels, the last 48-pixel tile (nearly) full."""
    from computehal.backends.cpu._conv_direct import BLOCK_PIXELS, _block_rows

    rows = _block_rows(112, 112, 115, 48)
    width = (rows - 1) * 115 + 112
    assert width <= BLOCK_PIXELS and width % 48 >= 40
    assert _block_rows(3, 40, 43, 48) <= 3
