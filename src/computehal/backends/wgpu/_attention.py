"""Scaled dot-product attention (wgpu_attention.wgsl): an online softmax, one invocation per query row.

An additive mask (read through broadcast strides), grouped-query heads and
``seq_q != seq_kv`` are parameters of the same kernel. Keys stream through each
invocation with a running maximum, sum and accumulator, so memory stays linear in the
sequence length. On llvmpipe, where one invocation may not loop over all keys, a column
chunk and a range of keys run per dispatch and every row's online-softmax state is
carried between dispatches in a scratch buffer, so the result is that of a single pass.
"""

from __future__ import annotations

from ... import validation as v
from ...errors import UnsupportedError
from .._common import ceil_div
from ._device import Gpu
from ._queue import MAX_GROUPS, Step, pack

__all__ = ["attention"]

#: Output columns per pass over the keys (DC in wgpu_attention.wgsl).
DC = 128


def attention(gpu: Gpu, p: v.AttentionProblem) -> None:
    """Run validated attention."""
    heads = p.batch * p.heads
    bq, bk, bv, bo = (
        gpu.bind(n, r) for n, r in (("q_ptr", p.q), ("k_ptr", p.k), ("v_ptr", p.v), ("o_ptr", p.o))
    )
    offset = max(-(2**31), min(2**31 - 1, p.causal_offset))
    gy = min(heads, MAX_GROUPS)
    grid = (ceil_div(p.seq_q, 64), gy, ceil_div(heads, gy))
    if grid[0] > MAX_GROUPS or grid[2] > MAX_GROUPS:
        raise UnsupportedError(
            f"attention over {heads} heads x {p.seq_q} queries exceeds the dispatch grid limits"
        )
    # Loop iterations of one invocation: per DC-column chunk, per key the key loop, the
    # score loop over head_dim and the accumulator loop over the chunk (each 4 columns an
    # iteration, then up to 3 single columns); per chunk the state load / store and output loops.
    dc = min(p.head_dim, DC)
    chunks = ceil_div(p.head_dim, DC)
    per_key = p.head_dim // 4 + p.head_dim % 4 + dc // 4 + 3 + 5
    fixed = 3 * (dc + 1) + 4
    one_pass = chunks * (p.seq_kv * per_key + fixed) + 1
    stride = p.head_dim + 2 * chunks
    bm = gpu.dummy() if p.mask is None else gpu.bind("mask_ptr", p.mask)
    base = (heads, p.seq_q, p.seq_kv, p.head_dim, p.causal, offset, bq.elem, bk.elem, bv.elem, bo.elem)
    # heads, kv_heads, group, has_mask, mask offset, a pad word (the strides are a vec4), strides.
    tail = (p.heads, p.kv_heads, p.group, p.mask is not None, bm.elem, 0, *p.mask_strides)
    scale = float(p.scale)
    if gpu.loop_budget is None or one_pass <= gpu.loop_budget:
        params = pack(*base, scale, 0, p.head_dim, 0, p.seq_kv, 1, 1, stride, *tail)
        gpu.run([Step("attention", params, (bq, bk, bv, bo, gpu.dummy(), bm), grid)])
        return
    keys = (gpu.loop_budget - fixed - 2) // per_key
    gpu.check_loops(
        f"attention with head_dim {p.head_dim} (one key per shader invocation)", per_key + fixed + 2
    )
    state, bs = gpu.temporary(4 * heads * p.seq_q * stride, "computehal-attention-state")
    steps = []
    for c in range(chunks):
        d_lo, d_hi = c * DC, min(p.head_dim, (c + 1) * DC)
        for kv_lo in range(0, p.seq_kv, keys):
            kv_hi = min(p.seq_kv, kv_lo + keys)
            flags = (kv_lo == 0, kv_hi == p.seq_kv)
            params = pack(*base, scale, d_lo, d_hi, kv_lo, kv_hi, *flags, stride, *tail)
            steps.append(Step("attention", params, (bq, bk, bv, bo, bs, bm), grid))
    gpu.run(steps, retire=[state])
