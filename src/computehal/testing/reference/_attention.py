"""Scaled dot-product attention, one query row at a time (the full score row is formed)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ._rounding import F64Array

__all__ = ["attention"]


def attention(
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    v: npt.ArrayLike,
    scale: float,
    causal: bool,
    *,
    mask: npt.ArrayLike | None = None,
) -> F64Array:
    """``softmax(Q K^T * scale + mask) V`` per (batch, head) with grouped key/value heads.

    ``q`` is [B, H, Sq, D]; ``k`` and ``v`` are [B, Hkv, Skv, D] with ``Hkv`` dividing
    ``H`` (query head ``h`` reads key/value head ``h // (H / Hkv)``); ``mask`` broadcasts
    (NumPy rules) to [B, H, Sq, Skv]. Key ``j`` is visible to query ``i`` when the
    bottom-right causal rule allows it (``j <= i + Skv - Sq``) and its masked score is
    not -inf. A row with no visible key is zero; otherwise the softmax runs over the
    visible keys only, in IEEE arithmetic: a NaN score, or a NaN or infinity in a
    visible value, reaches the row, and a +inf score makes it NaN (``inf - inf``).
    """
    q64, k64, v64 = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    batch, heads, seq_q, head_dim = q64.shape
    kv_heads, seq_kv = k64.shape[1], k64.shape[2]
    group = heads // kv_heads
    shape = (batch, heads, seq_q, seq_kv)
    additive = np.zeros(shape) if mask is None else np.broadcast_to(np.asarray(mask, dtype=np.float64), shape)
    allowed = np.ones((seq_q, seq_kv), dtype=bool)
    if causal:
        allowed = np.arange(seq_kv)[None, :] <= np.arange(seq_q)[:, None] + (seq_kv - seq_q)
    out = np.zeros((batch, heads, seq_q, head_dim))
    with np.errstate(all="ignore"):
        for b in range(batch):
            for h in range(heads):
                keys, values = k64[b, h // group], v64[b, h // group]
                scores = np.einsum("id,jd->ij", q64[b, h], keys) * scale + additive[b, h]
                for i in range(seq_q):
                    visible = allowed[i] & (scores[i] != -np.inf)
                    if not visible.any():
                        continue
                    row = scores[i][visible]
                    weights = np.exp(row - np.max(row))
                    out[b, h, i] = np.einsum("j,jd->d", weights / weights.sum(), values[visible])
    return out
