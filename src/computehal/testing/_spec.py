"""The record of one valid call that bad-input cases mutate, and helpers that build operands."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backend import ComputeBackend
from ..errors import BackendError, InvalidArgumentError, UnsupportedError
from ._common import rng_for
from .workspace import Workspace

__all__ = [
    "CallSpec",
    "DTYPE_ERRORS",
    "Expected",
    "dtype_mutations",
    "f32_block",
    "freed_block",
    "short_block",
]

F32 = np.dtype(np.float32)
Expected = type[BackendError] | tuple[type[BackendError], ...]
#: A dtype that is a NumPy dtype but no compute dtype may be refused either way.
DTYPE_ERRORS: tuple[type[BackendError], ...] = (UnsupportedError, InvalidArgumentError)


@dataclass
class CallSpec:
    """One valid call of ``method`` and what each of its arguments is.

    ``names`` are the positional parameters (their values in ``values``); ``kwargs``
    the keyword arguments of the valid call. ``pointers`` maps a pointer argument
    (positional or keyword) to (bytes the call reads or writes there, element size);
    ``counts`` are non-negative integer arguments; ``scalars`` real numbers; ``enums``
    enum-or-string arguments; ``shapes`` list arguments with their required length.
    ``specific`` lists op-specific invalid variants as (label, overrides, expected
    error). ``dtype`` is the element type of the valid call (``"uint8"`` for raw bytes).
    """

    method: str
    names: list[str]
    values: dict[str, Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    pointers: dict[str, tuple[int, int]] = field(default_factory=dict)
    counts: tuple[str, ...] = ()
    scalars: tuple[str, ...] = ()
    enums: tuple[str, ...] = ()
    shapes: dict[str, int] = field(default_factory=dict)
    specific: list[tuple[str, dict[str, Any], Expected]] = field(default_factory=list)
    dtype: str = "float32"

    def get(self, name: str) -> Any:
        """The valid value of argument ``name`` (positional or keyword)."""
        return self.values[name] if name in self.values else self.kwargs[name]

    def call(self, be: ComputeBackend, **overrides: Any) -> None:
        """Call the method with the valid arguments, some replaced by ``overrides``."""
        values = dict(self.values)
        kwargs = dict(self.kwargs)
        for key, value in overrides.items():
            if key in values:
                values[key] = value
            else:
                kwargs[key] = value
        getattr(be, self.method)(*(values[name] for name in self.names), **kwargs)


def f32_block(ws: Workspace, shape: tuple[int, ...] | int, label: str, seed: int = 0) -> int:
    """A guarded operand of random float32 values; returns its pointer."""
    data = rng_for(f"{label}-{seed}").standard_normal(shape).astype(F32)
    return ws.put(data, label=label)


def short_block(ws: Workspace, nbytes: int, label: str) -> int:
    """An operand of ``nbytes`` bytes that ends exactly at the end of its allocation."""
    return ws.put_bytes(np.zeros(nbytes, dtype=np.uint8), label=label, hi=0).ptr


def freed_block(ws: Workspace, nbytes: int, label: str) -> int:
    """The pointer of an operand that has been freed."""
    block = ws.put_bytes(np.zeros(nbytes, dtype=np.uint8), label=label)
    ws.release(block.ptr)
    return block.ptr


def dtype_mutations() -> list[tuple[str, dict[str, Any], Expected]]:
    """A dtype that is no compute dtype, and a value that is no dtype at all."""
    return [
        ("dtype-int32", {"dtype": "int32"}, DTYPE_ERRORS),
        ("dtype-float8", {"dtype": "float8_e4m3fn"}, DTYPE_ERRORS),
        ("dtype-garbage", {"dtype": "banana"}, InvalidArgumentError),
        ("dtype-object", {"dtype": object()}, DTYPE_ERRORS),
    ]
