"""Softmax and log-softmax with the fused kernels of :mod:`._ksoftmax`, split over the worker threads.

Rows (``inner == 1``) go to the threads in contiguous ranges. A strided axis is split
into column panels of each outer slice whose rows all fit in cache together
(:func:`._ksoftmax.softmax_panel`: one read and one write of memory); where even a
line's width of every row would not fit, into column ranges at least
:data:`MIN_COLUMNS` wide for the two-pass :func:`._ksoftmax.softmax_columns`. Outputs
far larger than the caches are written with non-temporal stores. Each thread keeps its
scratch between calls (:func:`._scratch.thread_scratch`). Where there are at least
:data:`PULL_TILES` panels per thread they are pulled one at a time
(:func:`._runtime.parallel_pull`): the panel kernel is bound by its arithmetic and the
two vCPUs have run at different speeds (one-thread work 1.45 times slower on one of
them); under load, pulling measured no different from static halves (0.57 / 0.56 against
0.53 / 0.60 of the copy ceiling in two runs).

Why panels that stay in L2 (measured on a 2-core Sapphire Rapids VM, 4096 x 4096
float32 over axis 0, both threads): the kernels' own work, input and panel in cache, is
about 0.9 ns per element for the panel kernel against 0.6 for the row kernel (its
exponential alone about 0.25), so both are close to what two cores can feed at copy
bandwidth. Panels wider than L2 (256 to 1024 columns, packed in L3) and the two-pass
:func:`._ksoftmax.softmax_columns` on 1024 / 2048-column ranges (two reads and one write,
two exponentials per element, but whole-page row segments) ran 10-40 % slower than
96-column panels in the same minutes; 64 and 96 columns were within noise of each
other. Every row segment of a panel lies on its own 4 KiB page, so the matrix's blocks
ask for transparent huge pages (:mod:`._memory`): 5-15 % faster with them.

What limits the panels (measured again later, one core, the machine shared): the panel
kernel already computes one exponential per element (the exponential pass about
0.25 ns per element in cache, 16 lanes per 512-bit vector; the copy-and-maximum pass
about 0.18, at the L2's bandwidth; no gathers or scalar loops left in either). The
same kernel on a 4096 x 4096 matrix, its rows from memory, took 2-3 times its
in-cache time, so the strided reads (a few lines per row, 16 KiB apart, which the
hardware prefetchers do not follow) and the alternation of a read phase and a
streamed-write phase per panel cost more than the arithmetic. Folding the copy, the
maximum and the exponential into one pass over each block (exponentials taken against
a reference that moves only when a block's maximum exceeds it by more than 16) cost
the same in cache and 1.5 times as much on the full matrix: a long loop body keeps
fewer of the rows' cache misses in flight than a plain copy loop does.

Measured next (the same VM shared with other work, variants interleaved in one process,
ratios to the benchmark's two-thread ``np.copyto``): contiguous reads run at 37 GB/s on
two threads and a non-temporal copy at twice ``np.copyto``'s rate, but the panels'
strided read phase alone (384-byte segments) reaches only 0.74 of the copy ceiling and
read plus streamed write without arithmetic 0.94; the two vCPUs share what behaves like
one core's execution units (a compute-bound kernel runs no faster on two threads than on
one). Alternatives, none better than the panels (0.41-0.50 in those minutes): row
ranges per thread in two sequential passes (column statistics, merged across threads,
then results; two exponentials per element) 0.36-0.49, compute-bound, its reads almost
free; pass one streaming its exponentials to the output and pass two rescaling them in
place (one exponential, four sequential passes) 0.32 against 0.41 in CPU time; one
thread on two-pass columns beside one on panels 0.36-0.41; panels of 48 to 256 columns,
prefetch distances of 0 to 160 rows, or two prefetched lines per segment: within noise;
prefetching the next panel during the write-out: 3 times slower (a prefetch that
misses holds a fill buffer until its line arrives).

Measured again (session 6, 4096 x 4096 over axis 0, huge pages, variants interleaved):
both threads are used (each takes half of the 43 panels; each thread's CPU time is half
the one-thread run's), but with the machine shared the two-thread wall time matched one
thread's (20-21 ms against a 10-11 ms two-thread copy), as did the row kernel's and the
copy's own. On one thread the panel kernel's time splits into reading the panels
(strided rows into cache with the maxima: 0.47 ns per element, a whole copy's time),
the exponentials (0.28) and the streamed write-out (0.30), which do not overlap; in
cache the same phases take 0.29, 0.24 and 0.20 (the row kernel's three passes together
0.6), so the columns cost about 1.25-1.5 times the rows' work per element whatever the
memory does. Tried and not kept: prefetching the next block's rows during the
exponentials (10 % slower); reading the next panel while writing the previous one out
in one loop, double-buffered panels of 32-64 columns (slower: 31 against 27 ms); the
write-out's product streamed straight from registers without the L1 row (2-3 %, within
noise); per-row views replaced by flat indices (no change); pulling panels dynamically
instead of two static halves (no change); the exponentials taken again in the write-out
instead of stored (16 % slower); panels of 128 columns (2 MiB, the whole L2) 2-5 %
faster, within noise. Kept: blocks of 512 rows instead of 64 between the copy-in and the
exponentials (9-11 % less time for softmax, 2-5 % for log-softmax) and prefetching 40
rows ahead instead of 80 (about 3 %), see :mod:`._ksoftmax`.

Measured in session 7 (one thread's CPU time, the machine loaded, variants interleaved):
the strided read with its maxima alone costs about a sequential read (4.1 against
3.1-3.9 ms for 64 MiB); copying it into a 1.5 MiB panel costs 2.5-5 ms more (into an
L1-sized ring of rows, 0.5), and the phases added up (read 9.4, exponentials 3.5,
write-out 5.5 ms). Kept: each block's exponentials taken in the copy loop of the next
block, row by row: paired runs against the former kernel took 0.92 of its time for
softmax and 0.91 for log-softmax on one thread (17-18 against 18.5-19 ms); on two
threads 0.53-0.57 against 0.49-0.57 of the copy ceiling, log-softmax 0.55-0.61 against
0.51-0.55. The kernel is bound by its arithmetic more than by memory: taking the
softmax's exponentials again in the write-out instead of storing them cost 1.28 times
the time, though the write-out alone is memory work. Tried and not kept: blocks of 64,
128 or 256 rows (1.02, 1.05, 0.99 of 512's time); prefetching 20 or 80 rows ahead
instead of 40, into L1, or non-temporally (non-temporal 2.5 times slower); the
write-out's products streamed from registers (0.99, noise); an L1 stage of 16-64 rows
with the exponentials stored into the panel once (18-20 ms); two-pass strips of
256-1024 columns (0.19-0.37 of the copy ceiling); two passes over whole rows per thread
with the column statistics merged (log-softmax no faster, softmax slower: two
exponentials per element); the second thread starting half a panel late, or both in
lockstep (within noise). Under that load two threads ran no faster than one for the
copy, the row kernel or the panels (other processes held the second vCPU); each vCPU
has its own 2 MiB L2 (two threads reading 1.5 MiB each kept the one-thread L2 rate).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ... import validation as v
from ._plumbing import FloatArray
from ._runtime import PARALLEL_THRESHOLD, kernels, parallel_pull, parallel_ranges, workers
from ._scratch import thread_scratch

__all__ = ["fast_softmax"]

#: Elements below which a call stays with the general path (no thread split to pay for).
MIN_ELEMENTS = 1 << 12
#: Narrowest column range of the strided-axis kernel.
MIN_COLUMNS = 64
#: Outputs from this many bytes on are written with non-temporal stores (far beyond L2).
STREAM_BYTES = 8 << 20
#: Bytes of one column panel of the one-pass strided-axis kernel (three quarters of a 2 MiB L2).
PANEL_BYTES = 3 << 19
#: Narrowest panel: 64 bytes (a line) of each row.
MIN_PANEL = 16
#: Panels per thread from which they are pulled one at a time instead of split in halves.
PULL_TILES = 4


def fast_softmax(p: v.AxisProblem, x: FloatArray, out: FloatArray) -> bool:
    """(Log-)softmax of ``x`` [outer, length, inner] into ``out``; False where this path does not apply.

    ``out`` is ``x`` or does not overlap it.
    """
    if p.dtype != np.float32 or x.size < MIN_ELEMENTS or p.length == 0:
        return False
    kern: Any = kernels("_ksoftmax")
    if kern is None:
        return False
    if p.inner == 1:
        rows_x = x.reshape(p.outer, p.length)
        rows_out = out.reshape(p.outer, p.length)

        def run_rows(start: int, stop: int) -> None:
            scratch = thread_scratch("softmax-row", p.length)
            kern.softmax_rows(rows_x, rows_out, start, stop, p.log, scratch)

        parallel_ranges(p.outer, run_rows, grain=max(1, PARALLEL_THRESHOLD // p.length))
        return True
    width = _panel_width(p.length, p.inner)
    stream = out.nbytes >= STREAM_BYTES
    if width:
        # Column panels whose every row fits in cache together: one read and one write of memory.
        tiles = [(o, c0, min(p.inner, c0 + width)) for o in range(p.outer) for c0 in range(0, p.inner, width)]

        def run_tiles(items: Iterable[int]) -> None:
            panel = thread_scratch("softmax-panel", p.length * width)
            work = thread_scratch("softmax-panel-work", 5 * width)[: 5 * width].reshape(5, width)
            for i in items:
                o, c0, c1 = tiles[i]
                packed = panel[: p.length * (c1 - c0)].reshape(p.length, c1 - c0)
                kern.softmax_panel(x[o], out[o], c0, c1, p.log, packed, work, stream)

        grain = max(1, PARALLEL_THRESHOLD // (p.length * width))
        if len(tiles) >= PULL_TILES * workers() * grain:
            # Pulled one at a time: the kernel is bound by its arithmetic, and the vCPUs can
            # run at different speeds (a static half each leaves the faster one idle).
            parallel_pull(len(tiles), run_tiles)
        else:
            parallel_ranges(len(tiles), lambda start, stop: run_tiles(range(start, stop)), grain=grain)
        return True
    width = max(MIN_COLUMNS, -(-p.inner // workers()))
    panels = [(o, c0, min(p.inner, c0 + width)) for o in range(p.outer) for c0 in range(0, p.inner, width)]

    def run_panels(start: int, stop: int) -> None:
        for o, c0, c1 in panels[start:stop]:
            work = thread_scratch("softmax-columns", 5 * (c1 - c0))[: 5 * (c1 - c0)].reshape(5, c1 - c0)
            kern.softmax_columns(x[o], out[o], c0, c1, p.log, work, stream)

    parallel_ranges(len(panels), run_panels, grain=max(1, PARALLEL_THRESHOLD // (p.length * width)))
    return True


def _panel_width(length: int, inner: int) -> int:
    """Columns per panel of the one-pass strided-axis kernel (a multiple of 16 where the axis
    is wider), or 0 where :data:`MIN_PANEL` columns of every row would not fit in :data:`PANEL_BYTES`."""
    width = PANEL_BYTES // (4 * length) // 16 * 16
    if width < MIN_PANEL or inner < MIN_PANEL:
        return 0
    return min(width, inner)
