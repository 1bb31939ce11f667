"""NullBackend: a backend that owns nothing and refuses every operation by name.

Useful as a placeholder in registries and to test callers' error handling. It is
always initialised, exposes no devices, and ``synchronize()`` returns at once
(there is never anything to wait for).
"""

from __future__ import annotations

from typing import Any, NoReturn

from ..backend import ComputeBackend
from ..errors import UnsupportedError

__all__ = ["NullBackend"]


def _refuse(operation: str) -> NoReturn:
    raise UnsupportedError(f"{operation} is not available on the null backend")


class NullBackend(ComputeBackend):
    """The backend that does nothing: every memory and compute operation raises
    :class:`~computehal.UnsupportedError` naming the operation."""

    def name(self) -> str:
        return "null"

    def init(self) -> None:
        """Nothing to initialise; the null backend is always ready."""

    def is_initialized(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing is ever pending."""

    def alloc(self, bytes: int) -> int:
        _refuse("alloc")

    def free(self, ptr: int) -> None:
        _refuse("free")

    def copy_htod(self, dst: int, src: Any) -> None:
        _refuse("copy_htod")

    def copy_dtoh(self, dst: Any, src: int) -> None:
        _refuse("copy_dtoh")

    def gemm(self, *args: Any, **kwargs: Any) -> None:
        _refuse("gemm")

    def batched_gemm(self, *args: Any, **kwargs: Any) -> None:
        _refuse("batched_gemm")

    def gemm_mixed_precision(self, *args: Any, **kwargs: Any) -> None:
        _refuse("gemm_mixed_precision")

    def conv2d_forward(self, *args: Any, **kwargs: Any) -> None:
        _refuse("conv2d_forward")

    def conv2d_backward_data(self, *args: Any, **kwargs: Any) -> None:
        _refuse("conv2d_backward_data")

    def conv2d_backward_filter(self, *args: Any, **kwargs: Any) -> None:
        _refuse("conv2d_backward_filter")

    def attention(self, *args: Any, **kwargs: Any) -> None:
        _refuse("attention")

    def reduce(self, *args: Any, **kwargs: Any) -> None:
        _refuse("reduce")

    def softmax(self, *args: Any, **kwargs: Any) -> None:
        _refuse("softmax")

    def unary(self, *args: Any, **kwargs: Any) -> None:
        _refuse("unary")

    def binary(self, *args: Any, **kwargs: Any) -> None:
        _refuse("binary")

    def gather(self, *args: Any, **kwargs: Any) -> None:
        _refuse("gather")

    def scatter(self, *args: Any, **kwargs: Any) -> None:
        _refuse("scatter")
