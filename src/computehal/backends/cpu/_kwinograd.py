"""The per-position products of the Winograd convolutions on the compiled dense-layer tile.

Each transformed position ``xi`` of a Winograd convolution is one small GEMM,
``M[xi] (tiles x K) = V[xi] (tiles x C) @ U[xi] (C x K)``, with few rows (49 2x2 tiles
for one 14x14 image) and a transformed filter ``U`` that is reused call after call.
They run here on :func:`._kdense.batched` (a 6 x 64 register tile that broadcasts
``V`` and loads ``U`` rows) with ``U`` stored in panels of :data:`PANEL` output
channels: panel ``j`` of every position is one block of memory, position ``xi``'s
``C x width`` matrix at ``(j * positions * C + xi * C) * PANEL``, its rows ``width``
floats apart (``width`` is 64, or what is left for the last panel). Each panel's rows
are short and contiguous, which is the layout the dense-layer tile is fast on; a
block of 64 output channels transformed on its own (the streamed schedule) is one
panel as it comes.

Measured on one thread (CPU time, best of 15, a loaded machine, one-thread 1024^3
sgemm 97 GFLOP/s), OpenBLAS's batched ``matmul`` against this: 16 x (49 x 256 x 256)
(ResNet-50's 256-channel 14x14 layer at batch 1, F(2x2, 3x3)) 73 vs 86 GFLOP/s;
36 x (49 x 128 x 64) blocks (its 128-channel 28x28 layer, streamed F(4x4, 3x3)) 69 vs
89; 16 x (16 x 512 x 512) 46 vs 66. ``U`` read in place as one row-major [C, K]
matrix instead of panels: 76, 70 and 57.

Products are summed in order over the input channels with fused multiply-adds.
"""

# The function bodies are numba nopython code: numba types them, and numba's stubs
# cannot describe that to mypy.
# mypy: ignore-errors

from __future__ import annotations

import numpy as np

from ._kdense import batched
from ._nb import jit

__all__ = ["PANEL", "position_products", "warm_up"]

#: Output channels of a panel of ``U`` (the dense-layer tile's width).
PANEL = 64


@jit
def position_products(v, u, m, xi0, xi1, tiles, cin, kout, positions):
    """``M[xi] = V[xi] @ U[xi]`` for positions ``[xi0, xi1)``.

    ``v`` flat [positions, tiles, C], ``m`` flat [positions, tiles, K] (only written),
    ``u`` the transformed filter in panels (see the module docstring).
    """
    full = kout // PANEL
    rest = kout - full * PANEL
    step = positions * cin * PANEL
    for xi in range(xi0, xi1):
        x = v[xi * tiles * cin : (xi + 1) * tiles * cin]
        y = m[xi * tiles * kout : (xi + 1) * tiles * kout]
        if full > 0:
            w = u[xi * cin * PANEL : full * step]
            batched(x, cin, 1, w, PANEL, step, y, kout, PANEL, tiles, cin, PANEL, 0, full, False)
        if rest > 0:
            w = u[full * step + xi * cin * rest : full * step + (xi + 1) * cin * rest]
            batched(x, cin, 1, w, rest, 0, y[full * PANEL :], kout, 0, tiles, cin, rest, 0, 1, False)


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel now, and check it on a small product."""
    rng = np.random.default_rng(0)
    positions, tiles, cin, kout = 2, 7, 5, 70
    v = rng.standard_normal((positions, tiles, cin)).astype(np.float32)
    u = rng.standard_normal((positions, cin, kout)).astype(np.float32)
    panels = np.concatenate(
        [u[:, :, :PANEL].reshape(-1), u[:, :, PANEL:].reshape(-1)]  # panel 0, then the 6 left
    )
    m = np.zeros((positions, tiles, kout), dtype=np.float32)
    position_products(v.reshape(-1), panels, m.reshape(-1), 0, positions, tiles, cin, kout, positions)
    want = v.astype(np.float64) @ u.astype(np.float64)
    if not np.allclose(m, want, rtol=1e-5, atol=1e-5):
        raise RuntimeError("the compiled Winograd position products give wrong results here")
