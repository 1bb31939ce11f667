"""Attention on CUDA: the flash-attention kernel of ``kernels/attention.cl``.

A block of ``ATTENTION_BQ`` threads owns that many query rows of one head and walks the
keys in tiles staged in shared memory (online softmax, memory linear in the sequence
length). The kernel is specialised per head dimension. Heads go in grid dimension y,
at most 65535 per launch.
"""

from __future__ import annotations

from ... import validation as v
from ...errors import InvalidArgumentError, UnsupportedError
from .._common import ceil_div, chunks, refuse_extensions
from ._core import I32, I64, CudaCore, Ptr, scalar
from ._device import GRID_YZ_MAX
from ._programs import ATTENTION_BQ, ATTENTION_MAX_DIM, attention_unit

__all__ = ["AttentionOps"]


class AttentionOps(CudaCore):
    """attention."""

    def _exec_attention(self, p: v.AttentionProblem) -> None:
        refuse_extensions("cuda", "attention", p)
        if max(p.seq_q, p.seq_kv) > v.BLAS_INT_MAX:
            raise InvalidArgumentError(
                f"sequence lengths must not exceed {v.BLAS_INT_MAX} on the CUDA kernels"
            )
        if p.head_dim > ATTENTION_MAX_DIM:
            raise UnsupportedError(
                f"attention with head_dim {p.head_dim} > {ATTENTION_MAX_DIM} on {self.name()}"
            )
        unit = attention_unit(p.head_dim)
        size = p.dtype.itemsize
        q_step, kv_step = p.seq_q * p.head_dim * size, p.seq_kv * p.head_dim * size
        blocks = ceil_div(p.seq_q, ATTENTION_BQ)
        for h0, h1 in chunks(p.batch * p.heads, 0, most=GRID_YZ_MAX):
            self._launch(
                unit, "attention_fwd", (blocks, h1 - h0), (ATTENTION_BQ,),
                Ptr(p.q.ptr + h0 * q_step), I64(0), Ptr(p.k.ptr + h0 * kv_step), I64(0),
                Ptr(p.v.ptr + h0 * kv_step), I64(0), Ptr(p.o.ptr + h0 * q_step), I64(0),
                I32(p.seq_q), I32(p.seq_kv), scalar(p.scale, p.dtype), I32(int(p.causal)),
            )  # fmt: skip
