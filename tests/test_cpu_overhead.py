"""The CPU backend's per-call fast paths against its general paths and against NumPy:
one-ufunc small unary calls, typed views cached per allocation (dropped with the memory,
never reached through a later allocation at the same address), interior pointers, and
frees racing a running call."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from computehal import InvalidArgumentError
from computehal.backends.cpu import CpuBackend
from computehal.backends.cpu import _memory as host_memory
from computehal.backends.cpu._elementwise import _DIRECT, _F32_KERNELS, DIRECT_LIMIT, KERNEL_THRESHOLD
from computehal.types import UnaryOp


@pytest.fixture
def be() -> Iterator[CpuBackend]:
    with CpuBackend() as backend:
        yield backend  # type: ignore[misc]


def put(be: CpuBackend, values: np.ndarray[Any, Any]) -> int:
    ptr = be.alloc(max(values.nbytes, 1))
    be.copy_htod(ptr, values)
    return ptr


def get(be: CpuBackend, ptr: int, n: int, dtype: Any) -> np.ndarray[Any, Any]:
    out = np.empty(n, dtype=dtype)
    be.copy_dtoh(out, ptr)
    return out


SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3e38, -3e38, 1e-40, -1e-40, np.inf, -np.inf, np.nan, 100.0]


def _same_bits(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    """Equal bit patterns, except that any NaN matches any NaN."""
    nan = np.isnan(a)
    if not np.array_equal(nan, np.isnan(b)):
        return False
    bits = np.dtype(f"u{a.itemsize}")
    return bool(np.array_equal(a[~nan].view(bits), b[~nan].view(bits)))


#: (op, dtype) pairs whose large calls also go through the ufunc: float32 ops with a
#: compiled kernel are left out (their large calls use the kernel, a different code path).
_UFUNC_BOTH_WAYS = [
    pytest.param(op, dtype, id=f"{op.value}-{dtype}")
    for op in sorted(_DIRECT, key=lambda o: o.value)
    for dtype in ("float32", "float64")
    if not (dtype == "float32" and op in _F32_KERNELS)
]


@pytest.mark.parametrize(("op", "dtype"), _UFUNC_BOTH_WAYS)
def test_direct_small_path_matches_the_general_path(be: CpuBackend, op: UnaryOp, dtype: str) -> None:
    """Below DIRECT_LIMIT elements an op is one ufunc call; its results (special values
    included: NaN, infinities, signed zeros, subnormals) are bit for bit those of the
    general path, which runs the same values in a call too large for the direct one."""
    small = np.array(SPECIALS, dtype=dtype)
    large = np.resize(small, KERNEL_THRESHOLD + 5)
    assert small.size < DIRECT_LIMIT
    results = []
    for values in (small, large):
        src, dst = put(be, values), be.alloc(values.nbytes)
        be.unary(op.value, src, dst, values.size, dtype=dtype)
        results.append(get(be, dst, values.size, dtype))
        be.unary(op.value, src, src, values.size, dtype=dtype)  # in place
        assert _same_bits(get(be, src, values.size, dtype), results[-1])
        be.free(src)
        be.free(dst)
    assert _same_bits(results[0], results[1][: small.size])


@pytest.mark.parametrize("n", [1, 3, DIRECT_LIMIT - 1, DIRECT_LIMIT, KERNEL_THRESHOLD - 1])
def test_relu_sizes_against_numpy(be: CpuBackend, n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    x[:: max(1, n // 3)] = np.nan
    src, dst = put(be, x), be.alloc(x.nbytes)
    be.unary("relu", src, dst, n)
    want = np.where(x > 0, x, np.float32(0))  # NaN -> 0
    np.testing.assert_array_equal(get(be, dst, n, np.float32), want)
    be.free(src)
    be.free(dst)


def test_interior_pointers_and_partial_overlap(be: CpuBackend) -> None:
    """Operands inside an allocation (not its base) take the fast resolution too; a partial
    overlap of input and output reads every input before writing (copied aside)."""
    x = np.arange(-8, 8, dtype=np.float32)
    ptr = put(be, x)
    other = be.alloc(64)
    be.unary("neg", ptr + 8, other + 4, 6)
    np.testing.assert_array_equal(get(be, other + 4, 6, np.float32), -x[2:8])
    be.unary("neg", ptr + 4, ptr + 8, 8)  # out starts one element after the input
    want = x.copy()
    want[2:10] = -x[1:9]
    np.testing.assert_array_equal(get(be, ptr, 16, np.float32), want)
    with pytest.raises(InvalidArgumentError, match="needs 8 bytes but only 4 remain"):
        be.unary("neg", ptr + 60, other, 2)
    with pytest.raises(InvalidArgumentError, match="not aligned"):
        be.unary("neg", ptr + 2, other, 1)
    be.unary("neg", ptr + 64, other + 64, 0)  # zero elements one past the end: valid
    be.free(ptr)
    be.free(other)


def test_views_switch_dtype_on_one_allocation(be: CpuBackend) -> None:
    ptr = be.alloc(64)
    be.copy_htod(ptr, np.arange(8, dtype=np.float64) - 4)
    be.unary("abs", ptr, ptr, 8, dtype="float64")
    np.testing.assert_array_equal(get(be, ptr, 8, np.float64), np.abs(np.arange(8) - 4.0))
    be.copy_htod(ptr, np.arange(16, dtype=np.float32) - 8)
    be.unary("abs", ptr + 4, ptr + 4, 14)  # float32 now, interior
    want = np.abs(np.arange(16, dtype=np.float32) - 8)
    want[0], want[15] = -8, 7
    np.testing.assert_array_equal(get(be, ptr, 16, np.float32), want)
    be.free(ptr)


@pytest.mark.parametrize("size", [64, host_memory.LARGE_THRESHOLD, host_memory.HUGE_BYTES])
def test_no_cached_view_reaches_a_later_allocation_at_the_same_address(
    be: CpuBackend, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no quarantine the heap hands a freed address out again; calls on the new
    allocation write the new memory (its own view), and the freed one's view is gone."""
    monkeypatch.setattr(host_memory, "SMALL_BLOCKS", 0)
    monkeypatch.setattr(host_memory, "LARGE_BLOCKS", 0)
    n = size // 4
    seen: dict[int, int] = {}
    reused = False
    for round_ in range(40):
        ptr = be.alloc(size)
        reused = reused or ptr in seen
        be.copy_htod(ptr, np.full(n, -float(round_ + 1), dtype=np.float32))
        be.unary("abs", ptr, ptr, n)
        np.testing.assert_array_equal(get(be, ptr, n, np.float32), np.full(n, round_ + 1, np.float32))
        allocation = be._table._by_base[ptr]
        assert allocation.view is not None
        be.free(ptr)
        assert allocation.view is None and allocation.whole is None and allocation.payload is None
        seen[ptr] = round_
    # Without a quarantine the heap hands the same address out again (malloc / mmap
    # reuse it for a block of the same size); the test means nothing if it did not.
    assert reused, "the allocator never returned a freed address: nothing was tested"


