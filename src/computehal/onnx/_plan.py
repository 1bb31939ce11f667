"""The executable plan: ordered steps, partition borders, arenas, and the run loop.

Built from the placed nodes (:mod:`computehal.onnx._partition`):

* every tensor a step touches is resolved in the step's partition; an intermediate made in
  the other partition gets a mirror there and an explicit copy step at the border;
* graph inputs are uploaded once per run into each partition that reads them, or read
  in place where the backend borrows host memory (:mod:`computehal.onnx._borrow`);
  weights once per session (:mod:`computehal.onnx._weights`), shared by its plans;
* intermediates are placed in one arena per partition by lifetime
  (:mod:`computehal.onnx._memory`), so buffers are reused, and an element-wise call whose
  input dies with it writes over that input;
* a run executes the steps in order (no host round trip between device nodes), calls
  ``synchronize()`` once per backend, and copies the outputs out.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backend import ComputeBackend
from ..errors import InvalidArgumentError, UnsupportedError
from ._borrow import BorrowedInputs, blocked_storages, borrowable_outputs
from ._lowering import LoweringContext
from ._memory import Block, naive_size, place
from ._partition import FALLBACK, HOST, PRIMARY, NodePlan
from ._tensors import Call, DeviceTensor, HostArg, Storage, Upload
from ._weights import WeightStore

__all__ = ["Border", "ExecutablePlan", "MemoryReport", "StepUnsupported"]

Step = Callable[[dict[str, Any]], None]

#: Unary functions written over their input when it dies with the call (simple selections).
_IN_PLACE_UNARY = frozenset({"relu", "abs", "neg"})


class StepUnsupported(UnsupportedError):
    """A call of the plan was refused when it ran (a limit no probe shows: a buffer too large
    for one binding, ...); ``node`` names the node it belongs to."""

    def __init__(self, node: str, error: UnsupportedError) -> None:
        super().__init__(f"node {node!r}: {error}")
        self.node = node
        self.reason = str(error)


@dataclass
class Border:
    """One copy across a partition border."""

    value: str
    source: str
    target: str
    nbytes: int


@dataclass
class MemoryReport:
    """Device memory of one partition: the arena (peak), what it would be without reuse, weights."""

    backend: str
    arena_bytes: int
    naive_bytes: int
    weight_bytes: int


@dataclass
class _Partition:
    backend: ComputeBackend
    store: WeightStore
    storages: dict[Storage, Block] = field(default_factory=dict)
    weights: dict[Storage, int] = field(default_factory=dict)
    shared: dict[Storage, Storage] = field(default_factory=dict)  # computed in place into another
    arena: int = 0
    arena_bytes: int = 0
    naive_bytes: int = 0

    def canonical(self, storage: Storage) -> Storage:
        while storage in self.shared:
            storage = self.shared[storage]
        return storage

    def touch(self, storage: Storage, step: int) -> None:
        if storage.kind == "weight":
            self.weights.setdefault(storage, 0)
            return
        storage = self.canonical(storage)
        block = self.storages.get(storage)
        if block is None:
            self.storages[storage] = Block(storage, storage.nbytes, step, step)
        else:
            block.first, block.last = min(block.first, step), max(block.last, step)

    def address(self, tensor: DeviceTensor) -> int:
        storage = tensor.storage
        if storage.kind == "weight":
            return self.weights[storage] + tensor.offset
        return self.arena + self.storages[self.canonical(storage)].offset + tensor.offset

    def share_in_place(self, step: int, call: Call) -> None:
        """Let an element-wise call write over an input that dies with it (same bytes, same place).

        Unary functions other than :data:`_IN_PLACE_UNARY` keep a separate output: compiled
        loops vectorise only when input and output are distinct (a loop over one buffer
        in place ran 4-7x slower for GELU, erf, tanh and sigmoid on the CPU backend).
        """
        if call.method == "unary" and str(call.args[0]) not in _IN_PLACE_UNARY:
            return
        out = call.args[2] if call.method == "unary" else call.args[3]
        inputs = call.args[1:2] if call.method == "unary" else call.args[1:3]
        target = self.canonical(out.storage)
        out_block = self.storages.get(target)
        if target.kind != "arena" or out_block is None or out_block.first != step:
            return
        if out.offset or out.nbytes != target.nbytes:
            return
        for x in inputs:
            source = self.canonical(x.storage)
            block = self.storages.get(source)
            if source is target or source.kind != "arena" or block is None or block.last != step:
                continue
            if x.offset or x.nbytes != out.nbytes or source.nbytes != target.nbytes:
                continue
            block.last = out_block.last
            del self.storages[target]
            self.shared[target] = source
            return


class ExecutablePlan:
    """Steps bound to addresses on one or two backends; :meth:`run` executes them."""

    def __init__(
        self,
        plans: list[NodePlan],
        ctx: LoweringContext,
        primary: ComputeBackend,
        fallback: ComputeBackend | None,
        store: WeightStore,
    ) -> None:
        self.plans = plans
        self.ctx = ctx
        self.spec = ctx.spec
        self.parts: dict[str, _Partition] = {PRIMARY: _Partition(primary, store)}
        if fallback is not None:
            self.parts[FALLBACK] = _Partition(fallback, store)
        self.borders: list[Border] = []
        self._mirrors: dict[tuple[Storage, str], Storage] = {}
        self._inputs: list[tuple[str, Storage]] = []
        self._downloaded: set[str] = set()
        self._lock = threading.Lock()
        self._ops: list[tuple[str, Any]] = []  # (partition | HOST, instruction), resolved
        self._owners: list[str] = []  # the node each entry of _ops belongs to
        self._current = ""
        self._build()
        self.outputs = [self._output_source(name) for name in self.spec.graph.output_values()]
        end = len(self._ops)
        for kind, item in self.outputs:
            if kind in self.parts:
                self.parts[kind].touch(item.storage, end)
        self._touch_inputs()
        for part in self.parts.values():
            part.naive_bytes = naive_size(list(part.storages.values()))
        for step, (where, op) in enumerate(self._ops):
            if where != HOST and isinstance(op, Call) and op.method in ("unary", "binary"):
                self.parts[where].share_in_place(step, op)
        self._allocate()
        self._borrowed = self._borrowable(primary)
        self._steps = [self._bind(where, op) for where, op in self._ops]
        self._input_steps = [self._bind_input(where, name, s) for where, name, s in self._input_uploads()]
        if self._borrowed.outputs:
            self._input_steps.append(self._borrowed.output_step())

    # ------------------------------------------------------------------ building

    def _resolve(self, tensor: DeviceTensor, where: str) -> DeviceTensor:
        storage = tensor.storage
        if storage.kind == "input":
            if (storage, where) not in self._mirrors:
                self._mirrors[(storage, where)] = (
                    storage if where == PRIMARY else Storage(storage.nbytes, "input", storage.label)
                )
                self._inputs.append((where, self._mirrors[(storage, where)]))
            return DeviceTensor(self._mirrors[(storage, where)], tensor.offset, tensor.shape, tensor.dtype)
        if storage.kind == "weight" or storage.home == where:
            return tensor
        mirror = self._mirrors.get((storage, where))
        if mirror is None:
            mirror = Storage(storage.nbytes, "arena", f"{storage.label}@{where}", home=where)
            self._mirrors[(storage, where)] = mirror
            home = storage.home or PRIMARY
            self._append(where, ("transfer", home, storage, mirror))
            self.parts[home].touch(storage, len(self._ops) - 1)
            self.parts[where].touch(mirror, len(self._ops) - 1)
            self.borders.append(
                Border(
                    storage.label,
                    self.parts[home].backend.name(),
                    self.parts[where].backend.name(),
                    storage.nbytes,
                )
            )
        return DeviceTensor(mirror, tensor.offset, tensor.shape, tensor.dtype)

    def _append(self, where: str, op: Any) -> None:
        self._ops.append((where, op))
        self._owners.append(self._current)

    def _build(self) -> None:
        for plan in self.plans:
            self._current = plan.node.name
            if plan.where == HOST:
                self._host_node(plan)
                continue
            for instr in plan.instrs:
                resolved = self._resolve_instr(instr, plan.where)
                if isinstance(resolved, Upload):
                    name = self.parts[plan.where].backend.name()
                    label = f"{resolved.dst.storage.label} ({resolved.value.label})"
                    self.borders.append(Border(label, "host", name, resolved.dst.nbytes))
                self._append(plan.where, resolved)
                step = len(self._ops) - 1
                for tensor in resolved.tensors():
                    self.parts[plan.where].touch(tensor.storage, step)

    def _resolve_instr(self, instr: Call | Upload, where: str) -> Call | Upload:
        if isinstance(instr, Upload):
            return Upload(self._resolve(instr.dst, where), instr.value)

        def fix(a: Any) -> Any:
            return self._resolve(a, where) if isinstance(a, DeviceTensor) else a

        return Call(
            instr.method, tuple(fix(a) for a in instr.args), {k: fix(v) for k, v in instr.kwargs.items()}
        )

    def _host_node(self, plan: NodePlan) -> None:
        for name in plan.node.present_inputs():
            if name in self.spec.graph.consts or name in self.ctx.host or name in self._downloaded:
                continue
            tensor = self.ctx.device.get(name)
            if tensor is None:
                raise InvalidArgumentError(f"value {name!r} is not available for node {plan.node.name!r}")
            where = tensor.storage.home or PRIMARY
            self._append(where, ("download", name, tensor))
            self.parts[where].touch(tensor.storage, len(self._ops) - 1)
            self._downloaded.add(name)
            self.borders.append(Border(name, self.parts[where].backend.name(), "host", tensor.nbytes))
        self._append(HOST, plan)

    def _output_source(self, name: str) -> Any:
        consts = self.spec.graph.consts
        if name in consts:
            return ("const", consts[name])
        if name in self.ctx.host:
            return ("host", name)
        tensor = self.ctx.device[name]
        where = tensor.storage.home or PRIMARY
        return (where, self._resolve(tensor, where))

    def _borrowable(self, backend: ComputeBackend) -> BorrowedInputs:
        """The primary partition's inputs and outputs its calls may use in the caller's arrays."""
        part = self.parts[PRIMARY]
        blocked = blocked_storages(self._ops, part.canonical)
        tensors = [item for kind, item in self.outputs if kind == PRIMARY]
        blocked.update(t.storage for t in tensors if t.storage.kind == "input")
        inputs = [s for where, s in self._inputs if where == PRIMARY and s not in blocked]
        outputs = borrowable_outputs(tensors, part.canonical, blocked)
        at = {s: (t, part.arena + part.storages[s].offset) for s, t in outputs.items()}
        return BorrowedInputs(backend, inputs, at)

    def _input_uploads(self) -> list[tuple[str, str, Storage]]:
        return [(where, storage.label, storage) for where, storage in self._inputs]

    def _touch_inputs(self) -> None:
        for where, storage in self._inputs:
            self.parts[where].touch(storage, 0)

    def _allocate(self) -> None:
        for part in self.parts.values():
            blocks = list(part.storages.values())
            part.arena_bytes = place(blocks)
            for storage in part.weights:
                part.weights[storage] = part.store.address(part.backend, storage)
            if part.arena_bytes:
                part.arena = part.backend.alloc(part.arena_bytes)

    # ------------------------------------------------------------------ binding

    def _bind(self, where: str, op: Any) -> Step:
        if where == HOST:
            return self._bind_host(op)
        part = self.parts[where]
        if isinstance(op, Call):
            return _bind_call(part, self._borrowed.call(op, part.canonical) if where == PRIMARY else op)
        if isinstance(op, Upload):
            return _bind_upload(part, op)
        kind = op[0]
        if kind == "transfer":
            _, home, storage, mirror = op
            return _bind_transfer(self.parts[home], storage, part, mirror)
        _, name, tensor = op
        return _bind_download(part, name, tensor)

    def _bind_host(self, plan: NodePlan) -> Step:
        consts = self.spec.graph.consts
        node, host = plan.node, plan.host
        assert host is not None

        def run(values: dict[str, Any]) -> None:
            args = [consts[n] if n in consts else values[n] if n else None for n in node.inputs]
            for name, result in zip(node.outputs, host(*args), strict=False):
                if name:
                    values[name] = result

        return run

    def _bind_input(self, where: str, name: str, storage: Storage) -> Step:
        part = self.parts[where]
        address = part.arena + part.storages[part.canonical(storage)].offset
        backend = part.backend
        if where == PRIMARY and storage in self._borrowed.keys:
            return self._borrowed.input_step(name, storage, address)

        def upload(values: dict[str, Any]) -> None:
            value = values[name]
            if value.nbytes:
                backend.copy_htod(address, value)

        return upload

    # ------------------------------------------------------------------ running

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Execute the plan on ``feeds`` (already checked) and return every graph output."""
        with self._lock:
            values: dict[str, Any] = dict(feeds)
            try:
                for step in self._input_steps:
                    step(values)
                for index, step in enumerate(self._steps):
                    try:
                        step(values)
                    except UnsupportedError as exc:
                        raise StepUnsupported(self._owners[index], exc) from exc
            finally:
                # Also after a failed step: borrowed inputs are forgotten once nothing reads them.
                for part in self.parts.values():
                    if part.storages or part.weights:
                        part.backend.synchronize()
                self._borrowed.release(values)
            return [self._fetch(source, values) for source in self.outputs]

    def _fetch(self, source: Any, values: dict[str, Any]) -> np.ndarray:
        kind, item = source
        if kind == "const":
            return np.array(item, copy=True)
        if kind == "host":
            return np.array(values[item], copy=True)
        tensor: DeviceTensor = item
        if kind == PRIMARY:
            written = self._borrowed.fetched(self.parts[kind].canonical(tensor.storage), values)
            if written is not None:
                return written
        out = np.empty(tensor.shape, dtype=tensor.dtype)
        if out.size:
            part = self.parts[kind]
            part.backend.copy_dtoh(out, part.address(tensor))
        return out

    def memory(self) -> list[MemoryReport]:
        """Device memory per partition that holds anything."""
        return [
            MemoryReport(p.backend.name(), p.arena_bytes, p.naive_bytes, sum(s.nbytes for s in p.weights))
            for p in self.parts.values()
            if p.storages or p.weights
        ]

    def close(self) -> None:
        """Free the arenas (weights belong to the session's store); the plan cannot run afterwards."""
        for part in self.parts.values():
            if part.arena:
                try:
                    part.backend.free(part.arena)
                except Exception:  # noqa: BLE001 - the backend may already be closed
                    pass
                part.arena = 0
        self._steps = []


