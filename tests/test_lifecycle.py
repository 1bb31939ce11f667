"""Lifecycle: init, NotInitializedError, free rules, context managers, NullBackend,
ForwardingBackend delegation, and concurrent use from several threads."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from computehal import (
    Capabilities,
    ComputeBackend,
    CpuBackend,
    DeviceInfo,
    ForwardingBackend,
    InvalidArgumentError,
    NotInitializedError,
    NullBackend,
    TileShape,
    UnsupportedError,
)
from computehal.backend import EXTENSION_OPS
from conftest import live_count

P = 0x1000  # any pointer: before init nothing is looked up

#: Every operation that must raise NotInitializedError before init(), with plausible arguments.
OPERATIONS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "synchronize": ((), {}),
    "alloc": ((64,), {}),
    "free": ((P,), {}),
    "freeze": ((P,), {}),
    "copy_htod": ((P, b"\x00" * 8), {}),
    "copy_dtoh": ((bytearray(8), P), {}),
    "gemm": (("N", "N", 2, 2, 2, 1.0, P, 2, P, 2, 0.0, P, 2), {"dtype": "float32"}),
    "batched_gemm": (("N", "N", 2, 2, 2, 1.0, P, 2, 4, P, 2, 4, 0.0, P, 2, 4, 2), {}),
    "gemm_mixed_precision": (("bf16", "N", "N", 2, 2, 2, 1.0, P, 2, P, 2, 0.0, P, 2), {}),
    "conv2d_forward": ((P, [1, 1, 3, 3], P, [1, 1, 2, 2], P, [1, 1, 2, 2], [1, 1], [0, 0]), {}),
    "conv2d_backward_data": ((P, [1, 1, 2, 2], P, [1, 1, 2, 2], P, [1, 1, 3, 3], [1, 1], [0, 0]), {}),
    "conv2d_backward_filter": ((P, [1, 1, 3, 3], P, [1, 1, 2, 2], P, [1, 1, 2, 2], [1, 1], [0, 0]), {}),
    "attention": ((P, P, P, P, 1, 1, 2, 2, 4, 0.5, False), {}),
    "reduce": (("sum", P, P, [2, 3], 1), {}),
    "softmax": ((P, P, [2, 3], 1), {}),
    "unary": (("relu", P, P, 4), {}),
    "binary": (("add", P, P, P, 4), {}),
    "gather": ((P, [0, 1], P, 2, 3), {}),
    "scatter": ((P, [0, 1], P, 2, 3), {}),
    "recommended_tile_for": ((64, 64, 64), {}),
    # computehal extensions
    "copy_dtod": ((P, P, 8), {}),
    "fill": ((P, 4, 1.0), {}),
    "copy_strided": ((P, P, [2, 2], [2, 1], [1, 2]), {}),
    "cast": ((P, P, 4), {"out_dtype": "float64"}),
    "broadcast_binary": (("add", P, [2, 1], P, [3], P, [2, 3]), {}),
    "pool2d": (("max", P, [1, 1, 4, 4], P, [1, 1, 2, 2], [2, 2], [2, 2], [0, 0]), {}),
    "batch_norm": ((P, [1, 2, 3], P, P, P, P, P, 1e-5), {}),
    "layer_norm": ((P, P, 2, 3, 1e-5), {}),
    "rms_norm": ((P, P, 2, 3, 1e-5), {}),
    "lrn": ((P, P, [1, 3, 2], 3, 1e-4, 0.75, 1.0), {}),
    "allocation_of": ((P,), {}),
    "borrow": ((P, 64, None), {}),
}
#: Extension methods that answer before init (they only describe the backend).
DESCRIPTIVE = {"host_view", "dlpack_device", "gemm_weight_panel"}


def test_operation_table_covers_the_interface() -> None:
    allowed = {"name", "init", "is_initialized", "capabilities", "available_devices"}
    public = {
        name
        for name, value in vars(ComputeBackend).items()
        if callable(value) and not name.startswith("_") and name != "close"
    }
    assert public - allowed - DESCRIPTIVE == set(OPERATIONS)
    assert len(public) == 24 + len(EXTENSION_OPS) + len({"allocation_of", "borrow", "freeze"} | DESCRIPTIVE)


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_not_initialized_before_init(backend_factory: Callable[[], ComputeBackend], operation: str) -> None:
    be = backend_factory()
    assert not be.is_initialized()
    args, kwargs = OPERATIONS[operation]
    with pytest.raises(NotInitializedError) as info:
        getattr(be, operation)(*args, **kwargs)
    assert str(info.value) == "backend not initialized"
    assert isinstance(info.value, RuntimeError)


def test_introspection_allowed_before_init(backend_factory: Callable[[], ComputeBackend]) -> None:
    be = backend_factory()
    assert isinstance(be.name(), str) and be.name()
    assert be.is_initialized() is False
    assert isinstance(be.capabilities(), Capabilities)
    devices = be.available_devices()
    assert isinstance(devices, list) and all(isinstance(d, DeviceInfo) for d in devices)
    assert not be.is_initialized()
    repr(be)


def test_init_is_idempotent(backend_factory: Callable[[], ComputeBackend]) -> None:
    be = backend_factory()
    be.init()
    try:
        ptr = be.alloc(16)
        be.copy_htod(ptr, np.arange(4, dtype=np.float32))
        be.init()
        assert be.is_initialized()
        out = np.zeros(4, dtype=np.float32)
        be.copy_dtoh(out, ptr)
        assert out.tolist() == [0, 1, 2, 3]
        be.free(ptr)
    finally:
        be.close()


def test_double_free_and_alloc_zero(backend: ComputeBackend) -> None:
    ptr = backend.alloc(64)
    backend.free(ptr)
    with pytest.raises(InvalidArgumentError, match="already freed"):
        backend.free(ptr)
    with pytest.raises(InvalidArgumentError):
        backend.alloc(0)
    with pytest.raises(InvalidArgumentError):
        backend.alloc(-8)


def test_free_interior_pointer_refused_and_base_still_frees(backend: ComputeBackend) -> None:
    ptr = backend.alloc(128)
    with pytest.raises(InvalidArgumentError, match="only a base pointer"):
        backend.free(ptr + 64)
    backend.free(ptr)


def test_context_manager_inits_and_frees(backend_factory: Callable[[], ComputeBackend]) -> None:
    with backend_factory() as be:
        assert be.is_initialized()
        ptrs = [be.alloc(100) for _ in range(3)]
        if live_count(be) is not None:
            assert live_count(be) == 3
    if live_count(be) is not None:
        assert live_count(be) == 0
    # The pointers are gone: using one raises a BackendError (never touches freed memory).
    with pytest.raises((InvalidArgumentError, NotInitializedError)):
        be.copy_htod(ptrs[0], b"\x01")


def test_context_manager_frees_on_exception(backend_factory: Callable[[], ComputeBackend]) -> None:
    with pytest.raises(KeyError), backend_factory() as be:
        be.alloc(100)
        raise KeyError("boom")
    if live_count(be) is not None:
        assert live_count(be) == 0


def test_close_twice_is_harmless(backend_factory: Callable[[], ComputeBackend]) -> None:
    be = backend_factory()
    be.init()
    be.alloc(10)
    be.close()
    be.close()


# --------------------------------------------------------------------------- NullBackend

NULL_REFUSED = sorted(set(OPERATIONS) - {"synchronize", "recommended_tile_for"})


@pytest.mark.parametrize("operation", NULL_REFUSED)
def test_null_backend_refuses_by_name(operation: str) -> None:
    be = NullBackend()
    args, kwargs = OPERATIONS[operation]
    with pytest.raises(UnsupportedError) as info:
        getattr(be, operation)(*args, **kwargs)
    assert operation in str(info.value)
    assert str(info.value).startswith("unsupported operation: ")


@pytest.mark.parametrize("operation", NULL_REFUSED)
def test_null_backend_refuses_any_argument_values(operation: str) -> None:
    args, kwargs = OPERATIONS[operation]
    garbage = [None, "garbage", -1, float("nan"), object()]
    with pytest.raises(UnsupportedError, match=operation):
        getattr(NullBackend(), operation)(*(garbage[i % len(garbage)] for i in range(len(args))), **kwargs)


def test_null_backend_lifecycle() -> None:
    be = NullBackend()
    assert be.name() == "null"
    assert be.is_initialized()
    be.init()
    be.init()
    assert be.synchronize() is None
    assert be.available_devices() == []
    assert be.capabilities() == Capabilities.cpu()
    assert isinstance(be.recommended_tile_for(64, 64, 64), TileShape)
    with NullBackend() as inside:
        assert inside.is_initialized()


# --------------------------------------------------------------------------- ForwardingBackend


class _Recorder(ComputeBackend):
    """A fake inner backend that records every call and returns a marker."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.closed = 0

    def _record(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((name, args, kwargs))
        return f"result of {name}"

    def name(self) -> str:
        return "recorder"

    def init(self) -> None:
        self._record("init")

    def is_initialized(self) -> bool:
        self._record("is_initialized")
        return True

    def close(self) -> None:
        self.closed += 1

    def capabilities(self) -> Capabilities:
        self._record("capabilities")
        return Capabilities(tensor_cores=True)

    def available_devices(self) -> list[DeviceInfo]:
        self._record("available_devices")
        return [DeviceInfo(0, "fake")]

    def recommended_tile_for(self, m: int, n: int, k: int) -> TileShape:
        self._record("recommended_tile_for", m, n, k)
        return TileShape(1, 2, 3)

    def live_allocations(self) -> int:
        return 42

    def __getattribute__(self, attribute: str) -> Any:
        if attribute in OPERATIONS and attribute != "recommended_tile_for":
            record = object.__getattribute__(self, "_record")
            return lambda *args, **kwargs: record(attribute, *args, **kwargs)
        return object.__getattribute__(self, attribute)

    # Abstract methods (never reached: __getattribute__ records them).
    def synchronize(self) -> None: ...
    def alloc(self, bytes: int) -> int: ...  # type: ignore[empty-body]
    def free(self, ptr: int) -> None: ...
    def copy_htod(self, dst: int, src: Any) -> None: ...
    def copy_dtoh(self, dst: Any, src: int) -> None: ...
    def gemm(self, *args: Any, **kwargs: Any) -> None: ...  # type: ignore[override]
    def conv2d_forward(self, *args: Any, **kwargs: Any) -> None: ...  # type: ignore[override]
    def attention(self, *args: Any, **kwargs: Any) -> None: ...  # type: ignore[override]
    def reduce(self, *args: Any, **kwargs: Any) -> None: ...  # type: ignore[override]
    def unary(self, *args: Any, **kwargs: Any) -> None: ...  # type: ignore[override]
    def binary(self, *args: Any, **kwargs: Any) -> None: ...  # type: ignore[override]


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_forwarding_backend_delegates(operation: str) -> None:
    inner = _Recorder()
    outer = ForwardingBackend(inner)
    args, kwargs = OPERATIONS[operation]
    extra = {"dtype": "float64"} if operation in ("gemm", "batched_gemm") else {}
    result = getattr(outer, operation)(*args, **{**kwargs, **extra})
    contract = inspect.signature(getattr(ComputeBackend, operation))

    def bound(a: tuple[Any, ...], k: dict[str, Any]) -> dict[str, Any]:
        b = contract.bind(None, *a, **k)
        b.apply_defaults()
        return dict(b.arguments)

    assert len(inner.calls) == 1 and inner.calls[0][0] == operation
    assert bound(inner.calls[0][1], inner.calls[0][2]) == bound(args, {**kwargs, **extra})
    if operation in ("alloc", "recommended_tile_for"):
        assert result == inner_result(operation)


def inner_result(operation: str) -> Any:
    return TileShape(1, 2, 3) if operation == "recommended_tile_for" else f"result of {operation}"


def test_forwarding_backend_delegates_lifecycle_and_introspection() -> None:
    inner = _Recorder()
    outer = ForwardingBackend(inner)
    assert outer.name() == "recorder"
    outer.init()
    assert outer.is_initialized() is True
    assert outer.capabilities() == Capabilities(tensor_cores=True)
    assert outer.available_devices() == [DeviceInfo(0, "fake")]
    assert [c[0] for c in inner.calls] == ["init", "is_initialized", "capabilities", "available_devices"]
    outer.close()
    assert inner.closed == 1
    assert outer.live_allocations() == 42  # extensions stay reachable
    with ForwardingBackend(_Recorder()) as fwd:
        assert fwd.is_initialized()
    with pytest.raises(InvalidArgumentError):
        ForwardingBackend("cpu")  # type: ignore[arg-type]


class _Tracer(ForwardingBackend):
    """The intended use: observe some methods, forward everything."""

    def __init__(self, inner: ComputeBackend) -> None:
        super().__init__(inner)
        self.seen: list[str] = []

    def gemm(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self.seen.append("gemm")
        super().gemm(*args, **kwargs)


def test_tracing_subclass_over_cpu() -> None:
    with _Tracer(CpuBackend()) as be:
        a = np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3))
        b = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))
        pa, pb, pc = be.alloc(a.nbytes), be.alloc(b.nbytes), be.alloc(64)
        be.copy_htod(pa, a.T.copy())  # column-major bytes
        be.copy_htod(pb, b.T.copy())
        be.gemm("N", "N", 2, 4, 3, 1.0, pa, 2, pb, 3, 0.0, pc, 2)
        out = np.zeros(8)
        be.copy_dtoh(out, pc)
        assert out.reshape(4, 2).T.tolist() == (a @ b).tolist()
        assert be.seen == ["gemm"]
        assert be.live_allocations() == 3
    assert be.live_allocations() == 0


