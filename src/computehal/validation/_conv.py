"""2-D convolution (forward and both gradients) and 2-D pooling, NCHW."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..errors import InvalidArgumentError
from ..memory import Lease, Region, as_count, as_pointer, ceil_div
from ..types import PoolOp, UnaryOp, coerce_enum
from ._core import INDEX_MAX, Operand, Problem, Role, as_flag, as_shape, float_dtype, record

__all__ = [
    "ConvProblem",
    "ConvForwardProblem",
    "ConvDataProblem",
    "ConvFilterProblem",
    "PoolProblem",
    "conv2d_forward",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "pool2d",
    "padding4",
]


def padding4(value: object) -> tuple[int, int, int, int]:
    """``padding`` as (top, left, bottom, right): two entries [ph, pw] mean both sides."""
    pads = as_shape("padding", value, (2, 4))
    if len(pads) == 2:
        return pads[0], pads[1], pads[0], pads[1]
    return pads[0], pads[1], pads[2], pads[3]


def _pair(name: str, value: object) -> tuple[int, int]:
    a, b = as_shape(name, value, 2)
    if a < 1 or b < 1:
        raise InvalidArgumentError(f"{name} must be >= 1, got [{a}, {b}]")
    return a, b


@record
class ConvProblem(Problem):
    """A validated 2-D convolution (NCHW input, KCHW filter, NKHW output).

    The same fields describe the forward pass and both gradients: ``x``, ``f`` and
    ``y`` are the regions of the input (or its gradient), the filter (or its
    gradient) and the output (or its gradient). Padding is (``ph`` top, ``pw`` left,
    ``pb`` bottom, ``pr`` right); the filter is ``[K, C / groups, Fh, Fw]``; output
    channel ``k`` of group ``g = k // (K / groups)`` reads input channels
    ``g * C/groups .. (g + 1) * C/groups - 1``; taps are ``dh`` / ``dw`` apart.
    """

    n: int
    c: int
    h: int
    w: int
    k: int
    fh: int
    fw: int
    oh: int
    ow: int
    sh: int
    sw: int
    ph: int
    pw: int
    x: Region
    f: Region
    y: Region
    dtype: np.dtype[Any]
    groups: int = 1
    dh: int = 1
    dw: int = 1
    pb: int = 0
    pr: int = 0
    bias: Region | None = None

    @property
    def empty_output(self) -> bool:
        """True when the forward output has no elements."""
        return self.n * self.k * self.oh * self.ow == 0

    @property
    def cg(self) -> int:
        """Input channels per group (the filter's second dimension)."""
        return self.c // self.groups

    @property
    def kg(self) -> int:
        """Output channels per group."""
        return self.k // self.groups

    @property
    def symmetric(self) -> bool:
        """True when top == bottom and left == right padding."""
        return self.ph == self.pb and self.pw == self.pr

    @property
    def is_plain(self) -> bool:
        """True for the seed's convolution: one group, no dilation, symmetric padding, no bias."""
        return self.groups == 1 and self.dh == 1 and self.dw == 1 and self.symmetric and self.bias is None

    @property
    def depthwise(self) -> bool:
        """True when every group has one input channel (``groups == C``)."""
        return self.groups == self.c and self.c > 0


@record
class ConvForwardProblem(ConvProblem):
    """``conv2d_forward``: reads ``x``, ``f`` (and ``bias``, ``residual``), overwrites ``y``.

    The epilogue: ``y = activation(conv + bias + residual)`` (each part optional);
    ``residual`` may be exactly ``y`` (accumulate in place).
    """

    OPERANDS: ClassVar[tuple[Operand, ...]] = (
        Operand("x", Role.IN),
        Operand("f", Role.IN),
        Operand("bias", Role.IN),
        Operand("residual", Role.IN),
        Operand("y", Role.OUT),
    )
    IDENTICAL_OK: ClassVar[frozenset[str]] = frozenset({"residual"})

    residual: Region | None = None
    activation: UnaryOp | None = None

    @property
    def has_epilogue(self) -> bool:
        """True when a residual or an activation follows the convolution."""
        return self.residual is not None or self.activation is not None

    def constant_output(self) -> tuple[Region, float] | None:
        """No input channel, no bias and no epilogue: the output is zero."""
        plain = self.bias is None and self.residual is None and self.activation is None
        return (self.y, 0.0) if self.c == 0 and plain else None


@record
class ConvDataProblem(ConvProblem):
    """``conv2d_backward_data``: reads ``y`` (output gradient) and ``f``, overwrites ``x``."""

    OPERANDS: ClassVar[tuple[Operand, ...]] = (
        Operand("y", Role.IN),
        Operand("f", Role.IN),
        Operand("x", Role.OUT),
    )

    def constant_output(self) -> tuple[Region, float] | None:
        """No output channel: the input gradient is zero."""
        return (self.x, 0.0) if self.k == 0 else None


@record
class ConvFilterProblem(ConvProblem):
    """``conv2d_backward_filter``: reads ``x`` and ``y`` (output gradient), overwrites ``f``."""

    OPERANDS: ClassVar[tuple[Operand, ...]] = (
        Operand("x", Role.IN),
        Operand("y", Role.IN),
        Operand("f", Role.OUT),
    )

    def constant_output(self) -> tuple[Region, float] | None:
        """Nothing is summed (no image or no output pixel): the filter gradient is zero."""
        return (self.f, 0.0) if self.n * self.oh * self.ow == 0 else None


_CONV_KINDS: dict[str, type[ConvProblem]] = {
    "forward": ConvForwardProblem,
    "data": ConvDataProblem,
    "filter": ConvFilterProblem,
}


def _conv(
    lease: Lease,
    kind: str,
    x_arg: tuple[str, object, object],
    f_arg: tuple[str, object, object],
    y_arg: tuple[str, object, object],
    stride: object,
    padding: object,
    dtype: object,
    groups: object,
    dilation: object,
    bias_ptr: object = None,
    epilogue: tuple[object, object] = (None, None),
) -> ConvProblem:
    """Validate a conv2d call given (name, pointer, shape) of input, filter and output.

    ``epilogue`` is the forward pass's (residual pointer, activation).
    """
    dt = float_dtype(dtype)
    x_name, x_ptr, x_shape = x_arg
    f_name, f_ptr, f_shape = f_arg
    y_name, y_ptr, y_shape = y_arg
    n, c, h, w = as_shape(x_name.replace("_ptr", "_shape"), x_shape, 4)
    k, fc, fh, fw = as_shape(f_name.replace("_ptr", "_shape"), f_shape, 4)
    yn, yk, oh, ow = as_shape(y_name.replace("_ptr", "_shape"), y_shape, 4)
    sh, sw = _pair("stride", stride)
    pt, pl, pb, pr = padding4(padding)
    dh, dw = _pair("dilation", dilation)
    g = as_count("groups", groups)
    pointers = {name: as_pointer(name, p) for name, p in ((x_name, x_ptr), (f_name, f_ptr), (y_name, y_ptr))}
    bias = None if bias_ptr is None else as_pointer("bias_ptr", bias_ptr)
    residual = None if epilogue[0] is None else as_pointer("residual_ptr", epilogue[0])
    activation = _activation(epilogue[1])
    if g < 1:
        raise InvalidArgumentError(f"groups must be >= 1, got {g}")
    if c % g or k % g:
        raise InvalidArgumentError(f"groups = {g} must divide the input channels {c} and the filters K = {k}")
    if fh < 1 or fw < 1:
        raise InvalidArgumentError(f"filter height and width must be >= 1, got [{fh}, {fw}]")
    if fc != c // g:
        raise InvalidArgumentError(
            f"filter has {fc} channels but the input has {c} in {g} group(s) (expected {c // g})"
        )
    if yn != n:
        raise InvalidArgumentError(f"output batch {yn} does not match input batch {n}")
    if yk != k:
        raise InvalidArgumentError(f"output has {yk} channels but the filter has K = {k}")
    ph_total, pw_total = h + pt + pb, w + pl + pr
    eh, ew = dh * (fh - 1) + 1, dw * (fw - 1) + 1
    if max(sh, sw, ph_total, pw_total, eh, ew) > INDEX_MAX:
        # Kernels index images with 32-bit integers: larger values would wrap.
        raise InvalidArgumentError(
            f"stride [{sh}, {sw}], padded input {ph_total}x{pw_total} and dilated filter {eh}x{ew} "
            f"must not exceed {INDEX_MAX} (32-bit kernel indices)"
        )
    if ph_total < eh or pw_total < ew:
        raise InvalidArgumentError(
            f"padded input {ph_total}x{pw_total} is smaller than the (dilated) filter {eh}x{ew}"
        )
    eoh, eow = (ph_total - eh) // sh + 1, (pw_total - ew) // sw + 1
    if (oh, ow) != (eoh, eow):
        raise InvalidArgumentError(
            f"output spatial shape {oh}x{ow} does not match the convolution: expected {eoh}x{eow} "
            "= (H + pad_top + pad_bottom - dilation*(Fh-1) - 1) // stride + 1 (likewise W)"
        )
    size = dt.itemsize
    x = lease.resolve(x_name, pointers[x_name], n * c * h * w * size, align=size)
    f = lease.resolve(f_name, pointers[f_name], k * fc * fh * fw * size, align=size)
    y = lease.resolve(y_name, pointers[y_name], n * k * oh * ow * size, align=size)
    b = None if bias is None else lease.resolve("bias_ptr", bias, k * size, align=size)
    if kind == "forward":
        r = None if residual is None else lease.resolve("residual_ptr", residual, y.nbytes, align=size)
        fields = (n, c, h, w, k, fh, fw, oh, ow, sh, sw, pt, pl, x, f, y, dt, g, dh, dw, pb, pr, b)
        return ConvForwardProblem(*fields, r, activation)
    cls = _CONV_KINDS[kind]
    return cls(n, c, h, w, k, fh, fw, oh, ow, sh, sw, pt, pl, x, f, y, dt, g, dh, dw, pb, pr, b)


def _activation(value: object) -> UnaryOp | None:
    """The epilogue's activation: None or a parameter-free :class:`UnaryOp`."""
    if value is None:
        return None
    op = coerce_enum(UnaryOp, value, "activation")
    if op in (UnaryOp.LEAKY_RELU, UnaryOp.CLIP):
        raise InvalidArgumentError(
            f"activation {op.value} takes parameters; the convolution epilogue takes parameter-free "
            "unary ops only (run unary after the convolution instead)"
        )
    return op


def conv2d_forward(
    lease: Lease,
    input_ptr: object,
    input_shape: object,
    filter_ptr: object,
    filter_shape: object,
    output_ptr: object,
    output_shape: object,
    stride: object,
    padding: object,
    *,
    dtype: object = "float32",
    groups: object = 1,
    dilation: object = (1, 1),
    bias_ptr: object = None,
    residual_ptr: object = None,
    activation: object = None,
) -> ConvProblem:
    """Validate ``conv2d_forward``."""
    return _conv(
        lease,
        "forward",
        ("input_ptr", input_ptr, input_shape),
        ("filter_ptr", filter_ptr, filter_shape),
        ("output_ptr", output_ptr, output_shape),
        stride,
        padding,
        dtype,
        groups,
        dilation,
        bias_ptr,
        (residual_ptr, activation),
    )


def conv2d_backward_data(
    lease: Lease,
    grad_output_ptr: object,
    grad_output_shape: object,
    filter_ptr: object,
    filter_shape: object,
    grad_input_ptr: object,
    grad_input_shape: object,
    stride: object,
    padding: object,
    *,
    dtype: object = "float32",
    groups: object = 1,
    dilation: object = (1, 1),
) -> ConvProblem:
    """Validate ``conv2d_backward_data``."""
    return _conv(
        lease,
        "data",
        ("grad_input_ptr", grad_input_ptr, grad_input_shape),
        ("filter_ptr", filter_ptr, filter_shape),
        ("grad_output_ptr", grad_output_ptr, grad_output_shape),
        stride,
        padding,
        dtype,
        groups,
        dilation,
    )


def conv2d_backward_filter(
    lease: Lease,
    input_ptr: object,
    input_shape: object,
    grad_output_ptr: object,
    grad_output_shape: object,
    grad_filter_ptr: object,
    grad_filter_shape: object,
    stride: object,
    padding: object,
    *,
    dtype: object = "float32",
    groups: object = 1,
    dilation: object = (1, 1),
) -> ConvProblem:
    """Validate ``conv2d_backward_filter``."""
    return _conv(
        lease,
        "filter",
        ("input_ptr", input_ptr, input_shape),
        ("grad_filter_ptr", grad_filter_ptr, grad_filter_shape),
        ("grad_output_ptr", grad_output_ptr, grad_output_shape),
        stride,
        padding,
        dtype,
        groups,
        dilation,
    )


# --------------------------------------------------------------------------- pooling


@record
class PoolProblem(Problem):
    """A validated ``pool2d``: input [N, C, H, W], output [N, C, Oh, Ow].

    Output pixel (i, j) covers input rows ``i*sh - pt + r*dh`` for ``r < kh`` (likewise
    columns); positions outside the input are padding. MAX ignores padding (and NaN,
    as ``fmax``); AVG divides by the number of positions inside the input, or, with
    ``count_include_pad``, inside the padded input (ceil-mode overhang never counts).
    A window with no input position gives -inf (MAX) and NaN (AVG, 0 / 0; 0 with
    ``count_include_pad`` when it covers padding).
    """

    OPERANDS: ClassVar[tuple[Operand, ...]] = (Operand("x", Role.IN), Operand("y", Role.OUT))

    op: PoolOp
    n: int
    c: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    pb: int
    pr: int
    dh: int
    dw: int
    ceil_mode: bool
    count_include_pad: bool
    x: Region
    y: Region
    dtype: np.dtype[Any]


def pool_output_size(
    size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, dil: int, ceil: bool
) -> int:
    """Output length of one pooled dimension (PyTorch's and ONNX's rule, ceil mode included).

    In ceil mode a last window that would start inside the trailing padding is dropped.
    """
    span = size + pad_lo + pad_hi - dil * (kernel - 1) - 1
    if span < 0:
        return 0
    out = (ceil_div(span, stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + pad_lo:
        out -= 1
    return out


def pool2d(
    lease: Lease,
    op: object,
    input_ptr: object,
    input_shape: object,
    output_ptr: object,
    output_shape: object,
    kernel: object,
    stride: object,
    padding: object,
    *,
    dilation: object = (1, 1),
    ceil_mode: object = False,
    count_include_pad: object = False,
    dtype: object = "float32",
) -> PoolProblem:
    """Validate ``pool2d``."""
    pop = coerce_enum(PoolOp, op, "op")
    dt = float_dtype(dtype)
    n, c, h, w = as_shape("input_shape", input_shape, 4)
    yn, yc, oh, ow = as_shape("output_shape", output_shape, 4)
    kh, kw = _pair("kernel", kernel)
    sh, sw = _pair("stride", stride)
    pt, pl, pb, pr = padding4(padding)
    dh, dw = _pair("dilation", dilation)
    ceil, include = as_flag("ceil_mode", ceil_mode), as_flag("count_include_pad", count_include_pad)
    src, dst = as_pointer("input_ptr", input_ptr), as_pointer("output_ptr", output_ptr)
    if (yn, yc) != (n, c):
        raise InvalidArgumentError(f"output batch and channels {yn}, {yc} do not match the input's {n}, {c}")
    if max(h + pt + pb, w + pl + pr, dh * kh, dw * kw, sh, sw) > INDEX_MAX:
        raise InvalidArgumentError(f"pooling extents must not exceed {INDEX_MAX} (32-bit kernel indices)")
    eoh = pool_output_size(h, kh, sh, pt, pb, dh, ceil)
    eow = pool_output_size(w, kw, sw, pl, pr, dw, ceil)
    if (oh, ow) != (eoh, eow) or eoh < 1 or eow < 1:
        raise InvalidArgumentError(
            f"output spatial shape {oh}x{ow} does not match the pooling: expected {eoh}x{eow} "
            f"(kernel [{kh}, {kw}], stride [{sh}, {sw}], padding [{pt}, {pl}, {pb}, {pr}], "
            f"dilation [{dh}, {dw}], ceil_mode {ceil})"
        )
    size = dt.itemsize
    x = lease.resolve("input_ptr", src, n * c * h * w * size, align=size)
    y = lease.resolve("output_ptr", dst, n * c * oh * ow * size, align=size)
    return PoolProblem(
        pop, n, c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, ceil, include, x, y, dt
    )
