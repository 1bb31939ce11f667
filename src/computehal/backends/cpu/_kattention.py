"""Compiled float32 attention over one block of query rows of one head (numba).

:func:`attention_rows` runs the whole online softmax of a query block in compiled
code: per chunk of keys, the scores ``Q_block K_chunk^T``, one pass per score row that
finds its maximum (order-preserving integer keys, which vectorise), rescales the
running sum and output row, and replaces the scores by their exponentials while
summing them, then ``P V_chunk`` added into the output rows. No Python runs between the
steps, and no temporary is allocated.

Both products are :func:`._kdense.product` (a register-tile kernel that reads its left
operand in place and wants a right operand of short contiguous rows): ``P V`` reads
``P`` where the softmax left it and ``V``'s rows (``head_dim`` long) as they are; the
scores take the chunk's keys transposed into panels of 64 keys by ``head_dim``
(:func:`_pack_keys`, 8 x 8 blocks transposed in registers). Measured
against OpenBLAS's ``sgemm`` in the same places (interleaved, CPU time of one thread,
S = 2048, D = 64, blocks 512): the scores product alone 140 against 112 GFLOP/s (OpenBLAS
packs both operands on every call), the whole kernel 115 against 106 GFLOP/s (0.92
against 0.84 of a 1024-cubed ``sgemm``; causal 102 against 96); on two threads,
+8 % full and causal. Products sum in order over their depth with fused multiply-adds.

Under a causal mask, chunks no row of the block sees are skipped; whole chunks of
:data:`kv_block` keys that every row sees run as in full attention, and the rest (the
diagonal region) is halved recursively: the lower half of a part's rows sees every key
its first row sees, which makes one full rectangle of GEMMs as wide as half the part;
only groups of :data:`DIAGONAL_ROWS` rows at the leaves multiply keys that the mask
then discards (about 3 % of the kept work at S = 2048, blocks of 512). Measured on one
thread (B=1, H=4, S=2048, D=64, blocks 512): causal runs at 0.88 of full attention's
rate per kept FLOP, against 0.85 when the diagonal was cut into 64-row groups (GEMMs
64 rows wide) after a chunk boundary at the block's first visible key (a one-key chunk
for the first block, thinner chunks for the others).

Where the time went with OpenBLAS's GEMMs (one thread, CPU time, a 512-query block
against 2048 keys): the two GEMMs 85 % (scores at 0.87 and ``P V`` at 0.91 of a
1024-cubed sgemm's rate), the softmax passes 12 %, the rest 3 %; a key-padding mask adds
3-4 % (adding it inside the maximum pass instead changed nothing measurable). Under the
causal mask a head costs 1.10-1.12 times full attention per kept FLOP: the diagonal
region runs at 1.4-1.5 times the full chunks' cost per kept pair (GEMMs 64 to 256 wide,
13 % of its products discarded). Splitting the diagonal on 16- or 64-key boundaries,
leaves of 32 or 128 rows, and blocks from 256 to 1024 on either side: no better than 512
x 512, 64 rows.

An additive mask (any broadcast of [batch, heads, seq_q, seq_kv]) is added to each
score tile right after its GEMM. NaN and infinity follow the definition
``softmax(Q K^T * scale + mask) V``: a NaN or +inf score makes its row NaN; a -inf
score gets weight 0, and a row with no finite score is 0. Values holding NaN or infinity are
left to the general path (``0 * NaN`` would reach rows whose weight for that key is 0).
"""

# The function bodies are numba nopython code: numba types them, and numba's stubs
# cannot describe that to mypy.
# mypy: ignore-errors

from __future__ import annotations

import numpy as np

from ._kdense import PANEL, product
from ._ksoftmax import exp_fast
from ._nb import jit, jit_reassoc, order_key, transpose8, wide_vectors

__all__ = ["attention_rows", "attention_scratch", "no_mask", "DIAGONAL_ROWS", "warm_up"]

