"""The per-call fast paths of the pointer table: ``Lease.resolve_pair`` against ``Lease.resolve``,
the cached whole-allocation region, and the cached view being dropped with the memory."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from computehal import InvalidArgumentError, NotInitializedError
from computehal.memory import Allocation, Lease, PointerTable, Region

SPANS = ((0x1000, 256), (0x2000, 64), (0x3000, 8))


def table_with(*spans: tuple[int, int], release: list[Allocation] | None = None) -> PointerTable:
    table = PointerTable(release=None if release is None else release.append)
    for base, size in spans:
        table.insert(Allocation(base, size, payload=None))
    return table


def _outcome(call: Callable[..., tuple[Region, Region]], *args: Any) -> tuple[str, object]:
    """("ok", regions) or ("error", message) of a resolution."""
    try:
        result = call(*args)
    except InvalidArgumentError as exc:
        return ("error", str(exc))
    return ("ok", tuple((r.allocation.base, r.offset, r.nbytes) for r in result))


def _one_by_one(lease: Lease, ptr_a: int, ptr_b: int, nbytes: int, align: int) -> tuple[Region, Region]:
    return lease.resolve("a_ptr", ptr_a, nbytes, align), lease.resolve("b_ptr", ptr_b, nbytes, align)


POINTERS = (0x1000, 0x1004, 0x10FC, 0x1100, 0x1002, 0x2000, 0x2040, 0x3000, 0x5000, 0, -4, 2**70)


@pytest.mark.parametrize("nbytes", [0, 4, 8, 64, 256])
@pytest.mark.parametrize("align", [1, 4])
def test_resolve_pair_matches_two_resolves(nbytes: int, align: int) -> None:
    """Every pair of pointers (bases, interior, one past the end, misaligned, unknown, out of
    range): resolve_pair gives the regions, or the error, of resolve(a) then resolve(b)."""
    for ptr_a, ptr_b in itertools.product(POINTERS, repeat=2):
        pair_table, single_table = table_with(*SPANS), table_with(*SPANS)
        pair, single = pair_table.lease(), single_table.lease()
        got = _outcome(pair.resolve_pair, "a_ptr", ptr_a, "b_ptr", ptr_b, nbytes, align)
        want = _outcome(_one_by_one, single, ptr_a, ptr_b, nbytes, align)
        assert got == want, (ptr_a, ptr_b, nbytes, align)
        # resolve(a) pins before resolve(b) fails: the pair leaves the same pins behind
        assert [a.pins for a in pair_table.live()] == [a.pins for a in single_table.live()]
        pair.end()
        single.end()
        assert all(a.pins == 0 for a in pair_table.live()) and not pair_table.busy()


def test_resolve_pair_on_a_closed_table() -> None:
    table = table_with(*SPANS)
    lease = table.lease()
    table.close()
    with pytest.raises(NotInitializedError):
        lease.resolve_pair("a", 0x1000, "b", 0x2000, 4)
    lease.end()


def test_whole_region_is_reused_only_for_the_whole_allocation() -> None:
    table = table_with(*SPANS)
    lease = table.lease()
    first = lease.resolve("x", 0x2000, 64)
    again = lease.resolve("x", 0x2000, 64)
    assert again is first and first.allocation.whole is first
    part = lease.resolve("x", 0x2000, 60)
    assert part is not first and (part.offset, part.nbytes) == (0, 60)
    a, b = lease.resolve_pair("a", 0x2000, "b", 0x2000, 64)
    assert a is first and b is first
    inner, _ = lease.resolve_pair("a", 0x2004, "b", 0x2000, 60)
    assert (inner.offset, inner.nbytes) == (4, 60)
    lease.end()


def test_free_drops_the_cached_view_and_whole_region_once_unpinned() -> None:
    """A free while an operation pins the allocation keeps the caches (the memory is still in
    use); the release after the last lease clears them before the backend gets the memory."""
    released: list[Allocation] = []
    table = table_with(*SPANS, release=released)
    lease = table.lease()
    region = lease.resolve("x", 0x1000, 256)
    allocation = region.allocation
    allocation.view = "typed view"
    table.free("ptr", 0x1000)
    assert allocation.freed and allocation.view == "typed view" and allocation.whole is region
    assert not released
    lease.end()
    assert released == [allocation]
    assert allocation.view is None and allocation.whole is None
    # a new allocation at the same address starts with empty caches of its own
    table.insert(Allocation(0x1000, 256, payload=None))
    fresh = table.lease()
    new_region = fresh.resolve("x", 0x1000, 256)
    assert new_region.allocation is not allocation and new_region.allocation.view is None
    fresh.end()


def test_drain_drops_the_caches_of_borrowed_and_owned_allocations() -> None:
    table = PointerTable()
    owned, borrowed = Allocation(0x1000, 64, None), Allocation(0x2000, 64, None, borrowed=True)
    for allocation in (owned, borrowed):
        table.insert(allocation)
        lease = table.lease()
        lease.resolve("x", allocation.base, 64)
        lease.end()
        allocation.view = "view"
        assert allocation.whole is not None
    table.drain()
    assert all(a.view is None and a.whole is None for a in (owned, borrowed))
