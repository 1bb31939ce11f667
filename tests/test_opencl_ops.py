"""OpenCL kernels of the extension ops, in both kernel profiles (the CPU profile's vector runs and
the GPU profile's one-element work-items take different code paths in the same kernels).

The conformance kit checks every op's values on every backend; these tests pin down what is
specific to the OpenCL kernels: both profiles, float64 builds, the strided index arithmetic
over six dimensions, device-side index checks, and the exact rounding of the conversion
kernels. References are independent NumPy definitions.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from computehal import InvalidArgumentError
from conftest import unavailable

try:
    import ml_dtypes

    from computehal.backends.opencl import OpenCLBackend, list_devices
except ImportError as error:  # pragma: no cover - exercised only without pyopencl
    IMPORT_ERROR: str | None = f"{type(error).__name__}: {error}"
else:
    IMPORT_ERROR = None


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def be(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An OpenCL backend in each kernel profile."""
    if IMPORT_ERROR is not None:
        unavailable("opencl", IMPORT_ERROR)
    if not list_devices():
        unavailable("opencl", "no OpenCL platform with a device (install pocl-binary-distribution)")
    backend = OpenCLBackend(kernel_profile=request.param)
    backend.init()
    yield backend
    backend.close()


def storage(dtype: str) -> Any:
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)


def put(be: Any, array: np.ndarray[Any, Any]) -> int:
    ptr = be.alloc(max(array.nbytes, 1))
    be.copy_htod(ptr, np.ascontiguousarray(array))
    return ptr


def get(be: Any, ptr: int, shape: Any, dtype: Any) -> np.ndarray[Any, Any]:
    out = np.empty(shape, dtype=dtype)
    be.copy_dtoh(out, ptr)
    return out


def round_exact(x: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
    """``x`` (float64) rounded to nearest-even in ``dtype`` from the definition, as float64."""
    bits, emin, top = {
        "float16": (11, -14, 65504.0),
        "bfloat16": (8, -126, (2 - 2.0**-7) * 2.0**127),
        "float32": (24, -126, (2 - 2.0**-23) * 2.0**127),
    }[dtype]
    out = np.array(x, dtype=np.float64)
    pick = np.isfinite(out) & (out != 0)
    _, exponent = np.frexp(out[pick])
    step = np.maximum(exponent - bits, emin - bits + 1)
    rounded = np.ldexp(np.rint(np.ldexp(out[pick], -step)), step)
    out[pick] = np.where(np.abs(rounded) > top, np.copysign(np.inf, out[pick]), rounded)
    return out


# --------------------------------------------------------------------------- element-wise

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-20, 3e38, -3e38, 9.75, -12.0]


