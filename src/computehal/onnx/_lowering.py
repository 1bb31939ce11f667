"""Turning one ONNX node into interface calls: the context every op's lowering works through.

A lowering is a function ``lower(lw: Lowerer) -> None`` registered for one or more op
types with :func:`lowers`. It reads its inputs (constants as NumPy arrays, dynamic float
tensors as :class:`~computehal.onnx._tensors.DeviceTensor`), declares its outputs (new
storages, or views of an input), and emits :class:`~computehal.onnx._tensors.Call`
records. It raises :class:`Unmappable` when the node uses something the interface has
no way to express (a 3-D convolution, training-mode batch norm, ...): such a node runs
nowhere and the model is refused with that reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._ir import Node, is_float
from ._shapes import Specialized
from ._tensors import Call, DeviceTensor, HostArg, Storage, Upload, coalesce, contiguous_strides
from ._weights import content_key

__all__ = ["LOWERINGS", "Lowerer", "LoweringContext", "Unmappable", "lowers"]

#: Most dimensions copy_strided / broadcast_binary take.
MAX_DIMS = 6
#: A strided copy of at most this many contiguous runs of at least _LONG_ROW bytes is one copy_dtod per run.
#: Shorter runs go to one copy_strided: GPT's key/value caches joined per head (12 runs of
#: 128 KB per tensor, 336 copy_dtod calls a step at 64 KB) took the decoding step 0.77-0.97
#: of the time on the CPU backend as one copy_strided per tensor (medians of 15, three
#: alternating processes; the same in PoCL's noise, 159 / 193 ms against 178 / 188).
_FEW_ROWS = 32
_LONG_ROW = 1 << 20

Lowering = Callable[["Lowerer"], None]
#: op type -> lowering function (filled by the ``ops_*`` modules).
LOWERINGS: dict[str, Lowering] = {}


class Unmappable(Exception):
    """The node uses something the interface cannot express; ``str()`` says what."""


def lowers(*ops: str) -> Callable[[Lowering], Lowering]:
    """Register a lowering for ``ops``."""

    def register(fn: Lowering) -> Lowering:
        for op in ops:
            LOWERINGS[op] = fn
        return fn

    return register


@dataclass
class LoweringContext:
    """What lowerings share across the nodes of one plan.

    ``stable`` names the constants of the model as loaded: weights derived from them keep
    their name as key across plans; any other constant is keyed by its content.
    ``weight_panel(rows, depth, cols)`` is the column-panel width in which the primary
    backend wants a constant float32 ``depth x cols`` weight stored for ``rows``
    activation rows (0: as it is; see ``ComputeBackend.gemm_weight_panel``).
    """

    spec: Specialized
    stable: frozenset[str] = frozenset()
    weight_panel: Callable[[int, int, int], int] = field(default=lambda rows, depth, cols: 0)
    device: dict[str, DeviceTensor] = field(default_factory=dict)
    host: set[str] = field(default_factory=set)
    weights: dict[str, DeviceTensor] = field(default_factory=dict)

    def weight(self, array: np.ndarray, label: str, key: str | None = None) -> DeviceTensor:
        """A device copy of a host array (uploaded once per session and backend)."""
        if key is not None and key in self.weights:
            return self.weights[key]
        data = np.ascontiguousarray(array)
        stable = key is not None and key.split(":")[0] in self.stable
        storage = Storage(max(data.nbytes, 1), "weight", label, data=data)
        storage.key = f"name:{key}" if stable else content_key(data)
        tensor = DeviceTensor(storage, 0, tuple(data.shape), data.dtype)
        if key is not None:
            self.weights[key] = tensor
        return tensor


class Lowerer:
    """The lowering of one node: inputs, outputs, scratch memory and the calls it emits."""

    def __init__(self, node: Node, ctx: LoweringContext) -> None:
        self.node = node
        self.ctx = ctx
        self.spec = ctx.spec
        self.instrs: list[Call | Upload] = []
        self.outputs: dict[str, DeviceTensor] = {}
        self.new_storages: list[Storage] = []

    # ------------------------------------------------------------------ attributes and inputs

    @property
    def opset(self) -> int:
        """The model's default-domain opset version."""
        return self.spec.graph.opset

    def attr(self, name: str, default: Any = None) -> Any:
        """Node attribute ``name`` or ``default``."""
        return self.node.attr(name, default)

    def has(self, i: int) -> bool:
        """True when optional input ``i`` is given."""
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    def name(self, i: int) -> str:
        return self.node.inputs[i]

    def const(self, i: int) -> np.ndarray | None:
        """Input ``i`` as a constant array, or None when it is not constant (or absent)."""
        if not self.has(i):
            return None
        return self.spec.graph.consts.get(self.node.inputs[i])

    def need_const(self, i: int, what: str) -> np.ndarray:
        """Input ``i`` as a constant, or Unmappable naming ``what``."""
        value = self.const(i)
        if value is None:
            raise Unmappable(f"{what} (input {i}) must be a constant")
        return value

    def dtype(self, i: int) -> np.dtype[Any]:
        info = self.spec.info(self.node.inputs[i])
        if info is None:
            raise Unmappable(f"the type of input {self.node.inputs[i]!r} is unknown")
        return info[0]

    def shape(self, i: int) -> tuple[int, ...]:
        info = self.spec.info(self.node.inputs[i])
        if info is None:
            raise Unmappable(f"the shape of input {self.node.inputs[i]!r} is unknown")
        return info[1]

    def out_dtype(self, i: int = 0) -> np.dtype[Any]:
        name = self.node.outputs[i]
        info = self.spec.info(name)
        if info is None:
            raise Unmappable(f"the type of output {name!r} is unknown")
        return info[0]

    def out_shape(self, i: int = 0) -> tuple[int, ...]:
        name = self.node.outputs[i]
        if name not in self.spec.shapes:
            raise Unmappable(f"the shape of output {name!r} is unknown")
        return self.spec.shapes[name]

    def wants(self, i: int) -> bool:
        """True when output ``i`` exists and is named."""
        return i < len(self.node.outputs) and bool(self.node.outputs[i])

    def tensor(self, i: int) -> DeviceTensor:
        """Input ``i`` on the device: a dynamic float tensor, or a constant uploaded as a weight."""
        name = self.node.inputs[i]
        if name in self.ctx.device:
            return self.ctx.device[name]
        value = self.spec.graph.consts.get(name)
        if value is not None:
            if not is_float(value.dtype):
                raise Unmappable(f"input {name!r} is {value.dtype.name}; the device computes in floats")
            return self.ctx.weight(value, name, key=name)
        raise Unmappable(f"input {name!r} is not a float tensor on the device")

    def is_host(self, i: int) -> bool:
        """True when input ``i`` is known on the host at run time (constant, graph input, host int)."""
        name = self.node.inputs[i]
        return name in self.spec.graph.consts or name in self.ctx.host

    def host_arg(self, fn: Callable[..., Any], *inputs: int, label: str = "host value") -> Any:
        """``fn`` of host inputs: computed now when they are constants, else at run time."""
        values = [self.const(i) for i in inputs]
        if all(v is not None for v in values):
            return fn(*values)
        for i in inputs:
            if not self.is_host(i):
                raise Unmappable(f"input {self.node.inputs[i]!r} would have to come back from the device")
        consts = {i: v for i, v in zip(inputs, values, strict=True) if v is not None}
        names = tuple(self.node.inputs[i] for i in inputs if i not in consts)
        if not consts:
            return HostArg(fn, names, label)

        def bound(*dynamic: Any) -> Any:
            it = iter(dynamic)
            return fn(*[consts[i] if i in consts else next(it) for i in inputs])

        return HostArg(bound, names, label)

    # ------------------------------------------------------------------ outputs and memory

    def _storage(self, nbytes: int, label: str) -> Storage:
        storage = Storage(max(nbytes, 1), "arena", label)
        self.new_storages.append(storage)
        return storage

    def output(self, i: int = 0, shape: Sequence[int] | None = None) -> DeviceTensor:
        """A new tensor for output ``i`` (shape from inference unless given)."""
        name = self.node.outputs[i]
        dims = tuple(self.out_shape(i) if shape is None else shape)
        dtype = self.out_dtype(i)
        tensor = DeviceTensor(self._storage(math.prod(dims) * dtype.itemsize, name), 0, dims, dtype)
        self.outputs[name] = tensor
        return tensor

    def alias(self, i: int, tensor: DeviceTensor) -> None:
        """Output ``i`` is ``tensor`` seen with the output's shape: a view, no copy."""
        name = self.node.outputs[i]
        shape = self.out_shape(i)
        if math.prod(shape) != tensor.size:
            raise Unmappable(f"output {name!r} {list(shape)} cannot view {list(tensor.shape)}")
        self.outputs[name] = tensor.view(shape)

    def host_const(self, i: int, value: np.ndarray) -> None:
        """Output ``i`` is a constant known now (an all-True Dropout mask, ...)."""
        name = self.node.outputs[i]
        self.spec.graph.consts[name] = value
        self.ctx.host.add(name)

    def scratch(self, shape: Sequence[int], dtype: np.dtype[Any], label: str = "scratch") -> DeviceTensor:
        """Device memory live only while this node runs."""
        dims = tuple(shape)
        storage = self._storage(math.prod(dims) * dtype.itemsize, f"{self.node.name}:{label}")
        return DeviceTensor(storage, 0, dims, dtype)

    def weight(self, array: np.ndarray, label: str = "weight", key: str | None = None) -> DeviceTensor:
        """A host array the lowering derived, uploaded once with the weights."""
        return self.ctx.weight(array, f"{self.node.name}:{label}", key=key)

    # ------------------------------------------------------------------ emitting

    def call(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Emit one call of the backend's public ``method``."""
        self.instrs.append(Call(method, args, kwargs))

    def upload(self, dst: DeviceTensor, value: Any) -> None:
        """Copy a host value (an array, or a :class:`HostArg`) into ``dst`` when the plan runs."""
        arg = value if isinstance(value, HostArg) else HostArg(lambda v=value: v, (), "constant")
        self.instrs.append(Upload(dst, arg))

    def copy(
        self,
        dst: DeviceTensor,
        src: DeviceTensor,
        shape: Sequence[int],
        src_strides: Sequence[int],
        dst_strides: Sequence[int] | None = None,
    ) -> None:
        """``dst[idx] = src[idx]`` over ``shape`` with element strides (one or a few calls).

        Contiguous runs become ``copy_dtod`` (one call, or one per run for a few long runs);
        anything else ``copy_strided`` (split over the leading dimension when more than six
        dimensions remain after merging).
        """
        if math.prod(shape) == 0:
            return
        dst_strides = contiguous_strides(shape) if dst_strides is None else tuple(dst_strides)
        dims, (ss, ds) = coalesce(shape, src_strides, dst_strides)
        if len(dims) == 1 and ss[0] == 1 and ds[0] == 1:
            size = dims[0] * src.dtype.itemsize
            self.call("copy_dtod", dst.view((dims[0],)), src.view((dims[0],)), size)
            return
        row = dims[-1] * src.dtype.itemsize
        if len(dims) == 2 and ss[1] == 1 and ds[1] == 1 and dims[0] <= _FEW_ROWS and row >= _LONG_ROW:
            # A few long contiguous runs (a key/value cache joined with new positions): one
            # plain copy each streams at copy speed.
            for j in range(dims[0]):
                self.call("copy_dtod", dst.view((dims[1],), j * ds[0]), src.view((dims[1],), j * ss[0]), row)
            return
        if len(dims) > MAX_DIMS:
            for j in range(dims[0]):
                self.copy(
                    dst.view(dst.shape, j * ds[0]), src.view(src.shape, j * ss[0]), dims[1:], ss[1:], ds[1:]
                )
            return
        self.call("copy_strided", dst, src, dims, ss, ds, dtype=src.dt)


def normalize_axis(axis: int, rank: int) -> int:
    """``axis`` in ``[0, rank)`` (negative counts from the end), or Unmappable."""
    a = int(axis)
    if a < 0:
        a += rank
    if not 0 <= a < max(rank, 1):
        raise Unmappable(f"axis {axis} is out of range for rank {rank}")
    return a
