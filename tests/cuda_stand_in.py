"""A stand-in for the parts of CuPy that ``CudaDevice`` calls, over host memory.

``CudaDevice`` is the only code of the CUDA backend that calls CuPy once a device is
open; without a GPU it cannot run for real. :class:`StandIn` gives it the same calls
(``cupy.cuda.Device``, a memory pool, ``runtime.memcpy`` and friends, ``function.Module``,
and cuBLAS's ``create`` / ``sgemm`` / ``gemmStridedBatchedEx`` ...) over host memory, with
the argument lists of the C functions CuPy wraps, so that a test can check what the
device session passes: cuBLAS arguments in the right order (the products are computed
with NumPy and compared), kernel arguments as CuPy receives them, the pool's retry,
module loading and caching, and what ``close`` releases. Nothing here runs a kernel.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

__all__ = ["StandIn"]

#: cudaDataType codes cuBLAS's gemmEx takes.
_TYPES = {0: np.float32, 1: np.float64, 2: np.float16, 14: "bfloat16"}


def _matrix(address: int, rows: int, cols: int, ld: int, kind: Any) -> np.ndarray[Any, Any]:
    """A column-major view of host memory (bfloat16 read as the top half of float32)."""
    dt = np.dtype(np.uint16 if kind == "bfloat16" else kind)
    span = (cols - 1) * ld + rows
    flat = np.ctypeslib.as_array((ctypes.c_ubyte * (span * dt.itemsize)).from_address(address)).view(dt)
    view = np.lib.stride_tricks.as_strided(flat, (rows, cols), (dt.itemsize, ld * dt.itemsize))
    if kind == "bfloat16":
        return (view.astype(np.uint32) << 16).view(np.float32)
    return view


class _Memory:
    def __init__(self, nbytes: int) -> None:
        self.buffer = np.zeros(nbytes + 512, dtype=np.uint8)
        self.ptr = int(self.buffer.ctypes.data) + (-int(self.buffer.ctypes.data)) % 512


class _Pool:
    def __init__(self, owner: StandIn) -> None:
        self.owner = owner
        self.live = 0

    def malloc(self, nbytes: int) -> _Memory:
        if self.owner.fail_mallocs:
            self.owner.fail_mallocs -= 1
            raise MemoryError(f"out of memory allocating {nbytes} bytes")
        self.live += 1
        return _Memory(nbytes)

    def free_all_blocks(self) -> None:
        self.owner.calls.append(("free_all_blocks",))

    def free_bytes(self) -> int:
        return 0


class _Module:
    def __init__(self, owner: StandIn) -> None:
        self.owner = owner

    def load(self, binary: bytes) -> None:
        if self.owner.reject_loads:
            self.owner.reject_loads -= 1
            raise RuntimeError("CUDA_ERROR_INVALID_IMAGE")
        assert isinstance(binary, bytes) and binary
        self.owner.calls.append(("load", len(binary)))

    def get_function(self, name: str) -> Any:
        owner = self.owner
        owner.calls.append(("get_function", name))

        def kernel(grid: Any, block: Any, args: Any, stream: Any = None) -> None:
            owner.launches.append((name, grid, block, args, stream))

        return kernel


class StandIn:
    """``cupy`` (as ``.cuda``) and ``cupy_backends.cuda.libs.cublas`` (as ``.cublas``) over host memory."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.launches: list[tuple[Any, ...]] = []
        self.fail_mallocs = 0
        self.reject_loads = 0
        self.cuda = self._cuda()
        self.cublas = self._cublas()
        self.pool = _Pool(self)

    def _cuda(self) -> Any:
        owner = self

        class Device:
            def __init__(self, ordinal: int) -> None:
                self.ordinal = ordinal

            def __enter__(self) -> Device:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

        class Runtime:
            memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice = 1, 2, 3

            @staticmethod
            def memcpy(dst: int, src: int, nbytes: int, kind: int) -> None:
                owner.calls.append(("memcpy", kind, nbytes))
                ctypes.memmove(dst, src, nbytes)

            @staticmethod
            def deviceSynchronize() -> None:
                owner.calls.append(("deviceSynchronize",))

            @staticmethod
            def memGetInfo() -> tuple[int, int]:
                return (1 << 20, 1 << 30)

        class Function:
            Module = staticmethod(lambda: _Module(owner))

        class Stream:
            null = "the legacy default stream"

        class Cuda:
            pass

        cuda = Cuda()
        cuda.Device, cuda.runtime, cuda.function, cuda.Stream = Device, Runtime, Function, Stream  # type: ignore[attr-defined]
        return cuda

    # ------------------------------------------------------------------ cuBLAS, as CuPy wraps it

    def _cublas(self) -> Any:
        owner = self

        def record(name: str) -> Any:
            return lambda *args: owner.calls.append((name, *args))

        class Cublas:
            create = staticmethod(lambda: 7)
            destroy = staticmethod(record("destroy"))
            setPointerMode = staticmethod(record("setPointerMode"))
            setMathMode = staticmethod(record("setMathMode"))
            setStream = staticmethod(record("setStream"))

            @staticmethod
            def sgemm(*a: Any) -> None:
                owner._gemm("sgemm", np.float32, a, batched=False, ex=False)

            @staticmethod
            def dgemm(*a: Any) -> None:
                owner._gemm("dgemm", np.float64, a, batched=False, ex=False)

            @staticmethod
            def sgemmStridedBatched(*a: Any) -> None:
                owner._gemm("sgemmStridedBatched", np.float32, a, batched=True, ex=False)

            @staticmethod
            def dgemmStridedBatched(*a: Any) -> None:
                owner._gemm("dgemmStridedBatched", np.float64, a, batched=True, ex=False)

            @staticmethod
            def gemmEx(*a: Any) -> None:
                owner._gemm("gemmEx", None, a, batched=False, ex=True)

            @staticmethod
            def gemmStridedBatchedEx(*a: Any) -> None:
                owner._gemm("gemmStridedBatchedEx", None, a, batched=True, ex=True)

        return Cublas()

    def _gemm(self, name: str, real: Any, args: tuple[Any, ...], *, batched: bool, ex: bool) -> None:
        """C = alpha op(A) op(B) + beta C with the argument list of cublas<t>gemm[StridedBatched][Ex]."""
        self.calls.append((name, len(args)))
        expected = {"gemm": 14, "gemmStridedBatched": 18, "gemmEx": 19, "gemmStridedBatchedEx": 23}
        assert len(args) == expected[name.lstrip("sd")], (
            f"{name} takes {expected[name.lstrip('sd')]} arguments"
        )
        handle, ta, tb, m, n, k, alpha_ptr = args[:7]
        assert handle == 7 and ta in (0, 1) and tb in (0, 1)
        rest = list(args[7:])
        step = (3 if ex else 2) + (1 if batched else 0)
        a, b = rest[:step], rest[step : 2 * step]
        beta_ptr = rest[2 * step]
        c = rest[2 * step + 1 : 3 * step + 1]
        tail = rest[3 * step + 1 :]
        count = tail.pop(0) if batched else 1
        if ex:
            assert tail == [68, -1], tail  # CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT
            kinds = [_TYPES[a[1]], _TYPES[b[1]], _TYPES[c[1]]]
            a, b, c = [x[:1] + x[2:] for x in (a, b, c)]
        else:
            assert not tail, tail
            kinds = [real, real, real]
        scalar = np.float64 if kinds[2] == np.float64 else np.float32
        alpha = float(np.ctypeslib.as_array((ctypes.c_byte * 8).from_address(alpha_ptr)).view(scalar)[0])
        beta = float(np.ctypeslib.as_array((ctypes.c_byte * 8).from_address(beta_ptr)).view(scalar)[0])
        sizes = [2 if kind in (np.float16, "bfloat16") else np.dtype(kind).itemsize for kind in kinds]
        for i in range(count):
            at = [x[0] + (i * x[2] * s if batched else 0) for x, s in zip((a, b, c), sizes, strict=True)]
            mat_a = _matrix(at[0], k if ta else m, m if ta else k, a[1], kinds[0]).astype(np.float64)
            mat_b = _matrix(at[1], n if tb else k, k if tb else n, b[1], kinds[1]).astype(np.float64)
            out = _matrix(at[2], m, n, c[1], kinds[2])
            product = (mat_a.T if ta else mat_a) @ (mat_b.T if tb else mat_b)
            out[...] = alpha * product + (0 if beta == 0 else beta * out.astype(np.float64))

    # ------------------------------------------------------------------ plugging into a session

    def attach(self, device: Any, arch: str = "compute_80") -> None:
        """Give an unopened ``CudaDevice`` this stand-in as its CuPy, pool and cuBLAS handle."""
        device._cupy, device._cublas, device._pool, device._handle, device._arch = (
            self,
            self.cublas,
            self.pool,
            7,
            arch,
        )
