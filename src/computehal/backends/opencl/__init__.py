"""OpenCLBackend: every operation as an OpenCL kernel, on any OpenCL device (PoCL included).

The package is split the way the contract is: device discovery (``_device``), driver
plumbing (``_runtime``: error translation, buffers, the bounded program cache, launches),
the backend's device state (``_core``), then one module per op family (``_gemm``,
``_conv``, ``_pool``, ``_attention``, ``_axis``, ``_elementwise``, ``_movement``), combined by
``_backend``. Importing it imports ``pyopencl``.
"""

from __future__ import annotations

from ...kernels import kernel_files, kernel_source
from ._backend import OpenCLBackend
from ._device import KERNEL_PROFILES, list_devices

__all__ = ["KERNEL_PROFILES", "OpenCLBackend", "kernel_files", "kernel_source", "list_devices"]
