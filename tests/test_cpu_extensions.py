"""The CPU backend's extension operations against NumPy definitions.

Data movement, casts, broadcasting, the extension element-wise ops and log-softmax, at
shapes that reach each code path of the CPU backend (NumPy and compiled kernels, one
thread and several). Semantics are those documented in ``computehal.backend``; the
conformance kit checks them on every backend, these tests pin the CPU's own paths.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
import scipy.special

from computehal import InvalidArgumentError
from computehal.backends.cpu import CpuBackend

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
RNG = np.random.default_rng(1234)


@pytest.fixture(scope="module")
def be(cpu_backend: CpuBackend) -> CpuBackend:
    """The module's CPU backend (conftest's ``cpu_backend``) under this module's short name."""
    return cpu_backend


def put(be: CpuBackend, array: npt.ArrayLike) -> int:
    data = np.ascontiguousarray(array)
    ptr = be.alloc(max(1, data.nbytes))
    if data.nbytes:
        be.copy_htod(ptr, data.reshape(-1).view(np.uint8))
    return ptr


def get(be: CpuBackend, ptr: int, shape: tuple[int, ...], dtype: Any) -> npt.NDArray[Any]:
    out = np.empty(shape, dtype=dtype)
    if out.nbytes:
        be.copy_dtoh(out.reshape(-1).view(np.uint8), ptr)
    return out


