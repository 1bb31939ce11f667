"""Argument validation shared by every backend, written once.

Each ``*_problem`` function takes the raw arguments of one operation plus the
backend's :class:`~computehal.memory.PointerTable`, checks every value (types,
ranges, shape consistency, the byte range of every operand) and returns a frozen
problem record holding normalised values and resolved :class:`Region` objects.
Nothing here touches operand memory; a backend computes only from a problem record,
so it never sees an unchecked argument.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import InvalidArgumentError, UnsupportedError
from .memory import PointerTable, Region, as_count, as_pointer
from .types import (
    BackendTranspose,
    BinaryOp,
    MixedPrecision,
    ReduceOp,
    UnaryOp,
    coerce_enum,
)

__all__ = [
    "BLAS_INT_MAX",
    "GemmProblem",
    "BatchedGemmProblem",
    "ConvProblem",
    "AttentionProblem",
    "AxisProblem",
    "ElementwiseProblem",
    "RowsProblem",
    "as_dtype",
    "as_scalar",
    "gemm_problem",
    "batched_gemm_problem",
    "conv_problem",
    "attention_problem",
    "axis_problem",
    "unary_problem",
    "binary_problem",
    "gather_problem",
    "scatter_problem",
    "host_buffer",
]

#: BLAS (and cuBLAS) take dimensions and leading dimensions as 32-bit ints.
BLAS_INT_MAX = 2**31 - 1

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def as_dtype(value: object, argument: str = "dtype") -> np.dtype[Any]:
    """Normalise a GEMM dtype: ``"float32"`` / ``"float64"`` or the NumPy dtypes."""
    try:
        dtype: np.dtype[Any] = np.dtype(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{argument} must be 'float32' or 'float64', got {value!r}") from None
    if dtype not in (F32, F64):
        raise UnsupportedError(f"{argument} {dtype} (gemm supports float32 and float64)")
    return dtype


def as_scalar(name: str, value: object) -> float:
    """Return a real scalar argument as ``float`` (NaN and inf are allowed)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name} must be a real number, got {type(value).__name__}")
    try:
        return float(value)
    except (OverflowError, ValueError):
        raise InvalidArgumentError(f"{name} = {value!r} does not fit a float64") from None


def _blas_dim(name: str, value: object) -> int:
    count = as_count(name, value)
    if count > BLAS_INT_MAX:
        raise InvalidArgumentError(f"{name} = {count} exceeds the 32-bit BLAS limit {BLAS_INT_MAX}")
    return count


def matrix_bytes(rows: int, cols: int, ld: int, itemsize: int) -> int:
    """Bytes spanned by a column-major ``rows x cols`` matrix with leading dimension ``ld``."""
    if rows == 0 or cols == 0:
        return 0
    return (ld * (cols - 1) + rows) * itemsize


# --------------------------------------------------------------------------- GEMM


@dataclass(frozen=True)
class GemmProblem:
    """A validated GEMM: ``C = alpha * op(A) @ op(B) + beta * C``, column-major.

    ``a`` and ``b`` span zero bytes when the product is skipped (``k == 0`` or
    ``alpha == 0``), and ``c`` spans zero bytes when ``m == 0`` or ``n == 0``.
    """

    trans_a: bool
    trans_b: bool
    m: int
    n: int
    k: int
    alpha: float
    a: Region
    lda: int
    b: Region
    ldb: int
    beta: float
    c: Region
    ldc: int
    dtype: np.dtype[Any]

    @property
    def empty(self) -> bool:
        """True when C has no elements: nothing to do at all."""
        return self.m == 0 or self.n == 0

    @property
    def product_skipped(self) -> bool:
        """True when A and B are not read and ``C = beta * C`` (BLAS quick return)."""
        return self.k == 0 or self.alpha == 0.0

    @property
    def a_shape(self) -> tuple[int, int]:
        """(rows, cols) of A as stored."""
        return (self.k, self.m) if self.trans_a else (self.m, self.k)

    @property
    def b_shape(self) -> tuple[int, int]:
        """(rows, cols) of B as stored."""
        return (self.n, self.k) if self.trans_b else (self.k, self.n)


