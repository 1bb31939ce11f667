"""The CPU benchmark suite: every CpuBackend operation against this machine's own limits.

One run measures the machine's ceilings (a direct SciPy BLAS ``dgemm`` / ``sgemm`` call,
``numpy.matmul`` on stacked arrays, and a large-array copy that uses every core) and
then every :class:`~computehal.backends.cpu.CpuBackend` operation at the sizes of the
performance issue. Each operation is timed *interleaved* with the limit it is held
against (limit, op, limit, op, ...) in the same process, and the medians are compared,
so that the load of other processes on a shared machine affects both sides alike.

For every row the suite prints the achieved rate (GFLOP/s or GB/s), the limit, their
ratio, the target and PASS/FAIL; it writes the results as JSON and, when matplotlib is
importable, a roofline plot placing each operation under the measured compute and
bandwidth ceilings.

Run it as ``computehal bench`` or ``python benchmarks/bench_cpu.py`` (``--quick`` for a
short run with small sizes). Rates are medians; the comparison is what matters, the
absolute figures on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__all__ = ["BenchResult", "Sizes", "main", "run_suite"]

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
MIB = 1 << 20

Compare = Literal["time", "rate", "value_max"]


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one suite run (the defaults are those of the performance issue)."""

    gemm: int = 2048
    batch: int = 64
    batch_dim: int = 256
    conv: tuple[int, int, int, int, int] = (8, 64, 64, 56, 56)  # N, C, K, H, W (3x3, stride 1, pad 1)
    attention: tuple[int, int, int, int] = (4, 8, 2048, 64)  # B, H, S, D
    attention_memory_seq: int = 16384
    elementwise: int = 1 << 24
    matrix: int = 4096  # softmax / reduce are matrix x matrix
    rows: int = 4096  # gather / scatter move `rows` rows of `row_len` floats
    row_len: int = 4096
    table_rows: int = 16384
    copy_elements: int = 1 << 24
    repeats: int = 9
    overhead_calls: int = 2000

    @classmethod
    def quick(cls) -> Sizes:
        """Small sizes for a run of a few seconds (a smoke test; the ratios mean little)."""
        return cls(
            gemm=256,
            batch=8,
            batch_dim=64,
            conv=(2, 8, 8, 12, 12),
            attention=(1, 2, 256, 32),
            attention_memory_seq=2048,
            elementwise=1 << 16,
            matrix=256,
            rows=64,
            row_len=256,
            table_rows=256,
            copy_elements=1 << 16,
            repeats=3,
            overhead_calls=200,
        )


@dataclass
class BenchResult:
    """One row of the results table.

    ``compare`` says how ``ratio`` is formed and checked: ``"time"`` is op time over
    limit time (pass when ``ratio <= target``), ``"rate"`` is achieved rate over the
    limit's rate (pass when ``ratio >= target``), ``"value_max"`` checks the achieved
    value itself (microseconds, MiB) against ``target`` (pass when ``value <= target``).

    ``ratio`` is the median over rounds of the ratio within each round (op and limit
    ran back to back); ``achieved`` and ``limit`` are the medians of each side.
    ``ratio_of_best`` (JSON only) is the same ratio formed from each side's fastest
    run, a second view that is less sensitive to other processes' load.
    """

    name: str
    params: str
    unit: str
    achieved: float
    limit: float | None
    limit_name: str
    compare: Compare
    ratio: float | None
    target: float
    passed: bool
    op_seconds: float | None = None
    limit_seconds: float | None = None
    ratio_of_best: float | None = None
    work: float | None = None
    bytes_moved: float | None = None
    flops: float | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)

    def target_text(self) -> str:
        """The target as printed in the table (e.g. ``<= 1.05 x time``)."""
        if self.compare == "time":
            return f"<= {self.target:.2f}x time"
        if self.compare == "rate":
            return f">= {self.target:.2f}x rate"
        return f"<= {self.target:g} {self.unit}"


