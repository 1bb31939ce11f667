"""Compiled loops pulled by several threads: a shared block counter, and waiting only for blocks taken.

A kernel split over the backend's threads runs as one compiled call per thread (without
the GIL) that takes block numbers from a shared counter (:func:`take`, an atomic add)
while they are below ``blocks`` and counts each finished block on a second one (:func:`take`
again, its value unused); a numba generator would hold that loop once, but a function
using one failed to load from numba's cache. :func:`run_pulled` makes the counters, starts the workers' calls
(:func:`._runtime.submit`), runs its own, and then
waits only until every block taken so far is finished (:func:`wait_taken`): a worker woken
late from a halted vCPU (50-130 us on the project's 2-vCPU VM) finds no block left and
returns, and the call does not wait for it. Loops that follow this pattern touch their
operands only inside blocks, so a late worker never reads or writes memory after the call
has returned.
"""

# Function bodies are LLVM IR builders and numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._nb import jit
from ._runtime import submit, workers

__all__ = ["WAIT_SPINS", "run_pulled", "take", "wait_taken", "warm_up"]

#: Reads of the counters a caller spins for before blocking on its workers' tasks.
WAIT_SPINS = 1 << 20


@intrinsic
def take(typingctx: Any, counter: Any) -> Any:
    """``counter[0]`` before adding one to it, atomically (an int64 array of one)."""
    sig = types.int64(counter)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", array.data, ir.IntType(64)(1), "seq_cst")

    return sig, codegen


@intrinsic
def _read(typingctx: Any, counter: Any) -> Any:
    """``counter[0]``, read atomically (acquire) so that a spinning loop sees other threads' adds."""
    sig = types.int64(counter)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(array.data, "acquire", 8)

    return sig, codegen


@jit
def wait_taken(taken, done, blocks, spins):
    """Spin until every block taken from ``taken`` is counted in ``done``; False after ``spins`` reads."""
    target = min(_read(taken), blocks)
    for _ in range(spins):
        if _read(done) >= target:
            return True
    return _read(done) >= target


def run_pulled(
    call: Callable[..., object], args: tuple[Any, ...], blocks: int, threads: int
) -> tuple[Any, Any]:
    """``call(taken, done, blocks, *args)`` here and on ``threads - 1`` workers, until all are done.

    ``call`` takes blocks from ``taken`` and counts each finished one in ``done``, the two
    counters made here (returned, for tests). A worker still inside a block after :data:`WAIT_SPINS`
    reads is waited for on its task.
    """
    taken, done = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    full = (taken, done, blocks, *args)
    count = max(1, min(threads, blocks, workers()))
    helpers = [submit(call, *full) for _ in range(count - 1)]
    call(*full)
    if helpers and not wait_taken(taken, done, blocks, WAIT_SPINS):
        for helper in helpers:
            helper.result()
    return taken, done


def warm_up() -> None:
    """Compile (or load from numba's cache) the counters' loops now, and check them."""
    taken, done = run_pulled(_count_blocks, (np.zeros(3, dtype=np.int64),), 3, 1)
    if int(taken[0]) != 4 or int(done[0]) != 3 or not wait_taken(taken, done, 3, 1):
        raise RuntimeError("the compiled block counters do not work here")


@jit
def _count_blocks(taken, done, blocks, seen):
    t = take(taken)
    while t < blocks:
        seen[t] += 1
        take(done)
        t = take(taken)
