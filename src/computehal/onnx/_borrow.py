"""Graph inputs read in place: the caller's arrays borrowed by the backend for one run.

A backend that addresses host memory in place (``borrow``: the CPU backend) reads a
graph input straight from the array passed to ``run``, instead of a copy of it in the
plan's arena: a decoder step's key / value cache is then copied once per run (into the
present cache) instead of twice. The calls that read such an input take its address as
a :class:`~computehal.onnx._tensors.HostArg` evaluated per run; the arena keeps the
input's block, which the run fills (as before) when the backend refuses to borrow.
Borrowed ranges are forgotten again when the run ends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from ..backend import ComputeBackend
from ..errors import BackendError
from ._tensors import Call, DeviceTensor, HostArg, Storage

__all__ = ["BorrowedInputs"]

Step = Callable[[dict[str, Any]], None]

#: The values entry listing the pointers borrowed by the current run.
_HELD = "\0borrowed"


def _at(offset: int, base: int) -> int:
    return base + offset


class BorrowedInputs:
    """The inputs of one partition that its calls read in place, and the steps that bind them."""

    def __init__(self, backend: ComputeBackend, storages: Iterable[Storage]) -> None:
        self.backend = backend
        self.keys = {storage: f"\0input:{storage.label}:{id(storage)}" for storage in storages}
        self.enabled = True  # False once the backend refuses to borrow

    def call(self, call: Call, canonical: Callable[[Storage], Storage]) -> Call:
        """``call`` with every tensor of a borrowed input replaced by its per-run address."""
        if not self.keys:
            return call

        def fix(a: Any) -> Any:
            if not isinstance(a, DeviceTensor):
                return a
            key = self.keys.get(canonical(a.storage))
            if key is None:
                return a
            return HostArg(functools.partial(_at, a.offset), (key,), f"address of {a.storage.label}")

        return Call(
            call.method, tuple(fix(a) for a in call.args), {k: fix(v) for k, v in call.kwargs.items()}
        )

    def input_step(self, name: str, storage: Storage, address: int) -> Step:
        """Borrow the array fed as ``name`` (or copy it to ``address`` in the arena)."""
        key, backend = self.keys[storage], self.backend

        def bind(values: dict[str, Any]) -> None:
            value = values[name]
            pointer = address
            # An array not aligned to its element size (a view into raw bytes) is copied.
            if value.nbytes and self.enabled and value.ctypes.data % value.dtype.itemsize == 0:
                try:
                    pointer = backend.borrow(value.ctypes.data, value.nbytes, value)
                except BackendError:  # unsupported, or the array lies in this backend's memory
                    self.enabled = False
                else:
                    values.setdefault(_HELD, []).append(pointer)
            if pointer == address and value.nbytes:
                backend.copy_htod(address, value)
            values[key] = pointer

        return bind

    def release(self, values: dict[str, Any]) -> None:
        """Forget this run's borrowed ranges (after the backend finished reading them)."""
        for pointer in values.pop(_HELD, ()):
            self.backend.free(pointer)


def borrowable(
    ops: list[tuple[str, Any]], inputs: Iterable[Storage], excluded: Iterable[Storage]
) -> list[Storage]:
    """Inputs that only calls read (no border transfer, download or graph output of them)."""
    blocked = set(excluded)
    for _, op in ops:
        if isinstance(op, tuple) and op[0] == "transfer":
            blocked.add(op[2])
        elif isinstance(op, tuple) and op[0] == "download":
            blocked.add(op[2].storage)
    return [s for s in inputs if s not in blocked]
