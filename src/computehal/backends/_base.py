"""The shared base of every memory-owning backend: lifecycle, pointer table, copies, validation.

:class:`TableBackend` implements ``init`` / ``is_initialized`` / ``alloc`` / ``free``
/ ``copy_htod`` / ``copy_dtoh`` / ``close`` once, on top of small hooks a concrete
backend provides (:meth:`_open`, :meth:`_allocate`, :meth:`_release`, :meth:`_write`,
:meth:`_read`). It also implements every public operation once: the method checks
that the backend is initialised, validates all arguments through
:mod:`computehal.validation` into a problem record, and hands that record to the
backend's ``_exec_<op>`` hook. A backend therefore only ever sees validated problems,
and the public signatures (with their documentation on
:class:`~computehal.ComputeBackend`) are written in one place.
"""

from __future__ import annotations

import abc
import functools
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ParamSpec, TypeVar

from .. import validation as v
from ..backend import ComputeBackend
from ..errors import (
    BackendError,
    DeviceError,
    InvalidArgumentError,
    NotInitializedError,
    OutOfMemoryError,
    UnsupportedError,
)
from ..memory import Allocation, PointerTable, Region, as_count
from ..types import MixedPrecision, TileShape
from ..validation import host_buffer

__all__ = ["TableBackend", "guarded"]

P = ParamSpec("P")
R = TypeVar("R")


def guarded(method: Callable[P, R]) -> Callable[P, R]:
    """Let only :class:`BackendError` escape ``method``.

    ``MemoryError`` becomes :class:`OutOfMemoryError`; any other unexpected
    exception becomes :class:`DeviceError` chained to the original, so a bug
    still shows its traceback but never breaks the error contract.
    """

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except BackendError:
            raise
        except MemoryError as exc:
            raise OutOfMemoryError() from exc
        except Exception as exc:  # noqa: BLE001 - the contract is "only BackendError escapes"
            raise DeviceError(f"{method.__name__} failed: {type(exc).__name__}: {exc}") from exc

    return wrapper


def _shift(region: Region, nbytes: int) -> Region:
    """``region`` moved ``nbytes`` bytes further into its allocation (validated by the caller)."""
    return Region(region.allocation, region.offset + nbytes, region.nbytes)


