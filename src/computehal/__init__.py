"""computehal: one low-level compute interface over CPU, OpenCL, wgpu and CUDA.

Importing the package is cheap and touches no device; backends load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .backend import ComputeBackend, ForwardingBackend
from .errors import (
    BackendError,
    DeviceError,
    InvalidArgumentError,
    NotInitializedError,
    OutOfMemoryError,
    UnsupportedError,
)
from .memory import AllocationInfo
from .types import (
    BackendTranspose,
    BinaryOp,
    Capabilities,
    DeviceInfo,
    MemoryKind,
    MixedPrecision,
    OpClass,
    PoolOp,
    ReduceOp,
    TileShape,
    UnaryOp,
    default_tile_for,
    round_to_bf16,
    round_to_f16,
)

if TYPE_CHECKING:
    from .array import DeviceArray, asarray, empty, from_dlpack, to_device, zeros
    from .backends.cpu import CpuBackend
    from .backends.null import NullBackend
    from .probe import ProbeReport
    from .probe import probe as probe_backends
    from .registry import BackendEntry, BackendKind, BackendRegistry, SelectionRequest
    from .selection import Selection, auto, create_backend, last_selection

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "ComputeBackend",
    "ForwardingBackend",
    "AllocationInfo",
    "CpuBackend",
    "NullBackend",
    "BackendError",
    "DeviceError",
    "InvalidArgumentError",
    "NotInitializedError",
    "OutOfMemoryError",
    "UnsupportedError",
    "BackendTranspose",
    "BinaryOp",
    "Capabilities",
    "DeviceInfo",
    "MemoryKind",
    "MixedPrecision",
    "OpClass",
    "PoolOp",
    "ReduceOp",
    "TileShape",
    "UnaryOp",
    "default_tile_for",
    "round_to_bf16",
    "round_to_f16",
    "BackendKind",
    "SelectionRequest",
    "BackendEntry",
    "BackendRegistry",
    "ProbeReport",
    "Selection",
    "probe_backends",
    "create_backend",
    "auto",
    "last_selection",
    "DeviceArray",
    "asarray",
    "to_device",
    "empty",
    "zeros",
    "from_dlpack",
]

# Backend classes are imported on first attribute access so that importing
# computehal stays cheap (no SciPy, no GPU runtime).
_LAZY = {
    "CpuBackend": ("computehal.backends.cpu", "CpuBackend"),
    "NullBackend": ("computehal.backends.null", "NullBackend"),
    "BackendKind": ("computehal.registry", "BackendKind"),
    "SelectionRequest": ("computehal.registry", "SelectionRequest"),
    "BackendEntry": ("computehal.registry", "BackendEntry"),
    "BackendRegistry": ("computehal.registry", "BackendRegistry"),
    "ProbeReport": ("computehal.probe", "ProbeReport"),
    "Selection": ("computehal.selection", "Selection"),
    # The module computehal.probe shadows the name "probe"; its function is exported as probe_backends.
    "probe_backends": ("computehal.probe", "probe"),
    "create_backend": ("computehal.selection", "create_backend"),
    "auto": ("computehal.selection", "auto"),
    "last_selection": ("computehal.selection", "last_selection"),
    "DeviceArray": ("computehal.array", "DeviceArray"),
    "asarray": ("computehal.array", "asarray"),
    "to_device": ("computehal.array", "to_device"),
    "empty": ("computehal.array", "empty"),
    "zeros": ("computehal.array", "zeros"),
    "from_dlpack": ("computehal.array", "from_dlpack"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module_name, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'computehal' has no attribute {name!r}")
