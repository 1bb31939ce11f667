"""Lowering of ONNX ``Attention`` (opset 23 and later) onto the interface's ``attention``.

3-D inputs ([batch, seq, heads * head_size]) are transposed to [batch, heads, seq,
head_size] with ``copy_strided`` and back; a key/value cache is concatenated on the device
into ``present_key`` / ``present_value``; grouped-query heads map to ``kv_heads``. The
additive mask the interface takes is assembled from what the node gives: a float mask on
the device is used as it is; boolean masks, the causal rule when it is not the
interface's bottom-right one, sliding windows and per-batch key lengths are integer
facts, turned into an additive float mask on the host (a border upload) and, when a
device mask is given too, added to it on the device.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._fuse import PACKED_ATTENTION
from ._ir import is_float
from ._lowering import Lowerer, Unmappable, lowers
from ._tensors import DeviceTensor, contiguous_strides
from .ops_elementwise import emit_binary


def _heads_first(lw: Lowerer, x: DeviceTensor, heads: int, label: str) -> DeviceTensor:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]: a copy (a view for one position or head)."""
    b, s, hidden = x.shape
    size = hidden // heads
    if s == 1 or heads == 1:
        return x.view((b, heads, s, size))  # the same bytes in either order
    out = lw.scratch((b, heads, s, size), x.dtype, label)
    src = contiguous_strides((b, s, heads, size))
    lw.copy(out, x, (b, heads, s, size), (src[0], src[2], src[1], src[3]))
    return out


def _concat_seq(lw: Lowerer, past: DeviceTensor, new: DeviceTensor, out: DeviceTensor) -> None:
    """``out`` = ``past`` and ``new`` joined along axis 2 of [batch, heads, seq, size]."""
    b, h, p, d = past.shape
    s = new.shape[2]
    total = p + s
    if p:
        lw.copy(out, past, (b * h, p * d), (p * d, 1), (total * d, 1))
    if s:
        lw.copy(out.view(out.shape, p * d), new, (b * h, s * d), (s * d, 1), (total * d, 1))


def host_bias(
    attn: np.ndarray | None,
    nonpad: np.ndarray | None,
    sq: int,
    skv: int,
    past: int,
    causal: bool,
    window: tuple[int, int],
    dtype: np.dtype[Any],
) -> np.ndarray:
    """The additive mask ONNX's Attention means, computed from host facts (NumPy)."""
    bias = np.zeros((sq, skv), dtype=dtype)
    if attn is not None:
        a = np.asarray(attn)
        if a.dtype == np.bool_:
            a = np.where(a, 0.0, -np.inf)
        a = a.astype(dtype)
        if a.shape[-1] < skv:
            pad = [(0, 0)] * (a.ndim - 1) + [(0, skv - a.shape[-1])]
            a = np.pad(a, pad, constant_values=-np.inf)
        bias = bias + a
    i = np.arange(sq).reshape(sq, 1)
    j = np.arange(skv).reshape(1, skv)
    offset: Any = past
    if nonpad is not None:
        offset = np.asarray(nonpad, dtype=np.int64).reshape(-1, 1, 1, 1) - sq
    allowed = np.ones((1, 1), dtype=np.bool_)
    if causal:
        allowed = allowed & (j <= i + offset)
    left, right = window
    if left >= 0:
        allowed = allowed & ((i + offset) - j <= left)
    if right >= 0:
        allowed = allowed & (j - (i + offset) <= right)
    if nonpad is not None:
        allowed = allowed & (j < np.asarray(nonpad, dtype=np.int64).reshape(-1, 1, 1, 1))
    if allowed.shape != (1, 1) or not bool(allowed.all()):
        bias = bias + np.where(allowed, 0.0, -np.inf).astype(dtype)
    return np.ascontiguousarray(bias.astype(dtype))


def _mask(
    lw: Lowerer, dtype: np.dtype[Any], sq: int, skv: int, past: int, native_causal: bool
) -> DeviceTensor | None:
    """The additive mask the interface gets (None when nothing is masked beyond ``causal``)."""
    causal = bool(lw.attr("is_causal", 0)) and not native_causal
    window = (int(lw.attr("left_window_size", -1)), int(lw.attr("right_window_size", -1)))
    has_nonpad = lw.has(6)
    device_mask = lw.has(3) and lw.const(3) is None and is_float(lw.dtype(3))
    host_inputs = [i for i in (3, 6) if lw.has(i) and not (i == 3 and device_mask)]
    needs_host = bool(host_inputs) or causal or window != (-1, -1)
    host_part: DeviceTensor | None = None
    if needs_host:

        def build(*values: np.ndarray) -> np.ndarray:
            named = dict(zip(host_inputs, values, strict=True))
            return host_bias(named.get(3), named.get(6), sq, skv, past, causal, window, dtype)

        value = lw.host_arg(build, *host_inputs, label="attention mask") if host_inputs else build()
        if isinstance(value, np.ndarray):
            host_part = lw.weight(value, "mask")
        else:
            probe_shape = _bias_shape(lw, sq, skv, has_nonpad, device_mask)
            host_part = lw.scratch(probe_shape, dtype, "mask")
            lw.upload(host_part, value)
    if not device_mask:
        return host_part
    attn = _padded_mask(lw, lw.tensor(3), skv)
    if attn.dtype != dtype:
        raise Unmappable("an attention mask of another dtype than the queries")
    if host_part is None:
        return attn
    shape = tuple(np.broadcast_shapes(attn.shape, host_part.shape))
    combined = lw.scratch(shape, dtype, "mask_sum")
    emit_binary(lw, "add", attn, host_part, combined)
    return combined


