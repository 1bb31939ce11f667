"""Scaled dot-product attention on the CPU: tiles of queries against tiles of keys.

Each (head, query block) task keeps an online softmax (running maximum and sum) over
chunks of keys, so extra memory stays O(block_q * (block_kv + head_dim)) per thread
whatever the sequence length. Tasks are pulled by the worker threads, each with
single-threaded BLAS.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from ... import validation as v
from .._common import refuse_extensions
from ._plumbing import CpuPlumbing, FloatArray
from ._runtime import kernels, parallel_pull, single_threaded_blas

__all__ = ["AttentionOps"]


class AttentionOps(CpuPlumbing):
    """``attention``."""

    _block_q: int
    _block_kv: int

    def _exec_attention(self, p: v.AttentionProblem) -> None:
        refuse_extensions("cpu", "attention", p)
        dt = p.dtype
        bh = p.batch * p.heads
        q = self._array(p.q, (bh, p.seq_q, p.head_dim), dt)
        k = self._array(p.k, (bh, p.seq_kv, p.head_dim), dt)
        val = self._array(p.v, (bh, p.seq_kv, p.head_dim), dt)
        o = self._array(p.o, (bh, p.seq_q, p.head_dim), dt)
        tasks = [(h, i0) for h in range(bh) for i0 in range(0, p.seq_q, self._block_q)]
        block_q, block_kv = min(self._block_q, p.seq_q), min(self._block_kv, p.seq_kv)

        def run(items: Iterator[int]) -> None:
            # Per-thread scratch, reused by every tile: scores of one query block against
            # one key block.
            scratch = np.empty(block_q * (block_kv + block_kv // 2 + 1), dtype=dt)
            upper = np.arange(block_q)[None, :] >= np.arange(block_q)[:, None]
            for t in items:
                h, i0 = tasks[t]
                self._attention_block(p, q[h], k[h], val[h], o[h], i0, scratch, upper)

        with single_threaded_blas():
            parallel_pull(len(tasks), run)

    def _attention_block(
        self,
        p: v.AttentionProblem,
        q: FloatArray,
        k: FloatArray,
        val: FloatArray,
        o: FloatArray,
        i0: int,
        scratch: FloatArray,
        upper: npt.NDArray[np.bool_],
    ) -> None:
        """Online-softmax attention for query rows [i0, i0 + block) of one head.

        Keys are visited in chunks of ``block_kv``. Under a causal mask, keys no row of
        the block sees are never touched, and the mask is written only over the
        diagonal columns (keys some rows see and others do not); ``upper`` is the
        cached ``[block_q, block_q]`` mask ``t >= u`` of the usual diagonal block.
        """
        dt: Any = p.dtype
        i1 = min(i0 + self._block_q, p.seq_q)
        rows = i1 - i0
        qs = q[i0:i1] * dt.type(p.scale)
        row_max = np.full(rows, -np.inf, dtype=dt)
        row_sum = np.zeros(rows, dtype=dt)
        compiled = kernels("_kmath") if dt == np.float32 else None
        block_sum = np.empty(rows, dtype=dt)
        acc = np.zeros((rows, p.head_dim), dtype=dt)
        if p.causal:
            # Row i sees key j iff j <= i + offset.
            kv_end = max(0, min(p.seq_kv, i1 + p.causal_offset))
            open_end = max(0, min(kv_end, i0 + p.causal_offset + 1))
        else:
            kv_end = open_end = p.seq_kv
        # Equal chunks of at most 1.5 x block_kv keys: no thin remainder chunk, whose
        # fixed per-chunk cost (a dozen NumPy calls) would outweigh its work.
        chunks = max(1, (2 * kv_end + self._block_kv) // (2 * self._block_kv)) if kv_end else 0
        bounds = [kv_end * c // max(1, chunks) for c in range(chunks + 1)]
        for j0, j1 in zip(bounds[:-1], bounds[1:], strict=True):
            scores = scratch[: rows * (j1 - j0)].reshape(rows, j1 - j0)
            np.matmul(qs, k[j0:j1].T, out=scores)
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
            acc += scores @ val[j0:j1]
            row_max = new_max
        with np.errstate(invalid="ignore", divide="ignore"):
            np.divide(acc, row_sum[:, None], out=o[i0:i1])
        o[i0:i1][row_sum <= 0] = 0
