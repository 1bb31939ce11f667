"""CpuBackend: the exact reference backend on the host, built on NumPy and SciPy's BLAS.

Pointers are real host addresses of 64-byte-aligned NumPy byte buffers. GEMMs call
BLAS directly on the caller's memory with the caller's leading dimensions (no
operand copies); batched GEMMs split batches across threads. Stride-1 convolutions
(forward and both gradients) are per-filter-tap GEMMs on the zero-padded image, with
no im2col buffer; other strides use im2col + GEMM. Attention is tiled with an online
softmax, parallel over (head, query block). Memory-bound operations split across a
small thread pool (NumPy ufuncs release the GIL) so they use every core; multi-pass
ones (softmax, sigmoid) work on cache-sized blocks. ``computehal bench``
(:mod:`computehal.bench`) holds every operation against this machine's limits.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import validation as v
from ..backend import COMPUTE_OPS
from ..errors import OutOfMemoryError
from ..memory import ALIGNMENT, Allocation, Region
from ..types import (
    BinaryOp,
    Capabilities,
    DeviceInfo,
    MemoryKind,
    MixedPrecision,
    ReduceOp,
    UnaryOp,
)
from ._base import TableBackend
from ._blas import gemm_at
from ._common import refuse_extensions

__all__ = ["CpuBackend"]

_log = logging.getLogger(__name__)

F32 = np.dtype(np.float32)
FloatArray = npt.NDArray[np.floating[Any]]

#: Element-wise problems below this many elements run on the calling thread.
PARALLEL_THRESHOLD = 1 << 16
#: Batched GEMM hands each thread at least this many multiply-adds.
BATCH_GRAIN_FLOPS = 1 << 21

_OPS = frozenset(COMPUTE_OPS)
_F32 = frozenset({"float32"})
_F32_F64 = frozenset({"float32", "float64"})
_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
_BYTES = frozenset({"uint8"})

#: Element-wise and axis problems below this many elements stay on NumPy (no kernel dispatch).
KERNEL_THRESHOLD = 1 << 12

_pool: ThreadPoolExecutor | None = None
_kernels_lock = threading.Lock()
_kernels_module: Any = None


def _kernels() -> Any:
    """The compiled kernels (:mod:`._cpu_kernels`), or ``None`` where numba is unusable.

    Loaded once, on the first call that can use them; every kernel is compiled (or read
    from numba's cache) right then, so a numba that cannot compile is found here and
    the backend keeps its NumPy paths. ``COMPUTEHAL_CPU_KERNELS=0`` turns them off.
    """
    global _kernels_module
    if _kernels_module is None:
        with _kernels_lock:
            if _kernels_module is None:
                _kernels_module = _load_kernels()
    return _kernels_module or None


def _load_kernels() -> Any:
    if os.environ.get("COMPUTEHAL_CPU_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        from . import _cpu_kernels as kernels

        x = np.zeros(4, dtype=F32)
        rows = np.zeros((2, 4), dtype=F32)
        for fn in (kernels.exp_into, kernels.log_into, kernels.tanh_into, kernels.sigmoid_into):
            fn(x, x)
        kernels.softmax_rows(rows, rows)
        kernels.softmax_columns(rows, rows, 0, 4)
        kernels.extreme_columns(rows, x, 0, 4, True)
        kernels.extreme_columns(rows, x, 0, 4, False)
        kernels.exp_shifted_rowsum(rows, x[:2], x[2:])
    except Exception as exc:  # numba missing, or unable to compile here: NumPy paths stay
        _log.debug("computehal: compiled CPU kernels unavailable, using NumPy (%r)", exc)
        return False
    return kernels


@functools.cache
def _workers() -> int:
    """Threads to split work over: the CPUs this process may run on (read once)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _thread_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="computehal-cpu")
    return _pool


