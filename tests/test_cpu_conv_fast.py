"""The CPU backend's convolution speed-ups against independent definitions.

The compiled product of :mod:`computehal.backends.cpu._kgemm` against float64 (and
nothing written outside its operands); the Winograd filter cache never serving a
transform for bytes the filter no longer holds; im2col's after-the-fact finiteness
check keeping inf and NaN to the outputs that read them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from computehal.backends.cpu import CpuBackend
from computehal.backends.cpu._conv_winograd import winograd_forward
from test_cpu_perf import F32, _backend_conv, _data, _forward64, _within_kit_tolerance


@pytest.mark.parametrize(
    "rows, depth, width, block, chunk",
    [
        (9, 3, 37, 32, 3),
        (16, 64, 100, 64, 64),
        (7, 1, 5, 32, 1),
        (24, 20, 64, 32, 8),
        (17, 150, 70, 64, 64),
        (8, 64, 49, 576, 64),
        (12, 70, 196, 576, 32),
        (5, 4, 20, 48, 4),
    ],
)
def test_compiled_product_matches_float64_and_stays_inside(
    rows: int, depth: int, width: int, block: int, chunk: int
) -> None:
    """The compiled convolution product: y = f @ x + bias on strided rows, nothing else written."""
    # numba is a core dependency: a kernel module that fails to compile is a failure.
    from computehal.backends.cpu import _kgemm as compiled

    rng = np.random.default_rng(17)
    f_ld, x_ld, y_ld = depth + 3, width + 5, width + 7
    f = rng.standard_normal(rows * f_ld).astype(np.float32)
    x = rng.standard_normal(depth * x_ld).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    y = np.full(rows * y_ld + 40, np.nan, dtype=np.float32)
    compiled.product(f, f_ld, x, x_ld, bias, y, y_ld, rows, depth, width, block, chunk)
    fm = f.reshape(rows, f_ld)[:, :depth].astype(np.float64)
    xm = x.reshape(depth, x_ld)[:, :width].astype(np.float64)
    want = fm @ xm + bias[:, None]
    mag = np.abs(fm) @ np.abs(xm) + np.abs(bias)[:, None]
    got = y[: rows * y_ld].reshape(rows, y_ld)
    assert np.all(np.abs(got[:, :width] - want) <= 2 * (depth + 2) * np.finfo(np.float32).eps * mag)
    assert np.isnan(got[:, width:]).all() and np.isnan(y[rows * y_ld :]).all()


@pytest.mark.parametrize("tile", [4, 2])
def test_winograd_cache_never_serves_a_changed_filter(tile: int) -> None:
    """The transformed filter is reused only for the bytes it was made from (same address, new values)."""
    from computehal.backends.cpu import _winograd_cache

    _winograd_cache.clear()
    shape = (2, 20, 18, 11, 13, (1, 1, 1, 1))
    x, f, _ = _data(shape, 5)
    pads = shape[5]
    rng = np.random.default_rng(7)
    for step in range(5):
        if step == 3:
            f[...] = rng.standard_normal(f.shape).astype(F32)  # written in place: same address
        want = _forward64(x, f, pads)
        mag = _forward64(np.abs(x), np.abs(f), pads)
        y = np.full(want.shape, np.nan, dtype=F32)
        assert winograd_forward(x, f, None, y, pads[0], pads[1], tile)
        _within_kit_tolerance(y, want, mag, x.shape[1] * 9)
        # Stored from the second sighting of the same bytes on.
        assert (_winograd_cache.lookup(f, tile) is not None) == (step in (1, 2, 4))
    _winograd_cache.clear()


def test_cached_only_winograd_declines_a_new_filter() -> None:
    from computehal.backends.cpu import _winograd_cache

    _winograd_cache.clear()
    x, f, _ = _data((1, 16, 16, 9, 9, (1, 1, 1, 1)), 6)
    y = np.full((1, 16, 9, 9), np.nan, dtype=F32)
    assert not winograd_forward(x, f, None, y, 1, 1, 4, cached_only=True)
    assert np.isnan(y).all()  # nothing written
    assert winograd_forward(x, f, None, y, 1, 1, 4, cached_only=True)  # seen before: transformed, stored
    assert _winograd_cache.lookup(f, 4) is not None
    _within_kit_tolerance(
        y, _forward64(x, f, (1, 1, 1, 1)), _forward64(np.abs(x), np.abs(f), (1, 1, 1, 1)), 144
    )
    _winograd_cache.clear()


def test_backend_cached_winograd_follows_filter_writes(cpu_backend: CpuBackend) -> None:
    """A shape that takes Winograd only with a cached transform: right before, while and after caching."""
    be = cpu_backend
    from computehal import validation as v
    from computehal.backends.cpu import _winograd_cache
    from computehal.backends.cpu._conv_select import cached_winograd_tile
    from computehal.memory import Region

    _winograd_cache.clear()
    region = Region(None, 0, 0)  # type: ignore[arg-type]
    probe = v.ConvForwardProblem(
        2, 48, 15, 15, 48, 3, 3, 15, 15, 1, 1, 1, 1, region, region, region, np.dtype(F32), pb=1, pr=1
    )
    assert cached_winograd_tile(probe) == 4
    x, f, _ = _data((2, 48, 48, 15, 15, (1, 1, 1, 1)), 10)
    px, pf, py = be.alloc(x.nbytes), be.alloc(f.nbytes), be.alloc(2 * 48 * 15 * 15 * 4)
    try:
        be.copy_htod(px, x)
        for step in range(6):
            if step in (0, 4):
                f = np.random.default_rng(step).standard_normal(f.shape).astype(F32)
                be.copy_htod(pf, f)
            be.conv2d_forward(px, list(x.shape), pf, list(f.shape), py, [2, 48, 15, 15], [1, 1], [1, 1])
            got = np.empty((2, 48, 15, 15), dtype=F32)
            be.copy_dtoh(got, py)
            want = _forward64(x, f, (1, 1, 1, 1))
            _within_kit_tolerance(got, want, _forward64(np.abs(x), np.abs(f), (1, 1, 1, 1)), 48 * 9)
            view = be.host_view(pf, f.nbytes)
            assert view is not None
            stored = _winograd_cache.lookup(np.frombuffer(view, dtype=F32).reshape(f.shape), 4)
            assert (stored is not None) == (step in (1, 2, 3, 5))
    finally:
        for ptr in (px, pf, py):
            be.free(ptr)


def test_backend_frozen_filter_transform_kept_unchecked_and_dropped_on_free(cpu_backend: CpuBackend) -> None:
    """A frozen filter: its transform is kept on the first call under the allocation's serial
    (no copy of the filter), served after, dropped when the allocation is freed; a new
    filter at a reused address is never served the old transform."""
    be = cpu_backend
    from computehal.backends.cpu import _winograd_cache

    _winograd_cache.clear()
    x, f, _ = _data((2, 48, 48, 15, 15, (1, 1, 1, 1)), 11)
    px, py = be.alloc(x.nbytes), be.alloc(2 * 48 * 15 * 15 * 4)
    try:
        be.copy_htod(px, x)
        for seed in (12, 13):
            f = np.random.default_rng(seed).standard_normal(f.shape).astype(F32)
            pf = be.alloc(f.nbytes)
            be.copy_htod(pf, f)
            be.freeze(pf)
            serial = be.allocation_of(pf).serial  # type: ignore[union-attr]
            for _ in range(2):
                be.conv2d_forward(px, list(x.shape), pf, list(f.shape), py, [2, 48, 15, 15], [1, 1], [1, 1])
                got = np.empty((2, 48, 15, 15), dtype=F32)
                be.copy_dtoh(got, py)
                want = _forward64(x, f, (1, 1, 1, 1))
                _within_kit_tolerance(got, want, _forward64(np.abs(x), np.abs(f), (1, 1, 1, 1)), 48 * 9)
                kept = [entry for key, entry in _winograd_cache._entries.items() if key[0] == (serial, 0)]
                assert len(kept) == 1 and kept[0][0] is None  # no copy of the filter
            be.free(pf)
            assert not any(key[0] == (serial, 0) for key in _winograd_cache._entries)
    finally:
        for ptr in (px, py):
            be.free(ptr)


def test_backend_im2col_nonfinite_filter_reaches_only_readers(cpu_backend: CpuBackend) -> None:
    """Filter larger than the output (checked after im2col): a corner tap's inf spares padding outputs."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 128, 7, 7)).astype(F32)
    f = rng.standard_normal((128, 128, 3, 3)).astype(F32)
    f[3, 5, 0, 0] = np.inf
    want = np.zeros((1, 128, 7, 7))
    with np.errstate(invalid="ignore"):
        for r in range(3):
            for s in range(3):
                h0, h1, w0, w1 = max(0, 1 - r), min(7, 8 - r), max(0, 1 - s), min(7, 8 - s)
                win = x[0, :, h0 + r - 1 : h1 + r - 1, w0 + s - 1 : w1 + s - 1].astype(np.float64)
                want[0, :, h0:h1, w0:w1] += np.einsum("kc,chw->khw", f[:, :, r, s].astype(np.float64), win)
    got = _backend_conv(cpu_backend, x, f, [1, 1, 1, 1])
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    assert np.isfinite(got[0, 3, 0, :]).all() and np.isfinite(got[0, 3, :, 0]).all()
    finite = np.isfinite(want)
    assert np.allclose(got[finite], want[finite], rtol=1e-4, atol=1e-3)


