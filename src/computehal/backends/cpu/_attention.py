"""Scaled dot-product attention on the CPU: tiles of queries against tiles of keys.

Each (batch, head, query block) task keeps an online softmax (running maximum and sum)
over chunks of keys, so extra memory stays O(block_q * (block_kv + head_dim)) per thread
whatever the sequence length. Tasks are pulled by the worker threads, each with
single-threaded BLAS. Query head ``h`` reads key/value head ``h // (heads / kv_heads)``;
an additive mask is read through a strided view (stride 0 along its broadcast
dimensions), one tile at a time.

A key hidden from a query (by the causal rule, or a masked score of -inf) gets weight 0,
and ``0 * NaN`` would still be NaN: a value tile holding NaN or infinity is multiplied
without those entries, which are then added back for the queries that see their key.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ... import validation as v
from ._attention_fast import fast_attention
from ._plumbing import CpuPlumbing, FloatArray
from ._runtime import kernels, parallel_pull, single_threaded_blas
from ._strided import strided_view

__all__ = ["AttentionOps"]


@dataclass
class _Head:
    """One (batch, head) pair: its query / output rows, key / value rows and mask view."""

    q: FloatArray
    k: FloatArray
    v: FloatArray
    o: FloatArray
    mask: FloatArray | None  # [seq_q, seq_kv] view (broadcast dimensions have stride 0)


def _add_values(
    acc: FloatArray, weights: FloatArray, values: FloatArray, visible: npt.NDArray[np.bool_]
) -> None:
    """``acc += weights @ values`` where non-finite values reach only the rows that see their key."""
    bad = ~np.isfinite(values)
    clean = np.where(bad, values.dtype.type(0), values)
    acc += weights @ clean
    for j, d in zip(*np.nonzero(bad), strict=True):
        acc[:, d] += np.where(visible[:, j], weights[:, j] * values[j, d], 0)


class AttentionOps(CpuPlumbing):
    """``attention`` (with an additive mask, grouped-query heads and ``seq_q != seq_kv``)."""

    _block_q: int
    _block_kv: int

    def _heads(self, p: v.AttentionProblem) -> list[_Head]:
        dt = p.dtype
        q = self._array(p.q, (p.batch, p.heads, p.seq_q, p.head_dim), dt)
        k = self._array(p.k, (p.batch, p.kv_heads, p.seq_kv, p.head_dim), dt)
        val = self._array(p.v, (p.batch, p.kv_heads, p.seq_kv, p.head_dim), dt)
        o = self._array(p.o, (p.batch, p.heads, p.seq_q, p.head_dim), dt)
        flat_mask = None if p.mask is None else self._flat(p.mask, dt)
        mb, mh, mq, mk = p.mask_strides
        heads = []
        for b in range(p.batch):
            for h in range(p.heads):
                mask = None
                if flat_mask is not None:
                    mask = strided_view(flat_mask, b * mb + h * mh, (p.seq_q, p.seq_kv), (mq, mk))
                kv = h // p.group
                heads.append(_Head(q[b, h], k[b, kv], val[b, kv], o[b, h], mask))
        return heads

    def _exec_attention(self, p: v.AttentionProblem) -> None:
        if fast_attention(p, self._block_q, self._block_kv):
            return
        heads = self._heads(p)
        tasks = [(h, i0) for h in range(len(heads)) for i0 in range(0, p.seq_q, self._block_q)]
        block_q, block_kv = min(self._block_q, p.seq_q), min(self._block_kv, p.seq_kv)

        def run(items: Iterator[int]) -> None:
            # Per-thread scratch, reused by every tile: scores of one query block against
            # one key block.
            scratch = np.empty(block_q * (block_kv + block_kv // 2 + 1), dtype=p.dtype)
            upper = np.arange(block_q)[None, :] >= np.arange(block_q)[:, None]
            for t in items:
                h, i0 = tasks[t]
                self._attention_block(p, heads[h], i0, scratch, upper)

        with single_threaded_blas():
            parallel_pull(len(tasks), run)

    def _key_chunks(self, p: v.AttentionProblem, i0: int, i1: int) -> tuple[list[tuple[int, int]], int]:
        """The key chunks rows [i0, i1) may see, and where the causally hidden columns start.

        Under a causal mask, keys no row of the block sees are never touched. Chunks are
        equal, at most 1.5 x block_kv keys: no thin remainder chunk, whose fixed cost (a
        dozen NumPy calls) would outweigh its work.
        """
        if p.causal:
            # Row i sees key j iff j <= i + offset.
            kv_end = max(0, min(p.seq_kv, i1 + p.causal_offset))
            open_end = max(0, min(kv_end, i0 + p.causal_offset + 1))
        else:
            kv_end = open_end = p.seq_kv
        chunks = max(1, (2 * kv_end + self._block_kv) // (2 * self._block_kv)) if kv_end else 0
        bounds = [kv_end * c // max(1, chunks) for c in range(chunks + 1)]
        return list(zip(bounds[:-1], bounds[1:], strict=True)), open_end

    def _attention_block(
        self, p: v.AttentionProblem, head: _Head, i0: int, scratch: FloatArray, upper: npt.NDArray[np.bool_]
    ) -> None:
        """Online-softmax attention for query rows [i0, i0 + block) of one head.

        The causal mask is written only over the diagonal columns (keys some rows see
        and others do not); ``upper`` is the cached ``[block_q, block_q]`` mask ``t >= u``
        of the usual diagonal block.
        """
        dt: Any = p.dtype
        i1 = min(i0 + self._block_q, p.seq_q)
        rows = i1 - i0
        qs = head.q[i0:i1] * dt.type(p.scale)
        row_max = np.full(rows, -np.inf, dtype=dt)
        row_sum = np.zeros(rows, dtype=dt)
        compiled = kernels("_kmath") if dt == np.float32 else None
        block_sum = np.empty(rows, dtype=dt)
        acc = np.zeros((rows, p.head_dim), dtype=dt)
        chunks, open_end = self._key_chunks(p, i0, i1)
        for j0, j1 in chunks:
            scores = scratch[: rows * (j1 - j0)].reshape(rows, j1 - j0)
            np.matmul(qs, head.k[j0:j1].T, out=scores)
            if head.mask is not None:
                scores += head.mask[i0:i1, j0:j1]
            if j1 > open_end:
                # Only the diagonal columns [m0, j1) are partly hidden: key m0 + t is
                # hidden from row i0 + u iff t - u > i0 + offset - m0.
                m0 = max(j0, open_end)
                limit = i0 + p.causal_offset - m0
                if limit == -1 and j1 - m0 <= upper.shape[1]:
                    hidden = upper[:rows, : j1 - m0]  # the usual case: t >= u
                else:
                    hidden = np.arange(j1 - m0)[None, :] - np.arange(rows)[:, None] > limit
                np.copyto(scores[:, m0 - j0 :], dt.type(-np.inf), where=hidden)
            values = head.v[j0:j1]
            visible = None if np.isfinite(values).all() else scores != -np.inf
            block_max = np.max(scores, axis=1)
            new_max = np.maximum(row_max, block_max)
            # Rows that have seen no key yet keep a finite reference so exp() gives 0.
            safe_max = np.where(np.isneginf(new_max), dt.type(0), new_max)
            correction = np.exp(row_max - safe_max)
            row_sum *= correction
            if compiled is not None:
                compiled.exp_shifted_rowsum(scores, safe_max, block_sum)
                row_sum += block_sum
            else:
                np.subtract(scores, safe_max[:, None], out=scores)
                np.exp(scores, out=scores)
                row_sum += np.add.reduce(scores, axis=1)
            acc *= correction[:, None]
            if visible is None:
                acc += scores @ values
            else:
                _add_values(acc, scores, values, visible)
            row_max = new_max
        with np.errstate(invalid="ignore", divide="ignore"):
            np.divide(acc, row_sum[:, None], out=head.o[i0:i1])
        head.o[i0:i1][row_sum <= 0] = 0
