"""The CPU backend's 1x1 convolutions of one small deep image on the dense-layer product.

Against an independent float64 definition: bias, residual and ReLU, 49-pixel images,
channel counts off the kernel's tiles, stride 2, inf and NaN in the input and the filter,
and nothing written past the output.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from computehal.backends.cpu import CpuBackend

F32 = np.float32
EPS = float(np.finfo(F32).eps)


def _want(x: Any, f: Any, bias: Any, r: Any, relu: bool, s: int) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Float64 definition and magnitude: relu(sum_c f[k, c] x[c, s i, s j] + bias + r), ReLU(NaN) = 0."""
    k, c = f.shape[0], f.shape[1]
    xs = x[:, :, ::s, ::s].astype(np.float64)
    f64 = f.reshape(k, c).astype(np.float64)
    with np.errstate(all="ignore"):
        out = np.einsum("kc,nchw->nkhw", f64, xs)
        mag = np.einsum("kc,nchw->nkhw", np.abs(f64), np.abs(xs))
    if bias is not None:
        out = out + bias.astype(np.float64)[None, :, None, None]
        mag = mag + np.abs(bias.astype(np.float64))[None, :, None, None]
    if r is not None:
        out = out + r.reshape(out.shape)
        mag = mag + np.abs(r.reshape(out.shape))
    if relu:
        clamped = np.isnan(out) | (out == -np.inf)
        out = np.where(np.isnan(out), 0.0, np.maximum(out, 0.0))
        mag = np.where(clamped, 0.0, mag)
    return out, mag


