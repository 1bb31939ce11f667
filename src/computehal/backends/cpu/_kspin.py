"""A compiled busy-wait on one memory word, for the worker pool of :mod:`._workers`.

:func:`wait_changed` polls an int64 word (a volatile load, then the CPU's spin-loop
hint, ``pause`` on x86) until it differs from the value the caller saw, or until a
number of polls has passed, and runs without the GIL. A thread that waits this way
keeps its CPU awake: in a virtual machine a vCPU that went idle is halted, and waking a
thread there took 100-200 us at the median and 440-720 us at the 90th percentile on
this project's 2-vCPU host (a task handed to a sleeping pool thread after a 1-10 ms
pause), against a few microseconds for a thread that is polling.

numba's loads may be hoisted out of a loop that does not store, so the loop is written
in LLVM IR with an atomic (acquire) load, which is a plain load on x86.
"""

# Function bodies are LLVM IR builders and numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

import platform
import time
from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._nb import jit

__all__ = ["polls_per_second", "wait_changed", "warm_up"]

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


def _pause(builder: Any) -> None:
    if _X86:
        hint = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause"
        )
        builder.call(hint, [])


@intrinsic
def _poll(typingctx: Any, word: Any, seen: Any, polls: Any) -> Any:
    """Poll ``word[0]`` until it differs from ``seen`` (True) or ``polls`` have passed (False)."""
    sig = types.boolean(word, types.int64, types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array = context.make_array(signature.args[0])(context, builder, args[0])
        i64 = ir.IntType(64)
        start = builder.basic_block
        loop = builder.append_basic_block("poll")
        again = builder.append_basic_block("again")
        done = builder.append_basic_block("done")
        builder.branch(loop)
        builder.position_at_end(loop)
        count = builder.phi(i64)
        count.add_incoming(i64(0), start)
        value = builder.load_atomic(array.data, "acquire", 8)
        changed = builder.icmp_signed("!=", value, args[1])
        builder.cbranch(changed, done, again)
        builder.position_at_end(again)
        _pause(builder)
        following = builder.add(count, i64(1))
        count.add_incoming(following, again)
        builder.cbranch(builder.icmp_signed("<", following, args[2]), loop, done)
        builder.position_at_end(done)
        result = builder.phi(ir.IntType(1))
        result.add_incoming(ir.Constant(ir.IntType(1), 1), loop)
        result.add_incoming(ir.Constant(ir.IntType(1), 0), again)
        return result

    return sig, codegen


@jit
def wait_changed(word: Any, seen: int, polls: int) -> bool:
    """Poll ``word[0]`` (int64) until it is not ``seen``: True, or False after ``polls`` polls."""
    return _poll(word, seen, polls)


_rate: list[float] = []


def polls_per_second() -> float:
    """How many polls of :func:`wait_changed` take a second here (measured once)."""
    if not _rate:
        word = np.zeros(1, dtype=np.int64)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            wait_changed(word, 0, 20_000)
            best = min(best, time.perf_counter() - start)
        _rate.append(20_000 / max(best, 1e-6))
    return _rate[0]


def warm_up() -> None:
    """Compile (or load from numba's cache) the wait, check it both ways, measure its rate."""
    word = np.ones(1, dtype=np.int64)
    if not wait_changed(word, 0, 10) or wait_changed(word, 1, 10):
        raise RuntimeError("computehal: the compiled spin-wait gave a wrong answer")
    polls_per_second()
