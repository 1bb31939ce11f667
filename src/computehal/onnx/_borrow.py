"""Graph inputs and outputs in place: host arrays borrowed by the backend for one run.

A backend that addresses host memory in place (``borrow``: the CPU backend) reads a
graph input straight from the array passed to ``run``, and writes a graph output
straight into the array ``run`` returns, instead of copies of them in the plan's arena:
a decoder step's key / value cache is then copied once per run (the past into the
present cache) instead of three times. The calls that touch such a tensor take its
address as a :class:`~computehal.onnx._tensors.HostArg` evaluated per run; the arena
keeps the tensor's block, which the run uses (as before, with the copies) when the
backend refuses to borrow. Borrowed ranges are forgotten again when the run ends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..backend import ComputeBackend
from ..errors import BackendError
from ._tensors import Call, DeviceTensor, HostArg, Storage, Upload

__all__ = ["BorrowedInputs", "blocked_storages", "borrowable_outputs"]

Step = Callable[[dict[str, Any]], None]

#: The values entry listing the pointers borrowed by the current run.
_HELD = "\0borrowed"


def _at(offset: int, base: int) -> int:
    return base + offset


class BorrowedInputs:
    """The inputs and outputs of one partition that its calls use in place, and the steps that bind them.

    ``outputs`` maps each output's storage to (the output tensor, its arena address).
    """

    def __init__(
        self,
        backend: ComputeBackend,
        storages: Iterable[Storage],
        outputs: dict[Storage, tuple[DeviceTensor, int]] | None = None,
    ) -> None:
        self.backend = backend
        self.outputs = dict(outputs or {})
        self.keys = {s: f"\0tensor:{s.label}:{id(s)}" for s in [*storages, *self.outputs]}
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

    def output_step(self) -> Step:
        """Make each output's array and borrow it (or leave the output in the arena)."""

        def bind(values: dict[str, Any]) -> None:
            for storage, (tensor, address) in self.outputs.items():
                key, pointer = self.keys[storage], address
                if self.enabled:
                    array = np.empty(tensor.shape, dtype=tensor.dtype)
                    try:
                        pointer = self.backend.borrow(array.ctypes.data, array.nbytes, array)
                    except BackendError:
                        self.enabled = False
                    else:
                        values.setdefault(_HELD, []).append(pointer)
                        values[key + ":array"] = array
                values[key] = pointer

        return bind

    def fetched(self, storage: Storage, values: dict[str, Any]) -> np.ndarray | None:
        """The array output ``storage`` was written into this run, if it was borrowed."""
        key = self.keys.get(storage)
        array: np.ndarray | None = None if key is None else values.get(key + ":array")
        return array

    def release(self, values: dict[str, Any]) -> None:
        """Forget this run's borrowed ranges (after the backend finished reading them)."""
        for pointer in values.pop(_HELD, ()):
            self.backend.free(pointer)


def blocked_storages(ops: list[tuple[str, Any]], canonical: Callable[[Storage], Storage]) -> set[Storage]:
    """Storages that something other than a call touches (border transfers, downloads, uploads)."""
    blocked: set[Storage] = set()
    for _, op in ops:
        if isinstance(op, tuple) and op[0] == "transfer":
            blocked.add(canonical(op[2]))
        elif isinstance(op, tuple) and op[0] == "download":
            blocked.add(canonical(op[2].storage))
        elif isinstance(op, Upload):
            blocked.add(canonical(op.dst.storage))
    return blocked


def borrowable_outputs(
    outputs: list[DeviceTensor], canonical: Callable[[Storage], Storage], blocked: set[Storage]
) -> dict[Storage, DeviceTensor]:
    """Outputs that are the whole of an arena storage no other output, transfer or upload uses."""
    seen: dict[Storage, int] = {}
    for tensor in outputs:
        storage = canonical(tensor.storage)
        seen[storage] = seen.get(storage, 0) + 1
    found = {}
    for tensor in outputs:
        storage = canonical(tensor.storage)
        whole = tensor.offset == 0 and tensor.nbytes == storage.nbytes and storage.kind == "arena"
        if whole and seen[storage] == 1 and storage not in blocked and tensor.nbytes:
            found[storage] = tensor
    return found
