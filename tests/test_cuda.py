"""CudaBackend: what can be checked without a GPU, the kernel compile checks, and GPU tests.

Without a GPU (CI and these machines):

* the package imports without touching CuPy, reports itself unavailable with CuPy's own
  reason, translates CuPy's exceptions into the error contract, and keeps compiled
  kernels in a disk cache that survives damage;
* every compilation unit the backend builds (``kernel_sources()``: the exact text and
  NVRTC options it uses at run time) compiles to PTX for sm_80 and sm_90 with NVRTC,
  and with nvcc where it is installed;
* the backend runs on an emulated device (``tests/cuda_emulator.py``: PoCL running the
  same units as OpenCL C with CUDA's grid x block shapes, NumPy for cuBLAS): the
  conformance kit passes, the paths that only CUDA's launch limits need (pieces of
  65535 rows, outer indices, heads) compute the right values, and every launch it made
  names a kernel of its unit's PTX with the parameter count and types it passed.

Tests that need a device are skipped, with one reason, when there is none.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from computehal import (
    DeviceError,
    InvalidArgumentError,
    NotInitializedError,
    OutOfMemoryError,
    UnsupportedError,
)
from computehal.backends import cuda
from computehal.backends.cuda import _programs
from computehal.backends.cuda._attention import head_pieces
from computehal.backends.cuda._core import split_outer

ARCHES = ("80", "90")
NO_DEVICE = cuda.unavailable_reason()
needs_gpu = pytest.mark.skipif(NO_DEVICE is not None, reason=f"no CUDA device: {NO_DEVICE}")
#: Head dimensions whose attention units the compile check builds (buckets 32, 128 and the largest, 2048).
HEAD_DIMS = (24, 128, 2048)


@pytest.fixture(scope="session", autouse=True)
def _session_kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Compiled units are cached for this session only (compile checks and launch checks share them)."""
    old = os.environ.get("COMPUTEHAL_CUDA_CACHE")
    os.environ["COMPUTEHAL_CUDA_CACHE"] = str(tmp_path_factory.mktemp("cuda-kernel-cache"))
    yield
    if old is None:
        os.environ.pop("COMPUTEHAL_CUDA_CACHE", None)
    else:
        os.environ["COMPUTEHAL_CUDA_CACHE"] = old


def _nvrtc_available() -> bool:
    try:
        cuda.nvrtc_compile(cuda.narrow_unit(), "compute_80")
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
# nvcc runs on a pool thread while the main thread's tests set environment variables.
# A child started with vfork that reads the C `environ` while another thread reallocates
# it fails with EFAULT ("[Errno 14] Bad address", seen once in CI), so the compiles pass
# this snapshot, taken at import on the main thread: the child then gets an array that
# its own thread built.
_NVCC_ENV = dict(os.environ)


# --------------------------------------------------------------------------- no GPU needed


