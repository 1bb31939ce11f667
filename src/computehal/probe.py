"""What this machine can run.

:func:`probe` goes through the backend table (:data:`computehal.backends.BACKENDS`):
it imports each backend, constructs it on its default device (without ``init``), asks
it for its devices and capabilities, and records for every backend that cannot run
here the reason (the import error's text, ``"no device"``, ...). It runs on first use
and is cached; importing :mod:`computehal` never probes. A :class:`ProbeReport` turns
into a :class:`~computehal.registry.BackendRegistry`, whose policy
:mod:`computehal.selection` follows to choose a backend.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from . import backends as _backends
from .backends import BackendSpec
from .errors import BackendError, InvalidArgumentError
from .registry import BackendEntry, BackendKind, BackendRegistry
from .types import Capabilities, DeviceInfo, MemoryKind

__all__ = ["HOST_CPU_PRIORITY", "ProbeEntry", "ProbeReport", "probe", "describe_error"]

logger = logging.getLogger("computehal")


#: Priority of a GPU-kind backend that only has the host CPU as its device (PoCL,
#: lavapipe): below :class:`~computehal.CpuBackend`, which is faster on the same cores.
HOST_CPU_PRIORITY = 0


# ---------------------------------------------------------------------- probe report


@dataclass(frozen=True)
class ProbeEntry:
    """What the probe found for one backend kind.

    Attributes
    ----------
    kind : BackendKind
    available : bool
        The module imports, the backend constructs and it reports at least one device.
    reason : str
        Why the backend is unavailable (the exception text, ``"no device"``, ...);
        empty when available.
    target : str
        ``module.Class`` of the backend implementation (empty when computehal has none).
    devices : tuple of DeviceInfo
        The devices the backend reported.
    capabilities : Capabilities or None
        The backend's capabilities (None when it could not be asked).
    seconds : float
        How long probing this backend took.
    runs_as : BackendKind or None
        For a kind whose implementation serves several kinds and runs here as another
        one (``webgpu`` when wgpu's adapter is Vulkan), that other kind.
    """

    kind: BackendKind
    available: bool
    reason: str = ""
    target: str = ""
    devices: tuple[DeviceInfo, ...] = ()
    capabilities: Capabilities | None = None
    seconds: float = 0.0
    runs_as: BackendKind | None = None

    @property
    def on_host_cpu(self) -> bool:
        """True for a GPU-kind backend whose every device is this host's CPU.

        PoCL (OpenCL) and lavapipe (Vulkan) run kernels on the host processor and
        report host memory; :class:`~computehal.CpuBackend` is faster there, so such an
        entry ranks below it (see :attr:`priority`). Asked for by name, it still runs.
        """
        return (
            self.kind is not BackendKind.CPU
            and bool(self.devices)
            and all(device.memory_kind is MemoryKind.HOST for device in self.devices)
        )

    @property
    def priority(self) -> int:
        """The kind's default priority, or 0 (below the CPU's 1) when :attr:`on_host_cpu`."""
        return HOST_CPU_PRIORITY if self.on_host_cpu else self.kind.default_priority()

    def registry_entry(self) -> BackendEntry:
        """This result as a :class:`BackendEntry` (the CPU profile when capabilities are unknown)."""
        return BackendEntry(
            self.kind,
            self.available,
            capabilities=self.capabilities if self.capabilities is not None else Capabilities.cpu(),
        ).with_priority(self.priority)


@dataclass(frozen=True)
class ProbeReport:
    """The result of :func:`probe`: one :class:`ProbeEntry` per :class:`BackendKind`.

    Entries are ordered by priority, highest first.
    """

    entries: tuple[ProbeEntry, ...]
    seconds: float = 0.0

    def entry(self, kind: BackendKind | str) -> ProbeEntry:
        """The entry of ``kind`` (a name such as ``"cl"`` is accepted)."""
        wanted = _kind_or_raise(kind)
        for entry in self.entries:
            if entry.kind is wanted:
                return entry
        raise KeyError(wanted)

    def available_kinds(self) -> list[BackendKind]:
        """The kinds that can run here, highest priority first."""
        return [entry.kind for entry in self.entries if entry.available]

    def unavailable(self) -> dict[BackendKind, str]:
        """Every kind that cannot run here, with the reason."""
        return {entry.kind: entry.reason for entry in self.entries if not entry.available}

    def registry(self) -> BackendRegistry:
        """A fresh :class:`BackendRegistry` filled from this report."""
        return BackendRegistry([entry.registry_entry() for entry in self.entries])


_cache: ProbeReport | None = None
_cache_lock = threading.Lock()


def probe(refresh: bool = False) -> ProbeReport:
    """Find out which backends can run on this machine (cached after the first call).

    For every backend computehal knows this imports its module, constructs it (without
    ``init``), and asks for ``available_devices()`` and ``capabilities()``. Any failure
    is caught and becomes the entry's reason; nothing here raises.

    Parameters
    ----------
    refresh : bool
        Probe again instead of returning the cached report.

    Returns
    -------
    ProbeReport
    """
    global _cache
    with _cache_lock:
        if _cache is None or refresh:
            _cache = _probe_all(_backends.BACKENDS)
        return _cache


def _probe_all(specs: Sequence[BackendSpec]) -> ProbeReport:
    started = time.perf_counter()
    found: dict[BackendKind, ProbeEntry] = {}
    for spec in specs:
        for entry in _probe_spec(spec):
            found[entry.kind] = entry
    for kind in BackendKind:
        if kind not in found:
            found[kind] = ProbeEntry(kind, False, reason=f"computehal has no {kind.value} backend")
    ordered = sorted(found.values(), key=lambda entry: -entry.priority)
    report = ProbeReport(tuple(ordered), seconds=time.perf_counter() - started)
    for entry in report.entries:
        if entry.available:
            logger.debug("probe: %s available (%d device(s))", entry.kind.value, len(entry.devices))
        else:
            logger.debug("probe: %s unavailable: %s", entry.kind.value, entry.reason)
    return report


def _probe_spec(spec: BackendSpec) -> list[ProbeEntry]:
    started = time.perf_counter()
    target = spec.target

    def unavailable(reason: str) -> list[ProbeEntry]:
        seconds = time.perf_counter() - started
        return [ProbeEntry(kind, False, reason, target, seconds=seconds) for kind in spec.kinds]

    try:
        cls = spec.load()
    except Exception as exc:  # noqa: BLE001 - any import failure is a reason, never a crash
        return unavailable(describe_error(exc))
    try:
        backend = cls()
    except Exception as exc:  # noqa: BLE001
        return unavailable(f"{target} could not be constructed: {describe_error(exc)}")
    try:
        devices = tuple(backend.available_devices())
    except Exception as exc:  # noqa: BLE001
        return unavailable(describe_error(exc))
    try:
        capabilities: Capabilities | None = backend.capabilities()
    except Exception as exc:  # noqa: BLE001
        capabilities = None
        logger.debug("probe: %s.capabilities() failed: %s", target, describe_error(exc))
    kind = spec.kind_of(backend)
    seconds = time.perf_counter() - started
    entries = []
    for candidate in spec.kinds:
        if candidate is not kind:
            reason = f"{spec.class_name} runs as {kind.value} on this machine"
            entries.append(ProbeEntry(candidate, False, reason, target, seconds=seconds, runs_as=kind))
        elif not devices:
            entries.append(ProbeEntry(kind, False, "no device", target, (), capabilities, seconds))
        else:
            entries.append(ProbeEntry(kind, True, "", target, devices, capabilities, seconds))
    return entries


def describe_error(exc: BaseException) -> str:
    """The text of ``exc``, with its type where the text alone would not say what failed."""
    text = str(exc).strip()
    if isinstance(exc, BackendError) and text:
        return text  # already "device error: ...", "unsupported operation: ..."
    name = type(exc).__name__
    if not text:
        return name
    if isinstance(exc, ImportError | OSError) or name not in text:
        return f"{name}: {text}"
    return text


def _kind_or_raise(kind: BackendKind | str) -> BackendKind:
    if isinstance(kind, BackendKind):
        return kind
    found = BackendKind.from_name(kind)
    if found is None:
        raise InvalidArgumentError(
            f"unknown backend {kind!r}; known: {', '.join(k.value for k in BackendKind)}"
        )
    return found
