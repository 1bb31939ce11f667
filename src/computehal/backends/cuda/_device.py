"""One opened CUDA device: memory pool, cuBLAS handle, loaded kernels, copies and launches.

:class:`CudaDevice` is the only place the CUDA backend calls CuPy once a device is open;
every call runs inside :func:`~._driver.check`. All work goes to the device's legacy
default stream (kernels, cuBLAS and the synchronous ``cudaMemcpy`` copies), so
operations run in the order they were issued and a copy to the host sees every earlier
result. A test double with the same methods can stand in for it (the backend asks its
``_connect`` hook for one).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from ...dtypes import F32, F64
from ...errors import DeviceError, OutOfMemoryError, UnsupportedError
from ...memory import ALIGNMENT
from ...types import DeviceInfo
from ._driver import check, import_cupy, is_hip, translate
from ._programs import KernelSource, Ptr, compile_cached, forget_cached, target_arch

__all__ = ["Batch", "CudaDevice", "GRID_X_MAX", "GRID_YZ_MAX", "check_grid"]

#: CUDA limits on the grid dimensions.
GRID_X_MAX = 2**31 - 1
GRID_YZ_MAX = 65535

# cuBLAS / CUDA library enums (stable across CUDA 11-13; CuPy exposes the same values).
_OP = {False: 0, True: 1}
_POINTER_MODE_HOST = 0
_DEFAULT_MATH = 0
_DATA_TYPE = {"float32": 0, "float16": 2, "bfloat16": 14}
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1


class Batch(NamedTuple):
    """Strides (in elements) of A, B and C between the matrices of a strided batch, and its count."""

    stride_a: int
    stride_b: int
    stride_c: int
    batches: int


def check_grid(function: str, grid: Sequence[int]) -> tuple[int, int, int]:
    """``grid`` as three dimensions; :class:`UnsupportedError` beyond CUDA's limits."""
    dims = (*grid, 1, 1, 1)[:3]
    if dims[0] > GRID_X_MAX or dims[1] > GRID_YZ_MAX or dims[2] > GRID_YZ_MAX:
        raise UnsupportedError(
            f"{function}: launch grid {dims} exceeds the CUDA limits "
            f"({GRID_X_MAX}, {GRID_YZ_MAX}, {GRID_YZ_MAX})"
        )
    return int(dims[0]), int(dims[1]), int(dims[2])


def kernel_args(args: Sequence[Any]) -> tuple[Any, ...]:
    """Launch arguments as CuPy passes them: device addresses as 64-bit integers."""
    return tuple(np.uint64(a) if isinstance(a, Ptr) else a for a in args)


