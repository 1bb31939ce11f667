"""What a lowered node is made of: device tensors on storages, interface calls, host arguments.

A :class:`Storage` is a block of device memory the plan places later (an intermediate in
the arena, a graph input, or a weight uploaded once). A :class:`DeviceTensor` is a
contiguous row-major window of a storage; views (Reshape, Flatten, Squeeze, Unsqueeze,
contiguous slices) are new tensors on the same storage. A :class:`Call` is one public
method of :class:`~computehal.ComputeBackend` with tensors standing in for pointers; the
plan binds them to addresses once memory is placed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "Call",
    "DeviceTensor",
    "HostArg",
    "Storage",
    "Upload",
    "broadcast_strides",
    "coalesce",
    "contiguous_strides",
]


@dataclass(eq=False)
class Storage:
    """A block of device memory: an arena intermediate, a graph input or a weight."""

    nbytes: int
    kind: str  # "arena" | "input" | "weight"
    label: str
    data: np.ndarray | None = None  # the host value of a weight, or None
    home: str | None = None  # the partition that writes it (arena storages)
    key: str | None = None  # what names a weight across plans (see computehal.onnx._weights)

    def __repr__(self) -> str:
        return f"<Storage {self.kind} {self.label!r} {self.nbytes} B>"


@dataclass(frozen=True, eq=False)
class DeviceTensor:
    """A contiguous row-major tensor at ``offset`` bytes into ``storage``."""

    storage: Storage
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self.size * self.dtype.itemsize

    @property
    def dt(self) -> str:
        """The dtype name computehal operations take."""
        return self.dtype.name

    def view(self, shape: Sequence[int], element_offset: int = 0) -> DeviceTensor:
        """The same storage seen with another shape, starting ``element_offset`` elements in."""
        return DeviceTensor(
            self.storage, self.offset + element_offset * self.dtype.itemsize, tuple(shape), self.dtype
        )

    def __repr__(self) -> str:
        return f"<DeviceTensor {self.storage.label!r}+{self.offset} {list(self.shape)} {self.dt}>"


@dataclass(frozen=True)
class HostArg:
    """An argument computed on the host at run time from host values (integer tensors, inputs).

    ``fn`` receives the host values named in ``names`` (in order).
    """

    fn: Callable[..., Any]
    names: tuple[str, ...]
    label: str = "host value"


@dataclass
class Call:
    """One public method of the backend; DeviceTensor arguments stand for their pointers."""

    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def tensors(self) -> list[DeviceTensor]:
        """Every tensor the call touches."""
        return [a for a in (*self.args, *self.kwargs.values()) if isinstance(a, DeviceTensor)]

    def host_names(self) -> list[str]:
        """Host values the call needs at run time."""
        return [n for a in (*self.args, *self.kwargs.values()) if isinstance(a, HostArg) for n in a.names]


@dataclass
class Upload:
    """Copy a host value (computed at run time by ``value``) into ``dst``: a border from the host."""

    dst: DeviceTensor
    value: HostArg

    def tensors(self) -> list[DeviceTensor]:
        return [self.dst]

    def host_names(self) -> list[str]:
        return list(self.value.names)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides in elements."""
    strides = []
    step = 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Strides of a contiguous ``shape`` read as ``out_shape`` (0 on broadcast dimensions)."""
    pad = len(out_shape) - len(shape)
    full = (1,) * pad + tuple(shape)
    base = contiguous_strides(full)
    return tuple(0 if e == 1 and o != 1 else s for e, o, s in zip(full, out_shape, base, strict=True))


def coalesce(
    shape: Sequence[int], *stride_lists: Sequence[int]
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop unit dimensions and merge neighbours that every stride list walks as one.

    Returns the shorter shape and stride lists (at least one dimension).
    """
    dims = [(e, [s[i] for s in stride_lists]) for i, e in enumerate(shape) if e != 1]
    if not dims:
        return (1,), [(0,) for _ in stride_lists]
    merged = [dims[0]]
    for extent, strides in dims[1:]:
        prev_extent, prev_strides = merged[-1]
        if all(ps == s * extent for ps, s in zip(prev_strides, strides, strict=True)):
            merged[-1] = (prev_extent * extent, strides)
        else:
            merged.append((extent, strides))
    out_shape = tuple(e for e, _ in merged)
    return out_shape, [tuple(s[k] for _, s in merged) for k in range(len(stride_lists))]
