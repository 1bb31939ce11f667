"""Data movement rows: ``copy_dtod``, ``fill``, ``copy_strided``, ``gather``, ``scatter``, host copies.

GB/s of bytes read + written (``fill``: written) against the bandwidth ceiling. On a
device whose bandwidth ceiling *is* ``copy_dtod``, that row is compared with the host's
copy instead, without a verdict; ``copy_htod`` / ``copy_dtoh`` are reported against the
host's copy without a verdict everywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._context import BenchContext
from ._groups import register_group
from ._harness import Case, Limit, Target

__all__ = ["movement_cases"]

F32 = np.float32


def _case(
    ctx: BenchContext,
    op: str,
    params: str,
    fn: Any,
    moved: float,
    limit: Limit | None = None,
    target: Target | None = None,
) -> Case:
    return ctx.bandwidth_case(op, params, fn, moved, moved / 8, limit, target)


def _copies(ctx: BenchContext) -> Iterator[Case]:
    be = ctx.backend
    n = ctx.sizes.elementwise
    host = np.ones(n, dtype=F32)
    back = np.empty_like(host)
    src, dst = ctx.put(host), ctx.empty(4 * n)
    if ctx.ceilings.bandwidth.name == "copy_dtod":
        yield _case(
            ctx,
            "copy_dtod",
            f"{4 * n} bytes",
            functools.partial(be.copy_dtod, dst, src, 4 * n),
            8.0 * n,
            ctx.ceilings.host.copy(),
        )
    else:
        yield _case(
            ctx, "copy_dtod", f"{4 * n} bytes", functools.partial(be.copy_dtod, dst, src, 4 * n), 8.0 * n
        )
    yield _case(ctx, "fill", f"{n} f32", functools.partial(be.fill, dst, n, 0.5), 4.0 * n)
    host_copy = ctx.ceilings.host.copy()
    yield _case(
        ctx, "copy_htod", f"{4 * n} bytes", functools.partial(be.copy_htod, dst, host), 8.0 * n, host_copy
    )
    yield _case(
        ctx, "copy_dtoh", f"{4 * n} bytes", functools.partial(be.copy_dtoh, back, src), 8.0 * n, host_copy
    )


def _strided(ctx: BenchContext) -> Iterator[Case]:
    be = ctx.backend
    m = ctx.sizes.matrix
    src, dst = ctx.put(ctx.rng.standard_normal((m, m), dtype=F32)), ctx.empty(4 * m * m)
    transpose = functools.partial(be.copy_strided, dst, src, (m, m), (1, m), (m, 1))
    yield _case(ctx, "copy_strided", f"transpose {m}x{m}", transpose, 8.0 * m * m)
    half = m // 2

    def concat() -> None:
        # Two [m, m/2] halves of the source (rows of m/2 apart) side by side: [m, m].
        be.copy_strided(dst, src, (m, half), (half, 1), (m, 1))
        be.copy_strided(dst + 4 * half, src + 4 * m * half, (m, half), (half, 1), (m, 1))

    yield _case(ctx, "copy_strided", f"concat 2 x [{m},{half}] -> [{m},{m}]", concat, 8.0 * m * m)
    n, c, h, w = ctx.sizes.pool
    with ctx.scope():
        px, py = ctx.put(ctx.rng.standard_normal((n, c, h, w), dtype=F32)), ctx.empty(4 * n * c * h * w)
        # dst[n, h, w, c] = src[n, c, h, w]: iterate the source shape with destination strides.
        permute = functools.partial(
            be.copy_strided, py, px, (n, c, h, w), (c * h * w, h * w, w, 1), (h * w * c, 1, w * c, c)
        )
        yield _case(ctx, "copy_strided", f"NCHW->NHWC {n}x{c}x{h}x{w}", permute, 8.0 * n * c * h * w)


def _rows(ctx: BenchContext) -> Iterator[Case]:
    be = ctx.backend
    rows, cols, table_rows = ctx.sizes.rows, ctx.sizes.row_len, ctx.sizes.table_rows
    table = ctx.put(ctx.rng.standard_normal((table_rows, cols), dtype=F32))
    block = ctx.put(ctx.rng.standard_normal((rows, cols), dtype=F32))
    out_table, gathered = ctx.empty(4 * table_rows * cols), ctx.empty(4 * rows * cols)
    picks = ctx.rng.integers(0, table_rows, rows)
    targets = ctx.rng.choice(table_rows, size=rows, replace=False)
    dev_picks, dev_targets = ctx.put(picks.astype(np.int64)), ctx.put(targets.astype(np.int32))
    moved = 8.0 * rows * cols
    params = f"{rows} rows x {cols} of {table_rows}"
    yield _case(
        ctx, "gather", params, functools.partial(be.gather, table, picks, gathered, table_rows, cols), moved
    )
    yield _case(
        ctx,
        "gather",
        params + " device int64 indices",
        functools.partial(
            be.gather, table, rows, gathered, table_rows, cols, indices_ptr=dev_picks, index_dtype="int64"
        ),
        moved,
    )
    yield _case(
        ctx,
        "scatter",
        params,
        functools.partial(be.scatter, block, targets, out_table, table_rows, cols),
        moved,
    )
    yield _case(
        ctx,
        "scatter",
        params + " device int32 indices",
        functools.partial(
            be.scatter, block, rows, out_table, table_rows, cols, indices_ptr=dev_targets, index_dtype="int32"
        ),
        moved,
    )


def movement_cases(ctx: BenchContext) -> Iterator[Case]:
    """Copies and fills, strided copies (transpose, concatenation, permutation), gather / scatter."""
    for part in (_copies, _strided, _rows):
        with ctx.scope():
            yield from part(ctx)


register_group(
    "movement",
    movement_cases,
    description="copy_dtod, fill, copy_strided, gather, scatter, host copies",
    default=True,
)