# --------------------------------------------------------------------------- threads


def test_concurrent_gemm_and_elementwise(backend: ComputeBackend) -> None:
    errors: list[BaseException] = []
    start = live_count(backend)

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(15):
                m, n, k = (int(v) for v in rng.integers(1, 40, size=3))
                a = rng.standard_normal((m, k)).astype(np.float32)
                b = rng.standard_normal((k, n)).astype(np.float32)
                pa, pb, pc = backend.alloc(a.nbytes), backend.alloc(b.nbytes), backend.alloc(m * n * 4)
                try:
                    backend.copy_htod(pa, np.asfortranarray(a).T.copy())
                    backend.copy_htod(pb, np.asfortranarray(b).T.copy())
                    backend.gemm("N", "N", m, n, k, 1.0, pa, m, pb, k, 0.0, pc, m, dtype="float32")
                    backend.unary("neg", pc, pc, m * n)
                    out = np.empty(m * n, dtype=np.float32)
                    backend.copy_dtoh(out, pc)
                    got = out.reshape(n, m).T
                    want = -(a.astype(np.float64) @ b.astype(np.float64))
                    tol = 4 * (k + 2) * 1.2e-7 * (np.abs(a) @ np.abs(b)) + 1e-30
                    assert np.all(np.abs(got - want) <= tol), "wrong gemm result under concurrency"
                finally:
                    for p in (pa, pb, pc):
                        backend.free(p)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert live_count(backend) == start