_F = np.float32
_ZERO = _F(0.0)
_ONE = _F(1.0)
_INF = _F(np.inf)

#: Query rows per group of the causal diagonal region.
DIAGONAL_ROWS = 64


def attention_scratch(rows: int, kv_block: int, head_dim: int) -> int:
    """Float32 elements of scratch one :func:`attention_rows` call needs."""
    return rows * kv_block + 2 * rows * head_dim + 3 * rows + _packed_keys(kv_block, head_dim)


def _packed_keys(kv_block: int, head_dim: int) -> int:
    """Float32 elements of a chunk of keys packed by :func:`_pack_keys`."""
    return -(-kv_block // PANEL) * PANEL * head_dim


@jit
def _pack_keys(kf, j0, j1, head_dim, kt):
    """``kt[p, d, c] = K[j0 + PANEL p + c, d]``: the chunk's keys transposed, in panels of
    :data:`._kdense.PANEL` keys whose ``head_dim`` rows are contiguous (8 x 8 blocks in registers)."""
    n = j1 - j0
    d8 = head_dim // 8 * 8
    for p in range(0, n, PANEL):
        m = min(PANEL, n - p)
        base = (p // PANEL) * head_dim * PANEL
        m8 = m // 8 * 8
        for c in range(0, m8, 8):
            src = (j0 + p + c) * head_dim
            for d in range(0, d8, 8):
                transpose8(kf, src + d, head_dim, kt, base + d * PANEL + c, PANEL)
            for d in range(d8, head_dim):
                for i in range(8):
                    kt[base + d * PANEL + c + i] = kf[src + i * head_dim + d]
        for c in range(m8, m):
            src = (j0 + p + c) * head_dim
            for d in range(head_dim):
                kt[base + d * PANEL + c] = kf[src + d]


@jit
def _row_peak(row, count):
    """Largest of ``row[:count]`` by order keys (a NaN with a clear sign bit wins: NaN rows stay NaN)."""
    wide_vectors()
    best = order_key(-_INF)
    for t in range(count):
        key = order_key(row[t])
        best = key if key > best else best
    return order_key(best)


@jit_reassoc
def _exp_row(row, count, shift):
    """``row[t] = exp(row[t] - shift)`` for ``t < count``, 0 beyond; returns the sum."""
    wide_vectors()
    total = _ZERO
    for t in range(count):
        e = exp_fast(row[t] - shift)
        row[t] = e
        total += e
    for t in range(count, row.shape[0]):
        row[t] = _ZERO
    return total


@jit
def _softmax_rows(scores, nr, kb, diagonal, first_visible, peak, total, acc, head_dim):
    """Online-softmax step for ``nr`` score rows of ``kb`` keys.

    Row ``u`` sees the first ``first_visible + u`` keys of the chunk on the ``diagonal``,
    every key otherwise.
    """
    wide_vectors()
    for u in range(nr):
        row = scores[u * kb : (u + 1) * kb]
        count = max(0, min(kb, first_visible + u)) if diagonal else kb
        old = peak[u]
        new = _row_peak(row, count)
        new = new if new > old or new != new else old
        safe = new if new > -_INF else _ZERO
        old_safe = old if old > -_INF else _ZERO
        correction = exp_fast(old_safe - safe) if total[u] != _ZERO else _ONE
        total[u] = total[u] * correction + _exp_row(row, count, safe)
        peak[u] = new
        if correction != _ONE:
            line = acc[u * head_dim : (u + 1) * head_dim]
            for d in range(head_dim):
                line[d] = line[d] * correction


@jit
def _add_mask(scores, nr, kb, mask, r0, j0):
    """``scores[u, t] += M[r0 + u, j0 + t]``; ``mask`` is (flat, origin, row stride, column stride)."""
    wide_vectors()
    flat, origin, mq, mk = mask
    for u in range(nr):
        row = scores[u * kb : (u + 1) * kb]
        base = origin + (r0 + u) * mq + j0 * mk
        if mk == 0:
            value = flat[base]
            for t in range(kb):
                row[t] += value
        elif mk == 1:
            extra = flat[base : base + kb]
            for t in range(kb):
                row[t] += extra[t]
        else:
            for t in range(kb):
                row[t] += flat[base + t * mk]


@jit
def _chunk(
    k, v, qs, u0, u1, j0, j1, diagonal, first_visible, scores, peak, total, acc, mask, has_mask, i0, kt
):
    """Keys ``[j0, j1)`` for block rows ``[u0, u1)``: scores (+ mask), online softmax, ``acc += P V``."""
    head_dim = k.shape[1]
    nr, kb = u1 - u0, j1 - j0
    kf = k.reshape(-1)
    vf = v.reshape(-1)
    # S (nr x kb) = Qs (nr x D) @ K_chunk^T, one packed panel of keys at a time.
    _pack_keys(kf, j0, j1, head_dim, kt)
    rows_q = qs[u0 * head_dim :]
    for p in range(0, kb, PANEL):
        at = (p // PANEL) * head_dim * PANEL
        after = at + head_dim * PANEL if p + PANEL < kb else 0
        product(
            rows_q, head_dim, 1, kt, at, PANEL, scores, p, kb, nr, head_dim, min(PANEL, kb - p), False, after
        )
    if has_mask:
        _add_mask(scores, nr, kb, mask, i0 + u0, j0)
    _softmax_rows(
        scores,
        nr,
        kb,
        diagonal,
        first_visible,
        peak[u0:u1],
        total[u0:u1],
        acc[u0 * head_dim : u1 * head_dim],
        head_dim,
    )
    # acc[u0:u1] += P (nr x kb) @ V_chunk (kb x D): P read in place, not packed.
    after = j1 * head_dim if j1 < v.shape[0] else j0 * head_dim
    product(
        scores,
        kb,
        1,
        vf,
        j0 * head_dim,
        head_dim,
        acc,
        u0 * head_dim,
        head_dim,
        nr,
        kb,
        head_dim,
        True,
        after,
    )


@jit
def _keys(ctx, u0, u1, j0, end, diagonal):
    """Keys ``[j0, end)`` for block rows ``[u0, u1)`` in chunks of ``kv_block`` (on the
    ``diagonal``: row ``u`` sees the keys before ``i0 + u + offset + 1``).

    ``ctx`` is ``(k, v, qs, scores, peak, total, acc, mask, has_mask, i0, offset, kv_block, kt)``.
    """
    k, v, qs, scores, peak, total, acc, mask, has_mask, i0, offset, kv_block, kt = ctx
    while j0 < end:
        j1 = min(end, j0 + kv_block)
        first = i0 + u0 + offset + 1 - j0  # keys of the chunk row u0 sees
        _chunk(k, v, qs, u0, u1, j0, j1, diagonal, first, scores, peak, total, acc, mask, has_mask, i0, kt)
        j0 = j1


@jit
def _diagonal(ctx, rows, open_end, kv_end):
    """The causal diagonal region: keys ``[open_end, kv_end)``, which not every row of the block sees.

    Halved recursively (an explicit stack): rows ``[mid, u1)`` of a part see every key
    that row ``mid`` sees, so those keys form one full rectangle (GEMMs as wide as half
    the part); the two halves are then split again, down to groups of
    :data:`DIAGONAL_ROWS` rows, which multiply the keys their last row sees and mask the
    rest. Only the leaves' triangles are computed and discarded. ``ctx`` as :func:`_keys`.
    """
    i0, offset = ctx[9], ctx[10]
    stack = np.empty((64, 3), dtype=np.int64)
    stack[0, 0], stack[0, 1], stack[0, 2] = 0, rows, open_end
    top = 1
    while top > 0:
        top -= 1
        u0, u1, j0 = stack[top, 0], stack[top, 1], stack[top, 2]
        end = min(kv_end, i0 + u1 + offset)  # the keys the part's last row sees
        if end <= j0:
            continue
        if u1 - u0 <= DIAGONAL_ROWS:
            _keys(ctx, u0, u1, j0, end, True)
            continue
        mid = u0 + (u1 - u0) // 2
        seen = min(end, max(j0, i0 + mid + offset + 1))  # every row from mid on sees keys [j0, seen)
        _keys(ctx, mid, u1, j0, seen, False)
        stack[top, 0], stack[top, 1], stack[top, 2] = u0, mid, j0
        stack[top + 1, 0], stack[top + 1, 1], stack[top + 1, 2] = mid, u1, seen
        top += 2


@jit
def attention_rows(q, k, v, o, i0, i1, scale, causal, offset, kv_block, work, mask, has_mask):
    """Output rows ``[i0, i1)`` of one head: ``softmax(q K^T * scale + mask) V`` over its visible keys.

    ``q`` / ``o`` are [seq_q, D], ``k`` / ``v`` [seq_kv, D] (C-contiguous float32). With
    ``causal``, query ``i`` sees key ``j`` iff ``j <= i + offset``. ``mask`` is
    ``(flat, origin, row stride, column stride)``: element ``[i, j]`` of the [seq_q,
    seq_kv] mask of this head is ``flat[origin + i * row stride + j * column stride]``
    (stride 0 along broadcast dimensions); it is added when ``has_mask``. ``work`` holds
    :func:`attention_scratch` elements. A row that sees no key (or only -inf scores) is 0.
    """
    rows = i1 - i0
    head_dim = q.shape[1]
    seq_kv = k.shape[0]
    scores = work[: rows * kv_block]
    qs = work[rows * kv_block : rows * kv_block + rows * head_dim]
    acc = work[rows * kv_block + rows * head_dim : rows * kv_block + 2 * rows * head_dim]
    rest = rows * kv_block + 2 * rows * head_dim
    peak = work[rest : rest + rows]
    total = work[rest + rows : rest + 2 * rows]
    kt = work[rest + 3 * rows :]
    for u in range(rows):
        src = q[i0 + u]
        for d in range(head_dim):
            qs[u * head_dim + d] = src[d] * scale
    acc[:] = _ZERO
    peak[:] = -_INF
    total[:] = _ZERO
    if causal:
        kv_end = max(0, min(seq_kv, i1 + offset))
        # Whole chunks of keys every row sees; the rest (a few keys every row sees, then
        # the triangle) goes to the diagonal region, which splits it into wide GEMMs.
        open_end = max(0, min(kv_end, i0 + offset + 1)) // kv_block * kv_block
        chunks = open_end // kv_block
    else:
        kv_end = open_end = seq_kv
        chunks = -(-open_end // kv_block)  # equal chunks, none thin
    for c in range(chunks):
        j0 = open_end * c // chunks
        j1 = open_end * (c + 1) // chunks
        _chunk(k, v, qs, 0, rows, j0, j1, False, 0, scores, peak, total, acc, mask, has_mask, i0, kt)
    if kv_end > open_end:
        ctx = (k, v, qs, scores, peak, total, acc, mask, has_mask, i0, offset, kv_block, kt)
        _diagonal(ctx, rows, open_end, kv_end)
    for u in range(rows):
        dst = o[i0 + u]
        line = acc[u * head_dim : (u + 1) * head_dim]
        t = total[u]
        if t > _ZERO or t != t:
            factor = _ONE / t
            for d in range(head_dim):
                dst[d] = line[d] * factor
        else:
            dst[:] = _ZERO


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel now."""
    q = np.zeros((4, 2), dtype=_F)
    work = np.zeros(attention_scratch(4, 4, 2), dtype=_F)
    attention_rows(q, q, q, q, 0, 4, 1.0, True, 0, 4, work, no_mask(), False)


def no_mask() -> tuple[np.ndarray, int, int, int]:
    """The ``mask`` argument of a call without a mask."""
    return (np.zeros(1, dtype=_F), 0, 0, 0)
