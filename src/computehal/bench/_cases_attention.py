"""Attention rows: full, causal, with an additive padding mask, grouped-query; peak memory.

FLOPs count the two GEMMs (``4 * B * H * S_q * S_kv * D``), for causal attention only
the pairs the mask keeps. On the CPU the rows are held against the host's sgemm; on
CUDA against PyTorch's ``scaled_dot_product_attention`` on the same problem (by time);
elsewhere against the compute ceiling without a verdict. Batch 0, head 0 of each result
is checked against NumPy in float64.
"""

from __future__ import annotations

import gc
import math
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from ._context import BenchContext, relative_error
from ._groups import register_group
from ._harness import Case, ValueCase, compute_case

__all__ = ["attention_cases"]

F32 = np.float32
MIB = 1 << 20
#: The name of the PyTorch reference (the only attention reference with a target).
SDPA = "torch SDPA"


def attention_reference(
    q: npt.NDArray[Any],
    k: npt.NDArray[Any],
    v: npt.NDArray[Any],
    scale: float,
    causal: bool,
    bias: npt.NDArray[Any] | None,
) -> npt.NDArray[np.float64]:
    """One head: ``softmax(q k^T * scale + bias) v`` in float64 ([S, D] operands)."""
    scores = q.astype(np.float64) @ k.astype(np.float64).T * scale
    if bias is not None:
        scores = scores + bias
    if causal:
        scores[np.triu_indices(scores.shape[0], 1 + scores.shape[1] - scores.shape[0])] = -np.inf
    scores -= scores.max(axis=1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=1, keepdims=True)
    result: npt.NDArray[np.float64] = weights @ v.astype(np.float64)
    return result


def _case(
    ctx: BenchContext, variant: str, causal: bool = False, mask: bool = False, grouped: bool = False
) -> Case:
    b, h, s, d = ctx.sizes.attention
    kvh = max(1, ctx.sizes.kv_heads) if grouped else h
    q = ctx.rng.standard_normal((b, h, s, d), dtype=F32)
    k = ctx.rng.standard_normal((b, kvh, s, d), dtype=F32)
    v = ctx.rng.standard_normal((b, kvh, s, d), dtype=F32)
    bias = ctx.rng.standard_normal((b, 1, 1, s), dtype=F32) if mask else None
    pq, pk, pv, po = ctx.put(q), ctx.put(k), ctx.put(v), ctx.empty(q.nbytes)
    extra: dict[str, Any] = {}
    if bias is not None:
        extra.update(mask_ptr=ctx.put(bias), mask_shape=bias.shape)
    if grouped:
        extra["kv_heads"] = kvh
    scale = 1.0 / math.sqrt(d)

    def run() -> None:
        ctx.backend.attention(pq, pk, pv, po, b, h, s, s, d, scale, causal, **extra)

    def verify() -> float:
        got = ctx.read(po, q.shape)[0, 0]
        want = attention_reference(
            q[0, 0], k[0, 0], v[0, 0], scale, causal, None if bias is None else bias[0, 0]
        )
        return relative_error(got, want)

    pairs = s * (s + 1) / 2 if causal else s * s
    flops = 4.0 * b * h * d * pairs
    limit = ctx.ceilings.vendor.attention((b, h, s, d), causal, mask, kvh)
    key = "attention_causal" if causal else "attention"
    target = ctx.target(key) if limit is None or limit.name == SDPA else None
    if limit is None:
        limit = ctx.ceilings.compute
    moved = 4.0 * (2 * q.size + k.size + v.size + (0 if bias is None else bias.size))
    params = f"B={b} H={h} S={s} D={d} {variant}" + (f" kv_heads={kvh}" if grouped else "")
    return compute_case("attention", params, run, flops, moved, limit, target, verify=verify)


def _memory_case(ctx: BenchContext) -> ValueCase:
    """Peak extra host memory (tracemalloc sees NumPy's allocations) at a long sequence."""
    s, d = ctx.sizes.attention_memory_seq, 64
    pq, pk, pv = (ctx.put(ctx.rng.standard_normal((s, d), dtype=F32)) for _ in range(3))
    po = ctx.empty(s * d * 4)
    scale = 1.0 / math.sqrt(d)

    def measure(repeats: int) -> list[float]:
        peaks = []
        gc.collect()
        for causal in (False, True):
            tracemalloc.start()
            try:
                ctx.backend.attention(pq, pk, pv, po, 1, 1, s, s, d, scale, causal)
                peaks.append(tracemalloc.get_traced_memory()[1] / MIB)
            finally:
                tracemalloc.stop()
        return [max(peaks)]

    return ValueCase(
        "attention_memory", f"B=1 H=1 S={s} D={d} peak extra", "MiB", measure, ctx.target("attention_memory")
    )


def attention_cases(ctx: BenchContext) -> Iterator[Case | ValueCase]:
    """Full, causal, masked and grouped-query attention; peak memory on the CPU."""
    for variant, kwargs in (
        ("full", {}),
        ("causal", {"causal": True}),
        ("mask [B,1,1,S]", {"mask": True}),
        ("GQA", {"grouped": True}),
    ):
        with ctx.scope():
            yield _case(ctx, variant, **kwargs)
    if ctx.profile == "cpu" and ctx.sizes.attention_memory_seq > 0:
        yield _memory_case(ctx)


register_group(
    "attention",
    attention_cases,
    description="attention full / causal / mask / GQA, peak memory",
    default=True,
)
