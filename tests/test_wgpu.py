"""What only the wgpu backend has, on a real adapter (lavapipe here), against NumPy definitions.

Every op's semantics are checked on every backend by the conformance kit
(``tests/test_conformance.py``); this file checks the wgpu backend's own machinery:
adapter selection and ``kind``, wgpu error translation, the queue (bind-group cache,
pipeline cache, buffers that outlive the work recorded with them), the word-owning
shaders (byte copies, fills, 16-bit conversion), the special functions built in WGSL,
device-side index checks, grid limits, and llvmpipe's loop budget: lavapipe silently
stops every shader loop after 65535 iterations, so the backend cuts long work into
several dispatches (checked at real sizes and, through ``tight``, at a tiny budget).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest

from computehal import (
    DeviceError,
    InvalidArgumentError,
    OutOfMemoryError,
    UnsupportedError,
)
from conftest import make_backend

F32 = np.float32
Array = npt.NDArray[Any]


@pytest.fixture(scope="module")
def be() -> Iterator[Any]:
    """One initialised wgpu backend (skipped, or failed when required, without an adapter)."""
    backend = make_backend("wgpu")
    yield backend
    backend.close()


@pytest.fixture()
def tight(be: Any) -> Iterator[Any]:
    """A backend that splits work as llvmpipe does, but against a far smaller loop budget."""
    backend = make_backend("wgpu")
    backend._gpu.loop_budget = 2000  # exercise the split paths at small sizes
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


# ---------------------------------------------------------------------- adapters and errors


def test_device_zero_is_the_preferred_adapter_and_kind_follows_it() -> None:
    import wgpu

    from computehal.backends.wgpu import WgpuBackend

    assert WgpuBackend.kind == "vulkan"  # the class's default kind
    preferred = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    adapters = wgpu.gpu.enumerate_adapters_sync()
    first = WgpuBackend()
    devices = first.available_devices()
    assert len(devices) == len(adapters)
    assert devices[0].name.startswith(str(preferred.info["device"]))
    assert [d.ordinal for d in devices] == list(range(len(devices)))
    for ordinal, device in enumerate(devices):
        backend = WgpuBackend(device=ordinal)
        backend_type = device.name.rsplit("(", 1)[-1].rstrip(")").lower()
        assert (
            backend.kind
            == backend.name()
            == (backend_type if backend_type in ("vulkan", "metal") else "webgpu")
        )
        assert device.capabilities.supports_fp64 is False
        assert device.capabilities.supports("cast", "bfloat16")
    with pytest.raises(DeviceError, match="adapters"):
        WgpuBackend(device=len(devices)).init()


def test_wgpu_errors_become_backend_errors_with_their_text() -> None:
    import wgpu

    from computehal.backends.wgpu._adapter import check

    with pytest.raises(DeviceError, match="doing a thing: .*the driver's own words"):
        with check("doing a thing"):
            raise wgpu.GPUValidationError("the driver's own words")
    with pytest.raises(OutOfMemoryError):
        with check("allocating"):
            raise wgpu.GPUOutOfMemoryError("no room")


def test_float64_is_refused_with_the_reason(be: Any) -> None:
    p = be.alloc(64)
    for call in (
        lambda: be.gemm("N", "N", 1, 1, 1, 1.0, p, 1, p, 1, 0.0, p, 1),  # gemm defaults to float64
        lambda: be.unary("exp", p, p, 2, dtype="float64"),
        lambda: be.cast(p, p + 32, 2, dtype="float32", out_dtype="float64"),
    ):
        with pytest.raises(UnsupportedError, match="WGSL has no float64"):
            call()
    assert "float64" not in be.capabilities().dtypes("gemm")
    be.free(p)


def test_limits_are_reported(be: Any) -> None:
    with pytest.raises(OutOfMemoryError):
        be.alloc(be._gpu.max_buffer + 4)
    px = be.alloc(4096)
    saved = be._gpu.max_binding
    be._gpu.max_binding = 1024
    try:
        with pytest.raises(UnsupportedError, match="maxStorageBufferBindingSize"):
            be.unary("abs", px, px, 1024)
    finally:
        be._gpu.max_binding = saved
    be.free(px)


# ---------------------------------------------------------------------- the queue and caches


def test_pipelines_are_compiled_once(be: Any) -> None:
    px = put(be, np.ones(256, F32))

    def calls() -> None:
        for op in ("exp", "relu", "tanh", "neg"):
            be.unary(op, px, px, 256)
            be.unary(op, px, px, 99)  # vec4 body and scalar tail
        be.binary("mul", px, px, px, 17)
        be.reduce("max", px, px, [8, 16], 1)

    calls()
    compiled = be._gpu.programs.compiled()
    assert {"unary4", "unary", "binary4", "binary", "reduce_thread"} <= compiled[0]
    calls()
    assert be._gpu.programs.compiled() == compiled
    be.free(px)


def test_bind_groups_are_cached_and_forgotten_with_their_buffer(be: Any) -> None:
    queue = be._gpu.queue
    px, py = put(be, np.ones(64, F32)), be.alloc(256)
    be.unary("exp", px, py, 64)
    cached = queue.cached_groups()
    for _ in range(5):
        be.unary("exp", px, py, 64)  # the same operands: the same bind group
    assert queue.cached_groups() == cached
    be.free(px)
    assert queue.cached_groups() < cached  # the freed buffer's groups are dropped
    be.free(py)


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
    """Largest error in float32 ulps (2**-23 relative) of normal results; NaN, infinities exact,
    subnormal results within a few of their fixed steps."""
    with np.errstate(over="ignore"):
        w32 = want.astype(np.float32).astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(w32))
    inf = np.isinf(w32)
    assert np.array_equal(got[inf], w32[inf])
    tiny = np.isfinite(w32) & (np.abs(w32) < 2.0**-126)
    assert np.all(np.abs(got[tiny] - want[tiny]) <= 4 * 2.0**-149)
    normal = np.isfinite(w32) & ~tiny
    return float((np.abs(got[normal] - want[normal]) / np.abs(want[normal])).max() / 2.0**-23)


def test_erf_gelu_silu_sin_cos_are_accurate(be: Any) -> None:
    import scipy.special

    rng = np.random.default_rng(12)
    huge = 10 ** rng.uniform(-40, 38.5, 4000) * rng.choice([-1, 1], 4000)
    specials = [np.nan, np.inf, -np.inf, 0, -0.0, 1e-30, 3e38, -3e38, 1e30, 3.1415927, 102940.04]
    x = np.concatenate([np.linspace(-12, 12, 20001), huge, specials]).astype(F32)
    x64 = x.astype(np.float64)
    px, po = put(be, x), be.alloc(x.nbytes)
    with np.errstate(all="ignore"):
        refs = {
            "erf": (scipy.special.erf(x64), 4),
            "gelu": (0.5 * x64 * scipy.special.erfc(-x64 / np.sqrt(2)), 8),
            "silu": (x64 * scipy.special.expit(x64), 8),
            "sin": (np.sin(x64), 4),  # exact range reduction: also for 3e38
            "cos": (np.cos(x64), 4),
        }
    for op, (want, ulps) in refs.items():
        be.unary(op, px, po, x.size)
        if op in ("gelu", "silu"):
            want[np.isneginf(x64)] = np.nan  # -inf * 0
        assert _ulps(get(be, po, x.size).astype(np.float64), want) <= ulps, op
    # GELU_TANH: x sigmoid(t), t = 2 sqrt(2/pi) (x + 0.044715 x^3) rounded to float32 on the way,
    # so the error grows with |t| as for the sigmoid.
    t = 2 * np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)
    with np.errstate(all="ignore"):
        want = x64 * scipy.special.expit(t)
    be.unary("gelu_tanh", px, po, x.size)
    got = get(be, po, x.size).astype(np.float64)
    normal = np.isfinite(want) & (np.abs(want) >= 2.0**-126)
    rel = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    assert np.all(rel <= (8 + 2 * np.abs(t[normal])) * 2.0**-23)
    be.free(px)
    be.free(po)


def test_pow_follows_c(be: Any) -> None:
    rng = np.random.default_rng(9)
    pairs = [
        (0.0, -1.0), (-0.0, -1.0), (-0.0, -2.0), (-0.0, 3.0), (np.inf, -2.0), (-np.inf, 3.0),
        (-np.inf, -3.0), (-1.0, np.inf), (0.5, np.inf), (2.0, -np.inf), (np.nan, 0.0), (1.0, np.nan),
        (-8.0, 1 / 3), (-2.0, 3.0), (-2.0, 2.0), (np.nan, 1.0), (2.0, np.nan), (-1.5, 1e30), (1e-40, 0.5),
    ]  # fmt: skip
    a = np.concatenate([rng.uniform(0.5, 2, 3000), 10 ** rng.uniform(-44, 38, 3000), [p[0] for p in pairs]])
    b = np.concatenate([rng.uniform(-120, 120, 3000), rng.uniform(-1, 1, 3000), [p[1] for p in pairs]])
    a, b = a.astype(F32), b.astype(F32)
    pa, pb, po = put(be, a), put(be, b), be.alloc(a.nbytes)
    be.binary("pow", pa, pb, po, a.size)
    with np.errstate(all="ignore"):
        want = np.power(a.astype(np.float64), b.astype(np.float64))
    assert _ulps(get(be, po, a.size).astype(np.float64), want) <= 4  # whatever |y * log2 x|
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


# ---------------------------------------------------------------------- kernel paths and grids


def test_vec4_and_scalar_paths_and_overlap(be: Any) -> None:
    """Aligned operands run four floats an invocation, misaligned ones the scalar kernel."""
    x = np.linspace(-3, 3, 67, dtype=F32)
    px, po = put(be, x), be.alloc(4 * 67)
    be.binary("mul", px + 4, px + 8, po + 12, 60)  # element offsets 1, 2, 3: scalar
    np.testing.assert_allclose(get(be, po, 67)[3:63], x[1:61] * x[2:62], rtol=1e-6)
    be.binary("mul", px, px, po, 67)  # vec4 body and a scalar tail of 3
    np.testing.assert_allclose(get(be, po, 67), x * x, rtol=1e-6)
    be.unary("neg", px, px + 4 * 8, 32)  # output 8 floats after the input: copied aside first
    want = x.copy()
    want[8:40] = -x[:32]
    np.testing.assert_array_equal(get(be, px, 67), want)
    be.free(px)
    be.free(po)


def test_large_problem_uses_a_2d_grid(be: Any) -> None:
    n = 65535 * 256 + 1000  # more workgroups than one grid dimension allows
    x = np.linspace(-1, 1, n, dtype=F32)
    px = put(be, x)
    be.unary("abs", px, px, n)
    np.testing.assert_array_equal(get(be, px, n), np.abs(x))
    be.free(px)


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
    be.free(px)
    be.free(po)


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


# ---------------------------------------------------------------------- llvmpipe's loop budget
#
# lavapipe stops every shader loop after 65535 iterations per invocation; the backend cuts
# such work into several dispatches / passes. The sizes below exceed that budget in one
# invocation and must compute; ``tight`` runs the same splits at small sizes.


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


CONV_CASES = [
    ((2, 3, 7, 6), (4, 3, 3, 3), (1, 1), (1, 1)),
    ((1, 2, 9, 8), (3, 2, 2, 3), (2, 3), (0, 2)),
    ((2, 3, 5, 5), (2, 3, 5, 5), (2, 2), (2, 2)),
    ((2, 40, 6, 7), (30, 40, 3, 3), (1, 2), (1, 1)),
]


@pytest.mark.parametrize("xs,fs,stride,pad", CONV_CASES)
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


@pytest.mark.parametrize("dims", [(1, 2, 256, 2048, 64), (1, 2, 37, 700, 200), (1, 1, 3, 5000, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_past_the_loop_budget(be: Any, dims: tuple[int, ...], causal: bool) -> None:
    """Keys (and wide heads' column chunks) in consecutive dispatches; a NaN query row stays NaN."""
    b, h, sq, skv, d = dims
    rng = np.random.default_rng(sq + skv + d)
    q = rng.standard_normal((b, h, sq, d)).astype(F32)
    k, v = (rng.standard_normal((b, h, skv, d)).astype(F32) for _ in range(2))
    q[0, 0, 1, 0] = np.nan
    scale = 1.0 / np.sqrt(d)
    pq, pk, pv, po = put(be, q), put(be, k), put(be, v), put(be, np.full(q.shape, 5.0, F32))
    be.attention(pq, pk, pv, po, b, h, sq, skv, d, scale, causal)
    want = masked_attention_reference(*(t.astype(np.float64) for t in (q, k, v)), scale, causal, None)
    got = get(be, po, q.shape)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-5, atol=1e-5)
    for p in (pq, pk, pv, po):
        be.free(p)


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
    want = masked_attention_reference(*(t.astype(np.float64) for t in (q, k, v)), 0.3, causal, None)
    np.testing.assert_allclose(get(tight, po, q.shape), want, rtol=1e-5, atol=1e-5)
    tight.attention(pq, pk, pv, pq, b, h, sq, skv, d, 0.3, causal)  # output aliasing the query
    np.testing.assert_allclose(get(tight, pq, q.shape), want, rtol=1e-5, atol=1e-5)
    for p in (pq, pk, pv, po):
        tight.free(p)


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


