"""Independent NumPy definitions of every operation, used as the conformance oracle.

Written from the documented semantics of :class:`~computehal.ComputeBackend` alone, in
float64 and in the most literal form (``einsum`` per filter tap, loops over rows and
windows, the rounding of storage types computed bit by bit), deliberately sharing no
code with any backend or with :mod:`computehal.validation`: a backend is never checked
against itself. Each function returns the exact (float64) result, or the exact bits for
data movement; the cases round it to the storage type or compare with tolerances.

:data:`DEFINITIONS` maps every operation of :data:`computehal.backend.ALL_OPS` to its
definition here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._attention import attention
from ._axis import batch_norm, layer_norm, lrn, reduce, rms_norm, softmax
from ._blas import batched_gemm, gemm, gemm_mixed_precision, stored_colmajor
from ._conv import (
    conv2d_backward_data,
    conv2d_backward_filter,
    conv2d_forward,
    conv2d_output_shape,
    conv_output_size,
    pads4,
    pool2d,
    pool_output_size,
)
from ._elementwise import UNARY_DEFINITIONS, binary, broadcast_binary, cast, unary
from ._movement import copy_dtod, copy_strided, fill, gather, scatter
from ._rounding import F64Array, dtype_name, round_bf16, round_f16, round_to, storage, storage_dtype, ulp

__all__ = [
    "DEFINITIONS",
    "F64Array",
    "UNARY_DEFINITIONS",
    "attention",
    "batch_norm",
    "batched_gemm",
    "binary",
    "broadcast_binary",
    "cast",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "conv2d_forward",
    "conv2d_output_shape",
    "conv_output_size",
    "copy_dtod",
    "copy_strided",
    "dtype_name",
    "fill",
    "gather",
    "gemm",
    "gemm_mixed_precision",
    "layer_norm",
    "lrn",
    "pads4",
    "pool2d",
    "pool_output_size",
    "reduce",
    "rms_norm",
    "round_bf16",
    "round_f16",
    "round_to",
    "scatter",
    "softmax",
    "storage",
    "storage_dtype",
    "stored_colmajor",
    "ulp",
    "unary",
]

#: Operation name -> its definition (each function is named after its operation).
DEFINITIONS: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (
        *(gemm, batched_gemm, gemm_mixed_precision),
        *(conv2d_forward, conv2d_backward_data, conv2d_backward_filter, attention),
        *(reduce, softmax, unary, binary, gather, scatter),
        *(copy_dtod, fill, copy_strided, cast, broadcast_binary, pool2d),
        *(batch_norm, layer_norm, rms_norm, lrn),
    )
}
