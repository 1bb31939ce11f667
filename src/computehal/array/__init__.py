"""The friendly layer over pointers: device arrays and array-level operations.

:class:`DeviceArray` owns (or borrows) an allocation of a backend and knows its shape,
dtype and strides; the functions here turn array operands into the pointer, shape and
leading-dimension arguments of one :class:`~computehal.ComputeBackend` call each. The
pointer API stays the contract: every array exposes ``.ptr`` and ``.backend``, and
nothing in this layer computes a number itself.

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

from ..dlpack import from_dlpack
from ._core import Device, DeviceArray, asarray, empty, to_device, zeros
from ._ops import (
    abs,
    add,
    attention,
    binary,
    conv2d,
    conv2d_backward_data,
    conv2d_backward_filter,
    div,
    exp,
    log,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    mul,
    neg,
    put,
    reduce,
    relu,
    sigmoid,
    softmax,
    sqrt,
    sub,
    sum,
    take,
    tanh,
    unary,
)

__all__ = [
    "Device",
    "DeviceArray",
    "asarray",
    "to_device",
    "empty",
    "zeros",
    "from_dlpack",
    "matmul",
    "conv2d",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "attention",
    "softmax",
    "reduce",
    "sum",
    "max",
    "min",
    "mean",
    "unary",
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "sqrt",
    "abs",
    "neg",
    "binary",
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "take",
    "put",
]
