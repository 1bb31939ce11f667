"""The CPU backend's shape-specific algorithms against independent definitions.

Winograd F(4x4, 3x3) (forward, data and filter gradients) is compared with the float64
direct definitions of ``computehal.testing.reference``, under the conformance kit's own
tolerance formula (``2 (reach + 2) eps |x| * |f|``, the direct definition's error
bound), on odd sizes (partial tiles, channel counts that are no multiple of 8,
asymmetric padding, bias). Its error is also printed in units of that bound's ``eps
|x| * |f|`` so the margin is visible. Inputs holding inf or NaN must leave the result
to the exact algorithms, and through the backend they must give the reference's
NaN / inf pattern.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import computehal.backends.cpu._winograd as W  # noqa: F401  (numba is a core dependency)
from computehal.backends.cpu import CpuBackend
from computehal.backends.cpu._conv_select import winograd_applies
from computehal.backends.cpu._conv_winograd import (
    winograd_backward_data,
    winograd_backward_filter,
    winograd_forward,
)
from computehal.testing import reference as ref

F32 = np.float32
EPS32 = float(np.finfo(np.float32).eps)

#: (N, C, K, H, W, (top, left, bottom, right))
SHAPES = [
    (2, 3, 4, 7, 9, (1, 1, 1, 1)),
    (1, 16, 13, 13, 10, (1, 1, 1, 1)),
    (2, 17, 24, 9, 11, (0, 0, 0, 0)),
    (1, 24, 9, 6, 5, (2, 0, 1, 2)),
    (3, 64, 64, 12, 12, (1, 1, 1, 1)),
    (1, 8, 8, 1, 1, (1, 1, 1, 1)),
    (2, 96, 83, 9, 7, (1, 2, 0, 1)),  # a transformed filter beyond the fused schedule's limit
]


def _data(shape: tuple[Any, ...], seed: int) -> tuple[npt.NDArray[np.float32], ...]:
    n, c, k, h, w, (pt, pl, pb, pr) = shape
    rng = np.random.default_rng(seed)
    oh, ow = h + pt + pb - 2, w + pl + pr - 2
    x = rng.standard_normal((n, c, h, w)).astype(F32)
    f = rng.standard_normal((k, c, 3, 3)).astype(F32)
    gy = rng.standard_normal((n, k, oh, ow)).astype(F32)
    return x, f, gy


def _padded64(x: npt.NDArray[Any], pads: tuple[int, int, int, int]) -> npt.NDArray[np.float64]:
    pt, pl, pb, pr = pads
    return np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))


def _forward64(x: npt.NDArray[Any], f: npt.NDArray[Any], pads: tuple[int, int, int, int]) -> Any:
    """Direct definition with four-sided padding (the reference pads symmetrically)."""
    return ref.conv2d_forward(_padded64(x, pads), f.astype(np.float64), (1, 1), (0, 0))


def _within_kit_tolerance(got: Any, want: Any, mag: Any, reach: int) -> float:
    """Assert the kit's conv tolerance; return the worst error in units of eps * magnitude."""
    tiny = np.finfo(np.float32).tiny
    tol = 2.0 * (reach + 2) * EPS32 * mag + tiny
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= tol), f"max error {err.max():.3g}, worst ratio {(err / tol).max():.3g}"
    return float((err / (EPS32 * mag + tiny)).max())


