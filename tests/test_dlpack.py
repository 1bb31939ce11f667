"""DLPack export and import on every backend: zero-copy where memory is host memory, copies elsewhere.

Backends are sorted by their own answer, ``dlpack_device()``: host-memory backends (the
CPU backend) run the zero-copy tests; copy-only backends (OpenCL, wgpu, and ``Opaque``,
a CPU backend that answers like them) run the copy tests.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import computehal as ch
from computehal import array as ca
from computehal.dlpack import HOST_DEVICE_TYPES, DLDeviceType
from conftest import BACKEND_FACTORIES, runnable_backends, shared_backend


class Opaque(ch.ForwardingBackend):
    """A CPU backend that answers like OpenCL / wgpu: its memory is not host-addressable.

    The array layer only asks (``host_view``, ``dlpack_device``, ``borrow``), so these
    answers alone exercise the copy-only export and import paths.
    """

    def name(self) -> str:
        return "opaque"

    def host_view(self, ptr: int, nbytes: int) -> memoryview | None:
        return None

    def dlpack_device(self) -> tuple[int, int] | None:
        return None

    def borrow(self, address: int, nbytes: int, owner: object) -> int:
        raise ch.UnsupportedError("the opaque backend cannot borrow memory")


def _memory_of(name: str) -> str:
    backend = shared_backend(name)
    if isinstance(backend, str):
        return "copy"  # a required backend that cannot start: its tests fail when they ask for it
    device = backend.dlpack_device()
    if device is None:
        return "copy"
    return "host" if device[0] in HOST_DEVICE_TYPES else "device"


HOST = sorted(n for n in runnable_backends() if _memory_of(n) == "host")
COPY_ONLY = sorted(n for n in runnable_backends() if _memory_of(n) == "copy") + ["opaque"]


def _factory(name: str) -> Callable[[], ch.ComputeBackend]:
    if name == "opaque":
        return lambda: Opaque(ch.CpuBackend())
    return BACKEND_FACTORIES[name]


def _fresh(name: str) -> Iterator[Any]:
    backend = _factory(name)()
    backend.init()
    yield backend
    backend.close()


@pytest.fixture(params=HOST)
def be(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh instance of each backend whose memory is host memory."""
    yield from _fresh(request.param)


