"""The shared base of every memory-owning backend: lifecycle, pointer table, copies, dispatch.

:class:`TableBackend` implements the whole public contract once, on top of small hooks a
concrete backend provides:

* device plumbing: :meth:`~TableBackend._open` / :meth:`~TableBackend._shutdown`,
  :meth:`~TableBackend._allocate` / :meth:`~TableBackend._release`,
  :meth:`~TableBackend._write` / :meth:`~TableBackend._read`, and optionally
  :meth:`~TableBackend._memory_limit` and :meth:`~TableBackend._borrow_payload`;
* one ``_exec_<op>(problem)`` hook per operation, which only ever sees a validated
  problem record (:mod:`computehal.validation`);
* :meth:`~TableBackend._native_dtypes`: which dtypes each hook handles itself.

Every public operation is generated from the signature in
:class:`~computehal.ComputeBackend` (:mod:`._operations`): it opens a lease on the pointer table (pinning the
operands until it returns), validates, and hands the problem to :meth:`TableBackend._dispatch`,
which applies the mechanisms written once for every backend:

* nothing to write: return; one value everywhere (a reduction over an empty axis, a
  convolution over zero channels): :meth:`_exec_fill`;
* an input overlapping an output (other than the very same range, for element-wise
  ops): the input is copied aside on the device first, so results are as if inputs
  were read first;
* a 16-bit dtype the hook does not take natively: operands are widened to float32 on
  the device (:meth:`_exec_cast`), the float32 hook runs, outputs are rounded back.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, ClassVar, ParamSpec, TypeVar

import numpy as np

from .. import validation as v
from ..backend import ALL_OPS, ComputeBackend
from ..dtypes import F32, as_float_dtype
from ..errors import (
    BackendError,
    DeviceError,
    InvalidArgumentError,
    NotInitializedError,
    OutOfMemoryError,
    UnsupportedError,
)
from ..memory import Allocation, AllocationInfo, PointerTable, Region, as_count, as_pointer
from ..types import BinaryOp, Capabilities, TileShape
from ._operations import check_writable, guarded, operation, unimplemented

__all__ = ["TableBackend", "guarded"]

P = ParamSpec("P")
R = TypeVar("R")

#: dtype names an op takes when its hook exists and says nothing else.
_F32_ONLY = frozenset({"float32"})
_WIDENED = frozenset({"float16", "bfloat16"})
#: Ops whose dtype is not a storage type of floating-point operands (no 16-bit widening).
_NEVER_WIDENED = frozenset({"cast", "copy_dtod", "gemm_mixed_precision"})


def _as_dtype(name: str) -> np.dtype[Any]:
    return np.dtype("uint8") if name == "uint8" else as_float_dtype(name)


class TableBackend(ComputeBackend):
    """A backend whose allocations live in a :class:`~computehal.memory.PointerTable`.

    Thread-safe: the table has its own lock, operations pin their operands, and
    ``init`` / ``close`` serialise on the backend's lock.

    Class attributes
    ----------------
    kind : str
        The :class:`~computehal.registry.BackendKind` name this backend registers as.
    handles_aliasing : frozenset of str
        Operations whose hooks cope with any overlap of inputs and outputs themselves,
        so the base does not copy inputs aside for them.
    fuses_conv_epilogue : bool
        True when ``_exec_conv2d_forward`` applies the residual and the activation of
        the convolution epilogue itself; otherwise the base runs the hook on the bare
        convolution and then the backend's own ``binary`` / ``unary`` hooks.
    """

    kind: ClassVar[str] = "cpu"
    handles_aliasing: ClassVar[frozenset[str]] = frozenset()
    fuses_conv_epilogue: ClassVar[bool] = False

    def __init__(self, device: int = 0) -> None:
        self._device_ordinal = as_count("device", device)
        self._table = PointerTable(release=self._release)
        self._table.close()  # no lease before init
        self._initialized = False
        self._lifecycle_lock = threading.Lock()
        self._dtype_cache: dict[str, frozenset[str]] | None = None
        self._native_cache: dict[str, frozenset[np.dtype[Any]]] = {}
        self._plans: dict[str, tuple[frozenset[np.dtype[Any]], Callable[[Any, v.Problem], None]]] = {}

    # ------------------------------------------------------------------ hooks

    def _open(self) -> None:
        """Create contexts, queues and compile what is needed; called by ``init``."""

    def _shutdown(self) -> None:
        """Release contexts, queues and caches; called by ``close`` once no operation runs."""

    @abc.abstractmethod
    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        """Allocate ``nbytes`` bytes; return (64-byte-aligned base address, payload)."""

    @abc.abstractmethod
    def _release(self, allocation: Allocation) -> None:
        """Free the memory behind ``allocation`` (never called for borrowed ranges).

        Called once no operation uses the allocation any more; for asynchronous
        devices, work already submitted may still read it (the runtime must keep it
        alive until that work completes, or the backend defers the release).
        """

    @abc.abstractmethod
    def _write(self, region: Region, data: memoryview) -> None:
        """Copy ``data`` (``region.nbytes`` bytes) into device memory at ``region``."""

    @abc.abstractmethod
    def _read(self, region: Region, out: memoryview) -> None:
        """Copy ``region.nbytes`` bytes of device memory at ``region`` into ``out``."""

    def _memory_limit(self) -> int | None:
        """Largest allocation that can succeed now (bytes), or None when unknown."""
        return None

    def _borrow_payload(self, address: int, nbytes: int, owner: object) -> Any:
        """The payload for memory borrowed at ``address``; raise UnsupportedError if impossible."""
        raise UnsupportedError(f"the {self.name()} backend cannot borrow memory it did not allocate")

    def _native_dtypes(self) -> Mapping[str, Iterable[str]]:
        """For each operation this backend implements, the dtype names its hook takes.

        Operations missing here raise :class:`UnsupportedError`; 16-bit dtypes missing
        for an op are run through float32 when ``cast`` takes them. The default: every
        op whose ``_exec_`` hook is overridden, float32 only.
        """
        return {op: _F32_ONLY for op in ALL_OPS if self._overrides(f"_exec_{op}")}

    def _dtype_note(self, dtype: str) -> str:
        """Why this backend lacks ``dtype`` (appended to the UnsupportedError), or ""."""
        return ""

    def _overrides(self, hook: str) -> bool:
        return getattr(type(self), hook, None) is not getattr(TableBackend, hook, None)

    # ------------------------------------------------------------------ dtypes

    def op_dtypes(self) -> dict[str, frozenset[str]]:
        """For each operation, every dtype name it takes on this backend (natively or widened)."""
        if self._dtype_cache is None:
            native = {op: frozenset(names) for op, names in self._native_dtypes().items()}
            widen = native.get("cast", frozenset()) >= {"float32"} | _WIDENED
            table = {}
            for op, names in native.items():
                extra = _WIDENED if widen and op not in _NEVER_WIDENED and "float32" in names else set()
                table[op] = names | extra
            self._native_cache = {op: frozenset(_as_dtype(n) for n in names) for op, names in native.items()}
            self._plans = {}
            self._dtype_cache = table
        return self._dtype_cache

    def _with_dtypes(self, caps: Capabilities) -> Capabilities:
        """``caps`` with ``op_dtypes`` and ``native_ops`` filled from this backend's table."""
        table = self.op_dtypes()
        ordered = tuple((op, table[op]) for op in ALL_OPS if op in table)
        return replace(caps, op_dtypes=ordered, native_ops=frozenset(table))

    # ------------------------------------------------------------------ lifecycle

    def init(self) -> None:
        with self._lifecycle_lock:
            if self._initialized:
                return
            try:
                self._open()
            except BackendError:
                raise
            except Exception as exc:
                raise DeviceError(f"{self.name()} backend failed to initialise: {exc}") from exc
            self._dtype_cache = None
            self.op_dtypes()
            self._table.reopen()
            self._initialized = True

    def is_initialized(self) -> bool:
        return self._initialized

    @property
    def device(self) -> int:
        """The device ordinal this backend was constructed for (``device`` of the constructor)."""
        return self._device_ordinal

    def _memory(self) -> PointerTable:
        """The pointer table, after checking that the backend is initialised."""
        if not self._initialized:
            raise NotInitializedError()
        return self._table

    @guarded
    def close(self) -> None:
        """Free every live allocation (borrowed ranges are only forgotten), then shut down.

        Operations running in other threads finish first. Afterwards the backend is
        uninitialised; :meth:`init` starts it afresh.
        """
        with self._lifecycle_lock:
            if not self._initialized:
                return
            self._initialized = False
        self._table.close(shutdown=self._shutdown)

    def recommended_tile_for(self, m: int, n: int, k: int) -> TileShape:
        """The default tile heuristic, after checking that the backend is initialised.

        A backend's tiles depend on the device that ``init`` selects, so, like every
        operation other than the introspection methods, this raises
        :class:`~computehal.NotInitializedError` before ``init``.
        """
        self._memory()
        return super().recommended_tile_for(m, n, k)

    def live_allocations(self) -> int:
        """Number of live allocations (owned and borrowed) on this backend."""
        return len(self._table)

    # ------------------------------------------------------------------ memory

    @guarded
    def alloc(self, bytes: int) -> int:
        table = self._memory()
        nbytes = as_count("bytes", bytes)
        if nbytes == 0:
            raise InvalidArgumentError("bytes must be >= 1 (alloc(0) is not allowed)")
        limit = self._memory_limit()
        if limit is not None and nbytes > limit:
            raise OutOfMemoryError(nbytes, limit)
        base, payload = self._allocate(nbytes)
        table.insert(Allocation(base, nbytes, payload))
        return base

    @guarded
    def free(self, ptr: int) -> None:
        self._memory().free("ptr", ptr)

    @guarded
    def freeze(self, ptr: int) -> None:
        self._memory().freeze("ptr", ptr)

    @guarded
    def copy_htod(self, dst: int, src: Any) -> None:
        table = self._memory()
        data = v.host_buffer("src", src, writable=False)
        with table.lease() as lease:
            region = lease.resolve("dst", dst, data.nbytes)
            check_writable("copy_htod", "dst", region)
            if data.nbytes:
                self._write(region, data)

    @guarded
    def copy_dtoh(self, dst: Any, src: int) -> None:
        table = self._memory()
        out = v.host_buffer("dst", dst, writable=True)
        with table.lease() as lease:
            region = lease.resolve("src", src, out.nbytes)
            if out.nbytes:
                self._read(region, out)

    @guarded
    def allocation_of(self, ptr: int) -> AllocationInfo | None:
        return self._memory().info(ptr)

    @guarded
    def borrow(self, address: int, nbytes: int, owner: object) -> int:
        table = self._memory()
        base, size = as_pointer("address", address), as_count("nbytes", nbytes)
        if size == 0:
            raise InvalidArgumentError("nbytes must be >= 1")
        payload = self._borrow_payload(base, size, owner)
        table.insert(Allocation(base, size, payload, borrowed=True))
        return base

    # ------------------------------------------------------------------ scratch

    def _scratch_range(self, nbytes: int) -> Region:
        """A private device range of ``nbytes`` bytes (not in the table); see :meth:`_drop_scratch`."""
        base, payload = self._allocate(max(nbytes, 1))
        return Region(Allocation(base, max(nbytes, 1), payload), 0, nbytes)

    def _drop_scratch(self, scratch: Region) -> None:
        """Release a range from :meth:`_scratch_range` (after the work using it was submitted)."""
        self._release(scratch.allocation)

    @contextmanager
    def _scratches(self) -> Iterator[list[Region]]:
        """Collects scratch ranges and drops them all on exit."""
        held: list[Region] = []
        try:
            yield held
        finally:
            for region in held:
                self._drop_scratch(region)

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, op: str, p: v.Problem) -> None:
        """Run a validated problem through the shared mechanisms and the backend's hook.

        An operation or dtype the backend does not offer raises UnsupportedError even
        for an empty problem: ``capabilities().dtypes(op)`` holds for every size. The
        common case (a native dtype, something to compute, no overlap) costs a few
        attribute tests: the cheap checks come first.
        """
        plan = self._plans.get(op)
        if plan is None:
            plan = self._plan(op)
        native, hook = plan
        if p.dtype not in native:
            self._dispatch_other(op, p)
            return
        if p.empty:
            return
        if p.CONSTANT_OUTPUT:
            constant = p.constant_output()
            if constant is not None:
                region, value = constant
                self._exec_fill(v.FillProblem(region, region.nbytes // p.dtype.itemsize, value, p.dtype))
                return
        if op in self.handles_aliasing or not p.overlapping():
            hook(self, p)
            return
        with self._scratches() as held:
            hook(self, self._copy_inputs_aside(p, held))

    def _plan(self, op: str) -> tuple[frozenset[np.dtype[Any]], Callable[[Any, v.Problem], None]]:
        """(dtypes the hook of ``op`` takes natively, the hook), cached until the next ``init``."""
        if self._dtype_cache is None:
            self.op_dtypes()
        hook = getattr(type(self), "_exec_" + op)
        if op == "conv2d_forward" and not self.fuses_conv_epilogue:
            hook = TableBackend._conv_forward_with_epilogue
        plan = (self._native_cache.get(op, frozenset()), hook)
        self._plans[op] = plan
        return plan

    def _dispatch_other(self, op: str, p: v.Problem) -> None:
        """A dtype the hook does not take natively: nothing to do, widen a 16-bit type, or refuse."""
        name = p.dtype.name
        if name not in self.op_dtypes().get(op, ()):
            note = self._dtype_note(name)
            raise UnsupportedError(f"{op} with dtype {name} on the {self.name()} backend{note}")
        if not p.empty:
            self._widen_and_dispatch(op, p)

    def _copy_inputs_aside(self, p: v.Problem, held: list[Region]) -> v.Problem:
        """``p`` with every input that overlaps an output replaced by a device copy."""
        outputs = [getattr(p, name) for name in p.OUTPUTS]
        changes: dict[str, Region] = {}
        for name in p.INPUTS:
            region = getattr(p, name)
            if region is None or not region.nbytes:
                continue
            for out in outputs:
                if out is None or not region.overlaps(out):
                    continue
                if name in p.IDENTICAL_OK and region == out:
                    continue
                copy = self._scratch_range(region.nbytes)
                held.append(copy)
                self._exec_copy_dtod(v.CopyProblem(copy, region, region.nbytes))
                changes[name] = copy
                break
        return p.retyped(p.dtype, changes) if changes else p

    def _widen_and_dispatch(self, op: str, p: v.Problem) -> None:
        """Run a 16-bit problem in float32: widen the operands, run, round the outputs back."""
        with self._scratches() as held:
            changes: dict[str, Region] = {}
            back: list[tuple[Region, Region, int]] = []
            for operand, region in p.regions():
                if not operand.is_float:
                    continue
                count = region.nbytes // p.dtype.itemsize
                wide = self._scratch_range(count * 4)
                held.append(wide)
                changes[operand.field] = wide
                if operand.role is not v.Role.OUT:
                    self._exec_cast(v.CastProblem(count, region, wide, p.dtype, F32))
                if operand.role is not v.Role.IN:
                    back.append((wide, region, count))
            self._dispatch(op, p.retyped(F32, changes))
            for wide, region, count in back:
                self._exec_cast(v.CastProblem(count, wide, region, F32, p.dtype))

    def _conv_forward_with_epilogue(self, p: v.ConvForwardProblem) -> None:
        """``conv2d_forward`` on a backend without a fused epilogue: the convolution, then
        the residual (``binary`` ADD) and the activation (``unary``), all on the device.

        A residual that is the output itself has the convolution written to scratch first.
        """
        if not p.has_epilogue:
            self._exec_conv2d_forward(p)
            return
        conv = replace(p, residual=None, activation=None)
        with self._scratches() as held:
            if p.residual is not None and p.residual == p.y:
                acc = self._scratch_range(p.y.nbytes)
                held.append(acc)
                conv = replace(conv, y=acc)
            if conv.c == 0 and conv.bias is None:
                self._exec_fill(v.FillProblem(conv.y, conv.y.nbytes // p.dtype.itemsize, 0.0, p.dtype))
            else:
                self._exec_conv2d_forward(conv)
            count = p.y.nbytes // p.dtype.itemsize
            result = conv.y
            if p.residual is not None:
                add = v.ElementwiseProblem(BinaryOp.ADD, count, result, p.residual, p.y, p.dtype)
                self._dispatch("binary", add)
                result = p.y
            if p.activation is not None:
                self._dispatch("unary", v.ElementwiseProblem(p.activation, count, result, None, p.y, p.dtype))

    # ------------------------------------------------------------------ operation hooks

    @abc.abstractmethod
    def _exec_gemm(self, p: v.GemmProblem) -> None:
        """Run a validated GEMM."""

    def _exec_batched_gemm(self, p: v.BatchedGemmProblem) -> None:
        """Run a validated strided batched GEMM; the default runs :meth:`_exec_gemm` per batch."""
        for i in range(p.batch_count):
            self._exec_gemm(p.batch(i))

    @abc.abstractmethod
    def _exec_copy_dtod(self, p: v.CopyProblem) -> None:
        """Copy ``p.nbytes`` bytes from ``p.src`` to ``p.dst`` (they do not overlap)."""

    @abc.abstractmethod
    def _exec_fill(self, p: v.FillProblem) -> None:
        """Set ``p.count`` elements of ``p.dtype`` at ``p.region`` to ``p.value``."""

    @abc.abstractmethod
    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        """Run a validated forward convolution (``p.x`` input, ``p.f`` filter, ``p.y`` output)."""

    @abc.abstractmethod
    def _exec_attention(self, p: v.AttentionProblem) -> None:
        """Run validated attention."""

    @abc.abstractmethod
    def _exec_reduce(self, p: v.AxisProblem) -> None:
        """Run a validated reduction (``p.op`` is set)."""

    @abc.abstractmethod
    def _exec_unary(self, p: v.ElementwiseProblem) -> None:
        """Run a validated unary op (``p.b`` is None)."""

    @abc.abstractmethod
    def _exec_binary(self, p: v.ElementwiseProblem) -> None:
        """Run a validated binary op."""

    def _exec_cast(self, p: v.CastProblem) -> None:
        """Convert ``p.n`` elements from ``p.dtype`` to ``p.out_dtype`` (also widens 16-bit types)."""
        raise UnsupportedError(f"cast is not implemented by the {self.name()} backend")

    # ------------------------------------------------------------------ public operations
    # Generated from the contract's signatures: lease, validate, dispatch.

    gemm = operation("gemm")
    batched_gemm = operation("batched_gemm")
    gemm_mixed_precision = operation("gemm_mixed_precision")
    conv2d_forward = operation("conv2d_forward")
    conv2d_backward_data = operation("conv2d_backward_data")
    conv2d_backward_filter = operation("conv2d_backward_filter")
    pool2d = operation("pool2d")
    attention = operation("attention")
    reduce = operation("reduce")
    softmax = operation("softmax")
    layer_norm = operation("layer_norm")
    rms_norm = operation("rms_norm")
    batch_norm = operation("batch_norm")
    lrn = operation("lrn")
    unary = operation("unary")
    binary = operation("binary")
    broadcast_binary = operation("broadcast_binary")
    cast = operation("cast")
    copy_dtod = operation("copy_dtod")
    fill = operation("fill")
    copy_strided = operation("copy_strided")
    gather = operation("gather")
    scatter = operation("scatter")


for _op in ALL_OPS:  # default hooks of the optional operations
    if not hasattr(TableBackend, f"_exec_{_op}"):
        setattr(TableBackend, f"_exec_{_op}", unimplemented(_op))
del _op
