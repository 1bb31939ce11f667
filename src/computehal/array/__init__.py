"""The friendly layer over pointers: device arrays and array-level operations.

:class:`DeviceArray` owns (or borrows) an allocation of a backend and knows its shape,
dtype and strides; the functions here turn array operands into the pointer, shape and
leading-dimension arguments of one :class:`~computehal.ComputeBackend` call each, with
the arrays' own dtype (so float64 NumPy data stays float64 where the device has it).
The pointer API stays the contract: every array exposes ``.ptr`` and ``.backend``, and
nothing in this layer computes a number itself.

Modules: ``_core`` (the array), ``_holder`` (ownership), ``_create`` (``empty``,
``zeros``, ``asarray``), ``_dlpack`` (DLPack interop, :func:`from_dlpack`), and one
module per family of functions: ``_linalg``, ``_nn``, ``_reduce``, ``_elementwise``,
``_movement``.

Examples
--------
>>> import numpy as np
>>> import computehal as ch
>>> from computehal import array as ca
>>> with ch.CpuBackend() as be:
...     a = ch.asarray(np.ones((2, 3), np.float32), be)
...     b = ch.asarray(np.ones((3, 4), np.float32), be)
...     c = ca.relu(ca.matmul(a, b))
...     np.from_dlpack(c)[0, 0].item()
3.0
"""

from ._core import Device, DeviceArray
from ._create import asarray, empty, full, to_device, zeros
from ._dlpack import from_dlpack
from ._elementwise import (
    abs,
    add,
    binary,
    clip,
    cos,
    div,
    erf,
    exp,
    gelu,
    leaky_relu,
    log,
    maximum,
    minimum,
    mul,
    neg,
    pow,
    reciprocal,
    relu,
    sigmoid,
    silu,
    sin,
    sqrt,
    square,
    sub,
    tanh,
    unary,
)
from ._linalg import matmul
from ._movement import (
    ascontiguousarray,
    astype,
    broadcast_to,
    concat,
    expand,
    permute_dims,
    put,
    split,
    take,
    transpose,
)
from ._nn import (
    attention,
    avg_pool2d,
    batch_norm,
    conv2d,
    conv2d_backward_data,
    conv2d_backward_filter,
    layer_norm,
    lrn,
    max_pool2d,
    rms_norm,
)
from ._reduce import log_softmax, max, mean, min, reduce, softmax, sum

__all__ = [
    "Device",
    "DeviceArray",
    "asarray",
    "to_device",
    "empty",
    "zeros",
    "full",
    "from_dlpack",
    # linear algebra and layers
    "matmul",
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
    # reductions
    "softmax",
    "log_softmax",
    "reduce",
    "sum",
    "max",
    "min",
    "mean",
    # element-wise
    "unary",
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "sqrt",
    "abs",
    "neg",
    "gelu",
    "silu",
    "erf",
    "reciprocal",
    "square",
    "sin",
    "cos",
    "leaky_relu",
    "clip",
    "binary",
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "maximum",
    "minimum",
    # data movement
    "ascontiguousarray",
    "transpose",
    "permute_dims",
    "concat",
    "split",
    "expand",
    "broadcast_to",
    "astype",
    "take",
    "put",
]
