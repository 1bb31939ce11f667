"""Concrete backends, one module each, and the one table that lists them.

:data:`BACKENDS` is read by the probe (:func:`computehal.probe.probe`), the
``computehal`` command and the test suite. Adding a backend is one module here plus
one line in that table: its name, module, class and the kinds it can run as.

Every backend class takes ``device: int = 0`` (the device ordinal) and names its
:class:`~computehal.registry.BackendKind` in a ``kind`` attribute: a class attribute,
or a property on a class that serves several kinds (wgpu runs as Vulkan, Metal or
WebGPU depending on its adapter).

Importing this package imports no backend and no GPU library: a backend's module is
imported only by :meth:`BackendSpec.load`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError
from ..registry import BackendKind

if TYPE_CHECKING:
    from ..backend import ComputeBackend

__all__ = ["BACKENDS", "BackendSpec", "spec_named", "spec_for_kind"]


@dataclass(frozen=True)
class BackendSpec:
    """One line of the backend table.

    Parameters
    ----------
    name : str
        Short name (``"cpu"``, ``"opencl"``, ``"wgpu"``, ``"cuda"``); test ids use it.
    module : str
        The module that defines the class.
    class_name : str
        The :class:`~computehal.ComputeBackend` subclass in ``module``.
    kinds : tuple of BackendKind
        The kinds the class can run as; the first is the one it runs as when it
        does not say (for wgpu: plain WebGPU).
    extra : str or None
        The pip extra that installs its dependency (``computehal[opencl]``).
    """

    name: str
    module: str
    class_name: str
    kinds: tuple[BackendKind, ...]
    extra: str | None = None

    @property
    def target(self) -> str:
        """``module.Class``, for display."""
        return f"{self.module}.{self.class_name}"

    def load(self) -> type[ComputeBackend]:
        """Import the module and return the class.

        Raises
        ------
        ImportError
            When the module (or a dependency it imports) is missing, or it defines no
            such backend class.
        """
        from ..backend import ComputeBackend

        cls = getattr(importlib.import_module(self.module), self.class_name, None)
        if not (isinstance(cls, type) and issubclass(cls, ComputeBackend)):
            raise ImportError(f"{self.module} has no ComputeBackend class {self.class_name}")
        return cls

    def create(self, device: int = 0) -> ComputeBackend:
        """A new, uninitialised backend on device ``device`` (imports the module).

        Device 0 is the class's default device, so ``create()`` is ``cls()``; another
        ordinal is passed as ``cls(device=device)``.
        """
        cls = self.load()
        if device == 0:
            return cls()
        return cls(device=device)  # type: ignore[call-arg]

    def kind_of(self, backend: ComputeBackend) -> BackendKind:
        """The kind a constructed backend of this spec runs as.

        Its ``kind`` attribute when that names one of :attr:`kinds`; otherwise, for a
        class serving several kinds, the kind its :meth:`~computehal.ComputeBackend.name`
        names; otherwise the first of :attr:`kinds`.
        """
        if len(self.kinds) == 1:
            return self.kinds[0]
        for answer in (getattr(backend, "kind", None), _name_of(backend)):
            kind = BackendKind.from_name(answer) if isinstance(answer, str) else answer
            if isinstance(kind, BackendKind) and kind in self.kinds:
                return kind
        return self.kinds[0]


def _name_of(backend: ComputeBackend) -> str | None:
    try:
        return backend.name()
    except Exception:  # noqa: BLE001 - a name that cannot be read tells nothing
        return None


_K = BackendKind

#: Every backend computehal ships, one line each. Priorities decide between them; the
#: order here only breaks ties (PoCL and lavapipe on the host CPU both rank 0).
BACKENDS: tuple[BackendSpec, ...] = (
    BackendSpec("cuda", "computehal.backends.cuda", "CudaBackend", (_K.CUDA, _K.ROCM), "cuda"),
    BackendSpec("wgpu", "computehal.backends.wgpu", "WgpuBackend", (_K.WEBGPU, _K.VULKAN, _K.METAL), "wgpu"),
    BackendSpec("opencl", "computehal.backends.opencl", "OpenCLBackend", (_K.OPENCL,), "opencl"),
    BackendSpec("cpu", "computehal.backends.cpu", "CpuBackend", (_K.CPU,)),
)


def spec_named(name: str, table: tuple[BackendSpec, ...] | None = None) -> BackendSpec:
    """The line of ``table`` (default :data:`BACKENDS`) called ``name``.

    Raises
    ------
    InvalidArgumentError
        If no line has that name.
    """
    specs = BACKENDS if table is None else table
    for spec in specs:
        if spec.name == name:
            return spec
    known = ", ".join(spec.name for spec in specs) or "none"
    raise InvalidArgumentError(f"no backend named {name!r} in the table; known: {known}")


def spec_for_kind(kind: BackendKind, table: tuple[BackendSpec, ...] | None = None) -> BackendSpec | None:
    """The line of ``table`` (default :data:`BACKENDS`) that can run as ``kind``, if any."""
    for spec in BACKENDS if table is None else table:
        if kind in spec.kinds:
            return spec
    return None
