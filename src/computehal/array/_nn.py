"""Network layers on arrays: convolution, pooling, attention, normalisation; one backend call each.

Every function checks its operands (one backend, one floating dtype, C-contiguous,
shapes that fit), works out the output shape, allocates the output unless ``out=`` is
given and makes one call of the :class:`~computehal.ComputeBackend` API with the
arrays' dtype. What the device takes is the backend's answer: a dtype it lacks raises
:class:`~computehal.UnsupportedError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import InvalidArgumentError
from ..types import PoolOp
from ._checks import as_shape, float_inputs, ints, output, pair, run
from ._core import DeviceArray

__all__ = [
    "conv2d",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "max_pool2d",
    "avg_pool2d",
    "attention",
    "layer_norm",
    "rms_norm",
    "batch_norm",
    "lrn",
]

IntOrPair = int | Sequence[int]


# --------------------------------------------------------------------------- shapes


def _four(name: str, x: DeviceArray) -> tuple[int, int, int, int]:
    if x.ndim != 4:
        raise InvalidArgumentError(f"{name} must be 4-D (NCHW), got shape {x.shape}")
    n, c, h, w = x.shape
    return n, c, h, w


def _padding(value: object) -> tuple[int, ...]:
    """An int, a pair (ph, pw) or four entries (top, left, bottom, right), as the backend takes them."""
    pads = ints("padding", value, (2, 4))
    if any(p < 0 for p in pads):
        raise InvalidArgumentError(f"padding must be >= 0, got {pads}")
    return pads


def _sides(pads: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) of a padding."""
    if len(pads) == 2:
        return pads[0], pads[1], pads[0], pads[1]
    return pads[0], pads[1], pads[2], pads[3]


def _positive(name: str, value: object) -> tuple[int, int]:
    a, b = pair(name, value)
    if a < 1 or b < 1:
        raise InvalidArgumentError(f"{name} must be >= 1, got {(a, b)}")
    return a, b


def _length(size: int, k: int, s: int, lo: int, hi: int, d: int, ceil: bool = False) -> int:
    """Output length of one window dimension (PyTorch's and ONNX's rule, ceil mode included)."""
    span = size + lo + hi - d * (k - 1) - 1
    if span < 0:
        raise InvalidArgumentError(
            f"the padded input ({size + lo + hi}) is smaller than the dilated window ({d * (k - 1) + 1})"
        )
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + lo:
        out -= 1  # a last window starting in the trailing padding is dropped
    return out


def _window(
    h: int,
    w: int,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    pads: tuple[int, ...],
    dil: tuple[int, int],
) -> tuple[int, int]:
    top, left, bottom, right = _sides(pads)
    oh = _length(h, kernel[0], stride[0], top, bottom, dil[0])
    ow = _length(w, kernel[1], stride[1], left, right, dil[1])
    return oh, ow


# --------------------------------------------------------------------------- convolution