def _erf(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.array([math.erf(v) for v in x])


def _erfc(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.array([math.erfc(v) for v in x])


UNARY: dict[str, Any] = {
    "tanh": np.tanh,
    "gelu": lambda x: x * 0.5 * _erfc(-x / math.sqrt(2)),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "erf": _erf,
    "reciprocal": lambda x: 1 / x,
    "square": lambda x: x * x,
    "sin": np.sin,
    "cos": np.cos,
    "leaky_relu": lambda x: np.where(x >= 0, x, 0.25 * x),
    "clip": lambda x: np.where(np.isnan(x), np.nan, np.minimum(np.maximum(x, -1.5), 2.0)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_extension_ops(be: Any, op: str, dtype: str) -> None:
    n = 301
    x = np.random.default_rng(3).uniform(-8, 8, n)
    x[: len(SPECIALS)] = SPECIALS
    if op in ("sin", "cos"):
        x[10:12] = [1000.25, -1234.5]
    x = x.astype(dtype)
    kw = {"alpha": 0.25} if op == "leaky_relu" else ({"lo": -1.5, "hi": 2.0} if op == "clip" else {})
    px, py = put(be, x), be.alloc(x.nbytes)
    be.unary(op, px, py, n, dtype=dtype, **kw)
    got = get(be, py, n, dtype).astype(np.float64)
    with np.errstate(all="ignore"):
        want = UNARY[op](x.astype(np.float64)).astype(dtype).astype(np.float64)  # overflow: inf
    eps = np.finfo(dtype).eps
    tol = 16 * eps * (np.abs(np.nan_to_num(want, posinf=0, neginf=0)) + 1)
    if op in ("sin", "cos"):
        tol = tol + 4 * eps * np.abs(np.nan_to_num(x.astype(np.float64), posinf=0, neginf=0))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{op}: NaN positions")
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    assert np.all(np.abs(got[finite] - want[finite]) <= tol[finite]), op


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_binary_pow_is_c_pow(be: Any, dtype: str) -> None:
    a = np.array([2.0, -2.0, -2.0, np.nan, 1.0, 0.0, 0.0, np.inf, -8.0, 3.0], dtype=dtype)
    b = np.array([10.0, 3.0, 0.5, 0.0, np.nan, -1.0, 0.0, -2.0, 1 / 3, -2.0], dtype=dtype)
    pa, pb, po = put(be, a), put(be, b), be.alloc(a.nbytes)
    be.binary("pow", pa, pb, po, a.size, dtype=dtype)
    with np.errstate(all="ignore"):
        want = np.power(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(get(be, po, a.size, dtype), want, rtol=4 * np.finfo(dtype).eps)


BROADCASTS = [
    ((3, 1, 5), (4, 1), (3, 4, 5)),  # inner strides 1 / 0
    ((1, 7), (6, 7), (6, 7)),  # a broadcast along the outer dimension
    ((5, 1), (1, 9), (5, 9)),  # inner strides 0 / 1
    ((2, 3, 1, 2, 1, 3), (3, 4, 1, 5, 1), (2, 3, 4, 2, 5, 3)),  # six dimensions, general strides
    ((), (4,), (4,)),
    ((2, 0, 3), (3,), (2, 0, 3)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("sa", "sb", "so"), BROADCASTS)
def test_broadcast_binary_shapes(be: Any, sa: Any, sb: Any, so: Any, dtype: str) -> None:
    rng = np.random.default_rng(len(so))
    a, b = rng.standard_normal(sa).astype(dtype), rng.standard_normal(sb).astype(dtype)
    pa, pb = put(be, a), put(be, b)
    po = put(be, np.full(so, 7.0, dtype=dtype))
    for op, fn in (("sub", np.subtract), ("max", np.fmax), ("div", np.divide)):
        be.broadcast_binary(op, pa, sa, pb, sb, po, so, dtype=dtype)
        np.testing.assert_array_equal(get(be, po, so, dtype), fn(a, b))


# --------------------------------------------------------------------------- conversion and fill

EDGES = [0.0, -0.0, 1.0, 1 + 2**-10, 1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65519.99, 65520.0, 2**-24,
         2**-25, 3 * 2**-26, 1e-8, 1e-40, 3.4e38, 3.5e38, 1 + 2**-8, 1 + 3 * 2**-9, 1 + 2**-8 + 2**-30,
         np.nan, np.inf, -np.inf, -1 - 2**-8 - 2**-40, 1e300, 1e-300]  # fmt: skip


@pytest.mark.parametrize("src", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("dst", ["float16", "bfloat16", "float32", "float64"])
def test_cast_rounds_to_nearest_even_once(be: Any, src: str, dst: str) -> None:
    values = np.array(EDGES + list(np.random.default_rng(5).standard_normal(40) * 1e3))
    x64 = values if src == "float64" else round_exact(values, src)
    x = x64.astype(storage(src))
    px, py = put(be, x), be.alloc(x.size * np.dtype(storage(dst)).itemsize)
    be.cast(px, py, x.size, dtype=src, out_dtype=dst)
    got = get(be, py, x.size, storage(dst)).astype(np.float64)
    want = x64 if dst == "float64" else round_exact(x64, dst)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_fill_rounds_the_value_once(be: Any, dtype: str) -> None:
    ptr = put(be, np.zeros(12, dtype=storage(dtype)))
    for value in (1 / 3, 1 + 2**-8 + 2**-30, 70000.0, -0.0, np.nan, -np.inf):
        be.fill(ptr + 2 * np.dtype(storage(dtype)).itemsize, 9, value, dtype=dtype)
        got = get(be, ptr, 12, storage(dtype)).astype(np.float64)
        want = value if dtype == "float64" else round_exact(np.array([value]), dtype)[0]
        np.testing.assert_array_equal(got[2:11], np.full(9, want))
        assert got[0] == got[1] == got[11] == 0


# --------------------------------------------------------------------------- movement


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_copy_strided_views(be: Any, dtype: str) -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 4, 5, 2, 3)).astype(dtype)
    x.reshape(-1)[::7] = np.nan
    size = x.itemsize
    px = put(be, x)
    strides = [s // size for s in x.strides]
    views = [
        (x.transpose(5, 3, 0, 4, 1, 2), [strides[i] for i in (5, 3, 0, 4, 1, 2)], 0),  # permute
        (x[:, ::-1, :, ::-2], [strides[0], -strides[1], strides[2], -2 * strides[3], *strides[4:]],
         2 * strides[1] + 4 * strides[3]),  # reversed and strided slices
        (np.broadcast_to(x[:, :1], (2, 5, 4, 5, 2, 3)), [strides[0], 0, *strides[2:]], 0),  # expand
    ]  # fmt: skip
    for view, src_strides, origin in views:
        out = np.empty(view.shape, dtype=dtype)
        dst_strides = [s // size for s in out.strides]
        po = be.alloc(out.nbytes)
        be.copy_strided(po, px + origin * size, view.shape, src_strides, dst_strides, dtype=dtype)
        got = get(be, po, view.shape, dtype)
        assert got.tobytes() == np.ascontiguousarray(view).tobytes()  # a bit copy: NaN payloads too


def test_copy_strided_overlap_reads_the_source_first(be: Any) -> None:
    x = np.arange(10, dtype=np.float32)
    px = put(be, x)
    be.copy_strided(px + 4, px, (9,), (1,), (1,))  # shift right by one, in place
    np.testing.assert_array_equal(get(be, px, 10, np.float32), np.concatenate([[0], x[:9]]))


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float64"])
def test_device_indices_gather_scatter(be: Any, dtype: str, index_dtype: str) -> None:
    rng = np.random.default_rng(2)
    table = rng.standard_normal((9, 5)).astype(storage(dtype))
    idx = np.array([4, 0, 8, 4, 2, 4], dtype=index_dtype)
    pt, pi = put(be, table), put(be, idx)
    po = be.alloc(idx.size * 5 * table.itemsize)
    be.gather(pt, idx.size, po, 9, 5, dtype=dtype, indices_ptr=pi, index_dtype=index_dtype)
    assert get(be, po, (6, 5), storage(dtype)).tobytes() == table[idx].tobytes()
    rows = rng.standard_normal((6, 5)).astype(storage(dtype))
    pr = put(be, rows)
    be.scatter(pr, idx.size, pt, 9, 5, dtype=dtype, indices_ptr=pi, index_dtype=index_dtype)
    want = table.copy()
    for i, r in enumerate(idx):
        want[r] = rows[i]  # the last duplicate wins
    assert get(be, pt, (9, 5), storage(dtype)).tobytes() == want.tobytes()


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_device_indices_are_checked_before_anything_is_written(be: Any, index_dtype: str) -> None:
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    pt = put(be, table)
    out = put(be, np.full((3, 3), -1.0, dtype=np.float32))
    cases = (([1, -3, 2], "index -3 is negative"), ([1, 2, 7], "index 7 is out of range for 4 rows"))
    for bad, message in cases:
        pi = put(be, np.array(bad, dtype=index_dtype))
        with pytest.raises(InvalidArgumentError, match=message):
            be.gather(pt, 3, out, 4, 3, indices_ptr=pi, index_dtype=index_dtype)
        with pytest.raises(InvalidArgumentError, match=message):
            be.scatter(out, 3, pt, 4, 3, indices_ptr=pi, index_dtype=index_dtype)
        # the host path says the same
        with pytest.raises(InvalidArgumentError, match=message):
            be.gather(pt, np.array(bad), out, 4, 3)
    np.testing.assert_array_equal(get(be, out, (3, 3), np.float32), np.full((3, 3), -1.0))
    np.testing.assert_array_equal(get(be, pt, (4, 3), np.float32), table)


# --------------------------------------------------------------------------- axis ops and normalisation


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("shape", "axis"), [((3, 5000), 1), ((4, 7, 5), 1), ((9,), 0)])
def test_log_softmax_and_float64_reductions(be: Any, shape: Any, axis: int, dtype: str) -> None:
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(dtype) * 4
    x.reshape(-1)[1] = -np.inf
    px, py = put(be, x), be.alloc(x.nbytes)
    x64 = x.astype(np.float64)
    peak = x64.max(axis=axis, keepdims=True)
    be.softmax(px, py, shape, axis, dtype=dtype, log=True)
    want = (x64 - peak) - np.log(np.exp(x64 - peak).sum(axis=axis, keepdims=True))
    tol = 64 * np.finfo(dtype).eps
    np.testing.assert_allclose(get(be, py, shape, dtype), want, rtol=tol, atol=tol)
    assert get(be, py, shape, dtype).reshape(-1)[1] == -np.inf
    out_shape = tuple(s for i, s in enumerate(shape) if i != axis)
    po = be.alloc(max(1, math.prod(out_shape)) * x.itemsize)
    be.reduce("mean", px, po, shape, axis, dtype=dtype)
    np.testing.assert_allclose(get(be, po, out_shape, dtype), x64.mean(axis=axis), rtol=tol * 100)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cols", [1, 300, 5000])
def test_layer_and_rms_norm(be: Any, cols: int, dtype: str) -> None:
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((4, cols)) * 3 + 1).astype(dtype)
    x[2, 0] = np.nan
    scale, bias = rng.standard_normal(cols).astype(dtype), rng.standard_normal(cols).astype(dtype)
    px, ps, pb, py = put(be, x), put(be, scale), put(be, bias), be.alloc(x.nbytes)
    x64 = x.astype(np.float64)
    tol = 64 * np.finfo(dtype).eps
    be.layer_norm(px, py, 4, cols, 1e-5, scale_ptr=ps, bias_ptr=pb, dtype=dtype)
    centred = x64 - x64.mean(axis=1, keepdims=True)
    want = centred / np.sqrt((centred**2).mean(axis=1, keepdims=True) + 1e-5) * scale + bias
    np.testing.assert_allclose(get(be, py, (4, cols), dtype), want, rtol=tol, atol=tol)
    be.rms_norm(px, py, 4, cols, 1e-5, bias_ptr=pb, dtype=dtype)
    want = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-5) + bias
    np.testing.assert_allclose(get(be, py, (4, cols), dtype), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batch_norm_and_lrn(be: Any, dtype: str) -> None:
    rng = np.random.default_rng(8)
    shape = (2, 5, 3, 7)
    x = rng.standard_normal(shape).astype(dtype)
    scale, bias, mean = (rng.standard_normal(5).astype(dtype) for _ in range(3))
    var = np.abs(rng.standard_normal(5)).astype(dtype)
    px, py = put(be, x), be.alloc(x.nbytes)
    ps, pb, pm, pv = (put(be, a) for a in (scale, bias, mean, var))
    be.batch_norm(px, shape, ps, pb, pm, pv, py, 1e-3, dtype=dtype)
    per = [a.astype(np.float64).reshape(1, 5, 1, 1) for a in (scale, bias, mean, var)]
    want = (x - per[2]) / np.sqrt(per[3] + 1e-3) * per[0] + per[1]
    tol = 16 * np.finfo(dtype).eps
    np.testing.assert_allclose(get(be, py, shape, dtype), want, rtol=tol, atol=tol)
    for size in (1, 2, 3, 8):
        be.lrn(px, py, shape, size, 0.5, 0.75, 2.0, dtype=dtype)
        squares = np.zeros(shape)
        for c in range(5):
            window = slice(max(0, c - (size - 1) // 2), min(5, c + size // 2 + 1))
            squares[:, c] = (x[:, window].astype(np.float64) ** 2).sum(axis=1)
        want = x / (2.0 + 0.5 / size * squares) ** 0.75
        np.testing.assert_allclose(get(be, py, shape, dtype), want, rtol=tol, atol=tol)


# --------------------------------------------------------------------------- pooling


def _pool_reference(x: Any, op: str, out_hw: Any, kernel: Any, stride: Any, pads: Any, dil: Any,
                    include_pad: bool) -> Any:  # fmt: skip
    n, c, h, w = x.shape
    oh, ow = out_hw
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            vals, padded = [], 0
            for r in range(kernel[0]):
                for q in range(kernel[1]):
                    yy, xx = i * stride[0] - pads[0] + r * dil[0], j * stride[1] - pads[1] + q * dil[1]
                    if 0 <= yy < h and 0 <= xx < w:
                        vals.append(x[:, :, yy, xx])
                    padded += -pads[0] <= yy < h + pads[2] and -pads[1] <= xx < w + pads[3]
            stack = np.array(vals) if vals else np.zeros((0, n, c))
            if op == "max":
                out[:, :, i, j] = np.fmax.reduce(stack, axis=0, initial=-np.inf)
            else:
                with np.errstate(invalid="ignore"):
                    out[:, :, i, j] = stack.sum(axis=0) / (padded if include_pad else len(vals))
    return out


POOLS = [
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
    ((2, 3), (1, 2), (0, 1, 1, 2), (2, 1), True),
    ((3, 3), (2, 2), (0, 0, 0, 0), (1, 1), True),  # ceil mode: the last window overhangs
    ((7, 6), (1, 1), (0, 0, 0, 0), (1, 1), False),  # global
    ((2, 2), (2, 2), (1, 1, 1, 1), (3, 3), False),  # dilated: some windows see only padding
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("kernel", "stride", "pads", "dil", "ceil"), POOLS)
def test_pool2d(be: Any, kernel: Any, stride: Any, pads: Any, dil: Any, ceil: bool, dtype: str) -> None:
    from computehal.validation import pool_output_size

    x = np.random.default_rng(7).standard_normal((2, 3, 7, 6)).astype(dtype)
    x[0, 1, 2, 3] = np.nan
    oh = pool_output_size(7, kernel[0], stride[0], pads[0], pads[2], dil[0], ceil)
    ow = pool_output_size(6, kernel[1], stride[1], pads[1], pads[3], dil[1], ceil)
    px, py = put(be, x), be.alloc(2 * 3 * oh * ow * x.itemsize)
    for op in ("max", "avg"):
        for include in (False, True):
            be.pool2d(op, px, x.shape, py, (2, 3, oh, ow), kernel, stride, pads, dilation=dil, ceil_mode=ceil,
                      count_include_pad=include, dtype=dtype)  # fmt: skip
            want = _pool_reference(x.astype(np.float64), op, (oh, ow), kernel, stride, pads, dil, include)
            tol = 8 * np.finfo(dtype).eps
            np.testing.assert_allclose(get(be, py, (2, 3, oh, ow), dtype), want, rtol=tol, atol=tol)


# --------------------------------------------------------------------------- convolution


def _taps(x_shape: Any, f_shape: Any, out_hw: Any, stride: Any, pads: Any, dil: Any, groups: int) -> Any:
    """Every (input index, filter index, output index) product of the convolution, padding skipped."""
    n, c, h, w = x_shape
    k, cg, fh, fw = f_shape
    kg = k // groups
    for kk, cl, r, s in np.ndindex(k, cg, fh, fw):
        ch = kk // kg * cg + cl
        for i, j in np.ndindex(*out_hw):
            yy, xx = i * stride[0] - pads[0] + r * dil[0], j * stride[1] - pads[1] + s * dil[1]
            if 0 <= yy < h and 0 <= xx < w:
                yield (slice(None), ch, yy, xx), (kk, cl, r, s), (slice(None), kk, i, j)


CONVS = [  # n, c, h, w, k, fh, fw, stride, padding, dilation, groups, bias
    (2, 3, 6, 7, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1, True),
    (1, 4, 7, 6, 4, 2, 3, (2, 1), (1, 2, 0, 1), (2, 1), 2, False),
    (2, 4, 5, 5, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 4, True),  # depthwise, channel multiplier 2
    (1, 6, 9, 8, 6, 3, 2, (2, 2), (0, 1, 2, 0), (1, 2), 3, True),
]


@pytest.mark.parametrize("chunked", [False, True], ids=["one-chunk", "image-chunks"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cfg", CONVS, ids=["plain-bias", "groups-dilation-4pad", "depthwise", "groups-3"])
def test_conv_extensions_with_nan_next_to_the_padding(
    be: Any, cfg: Any, dtype: str, chunked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import computehal.backends.opencl._conv as module

    if chunked:
        monkeypatch.setattr(module, "CONV_SCRATCH", 1)  # one image per chunk, beta = 1 accumulation
    n, c, h, w, k, fh, fw, stride, pads, dil, groups, has_bias = cfg
    p4 = pads if len(pads) == 4 else (*pads, *pads)
    oh = (h + p4[0] + p4[2] - dil[0] * (fh - 1) - 1) // stride[0] + 1
    ow = (w + p4[1] + p4[3] - dil[1] * (fw - 1) - 1) // stride[1] + 1
    rng = np.random.default_rng(n * c * k)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    f = rng.standard_normal((k, c // groups, fh, fw)).astype(dtype)
    gy = rng.standard_normal((n, k, oh, ow)).astype(dtype)
    bias = rng.standard_normal(k).astype(dtype)
    x[0, 0, 1, 2], f[0, 0, 0, 0], gy[-1, -1, -1, 0] = np.nan, np.nan, np.inf  # next to the padding
    y, gx, gf = np.zeros(gy.shape), np.zeros(x.shape), np.zeros(f.shape)
    x64, f64, gy64 = (a.astype(np.float64) for a in (x, f, gy))
    with np.errstate(invalid="ignore"):
        for xi, fi, yi in _taps(x.shape, f.shape, (oh, ow), stride, p4, dil, groups):
            y[yi] += x64[xi] * f64[fi]
            gx[xi] += gy64[yi] * f64[fi]
            gf[fi] += (x64[xi] * gy64[yi]).sum()
    if has_bias:
        y += bias.reshape(1, k, 1, 1)
    conv = {"dtype": dtype, "groups": groups, "dilation": dil}
    py, pgx, pgf = be.alloc(y.size * x.itemsize), be.alloc(x.nbytes), be.alloc(f.nbytes)
    px, pf, pgy = put(be, x), put(be, f), put(be, gy)
    bias_ptr = put(be, bias) if has_bias else None
    be.conv2d_forward(px, x.shape, pf, f.shape, py, y.shape, stride, pads, bias_ptr=bias_ptr, **conv)
    be.conv2d_backward_data(pgy, gy.shape, pf, f.shape, pgx, x.shape, stride, pads, **conv)
    be.conv2d_backward_filter(px, x.shape, pgy, gy.shape, pgf, f.shape, stride, pads, **conv)
    tol = 256 * np.finfo(dtype).eps
    for got, want in ((get(be, py, y.shape, dtype), y), (get(be, pgx, x.shape, dtype), gx),
                      (get(be, pgf, f.shape, dtype), gf)):  # fmt: skip
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# --------------------------------------------------------------------------- attention


def _attention_reference(q: Any, k: Any, v: Any, scale: float, causal: bool, mask: Any) -> Any:
    """One query row at a time over its visible keys (causal rule, masked score not -inf)."""
    b, h, sq, d = q.shape
    group, skv = h // k.shape[1], k.shape[2]
    additive = np.broadcast_to(np.zeros(1) if mask is None else mask.astype(np.float64), (b, h, sq, skv))
    out = np.zeros((b, h, sq, d))
    for bi, hi, i in np.ndindex(b, h, sq):
        keys, values = k[bi, hi // group].astype(np.float64), v[bi, hi // group].astype(np.float64)
        scores = keys @ q[bi, hi, i].astype(np.float64) * scale + additive[bi, hi, i]
        visible = scores != -np.inf
        if causal:
            visible &= np.arange(skv) <= i + skv - sq
        if visible.any():
            weights = np.exp(scores[visible] - scores[visible].max())
            out[bi, hi, i] = weights @ values[visible] / weights.sum()
    return out


ATTENTIONS = [  # batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, mask shape
    (2, 4, 2, 5, 9, 24, True, (5, 9)),
    (1, 3, 1, 40, 70, 64, False, (1, 3, 1, 70)),
    (2, 2, 2, 70, 33, 80, True, None),
    (1, 1, 1, 3, 130, 300, False, (130,)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cfg", ATTENTIONS, ids=["gqa-mask", "mqa-broadcast-mask", "long-q", "wide-head"])
def test_attention_mask_grouped_heads_and_cache(be: Any, cfg: Any, dtype: str) -> None:
    b, h, kvh, sq, skv, d, causal, mask_shape = cfg
    rng = np.random.default_rng(sq * skv)
    q = rng.standard_normal((b, h, sq, d)).astype(dtype)
    k, val = (rng.standard_normal((b, kvh, skv, d)).astype(dtype) for _ in range(2))
    mask = None
    kw: dict[str, Any] = {"dtype": dtype, "kv_heads": kvh}
    if mask_shape is not None:
        mask = rng.standard_normal(mask_shape).astype(dtype)
        mask[rng.random(mask_shape) < 0.3] = -np.inf
        kw.update(mask_ptr=put(be, mask), mask_shape=mask_shape)
    out = be.alloc(q.nbytes)
    be.attention(put(be, q), put(be, k), put(be, val), out, b, h, sq, skv, d, 0.3, causal, **kw)
    tol = 64 * np.finfo(dtype).eps
    want = _attention_reference(q, k, val, 0.3, causal, mask)
    np.testing.assert_allclose(get(be, out, q.shape, dtype), want, rtol=tol, atol=tol)


def test_long_rows_keep_their_accuracy(be: Any) -> None:
    """One row of 2^22 elements: the folds sum in blocks, so rounding does not grow with the row
    (one work-item per row on the CPU profile summed it in 8 lanes: softmax was 4e-3 off)."""
    n = 1 << 22
    x = np.random.default_rng(3).uniform(0, 1, n).astype(np.float32)
    px, py = put(be, x), be.alloc(x.nbytes)
    x64 = x.astype(np.float64)
    be.reduce("sum", px, py, [1, n], 1)
    assert abs(get(be, py, 1, np.float32)[0] - x64.sum()) <= 1e-6 * x64.sum()
    be.softmax(px, py, [1, n], 1)
    e = np.exp(x64 - x64.max())
    np.testing.assert_allclose(get(be, py, n, np.float32), e / e.sum(), rtol=1e-5)
    be.layer_norm(px, py, 1, n, 1e-5)
    want = (x64 - x64.mean()) / np.sqrt(x64.var() + 1e-5)
    np.testing.assert_allclose(get(be, py, n, np.float32), want, atol=1e-5)
