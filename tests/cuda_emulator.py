"""A CUDA device emulated on the host, for testing CudaBackend without a GPU.

:class:`EmulatedCudaBackend` is :class:`~computehal.backends.cuda.CudaBackend` with its
device session replaced by :class:`EmulatedDevice`, which has the same methods as the
real one but:

* memory is PoCL fine-grained SVM: real host addresses that OpenCL kernels take as
  pointer arguments, exactly like CUDA device addresses (interior pointers included);
* a launch compiles the very unit text the backend hands over as OpenCL C (the shared
  dialect compiles both ways) and runs it with global size grid x block and local size
  block, after checking CUDA's limits on grids and blocks; the CUDA-only
  ``cuda_narrow.cu`` runs as host code (g++ with a small shim, one thread walking the
  grid-stride loops);
* cuBLAS calls are NumPy products with BLAS semantics (C not read when beta == 0).

Every launch is recorded (unit, function, grid, block, arguments) so that tests can
compare them with the PTX NVRTC makes of the same units. What this cannot show: NVRTC
code generation (checked by compiling), CuPy's argument marshalling (checked against
the PTX parameter lists) and real device timing.
"""

from __future__ import annotations

import bisect
import ctypes
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from computehal import OutOfMemoryError
from computehal.backends.cuda import CudaBackend, KernelSource, Ptr, narrow_unit
from computehal.backends.cuda._device import Batch
from computehal.backends.cuda._driver import capabilities_from, device_info_from
from computehal.types import DeviceInfo

__all__ = ["EmulatedCudaBackend", "EmulatedDevice", "Launch", "host_narrow_library"]

#: CUDA limits the emulator enforces on every launch.
GRID_MAX = (2**31 - 1, 65535, 65535)
BLOCK_MAX = (1024, 1024, 64)
THREADS_MAX = 1024

_PROPS = {
    "name": b"emulated sm_90 (PoCL)",
    "major": 9,
    "minor": 0,
    "totalGlobalMem": 1 << 31,
    "maxThreadsPerBlock": 1024,
    "sharedMemPerBlock": 49152,
    "warpSize": 32,
    "integrated": 0,
}

HOST_SHIM = r"""
#include <string.h>
#include <math.h>
#define __CUDACC__ 1
#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__ static
#define __restrict__
#define __syncthreads()
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };
static dim3 gridDim = {1, 1, 1}, blockDim = {1, 1, 1};
static uint3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
"""


