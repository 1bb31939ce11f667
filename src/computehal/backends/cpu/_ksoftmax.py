"""Compiled float32 softmax and log-softmax at the memory's speed (numba).

Rows (the axis contiguous): each row is read from memory once and the output written
once. Three passes run over it while it sits in L1 / L2: its maximum (order-preserving
integer keys, which vectorise, and NaN found in the same pass), ``exp(x - max)`` stored
to cached scratch and summed in the same loop, then the scaled values streamed to the
output (non-temporal stores: no read of the output's lines). The next row is
prefetched into L2 while the current one is computed on.

Columns (the axis strided, ``inner > 1``): only whole row segments are read (a
power-of-two row stride maps a column of cache lines onto a few cache sets, so
column-panel algorithms thrash L1 / L2 and the TLB). A first pass folds blocks of
:data:`BLOCK_ROWS` rows into running column maxima and sums of exponentials (online
softmax: the sums are rescaled when a maximum grows), reading each block twice while
it is in L2; a second pass writes the result: two reads and one write per element.

The exponential (:func:`exp_fast`) takes ``x <= 0``, -inf or NaN, which is all softmax
needs after subtracting the maximum (13 vector operations; measured against float64 at 2
million points: 2.1 ULP on [-10, 0], 4.8 down to the flush threshold; NaN carried by
the final product, so one compare-and-select does both the flush and NaN: 0.22 ns per
element in cache against 0.29 for the previous 16-operation form with two selects, the
results bit for bit the same on 2 million arguments, -inf, +-NaN and the flush edge). Every loop
is vectorised with the CPU's widest vectors (:func:`._nb.wide_vectors`). NaN semantics match
the three-pass definition ``exp(x - max) / sum``: a row holding NaN or +inf, or only
-inf, becomes NaN; -inf entries give exactly 0 (log-softmax: -inf).
"""

# The function bodies are numba nopython code: numba types them, and numba's stubs
# cannot describe that to mypy.
# mypy: ignore-errors

from __future__ import annotations

import numpy as np

from ._kstream import stream_copy
from ._kwrite import store_fence, stream_block, stream_head
from ._nb import (
    as_float,
    as_int,
    jit,
    jit_reassoc,
    order_key,
    prefetch,
    stream_scaled,
    stream_shifted,
    wide_vectors,
)

__all__ = [
    "exp_fast",
    "softmax_rows",
    "softmax_columns",
    "softmax_panel",
    "BLOCK_ROWS",
    "PANEL_BLOCK_ROWS",
    "warm_up",
]

_F = np.float32
_LOG2E = _F(1.44269504088896341)
# 1.5 * 2**23 + 127: adding it rounds to an integer (ties to even) and leaves n + 127, the
# biased exponent of 2**n, in the low bits, so one shift by 23 builds 2**n (the high bits
# shift out).
_ROUND = _F(12583039.0)
_FLUSH = _F(-87.68)  # below -126.5 ln 2 the result is flushed to zero
_LN2 = _F(0.6931471805599453)
# Minimax coefficients of (exp(r) - 1) / r on [-ln2/2, ln2/2] (relative error of exp 1.4 ULP).
_P1 = _F(0.9999997019767761)
_P2 = _F(0.4999915063381195)
_P3 = _F(0.1666763573884964)
_P4 = _F(0.04189793020486832)
_P5 = _F(0.008290314115583897)
_ONE = _F(1.0)
_ZERO = _F(0.0)
_NAN = _F(np.nan)
_INF = _F(np.inf)
_KEY_INF = np.int32(0x7F800000)  # order key of +inf (its own bits)
_KEY_NEG_INF = np.int32(-0x7F800001)  # order key of -inf (0xFF800000 ^ 0x7FFFFFFF)

#: Rows per block of the column softmax's first pass (read twice while in L2).
BLOCK_ROWS = 64
#: Rows per block of :func:`softmax_panel` (copied into the panel, then their exponentials
#: taken while the block is in L2): longer runs of reading between the compute passes.
#: Measured on 4096 x 4096 over axis 0, interleaved: 512 rows against 64 took 9-10 % less
#: time for softmax, 2-5 % for log-softmax (one and two threads); 256 and 1024 in between.
PANEL_BLOCK_ROWS = 512
#: Rows ahead whose column segments :func:`softmax_panel` prefetches (with blocks of
#: :data:`PANEL_BLOCK_ROWS`: 40 about 3 % faster than 80 or 160, no prefetch 15 % slower).
_AHEAD = 40


