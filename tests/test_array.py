"""DeviceArray ownership, views and the seed's array-level functions against NumPy, on every backend."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import computehal as ch
from computehal import array as ca
from computehal.array import DeviceArray
from test_array_ops import check


@pytest.fixture
def be(backend_factory: Any) -> Iterator[Any]:
    """A fresh instance of each runnable backend (tests here count and close its allocations)."""
    backend = backend_factory()
    backend.init()
    yield backend
    backend.close()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def f32(rng: np.random.Generator, *shape: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    return rng.standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- creation


def test_attributes_of_new_arrays(be: ch.CpuBackend) -> None:
    a = ca.empty((2, 3, 4), be)
    assert a.shape == (2, 3, 4)
    assert a.dtype == np.float32
    assert a.strides == (48, 16, 4)
    assert a.nbytes == 96 and a.size == 24 and a.ndim == 3 and a.itemsize == 4
    assert a.backend is be
    assert str(a.device) == f"{be.name()}:0"
    assert a.ptr % 64 == 0
    assert a.base is None and a.is_contiguous and not a.freed
    z = ca.zeros((5,), be, dtype="float64")
    assert z.dtype == np.float64 and np.array_equal(z.numpy(), np.zeros(5))
    host = np.arange(12, dtype=np.int32).reshape(3, 4)
    d = ch.asarray(host, be)
    assert d.dtype == np.int32 and np.array_equal(d.numpy(), host)
    assert np.array_equal(ch.to_device(host, be, dtype=np.float32).numpy(), host.astype(np.float32))
    assert "DeviceArray(shape=(3, 4)" in repr(d)


def test_asarray_copies_host_data(be: ch.CpuBackend) -> None:
    host = np.ones(4, np.float32)
    d = ch.asarray(host, be)
    host[0] = 7
    assert d.numpy()[0] == 1
    assert ch.asarray(d, be) is d
    assert ch.asarray(d, be, copy=True) is not d
    with pytest.raises(BufferError):
        ch.asarray(host, be, copy=False)


def test_zero_size_arrays_have_valid_pointers(be: ch.CpuBackend) -> None:
    a = ca.empty((0, 3), be)
    assert a.nbytes == 0 and a.ptr != 0
    assert a.numpy().shape == (0, 3)
    b = ca.take(ca.zeros((4, 3), be), [])
    assert b.shape == (0, 3)


def test_constructor_and_bad_arguments(be: ch.CpuBackend) -> None:
    with pytest.raises(TypeError):
        DeviceArray()
    with pytest.raises(ch.InvalidArgumentError):
        ca.empty((2, -1), be)
    with pytest.raises(ch.InvalidArgumentError):
        ca.empty((2,), be, dtype=object)
    with pytest.raises(ch.InvalidArgumentError):
        ca.empty((2,), "cpu")  # type: ignore[arg-type]


def test_operations_before_init_raise() -> None:
    with pytest.raises(ch.NotInitializedError):
        ca.empty((2,), ch.CpuBackend())


# --------------------------------------------------------------------------- ownership


def test_free_is_exactly_once(be: ch.CpuBackend) -> None:
    start = be.live_allocations()
    a = ca.empty((16,), be)
    ptr = a.ptr
    assert be.live_allocations() == start + 1
    a.free()
    assert be.live_allocations() == start and a.freed
    a.free()  # idempotent: nothing is freed twice
    with pytest.raises(ch.InvalidArgumentError):
        be.free(ptr)  # the pointer really is gone
    with pytest.raises(ch.InvalidArgumentError):
        _ = a.ptr


def test_context_manager_frees(be: ch.CpuBackend) -> None:
    start = be.live_allocations()
    with ca.zeros((4, 4), be) as a:
        assert be.live_allocations() == start + 1
        assert a.numpy().sum() == 0
    assert be.live_allocations() == start


def test_garbage_collection_frees(be: ch.CpuBackend) -> None:
    start = be.live_allocations()
    arrays = [ca.empty((8,), be) for _ in range(10)]
    views = [a[2:4] for a in arrays]
    assert be.live_allocations() == start + 10
    del arrays
    gc.collect()
    assert be.live_allocations() == start + 10  # the views keep their allocations
    del views
    gc.collect()
    assert be.live_allocations() == start


def test_results_of_operations_are_collected(be: ch.CpuBackend, rng: np.random.Generator) -> None:
    start = be.live_allocations()
    x = ch.asarray(f32(rng, 8, 8), be)
    for _ in range(5):
        ca.softmax(ca.relu(ca.matmul(x, x)))
    del x
    gc.collect()
    assert be.live_allocations() == start


def test_failed_operation_frees_its_fresh_output(be: ch.CpuBackend) -> None:
    start = be.live_allocations()
    x = ca.zeros((2, 3), be)
    with pytest.raises(ch.InvalidArgumentError):
        ca.take(x, [0, 5])  # index out of range: raised by the backend after allocation
    assert be.live_allocations() == start + 1
    x.free()


def test_gc_after_backend_close_is_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    reports: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", reports.append)
    backend = ch.CpuBackend()
    backend.init()
    a = ca.empty((4,), backend)
    b = ca.empty((4,), backend)
    backend.close()
    assert backend.live_allocations() == 0
    a.free()  # already released with the backend: nothing to do, no error
    del a, b
    gc.collect()
    assert reports == []


def test_stale_array_never_frees_a_newer_allocation(be: ch.CpuBackend) -> None:
    old = ca.empty((4,), be)
    be.close()  # releases old's memory behind its back
    be.init()  # and starts afresh
    newer = [ca.empty((4,), be) for _ in range(4)]
    del old
    gc.collect()
    assert be.live_allocations() == 4
    assert all(not n.freed for n in newer)


def test_raw_free_then_array_free(be: ch.CpuBackend) -> None:
    a = ca.empty((4,), be)
    be.free(a.ptr)
    a.free()  # the allocation is already gone; the array does not free anything else
    assert be.live_allocations() == 0


def test_from_pointer(be: ch.CpuBackend) -> None:
    ptr = be.alloc(64)
    be.copy_htod(ptr, np.arange(16, dtype=np.float32))
    borrowed = DeviceArray.from_pointer(be, ptr, (4, 4))
    assert np.array_equal(borrowed.numpy(), np.arange(16, dtype=np.float32).reshape(4, 4))
    borrowed.free()
    del borrowed
    gc.collect()
    assert be.live_allocations() == 1  # not owned: the caller still holds it
    owned = DeviceArray.from_pointer(be, ptr, (16,), own=True)
    del owned
    gc.collect()
    assert be.live_allocations() == 0


# --------------------------------------------------------------------------- views


@pytest.mark.parametrize(
    "key",
    [
        1,
        -1,
        slice(1, 3),
        slice(None, None, 2),
        slice(None, None, -1),
        (slice(1, 3), 2),
        (Ellipsis, 1),
        (1, Ellipsis, slice(0, 4, 3)),
        (None, slice(1, 2)),
        (slice(3, 1),),
        (2, 3, 1),
    ],
)
def test_basic_indexing_matches_numpy(be: ch.CpuBackend, key: Any) -> None:
    host = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    a = ch.asarray(host, be)
    view = a[key]
    # Appending "..." makes NumPy return a view even when every axis is indexed.
    expected = host[(*key, Ellipsis)] if isinstance(key, tuple) and Ellipsis not in key else host[key]
    assert view.shape == expected.shape
    assert view.strides == expected.strides or expected.size == 0
    assert np.array_equal(view.numpy(), expected)
    assert view.base is a
    if expected.size:
        assert view.ptr == a.ptr + (expected.__array_interface__["data"][0] - host.ctypes.data)


def test_bad_indices(be: ch.CpuBackend) -> None:
    a = ca.zeros((3, 4), be)
    with pytest.raises(IndexError):
        a[3]
    with pytest.raises(IndexError):
        a[0, 0, 0]
    with pytest.raises(IndexError):
        a[[0, 1]]
    with pytest.raises(IndexError):
        a[..., ...]


def test_views_share_memory_and_keep_parent_alive(be: ch.CpuBackend) -> None:
    start = be.live_allocations()
    a = ch.asarray(np.arange(10, dtype=np.float32), be)
    v = a[2:5]
    del a
    gc.collect()
    assert be.live_allocations() == start + 1
    v.copy_from(np.array([7, 8, 9], np.float32))
    assert np.array_equal(v.base.numpy()[:6], [0, 1, 7, 8, 9, 5])  # type: ignore[union-attr]
    del v
    gc.collect()
    assert be.live_allocations() == start


def test_freeing_the_owner_invalidates_views(be: ch.CpuBackend) -> None:
    a = ca.zeros((4, 4), be)
    v = a[1]
    a.free()
    assert v.freed
    with pytest.raises(ch.InvalidArgumentError):
        v.numpy()
    with pytest.raises(ch.InvalidArgumentError):
        ca.relu(v)


def test_freeing_a_view_releases_only_the_view(be: ch.CpuBackend) -> None:
    start = be.live_allocations()
    a = ca.zeros((4, 4), be)
    with a[1:3] as v:
        assert v.shape == (2, 4)
    assert v.freed and not a.freed
    assert be.live_allocations() == start + 1
    assert a.numpy().shape == (4, 4)


def test_reshape_and_transpose(be: ch.CpuBackend) -> None:
    host = np.arange(24, dtype=np.float32)
    a = ch.asarray(host, be)
    r = a.reshape(2, 3, 4)
    assert r.ptr == a.ptr and r.strides == (48, 16, 4)
    assert np.array_equal(r.numpy(), host.reshape(2, 3, 4))
    assert a.reshape((4, -1)).shape == (4, 6)
    assert np.array_equal(r.T.numpy(), host.reshape(2, 3, 4).T)
    assert np.array_equal(r.transpose(1, 0, 2).numpy(), host.reshape(2, 3, 4).transpose(1, 0, 2))
    assert np.array_equal(r[1].ravel().numpy(), host[12:])
    with pytest.raises(ch.InvalidArgumentError):
        r.T.reshape(-1)  # not contiguous
    with pytest.raises(ch.InvalidArgumentError):
        a.reshape(5, 5)
    with pytest.raises(ch.InvalidArgumentError):
        a.reshape(-1, -1)
    assert np.array_equal(r.T.copy().numpy(), host.reshape(2, 3, 4).T)


def test_copy_from_strided_target(be: ch.CpuBackend) -> None:
    a = ca.zeros((4, 4), be)
    a[:, 1].copy_from(np.arange(4, dtype=np.float32))
    a[::2, ::2].copy_from(5.0)
    expected = np.zeros((4, 4), np.float32)
    expected[:, 1] = np.arange(4)
    expected[::2, ::2] = 5
    assert np.array_equal(a.numpy(), expected)
    with pytest.raises(ch.InvalidArgumentError):
        a.copy_from(np.zeros(3))


def test_to_device_and_numpy_protocol(be: ch.CpuBackend) -> None:
    a = ch.asarray(np.arange(3, dtype=np.float32), be)
    assert a.to_device(be) is a
    other = ch.CpuBackend()
    other.init()
    try:
        b = a.to_device(other)
        assert b.backend is other and np.array_equal(b.numpy(), [0, 1, 2])
        with pytest.raises(ch.InvalidArgumentError):
            ca.add(a, b)
        b.free()
    finally:
        other.close()
    assert np.array_equal(np.asarray(a), [0, 1, 2])
    assert np.asarray(a, dtype=np.float64).dtype == np.float64
    assert np.array_equal(a.to_host(), [0, 1, 2])


# --------------------------------------------------------------------------- matmul


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_2d(be: ch.CpuBackend, rng: np.random.Generator, dtype: Any) -> None:
    a = rng.standard_normal((5, 7)).astype(dtype)
    b = rng.standard_normal((7, 3)).astype(dtype)
    expected = np.einsum("ik,kj->ij", a.astype(np.float64), b.astype(np.float64))
    got = check(be, "gemm", dtype, lambda: ca.matmul(ch.asarray(a, be), ch.asarray(b, be)))
    if got is None:
        return
    assert got.shape == (5, 3) and got.dtype == dtype
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got.numpy(), expected, rtol=tol, atol=tol)


def test_matmul_transposed_and_sliced_operands(be: ch.CpuBackend, rng: np.random.Generator) -> None:
    a = f32(rng, 7, 5)  # used as a.T: 5 x 7, column-major in memory
    b = f32(rng, 4, 10)  # used as b[:, 2:9].T ... first a column slice (ld 10)
    c = f32(rng, 7, 9)
    da, db, dc = ch.asarray(a, be), ch.asarray(b, be), ch.asarray(c, be)
    ref = np.einsum("ki,kj->ij", a, c)
    np.testing.assert_allclose(ca.matmul(da.T, dc).numpy(), ref, rtol=1e-5, atol=1e-5)
    sliced = db[:, 2:9]  # 4 x 7, row-major with ld = 10
    ref2 = np.einsum("ik,kj->ij", b[:, 2:9], c)
    np.testing.assert_allclose(ca.matmul(sliced, dc).numpy(), ref2, rtol=1e-5, atol=1e-5)
    ref3 = np.einsum("ik,jk->ij", c.T, b[:, 2:9])
    np.testing.assert_allclose(ca.matmul(dc.T, sliced.T).numpy(), ref3, rtol=1e-5, atol=1e-5)


def test_matmul_into_out_with_alpha_beta(be: ch.CpuBackend, rng: np.random.Generator) -> None:
    a, b, c = f32(rng, 3, 4), f32(rng, 4, 5), f32(rng, 3, 5)
    out = ch.asarray(c, be)
    result = ca.matmul(ch.asarray(a, be), ch.asarray(b, be), out=out, alpha=2.0, beta=0.5)
    assert result is out
    np.testing.assert_allclose(out.numpy(), 2 * np.einsum("ik,kj->ij", a, b) + 0.5 * c, rtol=1e-5, atol=1e-5)
    # A column-major output (a transposed view) is written in place too.
    ct = ca.zeros((5, 3), be)
    ca.matmul(ch.asarray(a, be), ch.asarray(b, be), out=ct.T)
    np.testing.assert_allclose(ct.numpy().T, np.einsum("ik,kj->ij", a, b), rtol=1e-5, atol=1e-5)
    with pytest.raises(ch.InvalidArgumentError):
        ca.matmul(ch.asarray(a, be), ch.asarray(b, be), beta=1.0)


def test_matmul_batched(be: ch.CpuBackend, rng: np.random.Generator) -> None:
    a, b = f32(rng, 4, 3, 5), f32(rng, 4, 5, 2)
    w = f32(rng, 5, 6)
    da, db, dw = ch.asarray(a, be), ch.asarray(b, be), ch.asarray(w, be)
    np.testing.assert_allclose(
        ca.matmul(da, db).numpy(), np.einsum("bik,bkj->bij", a, b), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        ca.matmul(da, dw).numpy(), np.einsum("bik,kj->bij", a, w), rtol=1e-5, atol=1e-5
    )
    x = f32(rng, 2, 5)
    np.testing.assert_allclose(
        ca.matmul(ch.asarray(x, be), db).numpy(), np.einsum("ik,bkj->bij", x, b), rtol=1e-5, atol=1e-5
    )
    # Batched float64, via the operator.
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    got = check(be, "batched_gemm", "float64", lambda: ch.asarray(a64, be) @ ch.asarray(b64, be))
    if got is not None:
        np.testing.assert_allclose(got.numpy(), np.einsum("bik,bkj->bij", a64, b64), rtol=1e-12)


def test_matmul_errors(be: ch.CpuBackend) -> None:
    a32, b32 = ca.zeros((2, 3), be), ca.zeros((4, 2), be)
    with pytest.raises(ch.InvalidArgumentError):
        ca.matmul(a32, b32)  # k mismatch
    with pytest.raises(ch.InvalidArgumentError):
        ca.matmul(a32, ca.zeros((3, 2), be, dtype="float64"))
    with pytest.raises(ch.InvalidArgumentError):
        ca.matmul(ca.zeros((2, 3), be, dtype="int32"), ca.zeros((3, 2), be, dtype="int32"))
    with pytest.raises(ch.InvalidArgumentError):
        ca.matmul(ca.zeros((3,), be), ca.zeros((3, 2), be))
    with pytest.raises(ch.InvalidArgumentError):
        ca.matmul(ca.zeros((2, 2, 3), be), ca.zeros((3, 3, 2), be))
    with pytest.raises(ch.InvalidArgumentError):
        ca.matmul(a32, ca.zeros((3, 2), be), out=ca.zeros((2, 3), be))
    with pytest.raises(ch.InvalidArgumentError):
        ca.matmul(ca.zeros((4, 6), be)[:, ::2], ca.zeros((3, 2), be))  # no unit stride
    with pytest.raises(ch.InvalidArgumentError):
        ca.matmul(a32, np.zeros((3, 2), np.float32))  # type: ignore[arg-type]
    square = ca.zeros((3, 3), be)
    with pytest.raises(ch.InvalidArgumentError):
        ca.matmul(square, ca.zeros((3, 3), be), out=square)  # BLAS output may not alias an input
    with pytest.raises(ch.InvalidArgumentError):
        square.reshape("a", 3)


# --------------------------------------------------------------------------- convolution


def conv_reference(
    x: np.ndarray[Any, Any], w: np.ndarray[Any, Any], stride: int, pad: int
) -> np.ndarray[Any, Any]:
    n, c, h, wd = x.shape
    k, _, fh, fw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - fh) // stride + 1, (wd + 2 * pad - fw) // stride + 1
    y = np.zeros((n, k, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride : i * stride + fh, j * stride : j * stride + fw]
            y[:, :, i, j] = np.einsum("nchw,kchw->nk", patch, w.astype(np.float64))
    return y


@pytest.mark.parametrize(("stride", "pad"), [(1, 0), (2, 1), (1, 2)])
def test_conv2d_and_gradients(be: ch.CpuBackend, rng: np.random.Generator, stride: int, pad: int) -> None:
    x, w = f32(rng, 2, 3, 7, 6), f32(rng, 4, 3, 3, 2)
    dx, dw = ch.asarray(x, be), ch.asarray(w, be)
    y = ca.conv2d(dx, dw, stride=stride, padding=pad)
    ref = conv_reference(x, w, stride, pad)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)
    # Gradients through the adjoint identities <conv(x, w), g> = <x, dL/dx> = <w, dL/dw>.
    g = f32(rng, *ref.shape)
    dg = ch.asarray(g, be)
    gx = ca.conv2d_backward_data(dg, dw, x.shape, stride=stride, padding=pad)
    gw = ca.conv2d_backward_filter(dx, dg, (3, 2), stride=(stride, stride), padding=(pad, pad))
    assert gx.shape == x.shape and gw.shape == w.shape
    for i in range(x.size):  # exact gradient: one basis input at a time
        if i % 7:
            continue
        e = np.zeros(x.size)
        e[i] = 1
        expected = np.sum(conv_reference(e.reshape(x.shape), w, stride, pad) * g)
        assert gx.numpy().reshape(-1)[i] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    for i in range(w.size):
        e = np.zeros(w.size)
        e[i] = 1
        expected = np.sum(conv_reference(x, e.reshape(w.shape), stride, pad) * g)
        assert gw.numpy().reshape(-1)[i] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    out = ca.zeros(ref.shape, be)
    assert ca.conv2d(dx, dw, stride=stride, padding=pad, out=out) is out


def test_conv2d_errors(be: ch.CpuBackend) -> None:
    x, w = ca.zeros((1, 3, 4, 4), be), ca.zeros((2, 2, 3, 3), be)
    with pytest.raises(ch.InvalidArgumentError):
        ca.conv2d(x, w)  # channel mismatch
    with pytest.raises(ch.InvalidArgumentError):
        ca.conv2d(x, ca.zeros((2, 3, 5, 5), be))  # filter larger than input
    with pytest.raises(ch.InvalidArgumentError):
        ca.conv2d(x, ca.zeros((2, 3, 3, 3), be), stride=0)
    with pytest.raises(ch.InvalidArgumentError):
        ca.conv2d(x, ca.zeros((2, 3, 3, 3), be), out=ca.zeros((1, 2, 3, 3), be))
    with pytest.raises(ch.InvalidArgumentError):
        ca.conv2d_backward_data(ca.zeros((1, 2, 2, 2), be), ca.zeros((2, 3, 3, 3), be), (1, 3, 5, 5))


# --------------------------------------------------------------------------- attention


def attention_reference(q: Any, k: Any, v: Any, scale: float, causal: bool) -> np.ndarray[Any, Any]:
    scores = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) * scale
    sq, skv = q.shape[2], k.shape[2]
    if causal:
        hidden = np.arange(skv)[None, :] > np.arange(sq)[:, None] + (skv - sq)
        scores = np.where(hidden, -np.inf, scores)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out: np.ndarray[Any, Any] = np.einsum("bhij,bhjd->bhid", p, v.astype(np.float64))
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_attention(be: ch.CpuBackend, rng: np.random.Generator, causal: bool) -> None:
    q, k, v = f32(rng, 2, 3, 5, 8), f32(rng, 2, 3, 7, 8), f32(rng, 2, 3, 7, 8)
    got = ca.attention(ch.asarray(q, be), ch.asarray(k, be), ch.asarray(v, be), causal=causal)
    ref = attention_reference(q, k, v, 1 / np.sqrt(8), causal)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=1e-5)
    got2 = ca.attention(ch.asarray(q, be), ch.asarray(k, be), ch.asarray(v, be), scale=0.3)
    np.testing.assert_allclose(got2.numpy(), attention_reference(q, k, v, 0.3, False), rtol=1e-4, atol=1e-5)
    with pytest.raises(ch.InvalidArgumentError):
        ca.attention(ch.asarray(q, be), ch.asarray(k, be), ch.asarray(v[:, :, :6], be))
    with pytest.raises(ch.InvalidArgumentError):
        ca.attention(ch.asarray(q[0], be), ch.asarray(k[0], be), ch.asarray(v[0], be))


# --------------------------------------------------------------------------- reductions


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax(be: ch.CpuBackend, rng: np.random.Generator, axis: int) -> None:
    x = f32(rng, 3, 4, 5)
    got = ca.softmax(ch.asarray(x, be), axis=axis)
    e = np.exp(x.astype(np.float64) - x.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(got.numpy(), e / e.sum(axis=axis, keepdims=True), rtol=1e-5, atol=1e-6)
    d = ch.asarray(x, be)
    assert ca.softmax(d, axis=axis, out=d) is d  # in place
    np.testing.assert_allclose(d.numpy(), got.numpy(), rtol=1e-6)
    with pytest.raises(ch.InvalidArgumentError):
        ca.softmax(d, axis=3)


@pytest.mark.parametrize(
    ("fn", "ref"),
    [(ca.sum, np.sum), (ca.max, np.max), (ca.min, np.min), (ca.mean, np.mean)],
)
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(
    be: ch.CpuBackend, rng: np.random.Generator, fn: Any, ref: Any, axis: Any, keepdims: bool
) -> None:
    x = f32(rng, 3, 4, 5)
    got = fn(ch.asarray(x, be), axis, keepdims=keepdims)
    expected = ref(x.astype(np.float64), axis=axis, keepdims=keepdims)
    assert got.shape == np.shape(expected)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_reduce_generic_and_errors(be: ch.CpuBackend) -> None:
    x = ch.asarray(np.arange(6, dtype=np.float32).reshape(2, 3), be)
    assert np.array_equal(ca.reduce("sum", x, 1).numpy(), [3, 12])
    out = ca.empty((3,), be)
    assert ca.reduce(ch.ReduceOp.MAX, x, 0, out=out) is out
    assert np.array_equal(out.numpy(), [3, 4, 5])
    with pytest.raises(ch.InvalidArgumentError):
        ca.sum(x, 0, out=ca.empty((2,), be))
    with pytest.raises(ch.InvalidArgumentError):
        ca.sum(ch.asarray(np.ones(3, np.int32), be))  # not a floating dtype
    with pytest.raises(ch.InvalidArgumentError):
        ca.sum(x, 0, out=ca.empty((3,), be, dtype="float64"))  # out of another dtype
    with pytest.raises(ch.InvalidArgumentError):
        ca.sum(x.T, 0)  # not contiguous
    with pytest.raises(ch.InvalidArgumentError):
        ca.sum(x, axis=True)
    assert ca.sum(ca.zeros((0, 3), be), 0).numpy().tolist() == [0, 0, 0]


# --------------------------------------------------------------------------- element-wise

UNARY_CASES = [
    (ca.relu, lambda x: np.maximum(x, 0)),
    (ca.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    (ca.tanh, np.tanh),
    (ca.exp, np.exp),
    (ca.log, lambda x: np.log(np.abs(x))),
    (ca.sqrt, lambda x: np.sqrt(np.abs(x))),
    (ca.abs, np.abs),
    (ca.neg, np.negative),
]


@pytest.mark.parametrize(("fn", "ref"), UNARY_CASES)
def test_unary(be: ch.CpuBackend, rng: np.random.Generator, fn: Any, ref: Any) -> None:
    x = f32(rng, 4, 5)
    if fn in (ca.log, ca.sqrt):
        x = np.abs(x)
    got = fn(ch.asarray(x, be))
    np.testing.assert_allclose(got.numpy(), ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6)
    d = ch.asarray(x, be)
    assert fn(d, out=d) is d
    np.testing.assert_allclose(d.numpy(), got.numpy())


BINARY_CASES = [
    (ca.add, np.add),
    (ca.sub, np.subtract),
    (ca.mul, np.multiply),
    (ca.div, np.divide),
    (ca.maximum, np.fmax),
    (ca.minimum, np.fmin),
]


@pytest.mark.parametrize(("fn", "ref"), BINARY_CASES)
def test_binary(be: ch.CpuBackend, rng: np.random.Generator, fn: Any, ref: Any) -> None:
    a, b = f32(rng, 3, 4), f32(rng, 3, 4)
    got = fn(ch.asarray(a, be), ch.asarray(b, be))
    np.testing.assert_allclose(got.numpy(), ref(a.astype(np.float64), b), rtol=1e-6, atol=1e-6)
    da = ch.asarray(a, be)
    assert fn(da, ch.asarray(b, be), out=da) is da


def test_generic_elementwise_and_operators(be: ch.CpuBackend) -> None:
    a = ch.asarray(np.array([1, -2, 3], np.float32), be)
    b = ch.asarray(np.array([4, 5, -6], np.float32), be)
    assert ca.unary("relu", a).numpy().tolist() == [1, 0, 3]
    assert ca.binary(ch.BinaryOp.MUL, a, b).numpy().tolist() == [4, -10, -18]
    assert (a + b).numpy().tolist() == [5, 3, -3]
    assert (a - b).numpy().tolist() == [-3, -7, 9]
    assert (a * b).numpy().tolist() == [4, -10, -18]
    assert (a / b).numpy().tolist() == pytest.approx([0.25, -0.4, -0.5])
    assert (-a).numpy().tolist() == [-1, 2, -3]
    with pytest.raises(ch.InvalidArgumentError):
        ca.add(a, ca.zeros((4,), be))
    with pytest.raises(ch.InvalidArgumentError):
        ca.relu(a, out=ca.zeros((3,), be, dtype="float64"))
    with pytest.raises(ch.InvalidArgumentError):
        ca.relu(ca.zeros((4, 4), be)[:, 1])  # strided


# --------------------------------------------------------------------------- gather / scatter


def test_take_and_put(be: ch.CpuBackend, rng: np.random.Generator) -> None:
    table = f32(rng, 6, 2, 3)
    d = ch.asarray(table, be)
    idx = np.array([5, 0, 0, 3])
    got = ca.take(d, idx)
    assert got.shape == (4, 2, 3)
    assert np.array_equal(got.numpy(), table[idx])
    values = f32(rng, 3, 2, 3)
    target = table.copy()
    ca.put(d, [1, 4, 1], ch.asarray(values, be))
    target[4] = values[1]
    target[1] = values[2]  # the last duplicate wins
    assert np.array_equal(d.numpy(), target)
    with pytest.raises(ch.InvalidArgumentError):
        ca.put(d, [6], ch.asarray(values[:1], be))
    assert np.array_equal(d.numpy(), target)  # nothing written
    with pytest.raises(ch.InvalidArgumentError):
        ca.put(d, [0, 1], ch.asarray(values, be))
    with pytest.raises(ch.InvalidArgumentError):
        ca.take(d, np.zeros((2, 2), np.int64))
    with pytest.raises(ch.InvalidArgumentError):
        ca.take(d, 3)


# --------------------------------------------------------------------------- every backend


def test_array_layer_on_every_backend(backend: ch.ComputeBackend) -> None:
    """The same array code on each backend of tests/conftest.py (no leak: the fixture checks)."""
    rng = np.random.default_rng(7)
    x, w = f32(rng, 6, 5), f32(rng, 5, 4)
    dx, dw = ch.asarray(x, backend), ch.asarray(w, backend)
    logits = ca.matmul(dx, dw)
    probs = ca.softmax(ca.relu(logits, out=logits), axis=1, out=logits)
    h = np.maximum(np.einsum("ik,kj->ij", x.astype(np.float64), w), 0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    np.testing.assert_allclose(probs.numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ca.sum(probs, 1).numpy(), np.ones(6), rtol=1e-5)
    assert np.array_equal(ca.take(dx, [3, 0]).numpy(), x[[3, 0]])
    assert np.array_equal(dx[2:4].numpy(), x[2:4])
    assert np.array_equal(dx.T.copy().numpy(), x.T)
    # DLPack into NumPy: zero-copy on the CPU backend, a host copy elsewhere.
    host = np.from_dlpack(probs, device="cpu")
    np.testing.assert_allclose(host, probs.numpy())
    if backend.name() == "cpu":
        assert np.from_dlpack(probs, copy=False).ctypes.data == probs.ptr
    else:
        with pytest.raises(BufferError):
            np.from_dlpack(probs, copy=False)
    back = ch.from_dlpack(host, backend)
    assert np.array_equal(back.numpy(), host)
    with ca.zeros((3,), backend) as z:
        assert z.numpy().tolist() == [0, 0, 0]


# --------------------------------------------------------------------------- regressions (hostile use)


def test_array_learns_that_the_pointer_api_freed_its_allocation(backend: ch.ComputeBackend) -> None:
    x = ch.asarray(np.arange(4, dtype=np.float32), backend)
    view = x[1:]
    backend.free(x.ptr)
    assert x.freed and view.freed
    newer = [ch.asarray(np.full(4, 7, np.float32), backend) for _ in range(8)]  # may reuse the address
    for stale in (x, view):
        with pytest.raises(ch.InvalidArgumentError, match="freed"):
            stale.numpy()
        with pytest.raises(ch.InvalidArgumentError, match="freed"):
            stale.copy_from(np.zeros(stale.shape, np.float32))
        with pytest.raises(ch.InvalidArgumentError):
            ca.relu(stale)
    x.free()  # nothing to free any more, and no newer allocation is touched
    for n in newer:
        assert not n.freed and n.numpy().tolist() == [7, 7, 7, 7]
        n.free()


def test_array_learns_that_close_released_its_allocation(backend_factory: Any) -> None:
    be = backend_factory()
    be.init()
    try:
        x = ch.asarray(np.arange(4, dtype=np.float32), be)
        be.close()
        assert x.freed
        be.init()
        newer = ch.asarray(np.full(4, 3, np.float32), be)
        with pytest.raises(ch.InvalidArgumentError, match="freed"):
            x.copy_from(np.zeros(4, np.float32))
        x.free()
        del x
        gc.collect()
        assert not newer.freed and newer.numpy().tolist() == [3, 3, 3, 3]
    finally:
        be.close()


def test_bfloat16_arrays_travel_on_every_backend(backend: ch.ComputeBackend) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    assert ca.zeros(3, backend, dtype=bf16).numpy().tolist() == [0, 0, 0]
    host = np.array([1.5, -2.0, 3.0e38, np.inf], dtype=bf16)
    a = ch.asarray(host, backend)
    assert a.dtype == bf16 and a.numpy().tobytes() == host.tobytes()
    b = ch.from_dlpack(host, backend)
    assert b.dtype == bf16 and b.numpy().tobytes() == host.tobytes()
    c = ch.asarray(np.array([0.5, 1.25], np.float32), backend, dtype=bf16)
    assert c.numpy().astype(np.float32).tolist() == [0.5, 1.25]
    a[1:3].copy_from(np.array([4, 5], dtype=bf16))
    assert a.numpy().astype(np.float32)[1:3].tolist() == [4, 5]
