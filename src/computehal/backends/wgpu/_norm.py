"""Normalisation (wgpu_norm.wgsl): layer / RMS norm over rows, batch norm and LRN over channels.

Rows are normalised by one workgroup each (two reductions in workgroup memory for layer
normalisation, one for RMS); batch norm and LRN are one invocation per element, LRN
summing the squares of its channel window.
"""

from __future__ import annotations

from ... import validation as v
from ...errors import UnsupportedError
from .._common import ceil_div
from ._device import Gpu
from ._queue import MAX_GROUPS, Step, grid_1d, pack

__all__ = ["batch_norm", "lrn", "row_norm"]


def row_norm(gpu: Gpu, p: v.NormProblem) -> None:
    """Run a validated layer_norm or rms_norm."""
    gpu.check_loops(f"a normalisation over rows of {p.cols}", 3 * (ceil_div(p.cols, 256) + 1) + 30)
    bx, by = gpu.bind("input_ptr", p.input), gpu.bind("output_ptr", p.output)
    bs = gpu.dummy() if p.scale is None else gpu.bind("scale_ptr", p.scale)
    bb = gpu.dummy() if p.bias is None else gpu.bind("bias_ptr", p.bias)
    gx = min(p.rows, MAX_GROUPS)
    grid = (gx, ceil_div(p.rows, gx), 1)
    if grid[1] > MAX_GROUPS:
        raise UnsupportedError(f"{p.rows} rows exceed the device's dispatch grid limits")
    params = pack(
        p.rows, p.cols, 0, bx.elem, by.elem, bs.elem, bb.elem, 0, 0,
        p.scale is not None, p.bias is not None, p.rms, float(p.eps), 0.0, 0.0, 0,
    )  # fmt: skip
    dummy = gpu.dummy()
    gpu.run([Step("row_norm", params, (bx, by, bs, bb, dummy, dummy), grid)])


def batch_norm(gpu: Gpu, p: v.BatchNormProblem) -> None:
    """Run a validated inference batch_norm."""
    total = p.n * p.c * p.spatial
    names = ("input_ptr", "output_ptr", "scale_ptr", "bias_ptr", "mean_ptr", "var_ptr")
    regions = (p.input, p.output, p.scale, p.bias, p.mean, p.var)
    bx, by, bs, bb, bm, bv = (gpu.bind(n, r) for n, r in zip(names, regions, strict=True))
    params = pack(
        total, p.c, p.spatial, bx.elem, by.elem, bs.elem, bb.elem, bm.elem, bv.elem,
        1, 1, 0, float(p.eps), 0.0, 0.0, 0,
    )  # fmt: skip
    gpu.run([Step("batch_norm", params, (bx, by, bs, bb, bm, bv), grid_1d(total, 256))])


def lrn(gpu: Gpu, p: v.LrnProblem) -> None:
    """Run a validated LRN (ONNX's definition, across channels)."""
    total = p.n * p.c * p.spatial
    gpu.check_loops(f"lrn over a window of {min(p.size, p.c)} channels", min(p.size, p.c) + 2)
    bx, by = gpu.bind("input_ptr", p.input), gpu.bind("output_ptr", p.output)
    d = gpu.dummy()
    params = pack(
        total, p.c, p.spatial, bx.elem, by.elem, 0, 0, 0, 0,
        0, 0, 0, float(p.alpha / p.size), float(p.beta), float(p.bias), p.size,
    )  # fmt: skip
    gpu.run([Step("lrn", params, (bx, by, d, d, d, d), grid_1d(total, 256))])
