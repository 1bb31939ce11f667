"""The :class:`ComputeBackend` interface and the :class:`ForwardingBackend` wrapper.

This module carries the contract's documentation; backends are thin subclasses.
Method names and positional parameter order are exactly those of the original
``ComputeBackend`` trait; computehal's extensions are keyword-only.

Conventions shared by every method
----------------------------------
* Pointers are plain ``int`` addresses returned by :meth:`ComputeBackend.alloc`, or
  interior pointers ``base + byte_offset`` into such an allocation. 0 is never valid.
  Pointers to typed operands must be aligned to the element size (4 bytes for
  float32, 8 for float64), as on every GPU runtime and BLAS.
* Before touching memory every method checks each operand's byte range against the
  backend's live allocations and raises :class:`~computehal.InvalidArgumentError`
  naming the argument on any violation.
* ``gemm``, ``batched_gemm`` and ``gemm_mixed_precision`` are column-major with
  leading dimensions (BLAS); every other operation is contiguous row-major float32.
* Only :class:`~computehal.BackendError` subclasses escape, whatever the arguments.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import InvalidArgumentError, UnsupportedError
from .memory import as_count, as_pointer
from .types import (
    BackendTranspose,
    BinaryOp,
    Capabilities,
    DeviceInfo,
    MixedPrecision,
    ReduceOp,
    TileShape,
    UnaryOp,
    default_tile_for,
)
from .validation import as_dtype

__all__ = ["COMPUTE_OPS", "ComputeBackend", "ForwardingBackend", "Indices", "Shape"]

#: The compute operations of the trait, in the order of its documentation.
COMPUTE_OPS: tuple[str, ...] = (
    "gemm",
    "batched_gemm",
    "gemm_mixed_precision",
    "conv2d_forward",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "attention",
    "reduce",
    "softmax",
    "unary",
    "binary",
    "gather",
    "scatter",
)

#: A shape or stride/padding list: any sequence of non-negative ints.
Shape = Sequence[int]
#: Row indices for gather / scatter: a sequence of ints or an integer NumPy array.
Indices = Sequence[int] | npt.NDArray[np.integer[Any]]
Transpose = BackendTranspose | str


class ComputeBackend(abc.ABC):
    """Abstract compute backend: explicit memory plus BLAS/cuDNN-shaped operations.

    Lifecycle: construct, :meth:`init`, :meth:`alloc`, :meth:`copy_htod`, run
    operations, :meth:`copy_dtoh`, :meth:`free`. Backends are context managers:
    ``with CpuBackend() as be:`` initialises the backend and, on exit, frees every
    allocation that is still live (see :meth:`close`).

    Subclasses implement the 14 abstract methods; the 10 provided methods have the
    defaults of the original trait (a conservative CPU capability profile, no
    devices, the default tile heuristic, ``UnsupportedError`` for the optional
    operations, and a ``batched_gemm`` that loops :meth:`gemm`).
    """

    # ------------------------------------------------------------------ lifecycle

    @abc.abstractmethod
    def name(self) -> str:
        """Backend name, e.g. ``"cpu"``, ``"opencl"``, ``"cuda"``."""

    @abc.abstractmethod
    def init(self) -> None:
        """Initialise the backend (select the device, create a context).

        Must be called before any other operation except :meth:`name`,
        :meth:`is_initialized`, :meth:`capabilities` and :meth:`available_devices`,
        which raise :class:`~computehal.NotInitializedError` until then. Calling it
        again is a no-op.

        Raises
        ------
        DeviceError
            If the device cannot be opened.
        """

    @abc.abstractmethod
    def is_initialized(self) -> bool:
        """True once :meth:`init` has succeeded."""

    def close(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release what the backend still holds (live allocations, contexts).

        Called on leaving a ``with`` block. The default does nothing.
        """

    def __enter__(self) -> ComputeBackend:
        self.init()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "initialized" if self.is_initialized() else "not initialized"
        return f"<{type(self).__name__} {self.name()!r} ({state})>"

    # ------------------------------------------------------------------ memory

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block until all previously submitted work on this backend has finished."""

    @abc.abstractmethod
    def alloc(self, bytes: int) -> int:
        """Allocate ``bytes`` bytes of device memory, aligned to at least 64 bytes.

        Parameters
        ----------
        bytes : int
            Size in bytes, >= 1.

        Returns
        -------
        int
            The pointer; release it with :meth:`free`.

        Raises
        ------
        InvalidArgumentError
            If ``bytes`` is not a positive integer.
        OutOfMemoryError
            If the device cannot satisfy the request.
        """

    @abc.abstractmethod
    def free(self, ptr: int) -> None:
        """Free an allocation made by :meth:`alloc`.

        Raises
        ------
        InvalidArgumentError
            If ``ptr`` is not the base of a live allocation (unknown, interior, or
            already freed: a double free is an error).
        """

    @abc.abstractmethod
    def copy_htod(self, dst: int, src: Any) -> None:
        """Copy host bytes to device memory.

        Parameters
        ----------
        dst : int
            Device pointer; ``len(src)`` bytes from here must be allocated.
        src : buffer
            Any C-contiguous buffer-protocol object (bytes, bytearray, memoryview,
            NumPy array). Its bytes are copied exactly.
        """

    @abc.abstractmethod
    def copy_dtoh(self, dst: Any, src: int) -> None:
        """Copy device bytes to host memory.

        Parameters
        ----------
        dst : writable buffer
            Any writable C-contiguous buffer; it is filled completely.
        src : int
            Device pointer; ``nbytes(dst)`` bytes from here must be allocated.
        """

    # ------------------------------------------------------------------ GEMM

    @abc.abstractmethod
    def gemm(
        self,
        trans_a: Transpose,
        trans_b: Transpose,
        m: int,
        n: int,
        k: int,
        alpha: float,
        a_ptr: int,
        lda: int,
        b_ptr: int,
        ldb: int,
        beta: float,
        c_ptr: int,
        ldc: int,
        *,
        dtype: Any = "float64",
    ) -> None:
        """General matrix multiply ``C = alpha * op(A) @ op(B) + beta * C``, column-major.

        Parameters
        ----------
        trans_a, trans_b : BackendTranspose or {"N", "T", "C"}
            How A and B are read; for real data ``"C"`` equals ``"T"``.
        m, n, k : int
            C is m x n, op(A) is m x k, op(B) is k x n.
        alpha, beta : float
            Scaling factors.
        a_ptr, b_ptr, c_ptr : int
            Column-major matrices of ``dtype``.
        lda, ldb, ldc : int
            Leading dimensions: ``lda >= max(1, rows of A as stored)``, likewise ``ldb``,
            and ``ldc >= max(1, m)``.
        dtype : {"float64", "float32"}, keyword-only
            Element type of A, B, C (default float64, as in the original).

        Notes
        -----
        Reference-BLAS semantics: leading dimensions are checked first; ``m == 0`` or
        ``n == 0`` returns at once; with ``beta == 0`` C is write-only (NaN already in
        C does not survive); with ``k == 0`` or ``alpha == 0`` A and B are not read
        and ``C = beta * C``. Rows of C between ``m`` and ``ldc`` are untouched.

        Raises
        ------
        InvalidArgumentError
            Bad dimensions, leading dimensions or operand ranges.
        UnsupportedError
            If the backend has no such dtype (e.g. float64 on WGSL).
        """

    def batched_gemm(
        self,
        trans_a: Transpose,
        trans_b: Transpose,
        m: int,
        n: int,
        k: int,
        alpha: float,
        a_ptr: int,
        lda: int,
        stride_a: int,
        b_ptr: int,
        ldb: int,
        stride_b: int,
        beta: float,
        c_ptr: int,
        ldc: int,
        stride_c: int,
        batch_count: int,
        *,
        dtype: Any = "float32",
    ) -> None:
        """Strided batched GEMM: ``C_i = alpha * op(A_i) @ op(B_i) + beta * C_i``.

        Batch ``i`` reads A at ``a_ptr + i * stride_a * itemsize`` bytes (likewise B
        and C), with strides in elements of ``dtype`` (default float32, as the
        original documents). The C matrices of different batches must not overlap.

        The default implementation calls :meth:`gemm` once per batch; backends
        override it with a single batched call.
        """
        dt = as_dtype(dtype)
        counts = {
            name: as_count(name, value)
            for name, value in (
                ("stride_a", stride_a),
                ("stride_b", stride_b),
                ("stride_c", stride_c),
                ("batch_count", batch_count),
                ("m", m),
                ("n", n),
                ("ldc", ldc),
            )
        }
        pa, pb, pc = (as_pointer(p, v) for p, v in (("a_ptr", a_ptr), ("b_ptr", b_ptr), ("c_ptr", c_ptr)))
        c_span = counts["ldc"] * (counts["n"] - 1) + counts["m"] if counts["m"] and counts["n"] else 0
        if counts["batch_count"] > 1 and c_span and counts["stride_c"] < c_span:
            raise InvalidArgumentError(
                f"stride_c = {counts['stride_c']} is smaller than one C matrix; outputs would overlap"
            )
        size = dt.itemsize
        for i in range(counts["batch_count"]):
            self.gemm(
                trans_a,
                trans_b,
                m,
                n,
                k,
                alpha,
                pa + i * counts["stride_a"] * size,
                lda,
                pb + i * counts["stride_b"] * size,
                ldb,
                beta,
                pc + i * counts["stride_c"] * size,
                ldc,
                dtype=dt,
            )

    def gemm_mixed_precision(
        self,
        prec: MixedPrecision | str,
        trans_a: Transpose,
        trans_b: Transpose,
        m: int,
        n: int,
        k: int,
        alpha: float,
        a_ptr: int,
        lda: int,
        b_ptr: int,
        ldb: int,
        beta: float,
        c_ptr: int,
        ldc: int,
    ) -> None:
        """Mixed-precision GEMM: 16-bit operands, float32 accumulation, column-major.

        A and B are float32 buffers; each element is rounded to ``prec`` (f16 or
        bf16, round-to-nearest-even) before use. Products accumulate in float32;
        alpha, beta and C are float32. Same BLAS semantics as :meth:`gemm`.

        The default raises :class:`~computehal.UnsupportedError`.
        """
        raise UnsupportedError(f"gemm_mixed_precision is not implemented by the {self.name()} backend")

    # ------------------------------------------------------------------ convolution

    @abc.abstractmethod
    def conv2d_forward(
        self,
        input_ptr: int,
        input_shape: Shape,
        filter_ptr: int,
        filter_shape: Shape,
        output_ptr: int,
        output_shape: Shape,
        stride: Shape,
        padding: Shape,
    ) -> None:
        """2-D convolution (cross-correlation, no filter flip), float32, overwrites the output.

        Parameters
        ----------
        input_ptr, input_shape : int, [N, C, H, W]
            NCHW input.
        filter_ptr, filter_shape : int, [K, C, Fh, Fw]
            KCHW filter.
        output_ptr, output_shape : int, [N, K, Oh, Ow]
            Output, with ``Oh = (H + 2*ph - Fh) // sh + 1`` (same for W).
        stride : [sh, sw]
            >= 1.
        padding : [ph, pw]
            Zero padding, >= 0.

        Raises
        ------
        InvalidArgumentError
            Shape lists of the wrong length, disagreeing channels / batch / K, an
            output shape that differs from the formula, stride < 1, a padded input
            smaller than the filter, or operand ranges outside their allocations.
        """

    def conv2d_backward_data(
        self,
        grad_output_ptr: int,
        grad_output_shape: Shape,
        filter_ptr: int,
        filter_shape: Shape,
        grad_input_ptr: int,
        grad_input_shape: Shape,
        stride: Shape,
        padding: Shape,
    ) -> None:
        """Gradient of :meth:`conv2d_forward` with respect to its input; overwrites grad_input.

        ``grad_output`` is [N, K, Oh, Ow], the filter [K, C, Fh, Fw], ``grad_input``
        [N, C, H, W]; stride and padding are the forward pass's. Input positions the
        forward pass never reads get zero gradient. The default raises
        :class:`~computehal.UnsupportedError`.
        """
        raise UnsupportedError(f"conv2d_backward_data is not implemented by the {self.name()} backend")

    def conv2d_backward_filter(
        self,
        input_ptr: int,
        input_shape: Shape,
        grad_output_ptr: int,
        grad_output_shape: Shape,
        grad_filter_ptr: int,
        grad_filter_shape: Shape,
        stride: Shape,
        padding: Shape,
    ) -> None:
        """Gradient of :meth:`conv2d_forward` with respect to the filter; overwrites grad_filter.

        ``input`` is [N, C, H, W], ``grad_output`` [N, K, Oh, Ow], ``grad_filter``
        [K, C, Fh, Fw]. The default raises :class:`~computehal.UnsupportedError`.
        """
        raise UnsupportedError(f"conv2d_backward_filter is not implemented by the {self.name()} backend")

    # ------------------------------------------------------------------ attention

    @abc.abstractmethod
    def attention(
        self,
        q_ptr: int,
        k_ptr: int,
        v_ptr: int,
        o_ptr: int,
        batch: int,
        heads: int,
        seq_q: int,
        seq_kv: int,
        head_dim: int,
        scale: float,
        causal: bool,
    ) -> None:
        """Scaled dot-product attention ``O = softmax(Q @ K^T * scale) @ V``, float32.

        Parameters
        ----------
        q_ptr, o_ptr : int
            [batch, heads, seq_q, head_dim], row-major.
        k_ptr, v_ptr : int
            [batch, heads, seq_kv, head_dim], row-major.
        batch, heads, seq_q, seq_kv, head_dim : int
            All >= 1.
        scale : float
            Finite; it *multiplies* the scores (typically ``1 / sqrt(head_dim)``).
        causal : bool
            Bottom-right aligned mask: query ``i`` sees key ``j`` iff
            ``j <= i + (seq_kv - seq_q)``. A query that sees no key gets a zero row.

        Notes
        -----
        Implementations tile over keys with an online softmax; memory stays linear
        in the sequence length.
        """

    # ------------------------------------------------------------------ reductions

    @abc.abstractmethod
    def reduce(
        self,
        op: ReduceOp | str,
        input_ptr: int,
        output_ptr: int,
        shape: Shape,
        axis: int,
    ) -> None:
        """Reduce a row-major float32 tensor of ``shape`` over ``axis``.

        The output's shape is ``shape`` without ``axis``. MAX / MIN ignore NaN (as
        ``numpy.fmax`` / ``fmin`` folds starting from -inf / +inf), so a slice with
        no non-NaN value gives -inf (MAX) or +inf (MIN); a zero-length axis gives 0
        for SUM and MEAN.

        Raises
        ------
        InvalidArgumentError
            An empty shape or ``axis >= len(shape)``.
        """

    def softmax(self, input_ptr: int, output_ptr: int, shape: Shape, axis: int) -> None:
        """Numerically stable softmax of a row-major float32 tensor along ``axis``.

        Each slice has its maximum (NaN ignored) subtracted before ``exp``; a slice
        of all -inf gives NaN, and a NaN in a slice makes that slice NaN. The
        default raises :class:`~computehal.UnsupportedError`.
        """
        raise UnsupportedError(f"softmax is not implemented by the {self.name()} backend")

    # ------------------------------------------------------------------ element-wise

    @abc.abstractmethod
    def unary(self, op: UnaryOp | str, input_ptr: int, output_ptr: int, n: int) -> None:
        """Apply ``op`` to ``n`` float32 elements; ``input_ptr`` may equal ``output_ptr``.

        RELU is ``max(x, 0)`` with NaN -> 0; LOG / SQRT of negatives give NaN.
        """

    @abc.abstractmethod
    def binary(self, op: BinaryOp | str, a_ptr: int, b_ptr: int, output_ptr: int, n: int) -> None:
        """``output[i] = op(a[i], b[i])`` for ``n`` float32 elements.

        MAX / MIN ignore NaN (like ``fmax`` / ``fmin``); DIV is IEEE division
        (x/0 -> +-inf, 0/0 -> NaN, no error). Operands may alias the output.
        """

    # ------------------------------------------------------------------ routing

    def gather(self, input_ptr: int, indices: Indices, output_ptr: int, rows: int, cols: int) -> None:
        """Row gather: ``output[i, :] = input[indices[i], :]``, float32.

        ``input`` is ``rows x cols``, ``output`` is ``len(indices) x cols``. Any index
        outside ``[0, rows)`` raises :class:`~computehal.InvalidArgumentError` before
        anything is written. The default raises :class:`~computehal.UnsupportedError`.
        """
        raise UnsupportedError(f"gather is not implemented by the {self.name()} backend")

    def scatter(self, input_ptr: int, indices: Indices, output_ptr: int, rows: int, cols: int) -> None:
        """Row scatter: ``output[indices[i], :] = input[i, :]``, float32.

        ``input`` is ``len(indices) x cols``, ``output`` is ``rows x cols``. Rows not
        named keep their values; with duplicate indices the last one wins. The
        default raises :class:`~computehal.UnsupportedError`.
        """
        raise UnsupportedError(f"scatter is not implemented by the {self.name()} backend")

    # ------------------------------------------------------------------ introspection

    def capabilities(self) -> Capabilities:
        """What the device can do; the default is the conservative CPU profile."""
        return Capabilities.cpu()

    def available_devices(self) -> list[DeviceInfo]:
        """The devices this backend exposes; the default is an empty list."""
        return []

    def recommended_tile_for(self, m: int, n: int, k: int) -> TileShape:
        """A GEMM tile for an m x n x k problem, from :func:`~computehal.default_tile_for`."""
        return default_tile_for(as_count("m", m), as_count("n", n), as_count("k", k), self.capabilities())


class ForwardingBackend(ComputeBackend):
    """Delegates every method to ``inner``: the base for tracing or profiling wrappers.

    Override the methods you want to observe and call ``super()`` to forward.
    """

    def __init__(self, inner: ComputeBackend) -> None:
        if not isinstance(inner, ComputeBackend):
            raise InvalidArgumentError(f"inner must be a ComputeBackend, got {type(inner).__name__}")
        self.inner = inner

    def name(self) -> str:
        return self.inner.name()

    def init(self) -> None:
        self.inner.init()

    def is_initialized(self) -> bool:
        return self.inner.is_initialized()

    def close(self) -> None:
        self.inner.close()

    def capabilities(self) -> Capabilities:
        return self.inner.capabilities()

    def available_devices(self) -> list[DeviceInfo]:
        return self.inner.available_devices()

    def recommended_tile_for(self, m: int, n: int, k: int) -> TileShape:
        return self.inner.recommended_tile_for(m, n, k)

    def synchronize(self) -> None:
        self.inner.synchronize()

    def alloc(self, bytes: int) -> int:
        return self.inner.alloc(bytes)

    def free(self, ptr: int) -> None:
        self.inner.free(ptr)

    def copy_htod(self, dst: int, src: Any) -> None:
        self.inner.copy_htod(dst, src)

    def copy_dtoh(self, dst: Any, src: int) -> None:
        self.inner.copy_dtoh(dst, src)

    def gemm(self, *args: Any, **kwargs: Any) -> None:
        self.inner.gemm(*args, **kwargs)

    def batched_gemm(self, *args: Any, **kwargs: Any) -> None:
        self.inner.batched_gemm(*args, **kwargs)

    def gemm_mixed_precision(self, *args: Any, **kwargs: Any) -> None:
        self.inner.gemm_mixed_precision(*args, **kwargs)

    def conv2d_forward(self, *args: Any, **kwargs: Any) -> None:
        self.inner.conv2d_forward(*args, **kwargs)

    def conv2d_backward_data(self, *args: Any, **kwargs: Any) -> None:
        self.inner.conv2d_backward_data(*args, **kwargs)

    def conv2d_backward_filter(self, *args: Any, **kwargs: Any) -> None:
        self.inner.conv2d_backward_filter(*args, **kwargs)

    def attention(self, *args: Any, **kwargs: Any) -> None:
        self.inner.attention(*args, **kwargs)

    def reduce(self, *args: Any, **kwargs: Any) -> None:
        self.inner.reduce(*args, **kwargs)

    def softmax(self, *args: Any, **kwargs: Any) -> None:
        self.inner.softmax(*args, **kwargs)

    def unary(self, *args: Any, **kwargs: Any) -> None:
        self.inner.unary(*args, **kwargs)

    def binary(self, *args: Any, **kwargs: Any) -> None:
        self.inner.binary(*args, **kwargs)

    def gather(self, *args: Any, **kwargs: Any) -> None:
        self.inner.gather(*args, **kwargs)

    def scatter(self, *args: Any, **kwargs: Any) -> None:
        self.inner.scatter(*args, **kwargs)

    def __getattr__(self, attribute: str) -> Any:
        # Extensions of the inner backend (live_allocations, ...) stay reachable.
        if attribute == "inner":
            raise AttributeError(attribute)
        return getattr(self.inner, attribute)
