"""Choosing a backend: :func:`create_backend` and its shorthand :func:`auto`.

They turn a :class:`~computehal.registry.SelectionRequest` or a name such as
``"opencl"`` or ``"cuda:1"`` into an initialised backend. There is one selection
policy, the registry's: the candidates are
:meth:`BackendRegistry.candidates <computehal.registry.BackendRegistry.candidates>`
of the probe report's registry, best first, and without ``strict`` a choice that is
unavailable or cannot start falls back along
:meth:`BackendRegistry.fallback_chain <computehal.registry.BackendRegistry.fallback_chain>`,
which is :func:`auto`'s own order. A named backend that cannot run therefore falls
back to what :func:`auto` would choose, with a warning.

What was chosen and why each other backend was skipped is logged on the
``"computehal"`` logger and returned as data by :func:`last_selection`. The environment
variable ``COMPUTEHAL_BACKEND`` overrides the choice; ``strict=True`` raises
:class:`~computehal.UnsupportedError` instead of falling back.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field, replace

from .backend import ComputeBackend
from .backends import spec_for_kind
from .errors import InvalidArgumentError, UnsupportedError
from .probe import ProbeEntry, ProbeReport, describe_error, probe
from .registry import BackendKind, SelectionRequest

__all__ = [
    "ENV_VAR",
    "Selection",
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
    if not (ordinal_text.isascii() and ordinal_text.isdigit()):  # "²".isdigit() is True
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

    The candidates are the available backends that satisfy the request, best first
    (:meth:`BackendRegistry.candidates <computehal.registry.BackendRegistry.candidates>`).
    Each is constructed and initialised in turn until one succeeds; a failure is
    recorded as the reason it was skipped. Without ``strict``, when no candidate
    qualifies or starts (a named backend that is unavailable, say), the rest of the
    registry's fallback chain is tried: :func:`auto`'s own order, so the fallback is
    what :func:`auto` would choose. The decision is logged on the ``"computehal"``
    logger (INFO for the choice, WARNING when it is a fallback) and kept for
    :func:`last_selection`.

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
        try:
            kind, ordinal = parse_backend_name(override)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{ENV_VAR}={override!r}: {exc.msg}") from None
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
    candidates, first_choice = _candidates(plan, found, strict)
    for position, kind in enumerate(candidates):
        entry = found.entry(kind)
        ordinal = plan.ordinal if kind is plan.request.pin else 0
        backend = _try_start(entry, ordinal, plan)
        if backend is None:
            continue
        fell_back = kind is not first_choice or position > 0
        selection = Selection(
            kind=kind,
            device=ordinal,
            backend_name=_safe_name(backend),
            requested=plan.requested,
            source=plan.source,
            reason=_reason(entry, plan, fell_back, found),
            skipped=tuple(_dedupe(plan.skipped)),
            fell_back=fell_back,
            strict=strict,
        )
        logger.log(logging.WARNING if fell_back else logging.INFO, "%s", selection.summary())
        return backend, selection
    detail = "; ".join(f"{kind.value}: {why}" for kind, why in _dedupe(plan.skipped)) or "nothing to try"
    if strict:
        raise UnsupportedError(f"no backend for {plan.requested} (strict, from {plan.source}): {detail}")
    raise UnsupportedError(f"no backend could be started for {plan.requested}: {detail}")


def _candidates(
    plan: _Plan, found: ProbeReport, strict: bool
) -> tuple[list[BackendKind], BackendKind | None]:
    """The kinds to try in order, and the first choice for the request (None if nothing qualifies).

    The registry decides: the kinds that qualify, best first, then (without ``strict``)
    the rest of its fallback chain, which is :func:`auto`'s own order. Why each
    rejected kind did not qualify is recorded in ``plan.skipped``.
    """
    registry = found.registry()
    request = plan.request
    qualifying, rejected = registry.candidates(request)
    for kind, missing in rejected:
        if request.pin is not None and kind is not request.pin:
            continue
        if "unavailable" in missing:
            plan.skipped.append((kind, f"unavailable: {found.entry(kind).reason}"))
        else:
            plan.skipped.append((kind, "does not meet the request: " + ", ".join(missing)))
    candidates = qualifying[:1] if strict else list(qualifying)
    if not strict:
        candidates.extend(kind for kind in registry.fallback_chain() if kind not in candidates)
    return candidates, qualifying[0] if qualifying else None


def _try_start(entry: ProbeEntry, ordinal: int, plan: _Plan) -> ComputeBackend | None:
    """The initialised backend of ``entry``, or None with the reason recorded in ``plan.skipped``."""
    if entry.available and entry.devices and ordinal >= len(entry.devices):
        why = f"device {ordinal} not present ({len(entry.devices)} device(s))"
    else:
        try:
            return _start(entry, ordinal)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot start is skipped, with the reason
            why = f"failed to start: {describe_error(exc)}"
    plan.skipped.append((entry.kind, why))
    logger.info("skipped %s: %s", entry.kind.value, why)
    return None


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
        raise UnsupportedError(f"{kind.value}:{ordinal} failed to start: {describe_error(exc)}") from exc


def _start(entry: ProbeEntry, ordinal: int) -> ComputeBackend:
    """Construct and initialise the backend of ``entry`` on device ``ordinal``."""
    if not entry.available:
        raise UnsupportedError(entry.reason or f"computehal has no {entry.kind.value} backend")
    spec = spec_for_kind(entry.kind)
    if spec is None:
        raise UnsupportedError(f"computehal has no {entry.kind.value} backend")
    backend = spec.create(ordinal)
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