def _strided_forward64(
    x: Any, f: Any, bias: Any, pads: tuple[int, int, int, int], stride: tuple[int, int]
) -> Any:
    """The direct definition in float64, tap by tap over the zero-padded input."""
    pt, pl, pb, pr = pads
    sh, sw = stride
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    k, _, fh, fw = f.shape
    oh, ow = (xp.shape[2] - fh) // sh + 1, (xp.shape[3] - fw) // sw + 1
    out = np.zeros((x.shape[0], k, oh, ow)) + (
        0 if bias is None else bias.astype(np.float64)[None, :, None, None]
    )
    for r in range(fh):
        for s in range(fw):
            win = xp[:, :, r : r + (oh - 1) * sh + 1 : sh, s : s + (ow - 1) * sw + 1 : sw]
            out += np.einsum("kc,nchw->nkhw", f[:, :, r, s].astype(np.float64), win)
    return out


@pytest.mark.parametrize(
    "n, c, k, hw, fhw, stride, pads, with_bias",
    [
        (5, 3, 64, (40, 38), (7, 7), (2, 2), (3, 3, 3, 3), True),  # the stem's geometry, whole-image tasks
        (1, 3, 13, (33, 70), (7, 5), (2, 3), (3, 1, 2, 0), False),  # one image: row-block tasks
        (2, 4, 9, (20, 50), (3, 3), (1, 1), (0, 2, 1, 1), True),
        (3, 1, 8, (9, 64), (1, 1), (1, 2), (0, 0, 0, 0), True),
    ],
)
def test_direct_forward_matches_float64(
    n: int, c: int, k: int, hw: tuple[int, int], fhw: tuple[int, int], stride: Any, pads: Any, with_bias: bool
) -> None:
    """The im2col-free kernel (phase-split input, tap table) against the definition, any stride / padding."""
    from computehal.backends.cpu._conv_direct import direct_forward

    rng = np.random.default_rng(23)
    x = rng.standard_normal((n, c, *hw)).astype(F32)
    f = rng.standard_normal((k, c, *fhw)).astype(F32)
    bias = rng.standard_normal(k).astype(F32) if with_bias else None
    want = _strided_forward64(x, f, bias, pads, stride)
    mag = _strided_forward64(np.abs(x), np.abs(f), None if bias is None else np.abs(bias), pads, stride)
    guarded = np.full(want.size + 64, np.nan, dtype=F32)
    y = guarded[: want.size].reshape(want.shape)
    direct_forward(x, f, bias, y, (pads[0], pads[1], stride[0], stride[1]))
    _within_kit_tolerance(y, want, mag, c * fhw[0] * fhw[1])
    assert np.isnan(guarded[want.size :]).all()  # nothing stored past the output
    # An output that is not one contiguous block (computed aside, then copied).
    wide = np.full((*want.shape[:3], want.shape[3] + 5), np.nan, dtype=F32)
    direct_forward(x, f, bias, wide[..., 2:-3], (pads[0], pads[1], stride[0], stride[1]))
    _within_kit_tolerance(wide[..., 2:-3], want, mag, c * fhw[0] * fhw[1])
    assert np.isnan(wide[..., :2]).all() and np.isnan(wide[..., -3:]).all()