def bits(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return a.view(f"u{a.dtype.itemsize}")


# --------------------------------------------------------------------------- copy_strided


STRIDED_CASES = [
    # (source shape, transpose axes, source slice): the destination is the contiguous result.
    ((96, 80), (1, 0), None),  # big enough for the tiled kernel
    ((45, 67), (1, 0), None),  # ragged edges around the 8 x 8 register blocks
    ((5, 7), (1, 0), None),  # NumPy path
    ((2, 3, 40, 36), (0, 2, 3, 1), None),  # NCHW -> NHWC
    ((4, 6, 8), (2, 0, 1), None),
    ((3, 4, 5, 2, 3, 2), (5, 4, 3, 2, 1, 0), None),  # six dimensions
    ((10, 12), (0, 1), (slice(2, 9, 3), slice(None, None, -2))),  # slice with a negative step
    ((70, 50), (1, 0), (slice(None, None, -1), slice(1, None))),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(("shape", "axes", "index"), STRIDED_CASES)
def test_copy_strided_views(be: CpuBackend, dtype: Any, shape: Any, axes: Any, index: Any) -> None:
    src = RNG.standard_normal(shape).astype(dtype)
    view = src.transpose(axes)
    if index is not None:
        view = view[index]
    elements = [s // src.itemsize for s in view.strides]
    origin = (view.__array_interface__["data"][0] - src.__array_interface__["data"][0]) // src.itemsize
    sp = put(be, src)
    dp = put(be, np.zeros(view.size + 8, dtype=dtype))
    dst_strides = [math.prod(view.shape[i + 1 :]) for i in range(view.ndim)]
    be.copy_strided(
        dp + 8 * src.itemsize, sp + origin * src.itemsize, view.shape, elements, dst_strides, dtype=dtype
    )
    out = get(be, dp, (view.size + 8,), dtype)
    np.testing.assert_array_equal(bits(out[8:].reshape(view.shape)), bits(np.ascontiguousarray(view)))
    assert not bits(out[:8]).any()
    be.free(sp)
    be.free(dp)


def test_copy_strided_broadcast_and_bit_exact(be: CpuBackend) -> None:
    # A zero source stride broadcasts; signalling NaN and -0 payloads survive.
    row = np.array([0x7F800001, 0xFFC00123, 0x80000000, 0x3F800000], dtype=np.uint32).view(np.float32)
    sp, dp = put(be, row), put(be, np.zeros((50, 4), np.float32))
    be.copy_strided(dp, sp, (50, 4), (0, 1), (4, 1))
    out = get(be, dp, (50, 4), np.float32)
    np.testing.assert_array_equal(bits(out), np.broadcast_to(bits(row), (50, 4)))
    # Transposed destination written through the tiled kernel: bits as well.
    big = RNG.integers(0, 2**32, size=(64, 48), dtype=np.uint32).view(np.float32)
    bp, tp = put(be, big), put(be, np.zeros((48, 64), np.float32))
    be.copy_strided(tp, bp, (64, 48), (48, 1), (1, 64))
    np.testing.assert_array_equal(bits(get(be, tp, (48, 64), np.float32)), bits(big).T)
    for p in (sp, dp, bp, tp):
        be.free(p)


def test_copy_strided_overlap_reads_source_first(be: CpuBackend) -> None:
    data = np.arange(100, dtype=np.float32)
    ptr = put(be, data)
    # Reverse in place: destination element i is source element 99 - i.
    be.copy_strided(ptr, ptr + 99 * 4, (100,), (-1,), (1,))
    np.testing.assert_array_equal(get(be, ptr, (100,), np.float32), data[::-1])
    # Shift right by one (overlapping, same direction).
    be.copy_strided(ptr + 4, ptr, (99,), (1,), (1,))
    np.testing.assert_array_equal(get(be, ptr, (100,), np.float32)[1:], data[::-1][:99])
    be.free(ptr)


def test_copy_strided_large_threads(be: CpuBackend) -> None:
    src = RNG.standard_normal((300, 700)).astype(np.float32)
    sp, dp = put(be, src), put(be, np.zeros((700, 300), np.float32))
    be.copy_strided(dp, sp, (700, 300), (1, 700), (300, 1))
    np.testing.assert_array_equal(get(be, dp, (700, 300), np.float32), src.T)
    be.free(sp)
    be.free(dp)


@pytest.mark.parametrize("shape", [(1040, 2064), (2, 1040, 1030)])
def test_copy_strided_streamed_transposes(be: CpuBackend, shape: tuple[int, ...]) -> None:
    """Transposes of 8 MiB and more stream whole destination lines; ragged edges and neighbours stay exact."""
    src = RNG.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)  # NaN payloads included
    want = np.swapaxes(src, -1, -2)
    sp, dp = put(be, src), put(be, np.full(want.size + 32, 5, np.uint32))
    strides = src.strides[:-2] if src.ndim == 3 else ()
    src_strides = tuple(s // 4 for s in strides) + (1, shape[-1])
    dst_strides = tuple(s // 4 for s in want.strides[:-2]) + (shape[-2], 1)
    be.copy_strided(dp + 64, sp, want.shape, src_strides, dst_strides)
    got = get(be, dp, (want.size + 32,), np.uint32)
    np.testing.assert_array_equal(got[16 : want.size + 16].reshape(want.shape), want)
    assert (got[:16] == 5).all() and (got[want.size + 16 :] == 5).all()
    be.free(sp)
    be.free(dp)


# --------------------------------------------------------------------------- cast and fill


def _rne_reference(x: npt.NDArray[np.float64], dtype: Any) -> npt.NDArray[Any]:
    """Round float64 values to ``dtype`` exactly, through Python's exact rationals."""
    from fractions import Fraction

    if dtype == np.float64:
        return x.copy()
    out = np.empty(x.shape, dtype=dtype)
    info = ml_dtypes.finfo(dtype)
    for i, value in enumerate(x.tolist()):
        if math.isnan(value) or math.isinf(value):
            out[i] = value
            continue
        lo = np.array(value, dtype=np.float64).astype(dtype)  # a neighbour, maybe wrong
        best = None
        for cand in (np.nextafter(lo, dtype.type(-np.inf)), lo, np.nextafter(lo, dtype.type(np.inf))):
            c = float(cand)
            if math.isinf(c):
                continue
            err = abs(Fraction(c) - Fraction(value))
            key = (err, int(bits(np.array([cand], dtype=dtype))[0]) & 1)
            if best is None or key < best[0]:
                best = (key, cand)
        assert best is not None
        largest = float(info.max)
        half_ulp = (float(info.max) - float(np.nextafter(dtype.type(info.max), dtype.type(0)))) / 2
        out[i] = best[1] if abs(value) < largest + half_ulp else math.copysign(math.inf, value)
    return out


@pytest.mark.parametrize("src", FLOATS, ids=str)
@pytest.mark.parametrize("dst", FLOATS, ids=str)
def test_cast_rounds_to_nearest_even(be: CpuBackend, src: Any, dst: Any) -> None:
    wide = np.concatenate(
        [
            RNG.standard_normal(2000) * 10.0 ** RNG.integers(-8, 8, 2000),
            [1 + 2**-8 + 2**-30, 1 + 2**-11 + 2**-40, -(1 + 2**-8 + 2**-31), 1e6, -1e40, 3.3961e38],
            [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 2**-24, 2**-25, 2**-26],
        ]
    )
    with np.errstate(over="ignore"):
        x = _rne_reference(wide, src) if src != np.float64 else wide
    want = _rne_reference(x.astype(np.float64), dst)
    xp, yp = put(be, x), put(be, np.zeros(x.size, dtype=dst))
    be.cast(xp, yp, x.size, dtype=src, out_dtype=dst)
    got = get(be, yp, (x.size,), dst)
    np.testing.assert_array_equal(bits(got), bits(want))
    be.free(xp)
    be.free(yp)


def test_cast_in_place_and_large(be: CpuBackend) -> None:
    x = RNG.standard_normal(300_000).astype(np.float32)
    ptr = put(be, x)
    out = be.alloc(x.size * 2)
    be.cast(ptr, out, x.size, out_dtype="bfloat16")
    np.testing.assert_array_equal(bits(get(be, out, (x.size,), BF16)), bits(x.astype(BF16)))
    be.cast(out, out, x.size, dtype="bfloat16", out_dtype="float16")  # same size: in place
    np.testing.assert_array_equal(
        bits(get(be, out, (x.size,), np.float16)), bits(x.astype(BF16).astype(np.float32).astype(np.float16))
    )
    be.free(ptr)
    be.free(out)


@pytest.mark.parametrize("pair", [("float32", "float16"), ("float16", "float32"), ("float32", "bfloat16")])
def test_cast_streamed_outputs(be: CpuBackend, pair: tuple[str, str]) -> None:
    """Outputs of 8 MiB and more are written by streamed lines; the ends and neighbours stay exact."""
    src, dst = (BF16 if name == "bfloat16" else np.dtype(name) for name in pair)
    n = (1 << 23) // dst.itemsize + 101
    x = (RNG.standard_normal(n) * 300.0).astype(src)
    xp = put(be, x)
    yp = put(be, np.full(n + 8, 7, dtype=dst))
    be.cast(xp, yp + 3 * dst.itemsize, n, dtype=pair[0], out_dtype=pair[1])
    got = get(be, yp, (n + 8,), dst)
    np.testing.assert_array_equal(bits(got[3 : n + 3]), bits(x.astype(np.float32).astype(dst)))
    assert (got[:3] == 7).all() and (got[n + 3 :] == 7).all()
    be.free(xp)
    be.free(yp)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_fill(be: CpuBackend, dtype: Any) -> None:
    # The last count fills 8 MiB and more: whole lines streamed, the ragged ends stored plainly.
    for count in (5, 400_000, (1 << 23) // dtype.itemsize + 37):
        ptr = put(be, np.zeros(count + 2, dtype=dtype))
        be.fill(ptr + dtype.itemsize, count, 1 + 2**-8 + 2**-30, dtype=dtype)
        out = get(be, ptr, (count + 2,), dtype)
        want = _rne_reference(np.array([1 + 2**-8 + 2**-30]), dtype)[0]
        assert (bits(out[1:-1]) == bits(np.array([want], dtype=dtype))[0]).all()
        assert out[0] == 0 and out[-1] == 0
        be.fill(ptr, 1, math.nan, dtype=dtype)
        assert np.isnan(get(be, ptr, (1,), dtype)[0])
        be.free(ptr)


# --------------------------------------------------------------------------- broadcasting


BROADCAST_SHAPES = [
    ((4, 3), (3,)),
    ((2, 1, 5), (1, 4, 1)),
    ((8, 64, 30, 30), (64, 1, 1)),
    ((1,), (7, 3)),
    ((), (4,)),
    ((2, 1, 3, 1, 2, 1), (1, 2, 1, 3, 1, 2)),
    ((300, 500), (300, 1)),
]


def _binary_reference(op: str, a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    with np.errstate(all="ignore"):
        return {
            "add": np.add,
            "sub": np.subtract,
            "mul": np.multiply,
            "div": np.divide,
            "max": np.fmax,
            "min": np.fmin,
            "pow": np.power,
        }[op](a, b)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=str)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "max", "min", "pow"])
@pytest.mark.parametrize(("sa", "sb"), BROADCAST_SHAPES)
def test_broadcast_binary(be: CpuBackend, op: str, sa: Any, sb: Any, dtype: Any) -> None:
    a = RNG.standard_normal(sa).astype(dtype)
    b = RNG.standard_normal(sb).astype(dtype)
    if op == "pow":
        a = np.abs(a)
    want = _binary_reference(op, a.astype(np.float64), b.astype(np.float64))
    ap, bp, op_ = put(be, a), put(be, b), put(be, np.zeros(want.shape, dtype))
    be.broadcast_binary(op, ap, sa, bp, sb, op_, want.shape, dtype=dtype)
    got = get(be, op_, want.shape, dtype)
    np.testing.assert_allclose(got, want, rtol=2e-6 if dtype == np.float32 else 1e-14, atol=1e-30)
    for p in (ap, bp, op_):
        be.free(p)


def test_broadcast_binary_in_place_and_nan(be: CpuBackend) -> None:
    a = RNG.standard_normal((3, 70_000)).astype(np.float32)
    a[0, :3] = [np.nan, 1.0, np.inf]
    b = np.array([[2.0], [np.nan], [0.0]], dtype=np.float32)
    ap, bp = put(be, a), put(be, b)
    be.broadcast_binary("max", ap, a.shape, bp, b.shape, ap, a.shape)  # out is a
    np.testing.assert_array_equal(get(be, ap, a.shape, np.float32), np.fmax(a, b))
    be.free(ap)
    be.free(bp)


def test_pow_c_semantics(be: CpuBackend) -> None:
    a = np.array([np.nan, -8.0, 1.0, 0.0, -2.0, np.inf], dtype=np.float32)
    b = np.array([0.0, 1 / 3, np.nan, -1.0, 3.0, -0.5], dtype=np.float32)
    ap, bp, op = put(be, a), put(be, b), put(be, np.zeros(6, np.float32))
    be.binary("pow", ap, bp, op, 6)
    got = get(be, op, (6,), np.float32)
    want = [math.pow(1.0, 0.0), math.nan, 1.0, math.inf, -8.0, 0.0]
    np.testing.assert_array_equal(got, np.array(want, dtype=np.float32))
    for p in (ap, bp, op):
        be.free(p)


# --------------------------------------------------------------------------- unary


def _unary_reference(op: str, x: npt.NDArray[np.float64], alpha: float, lo: float, hi: float) -> Any:
    with np.errstate(all="ignore"):
        if op == "gelu":
            return 0.5 * x * (1.0 + scipy.special.erf(x / math.sqrt(2.0)))
        if op == "gelu_tanh":
            return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
        if op == "silu":
            return x / (1.0 + np.exp(-x))
        if op == "erf":
            return scipy.special.erf(x)
        if op == "reciprocal":
            return 1.0 / x
        if op == "square":
            return x * x
        if op == "sin":
            return np.sin(x)
        if op == "cos":
            return np.cos(x)
        if op == "leaky_relu":
            return np.where(x >= 0, x, alpha * x)
        if op == "clip":
            return np.minimum(np.maximum(x, lo), hi)
    raise AssertionError(op)


UNARY_NEW = ["gelu", "gelu_tanh", "silu", "erf", "reciprocal", "square", "sin", "cos", "leaky_relu", "clip"]


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=str)
@pytest.mark.parametrize("n", [37, 200_000])
@pytest.mark.parametrize("op", UNARY_NEW)
def test_unary_extensions(be: CpuBackend, kernel_path: str, op: str, n: int, dtype: Any) -> None:
    x = (RNG.standard_normal(n) * 4).astype(dtype)
    x[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, 30.0, -30.0]
    kwargs: dict[str, float] = {}
    alpha, lo, hi = 0.01, -math.inf, math.inf
    if op == "leaky_relu":
        kwargs = {"alpha": 0.2}
        alpha = 0.2
    if op == "clip":
        kwargs = {"lo": -1.5, "hi": 2.25}
        lo, hi = -1.5, 2.25
    want = _unary_reference(op, x.astype(np.float64), alpha, lo, hi)
    xp, yp = put(be, x), put(be, np.zeros(n, dtype))
    be.unary(op, xp, yp, n, dtype=dtype, **kwargs)
    got = get(be, yp, (n,), dtype)
    tol = 4e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    be.unary(op, xp, xp, n, dtype=dtype, **kwargs)  # in place
    np.testing.assert_array_equal(bits(get(be, xp, (n,), dtype)), bits(got))
    be.free(xp)
    be.free(yp)


def test_leaky_relu_and_clip_parameters(be: CpuBackend) -> None:
    x = np.array([-2.0, -0.0, 3.0, np.nan, -np.inf, np.inf], dtype=np.float32)
    xp, yp = put(be, x), put(be, np.zeros(6, np.float32))
    be.unary("leaky_relu", xp, yp, 6, alpha=0.0)
    got = get(be, yp, (6,), np.float32)
    np.testing.assert_array_equal(got[:4], [-0.0, -0.0, 3.0, np.nan])
    assert np.isnan(got[4]) and got[5] == np.inf  # 0 * -inf is NaN; +inf >= 0 stays
    be.unary("clip", xp, yp, 6, lo=2.0, hi=1.0)  # lo > hi: min(max(x, lo), hi) is hi
    np.testing.assert_array_equal(get(be, yp, (6,), np.float32), [1.0, 1.0, 1.0, np.nan, 1.0, 1.0])
    with pytest.raises(InvalidArgumentError):
        be.unary("relu", xp, yp, 6, alpha=0.5)
    be.free(xp)
    be.free(yp)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sixteen_bit_through_float32(be: CpuBackend, dtype: str) -> None:
    narrow = np.dtype(dtype) if dtype == "float16" else BF16
    x = RNG.standard_normal(1000).astype(narrow)
    xp, yp = put(be, x), put(be, np.zeros(1000, narrow))
    be.unary("gelu", xp, yp, 1000, dtype=dtype)
    want = _unary_reference("gelu", x.astype(np.float64), 0, 0, 0).astype(np.float32).astype(narrow)
    got = get(be, yp, (1000,), narrow).astype(np.float64)
    np.testing.assert_allclose(got, want.astype(np.float64), rtol=1e-2, atol=1e-3)
    be.free(xp)
    be.free(yp)


# --------------------------------------------------------------------------- log-softmax


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=str)
@pytest.mark.parametrize(
    ("shape", "axis"), [((6, 50), 1), ((40, 3, 700), 1), ((300, 400), 0), ((5,), 0), ((300, 400), 1)]
)
def test_log_softmax(be: CpuBackend, kernel_path: str, shape: Any, axis: int, dtype: Any) -> None:
    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    x.reshape(-1)[0] = -np.inf
    want = scipy.special.log_softmax(x.astype(np.float64), axis=axis)
    xp, yp = put(be, x), put(be, np.zeros(shape, dtype))
    be.softmax(xp, yp, shape, axis, dtype=dtype, log=True)
    got = get(be, yp, shape, dtype)
    assert got.reshape(-1)[0] == -np.inf
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)
    be.free(xp)
    be.free(yp)