@jit
def exp_fast(x):
    """``exp(x)`` for float32 ``x <= 0``, -inf or NaN (NaN carried) in 12 vector operations.

    ``r = x - n ln2`` in one fused multiply-add with ln 2 rounded to float32 (error
    ``n * 1.9e-9``: up to 3.4 ULP more near the flush threshold), then the degree-5
    minimax polynomial ``1 + r (c1 + r (c2 + ...))`` (1.4 ULP), times ``2**n`` built in
    the exponent bits (normal down to n = -126; the product rounds the subnormal results
    once; n + 127 is read from ``t``'s low bits with one shift, bit for bit the results of
    the former subtract-and-shift, 3-7 % less time in a row's exponential pass). Results
    below 2**-126.5 flush to zero, within the kit's ``TINY``; -inf gives 0.
    A NaN makes ``p`` NaN, and the product keeps it whatever the exponent bits hold.
    Softmax's and attention's error bounds grow with ``|x - max|``, which covers it.
    """
    t = x * _LOG2E + _ROUND
    nf = t - _ROUND
    r = x - nf * _LN2
    p = ((((_P5 * r + _P4) * r + _P3) * r + _P2) * r + _P1) * r + _ONE
    e = p * as_float(as_int(t) << 23)
    return _ZERO if x < _FLUSH else e


@jit
def _row_keys(row):
    """Largest and smallest order keys (:func:`._nb.order_key`) of a float32 row, in one pass."""
    wide_vectors()
    hi = order_key(-_INF)
    lo = order_key(_INF)
    for i in range(row.shape[0]):
        key = order_key(row[i])
        hi = key if key > hi else hi
        lo = key if key < lo else lo
    return hi, lo


@jit_reassoc
def _exp_sum(row, out, peak, store):
    """``out[i] = exp(row[i] - peak)`` (when ``store``) and the sum of those values."""
    wide_vectors()
    total = _ZERO
    if store:
        for i in range(row.shape[0]):
            e = exp_fast(row[i] - peak)
            out[i] = e
            total += e
    else:
        for i in range(row.shape[0]):
            total += exp_fast(row[i] - peak)
    return total


