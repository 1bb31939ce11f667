"""Attention on CUDA (float32 and float64): the flash-attention kernel of ``kernels/attention.cl``.

A block of ``ATTENTION_BQ`` threads owns that many query rows of one (batch, head) and walks
the keys in tiles staged in shared memory (online softmax, memory linear in the sequence
length), with an additive broadcast mask, grouped-query heads and ``seq_q != seq_kv``. The
kernel is built per bucket of head dimensions (``head_bucket``), the true head dimension
being an argument. (batch, head) pairs go in grid dimension y, at most 65535 per launch:
larger problems run in pieces of whole batches, or of heads that share key / value heads.
"""

from __future__ import annotations

from collections.abc import Iterator

from ... import validation as v
from ...errors import InvalidArgumentError, UnsupportedError
from .._common import ceil_div, head_bucket
from ._core import I32, I64, CudaCore, Ptr, scalar
from ._device import GRID_YZ_MAX
from ._programs import ATTENTION_BQ, attention_bkv, attention_unit, real_of

__all__ = ["AttentionOps", "head_pieces"]


def head_pieces(
    batch: int, heads: int, group: int, limit: int = GRID_YZ_MAX
) -> Iterator[tuple[int, int, int, int, int]]:
    """Pieces ``(first batch, batches, first head, heads, group)`` of at most ``limit`` (batch, head) pairs.

    A piece covers whole batches when the heads of one fit; otherwise heads of one batch,
    in multiples of ``group`` (whole key / value heads), or within one key / value head when
    a group alone is too large (its heads then form one group of their own).
    """
    if heads <= limit:
        per = limit // heads
        for b0 in range(0, batch, per):
            yield b0, min(per, batch - b0), 0, heads, group
        return
    step = (limit // group) * group if group <= limit else limit
    for b in range(batch):
        h0 = 0
        while h0 < heads:
            if group <= limit:
                h1 = min(heads, h0 + step)
                yield b, 1, h0, h1 - h0, group
            else:
                h1 = min(h0 + step, (h0 // group + 1) * group)
                yield b, 1, h0, h1 - h0, h1 - h0
            h0 = h1


class AttentionOps(CudaCore):
    """attention."""

    def _exec_attention(self, p: v.AttentionProblem) -> None:
        if max(p.seq_q, p.seq_kv) > v.BLAS_INT_MAX:
            raise InvalidArgumentError("seq_q and seq_kv must fit in 32 bits")
        real, bucket = real_of(p.dtype.name), head_bucket(p.head_dim)
        if attention_bkv(real, bucket) < 1:
            raise UnsupportedError(
                f"attention with head_dim {p.head_dim} in {p.dtype.name} on {self.name()}: one key and "
                "value row do not fit in a block's 48 KiB of shared memory"
            )
        unit = attention_unit(real, bucket)
        q_rows, kv_rows = p.seq_q * p.head_dim, p.seq_kv * p.head_dim
        ms0, ms1, ms2, ms3 = p.mask_strides
        mask = p.mask.ptr if p.mask is not None else p.q.ptr  # not read without a mask
        blocks = ceil_div(p.seq_q, ATTENTION_BQ)
        for b0, nb, h0, nh, group in head_pieces(p.batch, p.heads, p.group):
            qo = (b0 * p.heads + h0) * q_rows
            kvo = (b0 * p.kv_heads + h0 // p.group) * kv_rows
            self._launch(
                unit, "attention_fwd", (blocks, nb * nh), (ATTENTION_BQ,),
                Ptr(p.q.ptr), I64(qo), Ptr(p.k.ptr), I64(kvo), Ptr(p.v.ptr), I64(kvo), Ptr(p.o.ptr), I64(qo),
                Ptr(mask), I64(b0 * ms0 + h0 * ms1), I64(ms0), I64(ms1), I64(ms2), I64(ms3),
                I32(p.mask is not None), I32(p.seq_q), I32(p.seq_kv), I32(p.head_dim),
                scalar(p.scale, p.dtype), I32(int(p.causal)), I32(nh), I32(group),
            )  # fmt: skip
