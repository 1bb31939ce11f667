"""Lowerings of matrix products, convolution and pooling.

The interface's GEMMs are column-major: a row-major ``C = A @ B`` is the column-major
``C^T = B^T A^T``, so every product here swaps its operands and reads the row-major
buffers as they are, without copies.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._fuse import FUSED_CONV, HEADS_PROJECTION, MATMUL_ADD
from ._lowering import Lowerer, Unmappable, lowers
from ._tensors import DeviceTensor, broadcast_strides, coalesce, contiguous_strides

__all__ = ["conv_pads"]


def conv_pads(
    lw: Lowerer,
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
) -> list[int]:
    """ONNX ``pads`` (all begins, then all ends) after applying ``auto_pad``."""
    spatial = len(sizes)
    auto_pad = lw.attr("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", ""):
        pads = [int(p) for p in lw.attr("pads", [0] * (2 * spatial))]
        if len(pads) != 2 * spatial:
            raise Unmappable(f"pads {pads} do not match {spatial} spatial dimensions")
        return pads
    if auto_pad == "VALID":
        return [0] * (2 * spatial)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unmappable(f"auto_pad={auto_pad!r}")
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def _window_params(
    lw: Lowerer, x_shape: tuple[int, ...], kernel: Sequence[int]
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, ...], tuple[int, int]]:
    """(stride, dilation, padding, kernel) as 2-D tuples for a 1-D or 2-D window op."""
    spatial = len(x_shape) - 2
    if spatial not in (1, 2):
        raise Unmappable(f"{spatial}-D {lw.node.op} (the interface has 2-D windows)")
    strides = [int(s) for s in lw.attr("strides", [1] * spatial)]
    dilations = [int(d) for d in lw.attr("dilations", [1] * spatial)]
    pads = conv_pads(lw, x_shape[2:], kernel, strides, dilations)
    if spatial == 1:
        return (1, strides[0]), (1, dilations[0]), (0, pads[0], 0, pads[1]), (1, int(kernel[0]))
    top, left, bottom, right = pads
    padding = (top, left) if (top, left) == (bottom, right) else (top, left, bottom, right)
    return (strides[0], strides[1]), (dilations[0], dilations[1]), padding, (int(kernel[0]), int(kernel[1]))


def _as_4d(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape if len(shape) == 4 else (shape[0], shape[1], 1, shape[2])


def _symmetric(padding: tuple[int, ...]) -> tuple[int, ...]:
    if len(padding) == 4 and padding[0] == padding[2] and padding[1] == padding[3]:
        return padding[:2]
    return padding


@lowers("Conv", FUSED_CONV)
def conv(lw: Lowerer) -> None:
    """``Conv``, and the fused one with its epilogue (residual input 3, ``activation``)."""
    x_shape, w_shape = lw.shape(0), lw.shape(1)
    kernel = lw.attr("kernel_shape", w_shape[2:])
    stride, dilation, padding, _ = _window_params(lw, x_shape, kernel)
    x, w = lw.tensor(0), lw.tensor(1)
    y = lw.output(0)
    kwargs: dict[str, Any] = {"dtype": y.dt}
    groups = int(lw.attr("group", 1))
    if groups != 1:
        kwargs["groups"] = groups
    if dilation != (1, 1):
        kwargs["dilation"] = dilation
    if lw.has(2):
        kwargs["bias_ptr"] = lw.tensor(2)
    if lw.node.op == FUSED_CONV:
        if lw.has(3):
            kwargs["residual_ptr"] = lw.tensor(3)
        if lw.attr("activation", ""):
            kwargs["activation"] = lw.attr("activation")
    if y.size == 0:
        return
    x4, w4, y4 = _as_4d(x_shape), _as_4d(w_shape), _as_4d(y.shape)
    lw.call("conv2d_forward", x, x4, w, w4, y, y4, stride, _symmetric(padding), **kwargs)


@lowers("MaxPool", "AveragePool")
def pool(lw: Lowerer) -> None:
    is_max = lw.node.op == "MaxPool"
    if is_max and lw.wants(1):
        raise Unmappable("MaxPool's Indices output")
    x_shape = lw.shape(0)
    kernel = [int(k) for k in lw.attr("kernel_shape")]
    stride, dilation, padding, kernel2 = _window_params(lw, x_shape, kernel)
    x = lw.tensor(0)
    y = lw.output(0)
    kwargs: dict[str, Any] = {"dtype": y.dt}
    if dilation != (1, 1):
        kwargs["dilation"] = dilation
    if lw.attr("ceil_mode", 0):
        kwargs["ceil_mode"] = True
    if not is_max and lw.attr("count_include_pad", 0):
        kwargs["count_include_pad"] = True
    if y.size == 0:
        return
    op = "max" if is_max else "avg"
    lw.call(
        "pool2d", op, x, _as_4d(x_shape), y, _as_4d(y.shape), kernel2, stride, _symmetric(padding), **kwargs
    )


@lowers("GlobalAveragePool", "GlobalMaxPool")
def global_pool(lw: Lowerer) -> None:
    x_shape = lw.shape(0)
    x = lw.tensor(0)
    y = lw.output(0)
    rows, cols = x_shape[0] * x_shape[1], math.prod(x_shape[2:])
    if rows == 0:
        return
    op = "mean" if lw.node.op == "GlobalAveragePool" else "max"
    lw.call("reduce", op, x.view((rows, cols)), y.view((rows,)), (rows, cols), 1, dtype=y.dt)


@lowers("Gemm")
def gemm(lw: Lowerer) -> None:
    trans_a, trans_b = int(lw.attr("transA", 0)), int(lw.attr("transB", 0))
    alpha, beta = float(lw.attr("alpha", 1.0)), float(lw.attr("beta", 1.0))
    a_shape, b_shape = lw.shape(0), lw.shape(1)
    if len(a_shape) != 2 or len(b_shape) != 2:
        raise Unmappable("Gemm operands must be matrices")
    m, k = (a_shape[1], a_shape[0]) if trans_a else a_shape
    n = b_shape[0] if trans_b else b_shape[1]
    a, b = lw.tensor(0), lw.tensor(1)
    y = lw.output(0)
    if y.size == 0:
        return
    applied_beta = 0.0
    if lw.has(2) and beta != 0.0:
        c_const = lw.const(2)
        if c_const is not None:
            full = np.broadcast_to(c_const.astype(y.dtype), (m, n))
            c = lw.weight(np.ascontiguousarray(full), "C", key=f"{lw.node.inputs[2]}:{m}x{n}:{y.dt}")
            lw.call("copy_dtod", y, c, y.nbytes)
        else:
            c = lw.tensor(2)
            lw.copy(y, c, (m, n), broadcast_strides(c.shape, (m, n)))
        applied_beta = beta
    lw.call(
        "gemm",
        "T" if trans_b else "N",
        "T" if trans_a else "N",
        n, m, k, alpha,
        b, max(1, k if trans_b else n),
        a, max(1, m if trans_a else k),
        applied_beta, y, max(1, n),
        dtype=y.dt,
    )  # fmt: skip


@lowers("MatMul")
def matmul(lw: Lowerer) -> None:
    a_shape, b_shape = lw.shape(0), lw.shape(1)
    a, b = lw.tensor(0), lw.tensor(1)
    y = lw.output(0)
    if len(a_shape) == 1:
        a_shape = (1,) + a_shape
    if len(b_shape) == 1:
        b_shape = b_shape + (1,)
    m, k = a_shape[-2:]
    n = b_shape[-1]
    batch_a, batch_b = a_shape[:-2], b_shape[:-2]
    batch = tuple(np.broadcast_shapes(batch_a, batch_b))
    count = math.prod(batch)
    if y.size == 0:
        return
    dt = y.dt
    if math.prod(batch_b) == 1 and batch_a == batch:
        # B is one matrix: the batch folds into A's rows, one GEMM.
        lw.call(
            "gemm", "N", "N", n, count * m, k, 1.0, b, max(1, n), a, max(1, k), 0.0, y, max(1, n), dtype=dt
        )
        return
    sa = tuple(s * m * k for s in broadcast_strides(batch_a, batch)) if batch_a else (0,) * len(batch)
    sb = tuple(s * k * n for s in broadcast_strides(batch_b, batch)) if batch_b else (0,) * len(batch)
    sc = tuple(s * m * n for s in contiguous_strides(batch))
    dims, (sa, sb, sc) = coalesce(batch, sa, sb, sc)
    for outer in itertools.product(*(range(e) for e in dims[:-1])):
        oa = sum(i * s for i, s in zip(outer, sa, strict=False))
        ob = sum(i * s for i, s in zip(outer, sb, strict=False))
        oc = sum(i * s for i, s in zip(outer, sc, strict=False))
        lw.call(
            "batched_gemm", "N", "N", n, m, k, 1.0,
            b.view(b.shape, ob), max(1, n), sb[-1],
            a.view(a.shape, oa), max(1, k), sa[-1],
            0.0, y.view(y.shape, oc), max(1, n), sc[-1], dims[-1],
            dtype=dt,
        )  # fmt: skip


@lowers("BatchNormalization")
def batch_norm(lw: Lowerer) -> None:
    if lw.attr("training_mode", 0) or any(lw.wants(i) for i in range(1, len(lw.node.outputs))):
        raise Unmappable("training-mode BatchNormalization")
    if lw.opset < 9 and not lw.attr("spatial", 1):
        raise Unmappable("BatchNormalization with spatial=0")
    x_shape = lw.shape(0)
    if len(x_shape) < 2:
        raise Unmappable("BatchNormalization of a tensor with fewer than 2 dimensions")
    x = lw.tensor(0)
    y = lw.output(0)
    params = [_param(lw, i, y.dtype) for i in range(1, 5)]
    if y.size:
        lw.call("batch_norm", x, x_shape, *params, y, float(lw.attr("epsilon", 1e-5)), dtype=y.dt)


def _param(lw: Lowerer, i: int, dtype: np.dtype[Any]) -> DeviceTensor:
    value = lw.const(i)
    if value is not None and value.dtype != dtype:
        return lw.weight(value.astype(dtype), f"param{i}", key=f"{lw.node.inputs[i]}:{dtype.name}")
    tensor = lw.tensor(i)
    if tensor.dtype != dtype:
        raise Unmappable(f"parameter {lw.node.inputs[i]!r} is {tensor.dt}, the input {dtype.name}")
    return tensor


@lowers("LRN")
def lrn(lw: Lowerer) -> None:
    x_shape = lw.shape(0)
    x = lw.tensor(0)
    y = lw.output(0)
    if y.size:
        lw.call(
            "lrn", x, y, x_shape, int(lw.attr("size")),
            float(lw.attr("alpha", 1e-4)), float(lw.attr("beta", 0.75)), float(lw.attr("bias", 1.0)),
            dtype=y.dt,
        )  # fmt: skip


@lowers(MATMUL_ADD)
def matmul_add(lw: Lowerer) -> None:
    """``x @ W (+ bias) (+ residual)`` as GEMMs accumulating into the output.

    The output first holds the residual (a copy) and / or the bias broadcast over the rows
    (a broadcast copy; with a residual, a rank-1 GEMM of a column of ones and the bias; a
    copy or an addition for one row),
    then the product is accumulated into it with ``beta = 1``: no separate pass over the
    output for each ``Add``.
    """
    x_shape, (k, n) = lw.shape(0), lw.shape(1)
    x = lw.tensor(0)
    y = lw.output(0)
    rows = math.prod(x_shape[:-1])
    if y.size == 0:
        return
    dt = y.dt
    beta = 0.0
    if lw.has(3):
        lw.call("copy_dtod", y, lw.tensor(3), y.nbytes)
        beta = 1.0
    if lw.has(2):
        bias = lw.tensor(2).view((n,))
        if rows == 1 and beta == 0.0:
            lw.call("copy_dtod", y, bias, y.nbytes)
        elif rows == 1:
            lw.call("binary", "add", y, bias, y, n, dtype=dt)
        elif beta == 0.0:
            # A broadcast copy (source row stride 0) rather than a rank-1 GEMM, which
            # BLAS packs for one multiply-add per element: on the CPU, 128 x 3072 took
            # 0.29 ms as a copy against 0.48 ms as a GEMM.
            lw.call("copy_strided", y, bias, (rows, n), (0, 1), (n, 1), dtype=dt)
        else:
            ones = lw.weight(np.ones(rows, dtype=y.dtype), "ones", key=f"ones:{rows}:{dt}")
            lw.call("gemm", "N", "N", n, rows, 1, 1.0, bias, n, ones, 1, beta, y, n, dtype=dt)
        beta = 1.0
    if k == 0:
        return
    if _panel_product(lw, x, y, rows, beta):
        return
    w = lw.tensor(1)
    lw.call("gemm", "N", "N", n, rows, k, 1.0, w, max(1, n), x, max(1, k), beta, y, max(1, n), dtype=dt)


def _panel_product(lw: Lowerer, x: DeviceTensor, y: DeviceTensor, rows: int, beta: float) -> bool:
    """``y (+)= x @ W`` over ``W`` stored once as column panels, where the backend asks for them.

    The constant ``W`` [k, n] is laid out at load as ``n / width`` contiguous panels of
    ``width`` columns ([n / width, k, width]) and the product is one batched GEMM over the
    panels with ``x`` shared, each batch writing its columns of the row-major ``y``
    (``stride_c = width``, ``ldc = n``). The CPU backend runs that on a kernel reading
    the panels in place, where BLAS repacks the whole weight matrix on every call.
    """
    w = lw.const(1)
    if w is None or w.dtype != np.float32 or y.dtype != np.float32:
        return False
    k, n = w.shape
    width = lw.ctx.weight_panel(rows, k, n)
    if not width or n % width:  # (the backend chose the width; it must still divide n)
        return False
    panels = w.reshape(k, n // width, width).transpose(1, 0, 2)
    wp = lw.weight(panels, "panels", key=f"{lw.node.inputs[1]}:panels{width}")
    lw.call(
        "batched_gemm", "N", "N", width, rows, k, 1.0, wp, width, k * width,
        x, k, 0, beta, y, n, width, n // width, dtype=y.dt,
    )  # fmt: skip
    return True


@lowers(HEADS_PROJECTION)
def heads_projection(lw: Lowerer) -> None:
    """``x @ W + bias`` written head-major: [3, batch, heads, seq, size] from W's per-head blocks.

    The bias (when there is one) is broadcast into the output first and the products are
    accumulated into it (``beta = 1``). Per batch entry and Q / K / V, one batched GEMM
    over the heads: every head's GEMM reads the same rows of ``x`` (``stride_b = 0``) and
    its own contiguous weight block (one call of ``3 * heads`` GEMMs when the batch is 1).
    """
    batch, seq, depth = lw.shape(0)
    groups, _, size = lw.shape(1)
    heads = groups // 3
    x, w = lw.tensor(0), lw.tensor(1)
    y = lw.output(0)
    if y.size == 0:
        return
    dt = y.dt
    beta = 0.0
    if lw.has(2):
        strides = (heads * size, 0, size, 0, 1)
        lw.call("copy_strided", y, lw.tensor(2), y.shape, strides, contiguous_strides(y.shape), dtype=dt)
        beta = 1.0
    elif depth == 0:
        lw.call("fill", y, y.size, 0.0, dtype=dt)
    if depth == 0:
        return
    one = seq * size  # one head's output
    calls = [(0, 0, groups)] if batch == 1 else [(b, g, heads) for b in range(batch) for g in range(3)]
    for b, g, count in calls:
        lw.call(
            "batched_gemm", "N", "N", size, seq, depth, 1.0,
            w.view(w.shape, g * heads * depth * size), size, depth * size,
            x.view(x.shape, b * seq * depth), depth, 0,
            beta, y.view(y.shape, (g * batch + b) * heads * one), size, one, count,
            dtype=dt,
        )  # fmt: skip