@jit
def _scale_into(src, dst, factor):
    """``dst = src * factor``: streaming stores on the 32-byte aligned body of ``dst``."""
    n = dst.shape[0]
    head = min(n, ((32 - dst.ctypes.data % 32) % 32) // 4)
    for i in range(head):
        dst[i] = src[i] * factor
    body = head + (n - head) // 8 * 8
    for i in range(head, body, 8):
        stream_scaled(src, i, factor, factor, dst, i)
    for i in range(body, n):
        dst[i] = src[i] * factor


@jit
def _shift_into(src, dst, peak, offset):
    """``dst = (src - peak) - offset``: streaming stores on the 32-byte aligned body of ``dst``."""
    n = dst.shape[0]
    head = min(n, ((32 - dst.ctypes.data % 32) % 32) // 4)
    for i in range(head):
        dst[i] = (src[i] - peak) - offset
    body = head + (n - head) // 8 * 8
    for i in range(head, body, 8):
        stream_shifted(src, i, peak, offset, dst, i)
    for i in range(body, n):
        dst[i] = (src[i] - peak) - offset


@jit
def _softmax_row(src, dst, log, scratch):
    """(Log-)softmax of one row into ``dst`` (which may be ``src``); ``scratch`` holds a row."""
    hi, lo = _row_keys(src)
    # NaN (a key beyond +-inf), +inf, or a row of only -inf: the definition makes the
    # whole row NaN.
    if hi >= _KEY_INF or hi == _KEY_NEG_INF or lo < _KEY_NEG_INF:
        dst[:] = _NAN
        return
    peak = order_key(hi)
    if log:
        total = _exp_sum(src, scratch, peak, False)
        _shift_into(src, dst, peak, _F(np.log(total)))
    else:
        # The exponentials go to cached scratch; the output is written once, streaming.
        total = _exp_sum(src, scratch, peak, True)
        _scale_into(scratch, dst, _ONE / total)


@jit
def softmax_rows(x, out, first, last, log, scratch):
    """(Log-)softmax along axis 1 of rows ``[first, last)`` of C-contiguous ``[rows, length]`` float32.

    ``out`` may be ``x``; ``scratch`` is float32 of at least ``length``. Each next row is
    prefetched while the current one is computed.
    """
    length = x.shape[1]
    flat = x.reshape(-1)
    row = scratch[:length]
    for r in range(first, last):
        if r + 1 < last:
            base = (r + 1) * length
            for i in range(0, length, 16):
                prefetch(flat, base + i)
        _softmax_row(x[r], out[r], log, row)


@jit
def _block_max(x, r0, r1, c0, c1, peak):
    """``peak[j] = max(x[r0:r1, c0 + j])``, NaN ignored (-inf if none)."""
    wide_vectors()
    peak[:] = -_INF
    for r in range(r0, r1):
        row = x[r, c0:c1]
        for j in range(row.shape[0]):
            v = row[j]
            peak[j] = v if v > peak[j] else peak[j]


@jit
def _rescale(best, block, total, safe):
    """Fold a block's maxima into the running ones, rescaling the running sums to the new maxima."""
    wide_vectors()
    for j in range(best.shape[0]):
        new = block[j] if block[j] > best[j] else best[j]
        old = best[j] if best[j] > -_INF else _ZERO
        fresh = new if new > -_INF else _ZERO
        total[j] = total[j] * exp_fast(old - fresh) if total[j] != _ZERO else total[j]
        best[j] = new
        safe[j] = fresh


@jit
def _add_exps(x, r0, r1, c0, c1, safe, total):
    wide_vectors()
    for r in range(r0, r1):
        row = x[r, c0:c1]
        for j in range(row.shape[0]):
            total[j] += exp_fast(row[j] - safe[j])


@jit
def _column_results(src, dst, safe, factor, log):
    """One row segment of the column softmax's result: ``dst = f(src)`` (``dst`` may be ``src``)."""
    if log:
        for j in range(dst.shape[0]):
            dst[j] = (src[j] - safe[j]) - factor[j]
    else:
        for j in range(dst.shape[0]):
            dst[j] = exp_fast(src[j] - safe[j]) * factor[j]


@jit
def softmax_columns(x, out, c0, c1, log, work, stream=False):
    """(Log-)softmax along axis 0 of columns ``[c0, c1)`` of C-contiguous ``[length, width]`` float32.

    Two passes of whole row segments (no strided access): blocks of :data:`BLOCK_ROWS`
    rows fold their column maxima and sums of exponentials into running ones (each
    block read twice while it is in L2), then one pass writes the result (with
    ``stream``, through an L1 block as whole non-temporal lines, :mod:`._kwrite`).
    ``work`` is float32 scratch of [5, c1 - c0]; ``out`` may be ``x``.
    """
    wide_vectors()
    length = x.shape[0]
    w = c1 - c0
    best, block, total, safe, factor = work[0, :w], work[1, :w], work[2, :w], work[3, :w], work[4, :w]
    best[:] = -_INF
    total[:] = _ZERO
    for r0 in range(0, length, BLOCK_ROWS):
        r1 = min(length, r0 + BLOCK_ROWS)
        _block_max(x, r0, r1, c0, c1, block)
        _rescale(best, block, total, safe)
        _add_exps(x, r0, r1, c0, c1, safe, total)
    for j in range(w):
        # +inf or NaN in the column makes its sum NaN already; only -inf columns remain.
        ok = best[j] > -_INF
        if log:
            factor[j] = _F(np.log(total[j])) if ok else _NAN
        else:
            factor[j] = _ONE / total[j] if ok else _NAN
    row = np.empty(w if stream else 0, dtype=_F)
    for r in range(length):
        src = x[r, c0:c1]
        dst = out[r, c0:c1]
        if stream:
            # The row segment into L1 scratch, then out as whole streamed lines.
            _column_results(src, row, safe, factor, log)
            head = stream_head(dst, stream)
            for j in range(head):
                dst[j] = row[j]
            if head < w:
                stream_block(row[head:], w - head, dst, head)
        else:
            _column_results(src, dst, safe, factor, log)
    if stream:
        store_fence()


_U = np.uint64


@jit
def _panel_block(x, c0, c1, r0, r1, panel, peak, e0, safe, total, store):
    """Copy columns ``[c0, c1)`` of rows ``[r0, r1)`` of ``x`` into ``panel``; ``peak`` = their maxima.

    With ``e0 >= 0``, each row copied is paired with row ``e0 + i`` of the previous block
    of the panel, whose exponentials are taken in the same iteration (as
    :func:`_block_exps`): the arithmetic runs while the copy's cache misses are in
    flight instead of in a phase of its own. NaN is passed over in ``peak`` (the running
    value is never NaN). The row segments :data:`_AHEAD` rows ahead are prefetched: a
    segment is a few lines, too short for the hardware's stream detection, and the
    prefetches keep memory busy while a block is computed on.
    """
    wide_vectors()
    length, width = x.shape
    w = c1 - c0
    xf, pf = x.reshape(-1), panel.reshape(-1)
    peak[:] = -_INF
    for i in range(r1 - r0):
        r = r0 + i
        if r + _AHEAD < length:
            for j in range(0, w, 16):
                prefetch(xf, (r + _AHEAD) * width + c0 + j)
        src = _U(r * width + c0)
        dst = _U(r * w)
        for j in range(w):
            v = xf[src + _U(j)]
            pf[dst + _U(j)] = v
            peak[j] = v if v > peak[j] else peak[j]
        if e0 >= 0:
            # _row_exps written out: called from here it ran 1.2-1.9 times slower.
            row = panel[e0 + i]
            if store:
                for j in range(w):
                    e = exp_fast(row[j] - safe[j])
                    row[j] = e
                    total[j] += e
            else:
                for j in range(w):
                    total[j] += exp_fast(row[j] - safe[j])


@jit
def _row_exps(row, safe, total, store):
    """``total[j] += exp(row[j] - safe[j])``; ``store``: the exponentials replace ``row``."""
    wide_vectors()
    if store:
        for j in range(row.shape[0]):
            e = exp_fast(row[j] - safe[j])
            row[j] = e
            total[j] += e
    else:
        for j in range(row.shape[0]):
            total[j] += exp_fast(row[j] - safe[j])


@jit
def _block_exps(panel, r0, r1, safe, total, store):
    """:func:`_row_exps` over rows ``[r0, r1)`` of ``panel``."""
    wide_vectors()
    for r in range(r0, r1):
        _row_exps(panel[r], safe, total, store)


@jit
def _panel_finish(panel, out, c0, c1, shift, factor, log, lines, tmp):
    """``out[:, c0:c1]`` from ``panel``: ``(panel - shift) - factor[0]`` (``log``) or
    ``panel * factor[b]``, ``b`` the row's block of :data:`PANEL_BLOCK_ROWS`.

    Each row is finished into ``tmp`` (float32, ``c1 - c0``, in L1) and written out; with
    ``lines`` (every row's ``out[r, c0]`` 64-byte aligned) whole lines are streamed.
    """
    wide_vectors()
    width = out.shape[1]
    w = c1 - c0
    of = out.reshape(-1)
    body = w // 16 * 16 if lines else 0
    for r in range(panel.shape[0]):
        row = panel[r]
        f = factor[0] if log else factor[r // PANEL_BLOCK_ROWS]
        if log:
            for j in range(w):
                tmp[j] = (row[j] - shift[j]) - f[j]
        else:
            for j in range(w):
                tmp[j] = row[j] * f[j]
        at = r * width + c0
        for j in range(0, body, 16):
            stream_copy(tmp, j, of, at + j)
        # Unsigned indices on both sides: a signed start LLVM cannot prove non-negative
        # keeps Python's negative-index wrap-around, which it vectorised as gathers
        # (the whole row where the output is not streamed: 10-15 % of the kernel's time).
        dst = _U(at + body)
        for j in range(w - body):
            of[dst + _U(j)] = tmp[_U(body) + _U(j)]


@jit
def softmax_panel(x, out, c0, c1, log, panel, work, stream):
    """(Log-)softmax along axis 0 of columns ``[c0, c1)`` of C-contiguous ``[length, width]`` float32.

    One read and one write of memory, one exponential per element. Blocks of
    :data:`PANEL_BLOCK_ROWS` rows are copied into the packed ``panel`` (float32
    [length, c1 - c0], sized to stay in cache, where the rows' own stride could map them
    onto a few cache sets) and folded into running column maxima and sums of
    exponentials (online softmax, as :func:`softmax_columns`) while the next rows are
    prefetched, each block's exponentials taken in the loop that copies in the next
    block (:func:`_panel_block`); softmax keeps each block's exponentials, relative to the running
    maximum of its time, in the panel. The results are then written out (with
    ``stream``, whole lines streamed where the rows are 64-byte aligned): each block's
    exponentials times ``exp(its maximum - the final one) / sum``, or for log-softmax
    ``x - max - log(sum)``. ``work`` is float32 scratch of [5, c1 - c0]; ``out`` may be
    ``x``. NaN semantics are the three-pass definition's: a column holding NaN or +inf,
    or only -inf, becomes NaN; -inf entries give 0 (log-softmax: -inf).
    """
    wide_vectors()
    length = x.shape[0]
    w = c1 - c0
    best, block, total, safe, tmp = work[0, :w], work[1, :w], work[2, :w], work[3, :w], work[4, :w]
    blocks = (length + PANEL_BLOCK_ROWS - 1) // PANEL_BLOCK_ROWS
    # Per block: the running maximum its exponentials were taken against (softmax only).
    shifts = np.empty((blocks if not log else 0, w), dtype=_F)
    starts = np.empty((blocks if not log else 0, w), dtype=_F)
    best[:] = -_INF
    total[:] = _ZERO
    for b in range(blocks):
        r0 = b * PANEL_BLOCK_ROWS
        r1 = min(length, r0 + PANEL_BLOCK_ROWS)
        # Block b is copied in while block b - 1's exponentials are taken, row by row; a
        # shorter last block leaves the rest of block b - 1 to a pass of its own.
        _panel_block(x, c0, c1, r0, r1, panel, block, r0 - PANEL_BLOCK_ROWS, safe, total, not log)
        if b > 0:
            _block_exps(panel, r0 - PANEL_BLOCK_ROWS + (r1 - r0), r0, safe, total, not log)
        _rescale(best, block, total, safe)
        if not log:
            shifts[b] = safe
            starts[b] = best
    _block_exps(panel, (blocks - 1) * PANEL_BLOCK_ROWS, length, safe, total, not log)
    factor = np.empty((1 if log else blocks, w), dtype=_F)
    for j in range(w):
        # +inf or NaN in the column makes its sum NaN already; only -inf columns remain.
        ok = best[j] > -_INF
        if log:
            factor[0, j] = _F(np.log(total[j])) if ok else _NAN
        else:
            tmp[j] = _ONE / total[j] if ok else _NAN
    if not log:
        for b in range(blocks):
            for j in range(w):
                # A block seen while its column held only -inf has exponentials 0 (or NaN).
                scale = exp_fast(shifts[b, j] - safe[j]) if starts[b, j] > -_INF else _ZERO
                factor[b, j] = scale * tmp[j]
    lines = stream and (out.ctypes.data + 4 * c0) % 64 == 0 and (4 * out.shape[1]) % 64 == 0
    _panel_finish(panel, out, c0, c1, safe, factor, log, lines, tmp)
    if lines:
        store_fence()


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel of this module now."""
    x = np.zeros((9, 9), dtype=_F)
    work = np.zeros((5, 9), dtype=_F)
    for log in (False, True):
        softmax_rows(x, x, 0, 9, log, work[0])
        softmax_columns(x, x, 0, 9, log, work)
        softmax_columns(x, x, 0, 9, log, work, True)
        for stream in (False, True):
            softmax_panel(x, x, 0, 9, log, np.zeros((9, 9), dtype=_F), work, stream)
