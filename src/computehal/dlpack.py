"""DLPack vocabulary shared by computehal: device type codes, and which of them the host can address.

Which device a backend's memory is on is the backend's own answer,
:meth:`~computehal.ComputeBackend.dlpack_device` (``(kDLCPU, 0)`` for the CPU backend,
``(kDLCUDA, ordinal)`` for CUDA, None for backends whose memory leaves the device only
by copy). The array-level exchange, :func:`computehal.from_dlpack` and
``DeviceArray.__dlpack__``, lives in :mod:`computehal.array`.
"""

from __future__ import annotations

import enum
from typing import Any

from .errors import UnsupportedError

__all__ = ["DLDeviceType", "HOST_DEVICE_TYPES", "CUDA_DEVICE_TYPES", "cupy_module"]


class DLDeviceType(enum.IntEnum):
    """The ``DLDeviceType`` codes of the DLPack standard used by computehal."""

    CPU = 1
    CUDA = 2
    CUDA_HOST = 3
    OPENCL = 4
    VULKAN = 7
    METAL = 8
    ROCM = 10
    CUDA_MANAGED = 13
    WEBGPU = 15


#: Device types whose memory NumPy can address from the host.
HOST_DEVICE_TYPES = frozenset({DLDeviceType.CPU, DLDeviceType.CUDA_HOST, DLDeviceType.CUDA_MANAGED})

#: Device types whose memory CuPy addresses (device memory of a CUDA or ROCm GPU).
CUDA_DEVICE_TYPES = frozenset({DLDeviceType.CUDA, DLDeviceType.ROCM})


def cupy_module() -> Any:
    """CuPy, which exchanges CUDA / ROCm memory; UnsupportedError when it is missing."""
    try:
        import cupy
    except ImportError as exc:
        raise UnsupportedError(f"DLPack exchange of CUDA memory needs CuPy ({exc})") from exc
    return cupy
