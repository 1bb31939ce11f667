"""Adversarial use of every backend: odd shapes, odd host buffers, aliasing, threads, long loops.

Each case must give the right answer (checked against NumPy) or raise a ``BackendError``
subclass; never crash, hang, write outside its outputs or return a wrong result silently.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from computehal import (
    BackendError,
    ComputeBackend,
    InvalidArgumentError,
    NotInitializedError,
    UnsupportedError,
)

F32 = np.float32


def upload(be: ComputeBackend, array: np.ndarray[Any, Any]) -> int:
    ptr = be.alloc(max(1, array.nbytes))
    if array.nbytes:
        be.copy_htod(ptr, np.ascontiguousarray(array))
    return ptr


def download(be: ComputeBackend, ptr: int, shape: tuple[int, ...], dtype: Any = F32) -> np.ndarray[Any, Any]:
    out = np.empty(shape, dtype=dtype)
    be.copy_dtoh(out, ptr)
    return out


def attention_reference(
    q: np.ndarray[Any, Any], k: np.ndarray[Any, Any], v: np.ndarray[Any, Any], scale: float
) -> Any:
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) * scale
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s /= s.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", s, v.astype(np.float64))


def run_attention(be: ComputeBackend, sq: int, skv: int, hd: int) -> None:
    rng = np.random.default_rng(hd + skv)
    q = rng.standard_normal((1, 2, sq, hd)).astype(F32)
    k = rng.standard_normal((1, 2, skv, hd)).astype(F32)
    v = rng.standard_normal((1, 2, skv, hd)).astype(F32)
    ptrs = [upload(be, a) for a in (q, k, v)]
    po = be.alloc(q.nbytes)
    scale = 1.0 / np.sqrt(hd)
    try:
        be.attention(*ptrs, po, 1, 2, sq, skv, hd, scale, False)
        got = download(be, po, q.shape)
    except UnsupportedError:
        return
    finally:
        for p in [*ptrs, po]:
            be.free(p)
    np.testing.assert_allclose(got, attention_reference(q, k, v, scale), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hd", [1, 255, 256, 257, 512])
@pytest.mark.parametrize("sq, skv", [(1, 1), (3, 5)])
def test_attention_head_dims(backend: ComputeBackend, hd: int, sq: int, skv: int) -> None:
    run_attention(backend, sq, skv, hd)


def test_attention_huge_head_dim(backend: ComputeBackend) -> None:
    # PoCL kept 32 rows x 2 x 32768 floats of private state on one stack: a segfault.
    run_attention(backend, 3, 5, 32768)


# ---------------------------------------------------------------------- long loops (lavapipe)


@pytest.mark.parametrize("m, n, k", [(1, 1, 70000), (40, 20, 70000), (70, 65, 66000)])
def test_gemm_long_k(backend: ComputeBackend, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(k)
    a = rng.standard_normal((m, k)).astype(F32)
    b = rng.standard_normal((k, n)).astype(F32)
    c0 = rng.standard_normal((m, n)).astype(F32)
    pa, pb, pc = upload(be := backend, a.T.copy()), upload(be, b.T.copy()), upload(be, c0.T.copy())
    try:
        be.gemm("N", "N", m, n, k, 0.5, pa, m, pb, k, 2.0, pc, m, dtype="float32")
        got = download(be, pc, (n, m)).T
    finally:
        for p in (pa, pb, pc):
            be.free(p)
    want = 0.5 * a.astype(np.float64) @ b + 2.0 * c0
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())


@pytest.mark.parametrize("hd, skv", [(64, 1024), (1, 20000)])
def test_attention_long_keys(backend: ComputeBackend, hd: int, skv: int) -> None:
    run_attention(backend, 2, skv, hd)


def test_softmax_long_row(backend: ComputeBackend) -> None:
    n = 1 << 23
    x = np.random.default_rng(1).standard_normal(n).astype(F32)
    px, py = upload(backend, x), backend.alloc(x.nbytes)
    try:
        backend.softmax(px, py, [1, n], 1)
        got = download(backend, py, (n,))
    except UnsupportedError:
        return
    finally:
        backend.free(px)
        backend.free(py)
    e = np.exp(x.astype(np.float64) - x.max())
    np.testing.assert_allclose(got, e / e.sum(), rtol=1e-4, atol=1e-12)


def conv_reference(x: Any, w: Any, stride: tuple[int, int], pad: tuple[int, int]) -> Any:
    n, c, h, wd = x.shape
    k, _, fh, fw = w.shape
    xp = np.zeros((n, c, h + 2 * pad[0], wd + 2 * pad[1]))
    xp[:, :, pad[0] : pad[0] + h, pad[1] : pad[1] + wd] = x
    oh = (h + 2 * pad[0] - fh) // stride[0] + 1
    ow = (wd + 2 * pad[1] - fw) // stride[1] + 1
    out = np.zeros((n, k, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride[0] : i * stride[0] + fh, j * stride[1] : j * stride[1] + fw]
            out[:, :, i, j] = np.einsum("ncij,kcij->nk", patch, w)
    return out


def test_conv_backward_filter_large_image(backend: ComputeBackend) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 1, 300, 300)).astype(F32)
    gy = rng.standard_normal((1, 1, 300, 300)).astype(F32)
    px, pg, pf = upload(backend, x), upload(backend, gy), backend.alloc(4)
    try:
        backend.conv2d_backward_filter(px, x.shape, pg, gy.shape, pf, [1, 1, 1, 1], [1, 1], [0, 0])
        got = download(backend, pf, (1,))
    except UnsupportedError:
        return
    finally:
        for p in (px, pg, pf):
            backend.free(p)
    want = (x.astype(np.float64) * gy).sum()
    np.testing.assert_allclose(got[0], want, rtol=1e-3, atol=1e-2)


# ---------------------------------------------------------------------- conv shapes


@pytest.mark.parametrize(
    "xs, ws, stride, pad",
    [
        ((1, 2, 1, 1), (3, 2, 1, 1), (1, 1), (0, 0)),
        ((1, 1, 1, 1), (1, 1, 3, 3), (1, 1), (2, 2)),
        ((2, 1, 7, 6), (2, 1, 2, 2), (5, 4), (0, 1)),
        ((1, 2, 3, 3), (1, 2, 1, 1), (1, 1), (4, 3)),
    ],
)
def test_conv_odd_shapes(backend: ComputeBackend, xs: Any, ws: Any, stride: Any, pad: Any) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal(xs).astype(F32)
    w = rng.standard_normal(ws).astype(F32)
    want = conv_reference(x, w, stride, pad)
    px, pw, py = upload(backend, x), upload(backend, w), backend.alloc(want.size * 4)
    try:
        backend.conv2d_forward(px, xs, pw, ws, py, want.shape, stride, pad)
        np.testing.assert_allclose(download(backend, py, want.shape), want, rtol=1e-5, atol=1e-5)
    finally:
        for p in (px, pw, py):
            backend.free(p)


def test_conv_stride_padding_beyond_32_bits(backend: ComputeBackend) -> None:
    # wgpu packed these as u32 (2**32 -> 0): a silently wrong, non-zero output.
    px, pw, py = (
        upload(backend, np.ones((1, 1, 1, 1), F32)),
        upload(backend, np.ones((1, 1, 1, 1), F32)),
        backend.alloc(4),
    )
    try:
        backend.copy_htod(py, np.full(1, 7.0, F32))
        with pytest.raises(InvalidArgumentError):
            backend.conv2d_forward(
                px, [1, 1, 1, 1], pw, [1, 1, 1, 1], py, [1, 1, 1, 1], [2**40, 2**40], [2**32, 2**32]
            )
        assert download(backend, py, (1,))[0] == 7.0
    finally:
        for p in (px, pw, py):
            backend.free(p)


# ---------------------------------------------------------------------- batched GEMM


def test_batched_gemm_many_tiny_batches(backend: ComputeBackend) -> None:
    count = 70000
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(count).astype(F32), rng.standard_normal(count).astype(F32)
    pa, pb, pc = upload(backend, a), upload(backend, b), upload(backend, np.full(count, np.nan, F32))
    try:
        backend.batched_gemm("N", "N", 1, 1, 1, 1.0, pa, 1, 1, pb, 1, 1, 0.0, pc, 1, 1, count)
        np.testing.assert_allclose(download(backend, pc, (count,)), a * b, rtol=1e-6)
    finally:
        for p in (pa, pb, pc):
            backend.free(p)


def test_batched_gemm_c_overlaps_a(backend: ComputeBackend) -> None:
    # Batch i reads A at 4i and writes C at 4i + 2 of the same buffer (2x2 matrices).
    rng = np.random.default_rng(6)
    buf = rng.standard_normal(4 * 5 + 4).astype(F32)
    bmat = rng.standard_normal(4).astype(F32)
    pbuf, pb = upload(backend, buf), upload(backend, bmat)
    try:
        try:
            backend.batched_gemm("N", "N", 2, 1, 2, 1.0, pbuf, 2, 4, pb, 2, 0, 0.0, pbuf + 8, 2, 4, 5)
        except InvalidArgumentError:
            return
        got = download(backend, pbuf, buf.shape)
    finally:
        backend.free(pbuf)
        backend.free(pb)
    # A is 2x2 column-major with lda 2 starting at 4i: columns (4i, 4i+1) and (4i+2, 4i+3)
    # overlap C of the same batch, so compare against a snapshot of the inputs.
    want = buf.copy()
    for i in range(5):
        amat = buf[4 * i : 4 * i + 4].reshape(2, 2, order="F").astype(np.float64)
        want[4 * i + 2 : 4 * i + 4] = amat @ bmat[:2]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_gemm_c_overlaps_a(backend: ComputeBackend) -> None:
    rng = np.random.default_rng(7)
    m = n = k = 9
    buf = rng.standard_normal(m * k + 5).astype(F32)
    bmat = rng.standard_normal((k, n)).astype(F32)
    pbuf, pb = upload(backend, buf), upload(backend, bmat.T.copy())
    try:
        backend.gemm("N", "N", m, n, k, 1.0, pbuf, m, pb, k, 0.5, pbuf + 12, m, dtype="float32")
        got = download(backend, pbuf, buf.shape)
    finally:
        backend.free(pbuf)
        backend.free(pb)
    a = buf[: m * k].reshape(k, m).T.astype(np.float64)
    c0 = buf[3 : 3 + m * n].reshape(n, m).T.astype(np.float64)
    want = buf.astype(np.float64).copy()
    want[3 : 3 + m * n] = (a @ bmat + 0.5 * c0).T.ravel()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_conv_output_overlaps_input(backend: ComputeBackend) -> None:
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 1, 5, 5)).astype(F32)
    w = rng.standard_normal((1, 1, 3, 3)).astype(F32)
    buf = np.concatenate([x.ravel(), np.zeros(4, F32)])
    pbuf, pw = upload(backend, buf), upload(backend, w)
    try:
        backend.conv2d_forward(pbuf, x.shape, pw, w.shape, pbuf + 8, [1, 1, 3, 3], [1, 1], [0, 0])
        got = download(backend, pbuf, buf.shape)
    finally:
        backend.free(pbuf)
        backend.free(pw)
    want = buf.astype(np.float64)
    want[2 : 2 + 9] = conv_reference(x, w, (1, 1), (0, 0)).ravel()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- reduce / softmax shapes


@pytest.mark.parametrize(
    "shape, axis", [((1, 1, 3, 1, 2, 1), 2), ((2, 1, 1, 1, 1, 3), 5), ((1,), 0), ((4, 1, 5), 1), ((3, 1), 1)]
)
def test_reduce_softmax_size_one_axes(backend: ComputeBackend, shape: tuple[int, ...], axis: int) -> None:
    x = np.random.default_rng(9).standard_normal(shape).astype(F32)
    px, py = upload(backend, x), backend.alloc(x.nbytes)
    try:
        backend.reduce("max", px, py, list(shape), axis)
        red = download(backend, py, np.delete(np.array(shape), axis).tolist() or [1])
        np.testing.assert_array_equal(red.reshape(-1), x.max(axis=axis).reshape(-1))
        backend.softmax(px, py, list(shape), axis)
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        np.testing.assert_allclose(
            download(backend, py, shape), e / e.sum(axis=axis, keepdims=True), rtol=1e-6
        )
    finally:
        backend.free(px)
        backend.free(py)


def test_reduce_empty_inner_with_huge_axis(backend: ComputeBackend) -> None:
    px, py = backend.alloc(64), backend.alloc(64)
    try:
        backend.reduce("sum", px, py, [1, 2**40, 0], 1)
        backend.softmax(px, py, [2**40, 0], 0)
    finally:
        backend.free(px)
        backend.free(py)


# ---------------------------------------------------------------------- gather / scatter


INDEX_ARRAYS: dict[str, Callable[[], Any]] = {
    "uint64": lambda: np.array([2, 0, 2], dtype=np.uint64),
    "int8": lambda: np.array([2, 0, 2], dtype=np.int8),
    "strided": lambda: np.array([2, 9, 0, 9, 2, 9], dtype=np.int32)[::2],
    "list-of-numpy-ints": lambda: [np.int16(2), np.uint8(0), 2],
}


@pytest.mark.parametrize("kind", sorted(INDEX_ARRAYS))
def test_gather_scatter_index_kinds(backend: ComputeBackend, kind: str) -> None:
    rows, cols = 3, 5
    x = np.arange(rows * cols, dtype=F32).reshape(rows, cols)
    idx = INDEX_ARRAYS[kind]()
    px, py = upload(backend, x), upload(backend, np.zeros((3, cols), F32))
    try:
        backend.gather(px, idx, py, rows, cols)
        np.testing.assert_array_equal(download(backend, py, (3, cols)), x[[2, 0, 2]])
        backend.scatter(px, idx, py, rows, cols)
        want = x[[2, 0, 2]].copy()
        want[2], want[0] = x[2], x[1]
        np.testing.assert_array_equal(download(backend, py, (3, cols)), want)
    finally:
        backend.free(px)
        backend.free(py)


@pytest.mark.parametrize(
    "idx", [[2**63 - 1], np.array([2**64 - 1], dtype=np.uint64), [-1], np.array([-1]), [2**64], [True], [1.0]]
)
def test_gather_scatter_bad_indices(backend: ComputeBackend, idx: Any) -> None:
    px, py = upload(backend, np.ones(8, F32)), upload(backend, np.full(8, 3.0, F32))
    try:
        for op in (backend.gather, backend.scatter):
            with pytest.raises(InvalidArgumentError):
                op(px, idx, py, 2, 4)
        np.testing.assert_array_equal(download(backend, py, (8,)), np.full(8, 3.0, F32))
    finally:
        backend.free(px)
        backend.free(py)


def test_gather_scatter_zero_rows_or_cols(backend: ComputeBackend) -> None:
    px, py = upload(backend, np.ones(4, F32)), upload(backend, np.full(4, 3.0, F32))
    try:
        backend.gather(px, [], py, 0, 4)
        backend.scatter(px, [], py, 0, 4)
        backend.gather(px, [5, 2**40], py, 2**41, 0)
        backend.scatter(px, [5, 2**40], py, 2**41, 0)
        np.testing.assert_array_equal(download(backend, py, (4,)), np.full(4, 3.0, F32))
    finally:
        backend.free(px)
        backend.free(py)


# ---------------------------------------------------------------------- host buffers


def test_copy_host_buffer_kinds(backend: ComputeBackend) -> None:
    p = backend.alloc(64)
    try:
        data = bytes(range(64))
        backend.copy_htod(p, memoryview(data))
        assert download(backend, p, (64,), np.uint8).tobytes() == data
        structured = np.zeros(4, dtype=[("a", np.int32), ("b", np.float64)])
        structured["a"] = [1, 2, 3, 4]
        backend.copy_htod(p, structured)
        back = np.zeros(4, dtype=structured.dtype)
        backend.copy_dtoh(back, p)
        np.testing.assert_array_equal(back["a"], [1, 2, 3, 4])
        flags = np.array([True, False] * 8)
        backend.copy_htod(p + 3, flags)
        assert download(backend, p, (64,), np.uint8)[3:19].tolist() == [1, 0] * 8
        backend.copy_htod(p, b"")
        backend.copy_htod(p + 64, b"")
        backend.copy_dtoh(bytearray(), p + 64)
        with pytest.raises(InvalidArgumentError):
            backend.copy_htod(p, np.arange(32, dtype=np.int32)[::2])
        with pytest.raises(InvalidArgumentError):
            backend.copy_dtoh(np.zeros(32, np.int32)[::2], p)
        with pytest.raises(InvalidArgumentError):
            backend.copy_dtoh(b"x" * 8, p)
        with pytest.raises(InvalidArgumentError):
            backend.copy_htod(p + 1, bytes(64))
    finally:
        backend.free(p)


# ---------------------------------------------------------------------- lifecycle


def test_operations_after_close_and_free(backend_factory: Callable[[], ComputeBackend]) -> None:
    be = backend_factory()
    be.init()
    p = be.alloc(256)
    be.copy_htod(p, np.ones(64, F32))
    be.close()
    for call in (
        lambda: be.unary("relu", p, p, 64),
        lambda: be.unary("relu", p + 64, p + 64, 4),
        lambda: be.copy_dtoh(np.empty(4, F32), p),
        lambda: be.free(p),
    ):
        with pytest.raises(BackendError):
            call()
    assert not be.is_initialized()
    with pytest.raises(NotInitializedError):
        be.alloc(64)
    be.init()  # starts afresh; pointers from before the close stay invalid
    q = be.alloc(64)
    be.free(q)
    for stale in (p, q):
        with pytest.raises(InvalidArgumentError, match="freed"):
            be.unary("neg", stale + 16, stale + 16, 4)
    be.close()


def test_concurrent_calls(backend: ComputeBackend) -> None:
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            for _ in range(5):
                a = rng.standard_normal((33, 17)).astype(F32)
                b = rng.standard_normal((17, 21)).astype(F32)
                pa, pb, pc = (
                    upload(backend, a.T.copy()),
                    upload(backend, b.T.copy()),
                    backend.alloc(33 * 21 * 4),
                )
                backend.gemm("N", "N", 33, 21, 17, 1.0, pa, 33, pb, 17, 0.0, pc, 33, dtype="float32")
                backend.unary("neg", pc, pc, 33 * 21)
                got = download(backend, pc, (21, 33)).T
                for p in (pa, pb, pc):
                    backend.free(p)
                np.testing.assert_allclose(got, -(a.astype(np.float64) @ b), rtol=1e-4, atol=1e-4)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors[0]