def _bias_shape(lw: Lowerer, sq: int, skv: int, has_nonpad: bool, device_mask: bool) -> tuple[int, ...]:
    """The shape :func:`host_bias` returns for this node's host inputs."""
    shapes: list[tuple[int, ...]] = [(sq, skv)]
    if lw.has(3) and not device_mask:
        shapes.append(lw.shape(3)[:-1] + (skv,))
    if has_nonpad:
        shapes.append((lw.shape(6)[0], 1, sq, skv))
    return tuple(np.broadcast_shapes(*shapes))


def _widen(lw: Lowerer, t: DeviceTensor, width: int, label: str) -> DeviceTensor:
    """``t`` [..., d] zero-padded to [..., width] (zeros change no dot product)."""
    d = t.shape[-1]
    if d == width:
        return t
    rows = t.size // d
    out = lw.scratch(t.shape[:-1] + (width,), t.dtype, label)
    lw.call("fill", out, out.size, 0.0, dtype=out.dt)
    lw.copy(out, t, (rows, d), (d, 1), (width, 1))
    return out


def _padded_mask(lw: Lowerer, mask: DeviceTensor, skv: int) -> DeviceTensor:
    """A device mask shorter than the keys, extended with -inf (the missing keys are masked)."""
    m = mask.shape[-1]
    if m == skv:
        return mask
    rows = mask.size // m
    out = lw.scratch(mask.shape[:-1] + (skv,), mask.dtype, "mask_padded")
    lw.call("fill", out, out.size, float("-inf"), dtype=out.dt)
    lw.copy(out, mask, (rows, m), (m, 1), (skv, 1))
    return out


@lowers("Attention", PACKED_ATTENTION)
def attention(lw: Lowerer) -> None:
    if float(lw.attr("softcap", 0.0)) != 0.0:
        raise Unmappable("Attention softcap")
    if lw.wants(3):
        raise Unmappable("Attention's qk_matmul_output")
    if lw.has(4) != lw.has(5):
        raise Unmappable("past_key without past_value")
    q_shape = lw.shape(0)
    if lw.node.op == PACKED_ATTENTION:
        # [3, batch, heads, seq, size], written head-major by the projection: views.
        packed = lw.tensor(0)
        _, b, h, s, size = q_shape
        q, k, v = (packed.view((b, h, s, size), i * b * h * s * size) for i in range(3))
        q_shape = (b, s, h * size)
    elif len(q_shape) == 3:
        heads, kv_heads = int(lw.attr("q_num_heads")), int(lw.attr("kv_num_heads"))
        q = _heads_first(lw, lw.tensor(0), heads, "q")
        k = _heads_first(lw, lw.tensor(1), kv_heads, "k")
        v = _heads_first(lw, lw.tensor(2), kv_heads, "v")
    elif len(q_shape) == 4:
        q, k, v = lw.tensor(0), lw.tensor(1), lw.tensor(2)
    else:
        raise Unmappable(f"Attention on rank-{len(q_shape)} inputs")
    batch, heads, sq, size = q.shape
    kv_heads, v_size = k.shape[1], v.shape[3]
    if heads % kv_heads:
        raise Unmappable(f"{heads} query heads do not group over {kv_heads} key/value heads")
    past = lw.shape(4)[2] if lw.has(4) else 0
    keys, values = k, v
    if lw.has(4):
        k_shape = (batch, kv_heads, past + k.shape[2], size)
        v_shape = (batch, kv_heads, past + k.shape[2], v_size)
        keys = lw.output(1, k_shape) if lw.wants(1) else lw.scratch(k_shape, q.dtype, "present_key")
        values = lw.output(2, v_shape) if lw.wants(2) else lw.scratch(v_shape, q.dtype, "present_value")
        _concat_seq(lw, lw.tensor(4), k, keys)
        _concat_seq(lw, lw.tensor(5), v, values)
    else:
        for j, t in ((1, k), (2, v)):
            if lw.wants(j):
                lw.alias(j, t)
    skv = keys.shape[2]
    native_causal = bool(lw.attr("is_causal", 0)) and skv - sq == past and not lw.has(6)
    if lw.attr("left_window_size", -1) != -1 or lw.attr("right_window_size", -1) != -1:
        native_causal = False
    mask = _mask(lw, q.dtype, sq, skv, past, native_causal)
    scale = lw.attr("scale")
    scale = 1.0 / math.sqrt(size) if scale is None else float(scale)
    width = max(size, v_size)
    q, keys, values = (
        _widen(lw, q, width, "q_wide"),
        _widen(lw, keys, width, "k_wide"),
        _widen(lw, values, width, "v_wide"),
    )
    y = lw.output(0)
    # [batch, seq, heads * size] is [batch, heads, seq, size] when there is one query or one head.
    direct = width == v_size and (len(q_shape) == 4 or sq == 1 or heads == 1)
    o = y.view((batch, heads, sq, width)) if direct else lw.scratch((batch, heads, sq, width), q.dtype, "o")
    kwargs: dict[str, Any] = {"dtype": q.dt}
    if mask is not None:
        kwargs["mask_ptr"] = mask
        kwargs["mask_shape"] = mask.shape
    if kv_heads != heads:
        kwargs["kv_heads"] = kv_heads
    if y.size == 0:
        return
    # One query row at the end of the keys sees every key: the causal rule changes nothing there.
    causal = native_causal and sq > 1
    lw.call("attention", q, keys, values, o, batch, heads, sq, skv, width, scale, causal, **kwargs)
    if not direct:
        src = contiguous_strides((batch, heads, sq, width))
        if len(q_shape) == 3:
            shape, strides = (batch, sq, heads, v_size), (src[0], src[2], src[1], 1)
        else:
            shape, strides = (batch, heads, sq, v_size), (src[0], src[1], src[2], 1)
        lw.copy(y.view(shape), o, shape, strides)
