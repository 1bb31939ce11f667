"""CudaBackend: NVIDIA GPUs (and AMD GPUs through CuPy's ROCm build) on CuPy.

Pointers are real device addresses from the backend's own CuPy memory pool. GEMMs go
straight to cuBLAS through CuPy's pointer-level bindings; every other operation runs the
kernels in :mod:`computehal.kernels` (the same sources the OpenCL backend runs) compiled
with NVRTC, the binaries cached on disk.

The package is split the way the contract is: CuPy access, error translation and device
discovery (``_driver``), kernel units and their compilation with the disk cache
(``_programs``), the opened device (``_device``: memory pool, cuBLAS handle, loaded
modules, copies, launches), the backend's plumbing (``_core``), then one module per op
family (``_gemm``, ``_conv``, ``_attention``, ``_axis``, ``_elementwise``,
``_movement``), combined by ``_backend``.

Importing this package imports neither CuPy nor a GPU runtime;
:meth:`CudaBackend.init`, :meth:`~CudaBackend.capabilities` and
:meth:`~CudaBackend.available_devices` raise :class:`~computehal.DeviceError` carrying
CuPy's own text when CuPy or a device is missing (see :func:`unavailable_reason`).
"""

from __future__ import annotations

from ._backend import CudaBackend
from ._driver import check, translate, unavailable_reason
from ._programs import (
    NVRTC_OPTIONS,
    KernelSource,
    Ptr,
    cache_dir,
    compile_cached,
    compile_ptx,
    kernel_sources,
    narrow_unit,
    nvrtc_compile,
)

__all__ = [
    "NVRTC_OPTIONS",
    "CudaBackend",
    "KernelSource",
    "Ptr",
    "cache_dir",
    "check",
    "compile_cached",
    "compile_ptx",
    "kernel_sources",
    "narrow_unit",
    "nvrtc_compile",
    "translate",
    "unavailable_reason",
]