@pytest.mark.parametrize("shape,axis", [((3, 1 << 17), 1), ((1 << 17, 3), 0), ((2, 100001, 2), 1)])
def test_softmax_long_slices(be: Any, shape: tuple[int, ...], axis: int) -> None:
    x = (np.random.default_rng(len(shape) + axis).standard_normal(shape) * 5).astype(F32)
    px, po = put(be, x), be.alloc(x.nbytes)
    x64 = x.astype(np.float64)
    shifted = x64 - x64.max(axis=axis, keepdims=True)
    total = np.exp(shifted).sum(axis=axis, keepdims=True)
    be.softmax(px, po, list(shape), axis)
    np.testing.assert_allclose(get(be, po, shape), np.exp(shifted) / total, rtol=1e-5, atol=1e-12)
    be.softmax(px, px, list(shape), axis, log=True)  # in place, log-softmax
    np.testing.assert_allclose(get(be, px, shape), shifted - np.log(total), rtol=1e-5, atol=1e-5)
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


@pytest.mark.parametrize("shape,axis", [((1 << 22,), 0), ((3, 1 << 18), 1), ((1 << 18, 2), 0)])
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_reduce_long_slices(be: Any, shape: tuple[int, ...], axis: int, op: str) -> None:
    x = np.random.default_rng(len(shape) + axis).standard_normal(shape).astype(F32)
    x.reshape(-1)[12345] = np.nan  # ignored by max / min, poisons sum / mean
    px = put(be, x)
    x64 = x.astype(np.float64)
    want = {
        "sum": lambda: x64.sum(axis=axis),
        "mean": lambda: x64.mean(axis=axis),
        "max": lambda: np.fmax.reduce(x64, axis=axis),
        "min": lambda: np.fmin.reduce(x64, axis=axis),
    }[op]().reshape(-1)
    po = be.alloc(4 * want.size)
    be.reduce(op, px, po, list(shape), axis)
    np.testing.assert_allclose(get(be, po, want.size), want, rtol=1e-5, atol=1e-6)
    be.free(px)
    be.free(po)


def test_unsplittable_work_is_refused_on_llvmpipe(be: Any) -> None:
    if be._gpu.loop_budget is None:
        pytest.skip("the adapter has no per-invocation loop limit")
    # A filter-gradient row of 70000 output columns cannot be cut further.
    xs, fs, ys = (1, 1, 1, 70_000), (1, 1, 1, 1), (1, 1, 1, 70_000)
    px, pg, pf = put(be, np.ones(xs, F32)), put(be, np.ones(ys, F32)), be.alloc(4)
    with pytest.raises(UnsupportedError, match="65535"):
        be.conv2d_backward_filter(px, xs, pg, ys, pf, fs, (1, 1), (0, 0))
    for p in (px, pg, pf):
        be.free(p)
