"""The OpenCL backend class: the op families of this package over one device."""

from __future__ import annotations

from collections.abc import Mapping

from ...backend import ALL_OPS
from ._attention import AttentionOps
from ._axis import AxisOps
from ._conv import ConvOps
from ._elementwise import ElementwiseOps
from ._movement import MovementOps
from ._pool import PoolOps

__all__ = ["OpenCLBackend"]

_F32 = frozenset({"float32"})
_WIDENED = frozenset({"float16", "bfloat16"})
#: Bit copies take every storage dtype (float64 is moved as 64-bit words, no fp64 needed).
_BITS = frozenset({"float16", "bfloat16", "float32", "float64"})


class OpenCLBackend(ConvOps, AttentionOps, AxisOps, ElementwiseOps, MovementOps, PoolOps):
    """Compute on one OpenCL device (a GPU, or a CPU through PoCL) with real kernels.

    Parameters
    ----------
    device : int
        Ordinal among the devices that pass ``platform`` and ``device_filter`` (in
        platform order; see :meth:`available_devices`).
    platform : str, optional
        Only use platforms whose name or vendor contains this text (case-insensitive).
    device_filter : str or callable, optional
        Only use devices whose name contains this text, or for which the callable returns
        True when given the ``pyopencl.Device``.
    kernel_profile : {"gpu", "cpu"}, optional
        Launch shapes to use. ``"cpu"``: GEMM and convolution by one work-item per work-group
        with a vector register tile over packed panels, contiguous folds in reductions, several
        elements per element-wise work-item and the single-work-item attention kernel (fast on
        CPU devices such as PoCL). ``"gpu"``: GEMM and convolution by work-group tiles staged
        in local memory (``kernels/gemm_wg.cl``), interleaved (coalesced) reduction folds, one
        element per work-item and the work-group attention kernel. By default the device type
        decides: GPU and accelerator devices get ``"gpu"``, every other device ``"cpu"``.
        Forcing ``"gpu"`` on a CPU device runs (and tests) the GPU kernels there.

    Notes
    -----
    Kernels live in :mod:`computehal.kernels` (OpenCL C in the dialect that also compiles as
    CUDA C++), built lazily per family and build configuration and kept in a bounded
    program cache. Operand data never goes through the host.
    """

    kind = "opencl"

    def _native_dtypes(self) -> Mapping[str, frozenset[str]]:
        floats = self._native_float()
        table = {op: floats for op in ALL_OPS}
        table.update({op: _BITS for op in ("fill", "copy_strided", "gather", "scatter")})
        table.update(gemm_mixed_precision=_F32, copy_dtod=frozenset({"uint8"}), cast=_WIDENED | floats)
        return table