def _gemm_common(
    table: PointerTable,
    trans_a: object,
    trans_b: object,
    m: object,
    n: object,
    k: object,
    alpha: object,
    lda: object,
    ldb: object,
    beta: object,
    ldc: object,
    a_ptr: object,
    b_ptr: object,
    c_ptr: object,
) -> tuple[bool, bool, int, int, int, float, float, int, int, int]:
    ta = coerce_enum(BackendTranspose, trans_a, "trans_a").is_transposed
    tb = coerce_enum(BackendTranspose, trans_b, "trans_b").is_transposed
    mm, nn, kk = _blas_dim("m", m), _blas_dim("n", n), _blas_dim("k", k)
    al, be = as_scalar("alpha", alpha), as_scalar("beta", beta)
    a_rows = kk if ta else mm
    b_rows = nn if tb else kk
    ilda, ildb, ildc = _blas_dim("lda", lda), _blas_dim("ldb", ldb), _blas_dim("ldc", ldc)
    if ilda < max(1, a_rows):
        raise InvalidArgumentError(f"lda = {ilda} must be >= max(1, {a_rows}) (rows of A)")
    if ildb < max(1, b_rows):
        raise InvalidArgumentError(f"ldb = {ildb} must be >= max(1, {b_rows}) (rows of B)")
    if ildc < max(1, mm):
        raise InvalidArgumentError(f"ldc = {ildc} must be >= max(1, m = {mm})")
    for name, ptr in (("a_ptr", a_ptr), ("b_ptr", b_ptr), ("c_ptr", c_ptr)):
        as_pointer(name, ptr)
    return ta, tb, mm, nn, kk, al, be, ilda, ildb, ildc


def gemm_problem(
    table: PointerTable,
    trans_a: object,
    trans_b: object,
    m: object,
    n: object,
    k: object,
    alpha: object,
    a_ptr: object,
    lda: object,
    b_ptr: object,
    ldb: object,
    beta: object,
    c_ptr: object,
    ldc: object,
    dtype: object = F64,
) -> GemmProblem:
    """Validate the arguments of ``gemm`` (and of mixed-precision GEMM, with float32)."""
    dt = as_dtype(dtype)
    ta, tb, mm, nn, kk, al, be, ilda, ildb, ildc = _gemm_common(
        table, trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc, a_ptr, b_ptr, c_ptr
    )
    size = dt.itemsize
    empty = mm == 0 or nn == 0
    reads = not empty and kk != 0 and al != 0.0
    a_rows, a_cols = (kk, mm) if ta else (mm, kk)
    b_rows, b_cols = (nn, kk) if tb else (kk, nn)
    a = table.resolve("a_ptr", a_ptr, matrix_bytes(a_rows, a_cols, ilda, size) if reads else 0, align=size)
    b = table.resolve("b_ptr", b_ptr, matrix_bytes(b_rows, b_cols, ildb, size) if reads else 0, align=size)
    c = table.resolve("c_ptr", c_ptr, matrix_bytes(mm, nn, ildc, size), align=size)
    return GemmProblem(ta, tb, mm, nn, kk, al, a, ilda, b, ildb, be, c, ildc, dt)


@dataclass(frozen=True)
class BatchedGemmProblem:
    """A validated strided batched GEMM; ``gemm`` describes batch 0.

    Batch ``i`` reads A at ``gemm.a.ptr + i * stride_a * itemsize`` (likewise B, C).
    ``a``, ``b`` and ``c`` are the regions spanned by all batches together.
    """

    gemm: GemmProblem
    stride_a: int
    stride_b: int
    stride_c: int
    batch_count: int
    a: Region
    b: Region
    c: Region

    @property
    def empty(self) -> bool:
        """True when there is nothing to compute."""
        return self.batch_count == 0 or self.gemm.empty


