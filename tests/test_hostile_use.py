"""Hostile and careless use of every backend: the reproductions of reported breakages.

Each test recreates one way the contract was broken from outside (indices checked on
one object and used from another, operands freed under a running operation, raw bytes
written over Python object pointers, a close that deadlocked in the garbage collector,
the wrong exception type) and checks the promise: only ``BackendError`` escapes,
nothing outside an operand is written, results are right or refused, nothing hangs.
Threaded tests are bounded in time.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from computehal import BackendError, ComputeBackend, InvalidArgumentError
from computehal.testing.workspace import Workspace

F32 = np.float32
ROWS, COLS = 8, 5
#: Names the wgpu backend takes (its adapter's API); here that is lavapipe, a slow
#: software Vulkan, so the long-running calls below are made smaller there.
SOFTWARE_GPU_NAMES = frozenset({"wgpu", "vulkan", "metal", "dx12", "gl"})


def _table(seed: int, rows: int = ROWS, cols: int = COLS) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(F32)


def _run_bounded(target: Callable[[], None], seconds: float, what: str) -> None:
    """Run ``target`` in a daemon thread; fail if it is still running after ``seconds``."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{what} did not finish within {seconds} s (deadlock or hang)"
    if errors:
        raise errors[0]


# --------------------------------------------------------------------------- indices


@pytest.mark.parametrize("op", ["gather", "scatter"])
@pytest.mark.parametrize("bad", [6, 10**6])
def test_masked_index_array_is_checked_on_its_data(backend: ComputeBackend, op: str, bad: int) -> None:
    """A masked entry passes ``min()`` / ``max()`` of a masked array but is still data."""
    indices = np.ma.array([0, bad], mask=[False, True])
    assert indices.max() < 4  # what a check on the masked object sees
    with Workspace(backend, tail=0) as ws:
        if op == "gather":
            src, dst = (
                ws.put(_table(1, 4, COLS), label="input"),
                ws.put(np.zeros((2, COLS), F32), label="output"),
            )
        else:
            src, dst = (
                ws.put(_table(1, 2, COLS), label="input"),
                ws.put(np.zeros((4, COLS), F32), label="output"),
            )
        with pytest.raises(InvalidArgumentError):
            getattr(backend, op)(src, indices, dst, 4, COLS)
        ws.check_unchanged()


