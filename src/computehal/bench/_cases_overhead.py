"""The per-call cost of the interface: CPU time of a one-element ``unary`` call.

The figure is the calling thread's CPU time per call (``time.thread_time``), median
over samples of ``sizes.overhead_calls`` calls: what validation and dispatch cost,
without the time the process spends descheduled on a busy machine. Device backends
are synchronised once per sample, outside the measured CPU time of the calls.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from ._context import BenchContext
from ._groups import register_group
from ._harness import ValueCase

__all__ = ["overhead_cases"]


def overhead_cases(ctx: BenchContext) -> Iterator[ValueCase]:
    """A one-element relu, called ``overhead_calls`` times per sample."""
    be = ctx.backend
    pin, pout = ctx.put(np.ones(1, dtype=np.float32)), ctx.empty(4)
    calls = ctx.sizes.overhead_calls

    def measure(repeats: int) -> list[float]:
        samples = []
        for _ in range(repeats + 1):
            start = time.thread_time()
            for _ in range(calls):
                be.unary("relu", pin, pout, 1)
            samples.append((time.thread_time() - start) / calls * 1e6)
            be.synchronize()
        return samples[1:]  # the first sample warms up

    yield ValueCase("overhead", "unary relu, n=1 (CPU time)", "us/call", measure, ctx.target("overhead"))


register_group("overhead", overhead_cases, description="CPU time of a one-element call", default=True)