class CudaDevice:
    """The CuPy resources of one device, created by :meth:`open`, released by :meth:`close`.

    Parameters
    ----------
    ordinal : int
        The device.
    info : DeviceInfo
        Its description (compute capability decides the compilation target).
    """

    def __init__(self, ordinal: int, info: DeviceInfo) -> None:
        self.ordinal = ordinal
        self.info = info
        self._cupy: Any = None
        self._cublas: Any = None
        self._pool: Any = None
        self._handle = 0
        self._arch = ""
        self._modules: dict[str, Any] = {}
        self._functions: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Create the memory pool and the cuBLAS handle (host pointer mode, no TF32)."""
        cupy = import_cupy()
        with check(f"opening {'ROCm' if is_hip() else 'CUDA'} device {self.ordinal}"):
            from cupy_backends.cuda.libs import cublas

            with cupy.cuda.Device(self.ordinal):
                pool = cupy.cuda.MemoryPool()
                handle = cublas.create()
                try:
                    cublas.setPointerMode(handle, _POINTER_MODE_HOST)
                    cublas.setMathMode(handle, _DEFAULT_MATH)
                    cublas.setStream(handle, 0)
                except BaseException:
                    cublas.destroy(handle)
                    raise
        self._cupy, self._cublas, self._pool, self._handle = cupy, cublas, pool, handle
        if not is_hip():
            self._arch = target_arch(self.info.compute_capability)

    def close(self) -> None:
        """Wait for the device, destroy the cuBLAS handle, unload kernels, return pooled memory."""
        if self._cupy is None:
            return
        try:
            with self.on_device(), check("closing the device"):
                self._cupy.cuda.runtime.deviceSynchronize()
                if self._handle:
                    self._cublas.destroy(self._handle)
                self._handle = 0
                self._functions.clear()
                self._modules.clear()
                self._pool.free_all_blocks()
        finally:
            self._cupy = None

    @contextmanager
    def on_device(self) -> Iterator[None]:
        """Make this device current for the block."""
        with self._cupy.cuda.Device(self.ordinal):
            yield

    def synchronize(self) -> None:
        """Wait until every issued operation has finished."""
        with self.on_device(), check("synchronising the device"):
            self._cupy.cuda.runtime.deviceSynchronize()

    # ------------------------------------------------------------------ memory

    def free_bytes(self) -> int | None:
        """Free device memory plus what the pool caches (None if the driver cannot say)."""
        try:
            with self.on_device():
                free = int(self._cupy.cuda.runtime.memGetInfo()[0])
            return free + int(self._pool.free_bytes())
        except Exception:  # noqa: BLE001 - only used for the error message
            return None

    def _malloc(self, nbytes: int) -> Any:
        """A pool block of ``nbytes``; the pool's cached blocks are returned once before giving up."""
        with self.on_device():
            for attempt in range(2):
                try:
                    return self._pool.malloc(nbytes)
                except Exception as exc:  # noqa: BLE001 - OutOfMemoryError or CUDARuntimeError
                    error = translate(exc, f"allocating {nbytes} bytes", nbytes)
                    if attempt or not isinstance(error, OutOfMemoryError):
                        raise error from exc
                with check("returning cached memory to the device"):
                    self._pool.free_all_blocks()
        raise AssertionError("unreachable")  # pragma: no cover

    def allocate(self, nbytes: int) -> tuple[int, Any]:
        """``nbytes`` of device memory: (64-byte aligned address, the pool's memory object).

        The pool is asked twice (the second time after returning its cached blocks);
        then :class:`~computehal.OutOfMemoryError` tells how much was free.
        """
        try:
            memory = self._malloc(nbytes)
        except OutOfMemoryError:
            raise OutOfMemoryError(nbytes, self.free_bytes()) from None
        base = int(memory.ptr)
        if base % ALIGNMENT == 0:
            return base, memory
        # CuPy's pool hands out 512-byte aligned blocks; keep the contract regardless.
        padded = self._malloc(nbytes + ALIGNMENT)
        base = int(padded.ptr)
        return base + (-base) % ALIGNMENT, padded

    def owns(self, address: int, nbytes: int) -> bool:
        """True when ``address`` .. ``address + nbytes`` is memory of this device that kernels can
        read and write (device or managed memory, first and last byte)."""
        with self.on_device():
            for byte in {address, address + max(nbytes, 1) - 1}:
                try:
                    attrs = self._cupy.cuda.runtime.pointerGetAttributes(byte)
                except Exception:  # noqa: BLE001 - not a pointer the runtime knows
                    return False
                memory_type = int(getattr(attrs, "type", 0))  # 2: device, 3: managed
                if memory_type not in (2, 3) or int(getattr(attrs, "device", -1)) != self.ordinal:
                    return False
        return True

    def write(self, dst: int, host: np.ndarray[Any, Any]) -> None:
        """Copy the bytes of ``host`` to device address ``dst``."""
        runtime = self._cupy.cuda.runtime
        with self.on_device(), check("copying to the device", host.nbytes):
            runtime.memcpy(dst, host.ctypes.data, host.nbytes, runtime.memcpyHostToDevice)

    def read(self, host: np.ndarray[Any, Any], src: int) -> None:
        """Fill ``host`` with the bytes at device address ``src``."""
        runtime = self._cupy.cuda.runtime
        with self.on_device(), check("copying from the device", host.nbytes):
            runtime.memcpy(host.ctypes.data, src, host.nbytes, runtime.memcpyDeviceToHost)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """``cudaMemcpy`` of ``nbytes`` from ``src`` to ``dst`` on the device."""
        runtime = self._cupy.cuda.runtime
        with self.on_device(), check("copying on the device", nbytes):
            runtime.memcpy(dst, src, nbytes, runtime.memcpyDeviceToDevice)

    # ------------------------------------------------------------------ kernels

    def _module(self, unit: KernelSource) -> Any:
        """The loaded module of ``unit`` (compiled, or read from the disk cache, once)."""
        module = self._modules.get(unit.module)
        if module is not None:
            return module
        with self.on_device():
            if is_hip():
                with check(f"compiling {unit.module} with hiprtc"):
                    module = self._cupy.RawModule(code=unit.code, options=("--std=c++17",))
            else:
                module = self._load(unit)
            with check(f"loading the kernels of {unit.module}"):
                for name in unit.functions:  # every kernel now, not mid-operation
                    self._functions[(unit.module, name)] = module.get_function(name)
        self._modules[unit.module] = module
        return module

    def _load(self, unit: KernelSource) -> Any:
        binary = compile_cached(unit, self._arch)
        module = self._cupy.cuda.function.Module()
        try:
            with check(f"loading {unit.module}"):
                module.load(binary)
        except DeviceError:
            # A cached binary the driver rejects (damaged on disk): compile it once more.
            forget_cached(unit, self._arch)
            module = self._cupy.cuda.function.Module()
            with check(f"loading {unit.module}"):
                module.load(compile_cached(unit, self._arch))
        return module

    def launch(
        self,
        unit: KernelSource,
        function: str,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[Any],
    ) -> None:
        """Launch ``function`` of ``unit`` over ``grid`` x ``block`` on the legacy default stream."""
        dims = check_grid(function, grid)
        kernel = self._functions.get((unit.module, function))
        if kernel is None:
            with self._lock:
                self._module(unit)
            kernel = self._functions.get((unit.module, function))
            if kernel is None:
                raise DeviceError(f"{function} is not a kernel of {unit.module}")
        block3 = (*block, 1, 1, 1)[:3]
        with self.on_device(), check(f"launching {function}"):
            kernel(dims, block3, kernel_args(args), stream=self._cupy.cuda.Stream.null)

    # ------------------------------------------------------------------ cuBLAS

    def gemm(
        self,
        kind: str,
        ta: bool,
        tb: bool,
        shape: tuple[int, int, int],
        alpha: float,
        a: tuple[int, int],
        b: tuple[int, int],
        beta: float,
        c: tuple[int, int],
        batch: Batch | None = None,
    ) -> None:
        """A cuBLAS GEMM, column-major, strided batched when ``batch`` is given.

        ``kind`` ``"float32"`` / ``"float64"``: ``s`` / ``d`` GEMM. ``"float16"`` /
        ``"bfloat16"``: A and B of that type, C and the arithmetic float32 (``gemmEx``).
        ``shape`` is (m, n, k); ``a``, ``b``, ``c`` are (address, leading dimension).
        """
        real = F64 if kind == "float64" else F32
        scalars = np.array([alpha, beta], dtype=real)
        beta_ptr = scalars.ctypes.data + real.itemsize
        ops: list[tuple[int, ...]]
        extra: tuple[int, ...] = ()
        if kind in _DATA_TYPE and kind != "float32":  # 16-bit A and B: gemmEx
            name, extra = "gemmEx", (_COMPUTE_32F, _GEMM_DEFAULT)
            types = (_DATA_TYPE[kind], _DATA_TYPE[kind], _DATA_TYPE["float32"])
            ops = [(x[0], t, x[1]) for x, t in zip((a, b, c), types, strict=True)]
        else:
            name = ("d" if real == F64 else "s") + "gemm"
            ops = [a, b, c]
        tail: tuple[int, ...] = ()
        if batch is not None:
            name = name.replace("gemm", "gemmStridedBatched")
            ops = [(*op, stride) for op, stride in zip(ops, batch[:3], strict=True)]
            tail = (batch.batches,)
        m, n, k = shape
        args = (
            self._handle,
            _OP[ta],
            _OP[tb],
            m,
            n,
            k,
            scalars.ctypes.data,
            *ops[0],
            *ops[1],
            beta_ptr,
            *ops[2],
        )
        with self.on_device(), self._lock, check(f"cuBLAS {name}"):
            getattr(self._cublas, name)(*args, *tail, *extra)
