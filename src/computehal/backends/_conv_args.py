"""Host-side arguments of ``conv.cl``, shared by the two backends that build it (OpenCL, CUDA).

``conv.cl`` is written in the kernel dialect, so the OpenCL and the CUDA backend launch
the same kernels with the same scalar arguments: the ``CHAL_CONV_PARAMS`` list of a
problem, and the bounds of the interior outputs whose window never touches the padding
(the direct kernels treat the border outputs separately). This module imports no GPU
library.
"""

from __future__ import annotations

import numpy as np

from .. import validation as v
from ._common import ceil_div

__all__ = ["conv_border", "conv_dims"]

I32 = np.int32


def conv_dims(p: v.ConvProblem, c0: int = 0, cg: int | None = None) -> tuple[np.int32, ...]:
    """``CHAL_CONV_PARAMS`` of conv.cl for the group whose first input channel is ``c0``."""
    values = (c0, p.cg if cg is None else cg, p.c, p.h, p.w, p.fh, p.fw, p.oh, p.ow, p.sh, p.sw, p.ph, p.pw)
    return tuple(I32(d) for d in (*values, p.dh, p.dw))


def _interior(size: int, pad: int, extent: int, stride: int, out: int) -> tuple[int, int]:
    """[first, last + 1) output indices whose window lies inside the input along one axis."""
    first = min(out, ceil_div(pad, stride))
    span = size - extent + pad
    last = min(out, span // stride + 1) if span >= 0 else 0
    return first, max(first, last)


def conv_border(p: v.ConvProblem) -> tuple[int, tuple[np.int32, ...]]:
    """(number of border outputs, (r0, r1, q0, q1)).

    Outputs outside rows [r0, r1) x columns [q0, q1) have a window that touches the padding.
    """
    r0, r1 = _interior(p.h, p.ph, p.dh * (p.fh - 1) + 1, p.sh, p.oh)
    q0, q1 = _interior(p.w, p.pw, p.dw * (p.fw - 1) + 1, p.sw, p.ow)
    return p.oh * p.ow - (r1 - r0) * (q1 - q0), tuple(I32(b) for b in (r0, r1, q0, q1))