@pytest.fixture(params=COPY_ONLY)
def opaque(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh instance of each backend whose memory leaves the device only by copy."""
    yield from _fresh(request.param)


@pytest.fixture
def cpu() -> Iterator[ch.CpuBackend]:
    backend = ch.CpuBackend()
    backend.init()
    yield backend
    backend.close()


# --------------------------------------------------------------------------- export, host memory


def test_export_to_numpy_shares_memory(be: Any) -> None:
    a = ch.asarray(np.arange(12, dtype=np.float32).reshape(3, 4), be)
    assert a.__dlpack_device__() == (DLDeviceType.CPU, 0)
    view = np.from_dlpack(a)
    assert view.shape == (3, 4) and view.dtype == np.float32
    assert view.ctypes.data == a.ptr
    view[1, 2] = -5  # write through NumPy, read through the backend
    assert a.numpy()[1, 2] == -5
    ca.relu(a, out=a)  # write through the backend, read through NumPy
    assert view[1, 2] == 0
    a.copy_from(np.ones((3, 4), np.float32))
    assert view.sum() == 12


def test_export_of_strided_views(be: Any) -> None:
    host = np.arange(30, dtype=np.float64).reshape(5, 6)
    a = ch.asarray(host, be)
    keys: list[Any] = [(slice(1, 4), slice(None, None, 2)), (slice(None, None, -1), 3), (Ellipsis,)]
    for key in keys:
        v = a[key]
        exported = np.from_dlpack(v)
        assert np.array_equal(exported, host[key])
    t = np.from_dlpack(a.T)
    t[0, 1] = 100
    assert a.numpy()[1, 0] == 100
    r = np.from_dlpack(a.reshape(3, 10))
    r[2, 9] = -1
    assert a.numpy()[4, 5] == -1


def test_export_outlives_the_array(be: Any) -> None:
    a = ch.asarray(np.arange(4, dtype=np.float32), be)
    view = np.from_dlpack(a)
    a.free()
    assert be.live_allocations() == 0
    assert view.tolist() == [0, 1, 2, 3]  # the exported memory is kept alive by the view
    with pytest.raises(ch.InvalidArgumentError):
        a.__dlpack__()


def test_dlpack_arguments(be: Any) -> None:
    a = ch.asarray(np.arange(4, dtype=np.float32), be)
    versioned = a.__dlpack__(max_version=(1, 0))
    legacy = a.__dlpack__()
    assert "dltensor_versioned" in repr(versioned)
    assert "dltensor" in repr(legacy)
    assert np.from_dlpack(a, device="cpu").ctypes.data == a.ptr  # dl_device=(kDLCPU, 0)
    copied = np.from_dlpack(a, copy=True)
    copied[0] = 9
    assert a.numpy()[0] == 0
    assert np.from_dlpack(a, copy=False).ctypes.data == a.ptr
    with pytest.raises(BufferError):
        a.__dlpack__(stream=1)
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(DLDeviceType.CUDA, 0))
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device="cpu")  # type: ignore[arg-type]


def test_numpy_copy_false_is_a_view(be: Any) -> None:
    a = ch.asarray(np.zeros(3, np.float32), be)
    v = a.numpy(copy=False)
    v[1] = 4
    assert a.numpy()[1] == 4
    c = a.numpy()
    c[2] = 4
    assert a.numpy()[2] == 0
    assert np.shares_memory(np.asarray(a), v)


# --------------------------------------------------------------------------- import, host memory


def test_from_dlpack_borrows_host_memory(be: Any) -> None:
    start = be.live_allocations()
    host = np.arange(8, dtype=np.float32).reshape(2, 4)
    d = ch.from_dlpack(host, be)
    assert d.ptr == host.ctypes.data and d.shape == (2, 4) and d.dtype == np.float32
    assert be.live_allocations() == start + 1
    ca.neg(d, out=d)  # backend writes land in the NumPy array
    assert host[1, 3] == -7
    host[0, 0] = 42  # NumPy writes are seen by the backend
    assert ca.max(d).numpy() == 42
    d.free()
    assert be.live_allocations() == start
    assert host[0, 0] == 42  # the borrowed memory was not freed
    host[0, 0] = 1


def test_borrowed_range_is_unregistered_on_gc(be: Any) -> None:
    start = be.live_allocations()
    host = np.ones(16, np.float32)
    d = ch.from_dlpack(host, be)
    y = ca.exp(d)
    del d
    gc.collect()
    assert be.live_allocations() == start + 1  # only y
    np.testing.assert_allclose(y.numpy(), np.e, rtol=1e-6)


def test_borrowed_memory_stays_alive_while_borrowed(be: Any) -> None:
    d = ch.from_dlpack(np.full(1000, 3, np.float32), be)  # the NumPy array has no other owner
    gc.collect()
    assert float(ca.sum(d).numpy()) == 3000


def test_from_dlpack_copies_when_it_must(be: Any) -> None:
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    strided = host[:, ::2]
    d = ch.from_dlpack(strided, be)
    assert d.ptr != strided.ctypes.data and np.array_equal(d.numpy(), strided)
    with pytest.raises(BufferError):
        ch.from_dlpack(strided, be, copy=False)
    readonly = np.frombuffer(bytes(16), dtype=np.float32)
    r = ch.from_dlpack(readonly, be)
    assert r.ptr != readonly.ctypes.data
    with pytest.raises(BufferError):
        ch.from_dlpack(readonly, be, copy=False)
    forced = ch.from_dlpack(host, be, copy=True)
    forced.copy_from(0.0)
    assert host[2, 3] == 11
    # Buffer-protocol objects without __dlpack__ are borrowed too.
    raw = bytearray(np.arange(4, dtype=np.float32).tobytes())
    b = ch.from_dlpack(raw, be)
    assert b.shape == (16,) and b.dtype == np.uint8
    b.free()
    with pytest.raises(ch.InvalidArgumentError):
        ch.from_dlpack(object(), be)


def test_round_trip_returns_a_view_of_the_same_allocation(be: Any) -> None:
    a = ch.asarray(np.arange(6, dtype=np.float32), be)
    start = be.live_allocations()
    exported = np.from_dlpack(a)
    back = ch.from_dlpack(exported, be)
    assert back.ptr == a.ptr
    assert be.live_allocations() == start  # nothing new registered
    ca.mul(back, back, out=back)
    assert a.numpy().tolist() == [0, 1, 4, 9, 16, 25]
    inner = ch.from_dlpack(exported[2:5], be)
    assert inner.ptr == a.ptr + 8
    assert ch.from_dlpack(a, be) is a
    back.free()
    assert not a.freed


def test_from_dlpack_on_another_cpu_backend_borrows_independently(be: Any) -> None:
    a = ch.asarray(np.arange(3, dtype=np.float32), be)
    other = ch.CpuBackend()
    other.init()
    try:
        b = ch.from_dlpack(a, other)
        assert b.ptr == a.ptr and b.backend is other
        ca.relu(ca.neg(b, out=b), out=b)
        assert a.numpy().tolist() == [0, 0, 0]
        b.free()
        assert other.live_allocations() == 0
    finally:
        other.close()


# --------------------------------------------------------------------------- copy-only backends


def test_handle_backend_exports_by_copy(opaque: Any) -> None:
    a = ch.asarray(np.arange(6, dtype=np.float32).reshape(2, 3), opaque)
    assert a.__dlpack_device__() == (DLDeviceType.CPU, 0)
    host = np.from_dlpack(a)
    assert np.array_equal(host, np.arange(6).reshape(2, 3))
    host[0, 0] = 50
    assert a.numpy()[0, 0] == 0  # a copy
    assert np.array_equal(np.from_dlpack(a.T), np.arange(6).reshape(2, 3).T)
    with pytest.raises(BufferError):
        np.from_dlpack(a, copy=False)
    with pytest.raises(BufferError):
        a.numpy(copy=False)
    with pytest.raises(ValueError):
        np.asarray(a, copy=False)


def test_handle_backend_imports_by_copy(opaque: Any, cpu: ch.CpuBackend) -> None:
    host = np.arange(4, dtype=np.float32)
    d = ch.from_dlpack(host, opaque)
    assert d.backend is opaque
    ca.neg(d, out=d)
    assert host.tolist() == [0, 1, 2, 3]
    assert d.numpy().tolist() == [0, -1, -2, -3]
    with pytest.raises(BufferError):
        ch.from_dlpack(host, opaque, copy=False)
    moved = ch.from_dlpack(d, cpu)  # copy-only backend -> CPU: a host copy, then borrowed
    assert moved.numpy().tolist() == [0, -1, -2, -3]


def test_handle_backend_strided_writes_and_copies(opaque: Any) -> None:
    a = ca.zeros((3, 4), opaque)
    a[:, 1].copy_from(np.array([1, 2, 3], np.float32))
    assert a.numpy()[:, 1].tolist() == [1, 2, 3]
    assert a[1:, ::2].numpy().shape == (2, 2)
    c = a.T.copy()
    assert c.is_contiguous and np.array_equal(c.numpy(), a.numpy().T)


# --------------------------------------------------------------------------- PyTorch


def test_torch_round_trip(be: Any) -> None:
    torch = pytest.importorskip("torch")
    a = ch.asarray(np.arange(6, dtype=np.float32).reshape(2, 3), be)
    t = torch.from_dlpack(a)
    t[1, 1] = -3.0
    assert a.numpy()[1, 1] == -3
    back = ch.from_dlpack(torch.ones(4), be)
    ca.neg(back, out=back)
    assert back.numpy().tolist() == [-1, -1, -1, -1]


def test_example_numpy_network_runs(be: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import runpy
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "numpy_network.py"
    namespace: dict[str, Any] = runpy.run_path(str(path), run_name="not_main")
    namespace["main"](be)
    assert "without a copy" in capsys.readouterr().out


# --------------------------------------------------------------------------- CUDA (needs a GPU)


def test_cuda_zero_copy_round_trip() -> None:
    cupy = pytest.importorskip("cupy")
    cuda = pytest.importorskip("computehal.backends.cuda")
    try:
        backend = cuda.CudaBackend()
        backend.init()
    except ch.BackendError as error:
        pytest.skip(f"no usable CUDA device: {error}")
    try:
        a = ch.asarray(np.arange(6, dtype=np.float32).reshape(2, 3), backend)
        assert a.__dlpack_device__()[0] in (DLDeviceType.CUDA, DLDeviceType.ROCM)
        c = cupy.from_dlpack(a)
        assert int(c.data.ptr) == a.ptr
        c[1, 1] = -3.0  # write through CuPy, read through the backend
        backend.synchronize()
        assert a.numpy()[1, 1] == -3
        ca.neg(a, out=a)  # write through the backend, read through CuPy
        backend.synchronize()
        assert float(c[0, 1]) == -1
        assert a.__cuda_array_interface__["data"][0] == a.ptr
        assert int(cupy.asarray(a).data.ptr) == a.ptr
        t = a.T
        assert cupy.array_equal(cupy.from_dlpack(t), c.T)
        host = np.from_dlpack(a, device="cpu")
        assert np.array_equal(host, a.numpy())
        ones = cupy.ones(4, dtype=cupy.float32)
        b = ch.from_dlpack(ones, backend)
        assert b.ptr == int(ones.data.ptr)
        ca.neg(b, out=b)
        backend.synchronize()
        assert ones.get().tolist() == [-1, -1, -1, -1]
        b.free()
        a.free()
        assert backend.live_allocations() == 0
    finally:
        backend.close()


def test_cuda_array_interface_absent_on_cpu(be: Any) -> None:
    assert not hasattr(ch.asarray(np.zeros(2, np.float32), be), "__cuda_array_interface__")
