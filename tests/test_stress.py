"""Several threads allocate, compute, free and free-while-computing on one backend at once.

Per backend, worker threads loop for a few seconds over small operations (GEMM,
element-wise, reductions, softmax, gather, attention, device copies) on guarded operands
(canary bytes on both sides). In half the iterations a worker hands one operand to a
freeing thread just before the call, so the free races the operation; in a quarter it
frees one itself first (a stale pointer). The promise checked: no crash, no hang (every
thread ends within a bound), every call either right or refused with
``InvalidArgumentError`` (an operand freed under a call is pinned until it ends; one
freed before the call is refused, never aliased to newer memory), canaries of the
operands a worker still owns intact, and no allocation left behind.

Marked ``stress``: it runs in the default suite (about a minute for cpu, opencl and wgpu
together); ``COMPUTEHAL_STRESS_SECONDS`` sets the seconds per backend.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from computehal import ComputeBackend, InvalidArgumentError

SECONDS = float(os.environ.get("COMPUTEHAL_STRESS_SECONDS", "12"))
WORKERS = 4
GUARD = 64
F32 = np.float32
Array = np.ndarray[Any, Any]


@dataclass
class Operand:
    """One guarded allocation: GUARD canary bytes, the data, GUARD canary bytes."""

    base: int
    data: Array
    canary: Array
    published: bool = False

    @property
    def ptr(self) -> int:
        return self.base + GUARD


@dataclass
class Worker:
    backend: ComputeBackend
    seed: int
    pool: queue.Queue[int | None]
    stop: threading.Event
    counts: dict[str, int] = field(default_factory=dict)
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    # ---------------------------------------------------------------- operands

    def put(self, data: Array) -> Operand:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        canary = self.rng.integers(0, 256, size=2 * GUARD + raw.size, dtype=np.uint8)
        canary[GUARD : GUARD + raw.size] = raw
        base = self.backend.alloc(canary.size)
        self.backend.copy_htod(base, canary)
        return Operand(base, np.ascontiguousarray(data), canary)

    def read(self, operand: Operand, shape: tuple[int, ...]) -> Array:
        raw = np.empty(operand.canary.size, dtype=np.uint8)
        self.backend.copy_dtoh(raw, operand.base)
        for part in (slice(0, GUARD), slice(raw.size - GUARD, raw.size)):
            np.testing.assert_array_equal(raw[part], operand.canary[part], err_msg="canary bytes changed")
        return raw[GUARD:-GUARD].view(F32).reshape(shape)

    def release(self, operands: list[Operand]) -> None:
        for operand in operands:
            if not operand.published:  # published ones belong to the freeing thread
                self.backend.free(operand.base)

    # ---------------------------------------------------------------- operations

    def problem(
        self,
    ) -> tuple[str, list[Array], Callable[[list[int], int], None], Callable[[], Array], tuple[int, ...]]:
        """(name, inputs, call(input_ptrs, output_ptr), reference, output shape)."""
        be, rng = self.backend, self.rng
        kind = str(
            rng.choice(["gemm", "unary", "binary", "reduce", "softmax", "gather", "attention", "copy"])
        )
        if kind == "gemm":
            m, n, k = (int(v) for v in rng.integers(1, 24, 3))
            a, b = rng.standard_normal((k, m)).astype(F32), rng.standard_normal((n, k)).astype(F32)

            def gemm(p: list[int], o: int) -> None:
                be.gemm("N", "N", m, n, k, 1.0, p[0], m, p[1], k, 0.0, o, m, dtype="float32")

            # column-major: A is m x k stored as its transpose's rows
            return kind, [a, b], gemm, lambda: (a.T.astype(np.float64) @ b.T).T, (n, m)
        if kind in ("unary", "binary", "copy"):
            size = int(rng.integers(1, 3000))
            x, y = rng.standard_normal(size).astype(F32), rng.standard_normal(size).astype(F32)
            if kind == "unary":
                return kind, [x], lambda p, o: be.unary("tanh", p[0], o, size), lambda: np.tanh(x), (size,)
            if kind == "binary":
                return (
                    kind,
                    [x, y],
                    lambda p, o: be.binary("mul", p[0], p[1], o, size),
                    lambda: x * y,
                    (size,),
                )
            return kind, [x], lambda p, o: be.copy_dtod(o, p[0], 4 * size), lambda: x, (size,)
        if kind in ("reduce", "softmax"):
            rows, cols = (int(v) for v in rng.integers(1, 40, 2))
            x = rng.standard_normal((rows, cols)).astype(F32)
            if kind == "reduce":
                return (
                    kind,
                    [x],
                    lambda p, o: be.reduce("sum", p[0], o, [rows, cols], 1),
                    lambda: x.sum(1),
                    (rows,),
                )
            e = np.exp(x - x.max(1, keepdims=True))
            return (
                kind,
                [x],
                lambda p, o: be.softmax(p[0], o, [rows, cols], 1),
                lambda: e / e.sum(1, keepdims=True),
                x.shape,
            )
        if kind == "gather":
            rows, cols = (int(v) for v in rng.integers(1, 30, 2))
            table = rng.standard_normal((rows, cols)).astype(F32)
            index = rng.integers(0, rows, int(rng.integers(1, 40)))
            return (
                kind,
                [table],
                lambda p, o: be.gather(p[0], index, o, rows, cols),
                lambda: table[index],
                (index.size, cols),
            )
        s, d = (int(v) for v in rng.integers(1, 12, 2))
        q, k, v = (rng.standard_normal((1, 2, s, d)).astype(F32) for _ in range(3))

        def reference() -> Array:
            scores = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k) * 0.5
            w = np.exp(scores - scores.max(-1, keepdims=True))
            return np.einsum("bhij,bhjd->bhid", w / w.sum(-1, keepdims=True), v)

        return (
            kind,
            [q, k, v],
            lambda p, o: be.attention(p[0], p[1], p[2], o, 1, 2, s, s, d, 0.5, False),
            reference,
            q.shape,
        )

    def iteration(self) -> None:
        kind, inputs, call, reference, out_shape = self.problem()
        operands = [self.put(x) for x in inputs]
        out = self.put(np.full(out_shape, np.nan, dtype=F32))
        mode = str(self.rng.choice(["clean", "race", "race", "stale"]))
        if mode != "clean":
            victim = (operands + [out])[int(self.rng.integers(0, len(operands) + 1))]
            victim.published = True
            if mode == "race":  # the freeing thread frees it while the call starts
                self.pool.put(victim.base)
            else:  # freed before the call: a stale pointer, which must be refused
                self.backend.free(victim.base)
        try:
            call([o.ptr for o in operands], out.ptr)
        except InvalidArgumentError:
            if mode == "clean":
                raise
            self.counts["refused"] = self.counts.get("refused", 0) + 1
        else:
            assert mode != "stale", f"{kind} accepted a pointer freed before the call"
            if not out.published:
                got = self.read(out, out_shape)
                np.testing.assert_allclose(got, reference(), rtol=2e-4, atol=2e-5, err_msg=f"{kind} result")
            self.counts[kind] = self.counts.get(kind, 0) + 1
        for operand in operands:
            if not operand.published:  # inputs unchanged, canaries around them too
                np.testing.assert_array_equal(self.read(operand, operand.data.shape), operand.data)
        self.release(operands + [out])

    def run(self) -> None:
        while not self.stop.is_set():
            self.iteration()


def _free_all(backend: ComputeBackend, pool: queue.Queue[int | None], errors: list[BaseException]) -> None:
    """Free every pointer handed over, as soon as it arrives (racing the operation using it)."""
    try:
        while True:
            ptr = pool.get()
            if ptr is None:
                return
            backend.free(ptr)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


@pytest.mark.stress
def test_threads_allocate_compute_and_free_at_once(backend: ComputeBackend) -> None:
    pool: queue.Queue[int | None] = queue.Queue()
    stop = threading.Event()
    errors: list[BaseException] = []
    workers = [Worker(backend, seed, pool, stop) for seed in range(WORKERS)]

    def guarded(worker: Worker) -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=guarded, args=(w,), daemon=True) for w in workers]
    freer = threading.Thread(target=_free_all, args=(backend, pool, errors), daemon=True)
    freer.start()
    for t in threads:
        t.start()
    time.sleep(SECONDS)
    stop.set()
    deadline = time.monotonic() + 120
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    pool.put(None)
    freer.join(max(0.0, deadline - time.monotonic()))
    hung = [t.name for t in [*threads, freer] if t.is_alive()]
    assert not hung, f"threads still running after the stop: {hung}"
    assert not errors, f"{type(errors[0]).__name__}: {errors[0]}"
    done = {}
    for w in workers:
        for key, value in w.counts.items():
            done[key] = done.get(key, 0) + value
    assert sum(v for k, v in done.items() if k != "refused") >= WORKERS, done
