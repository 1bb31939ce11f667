"""Backend kinds, selection requests and the registry that picks a backend.

The registry is pure bookkeeping: it knows which kinds of backend exist, which are
available and what each can do, and answers "which one should run this?". It never
imports a backend or touches a device; :mod:`computehal.probe` fills a registry from
what this machine really has.

Selection rules
---------------
* Every :class:`BackendKind` has a default priority (CUDA 100 ... CPU 1); higher wins.
* :meth:`BackendRegistry.select` returns the highest-priority *available* entry that
  meets every requirement of a :class:`SelectionRequest`; ``pin`` restricts the
  candidates to one kind. When nothing qualifies it raises
  :class:`~computehal.UnsupportedError` stating what was asked and why each
  registered backend did not qualify.
* :meth:`BackendRegistry.candidates` sorts the entries into those that qualify for a
  request (in the order they are tried) and those that do not, with the reasons;
  ``select`` is its first answer.
* :meth:`BackendRegistry.fallback_chain` is the one order every fallback follows:
  the available kinds by priority (the CPU at its own), with the CPU added last when
  it is not available (it is the fallback of last resort).
* :meth:`BackendRegistry.route` sends matmul, convolution and attention to a
  tensor-core backend when one is available, everything else to the best backend.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from .errors import UnsupportedError
from .types import Capabilities, OpClass, ValueEnum, coerce_enum

__all__ = ["BackendKind", "SelectionRequest", "BackendEntry", "BackendRegistry"]


class BackendKind(ValueEnum):
    """The kinds of compute backend, with the priority used to choose between them."""

    CUDA = "cuda"
    ROCM = "rocm"
    METAL = "metal"
    LEVEL_ZERO = "level_zero"
    OPENCL = "opencl"
    VULKAN = "vulkan"
    WEBGPU = "webgpu"
    CPU = "cpu"

    def default_priority(self) -> int:
        """The priority of this kind when an entry does not set its own (higher wins).

        CUDA 100, ROCm 90, Metal 85, Level Zero 80, OpenCL 70, Vulkan 60, WebGPU 50, CPU 1.
        """
        return _PRIORITY[self]

    def is_gpu(self) -> bool:
        """True for every kind except :attr:`CPU`."""
        return self is not BackendKind.CPU

    @classmethod
    def from_name(cls, name: str) -> BackendKind | None:
        """Parse a backend name, tolerant of case, surrounding space and common aliases.

        Parameters
        ----------
        name : str
            A kind's value (``"cuda"``, ``"level_zero"``, ...) or an alias: ``nvidia``;
            ``hip``, ``amd``; ``levelzero``, ``l0``, ``intel``; ``cl``; ``vk``; ``mtl``,
            ``apple``; ``wgpu``; ``host``, ``reference``. ``-`` and ``_`` are
            interchangeable (``"level-zero"``).

        Returns
        -------
        BackendKind or None
            The kind, or ``None`` when the name is unknown.
        """
        if not isinstance(name, str):
            return None
        key = name.strip().lower().replace("-", "_")
        try:
            return cls(key)
        except ValueError:
            return _ALIASES.get(key)


_PRIORITY: dict[BackendKind, int] = {
    BackendKind.CUDA: 100,
    BackendKind.ROCM: 90,
    BackendKind.METAL: 85,
    BackendKind.LEVEL_ZERO: 80,
    BackendKind.OPENCL: 70,
    BackendKind.VULKAN: 60,
    BackendKind.WEBGPU: 50,
    BackendKind.CPU: 1,
}

_ALIASES: dict[str, BackendKind] = {
    "nvidia": BackendKind.CUDA,
    "hip": BackendKind.ROCM,
    "amd": BackendKind.ROCM,
    "levelzero": BackendKind.LEVEL_ZERO,
    "l0": BackendKind.LEVEL_ZERO,
    "intel": BackendKind.LEVEL_ZERO,
    "cl": BackendKind.OPENCL,
    "vk": BackendKind.VULKAN,
    "mtl": BackendKind.METAL,
    "apple": BackendKind.METAL,
    "wgpu": BackendKind.WEBGPU,
    "host": BackendKind.CPU,
    "reference": BackendKind.CPU,
}


def _as_kind(value: BackendKind | str, argument: str) -> BackendKind:
    """``value`` as a :class:`BackendKind`, accepting any name :meth:`BackendKind.from_name` knows."""
    if isinstance(value, BackendKind):
        return value
    kind = BackendKind.from_name(value) if isinstance(value, str) else None
    if kind is None:
        return coerce_enum(BackendKind, value, argument)  # raises InvalidArgumentError
    return kind


@dataclass(frozen=True)
class SelectionRequest:
    """What a caller needs from a backend; every field defaults to "don't care".

    Parameters
    ----------
    require_gpu : bool
        Only GPU kinds qualify (everything but :attr:`BackendKind.CPU`).
    require_fp16, require_bf16, require_fp8 : bool
        The backend's capabilities must report the 16-bit / 8-bit float support.
    require_tensor_cores : bool
        The backend must have matrix (tensor-core) units.
    require_unified_memory : bool
        Host and device must share one address space.
    require_peer_access : bool
        Device-to-device peer access must be possible.
    pin : BackendKind or None
        Only this kind qualifies (a name such as ``"opencl"`` is accepted too).
    """

    require_gpu: bool = False
    require_fp16: bool = False
    require_bf16: bool = False
    require_fp8: bool = False
    require_tensor_cores: bool = False
    require_unified_memory: bool = False
    require_peer_access: bool = False
    pin: BackendKind | None = None

    def __post_init__(self) -> None:
        if self.pin is not None and not isinstance(self.pin, BackendKind):
            object.__setattr__(self, "pin", _as_kind(self.pin, "pin"))

    def describe(self) -> str:
        """A short human-readable statement of the request, e.g. ``"gpu, fp16, pin=cuda"``."""
        parts = [label for label, wanted in self._flags() if wanted]
        if self.pin is not None:
            parts.append(f"pin={self.pin.value}")
        return ", ".join(parts) if parts else "any backend"

    def unmet(self, kind: BackendKind, capabilities: Capabilities) -> list[str]:
        """The requirements that a backend of ``kind`` with ``capabilities`` does not meet.

        Returns
        -------
        list of str
            One phrase per unmet requirement (``"not a GPU"``, ``"no fp16"``, ...);
            empty when the backend qualifies.
        """
        missing: list[str] = []
        if self.pin is not None and kind is not self.pin:
            missing.append(f"not {self.pin.value} (pinned)")
        if self.require_gpu and not kind.is_gpu():
            missing.append("not a GPU")
        checks = (
            (self.require_fp16, capabilities.supports_fp16, "no fp16"),
            (self.require_bf16, capabilities.supports_bf16, "no bf16"),
            (self.require_fp8, capabilities.supports_fp8, "no fp8"),
            (self.require_tensor_cores, capabilities.tensor_cores, "no tensor cores"),
            (self.require_unified_memory, capabilities.unified_memory, "no unified memory"),
            (self.require_peer_access, capabilities.peer_access, "no peer access"),
        )
        missing.extend(text for wanted, has, text in checks if wanted and not has)
        return missing

    def _flags(self) -> tuple[tuple[str, bool], ...]:
        return (
            ("gpu", self.require_gpu),
            ("fp16", self.require_fp16),
            ("bf16", self.require_bf16),
            ("fp8", self.require_fp8),
            ("tensor cores", self.require_tensor_cores),
            ("unified memory", self.require_unified_memory),
            ("peer access", self.require_peer_access),
        )


#: Marker default of :attr:`BackendEntry.priority`: "use the kind's default priority".
_KIND_PRIORITY = -(2**63)


@dataclass(frozen=True)
class BackendEntry:
    """One backend kind as the registry sees it.

    Parameters
    ----------
    kind : BackendKind
        Which backend.
    available : bool
        Whether it can be used on this machine.
    priority : int, optional
        Defaults to ``kind.default_priority()``.
    capabilities : Capabilities, optional
        Defaults to the CPU profile, :meth:`Capabilities.cpu`.
    """

    kind: BackendKind
    available: bool
    priority: int = _KIND_PRIORITY
    capabilities: Capabilities = field(default_factory=Capabilities.cpu)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, BackendKind):
            object.__setattr__(self, "kind", _as_kind(self.kind, "kind"))
        if self.priority == _KIND_PRIORITY:
            object.__setattr__(self, "priority", self.kind.default_priority())

    def with_priority(self, priority: int) -> BackendEntry:
        """A copy of this entry with ``priority`` instead of the current one."""
        return replace(self, priority=int(priority))

    def with_capabilities(self, capabilities: Capabilities) -> BackendEntry:
        """A copy of this entry with ``capabilities`` instead of the current ones."""
        return replace(self, capabilities=capabilities)


class BackendRegistry:
    """An ordered set of :class:`BackendEntry`, at most one per kind. Thread-safe.

    Parameters
    ----------
    entries : iterable of BackendEntry, optional
        Registered in order (a later entry of the same kind replaces an earlier one).
    """

    def __init__(self, entries: tuple[BackendEntry, ...] | list[BackendEntry] = ()) -> None:
        self._entries: list[BackendEntry] = []
        self._lock = threading.Lock()
        for entry in entries:
            self.register(entry)

    # ------------------------------------------------------------------ contents

    def register(self, entry: BackendEntry) -> None:
        """Add ``entry``; an entry of the same kind already present is replaced in place.

        Replacing keeps the registration position, so ties in priority keep resolving
        the same way.
        """
        if not isinstance(entry, BackendEntry):
            raise TypeError(f"register() takes a BackendEntry, got {type(entry).__name__}")
        with self._lock:
            for index, existing in enumerate(self._entries):
                if existing.kind is entry.kind:
                    self._entries[index] = entry
                    return
            self._entries.append(entry)

    def get(self, kind: BackendKind | str) -> BackendEntry | None:
        """The entry of ``kind`` (a name is accepted), or ``None`` if none is registered."""
        wanted = _as_kind(kind, "kind")
        with self._lock:
            for entry in self._entries:
                if entry.kind is wanted:
                    return entry
        return None

    def set_available(self, kind: BackendKind | str, available: bool) -> None:
        """Mark ``kind`` available or not; registers a default entry if it is missing."""
        self._update(_as_kind(kind, "kind"), available=bool(available))

    def set_capabilities(self, kind: BackendKind | str, capabilities: Capabilities) -> None:
        """Replace the capabilities of ``kind``; registers an unavailable entry if it is missing."""
        self._update(_as_kind(kind, "kind"), capabilities=capabilities)

    def entries(self) -> list[BackendEntry]:
        """Every registered entry, in registration order."""
        with self._lock:
            return list(self._entries)

    def available_kinds(self) -> list[BackendKind]:
        """The available kinds, highest priority first."""
        return [entry.kind for entry in self._ranked() if entry.available]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __iter__(self) -> Iterator[BackendEntry]:
        return iter(self.entries())

    def __contains__(self, kind: object) -> bool:
        if isinstance(kind, BackendKind | str):
            found = BackendKind.from_name(kind) if isinstance(kind, str) else kind
            return found is not None and self.get(found) is not None
        return False

    def __repr__(self) -> str:
        inner = ", ".join(
            f"{e.kind.value}{'' if e.available else ' (unavailable)'}:{e.priority}" for e in self._ranked()
        )
        return f"BackendRegistry([{inner}])"

    # ------------------------------------------------------------------ selection

    def candidates(
        self, request: SelectionRequest | None = None
    ) -> tuple[list[BackendKind], list[tuple[BackendKind, list[str]]]]:
        """Every registered kind sorted into those that qualify for ``request`` and those that do not.

        Parameters
        ----------
        request : SelectionRequest, optional
            Defaults to no requirement.

        Returns
        -------
        qualifying : list of BackendKind
            The available kinds meeting every requirement, highest priority first: the
            order in which :func:`computehal.create_backend` tries them.
        rejected : list of (BackendKind, list of str)
            Every other registered kind, by priority, with the phrases of
            :meth:`SelectionRequest.unmet` (``"unavailable"`` first when it is).
        """
        wanted = request if request is not None else SelectionRequest()
        qualifying: list[BackendKind] = []
        rejected: list[tuple[BackendKind, list[str]]] = []
        for entry in self._ranked():
            missing = wanted.unmet(entry.kind, entry.capabilities)
            if not entry.available:
                missing.insert(0, "unavailable")
            if missing:
                rejected.append((entry.kind, missing))
            else:
                qualifying.append(entry.kind)
        return qualifying, rejected

    def select(self, request: SelectionRequest | None = None) -> BackendKind:
        """The highest-priority available kind that meets every requirement of ``request``.

        Parameters
        ----------
        request : SelectionRequest, optional
            Defaults to no requirement.

        Returns
        -------
        BackendKind
            The first of :meth:`candidates`.

        Raises
        ------
        UnsupportedError
            If no registered, available entry qualifies. The message states the request
            and, for each registered backend, why it did not qualify.
        """
        qualifying, rejected = self.candidates(request)
        if qualifying:
            return qualifying[0]
        wanted = request if request is not None else SelectionRequest()
        detail = "; ".join(f"{kind.value}: {', '.join(missing)}" for kind, missing in rejected)
        detail = detail or "no backend is registered"
        raise UnsupportedError(f"no backend satisfies the request ({wanted.describe()}): {detail}")

    def select_best(self) -> BackendKind:
        """The kind :func:`computehal.auto` chooses with no requirement: ``fallback_chain()[0]``.

        The highest-priority available kind, or the CPU when nothing is available. The
        probe ranks PoCL / lavapipe, whose only device is the host CPU, at 0, below the
        CPU's 1, so on a machine without a real GPU this is the CPU.
        """
        return self.fallback_chain()[0]

    def fallback_chain(self) -> list[BackendKind]:
        """The order in which :func:`computehal.auto` tries backends, and every fallback follows.

        The available kinds by priority, highest first, the CPU at its own priority
        (so backends ranked below it, such as PoCL on the host, come after it). An
        unavailable or unregistered CPU still ends the chain: it is the fallback of
        last resort.
        """
        chain = self.available_kinds()
        if BackendKind.CPU not in chain:
            chain.append(BackendKind.CPU)
        return chain

    def route(self, op_class: OpClass | str, *, dtype: object = None) -> BackendKind:
        """The kind that should run operations of ``op_class``.

        Matmul, convolution and attention go to the highest-priority available backend
        with tensor cores when there is one; otherwise, and for every other class, to
        the first of :meth:`fallback_chain` (that takes ``dtype``).

        Parameters
        ----------
        op_class : OpClass or str
            The family of operation.
        dtype : dtype-like, optional
            computehal extension: with a float64 dtype only backends whose capabilities
            report ``supports_fp64`` are considered (WGSL has no float64); the CPU
            always does.
        """
        family = coerce_enum(OpClass, op_class, "op_class")
        needs_fp64 = _is_float64(dtype)
        ranked = [
            entry
            for entry in self._ranked()
            if entry.available and (not needs_fp64 or entry.capabilities.supports_fp64)
        ]
        if family in (OpClass.MATMUL, OpClass.CONVOLUTION, OpClass.ATTENTION):
            for entry in ranked:
                if entry.capabilities.tensor_cores:
                    return entry.kind
        return ranked[0].kind if ranked else BackendKind.CPU

    # ------------------------------------------------------------------ internals

    def _ranked(self) -> list[BackendEntry]:
        """Entries by priority, highest first; ties keep registration order."""
        with self._lock:
            ordered = list(self._entries)
        return sorted(ordered, key=lambda entry: -entry.priority)

    def _update(
        self, kind: BackendKind, *, available: bool | None = None, capabilities: Capabilities | None = None
    ) -> None:
        with self._lock:
            for index, entry in enumerate(self._entries):
                if entry.kind is kind:
                    if available is not None:
                        entry = replace(entry, available=available)
                    if capabilities is not None:
                        entry = replace(entry, capabilities=capabilities)
                    self._entries[index] = entry
                    return
            self._entries.append(
                BackendEntry(
                    kind,
                    available=bool(available),
                    capabilities=capabilities if capabilities is not None else Capabilities.cpu(),
                )
            )


def _is_float64(dtype: object) -> bool:
    if dtype is None:
        return False
    import numpy as np

    try:
        return bool(np.dtype(dtype) == np.float64)  # type: ignore[call-overload]
    except TypeError:
        return False
