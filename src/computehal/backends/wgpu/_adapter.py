"""wgpu-py itself: importing it, ordering adapters, describing them, translating its errors.

Adapter 0 is the adapter wgpu prefers for high-performance work; the others follow in
the order wgpu enumerates them. Every call into wgpu that can fail runs inside
:func:`check`, which turns wgpu's validation, out-of-memory and internal errors into
:class:`~computehal.DeviceError` / :class:`~computehal.OutOfMemoryError` carrying
wgpu's own text.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...errors import DeviceError, OutOfMemoryError
from ...types import Capabilities, DeviceInfo, MemoryKind

__all__ = [
    "adapter_kind",
    "capabilities_of",
    "check",
    "device_info",
    "info_get",
    "is_llvmpipe",
    "ordered_adapters",
    "wgpu_module",
]


def wgpu_module() -> Any:
    """Import wgpu-py (an optional dependency) on first use."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        # Mesa's Vulkan loader warns without it; a private directory keeps it quiet.
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="computehal-xdg-")
    try:
        import wgpu
    except ImportError as exc:
        raise DeviceError(f"the wgpu backend needs wgpu-py (pip install 'computehal[wgpu]'): {exc}") from None
    return wgpu


@contextmanager
def check(what: str) -> Iterator[None]:
    """Run a wgpu call, translating wgpu's errors (with their text) into computehal's.

    ``GPUOutOfMemoryError`` (and ``MemoryError``) become :class:`OutOfMemoryError`;
    validation and internal errors become :class:`DeviceError` naming ``what``.
    """
    wgpu = wgpu_module()
    try:
        yield
    except (wgpu.GPUOutOfMemoryError, MemoryError) as exc:
        raise OutOfMemoryError() from exc
    except wgpu.GPUError as exc:
        text = str(exc).strip() or type(exc).__name__
        if "out of memory" in text.lower():
            raise OutOfMemoryError() from exc
        raise DeviceError(f"wgpu failed {what}: {text}") from exc


def info_get(info: Any, key: str, default: Any) -> Any:
    """``info[key]`` of a wgpu adapter info (a dict, or an object in older wgpu-py)."""
    try:
        return info[key]
    except (KeyError, TypeError, IndexError):
        return getattr(info, key, default)


def adapter_kind(info: Any) -> str:
    """The backend kind of an adapter: ``"vulkan"``, ``"metal"`` or ``"webgpu"``."""
    backend = str(info_get(info, "backend_type", "")).lower()
    return backend if backend in ("vulkan", "metal") else "webgpu"


def is_llvmpipe(info: Any) -> bool:
    """True for Mesa's software rasteriser (lavapipe), which caps shader loops."""
    return "llvmpipe" in str(info_get(info, "device", "")).lower()


def _identity(info: Any) -> tuple[str, ...]:
    keys = ("vendor_id", "device_id", "backend_type", "device", "adapter_type")
    return tuple(str(info_get(info, key, "")) for key in keys)


def ordered_adapters() -> list[Any]:
    """Every adapter, the one wgpu prefers for high-performance work first."""
    wgpu = wgpu_module()
    with check("enumerating adapters"):
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
        preferred = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if preferred is not None:
        key = _identity(preferred.info)
        same = [i for i, adapter in enumerate(adapters) if _identity(adapter.info) == key]
        if same:
            adapters.insert(0, adapters.pop(same[0]))
        else:
            adapters.insert(0, preferred)
    return adapters


def capabilities_of(adapter: Any) -> Capabilities:
    """The capabilities of an adapter (native ops and dtypes are filled in by the backend)."""
    limits = adapter.limits
    features = set(adapter.features)
    info = adapter.info
    subgroup = 1
    if "subgroup" in features:
        # The smallest subgroup the adapter may run (wgpu-py 0.2x spells the key differently).
        size = info_get(info, "subgroup_min_size", None) or info_get(info, "stackgroup_min_size", 0)
        subgroup = int(size or 0) or 1
    adapter_type = str(info_get(info, "adapter_type", "")).lower()
    # bf16, fp8, tensor cores, peer access, cluster launch, async copy: never, the defaults.
    return Capabilities(
        supports_fp16="shader-f16" in features,
        unified_memory=adapter_type in ("cpu", "integratedgpu", "integrated-gpu"),
        max_threads_per_block=int(limits.get("max-compute-invocations-per-workgroup", 256)),
        max_shared_mem_per_block=int(limits.get("max-compute-workgroup-storage-size", 16384)),
        warp_size=subgroup,
        supports_fp64=False,
    )


def device_info(ordinal: int, adapter: Any, capabilities: Capabilities) -> DeviceInfo:
    """The :class:`DeviceInfo` of adapter ``ordinal``."""
    info = adapter.info
    adapter_type = str(info_get(info, "adapter_type", "")).lower()
    if adapter_type == "cpu":
        kind = MemoryKind.HOST
    elif adapter_type in ("integratedgpu", "integrated-gpu"):
        kind = MemoryKind.UNIFIED
    else:
        kind = MemoryKind.DEVICE
    name = str(info_get(info, "device", "") or info_get(info, "description", "") or "adapter")
    backend = str(info_get(info, "backend_type", ""))
    return DeviceInfo(
        ordinal=ordinal,
        name=f"{name} ({backend})" if backend else name,
        compute_capability=(0, 0),
        # wgpu does not report device memory; 0 means "not reported".
        total_memory_bytes=0,
        memory_kind=kind,
        capabilities=capabilities,
    )