def _parallel_ranges(total: int, fn: Callable[[int, int], None], grain: int = PARALLEL_THRESHOLD) -> None:
    """Run ``fn(start, stop)`` over ``[0, total)`` split across the worker threads."""
    parts = min(_workers(), max(1, total // grain))
    if parts <= 1:
        fn(0, total)
        return
    bounds = [total * i // parts for i in range(parts + 1)]
    futures = [_thread_pool().submit(fn, bounds[i], bounds[i + 1]) for i in range(1, parts)]
    fn(bounds[0], bounds[1])
    for future in futures:
        future.result()


def _parallel_pull(count: int, worker: Callable[[Iterator[int]], None]) -> None:
    """Run ``worker(items)`` on every worker thread; all share one iterator over ``range(count)``.

    Each thread pulls the next index when it is free (CPython's GIL makes ``next`` on a
    range iterator atomic), so a thread slowed by other processes simply takes fewer
    items instead of holding everyone up at the end. ``worker`` sets up its per-thread
    scratch once and then iterates ``items``.
    """
    items = iter(range(count))
    parts = min(_workers(), count)
    if parts <= 1:
        worker(items)
        return
    futures = [_thread_pool().submit(worker, items) for _ in range(parts - 1)]
    try:
        worker(items)
    finally:
        for future in futures:
            future.result()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "host CPU"


def _memory_bytes() -> tuple[int, int]:
    """(total, available) physical memory in bytes, where the OS reports it."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):
        return 0, 0


_ZERO = np.float32(0)


def _relu(x: FloatArray, out: FloatArray) -> object:
    return np.fmax(x, _ZERO, out=out)


_UNARY: dict[UnaryOp, Callable[..., object]] = {
    UnaryOp.RELU: _relu,
    UnaryOp.TANH: np.tanh,
    UnaryOp.EXP: np.exp,
    UnaryOp.LOG: np.log,
    UnaryOp.SQRT: np.sqrt,
    UnaryOp.ABS: np.abs,
    UnaryOp.NEG: np.negative,
}


def _sigmoid(x: FloatArray, out: FloatArray) -> None:
    # 1 / (1 + exp(-x)): exp overflows to inf for very negative x, giving exactly 0.
    np.negative(x, out=out)
    np.exp(out, out=out)
    np.add(out, np.float32(1), out=out)
    np.reciprocal(out, out=out)


_UNARY[UnaryOp.SIGMOID] = _sigmoid

#: Unary ops with a compiled kernel (attribute of :mod:`._cpu_kernels`).
_UNARY_KERNELS = {
    UnaryOp.EXP: "exp_into",
    UnaryOp.LOG: "log_into",
    UnaryOp.TANH: "tanh_into",
    UnaryOp.SIGMOID: "sigmoid_into",
}

_BINARY: dict[BinaryOp, Callable[..., object]] = {
    BinaryOp.ADD: np.add,
    BinaryOp.SUB: np.subtract,
    BinaryOp.MUL: np.multiply,
    BinaryOp.DIV: np.divide,
    BinaryOp.MAX: np.fmax,
    BinaryOp.MIN: np.fmin,
}


class CpuBackend(TableBackend):
    """The host CPU: exact reference semantics at BLAS speed.

    Parameters
    ----------
    attention_block_q : int, optional
        Query rows per attention tile (default 256).
    attention_block_kv : int, optional
        Keys per attention tile (default 1024; the last chunk of a row may take up to
        half as many again). Extra memory stays
        O(block_q * (block_kv + head_dim)) per thread, whatever the sequence length.
    """

    def __init__(self, *, attention_block_q: int = 256, attention_block_kv: int = 1024) -> None:
        super().__init__()
        self._block_q = attention_block_q
        self._block_kv = attention_block_kv

    # ------------------------------------------------------------------ identity

    def name(self) -> str:
        return "cpu"

    def capabilities(self) -> Capabilities:
        return self._with_dtypes(Capabilities())

    def _native_dtypes(self) -> dict[str, frozenset[str]]:
        table = {op: _F32 for op in _OPS}
        table.update(gemm=_F32_F64, batched_gemm=_F32_F64, copy_dtod=_BYTES, fill=_FLOATS)
        return table

    def available_devices(self) -> list[DeviceInfo]:
        total, _ = _memory_bytes()
        return [
            DeviceInfo(
                ordinal=0,
                name=_cpu_name(),
                compute_capability=(0, 0),
                total_memory_bytes=total,
                memory_kind=MemoryKind.HOST,
                capabilities=self.capabilities(),
            )
        ]

    def synchronize(self) -> None:
        self._memory()  # everything runs synchronously; only the lifecycle is checked

    # ------------------------------------------------------------------ memory hooks

    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        try:
            raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
        except (MemoryError, ValueError):
            raise OutOfMemoryError(nbytes, _memory_bytes()[1] or None) from None
        shift = (-raw.ctypes.data) % ALIGNMENT
        buffer = raw[shift : shift + nbytes]
        return int(buffer.ctypes.data), buffer

    def _release(self, allocation: Allocation) -> None:
        allocation.payload = None  # the NumPy buffer is reclaimed with its last view

    def _write(self, region: Region, data: memoryview) -> None:
        self._bytes(region)[:] = np.frombuffer(data, dtype=np.uint8)

    def _read(self, region: Region, out: memoryview) -> None:
        np.frombuffer(out, dtype=np.uint8)[:] = self._bytes(region)

    def _exec_copy_dtod(self, p: v.CopyProblem) -> None:
        self._bytes(p.dst)[:] = self._bytes(p.src)

    def _exec_fill(self, p: v.FillProblem) -> None:
        with np.errstate(over="ignore"):
            self._bytes(p.region).view(p.dtype)[:] = np.asarray(p.value, dtype=np.float64).astype(p.dtype)

    # ------------------------------------------------------------------ views

    @staticmethod
    def _bytes(region: Region) -> npt.NDArray[np.uint8]:
        buffer: npt.NDArray[np.uint8] = region.payload
        return buffer[region.offset : region.offset + region.nbytes]

    @classmethod
    def _array(cls, region: Region, shape: tuple[int, ...], dtype: Any = F32) -> FloatArray:
        """A writable view of ``region`` as a C-contiguous array (the region was validated)."""
        array: FloatArray = cls._bytes(region).view(dtype).reshape(shape)
        return array

    @classmethod
    def _matrix(cls, region: Region, rows: int, cols: int, ld: int, dtype: np.dtype[Any]) -> FloatArray:
        """A view of a column-major ``rows x cols`` matrix with leading dimension ``ld``."""
        flat = cls._bytes(region).view(dtype)
        return np.lib.stride_tricks.as_strided(
            flat, shape=(rows, cols), strides=(dtype.itemsize, ld * dtype.itemsize), writeable=True
        )

    # ------------------------------------------------------------------ GEMM

    @staticmethod
    def _scale_c(p: v.GemmProblem, c_ptr: int) -> None:
        """BLAS quick return for k == 0 or alpha == 0: C = beta * C (write-only if beta == 0)."""
        gemm_at(p.dtype, False, False, p.m, p.n, 0, 0.0, c_ptr, max(1, p.m), c_ptr, 1, p.beta, c_ptr, p.ldc)

    @classmethod
    def _unaliased(cls, operand: Region, out: Region) -> tuple[int, Any]:
        """The address to read ``operand`` from: itself, or a copy when ``out`` overlaps it.

        BLAS leaves overlapping operands undefined (and the GPU backends read inputs as they
        were before the call), so an A or B that C overlaps is copied aside first. The copy is
        returned too, to keep it alive during the call.
        """
        if not out.overlaps(operand):
            return operand.ptr, None
        copy = cls._bytes(operand).copy()
        return int(copy.ctypes.data), copy

    @staticmethod
    def _run_gemm(p: v.GemmProblem, a: int, b: int, c: int) -> None:
        if p.empty:
            return
        if p.product_skipped:
            CpuBackend._scale_c(p, c)
            return
        gemm_at(p.dtype, p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a, p.lda, b, p.ldb, p.beta, c, p.ldc)

    def _exec_gemm(self, p: v.GemmProblem) -> None:
        (a, keep_a), (b, keep_b) = self._unaliased(p.a, p.c), self._unaliased(p.b, p.c)
        self._run_gemm(p, a, b, p.c.ptr)
        del keep_a, keep_b

    def _exec_batched_gemm(self, p: v.BatchedGemmProblem) -> None:
        if p.empty:
            return
        g = p.gemm
        size = g.dtype.itemsize
        (a0, keep_a), (b0, keep_b), c0 = self._unaliased(p.a, p.c), self._unaliased(p.b, p.c), p.c.ptr

        def run(start: int, stop: int) -> None:
            for i in range(start, stop):
                self._run_gemm(
                    g, a0 + i * p.stride_a * size, b0 + i * p.stride_b * size, c0 + i * p.stride_c * size
                )

        # Batches go to the worker threads, each with single-threaded BLAS, unless a C
        # matrix may alias an operand of another batch (then batch order matters).
        grain = max(1, BATCH_GRAIN_FLOPS // max(1, g.m * g.n * max(1, g.k)))
        if _workers() > 1 and p.batch_count >= 2 * grain and not (p.c.overlaps(p.a) or p.c.overlaps(p.b)):

            def pull(items: Iterator[int]) -> None:
                for j in items:
                    run(j * grain, min(p.batch_count, (j + 1) * grain))

            with _single_threaded_blas():
                _parallel_pull(-(-p.batch_count // grain), pull)
        else:
            run(0, p.batch_count)
        del keep_a, keep_b

    def _exec_gemm_mixed_precision(self, p: v.GemmProblem) -> None:
        fmt = p.prec
        assert fmt is not None
        if p.empty or p.product_skipped:
            self._run_gemm(p, p.a.ptr, p.b.ptr, p.c.ptr)
            return
        a = self._rounded(p.a, *p.a_shape, p.lda, fmt)
        b = self._rounded(p.b, *p.b_shape, p.ldb, fmt)
        gemm_at(
            F32, p.trans_a, p.trans_b, p.m, p.n, p.k, np.float32(p.alpha).item(),
            a.ctypes.data, a.shape[0], b.ctypes.data, b.shape[0],
            np.float32(p.beta).item(), p.c.ptr, p.ldc,
        )  # fmt: skip

    def _rounded(self, region: Region, rows: int, cols: int, ld: int, fmt: MixedPrecision) -> FloatArray:
        """A Fortran-ordered float32 copy of a stored matrix, rounded through ``fmt``."""
        import ml_dtypes

        narrow = np.float16 if fmt is MixedPrecision.F16 else ml_dtypes.bfloat16
        stored = self._matrix(region, rows, cols, ld, F32)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asfortranarray(stored.astype(narrow, order="F").astype(F32, order="F"))

    # ------------------------------------------------------------------ convolution

    @staticmethod
    def _padded(x: FloatArray, ph: int, pw: int) -> FloatArray:
        if ph == 0 and pw == 0:
            return x
        n, c, h, w = x.shape
        padded = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=F32)
        padded[:, :, ph : ph + h, pw : pw + w] = x
        return padded

    @staticmethod
    def _windows(p: v.ConvProblem, padded: FloatArray, r: int, s: int) -> FloatArray:
        """The input positions filter tap (r, s) reads, shape [N, C, Oh, Ow]."""
        return padded[:, :, r : r + p.sh * (p.oh - 1) + 1 : p.sh, s : s + p.sw * (p.ow - 1) + 1 : p.sw]

    def _im2col(self, p: v.ConvProblem, x: FloatArray) -> FloatArray:
        """Columns [N, C*Fh*Fw, Oh*Ow] such that output[n] = filter @ columns[n]."""
        if p.fh == p.fw == p.sh == p.sw == 1 and p.ph == p.pw == 0:
            return x.reshape(p.n, p.c, p.h * p.w)
        padded = self._padded(x, p.ph, p.pw)
        cols = np.empty((p.n, p.c, p.fh, p.fw, p.oh, p.ow), dtype=F32)

        def fill(start: int, stop: int) -> None:
            for r in range(p.fh):
                for s in range(p.fw):
                    cols[start:stop, :, r, s] = self._windows(p, padded[start:stop], r, s)

        _parallel_ranges(p.n, fill, grain=1)
        return cols.reshape(p.n, p.c * p.fh * p.fw, p.oh * p.ow)

    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        refuse_extensions("cpu", "conv2d_forward", p)
        if p.empty_output:
            return
        y = self._array(p.y, (p.n, p.k, p.oh * p.ow))
        if p.c == 0:
            y[...] = 0
            return
        x = self._array(p.x, (p.n, p.c, p.h, p.w))
        f = self._array(p.f, (p.k, p.c * p.fh * p.fw))
        if p.sh == p.sw == 1 and not (p.fh == p.fw == 1 and p.ph == p.pw == 0):
            taps = np.ascontiguousarray(f.reshape(p.k, p.c, p.fh, p.fw).transpose(2, 3, 1, 0))
            out = self._array(p.y, (p.n, p.k, p.oh, p.ow))
            target = np.empty_like(out) if self._overlaps(p.y, p.x) else out
            _conv_s1(x, taps, p.ph, p.pw, target)
            if target is not out:
                out[...] = target
            return
        cols = self._im2col(p, x)
        if self._overlaps(p.y, p.x, p.f):
            y[...] = np.matmul(f, cols)
        else:
            np.matmul(f, cols, out=y)

    @staticmethod
    def _overlaps(out: Region, *inputs: Region) -> bool:
        """True when ``out`` shares memory with any of ``inputs``."""
        return any(out.overlaps(region) for region in inputs)

    def _exec_conv2d_backward_data(self, p: v.ConvProblem) -> None:
        refuse_extensions("cpu", "conv2d_backward_data", p)
        gx = self._array(p.x, (p.n, p.c, p.h, p.w))
        if gx.size == 0:
            return
        if p.empty_output:
            gx[...] = 0
            return
        gy = self._array(p.y, (p.n, p.k, p.oh * p.ow))
        f = self._array(p.f, (p.k, p.c * p.fh * p.fw))
        if p.sh == p.sw == 1 and p.ph < p.fh and p.pw < p.fw and not (p.fh == p.fw == 1):
            # Stride 1: the data gradient is the forward convolution of the output gradient,
            # padded by (F - 1 - pad), with the filter flipped and its K and C swapped.
            taps = np.ascontiguousarray(
                f.reshape(p.k, p.c, p.fh, p.fw)[:, :, ::-1, ::-1].transpose(2, 3, 0, 1)
            )
            grad = gy.reshape(p.n, p.k, p.oh, p.ow)
            target = np.empty_like(gx) if self._overlaps(p.x, p.y) else gx
            _conv_s1(grad, taps, p.fh - 1 - p.ph, p.fw - 1 - p.pw, target)
            if target is not gx:
                gx[...] = target
            return
        gcols = np.matmul(f.T, gy).reshape(p.n, p.c, p.fh, p.fw, p.oh, p.ow)
        if p.fh == p.fw == p.sh == p.sw == 1 and p.ph == p.pw == 0:
            gx[...] = gcols.reshape(gx.shape)
            return
        gpad = np.zeros((p.n, p.c, p.h + 2 * p.ph, p.w + 2 * p.pw), dtype=F32)

        def accumulate(start: int, stop: int) -> None:
            for r in range(p.fh):
                for s in range(p.fw):
                    self._windows(p, gpad[start:stop], r, s)[...] += gcols[start:stop, :, r, s]

        _parallel_ranges(p.n, accumulate, grain=1)
        gx[...] = gpad[:, :, p.ph : p.ph + p.h, p.pw : p.pw + p.w]

    def _exec_conv2d_backward_filter(self, p: v.ConvProblem) -> None:
        refuse_extensions("cpu", "conv2d_backward_filter", p)
        gf = self._array(p.f, (p.k, p.c * p.fh * p.fw))
        if gf.size == 0:
            return
        if p.empty_output:
            gf[...] = 0
            return
        x = self._array(p.x, (p.n, p.c, p.h, p.w))
        gy = self._array(p.y, (p.n, p.k, p.oh * p.ow))
        if p.sh == p.sw == 1 and not (p.fh == p.fw == 1 and p.ph == p.pw == 0):
            taps = np.empty((p.fh, p.fw, p.k, p.c), dtype=F32)
            grad = gy.reshape(p.n, p.k, p.oh, p.ow)
            if _conv_s1_filter_grad(x, grad, p.fh, p.fw, p.ph, p.pw, taps):
                gf.reshape(p.k, p.c, p.fh, p.fw)[...] = taps.transpose(2, 3, 0, 1)
                return
        cols = self._im2col(p, x)
        crs, spatial = cols.shape[1], cols.shape[2]
        # grad_filter (K x CRS, row-major) = sum_n gy[n] @ cols[n]^T; in column-major terms
        # gf^T = cols[n] @ gy[n]^T, accumulated by BLAS with beta = 1 after the first image.
        target = gf if not self._overlaps(p.f, p.x, p.y) else np.empty_like(gf)
        for i in range(p.n):
            gemm_at(
                F32, True, False, crs, p.k, spatial, 1.0,
                cols[i].ctypes.data, spatial, gy[i].ctypes.data, spatial,
                0.0 if i == 0 else 1.0, target.ctypes.data, crs,
            )  # fmt: skip
        if target is not gf:
            gf[...] = target

    # ------------------------------------------------------------------ attention

    def _exec_attention(self, p: v.AttentionProblem) -> None:
        refuse_extensions("cpu", "attention", p)
        bh = p.batch * p.heads
        q = self._array(p.q, (bh, p.seq_q, p.head_dim))
        k = self._array(p.k, (bh, p.seq_kv, p.head_dim))
        val = self._array(p.v, (bh, p.seq_kv, p.head_dim))
        o = self._array(p.o, (bh, p.seq_q, p.head_dim))
        aliased = self._overlaps(p.o, p.q, p.k, p.v)
        target = np.empty_like(o) if aliased else o
        tasks = [(h, i0) for h in range(bh) for i0 in range(0, p.seq_q, self._block_q)]
        block_q, block_kv = min(self._block_q, p.seq_q), min(self._block_kv, p.seq_kv)

        def run(items: Iterator[int]) -> None:
            # Per-thread scratch, reused by every tile: scores of one query block against
            # one key block.
            scratch = np.empty(block_q * (block_kv + block_kv // 2 + 1), dtype=F32)
            upper = np.arange(block_q)[None, :] >= np.arange(block_q)[:, None]
            for t in items:
                h, i0 = tasks[t]
                self._attention_block(p, q[h], k[h], val[h], target[h], i0, scratch, upper)

        with _single_threaded_blas():
            _parallel_pull(len(tasks), run)
        if aliased:
            o[...] = target

    def _attention_block(
        self,
        p: v.AttentionProblem,
        q: FloatArray,
        k: FloatArray,
        val: FloatArray,
        o: FloatArray,
        i0: int,
        scratch: FloatArray,
        upper: npt.NDArray[np.bool_],
    ) -> None:
        """Online-softmax attention for query rows [i0, i0 + block) of one head.

        Keys are visited in chunks of ``block_kv``. Under a causal mask, keys no row of
        the block sees are never touched, and the mask is written only over the
        diagonal columns (keys some rows see and others do not); ``upper`` is the
        cached ``[block_q, block_q]`` mask ``t >= u`` of the usual diagonal block.
        """
        i1 = min(i0 + self._block_q, p.seq_q)
        rows = i1 - i0
        qs = q[i0:i1] * np.float32(p.scale)
        row_max = np.full(rows, -np.inf, dtype=F32)
        row_sum = np.zeros(rows, dtype=F32)
        kernels = _kernels()
        block_sum = np.empty(rows, dtype=F32)
        acc = np.zeros((rows, p.head_dim), dtype=F32)
        if p.causal:
            # Row i sees key j iff j <= i + offset.
            kv_end = max(0, min(p.seq_kv, i1 + p.causal_offset))
            open_end = max(0, min(kv_end, i0 + p.causal_offset + 1))
        else:
            kv_end = open_end = p.seq_kv
        # Equal chunks of at most 1.5 x block_kv keys: no thin remainder chunk, whose
        # fixed per-chunk cost (a dozen NumPy calls) would outweigh its work.
        chunks = max(1, (2 * kv_end + self._block_kv) // (2 * self._block_kv)) if kv_end else 0
        bounds = [kv_end * c // max(1, chunks) for c in range(chunks + 1)]
        for j0, j1 in zip(bounds[:-1], bounds[1:], strict=True):
            scores = scratch[: rows * (j1 - j0)].reshape(rows, j1 - j0)
            np.matmul(qs, k[j0:j1].T, out=scores)
            if j1 > open_end:
                # Only the diagonal columns [m0, j1) are partly hidden: key m0 + t is
                # hidden from row i0 + u iff t - u > i0 + offset - m0.
                m0 = max(j0, open_end)
                limit = i0 + p.causal_offset - m0
                if limit == -1 and j1 - m0 <= upper.shape[1]:
                    hidden = upper[:rows, : j1 - m0]  # the usual case: t >= u
                else:
                    hidden = np.arange(j1 - m0)[None, :] - np.arange(rows)[:, None] > limit
                np.copyto(scores[:, m0 - j0 :], np.float32(-np.inf), where=hidden)
            block_max = np.max(scores, axis=1)
            new_max = np.maximum(row_max, block_max)
            # Rows that have seen no key yet keep a finite reference so exp() gives 0.
            safe_max = np.where(np.isneginf(new_max), np.float32(0), new_max)
            correction = np.exp(row_max - safe_max)
            row_sum *= correction
            if kernels is not None:
                kernels.exp_shifted_rowsum(scores, safe_max, block_sum)
                row_sum += block_sum
            else:
                np.subtract(scores, safe_max[:, None], out=scores)
                np.exp(scores, out=scores)
                row_sum += np.add.reduce(scores, axis=1)
            acc *= correction[:, None]
            acc += scores @ val[j0:j1]
            row_max = new_max
        with np.errstate(invalid="ignore", divide="ignore"):
            np.divide(acc, row_sum[:, None], out=o[i0:i1])
        o[i0:i1][row_sum <= 0] = 0

    # ------------------------------------------------------------------ reductions

    def _exec_reduce(self, p: v.AxisProblem) -> None:
        out = self._array(p.output, (p.outer, p.inner))
        if out.size == 0:
            return
        x = self._array(p.input, (p.outer, p.length, p.inner))
        aliased = p.output.overlaps(p.input)
        target = np.empty_like(out) if aliased else out
        if (
            p.op in (ReduceOp.MAX, ReduceOp.MIN)
            and p.inner >= 64
            and x.size >= KERNEL_THRESHOLD
            and (kernels := _kernels()) is not None
        ):
            # Strided axis: each thread streams whole contiguous rows (a share of the
            # reduced axis) into its own accumulator row; the few partial rows are then
            # folded together (NumPy's fmax.reduce along axis 0 runs below bandwidth).
            largest = p.op is ReduceOp.MAX
            parts = max(1, min(_workers(), p.length))
            partial = np.empty((p.outer, parts, p.inner), dtype=F32)
            cuts = [p.length * i // parts for i in range(parts + 1)]

            def run_parts(start: int, stop: int) -> None:
                for t in range(start, stop):
                    o, i = divmod(t, parts)
                    kernels.extreme_columns(x[o, cuts[i] : cuts[i + 1]], partial[o, i], 0, p.inner, largest)

            _parallel_ranges(p.outer * parts, run_parts, grain=1)
            fold = np.fmax if largest else np.fmin
            fold.reduce(partial, axis=1, out=target)
            if aliased:
                out[...] = target
            return

        def run(start: int, stop: int) -> None:
            self._reduce_rows(p, x[start:stop], target[start:stop])

        if p.outer > 1:
            _parallel_ranges(p.outer, run, grain=max(1, PARALLEL_THRESHOLD // max(1, p.length * p.inner)))
        else:
            # One outer slice: split the kept (inner) axis instead.
            def run_inner(start: int, stop: int) -> None:
                self._reduce_rows(p, x[:, :, start:stop], target[:, start:stop])

            _parallel_ranges(p.inner, run_inner, grain=max(1, PARALLEL_THRESHOLD // max(1, p.length)))
        if aliased:
            out[...] = target

    @staticmethod
    def _reduce_rows(p: v.AxisProblem, x: FloatArray, out: FloatArray) -> None:
        if p.op is ReduceOp.MAX:
            np.fmax.reduce(x, axis=1, initial=-np.inf, out=out)
        elif p.op is ReduceOp.MIN:
            np.fmin.reduce(x, axis=1, initial=np.inf, out=out)
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                np.add.reduce(x, axis=1, out=out)
                if p.op is ReduceOp.MEAN and p.length:
                    np.divide(out, np.float32(p.length), out=out)

    def _exec_softmax(self, p: v.AxisProblem) -> None:
        refuse_extensions("cpu", "softmax", p)
        if p.outer * p.length * p.inner == 0:
            return
        x = self._array(p.input, (p.outer, p.length, p.inner))
        out = self._array(p.output, (p.outer, p.length, p.inner))
        same = p.input.offset == p.output.offset and p.input.allocation is p.output.allocation
        if p.output.overlaps(p.input) and not same:
            x = x.copy()
        kernels = _kernels() if x.size >= KERNEL_THRESHOLD else None
        if kernels is not None:
            self._softmax_compiled(kernels, p, x, out)
            return

        if p.inner == 1 or p.length * p.inner <= AXIS_BLOCK:
            # Cache-sized blocks of whole slices: every pass of _softmax_slices over a
            # block hits L2, so memory sees one read and one write per element.
            blocks, per_block = _axis_blocks(p.outer, p.length, p.inner)

            def run(start: int, stop: int) -> None:
                for o0, o1, i0, i1 in blocks[start:stop]:
                    _softmax_slices(x[o0:o1, :, i0:i1], out[o0:o1, :, i0:i1])

            _parallel_ranges(len(blocks), run, grain=max(1, PARALLEL_THRESHOLD // per_block))
            return
        # The axis is strided (inner > 1): stream contiguous rows instead, in panels of
        # columns, one panel per thread (see _softmax_columns).
        width = max(256, -(-p.inner // _workers()))
        panels = [
            (o, i0, min(p.inner, i0 + width)) for o in range(p.outer) for i0 in range(0, p.inner, width)
        ]

        def run_panels(start: int, stop: int) -> None:
            for o, i0, i1 in panels[start:stop]:
                _softmax_columns(x[o, :, i0:i1], out[o, :, i0:i1])

        _parallel_ranges(len(panels), run_panels, grain=max(1, PARALLEL_THRESHOLD // (p.length * width)))

    @staticmethod
    def _softmax_compiled(kernels: Any, p: v.AxisProblem, x: FloatArray, out: FloatArray) -> None:
        """Softmax with the compiled fused kernels (``out`` may be ``x``, or not overlap it)."""
        if p.inner == 1:
            rows_x = x.reshape(p.outer, p.length)
            rows_out = out.reshape(p.outer, p.length)

            def run_rows(start: int, stop: int) -> None:
                kernels.softmax_rows(rows_x[start:stop], rows_out[start:stop])

            _parallel_ranges(p.outer, run_rows, grain=max(1, PARALLEL_THRESHOLD // p.length))
            return
        # Strided axis: each thread takes whole column ranges of an outer slice (see
        # softmax_columns); wide ranges keep the inner loops long.
        width = max(64, -(-p.inner // _workers()))
        panels = [
            (o, c0, min(p.inner, c0 + width)) for o in range(p.outer) for c0 in range(0, p.inner, width)
        ]

        def run_panels(start: int, stop: int) -> None:
            for o, c0, c1 in panels[start:stop]:
                kernels.softmax_columns(x[o], out[o], c0, c1)

        _parallel_ranges(len(panels), run_panels, grain=max(1, PARALLEL_THRESHOLD // (p.length * width)))

    # ------------------------------------------------------------------ element-wise

    def _elementwise(
        self,
        p: v.ElementwiseProblem,
        apply: Callable[..., object],
        block: int = 0,
        kernel: Callable[[FloatArray, FloatArray], None] | None = None,
    ) -> None:
        """Run ``apply(*inputs, out=out)`` over the problem, split across threads when large.

        ``block`` > 0 also cuts each thread's range into blocks of that many elements, so
        that multi-pass operations (sigmoid) run every pass on cache-resident data.
        ``kernel(x, out)``, a compiled unary kernel, replaces ``apply`` on problems of at
        least ``KERNEL_THRESHOLD`` elements whose output does not partly overlap the input.
        """
        n = p.n
        if n == 0:
            return
        a = np.ndarray((n,), dtype=F32, buffer=p.a.payload, offset=p.a.offset)
        out = np.ndarray((n,), dtype=F32, buffer=p.out.payload, offset=p.out.offset)
        operands = [a]
        if p.b is not None:
            operands.append(np.ndarray((n,), dtype=F32, buffer=p.b.payload, offset=p.b.offset))
        if n < PARALLEL_THRESHOLD:
            # One NumPy call: it resolves any overlap between operands itself.
            with np.errstate(all="ignore"):
                apply(*operands, out=out)
            return
        inputs = [p.a] if p.b is None else [p.a, p.b]
        if any(p.out.overlaps(r) and r.offset != p.out.offset for r in inputs):
            # NumPy resolves the partial overlap with a temporary; splitting would race.
            with np.errstate(all="ignore"):
                apply(*operands, out=out)
            return
        if kernel is not None and n >= KERNEL_THRESHOLD:
            compiled = kernel

            def run_kernel(start: int, stop: int) -> None:
                compiled(a[start:stop], out[start:stop])

            _parallel_ranges(n, run_kernel)
            return
        step = block if block > 0 else n

        def run(start: int, stop: int) -> None:
            with np.errstate(all="ignore"):
                for lo in range(start, stop, step):
                    hi = min(stop, lo + step)
                    apply(*(x[lo:hi] for x in operands), out=out[lo:hi])

        _parallel_ranges(n, run)

    def _exec_unary(self, p: v.ElementwiseProblem) -> None:
        refuse_extensions("cpu", "unary", p)
        assert isinstance(p.op, UnaryOp)
        kernel = None
        if p.op in _UNARY_KERNELS and p.n >= KERNEL_THRESHOLD and (kernels := _kernels()) is not None:
            kernel = getattr(kernels, _UNARY_KERNELS[p.op])
        self._elementwise(p, _UNARY[p.op], block=AXIS_BLOCK if p.op is UnaryOp.SIGMOID else 0, kernel=kernel)

    def _exec_binary(self, p: v.ElementwiseProblem) -> None:
        refuse_extensions("cpu", "binary", p)
        assert isinstance(p.op, BinaryOp)
        self._elementwise(p, _BINARY[p.op])

    # ------------------------------------------------------------------ gather / scatter

    def _exec_gather(self, p: v.RowsProblem) -> None:
        refuse_extensions("cpu", "gather", p)
        indices = p.indices
        assert indices is not None
        if indices.size == 0 or p.cols == 0:
            return
        table = self._array(p.input, (p.rows, p.cols))
        out = self._array(p.output, (indices.size, p.cols))
        if p.output.overlaps(p.input):
            table = table.copy()

        def run(start: int, stop: int) -> None:
            # The indices were validated; mode="clip" lets take() write straight into
            # `out` (mode="raise" buffers the whole result and copies it again).
            np.take(table, indices[start:stop], axis=0, out=out[start:stop], mode="clip")

        _parallel_ranges(indices.size, run, grain=max(1, PARALLEL_THRESHOLD // p.cols))

    def _exec_scatter(self, p: v.RowsProblem) -> None:
        refuse_extensions("cpu", "scatter", p)
        indices = p.indices
        assert indices is not None
        if indices.size == 0 or p.cols == 0:
            return
        src = self._array(p.input, (indices.size, p.cols))
        out = self._array(p.output, (p.rows, p.cols))
        if p.output.overlaps(p.input):
            src = src.copy()
        destinations, sources = v.last_occurrences(indices)
        grain = max(1, PARALLEL_THRESHOLD // p.cols)
        if destinations.size == indices.size:
            # Distinct rows: every source row lands once, in any order.
            def run_distinct(start: int, stop: int) -> None:
                out[indices[start:stop]] = src[start:stop]

            _parallel_ranges(indices.size, run_distinct, grain=grain)
            return
        chunk = max(1, min(256, (1 << 16) // p.cols))

        def run(start: int, stop: int) -> None:
            buffer = np.empty((min(chunk, stop - start), p.cols), dtype=F32)
            for lo in range(start, stop, chunk):
                hi = min(stop, lo + chunk)
                rows = buffer[: hi - lo]
                np.take(src, sources[lo:hi], axis=0, out=rows, mode="clip")
                out[destinations[lo:hi]] = rows

        _parallel_ranges(destinations.size, run, grain=grain)


# --------------------------------------------------------------------------- stride-1 convolution
#
# A stride-1 convolution over a zero-padded image is, for each filter tap (r, s), one
# GEMM on the padded image shifted by r * Wp + s pixels: output row oh, column ow of
# the "padded-width" output (Oh * Wp positions) reads input (oh + r, ow + s). The
# columns ow >= Ow of each output row wrap into the next padded row and are discarded.
# So no im2col buffer is built: the only copies are the padding and the output, and
# the taps accumulate in BLAS (beta = 1). The padded image is stored channels-last
# ([Hp * Wp, C]) so that the filter is BLAS's small A operand (K x C) and the image
# its B operand (C x positions, leading dimension C), the faster shape for OpenBLAS.


def _pad_flat(image: FloatArray, ph: int, pw: int, fw: int, buffer: FloatArray) -> FloatArray:
    """Write ``image`` [C, H, W] zero-padded into ``buffer`` (flat, [C, Hp, Wp] + fw spare)."""
    c, h, w = image.shape
    hp, wp = h + 2 * ph, w + 2 * pw
    body = buffer[: c * hp * wp].reshape(c, hp, wp)
    if ph:
        body[:, :ph] = 0
        body[:, ph + h :] = 0
    if pw:
        body[:, ph : ph + h, :pw] = 0
        body[:, ph : ph + h, pw + w :] = 0
    body[:, ph : ph + h, pw : pw + w] = image
    buffer[c * hp * wp :] = 0
    return buffer


def _conv_s1(images: FloatArray, taps: FloatArray, ph: int, pw: int, out: FloatArray) -> None:
    """Stride-1 convolution of ``images`` [N, Cin, H, W] with ``taps`` [Fh, Fw, Cin, Kout].

    ``out`` is [N, Kout, Oh, Ow]; images are split across the worker threads, each
    running single-threaded BLAS (one image alone uses the threaded BLAS instead).
    """
    n, cin, h, w = images.shape
    fh, fw, kout = taps.shape[0], taps.shape[1], taps.shape[3]
    hp, wp = h + 2 * ph, w + 2 * pw
    oh, ow = out.shape[2], out.shape[3]
    span = oh * wp

    def run(items: Iterator[int]) -> None:
        # Channels-last padded image with fw spare pixels for the last taps' overrun;
        # the borders stay zero, only the interior is rewritten per image.
        padded = np.zeros((hp * wp + fw, cin), dtype=F32)
        interior = padded[: hp * wp].reshape(hp, wp, cin)[ph : ph + h, pw : pw + w]
        wide = np.empty((span, kout), dtype=F32)
        base = padded.ctypes.data
        for i in items:
            interior[...] = images[i].transpose(1, 2, 0)
            first = True
            for r in range(fh):
                for s in range(fw):
                    # wide (col-major Kout x span) (+)= tap (Kout x Cin) @ shifted (Cin x span).
                    gemm_at(
                        F32, False, False, kout, span, cin, 1.0,
                        taps[r, s].ctypes.data, kout, base + 4 * cin * (r * wp + s), cin,
                        0.0 if first else 1.0, wide.ctypes.data, kout,
                    )  # fmt: skip
                    first = False
            out[i] = wide.reshape(oh, wp, kout)[:, :ow, :].transpose(2, 0, 1)

    if n >= 2:
        with _single_threaded_blas():
            _parallel_pull(n, run)
    else:
        run(iter(range(n)))


def _conv_s1_filter_grad(
    images: FloatArray, grad: FloatArray, fh: int, fw: int, ph: int, pw: int, out: FloatArray
) -> bool:
    """Filter gradient of a stride-1 convolution; ``out`` is [Fh, Fw, K, C] (row-major).

    ``images`` [N, C, H, W], ``grad`` [N, K, Oh, Ow]. For tap (r, s):
    ``out[r, s] = sum_n grad'[n] @ shifted[n]^T`` where ``grad'`` is the gradient spread
    to the padded width with zeros in the wrapped columns. Those zeros multiply real
    input values, which is exact only when they are finite: returns False (leaving
    ``out`` unspecified) when an image holds inf or NaN, so the caller can take the
    exact im2col route.
    """
    n, c, h, w = images.shape
    k, oh, ow = grad.shape[1], grad.shape[2], grad.shape[3]
    hp, wp = h + 2 * ph, w + 2 * pw
    span = oh * wp
    partials: list[FloatArray] = []
    finite = [True]
    lock = threading.Lock()

    def run(items: Iterator[int]) -> None:
        padded = np.empty(c * hp * wp + fw, dtype=F32)
        wide = np.zeros((k, oh, wp), dtype=F32)
        acc = np.zeros((fh, fw, k, c), dtype=F32)
        with lock:
            partials.append(acc)
        for i in items:
            _pad_flat(images[i], ph, pw, fw, padded)
            if not np.isfinite(padded).all():
                finite[0] = False
                return
            wide[:, :, :ow] = grad[i]
            base = padded.ctypes.data
            for r in range(fh):
                for s in range(fw):
                    # acc[r, s]^T [C x K] += shifted [C x span] @ wide^T [span x K], column-major.
                    gemm_at(
                        F32, True, False, c, k, span, 1.0,
                        base + 4 * (r * wp + s), hp * wp, wide.ctypes.data, span,
                        1.0, acc[r, s].ctypes.data, c,
                    )  # fmt: skip

    if n >= 2:
        with _single_threaded_blas():
            _parallel_pull(n, run)
    else:
        run(iter(range(n)))
    if not finite[0]:
        return False
    np.sum(partials, axis=0, out=out)
    return True


#: Elements per block of a blocked axis operation (256 KiB of float32: half of L2).
AXIS_BLOCK = 1 << 16


def _axis_blocks(outer: int, length: int, inner: int) -> tuple[list[tuple[int, int, int, int]], int]:
    """Split an [outer, length, inner] axis problem into cache-sized blocks.

    Returns ``(blocks, elements_per_block)`` with blocks ``(o0, o1, i0, i1)``; each block
    keeps whole slices along the axis. Kept-axis panels are at least 64 wide so the
    strided passes still run long inner loops.
    """
    length = max(1, length)
    width = inner if inner * length <= AXIS_BLOCK else min(inner, max(64, AXIS_BLOCK // length))
    rows = max(1, AXIS_BLOCK // (length * width))
    blocks = [
        (o0, min(outer, o0 + rows), i0, min(inner, i0 + width))
        for o0 in range(0, outer, rows)
        for i0 in range(0, inner, width)
    ]
    return blocks, min(outer, rows) * length * width


def _softmax_columns(x: FloatArray, out: FloatArray) -> None:
    """Softmax down the columns (axis 0) of a [length, width] row-major panel; ``out`` may be ``x``.

    Three passes of contiguous rows: the column maxima, then ``exp(x - max)`` written to
    ``out`` block by block (each block summed while it is in cache), then the division.
    """
    length, width = x.shape
    peak = np.fmax.reduce(x, axis=0, initial=-np.inf)
    total = np.zeros(width, dtype=F32)
    rows = max(1, AXIS_BLOCK // width)
    with np.errstate(invalid="ignore", over="ignore"):
        for r0 in range(0, length, rows):
            block = out[r0 : r0 + rows]
            np.subtract(x[r0 : r0 + rows], peak, out=block)
            np.exp(block, out=block)
            total += np.add.reduce(block, axis=0)
        for r0 in range(0, length, rows):
            block = out[r0 : r0 + rows]
            np.divide(block, total, out=block)


def _softmax_slices(x: FloatArray, out: FloatArray) -> None:
    """Softmax over axis 1 of [outer, length, inner] views; ``out`` may be ``x``."""
    peak = np.fmax.reduce(x, axis=1, initial=-np.inf, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        np.subtract(x, peak, out=out)
        np.exp(out, out=out)
        total = np.add.reduce(out, axis=1, keepdims=True)
        np.divide(out, total, out=out)


_blas_controller: Any = None
_blas_lock = threading.Lock()
_blas_users = 0
_blas_limiter: Any = None


@contextmanager
def _single_threaded_blas() -> Iterator[None]:
    """Run BLAS single-threaded inside the block (our own threads split the work).

    The threadpoolctl controller is built once: ``threadpool_limits`` rescans every
    loaded library on each use, which costs milliseconds per call. The limit is
    reference-counted, so overlapping blocks from several caller threads restore the
    original thread count only when the last one leaves (nested save/restore pairs
    would otherwise leave BLAS single-threaded for good).
    """
    global _blas_controller, _blas_users, _blas_limiter
    with _blas_lock:
        if _blas_controller is None:
            try:
                import scipy.linalg.cython_blas  # noqa: F401  (load SciPy's BLAS before the scan)
                from threadpoolctl import ThreadpoolController
            except ImportError:
                _blas_controller = False
            else:
                _blas_controller = ThreadpoolController()
        if _blas_controller is not False:
            if _blas_users == 0:
                _blas_limiter = _blas_controller.limit(limits=1, user_api="blas")
            _blas_users += 1
    try:
        yield
    finally:
        if _blas_controller is not False:
            with _blas_lock:
                _blas_users -= 1
                if _blas_users == 0 and _blas_limiter is not None:
                    _blas_limiter.restore_original_limits()
                    _blas_limiter = None