def conv2d(
    x: DeviceArray,
    weight: DeviceArray,
    bias: DeviceArray | None = None,
    *,
    stride: IntOrPair = 1,
    padding: IntOrPair = 0,
    dilation: IntOrPair = 1,
    groups: int = 1,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """2-D cross-correlation of an NCHW input with a ``[K, C / groups, Fh, Fw]`` filter (``conv2d_forward``).

    Parameters
    ----------
    x, weight : DeviceArray
        Input and filter, of one floating dtype.
    bias : DeviceArray, optional
        K values added to the output channels.
    stride, dilation : int or pair
        >= 1.
    padding : int, pair or four ints
        Zero padding: both sides, (ph, pw), or (top, left, bottom, right).
    groups : int
        Channel groups (``groups == C``: depthwise).

    Returns
    -------
    DeviceArray
        ``(N, K, Oh, Ow)`` with ``Oh = (H + top + bottom - dh*(Fh-1) - 1) // sh + 1``.
    """
    dt = float_inputs(x=x, weight=weight, bias=bias)
    n, c, h, w = _four("x", x)
    k, fc, fh, fw = _four("weight", weight)
    if groups < 1 or fc * groups != c:
        raise InvalidArgumentError(
            f"weight has {fc} input channels per group; x has {c} channels, groups {groups}"
        )
    if bias is not None and bias.shape not in ((k,), (1, k, 1, 1)):
        raise InvalidArgumentError(f"bias has shape {bias.shape}, expected ({k},)")
    st, dil, pads = _positive("stride", stride), _positive("dilation", dilation), _padding(padding)
    oh, ow = _window(h, w, (fh, fw), st, pads, dil)
    y, fresh = output(out, x, (n, k, oh, ow), dt)
    be = x.backend
    return run(
        y,
        fresh,
        lambda: be.conv2d_forward(
            x.ptr,
            x.shape,
            weight.ptr,
            weight.shape,
            y.ptr,
            y.shape,
            st,
            pads,
            dtype=dt,
            groups=groups,
            dilation=dil,
            bias_ptr=None if bias is None else bias.ptr,
        ),  # fmt: skip
    )


def conv2d_backward_data(
    grad_output: DeviceArray,
    weight: DeviceArray,
    input_shape: Sequence[int],
    *,
    stride: IntOrPair = 1,
    padding: IntOrPair = 0,
    dilation: IntOrPair = 1,
    groups: int = 1,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Gradient of :func:`conv2d` with respect to its input, of shape ``input_shape`` (NCHW)."""
    dt = float_inputs(grad_output=grad_output, weight=weight)
    shape = as_shape(input_shape, "input_shape")
    if len(shape) != 4:
        raise InvalidArgumentError(f"input_shape must have 4 entries, got {shape}")
    _four("grad_output", grad_output)
    _four("weight", weight)
    st, dil, pads = _positive("stride", stride), _positive("dilation", dilation), _padding(padding)
    gx, fresh = output(out, grad_output, shape, dt)
    be = grad_output.backend
    return run(
        gx,
        fresh,
        lambda: be.conv2d_backward_data(
            grad_output.ptr,
            grad_output.shape,
            weight.ptr,
            weight.shape,
            gx.ptr,
            gx.shape,
            st,
            pads,
            dtype=dt,
            groups=groups,
            dilation=dil,
        ),  # fmt: skip
    )


def conv2d_backward_filter(
    x: DeviceArray,
    grad_output: DeviceArray,
    filter_shape: Sequence[int],
    *,
    stride: IntOrPair = 1,
    padding: IntOrPair = 0,
    dilation: IntOrPair = 1,
    groups: int = 1,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Gradient of :func:`conv2d` with respect to its filter.

    ``filter_shape`` is the full ``(K, C / groups, Fh, Fw)`` or just ``(Fh, Fw)`` (K and
    C / groups then come from ``grad_output``, ``x`` and ``groups``).
    """
    dt = float_inputs(x=x, grad_output=grad_output)
    _four("x", x)
    _four("grad_output", grad_output)
    dims = as_shape(filter_shape, "filter_shape")
    if len(dims) == 2 and groups >= 1:
        dims = (grad_output.shape[1], x.shape[1] // groups, *dims)
    if len(dims) != 4:
        raise InvalidArgumentError(f"filter_shape must have 4 (or 2) entries, got {dims}")
    st, dil, pads = _positive("stride", stride), _positive("dilation", dilation), _padding(padding)
    gw, fresh = output(out, x, dims, dt)
    be = x.backend
    return run(
        gw,
        fresh,
        lambda: be.conv2d_backward_filter(
            x.ptr,
            x.shape,
            grad_output.ptr,
            grad_output.shape,
            gw.ptr,
            gw.shape,
            st,
            pads,
            dtype=dt,
            groups=groups,
            dilation=dil,
        ),  # fmt: skip
    )


# --------------------------------------------------------------------------- pooling


def _pool(
    op: PoolOp,
    x: DeviceArray,
    kernel_size: IntOrPair,
    stride: IntOrPair | None,
    padding: IntOrPair,
    dilation: IntOrPair,
    ceil_mode: bool,
    count_include_pad: bool,
    out: DeviceArray | None,
) -> DeviceArray:
    dt = float_inputs(x=x)
    n, c, h, w = _four("x", x)
    kernel = _positive("kernel_size", kernel_size)
    st = kernel if stride is None else _positive("stride", stride)
    dil, pads = _positive("dilation", dilation), _padding(padding)
    top, left, bottom, right = _sides(pads)
    oh = _length(h, kernel[0], st[0], top, bottom, dil[0], bool(ceil_mode))
    ow = _length(w, kernel[1], st[1], left, right, dil[1], bool(ceil_mode))
    y, fresh = output(out, x, (n, c, oh, ow), dt)
    be = x.backend
    return run(
        y,
        fresh,
        lambda: be.pool2d(
            op,
            x.ptr,
            x.shape,
            y.ptr,
            y.shape,
            kernel,
            st,
            pads,
            dilation=dil,
            ceil_mode=bool(ceil_mode),
            count_include_pad=bool(count_include_pad),
            dtype=dt,
        ),  # fmt: skip
    )


def max_pool2d(
    x: DeviceArray,
    kernel_size: IntOrPair,
    stride: IntOrPair | None = None,
    padding: IntOrPair = 0,
    *,
    dilation: IntOrPair = 1,
    ceil_mode: bool = False,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """2-D max pooling of an NCHW array (``pool2d``; NaN and padding ignored, like ``fmax``).

    ``stride`` defaults to the kernel size; ``padding`` is an int, a pair or
    (top, left, bottom, right). Global pooling is a kernel the size of the image.
    """
    return _pool(PoolOp.MAX, x, kernel_size, stride, padding, dilation, ceil_mode, False, out)


def avg_pool2d(
    x: DeviceArray,
    kernel_size: IntOrPair,
    stride: IntOrPair | None = None,
    padding: IntOrPair = 0,
    *,
    ceil_mode: bool = False,
    count_include_pad: bool = False,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """2-D average pooling of an NCHW array (``pool2d``).

    The divisor counts the window positions inside the input, or with
    ``count_include_pad`` inside the padded input.
    """
    return _pool(PoolOp.AVG, x, kernel_size, stride, padding, 1, ceil_mode, count_include_pad, out)


# --------------------------------------------------------------------------- attention


def attention(
    q: DeviceArray,
    k: DeviceArray,
    v: DeviceArray,
    *,
    scale: float | None = None,
    causal: bool = False,
    mask: DeviceArray | None = None,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Scaled dot-product attention ``softmax(q @ k^T * scale + mask) @ v``.

    Parameters
    ----------
    q : DeviceArray
        ``(batch, heads, seq_q, head_dim)``.
    k, v : DeviceArray
        ``(batch, kv_heads, seq_kv, head_dim)``; ``kv_heads`` divides ``heads``
        (grouped-query attention) and ``seq_kv`` may differ from ``seq_q`` (decoding
        with a key/value cache).
    scale : float, optional
        Multiplies the scores; default ``1 / sqrt(head_dim)``.
    causal : bool
        Bottom-right aligned causal mask (see ``ComputeBackend.attention``).
    mask : DeviceArray, optional
        Additive mask of up to 4 dimensions, broadcastable to
        ``(batch, heads, seq_q, seq_kv)``.
    """
    dt = float_inputs(q=q, k=k, v=v, mask=mask)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise InvalidArgumentError(f"q, k, v must be 4-D, got {q.shape}, {k.shape}, {v.shape}")
    batch, heads, seq_q, head_dim = q.shape
    if k.shape != v.shape:
        raise InvalidArgumentError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    kv_batch, kv_heads, seq_kv, kv_dim = k.shape
    if (kv_batch, kv_dim) != (batch, head_dim) or kv_heads < 1 or heads % kv_heads:
        raise InvalidArgumentError(
            f"k shape {k.shape} does not fit q shape {q.shape}: batch and head_dim must match and "
            "k's heads must divide q's"
        )
    if mask is not None and not 1 <= mask.ndim <= 4:
        raise InvalidArgumentError(f"mask must have 1 to 4 dimensions, got shape {mask.shape}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    o, fresh = output(out, q, q.shape, dt)
    be = q.backend
    return run(
        o,
        fresh,
        lambda: be.attention(
            q.ptr,
            k.ptr,
            v.ptr,
            o.ptr,
            batch,
            heads,
            seq_q,
            seq_kv,
            head_dim,
            scale,
            bool(causal),
            dtype=dt,
            mask_ptr=None if mask is None else mask.ptr,
            mask_shape=None if mask is None else mask.shape,
            kv_heads=kv_heads,
        ),  # fmt: skip
    )


# --------------------------------------------------------------------------- normalisation


def _row_norm(
    rms: bool,
    x: DeviceArray,
    normalized: int,
    scale: DeviceArray | None,
    bias: DeviceArray | None,
    eps: float,
    out: DeviceArray | None,
) -> DeviceArray:
    dt = float_inputs(x=x, scale=scale, bias=bias)
    if not 1 <= normalized <= x.ndim:
        raise InvalidArgumentError(f"cannot normalise the last {normalized} axes of a {x.ndim}-d array")
    cols = math.prod(x.shape[x.ndim - normalized :])
    rows = x.size // cols if cols else 0
    for name, p in (("scale", scale), ("bias", bias)):
        if p is not None and p.size != cols:
            raise InvalidArgumentError(f"{name} has {p.size} elements; the normalised axes have {cols}")
    y, fresh = output(out, x, x.shape, dt)
    be = x.backend
    method = be.rms_norm if rms else be.layer_norm
    return run(
        y,
        fresh,
        lambda: method(
            x.ptr,
            y.ptr,
            rows,
            cols,
            eps,
            dtype=dt,
            scale_ptr=None if scale is None else scale.ptr,
            bias_ptr=None if bias is None else bias.ptr,
        ),  # fmt: skip
    )


def layer_norm(
    x: DeviceArray,
    scale: DeviceArray | None = None,
    bias: DeviceArray | None = None,
    *,
    eps: float = 1e-5,
    axes: int = 1,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Layer normalisation over the last ``axes`` axes: ``(x - mean) / sqrt(var + eps) * scale + bias``."""
    return _row_norm(False, x, axes, scale, bias, eps, out)


def rms_norm(
    x: DeviceArray,
    scale: DeviceArray | None = None,
    bias: DeviceArray | None = None,
    *,
    eps: float = 1e-6,
    axes: int = 1,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """RMS normalisation over the last ``axes`` axes: ``x / sqrt(mean(x**2) + eps) * scale + bias``."""
    return _row_norm(True, x, axes, scale, bias, eps, out)


def batch_norm(
    x: DeviceArray,
    mean: DeviceArray,
    var: DeviceArray,
    scale: DeviceArray,
    bias: DeviceArray,
    *,
    eps: float = 1e-5,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Inference batch normalisation over channel axis 1 of an ``(N, C, ...)`` array.

    ``y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c]``; the four
    parameters have C elements.
    """
    dt = float_inputs(x=x, mean=mean, var=var, scale=scale, bias=bias)
    if x.ndim < 2:
        raise InvalidArgumentError(f"x must have at least 2 dimensions (N, C, ...), got shape {x.shape}")
    channels = x.shape[1]
    for name, p in (("mean", mean), ("var", var), ("scale", scale), ("bias", bias)):
        if p.size != channels:
            raise InvalidArgumentError(f"{name} has {p.size} elements; x has {channels} channels")
    y, fresh = output(out, x, x.shape, dt)
    be = x.backend
    return run(
        y,
        fresh,
        lambda: be.batch_norm(x.ptr, x.shape, scale.ptr, bias.ptr, mean.ptr, var.ptr, y.ptr, eps, dtype=dt),
    )


def lrn(
    x: DeviceArray,
    size: int,
    *,
    alpha: float = 1e-4,
    beta: float = 0.75,
    bias: float = 1.0,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Local response normalisation across channels (ONNX's LRN) of an ``(N, C, ...)`` array."""
    dt = float_inputs(x=x)
    if x.ndim < 2:
        raise InvalidArgumentError(f"x must have at least 2 dimensions (N, C, ...), got shape {x.shape}")
    y, fresh = output(out, x, x.shape, dt)
    be = x.backend
    return run(y, fresh, lambda: be.lrn(x.ptr, y.ptr, x.shape, size, alpha, beta, bias, dtype=dt))
