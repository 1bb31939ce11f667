"""What this machine can run, and the one-call way to get an initialised backend.

:func:`probe` imports each backend computehal knows, asks it for its devices and
capabilities, and records for every backend that cannot run here the reason (the
import error's text, ``"no device"``, ...). It runs on first use and is cached;
importing :mod:`computehal` never probes.

:func:`create_backend` (and its shorthand :func:`auto`) turn a
:class:`~computehal.registry.SelectionRequest` or a name such as ``"opencl"`` or
``"cuda:1"`` into an initialised backend, walking the fallback chain when the first
choice cannot start. What was chosen and why each other backend was skipped is logged
on the ``"computehal"`` logger and returned as data by :func:`last_selection`. The
environment variable ``COMPUTEHAL_BACKEND`` overrides the choice; ``strict=True``
raises :class:`~computehal.UnsupportedError` instead of falling back.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from .backend import ComputeBackend
from .errors import BackendError, InvalidArgumentError, UnsupportedError
from .registry import BackendEntry, BackendKind, BackendRegistry, SelectionRequest
from .types import Capabilities, DeviceInfo, MemoryKind

__all__ = [
    "ENV_VAR",
    "BackendSpec",
    "KNOWN_BACKENDS",
    "ProbeEntry",
    "ProbeReport",
    "Selection",
    "probe",
    "create_backend",
    "auto",
    "last_selection",
    "parse_backend_name",
    "start_backend",
]

#: Environment variable that overrides the backend choice (``"opencl"``, ``"cuda:1"``).
ENV_VAR = "COMPUTEHAL_BACKEND"

logger = logging.getLogger("computehal")


@dataclass(frozen=True)
class BackendSpec:
    """Where the backend class for one or more kinds lives.

    Parameters
    ----------
    kinds : tuple of BackendKind
        The kinds this class can run as. A class serving several kinds (wgpu: Vulkan,
        Metal or WebGPU; CuPy: CUDA or ROCm) reports the one it runs as through its
        ``kind`` attribute or its :meth:`~computehal.ComputeBackend.name`.
    modules : tuple of str
        Candidate module names, tried in order; a module that does not exist at all
        moves on to the next name, any other import failure is the reason the
        backend is unavailable.
    class_name : str
        The backend class inside the module.
    extra : str or None
        The pip extra that installs its dependency (``computehal[opencl]``).
    """

    kinds: tuple[BackendKind, ...]
    modules: tuple[str, ...]
    class_name: str
    extra: str | None = None

    @property
    def target(self) -> str:
        """``module.Class`` of the first candidate module, for display."""
        return f"{self.modules[0]}.{self.class_name}"


#: Priority of a GPU-kind backend that only has the host CPU as its device (PoCL,
#: lavapipe): below :class:`~computehal.CpuBackend`, which is faster on the same cores.
HOST_CPU_PRIORITY = 0

#: Every backend computehal knows, in no particular order (priorities decide).
KNOWN_BACKENDS: tuple[BackendSpec, ...] = (
    BackendSpec((BackendKind.CUDA, BackendKind.ROCM), ("computehal.backends.cuda",), "CudaBackend", "cuda"),
    BackendSpec(
        (BackendKind.METAL, BackendKind.VULKAN, BackendKind.WEBGPU),
        ("computehal.backends.wgpu", "computehal.backends.wgpu_backend"),
        "WgpuBackend",
        "wgpu",
    ),
    BackendSpec((BackendKind.OPENCL,), ("computehal.backends.opencl",), "OpenCLBackend", "opencl"),
    BackendSpec((BackendKind.CPU,), ("computehal.backends.cpu",), "CpuBackend"),
)

#: Names of constructor parameters that take a device ordinal, in order of preference.
_ORDINAL_PARAMETERS = (
    "device",
    "ordinal",
    "device_index",
    "device_ordinal",
    "adapter",
    "adapter_index",
    "index",
)


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
            _cache = _probe_all(KNOWN_BACKENDS)
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

    def unavailable(reason: str, target: str = spec.target) -> list[ProbeEntry]:
        seconds = time.perf_counter() - started
        return [ProbeEntry(kind, False, reason, target, seconds=seconds) for kind in spec.kinds]

    try:
        cls, target = _load_class(spec)
    except Exception as exc:  # noqa: BLE001 - any import failure is a reason, never a crash
        return unavailable(_describe(exc))
    try:
        backend = _instantiate(cls, 0)
    except Exception as exc:  # noqa: BLE001
        return unavailable(f"{target} could not be constructed: {_describe(exc)}", target)
    try:
        devices = tuple(backend.available_devices())
    except Exception as exc:  # noqa: BLE001
        return unavailable(_describe(exc), target)
    try:
        capabilities: Capabilities | None = backend.capabilities()
    except Exception as exc:  # noqa: BLE001
        capabilities = None
        logger.debug("probe: %s.capabilities() failed: %s", target, _describe(exc))
    kind = _kind_of(backend, spec)
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


def _load_class(spec: BackendSpec) -> tuple[type[ComputeBackend], str]:
    """Import the first existing candidate module of ``spec`` and return its class."""
    missing: ModuleNotFoundError | None = None
    for module_name in spec.modules:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise  # the module exists but one of its own imports is missing
            missing = missing or exc  # no such module: try the next candidate name
            continue
        cls = getattr(module, spec.class_name, None)
        if not (isinstance(cls, type) and issubclass(cls, ComputeBackend)):
            raise ImportError(f"{module_name} has no ComputeBackend class {spec.class_name}")
        return cls, f"{module_name}.{spec.class_name}"
    assert missing is not None
    raise missing


def _instantiate(cls: Callable[..., ComputeBackend], ordinal: int) -> ComputeBackend:
    """Construct ``cls`` for device ``ordinal`` (not initialised).

    Device 0 uses the class's own default (its first or preferred device); another
    ordinal is passed through the constructor parameter that takes it (``device``,
    ``adapter``, ...).
    """
    if ordinal == 0:
        return cls()
    try:
        parameters: Collection[str] = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        parameters = ()
    for name in _ORDINAL_PARAMETERS:
        if name in parameters:
            return cls(**{name: ordinal})
    raise UnsupportedError(f"{getattr(cls, '__name__', cls)} has a single device; device {ordinal} asked")


def _kind_of(backend: ComputeBackend, spec: BackendSpec) -> BackendKind:
    """The kind a constructed backend runs as (its ``kind`` attribute, else its name)."""
    candidates: list[object] = []
    declared = getattr(backend, "kind", None)
    if callable(declared):
        try:
            declared = declared()
        except Exception:  # noqa: BLE001
            declared = None
    candidates.append(declared)
    try:
        candidates.append(backend.name())
    except Exception:  # noqa: BLE001
        pass
    for candidate in candidates:
        if isinstance(candidate, BackendKind):
            kind: BackendKind | None = candidate
        elif isinstance(candidate, str):
            kind = BackendKind.from_name(candidate)
        else:
            kind = None
        if kind is not None and kind in spec.kinds:
            return kind
    return spec.kinds[0] if len(spec.kinds) == 1 else _generic_kind(spec)


def _generic_kind(spec: BackendSpec) -> BackendKind:
    # wgpu with an adapter it does not name runs as plain WebGPU; otherwise the first kind.
    return BackendKind.WEBGPU if BackendKind.WEBGPU in spec.kinds else spec.kinds[0]


def _describe(exc: BaseException) -> str:
    """The text of ``exc`` with its type where the text alone would not say what failed."""
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


# ---------------------------------------------------------------------- selection


@dataclass(frozen=True)
class Selection:
    """Which backend :func:`create_backend` chose, and why.

    Attributes
    ----------
    kind : BackendKind
        The kind of the backend that was initialised.
    device : int
        Its device ordinal.
    backend_name : str
        ``backend.name()``.
    requested : str
        What was asked, in words (``"auto"``, ``"opencl:0"``, ``"gpu, fp16"``).
    source : str
        Where the request came from: ``"default"``, ``"argument"`` or ``"COMPUTEHAL_BACKEND"``.
    reason : str
        Why this backend was chosen.
    skipped : tuple of (BackendKind, str)
        Every backend passed over before it, with the reason, in the order considered
        (unavailable backends included).
    fell_back : bool
        True when the chosen backend is not the first choice for the request.
    strict : bool
        Whether strict mode was on.
    """

    kind: BackendKind
    device: int
    backend_name: str
    requested: str
    source: str
    reason: str
    skipped: tuple[tuple[BackendKind, str], ...] = ()
    fell_back: bool = False
    strict: bool = False

    def summary(self) -> str:
        """A multi-line human-readable account of the choice."""
        lines = [f"selected {self.kind.value}:{self.device} ({self.backend_name}): {self.reason}"]
        lines.append(f"requested: {self.requested} (from {self.source}{', strict' if self.strict else ''})")
        for kind, why in self.skipped:
            lines.append(f"  skipped {kind.value}: {why}")
        return "\n".join(lines)


_last: Selection | None = None
_last_lock = threading.Lock()


def last_selection() -> Selection | None:
    """The :class:`Selection` of the most recent successful :func:`create_backend` call."""
    with _last_lock:
        return _last


def parse_backend_name(text: str) -> tuple[BackendKind, int]:
    """Parse ``"opencl"``, ``"cuda:1"`` or an alias (``"cl:0"``) into (kind, device ordinal).

    Raises
    ------
    InvalidArgumentError
        If the name is unknown or the ordinal is not a non-negative integer.
    """
    if not isinstance(text, str):
        raise InvalidArgumentError(f"backend name must be a string, got {type(text).__name__}")
    name, sep, ordinal_text = text.strip().partition(":")
    kind = BackendKind.from_name(name)
    if kind is None:
        known = ", ".join(k.value for k in BackendKind)
        raise InvalidArgumentError(
            f"unknown backend {text!r}; known backends: {known} (optionally ':<device>')"
        )
    if not sep:
        return kind, 0
    ordinal_text = ordinal_text.strip()
    if not ordinal_text.isdigit():
        raise InvalidArgumentError(f"device ordinal in {text!r} must be a non-negative integer")
    return kind, int(ordinal_text)


Request = SelectionRequest | BackendKind | str | None


def create_backend(
    request_or_name: Request = None,
    *,
    strict: bool = False,
    report: ProbeReport | None = None,
) -> ComputeBackend:
    """Return an initialised backend chosen by a request or a name.

    The candidates are the available backends that satisfy the request, best first.
    Each is constructed and initialised in turn until one succeeds; a failure is
    recorded as the reason it was skipped. Without ``strict``, when no candidate
    qualifies or starts, the rest of the fallback chain is tried (the CPU last).
    The decision is logged on the ``"computehal"`` logger (INFO for the choice,
    WARNING when it is a fallback) and kept for :func:`last_selection`.

    Parameters
    ----------
    request_or_name : SelectionRequest, BackendKind, str or None
        ``None`` for the best backend on this machine; a :class:`SelectionRequest`;
        a kind; or a name such as ``"opencl"``, ``"cl"`` or ``"cuda:1"`` (device
        ordinal after the colon).
    strict : bool
        Raise instead of falling back: only the first choice for the request is
        tried (the named kind and device, or the best backend that meets the
        request), and if it is unavailable or fails to start,
        :class:`UnsupportedError` says why.
    report : ProbeReport, optional
        Use this probe report instead of :func:`probe`'s cached one.

    Returns
    -------
    ComputeBackend
        An initialised backend.

    Raises
    ------
    InvalidArgumentError
        If the name (or ``COMPUTEHAL_BACKEND``) names no backend.
    UnsupportedError
        If ``strict`` and the first choice cannot be used, or if no backend at all
        could be initialised.

    Notes
    -----
    The environment variable ``COMPUTEHAL_BACKEND`` (e.g. ``"opencl"``, ``"cuda:1"``),
    when set and not ``"auto"``, replaces ``request_or_name``.
    """
    backend, selection = _select(request_or_name, strict=strict, report=report)
    global _last
    with _last_lock:
        _last = selection
    return backend


def auto(request: Request = None, *, strict: bool = False) -> ComputeBackend:
    """The best initialised backend for this machine.

    The same as :func:`create_backend` (which see for the selection rules, the
    ``COMPUTEHAL_BACKEND`` override and ``strict``); :func:`last_selection` tells which
    backend was chosen and why.

    Examples
    --------
    >>> import computehal
    >>> backend = computehal.auto()  # doctest: +SKIP
    >>> print(computehal.last_selection().summary())  # doctest: +SKIP
    """
    return create_backend(request, strict=strict)


@dataclass
class _Plan:
    request: SelectionRequest
    ordinal: int
    requested: str
    source: str
    skipped: list[tuple[BackendKind, str]] = field(default_factory=list)


def _plan(request_or_name: Request) -> _Plan:
    override = os.environ.get(ENV_VAR, "").strip()
    if override and override.lower() != "auto":
        kind, ordinal = parse_backend_name(override)
        if request_or_name is not None:
            logger.info(
                "%s=%s overrides the requested backend (%s)", ENV_VAR, override, _words(request_or_name)
            )
        return _Plan(SelectionRequest(pin=kind), ordinal, f"{kind.value}:{ordinal}", ENV_VAR)
    if request_or_name is None:
        return _Plan(SelectionRequest(), 0, "auto", "default")
    if isinstance(request_or_name, SelectionRequest):
        return _Plan(request_or_name, 0, request_or_name.describe(), "argument")
    if isinstance(request_or_name, BackendKind):
        return _Plan(SelectionRequest(pin=request_or_name), 0, f"{request_or_name.value}:0", "argument")
    if isinstance(request_or_name, str):
        kind, ordinal = parse_backend_name(request_or_name)
        return _Plan(SelectionRequest(pin=kind), ordinal, f"{kind.value}:{ordinal}", "argument")
    raise InvalidArgumentError(
        "create_backend() takes a SelectionRequest, a BackendKind, a name such as 'cuda:1' or None, "
        f"got {type(request_or_name).__name__}"
    )


def _words(request_or_name: Request) -> str:
    if isinstance(request_or_name, SelectionRequest):
        return request_or_name.describe()
    if isinstance(request_or_name, BackendKind):
        return request_or_name.value
    return str(request_or_name)


def _select(
    request_or_name: Request, *, strict: bool, report: ProbeReport | None
) -> tuple[ComputeBackend, Selection]:
    plan = _plan(request_or_name)
    found = report if report is not None else probe()
    if plan.request.pin is not None:
        pinned = _resolve_generic(plan.request.pin, found)
        if pinned is not plan.request.pin:
            plan.request = replace(plan.request, pin=pinned)
            plan.requested += f" (wgpu runs as {pinned.value})"
    request = plan.request

    qualifying: list[ProbeEntry] = []
    for entry in found.entries:
        if not entry.available:
            if request.pin is None or request.pin is entry.kind:
                plan.skipped.append((entry.kind, f"unavailable: {entry.reason}"))
            continue
        capabilities = entry.capabilities if entry.capabilities is not None else Capabilities.cpu()
        missing = request.unmet(entry.kind, capabilities)
        if missing:
            if request.pin is None or request.pin is entry.kind:
                plan.skipped.append((entry.kind, "does not meet the request: " + ", ".join(missing)))
            continue
        qualifying.append(entry)

    candidates = qualifying[:1] if strict else list(qualifying)
    if not strict:
        fallback = found.registry().fallback_chain()
        chosen = {entry.kind for entry in candidates}
        candidates.extend(found.entry(kind) for kind in fallback if kind not in chosen)

    first_choice = qualifying[0].kind if qualifying else None
    for position, entry in enumerate(candidates):
        ordinal = plan.ordinal if entry.kind is request.pin else 0
        if entry.available and entry.devices and ordinal >= len(entry.devices):
            why = f"device {ordinal} not present ({len(entry.devices)} device(s))"
            plan.skipped.append((entry.kind, why))
            logger.info("skipped %s: %s", entry.kind.value, why)
            continue
        try:
            backend = _start(entry, ordinal)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot start is skipped, with the reason
            why = f"failed to start: {_describe(exc)}"
            plan.skipped.append((entry.kind, why))
            logger.info("skipped %s: %s", entry.kind.value, why)
            continue
        fell_back = entry.kind is not first_choice or position > 0
        reason = _reason(entry, plan, fell_back, found)
        selection = Selection(
            kind=entry.kind,
            device=ordinal,
            backend_name=_safe_name(backend),
            requested=plan.requested,
            source=plan.source,
            reason=reason,
            skipped=tuple(_dedupe(plan.skipped)),
            fell_back=fell_back,
            strict=strict,
        )
        level = logging.WARNING if fell_back else logging.INFO
        logger.log(level, "%s", selection.summary())
        return backend, selection

    detail = "; ".join(f"{kind.value}: {why}" for kind, why in _dedupe(plan.skipped)) or "nothing to try"
    if strict:
        raise UnsupportedError(f"no backend for {plan.requested} (strict, from {plan.source}): {detail}")
    raise UnsupportedError(f"no backend could be started for {plan.requested}: {detail}")


def _resolve_generic(kind: BackendKind, report: ProbeReport) -> BackendKind:
    """``webgpu`` (alias ``wgpu``) names the wgpu backend whatever adapter it runs on.

    When the WebGPU entry is unavailable only because wgpu runs as Vulkan or Metal here,
    the request means that kind. Every other kind is taken literally.
    """
    if kind is not BackendKind.WEBGPU:
        return kind
    entry = report.entry(kind)
    if not entry.available and entry.runs_as is not None and report.entry(entry.runs_as).available:
        logger.info("webgpu: wgpu runs as %s on this machine; using it", entry.runs_as.value)
        return entry.runs_as
    return kind


def start_backend(kind_or_name: BackendKind | str, *, report: ProbeReport | None = None) -> ComputeBackend:
    """Construct and initialise exactly the named backend: no fallback, no environment override.

    Parameters
    ----------
    kind_or_name : BackendKind or str
        A kind, or a name with an optional device ordinal (``"opencl"``, ``"cuda:1"``).
    report : ProbeReport, optional
        Use this probe report instead of :func:`probe`'s cached one.

    Returns
    -------
    ComputeBackend
        The initialised backend.

    Raises
    ------
    InvalidArgumentError
        If the name is unknown.
    UnsupportedError
        If the backend is unavailable here, the device does not exist, or it fails to
        start; the message says why.
    """
    if isinstance(kind_or_name, BackendKind):
        kind, ordinal = kind_or_name, 0
    else:
        kind, ordinal = parse_backend_name(kind_or_name)
    found = report if report is not None else probe()
    kind = _resolve_generic(kind, found)
    entry = found.entry(kind)
    if not entry.available:
        raise UnsupportedError(f"{kind.value} is unavailable: {entry.reason}")
    if ordinal >= len(entry.devices):
        raise UnsupportedError(f"{kind.value} has no device {ordinal} ({len(entry.devices)} device(s))")
    try:
        return _start(entry, ordinal)
    except UnsupportedError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported as the reason
        raise UnsupportedError(f"{kind.value}:{ordinal} failed to start: {_describe(exc)}") from exc


def _start(entry: ProbeEntry, ordinal: int) -> ComputeBackend:
    """Construct and initialise the backend of ``entry`` on device ``ordinal``."""
    spec = next((s for s in KNOWN_BACKENDS if entry.kind in s.kinds), None)
    if spec is None:
        raise UnsupportedError(entry.reason or f"computehal has no {entry.kind.value} backend")
    if not entry.available:
        raise UnsupportedError(entry.reason)
    cls, _ = _load_class(spec)
    backend = _instantiate(cls, ordinal)
    backend.init()
    return backend


def _reason(entry: ProbeEntry, plan: _Plan, fell_back: bool, found: ProbeReport) -> str:
    if plan.request.pin is entry.kind:
        via = f"set by {ENV_VAR}" if plan.source == ENV_VAR else "asked for by name"
        return f"{entry.kind.value} was {via}"
    if fell_back:
        return f"fallback: the best backend that started ({entry.kind.value}, priority {entry.priority})"
    if plan.source == "default":
        text = f"highest-priority available backend (priority {entry.priority})"
        if entry.kind is BackendKind.CPU:
            emulated = [e.kind.value for e in found.entries if e.available and e.on_host_cpu]
            if emulated:
                text += (
                    f"; {', '.join(emulated)} rank below it because their only device is this "
                    "host's CPU (name one to use it anyway)"
                )
        return text
    return f"highest-priority backend meeting the request ({plan.requested}; priority {entry.priority})"


def _safe_name(backend: ComputeBackend) -> str:
    try:
        return str(backend.name())
    except Exception:  # noqa: BLE001
        return type(backend).__name__


def _dedupe(items: list[tuple[BackendKind, str]]) -> list[tuple[BackendKind, str]]:
    seen: set[tuple[BackendKind, str]] = set()
    unique = []
    for item in items:
        if item not in seen:
            seen.add(item)
            unique.append(item)
    return unique
