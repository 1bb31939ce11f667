"""The limits each row is held against: the device's own ceilings and vendor libraries.

* The host: a direct SciPy BLAS ``dgemm`` / ``sgemm`` on Fortran-ordered operands (no
  copies), ``numpy.matmul`` on stacked arrays, and a large copy split over every core.
* A device's bandwidth: ``copy_dtod`` through the public interface (its copy kernel or
  driver copy), synchronised.
* A vendor library on the same problem where the device has one: SciPy BLAS and
  ``numpy.matmul`` for the CPU backend, cuBLAS / PyTorch through CuPy for CUDA
  (:mod:`computehal.bench._cuda`). OpenCL and Vulkan devices have none; their GEMM rows
  are compared with the host's sgemm.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from ..errors import BackendError
from ._harness import BLAS_SETTLE_SECONDS, Limit
from ._sizes import Profile, Sizes

__all__ = ["Ceilings", "HostCeilings", "Vendor", "build_ceilings"]

F32 = np.dtype(np.float32)


def host_workers() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


class HostCeilings:
    """This host's ceilings; operands are allocated on first use."""

    def __init__(self, sizes: Sizes) -> None:
        self.sizes = sizes
        self._gemm: dict[str, tuple[Any, ...]] = {}
        self._copy: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Stop the copy threads and drop the operands."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self._gemm.clear()
        self._copy = None

    def blas_gemm(self, dtype: str, n: int | None = None) -> Limit:
        """A direct SciPy ``dgemm`` / ``sgemm`` of ``n``^3 (default: ``sizes.host_gemm``)."""
        from scipy.linalg import blas

        n = self.sizes.host_gemm if n is None else n
        key = f"{dtype}-{n}"
        if key not in self._gemm:
            rng = np.random.default_rng(1)
            a = np.asfortranarray(rng.standard_normal((n, n)).astype(dtype))
            b = np.asfortranarray(rng.standard_normal((n, n)).astype(dtype))
            c = np.zeros((n, n), dtype=dtype, order="F")
            self._gemm[key] = (blas.dgemm if dtype == "float64" else blas.sgemm, a, b, c)
        fn, a, b, c = self._gemm[key]
        name = "scipy dgemm" if dtype == "float64" else "scipy sgemm"
        if n != self.sizes.host_gemm:
            name += f" {n}^3"

        def run() -> None:
            fn(1.0, a, b, beta=0.0, c=c, overwrite_c=True)

        return Limit(name, run, 2.0 * n**3, settle=BLAS_SETTLE_SECONDS)

    def matmul3d(self, batch: int, dim: int) -> Limit:
        """``numpy.matmul`` of ``batch`` stacked float32 ``dim``^3 products."""
        rng = np.random.default_rng(2)
        a = rng.standard_normal((batch, dim, dim), dtype=F32)
        b = rng.standard_normal((batch, dim, dim), dtype=F32)
        out = np.empty_like(a)

        def run() -> None:
            np.matmul(a, b, out=out)

        return Limit("numpy.matmul 3-D", run, 2.0 * batch * dim**3, settle=BLAS_SETTLE_SECONDS)

    def copy(self) -> Limit:
        """A large float32 copy split over every core (``np.copyto`` releases the GIL)."""
        workers = host_workers()
        if self._copy is None:
            src = np.random.default_rng(3).standard_normal(self.sizes.copy_elements, dtype=F32)
            self._copy = (src, np.empty_like(src))
            self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench-copy")
        src, dst = self._copy
        pool = self._pool
        assert pool is not None
        n = src.size
        bounds = [n * i // workers for i in range(workers + 1)]

        def run() -> None:
            jobs = [
                pool.submit(np.copyto, dst[bounds[i] : bounds[i + 1]], src[bounds[i] : bounds[i + 1]])
                for i in range(workers)
            ]
            for job in jobs:
                job.result()

        # Bytes read + written (the STREAM copy convention).
        return Limit("host copy", run, 2.0 * src.nbytes, kind="bandwidth")


class Vendor(Protocol):
    """A vendor library's version of a problem, where the device has one (else None)."""

    name: str

    def gemm(self, dtype: str, n: int) -> Limit | None:
        """``n``^3 GEMM of ``dtype``."""

    def batched_gemm(self, batch: int, dim: int) -> Limit | None:
        """``batch`` float32 ``dim``^3 products."""

    def gemm_mixed_precision(self, prec: str, n: int) -> Limit | None:
        """16-bit operands, float32 accumulation, ``n``^3."""

    def attention(
        self, shape: tuple[int, int, int, int], causal: bool, mask: bool, kv_heads: int
    ) -> Limit | None:
        """Scaled dot-product attention of [B, H, S, D] on the device."""

    def close(self) -> None:
        """Release what the references hold."""


class NoVendor:
    """Devices without a vendor library (OpenCL, Vulkan)."""

    name = "none"

    def gemm(self, dtype: str, n: int) -> Limit | None:
        return None

    def batched_gemm(self, batch: int, dim: int) -> Limit | None:
        return None

    def gemm_mixed_precision(self, prec: str, n: int) -> Limit | None:
        return None

    def attention(
        self, shape: tuple[int, int, int, int], causal: bool, mask: bool, kv_heads: int
    ) -> Limit | None:
        return None

    def close(self) -> None:
        pass


class HostVendor(NoVendor):
    """The CPU backend's vendor library: SciPy BLAS and ``numpy.matmul``."""

    name = "scipy BLAS"

    def __init__(self, host: HostCeilings) -> None:
        self.host = host

    def gemm(self, dtype: str, n: int) -> Limit | None:
        return self.host.blas_gemm(dtype, n) if dtype in ("float32", "float64") else None

    def batched_gemm(self, batch: int, dim: int) -> Limit | None:
        return self.host.matmul3d(batch, dim)

    def gemm_mixed_precision(self, prec: str, n: int) -> Limit | None:
        return self.host.blas_gemm("float32", n)


def device_copy(backend: ComputeBackend, nbytes: int, held: list[int]) -> Limit:
    """The device's copy bandwidth through the public ``copy_dtod`` (bytes read + written).

    The two allocations are appended to ``held`` (the caller frees them).
    """
    src = backend.alloc(nbytes)
    held.append(src)
    dst = backend.alloc(nbytes)
    held.append(dst)
    backend.copy_htod(src, np.ones(nbytes // 4, dtype=F32))

    def run() -> None:
        backend.copy_dtod(dst, src, nbytes)
        backend.synchronize()

    run()  # an UnsupportedError here means the device has no copy_dtod
    return Limit("copy_dtod", run, 2.0 * nbytes, kind="bandwidth")


@dataclass
class Ceilings:
    """The limits of one run.

    Attributes
    ----------
    host : HostCeilings
        This host's BLAS and copy.
    compute : Limit
        The compute ceiling of convolution and attention rows (an sgemm).
    bandwidth : Limit
        The bandwidth ceiling of memory-bound rows (the device's copy).
    vendor : Vendor
        Vendor references for the same problems, where the device has a vendor library.
    """

    host: HostCeilings
    compute: Limit
    bandwidth: Limit
    vendor: Vendor
    backend: ComputeBackend | None = None
    held: list[int] = field(default_factory=list)

    def close(self) -> None:
        """Release every reference's memory (device allocations included)."""
        self.vendor.close()
        self.host.close()
        if self.backend is not None:
            self.backend.synchronize()
            while self.held:
                self.backend.free(self.held.pop())


def build_ceilings(backend: ComputeBackend, profile: Profile, sizes: Sizes) -> Ceilings:
    """The ceilings of ``backend`` on ``profile``."""
    host = HostCeilings(sizes)
    if profile == "cpu":
        return Ceilings(host, host.blas_gemm("float32"), host.copy(), HostVendor(host))
    if profile == "cuda":
        from ._cuda import CudaVendor

        vendor = CudaVendor(sizes)
        return Ceilings(host, vendor.compute(), vendor.copy(4 * sizes.copy_elements), vendor)
    held: list[int] = []
    try:
        bandwidth = device_copy(backend, 4 * sizes.copy_elements, held)
    except BackendError:
        bandwidth = host.copy()
    return Ceilings(host, host.blas_gemm("float32"), bandwidth, NoVendor(), backend, held)
