"""Network layers of the array layer (convolution, pooling, normalisation, attention) on every backend.

References are NumPy loops written here, independently of computehal. Where a backend
does not claim an op for the dtype, the function must raise ``UnsupportedError``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import computehal as ch
from computehal import array as ca
from test_array_ops import check, randn

Array = npt.NDArray[Any]
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(77)


def sides(padding: Any) -> tuple[int, int, int, int]:
    if isinstance(padding, int):
        return padding, padding, padding, padding
    if len(padding) == 2:
        return padding[0], padding[1], padding[0], padding[1]
    return tuple(padding)  # type: ignore[return-value]


# --------------------------------------------------------------------------- convolution


def conv_reference(
    x: Array,
    w: Array,
    b: Array | None,
    stride: tuple[int, int],
    padding: Any,
    dil: tuple[int, int],
    groups: int,
) -> Array:
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    k, cg, fh, fw = w.shape
    top, left, bottom, right = sides(padding)
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    oh = (h + top + bottom - dil[0] * (fh - 1) - 1) // stride[0] + 1
    ow = (wd + left + right - dil[1] * (fw - 1) - 1) // stride[1] + 1
    y = np.zeros((n, k, oh, ow))
    per_group = k // groups
    for kk in range(k):
        g = kk // per_group
        xs = xp[:, g * cg : (g + 1) * cg]
        for i in range(oh):
            for j in range(ow):
                r, s = i * stride[0], j * stride[1]
                patch = xs[
                    :, :, r : r + dil[0] * (fh - 1) + 1 : dil[0], s : s + dil[1] * (fw - 1) + 1 : dil[1]
                ]
                y[:, kk, i, j] = np.einsum("nchw,chw->n", patch, w[kk])
    if b is not None:
        y += b.astype(np.float64).reshape(1, k, 1, 1)
    return y


CONVS = [
    # (c, k, groups, stride, padding, dilation, bias)
    (4, 6, 2, (1, 1), 1, (1, 1), True),
    (3, 3, 3, (2, 1), (1, 0, 2, 1), (1, 1), False),  # depthwise, four-sided padding
    (2, 4, 1, (1, 2), (2, 1), (2, 2), True),  # dilated
]


@pytest.mark.parametrize("case", range(len(CONVS)))
def test_conv2d_groups_dilation_bias(backend: ch.ComputeBackend, rng: np.random.Generator, case: int) -> None:
    c, k, groups, stride, padding, dil, with_bias = CONVS[case]
    xh = randn(rng, (2, c, 7, 6))
    wh = randn(rng, (k, c // groups, 3, 2))
    bh = randn(rng, (k,)) if with_bias else None
    x, w = ch.asarray(xh, backend), ch.asarray(wh, backend)
    b = None if bh is None else ch.asarray(bh, backend)
    expected = conv_reference(xh, wh, bh, stride, padding, dil, groups)
    y = check(
        backend,
        "conv2d_forward",
        "float32",
        lambda: ca.conv2d(x, w, b, stride=stride, padding=padding, dilation=dil, groups=groups),
    )
    if y is None:
        return
    assert y.shape == expected.shape
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-4, atol=1e-5)


def test_conv2d_gradients_with_groups(backend: ch.ComputeBackend, rng: np.random.Generator) -> None:
    """The gradients are the adjoints of the forward pass: <conv(x, w), g> == <x, dX(g)> == <w, dW(g)>."""
    xh, wh = randn(rng, (1, 4, 6, 5)), randn(rng, (4, 2, 3, 3))
    x, w = ch.asarray(xh, backend), ch.asarray(wh, backend)
    kwargs: dict[str, Any] = {"stride": 1, "padding": 1, "dilation": (2, 1), "groups": 2}
    y = check(backend, "conv2d_forward", "float32", lambda: ca.conv2d(x, w, **kwargs))
    if y is None:
        return
    gh = randn(rng, y.shape)
    g = ch.asarray(gh, backend)
    dx = check(
        backend, "conv2d_backward_data", "float32", lambda: ca.conv2d_backward_data(g, w, xh.shape, **kwargs)
    )
    dw = check(
        backend,
        "conv2d_backward_filter",
        "float32",
        lambda: ca.conv2d_backward_filter(x, g, (3, 3), **kwargs),
    )
    inner = float(np.sum(conv_reference(xh, wh, None, (1, 1), 1, (2, 1), 2) * gh))
    if dx is not None:
        assert dx.shape == xh.shape
        assert float(np.sum(dx.numpy().astype(np.float64) * xh)) == pytest.approx(inner, rel=1e-4)
    if dw is not None:
        assert dw.shape == wh.shape
        assert float(np.sum(dw.numpy().astype(np.float64) * wh)) == pytest.approx(inner, rel=1e-4)


# --------------------------------------------------------------------------- pooling


def pool_reference(
    x: Array, op: str, kernel: tuple[int, int], stride: tuple[int, int], padding: Any, dil: tuple[int, int],
    ceil: bool, include_pad: bool,
) -> Array:  # fmt: skip
    n, c, h, w = x.shape
    top, left, bottom, right = sides(padding)

    def length(size: int, k: int, s: int, lo: int, hi: int, d: int) -> int:
        span = size + lo + hi - d * (k - 1) - 1
        out = (-(-span // s) if ceil else span // s) + 1
        return out - 1 if ceil and (out - 1) * s >= size + lo else out

    oh = length(h, kernel[0], stride[0], top, bottom, dil[0])
    ow = length(w, kernel[1], stride[1], left, right, dil[1])
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            rows = [i * stride[0] - top + a * dil[0] for a in range(kernel[0])]
            cols = [j * stride[1] - left + b * dil[1] for b in range(kernel[1])]
            inside = [(r, s) for r in rows for s in cols if 0 <= r < h and 0 <= s < w]
            values = np.stack([x[:, :, r, s] for r, s in inside], axis=-1).astype(np.float64)
            if op == "max":
                y[:, :, i, j] = np.fmax.reduce(values, axis=-1, initial=-np.inf)  # NaN ignored
            else:
                padded = [
                    (r, s) for r in rows for s in cols if -top <= r < h + bottom and -left <= s < w + right
                ]
                count = len(padded) if include_pad else len(inside)
                y[:, :, i, j] = values.sum(axis=-1) / count
    return y


POOLS = [
    # (kernel, stride, padding, dilation, ceil_mode, count_include_pad)
    ((2, 2), (2, 2), 0, (1, 1), False, False),
    ((3, 3), (2, 2), 1, (1, 1), True, False),
    ((3, 2), (2, 1), (1, 0, 1, 1), (1, 1), True, True),
    ((2, 2), (1, 1), 1, (2, 2), False, True),
]


@pytest.mark.parametrize(
    ("op", "case"),
    # avg_pool2d has no dilation, as in PyTorch and ONNX
    [("max", i) for i in range(len(POOLS))]
    + [("avg", i) for i in range(len(POOLS)) if POOLS[i][3] == (1, 1)],
)
def test_pooling(backend: ch.ComputeBackend, rng: np.random.Generator, op: str, case: int) -> None:
    kernel, stride, padding, dil, ceil, include = POOLS[case]
    xh = randn(rng, (2, 3, 7, 6))
    xh[0, 0, 1, 1] = np.nan  # MAX ignores NaN, AVG propagates it
    x = ch.asarray(xh, backend)
    if op == "max":
        run = lambda: ca.max_pool2d(x, kernel, stride, padding, dilation=dil, ceil_mode=ceil)  # noqa: E731
    else:
        run = lambda: ca.avg_pool2d(x, kernel, stride, padding, ceil_mode=ceil, count_include_pad=include)  # noqa: E731
    y = check(backend, "pool2d", "float32", run)
    if y is None:
        return
    expected = pool_reference(xh, op, kernel, stride, padding, dil, ceil, include)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_global_pooling(backend: ch.ComputeBackend, rng: np.random.Generator) -> None:
    xh = randn(rng, (2, 3, 5, 4))
    x = ch.asarray(xh, backend)
    y = check(backend, "pool2d", "float32", lambda: ca.avg_pool2d(x, (5, 4)))
    if y is not None:
        np.testing.assert_allclose(y.numpy()[..., 0, 0], xh.mean(axis=(2, 3)), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize("dtype", [F32, F64])
def test_layer_and_rms_norm(backend: ch.ComputeBackend, rng: np.random.Generator, dtype: Any) -> None:
    xh, sh, bh = randn(rng, (3, 4, 5), dtype), randn(rng, (4, 5), dtype), randn(rng, (4, 5), dtype)
    x, s, b = ch.asarray(xh, backend), ch.asarray(sh, backend), ch.asarray(bh, backend)
    wide = xh.astype(np.float64).reshape(3, 20)
    mean, var = wide.mean(axis=1, keepdims=True), wide.var(axis=1, keepdims=True)
    layer = ((wide - mean) / np.sqrt(var + 1e-5)).reshape(3, 4, 5) * sh + bh
    rms = (wide / np.sqrt((wide**2).mean(axis=1, keepdims=True) + 1e-6)).reshape(3, 4, 5) * sh
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == F32 else {"rtol": 1e-12, "atol": 1e-12}
    got = check(backend, "layer_norm", dtype, lambda: ca.layer_norm(x, s, b, eps=1e-5, axes=2))
    if got is not None:
        np.testing.assert_allclose(got.numpy(), layer, **tol)
        plain = ca.layer_norm(x, eps=1e-5)  # last axis, no scale or bias
        last = xh.astype(np.float64)
        centred = last - last.mean(axis=-1, keepdims=True)
        np.testing.assert_allclose(
            plain.numpy(), centred / np.sqrt(last.var(axis=-1, keepdims=True) + 1e-5), **tol
        )
    got = check(backend, "rms_norm", dtype, lambda: ca.rms_norm(x, s, axes=2))
    if got is not None:
        np.testing.assert_allclose(got.numpy(), rms, **tol)
    with pytest.raises(ch.InvalidArgumentError):
        ca.layer_norm(x, s, axes=1)  # scale has 20 elements, the last axis 5


def test_batch_norm_and_lrn(backend: ch.ComputeBackend, rng: np.random.Generator) -> None:
    xh = randn(rng, (2, 5, 3, 2))
    params = [randn(rng, (5,)) for _ in range(4)]
    params[1] = np.abs(params[1]) + 0.1  # a variance
    mean, var, scale, bias = (ch.asarray(p, backend) for p in params)
    x = ch.asarray(xh, backend)
    m, v, s, b = (p.astype(np.float64).reshape(1, 5, 1, 1) for p in params)
    got = check(backend, "batch_norm", "float32", lambda: ca.batch_norm(x, mean, var, scale, bias, eps=1e-3))
    if got is not None:
        expected = (xh - m) / np.sqrt(v + 1e-3) * s + b
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-5)
    got = check(backend, "lrn", "float32", lambda: ca.lrn(x, 3, alpha=0.2, beta=0.75, bias=2.0))
    if got is not None:
        sq = xh.astype(np.float64) ** 2
        total = np.zeros_like(sq)
        for c in range(5):
            total[:, c] = sq[:, max(0, c - 1) : min(5, c + 2)].sum(axis=1)
        expected = xh / (2.0 + 0.2 / 3 * total) ** 0.75
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- attention


def attention_reference(
    q: Array, k: Array, v: Array, scale: float, causal: bool, mask: Array | None
) -> Array:
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if mask is not None:
        scores = scores + mask.astype(np.float64)
    sq, skv = q.shape[2], k.shape[2]
    if causal:
        visible = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)
        scores = np.where(visible, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(top), top, 0))
    total = weights.sum(axis=-1, keepdims=True)
    out: Array = np.einsum(
        "bhij,bhjd->bhid", np.divide(weights, total, where=total > 0, out=np.zeros_like(weights)), v
    )
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_attention_with_mask_and_grouped_heads(
    backend: ch.ComputeBackend, rng: np.random.Generator, causal: bool
) -> None:
    qh = randn(rng, (2, 4, 3, 8))
    kh, vh = randn(rng, (2, 2, 5, 8)), randn(rng, (2, 2, 5, 8))  # 2 key/value heads, seq_kv != seq_q
    mh = randn(rng, (1, 1, 3, 5))
    mh[0, 0, 1, 2] = -np.inf
    q, k, v, m = (ch.asarray(t, backend) for t in (qh, kh, vh, mh))
    got = check(backend, "attention", "float32", lambda: ca.attention(q, k, v, causal=causal, mask=m))
    if got is None:
        return
    expected = attention_reference(qh, kh, vh, 1 / np.sqrt(8), causal, mh)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ch.InvalidArgumentError):
        ca.attention(
            q, ch.asarray(randn(rng, (2, 3, 5, 8)), backend), ch.asarray(randn(rng, (2, 3, 5, 8)), backend)
        )
