#!/usr/bin/env python
"""Verify CudaBackend on a real NVIDIA GPU: the conformance kit, then benchmark rows.

Run on a machine with an NVIDIA GPU after ``pip install -e .[cuda]``::

    python scripts/gpu_check.py            # conformance + benchmarks (about 2-4 minutes on an H200)
    python scripts/gpu_check.py --quick    # conformance only

It prints the per-op conformance table, then each benchmark row against its limit on the
same device, measured in the same process:

* dgemm / sgemm / bf16 mixed-precision GEMM at 4096^3 against a direct cuBLAS call through
  CuPy (``cupy.matmul``; for bf16, ``cublasGemmEx`` on pre-rounded bf16 operands);
* attention (4, 16, 2048, 64) against a plain cuBLAS + softmax version written in CuPy;
* memory-bound ops (unary, binary, reduce, softmax, gather, scatter) as GB/s against the
  device-to-device copy bandwidth.

Exit status: 0 when every conformance case passed and every benchmark result matched its
reference; 1 otherwise; 2 when no CUDA device could be used.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _fail_unavailable(reason: str) -> int:
    print(f"gpu_check: CudaBackend unavailable: {reason}", file=sys.stderr)
    return 2


class Bench:
    """Benchmark helpers on one initialised CudaBackend."""

    def __init__(self, backend: Any, cupy: Any) -> None:
        self.be = backend
        self.cp = cupy
        self.ok = True
        self.rt = cupy.cuda.runtime

    def put(self, array: Any) -> int:
        """A backend allocation holding a copy of the CuPy array ``array``."""
        ptr = int(self.be.alloc(max(1, int(array.nbytes))))
        self.rt.memcpy(ptr, array.data.ptr, array.nbytes, self.rt.memcpyDeviceToDevice)
        return ptr

    def view(self, ptr: int, shape: tuple[int, ...], dtype: Any, order: str = "C") -> Any:
        """A CuPy array over backend memory (no copy) for checking results."""
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        memory = self.cp.cuda.UnownedMemory(ptr, size, self)
        return self.cp.ndarray(shape, dtype, self.cp.cuda.MemoryPointer(memory, 0), order=order)

    def time(self, fn: Callable[[], object], reps: int) -> float:
        """Seconds per call, measured with CUDA events on the legacy default stream."""
        fn()
        self.rt.deviceSynchronize()
        start, end = self.cp.cuda.Event(), self.cp.cuda.Event()
        start.record(self.cp.cuda.Stream.null)
        for _ in range(reps):
            fn()
        end.record(self.cp.cuda.Stream.null)
        end.synchronize()
        return float(self.cp.cuda.get_elapsed_time(start, end)) / 1000.0 / reps

    def check(self, name: str, got: Any, want: Any, tol: float) -> None:
        err = float(self.cp.max(self.cp.abs(got.astype(self.cp.float64) - want.astype(self.cp.float64))))
        scale = float(self.cp.max(self.cp.abs(want))) or 1.0
        if not err <= tol * scale:
            self.ok = False
            print(f"  MISMATCH {name}: max error {err:.3g} (scale {scale:.3g}, tolerance {tol:g})")

    # ------------------------------------------------------------------ GEMM

    def gemm_rows(self, n: int) -> None:
        flops = 2.0 * n**3
        print(f"\nGEMM {n}^3 (column-major, no transposes)          ours      cuBLAS   ratio")
        self.gemm_row(n, flops, np.float64, "dgemm")
        self.gemm_row(n, flops, np.float32, "sgemm")
        self.mixed_row(n, flops)

    def gemm_row(self, n: int, flops: float, dtype: Any, label: str) -> None:
        cp = self.cp
        rng = cp.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=dtype)
        b = rng.standard_normal((n, n), dtype=dtype)
        pa, pb, pc = self.put(a), self.put(b), self.put(cp.zeros((n, n), dtype))
        dt = np.dtype(dtype).name
        ours = self.time(lambda: self.be.gemm("N", "N", n, n, n, 1.0, pa, n, pb, n, 0.0, pc, n, dtype=dt), 5)
        # The row-major arrays a, b read as column-major matrices are A = a^T, B = b^T, so the
        # column-major C = A B = (b a)^T has the memory of the row-major product b @ a.
        out = cp.empty((n, n), dtype)
        ref = self.time(lambda: cp.matmul(b, a, out=out), 5)
        self.check(label, self.view(pc, (n, n), dtype), out, 1e-10 if dtype == np.float64 else 1e-4)
        rate, limit = flops / ours / 1e12, flops / ref / 1e12
        print(f"  {label:<44} {rate:7.2f}  {limit:7.2f} TFLOP/s  {ref / ours:5.2f}x")
        for ptr in (pa, pb, pc):
            self.be.free(ptr)

    def mixed_row(self, n: int, flops: float) -> None:
        cp = self.cp
        import ml_dtypes
        from cupy_backends.cuda.libs import cublas

        rng = cp.random.default_rng(1)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        pa, pb, pc = self.put(a), self.put(b), self.put(cp.zeros((n, n), np.float32))
        ours = self.time(
            lambda: self.be.gemm_mixed_precision("bf16", "N", "N", n, n, n, 1.0, pa, n, pb, n, 0.0, pc, n), 5
        )
        # Reference: cublasGemmEx on operands already rounded to bf16 (rounding on the host).
        a16 = cp.asarray(cp.asnumpy(a).astype(ml_dtypes.bfloat16).view(np.uint16))
        b16 = cp.asarray(cp.asnumpy(b).astype(ml_dtypes.bfloat16).view(np.uint16))
        out = cp.empty((n, n), np.float32)
        handle = cp.cuda.device.get_cublas_handle()
        one = np.array([1.0], np.float32)
        zero = np.array([0.0], np.float32)
        mode = cublas.getPointerMode(handle)
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)

        def direct() -> None:
            cublas.gemmEx(handle, 0, 0, n, n, n, one.ctypes.data, a16.data.ptr, 14, n, b16.data.ptr, 14, n,
                          zero.ctypes.data, out.data.ptr, 0, n, 68, -1)  # fmt: skip

        try:
            ref = self.time(direct, 5)
        finally:
            cublas.setPointerMode(handle, mode)
        self.check("gemm_mixed_precision bf16", self.view(pc, (n, n), np.float32), out, 1e-4)
        print(f"  {'gemm_mixed_precision bf16 (incl. rounding)':<44} {flops / ours / 1e12:7.2f}  "
              f"{flops / ref / 1e12:7.2f} TFLOP/s  {ref / ours:5.2f}x")  # fmt: skip
        for ptr in (pa, pb, pc):
            self.be.free(ptr)

    # ------------------------------------------------------------------ attention

    def attention_row(self, batch: int, heads: int, seq: int, dim: int) -> None:
        cp = self.cp
        rng = cp.random.default_rng(2)
        shape = (batch, heads, seq, dim)
        q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
        pq, pk, pv, po = self.put(q), self.put(k), self.put(v), self.put(cp.zeros(shape, np.float32))
        scale = 1.0 / math.sqrt(dim)
        flops = 4.0 * batch * heads * seq * seq * dim
        ours = self.time(
            lambda: self.be.attention(pq, pk, pv, po, batch, heads, seq, seq, dim, scale, False), 3
        )

        def plain() -> Any:
            s = cp.matmul(q, k.transpose(0, 1, 3, 2)) * np.float32(scale)
            s -= s.max(axis=-1, keepdims=True)
            cp.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            return cp.matmul(s, v)

        ref = self.time(plain, 3)
        self.check("attention", self.view(po, shape, np.float32), plain(), 1e-4)
        print(f"\nattention {shape} (non-causal)          ours {flops / ours / 1e12:6.2f} TFLOP/s, "
              f"cuBLAS + softmax {flops / ref / 1e12:6.2f} TFLOP/s, ratio {ref / ours:5.2f}x")  # fmt: skip
        for ptr in (pq, pk, pv, po):
            self.be.free(ptr)

    # ------------------------------------------------------------------ memory-bound

    def memory_rows(self, n: int) -> None:
        cp = self.cp
        rng = cp.random.default_rng(3)
        x = rng.standard_normal(n, dtype=np.float32)
        y = rng.standard_normal(n, dtype=np.float32)
        px, py, po = self.put(x), self.put(y), self.put(cp.zeros(n, np.float32))
        nbytes = 4 * n
        copy = self.time(lambda: self.rt.memcpy(po, px, nbytes, self.rt.memcpyDeviceToDevice), 10)
        copy_bw = 2 * nbytes / copy
        print(
            f"\nmemory-bound ops on {n} floats; device-to-device copy {copy_bw / 1e9:.0f} GB/s (read + write)"
        )
        cols = 1024
        rows = n // cols
        idx = np.random.default_rng(4).permutation(rows).astype(np.int64)
        cases: list[tuple[str, Callable[[], object], float]] = [
            ("unary relu", lambda: self.be.unary("relu", px, po, n), 2 * nbytes),
            ("unary exp", lambda: self.be.unary("exp", px, po, n), 2 * nbytes),
            ("binary add", lambda: self.be.binary("add", px, py, po, n), 3 * nbytes),
            (
                "reduce sum, axis 1 of [rows, 1024]",
                lambda: self.be.reduce("sum", px, po, [rows, cols], 1),
                nbytes,
            ),
            (
                "reduce max, axis 0 of [1024, rows]",
                lambda: self.be.reduce("max", px, po, [cols, rows], 0),
                nbytes,
            ),
            ("softmax, axis 1 of [rows, 1024]", lambda: self.be.softmax(px, po, [rows, cols], 1), 2 * nbytes),
            ("gather all rows (permuted)", lambda: self.be.gather(px, idx, po, rows, cols), 2 * nbytes),
            ("scatter all rows (permuted)", lambda: self.be.scatter(px, idx, po, rows, cols), 2 * nbytes),
        ]
        for label, fn, moved in cases:
            seconds = self.time(fn, 5)
            bw = moved / seconds
            print(f"  {label:<40} {bw / 1e9:8.0f} GB/s  {bw / copy_bw:6.1%} of copy")
        self.be.reduce("sum", px, po, [rows, cols], 1)
        self.check("reduce sum", self.view(po, (rows,), np.float32), x.reshape(rows, cols).sum(axis=1), 1e-5)
        self.be.gather(px, idx, po, rows, cols)
        self.check(
            "gather", self.view(po, (rows, cols), np.float32), x.reshape(rows, cols)[cp.asarray(idx)], 0.0
        )
        for ptr in (px, py, po):
            self.be.free(ptr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    parser.add_argument("--quick", action="store_true", help="conformance only, no benchmarks")
    parser.add_argument("--gemm-size", type=int, default=4096)
    args = parser.parse_args(argv)
    started = time.perf_counter()

    from computehal import BackendError
    from computehal.backends.cuda import CudaBackend, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        return _fail_unavailable(reason)
    backend = CudaBackend(args.device)
    try:
        backend.init()
        device = backend.available_devices()[args.device]
    except BackendError as exc:
        return _fail_unavailable(str(exc))
    import cupy

    gib = device.total_memory_bytes / 2**30
    print(
        f"device {device.ordinal}: {device.name}, compute capability {device.compute_capability}, "
        f"{gib:.0f} GiB"
    )
    print(f"CuPy {cupy.__version__}, backend {backend.name()!r}")
    print(f"capabilities: {device.capabilities}")

    from computehal.testing import run_conformance

    report = run_conformance(backend)
    print()
    print(report.summary())
    print(f"conformance: {len(report.results)} cases in {time.perf_counter() - started:.1f} s")
    ok = report.passed

    if not args.quick:
        bench = Bench(backend, cupy)
        try:
            bench.gemm_rows(args.gemm_size)
            bench.attention_row(4, 16, 2048, 64)
            bench.memory_rows(1 << 26)
        except BackendError as exc:
            print(f"benchmark failed: {exc}")
            bench.ok = False
        ok = ok and bench.ok
    backend.close()
    print(f"\ngpu_check: {'PASS' if ok else 'FAIL'} in {time.perf_counter() - started:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
