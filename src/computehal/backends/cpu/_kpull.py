"""Compiled loops pulled by several threads: a shared block counter, and waiting only for blocks taken.

A kernel split over the backend's threads runs as one compiled call per thread (without
the GIL) that takes block numbers from a shared counter (:func:`take`, an atomic add) and
counts each finished block on a second counter (:func:`take` again, its value unused).
The caller starts the workers' calls (:func:`._runtime.submit`), runs its own, and then
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
    call: Callable[..., object], args: tuple[Any, ...], taken: Any, done: Any, blocks: int, threads: int
) -> None:
    """``call(*args)`` here and on ``threads - 1`` workers; return once every taken block is done.

    ``call`` takes blocks from ``taken`` (:func:`take`) while fewer than ``blocks`` are
    taken and counts each finished one in ``done`` (:func:`take` too). A worker still inside
    a block after :data:`WAIT_SPINS` reads is waited for on its task.
    """
    count = max(1, min(threads, blocks, workers()))
    helpers = [submit(call, *args) for _ in range(count - 1)]
    call(*args)
    if helpers and not wait_taken(taken, done, blocks, WAIT_SPINS):
        for helper in helpers:
            helper.result()


def warm_up() -> None:
    """Compile (or load from numba's cache) the waiting loop now."""
    counter = np.ones(1, dtype=np.int64)
    if not wait_taken(counter, counter, 1, 1):
        raise RuntimeError("the compiled block counters do not work here")
