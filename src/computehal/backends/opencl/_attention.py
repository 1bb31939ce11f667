"""Scaled dot-product attention on OpenCL (``kernels/attention.cl``) with an online softmax
(memory linear in the sequence), an additive broadcast mask, grouped-query heads and
``seq_q != seq_kv``, in float32 and float64: a single-work-item vector kernel for CPU
devices and a work-group kernel staging key / value tiles in local memory for GPUs.

Kernels are specialised for the head dimension rounded up to a bucket (multiples of 16 up
to 256, of 128 up to 2048, powers of two beyond), the true head dimension being an
argument: the number of attention programs cannot grow with the variety of head sizes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import validation as v
from ...dtypes import F64
from ...errors import InvalidArgumentError, UnsupportedError
from .._common import ceil_div, head_bucket, round_up
from ._core import OpenCLCore
from ._runtime import Operand

__all__ = ["AttentionOps", "head_bucket"]

I32 = np.int32
I64 = np.int64

#: Query rows per attention work-group (work-group kernel, GPUs).
_ATTN_BQ = 32
#: Bytes of private row state (query and accumulator, 2 * head_dim elements per query row) that
#: one attention work-group may hold: PoCL keeps the private arrays of every work-item of a
#: group on one thread's stack, which overflowed (a segfault) at head_dim 32768 with 32 rows.
_ATTN_PRIVATE = 1 << 20
#: Query rows per work-item of the vector attention kernel (CPU devices), and its largest head_dim.
_VEC_ATTN_BQ = 16
_VEC_ATTN_MAX_DIM = 256


class AttentionOps(OpenCLCore):
    """attention."""

    def _exec_attention(self, p: v.AttentionProblem) -> None:
        if p.seq_q > np.iinfo(np.int32).max or p.seq_kv > np.iinfo(np.int32).max:
            raise InvalidArgumentError("seq_q and seq_kv must fit in 32 bits")
        size, real = p.dtype.itemsize, p.dtype.type
        q, k, val, o = (self._at(r, size) for r in (p.q, p.k, p.v, p.o))
        mask = self._at(p.mask, size) if p.mask is not None else Operand(None, 0)
        args = (
            q.buffer, I64(q.offset), k.buffer, I64(k.offset), val.buffer, I64(val.offset),
            o.buffer, I64(o.offset), mask.buffer, I64(mask.offset), *(I64(s) for s in p.mask_strides),
            I32(p.mask is not None), I32(p.seq_q), I32(p.seq_kv), I32(p.head_dim), real(p.scale),
            I32(int(p.causal)), I32(p.heads), I32(p.group),
        )  # fmt: skip
        hd = head_bucket(p.head_dim)
        with self._lock:
            if self.vector_attention and hd <= _VEC_ATTN_MAX_DIM:
                kernel = self._vector_kernel(p.dtype, hd)
                self._launch(kernel, (ceil_div(p.seq_q, _VEC_ATTN_BQ), p.batch * p.heads), (1, 1), *args)
                return
            # K and V tiles of bkv rows must fit the device's local memory.
            bkv = min(64, self._local_mem // (2 * size * hd) - 1)
            if bkv < 1:
                raise UnsupportedError(
                    f"attention with head_dim {p.head_dim}: the device's {self._local_mem} bytes of local "
                    "memory cannot hold one key and value row"
                )
            bq = max(1, min(_ATTN_BQ, self._max_wg, _ATTN_PRIVATE // (2 * size * hd)))
            # (VW: the file's vector kernel is compiled too, on vectors the device takes.)
            vw = self._attention_vw(p.dtype)
            kernel = self._kernel("attention.cl", "attention_fwd", p.dtype, HD=hd, BQ=bq, BKV=bkv, VW=vw)
            self._launch(kernel, (round_up(p.seq_q, bq), p.batch * p.heads), (bq, 1), *args)

    def _attention_vw(self, dtype: np.dtype[Any]) -> int:
        """Lanes of the vector kernel's vectors: 256 bits where the device's vectors allow."""
        return min(4 if dtype == F64 else 8, self._lanes(dtype))

    def _vector_kernel(self, dtype: np.dtype[Any], hd: int) -> Any:
        """The single-work-item vector kernel for ``dtype`` and head bucket ``hd``."""
        vw = self._attention_vw(dtype)
        bkv = 8 * vw if hd <= 128 else 4 * vw
        return self._kernel(
            "attention.cl", "attention_fwd_vec", dtype, HD=hd, BQ=_VEC_ATTN_BQ, BKV=bkv, VW=vw
        )