@dataclass
class Peaks:
    """Every sample of the machine limits gathered during the run, for the summary."""

    samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, rate: float) -> None:
        self.samples.setdefault(name, []).append(rate)

    def median(self, name: str) -> float | None:
        values = self.samples.get(name)
        return statistics.median(values) if values else None


# --------------------------------------------------------------------------- timing


def _time_once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


#: Pause before each timed call whose neighbour is a multi-threaded BLAS call. OpenBLAS
#: worker threads busy-wait for about 2**28 cycles (~0.1 s) after a call before they sleep;
#: without a pause they occupy both cores while the next call runs, so whichever side runs
#: second is measured on a machine whose cores are taken (seen here: batched_gemm at 60
#: instead of 108 GFLOP/s right after numpy.matmul, and the same after the limit's sgemm).
BLAS_SETTLE_SECONDS = 0.2


#: Limits that are multi-threaded BLAS calls (their threads spin after returning).
BLAS_LIMITS = frozenset({"scipy dgemm", "scipy sgemm", "numpy.matmul 3-D"})


def interleaved(
    op: Callable[[], object],
    limit: Callable[[], object],
    repeats: int,
    warmup: int = 1,
    settle: float = 0.0,
) -> tuple[list[float], list[float]]:
    """Time ``op`` and ``limit`` alternately ``repeats`` times each; return (op, limit) seconds.

    The order within a round alternates, so neither side always runs first (warm caches,
    turbo state); both sides see the same background load. ``settle`` seconds of sleep
    precede every timed call (see :data:`BLAS_SETTLE_SECONDS`).
    """
    for _ in range(warmup):
        limit()
        op()

    def timed(fn: Callable[[], object]) -> float:
        if settle:
            time.sleep(settle)
        return _time_once(fn)

    op_times: list[float] = []
    limit_times: list[float] = []
    for i in range(repeats):
        if i % 2 == 0:
            limit_times.append(timed(limit))
            op_times.append(timed(op))
        else:
            op_times.append(timed(op))
            limit_times.append(timed(limit))
    return op_times, limit_times


# --------------------------------------------------------------------------- machine limits


