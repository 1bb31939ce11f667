"""The submission queue: uniform ring, command encoder, bind-group cache, buffer retirement.

Operations record compute dispatches (:class:`Step`) and buffer copies (:class:`Copy`)
into one pending command encoder; each dispatch owns a 256-byte slot of a uniform
ring buffer for its parameters. The pending work is submitted as one queue submission
when the ring is full and before the host can observe memory (reads, writes,
``synchronize``), so a sequence of small operations costs one submission.

Buffers that recorded work may still use are never destroyed early: :meth:`Queue.retire`
destroys a buffer at once when nothing is pending, and otherwise right after the
pending work is submitted (wgpu keeps a buffer alive for work already submitted).
Bind groups of user buffers are cached by (buffer, offset, size) and forgotten when
their buffer is retired.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import UnsupportedError
from .._common import ceil_div
from ._adapter import check, wgpu_module
from ._programs import KERNELS, Programs

__all__ = ["Binding", "Copy", "MAX_GROUPS", "Queue", "Step", "grid_1d", "pack", "vec6"]

#: Bytes reserved per dispatch in the uniform ring (>= any minUniformBufferOffsetAlignment).
SLOT = 256
#: Dispatches recorded per submission at most (uniform ring slots).
SLOTS = 256
#: maxComputeWorkgroupsPerDimension of WebGPU; larger 1-D grids spill into grid.y.
MAX_GROUPS = 65535
#: Bind groups kept in the cache before it is cleared.
BIND_GROUP_CACHE = 1024
#: Bytes of retired buffers kept waiting for a submission before one is forced.
RETIRED_BYTES = 256 << 20


@dataclass(frozen=True)
class Binding:
    """A storage-buffer binding: ``size`` bytes of ``buffer`` from byte ``offset``.

    ``byte`` is the operand's byte offset inside the binding (``elem`` = ``byte // 4``,
    its offset in 32-bit words); ``cached`` is False for per-call temporaries, whose
    bind groups are not kept.
    """

    buffer: Any
    offset: int
    size: int
    byte: int = 0
    cached: bool = True

    @property
    def elem(self) -> int:
        """The operand's offset inside the binding, in 32-bit elements."""
        return self.byte // 4


@dataclass(frozen=True)
class Step:
    """One compute dispatch of a submission."""

    kernel: str
    params: bytes
    bindings: tuple[Binding, ...]
    grid: tuple[int, int, int]


@dataclass(frozen=True)
class Copy:
    """A buffer-to-buffer copy of whole 4-byte words, recorded in order with the dispatches."""

    src: Any
    src_offset: int
    dst: Any
    dst_offset: int
    size: int


def pack(*values: int | float | bool) -> bytes:
    """Pack uniform fields: ``float`` -> f32, ``int`` / ``bool`` -> u32 (negatives as i32)."""
    words = np.zeros(len(values), dtype=np.uint32)
    for i, value in enumerate(values):
        if isinstance(value, float):
            words[i] = np.float32(value).view(np.uint32)
        else:
            words[i] = int(value) & 0xFFFFFFFF
    return words.tobytes()


def vec6(values: Sequence[int]) -> list[int]:
    """Up to 6 dimension values padded with zeros to the 8 words of two uniform vec4s."""
    return [*values, *([0] * (8 - len(values)))]


def grid_1d(invocations: int, workgroup: int) -> tuple[int, int, int]:
    """A 2-D grid of workgroups covering ``invocations`` (grid.x <= 65535)."""
    groups = max(1, ceil_div(invocations, workgroup))
    gx = min(groups, MAX_GROUPS)
    gy = ceil_div(groups, gx)
    if gy > MAX_GROUPS:
        raise UnsupportedError(f"a dispatch of {invocations} invocations exceeds the device grid limits")
    return gx, gy, 1


