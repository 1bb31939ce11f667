"""Argument validation shared by every backend, written once, one module per chapter.

Each validator takes the operation's :class:`~computehal.memory.Lease` followed by the
operation's own arguments, with the names and order of the
:class:`~computehal.ComputeBackend` method it validates (keyword-only ones by keyword).
It converts every argument to a plain value first, checks them all, resolves (and so
pins) every operand's byte range last, and returns a frozen problem record. Nothing
here touches operand memory; a backend computes only from a problem record, so it
never sees an unchecked argument.

:data:`VALIDATORS` maps each operation name to its validator; the shared dispatcher of
:class:`~computehal.backends._base.TableBackend` is generated from it and from the
signatures of :class:`~computehal.ComputeBackend`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._attention import AttentionProblem, attention, broadcast_strides
from ._axis import (
    AxisProblem,
    BatchNormProblem,
    LrnProblem,
    NormProblem,
    batch_norm,
    layer_norm,
    lrn,
    reduce,
    rms_norm,
    softmax,
)
from ._blas import BatchedGemmProblem, GemmProblem, batched_gemm, gemm, gemm_mixed_precision
from ._conv import (
    ConvDataProblem,
    ConvFilterProblem,
    ConvForwardProblem,
    ConvProblem,
    PoolProblem,
    conv2d_backward_data,
    conv2d_backward_filter,
    conv2d_forward,
    padding4,
    pool2d,
    pool_output_size,
)
from ._core import (
    BLAS_INT_MAX,
    INDEX_MAX,
    MAX_DIMS,
    Operand,
    Problem,
    Role,
    as_finite,
    as_flag,
    as_scalar,
    as_shape,
    float_dtype,
    matrix_bytes,
)
from ._elementwise import (
    BroadcastProblem,
    CastProblem,
    ElementwiseProblem,
    binary,
    broadcast_binary,
    broadcast_shape,
    cast,
    unary,
)
from ._host import host_buffer, snapshot_indices
from ._movement import (
    CopyProblem,
    FillProblem,
    GatherProblem,
    RowsProblem,
    ScatterProblem,
    StridedProblem,
    copy_dtod,
    copy_strided,
    fill,
    gather,
    last_occurrences,
    scatter,
)

__all__ = [
    "BLAS_INT_MAX",
    "INDEX_MAX",
    "MAX_DIMS",
    "VALIDATORS",
    "AttentionProblem",
    "AxisProblem",
    "BatchNormProblem",
    "BatchedGemmProblem",
    "BroadcastProblem",
    "CastProblem",
    "ConvDataProblem",
    "ConvFilterProblem",
    "ConvForwardProblem",
    "ConvProblem",
    "CopyProblem",
    "ElementwiseProblem",
    "FillProblem",
    "GatherProblem",
    "GemmProblem",
    "LrnProblem",
    "NormProblem",
    "Operand",
    "PoolProblem",
    "Problem",
    "Role",
    "RowsProblem",
    "ScatterProblem",
    "StridedProblem",
    "as_finite",
    "as_flag",
    "as_scalar",
    "as_shape",
    "broadcast_shape",
    "broadcast_strides",
    "float_dtype",
    "host_buffer",
    "last_occurrences",
    "matrix_bytes",
    "padding4",
    "pool_output_size",
    "snapshot_indices",
]

#: Operation name -> validator, for every operation that computes on operands.
VALIDATORS: dict[str, Callable[..., Any]] = {
    "gemm": gemm,
    "batched_gemm": batched_gemm,
    "gemm_mixed_precision": gemm_mixed_precision,
    "conv2d_forward": conv2d_forward,
    "conv2d_backward_data": conv2d_backward_data,
    "conv2d_backward_filter": conv2d_backward_filter,
    "attention": attention,
    "reduce": reduce,
    "softmax": softmax,
    "unary": unary,
    "binary": binary,
    "gather": gather,
    "scatter": scatter,
    "copy_dtod": copy_dtod,
    "fill": fill,
    "copy_strided": copy_strided,
    "cast": cast,
    "broadcast_binary": broadcast_binary,
    "pool2d": pool2d,
    "batch_norm": batch_norm,
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
    "lrn": lrn,
}