@pytest.mark.parametrize("poison", [False, True])
def test_backend_stem_shape_matches_definition(cpu_backend: CpuBackend, poison: bool) -> None:
    """A stem-shaped layer through the backend (the direct kernel, or with an inf in the filter the
    exact path): within the kit's tolerance, and only the outputs that read the inf tap are inf."""
    rng = np.random.default_rng(31)
    x = rng.standard_normal((2, 3, 64, 64)).astype(F32)
    f = rng.standard_normal((16, 3, 7, 7)).astype(F32)
    if poison:
        f[2, 1, 0, 0] = np.inf
    be = cpu_backend
    px, pf, py = be.alloc(x.nbytes), be.alloc(f.nbytes), be.alloc(2 * 16 * 32 * 32 * 4)
    try:
        be.copy_htod(px, x)
        be.copy_htod(pf, f)
        be.conv2d_forward(px, list(x.shape), pf, list(f.shape), py, [2, 16, 32, 32], [2, 2], [3, 3, 3, 3])
        got = np.empty((2, 16, 32, 32), dtype=F32)
        be.copy_dtoh(got, py)
    finally:
        for ptr in (px, pf, py):
            be.free(ptr)
    finite_f = np.where(np.isinf(f), 0, f)
    want = _strided_forward64(x, finite_f, None, (3, 3, 3, 3), (2, 2))
    mag = _strided_forward64(np.abs(x), np.abs(finite_f), None, (3, 3, 3, 3), (2, 2))
    if poison:
        # Tap (0, 0) of channel 1 reads input (2 o - 3, 2 q - 3): inside the image from o, q >= 2.
        want[:, 2, 2:, 2:] += np.inf * np.sign(x[:, 1, 1:61:2, 1:61:2])
    assert np.array_equal(np.isinf(got), np.isinf(want)) and not np.isnan(got).any()
    finite = np.isfinite(want)
    _within_kit_tolerance(got[finite], want[finite], mag[finite], 3 * 49)


