"""Compiled float32 attention for a few query rows against many keys: decoding (numba).

A decoder step asks for one query row (or a handful) per head against a key/value
cache of hundreds or thousands of rows. The query-block kernel of :mod:`._kattention`
is built for blocks of many rows: it transposes each chunk of keys into panels and
runs register-tile products of which one row is used, and its caller first scans the
values for inf / NaN. Here each head is two passes over its rows, the way they lie:

* the scores: ``s_j = scale (q . k_j) + mask_j`` for the keys ``j`` the row sees, the
  query held in registers and each key row read once (one vector product and one sum
  per key);
* the weights ``exp(s_j - max)`` (:func:`._ksoftmax.exp_fast`) and their sum, then
  ``o = sum_j w_j v_j / sum`` with each value row read once.

NaN and infinity follow the definition ``softmax(Q K^T * scale + mask) V`` as the other
paths do: a NaN or +inf score makes its row NaN, a -inf score (or a key hidden by the
causal rule) gets weight 0 and its value row is not read, every visible value row is
multiplied by its weight (``0 * NaN`` is NaN, as in the product), and a row with no
finite score is 0.
"""

# The function bodies are numba nopython code: numba types them, and numba's stubs
# cannot describe that to mypy.
# mypy: ignore-errors

from __future__ import annotations

import numpy as np

from ._ksoftmax import exp_fast
from ._nb import jit_reassoc

__all__ = ["decode_head", "warm_up"]

_F = np.float32
_ZERO = _F(0.0)
_INF = _F(np.inf)
_NAN = _F(np.nan)


# Reassociation lets LLVM keep each dot product's partial sums in vectors; nothing else
# here could change under it (comparisons keep their IEEE meaning).
@jit_reassoc
def decode_head(q, k, v, o, rows, keys, dim, scale, visible_end, mask, m0, mq, mk, has_mask, scores):
    """Attention of ``rows`` query rows of one head against ``keys`` key / value rows.

    ``q``, ``o`` [rows, dim], ``k``, ``v`` [keys, dim] as 1-D float32 arrays; row ``i`` sees
    keys ``j < visible_end[i]`` (``keys`` without the causal rule) and adds
    ``mask[m0 + i mq + j mk]`` to each score where ``has_mask``. ``scores`` holds at
    least ``keys`` floats (scratch).
    """
    for i in range(rows):
        end = visible_end[i]
        peak = -_INF
        bad = False
        for j in range(end):
            s = _ZERO
            for d in range(dim):
                s += q[i * dim + d] * k[j * dim + d]
            s *= scale
            if has_mask:
                s += mask[m0 + i * mq + j * mk]
            scores[j] = s
            if s != s or s == _INF:
                bad = True
            elif s > peak:
                peak = s
        out = i * dim
        for d in range(dim):
            o[out + d] = _ZERO
        if bad:
            for d in range(dim):
                o[out + d] = _NAN
            continue
        if peak == -_INF:
            continue  # no key visible, or every score -inf: the row is 0
        total = _ZERO
        for j in range(end):
            s = scores[j]
            if s == -_INF:
                continue  # weight 0, and its value row never read
            w = exp_fast(s - peak)
            total += w
            for d in range(dim):
                o[out + d] += w * v[j * dim + d]
        inv = _F(1.0) / total
        for d in range(dim):
            o[out + d] *= inv


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel, and check it on a small case."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 5)).astype(np.float32)
    k = rng.standard_normal((7, 5)).astype(np.float32)
    v = rng.standard_normal((7, 5)).astype(np.float32)
    o = np.empty((2, 5), dtype=np.float32)
    ends = np.array([6, 7], dtype=np.int64)
    mask = np.zeros(1, dtype=np.float32)
    scratch = np.empty(7, dtype=np.float32)
    flat = (q.ravel(), k.ravel(), v.ravel(), o.ravel())
    decode_head(*flat, 2, 7, 5, _F(0.5), ends, mask, 0, 0, 0, False, scratch)
    for i, end in enumerate(ends):
        s = (q[i].astype(np.float64) @ k[:end].T.astype(np.float64)) * 0.5
        w = np.exp(s - s.max())
        want = (w / w.sum()) @ v[:end]
        if not np.allclose(o[i], want, rtol=1e-5, atol=1e-5):
            raise RuntimeError("the compiled decoding attention gives wrong results here")