class _FreeingBackend(CpuBackend):
    """Frees the input inside the hook (as another thread could), then runs it."""

    free_inside = False

    def _exec_unary(self, p: Any) -> None:
        if self.free_inside:
            self.free(p.a.ptr)
            assert p.a.allocation.payload is not None  # pinned: not released yet
        super()._exec_unary(p)


def test_free_during_a_call_releases_after_it() -> None:
    with _FreeingBackend() as be:
        x = np.array([-1.0, 2.0, -3.0], dtype=np.float32)
        src, dst = put(be, x), be.alloc(12)
        be.unary("relu", src, dst, 3)  # warms the view cache of both
        allocation = be._table._by_base[src]
        assert allocation.view is not None
        be.free_inside = True
        be.unary("abs", src, dst, 3)
        np.testing.assert_array_equal(get(be, dst, 3, np.float32), np.abs(x))
        assert allocation.view is None and allocation.payload is None
        be.free_inside = False
        with pytest.raises(InvalidArgumentError, match="freed"):
            be.unary("relu", src, dst, 3)
        be.free(dst)


def test_calls_racing_frees_from_another_thread(be: CpuBackend) -> None:
    """One thread calls unary on a pointer that another frees and reallocates: each call
    either runs on live memory (correct result) or is refused; nothing else escapes.

    The churning thread keeps going until the caller has tried at least 50 calls while
    it ran (a loaded machine can otherwise hand it the GIL for all its rounds at once,
    and no call would race it), with a deadline.
    """
    n = 16
    x = -np.arange(1, n + 1, dtype=np.float32)
    out = be.alloc(n * 4)
    box = {"ptr": put(be, x)}
    stop = threading.Event()
    errors: list[BaseException] = []
    tried = [0]

    def churn() -> None:
        deadline = time.monotonic() + 60.0
        try:
            rounds = 0
            while rounds < 300 or (tried[0] < 50 and time.monotonic() < deadline):
                old = box["ptr"]
                box["ptr"] = put(be, x)
                be.free(old)
                rounds += 1
                if rounds % 8 == 0:
                    time.sleep(0)  # offer the caller the GIL
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            stop.set()

    worker = threading.Thread(target=churn)
    worker.start()
    ran = refused = 0
    while not stop.is_set():
        tried[0] += 1
        try:
            be.unary("abs", box["ptr"], out, n)
            ran += 1
        except InvalidArgumentError:
            refused += 1
            continue
        np.testing.assert_array_equal(get(be, out, n, np.float32), -x)
    worker.join()
    assert not errors and ran > 0, (errors, ran, refused)
    be.free(box["ptr"])
    be.free(out)
    assert be.live_allocations() == 0


