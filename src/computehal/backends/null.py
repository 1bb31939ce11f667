"""NullBackend: a backend that owns nothing and refuses every operation by name.

Useful as a placeholder in registries and to test callers' error handling. It is
always initialised, exposes no devices, and ``synchronize()`` returns at once
(there is never anything to wait for). Its refusing methods are generated from the
contract's signatures (:mod:`computehal._generate`).
"""

from __future__ import annotations

from typing import Any, ClassVar, NoReturn

from .._generate import method_from
from ..backend import ComputeBackend
from ..errors import UnsupportedError

__all__ = ["NullBackend"]


def _refuse(operation: str) -> NoReturn:
    raise UnsupportedError(f"{operation} is not available on the null backend")


def _refusing(method: str) -> Any:
    """A method with the contract's signature that raises UnsupportedError naming it."""
    return method_from(
        getattr(ComputeBackend, method),
        "_refuse({name!r})",
        {"__name__": __name__, "_refuse": _refuse},
        qualname=f"NullBackend.{method}",
    )


class NullBackend(ComputeBackend):
    """The backend that does nothing: every memory and compute operation raises
    :class:`~computehal.UnsupportedError` naming the operation."""

    kind: ClassVar[str] = "null"

    def __init__(self, device: int = 0) -> None:
        self.device = device

    def name(self) -> str:
        return "null"

    def init(self) -> None:
        """Nothing to initialise; the null backend is always ready."""

    def is_initialized(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing is ever pending."""

    # Every memory and compute method of the contract, generated:
    alloc = _refusing("alloc")
    free = _refusing("free")
    copy_htod = _refusing("copy_htod")
    copy_dtoh = _refusing("copy_dtoh")
    copy_dtod = _refusing("copy_dtod")
    fill = _refusing("fill")
    allocation_of = _refusing("allocation_of")
    borrow = _refusing("borrow")
    gemm = _refusing("gemm")
    batched_gemm = _refusing("batched_gemm")
    gemm_mixed_precision = _refusing("gemm_mixed_precision")
    conv2d_forward = _refusing("conv2d_forward")
    conv2d_backward_data = _refusing("conv2d_backward_data")
    conv2d_backward_filter = _refusing("conv2d_backward_filter")
    pool2d = _refusing("pool2d")
    attention = _refusing("attention")
    reduce = _refusing("reduce")
    softmax = _refusing("softmax")
    layer_norm = _refusing("layer_norm")
    rms_norm = _refusing("rms_norm")
    batch_norm = _refusing("batch_norm")
    lrn = _refusing("lrn")
    unary = _refusing("unary")
    binary = _refusing("binary")
    broadcast_binary = _refusing("broadcast_binary")
    cast = _refusing("cast")
    copy_strided = _refusing("copy_strided")
    gather = _refusing("gather")
    scatter = _refusing("scatter")