class Queue:
    """Records work for one wgpu device and submits it in batches. Thread-safe."""

    def __init__(self, device: Any, programs: Programs) -> None:
        wgpu = wgpu_module()
        self._device = device
        self._queue = device.queue
        self._programs = programs
        self._lock = threading.RLock()
        usage = wgpu.BufferUsage
        with check("creating the uniform ring"):
            self._uniform = device.create_buffer(
                size=SLOT * SLOTS, usage=usage.UNIFORM | usage.COPY_DST, label="computehal-uniforms"
            )
            self._sync = device.create_buffer(
                size=16, usage=usage.COPY_SRC | usage.STORAGE, label="computehal-sync"
            )
        self._pending: Any = None
        self._params = bytearray()
        self._slots = 0
        self._groups: dict[tuple[Any, ...], Any] = {}
        self._keys_of: dict[Any, set[tuple[Any, ...]]] = {}
        self._retired: list[Any] = []
        self._retired_bytes = 0

    # ------------------------------------------------------------------ recording

    def run(self, steps: Sequence[Step], copies: Iterable[Copy] = (), retire: Iterable[Any] = ()) -> None:
        """Record ``steps``, then ``copies``; then retire the buffers in ``retire``.

        Pipelines and bind groups are resolved before anything is recorded, so a
        failure there leaves nothing half-recorded.
        """
        with self._lock:
            for first in range(0, len(steps), SLOTS):
                chunk = steps[first : first + SLOTS]
                resolved = [
                    (self._programs.pipeline(st.kernel), self._bind_group(st.kernel, st.bindings))
                    for st in chunk
                ]
                if self._slots + len(chunk) > SLOTS:
                    self.flush()
                with check("recording a compute pass"):
                    compute = self._encoder().begin_compute_pass()
                    for step, (pipeline, group) in zip(chunk, resolved, strict=True):
                        offset = self._slots * SLOT
                        self._params += step.params.ljust(SLOT, b"\0")
                        self._slots += 1
                        compute.set_pipeline(pipeline)
                        compute.set_bind_group(0, group, [offset])
                        compute.dispatch_workgroups(*step.grid)
                    compute.end()
            for c in copies:
                with check("recording a buffer copy"):
                    self._encoder().copy_buffer_to_buffer(c.src, c.src_offset, c.dst, c.dst_offset, c.size)
            for buffer in retire:
                self.retire(buffer)

    def _encoder(self) -> Any:
        if self._pending is None:
            with check("creating a command encoder"):
                self._pending = self._device.create_command_encoder()
        return self._pending

    def _bind_group(self, kernel: str, bindings: tuple[Binding, ...]) -> Any:
        storage = KERNELS[kernel][1]
        key: tuple[Any, ...] = (storage,)
        for b in bindings:
            key += (b.buffer, b.offset, b.size)
        group = self._groups.get(key)
        if group is None:
            bgl, _ = self._programs.layout(storage)
            entries = [{"binding": 0, "resource": {"buffer": self._uniform, "offset": 0, "size": SLOT}}]
            entries += [
                {"binding": i + 1, "resource": {"buffer": b.buffer, "offset": b.offset, "size": b.size}}
                for i, b in enumerate(bindings)
            ]
            with check(f"creating a bind group for {kernel}"):
                group = self._device.create_bind_group(layout=bgl, entries=entries)
            if all(b.cached for b in bindings):
                if len(self._groups) >= BIND_GROUP_CACHE:
                    self._groups.clear()
                    self._keys_of.clear()
                self._groups[key] = group
                for b in bindings:
                    self._keys_of.setdefault(b.buffer, set()).add(key)
        return group

    def cached_groups(self) -> int:
        """Number of bind groups in the cache."""
        with self._lock:
            return len(self._groups)

    # ------------------------------------------------------------------ submission

    def flush(self) -> None:
        """Submit recorded work (its uniform slots first), then destroy buffers retired meanwhile."""
        with self._lock:
            if self._pending is not None:
                encoder, block = self._pending, self._params
                self._pending, self._params, self._slots = None, bytearray(), 0
                with check("submitting work"):
                    if block:
                        self._queue.write_buffer(self._uniform, 0, block)
                    self._queue.submit([encoder.finish()])
            retired, self._retired, self._retired_bytes = self._retired, [], 0
            for buffer in retired:
                buffer.destroy()

    def retire(self, buffer: Any) -> None:
        """Destroy ``buffer`` once no recorded-but-unsubmitted work can use it any more."""
        with self._lock:
            for key in self._keys_of.pop(buffer, ()):
                self._groups.pop(key, None)
            if self._pending is None:
                buffer.destroy()
                return
            self._retired.append(buffer)
            self._retired_bytes += int(buffer.size)
            if self._retired_bytes > RETIRED_BYTES:
                self.flush()

    def write(self, buffer: Any, offset: int, data: Any) -> None:
        """Write host bytes (whole words) after all recorded work."""
        with self._lock:
            # queue.write_buffer lands before the next submission: recorded work goes first.
            self.flush()
            with check("writing a buffer"):
                self._queue.write_buffer(buffer, offset, data)

    def upload(self, buffer: Any, data: Any) -> None:
        """Write host bytes into a new buffer that no recorded work uses yet (no flush needed)."""
        with self._lock, check("uploading to a buffer"):
            self._queue.write_buffer(buffer, 0, data)

    def read(self, buffer: Any, offset: int, size: int) -> memoryview:
        """Read ``size`` bytes (whole words) once all recorded work has finished."""
        with self._lock:
            self.flush()
            with check("reading a buffer"):
                return memoryview(self._queue.read_buffer(buffer, offset, size)).cast("B")

    def wait(self) -> None:
        """Submit everything recorded and block until the device has finished it."""
        with self._lock:
            self.flush()
            # Mapping a buffer waits for every earlier submission on the queue.
            with check("waiting for the queue"):
                self._queue.read_buffer(self._sync, 0, 4)

    def close(self) -> None:
        """Finish pending work and drop the cache and the ring."""
        with self._lock:
            self.flush()
            self._groups.clear()
            self._keys_of.clear()
            self._uniform.destroy()
            self._sync.destroy()
