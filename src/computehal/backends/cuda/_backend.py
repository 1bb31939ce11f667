"""The CUDA backend class: the op families of this package over one device."""

from __future__ import annotations

from collections.abc import Mapping

from ...backend import ALL_OPS
from ._attention import AttentionOps
from ._axis import AxisOps
from ._conv import ConvOps
from ._elementwise import ElementwiseOps
from ._gemm import GemmOps
from ._movement import MovementOps
from ._pool import PoolOps

__all__ = ["CudaBackend"]

_F32 = frozenset({"float32"})
#: Operations whose kernels are built for float32 and float64.
_REAL_OPS = (
    "conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "pool2d", "attention",
    "reduce", "softmax", "layer_norm", "rms_norm", "batch_norm", "lrn", "unary", "binary", "broadcast_binary",
)  # fmt: skip
_FLOATS = frozenset({"float32", "float64"})
#: Bit copies and conversions take every storage dtype.
_STORAGE = frozenset({"float16", "bfloat16", "float32", "float64"})


class CudaBackend(GemmOps, ConvOps, PoolOps, AttentionOps, AxisOps, ElementwiseOps, MovementOps):
    """An NVIDIA (or, with CuPy's ROCm build, AMD) GPU through CuPy.

    Parameters
    ----------
    device : int, optional
        Device ordinal (default 0).

    Notes
    -----
    Constructing the backend touches nothing; :meth:`init` opens the device (its own
    CuPy memory pool and a cuBLAS handle in host pointer mode with default math: no
    TF32) and raises :class:`~computehal.DeviceError` with CuPy's text when CuPy, the
    driver or the device is missing; :meth:`close` destroys the handle and returns the
    pool's memory. GEMMs are cuBLAS; every other operation runs the kernels of
    :mod:`computehal.kernels` (the sources the OpenCL backend runs) compiled by NVRTC
    on first use, with the binaries cached on disk. Pointers are device addresses:
    DLPack exchange with CuPy, PyTorch and others is zero-copy.
    """

    def _native_dtypes(self) -> Mapping[str, frozenset[str]]:
        caps = self._device_record().capabilities
        sixteen = {
            name for name, ok in (("float16", caps.supports_fp16), ("bfloat16", caps.supports_bf16)) if ok
        }
        table = {op: _F32 for op in ALL_OPS if self._overrides(f"_exec_{op}")}
        for op in ("gemm", "batched_gemm"):
            table[op] = _FLOATS | sixteen
        for op in _REAL_OPS:
            table[op] = _FLOATS
        for op in ("fill", "copy_strided", "gather", "scatter", "cast"):
            table[op] = _STORAGE
        table["copy_dtod"] = frozenset({"uint8"})
        return table