def host_narrow_library(folder: Path) -> Any:
    """``kernels/cuda_narrow.cu`` (the backend's exact unit text) compiled for the host with g++.

    One thread walks each grid-stride loop. Returns the ``ctypes`` library, or None
    when g++ is missing.
    """
    gxx = shutil.which("g++")
    if gxx is None:
        return None
    src, lib = folder / "narrow.cpp", folder / "narrow.so"
    src.write_text(HOST_SHIM + narrow_unit().code, encoding="utf-8")
    subprocess.run([gxx, "-O1", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, timeout=300)
    dll = ctypes.CDLL(str(lib))
    ll, vp = ctypes.c_longlong, ctypes.c_void_p
    dll.narrow_matrix.argtypes = [vp, ll, ll, ll, vp, ctypes.c_int]
    dll.scale_c_f32.argtypes = [vp, ll, ll, ll, ll, ll, ctypes.c_float]
    dll.scale_c_f64.argtypes = [vp, ll, ll, ll, ll, ll, ctypes.c_double]
    return dll


class Launch(NamedTuple):
    """One recorded kernel launch."""

    unit: KernelSource
    function: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    args: tuple[Any, ...]


class EmulatedDevice:
    """Stands in for ``CudaDevice`` (same methods), on PoCL and NumPy; see the module docstring."""

    def __init__(self, ordinal: int, info: DeviceInfo, narrow: Any, launches: list[Launch]) -> None:
        import pyopencl as cl

        self.cl = cl
        self.ordinal, self.info = ordinal, info
        device = next(
            d
            for p in cl.get_platforms()
            for d in p.get_devices()
            if d.svm_capabilities & 2  # fine-grain buffer
        )
        self.context = cl.Context([device])
        self.queue = cl.CommandQueue(self.context)
        self._flags = cl.svm_mem_flags.READ_WRITE | cl.svm_mem_flags.SVM_FINE_GRAIN_BUFFER
        self._bases: list[int] = []
        self._arrays: dict[int, np.ndarray[Any, Any]] = {}
        self._programs: dict[str, Any] = {}
        self._narrow = narrow
        self._lock = threading.RLock()  # a released block may be collected while the lock is held
        self.launches = launches
        self.closed = False

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self.queue.finish()
        self._programs.clear()
        self.closed = True

    def synchronize(self) -> None:
        self.queue.finish()

    # ------------------------------------------------------------------ memory

    def free_bytes(self) -> int | None:
        return None

    def allocate(self, nbytes: int) -> tuple[int, Any]:
        try:
            array = self.cl.svm_empty(self.context, self._flags, max(nbytes, 1), np.uint8, alignment=64)
        except (MemoryError, self.cl.Error) as exc:
            raise OutOfMemoryError(nbytes, None) from exc
        base = int(array.ctypes.data)
        with self._lock:
            bisect.insort(self._bases, base)
            self._arrays[base] = array
        return base, _Block(self, base)

    def _forget(self, base: int) -> None:
        self.queue.finish()  # the memory may go back to the allocator only once no kernel uses it
        with self._lock:
            self._bases.remove(base)
            del self._arrays[base]

    def _locate(self, address: int) -> tuple[np.ndarray[Any, Any], int]:
        with self._lock:
            i = bisect.bisect_right(self._bases, address) - 1
            if i >= 0:
                array = self._arrays[self._bases[i]]
                offset = address - self._bases[i]
                if offset <= array.nbytes:
                    return array, offset
        raise AssertionError(f"address {address:#x} is not emulated device memory")

    def owns(self, address: int, nbytes: int) -> bool:
        try:
            array, offset = self._locate(address)
        except AssertionError:
            return False
        return offset + nbytes <= array.nbytes

    def _bytes(self, address: int, nbytes: int) -> np.ndarray[Any, Any]:
        array, offset = self._locate(address)
        assert offset + nbytes <= array.nbytes, "access beyond an allocation"
        return array[offset : offset + nbytes]

    def write(self, dst: int, host: np.ndarray[Any, Any]) -> None:
        self.queue.finish()
        self._bytes(dst, host.nbytes)[:] = host.view(np.uint8).reshape(-1)

    def read(self, host: np.ndarray[Any, Any], src: int) -> None:
        self.queue.finish()
        host.view(np.uint8).reshape(-1)[:] = self._bytes(src, host.nbytes)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self.queue.finish()
        self._bytes(dst, nbytes)[:] = self._bytes(src, nbytes)

    # ------------------------------------------------------------------ kernels

    def launch(
        self,
        unit: KernelSource,
        function: str,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[Any],
    ) -> None:
        grid3, block3 = (*grid, 1, 1, 1)[:3], (*block, 1, 1, 1)[:3]
        assert all(0 < g <= m for g, m in zip(grid3, GRID_MAX, strict=True)), (
            f"{function}: grid {grid3} beyond CUDA's limits"
        )
        assert all(0 < b <= m for b, m in zip(block3, BLOCK_MAX, strict=True)), (
            f"{function}: block {block3} beyond limits"
        )
        assert block3[0] * block3[1] * block3[2] <= THREADS_MAX, (
            f"{function}: more than 1024 threads per block"
        )
        assert function in unit.functions, f"{function} is not listed among the functions of {unit.module}"
        self.launches.append(Launch(unit, function, tuple(grid3), tuple(block3), tuple(args)))
        if unit.module == narrow_unit().module:
            self.queue.finish()
            host = [ctypes.c_void_p(int(a)) if isinstance(a, Ptr) else a.item() for a in args]
            getattr(self._narrow, function)(*host)
            return
        kernel = self._kernel(unit, function)
        for i, arg in enumerate(args):
            if isinstance(arg, Ptr):
                array, offset = self._locate(int(arg))
                kernel.set_arg(i, self.cl.SVM(array[offset:] if offset < array.nbytes else array))
            else:
                assert isinstance(arg, np.generic), f"{function}: argument {i} is {type(arg).__name__}"
                kernel.set_arg(i, arg)
        size = tuple(g * b for g, b in zip(grid3, block3, strict=True))
        self.cl.enqueue_nd_range_kernel(self.queue, kernel, size, block3)

    def _kernel(self, unit: KernelSource, function: str) -> Any:
        with self._lock:
            program = self._programs.get(unit.module)
            if program is None:
                program = self.cl.Program(self.context, unit.code).build()
                self._programs[unit.module] = program
            return self.cl.Kernel(program, function)

    # ------------------------------------------------------------------ cuBLAS

    def _matrix(self, address: int, rows: int, cols: int, ld: int, dtype: Any) -> np.ndarray[Any, Any]:
        """A writable column-major view of ``rows`` x ``cols`` elements with leading dimension ``ld``."""
        dt = np.dtype(dtype)
        span = ((cols - 1) * ld + rows) * dt.itemsize if rows and cols else 0
        flat = self._bytes(address, span).view(dt) if span else np.zeros(0, dt)
        return np.lib.stride_tricks.as_strided(flat, (rows, cols), (dt.itemsize, ld * dt.itemsize))

    def _product(self, kinds: tuple[Any, Any], ta: bool, tb: bool, shape: tuple[int, int, int], alpha: float,
                 a: tuple[int, int], b: tuple[int, int], beta: float, c: tuple[int, int],
                 batch: Batch | None) -> None:  # fmt: skip
        self.queue.finish()
        m, n, k = shape
        ab_kind, c_kind = kinds
        batch = batch or Batch(0, 0, 0, 1)
        size, c_size = (
            np.dtype(np.uint16 if isinstance(ab_kind, str) else ab_kind).itemsize,
            np.dtype(c_kind).itemsize,
        )
        for i in range(batch.batches):
            mat_a = self._operand(ab_kind, a[0] + i * batch.stride_a * size, (k, m) if ta else (m, k), a[1])
            mat_b = self._operand(ab_kind, b[0] + i * batch.stride_b * size, (n, k) if tb else (k, n), b[1])
            out = self._matrix(c[0] + i * batch.stride_c * c_size, m, n, c[1], c_kind)
            with np.errstate(over="ignore", invalid="ignore"):  # NaN and infinity as BLAS gives them
                product = (mat_a.T if ta else mat_a) @ (mat_b.T if tb else mat_b)
                result = alpha * product if beta == 0 else alpha * product + beta * out.astype(np.float64)
                out[...] = result.astype(c_kind)

    def _operand(self, kind: Any, address: int, rc: tuple[int, int], ld: int) -> np.ndarray[Any, Any]:
        if kind == "float16":
            return self._matrix(address, *rc, ld, np.float16).astype(np.float64)
        if kind == "bfloat16":
            bits = self._matrix(address, *rc, ld, np.uint16).astype(np.uint32) << 16
            return bits.view(np.float32).astype(np.float64)
        return self._matrix(address, *rc, ld, kind).astype(np.float64)

    def gemm(self, kind: str, ta: bool, tb: bool, shape: tuple[int, int, int], alpha: float,
             a: tuple[int, int], b: tuple[int, int], beta: float, c: tuple[int, int],
             batch: Batch | None = None) -> None:  # fmt: skip
        """cuBLAS's GEMMs: ``kind`` float32 / float64, or 16-bit A and B with a float32 C (gemmEx)."""
        c_kind = np.float64 if kind == "float64" else np.float32
        ab_kind: Any = kind if kind in ("float16", "bfloat16") else np.dtype(c_kind)
        self._product((ab_kind, c_kind), ta, tb, shape, alpha, a, b, beta, c, batch)


class _Block:
    """The payload of an emulated allocation: releasing it returns the memory (like a pool block)."""

    def __init__(self, device: EmulatedDevice, base: int) -> None:
        self._device, self._base = device, base

    def __del__(self) -> None:
        try:
            self._device._forget(self._base)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class EmulatedCudaBackend(CudaBackend):
    """:class:`CudaBackend` on an :class:`EmulatedDevice` (see the module docstring)."""

    def __init__(self, device: int = 0, *, narrow: Any = None) -> None:
        super().__init__(device)
        self._narrow_lib = narrow
        self.launches: list[Launch] = []
        caps = capabilities_from(_PROPS, hip=False, peer=False)
        self._emulated_info = device_info_from(_PROPS, device, caps)
        self._narrow_dir = tempfile.mkdtemp(prefix="chal-narrow-")

    def _device_record(self) -> DeviceInfo:
        return self._emulated_info

    def available_devices(self) -> list[DeviceInfo]:
        return [self._emulated_info]

    def _connect(self, info: DeviceInfo) -> Any:
        if self._narrow_lib is None:
            self._narrow_lib = host_narrow_library(Path(self._narrow_dir))
        return EmulatedDevice(self.device, info, self._narrow_lib, self.launches)