def test_close_with_cached_views_then_reinit(be: CpuBackend) -> None:
    ptrs = [be.alloc(size) for size in (64, host_memory.LARGE_THRESHOLD, host_memory.HUGE_BYTES)]
    for ptr in ptrs:
        be.unary("relu", ptr, ptr, 16)
    allocations = [be._table._by_base[p] for p in ptrs]
    be.close()
    assert all(a.view is None and a.whole is None for a in allocations)
    be.init()
    ptr = put(be, np.array([-1.0, 1.0], dtype=np.float32))
    be.unary("relu", ptr, ptr, 2)
    np.testing.assert_array_equal(get(be, ptr, 2, np.float32), [0.0, 1.0])
    be.free(ptr)


@pytest.mark.parametrize("n", [4, KERNEL_THRESHOLD - 1])
def test_small_calls_ignore_and_restore_the_callers_fp_error_state(be: CpuBackend, n: int) -> None:
    """Small calls set NumPy's error state to "ignore" themselves (no warning, no exception
    even where the caller asked NumPy to raise) and leave the caller's state as it was."""
    big = put(be, np.full(n, 3e38, dtype=np.float32))
    neg = put(be, np.full(n, -1.0, dtype=np.float32))
    out = be.alloc(n * 4)
    for state in ("raise", "warn", "ignore"):
        with np.errstate(all=state):
            before = np.geterr()
            be.binary("add", big, big, out, n)
            np.testing.assert_array_equal(get(be, out, n, np.float32), np.inf)
            be.binary("div", neg, out, out, n)  # -1 / inf: no flag; then 0 / 0: invalid
            be.binary("div", out, out, out, n)
            assert np.isnan(get(be, out, n, np.float32)).all()
            be.unary("exp", big, out, n)
            np.testing.assert_array_equal(get(be, out, n, np.float32), np.inf)
            be.unary("log", neg, out, n)
            assert np.isnan(get(be, out, n, np.float32)).all()
            assert np.geterr() == before
    for ptr in (big, neg, out):
        be.free(ptr)


def test_fp_error_state_is_per_thread(be: CpuBackend) -> None:
    """A small call in one thread does not change the error state another thread sees."""
    big = put(be, np.full(4, 3e38, dtype=np.float32))
    seen: list[dict[str, str]] = []
    inside = threading.Event()
    done = threading.Event()

    def other() -> None:
        with np.errstate(all="raise"):
            inside.set()
            done.wait(5)
            seen.append(np.geterr())

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(5)
    for _ in range(50):
        be.binary("add", big, big, big, 4)
    done.set()
    thread.join()
    assert seen and set(seen[0].values()) == {"raise"}
    be.free(big)