@pytest.mark.parametrize("op", ["gather", "scatter"])
def test_index_array_changed_by_another_thread(backend: ComputeBackend, op: str) -> None:
    """Every call sees one snapshot of the indices: it is refused (nothing written) or right.

    The other thread rewrites the whole array with NumPy copies, which run without the
    GIL, so the values change while a call checks and copies them.
    """
    count = 1 << 16
    # One row per index (a permutation): a dropped, zeroed or clipped row shows.
    valid = np.random.default_rng(2).permutation(count).astype(np.int64)
    poisoned = valid.copy()
    poisoned[count // 2 :: 997] = 10**6
    indices = valid.copy()
    stop = threading.Event()

    def mutate() -> None:
        while not stop.is_set():
            np.copyto(indices, poisoned)
            np.copyto(indices, valid)

    table = _table(3, count, COLS)
    with Workspace(backend) as ws:
        if op == "gather":
            src, dst = ws.put(table, label="input"), ws.put(np.zeros((count, COLS), F32), label="output")
            want = table[valid]
        else:
            picked = _table(4, count, COLS)
            src, dst = ws.put(picked, label="input"), ws.put(table, label="output")
            want = table.copy()
            want[valid] = picked
        before = ws.get(dst, want.shape)
        mutator = threading.Thread(target=mutate, daemon=True)
        mutator.start()
        refused = computed = 0
        deadline = time.monotonic() + 3.0
        try:
            while time.monotonic() < deadline and refused + computed < 60:
                try:
                    getattr(backend, op)(src, indices, dst, count, COLS)
                except InvalidArgumentError:
                    refused += 1
                    np.testing.assert_array_equal(
                        ws.get(dst, want.shape), before, err_msg="written, then refused"
                    )
                    continue
                computed += 1
                np.testing.assert_array_equal(ws.get(dst, want.shape), want)  # canaries checked too
                backend.copy_htod(dst, before)
        finally:
            stop.set()
            mutator.join(10)
        ws.check_guards()
    assert refused + computed > 0


# --------------------------------------------------------------------------- freed operands


class FreesOnIndex:
    """An integer whose ``__index__`` frees another allocation when called the ``on_call``-th time."""

    def __init__(self, value: int, free: Callable[[], None], on_call: int = 1) -> None:
        self.value = value
        self.free = free
        self.on_call = on_call
        self.calls = 0

    def __index__(self) -> int:
        self.calls += 1
        if self.calls == self.on_call:
            self.free()
        return self.value


def test_pointer_whose_index_frees_an_earlier_operand_of_gemm(backend: ComputeBackend) -> None:
    """Each argument's ``__index__`` runs once, before any pointer is resolved.

    ``c_ptr`` frees A from its ``__index__``. Freeing on its first call makes A a freed
    pointer, refused; an object that would free A on a second call (after A has been
    resolved, where pointers were converted twice) never gets one, and the call computes
    on live memory.
    """
    n = 64
    a, b, c = (_table(s, n, n) for s in (5, 6, 7))
    with Workspace(backend) as ws:
        pa, pb, pc = ws.put(a, label="A"), ws.put(b, label="B"), ws.put(c, label="C")
        late = FreesOnIndex(pc, lambda: ws.release(pa), on_call=2)
        backend.gemm("N", "N", n, n, n, 1.0, pa, n, pb, n, 0.0, late, n, dtype="float32")
        assert late.calls == 1, f"__index__ ran {late.calls} times"
        got = ws.get(pc, (n, n))  # column-major C = A @ B, i.e. row-major C^T = B^T A^T
        np.testing.assert_allclose(got, b.astype(np.float64) @ a, rtol=1e-4, atol=1e-4)
        ws.check_unchanged(("A", "B"))
        ws.refresh()
        early = FreesOnIndex(pc, lambda: ws.release(pa), on_call=1)
        with pytest.raises(InvalidArgumentError):
            backend.gemm("N", "N", n, n, n, 1.0, pa, n, pb, n, 0.0, early, n, dtype="float32")
        assert early.calls == 1, f"__index__ ran {early.calls} times"
        ws.check_unchanged()


def test_pointer_whose_index_frees_the_input_of_unary(backend: ComputeBackend) -> None:
    x = _table(8, 1, 1000).reshape(-1)
    with Workspace(backend) as ws:
        px, po = ws.put(x, label="input"), ws.put(np.zeros_like(x), label="output")
        out = FreesOnIndex(po, lambda: ws.release(px))
        with pytest.raises(InvalidArgumentError):
            backend.unary("exp", px, out, x.size)
        assert out.calls == 1
        ws.check_unchanged()


def _long_call(backend: ComputeBackend, op: str, ws: Workspace) -> tuple[Callable[[], None], dict[str, int]]:
    """An operation that runs for a while on every backend, and its operands by name."""
    slow = backend.name() in SOFTWARE_GPU_NAMES
    if op == "gemm":
        # A thin product into a large C (36 MB: beyond malloc's largest heap threshold, so
        # a host backend that released it would unmap it under the running call).
        n, k = (256, 4) if slow else (3000, 4)
        ptrs = {
            "A": ws.put(_table(1, n, k), label="A"),
            "B": ws.put(_table(2, k, n), label="B"),
            "C": ws.put(np.zeros((n, n), F32), label="C"),
        }
        return (
            lambda: backend.gemm(
                "N", "N", n, n, k, 1.0, ptrs["A"], n, ptrs["B"], k, 0.0, ptrs["C"], n, dtype="float32"
            ),
            ptrs,
        )
    if op == "unary":
        count = 1 << (18 if slow else 21)
        ptrs = {
            "input": ws.put(np.ones(count, F32), label="input"),
            "output": ws.put(np.ones(count, F32), label="output"),
        }
        return lambda: backend.unary("tanh", ptrs["input"], ptrs["output"], count), ptrs
    if op == "attention":
        s, d = (128, 32) if slow else (512, 64)
        q = np.random.default_rng(9).standard_normal((1, 2, s, d)).astype(F32)
        ptrs = {name: ws.put(q, label=name) for name in ("q", "k", "v", "o")}
        return (
            lambda: backend.attention(ptrs["q"], ptrs["k"], ptrs["v"], ptrs["o"], 1, 2, s, s, d, 0.125, True),
            ptrs,
        )
    rows = 1 << (13 if slow else 15)
    ptrs = {
        "input": ws.put(np.ones((rows, 16), F32), label="input"),
        "output": ws.put(np.ones((rows, 16), F32), label="output"),
    }
    index = np.random.default_rng(10).integers(0, rows, rows)
    return lambda: backend.gather(ptrs["input"], index, ptrs["output"], rows, 16), ptrs


@pytest.mark.parametrize("op", ["gemm", "unary", "attention", "gather"])
def test_free_while_an_operation_runs(backend: ComputeBackend, op: str) -> None:
    """Another thread frees an operand of a running call and reuses the memory.

    The call finishes (its operands are pinned) or refuses the freed pointer; the
    new allocation made after the free is never written by the old call.
    """
    for delay in (0.0, 0.003, 0.01):
        with Workspace(backend) as ws:
            call, ptrs = _long_call(backend, op, ws)
            victim = ptrs["C"] if op == "gemm" else ptrs["o"] if op == "attention" else ptrs["output"]
            fresh: list[int] = []
            pattern = (np.arange(ws.block(victim).size) % 251).astype(np.uint8)
            started = threading.Event()

            def free_and_reuse(
                victim: int = victim,
                ws: Workspace = ws,
                started: threading.Event = started,
                delay: float = delay,
                fresh: list[int] = fresh,
                pattern: np.ndarray[Any, Any] = pattern,
            ) -> None:
                started.wait(10)
                time.sleep(delay)
                ws.release(victim)
                # As large as the freed allocation: where memory is reused, it lands there.
                fresh.append(backend.alloc(pattern.size))
                backend.copy_htod(fresh[0], pattern)

            freer = threading.Thread(target=free_and_reuse, daemon=True)
            freer.start()

            started.set()
            try:
                call()  # in this thread, as a user would; the freeing thread is bounded
            except InvalidArgumentError:
                pass  # the free came first: the pointer is refused
            freer.join(30)
            assert not freer.is_alive() and fresh
            backend.synchronize()
            got = np.empty(pattern.size, dtype=np.uint8)
            backend.copy_dtoh(got, fresh[0])
            backend.free(fresh[0])
            np.testing.assert_array_equal(got, pattern, err_msg="the old call wrote into a new allocation")
            with pytest.raises(InvalidArgumentError):
                backend.copy_dtoh(np.empty(4, dtype=np.uint8), victim)
            ws.check_guards()


# --------------------------------------------------------------------------- host buffers


def test_copy_dtoh_refuses_object_buffers(backend: ComputeBackend) -> None:
    """Raw bytes written over Python object pointers would crash the interpreter."""
    things = [object(), "text"]
    as_array = np.empty(2, dtype=object)
    as_array[:] = things
    as_ctypes = (ctypes.py_object * 2)(*things)
    ptr = backend.alloc(64)
    try:
        backend.copy_htod(ptr, np.full(64, 0xAB, dtype=np.uint8))
        for target in (as_array, as_ctypes, memoryview(as_ctypes)):
            with pytest.raises(InvalidArgumentError):
                backend.copy_dtoh(target, ptr)
            with pytest.raises(InvalidArgumentError):
                backend.copy_htod(ptr, target)
        gc.collect()
        assert list(as_array) == things and as_array[0] is things[0]
        assert [as_ctypes[0], as_ctypes[1]] == things
        for target in (np.empty(2, dtype="datetime64[s]"), np.empty(2, dtype="U3")):
            with pytest.raises(InvalidArgumentError):
                backend.copy_dtoh(target, ptr)
    finally:
        backend.free(ptr)


def test_bfloat16_travels_as_bytes(backend: ComputeBackend) -> None:
    data = np.array([1.0, -2.5, np.inf, np.nan, 3.0e38, 1e-40], dtype=ml_dtypes.bfloat16)
    ptr = backend.alloc(data.nbytes)
    try:
        backend.copy_htod(ptr, data)
        back = np.zeros_like(data)
        backend.copy_dtoh(back, ptr)
        np.testing.assert_array_equal(back.view(np.uint16), data.view(np.uint16))
        with pytest.raises(InvalidArgumentError):
            backend.copy_htod(ptr, np.zeros(2, dtype="datetime64[s]"))
    finally:
        backend.free(ptr)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("length", [1, 3])
def test_reduce_without_an_op_is_an_invalid_argument(backend: ComputeBackend, length: int) -> None:
    with Workspace(backend) as ws:
        px = ws.put(np.ones((2, length), F32), label="input")
        po = ws.put(np.zeros(2, F32), label="output")
        for op in (None, 0, "", b"sum", 1.5):
            with pytest.raises(InvalidArgumentError):
                backend.reduce(op, px, po, [2, length], 1)  # type: ignore[arg-type]
        ws.check_unchanged()


# --------------------------------------------------------------------------- close


@pytest.fixture
def gc_threshold_one() -> Iterator[None]:
    old = gc.get_threshold()
    gc.set_threshold(1)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def test_close_with_frequent_garbage_collection(
    backend_factory: Callable[[], ComputeBackend], gc_threshold_one: None
) -> None:
    """Array finalisers that the collector runs inside close() must not deadlock it.

    The arrays sit in reference cycles made while the collector is off, so only a
    collection frees them. With a threshold of 1 the collector runs at almost any
    allocation; to make "inside the table's drain" certain rather than likely, a trace
    hook collects at the first call made from ``drain`` (while it holds the table).
    """
    import computehal.array as ca

    be = backend_factory()
    be.init()
    gc.disable()
    try:
        for i in range(30):
            cycle: list[Any] = [ca.asarray(np.full(64, i, dtype=F32), be)]
            cycle.append(cycle)  # only the collector frees these
        del cycle
        collected: list[int] = []

        def collect_inside_drain(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and not collected and frame.f_back is not None:
                if frame.f_back.f_code.co_name == "drain":
                    collected.append(gc.collect())

        def close() -> None:
            sys.settrace(collect_inside_drain)
            try:
                be.close()
            finally:
                sys.settrace(None)

        _run_bounded(close, 30, "close() with the collector running inside it")
        assert collected and collected[0] > 0, "the collector did not run inside close()"
    finally:
        gc.enable()
    assert not be.is_initialized()
    gc.collect()
    with pytest.raises(BackendError):
        be.alloc(64)


def test_freeze_racing_writes_from_another_thread(backend: ComputeBackend) -> None:
    """One thread keeps copying into an allocation while this one freezes it: freeze is
    refused while a copy runs, and once it succeeds no write lands any more."""
    n = 1 << 16
    be = backend
    target, sources = be.alloc(n), [be.alloc(n) for _ in range(2)]
    for i, ptr in enumerate(sources):
        be.copy_htod(ptr, np.full(n, i + 1, dtype=np.uint8))
    stop, refused, writes = threading.Event(), [], [0]

    def writer() -> None:
        while not stop.is_set():
            try:
                be.copy_dtod(target, sources[writes[0] % 2], n)
                writes[0] += 1
            except InvalidArgumentError:
                refused.append(1)
                return

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while writes[0] < 20 and time.monotonic() < deadline:
        time.sleep(0.001)
    frozen = False
    while not frozen and time.monotonic() < deadline:
        try:
            be.freeze(target)
            frozen = True
        except InvalidArgumentError:
            pass  # a copy holds it: try again
    assert frozen
    seen = np.empty(n, dtype=np.uint8)
    be.copy_dtoh(seen, target)
    thread.join(20)
    stop.set()
    after = np.empty(n, dtype=np.uint8)
    be.copy_dtoh(after, target)
    assert refused and writes[0] >= 20
    assert np.array_equal(seen, after) and len(set(seen.tolist())) == 1
    for ptr in (target, *sources):
        be.free(ptr)
