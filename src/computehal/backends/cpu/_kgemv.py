"""A float32 GEMV's parallel loop in compiled code, pulled by the caller and the pool's workers.

A transformer's decoding step is matrix-vector products: every weight matrix is read
once per step, so the step runs at the memory's speed if both cores stream their share.
Split in two halves by Python tasks (one ``?gemv`` call each), the second core cost more
than it gave on one 2-vCPU host (a 9.4 MB GEMV after a large copy: 1.27-1.36 ms on two
threads against 0.85-0.90 on one; the whole GPT-2-small step 0.92-0.98 of the two-thread
time on one thread). The halves were blocks of rows of a column-major matrix (``cols``
short strided segments each: 16 such blocks on one thread took 1.5 times one call), a
worker woken from a halted vCPU starts 50-130 us late, and the halves handed the GIL back
and forth for their Python work. Here the caller and a worker enter one compiled call
each (:func:`pull_columns`, without the GIL) and take blocks of the matrix's *columns*
(contiguous memory) from a shared counter; a worker that starts late takes fewer blocks,
or none. The caller then waits only for blocks a worker has taken (:mod:`._kpull`), never
for a worker that has not started: its task finds no block left and returns.

Each block is one ``sgemv`` through numba's ``numba_xxgemv`` (SciPy's OpenBLAS, one
thread). For ``op(A) = A^T`` a block of columns is a block of outputs. For ``op(A) = A``
it is a slice of every output's sum: each thread adds its blocks into its own partial
result, and :func:`combine` adds the (at most two) partials into ``y``, so an output is
the sum of BLAS's partial dot products rather than one (float32 rounding either way).
"""

# Function bodies are LLVM IR builders and numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numpy as np

from ._kpull import run_pulled, take
from ._nb import NO, YES, jit, sgemv

__all__ = ["ALIGN", "BLOCK_BYTES", "MAX_BLOCKS", "combine", "gemv", "pull_columns", "warm_up"]

#: Output elements of a block are a multiple of this (BLAS kernels' unrolling).
ALIGN = 16
#: Bytes of the matrix per block, about (fewer blocks for small matrices).
BLOCK_BYTES = 1 << 20
#: Most blocks of one GEMV.
MAX_BLOCKS = 8


@jit
def pull_columns(taken, done, blocks, trans, rows, cols, alpha, a, lda, x, y, partials, slots):
    """Take blocks from ``taken`` until none is left; each finished block adds one to ``done``.

    ``alpha op(A) x`` with ``A`` column-major ``rows x cols`` (leading dimension ``lda``)
    from ``a[0]``, ``x`` of unit stride. Every block reads whole columns of ``A`` (contiguous
    memory; a block of rows of a column-major matrix is ``cols`` short strided segments,
    which ran about 1.5 times slower on one thread). ``trans`` :data:`._nb.YES`: block ``t`` is
    the outputs ``y[t * per ..]`` (``beta`` already applied to ``y`` by the caller, so
    ``beta`` 1 here). :data:`._nb.NO`: block ``t`` is columns ``t * per ..``, summed into
    this thread's row of ``partials`` (``slots[0]`` hands out the rows), which the caller
    adds into ``y`` (:func:`combine`).
    """
    out = cols
    per = ((out + blocks - 1) // blocks + ALIGN - 1) // ALIGN * ALIGN
    slot = -1
    t = take(taken)
    while t < blocks:
        o0 = t * per
        o1 = min(out, o0 + per)
        if trans == YES:
            if o0 < o1:
                sgemv(YES, rows, o1 - o0, alpha, a, o0 * lda, lda, x, 0, np.float32(1.0), y, o0)
        else:
            first = slot < 0
            if first:
                slot = take(slots)
            if o0 < o1:
                part = partials[slot]
                beta = np.float32(0.0) if first else np.float32(1.0)
                sgemv(NO, rows, o1 - o0, alpha, a, o0 * lda, lda, x, o0, beta, part, 0)
            elif first:
                partials[slot][:] = 0.0
        take(done)
        t = take(taken)


@jit
def combine(y, beta, partials, used):
    """``y = beta y + sum(partials[:used])``, ``y`` not read where ``beta`` is 0 (BLAS's rule)."""
    for i in range(y.size):
        total = np.float32(0.0)
        for s in range(used):
            total += partials[s, i]
        y[i] = total if beta == 0 else beta * y[i] + total


def gemv(
    trans: bool, rows: int, cols: int, alpha: float, a: Any, lda: int, x: Any, beta: float, y: Any
) -> None:
    """``y = alpha op(A) x + beta y``, ``A`` column-major ``rows x cols`` from ``a[0]``, by two threads.

    ``x`` and ``y`` are 1-D float32 of unit stride from element 0; ``beta`` 0 never reads
    ``y``. Blocks of about :data:`BLOCK_BYTES` of the matrix, at most :data:`MAX_BLOCKS`.
    """
    blocks = max(1, min(MAX_BLOCKS, rows * cols * 4 // BLOCK_BYTES, -(-cols // ALIGN)))
    if trans:  # each block writes its outputs once: apply beta first (0: y is not read)
        if beta == 0:
            y[...] = 0
        elif beta != 1:
            y *= np.float32(beta)
    partials = np.empty((2, 0 if trans else rows), dtype=np.float32)
    slots = np.zeros(1, dtype=np.int64)
    args = (YES if trans else NO, rows, cols, np.float32(alpha), a, lda, x, y, partials, slots)
    run_pulled(pull_columns, args, blocks, 2)
    if not trans:
        combine(y, np.float32(beta), partials, int(slots[0]))


def warm_up() -> None:
    """Compile (or load from numba's cache) the loop now, and check it on a small case."""
    rng = np.random.default_rng(0)
    rows, cols = 37, 21
    a = rng.standard_normal(rows * cols).astype(np.float32)  # column-major rows x cols
    matrix = a.reshape(cols, rows).T.astype(np.float64)
    for trans, n_in, want_of in ((False, cols, matrix), (True, rows, matrix.T)):
        x = rng.standard_normal(n_in).astype(np.float32)
        y = np.ones(want_of.shape[0], dtype=np.float32)
        gemv(trans, rows, cols, 2.0, a, rows, x, 0.5, y)
        want = 2.0 * (want_of @ x.astype(np.float64)) + 0.5
        if not np.allclose(y, want, rtol=1e-5, atol=1e-5):
            raise RuntimeError("the compiled pulled GEMV gives wrong results here")