# --------------------------------------------------------------------------- device-side indices


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_gather_scatter_device_indices(be: CpuBackend, index_dtype: str) -> None:
    table = RNG.standard_normal((10, 6)).astype(np.float64)
    idx = np.array([3, 0, 9, 3, 7], dtype=index_dtype)
    tp, ip, op = put(be, table), put(be, idx), put(be, np.zeros((5, 6)))
    be.gather(tp, 5, op, 10, 6, dtype="float64", indices_ptr=ip, index_dtype=index_dtype)
    np.testing.assert_array_equal(get(be, op, (5, 6), np.float64), table[idx])
    rows = RNG.standard_normal((5, 6))
    rp = put(be, rows)
    be.scatter(rp, 5, tp, 10, 6, dtype="float64", indices_ptr=ip, index_dtype=index_dtype)
    want = table.copy()
    for i, j in enumerate(idx):
        want[j] = rows[i]
    np.testing.assert_array_equal(get(be, tp, (10, 6), np.float64), want)
    # Out of range or negative: an error, and nothing written.
    for bad, message in ((10, "out of range"), (-1, "negative")):
        bad_idx = np.array([1, bad, 2], dtype=index_dtype)
        bp = put(be, bad_idx)
        before = get(be, tp, (10, 6), np.float64)
        with pytest.raises(InvalidArgumentError, match=message):
            be.scatter(rp, 3, tp, 10, 6, dtype="float64", indices_ptr=bp, index_dtype=index_dtype)
        with pytest.raises(InvalidArgumentError, match=message):
            be.gather(tp, 3, op, 10, 6, dtype="float64", indices_ptr=bp, index_dtype=index_dtype)
        np.testing.assert_array_equal(get(be, tp, (10, 6), np.float64), before)
        be.free(bp)
    for p in (tp, ip, op, rp):
        be.free(p)


