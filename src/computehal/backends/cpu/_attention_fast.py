"""Attention through the compiled query-block kernel of :mod:`._kattention`.

One task per (batch, head, block of query rows), pulled by the worker threads, each
with its own scratch (kept between calls; the kernel's products are compiled, no BLAS). Causal tasks are
ordered longest first (later query blocks see more keys), so the last tasks pulled are
the short ones. An additive mask is read in place through its element strides (0
along its broadcast dimensions). Calls whose values hold inf or NaN are left to the
general path of :mod:`._attention`.

A few query rows against many keys (a decoder step against its key/value cache) go
instead to :mod:`._kdecode`, one task per (batch, head): each key and value row read
once where it lies, no key panels, no scan of the values first. GPT-2-small's step
(12 heads, 1 query, 513 keys, ``head_dim`` 64), per call, one process, interleaved:
300 us against 439 us on the query-block kernel (one head: 8.3 us of compiled work;
a first version calling a separate dot-product function per key took 57).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ... import validation as v
from ._plumbing import CpuPlumbing
from ._runtime import kernels, parallel_pull, parallel_ranges
from ._scratch import thread_scratch

__all__ = ["fast_attention"]

#: Most query rows (with at least :data:`DECODE_KEYS` keys) that go to :mod:`._kdecode`.
DECODE_ROWS = 4
#: Fewest keys of a decoding call.
DECODE_KEYS = 64
#: Key and value bytes of a decoding call below which it runs on the calling thread
#: (GPT-2-small's step, 12 heads x 513 keys x 64, 3.2 MB: 410 us on the caller alone
#: against 515 us with a worker taking half the heads, hot; 470 against 646 after a
#: 16 MB copy: the worker did start at once and take its half, but the rows it reads
#: were just written from the caller's core).
DECODE_SERIAL_BYTES = 8 << 20
#: The mask argument of a decoding call without a mask (never read).
_NO_MASK = np.zeros(1, dtype=np.float32)
#: Values checked for inf / NaN per task of the parallel check.
_CHECK_BLOCK = 1 << 18


def _values_finite(values: Any) -> bool:
    """True when every value is finite (a compiled or-reduction split over the threads)."""
    flat = values.reshape(-1)
    check = kernels("_winograd").non_finite
    bad = [0]

    def run(start: int, stop: int) -> None:
        for lo in range(start * _CHECK_BLOCK, min(flat.size, stop * _CHECK_BLOCK), _CHECK_BLOCK):
            if check(flat[lo : lo + _CHECK_BLOCK]):
                bad[0] = 1

    parallel_ranges(-(-flat.size // _CHECK_BLOCK), run, grain=1)
    return not bad[0]


def fast_attention(p: v.AttentionProblem, block_q: int, block_kv: int) -> bool:
    """Compute ``p`` with the compiled kernel; False where this path does not apply."""
    if p.dtype != np.float32 or p.head_dim == 0:
        return False
    if p.seq_q <= DECODE_ROWS and p.seq_kv >= DECODE_KEYS and _decode(p):
        return True
    kern: Any = kernels("_kattention")
    if kern is None or kernels("_winograd") is None or kernels("_kdense") is None:
        return False
    dt = p.dtype
    view = CpuPlumbing._array
    q = view(p.q, (p.batch, p.heads, p.seq_q, p.head_dim), dt)
    k = view(p.k, (p.batch, p.kv_heads, p.seq_kv, p.head_dim), dt)
    val = view(p.v, (p.batch, p.kv_heads, p.seq_kv, p.head_dim), dt)
    o = view(p.o, (p.batch, p.heads, p.seq_q, p.head_dim), dt)
    if not _values_finite(val):
        return False
    flat_mask = None if p.mask is None else CpuPlumbing._flat(p.mask, dt)
    mb, mh, mq, mk = p.mask_strides
    placeholder = kern.no_mask()
    block_q, block_kv = min(block_q, p.seq_q), max(1, min(block_kv, p.seq_kv))
    starts = range(0, p.seq_q, block_q)
    if p.causal:
        starts = range(starts[-1], -1, -block_q)  # longest first
    tasks = [(b, h, i0) for i0 in starts for b in range(p.batch) for h in range(p.heads)]
    scale, offset = float(p.scale), p.causal_offset
    size = kern.attention_scratch(block_q, block_kv, p.head_dim)

    def run(items: Iterator[int]) -> None:
        work = thread_scratch("attention", size)
        for t in items:
            b, h, i0 = tasks[t]
            kv = h // p.group
            i1 = min(p.seq_q, i0 + block_q)
            mask = placeholder if flat_mask is None else (flat_mask, b * mb + h * mh, mq, mk)
            kern.attention_rows(
                q[b, h], k[b, kv], val[b, kv], o[b, h], i0, i1, scale, p.causal, offset, block_kv, work,
                mask, flat_mask is not None,
            )  # fmt: skip

    parallel_pull(len(tasks), run)
    return True


def _decode(p: v.AttentionProblem) -> bool:
    """``p`` on :func:`._kdecode.decode_head`, one task per (batch, head); False without the kernel."""
    kern: Any = kernels("_kdecode")
    if kern is None:
        return False
    dt, dim = p.dtype, p.head_dim
    flat = CpuPlumbing._flat
    q, k, val, o = flat(p.q, dt), flat(p.k, dt), flat(p.v, dt), flat(p.o, dt)
    rows, keys = p.seq_q, p.seq_kv
    ends = np.array(
        [min(keys, max(0, i + p.causal_offset + 1)) if p.causal else keys for i in range(rows)],
        dtype=np.int64,
    )
    mask = _NO_MASK if p.mask is None else flat(p.mask, dt)
    mb, mh, mq, mk = p.mask_strides
    scale = dt.type(p.scale)
    tasks = p.batch * p.heads

    def run(items: Iterator[int]) -> None:
        scores = thread_scratch("decode", keys)[:keys]
        for t in items:
            b, h = divmod(t, p.heads)
            kv = (b * p.kv_heads + h // p.group) * keys * dim
            qo = t * rows * dim
            kern.decode_head(
                q[qo : qo + rows * dim], k[kv : kv + keys * dim], val[kv : kv + keys * dim],
                o[qo : qo + rows * dim], rows, keys, dim, scale, ends, mask, b * mb + h * mh, mq, mk,
                p.mask is not None, scores,
            )  # fmt: skip

    if 2 * k.itemsize * p.batch * p.kv_heads * keys * dim < DECODE_SERIAL_BYTES:
        run(iter(range(tasks)))
    else:
        parallel_pull(tasks, run)
    return True
