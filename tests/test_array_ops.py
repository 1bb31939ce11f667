"""The array functions of the extended op set, on every backend, against NumPy.

Each function is one backend call (or one per operand). A test runs the function on
each runnable backend; where the backend does not claim the op for the dtype
(``capabilities().dtypes(op)``), the function must raise ``UnsupportedError`` cleanly
(the fixture checks that nothing leaked). References are written here in NumPy,
independently of computehal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import computehal as ch
from computehal import array as ca
from conftest import claims

Array = npt.NDArray[Any]
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
TOL = {F32: {"rtol": 2e-5, "atol": 2e-6}, F64: {"rtol": 1e-12, "atol": 1e-13}}


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(2024)


def randn(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any = F32) -> Array:
    return rng.standard_normal(shape).astype(dtype)


def check(
    backend: ch.ComputeBackend,
    ops: str | tuple[str, ...],
    dtype: Any,
    compute: Callable[[], Any],
) -> Any:
    """``compute()`` where ``backend`` claims every op of ``ops`` for ``dtype``; else it must raise
    UnsupportedError, and None is returned (the caller then stops).

    A claimed op may still refuse a feature it has not implemented yet (groups, masks,
    ...; the backends' interim guard says "... is not implemented by the X backend yet"):
    that test is skipped with the backend's message, so it runs as soon as the feature lands.
    """
    names = (ops,) if isinstance(ops, str) else ops
    if all(claims(backend, op, dtype) for op in names):
        try:
            return compute()
        except ch.UnsupportedError as error:
            if str(error).endswith("backend yet"):
                pytest.skip(str(error))
            raise
    with pytest.raises(ch.UnsupportedError):
        compute()
    return None


# --------------------------------------------------------------------------- data movement


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_transpose_and_permute(backend: ch.ComputeBackend, dtype: Any) -> None:
    host = np.arange(2 * 3 * 4 * 5).astype(dtype).reshape(2, 3, 4, 5)
    x = ch.asarray(host, backend)
    bits = {np.int32: "float32"}.get(dtype, np.dtype(dtype).name)
    got = check(backend, "copy_strided", bits, lambda: ca.transpose(x))
    if got is None:
        return
    assert got.is_contiguous and got.dtype == host.dtype
    assert np.array_equal(got.numpy(), host.T)
    p = ca.permute_dims(x, (2, 0, 3, 1))
    assert np.array_equal(p.numpy(), host.transpose(2, 0, 3, 1))
    # A strided, reversed view becomes contiguous in one call.
    v = x[:, ::-1, 1:, ::2]
    assert np.array_equal(ca.ascontiguousarray(v).numpy(), host[:, ::-1, 1:, ::2])
    assert np.array_equal(v.copy().numpy(), host[:, ::-1, 1:, ::2])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_and_split(backend: ch.ComputeBackend, rng: np.random.Generator, axis: int) -> None:
    parts = [randn(rng, (3, 3, 3)), randn(rng, (3, 3, 3)), randn(rng, (3, 3, 3))]
    sizes = [1, 2, 3]
    parts = [np.take(p, range(s), axis=axis) for p, s in zip(parts, sizes, strict=True)]
    arrays = [ch.asarray(p, backend) for p in parts]
    joined = check(backend, "copy_strided", "float32", lambda: ca.concat(arrays, axis=axis))
    if joined is None:
        return
    expected = np.concatenate(parts, axis=axis)
    assert np.array_equal(joined.numpy(), expected)
    pieces = ca.split(joined, [1, 3], axis=axis)
    for piece, part in zip(pieces, parts, strict=True):
        assert piece.is_contiguous and np.array_equal(piece.numpy(), part)
    halves = ca.split(ch.asarray(np.arange(12.0, dtype=np.float32), backend), 3)
    assert [h.numpy().tolist() for h in halves] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    out = ca.empty(expected.shape, backend)
    assert ca.concat(arrays, axis=axis, out=out) is out and np.array_equal(out.numpy(), expected)
    with pytest.raises(ch.InvalidArgumentError):
        ca.concat([arrays[0], ch.asarray(np.zeros((5, 5, 5, 5), np.float32), backend)], axis=axis)
    with pytest.raises(ch.InvalidArgumentError):
        ca.split(joined, 4, axis=axis)  # 6 is not a multiple of 4


def test_expand(backend: ch.ComputeBackend) -> None:
    host = np.arange(3, dtype=np.float32).reshape(3, 1)
    x = ch.asarray(host, backend)
    got = check(backend, "copy_strided", "float32", lambda: ca.expand(x, (2, 3, 4)))
    if got is None:
        return
    assert np.array_equal(got.numpy(), np.broadcast_to(host, (2, 3, 4)))
    assert np.array_equal(ca.broadcast_to(x[0], (5,)).numpy(), np.zeros(5))
    with pytest.raises(ch.InvalidArgumentError):
        ca.expand(x, (3, 2, 2))


def test_astype(backend: ch.ComputeBackend) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    host = np.array([1.0, -2.5, 1 + 2**-9, 65520.0, 3.4e38, np.inf, -0.0, np.nan], np.float32)
    x = ch.asarray(host, backend)
    for target in (np.dtype(np.float16), bf16, F64):
        got = check(backend, "cast", target, lambda t=target: ca.astype(x, t))
        if got is None:
            continue
        assert got.dtype == target
        with np.errstate(over="ignore"):
            expected = host.astype(target)
        assert np.array_equal(got.numpy(), expected, equal_nan=True), (target, got.numpy(), expected)
        back = ca.astype(got, np.float32)
        assert np.array_equal(back.numpy(), expected.astype(np.float32), equal_nan=True)
    with pytest.raises(ch.InvalidArgumentError):
        ca.astype(ch.asarray(np.zeros(2, np.int32), backend), np.float32)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_take_and_put_with_device_indices(backend: ch.ComputeBackend, index_dtype: Any) -> None:
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    x = ch.asarray(table, backend)
    idx = ch.asarray(np.array([4, 0, 4], index_dtype), backend)
    got = check(backend, "gather", "float32", lambda: ca.take(x, idx))
    if got is None:
        return
    assert np.array_equal(got.numpy(), table[[4, 0, 4]])
    values = ch.asarray(-np.ones((2, 3), np.float32), backend)
    ca.put(x, ch.asarray(np.array([1, 3], index_dtype), backend), values)
    expected = table.copy()
    expected[[1, 3]] = -1
    assert np.array_equal(x.numpy(), expected)
    with pytest.raises(ch.InvalidArgumentError):
        ca.take(x, ch.asarray(np.array([0, 5], index_dtype), backend))
    assert np.array_equal(x.numpy(), expected)  # nothing written
    with pytest.raises(ch.InvalidArgumentError):
        ca.take(x, ch.asarray(np.array([0.0]), backend))  # not integer indices


def test_take_of_float64_rows(backend: ch.ComputeBackend) -> None:
    table = np.arange(8.0).reshape(4, 2)
    x = ch.asarray(table, backend)
    got = check(backend, "gather", "float64", lambda: ca.take(x, [3, 1]))
    if got is not None:
        assert np.array_equal(got.numpy(), table[[3, 1]])


# --------------------------------------------------------------------------- element-wise


BINARY = {
    "add": (ca.add, np.add),
    "sub": (ca.sub, np.subtract),
    "mul": (ca.mul, np.multiply),
    "div": (ca.div, np.divide),
    "pow": (ca.pow, np.power),
    "maximum": (ca.maximum, np.fmax),
    "minimum": (ca.minimum, np.fmin),
}
SHAPES = [((2, 3, 4), (3, 1)), ((4,), (2, 1, 4)), ((1, 5), (3, 1)), ((2, 3), (2, 3)), ((), (3,))]


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("dtype", [F32, F64])
def test_broadcasting_arithmetic(
    backend: ch.ComputeBackend, rng: np.random.Generator, name: str, dtype: Any
) -> None:
    fn, ref = BINARY[name]
    for sa, sb in SHAPES:
        a_host = np.abs(randn(rng, sa, dtype)) + 0.5 if name == "pow" else randn(rng, sa, dtype)
        b_host = randn(rng, sb, dtype)
        a, b = ch.asarray(a_host, backend), ch.asarray(b_host, backend)
        op = "binary" if sa == sb else "broadcast_binary"
        got = check(backend, op, dtype, lambda a=a, b=b: fn(a, b))
        if got is None:
            continue
        expected = ref(a_host.astype(np.float64), b_host.astype(np.float64))
        assert got.shape == expected.shape and got.dtype == dtype
        np.testing.assert_allclose(got.numpy(), expected, **TOL[np.dtype(dtype)])


def test_operators_and_scalars(backend: ch.ComputeBackend) -> None:
    host = np.array([[1.0, 2.0, 4.0]])
    x = ch.asarray(host, backend)  # float64, NumPy's default
    col = ch.asarray(np.array([[1.0], [10.0]]), backend)
    results = check(
        backend,
        ("broadcast_binary", "fill"),
        "float64",
        lambda: (x + col, x * 2, 1 - x, 2 / x, x**2, -x),
    )
    if results is None:
        return
    expected = (host + [[1.0], [10.0]], host * 2, 1 - host, 2 / host, host**2, -host)
    for got, want in zip(results, expected, strict=True):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-15)
    with pytest.raises(ch.InvalidArgumentError):
        ca.add(x, ch.asarray(np.ones(3, np.float32), backend))  # no type promotion
    with pytest.raises(ch.InvalidArgumentError):
        ca.add(x, ch.asarray(np.ones((2, 2)), backend))  # shapes do not broadcast


def _erf(x: Array) -> Array:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


UNARY: dict[str, tuple[Callable[..., ch.array.DeviceArray], Callable[[Array], Array]]] = {
    "gelu": (ca.gelu, lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
    "gelu_tanh": (
        lambda x: ca.gelu(x, approximate="tanh"),
        lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    ),
    "silu": (ca.silu, lambda x: x / (1 + np.exp(-x))),
    "erf": (ca.erf, _erf),
    "reciprocal": (ca.reciprocal, lambda x: 1 / x),
    "square": (ca.square, lambda x: x * x),
    "sin": (ca.sin, np.sin),
    "cos": (ca.cos, np.cos),
    "leaky_relu": (lambda x: ca.leaky_relu(x, 0.2), lambda x: np.where(x >= 0, x, 0.2 * x)),
    "clip": (lambda x: ca.clip(x, -0.5, 0.75), lambda x: np.clip(x, -0.5, 0.75)),
    "clip_lo": (lambda x: ca.clip(x, lo=0.1), lambda x: np.maximum(x, 0.1)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", [F32, F64])
def test_extension_unary(backend: ch.ComputeBackend, rng: np.random.Generator, name: str, dtype: Any) -> None:
    fn, ref = UNARY[name]
    host = randn(rng, (4, 5), dtype) * 3
    x = ch.asarray(host, backend)
    got = check(backend, "unary", dtype, lambda: fn(x))
    if got is None:
        return
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == F32 else {"rtol": 1e-12, "atol": 1e-13}
    np.testing.assert_allclose(got.numpy(), ref(host.astype(np.float64)), **tol)


def test_unary_parameters_are_checked(backend: ch.ComputeBackend) -> None:
    x = ch.asarray(np.ones(3, np.float32), backend)
    with pytest.raises(ch.InvalidArgumentError):
        ca.unary("relu", x, alpha=0.3)
    with pytest.raises(ch.InvalidArgumentError):
        ca.gelu(x, approximate="fast")


# --------------------------------------------------------------------------- softmax, float64 seed ops


@pytest.mark.parametrize("dtype", [F32, F64])
def test_softmax_and_log_softmax(backend: ch.ComputeBackend, rng: np.random.Generator, dtype: Any) -> None:
    host = randn(rng, (3, 7), dtype)
    x = ch.asarray(host, backend)
    wide = host.astype(np.float64)
    shifted = wide - wide.max(axis=1, keepdims=True)
    log_expected = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    got = check(backend, "softmax", dtype, lambda: (ca.softmax(x, 1), ca.log_softmax(x, 1)))
    if got is None:
        return
    np.testing.assert_allclose(got[0].numpy(), np.exp(log_expected), **TOL[np.dtype(dtype)])
    np.testing.assert_allclose(got[1].numpy(), log_expected, **TOL[np.dtype(dtype)])


def test_numpy_float64_stays_float64(backend: ch.ComputeBackend, rng: np.random.Generator) -> None:
    a_host, b_host = rng.standard_normal((4, 3)), rng.standard_normal((3, 2))
    a, b = ch.asarray(a_host, backend), ch.asarray(b_host, backend)
    assert a.dtype == np.float64
    got = check(backend, ("gemm", "unary", "reduce"), "float64", lambda: ca.sum(ca.relu(a @ b), 0))
    if got is None:
        return
    expected = np.maximum(a_host @ b_host, 0).sum(axis=0)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-13)