def _resolve_args(part: _Partition, values: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(part.address(v) if isinstance(v, DeviceTensor) else v for v in values)


def _bind_call(part: _Partition, call: Call) -> Step:
    method = getattr(part.backend, call.method)
    args = _resolve_args(part, call.args)
    kwargs = {k: part.address(v) if isinstance(v, DeviceTensor) else v for k, v in call.kwargs.items()}
    dynamic = [i for i, a in enumerate(args) if isinstance(a, HostArg)]
    dynamic_kw = [k for k, v in kwargs.items() if isinstance(v, HostArg)]
    if not dynamic and not dynamic_kw:
        bound = functools.partial(method, *args, **kwargs)
        return lambda values: bound()

    def run(values: dict[str, Any]) -> None:
        a = list(args)
        kw = dict(kwargs)
        for i in dynamic:
            a[i] = _evaluate(a[i], values)
        for k in dynamic_kw:
            kw[k] = _evaluate(kw[k], values)
        method(*a, **kw)

    return run


def _evaluate(arg: Any, values: dict[str, Any]) -> Any:
    assert isinstance(arg, HostArg)
    return arg.fn(*[values[n] for n in arg.names])


def _bind_upload(part: _Partition, op: Upload) -> Step:
    address = part.address(op.dst)
    backend, dst = part.backend, op.dst

    def run(values: dict[str, Any]) -> None:
        array = np.ascontiguousarray(_evaluate(op.value, values), dtype=dst.dtype)
        if array.size != dst.size:
            raise InvalidArgumentError(
                f"{op.value.label}: {array.size} values for a tensor of shape {list(dst.shape)}"
            )
        if array.size:
            backend.copy_htod(address, array)

    return run


def _bind_transfer(src: _Partition, storage: Storage, dst: _Partition, mirror: Storage) -> Step:
    tensor_src = DeviceTensor(storage, 0, (storage.nbytes,), np.dtype(np.uint8))
    tensor_dst = DeviceTensor(mirror, 0, (mirror.nbytes,), np.dtype(np.uint8))
    src_ptr, dst_ptr = src.address(tensor_src), dst.address(tensor_dst)
    nbytes = storage.nbytes
    dst_view = dst.backend.host_view(dst_ptr, nbytes)
    src_view = src.backend.host_view(src_ptr, nbytes)
    staging = np.empty(nbytes, dtype=np.uint8)

    def run(values: dict[str, Any]) -> None:
        if dst_view is not None:
            src.backend.copy_dtoh(dst_view, src_ptr)
        elif src_view is not None:
            src.backend.synchronize()
            dst.backend.copy_htod(dst_ptr, src_view)
        else:
            src.backend.copy_dtoh(staging, src_ptr)
            dst.backend.copy_htod(dst_ptr, staging)

    return run


def _bind_download(part: _Partition, name: str, tensor: DeviceTensor) -> Step:
    address = part.address(tensor)
    backend = part.backend

    def run(values: dict[str, Any]) -> None:
        out = np.empty(tensor.shape, dtype=tensor.dtype)
        if out.size:
            backend.copy_dtoh(out, address)
        values[name] = out

    return run