def _check(got: Any, want: Any, mag: Any, depth: int) -> None:
    got64 = got.astype(np.float64)
    assert np.array_equal(np.isnan(got64), np.isnan(want))
    finite = np.isfinite(want)
    assert np.array_equal(got64[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    tol = 2.0 * (depth + 2) * EPS * mag[finite] + np.finfo(F32).tiny
    assert np.all(np.abs(got64[finite] - want[finite]) <= tol)


SHAPES = [(70, 37, 7, 1), (150, 100, 7, 1), (200, 13, 8, 1), (90, 77, 14, 2), (129, 65, 5, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_dense_pointwise_matches_float64(
    shape: tuple[int, ...], bias: bool, residual: bool, relu: bool
) -> None:
    """pointwise_forward on the dense-layer path: the definition, its epilogue, nothing written past ``y``."""
    from computehal.backends.cpu import _conv_pointwise as cg

    c, k, hw, s = shape
    o = -(-hw // s)
    assert cg._dense_layer(F32, (1, 1), 1, c, o * o)
    rng = np.random.default_rng(c * k + s)
    x = rng.standard_normal((1, c, hw, hw)).astype(F32)
    f = rng.standard_normal((k, c, 1, 1)).astype(F32)
    x[0, 3, 0, 0] = np.nan
    x[0, 5, s, 0] = np.inf
    f[2, 7, 0, 0] = -np.inf
    f[k - 1, c - 1, 0, 0] = np.nan
    b = rng.standard_normal(k).astype(F32) if bias else None
    r = rng.standard_normal(k * o * o).astype(F32) if residual else None
    if r is not None:
        r[4] = np.nan
        r[9] = -np.inf
    space = np.full(k * o * o + 40, 7.0, dtype=F32)
    y = space[: k * o * o].reshape(1, k, o, o)
    assert cg.pointwise_forward(x, f, b, y, s, s, (r, relu))
    want, mag = _want(x, f, b, r, relu, s)
    _check(y, want, mag, c)
    assert (space[k * o * o :] == 7.0).all()


def test_backend_dense_pointwise(cpu_backend: CpuBackend) -> None:
    """conv2d_forward of a 1x1 layer on a 7x7 image (and stride 2 from 14x14): bias, residual, ReLU."""
    be = cpu_backend
    rng = np.random.default_rng(3)
    for c, k, hw, s in ((130, 70, 7, 1), (96, 40, 14, 2)):
        o = hw // s
        x = rng.standard_normal((1, c, hw, hw)).astype(F32)
        f = rng.standard_normal((k, c, 1, 1)).astype(F32)
        b = rng.standard_normal(k).astype(F32)
        r = rng.standard_normal((1, k, o, o)).astype(F32)
        ptrs = [be.alloc(a.nbytes) for a in (x, f, b, r, r)]
        try:
            for ptr, a in zip(ptrs, (x, f, b, r), strict=False):
                be.copy_htod(ptr, a)
            px, pf, pb, pr, py = ptrs
            be.conv2d_forward(
                px, [1, c, hw, hw], pf, [k, c, 1, 1], py, [1, k, o, o], [s, s], [0, 0],
                bias_ptr=pb, residual_ptr=pr, activation="relu",
            )  # fmt: skip
            got = np.empty_like(r)
            be.copy_dtoh(got, py)
            want, mag = _want(x, f, b, r, True, s)
            _check(got, want, mag, c)
        finally:
            for ptr in ptrs:
                be.free(ptr)


ROWS_SHAPES = [(13, 70, 49), (6, 1, 5), (9, 800, 64), (2, 33, 130), (1, 5, 17)]


@pytest.mark.parametrize("rows, depth, width", ROWS_SHAPES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_product_rows_matches_float64(rows: int, depth: int, width: int, accumulate: bool) -> None:
    """The dense-layer product over whole rows: y (+)= x @ w at offsets, nothing written outside y's rows."""
    from computehal.backends.cpu import _kdense as kd

    rng = np.random.default_rng(rows * depth + width)
    x = rng.standard_normal(3 + rows * depth).astype(F32)
    w = rng.standard_normal((depth, width)).astype(F32)
    y_ld, y_off = width + 3, 5
    y = rng.standard_normal(y_off + rows * y_ld + 7).astype(F32)
    before = y.copy()
    kd.product_rows(x, 3, w.reshape(-1), width, y, y_off, y_ld, rows, depth, width, accumulate)
    xm = x[3:].reshape(rows, depth).astype(np.float64)
    want = xm @ w.astype(np.float64)
    mag = np.abs(xm) @ np.abs(w.astype(np.float64))
    view = y[y_off : y_off + rows * y_ld].reshape(rows, y_ld)
    start = before[y_off : y_off + rows * y_ld].reshape(rows, y_ld)[:, :width].astype(np.float64)
    if accumulate:
        want, mag = want + start, mag + np.abs(start)
    assert np.all(np.abs(view[:, :width] - want) <= 2.0 * (depth + 2) * EPS * mag)
    outside = np.ones(y.size, dtype=bool)
    outside[y_off : y_off + rows * y_ld] = False
    outside[y_off : y_off + rows * y_ld] = np.tile(np.arange(y_ld) >= width, rows)
    np.testing.assert_array_equal(y[outside], before[outside])


def test_batch1_blocks_pulled_by_every_thread() -> None:
    """The compiled pull loop of one image covers every block once, whatever thread takes it."""
    from computehal.backends.cpu import _kgemm_par as par  # numba is a dependency: no skip
    from computehal.backends.cpu import _runtime

    rng = np.random.default_rng(5)
    k, c, pixels = 200, 48, 196
    f = rng.standard_normal((k, c)).astype(F32)
    x = rng.standard_normal((c, pixels)).astype(F32)
    bias = rng.standard_normal(k).astype(F32)
    want = f.astype(np.float64) @ x.astype(np.float64) + bias.astype(np.float64)[:, None]
    for threads in (1, 2, 5):
        y = np.full((k, pixels), np.nan, dtype=F32)
        par.pointwise_image(
            f.ravel(), bias, k, c, x.ravel(), pixels, y.ravel(), 64, y.ravel(), 0, threads=threads
        )
        assert np.allclose(y, want, rtol=1e-4, atol=1e-4)
    seen: list[int] = []
    _runtime.on_every_thread(lambda: seen.append(threading.get_ident()), threads=2)
    assert len(seen) == min(2, _runtime.workers())