def test_concurrent_alloc_free(backend: ComputeBackend) -> None:
    errors: list[BaseException] = []
    seen: list[list[int]] = [[] for _ in range(4)]
    start = live_count(backend)
    barrier = threading.Barrier(4)

    def worker(index: int) -> None:
        try:
            barrier.wait()
            mine = []
            for i in range(100):
                ptr = backend.alloc(64 + i)
                backend.copy_htod(ptr, bytes([index]) * (64 + i))
                mine.append(ptr)
            seen[index] = list(mine)
            barrier.wait()  # every allocation of every thread is live here
            for ptr in mine:
                out = bytearray(64)
                backend.copy_dtoh(out, ptr)
                assert out == bytes([index]) * 64, "another thread wrote into this allocation"
                backend.free(ptr)
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    everything = [p for ptrs in seen for p in ptrs]
    assert len(everything) == len(set(everything)) == 400
    assert live_count(backend) == start


def test_free_is_atomic_across_threads(backend: ComputeBackend) -> None:
    """Many threads free the same pointer: exactly one succeeds."""
    ptr = backend.alloc(64)
    outcomes: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def worker() -> None:
        barrier.wait()
        try:
            backend.free(ptr)
            result = "ok"
        except InvalidArgumentError:
            result = "refused"
        except BaseException as error:  # noqa: BLE001
            result = repr(error)
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok"] + ["refused"] * 5


def test_gemm_weight_panel_answers_before_init(backend_factory: Callable[[], ComputeBackend]) -> None:
    """A layout hint describes the backend: it answers (validated) without a device context."""
    be = backend_factory()
    assert not be.is_initialized()
    width = be.gemm_weight_panel(128, 768, 3072)
    assert type(width) is int and width >= 0 and (width == 0 or 3072 % width == 0)
    with pytest.raises(InvalidArgumentError):
        be.gemm_weight_panel(-1, 768, 3072)
    assert not be.is_initialized()
