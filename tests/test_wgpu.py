"""WgpuBackend on a real adapter (lavapipe in CI), checked against independent NumPy definitions.

The whole module is skipped when wgpu-py or an adapter is missing, unless
``COMPUTEHAL_REQUIRE_BACKENDS`` names wgpu (or vulkan / webgpu / metal), in which
case a missing adapter is a failure.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest

from computehal import (
    BackendError,
    InvalidArgumentError,
    MemoryKind,
    NotInitializedError,
    UnsupportedError,
)

F32 = np.float32
Array = npt.NDArray[Any]


def _required() -> bool:
    names = {s.strip().lower() for s in os.environ.get("COMPUTEHAL_REQUIRE_BACKENDS", "").split(",")}
    return bool(names & {"wgpu", "vulkan", "webgpu", "metal"})


def _make() -> Any:
    from computehal.backends.wgpu import WgpuBackend

    backend = WgpuBackend()
    backend.init()
    return backend


try:
    _probe = _make()
    _probe.close()
    _REASON = ""
except Exception as exc:  # noqa: BLE001 - any failure means "no usable adapter here"
    _REASON = f"wgpu backend unavailable: {type(exc).__name__}: {exc}"

if _REASON:
    if _required():
        raise RuntimeError(_REASON + " (required by COMPUTEHAL_REQUIRE_BACKENDS)")
    pytest.skip(_REASON, allow_module_level=True)


@pytest.fixture(scope="module")
def be() -> Iterator[Any]:
    backend = _make()
    yield backend
    backend.close()


def put(be: Any, array: npt.ArrayLike, dtype: Any = F32) -> int:
    data = np.ascontiguousarray(array, dtype=dtype)
    ptr = int(be.alloc(max(1, data.nbytes)))
    if data.nbytes:
        be.copy_htod(ptr, data)
    return ptr


def get(be: Any, ptr: int, shape: Any, dtype: Any = F32) -> Array:
    out = np.empty(shape, dtype=dtype)
    be.copy_dtoh(out, ptr)
    return out


def colmajor(mat: Array, ld: int, fill: float = 0.0) -> Array:
    rows, cols = mat.shape
    flat = np.full(ld * cols, fill, dtype=F32)
    for j in range(cols):
        flat[j * ld : j * ld + rows] = mat[:, j]
    return flat


def from_colmajor(flat: Array, rows: int, cols: int, ld: int) -> Array:
    return np.stack([flat[j * ld : j * ld + rows] for j in range(cols)], axis=1)


# ---------------------------------------------------------------------- identity


def test_identity_and_devices(be: Any) -> None:
    import wgpu

    assert be.name() in ("vulkan", "metal", "webgpu")
    caps = be.capabilities()
    assert caps.supports_fp64 is False
    assert caps.supports_fp16 == ("shader-f16" in be._gpu.device.adapter.features)
    assert "gemm" in caps.native_ops and "attention" in caps.native_ops
    devices = be.available_devices()
    assert devices and len(devices) == len(wgpu.gpu.enumerate_adapters_sync())
    for i, dev in enumerate(devices):
        assert dev.ordinal == i and dev.name and dev.name != "adapter"
        assert isinstance(dev.memory_kind, MemoryKind)
        assert dev.capabilities.max_threads_per_block >= 64


def test_not_initialized_before_init() -> None:
    from computehal.backends.wgpu import WgpuBackend

    fresh = WgpuBackend()
    assert fresh.name() in ("vulkan", "metal", "webgpu")
    assert not fresh.is_initialized()
    with pytest.raises(NotInitializedError):
        fresh.alloc(16)
    with pytest.raises(NotInitializedError):
        fresh.unary("relu", 1, 1, 0)
    fresh.init()
    fresh.init()
    assert fresh.is_initialized()
    fresh.close()


def test_bad_adapter_index() -> None:
    from computehal.backends.wgpu import WgpuBackend

    with pytest.raises(BackendError):
        WgpuBackend(device=999).init()


# ---------------------------------------------------------------------- memory


def test_alloc_free_errors(be: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        be.alloc(0)
    with pytest.raises(InvalidArgumentError):
        be.alloc(-4)
    ptr = be.alloc(10)
    assert ptr % 64 == 0
    with pytest.raises(InvalidArgumentError):
        be.free(ptr + 4)
    be.free(ptr)
    with pytest.raises(InvalidArgumentError):
        be.free(ptr)
    with pytest.raises(InvalidArgumentError):
        be.copy_htod(ptr, b"abcd")


@pytest.mark.parametrize("size", [1, 3, 5, 13, 64, 67])
def test_unaligned_byte_copies_are_exact(be: Any, size: int) -> None:
    rng = np.random.default_rng(size)
    initial = rng.integers(0, 256, size, dtype=np.uint8)
    ptr = put(be, initial, np.uint8)
    expected = initial.copy()
    for start in range(size):
        for length in range(1, min(6, size - start) + 1):
            patch = rng.integers(0, 256, length, dtype=np.uint8)
            be.copy_htod(ptr + start, patch.tobytes())
            expected[start : start + length] = patch
            back = bytearray(length)
            be.copy_dtoh(back, ptr + start)
            assert bytes(back) == patch.tobytes()
    np.testing.assert_array_equal(get(be, ptr, size, np.uint8), expected)
    with pytest.raises(InvalidArgumentError):
        be.copy_htod(ptr, bytes(size + 1))  # the table records the requested size
    be.free(ptr)


def test_copy_accepts_buffer_protocol_objects(be: Any) -> None:
    ptr = be.alloc(16)
    be.copy_htod(ptr, memoryview(bytearray(b"0123456789abcdef")))
    out = np.zeros(4, dtype=np.uint32)
    be.copy_dtoh(out, ptr)
    assert out.tobytes() == b"0123456789abcdef"
    with pytest.raises(InvalidArgumentError):
        be.copy_dtoh(b"read-only", ptr)
    be.free(ptr)


def test_copy_dtod_any_byte_range(be: Any) -> None:
    """Whole words between buffers are a buffer copy; the rest runs the word-owning copy shader."""
    rng = np.random.default_rng(5)
    a0, b0 = rng.integers(0, 256, 64, dtype=np.uint8), rng.integers(0, 256, 64, dtype=np.uint8)
    pa, pb = put(be, a0, np.uint8), put(be, b0, np.uint8)
    for src, dst, n in [(0, 0, 63), (4, 8, 20), (1, 0, 9), (0, 3, 13), (5, 2, 37), (3, 7, 1), (6, 1, 2)]:
        be.copy_htod(pa, a0)
        be.copy_htod(pb, b0)
        be.copy_dtod(pb + dst, pa + src, n)  # two buffers
        want = b0.copy()
        want[dst : dst + n] = a0[src : src + n]
        np.testing.assert_array_equal(get(be, pb, 64, np.uint8), want)
        m = min(n // 2 + 1, 32 - dst // 2)
        be.copy_dtod(pa + 32 + dst // 2, pa + src, m)  # one buffer, apart or overlapping
        want = a0.copy()
        want[32 + dst // 2 : 32 + dst // 2 + m] = a0[src : src + m]
        np.testing.assert_array_equal(get(be, pa, 64, np.uint8), want)
        be.copy_htod(pa, a0)
        be.copy_dtod(pa + src + 1, pa + src, n)  # memmove forwards by one byte
        want = a0.copy()
        want[src + 1 : src + 1 + n] = a0[src : src + n]
        np.testing.assert_array_equal(get(be, pa, 64, np.uint8), want)
    be.free(pa)
    be.free(pb)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_fill_writes_only_its_elements(be: Any, dtype: str) -> None:
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    size = np.dtype(np_dtype).itemsize
    base = np.arange(40, dtype=np.uint8)
    ptr = put(be, base, np.uint8)
    for first, count, value in [(1, 1, 1.0 / 3.0), (1, 6, -2.5), (2, 5, np.inf), (0, 40 // size, np.nan)]:
        be.copy_htod(ptr, base)
        be.fill(ptr + first * size, count, value, dtype=dtype)
        got = get(be, ptr, 40, np.uint8)
        want = base.copy()
        want[first * size : (first + count) * size] = np.full(count, value, dtype=np_dtype).view(np.uint8)
        np.testing.assert_array_equal(got, want)
    be.free(ptr)


def test_buffers_outlive_the_recorded_work_that_uses_them(be: Any) -> None:
    """A buffer freed while recorded (unsubmitted, or running) work reads it is destroyed only after."""
    n = 1 << 20
    x = np.random.default_rng(3).random(n).astype(F32)
    py = be.alloc(4 * n)
    for flush in (False, True):
        px = put(be, x)
        for _ in range(3):
            be.unary("sqrt", px, py, n)
        if flush:
            be._gpu.queue.flush()  # submitted, probably still running
        be.free(px)
        np.testing.assert_array_equal(get(be, py, n), np.sqrt(x))
    be.free(py)


# ---------------------------------------------------------------------- 16-bit conversion
#
# wgpu_cast.wgsl converts on bit patterns, two 16-bit values per u32 word, each
# invocation owning one output word; the base widens every op through it.


def _same_floats(got: Array, want: Array) -> bool:
    g, w = got.astype(np.float32), want.astype(np.float32)
    return bool(np.all((g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w))))


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_cast_every_16bit_pattern_and_back(be: Any, name: str) -> None:
    dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(np.float16)
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    ph, pw = put(be, every, dtype), be.alloc(4 << 16)
    be.cast(ph, pw, 1 << 16, dtype=name, out_dtype="float32")
    wide = get(be, pw, 1 << 16)
    assert _same_floats(wide, every.astype(np.float32))
    nan_bits = every.view(np.uint16)[np.isnan(every.astype(np.float32))]
    be.cast(pw, ph, 1 << 16, dtype="float32", out_dtype=name)  # and back: NaN payloads too
    back = get(be, ph, 1 << 16, np.uint16)
    np.testing.assert_array_equal(back, every.view(np.uint16))
    assert nan_bits.size and np.isin(nan_bits, back).all()
    be.free(ph)
    be.free(pw)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_cast_rounds_to_nearest_even_into_odd_halves(be: Any, name: str) -> None:
    dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(np.float16)
    rng = np.random.default_rng(16)
    bits = rng.integers(0, 1 << 32, 3000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 1 << 16, 500, dtype=np.uint32) << 16) | 0x8000  # bf16 halfway cases
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 65504, 65520, 65519.996, 2.0**-25, 3e-8, 1e-45])
    x = np.concatenate([bits.view(np.float32), ties.view(np.float32), specials.astype(np.float32)])
    n = x.size
    px = put(be, x)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(dtype)
    for first in (0, 1):  # element 1 starts in the high half of a word
        canary = np.full(n + 3, 7.0, dtype)
        po = put(be, canary, dtype)
        be.cast(px, po + 2 * first, n, dtype="float32", out_dtype=name)
        got = get(be, po, n + 3, dtype)
        assert _same_floats(got[first : first + n], want)
        np.testing.assert_array_equal(np.delete(got, np.s_[first : first + n]), canary[:3])
        be.free(po)
    be.free(px)


def test_16bit_storage_runs_every_op_through_float32(be: Any) -> None:
    x = np.linspace(-4, 4, 37).astype(np.float16)
    px, po = put(be, x, np.float16), put(be, np.zeros(38, np.float16), np.float16)
    be.unary("tanh", px, po + 2, 37, dtype="float16")
    got = get(be, po, 38, np.float16)
    assert got[0] == 0
    np.testing.assert_allclose(
        got[1:].astype(np.float32), np.tanh(x.astype(np.float64)), rtol=2e-3, atol=1e-3
    )
    be.free(px)
    be.free(po)


# ---------------------------------------------------------------------- WGSL special functions
#
# WGSL has no erf and its exp / pow lose accuracy with the argument; wgpu_math.wgsl
# builds them from exact pieces. Checked against SciPy in float64.


def _ulps(got: Array, want: Array) -> float:
    w32 = want.astype(np.float32).astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(w32))
    fin = np.isfinite(w32) & (np.abs(w32) > 1e-37)
    assert np.array_equal(got[~fin & ~np.isnan(w32)], w32[~fin & ~np.isnan(w32)])
    return float((np.abs(got[fin] - want[fin]) / np.abs(want[fin])).max() / 2.0**-23)


def test_erf_gelu_silu_are_accurate(be: Any) -> None:
    import scipy.special

    x = np.concatenate([np.linspace(-12, 12, 20001), [np.nan, np.inf, -np.inf, 0, -0.0, 1e-30]]).astype(F32)
    x64 = x.astype(np.float64)
    px, po = put(be, x), be.alloc(x.nbytes)
    with np.errstate(all="ignore"):
        refs = {
            "erf": (scipy.special.erf(x64), 4),
            "gelu": (0.5 * x64 * scipy.special.erfc(-x64 / np.sqrt(2)), 8),
            "silu": (x64 / (1 + np.exp(-x64)), 8),
        }
    for op, (want, ulps) in refs.items():
        be.unary(op, px, po, x.size)
        if op in ("gelu", "silu"):
            want[np.isneginf(x64)] = np.nan  # -inf * 0
        assert _ulps(get(be, po, x.size).astype(np.float64), want) <= ulps, op
    be.free(px)
    be.free(po)


def test_pow_follows_c(be: Any) -> None:
    rng = np.random.default_rng(9)
    pairs = [
        (0.0, -1.0), (-0.0, -1.0), (-0.0, -2.0), (-0.0, 3.0), (np.inf, -2.0), (-np.inf, 3.0),
        (-np.inf, -3.0), (-1.0, np.inf), (0.5, np.inf), (2.0, -np.inf), (np.nan, 0.0), (1.0, np.nan),
        (-8.0, 1 / 3), (-2.0, 3.0), (-2.0, 2.0), (np.nan, 1.0), (2.0, np.nan), (-1.5, 1e30), (1e-40, 0.5),
    ]  # fmt: skip
    a = np.concatenate([rng.uniform(0, 10, 3000), 10 ** rng.uniform(-40, 38, 3000), [p[0] for p in pairs]])
    b = np.concatenate([rng.uniform(-3, 3, 3000), rng.uniform(-1, 1, 3000), [p[1] for p in pairs]])
    a, b = a.astype(F32), b.astype(F32)
    pa, pb, po = put(be, a), put(be, b), be.alloc(a.nbytes)
    be.binary("pow", pa, pb, po, a.size)
    with np.errstate(all="ignore"):
        want = np.power(a.astype(np.float64), b.astype(np.float64))
    assert _ulps(get(be, po, a.size).astype(np.float64), want) <= 16
    for p in (pa, pb, po):
        be.free(p)


# ---------------------------------------------------------------------- extension ops
#
# A compact check of the extension kernels against NumPy (the conformance kit checks
# them in depth on every backend).


def test_strided_broadcast_and_normalisation_kernels(be: Any) -> None:
    rng = np.random.default_rng(13)
    src = rng.standard_normal((3, 4, 5)).astype(F32)
    ps, pd = put(be, src), be.alloc(src.nbytes)
    be.copy_strided(pd, ps + 4 * 4, (5, 4, 3), (-1, 5, 20), (12, 3, 1))  # permute with a reversed axis
    np.testing.assert_array_equal(get(be, pd, (5, 4, 3)), np.transpose(src[:, :, ::-1], (2, 1, 0)))
    b = rng.standard_normal((4, 1)).astype(F32)
    pb = put(be, b)
    be.broadcast_binary("sub", ps, src.shape, pb, b.shape, pd, src.shape)
    np.testing.assert_array_equal(get(be, pd, src.shape), src - b)
    x = (rng.standard_normal((6, 37)) * 3 + 1).astype(F32)
    x[2, 5] = np.nan
    scale, bias = rng.standard_normal(37).astype(F32), rng.standard_normal(37).astype(F32)
    px, py, psc, pbi = put(be, x), be.alloc(x.nbytes), put(be, scale), put(be, bias)
    x64 = x.astype(np.float64)
    be.layer_norm(px, py, 6, 37, 1e-5, scale_ptr=psc, bias_ptr=pbi)
    mean = x64.mean(1, keepdims=True)
    want = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(1, keepdims=True) + 1e-5) * scale + bias
    np.testing.assert_allclose(get(be, py, x.shape), want, rtol=1e-5, atol=1e-5)
    be.rms_norm(px, py, 6, 37, 1e-5)
    want = x64 / np.sqrt((x64**2).mean(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(get(be, py, x.shape), want, rtol=1e-5, atol=1e-5)
    be.softmax(px, py, [6, 37], 1, log=True)
    want = (
        x64
        - x64.max(1, keepdims=True)
        - np.log(np.exp(x64 - x64.max(1, keepdims=True)).sum(1, keepdims=True))
    )
    np.testing.assert_allclose(get(be, py, x.shape), want, rtol=1e-5, atol=1e-5)
    shape, c = (2, 6, 3, 4), 6
    z = rng.standard_normal(shape).astype(F32)
    mu, var = rng.standard_normal(c).astype(F32), rng.uniform(0.5, 2, c).astype(F32)
    pz, pmu, pvar = put(be, z), put(be, mu), put(be, var)
    be.batch_norm(pz, shape, psc, pbi, pmu, pvar, py, 1e-3)
    col = (slice(None), None, None)
    want = (z - mu[col]) / np.sqrt(var[col] + 1e-3) * scale[:c][col] + bias[:c][col]
    np.testing.assert_allclose(get(be, py, shape), want, rtol=1e-5, atol=1e-5)
    be.lrn(pz, py, shape, 3, 1e-2, 0.75, 2.0)
    sq = np.pad(z.astype(np.float64) ** 2, ((0, 0), (1, 1), (0, 0), (0, 0)))
    window = sq[:, :-2] + sq[:, 1:-1] + sq[:, 2:]
    np.testing.assert_allclose(
        get(be, py, shape), z / (2.0 + 1e-2 / 3 * window) ** 0.75, rtol=1e-5, atol=1e-6
    )
    for p in (ps, pd, pb, px, py, psc, pbi, pz, pmu, pvar):
        be.free(p)


# ---------------------------------------------------------------------- GEMM


@pytest.mark.parametrize("ta", ["N", "T", "C"])
@pytest.mark.parametrize("tb", ["N", "T"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (70, 33, 129), (65, 64, 17)])
@pytest.mark.parametrize("beta", [0.0, -0.5])
def test_gemm(be: Any, ta: str, tb: str, shape: tuple[int, int, int], beta: float) -> None:
    m, n, k = shape
    rng = np.random.default_rng(m * 1000 + n + k)
    a_rows, a_cols = (m, k) if ta == "N" else (k, m)
    b_rows, b_cols = (k, n) if tb == "N" else (n, k)
    a = rng.standard_normal((a_rows, a_cols)).astype(F32)
    b = rng.standard_normal((b_rows, b_cols)).astype(F32)
    c = rng.standard_normal((m, n)).astype(F32)
    if beta == 0.0:
        c[0, 0] = np.nan  # write-only C: the NaN must not survive
    lda, ldb, ldc = a_rows + 2, b_rows + 1, m + 3
    c_flat = colmajor(c, ldc, fill=123.0)
    pa, pb, pc = put(be, colmajor(a, lda)), put(be, colmajor(b, ldb)), put(be, c_flat)
    be.gemm(ta, tb, m, n, k, 1.25, pa, lda, pb, ldb, beta, pc, ldc, dtype="float32")
    got_flat = get(be, pc, c_flat.shape)
    op_a = a.astype(np.float64) if ta == "N" else a.T.astype(np.float64)
    op_b = b.astype(np.float64) if tb == "N" else b.T.astype(np.float64)
    want = 1.25 * np.einsum("ik,kj->ij", op_a, op_b) + (beta * c if beta else 0.0)
    got = from_colmajor(got_flat, m, n, ldc)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))
    padding = np.ones(ldc * n, dtype=bool)
    for j in range(n):
        padding[j * ldc : j * ldc + m] = False
    assert np.all(got_flat[padding] == 123.0)  # rows between m and ldc untouched
    for p in (pa, pb, pc):
        be.free(p)


def test_gemm_quick_returns_do_not_read_a_b(be: Any) -> None:
    c = np.array([1.0, np.nan, 3.0, 4.0], dtype=F32)
    pc = put(be, c)
    nan_ab = put(be, np.full(16, np.nan, dtype=F32))
    be.gemm("N", "N", 2, 2, 0, 1.0, nan_ab, 2, nan_ab, 1, 0.0, pc, 2, dtype="float32")
    np.testing.assert_array_equal(get(be, pc, 4), np.zeros(4))
    be.copy_htod(pc, np.array([1, 2, 3, 4], dtype=F32))
    be.gemm("N", "N", 2, 2, 2, 0.0, nan_ab, 2, nan_ab, 2, 2.0, pc, 2, dtype="float32")
    np.testing.assert_array_equal(get(be, pc, 4), [2, 4, 6, 8])
    be.gemm("N", "N", 0, 2, 2, 1.0, nan_ab, 1, nan_ab, 2, 0.0, pc, 1, dtype="float32")
    np.testing.assert_array_equal(get(be, pc, 4), [2, 4, 6, 8])
    be.free(pc)
    be.free(nan_ab)


def test_gemm_float64_is_unsupported(be: Any) -> None:
    ptr = be.alloc(64)
    with pytest.raises(UnsupportedError, match="float64"):
        be.gemm("N", "N", 2, 2, 2, 1.0, ptr, 2, ptr, 2, 0.0, ptr, 2)
    with pytest.raises(UnsupportedError, match="float64"):
        be.batched_gemm("N", "N", 1, 1, 1, 1.0, ptr, 1, 1, ptr, 1, 1, 0.0, ptr, 1, 1, 2, dtype="float64")
    be.free(ptr)


def test_gemm_interior_pointers_and_overlap(be: Any) -> None:
    rng = np.random.default_rng(7)
    m = n = k = 9
    a = rng.standard_normal((m, k)).astype(F32)
    b = rng.standard_normal((k, n)).astype(F32)
    # A, B, C packed in one allocation at odd float offsets; then C overlaps A.
    blob = np.concatenate(
        [np.zeros(3, F32), colmajor(a, m), np.zeros(5, F32), colmajor(b, k), np.zeros(m * n, F32)]
    )
    base = put(be, blob)
    pa, pb = base + 3 * 4, base + (3 + m * k + 5) * 4
    pc = pb + k * n * 4
    be.gemm("N", "N", m, n, k, 1.0, pa, m, pb, k, 0.0, pc, m, dtype="float32")
    got = from_colmajor(get(be, base, blob.shape)[3 + m * k + 5 + k * n :], m, n, m)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    # In-place: C is A (square), beta = 1 -> C = A @ B + A.
    be.gemm("N", "N", m, n, k, 1.0, pa, m, pb, k, 1.0, pa, m, dtype="float32")
    got = from_colmajor(get(be, base, blob.shape)[3 : 3 + m * k], m, k, m)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b + a, rtol=1e-5, atol=1e-5)
    with pytest.raises(InvalidArgumentError, match="aligned"):
        be.gemm("N", "N", 1, 1, 1, 1.0, base + 1, 1, base, 1, 0.0, base + 8, 1, dtype="float32")
    be.free(base)


@pytest.mark.parametrize("ta,tb", [("N", "N"), ("T", "N"), ("N", "T")])
def test_batched_gemm(be: Any, ta: str, tb: str) -> None:
    rng = np.random.default_rng(11)
    m, n, k, count = 17, 9, 33, 5
    a_rows, a_cols = (m, k) if ta == "N" else (k, m)
    b_rows, b_cols = (k, n) if tb == "N" else (n, k)
    lda, ldb, ldc = a_rows + 1, b_rows, m + 2
    sa, sb, sc = lda * a_cols + 3, ldb * b_cols, ldc * n + 7
    a = rng.standard_normal((count, a_rows, a_cols)).astype(F32)
    b = rng.standard_normal((count, b_rows, b_cols)).astype(F32)
    c = rng.standard_normal((count, m, n)).astype(F32)

    def pack(mats: Array, ld: int, stride: int) -> Array:
        flat = np.full(stride * count, -7.0, dtype=F32)
        for i, mat in enumerate(mats):
            col = colmajor(mat, ld, fill=-7.0)
            flat[i * stride : i * stride + col.size] = col
        return flat

    c_flat = pack(c, ldc, sc)
    pa, pb, pc = put(be, pack(a, lda, sa)), put(be, pack(b, ldb, sb)), put(be, c_flat)
    be.batched_gemm(ta, tb, m, n, k, 0.5, pa, lda, sa, pb, ldb, sb, 2.0, pc, ldc, sc, count)
    got = get(be, pc, c_flat.shape)
    for i in range(count):
        op_a = a[i] if ta == "N" else a[i].T
        op_b = b[i] if tb == "N" else b[i].T
        want = 0.5 * np.einsum("ik,kj->ij", op_a.astype(np.float64), op_b) + 2.0 * c[i]
        np.testing.assert_allclose(from_colmajor(got[i * sc :], m, n, ldc), want, rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(got[i * sc + ldc * (n - 1) + m : (i + 1) * sc], -7.0)
    for p in (pa, pb, pc):
        be.free(p)


@pytest.mark.parametrize("prec", ["f16", "bf16"])
def test_mixed_precision_rounds_like_ml_dtypes(be: Any, prec: str) -> None:
    narrow = np.float16 if prec == "f16" else ml_dtypes.bfloat16
    specials = np.array(
        [1.0, 1.0009765625, 1.00048828125, 1.000732421875, 65504, 65519.99, 65520, 1e-7, 2.9802322e-08,
         5.96e-8, 8.9e-8, -1e-5, 3.14159, np.inf, -np.inf, np.nan, 1.00390625, 1.001953125, 3.4e38, -0.0],
        dtype=F32,
    )  # fmt: skip
    n = specials.size
    pa, one, pc = put(be, specials), put(be, np.ones(1, F32)), be.alloc(4 * n)
    # C (n x 1) = A (n x 1) @ [1]: each output is one rounded element of A.
    be.gemm_mixed_precision(prec, "N", "N", n, 1, 1, 1.0, pa, n, one, 1, 0.0, pc, n)
    with np.errstate(over="ignore"):
        want = specials.astype(narrow).astype(F32)
    np.testing.assert_array_equal(get(be, pc, n), want)
    for p in (pa, one, pc):
        be.free(p)
    rng = np.random.default_rng(3)
    for m, nn, k in ((31, 23, 40), (70, 40, 40)):  # the small-matrix and the tiled kernel
        a = (rng.standard_normal((m, k)) * 4).astype(F32)
        b = (rng.standard_normal((nn, k)) * 4).astype(F32)
        pa2, pb2, pc2 = put(be, colmajor(a, m)), put(be, colmajor(b, nn)), be.alloc(4 * m * nn)
        be.gemm_mixed_precision(prec, "N", "T", m, nn, k, 1.0, pa2, m, pb2, nn, 0.0, pc2, m)
        want2 = a.astype(narrow).astype(np.float64) @ b.astype(narrow).astype(np.float64).T
        np.testing.assert_allclose(from_colmajor(get(be, pc2, m * nn), m, nn, m), want2, rtol=1e-5, atol=1e-4)
        for p in (pa2, pb2, pc2):
            be.free(p)


# ---------------------------------------------------------------------- convolution


def conv_reference(x: Array, f: Array, stride: tuple[int, int], pad: tuple[int, int]) -> Array:
    n, c, h, w = x.shape
    k, _, fh, fw = f.shape
    xp = np.zeros((n, c, h + 2 * pad[0], w + 2 * pad[1]))
    xp[:, :, pad[0] : pad[0] + h, pad[1] : pad[1] + w] = x
    oh = (h + 2 * pad[0] - fh) // stride[0] + 1
    ow = (w + 2 * pad[1] - fw) // stride[1] + 1
    y = np.zeros((n, k, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride[0] : i * stride[0] + fh, j * stride[1] : j * stride[1] + fw]
            y[:, :, i, j] = np.einsum("ncrs,kcrs->nk", patch, f)
    return y


CONV_CASES = [
    ((2, 3, 7, 6), (4, 3, 3, 3), (1, 1), (1, 1)),
    ((1, 2, 9, 8), (3, 2, 2, 3), (2, 3), (0, 2)),
    ((2, 3, 5, 5), (2, 3, 5, 5), (2, 2), (2, 2)),
    ((1, 1, 6, 6), (1, 1, 1, 1), (3, 3), (0, 0)),
]


@pytest.mark.parametrize("xs,fs,stride,pad", CONV_CASES)
def test_conv2d_forward_and_gradients(be: Any, xs: Any, fs: Any, stride: Any, pad: Any) -> None:
    rng = np.random.default_rng(sum(xs) + sum(fs))
    x = rng.standard_normal(xs).astype(F32)
    f = rng.standard_normal(fs).astype(F32)
    y_want = conv_reference(x.astype(np.float64), f.astype(np.float64), stride, pad)
    ys = y_want.shape
    px, pf, py = put(be, x), put(be, f), put(be, np.full(ys, np.nan, F32))
    be.conv2d_forward(px, xs, pf, fs, py, ys, stride, pad)
    np.testing.assert_allclose(get(be, py, ys), y_want, rtol=1e-5, atol=1e-5)
    # Gradients of loss = sum(y * g) by linearity: d/dx and d/df via the reference's adjoint.
    g = rng.standard_normal(ys).astype(F32)
    pg = put(be, g)
    gx_want = np.zeros(xs)
    for idx in np.ndindex(*xs):
        e = np.zeros(xs)
        e[idx] = 1.0
        gx_want[idx] = np.sum(conv_reference(e, f.astype(np.float64), stride, pad) * g)
    gf_want = np.zeros(fs)
    for idx in np.ndindex(*fs):
        e = np.zeros(fs)
        e[idx] = 1.0
        gf_want[idx] = np.sum(conv_reference(x.astype(np.float64), e, stride, pad) * g)
    pgx, pgf = put(be, np.full(xs, np.nan, F32)), put(be, np.full(fs, np.nan, F32))
    be.conv2d_backward_data(pg, ys, pf, fs, pgx, xs, stride, pad)
    be.conv2d_backward_filter(px, xs, pg, ys, pgf, fs, stride, pad)
    np.testing.assert_allclose(get(be, pgx, xs), gx_want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(get(be, pgf, fs), gf_want, rtol=1e-5, atol=1e-4)
    for p in (px, pf, py, pg, pgx, pgf):
        be.free(p)


def test_conv2d_rejects_bad_shapes(be: Any) -> None:
    p = be.alloc(1024)
    with pytest.raises(InvalidArgumentError):
        be.conv2d_forward(p, [1, 1, 4, 4], p, [1, 2, 3, 3], p, [1, 1, 2, 2], [1, 1], [0, 0])
    with pytest.raises(InvalidArgumentError):
        be.conv2d_forward(p, [1, 1, 4, 4], p, [1, 1, 3, 3], p, [1, 1, 3, 3], [1, 1], [0, 0])
    be.free(p)


# ---------------------------------------------------------------------- attention


def attention_reference(q: Array, k: Array, v: Array, scale: float, causal: bool) -> Array:
    sq, skv = q.shape[2], k.shape[2]
    scores = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if causal:
        visible = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)
        scores = np.where(visible, scores, -np.inf)
    out = np.zeros(q.shape)
    for idx in np.ndindex(*scores.shape[:3]):
        row = scores[idx]
        if np.all(np.isneginf(row)):
            continue
        w = np.exp(row - row.max())
        out[idx] = (w / w.sum()) @ v[idx[0], idx[1]]
    return out


@pytest.mark.parametrize(
    "dims,causal",
    [
        ((1, 2, 5, 7, 4), False),
        ((2, 1, 7, 5, 3), True),  # seq_q > seq_kv: the first rows see no key
        ((1, 1, 9, 9, 130), True),  # head_dim above one accumulator chunk
        ((1, 2, 16, 40, 64), True),
        ((1, 1, 1, 1, 1), False),
    ],
)
def test_attention(be: Any, dims: tuple[int, ...], causal: bool) -> None:
    b, h, sq, skv, d = dims
    rng = np.random.default_rng(sq * 100 + skv)
    q = rng.standard_normal((b, h, sq, d)).astype(F32)
    k = rng.standard_normal((b, h, skv, d)).astype(F32)
    v = rng.standard_normal((b, h, skv, d)).astype(F32)
    scale = 1.0 / np.sqrt(d)
    pq, pk, pv, po = put(be, q), put(be, k), put(be, v), put(be, np.full(q.shape, np.nan, F32))
    be.attention(pq, pk, pv, po, b, h, sq, skv, d, scale, causal)
    want = attention_reference(
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), scale, causal
    )
    np.testing.assert_allclose(get(be, po, q.shape), want, rtol=1e-5, atol=1e-5)
    # Output aliasing the query: same result.
    be.attention(pq, pk, pv, pq, b, h, sq, skv, d, scale, causal)
    np.testing.assert_allclose(get(be, pq, q.shape), want, rtol=1e-5, atol=1e-5)
    for p in (pq, pk, pv, po):
        be.free(p)


# ---------------------------------------------------------------------- reduce / softmax


def special_tensor(shape: tuple[int, ...]) -> Array:
    rng = np.random.default_rng(int(np.prod(shape)))
    x = rng.standard_normal(shape).astype(F32)
    flat = x.reshape(-1)
    flat[3] = np.nan
    flat[7] = np.inf
    flat[11] = -np.inf
    return x


def np_reduce(op: str, x: Array, axis: int) -> Array:
    x64 = x.astype(np.float64)
    if op == "sum":
        return np.asarray(x64.sum(axis=axis))
    if op == "mean":
        return np.asarray(x64.mean(axis=axis) if x.shape[axis] else x64.sum(axis=axis))
    fold = np.fmax if op == "max" else np.fmin
    return np.asarray(fold.reduce(x64, axis=axis, initial=-np.inf if op == "max" else np.inf))


@pytest.mark.parametrize(
    "shape,axis",
    [
        ((3, 300, 5), 1),
        ((3, 300, 5), 0),
        ((3, 300, 5), 2),
        ((4500,), 0),
        ((2, 0, 3), 1),
        ((6, 1024), 1),
        ((3, 70001), 1),  # few long slices: split across workgroups in two passes
        ((70001, 2), 0),
    ],
)
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_reduce(be: Any, shape: tuple[int, ...], axis: int, op: str) -> None:
    x = special_tensor(shape) if np.prod(shape) > 12 else np.zeros(shape, F32)
    out_shape = shape[:axis] + shape[axis + 1 :]
    px, po = put(be, x), be.alloc(4 * max(1, int(np.prod(out_shape))))
    be.reduce(op, px, po, list(shape), axis)
    with np.errstate(invalid="ignore"):
        want = np_reduce(op, x, axis)
    np.testing.assert_allclose(get(be, po, out_shape), want, rtol=1e-5, atol=1e-4, equal_nan=True)
    be.free(px)
    be.free(po)


def test_reduce_nan_semantics(be: Any) -> None:
    x = np.array([[np.nan, np.nan], [np.nan, 1.0], [-np.inf, -np.inf]], dtype=F32)
    px, po = put(be, x), be.alloc(12)
    for op, want in (("max", [-np.inf, 1.0, -np.inf]), ("min", [np.inf, 1.0, -np.inf])):
        be.reduce(op, px, po, [3, 2], 1)
        np.testing.assert_array_equal(get(be, po, 3), want)
    be.free(px)
    be.free(po)


@pytest.mark.parametrize("shape,axis", [((3, 300, 5), 1), ((5, 7), 0), ((2, 2048), 1), ((4, 6), 1)])
def test_softmax(be: Any, shape: tuple[int, ...], axis: int) -> None:
    rng = np.random.default_rng(len(shape) + axis)
    x = rng.standard_normal(shape).astype(F32) * 5
    px, po = put(be, x), put(be, np.full(shape, 9.0, F32))
    be.softmax(px, po, list(shape), axis)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(get(be, po, shape), e / e.sum(axis=axis, keepdims=True), rtol=1e-5, atol=1e-6)
    be.softmax(px, px, list(shape), axis)  # in place
    np.testing.assert_allclose(get(be, px, shape), e / e.sum(axis=axis, keepdims=True), rtol=1e-5, atol=1e-6)
    be.free(px)
    be.free(po)


@pytest.mark.parametrize("length", [4, 600])
def test_softmax_special_slices(be: Any, length: int) -> None:
    x = np.zeros((4, length), dtype=F32)
    x[0] = -np.inf  # all -inf -> NaN
    x[1, 1] = np.nan  # a NaN poisons its slice
    x[2, 2] = np.inf  # +inf: inf - inf -> NaN
    x[3, 1:] = -np.inf  # one finite value -> [1, 0, 0, 0]
    px, po = put(be, x), be.alloc(x.nbytes)
    be.softmax(px, po, list(x.shape), 1)
    got = get(be, po, x.shape)
    assert np.all(np.isnan(got[:3]))
    want = np.zeros(length)
    want[0] = 1.0
    np.testing.assert_array_equal(got[3], want)
    be.free(px)
    be.free(po)


# ---------------------------------------------------------------------- element-wise

SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 100.0, -100.0, 1e-20, 20.0, -20.0, 88.8,
                     89.0, -104.0, 0.5, 3e38], dtype=F32)  # fmt: skip
OTHERS = np.array([0.0, 0.0, 2.0, np.nan, np.inf, 1.0, np.nan, -np.inf, 3.0, 0.0, -0.0, 5.0, np.inf, 1.0, 2.0,
                   -0.5, 3e38], dtype=F32)  # fmt: skip


def np_unary(op: str, x: Array) -> Array:
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        table = {
            "relu": np.fmax(x64, 0.0),
            "sigmoid": 1.0 / (1.0 + np.exp(-x64)),
            "tanh": np.tanh(x64),
            "exp": np.exp(x64),
            "log": np.log(x64),
            "sqrt": np.sqrt(x64),
            "abs": np.abs(x64),
            "neg": -x64,
        }
        return table[op].astype(F32)


@pytest.mark.parametrize("op", ["relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "neg"])
def test_unary(be: Any, op: str) -> None:
    rng = np.random.default_rng(5)
    x = np.concatenate([SPECIALS, rng.uniform(-8, 8, 500).astype(F32)])
    px, po = put(be, x), be.alloc(x.nbytes)
    be.unary(op, px, po, x.size)
    want = np_unary(op, x)
    got = get(be, po, x.shape)
    np.testing.assert_allclose(got, want, rtol=4e-6, atol=1e-30, equal_nan=True)
    be.unary(op.upper(), px, px, x.size)  # in place, upper-case name
    np.testing.assert_array_equal(get(be, px, x.shape), got)
    be.free(px)
    be.free(po)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "max", "min"])
def test_binary(be: Any, op: str) -> None:
    a, b = SPECIALS, OTHERS
    pa, pb, po = put(be, a), put(be, b), be.alloc(a.nbytes)
    be.binary(op, pa, pb, po, a.size)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(all="ignore"):
        want = {
            "add": a64 + b64,
            "sub": a64 - b64,
            "mul": a64 * b64,
            "div": a64 / b64,
            "max": np.fmax(a64, b64),
            "min": np.fmin(a64, b64),
        }[op].astype(F32)
    np.testing.assert_allclose(get(be, po, a.shape), want, rtol=1e-6, equal_nan=True)
    be.binary(op, pa, pb, pa, a.size)  # output aliases a
    np.testing.assert_allclose(get(be, pa, a.shape), want, rtol=1e-6, equal_nan=True)
    for p in (pa, pb, po):
        be.free(p)


def test_elementwise_partial_overlap(be: Any) -> None:
    x = np.arange(64, dtype=F32)
    px = put(be, x)
    be.unary("neg", px, px + 4 * 8, 32)  # output starts 8 floats after the input
    got = get(be, px, 64)
    want = x.copy()
    want[8:40] = -x[:32]
    np.testing.assert_array_equal(got, want)
    be.free(px)


def test_large_problem_uses_a_2d_grid(be: Any) -> None:
    n = 65535 * 256 + 1000  # more workgroups than one grid dimension allows
    x = np.linspace(-1, 1, n, dtype=F32)
    px = put(be, x)
    be.unary("abs", px, px, n)
    got = get(be, px, n)
    np.testing.assert_array_equal(got, np.abs(x))
    be.free(px)


# ---------------------------------------------------------------------- gather / scatter


@pytest.mark.parametrize("where", ["host", "int32", "int64"])
def test_gather_and_scatter(be: Any, where: str) -> None:
    """Host indices and device indices (checked on the device, int64 as two words)."""
    rng = np.random.default_rng(9)
    table = rng.standard_normal((10, 7)).astype(F32)
    idx = np.array([3, 0, 9, 3, 3, 5])
    src = rng.standard_normal((6, 7)).astype(F32)
    out = np.arange(70, dtype=F32).reshape(10, 7)
    pt, po, ps, pd = put(be, table), be.alloc(4 * 6 * 7), put(be, src), put(be, out)

    def rows(method: str, indices: Any, x: int, y: int) -> None:
        if where == "host":
            getattr(be, method)(x, indices, y, 10, 7)
            return
        pi = put(be, np.asarray(indices), where)
        try:
            getattr(be, method)(x, len(indices), y, 10, 7, indices_ptr=pi, index_dtype=where)
        finally:
            be.free(pi)

    rows("gather", idx, pt, po)
    np.testing.assert_array_equal(get(be, po, (6, 7)), table[idx])
    rows("scatter", idx, ps, pd)
    want = out.copy()
    for i, row in enumerate(idx):  # sequential loop: the last duplicate wins
        want[row] = src[i]
    np.testing.assert_array_equal(get(be, pd, (10, 7)), want)
    bad = [[1, 2, 10, 0, 0, 0], [0, -1, 3, 3, 3, 3]]
    if where != "int32":
        bad.append([1, 2**32 + 3, 0, 0, 0, 0])  # would wrap to row 3 in 32 bits
    for indices in bad:
        before_out, before_rows = get(be, pd, (10, 7)), get(be, po, (6, 7))
        with pytest.raises(InvalidArgumentError, match="negative" if min(indices) < 0 else "out of range"):
            rows("scatter", indices, ps, pd)
        with pytest.raises(InvalidArgumentError):
            rows("gather", indices, pt, po)
        np.testing.assert_array_equal(get(be, pd, (10, 7)), before_out)  # nothing written
        np.testing.assert_array_equal(get(be, po, (6, 7)), before_rows)
    for p in (pt, po, ps, pd):
        be.free(p)


def test_gather_scatter_use_the_validated_indices(be: Any) -> None:
    """Regression: masked or wrapping index arrays never drop or zero rows silently.

    The validation once looked at a masked array's unmasked values while the kernels used
    all of them, so an index past the rows was read (gather: zeros) or written nowhere
    (scatter: the row silently dropped).
    """
    table = np.arange(28, dtype=F32).reshape(4, 7)
    pt, po = put(be, table), put(be, np.full((2, 7), -1.0, F32))
    masked = np.ma.array([0, 6], mask=[False, True])
    for call in (
        lambda: be.gather(pt, masked, po, 4, 7),
        lambda: be.scatter(po, masked, pt, 4, 7),
        lambda: be.gather(pt, np.array([1, 2**32 + 2], np.int64), po, 4, 7),
        lambda: be.scatter(po, np.array([2**32, 1], np.uint64), pt, 4, 7),
    ):
        with pytest.raises(InvalidArgumentError):
            call()
    np.testing.assert_array_equal(get(be, pt, (4, 7)), table)
    np.testing.assert_array_equal(get(be, po, (2, 7)), np.full((2, 7), -1.0, F32))
    be.gather(pt, np.ma.array([3, 1], mask=[True, False]), po, 4, 7)  # raw values are used
    np.testing.assert_array_equal(get(be, po, (2, 7)), table[[3, 1]])
    be.free(pt)
    be.free(po)


def test_operands_freed_by_another_thread_during_recorded_work(be: Any) -> None:
    """Regression: frees racing with recorded (unsubmitted) work never break a result.

    Each worker records a chain of ops on its own buffers while a second thread frees
    them at random moments: every call either completes with the right value or raises
    InvalidArgumentError (the pointer was already freed); nothing else escapes.
    """
    import random
    import time

    errors: list[BaseException] = []
    deadline = time.monotonic() + 1.5

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        x = np.random.default_rng(seed).standard_normal(4096).astype(F32)
        try:
            while time.monotonic() < deadline:
                px, py = put(be, x), be.alloc(x.nbytes)
                pause = rnd.random() * 0.002

                def free_later(ptr: int = px, pause: float = pause) -> None:
                    time.sleep(pause)
                    be.free(ptr)

                freer = threading.Thread(target=free_later)
                freer.start()
                try:
                    for _ in range(5):
                        be.unary("neg", px, py, x.size)
                        be.gather(px, [3, 1], py, 1024, 4)
                    be.copy_dtoh(out := np.empty(8, F32), py)
                    np.testing.assert_array_equal(out, x.reshape(1024, 4)[[3, 1]].reshape(-1))
                except InvalidArgumentError:
                    pass  # px was freed first: reported, not used
                freer.join()
                be.free(py)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---------------------------------------------------------------------- engineering


def test_pipelines_are_compiled_once(be: Any) -> None:
    px = put(be, np.ones(256, F32))
    for _ in range(3):
        be.unary("exp", px, px, 256)
        be.binary("add", px, px, px, 256)
        be.reduce("sum", px, px, [16, 16], 1)
    compiled = be._gpu.programs.compiled()
    for op in ("relu", "tanh", "neg"):
        be.unary(op, px, px, 100)
    be.binary("mul", px, px, px, 17)
    be.reduce("max", px, px, [8, 16], 1)
    assert be._gpu.programs.compiled() == compiled
    be.free(px)


def test_binding_limit_is_reported(be: Any) -> None:
    px = be.alloc(4096)
    saved = be._gpu.max_binding
    be._gpu.max_binding = 1024
    try:
        with pytest.raises(UnsupportedError, match="maxStorageBufferBindingSize"):
            be.unary("abs", px, px, 1024)
    finally:
        be._gpu.max_binding = saved
    be.free(px)


def test_only_backend_errors_escape(be: Any) -> None:
    calls: list[Callable[[], object]] = [
        lambda: be.gemm("X", "N", 1, 1, 1, 1.0, 1, 1, 1, 1, 0.0, 1, 1, dtype="float32"),
        lambda: be.unary("nope", 1, 1, 1),
        lambda: be.reduce("sum", 1, 1, "abc", 0),
        lambda: be.attention(1, 1, 1, 1, 1, 1, 1, 1, 1, float("nan"), False),
        lambda: be.copy_htod(12345, object()),
        lambda: be.gather(1, [1.5], 1, 1, 1),
        lambda: be.alloc(2**70),
        lambda: be.alloc(be._gpu.max_buffer + 4),
    ]
    for call in calls:
        with pytest.raises(BackendError):
            call()


def test_threads_share_the_backend(be: Any) -> None:
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            x = np.random.default_rng(seed).standard_normal(1000).astype(F32)
            px = put(be, x)
            for _ in range(20):
                be.unary("neg", px, px, 1000)
            np.testing.assert_array_equal(get(be, px, 1000), x)
            be.free(px)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_unaligned_element_offsets_use_the_scalar_path(be: Any) -> None:
    x = np.linspace(-3, 3, 67, dtype=F32)
    px, po = put(be, x), be.alloc(4 * 67)
    be.binary("mul", px + 4, px + 8, po + 12, 60)  # element offsets 1, 2, 3
    got = get(be, po, 67)
    np.testing.assert_allclose(got[3:63], x[1:61] * x[2:62], rtol=1e-6)
    be.free(px)
    be.free(po)


def test_batched_gemm_beyond_one_grid_dimension(be: Any) -> None:
    count = 65535 + 7  # more batches than one dispatch's grid.z
    a = np.arange(count, dtype=F32) % 13
    b = np.full(count, 2.0, dtype=F32)
    pa, pb, pc = put(be, a), put(be, b), put(be, np.ones(count, F32))
    be.batched_gemm("N", "N", 1, 1, 1, 1.0, pa, 1, 1, pb, 1, 1, 1.0, pc, 1, 1, count)
    np.testing.assert_array_equal(get(be, pc, count), 2.0 * a + 1.0)
    for p in (pa, pb, pc):
        be.free(p)


def test_reduce_many_long_slices(be: Any) -> None:
    shape = (70000, 260)  # more slices than one grid dimension, each long enough for a workgroup
    x = np.random.default_rng(2).standard_normal(shape).astype(F32)
    px, po = put(be, x), be.alloc(4 * shape[0])
    be.reduce("max", px, po, list(shape), 1)
    np.testing.assert_array_equal(get(be, po, shape[0]), x.max(axis=1))
    be.reduce("sum", px, po, list(shape), 1)
    np.testing.assert_allclose(get(be, po, shape[0]), x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
    be.free(px)
    be.free(po)


# ---------------------------------------------------------------------- llvmpipe's loop budget
#
# lavapipe stops every shader loop after 65535 iterations per invocation; the backend cuts
# such work into several dispatches / passes. The sizes below exceeded that budget in one
# invocation (they used to raise UnsupportedError there) and must now compute.


def conv_references(
    x: Array,
    f: Array,
    g: Array,
    stride: tuple[int, int],
    pad: Any,
    groups: int = 1,
    dilation: tuple[int, int] = (1, 1),
) -> tuple[Array, Array, Array]:
    """y = conv(x, f), and for the output gradient g: dL/dx, dL/df (NumPy windows, float64).

    ``pad`` is [ph, pw] or [top, left, bottom, right]; filter ``k`` sees the input
    channels of its group. Windows are formed from the zero-padded input.
    """
    n, c, h, w = x.shape
    k, cg, fh, fw = f.shape
    (sh, sw), (dh, dw) = stride, dilation
    pt, pl, pb, pr = (pad[0], pad[1], pad[0], pad[1]) if len(pad) == 2 else pad
    xp = np.zeros((n, c, h + pt + pb, w + pl + pr))
    xp[:, :, pt : pt + h, pl : pl + w] = x
    oh, ow = g.shape[2:]
    kg = k // groups
    win = np.empty((n, c, fh, fw, oh, ow))
    for r in range(fh):
        for s in range(fw):
            win[:, :, r, s] = xp[
                :, :, r * dh : r * dh + sh * (oh - 1) + 1 : sh, s * dw : s * dw + sw * (ow - 1) + 1 : sw
            ]
    y = np.empty((n, k, oh, ow))
    gf = np.empty(f.shape)
    gxp = np.zeros_like(xp)
    for grp in range(groups):
        cs, ks = slice(grp * cg, (grp + 1) * cg), slice(grp * kg, (grp + 1) * kg)
        y[:, ks] = np.einsum("ncrsij,kcrs->nkij", win[:, cs], f[ks])
        gf[ks] = np.einsum("ncrsij,nkij->kcrs", win[:, cs], g[:, ks])
        for r in range(fh):
            for s in range(fw):
                rows = slice(r * dh, r * dh + sh * (oh - 1) + 1, sh)
                cols = slice(s * dw, s * dw + sw * (ow - 1) + 1, sw)
                gxp[:, cs, rows, cols] += np.einsum("nkij,kc->ncij", g[:, ks], f[ks, :, r, s])
    return y, gxp[:, :, pt : pt + h, pl : pl + w], gf


def check_conv(
    be: Any,
    xs: Any,
    fs: Any,
    stride: Any,
    pad: Any,
    groups: int = 1,
    dilation: Any = (1, 1),
    bias: bool = False,
) -> None:
    rng = np.random.default_rng(sum(xs) + sum(fs))
    x = rng.standard_normal(xs).astype(F32)
    f = rng.standard_normal(fs).astype(F32)
    b = rng.standard_normal(fs[0]).astype(F32)
    pt, pl, pb, pr = (pad[0], pad[1], pad[0], pad[1]) if len(pad) == 2 else pad
    ys = (
        xs[0],
        fs[0],
        (xs[2] + pt + pb - dilation[0] * (fs[2] - 1) - 1) // stride[0] + 1,
        (xs[3] + pl + pr - dilation[1] * (fs[3] - 1) - 1) // stride[1] + 1,
    )
    g = rng.standard_normal(ys).astype(F32)
    y_want, gx_want, gf_want = conv_references(
        x.astype(np.float64), f.astype(np.float64), g.astype(np.float64), stride, pad, groups, dilation
    )
    px, pf, pg, pbias = put(be, x), put(be, f), put(be, g), put(be, b)
    if bias:
        y_want += b.astype(np.float64)[None, :, None, None]
    py, pgx, pgf = (put(be, np.full(shape, np.nan, F32)) for shape in (ys, xs, fs))
    kw = {"groups": groups, "dilation": dilation}
    be.conv2d_forward(px, xs, pf, fs, py, ys, stride, pad, bias_ptr=pbias if bias else None, **kw)
    be.conv2d_backward_data(pg, ys, pf, fs, pgx, xs, stride, pad, **kw)
    be.conv2d_backward_filter(px, xs, pg, ys, pgf, fs, stride, pad, **kw)
    terms = {"y": fs[1] * fs[2] * fs[3], "gx": fs[0] * fs[2] * fs[3], "gf": xs[0] * ys[2] * ys[3]}
    for name, ptr, want in (("y", py, y_want), ("gx", pgx, gx_want), ("gf", pgf, gf_want)):
        got = get(be, ptr, want.shape)
        # Float32 sums of many terms: error relative to the typical magnitude of the sums,
        # growing like the square root of the number of terms.
        scale = max(1.0, float(np.sqrt(np.mean(want**2))))
        np.testing.assert_allclose(got / scale, want / scale, rtol=0, atol=2e-6 * np.sqrt(terms[name]) + 1e-5)
    for p in (px, pf, pg, pbias, py, pgx, pgf):
        be.free(p)


#: (input, filter, stride, padding, groups, dilation, bias): grouped, depthwise (the
#: tiled kernel, and the generic one for a patch too large to stage), dilated,
#: four-sided padding.
CONV_FEATURES = [
    ((2, 4, 7, 8), (6, 2, 3, 3), (1, 1), (1, 1), 2, (1, 1), True),
    ((1, 32, 40, 37), (32, 1, 3, 3), (1, 1), (1, 1, 1, 1), 32, (1, 1), True),
    ((2, 3, 10, 11), (6, 1, 3, 2), (2, 1), (0, 2, 1, 0), 3, (2, 3), False),
    ((1, 16, 30, 30), (16, 1, 3, 3), (3, 3), (1, 1), 16, (4, 4), True),
    ((1, 4, 12, 9), (4, 2, 5, 5), (2, 2), (2, 1, 0, 3), 2, (1, 2), True),
]


@pytest.mark.parametrize("xs,fs,stride,pad,groups,dilation,bias", CONV_FEATURES)
def test_conv2d_groups_dilation_padding_bias(
    be: Any, tight: Any, xs: Any, fs: Any, stride: Any, pad: Any, groups: int, dilation: Any, bias: bool
) -> None:
    for backend in (be, tight):
        check_conv(backend, xs, fs, stride, pad, groups, dilation, bias)


@pytest.mark.parametrize(
    "xs,fs,stride,pad",
    [
        ((2, 2, 300, 300), (3, 2, 3, 3), (1, 1), (1, 1)),  # filter gradient: 2 x 300 x 300 terms
        ((3, 1, 300, 301), (2, 1, 2, 3), (2, 1), (1, 0)),
        ((1, 5000, 4, 5), (2, 5000, 3, 3), (1, 1), (1, 1)),  # forward: 5000 channels x 3 x 3
        ((1, 2, 5, 4), (5000, 2, 3, 3), (1, 1), (1, 1)),  # data gradient: 5000 filters x 3 x 3
    ],
)
def test_conv2d_past_the_loop_budget(be: Any, xs: Any, fs: Any, stride: Any, pad: Any) -> None:
    check_conv(be, xs, fs, stride, pad)


@pytest.mark.parametrize(
    "dims,causal",
    [
        # The benchmark's problem (refused on lavapipe before the key loop was split).
        ((1, 8, 1024, 1024, 64), False),
        ((1, 8, 1024, 1024, 64), True),
        # 2048 keys x 64 dims exceed lavapipe's budget in one invocation even four columns
        # an iteration: the keys run in consecutive dispatches (bottom-right causal mask).
        ((1, 2, 256, 2048, 64), True),
        ((1, 2, 256, 2048, 64), False),
    ],
)
def test_attention_past_the_loop_budget(be: Any, dims: tuple[int, ...], causal: bool) -> None:
    b, h, sq, skv, d = dims
    rng = np.random.default_rng(7)
    q = rng.standard_normal((b, h, sq, d)).astype(F32)
    k, v = (rng.standard_normal((b, h, skv, d)).astype(F32) for _ in range(2))
    scale = 1.0 / np.sqrt(d)
    pq, pk, pv, po = put(be, q), put(be, k), put(be, v), put(be, np.full(q.shape, np.nan, F32))
    be.attention(pq, pk, pv, po, b, h, sq, skv, d, scale, causal)
    want = attention_reference(
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), scale, causal
    )
    np.testing.assert_allclose(get(be, po, q.shape), want, rtol=1e-5, atol=1e-5)
    for p in (pq, pk, pv, po):
        be.free(p)


@pytest.mark.parametrize("dims", [(1, 2, 37, 700, 200), (2, 1, 900, 600, 130), (1, 1, 3, 5000, 16)])
def test_attention_long_keys_and_wide_heads(be: Any, dims: tuple[int, ...]) -> None:
    b, h, sq, skv, d = dims
    rng = np.random.default_rng(sq + skv + d)
    q = rng.standard_normal((b, h, sq, d)).astype(F32)
    k = rng.standard_normal((b, h, skv, d)).astype(F32)
    v = rng.standard_normal((b, h, skv, d)).astype(F32)
    q[0, 0, 1, 0] = np.nan  # a NaN query poisons its row only
    scale = 1.0 / np.sqrt(d)
    pq, pk, pv = put(be, q), put(be, k), put(be, v)
    for causal in (False, True):
        po = put(be, np.full(q.shape, 5.0, F32))
        be.attention(pq, pk, pv, po, b, h, sq, skv, d, scale, causal)
        got = get(be, po, q.shape)
        with np.errstate(invalid="ignore"):
            want = attention_reference(
                q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), scale, causal
            )
        # NaN exactly where the reference has it (row 1 sees no key in some causal cases: 0).
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        got[0, 0, 1] = want[0, 0, 1] = 0.0
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        be.free(po)
    for p in (pq, pk, pv):
        be.free(p)


def test_softmax_of_a_2_pow_23_slice(be: Any) -> None:
    n = 1 << 23
    x = (np.random.default_rng(23).standard_normal(n) * 8).astype(F32)
    px, po = put(be, x), be.alloc(x.nbytes)
    be.softmax(px, po, [n], 0)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max())
    np.testing.assert_allclose(get(be, po, n), e / e.sum(), rtol=1e-5, atol=1e-12)
    be.softmax(px, px, [n], 0)  # in place
    np.testing.assert_allclose(get(be, px, n), e / e.sum(), rtol=1e-5, atol=1e-12)
    be.free(px)
    be.free(po)


@pytest.mark.parametrize("shape,axis", [((3, 1 << 20), 1), ((1 << 19, 3), 0), ((2, 100001, 2), 1)])
def test_softmax_long_slices(be: Any, shape: tuple[int, ...], axis: int) -> None:
    x = (np.random.default_rng(len(shape) + axis).standard_normal(shape) * 5).astype(F32)
    px, po = put(be, x), be.alloc(x.nbytes)
    be.softmax(px, po, list(shape), axis)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(get(be, po, shape), e / e.sum(axis=axis, keepdims=True), rtol=1e-5, atol=1e-12)
    be.free(px)
    be.free(po)


def test_softmax_special_long_slices(be: Any) -> None:
    length = 100_000
    x = np.zeros((4, length), dtype=F32)
    x[0] = -np.inf  # all -inf -> NaN
    x[1, 50_000] = np.nan  # a NaN in one chunk poisons the whole slice
    x[2, 90_000] = np.inf  # +inf: inf - inf -> NaN
    x[3, :-1] = -np.inf  # one finite value (in the last chunk) -> [0, ..., 0, 1]
    px, po = put(be, x), be.alloc(x.nbytes)
    be.softmax(px, po, list(x.shape), 1)
    got = get(be, po, x.shape)
    assert np.all(np.isnan(got[:3]))
    want = np.zeros(length)
    want[-1] = 1.0
    np.testing.assert_array_equal(got[3], want)
    be.free(px)
    be.free(po)


@pytest.mark.parametrize("shape,axis", [((1 << 23,), 0), ((3, 1 << 21), 1), ((1 << 20, 2), 0)])
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_reduce_long_slices(be: Any, shape: tuple[int, ...], axis: int, op: str) -> None:
    x = np.random.default_rng(len(shape) + axis).standard_normal(shape).astype(F32)
    x.reshape(-1)[12345] = np.nan  # ignored by max / min, poisons sum / mean
    px = put(be, x)
    want = np_reduce(op, x, axis).reshape(-1)
    po = be.alloc(4 * want.size)
    be.reduce(op, px, po, list(shape), axis)
    np.testing.assert_allclose(get(be, po, want.size), want, rtol=1e-5, atol=1e-6)
    be.free(px)
    be.free(po)


@pytest.fixture()
def tight(be: Any) -> Iterator[Any]:
    """A backend that splits work as llvmpipe does, but against a far smaller loop budget."""
    from computehal.backends.wgpu import WgpuBackend

    backend = WgpuBackend()
    backend.init()
    backend._gpu.loop_budget = 2000  # noqa: SLF001 - exercise the split paths at small sizes
    yield backend
    backend.close()


@pytest.mark.parametrize("xs,fs,stride,pad", CONV_CASES + [((2, 40, 6, 7), (30, 40, 3, 3), (1, 2), (1, 1))])
def test_conv2d_split_at_a_small_budget(tight: Any, xs: Any, fs: Any, stride: Any, pad: Any) -> None:
    check_conv(tight, xs, fs, stride, pad)
    check_conv(tight, (3, 2, 40, 45), (2, 2, 3, 2), (2, 1), (1, 0))  # one image, bands of rows


def pool_reference(x: Array, op: str, kernel: Any, stride: Any, pads: Any, include_pad: bool) -> Array:
    """Max / average pooling by explicit windows (NaN-ignoring max, IEEE average), float64."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = kernel, stride, pads
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * sh - pt, j * sw - pl
            win = x[:, :, max(r0, 0) : min(r0 + kh, h), max(c0, 0) : min(c0 + kw, w)].reshape(n, c, -1)
            if op == "max":
                out[:, :, i, j] = np.fmax.reduce(win, axis=2, initial=-np.inf)
            else:
                inside = (min(r0 + kh, h + pb) - max(r0, -pt)) * (min(c0 + kw, w + pr) - max(c0, -pl))
                out[:, :, i, j] = win.sum(axis=2) / (inside if include_pad else win.shape[2])
    return out