@pytest.mark.parametrize("tile", [4, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_winograd_forward_within_kit_tolerance(shape: tuple[Any, ...], tile: int) -> None:
    x, f, _ = _data(shape, 1)
    pads = shape[5]
    bias = np.random.default_rng(2).standard_normal(f.shape[0]).astype(F32)
    want = _forward64(x, f, pads) + bias[None, :, None, None]
    mag = _forward64(np.abs(x), np.abs(f), pads) + np.abs(bias)[None, :, None, None]
    y = np.full(want.shape, np.nan, dtype=F32)
    assert winograd_forward(x, f, bias, y, pads[0], pads[1], tile)
    units = _within_kit_tolerance(y, want, mag, x.shape[1] * 9)
    allowed = 2 * (x.shape[1] * 9 + 2)
    print(f"F({tile}x{tile}) forward {shape}: {units:.1f} eps * |x| * |f| (kit allows {allowed})")


@pytest.mark.parametrize("tile", [4, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_winograd_backward_data_within_kit_tolerance(shape: tuple[Any, ...], tile: int) -> None:
    x, f, gy = _data(shape, 3)
    pt, pl, pb, pr = shape[5]
    # The data gradient is the forward convolution of gy padded by 2 - pad with the
    # flipped, transposed filter; that full correlation, cropped, is the reference.
    flipped = f[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
    full_pads = (2 - pt, 2 - pl, 2 - pb, 2 - pr)
    lo = [max(0, -p) for p in full_pads]
    pads = tuple(max(0, p) for p in full_pads)
    crop = (slice(None), slice(None), slice(lo[0], lo[0] + x.shape[2]), slice(lo[1], lo[1] + x.shape[3]))
    want = _forward64(gy, flipped, pads)[crop]
    mag = _forward64(np.abs(gy), np.abs(flipped), pads)[crop]
    gx = np.full(x.shape, np.nan, dtype=F32)
    assert winograd_backward_data(gy, f, gx, pt, pl, tile)
    units = _within_kit_tolerance(gx, want, mag, f.shape[0] * 9)
    print(f"F({tile}x{tile}) backward data {shape}: {units:.1f} eps * |gy| * |f|")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_winograd_backward_filter_within_kit_tolerance(shape: tuple[Any, ...]) -> None:
    x, f, gy = _data(shape, 5)
    pads = shape[5]
    xp, xa = _padded64(x, pads), _padded64(np.abs(x), pads)
    want = ref.conv2d_backward_filter(xp, gy.astype(np.float64), f.shape, (1, 1), (0, 0))
    mag = ref.conv2d_backward_filter(xa, np.abs(gy).astype(np.float64), f.shape, (1, 1), (0, 0))
    gf = np.full(f.shape, np.nan, dtype=F32)
    assert winograd_backward_filter(x, gy, gf, pads[0], pads[1])
    units = _within_kit_tolerance(gf, want, mag, gy.shape[0] * gy.shape[2] * gy.shape[3])
    print(f"backward filter {shape}: {units:.1f} eps * |x| * |gy|")


@pytest.mark.parametrize("where", ["input", "filter"])
@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_winograd_declines_non_finite_operands(where: str, value: float) -> None:
    x, f, gy = _data((1, 16, 8, 9, 9, (1, 1, 1, 1)), 7)
    (x if where == "input" else f)[0, 3, 2, 2] = value
    y = np.empty((1, 8, 9, 9), dtype=F32)
    assert not winograd_forward(x, f, None, y, 1, 1)
    assert not winograd_forward(x, f, None, y, 1, 1, 2)
    gx = np.empty_like(x)
    if where == "filter":
        assert not winograd_backward_data(gy, f, gx, 1, 1)
    else:
        assert not winograd_backward_filter(x, gy, np.empty_like(f), 1, 1)
    gy[0, 1, 4, 4] = value
    assert not winograd_backward_data(gy, f, gx, 1, 1)
    assert not winograd_backward_filter(np.ones_like(x), gy, np.empty_like(f), 1, 1)


def _backend_conv(be: CpuBackend, x: Any, f: Any, pads: list[int]) -> npt.NDArray[np.float32]:
    n, k = x.shape[0], f.shape[0]
    oh, ow = x.shape[2] + pads[0] + pads[2] - 2, x.shape[3] + pads[1] + pads[3] - 2
    px, pf = be.alloc(x.nbytes), be.alloc(f.nbytes)
    py = be.alloc(n * k * oh * ow * 4)
    try:
        be.copy_htod(px, x)
        be.copy_htod(pf, f)
        be.conv2d_forward(px, list(x.shape), pf, list(f.shape), py, [n, k, oh, ow], [1, 1], pads)
        out = np.empty((n, k, oh, ow), dtype=F32)
        be.copy_dtoh(out, py)
        return out
    finally:
        for ptr in (px, pf, py):
            be.free(ptr)


def test_backend_takes_winograd_and_keeps_nan_semantics(cpu_backend: CpuBackend) -> None:
    """A layer large enough for Winograd: exact where finite, the reference's pattern with inf."""
    x, f, _ = _data((1, 16, 16, 48, 48, (1, 1, 1, 1)), 9)
    pads = [1, 1, 1, 1]
    from computehal import validation as v
    from computehal.memory import Region

    region = Region(None, 0, 0)  # type: ignore[arg-type]
    probe = v.ConvForwardProblem(
        1, 16, 48, 48, 16, 3, 3, 48, 48, 1, 1, 1, 1, region, region, region, np.dtype(F32), pb=1, pr=1
    )
    assert winograd_applies(probe)
    want = _forward64(x, f, (1, 1, 1, 1))
    mag = _forward64(np.abs(x), np.abs(f), (1, 1, 1, 1))
    _within_kit_tolerance(_backend_conv(cpu_backend, x, f, pads), want, mag, 16 * 9)
    x[0, 5, 10, 20] = np.inf
    got = _backend_conv(cpu_backend, x, f, pads)
    with np.errstate(invalid="ignore"):
        want = _forward64(x, f, (1, 1, 1, 1))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    assert np.all(np.abs(got[finite] - want[finite]) <= 2 * (16 * 9 + 2) * EPS32 * mag[finite] + 1e-30)
    assert math.isfinite(float(got[0, 0, 0, 0]))


# --------------------------------------------------------------------------- GEMM convolutions

#: (N, C, K, H, W, Fh, Fw, stride, (top, left, bottom, right), dilation)
GEMM_SHAPES = [
    (2, 3, 8, 23, 21, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1)),  # a stem, wide rows
    (3, 20, 12, 7, 7, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # small images: gathered by table
    (2, 5, 6, 9, 11, 3, 2, (2, 1), (0, 2, 1, 0), (2, 1)),  # asymmetric, dilated, strided
    (1, 4, 3, 40, 37, 5, 5, (3, 2), (2, 2, 2, 2), (1, 1)),
    (1, 6, 150, 7, 7, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # few pixels: shared columns, channel split
    (3, 5, 131, 5, 6, 3, 3, (2, 1), (1, 0, 1, 2), (1, 1)),  # the same, several images
    (1, 2, 140, 5, 40, 3, 5, (1, 1), (1, 2, 1, 2), (1, 1)),  # the same, wide rows
]


def _direct64(x: Any, f: Any, stride: Any, pads: Any, dilation: Any) -> npt.NDArray[np.float64]:
    """Direct definition: loops over taps on the zero-padded float64 image."""
    n, c, h, w = x.shape
    k, _, fh, fw = f.shape
    xp = _padded64(x, pads)
    oh = (h + pads[0] + pads[2] - dilation[0] * (fh - 1) - 1) // stride[0] + 1
    ow = (w + pads[1] + pads[3] - dilation[1] * (fw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, k, oh, ow))
    for r in range(fh):
        for s in range(fw):
            r0, s0 = r * dilation[0], s * dilation[1]
            win = xp[
                :,
                :,
                r0 : r0 + stride[0] * (oh - 1) + 1 : stride[0],
                s0 : s0 + stride[1] * (ow - 1) + 1 : stride[1],
            ]
            out += np.einsum("kc,nchw->nkhw", f[:, :, r, s].astype(np.float64), win)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=str)
def test_im2col_forward_matches_direct_definition(shape: tuple[Any, ...], dtype: Any) -> None:
    from computehal.backends.cpu._conv_gemm import im2col_forward

    n, c, k, h, w, fh, fw, stride, pads, dil = shape
    rng = np.random.default_rng(11)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    f = rng.standard_normal((k, c, fh, fw)).astype(dtype)
    bias = rng.standard_normal(k).astype(dtype)
    want = _direct64(x, f, stride, pads, dil) + bias[None, :, None, None]
    mag = _direct64(np.abs(x), np.abs(f), stride, pads, dil) + np.abs(bias)[None, :, None, None]
    y = np.full(want.shape, np.nan, dtype=dtype)
    im2col_forward(x, f, bias, y, (pads[0], pads[1], stride[0], stride[1], dil[0], dil[1]))
    eps = float(np.finfo(dtype).eps)
    assert np.all(np.abs(y - want) <= 2 * (c * fh * fw + 3) * eps * mag + 1e-300)


@pytest.mark.parametrize(
    "size",
    [(3, 19, 10, 17, 22), (1, 7, 200, 6, 5), (8, 130, 9, 33, 33), (1, 70, 203, 12, 13)],
    ids=["images", "channel-split", "deep-wide", "deep-channel-split"],
)
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pointwise_convolutions_match_direct_definition(
    stride: int, dtype: Any, size: tuple[int, ...]
) -> None:
    from computehal.backends.cpu._conv_pointwise import (
        pointwise_backward_data,
        pointwise_backward_filter,
        pointwise_forward,
    )

    n, c, k, h, w = size
    rng = np.random.default_rng(13)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    f = rng.standard_normal((k, c, 1, 1)).astype(dtype)
    bias = rng.standard_normal(k).astype(dtype)
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    gy = rng.standard_normal((n, k, oh, ow)).astype(dtype)
    sub = x[:, :, ::stride, ::stride].astype(np.float64)
    f2 = f.reshape(k, c).astype(np.float64)
    eps = float(np.finfo(dtype).eps)

    space = np.full(n * k * oh * ow + 64, np.nan, dtype=dtype)
    y = space[: n * k * oh * ow].reshape(n, k, oh, ow)
    pointwise_forward(x, f, bias, y, stride, stride)
    assert np.isnan(space[n * k * oh * ow :]).all()
    want = np.einsum("kc,nchw->nkhw", f2, sub) + bias[None, :, None, None]
    mag = np.einsum("kc,nchw->nkhw", np.abs(f2), np.abs(sub)) + np.abs(bias)[None, :, None, None]
    assert np.all(np.abs(y - want) <= 2 * (c + 3) * eps * mag)

    gx = np.full(x.shape, np.nan, dtype=dtype)
    pointwise_backward_data(gy, f, gx, stride, stride)
    want_gx = np.zeros(x.shape)
    want_gx[:, :, ::stride, ::stride] = np.einsum("kc,nkhw->nchw", f2, gy.astype(np.float64))
    mag_gx = np.zeros(x.shape)
    mag_gx[:, :, ::stride, ::stride] = np.einsum("kc,nkhw->nchw", np.abs(f2), np.abs(gy).astype(np.float64))
    assert np.all(np.abs(gx - want_gx) <= 2 * (k + 2) * eps * mag_gx)

    gf = np.full(f.shape, np.nan, dtype=dtype)
    pointwise_backward_filter(x, gy, gf, stride, stride)
    want_gf = np.einsum("nkhw,nchw->kc", gy.astype(np.float64), sub)
    mag_gf = np.einsum("nkhw,nchw->kc", np.abs(gy).astype(np.float64), np.abs(sub))
    assert np.all(np.abs(gf.reshape(k, c) - want_gf) <= 2 * (n * oh * ow + 2) * eps * mag_gf)


# --------------------------------------------------------------------------- softmax kernels


def _softmax64(x: Any, axis: int, log: bool) -> Any:
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float64)
        peak = np.max(x64, axis=axis, keepdims=True)
        e = np.exp(x64 - peak)
        total = e.sum(axis=axis, keepdims=True)
        return (x64 - peak) - np.log(total) if log else e / total


def _assert_softmax(got: Any, x: Any, axis: int, log: bool) -> None:
    """The conformance kit's softmax tolerance (log-softmax: also relative to 1), NaN where NaN."""
    want = _softmax64(x, axis, log)
    with np.errstate(invalid="ignore"):
        finite = np.nan_to_num(x.astype(np.float64), posinf=0.0, neginf=0.0)
        spread = np.abs(finite - np.fmax.reduce(finite, axis=axis, keepdims=True))
        scale = np.abs(np.nan_to_num(want)) + (1.0 if log else 0.0)
        tol = EPS32 * (16 + 4 * x.shape[axis] + 4 * spread) * scale + 2.0**-126
        ok = (np.abs(got - want) <= tol) | (np.isnan(got) & np.isnan(want)) | (got == want)
    assert ok.all(), f"{(~ok).sum()} entries off, first at {np.argwhere(~ok)[0]}"


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape", [(7, 1000), (1000, 7), (33, 61), (64, 4096)], ids=str)
def test_softmax_kernels_match_definition(shape: tuple[int, int], log: bool) -> None:
    import computehal.backends.cpu._ksoftmax as S

    rng = np.random.default_rng(17)
    for magnitude in (1.0, 400.0):
        x = (rng.standard_normal(shape) * magnitude).astype(F32)
        rows = np.full_like(x, 7.0)
        S.softmax_rows(x, rows, 0, shape[0], log, np.empty(shape[1], dtype=F32))
        _assert_softmax(rows, x, 1, log)
        cols = np.full_like(x, 7.0)
        S.softmax_columns(x, cols, 0, shape[1], log, np.empty((5, shape[1]), dtype=F32))
        _assert_softmax(cols, x, 0, log)
        S.softmax_columns(x, cols, 3, shape[1], log, np.empty((5, shape[1]), dtype=F32))  # a column range
        _assert_softmax(cols[:, 3:], x[:, 3:], 0, log)
        for stream in (False, True):
            panel = np.full_like(x, 7.0)
            w = shape[1] - 3
            S.softmax_panel(x, panel, 3, shape[1], log, np.empty((shape[0], w), F32), _work(w), stream)
            _assert_softmax(panel[:, 3:], x[:, 3:], 0, log)
            assert (panel[:, :3] == 7.0).all()  # nothing written outside the column range


def _work(width: int) -> Any:
    return np.empty((5, width), dtype=F32)


def test_softmax_exponential_against_float64() -> None:
    """exp_fast on x <= 0: within 2.5 ULP of float64 exp on [-10, 0] and 5 ULP down to the flush
    threshold (the range reduction's error grows with the exponent), 0 below it and for -inf,
    NaN (either sign) carried."""
    import computehal.backends.cpu._ksoftmax as S

    rng = np.random.default_rng(23)
    xs = np.concatenate(
        [
            -rng.exponential(4.0, 3000).astype(np.float32),
            np.linspace(-87.6, 0.0, 3000, dtype=np.float32),
            np.array([0.0, -0.0, -1e-45, -1e-30, -87.33, -87.34, -87.5], dtype=np.float32),
        ]
    )
    got = np.array([S.exp_fast(x) for x in xs], dtype=np.float64)
    want = np.exp(xs.astype(np.float64))
    normal = want >= 2.0**-126
    ulps = np.abs(got - want) / np.spacing(want.astype(np.float32))
    assert np.all(ulps[normal & (xs >= -10)] <= 2.5) and np.all(ulps[normal] <= 5)
    assert np.all(np.abs(got[~normal] - want[~normal]) <= 2.0**-126)  # subnormal or flushed results
    for x in (-87.7, -100.0, -1e30, -np.inf):
        assert S.exp_fast(np.float32(x)) == 0.0
    for x in (np.nan, -np.nan):
        assert math.isnan(S.exp_fast(np.float32(x)))


@pytest.mark.parametrize("log", [False, True])
def test_softmax_kernels_special_values_and_in_place(log: bool) -> None:
    import computehal.backends.cpu._ksoftmax as S

    rng = np.random.default_rng(19)
    x = rng.standard_normal((70, 45)).astype(F32)
    x[3, :] = -np.inf  # an all -inf row: NaN
    x[:, 5] = -np.inf  # an all -inf column: NaN
    x[7, 7], x[9, 9], x[11, 12], x[20, 20] = np.nan, np.inf, -np.inf, -np.nan
    x[: S.BLOCK_ROWS + 2, 30] = -np.inf  # -inf blocks, then finite values (the running sums restart)
    x[40, 40] = 1e30  # a huge value among ordinary ones
    rows, cols = x.copy(), x.copy()
    S.softmax_rows(rows, rows, 0, 70, log, np.empty(45, dtype=F32))
    _assert_softmax(rows, x, 1, log)
    S.softmax_columns(cols, cols, 0, 45, log, np.empty((5, 45), dtype=F32))
    _assert_softmax(cols, x, 0, log)
    for stream in (False, True):
        panel = x.copy()
        S.softmax_panel(panel, panel, 0, 45, log, np.empty((70, 45), dtype=F32), _work(45), stream)
        _assert_softmax(panel, x, 0, log)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_panel_across_blocks(log: bool) -> None:
    """The panel kernel over more rows than its blocks: columns -inf for whole blocks, a
    maximum growing block after block, NaN and +inf late; in place and out of place."""
    import computehal.backends.cpu._ksoftmax as S

    rows = 2 * S.PANEL_BLOCK_ROWS + 70
    rng = np.random.default_rng(23)
    x = rng.standard_normal((rows, 37)).astype(F32)
    x[: S.PANEL_BLOCK_ROWS + 2, 3] = -np.inf  # -inf blocks, then finite values
    x[:, 4] = np.arange(rows, dtype=F32) * F32(0.05)  # every block's maximum above the last
    x[:, 5] = -np.inf
    x[rows - 3, 6], x[rows - 5, 7] = np.nan, np.inf
    x[S.PANEL_BLOCK_ROWS + 9, 8] = 80.0  # a late maximum far above the earlier blocks
    for stream in (False, True):
        got = x.copy()
        S.softmax_panel(got, got, 0, 37, log, np.empty((rows, 37), dtype=F32), _work(37), stream)
        _assert_softmax(got, x, 0, log)
        out = np.full_like(x, 7.0)
        S.softmax_panel(x, out, 5, 30, log, np.empty((rows, 25), dtype=F32), _work(25), stream)
        _assert_softmax(out[:, 5:30], x[:, 5:30], 0, log)
        assert (out[:, :5] == 7.0).all() and (out[:, 30:] == 7.0).all()


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape", [(2, 1100, 40), (8, 1100, 64)], ids=str)
def test_backend_column_softmax_special_columns(
    cpu_backend: CpuBackend, shape: tuple[int, int, int], log: bool
) -> None:
    """Softmax over a strided axis through the public call (the panel kernel, several row
    blocks, a short last one; panels split in halves, or pulled where there are many):
    columns with NaN, +inf, only -inf, -inf entries, a late maximum, against the float64
    definition; the same in place."""
    rng = np.random.default_rng(29)
    x = (rng.standard_normal(shape) * 4).astype(F32)
    x[0, 700, 1], x[1, 1099, 2] = np.nan, np.nan  # NaN in the last (short) block
    x[0, 3, 3], x[1, 520, 4] = np.inf, np.inf
    x[:, :, 5] = -np.inf  # only -inf: NaN
    x[0, ::3, 6] = -np.inf  # -inf entries: 0 (log: -inf)
    x[1, :600, 7] = -np.inf  # a whole block -inf, then finite values
    x[0, 1050, 8] = 60.0  # a late maximum far above the earlier blocks
    px, py = cpu_backend.alloc(x.nbytes), cpu_backend.alloc(x.nbytes)
    try:
        cpu_backend.copy_htod(px, x)
        cpu_backend.softmax(px, py, list(shape), 1, log=log)
        got = np.empty_like(x)
        cpu_backend.copy_dtoh(got, py)
        _assert_softmax(got, x, 1, log)
        assert np.isnan(got[0, :, 1]).all() and np.isnan(got[:, :, 5]).all() and np.isnan(got[0, :, 3]).all()
        cpu_backend.softmax(px, px, list(shape), 1, log=log)  # in place
        cpu_backend.copy_dtoh(got, px)
        _assert_softmax(got, x, 1, log)
    finally:
        cpu_backend.free(px)
        cpu_backend.free(py)


# --------------------------------------------------------------------------- attention kernel


def _attention64(q: Any, k: Any, v: Any, scale: float, causal: bool, mask: Any = None) -> Any:
    """Direct definition in float64 for one head; rows that see no key are 0."""
    with np.errstate(all="ignore"):
        s = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
        if mask is not None:
            s = s + mask.astype(np.float64)
        if causal:
            offset = k.shape[0] - q.shape[0]
            hidden = np.arange(k.shape[0])[None, :] > np.arange(q.shape[0])[:, None] + offset
            s[hidden] = -np.inf
        peak = np.max(s, axis=1, keepdims=True)
        e = np.exp(s - np.where(np.isneginf(peak), 0.0, peak))
        total = e.sum(axis=1, keepdims=True)
        out = (e @ v.astype(np.float64)) / total
    out[(total == 0)[:, 0]] = 0.0
    return out


def _mask(kind: str, seq_q: int, seq_kv: int, rng: Any) -> Any:
    """None, a key-padding row broadcast over queries (stride 0), or a full mask with a hidden row."""
    if kind == "none":
        return None
    if kind == "keys":
        row = rng.standard_normal(seq_kv).astype(F32)
        row[seq_kv // 3] = -np.inf
        return (row, 0, 0, 1)  # broadcast over the queries: row stride 0
    if kind == "queries":
        column = rng.standard_normal(seq_q).astype(F32)
        return (column, 0, 1, 0)  # broadcast over the keys: column stride 0
    full = rng.standard_normal((seq_q, seq_kv)).astype(F32)
    full[seq_q // 2, :] = -np.inf  # a row that sees no key: 0
    return (full.reshape(-1), 0, seq_kv, 1)


def _dense(mask: Any, seq_q: int, seq_kv: int) -> Any:
    if mask is None:
        return None
    flat, origin, mq, mk = mask
    i, j = np.meshgrid(np.arange(seq_q), np.arange(seq_kv), indexing="ij")
    return flat[origin + i * mq + j * mk]


@pytest.mark.parametrize("mask_kind", ["none", "keys", "queries", "full"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "seq_q, seq_kv, dim, block_q, block_kv",
    [
        (37, 37, 8, 512, 512),
        (33, 50, 16, 7, 5),
        (50, 33, 16, 16, 9),
        (300, 300, 32, 64, 100),
        (129, 129, 64, 70, 64),
    ],
)
def test_attention_kernel_matches_definition(
    seq_q: int, seq_kv: int, dim: int, block_q: int, block_kv: int, causal: bool, mask_kind: str
) -> None:
    import computehal.backends.cpu._kattention as A

    rng = np.random.default_rng(23)
    q, o = rng.standard_normal((seq_q, dim)).astype(F32), np.full((seq_q, dim), np.nan, dtype=F32)
    k, v = rng.standard_normal((seq_kv, dim)).astype(F32), rng.standard_normal((seq_kv, dim)).astype(F32)
    scale = 1 / math.sqrt(dim)
    mask = _mask(mask_kind, seq_q, seq_kv, rng)
    view = A.no_mask() if mask is None else mask
    work = np.empty(A.attention_scratch(block_q, block_kv, dim), dtype=F32)
    for i0 in range(0, seq_q, block_q):
        i1 = min(seq_q, i0 + block_q)
        A.attention_rows(
            q, k, v, o, i0, i1, scale, causal, seq_kv - seq_q, block_kv, work, view, mask is not None
        )
    want = _attention64(q, k, v, scale, causal, _dense(mask, seq_q, seq_kv))
    # The kit's bound: scores off by their own rounding, the softmax and the sums by a few eps.
    tol = 8 * (seq_kv + dim + 8) * EPS32 * np.abs(v).max() + 1e-30
    assert np.all(np.abs(o - want) <= tol)
    if causal and seq_q > seq_kv:
        assert np.all(o[: seq_q - seq_kv] == 0)


def test_attention_kernel_nan_and_infinite_scores() -> None:
    import computehal.backends.cpu._kattention as A

    rng = np.random.default_rng(29)
    q, k, v = (rng.standard_normal((40, 8)).astype(F32) for _ in range(3))
    q[3, 2] = np.nan  # a NaN score row
    k[5, 1] = np.inf  # +inf / -inf scores in every row: NaN where +inf meets, weight 0 where -inf
    q[7] = 0  # 0 * inf = NaN for row 7 too
    o = np.empty_like(q)
    work = np.empty(A.attention_scratch(16, 8, 8), dtype=F32)
    for i0 in range(0, 40, 16):
        A.attention_rows(q, k, v, o, i0, min(40, i0 + 16), 0.5, True, 0, 8, work, A.no_mask(), False)
    want = _attention64(q, k, v, 0.5, True)
    assert np.array_equal(np.isnan(o), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.all(np.abs(o[finite] - want[finite]) <= 1e-5 * (1 + np.abs(want[finite])))


@pytest.mark.parametrize("pads", [[1, 1, 1, 1], [0, 2, 1, 0], [3, 3, 3, 3]])
def test_backend_small_image_data_gradient(cpu_backend: CpuBackend, pads: list[int]) -> None:
    """Small images take the im2col route for the data gradient; checked against the definition."""
    be = cpu_backend
    rng = np.random.default_rng(31)
    n, c, k, h, w = 2, 24, 20, 7, 6
    oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    f = rng.standard_normal((k, c, 3, 3)).astype(F32)
    gy = rng.standard_normal((n, k, oh, ow)).astype(F32)
    pgy, pf, pgx = be.alloc(gy.nbytes), be.alloc(f.nbytes), be.alloc(n * c * h * w * 4)
    try:
        be.copy_htod(pgy, gy)
        be.copy_htod(pf, f)
        be.conv2d_backward_data(pgy, list(gy.shape), pf, list(f.shape), pgx, [n, c, h, w], [1, 1], pads)
        gx = np.empty((n, c, h, w), dtype=F32)
        be.copy_dtoh(gx, pgx)
    finally:
        for ptr in (pgy, pf, pgx):
            be.free(ptr)
    # gx[h, w] = sum_k,r,s gy[h + top - r, w + left - s] f[k, :, r, s], gy zero outside.
    want = np.zeros((n, c, h, w))
    mag = np.zeros((n, c, h, w))
    padded = np.zeros((n, k, oh + 4 + h, ow + 4 + w))
    padded[:, :, 2 : 2 + oh, 2 : 2 + ow] = gy
    for r in range(3):
        for s in range(3):
            rows = slice(2 + pads[0] - r, 2 + pads[0] - r + h)
            cols = slice(2 + pads[1] - s, 2 + pads[1] - s + w)
            part = padded[:, :, rows, cols]
            want += np.einsum("kc,nkhw->nchw", f[:, :, r, s].astype(np.float64), part)
            mag += np.einsum("kc,nkhw->nchw", np.abs(f[:, :, r, s]).astype(np.float64), np.abs(part))
    assert np.all(np.abs(gx - want) <= 2 * (k * 9 + 2) * EPS32 * mag + 1e-30)


def test_thread_scratch_keeps_small_arrays_only() -> None:
    from computehal.backends.cpu._scratch import KEEP_BYTES, thread_scratch

    small = thread_scratch("test-scratch", 1000)
    assert thread_scratch("test-scratch", 500) is small  # reused, not shrunk
    assert thread_scratch("test-scratch", 2000).size >= 2000  # grown
    big = KEEP_BYTES // 4 + 1
    first, second = thread_scratch("test-big", big), thread_scratch("test-big", big)
    assert first is not second and first.size == big  # above the cap: per call, not held
