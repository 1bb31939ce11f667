"""Benchmark rows of the wgpu backend, each against the CPU backend on the same problem.

Run ``python benchmarks/bench_wgpu.py [--adapter N] [--repeat R] [--quick]``. Every row
prints the wgpu figure, the CPU backend's figure for the identical call measured in the
same process, and their ratio (wgpu / cpu; above 1 the wgpu device is faster). On a
machine without a GPU the adapter is lavapipe, Mesa's CPU Vulkan driver, so the ratio
mostly says how much lavapipe's JIT trails NumPy / BLAS; on a real GPU it is the speed-up.

Rows:
- sgemm 1024^3 (column-major, NN): GFLOP/s;
- attention batch 1, heads 8, seq 1024, head_dim 64 (not causal): GFLOP/s counting
  4 * batch * heads * seq^2 * head_dim;
- unary (exp) and binary (add) on 2^24 floats: GB/s of bytes read + written;
- 100 small unary calls (256 floats) then one synchronize: microseconds per call, the
  fixed per-op overhead (work is recorded and submitted in batches).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from computehal.backends.cpu import CpuBackend
from computehal.backends.wgpu import WgpuBackend

#: Small unary calls per timed sample of the per-call overhead row.
SMALL_CALLS = 100


def best_time(fn: Callable[[], None], sync: Callable[[], None], repeat: int) -> float:
    """Smallest wall time of ``repeat`` synchronised calls of ``fn`` after one warm-up call."""
    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


class Problems:
    """The benchmark problems, set up once on one backend."""

    def __init__(self, be: Any, gemm_n: int, seq: int, elems: int) -> None:
        self.be = be
        rng = np.random.default_rng(0)
        self.gemm_n, self.seq, self.elems = gemm_n, seq, elems
        self.heads, self.head_dim = 8, 64
        self.a = self.put(rng.standard_normal(gemm_n * gemm_n, dtype=np.float32))
        self.b = self.put(rng.standard_normal(gemm_n * gemm_n, dtype=np.float32))
        self.c = self.put(np.zeros(gemm_n * gemm_n, dtype=np.float32))
        qkv = self.heads * seq * self.head_dim
        self.q = self.put(rng.standard_normal(qkv, dtype=np.float32))
        self.k = self.put(rng.standard_normal(qkv, dtype=np.float32))
        self.v = self.put(rng.standard_normal(qkv, dtype=np.float32))
        self.o = self.put(np.zeros(qkv, dtype=np.float32))
        self.x = self.put(rng.uniform(-4, 4, elems).astype(np.float32))
        self.y = self.put(rng.uniform(-4, 4, elems).astype(np.float32))
        self.z = self.put(np.zeros(elems, dtype=np.float32))

    def put(self, data: np.ndarray[Any, Any]) -> int:
        ptr = int(self.be.alloc(data.nbytes))
        self.be.copy_htod(ptr, data)
        return ptr

    def sgemm(self) -> None:
        n = self.gemm_n
        self.be.gemm("N", "N", n, n, n, 1.0, self.a, n, self.b, n, 0.0, self.c, n, dtype="float32")

    def attention(self) -> None:
        self.be.attention(
            self.q, self.k, self.v, self.o, 1, self.heads, self.seq, self.seq, self.head_dim,
            1.0 / np.sqrt(self.head_dim), False,
        )  # fmt: skip

    def unary(self) -> None:
        self.be.unary("exp", self.x, self.z, self.elems)

    def binary(self) -> None:
        self.be.binary("add", self.x, self.y, self.z, self.elems)

    def small(self) -> None:
        for _ in range(SMALL_CALLS):
            self.be.unary("relu", self.x, self.z, 256)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--adapter", type=int, default=None, help="wgpu adapter index (default: wgpu's choice)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions per row (best is kept)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args(argv)
    gemm_n, seq, elems = (256, 256, 1 << 20) if args.quick else (1024, 1024, 1 << 24)

    gpu = WgpuBackend(adapter=args.adapter)
    gpu.init()
    cpu = CpuBackend()
    cpu.init()
    device = gpu.available_devices()[args.adapter or 0].name if args.adapter is not None else None
    print(f"wgpu backend: {gpu.name()} on {device or gpu._adapter.summary}")
    print(f"{'row':<34}{'wgpu':>12}{'cpu':>12}{'unit':>8}{'wgpu/cpu':>10}")
    problems = {name: Problems(be, gemm_n, seq, elems) for name, be in (("wgpu", gpu), ("cpu", cpu))}
    rows: list[tuple[str, str, Callable[[Problems], Callable[[], None]], float, bool]] = [
        (f"sgemm {gemm_n}^3", "GFLOP/s", lambda p: p.sgemm, 2.0 * gemm_n**3 / 1e9, False),
        (
            f"attention (1, 8, {seq}, 64)",
            "GFLOP/s",
            lambda p: p.attention,
            4.0 * 8 * seq * seq * 64 / 1e9,
            False,
        ),
        (f"unary exp 2^{elems.bit_length() - 1}", "GB/s", lambda p: p.unary, 8.0 * elems / 1e9, False),
        (f"binary add 2^{elems.bit_length() - 1}", "GB/s", lambda p: p.binary, 12.0 * elems / 1e9, False),
        ("small unary (256 floats) x100", "us/call", lambda p: p.small, 1e6 / SMALL_CALLS, True),
    ]
    for label, unit, pick, work, is_time in rows:
        figures = {}
        for name, be in (("wgpu", gpu), ("cpu", cpu)):
            seconds = best_time(pick(problems[name]), be.synchronize, args.repeat)
            figures[name] = seconds * work if is_time else work / seconds
        ratio = figures["cpu"] / figures["wgpu"] if is_time else figures["wgpu"] / figures["cpu"]
        print(f"{label:<34}{figures['wgpu']:>12.3f}{figures['cpu']:>12.3f}{unit:>8}{ratio:>10.3f}")
        sys.stdout.flush()
    gpu.close()
    cpu.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
