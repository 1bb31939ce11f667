"""The mechanisms written once for every backend: generated signatures, the shared dispatch
(16-bit widening, inputs copied aside when an output overlaps them, constant outputs),
operand pinning, and device-side index checks that hold even when nothing is written."""

from __future__ import annotations

import inspect
import threading

import numpy as np
import pytest

from computehal import ComputeBackend, ForwardingBackend, InvalidArgumentError, NullBackend
from computehal.backend import ALL_OPS, MEMORY_OPS, PUBLIC_METHODS
from computehal.backends._base import TableBackend
from computehal.memory import Allocation, PointerTable
from conftest import claims, get, put

# --------------------------------------------------------------------------- one source of signatures


@pytest.mark.parametrize("method", PUBLIC_METHODS)
def test_wrappers_have_the_contracts_signatures(method: str) -> None:
    contract = inspect.signature(getattr(ComputeBackend, method))
    classes = [ForwardingBackend, NullBackend]
    if method in (*ALL_OPS, *MEMORY_OPS, "allocation_of", "borrow"):
        classes.append(TableBackend)
    for cls in classes:
        assert inspect.signature(getattr(cls, method)) == contract, f"{cls.__name__}.{method}"


def test_forwarding_backend_forwards_every_public_method() -> None:
    """None falls through to the ABC's default (which would answer for the wrapped backend)."""
    missing = [method for method in PUBLIC_METHODS if method not in vars(ForwardingBackend)]
    assert not missing, missing


def test_every_op_has_a_generated_table_method_and_a_hook() -> None:
    for op in ALL_OPS:
        assert op in vars(TableBackend), op
        assert callable(getattr(TableBackend, f"_exec_{op}")), op


# --------------------------------------------------------------------------- shared dispatch


def test_float16_through_float32_matches_rounded_reference(backend: ComputeBackend) -> None:
    if not claims(backend, "binary", "float16"):
        pytest.skip(f"{backend.name()} does not take float16 binary ops")
    rng = np.random.default_rng(7)
    a = rng.standard_normal(37).astype(np.float16)
    b = rng.standard_normal(37).astype(np.float16)
    pa, pb, po = put(backend, a), put(backend, b), put(backend, np.zeros(37, np.float16))
    try:
        backend.binary("mul", pa, pb, po, 37, dtype="float16")
        want = (a.astype(np.float32) * b.astype(np.float32)).astype(np.float16)
        assert np.array_equal(get(backend, po, (37,), np.float16), want)
    finally:
        for p in (pa, pb, po):
            backend.free(p)


def test_shifted_overlap_reads_inputs_first(backend: ComputeBackend) -> None:
    # unary with the output one element past the input: as if the input were read first.
    x = np.arange(1, 33, dtype=np.float32)
    p = put(backend, np.concatenate([x, [0.0]]).astype(np.float32))
    try:
        backend.unary("neg", p, p + 4, 32)
        got = get(backend, p, (33,))
        assert got[0] == 1.0 and np.array_equal(got[1:], -x)
    finally:
        backend.free(p)


@pytest.mark.parametrize("op", ["gather", "scatter"])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_device_indices_checked_even_without_columns(
    backend: ComputeBackend, op: str, index_dtype: str
) -> None:
    if not claims(backend, op):
        pytest.skip(f"{backend.name()} has no {op}")
    x, y = put(backend, np.zeros(8, np.float32)), put(backend, np.zeros(8, np.float32))
    ip = put(backend, np.array([0, 5], dtype=index_dtype))
    try:
        with pytest.raises(InvalidArgumentError, match="index 5 is out of range for 4 rows"):
            getattr(backend, op)(x, 2, y, 4, 0, indices_ptr=ip, index_dtype=index_dtype)
    finally:
        for p in (x, y, ip):
            backend.free(p)


# --------------------------------------------------------------------------- pinning


def test_free_during_an_operation_defers_the_release() -> None:
    released: list[int] = []
    table = PointerTable(release=lambda a: released.append(a.base))
    table.reopen()
    table.insert(Allocation(0x1000, 64, None))
    with table.lease() as lease:
        region = lease.resolve("x", 0x1010, 16)
        table.free("ptr", 0x1000)  # unregistered at once ...
        assert released == [] and not region.allocation.pins == 0
        with pytest.raises(InvalidArgumentError, match="freed"):
            table.resolve("x", 0x1010, 16)
    assert released == [0x1000]  # ... released when the operation ends


def test_close_waits_for_running_operations() -> None:
    table = PointerTable()
    table.reopen()
    table.insert(Allocation(0x1000, 64, None))
    events: list[str] = []
    lease = table.lease()
    lease.resolve("x", 0x1000, 8)
    closer = threading.Thread(target=lambda: table.close(shutdown=lambda: events.append("shutdown")))
    closer.start()
    closer.join(0.2)
    assert closer.is_alive() and events == []  # waits for the lease
    lease.__exit__(None, None, None)
    closer.join(5)
    assert not closer.is_alive() and events == ["shutdown"]