def batched_gemm_problem(
    table: PointerTable,
    trans_a: object,
    trans_b: object,
    m: object,
    n: object,
    k: object,
    alpha: object,
    a_ptr: object,
    lda: object,
    stride_a: object,
    b_ptr: object,
    ldb: object,
    stride_b: object,
    beta: object,
    c_ptr: object,
    ldc: object,
    stride_c: object,
    batch_count: object,
    dtype: object = F32,
) -> BatchedGemmProblem:
    """Validate the arguments of ``batched_gemm``.

    Besides the GEMM checks, the strides must keep every batch inside its
    allocation, and the C matrices of different batches must not overlap (their
    results would depend on execution order).
    """
    dt = as_dtype(dtype)
    ta, tb, mm, nn, kk, al, be, ilda, ildb, ildc = _gemm_common(
        table, trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc, a_ptr, b_ptr, c_ptr
    )
    sa, sb, sc = (
        as_count("stride_a", stride_a),
        as_count("stride_b", stride_b),
        as_count("stride_c", stride_c),
    )
    count = as_count("batch_count", batch_count)
    size = dt.itemsize
    empty = mm == 0 or nn == 0 or count == 0
    reads = not empty and kk != 0 and al != 0.0
    a_rows, a_cols = (kk, mm) if ta else (mm, kk)
    b_rows, b_cols = (nn, kk) if tb else (kk, nn)
    c_elems = matrix_bytes(mm, nn, ildc, 1)
    if count > 1 and c_elems and sc < c_elems:
        raise InvalidArgumentError(
            f"stride_c = {sc} is smaller than one C matrix ({c_elems} elements with ldc = "
            f"{ildc}); the batches' outputs would overlap"
        )

    def span(name: str, ptr: object, one: int, stride: int) -> Region:
        if empty or one == 0:
            return table.resolve(name, ptr, 0, align=size)
        return table.resolve(name, ptr, (stride * (count - 1)) * size + one, align=size)

    a = span("a_ptr", a_ptr, matrix_bytes(a_rows, a_cols, ilda, size) if reads else 0, sa)
    b = span("b_ptr", b_ptr, matrix_bytes(b_rows, b_cols, ildb, size) if reads else 0, sb)
    c = span("c_ptr", c_ptr, c_elems * size, sc)
    first = GemmProblem(
        ta,
        tb,
        mm,
        nn,
        kk,
        al,
        Region(a.allocation, a.offset, matrix_bytes(a_rows, a_cols, ilda, size) if reads else 0),
        ilda,
        Region(b.allocation, b.offset, matrix_bytes(b_rows, b_cols, ildb, size) if reads else 0),
        ildb,
        be,
        Region(c.allocation, c.offset, 0 if empty else c_elems * size),
        ildc,
        dt,
    )
    return BatchedGemmProblem(first, sa, sb, sc, count, a, b, c)


def mixed_precision_format(prec: object) -> MixedPrecision:
    """Coerce the ``prec`` argument of mixed-precision GEMM."""
    return coerce_enum(MixedPrecision, prec, "prec")


# --------------------------------------------------------------------------- conv2d


def _shape(name: str, value: object, length: int) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise InvalidArgumentError(
            f"{name} must be a sequence of {length} integers, got {type(value).__name__}"
        )
    items = list(value)
    if len(items) != length:
        raise InvalidArgumentError(f"{name} must have {length} entries, got {len(items)}")
    return tuple(as_count(f"{name}[{i}]", v) for i, v in enumerate(items))


