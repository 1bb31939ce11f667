"""Scaled dot-product attention on OpenCL with an online softmax (memory linear in the
sequence): a single-work-item vector kernel for CPU devices and a work-group kernel
staging key / value tiles in local memory for GPUs (``kernels/attention.cl``).
"""

from __future__ import annotations

import numpy as np

from ... import validation as v
from ...errors import InvalidArgumentError, UnsupportedError
from .._common import ceil_div, refuse_extensions, round_up
from ._core import OpenCLCore

__all__ = ["AttentionOps"]

I32 = np.int32
I64 = np.int64

#: Query rows per attention work-group (work-group kernel, GPUs).
_ATTN_BQ = 32
#: Bytes of private row state (query and accumulator, 8 * head_dim bytes per query row) that
#: one attention work-group may hold: PoCL keeps the private arrays of every work-item of a
#: group on one thread's stack, which overflowed (a segfault) at head_dim 32768 with 32 rows.
_ATTN_PRIVATE = 1 << 20
#: Query rows per work-item of the vector attention kernel (CPU devices), and its largest head_dim.
_VEC_ATTN_BQ = 16
_VEC_ATTN_MAX_DIM = 256


class AttentionOps(OpenCLCore):
    """attention."""

    def _exec_attention(self, p: v.AttentionProblem) -> None:
        refuse_extensions("opencl", "attention", p)
        if p.seq_q > np.iinfo(np.int32).max or p.seq_kv > np.iinfo(np.int32).max:
            raise InvalidArgumentError("seq_q and seq_kv must fit in 32 bits")
        q, k, val, o = self._at(p.q), self._at(p.k), self._at(p.v), self._at(p.o)
        args = (
            q.buffer, I64(q.offset), k.buffer, I64(k.offset), val.buffer, I64(val.offset),
            o.buffer, I64(o.offset), I32(p.seq_q), I32(p.seq_kv), np.float32(p.scale), I32(int(p.causal)),
        )  # fmt: skip
        with self._lock:
            if self.vector_attention and p.head_dim <= _VEC_ATTN_MAX_DIM:
                bkv = 64 if p.head_dim <= 128 else 32
                kernel = self._kernel(
                    "attention.cl", "attention_fwd_vec", HD=p.head_dim, BQ=_VEC_ATTN_BQ, BKV=bkv, VW=8
                )
                self._launch(kernel, (ceil_div(p.seq_q, _VEC_ATTN_BQ), p.batch * p.heads), (1, 1), *args)
                return
            # K and V tiles of bkv rows must fit the device's local memory.
            bkv = min(64, self._local_mem // (8 * p.head_dim) - 1)
            if bkv < 1:
                raise UnsupportedError(
                    f"attention with head_dim {p.head_dim}: the device's {self._local_mem} bytes of local "
                    "memory cannot hold one key and value row"
                )
            bq = max(1, min(_ATTN_BQ, self._max_wg, _ATTN_PRIVATE // (8 * p.head_dim)))
            kernel = self._kernel("attention.cl", "attention_fwd", HD=p.head_dim, BQ=bq, BKV=bkv)
            self._launch(kernel, (round_up(p.seq_q, bq), p.batch * p.heads), (bq, 1), *args)