class TableBackend(ComputeBackend):
    """A backend whose allocations live in a :class:`PointerTable`.

    Thread-safe: the table has its own lock, and ``init`` / ``close`` serialise on
    the backend's lock.
    """

    def __init__(self) -> None:
        self._table = PointerTable()
        self._initialized = False
        self._lifecycle_lock = threading.Lock()

    # ------------------------------------------------------------------ hooks

    def _open(self) -> None:
        """Create contexts, queues and compile what is needed; called once by ``init``."""

    @abc.abstractmethod
    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        """Allocate ``nbytes`` bytes; return (64-byte-aligned base address, payload)."""

    @abc.abstractmethod
    def _release(self, allocation: Allocation) -> None:
        """Free the memory behind ``allocation`` (never called for borrowed ranges)."""

    @abc.abstractmethod
    def _write(self, region: Region, data: memoryview) -> None:
        """Copy ``data`` (``region.nbytes`` bytes) into device memory at ``region``."""

    @abc.abstractmethod
    def _read(self, region: Region, out: memoryview) -> None:
        """Copy ``region.nbytes`` bytes of device memory at ``region`` into ``out``."""

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
            self._initialized = True

    def is_initialized(self) -> bool:
        return self._initialized

    def _memory(self) -> PointerTable:
        """The pointer table, after checking that the backend is initialised."""
        if not self._initialized:
            raise NotInitializedError()
        return self._table

    def close(self) -> None:
        """Free every allocation that is still live (borrowed ranges are only forgotten)."""
        for allocation in self._table.drain():
            if not allocation.borrowed:
                self._release(allocation)

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
        base, payload = self._allocate(nbytes)
        table.insert(Allocation(base, nbytes, payload))
        return base

    @guarded
    def free(self, ptr: int) -> None:
        allocation = self._memory().remove("ptr", ptr)
        if not allocation.borrowed:
            self._release(allocation)

    @guarded
    def copy_htod(self, dst: int, src: Any) -> None:
        table = self._memory()
        data = host_buffer("src", src, writable=False)
        region = table.resolve("dst", dst, data.nbytes)
        if data.nbytes:
            self._write(region, data)

    @guarded
    def copy_dtoh(self, dst: Any, src: int) -> None:
        table = self._memory()
        out = host_buffer("dst", dst, writable=True)
        region = table.resolve("src", src, out.nbytes)
        if out.nbytes:
            self._read(region, out)

    # ------------------------------------------------------------------ operations
    # Each public operation validates once, here, then calls the backend's hook.

    def _exec_unimplemented(self, operation: str) -> None:
        raise UnsupportedError(f"{operation} is not implemented by the {self.name()} backend")

    @abc.abstractmethod
    def _exec_gemm(self, p: v.GemmProblem) -> None:
        """Run a validated GEMM (``p.dtype`` float32 or float64)."""

    def _exec_batched_gemm(self, p: v.BatchedGemmProblem) -> None:
        """Run a validated strided batched GEMM; the default runs :meth:`_exec_gemm` per batch."""
        if p.empty:
            return
        g = p.gemm
        size = g.dtype.itemsize
        for i in range(p.batch_count):
            step = i * size
            self._exec_gemm(
                replace(
                    g,
                    a=_shift(g.a, step * p.stride_a),
                    b=_shift(g.b, step * p.stride_b),
                    c=_shift(g.c, step * p.stride_c),
                )
            )

    def _exec_gemm_mixed_precision(self, fmt: MixedPrecision, p: v.GemmProblem) -> None:
        """Run a validated float32 GEMM whose operands are rounded through ``fmt``."""
        self._exec_unimplemented("gemm_mixed_precision")

    @abc.abstractmethod
    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        """Run a validated forward convolution (``p.x`` input, ``p.f`` filter, ``p.y`` output)."""

    def _exec_conv2d_backward_data(self, p: v.ConvProblem) -> None:
        """Write the input gradient to ``p.x`` from ``p.y`` (output gradient) and ``p.f``."""
        self._exec_unimplemented("conv2d_backward_data")

    def _exec_conv2d_backward_filter(self, p: v.ConvProblem) -> None:
        """Write the filter gradient to ``p.f`` from ``p.x`` (input) and ``p.y`` (output gradient)."""
        self._exec_unimplemented("conv2d_backward_filter")

    @abc.abstractmethod
    def _exec_attention(self, p: v.AttentionProblem) -> None:
        """Run validated attention."""

    @abc.abstractmethod
    def _exec_reduce(self, p: v.AxisProblem) -> None:
        """Run a validated reduction (``p.op`` is set)."""

    def _exec_softmax(self, p: v.AxisProblem) -> None:
        """Run a validated softmax (``p.op`` is None)."""
        self._exec_unimplemented("softmax")

    @abc.abstractmethod
    def _exec_unary(self, p: v.ElementwiseProblem) -> None:
        """Run a validated unary op (``p.b`` is None)."""

    @abc.abstractmethod
    def _exec_binary(self, p: v.ElementwiseProblem) -> None:
        """Run a validated binary op."""

    def _exec_gather(self, p: v.RowsProblem) -> None:
        """Run a validated row gather."""
        self._exec_unimplemented("gather")

    def _exec_scatter(self, p: v.RowsProblem) -> None:
        """Run a validated row scatter (duplicates: the last occurrence wins)."""
        self._exec_unimplemented("scatter")

    @guarded
    def gemm(
        self,
        trans_a: Any,
        trans_b: Any,
        m: int,
        n: int,
        k: int,
        alpha: float,
        a_ptr: int,
        lda: int,
        b_ptr: int,
        ldb: int,
        beta: float,
        c_ptr: int,
        ldc: int,
        *,
        dtype: Any = "float64",
    ) -> None:
        table = self._memory()
        self._exec_gemm(
            v.gemm_problem(
                table, trans_a, trans_b, m, n, k, alpha, a_ptr, lda, b_ptr, ldb, beta, c_ptr, ldc, dtype
            )
        )

    @guarded
    def batched_gemm(
        self,
        trans_a: Any,
        trans_b: Any,
        m: int,
        n: int,
        k: int,
        alpha: float,
        a_ptr: int,
        lda: int,
        stride_a: int,
        b_ptr: int,
        ldb: int,
        stride_b: int,
        beta: float,
        c_ptr: int,
        ldc: int,
        stride_c: int,
        batch_count: int,
        *,
        dtype: Any = "float32",
    ) -> None:
        table = self._memory()
        self._exec_batched_gemm(
            v.batched_gemm_problem(
                table, trans_a, trans_b, m, n, k, alpha, a_ptr, lda, stride_a, b_ptr, ldb, stride_b,
                beta, c_ptr, ldc, stride_c, batch_count, dtype,
            )
        )  # fmt: skip

    @guarded
    def gemm_mixed_precision(
        self,
        prec: Any,
        trans_a: Any,
        trans_b: Any,
        m: int,
        n: int,
        k: int,
        alpha: float,
        a_ptr: int,
        lda: int,
        b_ptr: int,
        ldb: int,
        beta: float,
        c_ptr: int,
        ldc: int,
    ) -> None:
        table = self._memory()
        fmt = v.mixed_precision_format(prec)
        p = v.gemm_problem(
            table, trans_a, trans_b, m, n, k, alpha, a_ptr, lda, b_ptr, ldb, beta, c_ptr, ldc, "float32"
        )
        self._exec_gemm_mixed_precision(fmt, p)

    @guarded
    def conv2d_forward(
        self,
        input_ptr: int,
        input_shape: Any,
        filter_ptr: int,
        filter_shape: Any,
        output_ptr: int,
        output_shape: Any,
        stride: Any,
        padding: Any,
    ) -> None:
        table = self._memory()
        self._exec_conv2d_forward(
            v.conv_problem(
                table,
                ("input_ptr", input_ptr, input_shape),
                ("filter_ptr", filter_ptr, filter_shape),
                ("output_ptr", output_ptr, output_shape),
                stride,
                padding,
            )
        )

    @guarded
    def conv2d_backward_data(
        self,
        grad_output_ptr: int,
        grad_output_shape: Any,
        filter_ptr: int,
        filter_shape: Any,
        grad_input_ptr: int,
        grad_input_shape: Any,
        stride: Any,
        padding: Any,
    ) -> None:
        table = self._memory()
        self._exec_conv2d_backward_data(
            v.conv_problem(
                table,
                ("grad_input_ptr", grad_input_ptr, grad_input_shape),
                ("filter_ptr", filter_ptr, filter_shape),
                ("grad_output_ptr", grad_output_ptr, grad_output_shape),
                stride,
                padding,
            )
        )

    @guarded
    def conv2d_backward_filter(
        self,
        input_ptr: int,
        input_shape: Any,
        grad_output_ptr: int,
        grad_output_shape: Any,
        grad_filter_ptr: int,
        grad_filter_shape: Any,
        stride: Any,
        padding: Any,
    ) -> None:
        table = self._memory()
        self._exec_conv2d_backward_filter(
            v.conv_problem(
                table,
                ("input_ptr", input_ptr, input_shape),
                ("grad_filter_ptr", grad_filter_ptr, grad_filter_shape),
                ("grad_output_ptr", grad_output_ptr, grad_output_shape),
                stride,
                padding,
            )
        )

    @guarded
    def attention(
        self,
        q_ptr: int,
        k_ptr: int,
        v_ptr: int,
        o_ptr: int,
        batch: int,
        heads: int,
        seq_q: int,
        seq_kv: int,
        head_dim: int,
        scale: float,
        causal: bool,
    ) -> None:
        table = self._memory()
        self._exec_attention(
            v.attention_problem(
                table, q_ptr, k_ptr, v_ptr, o_ptr, batch, heads, seq_q, seq_kv, head_dim, scale, causal
            )
        )

    @guarded
    def reduce(self, op: Any, input_ptr: int, output_ptr: int, shape: Any, axis: int) -> None:
        table = self._memory()
        self._exec_reduce(v.axis_problem(table, op, input_ptr, output_ptr, shape, axis))

    @guarded
    def softmax(self, input_ptr: int, output_ptr: int, shape: Any, axis: int) -> None:
        table = self._memory()
        self._exec_softmax(v.axis_problem(table, None, input_ptr, output_ptr, shape, axis))

    @guarded
    def unary(self, op: Any, input_ptr: int, output_ptr: int, n: int) -> None:
        table = self._memory()
        self._exec_unary(v.unary_problem(table, op, input_ptr, output_ptr, n))

    @guarded
    def binary(self, op: Any, a_ptr: int, b_ptr: int, output_ptr: int, n: int) -> None:
        table = self._memory()
        self._exec_binary(v.binary_problem(table, op, a_ptr, b_ptr, output_ptr, n))

    @guarded
    def gather(self, input_ptr: int, indices: Any, output_ptr: int, rows: int, cols: int) -> None:
        table = self._memory()
        self._exec_gather(v.gather_problem(table, input_ptr, indices, output_ptr, rows, cols))

    @guarded
    def scatter(self, input_ptr: int, indices: Any, output_ptr: int, rows: int, cols: int) -> None:
        table = self._memory()
        self._exec_scatter(v.scatter_problem(table, input_ptr, indices, output_ptr, rows, cols))