# --------------------------------------------------------------------------- pooling and normalisation


@pytest.fixture(params=["compiled", "numpy"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test through the compiled kernels, then through the NumPy fallbacks."""
    if request.param == "numpy":
        from computehal.backends.cpu import _runtime

        for name in ("_knorm", "_kpool", "_kmath", "_kmove"):
            monkeypatch.setitem(_runtime._kernel_modules, name, None)
    return str(request.param)


def _pool_reference(x: Any, op: str, k: Any, s: Any, pads: Any, d: Any, ceil: bool, include: bool) -> Any:
    n, c, h, w = x.shape
    pt, pl, pb, pr = pads
    oh = v_pool_size(h, k[0], s[0], pt, pb, d[0], ceil)
    ow = v_pool_size(w, k[1], s[1], pl, pr, d[1], ceil)
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            vals, padded = [], 0
            for r in range(k[0]):
                ih = i * s[0] - pt + r * d[0]
                for q in range(k[1]):
                    iw = j * s[1] - pl + q * d[1]
                    if 0 <= ih < h and 0 <= iw < w:
                        vals.append(x[:, :, ih, iw].astype(np.float64))
                    if -pt <= ih < h + pb and -pl <= iw < w + pr:
                        padded += 1
            if op == "max":
                acc = np.full((n, c), -np.inf)
                for val in vals:
                    acc = np.fmax(acc, val)
                out[:, :, i, j] = acc
            else:
                total = sum(vals, np.zeros((n, c)))
                with np.errstate(all="ignore"):
                    out[:, :, i, j] = total / (padded if include else len(vals))
    return out


def v_pool_size(size: int, k: int, s: int, lo: int, hi: int, d: int, ceil: bool) -> int:
    from computehal.validation import pool_output_size

    return pool_output_size(size, k, s, lo, hi, d, ceil)


POOL_CASES = [
    ("max", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False, False),
    ("avg", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False, False),
    ("avg", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False, True),
    ("avg", (2, 3), (2, 2), (0, 1, 1, 0), (1, 1), True, True),
    ("max", (3, 2), (2, 3), (1, 0, 1, 1), (2, 1), True, False),
    ("avg", (7, 7), (1, 1), (0, 0, 0, 0), (1, 1), False, False),  # global pooling
    ("max", (7, 7), (1, 1), (0, 0, 0, 0), (1, 1), False, False),
    ("max", (2, 2), (1, 1), (1, 1, 1, 1), (1, 1), False, False),
    # Column folds: more than three taps, strides above 2, dilated stride 1, one tap.
    ("max", (2, 5), (1, 2), (0, 2, 0, 2), (1, 1), False, False),
    ("avg", (3, 4), (2, 3), (1, 1, 1, 2), (1, 2), True, False),
    ("max", (1, 3), (1, 1), (0, 2, 0, 2), (1, 2), False, False),
    ("avg", (2, 1), (2, 2), (0, 0, 0, 0), (1, 1), False, True),
    ("max", (3, 3), (2, 2), (1, 1, 1, 1), (2, 2), True, False),
]


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=str)
@pytest.mark.parametrize(("op", "k", "s", "pads", "d", "ceil", "include"), POOL_CASES)
def test_pool2d(
    be: CpuBackend,
    kernel_path: str,
    op: str,
    k: Any,
    s: Any,
    pads: Any,
    d: Any,
    ceil: bool,
    include: bool,
    dtype: Any,
) -> None:
    x = RNG.standard_normal((2, 3, 7, 7)).astype(dtype)
    x[0, 0, 0, 0], x[1, 2, 3, 3], x[0, 1, 6, 6] = np.nan, np.inf, -np.inf
    want = _pool_reference(x, op, k, s, pads, d, ceil, include)
    xp, yp = put(be, x), put(be, np.zeros(want.shape, dtype))
    be.pool2d(
        op,
        xp,
        x.shape,
        yp,
        want.shape,
        k,
        s,
        pads,
        dilation=d,
        ceil_mode=ceil,
        count_include_pad=include,
        dtype=dtype,
    )
    got = get(be, yp, want.shape, dtype)
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-13, atol=1e-6)
    be.free(xp)
    be.free(yp)


WIDE_POOL_CASES = [  # stride-2 column folds over whole vectors of 16 outputs, then the rest
    ("max", (3, 3), (2, 2), (1, 1, 1, 1), False, False),
    ("avg", (3, 3), (2, 2), (1, 1, 1, 1), False, True),
    ("avg", (2, 2), (2, 2), (0, 0, 0, 0), False, False),
    ("max", (2, 2), (2, 2), (0, 0, 1, 1), True, False),
    ("avg", (3, 1), (2, 2), (1, 0, 1, 0), False, False),
    ("max", (1, 3), (1, 2), (0, 0, 0, 2), True, False),
]


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=str)
@pytest.mark.parametrize(("op", "k", "s", "pads", "ceil", "include"), WIDE_POOL_CASES)
def test_pool2d_wide_rows(
    be: CpuBackend, op: str, k: Any, s: Any, pads: Any, ceil: bool, include: bool, dtype: Any
) -> None:
    x = RNG.standard_normal((2, 2, 5, 75)).astype(dtype)
    x[0, 0, 1, 3], x[0, 1, 2, 40], x[1, 0, 0, 31], x[1, 1, 4, 74] = np.nan, np.nan, np.inf, -np.inf
    want = _pool_reference(x, op, k, s, pads, (1, 1), ceil, include)
    xp, yp = put(be, x), put(be, np.zeros(want.shape, dtype))
    options = {"ceil_mode": ceil, "count_include_pad": include, "dtype": dtype}
    be.pool2d(op, xp, x.shape, yp, want.shape, k, s, pads, **options)
    got = get(be, yp, want.shape, dtype)
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-13, atol=1e-6)
    be.free(xp)
    be.free(yp)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=str)
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize(("rows", "cols"), [(3, 5), (700, 300)])
@pytest.mark.parametrize("affine", [False, True])
def test_layer_and_rms_norm(
    be: CpuBackend, kernel_path: str, rms: bool, rows: int, cols: int, affine: bool, dtype: Any
) -> None:
    x = (RNG.standard_normal((rows, cols)) * 3 + 1).astype(dtype)
    x[1, 2] = np.nan
    scale, bias = RNG.standard_normal(cols).astype(dtype), RNG.standard_normal(cols).astype(dtype)
    x64 = x.astype(np.float64)
    mean = 0.0 if rms else x64.mean(axis=1, keepdims=True)
    want = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    if affine:
        want = want * scale + bias
    xp, yp, sp, bp = put(be, x), put(be, np.zeros_like(x)), put(be, scale), put(be, bias)
    kwargs = {"scale_ptr": sp, "bias_ptr": bp} if affine else {}
    (be.rms_norm if rms else be.layer_norm)(xp, yp, rows, cols, 1e-5, dtype=dtype, **kwargs)
    got = get(be, yp, x.shape, dtype)
    assert np.isnan(got[1]).all() and not np.isnan(np.delete(got, 1, axis=0)).any()
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)
    for p in (xp, yp, sp, bp):
        be.free(p)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=str)
@pytest.mark.parametrize("shape", [(2, 3), (2, 4, 5, 6), (4, 64, 40, 40)])
def test_batch_norm(be: CpuBackend, kernel_path: str, shape: Any, dtype: Any) -> None:
    c = shape[1]
    x = RNG.standard_normal(shape).astype(dtype)
    scale, bias, mean = (RNG.standard_normal(c).astype(dtype) for _ in range(3))
    var = RNG.random(c).astype(dtype)
    var[0] = 0.0  # with eps = 0: (x - mean) / 0
    expand = (slice(None),) + (None,) * (len(shape) - 2)
    with np.errstate(all="ignore"):
        want = (x.astype(np.float64) - mean[expand]) / np.sqrt(var[expand].astype(np.float64)) * scale[
            expand
        ] + bias[expand]
    ptrs = [put(be, a) for a in (x, scale, bias, mean, var)]
    yp = put(be, np.zeros_like(x))
    be.batch_norm(ptrs[0], shape, *ptrs[1:], yp, 0.0, dtype=dtype)
    got = get(be, yp, shape, dtype)
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)
    for p in [*ptrs, yp]:
        be.free(p)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=str)
@pytest.mark.parametrize(("size", "beta"), [(5, 0.75), (2, 0.6), (1, 1.0)])
def test_lrn(be: CpuBackend, kernel_path: str, size: int, beta: float, dtype: Any) -> None:
    x = RNG.standard_normal((2, 7, 5, 4)).astype(dtype)
    alpha, bias = 1e-2, 1.5
    x64 = x.astype(np.float64)
    want = np.empty_like(x64)
    for ch in range(7):
        lo, hi = max(0, ch - (size - 1) // 2), min(6, ch + size // 2)
        total = (x64[:, lo : hi + 1] ** 2).sum(axis=1)
        want[:, ch] = x64[:, ch] / (bias + alpha / size * total) ** beta
    xp, yp = put(be, x), put(be, np.zeros_like(x))
    be.lrn(xp, yp, x.shape, size, alpha, beta, bias, dtype=dtype)
    np.testing.assert_allclose(get(be, yp, x.shape, dtype), want, rtol=1e-5 if dtype == np.float32 else 1e-12)
    be.free(xp)
    be.free(yp)


# --------------------------------------------------------------------------- convolution


def _conv_positions(x_shape: Any, f_shape: Any, stride: Any, pads: Any, dil: Any) -> Iterator[Any]:
    """(r, s, i, j, ih, iw) for every filter tap and output position that reads inside the input."""
    _, _, h, w = x_shape
    _, _, fh, fw = f_shape
    pt, pl, pb, pr = pads
    oh = (h + pt + pb - dil[0] * (fh - 1) - 1) // stride[0] + 1
    ow = (w + pl + pr - dil[1] * (fw - 1) - 1) // stride[1] + 1
    for r in range(fh):
        for s in range(fw):
            for i in range(oh):
                for j in range(ow):
                    ih, iw = i * stride[0] - pt + r * dil[0], j * stride[1] - pl + s * dil[1]
                    if 0 <= ih < h and 0 <= iw < w:
                        yield r, s, i, j, ih, iw


def _conv_reference(x: Any, f: Any, stride: Any, pads: Any, dil: Any, groups: int) -> Any:
    n, c, h, w = x.shape
    k, cg, fh, fw = f.shape
    pt, pl, pb, pr = pads
    oh = (h + pt + pb - dil[0] * (fh - 1) - 1) // stride[0] + 1
    ow = (w + pl + pr - dil[1] * (fw - 1) - 1) // stride[1] + 1
    y, kg = np.zeros((n, k, oh, ow)), k // groups
    for r, s, i, j, ih, iw in _conv_positions(x.shape, f.shape, stride, pads, dil):
        for g in range(groups):
            xs = x[:, g * cg : (g + 1) * cg, ih, iw].astype(np.float64)
            y[:, g * kg : (g + 1) * kg, i, j] += xs @ f[g * kg : (g + 1) * kg, :, r, s].astype(np.float64).T
    return y


def _data_reference(gy: Any, f: Any, x_shape: Any, stride: Any, pads: Any, dil: Any, groups: int) -> Any:
    k, cg, _, _ = f.shape
    gx, kg = np.zeros(x_shape), k // groups
    for r, s, i, j, ih, iw in _conv_positions(x_shape, f.shape, stride, pads, dil):
        for g in range(groups):
            grad = gy[:, g * kg : (g + 1) * kg, i, j].astype(np.float64)
            gx[:, g * cg : (g + 1) * cg, ih, iw] += grad @ f[g * kg : (g + 1) * kg, :, r, s].astype(
                np.float64
            )
    return gx


def _filter_reference(x: Any, gy: Any, f_shape: Any, stride: Any, pads: Any, dil: Any, groups: int) -> Any:
    k, cg, _, _ = f_shape
    gf, kg = np.zeros(f_shape), k // groups
    for r, s, i, j, ih, iw in _conv_positions(x.shape, f_shape, stride, pads, dil):
        for g in range(groups):
            grad = gy[:, g * kg : (g + 1) * kg, i, j].astype(np.float64)
            xs = x[:, g * cg : (g + 1) * cg, ih, iw].astype(np.float64)
            gf[g * kg : (g + 1) * kg, :, r, s] += grad.T @ xs
    return gf


CONV_CASES = [
    # (x shape, f shape, stride, pads, dilation, groups)
    ((2, 4, 7, 6), (6, 2, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
    ((2, 3, 8, 8), (4, 3, 3, 2), (1, 1), (0, 1, 2, 0), (2, 1), 1),
    ((1, 4, 9, 9), (4, 1, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 4),  # depthwise
    ((2, 3, 6, 7), (6, 1, 3, 3), (1, 1), (1, 0, 1, 2), (1, 2), 3),  # depthwise, multiplier 2
    ((2, 6, 7, 7), (6, 2, 2, 3), (2, 1), (1, 2, 0, 1), (2, 1), 3),
    ((1, 2, 5, 5), (3, 2, 1, 1), (1, 1), (2, 2, 2, 2), (1, 1), 1),  # 1x1 with padding
    ((1, 2, 5, 5), (3, 2, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
]


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=str)
@pytest.mark.parametrize(("xs", "fs", "stride", "pads", "dil", "groups"), CONV_CASES)
def test_conv_extensions(
    be: CpuBackend,
    kernel_path: str,
    xs: Any,
    fs: Any,
    stride: Any,
    pads: Any,
    dil: Any,
    groups: int,
    dtype: Any,
) -> None:
    x = RNG.standard_normal(xs).astype(dtype)
    f = RNG.standard_normal(fs).astype(dtype)
    bias = RNG.standard_normal(fs[0]).astype(dtype)
    y = _conv_reference(x, f, stride, pads, dil, groups) + bias[None, :, None, None]
    gy = RNG.standard_normal(y.shape).astype(dtype)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}
    xp, fp, bp, yp, gyp = (
        put(be, x),
        put(be, f),
        put(be, bias),
        put(be, np.zeros(y.shape, dtype)),
        put(be, gy),
    )
    kw = {"dtype": dtype, "groups": groups, "dilation": dil}
    be.conv2d_forward(xp, xs, fp, fs, yp, y.shape, stride, pads, bias_ptr=bp, **kw)
    np.testing.assert_allclose(get(be, yp, y.shape, dtype), y, **tol)
    gxp, gfp = put(be, np.zeros(xs, dtype)), put(be, np.zeros(fs, dtype))
    be.conv2d_backward_data(gyp, y.shape, fp, fs, gxp, xs, stride, pads, **kw)
    np.testing.assert_allclose(
        get(be, gxp, xs, dtype), _data_reference(gy, f, xs, stride, pads, dil, groups), **tol
    )
    be.conv2d_backward_filter(xp, xs, gyp, y.shape, gfp, fs, stride, pads, **kw)
    np.testing.assert_allclose(
        get(be, gfp, fs, dtype), _filter_reference(x, gy, fs, stride, pads, dil, groups), **tol
    )
    for p in (xp, fp, bp, yp, gyp, gxp, gfp):
        be.free(p)


@pytest.mark.parametrize("case", range(4))
def test_conv_nan_reaches_only_what_reads_it(be: CpuBackend, case: int) -> None:
    """A NaN filter tap or gradient reaches only the results it multiplies (never through padding)."""
    xs, fs, stride, pads = [
        ((1, 1, 3, 3), (1, 1, 2, 2), (1, 1), (0, 0, 0, 0)),  # the reported case
        ((2, 3, 6, 6), (4, 3, 3, 3), (1, 1), (1, 1, 1, 1)),
        ((2, 3, 7, 7), (4, 3, 3, 3), (2, 2), (1, 1, 1, 1)),
        ((1, 2, 5, 5), (2, 1, 3, 3), (1, 1), (2, 1, 0, 1)),
    ][case]
    groups = xs[1] // fs[1]
    x = RNG.standard_normal(xs).astype(np.float32)
    f = RNG.standard_normal(fs).astype(np.float32)
    f[0, 0, 0, 0] = np.nan
    y = _conv_reference(x, f, stride, pads, (1, 1), groups)
    gy = RNG.standard_normal(y.shape).astype(np.float32)
    gy[0, 0, 0, 0] = np.inf
    xp, fp, yp, gyp = put(be, x), put(be, f), put(be, np.zeros(y.shape, np.float32)), put(be, gy)
    gxp, gfp = put(be, np.zeros(xs, np.float32)), put(be, np.zeros(fs, np.float32))
    be.conv2d_forward(xp, xs, fp, fs, yp, y.shape, stride, pads, groups=groups)
    be.conv2d_backward_data(gyp, y.shape, fp, fs, gxp, xs, stride, pads, groups=groups)
    be.conv2d_backward_filter(xp, xs, gyp, y.shape, gfp, fs, stride, pads, groups=groups)
    results = [
        (get(be, yp, y.shape, np.float32), y),
        (get(be, gxp, xs, np.float32), _data_reference(gy, f, xs, stride, pads, (1, 1), groups)),
        (get(be, gfp, fs, np.float32), _filter_reference(x, gy, fs, stride, pads, (1, 1), groups)),
    ]
    assert not np.isnan(results[1][1]).all()  # the data gradient is NaN only where the tap reaches
    for got, want in results:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for p in (xp, fp, yp, gyp, gxp, gfp):
        be.free(p)


def test_conv_huge_padding_needs_no_padded_copy(be: CpuBackend) -> None:
    """A 1-pixel image padded by 40000 on every side: the 25.6 GB padded copy is never built."""
    x = np.array([[[[3.0]]]], dtype=np.float32)
    f = np.array([[[[2.0]]]], dtype=np.float32)
    pad, stride = 40000, 40000
    out = (1 + 2 * pad - 1) // stride + 1
    xp, fp, yp = put(be, x), put(be, f), put(be, np.full((1, 1, out, out), 7.0, np.float32))
    be.conv2d_forward(xp, (1, 1, 1, 1), fp, (1, 1, 1, 1), yp, (1, 1, out, out), (stride, stride), (pad, pad))
    want = np.zeros((out, out), np.float32)
    want[1, 1] = 6.0
    np.testing.assert_array_equal(get(be, yp, (1, 1, out, out), np.float32)[0, 0], want)
    gxp, gfp = put(be, np.zeros(1, np.float32)), put(be, np.zeros(1, np.float32))
    gy = np.arange(out * out, dtype=np.float32).reshape(1, 1, out, out)
    gyp = put(be, gy)
    be.conv2d_backward_data(gyp, gy.shape, fp, (1, 1, 1, 1), gxp, (1, 1, 1, 1), (stride, stride), (pad, pad))
    be.conv2d_backward_filter(
        xp, (1, 1, 1, 1), gyp, gy.shape, gfp, (1, 1, 1, 1), (stride, stride), (pad, pad)
    )
    assert get(be, gxp, (1,), np.float32)[0] == 2.0 * gy[0, 0, 1, 1]
    assert get(be, gfp, (1,), np.float32)[0] == 3.0 * gy[0, 0, 1, 1]
    for p in (xp, fp, yp, gxp, gfp, gyp):
        be.free(p)


# --------------------------------------------------------------------------- attention


def _attention_reference(q: Any, k: Any, v: Any, scale: float, causal: bool, mask: Any, kv_heads: int) -> Any:
    """Full-matrix attention in float64; hidden keys (causal, or a -inf masked score) add nothing."""
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    group = q.shape[1] // kv_heads
    k64, v64 = np.repeat(k64, group, axis=1), np.repeat(v64, group, axis=1)
    sq, skv = q.shape[2], k.shape[2]
    with np.errstate(all="ignore"):
        scores = np.einsum("bhid,bhjd->bhij", q64, k64) * scale
        if mask is not None:
            scores = scores + mask.astype(np.float64)
        visible = np.ones(scores.shape, dtype=bool)
        if causal:
            visible &= np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)
        visible &= scores != -np.inf
        peak = np.max(np.where(visible, scores, -np.inf), axis=-1, keepdims=True)
        peak = np.where(np.isneginf(peak), 0.0, peak)
        weights = np.where(visible, np.exp(scores - peak), 0.0)
        total = weights.sum(axis=-1, keepdims=True)
        terms = np.where(visible[..., None], weights[..., None] * v64[:, :, None, :, :], 0.0)
        out = terms.sum(axis=-2) / total
    return np.where(visible.any(axis=-1)[..., None], out, 0.0)


ATTENTION_CASES = [
    # (batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, mask shape)
    (2, 4, 2, 5, 9, 3, True, None),
    (1, 2, 1, 7, 7, 4, False, (7, 7)),
    (2, 3, 3, 6, 11, 2, True, (2, 1, 1, 11)),
    (1, 4, 1, 1, 13, 5, True, (1, 4, 1, 13)),  # decoding one token with a cache
    (2, 2, 2, 8, 5, 3, False, (2, 2, 8, 5)),
]


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)], ids=str)
@pytest.mark.parametrize(("b", "h", "kvh", "sq", "skv", "d", "causal", "mshape"), ATTENTION_CASES)
def test_attention_mask_and_grouped_heads(
    kernel_path: str,
    b: int,
    h: int,
    kvh: int,
    sq: int,
    skv: int,
    d: int,
    causal: bool,
    mshape: Any,
    dtype: Any,
) -> None:
    q = RNG.standard_normal((b, h, sq, d)).astype(dtype)
    k = RNG.standard_normal((b, kvh, skv, d)).astype(dtype)
    v = RNG.standard_normal((b, kvh, skv, d)).astype(dtype)
    mask = None
    if mshape is not None:
        mask = RNG.standard_normal(mshape).astype(dtype)
        mask[RNG.random(mshape) < 0.3] = -np.inf
    v[0, 0, -1, 0] = np.nan  # a value the causal rule or the mask may hide
    scale = 1 / math.sqrt(d)
    want = _attention_reference(q, k, v, scale, causal, mask, kvh)
    with CpuBackend(attention_block_q=3, attention_block_kv=4) as be:
        ptrs = [put(be, a) for a in (q, k, v)]
        op = put(be, np.zeros(q.shape, dtype))
        extra: dict[str, Any] = {"kv_heads": kvh}
        if mask is not None:
            extra.update(mask_ptr=put(be, mask), mask_shape=mshape)
        be.attention(*ptrs, op, b, h, sq, skv, d, scale, causal, dtype=dtype, **extra)
        got = get(be, op, q.shape, dtype)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
