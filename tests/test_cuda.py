"""CudaBackend: clean unavailability without a GPU, kernel compile checks, and GPU tests.

Without a GPU (these machines), the module must import without touching CuPy, and the
backend must report itself unavailable with CuPy's own reason. Every compilation unit the
backend builds (``kernel_sources()``: the exact text and NVRTC options it uses at run time)
must compile to PTX for sm_80 and sm_90 -- through NVRTC when CuPy and
``nvidia-cuda-nvrtc`` are installed, else through ``nvcc``. The CUDA-only rounding kernels
are also compiled for the host with g++ and checked against NumPy / ml_dtypes. Tests that
need a device are skipped, saying why, when there is none.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from computehal import DeviceError, InvalidArgumentError, NotInitializedError
from computehal.backends import cuda

ARCHES = ("80", "90")
NO_DEVICE = cuda.unavailable_reason()
needs_gpu = pytest.mark.skipif(NO_DEVICE is not None, reason=f"no CUDA device: {NO_DEVICE}")


def _nvrtc_available() -> bool:
    try:
        cuda.compile_ptx(cuda.NARROW, "compute_80")
    except DeviceError:
        return False
    return True


def _nvcc() -> str | None:
    for candidate in (shutil.which("nvcc"), "/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


NVRTC = _nvrtc_available()
NVCC = _nvcc()

# --------------------------------------------------------------------------- no GPU needed


def test_import_does_not_load_cupy() -> None:
    code = "import sys, computehal.backends.cuda as c; c.CudaBackend(0); print('cupy' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"


def test_constructor_checks_the_ordinal() -> None:
    with pytest.raises(InvalidArgumentError):
        cuda.CudaBackend(-1)
    with pytest.raises(InvalidArgumentError):
        cuda.CudaBackend("0")  # type: ignore[arg-type]
    assert cuda.CudaBackend(3).device == 3


@pytest.mark.skipif(NO_DEVICE is None, reason="a CUDA device is present")
def test_unavailable_is_reported_with_the_reason() -> None:
    assert NO_DEVICE
    backend = cuda.CudaBackend()
    assert backend.name() in ("cuda", "rocm")
    assert not backend.is_initialized()
    for call in (backend.init, backend.available_devices, backend.capabilities):
        with pytest.raises(DeviceError) as info:
            call()
        assert NO_DEVICE in str(info.value)
    assert not backend.is_initialized()
    with pytest.raises(NotInitializedError):
        backend.alloc(16)
    with pytest.raises(NotInitializedError):
        backend.gemm("N", "N", 1, 1, 1, 1.0, 1, 1, 1, 1, 0.0, 1, 1)


def test_missing_cupy_is_a_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    backend = cuda.CudaBackend()
    assert backend.name() == "cuda"
    with pytest.raises(DeviceError, match="CuPy is not importable"):
        backend.init()
    with pytest.raises(DeviceError, match="CuPy is not importable"):
        backend.available_devices()
    assert cuda.unavailable_reason() is not None


def test_kernel_sources_are_self_contained() -> None:
    units = cuda.kernel_sources(head_dims=(32, 64))
    names = [u.module for u in units]
    assert len(set(names)) == len(names)
    for unit in units:
        assert '#include "' not in unit.code, unit.module
        # Each launched kernel is in the text, by name or as a suffix of a generated name
        # (elementwise.cl's unary_##name); the PTX test below checks the entry points.
        for function in unit.functions:
            suffix = function.split("_", 1)[-1]
            assert re.search(rf"\b({function}|{suffix})\b", unit.code), function
    launched = {f for u in units for f in u.functions}
    wanted = {
        "unary_gelu",
        "binary_pow",
        "broadcast_max",
        "fill_u32",
        "gather_32_i64",
        "scatter_pairs_32",
        "reduce_rows",
    }
    wanted |= {"softmax_cols", "pack_a_im2col", "pack_a_cols_t", "col2im", "attention_fwd", "narrow_matrix"}
    assert wanted <= launched


def _units() -> list[Any]:
    return [pytest.param(u, id=u.module) for u in cuda.kernel_sources(head_dims=(24, 64, 128))]


@pytest.mark.skipif(not NVRTC and NVCC is None, reason="neither NVRTC (cupy + nvidia-cuda-nvrtc) nor nvcc")
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("unit", _units())
def test_every_unit_compiles_to_ptx(unit: cuda.KernelSource, arch: str) -> None:
    if NVRTC:
        ptx = cuda.compile_ptx(unit, f"compute_{arch}")
    else:
        assert NVCC is not None
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "unit.cu"
            src.write_text(unit.code, encoding="utf-8")
            out = Path(tmp) / "unit.ptx"
            flags = [o for o in cuda.NVRTC_OPTIONS if not o.startswith("--std")]
            result = subprocess.run(
                [
                    NVCC,
                    "-x",
                    "cu",
                    "-std=c++17",
                    f"-arch=sm_{arch}",
                    "-ptx",
                    *flags,
                    str(src),
                    "-o",
                    str(out),
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert result.returncode == 0, f"nvcc failed for {unit.module}:\n{result.stderr}"
            ptx = out.read_text(encoding="utf-8")
    entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
    assert set(unit.functions) <= entries, f"{unit.module}: missing {set(unit.functions) - entries}"
    # IEEE arithmetic: no flush-to-zero on plain arithmetic (exp's internal ex2.approx.ftz is fine).
    assert not re.search(r"\b(add|sub|mul|fma\.rn|div\.rn)\.ftz\.f32", ptx), unit.module


@pytest.mark.skipif(not NVRTC, reason="NVRTC (cupy + nvidia-cuda-nvrtc) is not installed")
def test_cubin_for_sm90() -> None:
    binary = cuda.nvrtc_compile(cuda.NARROW, "sm_90")
    assert binary[:4] == b"\x7fELF"


# --------------------------------------------------------------------------- CUDA-only kernels on the host

_HOST_SHIM = r"""
#include <string.h>
#include <math.h>
#define __device__
#define __forceinline__ inline
#define __global__
#define __restrict__
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
struct chal_dim { unsigned int x, y, z; };
static chal_dim gridDim = {1, 1, 1}, blockDim = {1, 1, 1}, blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
"""


@pytest.fixture(scope="module")
def host_narrow() -> Any:
    """The exact CUDA-only source compiled for the host (one thread walks the grid-stride loops)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed")
    tmp = tempfile.mkdtemp()
    src = Path(tmp) / "narrow.cpp"
    lib = Path(tmp) / "narrow.so"
    src.write_text(_HOST_SHIM + cuda.NARROW.code, encoding="utf-8")
    subprocess.run([gxx, "-O1", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, timeout=300)
    dll = ctypes.CDLL(str(lib))
    ll, vp = ctypes.c_longlong, ctypes.c_void_p
    dll.narrow_matrix.argtypes = [vp, ll, ll, ll, vp, ctypes.c_int]
    dll.scale_c_f32.argtypes = [vp, ll, ll, ll, ll, ll, ctypes.c_float]
    dll.scale_c_f64.argtypes = [vp, ll, ll, ll, ll, ll, ctypes.c_double]
    return dll


def _float_patterns() -> np.ndarray[Any, Any]:
    bits = np.arange(0, 2**32, 65521, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 65536, 6.1e-5, 6.0e-8,
                         2.98e-8, 2.9802322e-8, 5.9604645e-8, 1e-45, 3.4e38, 1.0009766, 1.0004883],
                        dtype=np.float32)  # fmt: skip
    return np.concatenate([bits.view(np.float32), specials, -specials])