@pytest.mark.parametrize("op", ["max", "avg"])
def test_pool2d_large_windows_split_rows(tight: Any, op: str) -> None:
    """Global pooling of a large image: on a tight budget the window rows run in bands."""
    x = np.random.default_rng(4).standard_normal((2, 3, 50, 60)).astype(F32)
    x[0, 1, 30, 7] = np.nan
    px = put(tight, x)
    for kernel, stride, pads in (((50, 60), (1, 1), (0, 0, 0, 0)), ((9, 20), (7, 9), (2, 3, 4, 5))):
        want = pool_reference(x.astype(np.float64), op, kernel, stride, pads, True)
        py = tight.alloc(4 * want.size)
        tight.pool2d(op, px, x.shape, py, want.shape, kernel, stride, pads, count_include_pad=True)
        np.testing.assert_allclose(get(tight, py, want.shape), want, rtol=1e-5, atol=1e-6)
        tight.free(py)
    tight.free(px)


@pytest.mark.parametrize("dims", [(1, 2, 5, 7, 4), (2, 1, 7, 5, 3), (1, 1, 9, 40, 130), (1, 2, 16, 40, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_split_at_a_small_budget(tight: Any, dims: tuple[int, ...], causal: bool) -> None:
    b, h, sq, skv, d = dims
    rng = np.random.default_rng(sq * 100 + skv)
    q, k, v = (
        rng.standard_normal(shape).astype(F32) for shape in [(b, h, sq, d), (b, h, skv, d), (b, h, skv, d)]
    )
    pq, pk, pv, po = put(tight, q), put(tight, k), put(tight, v), put(tight, np.full(q.shape, np.nan, F32))
    tight.attention(pq, pk, pv, po, b, h, sq, skv, d, 0.3, causal)
    want = attention_reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), 0.3, causal)
    np.testing.assert_allclose(get(tight, po, q.shape), want, rtol=1e-5, atol=1e-5)
    tight.attention(pq, pk, pv, pq, b, h, sq, skv, d, 0.3, causal)  # output aliasing the query
    np.testing.assert_allclose(get(tight, pq, q.shape), want, rtol=1e-5, atol=1e-5)
    for p in (pq, pk, pv, po):
        tight.free(p)


def masked_attention_reference(
    q: Array, k: Array, v: Array, scale: float, causal: bool, mask: Array | None
) -> Array:
    """Grouped-query attention with an additive mask, float64: a key is visible when the causal
    rule allows it and its masked score is not -inf; NaN or +inf among visible scores: NaN row."""
    heads, sq, skv = q.shape[1], q.shape[2], k.shape[2]
    k, v = (np.repeat(t, heads // t.shape[1], axis=1) for t in (k, v))
    with np.errstate(all="ignore"):
        s = np.einsum("bhid,bhjd->bhij", q, k) * scale
        if mask is not None:
            s = s + np.broadcast_to(mask, s.shape)
        vis = ~(s == -np.inf)
        if causal:
            vis &= np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)
        finite = np.where(vis & np.isfinite(s), s, -np.inf)
        peak = np.where(vis.any(-1, keepdims=True), finite.max(-1, keepdims=True), 0.0)
        w = np.where(vis, np.exp(np.where(vis, s, 0.0) - np.where(np.isfinite(peak), peak, 0.0)), 0.0)
        out = np.einsum("bhij,bhjd->bhid", w / np.maximum(w.sum(-1, keepdims=True), 1e-300), v)
        bad = (vis & ~np.isfinite(s)).any(-1)[..., None]
    return np.where(bad, np.nan, np.where(vis.any(-1)[..., None], out, 0.0))


@pytest.mark.parametrize(
    "dims,kv_heads,mask_shape,causal",
    [
        ((2, 4, 5, 7, 8), 2, (7,), False),
        ((1, 4, 3, 9, 16), 1, (1, 4, 3, 9), True),  # decoding shape: seq_q < seq_kv
        ((2, 2, 6, 6, 4), 2, (2, 1, 6, 6), True),
        ((1, 2, 30, 40, 130), 1, (30, 40), True),  # two accumulator chunks
    ],
)
def test_attention_mask_and_grouped_heads(
    be: Any, tight: Any, dims: tuple[int, ...], kv_heads: int, mask_shape: tuple[int, ...], causal: bool
) -> None:
    """Masks (broadcast, -inf entries, a fully masked row, a NaN) and grouped-query heads, in one
    pass and, on a tight loop budget, in key ranges carrying the online-softmax state."""
    b, h, sq, skv, d = dims
    rng = np.random.default_rng(sq * 7 + skv)
    q = rng.standard_normal((b, h, sq, d)).astype(F32)
    k, v = (rng.standard_normal((b, kv_heads, skv, d)).astype(F32) for _ in range(2))
    mask = rng.standard_normal(mask_shape).astype(F32)
    mask.reshape(-1)[::3] = -np.inf
    mask.reshape(-1)[:skv] = -np.inf  # a row that sees no key: zeros
    if mask.size > skv + 1:
        mask.reshape(-1)[skv + 1] = np.nan
    want = masked_attention_reference(
        *(t.astype(np.float64) for t in (q, k, v)), 0.3, causal, mask.astype(np.float64)
    )
    for backend in (be, tight):
        pq, pk, pv, pm = (put(backend, t) for t in (q, k, v, mask))
        po = put(backend, np.full(q.shape, 5.0, F32))
        backend.attention(
            pq,
            pk,
            pv,
            po,
            b,
            h,
            sq,
            skv,
            d,
            0.3,
            causal,
            mask_ptr=pm,
            mask_shape=mask_shape,
            kv_heads=kv_heads,
        )
        got = get(backend, po, q.shape)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-5, atol=1e-5)
        for p in (pq, pk, pv, pm, po):
            backend.free(p)


def test_unsplittable_work_is_refused_on_llvmpipe(be: Any) -> None:
    if be._gpu.loop_budget is None:  # noqa: SLF001
        pytest.skip("the adapter has no per-invocation loop limit")
    # A filter-gradient row of 70000 output columns cannot be cut further.
    xs, fs, ys = (1, 1, 1, 70_000), (1, 1, 1, 1), (1, 1, 1, 70_000)
    px, pg, pf = put(be, np.ones(xs, F32)), put(be, np.ones(ys, F32)), be.alloc(4)
    with pytest.raises(UnsupportedError, match="65535"):
        be.conv2d_backward_filter(px, xs, pg, ys, pf, fs, (1, 1), (0, 0))
    for p in (px, pg, pf):
        be.free(p)
