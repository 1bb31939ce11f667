"""The :class:`ComputeBackend` interface and the :class:`ForwardingBackend` wrapper.

This module carries the contract's documentation; backends are thin subclasses, and
every class that only routes calls gets its methods generated from these signatures
(:mod:`computehal._generate`). Method names and positional parameter order of the
seed's 24 methods are exactly those of the original ``ComputeBackend`` trait;
computehal's extensions are keyword-only arguments and new methods, each marked
*Extension* below. The ABC's default for every extension method raises
:class:`~computehal.UnsupportedError` naming the operation, so a backend written
against the seed's 24 methods stays valid.

Conventions shared by every method
----------------------------------
* Pointers are plain ``int`` addresses returned by :meth:`ComputeBackend.alloc`, or
  interior pointers ``base + byte_offset`` into such an allocation. 0 is never valid.
  Pointers to typed operands must be aligned to the element size.
* Before touching memory every method converts its arguments to plain values (each
  ``__index__`` runs once), checks them, and checks each operand's byte range against
  the backend's live allocations; any violation raises
  :class:`~computehal.InvalidArgumentError` naming the argument. Host inputs (index
  lists, buffers) are copied first and only the copy is checked and used.
* An operation holds every operand's allocation until it no longer touches it:
  :meth:`~ComputeBackend.free` from another thread never releases memory under a
  running operation (the release is deferred to its end).
* ``gemm``, ``batched_gemm`` and ``gemm_mixed_precision`` are column-major with
  leading dimensions (BLAS); every other operation is contiguous row-major.
* Element types: a keyword-only ``dtype`` on every compute op, one of ``"float16"``,
  ``"bfloat16"``, ``"float32"``, ``"float64"`` (default float64 for ``gemm``, float32
  elsewhere). 16-bit types are storage types: computed in float32 and rounded to
  nearest-even when stored. ``capabilities().dtypes(op)`` tells what a device takes;
  anything else raises :class:`~computehal.UnsupportedError`.
* NaN and infinity: IEEE arithmetic, except where a method says otherwise (the seed's
  NaN-ignoring MAX / MIN and RELU). Each method's notes say how NaN travels.
* Only :class:`~computehal.BackendError` subclasses escape, whatever the arguments.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from ._generate import method_from
from .dtypes import as_float_dtype
from .errors import InvalidArgumentError, UnsupportedError
from .memory import AllocationInfo, as_count, as_pointer
from .types import (
    BackendTranspose,
    BinaryOp,
    Capabilities,
    DeviceInfo,
    MixedPrecision,
    PoolOp,
    ReduceOp,
    TileShape,
    UnaryOp,
    default_tile_for,
)

__all__ = [
    "ALL_OPS",
    "COMPUTE_OPS",
    "EXTENSION_OPS",
    "MEMORY_OPS",
    "ComputeBackend",
    "ForwardingBackend",
    "Indices",
    "Shape",
]

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

#: computehal's extension operations (methods beyond the trait), in documentation order.
EXTENSION_OPS: tuple[str, ...] = (
    "copy_dtod",
    "fill",
    "copy_strided",
    "cast",
    "broadcast_binary",
    "pool2d",
    "batch_norm",
    "layer_norm",
    "rms_norm",
    "lrn",
)

#: Every operation that computes on (or moves) operands: the seed's and the extensions.
ALL_OPS: tuple[str, ...] = COMPUTE_OPS + EXTENSION_OPS

#: The memory methods of the trait.
MEMORY_OPS: tuple[str, ...] = ("alloc", "free", "copy_htod", "copy_dtoh", "freeze")

#: A shape or stride/padding list: any sequence of non-negative ints.
Shape = Sequence[int]
#: Row indices for gather / scatter: a sequence of ints or an integer NumPy array.
Indices = Sequence[int] | npt.NDArray[np.integer[Any]]
Transpose = BackendTranspose | str
DType = str | np.dtype[Any] | type


def _unsupported(backend: ComputeBackend, operation: str) -> UnsupportedError:
    return UnsupportedError(f"{operation} is not implemented by the {backend.name()} backend")


class ComputeBackend(abc.ABC):
    """Abstract compute backend: explicit memory plus BLAS/cuDNN-shaped operations.

    Lifecycle: construct, :meth:`init`, :meth:`alloc`, :meth:`copy_htod`, run
    operations, :meth:`copy_dtoh`, :meth:`free`. Backends are context managers:
    ``with CpuBackend() as be:`` initialises the backend and, on exit, closes it
    (see :meth:`close`).

    Subclasses implement the 14 abstract methods; the 10 provided methods have the
    defaults of the original trait (a conservative CPU capability profile, no
    devices, the default tile heuristic, ``UnsupportedError`` for the optional
    operations, and a ``batched_gemm`` that loops :meth:`gemm`). Extension methods
    default to ``UnsupportedError``.
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
        again is a no-op; after :meth:`close` it starts the backend afresh.

        Raises
        ------
        DeviceError
            If the device cannot be opened.
        """

    @abc.abstractmethod
    def is_initialized(self) -> bool:
        """True once :meth:`init` has succeeded, and False again after :meth:`close`."""

    def close(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release what the backend holds: every live allocation, then its contexts.

        Called on leaving a ``with`` block. Afterwards :meth:`is_initialized` is False
        and every operation raises :class:`~computehal.NotInitializedError` until
        :meth:`init` starts the backend again. Operations running in other threads
        finish first. The default does nothing.
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
            If the device cannot satisfy the request; a request larger than the
            device's free memory (the host's physical memory, for host backends) is
            refused up front.
        """

    @abc.abstractmethod
    def free(self, ptr: int) -> None:
        """Free an allocation made by :meth:`alloc` (or forget a borrowed range).

        The pointer is invalid from this call on. If an operation is still using the
        allocation (in another thread), the memory is released when it ends. A freed
        address is not handed out again while its old name may still be in use, so a
        stale pointer is reported as freed rather than aliasing new memory.

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
            Any C-contiguous buffer-protocol object of numbers (bytes, bytearray,
            memoryview, NumPy array; bfloat16 and other extension number types as raw
            bytes). Object, datetime, string and structured buffers are refused.
        """

    @abc.abstractmethod
    def copy_dtoh(self, dst: Any, src: int) -> None:
        """Copy device bytes to host memory.

        Parameters
        ----------
        dst : writable buffer
            Any writable C-contiguous buffer of numbers; it is filled completely.
        src : int
            Device pointer; ``nbytes(dst)`` bytes from here must be allocated.
        """

    def copy_dtod(self, dst_ptr: int, src_ptr: int, nbytes: int) -> None:
        """*Extension.* Copy ``nbytes`` bytes between two device ranges of this backend.

        The ranges may overlap: the result is as if the source were read first
        (``memmove``). A bit copy: NaN payloads survive.
        """
        raise _unsupported(self, "copy_dtod")

    def fill(self, ptr: int, count: int, value: float, *, dtype: DType = "float32") -> None:
        """*Extension.* Set ``count`` elements of ``dtype`` at ``ptr`` to ``value``.

        ``value`` is rounded to ``dtype`` (nearest-even; NaN and infinities allowed).
        """
        raise _unsupported(self, "fill")

    def freeze(self, ptr: int) -> None:
        """*Extension.* Make the allocation holding ``ptr`` read-only: constant data such as weights.

        From this call until :meth:`free`, every operation that would write into the
        allocation (an op's output, :meth:`copy_htod`, :meth:`fill`, ...) raises
        :class:`~computehal.InvalidArgumentError` before touching memory, reading it is
        unchanged, and :meth:`host_view` gives read-only views. In return the backend may
        keep data derived from its contents between calls without checking them again (the
        CPU backend's transformed Winograd filters). Freezing is idempotent and cannot be
        undone. The caller promises not to write the memory by other means either (its raw
        address, or a view taken from another library): those writes are not seen.

        Raises
        ------
        InvalidArgumentError
            If ``ptr`` points into no live allocation, into borrowed memory (its owner
            can write it), into an allocation of which a writable host view was handed
            out, or into one that an operation running in another thread is using.
        UnsupportedError
            The default, for backends that cannot enforce it.
        """
        raise _unsupported(self, "freeze")

    def allocation_of(self, ptr: int) -> AllocationInfo | None:
        """*Extension.* The live allocation holding ``ptr``, or None if there is none.

        ``ptr`` may be interior (or one past the end). The returned ``serial`` is
        unique per allocation: compare it to tell a new allocation at a reused address
        from the one you knew. The default raises :class:`~computehal.UnsupportedError`.
        """
        raise _unsupported(self, "allocation_of")

    def host_view(self, ptr: int, nbytes: int) -> memoryview | None:
        """*Extension.* A writable view of ``nbytes`` bytes at ``ptr`` in host memory, if any.

        Backends whose memory is host memory (the CPU backend) return a zero-copy
        ``memoryview`` (it keeps the memory alive, but is meaningless after
        :meth:`free`); device backends return None. The range is checked like any
        operand. A frozen allocation (:meth:`freeze`) gives read-only views; one of
        which a writable view was handed out can no longer be frozen. The default
        returns None.
        """
        return None

    def dlpack_device(self) -> tuple[int, int] | None:
        """*Extension.* The DLPack ``(device_type, device_id)`` of this backend's memory.

        Returned when other libraries can address the memory in place (kDLCPU for the
        CPU backend, kDLCUDA / kDLROCM for CUDA devices); None when memory can only
        leave the device by copy (OpenCL, wgpu). The default returns None.
        """
        return None

    def borrow(self, address: int, nbytes: int, owner: object) -> int:
        """*Extension.* Register memory owned by someone else as a borrowed range.

        ``address`` must be memory this backend can address in place (host memory for
        the CPU backend, same-device memory for CUDA). Any alignment is accepted (a
        NumPy array's data is often only 16-byte aligned); each operation checks its
        operands' alignment to their element size, as for interior pointers. ``owner``
        is kept alive while the range is registered. Returns the pointer (``address``);
        :meth:`free` forgets the range without freeing the memory. The default raises
        :class:`~computehal.UnsupportedError`.
        """
        raise _unsupported(self, "borrow")

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
        dtype: DType = "float64",
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
        dtype : keyword-only
            Element type of A, B, C (default float64, as in the original).

        Notes
        -----
        Reference-BLAS semantics: leading dimensions are checked first; ``m == 0`` or
        ``n == 0`` returns at once; with ``beta == 0`` C is write-only (NaN already in
        C does not survive); with ``k == 0`` or ``alpha == 0`` A and B are not read
        and ``C = beta * C``. Rows of C between ``m`` and ``ldc`` are untouched.
        Otherwise IEEE: a NaN or infinity in A or B reaches every entry of C whose
        dot product reads it. If C overlaps A or B, the result is as if A and B were
        read first.

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
        dtype: DType = "float32",
    ) -> None:
        """Strided batched GEMM: ``C_i = alpha * op(A_i) @ op(B_i) + beta * C_i``.

        Batch ``i`` reads A at ``a_ptr + i * stride_a * itemsize`` bytes (likewise B
        and C), with strides in elements of ``dtype`` (default float32, as the
        original documents). A stride of 0 reuses one matrix for every batch; the C
        matrices of different batches must not overlap: ``stride_c`` spans at least one
        C matrix, or the batches' columns lie side by side in each column of ``ldc``
        (``m <= stride_c`` and ``(batch_count - 1) * stride_c + m <= ldc``: one
        row-major product written panel by panel). Same semantics as :meth:`gemm` per
        batch.

        The default implementation calls :meth:`gemm` once per batch; backends
        override it with a single batched call.
        """
        dt = as_float_dtype(dtype)
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
        side_by_side = (
            counts["m"] <= counts["stride_c"]
            and (counts["batch_count"] - 1) * counts["stride_c"] + counts["m"] <= counts["ldc"]
        )
        if counts["batch_count"] > 1 and c_span and counts["stride_c"] < c_span and not side_by_side:
            raise InvalidArgumentError(
                f"stride_c = {counts['stride_c']} is smaller than one C matrix; outputs would overlap"
            )
        size = dt.itemsize
        for i in range(counts["batch_count"]):
            self.gemm(
                trans_a, trans_b, m, n, k, alpha,
                pa + i * counts["stride_a"] * size, lda,
                pb + i * counts["stride_b"] * size, ldb,
                beta, pc + i * counts["stride_c"] * size, ldc, dtype=dt,
            )  # fmt: skip

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
        bf16, round-to-nearest-even, overflow to infinity) before use. Products
        accumulate in float32; alpha, beta and C are float32. Same BLAS semantics as
        :meth:`gemm`. (No ``dtype`` keyword: the buffers are float32 by definition;
        16-bit *storage* is ``gemm(..., dtype="float16")``.)

        The default raises :class:`~computehal.UnsupportedError`.
        """
        raise _unsupported(self, "gemm_mixed_precision")

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
        *,
        dtype: DType = "float32",
        groups: int = 1,
        dilation: Shape = (1, 1),
        bias_ptr: int | None = None,
        residual_ptr: int | None = None,
        activation: UnaryOp | str | None = None,
    ) -> None:
        """2-D convolution (cross-correlation, no filter flip); overwrites the output.

        Parameters
        ----------
        input_ptr, input_shape : int, [N, C, H, W]
            NCHW input.
        filter_ptr, filter_shape : int, [K, C / groups, Fh, Fw]
            KCHW filter.
        output_ptr, output_shape : int, [N, K, Oh, Ow]
            Output, with ``Oh = (H + pad_top + pad_bottom - dh*(Fh-1) - 1) // sh + 1``
            (likewise W).
        stride : [sh, sw]
            >= 1.
        padding : [ph, pw] or [top, left, bottom, right]
            Zero padding, >= 0 (four entries: ONNX's order; an extension).
        dtype : keyword-only
            Element type of every operand (extension).
        groups : int, keyword-only
            Extension. Input channels and filters split into ``groups`` equal groups;
            filter ``k`` sees only its group's ``C / groups`` input channels
            (``groups == C``: depthwise).
        dilation : [dh, dw], keyword-only
            Extension. Spacing between filter taps (>= 1).
        bias_ptr : int, optional, keyword-only
            Extension. K values added to each output channel.
        residual_ptr : int, optional, keyword-only
            Extension (fused epilogue). A tensor of the output's shape and dtype added to
            the convolution (after the bias). It may be exactly the output range (the
            result accumulates in place); any other overlap with the output behaves as
            if it were read before the output is written.
        activation : UnaryOp, optional, keyword-only
            Extension (fused epilogue). A parameter-free :class:`UnaryOp` (RELU,
            SIGMOID, TANH, GELU, SILU, ...) applied last, exactly as :meth:`unary`
            defines it; the parametrised LEAKY_RELU and CLIP are refused.

        Notes
        -----
        Output ``y[n, k, i, j]`` is the sum, over taps that land inside the input, of
        input times filter (plus the bias). Padding is not multiplied: a NaN or
        infinity in the input or the filter reaches exactly the outputs whose window
        reads it.

        With the epilogue (a computehal extension, like cuDNN's
        ``ConvolutionBiasActivationForward``), the output is
        ``activation((conv(x, w) + bias) + residual)``: the residual addition and the
        activation are :meth:`binary` ADD and :meth:`unary` element by element, so
        NaN and infinity follow their definitions (RELU maps NaN to 0, for example).
        Neither, both or one of them may be given.

        Raises
        ------
        InvalidArgumentError
            Shape lists of the wrong length, disagreeing channels / batch / K, groups
            that do not divide C and K, an output shape that differs from the formula,
            stride or dilation < 1, a padded input smaller than the dilated filter,
            operand ranges outside their allocations (the residual's included), or an
            activation that is not a parameter-free :class:`UnaryOp`.
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
        *,
        dtype: DType = "float32",
        groups: int = 1,
        dilation: Shape = (1, 1),
    ) -> None:
        """Gradient of :meth:`conv2d_forward` with respect to its input; overwrites grad_input.

        ``grad_output`` is [N, K, Oh, Ow], the filter [K, C / groups, Fh, Fw],
        ``grad_input`` [N, C, H, W]; stride, padding, groups and dilation are the
        forward pass's. Input positions the forward pass never reads get zero
        gradient. A NaN filter tap or gradient reaches only the input positions it
        multiplies in the forward pass. The default raises
        :class:`~computehal.UnsupportedError`.
        """
        raise _unsupported(self, "conv2d_backward_data")

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
        *,
        dtype: DType = "float32",
        groups: int = 1,
        dilation: Shape = (1, 1),
    ) -> None:
        """Gradient of :meth:`conv2d_forward` with respect to the filter; overwrites grad_filter.

        ``input`` is [N, C, H, W], ``grad_output`` [N, K, Oh, Ow], ``grad_filter``
        [K, C / groups, Fh, Fw]. Padding positions contribute nothing (a NaN in the
        input reaches only the taps that read it). The default raises
        :class:`~computehal.UnsupportedError`.
        """
        raise _unsupported(self, "conv2d_backward_filter")

    def pool2d(
        self,
        op: PoolOp | str,
        input_ptr: int,
        input_shape: Shape,
        output_ptr: int,
        output_shape: Shape,
        kernel: Shape,
        stride: Shape,
        padding: Shape,
        *,
        dilation: Shape = (1, 1),
        ceil_mode: bool = False,
        count_include_pad: bool = False,
        dtype: DType = "float32",
    ) -> None:
        """*Extension.* 2-D max or average pooling over NCHW; overwrites the output.

        Parameters
        ----------
        op : PoolOp or {"max", "avg"}
        input_shape, output_shape : [N, C, H, W], [N, C, Oh, Ow]
            ``Oh = (H + pad_top + pad_bottom - dh*(kh-1) - 1) // sh + 1`` (ceiling
            division with ``ceil_mode``, where a last window starting in the trailing
            padding is dropped; likewise W).
        kernel, stride, dilation : [h, w]
            All >= 1. Global pooling is a kernel the size of the image.
        padding : [ph, pw] or [top, left, bottom, right]

        Notes
        -----
        MAX ignores padding and NaN (like ``fmax``; a window with no input gives
        -inf). AVG divides the sum by the number of window positions inside the input,
        or with ``count_include_pad`` inside the padded input (ceil-mode overhang
        never counts); NaN in the window propagates, and a window with no input gives
        NaN (``0 / 0``), or 0 with ``count_include_pad``.
        """
        raise _unsupported(self, "pool2d")

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
        *,
        dtype: DType = "float32",
        mask_ptr: int | None = None,
        mask_shape: Shape | None = None,
        kv_heads: int | None = None,
    ) -> None:
        """Scaled dot-product attention ``O = softmax(Q @ K^T * scale + mask) @ V``.

        Parameters
        ----------
        q_ptr, o_ptr : int
            [batch, heads, seq_q, head_dim], row-major.
        k_ptr, v_ptr : int
            [batch, kv_heads, seq_kv, head_dim], row-major.
        batch, heads, seq_q, seq_kv, head_dim : int
            All >= 1; ``seq_q`` may differ from ``seq_kv`` (decoding with a cache).
        scale : float
            Finite; it *multiplies* the scores (typically ``1 / sqrt(head_dim)``).
        causal : bool
            Bottom-right aligned mask: query ``i`` sees key ``j`` iff
            ``j <= i + (seq_kv - seq_q)``.
        mask_ptr, mask_shape : keyword-only
            Extension. An additive mask of ``dtype`` whose shape (up to 4 dimensions)
            broadcasts to [batch, heads, seq_q, seq_kv]; added to the scaled scores.
        kv_heads : int, keyword-only
            Extension. Grouped-query attention: K and V have ``kv_heads`` heads
            (dividing ``heads``); query head ``h`` uses key/value head
            ``h // (heads // kv_heads)``. Default ``heads``.

        Notes
        -----
        Implementations tile over keys with an online softmax; memory stays linear
        in the sequence length. A key is *visible* to a query when the causal rule
        allows it and its masked score is not -inf; a query with no visible key gets
        an all-zero output row. Otherwise IEEE: a NaN in a query row, in a visible
        key, or in the mask makes the rows that read it NaN, a NaN or infinity in a
        visible value reaches the output entries that read it, and a +inf score makes
        its row NaN (``exp(inf - inf)``). Keys that are not visible are not read.
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
        *,
        dtype: DType = "float32",
    ) -> None:
        """Reduce a row-major tensor of ``shape`` over ``axis``.

        The output's shape is ``shape`` without ``axis``. MAX / MIN ignore NaN (as
        ``numpy.fmax`` / ``fmin`` folds starting from -inf / +inf), so a slice with
        no non-NaN value gives -inf (MAX) or +inf (MIN); a zero-length axis gives 0
        for SUM and MEAN. SUM and MEAN are IEEE (NaN propagates, inf - inf is NaN).

        Raises
        ------
        InvalidArgumentError
            An empty shape or ``axis >= len(shape)``.
        """

    def softmax(
        self,
        input_ptr: int,
        output_ptr: int,
        shape: Shape,
        axis: int,
        *,
        dtype: DType = "float32",
        log: bool = False,
    ) -> None:
        """Numerically stable softmax of a row-major tensor along ``axis``.

        Each slice has its maximum (NaN ignored) subtracted before ``exp``; a slice
        of all -inf gives NaN, a +inf in a slice makes it NaN, and a NaN in a slice
        makes that slice NaN. With ``log=True`` (extension) the result is
        log-softmax, ``x - max - log(sum(exp(x - max)))``: -inf entries stay -inf. The
        default raises :class:`~computehal.UnsupportedError`.
        """
        raise _unsupported(self, "softmax")

    def layer_norm(
        self,
        input_ptr: int,
        output_ptr: int,
        rows: int,
        cols: int,
        eps: float,
        *,
        scale_ptr: int | None = None,
        bias_ptr: int | None = None,
        dtype: DType = "float32",
    ) -> None:
        """*Extension.* Layer normalisation over the ``cols`` elements of each row.

        ``y = (x - mean) / sqrt(var + eps) * scale + bias`` with the mean and the
        (biased) variance of the row; ``scale`` and ``bias`` have ``cols`` elements
        (omitted: 1 and 0). ``eps`` finite and >= 0. IEEE: a NaN in a row makes the
        row NaN.
        """
        raise _unsupported(self, "layer_norm")

    def rms_norm(
        self,
        input_ptr: int,
        output_ptr: int,
        rows: int,
        cols: int,
        eps: float,
        *,
        scale_ptr: int | None = None,
        bias_ptr: int | None = None,
        dtype: DType = "float32",
    ) -> None:
        """*Extension.* RMS normalisation: ``y = x / sqrt(mean(x**2) + eps) * scale + bias``.

        Over the ``cols`` elements of each row, as :meth:`layer_norm` without the
        mean subtraction.
        """
        raise _unsupported(self, "rms_norm")

    def batch_norm(
        self,
        input_ptr: int,
        shape: Shape,
        scale_ptr: int,
        bias_ptr: int,
        mean_ptr: int,
        var_ptr: int,
        output_ptr: int,
        eps: float,
        *,
        dtype: DType = "float32",
    ) -> None:
        """*Extension.* Inference batch normalisation over channel axis 1.

        ``shape`` is [N, C, ...] (at least 2 dimensions); ``scale``, ``bias``,
        ``mean`` and ``var`` have C elements:
        ``y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c]``. IEEE.
        """
        raise _unsupported(self, "batch_norm")

    def lrn(
        self,
        input_ptr: int,
        output_ptr: int,
        shape: Shape,
        size: int,
        alpha: float,
        beta: float,
        bias: float,
        *,
        dtype: DType = "float32",
    ) -> None:
        """*Extension.* Local response normalisation across channels (ONNX's LRN).

        ``shape`` is [N, C, ...]. ``y = x / (bias + alpha / size * s) ** beta`` where
        ``s`` sums ``x**2`` over channels ``c - (size - 1) // 2`` to
        ``c + size // 2`` (clipped to the channels). IEEE.
        """
        raise _unsupported(self, "lrn")

    # ------------------------------------------------------------------ element-wise

    @abc.abstractmethod
    def unary(
        self,
        op: UnaryOp | str,
        input_ptr: int,
        output_ptr: int,
        n: int,
        *,
        dtype: DType = "float32",
        alpha: float | None = None,
        lo: float | None = None,
        hi: float | None = None,
    ) -> None:
        """Apply ``op`` to ``n`` elements; ``input_ptr`` may equal ``output_ptr``.

        RELU is ``max(x, 0)`` with NaN -> 0; LOG / SQRT of negatives give NaN; every
        other function is its formula evaluated in IEEE arithmetic (NaN in, NaN out;
        GELU, GELU_TANH and SILU of -inf are NaN, ``-inf * 0``). Extensions: GELU (erf
        form), GELU_TANH, SILU (``x * sigmoid(x)``), ERF, RECIPROCAL, SQUARE, SIN, COS,
        LEAKY_RELU (``x`` if ``x >= 0`` else ``alpha * x``; keyword ``alpha``, default
        0.01) and CLIP (``min(max(x, lo), hi)``, NaN stays NaN; keywords ``lo`` / ``hi``,
        default -inf / +inf). Passing ``alpha`` / ``lo`` / ``hi`` to another op is an error.
        Partially overlapping input and output behave as if the input were read first.
        """

    @abc.abstractmethod
    def binary(
        self,
        op: BinaryOp | str,
        a_ptr: int,
        b_ptr: int,
        output_ptr: int,
        n: int,
        *,
        dtype: DType = "float32",
    ) -> None:
        """``output[i] = op(a[i], b[i])`` for ``n`` elements.

        MAX / MIN ignore NaN (like ``fmax`` / ``fmin``); DIV is IEEE division
        (x/0 -> +-inf, 0/0 -> NaN, no error); POW (extension) is C's ``pow``
        (``pow(x, 0) == 1`` even for NaN, a negative base with a non-integer exponent
        gives NaN). Operands may alias the output.
        """

    def broadcast_binary(
        self,
        op: BinaryOp | str,
        a_ptr: int,
        a_shape: Shape,
        b_ptr: int,
        b_shape: Shape,
        out_ptr: int,
        out_shape: Shape,
        *,
        dtype: DType = "float32",
    ) -> None:
        """*Extension.* ``out = op(a, b)`` with NumPy's broadcasting rules (up to 6 dimensions).

        ``out_shape`` must be the broadcast of ``a_shape`` and ``b_shape``. Same
        semantics per element as :meth:`binary`; operands overlapping the output
        behave as if they were read first.
        """
        raise _unsupported(self, "broadcast_binary")

    def cast(
        self,
        input_ptr: int,
        output_ptr: int,
        n: int,
        *,
        dtype: DType = "float32",
        out_dtype: DType = "float32",
    ) -> None:
        """*Extension.* Convert ``n`` elements from ``dtype`` to ``out_dtype``.

        Round to nearest-even; values beyond the target's range become infinities;
        NaN stays NaN.
        """
        raise _unsupported(self, "cast")

    # ------------------------------------------------------------------ data movement

    def copy_strided(
        self,
        dst_ptr: int,
        src_ptr: int,
        shape: Shape,
        src_strides: Sequence[int],
        dst_strides: Sequence[int],
        *,
        dtype: DType = "float32",
    ) -> None:
        """*Extension.* Copy a strided view: ``dst[idx] = src[idx]`` for every ``idx`` of ``shape``.

        ``shape`` has up to 6 dimensions; strides are in elements of ``dtype`` and
        may be negative (the pointers address element ``[0, ..., 0]``). A zero source
        stride broadcasts; destination strides must not map two elements to one
        address. Transpose, permute, slice, concatenation, split, expand and channel
        shuffle are all one call. Overlapping source and destination behave as if the
        source were read first. A bit copy: NaN payloads survive.
        """
        raise _unsupported(self, "copy_strided")

    def gather(
        self,
        input_ptr: int,
        indices: Indices | int,
        output_ptr: int,
        rows: int,
        cols: int,
        *,
        dtype: DType = "float32",
        indices_ptr: int | None = None,
        index_dtype: DType = "int64",
    ) -> None:
        """Row gather: ``output[i, :] = input[indices[i], :]`` (a bit copy).

        ``input`` is ``rows x cols``, ``output`` is ``len(indices) x cols``. Any index
        outside ``[0, rows)`` raises :class:`~computehal.InvalidArgumentError` before
        anything is written. Extension: with ``indices_ptr`` the indices are read from
        device memory (``index_dtype`` int32 or int64) and ``indices`` is their number;
        they are checked on the device, with the same error. The default raises
        :class:`~computehal.UnsupportedError`.
        """
        raise _unsupported(self, "gather")

    def scatter(
        self,
        input_ptr: int,
        indices: Indices | int,
        output_ptr: int,
        rows: int,
        cols: int,
        *,
        dtype: DType = "float32",
        indices_ptr: int | None = None,
        index_dtype: DType = "int64",
    ) -> None:
        """Row scatter: ``output[indices[i], :] = input[i, :]`` (a bit copy).

        ``input`` is ``len(indices) x cols``, ``output`` is ``rows x cols``. Rows not
        named keep their values; with duplicate indices the last one wins. Device
        indices as for :meth:`gather`. The default raises
        :class:`~computehal.UnsupportedError`.
        """
        raise _unsupported(self, "scatter")

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

    def gemm_weight_panel(self, rows: int, depth: int, cols: int, *, dtype: DType = "float32") -> int:
        """*Extension.* Columns per panel in which a constant ``depth x cols`` weight is best stored.

        A caller multiplying ``rows`` activation rows by the same weight again and again
        (a model runner's dense layers) may store it once as ``cols / width`` panels of
        ``width`` columns, each a contiguous ``depth x width`` matrix, and run the product
        as one :meth:`batched_gemm` over the panels with the activations shared
        (``stride_b = 0``) and the outputs side by side in each column of C
        (``stride_c = width``, ``ldc`` the output's row length): the row-major product,
        written panel by panel. A backend whose kernels read such panels in place where a
        plain GEMM repacks the weight on every call returns the width it wants; 0 (the
        default) means: keep the weight as it is. A hint only: every layout gives the same
        results.

        Raises
        ------
        InvalidArgumentError
            If a size is not a non-negative integer or ``dtype`` is not a float dtype.
        """
        sizes = as_count("rows", rows), as_count("depth", depth), as_count("cols", cols)
        return self._gemm_weight_panel(*sizes, as_float_dtype(dtype))

    def _gemm_weight_panel(self, rows: int, depth: int, cols: int, dtype: np.dtype[Any]) -> int:
        """The panel width for validated sizes (override to ask for panels; 0: none)."""
        return 0


#: Every public method of the contract (what wrappers forward), in definition order.
PUBLIC_METHODS: tuple[str, ...] = tuple(
    name for name, value in vars(ComputeBackend).items() if callable(value) and not name.startswith("_")
)


def _forward(method: str) -> Any:
    """A method with the contract's signature that calls the same method of ``self.inner``."""
    return method_from(
        getattr(ComputeBackend, method),
        "return self.inner.{name}({call})",
        {"__name__": __name__},
        qualname=f"ForwardingBackend.{method}",
    )


class ForwardingBackend(ComputeBackend):
    """Delegates every method to ``inner``: the base for tracing or profiling wrappers.

    Override the methods you want to observe and call ``super()`` to forward. Every
    forwarding method has the contract's exact signature (generated from it).
    """

    def __init__(self, inner: ComputeBackend) -> None:
        if not isinstance(inner, ComputeBackend):
            raise InvalidArgumentError(f"inner must be a ComputeBackend, got {type(inner).__name__}")
        self.inner = inner

    def __getattr__(self, attribute: str) -> Any:
        # Extensions of the inner backend (live_allocations, ...) stay reachable.
        if attribute == "inner":
            raise AttributeError(attribute)
        return getattr(self.inner, attribute)

    # Every public method of the contract (PUBLIC_METHODS), generated:
    name = _forward("name")
    init = _forward("init")
    is_initialized = _forward("is_initialized")
    close = _forward("close")
    synchronize = _forward("synchronize")
    alloc = _forward("alloc")
    free = _forward("free")
    freeze = _forward("freeze")
    copy_htod = _forward("copy_htod")
    copy_dtoh = _forward("copy_dtoh")
    copy_dtod = _forward("copy_dtod")
    fill = _forward("fill")
    allocation_of = _forward("allocation_of")
    host_view = _forward("host_view")
    dlpack_device = _forward("dlpack_device")
    borrow = _forward("borrow")
    gemm = _forward("gemm")
    batched_gemm = _forward("batched_gemm")
    gemm_mixed_precision = _forward("gemm_mixed_precision")
    conv2d_forward = _forward("conv2d_forward")
    conv2d_backward_data = _forward("conv2d_backward_data")
    conv2d_backward_filter = _forward("conv2d_backward_filter")
    pool2d = _forward("pool2d")
    attention = _forward("attention")
    reduce = _forward("reduce")
    softmax = _forward("softmax")
    layer_norm = _forward("layer_norm")
    rms_norm = _forward("rms_norm")
    batch_norm = _forward("batch_norm")
    lrn = _forward("lrn")
    unary = _forward("unary")
    binary = _forward("binary")
    broadcast_binary = _forward("broadcast_binary")
    cast = _forward("cast")
    copy_strided = _forward("copy_strided")
    gather = _forward("gather")
    scatter = _forward("scatter")
    capabilities = _forward("capabilities")
    available_devices = _forward("available_devices")
    recommended_tile_for = _forward("recommended_tile_for")
    gemm_weight_panel = _forward("gemm_weight_panel")
