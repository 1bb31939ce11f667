"""Scaled dot-product attention, with an additive mask and grouped-query heads."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from ..errors import InvalidArgumentError
from ..memory import Lease, Region, as_count, as_pointer
from ._core import Operand, Problem, Role, as_finite, as_flag, as_shape, float_dtype, record

__all__ = ["AttentionProblem", "attention", "broadcast_strides"]


@record
class AttentionProblem(Problem):
    """A validated attention call.

    Q and O are [batch, heads, seq_q, head_dim]; K and V are [batch, kv_heads, seq_kv,
    head_dim]; query head ``h`` reads key/value head ``h // (heads // kv_heads)``.
    ``mask`` (optional) is added to the scaled scores; ``mask_strides`` are its element
    strides over [batch, heads, seq_q, seq_kv] (0 along broadcast dimensions).
    """

    OPERANDS: ClassVar[tuple[Operand, ...]] = (
        Operand("q", Role.IN),
        Operand("k", Role.IN),
        Operand("v", Role.IN),
        Operand("mask", Role.IN),
        Operand("o", Role.OUT),
    )

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
    dtype: np.dtype[Any]
    kv_heads: int = 0
    mask: Region | None = None
    mask_strides: tuple[int, int, int, int] = (0, 0, 0, 0)

    @property
    def causal_offset(self) -> int:
        """Query ``i`` may see key ``j`` iff ``j <= i + causal_offset`` (bottom-right aligned)."""
        return self.seq_kv - self.seq_q

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.heads // self.kv_heads

    @property
    def is_plain(self) -> bool:
        """True for the seed's attention: no mask, as many key/value heads as query heads."""
        return self.mask is None and self.kv_heads == self.heads


def broadcast_strides(name: str, shape: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides of ``shape`` broadcast (NumPy rules) to ``target``.

    Broadcast dimensions get stride 0. Raises :class:`InvalidArgumentError` when
    ``shape`` does not broadcast to ``target``.
    """
    if len(shape) > len(target):
        raise InvalidArgumentError(f"{name} {list(shape)} has more dimensions than {list(target)}")
    padded = (1,) * (len(target) - len(shape)) + shape
    strides = [0] * len(target)
    step = 1
    for i in range(len(target) - 1, -1, -1):
        if padded[i] == target[i]:
            strides[i] = step if target[i] != 1 else 0
        elif padded[i] == 1:
            strides[i] = 0
        else:
            raise InvalidArgumentError(f"{name} {list(shape)} does not broadcast to {list(target)}")
        step *= padded[i]
    return tuple(strides)


def attention(
    lease: Lease,
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
    *,
    dtype: object = "float32",
    mask_ptr: object = None,
    mask_shape: object = None,
    kv_heads: object = None,
) -> AttentionProblem:
    """Validate ``attention``."""
    dt = float_dtype(dtype)
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
    b, h, sq, skv, d = (dims[n] for n in ("batch", "heads", "seq_q", "seq_kv", "head_dim"))
    sc = as_finite("scale", scale)
    is_causal = as_flag("causal", causal)
    kvh = h if kv_heads is None else as_count("kv_heads", kv_heads)
    if kvh < 1 or h % kvh:
        raise InvalidArgumentError(f"kv_heads = {kvh} must be >= 1 and divide heads = {h}")
    pointers = [
        as_pointer(n, p) for n, p in (("q_ptr", q_ptr), ("k_ptr", k_ptr), ("v_ptr", v_ptr), ("o_ptr", o_ptr))
    ]
    mask = None if mask_ptr is None else as_pointer("mask_ptr", mask_ptr)
    if (mask is None) != (mask_shape is None):
        raise InvalidArgumentError("mask_ptr and mask_shape must be given together")
    strides: tuple[int, ...] = (0, 0, 0, 0)
    mask_elems = 0
    if mask_shape is not None:
        mshape = as_shape("mask_shape", mask_shape, (1, 2, 3, 4))
        strides = broadcast_strides("mask_shape", mshape, (b, h, sq, skv))
        mask_elems = math.prod(mshape)
    size = dt.itemsize
    q = lease.resolve("q_ptr", pointers[0], b * h * sq * d * size, align=size)
    k = lease.resolve("k_ptr", pointers[1], b * kvh * skv * d * size, align=size)
    v = lease.resolve("v_ptr", pointers[2], b * kvh * skv * d * size, align=size)
    o = lease.resolve("o_ptr", pointers[3], b * h * sq * d * size, align=size)
    m = None if mask is None else lease.resolve("mask_ptr", mask, mask_elems * size, align=size)
    ms = (strides[0], strides[1], strides[2], strides[3])
    return AttentionProblem(b, h, sq, skv, d, sc, is_causal, q, k, v, o, dt, kvh, m, ms)
