"""The shared memory bookkeeping: PointerTable, Region, AddressSpace, as_count / as_pointer."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from computehal import InvalidArgumentError, NotInitializedError
from computehal.memory import ALIGNMENT, AddressSpace, Allocation, PointerTable, Region, as_count, as_pointer


def table_with(*spans: tuple[int, int]) -> PointerTable:
    table = PointerTable()
    for base, size in spans:
        table.insert(Allocation(base, size, payload=None))
    return table


def test_resolve_interior_and_exact_end() -> None:
    table = table_with((0x1000, 256), (0x2000, 64))
    region = table.resolve("x", 0x1000 + 16, 240)
    assert (region.allocation.base, region.offset, region.nbytes, region.ptr) == (0x1000, 16, 240, 0x1010)
    assert table.resolve("x", 0x2000, 64).nbytes == 64
    # zero bytes at one past the end is a valid empty range
    assert table.resolve("x", 0x1000 + 256, 0).nbytes == 0


def test_resolve_message_names_argument_pointer_and_sizes() -> None:
    table = table_with((0x1000, 256))
    with pytest.raises(InvalidArgumentError) as info:
        table.resolve("c_ptr", 0x1000 + 200, 57)
    text = str(info.value)
    assert "c_ptr" in text and "0x10c8" in text and "57" in text and "56" in text
    with pytest.raises(InvalidArgumentError, match=r"b_ptr = 0x5000 does not point into any live allocation"):
        table.resolve("b_ptr", 0x5000, 4)
    with pytest.raises(InvalidArgumentError, match="needs 1 bytes"):
        table.resolve("a_ptr", 0x1000 + 256, 1)


def test_resolve_alignment() -> None:
    table = table_with((0x1000, 256))
    assert table.resolve("x", 0x1004, 8, align=4).offset == 4
    with pytest.raises(InvalidArgumentError, match="not aligned to its 4-byte elements"):
        table.resolve("x", 0x1002, 8, align=4)
    with pytest.raises(InvalidArgumentError, match="8-byte"):
        table.resolve("x", 0x1004, 8, align=8)


@pytest.mark.parametrize("ptr", [0, -64, 2**64, None, 1.5, "0x1000", b"\x10", True])
def test_bad_pointer_values(ptr: object) -> None:
    with pytest.raises(InvalidArgumentError):
        table_with((0x1000, 64)).resolve("p", ptr, 0)


def test_insert_refuses_overlap_and_remove_rules() -> None:
    table = table_with((0x1000, 256))
    for base, size in ((0x1000, 1), (0x10FF, 10), (0xF00, 0x101)):
        with pytest.raises(InvalidArgumentError, match="overlaps"):
            table.insert(Allocation(base, size, None))
    table.insert(Allocation(0x1100, 16, None))  # adjacent is fine
    with pytest.raises(InvalidArgumentError, match="only a base pointer"):
        table.remove("ptr", 0x1008)
    assert table.remove("ptr", 0x1000).size == 256
    with pytest.raises(InvalidArgumentError, match="already freed"):
        table.remove("ptr", 0x1000)
    assert len(table) == 1 and [a.base for a in table.live()] == [0x1100]
    assert [a.base for a in table.drain()] == [0x1100] and len(table) == 0


def test_region_overlaps() -> None:
    a = Allocation(0x1000, 100, None)
    b = Allocation(0x2000, 100, None)
    assert Region(a, 0, 10).overlaps(Region(a, 9, 5))
    assert not Region(a, 0, 10).overlaps(Region(a, 10, 5))
    assert not Region(a, 0, 10).overlaps(Region(b, 0, 10))
    assert not Region(a, 0, 0).overlaps(Region(a, 0, 10))


def test_address_space_aligned_guarded_never_reused() -> None:
    space = AddressSpace(start=0x10000, guard=4096)
    bases = [space.reserve(n) for n in (1, 64, 65, 0, 1000)]
    assert all(b % ALIGNMENT == 0 for b in bases)
    assert bases == sorted(bases) and len(set(bases)) == len(bases)
    for (b0, n0), b1 in zip(zip(bases, (1, 64, 65, 0, 1000), strict=True), bases[1:], strict=False):
        assert b1 - (b0 + max(n0, 1)) >= 4096


def test_address_space_threads() -> None:
    space = AddressSpace()
    out: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        mine = [space.reserve(100) for _ in range(200)]
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 800


@pytest.mark.parametrize("value", [0, 1, 2**62, np.int64(5), np.uint8(7)])
def test_as_count_accepts(value: object) -> None:
    assert as_count("n", value) == int(value)  # type: ignore[call-overload]


@pytest.mark.parametrize("value", [-1, 2**62 + 1, 1.0, None, "3", True, [1], np.float32(2)])
def test_as_count_rejects(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="^invalid argument: n"):
        as_count("n", value)


def test_as_pointer() -> None:
    assert as_pointer("p", np.uint64(0x1000)) == 0x1000
    assert as_pointer("p", 2**64 - 1) == 2**64 - 1
    with pytest.raises(InvalidArgumentError, match="null pointer"):
        as_pointer("p", 0)


def test_concurrent_insert_remove_resolve() -> None:
    table = PointerTable()
    space = AddressSpace()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(200):
                base = space.reserve(128)
                table.insert(Allocation(base, 128, None))
                assert table.resolve("x", base + 64, 64).offset == 64
                table.remove("ptr", base)
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(table) == 0


# --------------------------------------------------------------------------- leases


def test_lease_pins_resolved_operands_and_counts_from_its_first_pin() -> None:
    table = table_with((0x1000, 64), (0x2000, 64))
    lease = table.lease()
    assert not table.busy()  # nothing pinned yet: nothing to wait for
    first = lease.resolve("a", 0x1000, 64)
    second = lease.resolve("b", 0x2010, 16)  # an interior pointer
    assert table.busy() and first.allocation.pins == 1 and second.allocation.pins == 1
    assert (second.allocation.base, second.offset, second.ptr) == (0x2000, 16, 0x2010)
    assert type(first) is Region and first == Region(first.allocation, 0, 64)
    lease.end()
    assert not table.busy() and first.allocation.pins == 0 and second.allocation.pins == 0


def test_freeze_rules() -> None:
    """Interior pointers freeze the whole allocation; borrowed, host-viewed, in-use and
    unknown memory cannot be frozen; a second freeze of a frozen allocation is a no-op."""
    table = table_with((0x1000, 64), (0x2000, 64), (0x3000, 64), (0x4000, 64))
    table.freeze("p", 0x1010)
    assert table.resolve("p", 0x1000, 64).allocation.frozen
    table.freeze("p", 0x1000)  # idempotent
    borrowed = Allocation(0x5000, 64, payload=None, borrowed=True)
    table.insert(borrowed)
    viewed = table.resolve("v", 0x2000, 64)
    assert table.expose(viewed) and viewed.allocation.exposed
    assert not table.expose(table.resolve("f", 0x1000, 8))  # a frozen one gives read-only views
    lease = table.lease()
    lease.resolve("u", 0x3000, 64)
    for ptr in (0x5000, 0x2000, 0x3000, 0x40, 0x1040, 0x4000 + 64):
        with pytest.raises(InvalidArgumentError):
            table.freeze("p", ptr)
    lease.end()
    table.freeze("p", 0x3000)  # no operation uses it any more
    lease = table.lease()
    lease.resolve("u", 0x1000, 64)
    table.freeze("p", 0x1000)  # already frozen: nothing can be writing it
    lease.end()


def test_lease_resolve_checks_like_the_table() -> None:
    table = table_with((0x1000, 256))
    lease = table.lease()
    with pytest.raises(InvalidArgumentError, match="not aligned to its 4-byte elements"):
        lease.resolve("x", 0x1002, 8, align=4)
    with pytest.raises(InvalidArgumentError, match=r"c_ptr = 0x10c8 needs 57 bytes but only 56 remain"):
        lease.resolve("c_ptr", 0x10C8, 57)
    with pytest.raises(InvalidArgumentError, match="does not point into any live allocation"):
        lease.resolve("b_ptr", 0x5000, 4)
    for bad in (0, -64, 2**64, None, 1.5, True):
        with pytest.raises(InvalidArgumentError):
            lease.resolve("p", bad, 0)
    assert not table.busy()  # failed resolutions pin nothing
    lease.end()


def test_close_does_not_wait_for_a_lease_that_pinned_nothing() -> None:
    """Closing from inside a validation (a hostile ``__index__``) before any pin: no wait,
    and the lease's next resolution reports the closed backend."""
    table = table_with((0x1000, 64))
    shut: list[str] = []
    lease = table.lease()
    closer = threading.Thread(target=lambda: table.close(shutdown=lambda: shut.append("done")))
    closer.start()
    closer.join(5)
    assert not closer.is_alive() and shut == ["done"]
    with pytest.raises(NotInitializedError):
        lease.resolve("x", 0x1000, 8)
    lease.end()
    with pytest.raises(NotInitializedError):
        table.lease()


def test_close_from_inside_a_pinned_lease_defers_the_shutdown() -> None:
    table = table_with((0x1000, 64))
    shut: list[str] = []
    with table.lease() as lease:
        lease.resolve("x", 0x1000, 8)
        table.close(shutdown=lambda: shut.append("done"))  # same thread: must not wait
        assert shut == []
    assert shut == ["done"]