@pytest.mark.parametrize("tile", [4, 2])
@pytest.mark.parametrize(
    "shape, block",
    [
        ((1, 24, 40, 14, 14, (1, 1, 1, 1)), 16),  # blocks of 16 output channels, the last one partial
        ((2, 17, 23, 9, 11, (0, 0, 0, 0)), 32),  # one block narrower than asked; several images
        ((1, 33, 48, 10, 7, (2, 0, 1, 2)), 21),  # a block rounded down to 16 channels; asymmetric padding
    ],
    ids=str,
)
def test_streamed_winograd_within_kit_tolerance(shape: tuple[Any, ...], block: int, tile: int) -> None:
    """The filter transformed per block of output channels: every output written, within the kit's bound."""
    from computehal.backends.cpu._conv_winograd import winograd_streamed

    x, f, _ = _data(shape, 21)
    pads = shape[5]
    for bias in (np.random.default_rng(22).standard_normal(f.shape[0]).astype(F32), None):
        b64 = np.zeros(f.shape[0]) if bias is None else bias.astype(np.float64)
        want = _forward64(x, f, pads) + b64[None, :, None, None]
        mag = _forward64(np.abs(x), np.abs(f), pads) + np.abs(b64)[None, :, None, None]
        y = np.full(want.shape, np.nan, dtype=F32)
        assert winograd_streamed(x, f, bias, y, pads[0], pads[1], tile, block)
        _within_kit_tolerance(y, want, mag, x.shape[1] * 9)


@pytest.mark.parametrize("where", ["input", "filter"])
@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_streamed_winograd_declines_non_finite_operands(where: str, value: float) -> None:
    from computehal.backends.cpu._conv_winograd import winograd_streamed

    x, f, _ = _data((1, 16, 40, 9, 9, (1, 1, 1, 1)), 23)
    (x if where == "input" else f)[0 if where == "input" else 37, 3, 2, 2] = value
    y = np.empty((1, 40, 9, 9), dtype=F32)
    assert not winograd_streamed(x, f, None, y, 1, 1, 4, 16)
    assert not winograd_streamed(x, f, None, y, 1, 1, 2, 16)


