"""The CPU backend under hostile or careless use: stale pointers, global BLAS state,
allocations beyond the machine, constructor arguments, and host memory access.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from computehal import DeviceError, InvalidArgumentError, NotInitializedError, OutOfMemoryError
from computehal.backends.cpu import CpuBackend
from computehal.backends.cpu import _memory as host_memory


@pytest.fixture
def be() -> Iterator[CpuBackend]:
    with CpuBackend() as backend:
        yield backend  # type: ignore[misc]


# --------------------------------------------------------------------------- stale pointers


@pytest.mark.parametrize("size", [48, 4096, 300_000, 8 << 20])
def test_freed_address_is_not_handed_out_again(be: CpuBackend, size: int) -> None:
    first = be.alloc(size)
    be.free(first)
    later = [be.alloc(size) for _ in range(40)]
    assert first not in later
    # The stale pointer, and pointers into it, are reported as freed, not aliased.
    for stale in (first, first + 16):
        with pytest.raises(InvalidArgumentError, match="freed"):
            be.fill(stale, 1, 1.0)
    for ptr in later:
        be.free(ptr)


def test_stale_pointer_after_many_cycles(be: CpuBackend) -> None:
    victim = be.alloc(256)
    be.free(victim)
    for _ in range(2000):
        be.free(be.alloc(256))
    with pytest.raises(InvalidArgumentError, match="freed"):
        be.unary("relu", victim, victim, 4)


def test_quarantine_is_bounded(be: CpuBackend) -> None:
    held_before = host_memory._BUDGET.held
    for _ in range(host_memory.SMALL_BLOCKS + 500):
        be.free(be.alloc(1024))
    for _ in range(200):
        be.free(be.alloc(host_memory.LARGE_THRESHOLD))
    # Small blocks wait whole, up to their bounds; large ones give their pages back at once.
    assert host_memory._BUDGET.held - held_before <= host_memory.SMALL_BYTES + 2 * 1024 * 64


def test_stale_device_array_reports_freed(be: CpuBackend) -> None:
    import computehal.array as ca

    x = ca.asarray(np.arange(6, dtype=np.float32), be)
    be.free(x.ptr)
    y = ca.asarray(np.zeros(6, dtype=np.float32), be)
    assert x.freed
    with pytest.raises(InvalidArgumentError):
        x.numpy()
    np.testing.assert_array_equal(y.numpy(), 0)


def test_close_ends_the_backend() -> None:
    be = CpuBackend()
    be.init()
    ptr = be.alloc(64)
    be.close()
    assert not be.is_initialized()
    with pytest.raises(NotInitializedError):
        be.fill(ptr, 1, 1.0)


# --------------------------------------------------------------------------- BLAS threads


def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [info["num_threads"] for info in threadpool_info() if info.get("user_api") == "blas"]


def test_concurrent_calls_leave_blas_threads_alone(be: CpuBackend) -> None:
    """Attention and convolution from several threads at once: BLAS keeps its thread count."""
    before = _blas_threads()
    b, h, s, d = 1, 4, 48, 16
    n = b * h * s * d
    rng = np.random.default_rng(0)
    q, k, v, o = (be.alloc(n * 4) for _ in range(4))
    for ptr in (q, k, v):
        be.copy_htod(ptr, rng.standard_normal(n).astype(np.float32))
    x, f, y = be.alloc(2 * 8 * 12 * 12 * 4), be.alloc(8 * 8 * 9 * 4), be.alloc(2 * 8 * 12 * 12 * 4)
    be.copy_htod(x, rng.standard_normal(2 * 8 * 12 * 12).astype(np.float32))
    be.copy_htod(f, rng.standard_normal(8 * 8 * 9).astype(np.float32))
    errors: list[BaseException] = []

    def attention() -> None:
        try:
            for _ in range(60):
                be.attention(q, k, v, o, b, h, s, s, d, 0.25, True)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def convolution() -> None:
        try:
            for _ in range(60):
                be.conv2d_forward(x, (2, 8, 12, 12), f, (8, 8, 3, 3), y, (2, 8, 12, 12), (1, 1), (1, 1))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=fn) for fn in (attention, convolution, attention, convolution)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert _blas_threads() == before
    for ptr in (q, k, v, o, x, f, y):
        be.free(ptr)


# --------------------------------------------------------------------------- memory bounds


def _available() -> int:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable")


def test_allocations_beyond_physical_memory_fail_up_front(be: CpuBackend) -> None:
    total = be.available_devices()[0].total_memory_bytes
    assert total > 0
    with pytest.raises(OutOfMemoryError):
        be.alloc(total + (1 << 30))
    # Untouched allocations count too: two that together exceed what is free cannot both succeed.
    size = int(min(total, _available()) * 0.55)
    first = be.alloc(size)
    try:
        with pytest.raises(OutOfMemoryError):
            be.alloc(size)
    finally:
        be.free(first)
    be.free(be.alloc(size))  # the freed block's memory is available again


# --------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attention_block_q": 0},
        {"attention_block_kv": 0},
        {"attention_block_q": -4},
        {"attention_block_kv": 1 << 20},
        {"attention_block_q": 4096, "attention_block_kv": 8192},
        {"attention_block_q": True},
        {"attention_block_kv": 2.5},
        {"device": -1},
        {"device": "0"},
    ],
)
def test_bad_constructor_arguments_fail_at_construction(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        CpuBackend(**kwargs)


def test_missing_device_fails_at_init() -> None:
    be = CpuBackend(1)
    with pytest.raises(DeviceError):
        be.init()
    assert not be.is_initialized()
    assert CpuBackend.kind == "cpu"


# --------------------------------------------------------------------------- host memory


def test_host_view_is_zero_copy(be: CpuBackend) -> None:
    ptr = be.alloc(64)
    be.fill(ptr, 16, 2.0)
    view = be.host_view(ptr + 8, 16)
    assert view is not None and not view.readonly and view.nbytes == 16
    np.frombuffer(view, dtype=np.float32)[:] = [5, 6, 7, 8]
    out = np.empty(16, dtype=np.float32)
    be.copy_dtoh(out, ptr)
    np.testing.assert_array_equal(out, [2, 2, 5, 6, 7, 8] + [2] * 10)
    with pytest.raises(InvalidArgumentError):
        be.host_view(ptr + 8, 64)
    be.free(ptr)
    with pytest.raises(InvalidArgumentError, match="freed"):
        be.host_view(ptr, 4)
    assert be.dlpack_device() == (1, 0)


def test_borrow_host_memory(be: CpuBackend) -> None:
    raw = np.zeros(64 + 256, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    owner = raw[start : start + 256].view(np.float32)
    ptr = be.borrow(owner.ctypes.data, owner.nbytes, owner)
    assert ptr == owner.ctypes.data
    be.fill(ptr, 64, 3.0)
    np.testing.assert_array_equal(owner, 3.0)
    be.unary("neg", ptr, ptr + 128, 32)
    np.testing.assert_array_equal(owner[32:], -3.0)
    info = be.allocation_of(ptr + 4)
    assert info is not None and info.borrowed
    be.free(ptr)  # forgets the range, frees nothing
    owner[0] = 9.0
    assert owner[0] == 9.0
    # Any alignment is borrowed; operations check their operands' element alignment.
    odd = be.borrow(owner.ctypes.data + 4, 16, owner)
    be.fill(odd, 4, 1.0)
    with pytest.raises(InvalidArgumentError, match="aligned"):
        be.fill(odd, 2, 1.0, dtype="float64")
    be.free(odd)
    np.testing.assert_array_equal(owner[1:5], 1.0)
    mine = be.alloc(128)
    with pytest.raises(InvalidArgumentError):
        be.borrow(mine, 64, None)  # overlaps a live allocation
    be.free(mine)


def test_blas_limit_holds_in_every_caller_thread() -> None:
    """The limit is taken and released from any thread, not only the first one that set it.

    threadpoolctl (3.8 on) ignores a pthreads OpenBLAS limit set from a Python thread other
    than the one that first set one; the backend's limit must not depend on that.
    """
    from computehal.backends.cpu._runtime import single_threaded_blas

    before = _blas_threads()
    if not before or max(before) == 1:
        pytest.skip("BLAS runs one thread here already")
    with single_threaded_blas():  # this thread sets a limit first
        pass
    seen: list[list[int]] = []

    def other() -> None:
        with single_threaded_blas():
            seen.append(_blas_threads())
        seen.append(_blas_threads())

    worker = threading.Thread(target=other)
    worker.start()
    worker.join(timeout=60)
    assert seen == [[1] * len(before), before]
    assert _blas_threads() == before


@pytest.mark.skipif(host_memory._PRIVATE is None, reason="no private anonymous mappings here")
@pytest.mark.parametrize("extra", [0, 3 << 18])
def test_blocks_from_one_huge_page_start_on_its_boundary(be: CpuBackend, extra: int) -> None:
    """From :data:`HUGE_BYTES` (one huge page) on, a block is aligned for transparent huge pages."""
    assert host_memory.HUGE_BYTES <= host_memory.HUGE_PAGE
    size = host_memory.HUGE_BYTES + extra
    ptr = be.alloc(size)
    try:
        assert ptr % host_memory.HUGE_PAGE == 0
        be.copy_htod(ptr, np.arange(size // 4, dtype=np.float32))
        got = np.empty(size // 4, dtype=np.float32)
        be.copy_dtoh(got, ptr)
        assert np.array_equal(got, np.arange(size // 4, dtype=np.float32))
    finally:
        be.free(ptr)
