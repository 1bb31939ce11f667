"""Benchmark rows of the OpenCL backend against the targets of issue 5.

Run ``python benchmarks/bench_opencl.py [--device N] [--repeat R] [--profile gpu|cpu]``
(``--profile`` forces the backend's kernel profile; by default the device type decides). Each row prints the
measured figure, the target and their ratio (>= 1.00 meets the target), plus the machine's own
reference figures measured in the same process (NumPy BLAS sgemm and a large-array copy), since
absolute numbers on shared machines are noisy.

Rows:
- sgemm 1024^3: GFLOP/s (target 80);
- attention batch 1, heads 8, seq 1024, head_dim 64: seconds, against the same problem written
  as NumPy matmul + softmax + matmul on the host (target: faster, ratio = numpy / opencl);
- unary (relu) and binary (add) on 2^24 floats: GB/s of bytes read + written (target 25).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from computehal.backends.opencl import OpenCLBackend


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Smallest wall time of ``repeat`` calls of ``fn`` after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """The reference host formulation: scores, softmax, weighted sum (full score matrix)."""
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * np.float32(scale)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    result: np.ndarray = np.matmul(scores, v)
    return result


def row(name: str, value: float, unit: str, target: float, ratio: float) -> None:
    """Print one benchmark row."""
    verdict = "meets" if ratio >= 1.0 else "below"
    print(f"{name:<44} {value:>10.2f} {unit:<8} target {target:>8.2f}  ratio {ratio:5.2f}  ({verdict})")


def main() -> None:
    """Measure and print the OpenCL rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", choices=("gpu", "cpu"), default=None, help="force a kernel profile")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    be = OpenCLBackend(args.device, kernel_profile=args.profile)
    be.init()
    with be:
        print(f"device: {be.device_name()}; kernel profile: {be.kernel_profile}")

        def put(array: np.ndarray) -> int:
            ptr = be.alloc(array.nbytes)
            be.copy_htod(ptr, array)
            return ptr

        # Machine references.
        n = 1024
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        blas = 2 * n**3 / best_time(lambda: np.matmul(a, b), args.repeat) / 1e9
        big = rng.standard_normal(1 << 24).astype(np.float32)
        dst = np.empty_like(big)
        copy_gbs = 2 * big.nbytes / best_time(lambda: np.copyto(dst, big), args.repeat) / 1e9
        print(f"machine: NumPy BLAS sgemm 1024^3 {blas:.1f} GFLOP/s, host copy {copy_gbs:.1f} GB/s")

        # sgemm 1024^3.
        pa, pb, pc = put(a), put(b), be.alloc(n * n * 4)

        def sgemm() -> None:
            be.gemm("N", "N", n, n, n, 1.0, pa, n, pb, n, 0.0, pc, n, dtype="float32")
            be.synchronize()

        gflops = 2 * n**3 / best_time(sgemm, args.repeat) / 1e9
        row("sgemm 1024^3 (GFLOP/s)", gflops, "GFLOP/s", 80.0, gflops / 80.0)
        tile = be.recommended_tile_for(n, n, n)
        print(f"  tile used: {tile.tile_m}x{tile.tile_n}x{tile.tile_k}; vs NumPy BLAS {gflops / blas:.2f}x")

        # dgemm 1024^3 (no target; reported).
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        qa, qb, qc = put(a64), put(b64), be.alloc(n * n * 8)

        def dgemm() -> None:
            be.gemm("N", "N", n, n, n, 1.0, qa, n, qb, n, 0.0, qc, n)
            be.synchronize()

        row("dgemm 1024^3 (GFLOP/s, no target)", 2 * n**3 / best_time(dgemm, args.repeat) / 1e9, "GFLOP/s",
            0.0, float("inf"))  # fmt: skip

        # Attention.
        heads, seq, dim = 8, 1024, 64
        scale = 1.0 / np.sqrt(dim)
        q, k, v = (rng.standard_normal((1, heads, seq, dim)).astype(np.float32) for _ in range(3))
        pq, pk, pv, po = put(q), put(k), put(v), be.alloc(q.nbytes)

        def attention() -> None:
            be.attention(pq, pk, pv, po, 1, heads, seq, seq, dim, scale, False)
            be.synchronize()

        t_cl = best_time(attention, args.repeat)
        t_np = best_time(lambda: numpy_attention(q, k, v, scale), args.repeat)
        out = np.empty_like(q)
        be.copy_dtoh(out, po)
        error = float(np.abs(out - numpy_attention(q, k, v, scale)).max())
        row("attention 1x8x1024x64 (ms)", t_cl * 1e3, "ms", t_np * 1e3, t_np / t_cl)
        flops = 4 * heads * seq * seq * dim
        print(f"  {flops / t_cl / 1e9:.1f} GFLOP/s; NumPy {t_np * 1e3:.1f} ms; max |error| {error:.2e}")

        # Memory-bound element-wise ops.
        count = 1 << 24
        x = rng.standard_normal(count).astype(np.float32)
        px, py, pz = put(x), put(x), be.alloc(count * 4)

        def unary() -> None:
            be.unary("relu", px, pz, count)
            be.synchronize()

        def binary() -> None:
            be.binary("add", px, py, pz, count)
            be.synchronize()

        gbs = 2 * count * 4 / best_time(unary, args.repeat) / 1e9
        row("unary relu 2^24 (GB/s)", gbs, "GB/s", 25.0, gbs / 25.0)
        gbs = 3 * count * 4 / best_time(binary, args.repeat) / 1e9
        row("binary add 2^24 (GB/s)", gbs, "GB/s", 25.0, gbs / 25.0)

        # Reported without a target, against the host copy measured above.
        def reduce_sum() -> None:
            be.reduce("sum", px, pz, [count], 0)
            be.synchronize()

        def softmax() -> None:
            be.softmax(px, pz, [count // 4096, 4096], 1)
            be.synchronize()

        for label, fn, moved in (
            ("reduce sum 2^24 (GB/s)", reduce_sum, count * 4),
            ("softmax 4096 x 4096 (GB/s)", softmax, 2 * count * 4),
        ):
            gbs = moved / best_time(fn, args.repeat) / 1e9
            print(f"{label:<44} {gbs:>10.2f} GB/s     ({gbs / copy_gbs:.2f}x host copy)")


if __name__ == "__main__":
    main()