@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_host_narrowing_matches_ml_dtypes(host_narrow: Any, fmt: str) -> None:
    import ml_dtypes

    x = _float_patterns()
    narrow = np.float16 if fmt == "f16" else ml_dtypes.bfloat16
    with np.errstate(all="ignore"):
        expected = x.astype(narrow)
    bits = np.empty(x.size, dtype=np.uint16)
    host_narrow.narrow_matrix(x.ctypes.data, x.size, x.size, 1, bits.ctypes.data, 1 if fmt == "f16" else 2)
    got = bits.view(narrow).astype(np.float32)
    ref = expected.astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(bits[~nan], expected.view(np.uint16)[~nan])
    widened = np.empty(x.size, dtype=np.float32)
    host_narrow.narrow_matrix(x.ctypes.data, x.size, x.size, 1, widened.ctypes.data, 3 if fmt == "f16" else 4)
    assert np.array_equal(widened.view(np.uint32)[~nan], ref.view(np.uint32)[~nan])
    assert np.isnan(widened[nan]).all()


def test_host_narrowing_honours_leading_dimension(host_narrow: Any) -> None:
    rows, cols, ld = 5, 3, 8
    rng = np.random.default_rng(1)
    store = rng.standard_normal(ld * cols).astype(np.float32)
    out = np.empty(rows * cols, dtype=np.float32)
    host_narrow.narrow_matrix(store.ctypes.data, ld, rows, cols, out.ctypes.data, 3)
    expected = store.reshape(cols, ld)[:, :rows].astype(np.float16).astype(np.float32).reshape(-1)
    assert np.array_equal(out, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_host_scale_c_is_blas_quick_return(host_narrow: Any, dtype: Any) -> None:
    m, n, ld, batches, stride = 3, 2, 5, 2, 12
    c = np.full(stride * batches, 7.0, dtype=dtype)
    c[0] = np.nan
    fn = host_narrow.scale_c_f32 if dtype == np.float32 else host_narrow.scale_c_f64
    fn(c.ctypes.data, ld, stride, m, n, batches, 0.0)
    expected = np.full(stride * batches, 7.0, dtype=dtype)
    for b in range(batches):
        for j in range(n):
            expected[b * stride + j * ld : b * stride + j * ld + m] = 0.0  # NaN does not survive beta == 0
    assert np.array_equal(c, expected)
    fn(c.ctypes.data, ld, stride, m, n, batches, 2.5)
    assert np.array_equal(c, np.where(expected == 7.0, 7.0, 0.0).astype(dtype))


# --------------------------------------------------------------------------- on a GPU


@pytest.fixture(scope="module")
def gpu() -> Any:
    if NO_DEVICE is not None:
        pytest.skip(f"no CUDA device: {NO_DEVICE}")
    backend = cuda.CudaBackend()
    backend.init()
    yield backend
    backend.close()


def _put(be: Any, array: np.ndarray[Any, Any]) -> int:
    ptr = int(be.alloc(max(1, array.nbytes)))
    be.copy_htod(ptr, np.ascontiguousarray(array))
    return ptr


def _get(be: Any, ptr: int, shape: Any, dtype: Any = np.float32) -> np.ndarray[Any, Any]:
    out = np.empty(shape, dtype=dtype)
    be.copy_dtoh(out, ptr)
    return out


@needs_gpu
def test_gpu_devices_and_capabilities(gpu: Any) -> None:
    devices = gpu.available_devices()
    assert devices and devices[0].total_memory_bytes > 0
    caps = gpu.capabilities()
    assert caps.warp_size in (32, 64) and caps.supports_fp64
    ptr = gpu.alloc(1000)
    assert ptr % 64 == 0
    gpu.free(ptr)


@needs_gpu
@pytest.mark.parametrize(
    ("ta", "tb", "dtype"), [("N", "N", "float64"), ("T", "N", "float32"), ("N", "T", "float64")]
)
def test_gpu_gemm_with_leading_dimensions(gpu: Any, ta: str, tb: str, dtype: str) -> None:
    rng = np.random.default_rng(0)
    m, n, k, lda, ldb, ldc = 37, 29, 41, 50, 60, 45
    dt = np.dtype(dtype)
    a_rows, a_cols = (k, m) if ta == "T" else (m, k)
    b_rows, b_cols = (n, k) if tb == "T" else (k, n)
    a = rng.standard_normal((a_cols, lda)).astype(dt)
    b = rng.standard_normal((b_cols, ldb)).astype(dt)
    c = rng.standard_normal((n, ldc)).astype(dt)
    pa, pb, pc = _put(gpu, a), _put(gpu, b), _put(gpu, c)
    gpu.gemm(ta, tb, m, n, k, 1.5, pa, lda, pb, ldb, -0.5, pc, ldc, dtype=dtype)
    got = _get(gpu, pc, c.shape, dt)
    op_a = a[:, :a_rows].T if ta == "N" else a[:, :a_rows]
    op_b = b[:, :b_rows].T if tb == "N" else b[:, :b_rows]
    expected = c.copy()
    expected[:, :m] = (1.5 * np.einsum("ik,kj->ij", op_a.astype(np.float64), op_b.astype(np.float64))
                       - 0.5 * c[:, :m].T).T  # fmt: skip
    tol = 1e-10 if dtype == "float64" else 1e-4
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)
    for ptr in (pa, pb, pc):
        gpu.free(ptr)


@needs_gpu
def test_gpu_conformance(gpu: Any) -> None:
    from computehal.testing import run_conformance

    report = run_conformance(gpu)
    failures = [r for r in report.results if not r.passed]
    assert report.passed, "\n".join(f"{r.op}/{r.case}: {r.message}" for r in failures[:20])