def test_import_does_not_load_cupy() -> None:
    code = (
        "import sys, computehal.backends.cuda as c; b = c.CudaBackend(0); "
        "print('cupy' in sys.modules, c.CudaBackend.kind)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["False", "cuda"]


def test_constructor_checks_the_ordinal() -> None:
    with pytest.raises(InvalidArgumentError):
        cuda.CudaBackend(-1)
    with pytest.raises(InvalidArgumentError):
        cuda.CudaBackend("0")  # type: ignore[arg-type]
    backend = cuda.CudaBackend(3)
    assert backend.device == 3
    assert backend.dlpack_device() in ((2, 3), (10, 3))  # kDLCUDA / kDLROCM, the ordinal
    assert backend.kind == backend.name() in ("cuda", "rocm")
    assert backend.host_view(0, 16) is None  # device memory has no host view


@pytest.mark.skipif(NO_DEVICE is None, reason="a CUDA device is present")
def test_unavailable_is_reported_with_the_reason() -> None:
    assert NO_DEVICE
    backend = cuda.CudaBackend()
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
    backend.close()  # closing a backend that never opened does nothing


def test_missing_cupy_is_a_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    backend = cuda.CudaBackend()
    assert backend.name() == "cuda"
    with pytest.raises(DeviceError, match="CuPy is not importable"):
        backend.init()
    with pytest.raises(DeviceError, match="CuPy is not importable"):
        backend.available_devices()
    assert cuda.unavailable_reason() is not None


# --------------------------------------------------------------------------- error translation


def _cupy_errors() -> Any:
    cupy = pytest.importorskip("cupy")
    return cupy


def test_runtime_errors_keep_the_drivers_text() -> None:
    cupy = _cupy_errors()
    runtime = cupy.cuda.runtime
    oom = cuda.translate(runtime.CUDARuntimeError(2), "allocating 64 bytes", 64)
    assert isinstance(oom, OutOfMemoryError) and oom.requested == 64
    bad = cuda.translate(runtime.CUDARuntimeError(700), "launching k")
    assert type(bad) is DeviceError
    assert "launching k" in str(bad) and "cudaErrorIllegalAddress" in str(bad)
    with pytest.raises(DeviceError, match="cudaErrorInvalidValue") as info:
        with cuda.check("copying"):
            raise runtime.CUDARuntimeError(1)
    assert isinstance(info.value.__cause__, runtime.CUDARuntimeError)


def test_pool_and_library_errors() -> None:
    cupy = _cupy_errors()
    pool_oom = cupy.cuda.memory.OutOfMemoryError(1 << 40, 1 << 30)
    assert isinstance(cuda.translate(pool_oom, "allocating", 1 << 40), OutOfMemoryError)
    from cupy.cuda import nvrtc

    assert "NVRTC error" in str(cuda.translate(nvrtc.NVRTCError(6), "compiling"))
    assert isinstance(cuda.translate(nvrtc.NVRTCError(1), "compiling"), OutOfMemoryError)
    try:  # cuBLAS's module needs libcublas to import; elsewhere a class of the same name stands in
        from cupy_backends.cuda.libs.cublas import CUBLASError
    except ImportError:
        CUBLASError = type("CUBLASError", (RuntimeError,), {"__init__": _status_init})
    assert isinstance(cuda.translate(CUBLASError(3), "cuBLAS sgemm"), OutOfMemoryError)
    message = str(cuda.translate(CUBLASError(7), "cuBLAS sgemm"))
    assert "cuBLAS error while cuBLAS sgemm: CUBLAS_STATUS" in message
    assert "missing" in str(cuda.translate(ImportError("libcublas.so.12 missing"), "opening"))
    with pytest.raises(InvalidArgumentError):  # the error contract passes through unchanged
        with cuda.check("anything"):
            raise InvalidArgumentError("bad")


def _status_init(self: Any, status: int) -> None:
    RuntimeError.__init__(self, f"CUBLAS_STATUS {status}")
    self.status = status


# --------------------------------------------------------------------------- the disk cache


@pytest.mark.skipif(not NVRTC, reason="NVRTC (cupy + nvidia-cuda-nvrtc) is not installed")
def test_disk_cache_reuses_repairs_and_survives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = _programs.nvrtc_compile

    def counting(source: cuda.KernelSource, arch: str) -> bytes:
        calls.append(arch)
        return real(source, arch)

    monkeypatch.setattr(_programs, "nvrtc_compile", counting)
    monkeypatch.setenv("COMPUTEHAL_CUDA_CACHE", str(tmp_path / "cache"))
    unit = cuda.narrow_unit()
    first = cuda.compile_cached(unit, "compute_80")
    assert b".entry narrow_matrix" in first and calls == ["compute_80"]
    assert cuda.compile_cached(unit, "compute_80") == first and len(calls) == 1  # read back
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith(".tmp")  # written atomically
    cuda.compile_cached(unit, "compute_90")  # another architecture is another entry
    assert len(calls) == 2 and len(list((tmp_path / "cache").iterdir())) == 2
    damaged = bytearray(entries[0].read_bytes())
    damaged[-10] ^= 0xFF
    entries[0].write_bytes(bytes(damaged))
    assert cuda.compile_cached(unit, "compute_80") == first and len(calls) == 3  # compiled again
    assert cuda.compile_cached(unit, "compute_80") == first and len(calls) == 3  # and stored again
    entries[0].write_bytes(b"")
    assert cuda.compile_cached(unit, "compute_80") == first
    monkeypatch.setenv("COMPUTEHAL_CUDA_CACHE", str(entries[0]))  # a file: no usable directory
    assert cuda.compile_cached(unit, "compute_80") == first


def test_cache_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPUTEHAL_CUDA_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert cuda.cache_dir() == Path("/somewhere/computehal/cuda")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cuda.cache_dir() == Path.home() / ".cache" / "computehal" / "cuda"
    monkeypatch.setenv("COMPUTEHAL_CUDA_CACHE", "/elsewhere")
    assert cuda.cache_dir() == Path("/elsewhere")


# --------------------------------------------------------------------------- launch geometry


@pytest.mark.parametrize(
    ("dims", "limit"),
    [([7, 5, 3], 100), ([70000, 2], 65535), ([3, 4, 5, 6], 7), ([2, 9, 4], 4), ([1, 1, 8], 1), ([5], 1)],
)
def test_split_outer_covers_every_outer_index_once(dims: list[int], limit: int) -> None:
    strides = [int(np.prod(dims[i + 1 :])) for i in range(len(dims))]
    odd = [3 * s + 1 for s in strides]
    seen: list[tuple[int, int]] = []
    for piece, (first, second) in split_outer(dims, [strides, odd], limit):
        assert len(piece) == len(dims) and piece[-1] == dims[-1]
        assert int(np.prod(piece[:-1])) <= limit
        for index in np.ndindex(*piece[:-1]):
            seen.append(
                (
                    first + sum(i * s for i, s in zip(index, strides[:-1], strict=True)),
                    second + sum(i * s for i, s in zip(index, odd[:-1], strict=True)),
                )
            )
    expected = [
        (
            sum(i * s for i, s in zip(index, strides[:-1], strict=True)),
            sum(i * s for i, s in zip(index, odd[:-1], strict=True)),
        )
        for index in np.ndindex(*dims[:-1])
    ]
    assert sorted(seen) == sorted(expected)


@pytest.mark.parametrize(
    ("batch", "heads", "group", "limit"),
    [(5, 3, 1, 7), (2, 12, 4, 8), (2, 12, 4, 5), (3, 10, 10, 4), (1, 9, 3, 9), (4, 6, 2, 2)],
)
def test_head_pieces_cover_every_pair_with_its_key_value_head(
    batch: int, heads: int, group: int, limit: int
) -> None:
    seen = []
    for b0, nb, h0, nh, grp in head_pieces(batch, heads, group, limit):
        assert nb * nh <= limit and nh % grp == 0
        for bh in range(nb * nh):  # what the kernel computes from its block index
            b, h = divmod(bh, nh)
            kvh = b * (nh // grp) + h // grp
            seen.append(((b0 + b, h0 + h), (b0 * (heads // group) + h0 // group) + kvh))
    expected = [((b, h), b * (heads // group) + h // group) for b in range(batch) for h in range(heads)]
    assert sorted(seen) == expected


def test_kernel_sources_are_self_contained() -> None:
    units = cuda.kernel_sources(head_dims=HEAD_DIMS)
    names = [u.module for u in units]
    assert len(set(names)) == len(names)
    for unit in units:
        assert '#include "' not in unit.code, unit.module
    files = {name.split("[", 1)[0] for name in names}
    assert {"cuda_narrow.cu", "cast.cl", "movement.cl", "elementwise.cl", "reduce.cl", "conv.cl"} <= files
    assert {"elementwise.cl[REAL=double,USE_FP64=1]", "elementwise.cl[REAL=float]"} <= set(names)


# --------------------------------------------------------------------------- compile checks


def _nvcc_ptx(code: str, arch: str) -> str:
    assert NVCC is not None
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "unit.cu", Path(tmp) / "unit.ptx"
        src.write_text(code, encoding="utf-8")
        flags = [o for o in cuda.NVRTC_OPTIONS if not o.startswith("--std")]
        command = [
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
        ]
        # The environment goes in explicitly (see _NVCC_ENV).
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=_NVCC_ENV)
        assert result.returncode == 0, f"nvcc failed:\n{result.stderr}"
        return out.read_text(encoding="utf-8")


class _Compiled:
    """Every unit x architecture x compiler, compiled once per session on a thread pool."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2))
        self._jobs: dict[tuple[str, str, str], Future[str]] = {}
        self._lock = threading.Lock()

    def submit_all(self, units: list[cuda.KernelSource]) -> None:
        for unit in units:
            for arch in ARCHES:
                if NVRTC:
                    self.get(unit, arch, "nvrtc", wait=False)
                if NVCC:
                    self.get(unit, arch, "nvcc", wait=False)

    def get(self, unit: cuda.KernelSource, arch: str, tool: str, wait: bool = True) -> str:
        key = (unit.module, arch, tool)
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                if tool == "nvrtc":
                    job = self._pool.submit(cuda.compile_ptx, unit, f"compute_{arch}")
                else:
                    job = self._pool.submit(_nvcc_ptx, unit.code, arch)
                self._jobs[key] = job
        return job.result() if wait else ""


@pytest.fixture(scope="session")
def compiled() -> _Compiled:
    jobs = _Compiled()
    jobs.submit_all(cuda.kernel_sources(head_dims=HEAD_DIMS))
    return jobs


def _compilers() -> list[str]:
    return [tool for tool, present in (("nvrtc", NVRTC), ("nvcc", NVCC is not None)) if present]


def _units() -> list[Any]:
    return [pytest.param(u, id=u.module) for u in cuda.kernel_sources(head_dims=HEAD_DIMS)]


def test_ci_has_nvrtc() -> None:
    """In CI the compile check must run: a missing NVRTC fails instead of skipping."""
    if os.environ.get("CI") and not NVRTC:
        pytest.fail("CI has no NVRTC: install the cuda-compile extra (.ci/run does)")


@pytest.mark.skipif(not _compilers(), reason="neither NVRTC (cupy + nvidia-cuda-nvrtc) nor nvcc")
@pytest.mark.parametrize("tool", _compilers())
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("unit", _units())
def test_every_unit_compiles_to_ptx(
    compiled: _Compiled, unit: cuda.KernelSource, arch: str, tool: str
) -> None:
    ptx = compiled.get(unit, arch, tool)
    entries = _entries(ptx)
    assert set(unit.functions) <= set(entries), f"{unit.module}: missing {set(unit.functions) - set(entries)}"
    # IEEE arithmetic: no flush-to-zero on plain arithmetic (exp's internal ex2.approx.ftz is fine).
    assert not re.search(r"\b(add|sub|mul|fma\.rn|div\.rn)\.ftz\.f32", ptx), unit.module


@pytest.mark.skipif(not NVRTC, reason="NVRTC (cupy + nvidia-cuda-nvrtc) is not installed")
def test_cubin_for_sm90() -> None:
    binary = cuda.compile_cached(cuda.narrow_unit(), "sm_90")
    assert binary[:4] == b"\x7fELF"


def _entries(ptx: str) -> dict[str, list[str]]:
    """Each ``.entry`` of ``ptx`` with the PTX types of its parameters."""
    found = {}
    for name, params in re.findall(r"\.entry\s+(\w+)\s*\(([^)]*)\)", ptx):
        found[name] = re.findall(r"\.param\s+\.(\w+)", params)
    return found


# --------------------------------------------------------------------------- the device session


def _session() -> tuple[Any, Any]:
    from computehal.backends.cuda._device import CudaDevice
    from computehal.backends.cuda._driver import capabilities_from, device_info_from
    from cuda_stand_in import StandIn

    props = {"name": b"stand-in", "major": 9, "minor": 0, "totalGlobalMem": 1 << 30}
    device = CudaDevice(0, device_info_from(props, 0, capabilities_from(props, hip=False, peer=False)))
    stand_in = StandIn()
    stand_in.attach(device)
    return device, stand_in


@pytest.mark.parametrize("kind", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("batched", [False, True])
def test_session_passes_cublas_its_arguments_in_order(kind: str, batched: bool) -> None:
    """Every cuBLAS entry the session calls gets C's argument list (checked by computing the product)."""
    import ml_dtypes

    from computehal.backends.cuda._device import Batch

    device, stand_in = _session()
    rng = np.random.default_rng(5)
    m, n, k, lda, ldb, ldc, count = 4, 3, 5, 6, 7, 5, 2 if batched else 1
    store = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}.get(kind, np.dtype(kind))
    c_dtype = np.float64 if kind == "float64" else np.float32
    a = rng.standard_normal((count, m, lda)).astype(store)  # A transposed: stored k x m, ld >= k
    b = rng.standard_normal((count, n, ldb)).astype(store)  # B not: stored k x n, ld >= k
    c = rng.standard_normal((count, n, ldc)).astype(c_dtype)
    batch = Batch(a[0].size, b[0].size, c[0].size, count) if batched else None
    before = c.astype(np.float64)
    device.gemm(kind, True, False, (m, n, k), 1.5, (a.ctypes.data, lda), (b.ctypes.data, ldb), -0.5,
                (c.ctypes.data, ldc), batch)  # fmt: skip
    for i in range(count):
        product = a[i, :, :k].astype(np.float64) @ b[i, :, :k].astype(np.float64).T
        want = 1.5 * product - 0.5 * before[i, :, :m].T
        np.testing.assert_allclose(c[i, :, :m].T, want, rtol=1e-5)
    name = {"float32": "sgemm", "float64": "dgemm"}.get(kind, "gemmEx")
    if batched:
        name = name.replace("gemm", "gemmStridedBatched")
    assert any(call[0] == name for call in stand_in.calls)


def test_session_memory_kernels_and_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPUTEHAL_CUDA_CACHE", str(tmp_path))
    device, stand_in = _session()
    base, memory = device.allocate(100)
    assert base % 64 == 0
    host = np.arange(25, dtype=np.float32)
    device.write(base, host.view(np.uint8))
    other, _ = device.allocate(100)
    device.copy(other, base, 100)
    back = np.empty(25, dtype=np.float32)
    device.read(back.view(np.uint8), other)
    np.testing.assert_array_equal(back, host)
    stand_in.fail_mallocs = 1  # the pool's cached blocks are returned, then the second try works
    device.allocate(64)
    assert ("free_all_blocks",) in stand_in.calls
    stand_in.fail_mallocs = 2
    with pytest.raises(OutOfMemoryError) as info:
        device.allocate(64)
    assert info.value.requested == 64 and info.value.available is not None
    if NVRTC:  # kernels: compiled (through the disk cache), loaded once, arguments as CuPy takes them
        unit = cuda.narrow_unit()
        stand_in.reject_loads = 1  # a binary the driver rejects is compiled again
        device.launch(unit, "scale_c_f32", (3,), (256,), (cuda.Ptr(base), np.int64(5), np.float32(2)))
        device.launch(unit, "scale_c_f64", (70000,), (128, 1), (cuda.Ptr(base),))
        assert [call for call in stand_in.calls if call[0] == "load"] == [
            ("load", len(cuda.compile_cached(unit, "compute_80")))
        ]
        (name, grid, block, args, stream), second = stand_in.launches
        assert (name, grid, block, stream) == (
            "scale_c_f32",
            (3, 1, 1),
            (256, 1, 1),
            "the legacy default stream",
        )
        assert [type(x) for x in args] == [np.uint64, np.int64, np.float32] and int(args[0]) == base
        assert second[1] == (70000, 1, 1)
        with pytest.raises(DeviceError, match="not a kernel"):
            device.launch(unit, "no_such_kernel", (1,), (1,), ())
        with pytest.raises(UnsupportedError, match="exceeds the CUDA limits"):
            device.launch(unit, "scale_c_f32", (1, 70000), (1,), ())
    device.close()
    assert ("destroy", 7) in stand_in.calls and stand_in.calls[-1] == ("free_all_blocks",)
    device.close()  # closing twice does nothing
    del memory


# --------------------------------------------------------------------------- CUDA-only kernels on the host


@pytest.fixture(scope="module")
def host_narrow(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The exact ``cuda_narrow.cu`` unit compiled for the host (one thread walks the grid-stride loops)."""
    from cuda_emulator import host_narrow_library

    library = host_narrow_library(tmp_path_factory.mktemp("narrow"))
    if library is None:
        pytest.skip("g++ is not installed")
    return library


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
    ref = expected.astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(bits.view(narrow).astype(np.float32)), nan)
    assert np.array_equal(bits[~nan], expected.view(np.uint16)[~nan])
    widened = np.empty(x.size, dtype=np.float32)
    host_narrow.narrow_matrix(x.ctypes.data, x.size, x.size, 1, widened.ctypes.data, 3 if fmt == "f16" else 4)
    assert np.array_equal(widened.view(np.uint32)[~nan], ref.view(np.uint32)[~nan])
    assert np.isnan(widened[nan]).all()


def test_host_narrowing_honours_leading_dimension(host_narrow: Any) -> None:
    rows, cols, ld = 5, 3, 8
    store = np.random.default_rng(1).standard_normal(ld * cols).astype(np.float32)
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


# --------------------------------------------------------------------------- the emulated device

try:
    import pyopencl as _cl

    from cuda_emulator import EmulatedCudaBackend, Launch, host_narrow_library

    _SVM = any(d.svm_capabilities & 2 for p in _cl.get_platforms() for d in p.get_devices())
    EMULATOR_MISSING = (
        None if _SVM and shutil.which("g++") else "no OpenCL device with fine-grained SVM, or no g++"
    )
except ImportError as error:  # the GPU machine has no pyopencl: the real device runs instead
    EMULATOR_MISSING = f"pyopencl is not importable ({error})"

needs_emulator = pytest.mark.skipif(
    EMULATOR_MISSING is not None, reason=f"no CUDA emulator: {EMULATOR_MISSING}"
)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if EMULATOR_MISSING is not None:
        pytest.skip(f"no CUDA emulator: {EMULATOR_MISSING}")
    backend = EmulatedCudaBackend(narrow=host_narrow_library(tmp_path_factory.mktemp("narrow")))
    backend.init()
    yield backend
    backend.close()


def put(be: Any, array: np.ndarray[Any, Any]) -> int:
    ptr = int(be.alloc(max(1, array.nbytes)))
    be.copy_htod(ptr, np.ascontiguousarray(array))
    return ptr


def get(be: Any, ptr: int, shape: Any, dtype: Any = np.float32) -> np.ndarray[Any, Any]:
    out = np.empty(shape, dtype=dtype)
    be.copy_dtoh(out, ptr)
    return out


@needs_emulator
def test_emulated_conformance(emu: Any) -> None:
    from computehal.testing import run_conformance

    report = run_conformance(emu)
    assert report.passed, report.summary()


@needs_emulator
def test_emulated_close_releases_the_device(tmp_path: Path) -> None:
    backend = EmulatedCudaBackend(narrow=host_narrow_library(tmp_path))
    backend.init()
    device = backend._dev
    ptr = backend.alloc(1000)
    assert ptr % 64 == 0
    backend.close()
    assert device.closed and backend._dev is None and not backend.is_initialized()
    backend.init()  # opens afresh
    assert backend._dev is not device
    backend.close()


@needs_emulator
def test_freed_addresses_wait_before_reuse(emu: Any) -> None:
    """The pool would hand a freed block out again at once: a quarantine keeps stale pointers stale."""
    stale = emu.alloc(4096)
    emu.free(stale)
    fresh = [emu.alloc(4096) for _ in range(8)]
    assert stale not in fresh
    with pytest.raises(InvalidArgumentError, match="freed"):
        emu.fill(stale, 4, 1.0)
    for ptr in fresh:
        emu.free(ptr)


@needs_emulator
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_outer_indices_beyond_grid_y(emu: Any, dtype: str) -> None:
    """Broadcasts and strided copies whose outer extent exceeds 65535 run in pieces."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((70001, 1, 3)).astype(dtype)
    b = rng.standard_normal((2, 1)).astype(dtype)
    pa, pb, po = put(emu, a), put(emu, b), emu.alloc(70001 * 2 * 3 * a.itemsize)
    emu.broadcast_binary("sub", pa, a.shape, pb, b.shape, po, (70001, 2, 3), dtype=dtype)
    np.testing.assert_array_equal(get(emu, po, (70001, 2, 3), dtype), a - b)
    src = rng.standard_normal((3, 70001)).astype(dtype)
    ps, pt = put(emu, src), emu.alloc(src.nbytes)
    emu.copy_strided(pt, ps, (70001, 3), (1, 70001), (3, 1), dtype=dtype)  # transpose
    np.testing.assert_array_equal(get(emu, pt, (70001, 3), dtype), src.T)
    for ptr in (pa, pb, po, ps, pt):
        emu.free(ptr)


@needs_emulator
@pytest.mark.parametrize("index_dtype", [None, "int32", "int64"])
def test_rows_beyond_grid_y(emu: Any, index_dtype: str | None) -> None:
    """Gather and scatter of more than 65535 rows (the last duplicate still wins across pieces)."""
    rng = np.random.default_rng(2)
    rows, count, cols = 50, 70003, 2
    table = rng.standard_normal((rows, cols)).astype(np.float32)
    idx = rng.integers(0, rows, count)
    idx[-1] = idx[3]  # a duplicate in another piece than its first occurrence
    pt, po = put(emu, table), emu.alloc(count * cols * 4)
    device = (
        {}
        if index_dtype is None
        else {"indices_ptr": put(emu, idx.astype(index_dtype)), "index_dtype": index_dtype}
    )
    emu.gather(pt, count if device else idx, po, rows, cols, **device)
    np.testing.assert_array_equal(get(emu, po, (count, cols)), table[idx])
    values = rng.standard_normal((count, cols)).astype(np.float32)
    pv = put(emu, values)
    emu.scatter(pv, count if device else idx, pt, rows, cols, **device)
    want = table.copy()
    want[idx] = values  # NumPy assigns in order: the last occurrence wins
    np.testing.assert_array_equal(get(emu, pt, (rows, cols)), want)
    for ptr in (pt, po, pv, *([device["indices_ptr"]] if device else [])):
        emu.free(ptr)


@needs_emulator
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_device_indices_checked_on_the_device(emu: Any, index_dtype: str) -> None:
    """A bad device index raises before anything is written, also when rows have no columns."""
    table = put(emu, np.arange(12, dtype=np.float32))
    out = put(emu, np.full(9, -1.0, dtype=np.float32))
    for bad, message in (
        ([1, -3, 2], "index -3 is negative"),
        ([1, 2, 7], "index 7 is out of range for 4 rows"),
    ):
        idx = put(emu, np.array(bad, dtype=index_dtype))
        for cols in (3, 0):
            with pytest.raises(InvalidArgumentError, match=message):
                emu.gather(table, 3, out, 4, cols, indices_ptr=idx, index_dtype=index_dtype)
            with pytest.raises(InvalidArgumentError, match=message):
                emu.scatter(out, 3, table, 4, cols, indices_ptr=idx, index_dtype=index_dtype)
        emu.free(idx)
    np.testing.assert_array_equal(get(emu, table, 12), np.arange(12, dtype=np.float32))
    np.testing.assert_array_equal(get(emu, out, 9), np.full(9, -1.0, dtype=np.float32))
    emu.free(table)
    emu.free(out)


def _bf16(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    import ml_dtypes

    return x.astype(ml_dtypes.bfloat16)


@needs_emulator
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    ("alpha", "beta", "k"), [(1.5, 0.0, 7), (-0.5, 2.0, 9), (0.0, 0.5, 5), (2.0, 1.0, 0)]
)
def test_sixteen_bit_gemm_through_gemm_ex(emu: Any, dtype: str, alpha: float, beta: float, k: int) -> None:
    """float16 / bfloat16 GEMMs read A and B as stored (gemmEx) into a float32 C rounded back once."""
    narrow = np.float16 if dtype == "float16" else None
    rng = np.random.default_rng(k)
    m, n, lda, ldb, ldc, batches = 6, 5, k + 2, k + 1, 7, 3

    def stored(shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        x = rng.standard_normal(shape).astype(np.float32)
        return x.astype(narrow) if narrow else _bf16(x)

    # A transposed (stored k x m, column-major), B not (stored k x n), C stored m x n.
    a, b, c = stored((batches, m, lda)), stored((batches, n, ldb)), stored((batches, n, ldc))
    pa, pb, pc = put(emu, a), put(emu, b), put(emu, c)
    emu.batched_gemm("T", "N", m, n, k, alpha, pa, lda, m * lda, pb, ldb, n * ldb, beta, pc, ldc, n * ldc,
                     batches, dtype=dtype)  # fmt: skip
    got = get(emu, pc, c.shape, c.dtype)
    want = c.astype(np.float64)
    for i in range(batches):
        product = a[i, :, :k].astype(np.float64) @ b[i, :, :k].astype(np.float64).T
        want[i, :, :m] = (alpha * product + beta * c[i, :, :m].astype(np.float64).T).T
    rounded = want.astype(np.float32).astype(c.dtype)
    np.testing.assert_allclose(got.astype(np.float64), rounded.astype(np.float64), rtol=1e-2, atol=1e-2)
    assert got[:, :, m:].tobytes() == c[:, :, m:].tobytes()  # padding between columns untouched
    for ptr in (pa, pb, pc):
        emu.free(ptr)


@needs_emulator
def test_attention_heads_beyond_grid_y(emu: Any) -> None:
    """batch * heads above 65535 launches in pieces of heads."""
    batch, heads, seq, dim = 1, 65540, 2, 4
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((batch, heads, seq, dim)).astype(np.float32) for _ in range(3))
    pq, pk, pv, po = put(emu, q), put(emu, k), put(emu, v), emu.alloc(q.nbytes)
    emu.attention(pq, pk, pv, po, batch, heads, seq, seq, dim, 0.5, False)
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) * 0.5
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(
        get(emu, po, q.shape), np.einsum("bhqk,bhkd->bhqd", weights, v), rtol=1e-4, atol=1e-5
    )
    for ptr in (pq, pk, pv, po):
        emu.free(ptr)


#: PTX parameter types each kind of launch argument may meet.
_PTX_TYPES: dict[type, set[str]] = {
    cuda.Ptr: {"u64", "b64"},
    np.int64: {"u64", "s64", "b64"},
    np.uint64: {"u64", "b64"},
    np.int32: {"u32", "s32", "b32"},
    np.uint32: {"u32", "b32"},
    np.uint16: {"u16", "b16"},
    np.float32: {"f32"},
    np.float64: {"f64"},
}


@needs_emulator
@pytest.mark.skipif(not NVRTC, reason="NVRTC (cupy + nvidia-cuda-nvrtc) is not installed")
def test_every_launch_matches_its_ptx(emu: Any, compiled: _Compiled) -> None:
    """Runs after the emulated tests: every launch they made names an entry of its unit's PTX
    (NVRTC, compute_80) with exactly the parameter count and compatible types."""
    if not emu.launches:  # run on its own: make the launches to check
        from computehal.testing import run_conformance

        run_conformance(emu)
    seen: dict[tuple[str, str, tuple[type, ...]], Launch] = {}
    for launch in emu.launches:
        seen.setdefault((launch.unit.module, launch.function, tuple(type(a) for a in launch.args)), launch)
    problems = []
    for (module, function, kinds), launch in sorted(seen.items(), key=lambda item: item[0][:2]):
        entries = _entries(compiled.get(launch.unit, "80", "nvrtc"))
        params = entries.get(function)
        if params is None:
            problems.append(f"{module}: no entry {function}")
        elif len(params) != len(kinds):
            problems.append(
                f"{module}: {function} takes {len(params)} parameters, launched with {len(kinds)}"
            )
        else:
            for i, (param, kind) in enumerate(zip(params, kinds, strict=True)):
                if param not in _PTX_TYPES.get(kind, set()):
                    problems.append(f"{module}: {function} parameter {i} is .{param}, passed {kind.__name__}")
    assert not problems, "\n".join(problems)
    launched = {(key[0], key[1]) for key in seen}
    assert len(launched) >= 40, f"only {len(launched)} kernels were launched"


# --------------------------------------------------------------------------- on a GPU


@pytest.fixture(scope="module")
def gpu() -> Iterator[Any]:
    if NO_DEVICE is not None:
        pytest.skip(f"no CUDA device: {NO_DEVICE}")
    backend = cuda.CudaBackend()
    backend.init()
    yield backend
    backend.close()


@needs_gpu
def test_gpu_devices_and_capabilities(gpu: Any) -> None:
    devices = gpu.available_devices()
    assert devices and devices[0].total_memory_bytes > 0
    caps = gpu.capabilities()
    assert caps.warp_size in (32, 64) and caps.supports_fp64
    ptr = gpu.alloc(1000)
    assert ptr % 64 == 0
    gpu.free(ptr)
    with pytest.raises(OutOfMemoryError):
        gpu.alloc(devices[0].total_memory_bytes + 1)


@needs_gpu
@pytest.mark.parametrize(
    ("ta", "tb", "dtype"), [("N", "N", "float64"), ("T", "N", "float32"), ("N", "T", "float16")]
)
def test_gpu_gemm_with_leading_dimensions(gpu: Any, ta: str, tb: str, dtype: str) -> None:
    rng = np.random.default_rng(0)
    m, n, k, lda, ldb, ldc = 37, 29, 41, 50, 60, 45
    dt = np.dtype(dtype)
    a_rows = k if ta == "T" else m
    b_rows = n if tb == "T" else k
    a = rng.standard_normal((k if ta == "N" else m, lda)).astype(dt)
    b = rng.standard_normal((n if tb == "N" else k, ldb)).astype(dt)
    c = rng.standard_normal((n, ldc)).astype(dt)
    pa, pb, pc = put(gpu, a), put(gpu, b), put(gpu, c)
    gpu.gemm(ta, tb, m, n, k, 1.5, pa, lda, pb, ldb, -0.5, pc, ldc, dtype=dtype)
    got = get(gpu, pc, c.shape, dt)
    op_a = a[:, :a_rows].T if ta == "N" else a[:, :a_rows]
    op_b = b[:, :b_rows].T if tb == "N" else b[:, :b_rows]
    expected = c.astype(np.float64)
    expected[:, :m] = (1.5 * op_a.astype(np.float64) @ op_b.astype(np.float64) - 0.5 * c[:, :m].T).T
    tol = {"float64": 1e-10, "float32": 1e-4, "float16": 2e-2}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tol, atol=tol * 10)
    for ptr in (pa, pb, pc):
        gpu.free(ptr)


@needs_gpu
def test_gpu_close_destroys_the_handle_and_caches_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPUTEHAL_CUDA_CACHE", str(tmp_path))
    backend = cuda.CudaBackend()
    backend.init()
    ptr = put(backend, np.arange(8, dtype=np.float32))
    backend.unary("neg", ptr, ptr, 8)
    np.testing.assert_array_equal(get(backend, ptr, 8), -np.arange(8, dtype=np.float32))
    assert any(tmp_path.iterdir())  # the compiled unit is on disk
    backend.close()
    assert backend._dev is None
    backend.init()
    backend.close()
