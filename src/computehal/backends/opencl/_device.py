"""OpenCL devices: discovery, filtering, and what each device can do.

Every query that touches the driver is guarded: a platform or device that cannot be
listed is skipped, and an attribute the driver does not report reads as None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyopencl as cl

from ...backend import ALL_OPS
from ...types import Capabilities, DeviceInfo, MemoryKind

__all__ = ["KERNEL_PROFILES", "DeviceFilter", "capabilities_of", "device_attr", "device_info", "has_fp64",
           "list_devices", "profile_of"]  # fmt: skip

#: Kernel profiles: "cpu" (one work-item per group, vector register tiles, contiguous folds) and
#: "gpu" (work-group tiles staged in local memory, interleaved folds, one element per work-item).
KERNEL_PROFILES = ("cpu", "gpu")

#: A device filter: text the device name must contain, or a predicate on the ``pyopencl.Device``.
DeviceFilter = str | Callable[[Any], bool] | None


def _platforms() -> list[Any]:
    try:
        return list(cl.get_platforms())
    except cl.Error:
        return []  # no ICD loader or no platform installed


def _keep(dev: Any, device_filter: DeviceFilter) -> bool:
    if device_filter is None:
        return True
    if callable(device_filter):
        return bool(device_filter(dev))
    return device_filter.lower() in str(dev.name).lower()


def list_devices(platform: str | None = None, device_filter: DeviceFilter = None) -> list[Any]:
    """Every OpenCL device of every platform, in platform order, optionally filtered.

    Parameters
    ----------
    platform : str, optional
        Keep platforms whose name or vendor contains this text (case-insensitive).
    device_filter : str or callable, optional
        Keep devices whose name contains this text (case-insensitive), or for which the
        callable returns True.
    """
    devices: list[Any] = []
    for plat in _platforms():
        if platform is not None and platform.lower() not in f"{plat.name} {plat.vendor}".lower():
            continue
        try:
            found = plat.get_devices()
        except cl.Error:
            continue
        devices.extend(dev for dev in found if _keep(dev, device_filter))
    return devices


def device_attr(dev: Any, name: str) -> Any:
    """Attribute ``name`` of ``dev``, or None where the driver does not report it."""
    try:
        return getattr(dev, name)
    except (cl.Error, AttributeError):
        return None


def _warp_width(dev: Any) -> int:
    """Warp / wavefront / sub-group width where the device reports one, else 1."""
    for attr in ("warp_size_nv", "wavefront_width_amd"):
        value = device_attr(dev, attr)
        if value:
            return int(value)
    sizes = device_attr(dev, "sub_group_sizes_intel")
    return int(max(sizes)) if sizes else 1


def has_fp64(dev: Any) -> bool:
    """True when ``dev`` computes in double precision (``cl_khr_fp64``)."""
    return "cl_khr_fp64" in str(dev.extensions).split() or bool(device_attr(dev, "double_fp_config"))


def profile_of(dev: Any) -> str:
    """The default kernel profile of ``dev``: "gpu" for GPUs and accelerators, else "cpu"."""
    return "gpu" if dev.type & (cl.device_type.GPU | cl.device_type.ACCELERATOR) else "cpu"


def capabilities_of(dev: Any) -> Capabilities:
    """The capabilities of ``dev`` (the backend fills in which dtypes each op takes)."""
    extensions = set(str(dev.extensions).split())
    unified = bool(dev.type & cl.device_type.CPU) or bool(device_attr(dev, "host_unified_memory"))
    # bf16, fp8, tensor cores, peer access, cluster launch, async copy: never, the defaults.
    return Capabilities(
        supports_fp16="cl_khr_fp16" in extensions,
        unified_memory=unified,
        max_threads_per_block=int(dev.max_work_group_size),
        max_shared_mem_per_block=int(dev.local_mem_size),
        warp_size=_warp_width(dev),
        supports_fp64=has_fp64(dev),
        native_ops=frozenset(ALL_OPS),
    )


def device_info(ordinal: int, dev: Any, caps: Capabilities | None = None) -> DeviceInfo:
    """The :class:`DeviceInfo` of ``dev`` listed as ``ordinal``."""
    caps = caps or capabilities_of(dev)
    major = device_attr(dev, "compute_capability_major_nv")
    minor = device_attr(dev, "compute_capability_minor_nv")
    cc = (int(major), int(minor or 0)) if major is not None else (0, 0)
    if dev.type & cl.device_type.CPU:
        kind = MemoryKind.HOST
    elif caps.unified_memory:
        kind = MemoryKind.UNIFIED
    else:
        kind = MemoryKind.DEVICE
    return DeviceInfo(
        ordinal=ordinal,
        name=f"{str(dev.name).strip()} ({str(dev.platform.name).strip()})",
        compute_capability=cc,
        total_memory_bytes=int(dev.global_mem_size),
        memory_kind=kind,
        capabilities=caps,
    )
