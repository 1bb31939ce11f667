"""A batch-1 1x1 convolution's parallel loop in compiled code, pulled by the pool's threads.

A 1x1 layer on one small image (ResNet-50's later stages at batch 1: 49-784 pixels,
0.5-1.5 ms of work) splits its output channels over the threads. As Python tasks on the
backend's pool, two threads ran such a layer only 1.09-1.46x faster than one: every
task's Python and GIL hand-offs, and a worker woken from a halted vCPU joining late
into a split made in advance. Here the caller and each worker enter one compiled call
(:func:`pull_blocks`, without the GIL) and take blocks of filter panels from a shared
counter (an atomic add in LLVM IR), each packing its block's panels and multiplying
them (:func:`._kgemm.pack_filter`, :func:`._kgemm.product_packed`): a worker that
starts late takes fewer blocks, and nothing waits for it but its last block.

Measured on the 2-vCPU VM through the backend (medians of 30): 256 -> 1024 at 14x14
0.77 ms against 0.96 as pool tasks, 1024 -> 256 0.61 against 1.05; the whole ResNet-50
at batch 1 through the ONNX runner 0.925 of the time (paired runs in one process).
numba's own ``prange`` loop was measured first: as fast per layer, but libgomp's threads
spin after every parallel region and took the pool's cores (ResNet-50 at batch 1 105 ms
against 83; 69 with ``OMP_WAIT_POLICY=PASSIVE``), and GNU OpenMP is not fork-safe.
"""

# Function bodies are LLVM IR builders and numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

import numpy as np

from ._kgemm import ROWS, pack_filter, pixel_block, product_packed
from ._kpull import run_pulled, take
from ._nb import jit

__all__ = ["BLOCKS", "pointwise_image", "pull_blocks", "warm_up"]

#: Blocks of filter panels per layer (several per thread: the vCPUs run at unequal speeds).
BLOCKS = 8


@jit
def pull_blocks(counter, done, blocks, f, start, k, c, packed, pbias, x, pixels, y, block, chunk, r, mode):
    """Take blocks from ``counter`` until none is left; block ``t`` is panels ``t * per ..``."""
    panels = (k + ROWS - 1) // ROWS
    per = (panels + blocks - 1) // blocks
    t = take(counter)
    while t < blocks:
        p0 = t * per
        p1 = min(panels, p0 + per)
        if p0 < p1:
            k0 = p0 * ROWS
            k1 = min(k, p1 * ROWS)
            pack_filter(f[k0 * c :], c, start[k0:], k1 - k0, c, ROWS, packed[k0 * c :], pbias[k0:])
            product_packed(
                packed, pbias, p0, k1 - k0, c, x, 0, pixels, y, k0 * pixels, pixels, pixels, block, chunk,
                r, mode,
            )  # fmt: skip
        take(done)
        t = take(counter)


def pointwise_image(f, start, k, c, x, pixels, y, chunk, r, mode, threads=None):
    """``y`` [k, pixels] = ``f`` [k, c] @ ``x`` [c, pixels] + ``start``, epilogue ``mode`` on ``r``.

    Flat float32 operands; ``r`` is the residual laid out as ``y`` (``y`` itself without
    the residual bit). The caller and the pool's workers (``threads`` in all) pull the
    blocks.
    """
    panels = -(-k // ROWS)
    packed = np.empty(panels * ROWS * c, dtype=np.float32)
    pbias = np.empty(panels * ROWS, dtype=np.float32)
    blocks = min(BLOCKS, panels)
    block = pixel_block(min(c, chunk))
    args = (f, start, k, c, packed, pbias, x, pixels, y, block, chunk, r, mode)
    run_pulled(pull_blocks, args, blocks, threads or blocks)


def warm_up() -> None:
    """Compile (or load from numba's cache) the loop now, and check it on a small case."""
    rng = np.random.default_rng(0)
    k, c, pixels = 37, 5, 29
    f = rng.standard_normal((k, c)).astype(np.float32)
    x = rng.standard_normal((c, pixels)).astype(np.float32)
    bias = rng.standard_normal(k).astype(np.float32)
    y = np.zeros((k, pixels), dtype=np.float32)
    pointwise_image(f.ravel(), bias, k, c, x.ravel(), pixels, y.ravel(), 64, y.ravel(), 0, threads=1)
    want = f.astype(np.float64) @ x.astype(np.float64) + bias[:, None]
    if not np.allclose(y, want, rtol=1e-5, atol=1e-5):
        raise RuntimeError("the compiled pulled 1x1 product gives wrong results here")