def test_backend_streamed_winograd_selection_and_nan_semantics(
    cpu_backend: CpuBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One image, many channels: the streamed schedule, exact where finite, inf and NaN as defined."""
    from computehal import validation as v
    from computehal.backends.cpu import _conv_select as select
    from computehal.memory import Region

    region = Region(None, 0, 0)  # type: ignore[arg-type]

    def probe(n: int, c: int, size: int) -> Any:
        dims = (n, c, size, size, c, 3, 3, size, size, 1, 1, 1, 1)
        return v.ConvForwardProblem(*dims, region, region, region, np.dtype(F32), pb=1, pr=1)

    # ResNet-50 at batch 1: 128 channels at 28x28 by F(4x4, 3x3); not at batch 8, nor
    # where the transformed filter is small (64 channels at 56x56), nor by F(2x2, 3x3).
    assert select.streamed_winograd_tile(probe(1, 128, 28)) == 4
    assert select.streamed_winograd_tile(probe(1, 256, 14)) == 0
    assert select.streamed_winograd_tile(probe(8, 128, 28)) == 0
    assert select.streamed_winograd_tile(probe(1, 64, 56)) == 0
    monkeypatch.setattr(select, "STREAMED_MIN_FILTER_BYTES", 0)
    assert select.streamed_winograd_tile(probe(1, 32, 28)) == 4
    x, f, _ = _data((1, 32, 32, 28, 28, (1, 1, 1, 1)), 24)
    want = _forward64(x, f, (1, 1, 1, 1))
    mag = _forward64(np.abs(x), np.abs(f), (1, 1, 1, 1))
    _within_kit_tolerance(_backend_conv(cpu_backend, x, f, [1, 1, 1, 1]), want, mag, 32 * 9)
    for operand in ("input", "filter"):
        xs, fs = x.copy(), f.copy()
        if operand == "input":
            xs[0, 5, 3, 9] = np.inf
        else:
            fs[7, 2, 1, 1] = np.nan  # the centre tap: every output reads it
        got = _backend_conv(cpu_backend, xs, fs, [1, 1, 1, 1])
        with np.errstate(invalid="ignore"):
            want = _forward64(xs, fs, (1, 1, 1, 1))
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
        finite = np.isfinite(want)
        tol = 2 * (32 * 9 + 2) * float(np.finfo(F32).eps) * mag[finite] + 1e-30
        assert np.all(np.abs(got[finite] - want[finite]) <= tol)


@pytest.mark.parametrize("tile", [4, 2])
def test_cached_winograd_by_position_never_serves_a_changed_filter(tile: int) -> None:
    """A stored transform run by position: rewritten bytes, then one changed value, are seen."""
    from computehal.backends.cpu import _winograd_cache

    _winograd_cache.clear()
    x, f, _ = _data((1, 48, 160, 14, 14, (1, 1, 1, 1)), 25)  # 36 C K above the fused schedule's limit
    bias = np.random.default_rng(26).standard_normal(160).astype(F32)
    rng = np.random.default_rng(27)
    for step in range(8):
        if step == 3:
            f[...] = rng.standard_normal(f.shape).astype(F32)  # same address, other bytes
        if step == 5:
            f[159, 47, 2, 2] += 1.0  # after step 4 stored the new bytes: only the last value differs
        y = np.full((1, 160, 14, 14), np.nan, dtype=F32)
        assert winograd_forward(x, f, bias, y, 1, 1, tile)
        want = _forward64(x, f, (1, 1, 1, 1)) + bias[None, :, None, None]
        mag = _forward64(np.abs(x), np.abs(f), (1, 1, 1, 1)) + np.abs(bias)[None, :, None, None]
        _within_kit_tolerance(y, want, mag, 48 * 9)
    x[0, 1, 2, 3] = np.nan
    assert not winograd_forward(x, f, bias, y, 1, 1, tile)
    _winograd_cache.clear()


#: (N, C, K, H, W, F, stride, pad, algorithm taken): ReLU applied as each algorithm stores its blocks.
RELU_SHAPES = [
    ((1, 16, 16, 48, 48, 3, 1, 1), "winograd"),  # F(4x4, 3x3), fused schedule
    ((1, 48, 160, 28, 28, 3, 1, 1), "winograd"),  # by position
    ((1, 56, 56, 14, 14, 3, 1, 1), "im2col"),  # F(2x2, 3x3) once its transform is cached
    ((1, 8, 16, 40, 40, 3, 2, 1), "im2col"),  # tasks of pixel blocks
    ((1, 4, 150, 7, 7, 3, 1, 1), "im2col"),  # shared columns, the filter checked first
    ((1, 8, 150, 7, 7, 3, 1, 1), "im2col"),  # shared columns, the output checked after: ReLU after it
    ((1, 3, 16, 64, 64, 7, 2, 3), "direct"),  # the stem's kernel
]


@pytest.mark.parametrize("shape, algorithm", RELU_SHAPES, ids=str)
def test_backend_fused_relu_matches_definition(
    cpu_backend: CpuBackend, shape: tuple[int, ...], algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """conv + bias + ReLU with the ReLU applied inside each algorithm: the definition, NaN -> 0."""
    from computehal import validation as v
    from computehal.backends.cpu import _conv_select as select
    from computehal.memory import Region
    from test_cpu_perf import _direct64

    be = cpu_backend
    n, c, k, h, w, fs, st, pad = shape
    oh = ow = (h + 2 * pad - fs) // st + 1
    region = Region(None, 0, 0)  # type: ignore[arg-type]
    dims = (n, c, h, w, k, fs, fs, oh, ow, st, st, pad, pad)
    probe = v.ConvForwardProblem(*dims, region, region, region, np.dtype(F32), pb=pad, pr=pad)
    assert select.forward_algorithm(probe, np.empty(0, F32)) == algorithm
    rng = np.random.default_rng(31)
    x = rng.standard_normal((n, c, h, w)).astype(F32)
    f = rng.standard_normal((k, c, fs, fs)).astype(F32)
    bias = rng.standard_normal(k).astype(F32)
    x[0, 0, h // 2, w // 2] = np.nan  # on the exact paths (Winograd declines): ReLU maps its outputs to 0
    ptrs = [be.alloc(a.nbytes) for a in (x, f, bias)] + [be.alloc(n * k * oh * ow * 4)]
    try:
        for ptr, a in zip(ptrs, (x, f, bias), strict=False):
            be.copy_htod(ptr, a)
        for finite in (True, False):
            xs = np.nan_to_num(x) if finite else x
            be.copy_htod(ptrs[0], xs)
            geometry = ((st, st), (pad, pad, pad, pad), (1, 1))
            with np.errstate(invalid="ignore"):
                conv = _direct64(xs, f, *geometry) + bias[None, :, None, None]
            mag = (
                _direct64(np.abs(np.nan_to_num(xs)), np.abs(f), *geometry) + np.abs(bias)[None, :, None, None]
            )
            want = np.where(conv > 0, conv, 0.0)  # NaN -> 0, as the unary RELU
            tol = 2 * (c * fs * fs + 3) * float(np.finfo(F32).eps) * mag
            for _ in range(3):  # the third call runs a cached Winograd transform
                y = np.full((n, k, oh, ow), np.nan, dtype=F32)
                be.copy_htod(ptrs[3], y)
                be.conv2d_forward(
                    ptrs[0], list(x.shape), ptrs[1], list(f.shape), ptrs[3], [n, k, oh, ow], [st, st],
                    [pad, pad], bias_ptr=ptrs[2], activation="relu",
                )  # fmt: skip
                be.copy_dtoh(y, ptrs[3])
                assert np.all(np.abs(y - want) <= tol), (finite, np.argwhere(~(np.abs(y - want) <= tol))[:3])
    finally:
        for ptr in ptrs:
            be.free(ptr)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("size", [(2, 70, 19, 12, 11), (1, 150, 37, 14, 14), (1, 16, 200, 4, 7)])
def test_pointwise_epilogue_matches_separate_passes(
    size: tuple[int, ...], residual: bool, relu: bool
) -> None:
    """The compiled 1x1 forward with its epilogue: bit for bit the convolution, then ``relu(y + r)``."""
    from computehal.backends.cpu import _kepilogue as separate
    from computehal.backends.cpu._conv_pointwise import pointwise_forward

    n, c, k, h, w = size
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    f = rng.standard_normal((k, c, 1, 1)).astype(np.float32)
    bias = rng.standard_normal(k).astype(np.float32)
    r = rng.standard_normal(n * k * h * w).astype(np.float32)
    r[::7] = np.nan
    r[1::11] = -np.inf
    plain = np.empty((n, k, h, w), dtype=np.float32)
    assert pointwise_forward(x, f, bias, plain, 1, 1)
    want = plain.reshape(-1).copy()
    if residual and relu:
        separate.add_relu_into(want, r)
    elif residual:
        separate.add_into(want, r)
    elif relu:
        separate.relu_into(want)
    space = np.full(want.size + 40, 7.0, dtype=np.float32)
    y = space[: want.size].reshape(plain.shape)
    assert pointwise_forward(x, f, bias, y, 1, 1, (r if residual else None, relu))
    np.testing.assert_array_equal(y.reshape(-1).view(np.int32), want.view(np.int32))
    assert (space[want.size :] == 7.0).all()


def test_backend_fused_pointwise_epilogue(cpu_backend: CpuBackend) -> None:
    """conv2d_forward of a 1x1 layer with ReLU and a residual (the output as residual too), or ReLU alone."""
    be = cpu_backend
    n, c, k, h, w = 1, 96, 64, 12, 12
    rng = np.random.default_rng(8)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    f = rng.standard_normal((k, c, 1, 1)).astype(np.float32)
    r = rng.standard_normal((n, k, h, w)).astype(np.float32)
    conv = np.einsum("kc,nchw->nkhw", f[:, :, 0, 0].astype(np.float64), x.astype(np.float64))
    wants = {True: np.maximum(conv + r, 0), False: np.maximum(conv, 0)}
    mag = np.einsum("kc,nchw->nkhw", np.abs(f[:, :, 0, 0]).astype(np.float64), np.abs(x)) + np.abs(r)
    px, pf, pr, py = be.alloc(x.nbytes), be.alloc(f.nbytes), be.alloc(r.nbytes), be.alloc(r.nbytes)
    try:
        for ptr, a in ((px, x), (pf, f), (pr, r), (py, r)):
            be.copy_htod(ptr, a)
        for res in (pr, py, None):
            be.conv2d_forward(
                px, [n, c, h, w], pf, [k, c, 1, 1], py, [n, k, h, w], [1, 1], [0, 0],
                residual_ptr=res, activation="relu",
            )  # fmt: skip
            got = np.empty_like(r)
            be.copy_dtoh(got, py)
            want = wants[res is not None]
            assert np.all(np.abs(got - want) <= 2 * (c + 2) * np.finfo(np.float32).eps * mag)
            be.copy_htod(py, r)
    finally:
        for ptr in (px, pf, pr, py):
            be.free(ptr)


@pytest.mark.parametrize("positions, tiles, cin, kout", [(16, 49, 37, 150), (36, 7, 5, 64), (2, 13, 70, 3)])
def test_winograd_position_products_match_float64(positions: int, tiles: int, cin: int, kout: int) -> None:
    """M[xi] = V[xi] @ U[xi] with U in 64-channel panels (the last narrower), M written only."""
    from computehal.backends.cpu import _kwinograd

    rng = np.random.default_rng(3)
    v = rng.standard_normal((positions, tiles, cin)).astype(F32)
    u = rng.standard_normal((positions, cin, kout)).astype(F32)
    edges = list(range(0, kout, _kwinograd.PANEL)) + [kout]
    panels = np.concatenate([u[:, :, a:b].reshape(-1) for a, b in zip(edges[:-1], edges[1:], strict=True)])
    m = np.full(positions * tiles * kout + 17, np.nan, dtype=F32)
    _kwinograd.position_products(v.reshape(-1), panels, m, 0, positions, tiles, cin, kout, positions)
    want = v.astype(np.float64) @ u.astype(np.float64)
    mag = np.abs(v.astype(np.float64)) @ np.abs(u.astype(np.float64))
    got = m[: positions * tiles * kout].reshape(want.shape)
    assert np.all(np.abs(got - want) <= 2 * (cin + 2) * np.finfo(np.float32).eps * mag)
    assert np.isnan(m[positions * tiles * kout :]).all()


@pytest.mark.parametrize("relu", [False, True])
def test_winograd_streamed_blocks_match_definition(relu: bool) -> None:
    """The streamed schedule over several 64-channel blocks and a narrower last one: bias, ReLU, NaN."""
    from computehal.backends.cpu._conv_winograd import winograd_streamed

    shape = (1, 19, 150, 10, 9, (1, 2, 1, 0))
    x, f, _ = _data(shape, 12)
    pads = shape[5]
    bias = np.random.default_rng(4).standard_normal(f.shape[0]).astype(F32)
    want = _forward64(x, f, pads) + bias[None, :, None, None]
    mag = _forward64(np.abs(x), np.abs(f), pads) + np.abs(bias)[None, :, None, None]
    y = np.full(want.shape, np.nan, dtype=F32)
    assert winograd_streamed(x, f, bias, y, pads[0], pads[1], 4, 64, relu)
    if relu:
        want = np.maximum(want, 0.0)  # ReLU moves no value further from the definition
        assert np.all(y >= 0)
    _within_kit_tolerance(y, want, mag, x.shape[1] * 9)
    f[100, 3, 1, 1] = np.nan
    assert not winograd_streamed(x, f, bias, y, pads[0], pads[1], 4, 64, relu)


@pytest.mark.parametrize(
    "c, k, h, w, stride, pads",
    [
        (120, 53, 7, 7, (1, 1), (1, 1, 1, 1)),  # 49 pixels, channel blocks not multiples of 6
        (114, 20, 13, 11, (2, 2), (1, 0, 1, 2)),  # strided, asymmetric padding, 7 x 6 pixels
        (130, 7, 8, 8, (1, 2), (0, 0, 0, 0)),  # no padding, fewer channels than one row tile
    ],
)
@pytest.mark.parametrize("relu", [False, True])
def test_deep_small_image_forward_matches_definition(
    c: int, k: int, h: int, w: int, stride: tuple[int, int], pads: tuple[int, ...], relu: bool
) -> None:
    """One small deep image on the dense-layer product: bias, ReLU (NaN -> 0), nothing else written."""
    from computehal.backends.cpu._conv_deep import deep_applies, deep_forward
    from test_cpu_perf import _direct64

    rng = np.random.default_rng(21)
    x = rng.standard_normal((1, c, h, w)).astype(F32)
    f = rng.standard_normal((k, c, 3, 3)).astype(F32)
    bias = rng.standard_normal(k).astype(F32)
    want = _direct64(x, f, stride, pads, (1, 1)) + bias[None, :, None, None]
    mag = _direct64(np.abs(x), np.abs(f), stride, pads, (1, 1)) + np.abs(bias)[None, :, None, None]
    assert deep_applies(1, c * 9, want.shape[2] * want.shape[3], False)
    y = np.full(want.shape, np.nan, dtype=F32)
    deep_forward(x, f, bias, y, (pads[0], pads[1], *stride, 1, 1), relu)
    if relu:
        want = np.maximum(want, 0.0)
    assert np.all(np.abs(y - want) <= 2 * (c * 9 + 3) * np.finfo(np.float32).eps * mag)
    x[0, 5, 2, 3] = np.nan  # a NaN input reaches exactly the outputs that read it (0 after ReLU)
    deep_forward(x, f, None, y, (pads[0], pads[1], *stride, 1, 1), relu)
    with np.errstate(invalid="ignore"):
        reach = np.isnan(_direct64(x, f, stride, pads, (1, 1)))
    assert reach.any()
    assert np.array_equal(np.isnan(y), reach & (not relu))
    assert np.all(y[reach] == 0) if relu else True


def test_backend_deep_small_image_keeps_nan_semantics(cpu_backend: CpuBackend) -> None:
    """Through the backend: a NaN filter value reaches padded outputs exactly as the definition says."""
    from computehal import validation as v
    from computehal.backends.cpu._conv_select import forward_algorithm
    from computehal.memory import Region
    from test_cpu_perf import _direct64

    region = Region(None, 0, 0)  # type: ignore[arg-type]
    probe = v.ConvForwardProblem(
        1, 128, 7, 7, 64, 3, 3, 7, 7, 1, 1, 1, 1, region, region, region, np.dtype(F32), pb=1, pr=1
    )
    assert forward_algorithm(probe, np.zeros(1, dtype=F32)) == "im2col"
    x, f, _ = _data((1, 128, 64, 7, 7, (1, 1, 1, 1)), 13)
    want = _direct64(x, f, (1, 1), (1, 1, 1, 1), (1, 1))
    mag = _direct64(np.abs(x), np.abs(f), (1, 1), (1, 1, 1, 1), (1, 1))
    tol = 2 * (128 * 9 + 3) * np.finfo(F32).eps * mag
    got = _backend_conv(cpu_backend, x, f, [1, 1, 1, 1])
    assert np.all(np.abs(got - want) <= tol)
    # Tap (0, 0) of filter 3: padding (not multiplied) for the first output row and column.
    f[3, 7, 0, 0] = np.nan
    got = _backend_conv(cpu_backend, x, f, [1, 1, 1, 1])
    reach = np.zeros(want.shape, dtype=bool)
    reach[0, 3, 1:, 1:] = True
    assert np.array_equal(np.isnan(got), reach)
    fine = ~reach
    fine[0, 3] = False
    assert np.all(np.abs(got[fine] - want[fine]) <= tol[fine])