@dataclass(frozen=True)
class ConvProblem:
    """A validated 2-D convolution (NCHW input, KCHW filter, NKHW output, float32).

    The same record describes the forward pass and both gradients; ``x``, ``w``
    and ``y`` are the regions of the input (or its gradient), the filter (or its
    gradient) and the output (or its gradient).
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

    @property
    def empty_output(self) -> bool:
        """True when the forward output has no elements."""
        return self.n * self.k * self.oh * self.ow == 0


def conv_problem(
    table: PointerTable,
    x_arg: tuple[str, object, object],
    f_arg: tuple[str, object, object],
    y_arg: tuple[str, object, object],
    stride: object,
    padding: object,
) -> ConvProblem:
    """Validate a conv2d call given (name, pointer, shape) of input, filter and output.

    Names are those of the calling method (``grad_input_ptr`` ...), so messages
    point at the argument the caller actually passed.
    """
    x_name, x_ptr, x_shape = x_arg
    f_name, f_ptr, f_shape = f_arg
    y_name, y_ptr, y_shape = y_arg
    n, c, h, w = _shape(x_name.replace("_ptr", "_shape"), x_shape, 4)
    k, fc, fh, fw = _shape(f_name.replace("_ptr", "_shape"), f_shape, 4)
    yn, yk, oh, ow = _shape(y_name.replace("_ptr", "_shape"), y_shape, 4)
    sh, sw = _shape("stride", stride, 2)
    ph, pw = _shape("padding", padding, 2)
    if sh < 1 or sw < 1:
        raise InvalidArgumentError(f"stride must be >= 1, got [{sh}, {sw}]")
    if fh < 1 or fw < 1:
        raise InvalidArgumentError(f"filter height and width must be >= 1, got [{fh}, {fw}]")
    if fc != c:
        raise InvalidArgumentError(f"filter has {fc} channels but the input has {c}")
    if yn != n:
        raise InvalidArgumentError(f"output batch {yn} does not match input batch {n}")
    if yk != k:
        raise InvalidArgumentError(f"output has {yk} channels but the filter has K = {k}")
    if max(sh, sw, h + 2 * ph, w + 2 * pw) > BLAS_INT_MAX:
        # Kernels index images with 32-bit integers (wgpu packs every parameter as u32):
        # larger values would wrap and silently read the wrong pixels.
        raise InvalidArgumentError(
            f"stride [{sh}, {sw}] and padded input {h + 2 * ph}x{w + 2 * pw} must not exceed "
            f"{BLAS_INT_MAX} (32-bit kernel indices)"
        )
    if h + 2 * ph < fh or w + 2 * pw < fw:
        raise InvalidArgumentError(
            f"padded input {h + 2 * ph}x{w + 2 * pw} is smaller than the filter {fh}x{fw}"
        )
    eoh = (h + 2 * ph - fh) // sh + 1
    eow = (w + 2 * pw - fw) // sw + 1
    if (oh, ow) != (eoh, eow):
        raise InvalidArgumentError(
            f"output spatial shape {oh}x{ow} does not match the convolution: expected "
            f"{eoh}x{eow} = (H + 2*ph - Fh) // sh + 1, (W + 2*pw - Fw) // sw + 1"
        )
    x = table.resolve(x_name, x_ptr, n * c * h * w * 4, align=4)
    f = table.resolve(f_name, f_ptr, k * c * fh * fw * 4, align=4)
    y = table.resolve(y_name, y_ptr, n * k * oh * ow * 4, align=4)
    return ConvProblem(n, c, h, w, k, fh, fw, oh, ow, sh, sw, ph, pw, x, f, y)


# --------------------------------------------------------------------------- attention


@dataclass(frozen=True)
class AttentionProblem:
    """A validated attention call; Q, O are [B, H, Sq, D] and K, V are [B, H, Skv, D]."""

    batch: int
    heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    scale: float
    causal: bool
    q: Region
    k: Region
    v: Region
    o: Region

    @property
    def causal_offset(self) -> int:
        """Query ``i`` may see key ``j`` iff ``j <= i + causal_offset`` (bottom-right aligned)."""
        return self.seq_kv - self.seq_q


def attention_problem(
    table: PointerTable,
    q_ptr: object,
    k_ptr: object,
    v_ptr: object,
    o_ptr: object,
    batch: object,
    heads: object,
    seq_q: object,
    seq_kv: object,
    head_dim: object,
    scale: object,
    causal: object,
) -> AttentionProblem:
    """Validate the arguments of ``attention``."""
    dims = {}
    for name, value in (
        ("batch", batch),
        ("heads", heads),
        ("seq_q", seq_q),
        ("seq_kv", seq_kv),
        ("head_dim", head_dim),
    ):
        dims[name] = as_count(name, value)
        if dims[name] < 1:
            raise InvalidArgumentError(f"{name} must be >= 1, got {dims[name]}")
    sc = as_scalar("scale", scale)
    if not math.isfinite(sc):
        raise InvalidArgumentError(f"scale must be finite, got {sc}")
    if not isinstance(causal, (bool, np.bool_)):
        raise InvalidArgumentError(f"causal must be a bool, got {type(causal).__name__}")
    bh = dims["batch"] * dims["heads"] * dims["head_dim"] * 4
    q = table.resolve("q_ptr", q_ptr, bh * dims["seq_q"], align=4)
    k = table.resolve("k_ptr", k_ptr, bh * dims["seq_kv"], align=4)
    v = table.resolve("v_ptr", v_ptr, bh * dims["seq_kv"], align=4)
    o = table.resolve("o_ptr", o_ptr, bh * dims["seq_q"], align=4)
    return AttentionProblem(
        dims["batch"],
        dims["heads"],
        dims["seq_q"],
        dims["seq_kv"],
        dims["head_dim"],
        sc,
        bool(causal),
        q,
        k,
        v,
        o,
    )


# --------------------------------------------------------------------------- reduce / softmax


@dataclass(frozen=True)
class AxisProblem:
    """A validated reduce or softmax over ``axis`` of a row-major float32 tensor.

    The tensor is viewed as ``[outer, length, inner]`` with ``length`` the size of
    ``axis``. ``op`` is the reduction (``None`` for softmax).
    """

    shape: tuple[int, ...]
    axis: int
    outer: int
    length: int
    inner: int
    input: Region
    output: Region
    op: ReduceOp | None


def axis_problem(
    table: PointerTable,
    op: object,
    input_ptr: object,
    output_ptr: object,
    shape: object,
    axis: object,
) -> AxisProblem:
    """Validate ``reduce`` (``op`` given) or ``softmax`` (``op`` is ``None``)."""
    reduce_op = None if op is None else coerce_enum(ReduceOp, op, "op")
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (Sequence, np.ndarray)):
        raise InvalidArgumentError(f"shape must be a sequence of integers, got {type(shape).__name__}")
    dims = tuple(as_count(f"shape[{i}]", v) for i, v in enumerate(list(shape)))
    if not dims:
        raise InvalidArgumentError("shape must have at least one dimension")
    ax = as_count("axis", axis)
    if ax >= len(dims):
        raise InvalidArgumentError(f"axis {ax} is out of range for a {len(dims)}-d shape {list(dims)}")
    outer = math.prod(dims[:ax])
    inner = math.prod(dims[ax + 1 :])
    length = dims[ax]
    in_bytes = outer * length * inner * 4
    out_bytes = outer * inner * 4 if reduce_op is not None else in_bytes
    src = table.resolve("input_ptr", input_ptr, in_bytes, align=4)
    dst = table.resolve("output_ptr", output_ptr, out_bytes, align=4)
    return AxisProblem(dims, ax, outer, length, inner, src, dst, reduce_op)


# --------------------------------------------------------------------------- element-wise


@dataclass(frozen=True)
class ElementwiseProblem:
    """A validated unary (``b`` is ``None``) or binary op over ``n`` float32 elements."""

    op: UnaryOp | BinaryOp
    n: int
    a: Region
    b: Region | None
    out: Region


def unary_problem(
    table: PointerTable, op: object, input_ptr: object, output_ptr: object, n: object
) -> ElementwiseProblem:
    """Validate the arguments of ``unary``."""
    uop = coerce_enum(UnaryOp, op, "op")
    count = as_count("n", n)
    a = table.resolve("input_ptr", input_ptr, count * 4, align=4)
    out = table.resolve("output_ptr", output_ptr, count * 4, align=4)
    return ElementwiseProblem(uop, count, a, None, out)


def binary_problem(
    table: PointerTable, op: object, a_ptr: object, b_ptr: object, output_ptr: object, n: object
) -> ElementwiseProblem:
    """Validate the arguments of ``binary``."""
    bop = coerce_enum(BinaryOp, op, "op")
    count = as_count("n", n)
    a = table.resolve("a_ptr", a_ptr, count * 4, align=4)
    b = table.resolve("b_ptr", b_ptr, count * 4, align=4)
    out = table.resolve("output_ptr", output_ptr, count * 4, align=4)
    return ElementwiseProblem(bop, count, a, b, out)


# --------------------------------------------------------------------------- gather / scatter


@dataclass(frozen=True)
class RowsProblem:
    """A validated gather or scatter of float32 rows of ``cols`` elements.

    ``indices`` is a read-only int64 array, every entry in ``[0, rows)``.
    """

    indices: npt.NDArray[np.int64]
    rows: int
    cols: int
    input: Region
    output: Region


def _indices(value: object, rows: int) -> npt.NDArray[np.int64]:
    if isinstance(value, (str, bytes)):
        raise InvalidArgumentError("indices must be a sequence of integers, got a string")
    if isinstance(value, np.ndarray):
        arr = value
    else:
        if not isinstance(value, (Sequence, range)):
            raise InvalidArgumentError(
                f"indices must be a sequence of integers or an integer array, got {type(value).__name__}"
            )
        items = list(value)
        if not items:
            return np.zeros(0, dtype=np.int64)
        for i, item in enumerate(items):
            if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
                raise InvalidArgumentError(f"indices[{i}] must be an integer, got {type(item).__name__}")
        try:
            arr = np.array(items, dtype=np.int64)
        except OverflowError:
            raise InvalidArgumentError("an index does not fit in 64 bits") from None
    if arr.ndim != 1:
        raise InvalidArgumentError(f"indices must be one-dimensional, got {arr.ndim} dimensions")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise InvalidArgumentError(f"indices must have an integer dtype, got {arr.dtype}")
    low, high = int(arr.min()), int(arr.max())
    if low < 0:
        raise InvalidArgumentError(f"index {low} is negative")
    if high >= rows:
        raise InvalidArgumentError(f"index {high} is out of range for {rows} rows")
    out = np.array(arr, dtype=np.int64, copy=True)
    out.setflags(write=False)
    return out


def gather_problem(
    table: PointerTable,
    input_ptr: object,
    indices: object,
    output_ptr: object,
    rows: object,
    cols: object,
) -> RowsProblem:
    """Validate ``gather``: input is ``rows x cols``, output ``len(indices) x cols``."""
    r, c = as_count("rows", rows), as_count("cols", cols)
    idx = _indices(indices, r)
    src = table.resolve("input_ptr", input_ptr, r * c * 4, align=4)
    dst = table.resolve("output_ptr", output_ptr, idx.size * c * 4, align=4)
    return RowsProblem(idx, r, c, src, dst)


def scatter_problem(
    table: PointerTable,
    input_ptr: object,
    indices: object,
    output_ptr: object,
    rows: object,
    cols: object,
) -> RowsProblem:
    """Validate ``scatter``: input is ``len(indices) x cols``, output ``rows x cols``."""
    r, c = as_count("rows", rows), as_count("cols", cols)
    idx = _indices(indices, r)
    src = table.resolve("input_ptr", input_ptr, idx.size * c * 4, align=4)
    dst = table.resolve("output_ptr", output_ptr, r * c * 4, align=4)
    return RowsProblem(idx, r, c, src, dst)


def last_occurrences(indices: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """For scatter: the distinct destination rows and, for each, the last source row naming it."""
    reversed_idx = indices[::-1]
    unique, first_in_reversed = np.unique(reversed_idx, return_index=True)
    return unique, (indices.size - 1 - first_in_reversed).astype(np.int64)


# --------------------------------------------------------------------------- host buffers


def host_buffer(name: str, obj: object, writable: bool) -> memoryview:
    """Return a flat byte view of a C-contiguous host buffer-protocol object."""
    try:
        view = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(
            f"{name} must support the buffer protocol (bytes, bytearray, memoryview, ndarray), "
            f"got {type(obj).__name__}"
        ) from None
    if not view.c_contiguous:
        raise InvalidArgumentError(f"{name} must be C-contiguous")
    if writable and view.readonly:
        raise InvalidArgumentError(f"{name} must be writable")
    try:
        return view.cast("B")
    except TypeError:
        # Formats memoryview cannot cast (e.g. NumPy structured dtypes): reinterpret the
        # same memory as bytes through NumPy, which understands every buffer format.
        flat: memoryview = np.asarray(view).reshape(-1).view(np.uint8).data
        return flat