class Limits:
    """The machine's ceilings, each a callable timed next to the operation it bounds."""

    def __init__(self, sizes: Sizes, workers: int) -> None:
        from scipy.linalg import blas

        rng = np.random.default_rng(1)
        n = sizes.gemm
        self.gemm_flops = 2.0 * n**3
        self._blas = blas
        self._da = np.asfortranarray(rng.standard_normal((n, n)))
        self._db = np.asfortranarray(rng.standard_normal((n, n)))
        self._dc = np.zeros((n, n), order="F")
        self._sa = self._da.astype(F32, order="F")
        self._sb = self._db.astype(F32, order="F")
        self._sc = np.zeros((n, n), dtype=F32, order="F")
        count = sizes.copy_elements
        self.copy_bytes = 2.0 * count * 4  # read + write (the STREAM copy convention)
        self._src = rng.standard_normal(count, dtype=F32)
        self._dst = np.empty_like(self._src)
        self._workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench-copy")

    def close(self) -> None:
        self._pool.shutdown()

    def dgemm(self) -> None:
        """Direct SciPy dgemm on Fortran-ordered operands: no copy, C overwritten in place."""
        self._blas.dgemm(1.0, self._da, self._db, beta=0.0, c=self._dc, overwrite_c=True)

    def sgemm(self) -> None:
        """Direct SciPy sgemm on Fortran-ordered operands."""
        self._blas.sgemm(1.0, self._sa, self._sb, beta=0.0, c=self._sc, overwrite_c=True)

    def copy(self) -> None:
        """A large-array copy split across ``workers`` threads (np.copyto releases the GIL)."""
        n = self._src.size
        bounds = [n * i // self._workers for i in range(self._workers + 1)]
        jobs = [
            self._pool.submit(
                np.copyto, self._dst[bounds[i] : bounds[i + 1]], self._src[bounds[i] : bounds[i + 1]]
            )
            for i in range(self._workers)
        ]
        for job in jobs:
            job.result()


# --------------------------------------------------------------------------- backend helpers


class Device:
    """Allocations on a CpuBackend filled from NumPy arrays, freed at the end."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._ptrs: list[int] = []

    def put(self, array: npt.NDArray[Any]) -> int:
        data = np.ascontiguousarray(array)
        ptr = int(self.backend.alloc(max(1, data.nbytes)))
        self._ptrs.append(ptr)
        if data.nbytes:
            self.backend.copy_htod(ptr, data)
        return ptr

    def put_fortran(self, array: npt.NDArray[Any]) -> int:
        """Store a matrix column-major (what the GEMMs read)."""
        return self.put(np.asarray(array).T.copy())

    def empty(self, nbytes: int) -> int:
        ptr = int(self.backend.alloc(max(1, nbytes)))
        self._ptrs.append(ptr)
        return ptr

    def free_all(self) -> None:
        for ptr in self._ptrs:
            self.backend.free(ptr)
        self._ptrs.clear()


# --------------------------------------------------------------------------- the suite


@dataclass
class _Case:
    name: str
    params: str
    op: Callable[[], object]
    limit: Callable[[], object]
    limit_name: str
    limit_work: float
    unit: str  # GFLOP/s or GB/s
    work: float  # FLOPs or bytes of the operation
    compare: Compare
    target: float
    flops: float
    bytes_moved: float


def _rate(work: float, seconds: float) -> float:
    return work / seconds / 1e9 if seconds > 0 else math.inf


def _measure(case: _Case, repeats: int, peaks: Peaks) -> BenchResult:
    settle = BLAS_SETTLE_SECONDS if case.limit_name in BLAS_LIMITS else 0.0
    op_times, limit_times = interleaved(case.op, case.limit, repeats, settle=settle)
    op_t = statistics.median(op_times)
    limit_t = statistics.median(limit_times)
    for t in limit_times:
        peaks.add(case.limit_name, _rate(case.limit_work, t))
    achieved = _rate(case.work, op_t)
    limit_rate = _rate(case.limit_work, limit_t)
    # The ratio is the median of the per-round ratios: op and limit of one round ran
    # back to back, so a burst of load from other processes moves both; the medians of
    # the two sides separately would pair samples taken under different loads.
    if case.compare == "time":
        ratio = statistics.median(o / lim for o, lim in zip(op_times, limit_times, strict=True))
        passed = ratio <= case.target
    else:
        ratio = statistics.median(
            _rate(case.work, o) / _rate(case.limit_work, lim)
            for o, lim in zip(op_times, limit_times, strict=True)
        )
        passed = ratio >= case.target
    best = min(op_times) / min(limit_times)
    return BenchResult(
        name=case.name,
        params=case.params,
        unit=case.unit,
        achieved=achieved,
        limit=limit_rate,
        limit_name=case.limit_name,
        compare=case.compare,
        ratio=ratio,
        target=case.target,
        passed=passed,
        op_seconds=op_t,
        limit_seconds=limit_t,
        ratio_of_best=(
            best
            if case.compare == "time"
            else _rate(case.work, min(op_times)) / _rate(case.limit_work, min(limit_times))
        ),
        work=case.work,
        bytes_moved=case.bytes_moved,
        flops=case.flops,
        samples={"op": op_times, "limit": limit_times},
    )


def _gemm_cases(be: Any, dev: Device, sizes: Sizes, limits: Limits, rng: np.random.Generator) -> list[_Case]:
    n = sizes.gemm
    flops = 2.0 * n**3
    a64, b64 = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    pa, pb, pc = dev.put_fortran(a64), dev.put_fortran(b64), dev.empty(n * n * 8)
    pa32, pb32 = dev.put_fortran(a64.astype(F32)), dev.put_fortran(b64.astype(F32))
    pc32 = dev.empty(n * n * 4)

    bc, bd = sizes.batch, sizes.batch_dim
    stacked_a = rng.standard_normal((bc, bd, bd), dtype=F32)
    stacked_b = rng.standard_normal((bc, bd, bd), dtype=F32)
    stacked_c = np.empty((bc, bd, bd), dtype=F32)
    # Row-major [bd, bd] matrices read column-major are their transposes; C^T = B^T A^T.
    ba, bb, bcp = dev.put(stacked_a), dev.put(stacked_b), dev.empty(stacked_c.nbytes)
    stride = bd * bd

    def batched() -> None:
        be.batched_gemm(
            "N",
            "N",
            bd,
            bd,
            bd,
            1.0,
            bb,
            bd,
            stride,
            ba,
            bd,
            stride,
            0.0,
            bcp,
            bd,
            stride,
            bc,
            dtype="float32",
        )

    def matmul() -> None:
        np.matmul(stacked_a, stacked_b, out=stacked_c)

    bflops = 2.0 * bc * bd**3
    return [
        _Case(
            "gemm",
            f"f64 {n}x{n}x{n}",
            lambda: be.gemm("N", "N", n, n, n, 1.0, pa, n, pb, n, 0.0, pc, n, dtype="float64"),
            limits.dgemm,
            "scipy dgemm",
            flops,
            "GFLOP/s",
            flops,
            "time",
            1.05,
            flops,
            3.0 * n * n * 8,
        ),
        _Case(
            "batched_gemm",
            f"f32 {bc} x {bd}^3",
            batched,
            matmul,
            "numpy.matmul 3-D",
            bflops,
            "GFLOP/s",
            bflops,
            "time",
            1.15,
            bflops,
            3.0 * bc * bd * bd * 4,
        ),
        _Case(
            "gemm_mixed_precision",
            f"bf16 {n}x{n}x{n}",
            lambda: be.gemm_mixed_precision("bf16", "N", "N", n, n, n, 1.0, pa32, n, pb32, n, 0.0, pc32, n),
            limits.sgemm,
            "scipy sgemm",
            flops,
            "GFLOP/s",
            flops,
            "rate",
            0.75,
            flops,
            3.0 * n * n * 4,
        ),
    ]


def _conv_cases(be: Any, dev: Device, sizes: Sizes, limits: Limits, rng: np.random.Generator) -> list[_Case]:
    n, c, k, h, w = sizes.conv
    xs, fs, ys = (n, c, h, w), (k, c, 3, 3), (n, k, h, w)
    px = dev.put(rng.standard_normal(xs, dtype=F32))
    pf = dev.put(rng.standard_normal(fs, dtype=F32))
    py = dev.put(rng.standard_normal(ys, dtype=F32))
    pgx, pgf, pout = dev.empty(math.prod(xs) * 4), dev.empty(math.prod(fs) * 4), dev.empty(math.prod(ys) * 4)
    flops = 2.0 * n * k * c * 9 * h * w
    moved = 4.0 * (math.prod(xs) + math.prod(fs) + math.prod(ys))
    params = f"N={n} C={c} K={k} {h}x{w} 3x3 s1 p1"
    stride, pad = (1, 1), (1, 1)
    calls: list[tuple[str, Callable[[], object], float]] = [
        ("conv2d_forward", lambda: be.conv2d_forward(px, xs, pf, fs, pout, ys, stride, pad), 0.70),
        ("conv2d_backward_data", lambda: be.conv2d_backward_data(py, ys, pf, fs, pgx, xs, stride, pad), 0.60),
        (
            "conv2d_backward_filter",
            lambda: be.conv2d_backward_filter(px, xs, py, ys, pgf, fs, stride, pad),
            0.60,
        ),
    ]
    return [
        _Case(
            name,
            params,
            fn,
            limits.sgemm,
            "scipy sgemm",
            limits.gemm_flops,
            "GFLOP/s",
            flops,
            "rate",
            target,
            flops,
            moved,
        )
        for name, fn, target in calls
    ]


def _attention_cases(
    be: Any, dev: Device, sizes: Sizes, limits: Limits, rng: np.random.Generator
) -> list[_Case]:
    b, h, s, d = sizes.attention
    shape = (b, h, s, d)
    pq, pk, pv = (dev.put(rng.standard_normal(shape, dtype=F32)) for _ in range(3))
    po = dev.empty(math.prod(shape) * 4)
    scale = 1.0 / math.sqrt(d)
    full = 4.0 * b * h * s * s * d
    moved = 4.0 * 4 * math.prod(shape)
    cases = []
    for causal in (False, True):
        flops = full / 2 if causal else full
        cases.append(
            _Case(
                "attention",
                f"B={b} H={h} S={s} D={d} {'causal' if causal else 'full'}",
                functools.partial(be.attention, pq, pk, pv, po, b, h, s, s, d, scale, causal),
                limits.sgemm,
                "scipy sgemm",
                limits.gemm_flops,
                "GFLOP/s",
                flops,
                "rate",
                0.45,
                flops,
                moved,
            )
        )
    return cases


def _memory_cases(
    be: Any, dev: Device, sizes: Sizes, limits: Limits, rng: np.random.Generator
) -> list[_Case]:
    from .types import BinaryOp, ReduceOp, UnaryOp

    cases: list[_Case] = []

    def add(name: str, params: str, fn: Callable[[], object], moved: float, flops: float) -> None:
        cases.append(
            _Case(
                name,
                params,
                fn,
                limits.copy,
                "parallel copy",
                limits.copy_bytes,
                "GB/s",
                moved,
                "rate",
                0.60,
                flops,
                moved,
            )
        )

    n = sizes.elementwise
    a = rng.standard_normal(n, dtype=F32)
    pa, pb = dev.put(np.abs(a) + np.float32(0.5)), dev.put(rng.standard_normal(n, dtype=F32))
    pout = dev.empty(n * 4)
    for op in list(UnaryOp)[: list(UnaryOp).index(UnaryOp.NEG) + 1]:  # the seed's ops
        add(
            "unary",
            f"{op.value} 2^{int(math.log2(n))} f32",
            functools.partial(be.unary, op, pa, pout, n),
            8.0 * n,
            n,
        )
    for bop in (op for op in BinaryOp if op is not BinaryOp.POW):
        add(
            "binary",
            f"{bop.value} 2^{int(math.log2(n))} f32",
            functools.partial(be.binary, bop, pa, pb, pout, n),
            12.0 * n,
            n,
        )

    m = sizes.matrix
    pm = dev.put(rng.standard_normal((m, m), dtype=F32))
    pmo = dev.empty(m * m * 4)
    pr = dev.empty(m * 4)
    for axis in (0, 1):
        add(
            "softmax",
            f"{m}x{m} axis {axis}",
            functools.partial(be.softmax, pm, pmo, (m, m), axis),
            8.0 * m * m,
            5.0 * m * m,
        )
    for rop in (ReduceOp.SUM, ReduceOp.MAX):
        for axis in (0, 1):
            add(
                "reduce",
                f"{rop.value} {m}x{m} axis {axis}",
                functools.partial(be.reduce, rop, pm, pr, (m, m), axis),
                4.0 * m * m + 4.0 * m,
                m * m,
            )

    rows, cols, table_rows = sizes.rows, sizes.row_len, sizes.table_rows
    ptable = dev.put(rng.standard_normal((table_rows, cols), dtype=F32))
    prows = dev.put(rng.standard_normal((rows, cols), dtype=F32))
    pdst = dev.empty(table_rows * cols * 4)
    pgathered = dev.empty(rows * cols * 4)
    gather_idx = rng.integers(0, table_rows, rows)
    scatter_idx = rng.choice(table_rows, size=rows, replace=False)
    moved = 8.0 * rows * cols
    add(
        "gather",
        f"{rows} rows x {cols} of {table_rows}",
        lambda: be.gather(ptable, gather_idx, pgathered, table_rows, cols),
        moved,
        rows * cols,
    )
    add(
        "scatter",
        f"{rows} rows x {cols} into {table_rows}",
        lambda: be.scatter(prows, scatter_idx, pdst, table_rows, cols),
        moved,
        rows * cols,
    )
    return cases


def _overhead(be: Any, dev: Device, sizes: Sizes) -> BenchResult:
    """Per-call cost of a 1-element unary (validation + dispatch), median over batches of calls.

    The figure is the calling thread's CPU time per call (``time.thread_time``): what the
    call itself costs, without the time the process spends descheduled on a busy
    machine. The wall-clock medians are kept in the JSON samples (``wall``).
    """
    pin, pout = dev.put(np.ones(1, dtype=F32)), dev.empty(4)
    calls = sizes.overhead_calls
    cpu_us: list[float] = []
    wall_us: list[float] = []
    for _ in range(sizes.repeats + 1):
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            be.unary("relu", pin, pout, 1)
        cpu_us.append((time.thread_time() - cpu) / calls * 1e6)
        wall_us.append((time.perf_counter() - wall) / calls * 1e6)
    cpu_us, wall_us = cpu_us[1:], wall_us[1:]  # the first batch warms up
    value = statistics.median(cpu_us)
    return BenchResult(
        name="overhead",
        params="unary relu, n=1 (CPU time)",
        unit="us/call",
        achieved=value,
        limit=None,
        limit_name="-",
        compare="value_max",
        ratio=None,
        target=20.0,
        passed=value <= 20.0,
        samples={"op": cpu_us, "wall": wall_us},
    )


def _attention_memory(be: Any, dev: Device, sizes: Sizes) -> BenchResult:
    """Peak extra memory (tracemalloc sees NumPy's allocations) of attention at a long sequence."""
    s, d = sizes.attention_memory_seq, 64
    rng = np.random.default_rng(3)
    pq, pk, pv = (dev.put(rng.standard_normal((s, d), dtype=F32)) for _ in range(3))
    po = dev.empty(s * d * 4)
    scale = 1.0 / math.sqrt(d)
    peaks = []
    gc.collect()
    for causal in (False, True):
        tracemalloc.start()
        try:
            be.attention(pq, pk, pv, po, 1, 1, s, s, d, scale, causal)
            peaks.append(tracemalloc.get_traced_memory()[1] / MIB)
        finally:
            tracemalloc.stop()
    value = max(peaks)
    return BenchResult(
        name="attention_memory",
        params=f"B=1 H=1 S={s} D={d} peak extra",
        unit="MiB",
        achieved=value,
        limit=None,
        limit_name="-",
        compare="value_max",
        ratio=None,
        target=256.0,
        passed=value < 256.0,
        samples={"op": peaks},
    )


GROUPS = ("gemm", "conv", "attention", "memory", "overhead")


def run_suite(
    sizes: Sizes,
    groups: Sequence[str] = GROUPS,
    progress: Callable[[BenchResult], None] | None = None,
    only: str | None = None,
) -> tuple[list[BenchResult], dict[str, float | None]]:
    """Run the suite; return (results, machine peaks as medians over every limit sample).

    ``only`` keeps the cases whose name or parameters contain that text.
    """
    from .backends.cpu import CpuBackend

    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limits = Limits(sizes, max(1, workers))
    peaks = Peaks()
    results: list[BenchResult] = []
    rng = np.random.default_rng(0)

    def emit(result: BenchResult) -> None:
        results.append(result)
        if progress is not None:
            progress(result)

    def keep(name: str, params: str) -> bool:
        return only is None or only in name or only in params

    builders: dict[str, Callable[..., list[_Case]]] = {
        "gemm": _gemm_cases,
        "conv": _conv_cases,
        "attention": _attention_cases,
        "memory": _memory_cases,
    }
    with CpuBackend() as be:
        try:
            for group in groups:
                dev = Device(be)
                try:
                    if group in builders:
                        for case in builders[group](be, dev, sizes, limits, rng):
                            if keep(case.name, case.params):
                                emit(_measure(case, sizes.repeats, peaks))
                    elif group == "overhead":
                        if keep("overhead", ""):
                            emit(_overhead(be, dev, sizes))
                        if keep("attention_memory", "") and "attention" in groups:
                            emit(_attention_memory(be, dev, sizes))
                finally:
                    dev.free_all()
            # The ceilings themselves, when no case sampled them.
            for name, fn, work in (
                ("scipy dgemm", limits.dgemm, limits.gemm_flops),
                ("scipy sgemm", limits.sgemm, limits.gemm_flops),
                ("parallel copy", limits.copy, limits.copy_bytes),
            ):
                if name not in peaks.samples:
                    fn()
                    for _ in range(max(1, sizes.repeats // 2)):
                        peaks.add(name, _rate(work, _time_once(fn)))
        finally:
            limits.close()
    machine = {name: peaks.median(name) for name in ("scipy dgemm", "scipy sgemm", "parallel copy")}
    return results, machine


# --------------------------------------------------------------------------- output


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.{digits}f}"


def format_table(results: Sequence[BenchResult]) -> str:
    """The results as a fixed-width text table."""
    header = ("op", "params", "achieved", "limit", "limit is", "ratio", "target", "result")
    rows = [header]
    for r in results:
        rows.append(
            (
                r.name,
                r.params,
                f"{_fmt(r.achieved)} {r.unit}",
                f"{_fmt(r.limit)} {r.unit}" if r.limit is not None else "-",
                r.limit_name,
                _fmt(r.ratio, 3),
                r.target_text(),
                "PASS" if r.passed else "FAIL",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _machine() -> dict[str, Any]:
    from .backends.cpu import _cpu_name

    try:
        from threadpoolctl import threadpool_info

        blas = [
            {k: info.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
            for info in threadpool_info()
            if info.get("user_api") == "blas"
        ]
    except ImportError:
        blas = []
    return {
        "cpu": _cpu_name(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas,
    }


def write_json(
    path: Path, results: Sequence[BenchResult], peaks: dict[str, float | None], sizes: Sizes, seconds: float
) -> None:
    """Write the run (machine, peaks, sizes and every row with its samples) as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "suite": "computehal-cpu",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": seconds,
        "machine": _machine(),
        "peaks": {
            "dgemm_gflops": peaks.get("scipy dgemm"),
            "sgemm_gflops": peaks.get("scipy sgemm"),
            "copy_gbps": peaks.get("parallel copy"),
        },
        "sizes": asdict(sizes),
        "passed": all(r.passed for r in results),
        "results": [asdict(r) for r in results],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def write_roofline(path: Path, results: Sequence[BenchResult], peaks: dict[str, float | None]) -> bool:
    """Plot each op at (FLOP/byte, achieved GFLOP/s) under the measured ceilings; False without matplotlib.

    Memory-bound ops count one FLOP per element they produce or consume (gather and
    scatter: one per element copied), so they sit at their achieved bandwidth.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    compute = peaks.get("scipy sgemm")
    bandwidth = peaks.get("parallel copy")
    points = [r for r in results if r.flops and r.bytes_moved and r.op_seconds]
    if not compute or not bandwidth or not points:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(10, 6.5))
    xs = np.logspace(-3, 4, 400)
    ax.plot(xs, np.minimum(compute, bandwidth * xs), color="black", lw=2, label="roofline (sgemm, copy)")
    dgemm = peaks.get("scipy dgemm")
    if dgemm:
        ax.plot(xs, np.minimum(dgemm, bandwidth * xs), color="gray", lw=1, ls="--", label="dgemm ceiling")
    markers = "o^sDvP*Xh<>"
    names = sorted({r.name for r in points})
    for r in points:
        assert r.flops is not None and r.bytes_moved is not None and r.op_seconds is not None
        intensity = r.flops / r.bytes_moved
        gflops = r.flops / r.op_seconds / 1e9
        marker = markers[names.index(r.name) % len(markers)]
        ax.loglog(intensity, gflops, marker=marker, ls="none", color="tab:green" if r.passed else "tab:red")
        ax.annotate(
            f"{r.name} {r.params}", (intensity, gflops), fontsize=6, xytext=(3, 3), textcoords="offset points"
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"computehal CpuBackend roofline: sgemm {compute:.0f} GFLOP/s, copy {bandwidth:.1f} GB/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    """The command-line options of ``computehal bench``."""
    parser = argparse.ArgumentParser(
        prog="computehal bench",
        description="Benchmark every CpuBackend op against this machine's measured limits.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes and few repeats (seconds, not minutes)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per op (median is reported)")
    parser.add_argument(
        "--json", type=Path, default=Path("bench-results/cpu.json"), help="where to write JSON"
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=Path("bench-results/cpu-roofline.png"),
        help="where to write the roofline PNG",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not write the roofline plot")
    parser.add_argument(
        "--groups",
        default=",".join(GROUPS),
        help=f"comma list of groups to run (default: {','.join(GROUPS)})",
    )
    parser.add_argument(
        "--only", default=None, help="run only the cases whose name or params contain this text"
    )
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when any target fails")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the suite from the command line; return the exit status.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name (``sys.argv[1:]`` when omitted).

    Returns
    -------
    int
        0 on success (also when targets fail, unless ``--strict``), 1 when ``--strict``
        and a target failed, 2 on bad arguments.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.repeats is not None:
        if args.repeats < 1:
            print("--repeats must be >= 1", file=sys.stderr)
            return 2
        sizes = Sizes(**{**asdict(sizes), "repeats": args.repeats})
    groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        print(f"unknown group(s) {unknown}; choose from {list(GROUPS)}", file=sys.stderr)
        return 2

    print(f"computehal CPU benchmark ({'quick' if args.quick else 'default'} sizes, {sizes.repeats} repeats)")
    print(f"machine: {_machine()['cpu']}, {_machine()['cores']} cores, numpy {np.__version__}", flush=True)
    start = time.perf_counter()

    def progress(r: BenchResult) -> None:
        print(
            f"  {r.name:<22} {r.params:<34} {_fmt(r.achieved):>8} {r.unit:<7} "
            f"ratio {_fmt(r.ratio, 3):>6}  {'PASS' if r.passed else 'FAIL'}",
            flush=True,
        )

    with _quiet_numpy():
        results, peaks = run_suite(sizes, groups, progress, args.only)
    seconds = time.perf_counter() - start
    print()
    print("machine peaks (medians of every sample taken during the run):")
    print(
        f"  dgemm {_fmt(peaks.get('scipy dgemm'))} GFLOP/s   sgemm {_fmt(peaks.get('scipy sgemm'))} GFLOP/s"
        f"   copy {_fmt(peaks.get('parallel copy'))} GB/s"
    )
    print()
    print(format_table(results))
    failed = [r for r in results if not r.passed]
    print()
    print(f"{len(results) - len(failed)}/{len(results)} targets passed in {seconds:.1f} s")
    write_json(args.json, results, peaks, sizes, seconds)
    print(f"results: {args.json}")
    if not args.no_plot:
        if write_roofline(args.plot, results, peaks):
            print(f"roofline: {args.plot}")
        else:
            print("roofline: skipped (matplotlib is not installed: pip install computehal[bench])")
    return 1 if (args.strict and failed) else 0


@contextmanager
def _quiet_numpy() -> Iterator[None]:
    with np.errstate(all="ignore"):
        yield


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
