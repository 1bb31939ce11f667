"""One opened wgpu device: its limits, its queue and pipeline cache, and operand bindings.

Memory is one wgpu storage buffer per allocation, ``n`` bytes rounded up to whole
4-byte words (wgpu copies and shaders move words). An operand inside a buffer is bound
by binding the smallest range that starts at a multiple of
``minStorageBufferOffsetAlignment`` and covers it; the operand's remaining offset goes
to the shader in its uniform parameters, so nothing is copied to reach an interior
pointer. Operands larger than ``maxStorageBufferBindingSize`` raise
:class:`~computehal.UnsupportedError`.

The op families (the sibling modules) receive a :class:`Gpu` and record work through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ...errors import InvalidArgumentError, OutOfMemoryError, UnsupportedError
from ...memory import Region
from .._common import round_up
from ._adapter import check, is_llvmpipe, wgpu_module
from ._programs import Programs
from ._queue import Binding, Copy, Queue, Step

__all__ = ["Gpu", "LLVMPIPE_LOOP_BUDGET"]

#: Mesa's llvmpipe (lavapipe) ends every loop of a shader invocation once 65535 loop
#: iterations have run in total, counted over all loops of the invocation together
#: (LP_MAX_TGSI_LOOP_ITERATIONS in gallivm; measured: a loop of n iterations costs
#: n + 1), and the invocation then carries on with a silently truncated result. On such
#: adapters (only there) the op families cut the work of one invocation so that its
#: estimated iterations stay within this budget (65535 less a margin for the kernels'
#: fixed loops): GEMM runs k in chunks; attention runs ranges of keys in consecutive
#: dispatches carrying each row's online-softmax state; convolution sums ranges of its
#: outer summed dimension in accumulating dispatches; reductions split long slices into
#: chunks combined in a further pass. Only a problem that cannot be cut that far raises
#: UnsupportedError (:meth:`Gpu.check_loops`) rather than return a wrong answer.
LLVMPIPE_LOOP_BUDGET = 60000


class Gpu:
    """An opened adapter: device, limits, :class:`Queue` and :class:`Programs`."""

    def __init__(self, adapter: Any) -> None:
        wgpu = wgpu_module()
        limits = adapter.limits
        wanted = {
            key: limits[key]
            for key in ("max-storage-buffer-binding-size", "max-buffer-size")
            if key in limits
        }
        with check("requesting a device"):
            self.device = adapter.request_device_sync(required_limits=wanted)
        dl = self.device.limits
        self.storage_align = int(dl.get("min-storage-buffer-offset-alignment", 256))
        self.max_binding = int(dl.get("max-storage-buffer-binding-size", 128 << 20))
        self.max_buffer = int(dl.get("max-buffer-size", 256 << 20))
        #: Loop iterations one invocation may run, or None when the adapter has no such limit.
        self.loop_budget: int | None = LLVMPIPE_LOOP_BUDGET if is_llvmpipe(adapter.info) else None
        self.programs = Programs(self.device)
        self.queue = Queue(self.device, self.programs)
        self._usage = wgpu.BufferUsage
        self._dummy = self.create_buffer(16, "computehal-dummy")

    # ------------------------------------------------------------------ buffers

    def create_buffer(self, nbytes: int, label: str = "") -> Any:
        """A storage buffer of ``nbytes`` rounded up to whole words (at least 16 bytes)."""
        padded = max(16, round_up(nbytes, 4))
        if padded > self.max_buffer:
            raise OutOfMemoryError(nbytes, self.max_buffer)
        usage = self._usage
        with check(f"creating a {padded}-byte buffer"):
            return self.device.create_buffer(
                size=padded, usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST, label=label
            )

    def temporary(self, nbytes: int, label: str) -> tuple[Any, Binding]:
        """A per-call buffer and its (uncached) binding; retire it through :meth:`run`."""
        if nbytes > self.max_binding:
            raise UnsupportedError(
                f"a {nbytes}-byte work buffer exceeds this device's maxStorageBufferBindingSize "
                f"({self.max_binding} bytes)"
            )
        buffer = self.create_buffer(round_up(max(nbytes, 16), 16), label)
        return buffer, Binding(buffer, 0, int(buffer.size), 0, cached=False)

    def dummy(self) -> Binding:
        """A 16-byte binding for kernel slots an operation does not use."""
        return Binding(self._dummy, 0, 16)

    # ------------------------------------------------------------------ bindings

    def bind(self, name: str, region: Region, align: int = 4) -> Binding:
        """Bind the aligned buffer range covering ``region`` (no copy).

        ``align`` is the alignment the kernel needs of the operand's byte offset (4 for
        kernels that index 32-bit elements; 1 or 2 for the word-level kernels).
        """
        if region.offset % align:
            raise InvalidArgumentError(
                f"{name} = {region.ptr:#x} is not {align}-byte aligned, as the wgpu kernels need"
            )
        if region.nbytes == 0:
            return self.dummy()
        buffer = region.payload
        start = region.offset - region.offset % self.storage_align
        stop = min(int(buffer.size), round_up(region.offset + region.nbytes, 4))
        size = stop - start
        if size > self.max_binding:
            raise UnsupportedError(
                f"{name} spans {region.nbytes} bytes but this device binds at most "
                f"{self.max_binding} bytes per storage buffer (maxStorageBufferBindingSize)"
            )
        return Binding(buffer, start, size, region.offset - start)

    # ------------------------------------------------------------------ work

    def run(self, steps: Sequence[Step], copies: Iterable[Copy] = (), retire: Iterable[Any] = ()) -> None:
        """Record ``steps`` and ``copies`` on the queue, then retire the per-call buffers ``retire``."""
        self.queue.run(steps, copies, retire)

    def check_loops(self, what: str, iterations: int) -> None:
        """Refuse a dispatch that would exceed llvmpipe's per-invocation loop limit."""
        if self.loop_budget is not None and iterations > self.loop_budget:
            raise UnsupportedError(
                f"{what} needs about {iterations} loop iterations per shader invocation, but this "
                "adapter (Mesa llvmpipe / lavapipe) silently stops every shader loop after 65535 "
                "iterations, so the result would be wrong; use a smaller problem or another backend"
            )

    def close(self) -> None:
        """Finish pending work and release the queue's own buffers."""
        self.queue.close()
        self._dummy.destroy()
