"""CuPy access for the CUDA backend: import, error translation, device discovery.

Nothing here imports CuPy at module import time. :func:`import_cupy` turns a missing or
broken CuPy into :class:`~computehal.DeviceError` with CuPy's own text, and every call
into the CUDA runtime, the driver, cuBLAS or NVRTC that can fail runs inside
:func:`check`, which translates the library's exception into
:class:`~computehal.OutOfMemoryError` (the out-of-memory status codes) or
:class:`~computehal.DeviceError` carrying the library's message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...backend import ALL_OPS
from ...errors import BackendError, DeviceError, OutOfMemoryError
from ...types import Capabilities, DeviceInfo, MemoryKind

__all__ = [
    "all_devices",
    "check",
    "device_count",
    "import_cupy",
    "is_hip",
    "runtime_name",
    "translate",
    "unavailable_reason",
]

#: Exception classes of CuPy's bindings (matched by class name along the MRO, so that the
#: cuBLAS and driver modules, which need their libraries to import, are never imported
#: here), the library they speak for and their out-of-memory status codes:
#: cudaErrorMemoryAllocation / hipErrorOutOfMemory, CUDA_ERROR_OUT_OF_MEMORY,
#: CUBLAS_STATUS_ALLOC_FAILED, NVRTC_ERROR_OUT_OF_MEMORY.
_LIBRARIES: dict[str, tuple[str, frozenset[int]]] = {
    "CUDARuntimeError": ("CUDA runtime", frozenset({2})),
    "CUDADriverError": ("CUDA driver", frozenset({2})),
    "CUBLASError": ("cuBLAS", frozenset({3})),
    "NVRTCError": ("NVRTC", frozenset({1})),
}


def translate(exc: BaseException, action: str, nbytes: int | None = None) -> BackendError:
    """The computehal error for ``exc``, raised by CuPy while doing ``action``.

    Parameters
    ----------
    exc : BaseException
        What CuPy (or the library behind it) raised.
    action : str
        What was being done ("allocating 4096 bytes"), for the message.
    nbytes : int, optional
        The size being allocated, reported by :class:`OutOfMemoryError`.
    """
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, MemoryError):  # cupy.cuda.memory.OutOfMemoryError is a MemoryError
        return OutOfMemoryError(nbytes, None)
    for cls in type(exc).__mro__:
        known = _LIBRARIES.get(cls.__name__)
        if known is not None:
            library, oom = known
            if getattr(exc, "status", None) in oom:
                return OutOfMemoryError(nbytes, None)
            return DeviceError(f"{library} error while {action}: {exc}")
    if isinstance(exc, (ImportError, OSError)):
        return DeviceError(f"a CUDA library is not loadable while {action} ({type(exc).__name__}: {exc})")
    return DeviceError(f"{action} failed: {type(exc).__name__}: {exc}")


@contextmanager
def check(action: str, nbytes: int | None = None) -> Iterator[None]:
    """Translate what CuPy raises inside the block (see :func:`translate`).

    :class:`~computehal.BackendError` passes through unchanged.
    """
    try:
        yield
    except BackendError:
        raise
    except Exception as exc:  # noqa: BLE001 - CuPy raises several unrelated types
        raise translate(exc, action, nbytes) from exc


def import_cupy() -> Any:
    """Import CuPy, turning any failure into :class:`DeviceError` with the original text."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - a broken install raises anything
        raise DeviceError(f"CuPy is not importable ({type(exc).__name__}: {exc})") from exc
    return cupy


def is_hip() -> bool:
    """True on CuPy's ROCm (HIP) build; False without CuPy."""
    try:
        import cupy
    except Exception:  # noqa: BLE001
        return False
    return bool(getattr(cupy.cuda.runtime, "is_hip", False))


def runtime_name() -> str:
    """``"ROCm"`` on CuPy's HIP build, else ``"CUDA"``."""
    return "ROCm" if is_hip() else "CUDA"


def device_count() -> int:
    """Number of visible devices; :class:`DeviceError` with CuPy's text when there are none."""
    cupy = import_cupy()
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError, or a loader error
        raise DeviceError(f"no usable {runtime_name()} device ({exc})") from exc
    if count < 1:
        raise DeviceError(f"no {runtime_name()} device is visible")
    return count


def unavailable_reason() -> str | None:
    """Why the CUDA backend cannot run here, or ``None`` when a device is usable.

    Touches the driver (device count) but allocates nothing.
    """
    try:
        device_count()
    except DeviceError as exc:
        return exc.msg
    return None


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)


def _peer_access(runtime: Any, ordinal: int, count: int) -> bool:
    for other in range(count):
        if other == ordinal:
            continue
        try:
            if runtime.deviceCanAccessPeer(ordinal, other):
                return True
        except Exception:  # noqa: BLE001 - a query failure means "no"
            continue
    return False


def capabilities_from(props: dict[str, Any], hip: bool, peer: bool) -> Capabilities:
    """The :class:`Capabilities` of a device from its runtime properties."""
    major, minor = int(props.get("major", 0)), int(props.get("minor", 0))
    if hip:
        arch = _text(props.get("gcnArchName", "")).split(":", 1)[0]
        matrix_cores = arch.startswith(("gfx908", "gfx90a", "gfx94", "gfx95"))
        bf16 = matrix_cores or arch.startswith(("gfx11", "gfx12"))
        fp8 = arch.startswith(("gfx94", "gfx95", "gfx12"))
        tensor_cores, cluster, async_copy, fp16 = matrix_cores, False, False, True
    else:
        cc = major * 10 + minor
        fp16, bf16, fp8 = cc >= 53, cc >= 80, cc >= 89
        tensor_cores, cluster, async_copy = cc >= 70, cc >= 90, cc >= 80
    return Capabilities(
        supports_fp16=fp16,
        supports_bf16=bf16,
        supports_fp8=fp8,
        tensor_cores=tensor_cores,
        peer_access=peer,
        unified_memory=bool(props.get("integrated", 0)),
        cluster_launch=cluster,
        async_copy=async_copy,
        max_threads_per_block=int(props.get("maxThreadsPerBlock", 1024)),
        max_shared_mem_per_block=int(props.get("sharedMemPerBlock", 49152)),
        warp_size=int(props.get("warpSize", 32)),
        supports_fp64=True,
        native_ops=frozenset(ALL_OPS),
    )


def device_info_from(props: dict[str, Any], ordinal: int, caps: Capabilities) -> DeviceInfo:
    """A :class:`DeviceInfo` from a device's runtime properties and capabilities."""
    return DeviceInfo(
        ordinal=ordinal,
        name=_text(props.get("name", f"device {ordinal}")),
        compute_capability=(int(props.get("major", 0)), int(props.get("minor", 0))),
        total_memory_bytes=int(props.get("totalGlobalMem", 0)),
        memory_kind=MemoryKind.UNIFIED if caps.unified_memory else MemoryKind.DEVICE,
        capabilities=caps,
    )


def all_devices() -> list[DeviceInfo]:
    """Every visible device; :class:`DeviceError` with CuPy's text when CuPy or a device is missing."""
    cupy = import_cupy()
    count = device_count()
    runtime = cupy.cuda.runtime
    hip = is_hip()
    infos = []
    with check(f"querying {runtime_name()} devices"):
        for ordinal in range(count):
            props = runtime.getDeviceProperties(ordinal)
            caps = capabilities_from(props, hip, _peer_access(runtime, ordinal, count))
            infos.append(device_info_from(props, ordinal, caps))
    return infos
