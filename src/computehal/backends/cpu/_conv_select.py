"""Convolution algorithms chosen per shape, ahead of the general GEMM paths of :mod:`._conv`.

Each ``fast_*`` function returns True when it has computed the result, or False to
leave the problem to the general algorithms (any shape it does not cover, numba
missing, or an operand holding inf or NaN where an algorithm would spread it to
results that never read it). The choices, measured against the machine's sgemm rate
with ``computehal bench`` (ratios in the module docstrings of each algorithm):

* 3x3 stride-1 convolutions (one group, no dilation, at least :data:`WINOGRAD_MIN_CHANNELS`
  channels in and out, :data:`WINOGRAD_MIN_MACS` multiply-adds or more), float32:
  Winograd F(4x4, 3x3) (:mod:`._conv_winograd`) for the forward pass and both gradients.
  It does 4x fewer multiply-adds than the direct definition; per-tap GEMMs of the
  general path run at about 0.6-0.7 of the sgemm rate on 64-channel layers, Winograd
  at 1.3-1.5 (in the direct definition's FLOPs).

No oneDNN build with a C API installs from a wheel here (no ``onednn`` / ``dnnl``
package on the index), so the algorithms are written with numba and SciPy's BLAS.
"""

from __future__ import annotations

import numpy as np

from ... import validation as v
from ._conv_winograd import winograd_backward_data, winograd_backward_filter, winograd_forward
from ._plumbing import FloatArray
from ._runtime import kernels

__all__ = ["fast_forward", "fast_backward_data", "fast_backward_filter", "winograd_applies"]

#: Channels in and out below which the transforms cost more than the GEMMs save.
WINOGRAD_MIN_CHANNELS = 16
#: Direct multiply-adds below which a call is too small to be worth the transforms.
WINOGRAD_MIN_MACS = 1 << 22


def winograd_applies(p: v.ConvProblem) -> bool:
    """True when the Winograd F(4x4, 3x3) kernels compute ``p``."""
    return (
        p.dtype == np.float32
        and p.groups == 1
        and p.fh == p.fw == 3
        and p.sh == p.sw == 1
        and p.dh == p.dw == 1
        and min(p.c, p.k) >= WINOGRAD_MIN_CHANNELS
        and p.n * p.oh * p.ow * p.c * p.k * 9 >= WINOGRAD_MIN_MACS
        and kernels("_winograd") is not None
    )


def fast_forward(
    p: v.ConvProblem, x: FloatArray, f: FloatArray, y: FloatArray, bias: FloatArray | None
) -> bool:
    """``y`` = forward convolution (plus ``bias``) by a shape-specific algorithm, if one applies."""
    if winograd_applies(p):
        return winograd_forward(x, f, bias, y, p.ph, p.pw)
    return False


def fast_backward_data(p: v.ConvProblem, gy: FloatArray, f: FloatArray, gx: FloatArray) -> bool:
    """``gx`` = data gradient by a shape-specific algorithm, if one applies."""
    if winograd_applies(p):
        return winograd_backward_data(gy, f, gx, p.ph, p.pw)
    return False


def fast_backward_filter(p: v.ConvProblem, x: FloatArray, gy: FloatArray, gf: FloatArray) -> bool:
    """``gf`` = filter gradient by a shape-specific algorithm, if one applies."""
    if winograd_applies(p):
        return winograd_backward_filter(x, gy, gf, p.ph, p.pw)
    return False
