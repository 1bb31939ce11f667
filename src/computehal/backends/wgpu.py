"""WgpuBackend: Vulkan, Metal and WebGPU devices through wgpu-py, kernels in WGSL.

Memory is one wgpu storage buffer per allocation. The buffer behind an allocation of
``n`` bytes holds ``n`` rounded up to a multiple of 4 bytes (wgpu copies move whole
4-byte words) while the pointer table records exactly ``n``. Pointers are synthetic
addresses from :class:`~computehal.memory.AddressSpace`; an interior pointer resolves
to (buffer, byte offset) and is bound by binding the smallest aligned range of the
buffer that covers the operand (offsets must be multiples of
``minStorageBufferOffsetAlignment``) and passing the remaining element offset to the
shader in a uniform. Nothing is copied to reach an interior pointer.

Every operation validates its arguments with :mod:`computehal.validation` (the same
checks as :class:`~computehal.backends.cpu.CpuBackend`), then records WGSL compute
dispatches; nothing is computed on the host. Shader modules, pipelines and bind group
layouts are created once per kernel and cached, as are the bind groups of user
buffers; per call only a 256-byte uniform slot is filled. Recorded work is submitted
in batches (one queue submission for up to 256 dispatches), and always before the host
can observe memory (``copy_htod`` / ``copy_dtoh``, ``free``, ``synchronize``). Where an
output overlaps an input in a way the kernel cannot handle in place, the kernel writes
a temporary buffer that a device-side copy then moves into place.

Numerics: WGSL implementations may treat NaN and infinity loosely (``x != x`` can be
folded to false, ``max`` / ``min`` need not honour NaN), so the kernels test NaN on the
bit pattern and build infinities with ``bitcast``; ``tanh`` is evaluated with its own
polynomial near zero. Mixed-precision GEMM rounds A and B to f16 / bf16 by bit
manipulation of the f32 (round-to-nearest-even, overflow to infinity, NaN kept), which
needs no ``shader-f16`` feature: WGSL's own f32 -> f16 conversion neither guarantees
round-to-nearest-even nor infinity on overflow. ``capabilities().supports_fp16`` still
reports the adapter's ``shader-f16`` feature.

WGSL has no float64: ``gemm(dtype="float64")`` raises
:class:`~computehal.UnsupportedError` and ``capabilities().supports_fp64`` is False.
Operands larger than ``maxStorageBufferBindingSize`` raise
:class:`~computehal.UnsupportedError`; allocations beyond ``maxBufferSize`` raise
:class:`~computehal.OutOfMemoryError`.
"""

from __future__ import annotations

import os
import tempfile
import threading
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from .. import validation as v
from ..backend import COMPUTE_OPS
from ..errors import DeviceError, InvalidArgumentError, OutOfMemoryError, UnsupportedError
from ..memory import AddressSpace, Allocation, Region
from ..types import BinaryOp, Capabilities, DeviceInfo, MemoryKind, MixedPrecision, ReduceOp, UnaryOp
from ._base import TableBackend, guarded
from ._common import refuse_extensions

__all__ = ["WgpuBackend", "adapter_kind"]

F32 = np.dtype(np.float32)

_OPS = frozenset(COMPUTE_OPS)

#: Bytes reserved per dispatch in the uniform ring (>= any minUniformBufferOffsetAlignment).
_SLOT = 256
#: Dispatches recorded per submission at most (uniform ring slots).
_SLOTS = 256
#: maxComputeWorkgroupsPerDimension of WebGPU; larger 1-D grids spill into grid.y.
_MAX_GROUPS = 65535
#: GEMMs with at most this many elements of C per batch use one invocation per element.
_SMALL_GEMM = 1024
#: Reductions of at most this many slices, each at least _SPLIT_LENGTH long, run in two
#: passes: chunks of >= _SPLIT_CHUNK elements (at most _SPLIT_MAX_CHUNKS per slice), then
#: one workgroup per slice over the partial results.
_SPLIT_SLICES = 256
_SPLIT_LENGTH = 1 << 16
_SPLIT_CHUNK = 4096
_SPLIT_MAX_CHUNKS = 1024
#: Bind groups kept in the cache before it is cleared.
_BIND_GROUP_CACHE = 1024
#: Mesa's llvmpipe (lavapipe) ends every loop of a shader invocation once 65535 loop
#: iterations have run in total, counted over all loops of the invocation together
#: (LP_MAX_TGSI_LOOP_ITERATIONS in gallivm; measured here: a loop of n iterations costs
#: n + 1), and the invocation then carries on with a silently truncated result. On such
#: adapters (only there; other adapters run every operation in its single-pass form) the
#: work of one invocation is cut so that its estimated iterations stay within
#: _LLVMPIPE_LOOP_BUDGET (65535 less a margin for the kernels' fixed loops): GEMM runs k
#: in chunks of _LLVMPIPE_K_CHUNK (C accumulated with beta = 1 after the first chunk);
#: attention runs ranges of keys in consecutive dispatches that carry each row's
#: online-softmax state in a scratch buffer; conv2d sums ranges of its outer summed
#: dimension in consecutive accumulating dispatches; reduce and softmax split long slices
#: into chunks reduced by separate workgroups and combined in a further pass. Only a
#: problem that cannot be cut that far (e.g. a single row of a filter gradient wider than
#: the budget) raises UnsupportedError (``_check_loops``) rather than return a wrong answer.
_LLVMPIPE_LOOP_BUDGET = 60000
_LLVMPIPE_K_CHUNK = 32768
#: Output columns per pass over the keys in wgpu_attention.wgsl (its DC).
_ATTENTION_DC = 128

_UNARY_CODES = {op: i for i, op in enumerate(UnaryOp)}
_BINARY_CODES = {op: i for i, op in enumerate(BinaryOp)}
_REDUCE_CODES = {ReduceOp.SUM: 0, ReduceOp.MAX: 1, ReduceOp.MIN: 2, ReduceOp.MEAN: 3}

_ELEMENTWISE = "wgpu_elementwise_ops.wgsl+wgpu_elementwise.wgsl"
_ELEMENTWISE4 = "wgpu_elementwise_ops.wgsl+wgpu_elementwise4.wgsl"

#: kernel entry point -> (WGSL files joined by "+", number of storage buffers bound after
#: the uniform). wgpu_common.wgsl is prepended to every module.
_KERNELS: dict[str, tuple[str, int]] = {
    "unary": (_ELEMENTWISE, 3),
    "binary": (_ELEMENTWISE, 3),
    "unary4": (_ELEMENTWISE4, 3),
    "binary4": (_ELEMENTWISE4, 3),
    "gemm": ("wgpu_gemm.wgsl", 3),
    "gemm_scale": ("wgpu_gemm.wgsl", 3),
    "gemm_small": ("wgpu_gemm.wgsl", 3),
    "conv_forward": ("wgpu_conv.wgsl", 3),
    "conv_backward_data": ("wgpu_conv.wgsl", 3),
    "conv_backward_filter": ("wgpu_conv.wgsl", 3),
    "attention": ("wgpu_attention.wgsl", 5),
    "reduce_thread": ("wgpu_reduce.wgsl", 2),
    "reduce_group": ("wgpu_reduce.wgsl", 2),
    "reduce_partial": ("wgpu_reduce.wgsl", 2),
    "softmax_thread": ("wgpu_reduce.wgsl", 2),
    "softmax_group": ("wgpu_reduce.wgsl", 2),
    "softmax_split_stats": ("wgpu_reduce.wgsl", 3),
    "softmax_split_sums": ("wgpu_reduce.wgsl", 3),
    "softmax_split_write": ("wgpu_reduce.wgsl", 3),
    "gather": ("wgpu_rows.wgsl", 3),
    "scatter": ("wgpu_rows.wgsl", 3),
}


def _wgpu() -> Any:
    """Import wgpu-py (an optional dependency) on first use."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        # Mesa's Vulkan loader warns without it; a private directory keeps it quiet.
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="computehal-xdg-")
    try:
        import wgpu
    except ImportError as exc:
        raise DeviceError(f"the wgpu backend needs wgpu-py (pip install 'computehal[wgpu]'): {exc}") from None
    return wgpu


def adapter_kind(info: Any) -> str:
    """The backend kind of an adapter: ``"vulkan"``, ``"metal"`` or ``"webgpu"``."""
    backend = str(_info_get(info, "backend_type", "")).lower()
    if backend == "vulkan":
        return "vulkan"
    if backend == "metal":
        return "metal"
    return "webgpu"


def _info_get(info: Any, key: str, default: Any) -> Any:
    try:
        return info[key]
    except (KeyError, TypeError, IndexError):
        return getattr(info, key, default)


def _source(files: str) -> str:
    """The WGSL of one shader module: the common helpers, then ``files`` ("a.wgsl+b.wgsl")."""
    package = resources.files("computehal") / "kernels"
    parts = ["wgpu_common.wgsl", *files.split("+")]
    return "\n".join((package / name).read_text(encoding="utf-8") for name in parts)


def _pack(*values: int | float | bool) -> bytes:
    """Pack uniform fields: ``float`` -> f32, ``int`` / ``bool`` -> u32 (negatives as i32)."""
    words = np.zeros(len(values), dtype=np.uint32)
    for i, value in enumerate(values):
        if isinstance(value, float):
            words[i] = np.float32(value).view(np.uint32)
        else:
            words[i] = int(value) & 0xFFFFFFFF
    return words.tobytes()


def _grid_1d(invocations: int, workgroup: int) -> tuple[int, int, int]:
    """A 2-D grid of workgroups covering ``invocations`` (grid.x <= 65535)."""
    groups = max(1, -(-invocations // workgroup))
    gx = min(groups, _MAX_GROUPS)
    gy = -(-groups // gx)
    if gy > _MAX_GROUPS:
        raise UnsupportedError(f"a dispatch of {invocations} invocations exceeds the device grid limits")
    return gx, gy, 1


@dataclass(frozen=True)
class _Binding:
    """A storage-buffer binding: ``size`` bytes of ``buffer`` from byte ``offset``."""

    buffer: Any
    offset: int
    size: int
    elem: int  # element offset of the operand inside the binding
    cached: bool = True  # False for per-call temporaries: their bind groups are not kept


@dataclass(frozen=True)
class _Step:
    """One compute dispatch of a submission."""

    kernel: str
    params: bytes
    bindings: tuple[_Binding, ...]
    grid: tuple[int, int, int]


@dataclass(frozen=True)
class _Copy:
    """A buffer-to-buffer copy recorded between dispatches."""

    src: Any
    src_offset: int
    dst: Any
    dst_offset: int
    size: int


class WgpuBackend(TableBackend):
    """Compute on a wgpu adapter (Vulkan, Metal, D3D12 / WebGPU) with WGSL kernels.

    Parameters
    ----------
    adapter : int, optional
        Index into the adapters wgpu enumerates (see :meth:`available_devices`).
        The default asks wgpu for its high-performance adapter.
    """

    def __init__(self, adapter: int | None = None) -> None:
        super().__init__()
        self._adapter_index = adapter
        self._adapter: Any = None
        self._device: Any = None
        self._queue: Any = None
        self._addresses = AddressSpace()
        self._lock = threading.RLock()
        self._modules: dict[str, Any] = {}
        self._pipelines: dict[str, Any] = {}
        self._layouts: dict[int, tuple[Any, Any]] = {}
        self._bind_groups: dict[tuple[Any, ...], Any] = {}
        self._uniform: Any = None
        self._dummy: Any = None
        self._scratch: Any = None
        self._pending: Any = None
        self._pending_params = bytearray()
        self._pending_slots = 0
        self._storage_align = 256
        self._max_binding = 128 << 20
        self._max_buffer = 256 << 20
        self._loop_budget: int | None = None

    # ------------------------------------------------------------------ identity

    def _pick_adapter(self) -> Any:
        if self._adapter is None:
            wgpu = _wgpu()
            if self._adapter_index is None:
                adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
                if adapter is None:
                    raise DeviceError("wgpu found no adapter")
            else:
                adapters = wgpu.gpu.enumerate_adapters_sync()
                if not 0 <= self._adapter_index < len(adapters):
                    raise InvalidArgumentError(
                        f"adapter = {self._adapter_index} but wgpu lists {len(adapters)} adapters"
                    )
                adapter = adapters[self._adapter_index]
            self._adapter = adapter
        return self._adapter

    def name(self) -> str:
        try:
            return adapter_kind(self._pick_adapter().info)
        except Exception:  # noqa: BLE001 - name() never fails; an unusable adapter is "webgpu"
            return "webgpu"

    @staticmethod
    def _capabilities_of(adapter: Any) -> Capabilities:
        limits = adapter.limits
        features = set(adapter.features)
        info = adapter.info
        subgroup = 1
        if "subgroup" in features:
            # The smallest subgroup the adapter may run (wgpu-py 0.2x spells the key differently).
            size = _info_get(info, "subgroup_min_size", None) or _info_get(info, "stackgroup_min_size", 0)
            subgroup = int(size or 0) or 1
        adapter_type = str(_info_get(info, "adapter_type", "")).lower()
        return Capabilities(
            supports_fp16="shader-f16" in features,
            supports_bf16=False,
            supports_fp8=False,
            tensor_cores=False,
            peer_access=False,
            unified_memory=adapter_type in ("cpu", "integratedgpu", "integrated-gpu"),
            cluster_launch=False,
            async_copy=False,
            max_threads_per_block=int(limits.get("max-compute-invocations-per-workgroup", 256)),
            max_shared_mem_per_block=int(limits.get("max-compute-workgroup-storage-size", 16384)),
            warp_size=subgroup,
            supports_fp64=False,
            native_ops=_OPS,
        )

    @guarded
    def capabilities(self) -> Capabilities:
        return self._with_dtypes(self._capabilities_of(self._pick_adapter()))

    def _native_dtypes(self) -> dict[str, frozenset[str]]:
        table = {op: frozenset({"float32"}) for op in _OPS}
        table.update(copy_dtod=frozenset({"uint8"}), fill=frozenset({"float32"}))
        return table

    def _dtype_note(self, dtype: str) -> str:
        return ": WGSL has no float64 (use dtype='float32' or another backend)" if dtype == "float64" else ""

    def _exec_copy_dtod(self, p: v.CopyProblem) -> None:
        if (p.src.offset | p.dst.offset | p.nbytes) % 4:
            raise UnsupportedError("copy_dtod of ranges not aligned to 4 bytes on the wgpu backend (yet)")
        with self._lock:
            self._run([], [_Copy(p.src.payload, p.src.offset, p.dst.payload, p.dst.offset, p.nbytes)])

    def _exec_fill(self, p: v.FillProblem) -> None:
        # Interim: the constant pattern is uploaded (no operand data is computed on the host).
        pattern = np.full(p.count, p.value, dtype=np.float32)
        self._write(p.region, memoryview(pattern.tobytes()))

    @guarded
    def available_devices(self) -> list[DeviceInfo]:
        wgpu = _wgpu()
        devices = []
        for ordinal, adapter in enumerate(wgpu.gpu.enumerate_adapters_sync()):
            info = adapter.info
            adapter_type = str(_info_get(info, "adapter_type", "")).lower()
            if adapter_type == "cpu":
                kind = MemoryKind.HOST
            elif adapter_type in ("integratedgpu", "integrated-gpu"):
                kind = MemoryKind.UNIFIED
            else:
                kind = MemoryKind.DEVICE
            name = str(_info_get(info, "device", "") or _info_get(info, "description", "") or "adapter")
            backend = str(_info_get(info, "backend_type", ""))
            devices.append(
                DeviceInfo(
                    ordinal=ordinal,
                    name=f"{name} ({backend})" if backend else name,
                    compute_capability=(0, 0),
                    # wgpu does not report device memory; 0 means "not reported".
                    total_memory_bytes=0,
                    memory_kind=kind,
                    capabilities=self._capabilities_of(adapter),
                )
            )
        return devices

    # ------------------------------------------------------------------ lifecycle

    def _open(self) -> None:
        wgpu = _wgpu()
        adapter = self._pick_adapter()
        limits = adapter.limits
        wanted = {}
        for key in ("max-storage-buffer-binding-size", "max-buffer-size"):
            if key in limits:
                wanted[key] = limits[key]
        self._device = adapter.request_device_sync(required_limits=wanted)
        self._queue = self._device.queue
        dl = self._device.limits
        self._storage_align = int(dl.get("min-storage-buffer-offset-alignment", 256))
        self._max_binding = int(dl.get("max-storage-buffer-binding-size", 128 << 20))
        self._max_buffer = int(dl.get("max-buffer-size", 256 << 20))
        device_name = str(_info_get(adapter.info, "device", "")).lower()
        self._loop_budget = _LLVMPIPE_LOOP_BUDGET if "llvmpipe" in device_name else None
        usage = wgpu.BufferUsage
        self._uniform = self._device.create_buffer(
            size=_SLOT * _SLOTS, usage=usage.UNIFORM | usage.COPY_DST, label="computehal-uniforms"
        )
        self._dummy = self._device.create_buffer(size=16, usage=usage.STORAGE, label="computehal-dummy")

    def _shutdown(self) -> None:
        """Finish pending work and drop cached bind groups (allocations are already freed)."""
        with self._lock:
            self._flush()
            self._bind_groups.clear()

    @guarded
    def synchronize(self) -> None:
        self._memory()
        with self._lock:
            self._flush()
            # Mapping a buffer waits for every earlier submission on the queue.
            self._queue.read_buffer(self._sync_buffer(), 0, 4)

    def _sync_buffer(self) -> Any:
        if self._scratch is None:
            wgpu = _wgpu()
            self._scratch = self._device.create_buffer(
                size=16, usage=wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.STORAGE, label="computehal-sync"
            )
        return self._scratch

    # ------------------------------------------------------------------ memory hooks

    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        padded = -(-nbytes // 4) * 4
        if padded > self._max_buffer:
            raise OutOfMemoryError(nbytes, self._max_buffer)
        wgpu = _wgpu()
        usage = wgpu.BufferUsage
        with self._lock:
            try:
                buffer = self._device.create_buffer(
                    size=padded, usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST
                )
            except MemoryError:
                raise OutOfMemoryError(nbytes) from None
            except Exception as exc:  # noqa: BLE001 - wgpu reports allocation failure as its own errors
                if "memory" in str(exc).lower():
                    raise OutOfMemoryError(nbytes) from exc
                raise DeviceError(f"creating a {padded}-byte buffer failed: {exc}") from exc
        return self._addresses.reserve(nbytes), buffer

    def _release(self, allocation: Allocation) -> None:
        with self._lock:
            self._flush()  # recorded work may still use the buffer
            buffer = allocation.payload
            allocation.payload = None
            stale = [key for key in self._bind_groups if any(b is buffer for b in key[1::3])]
            for key in stale:
                del self._bind_groups[key]
            buffer.destroy()

    def _read_words(self, buffer: Any, offset: int, size: int) -> bytes:
        return bytes(self._queue.read_buffer(buffer, offset, size))

    def _write(self, region: Region, data: memoryview) -> None:
        buffer = region.payload
        start, stop = region.offset, region.offset + region.nbytes
        lo, hi = start & ~3, -(-stop // 4) * 4
        with self._lock:
            # queue.write_buffer lands before the next submission: recorded work goes first.
            self._flush()
            if lo == start and hi == stop:
                self._queue.write_buffer(buffer, start, data)
                return
            # Bytes outside [start, stop) in the covering words must keep their values:
            # read the partial head and tail words, merge, write whole words.
            block = bytearray(hi - lo)
            if start != lo:
                block[0:4] = self._read_words(buffer, lo, 4)
            if stop != hi:
                block[-4:] = self._read_words(buffer, hi - 4, 4)
            block[start - lo : stop - lo] = data
            self._queue.write_buffer(buffer, lo, block)

    def _read(self, region: Region, out: memoryview) -> None:
        buffer = region.payload
        start, stop = region.offset, region.offset + region.nbytes
        lo, hi = start & ~3, -(-stop // 4) * 4
        with self._lock:
            self._flush()
            words = self._queue.read_buffer(buffer, lo, hi - lo)
        out[:] = memoryview(words).cast("B")[start - lo : stop - lo]

    # ------------------------------------------------------------------ pipelines

    def _layout(self, storage: int) -> tuple[Any, Any]:
        layout = self._layouts.get(storage)
        if layout is None:
            wgpu = _wgpu()
            compute = wgpu.ShaderStage.COMPUTE
            entries = [
                {
                    "binding": 0,
                    "visibility": compute,
                    "buffer": {"type": wgpu.BufferBindingType.uniform, "has_dynamic_offset": True},
                }
            ]
            entries += [
                {"binding": i, "visibility": compute, "buffer": {"type": wgpu.BufferBindingType.storage}}
                for i in range(1, storage + 1)
            ]
            bgl = self._device.create_bind_group_layout(entries=entries)
            pipeline_layout = self._device.create_pipeline_layout(bind_group_layouts=[bgl])
            layout = (bgl, pipeline_layout)
            self._layouts[storage] = layout
        return layout

    def _pipeline(self, kernel: str) -> Any:
        pipeline = self._pipelines.get(kernel)
        if pipeline is None:
            filename, storage = _KERNELS[kernel]
            module = self._modules.get(filename)
            if module is None:
                module = self._device.create_shader_module(code=_source(filename), label=filename)
                self._modules[filename] = module
            _, pipeline_layout = self._layout(storage)
            pipeline = self._device.create_compute_pipeline(
                layout=pipeline_layout, compute={"module": module, "entry_point": kernel}, label=kernel
            )
            self._pipelines[kernel] = pipeline
        return pipeline

    def _bind_group(self, kernel: str, bindings: tuple[_Binding, ...]) -> Any:
        storage = _KERNELS[kernel][1]
        key: tuple[Any, ...] = (storage,)
        for b in bindings:
            key += (b.buffer, b.offset, b.size)
        group = self._bind_groups.get(key)
        if group is None:
            cache = all(b.cached for b in bindings)
            bgl, _ = self._layout(storage)
            entries = [{"binding": 0, "resource": {"buffer": self._uniform, "offset": 0, "size": _SLOT}}]
            entries += [
                {"binding": i + 1, "resource": {"buffer": b.buffer, "offset": b.offset, "size": b.size}}
                for i, b in enumerate(bindings)
            ]
            group = self._device.create_bind_group(layout=bgl, entries=entries)
            if cache:
                if len(self._bind_groups) >= _BIND_GROUP_CACHE:
                    self._bind_groups.clear()
                self._bind_groups[key] = group
        return group

    # ------------------------------------------------------------------ bindings

    def _bind(self, name: str, region: Region) -> _Binding:
        """Bind the aligned buffer range covering a float32 operand (no copy)."""
        if region.offset % 4:
            raise InvalidArgumentError(
                f"{name} = {region.ptr:#x} is not 4-byte aligned; float32 operands on the "
                f"{self.name()} backend must be"
            )
        if region.nbytes == 0:
            return _Binding(self._dummy, 0, 16, 0)
        buffer = region.payload
        start = region.offset - region.offset % self._storage_align
        stop = min(buffer.size, -(-(region.offset + region.nbytes) // 4) * 4)
        size = stop - start
        if size > self._max_binding:
            raise UnsupportedError(
                f"{name} spans {region.nbytes} bytes but this device binds at most "
                f"{self._max_binding} bytes per storage buffer (maxStorageBufferBindingSize)"
            )
        return _Binding(buffer, start, size, (region.offset - start) // 4)

    def _binding_of(self, buffer: Any, nbytes: int, cached: bool = False) -> _Binding:
        return _Binding(buffer, 0, max(16, -(-nbytes // 4) * 4), 0, cached)

    def _temporary(self, nbytes: int, label: str) -> Any:
        wgpu = _wgpu()
        usage = wgpu.BufferUsage
        return self._device.create_buffer(
            size=max(16, -(-nbytes // 16) * 16),
            usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST,
            label=label,
        )

    def _output(
        self, name: str, out: Region, *inputs: Region, in_place_ok: bool = False
    ) -> tuple[_Binding, list[_Copy]]:
        """The binding a kernel writes ``out`` through, plus copies to run afterwards.

        When ``out`` overlaps an input (other than the exact element-wise in-place
        case) the kernel writes a temporary buffer that is then copied into place on
        the device, so results never depend on the order invocations run in.
        """
        binding = self._bind(name, out)
        clash = any(out.overlaps(r) and not (in_place_ok and r.offset == out.offset) for r in inputs)
        if not clash:
            return binding, []
        temp = self._temporary(out.nbytes, "computehal-out")
        return self._binding_of(temp, out.nbytes), [_Copy(temp, 0, out.payload, out.offset, out.nbytes)]

    def _encoder(self) -> Any:
        """The command encoder collecting work not yet submitted (created on demand)."""
        if self._pending is None:
            self._pending = self._device.create_command_encoder()
        return self._pending

    def _flush(self) -> None:
        """Submit recorded work: write the uniform slots it uses, then submit its commands."""
        with self._lock:
            if self._pending is None:
                return
            encoder, block = self._pending, self._pending_params
            self._pending, self._pending_params, self._pending_slots = None, bytearray(), 0
            if block:
                self._queue.write_buffer(self._uniform, 0, block)
            self._queue.submit([encoder.finish()])

    def _record_copy(self, copy: _Copy) -> None:
        self._encoder().copy_buffer_to_buffer(copy.src, copy.src_offset, copy.dst, copy.dst_offset, copy.size)

    def _run(self, steps: list[_Step], copies: list[_Copy] | None = None) -> None:
        """Record ``steps`` (then ``copies``) for submission.

        Work is submitted in batches (each dispatch owns one slot of the uniform ring
        until then), so a sequence of small operations costs one queue submission; the
        batch is submitted when the ring is full and before anything the host can
        observe (copies, ``synchronize``, ``free``).
        """
        with self._lock:
            for first in range(0, len(steps), _SLOTS):
                chunk = steps[first : first + _SLOTS]
                # Pipelines and bind groups first: a failure there leaves nothing half-recorded.
                resolved = [
                    (self._pipeline(st.kernel), self._bind_group(st.kernel, st.bindings)) for st in chunk
                ]
                if self._pending_slots + len(chunk) > _SLOTS:
                    self._flush()
                compute = self._encoder().begin_compute_pass()
                for step, (pipeline, group) in zip(chunk, resolved, strict=True):
                    offset = self._pending_slots * _SLOT
                    self._pending_params += step.params.ljust(_SLOT, b"\0")
                    self._pending_slots += 1
                    compute.set_pipeline(pipeline)
                    compute.set_bind_group(0, group, [offset])
                    compute.dispatch_workgroups(*step.grid)
                compute.end()
            for c in copies or []:
                self._record_copy(c)

    def _check_loops(self, what: str, iterations: int) -> None:
        """Refuse a dispatch that would exceed llvmpipe's per-invocation loop limit."""
        if self._loop_budget is not None and iterations > self._loop_budget:
            raise UnsupportedError(
                f"{what} needs about {iterations} loop iterations per shader invocation, but this "
                "adapter (Mesa llvmpipe / lavapipe) silently stops every shader loop after 65535 "
                "iterations, so the result would be wrong; use a smaller problem or another backend"
            )

    # ------------------------------------------------------------------ GEMM

    def _gemm_steps(
        self,
        g: v.GemmProblem,
        a: Region,
        b: Region,
        c: Region,
        strides: tuple[int, int, int],
        batches: int,
        round_mode: int,
    ) -> tuple[list[_Step], list[_Copy]]:
        if g.dtype != F32:
            raise UnsupportedError(
                f"gemm with dtype {g.dtype} on the {self.name()} backend: WGSL has no float64 "
                "(use dtype='float32' or another backend)"
            )
        skipped = g.product_skipped
        ba = self._bind("a_ptr", a) if not skipped else self._binding_of(self._dummy, 16, cached=True)
        bb = self._bind("b_ptr", b) if not skipped else self._binding_of(self._dummy, 16, cached=True)
        bc, copies = self._output("c_ptr", c, *(() if skipped else (a, b)))
        if copies:
            # The temporary starts as a copy of C: C may be read (beta != 0), and the rows
            # between m and ldc (and gaps between batches) must come back unchanged.
            pre = _Copy(c.payload, c.offset, copies[0].src, 0, c.nbytes)
        else:
            pre = None
        alpha = float(np.float32(g.alpha))
        beta = float(np.float32(g.beta))
        steps = []
        small = not skipped and g.m * g.n <= _SMALL_GEMM
        chunk = batches if small else _MAX_GROUPS
        # k in chunks on llvmpipe (see _LLVMPIPE_LOOP_BUDGET): C = alpha * A_j B_j + beta_j C.
        k_chunks = [(0, g.k)]
        if not skipped and self._loop_budget is not None and g.k > _LLVMPIPE_K_CHUNK:
            k_chunks = [(k0, min(_LLVMPIPE_K_CHUNK, g.k - k0)) for k0 in range(0, g.k, _LLVMPIPE_K_CHUNK)]
        for base in range(0, batches, chunk):
            count = min(chunk, batches - base)
            for k0, kc in k_chunks:
                first = k0 == 0
                params = _pack(
                    g.m, g.n, kc, g.lda, g.ldb, g.ldc,
                    ba.elem + (k0 if g.trans_a else k0 * g.lda), bb.elem + (k0 * g.ldb if g.trans_b else k0),
                    bc.elem, strides[0], strides[1], strides[2], base,
                    g.trans_a, g.trans_b, first and g.beta == 0.0, round_mode, alpha, beta if first else 1.0,
                    count,
                )  # fmt: skip
                if small:
                    grid = _grid_1d(g.m * g.n * count, 256)
                    steps.append(_Step("gemm_small", params, (ba, bb, bc), grid))
                    continue
                steps.extend(self._gemm_tile_step(g, skipped, params, (ba, bb, bc), count))
        if pre is not None:
            self._pre_copy(pre)
        return steps, copies

    def _gemm_tile_step(
        self, g: v.GemmProblem, skipped: bool, params: bytes, bindings: tuple[_Binding, ...], count: int
    ) -> list[_Step]:
        """The dispatch of the tiled (or, for a skipped product, the scaling) GEMM kernel."""
        if skipped:
            grid = (-(-g.m // 16), -(-g.n // 16), count)
            kernel = "gemm_scale"
        else:
            grid = (-(-g.m // 64), -(-g.n // 64), count)
            kernel = "gemm"
        if grid[0] > _MAX_GROUPS or grid[1] > _MAX_GROUPS:
            raise UnsupportedError(f"gemm of {g.m} x {g.n} exceeds the device's dispatch grid limits")
        return [_Step(kernel, params, bindings, grid)]

    def _pre_copy(self, copy: _Copy) -> None:
        with self._lock:
            self._record_copy(copy)

    def _exec_gemm(self, p: v.GemmProblem) -> None:
        if p.dtype != F32:
            raise UnsupportedError(
                f"gemm with dtype {p.dtype} on the {self.name()} backend: WGSL has no "
                "float64 (use dtype='float32' or another backend)"
            )
        if p.empty:
            return
        steps, copies = self._gemm_steps(p, p.a, p.b, p.c, (0, 0, 0), 1, 0)
        self._run(steps, copies)

    def _exec_batched_gemm(self, p: v.BatchedGemmProblem) -> None:
        if p.gemm.dtype != F32:
            raise UnsupportedError(
                f"batched_gemm with dtype {p.gemm.dtype} on the {self.name()} backend: WGSL has no "
                "float64 (use dtype='float32' or another backend)"
            )
        if p.empty:
            return
        steps, copies = self._gemm_steps(
            p.gemm, p.a, p.b, p.c, (p.stride_a, p.stride_b, p.stride_c), p.batch_count, 0
        )
        self._run(steps, copies)

    def _exec_gemm_mixed_precision(self, p: v.GemmProblem) -> None:
        fmt = p.prec
        assert fmt is not None
        if p.empty:
            return
        mode = 1 if fmt is MixedPrecision.F16 else 2
        steps, copies = self._gemm_steps(p, p.a, p.b, p.c, (0, 0, 0), 1, mode)
        self._run(steps, copies)

    # ------------------------------------------------------------------ convolution

    def _conv_ranges(self, kernel: str, p: v.ConvProblem) -> list[tuple[int, int, int, int]]:
        """The (r_lo, r_hi, q_lo, q_hi) ranges of the dispatches of one convolution.

        One dispatch covers the whole sum unless an invocation would exceed llvmpipe's
        loop budget; then the outer summed dimension (and, for the filter gradient, the
        output rows) is cut so that each dispatch stays within it (see wgpu_conv.wgsl).
        """
        budget = self._loop_budget
        if kernel == "conv_forward":
            outer, per = p.c, 2 + p.fh * (2 + p.fw)
        elif kernel == "conv_backward_data":
            outer, per = p.k, 0
        else:
            outer, per = p.n, 2 + p.oh * (2 + p.ow)
        whole = [(0, outer, 0, p.oh)]
        if kernel == "conv_backward_data":
            # Loops: 1 + fh * (2 + fw * (2 + filters)); cut the filters.
            if budget is None or 1 + p.fh * (2 + p.fw * (2 + p.k)) <= budget:
                return whole
            step = ((budget - 1) // max(1, p.fh) - 2) // max(1, p.fw) - 2
            self._check_loops("conv2d backward data (one filter per dispatch)", 1 + p.fh * (2 + p.fw * 3))
            return [(lo, min(outer, lo + step), 0, p.oh) for lo in range(0, outer, step)] or whole
        if budget is None or 1 + outer * per <= budget:
            return whole
        if 3 + per <= budget:
            step = (budget - 1) // per
            return [(lo, min(outer, lo + step), 0, p.oh) for lo in range(0, outer, step)]
        if kernel == "conv_forward":
            self._check_loops("conv2d forward (one channel per dispatch)", 3 + per)
        # The filter gradient: one image and a band of output rows per dispatch.
        rows = (budget - 4) // (2 + p.ow)
        self._check_loops("conv2d backward filter (one output row per dispatch)", 6 + p.ow)
        return [(n, n + 1, q, min(p.oh, q + rows)) for n in range(outer) for q in range(0, p.oh, rows)]

    def _conv(self, kernel: str, p: v.ConvProblem, written: str, total: int) -> None:
        ranges = self._conv_ranges(kernel, p)
        regions = {"x": p.x, "f": p.f, "y": p.y}
        names = {"x": "input", "f": "filter", "y": "output"}
        bindings: dict[str, _Binding] = {}
        others = [r for key, r in regions.items() if key != written]
        out_binding, copies = self._output(f"{names[written]}_ptr", regions[written], *others)
        for key, region in regions.items():
            bindings[key] = out_binding if key == written else self._bind(f"{names[key]}_ptr", region)
        grid = _grid_1d(total, 256)
        steps = []
        for i, (r_lo, r_hi, q_lo, q_hi) in enumerate(ranges):
            params = _pack(
                p.n, p.c, p.h, p.w, p.k, p.fh, p.fw, p.oh, p.ow, p.sh, p.sw, p.ph, p.pw,
                bindings["x"].elem, bindings["f"].elem, bindings["y"].elem, total,
                r_lo, r_hi, q_lo, q_hi, i > 0,
            )  # fmt: skip
            steps.append(_Step(kernel, params, (bindings["x"], bindings["f"], bindings["y"]), grid))
        self._run(steps, copies)

    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        refuse_extensions("wgpu", "conv2d_forward", p)
        if p.empty_output:
            return
        self._conv("conv_forward", p, "y", p.n * p.k * p.oh * p.ow)

    def _exec_conv2d_backward_data(self, p: v.ConvProblem) -> None:
        refuse_extensions("wgpu", "conv2d_backward_data", p)
        total = p.n * p.c * p.h * p.w
        if total == 0:
            return
        self._conv("conv_backward_data", p, "x", total)

    def _exec_conv2d_backward_filter(self, p: v.ConvProblem) -> None:
        refuse_extensions("wgpu", "conv2d_backward_filter", p)
        total = p.k * p.c * p.fh * p.fw
        if total == 0:
            return
        self._conv("conv_backward_filter", p, "f", total)

    # ------------------------------------------------------------------ attention

    def _exec_attention(self, p: v.AttentionProblem) -> None:
        refuse_extensions("wgpu", "attention", p)
        heads = p.batch * p.heads
        bq, bk, bv = self._bind("q_ptr", p.q), self._bind("k_ptr", p.k), self._bind("v_ptr", p.v)
        bo, copies = self._output("o_ptr", p.o, p.q, p.k, p.v)
        offset = max(-(2**31), min(2**31 - 1, p.causal_offset))
        gy = min(heads, _MAX_GROUPS)
        grid = (-(-p.seq_q // 64), gy, -(-heads // gy))
        if grid[0] > _MAX_GROUPS or grid[2] > _MAX_GROUPS:
            raise UnsupportedError(
                f"attention over {heads} heads x {p.seq_q} queries exceeds the dispatch grid limits"
            )
        # Loop iterations of one invocation (see wgpu_attention.wgsl): per DC-column chunk,
        # per key the key loop, the score loop over head_dim and the accumulator loop over
        # the chunk (each 4 columns an iteration, then up to 3 single columns); per chunk
        # the state load / store and output loops.
        dc = min(p.head_dim, _ATTENTION_DC)
        chunks = -(-p.head_dim // _ATTENTION_DC)
        per_key = p.head_dim // 4 + p.head_dim % 4 + dc // 4 + 3 + 5  # the inner loops run 4 columns a step
        fixed = 3 * (dc + 1) + 4
        one_pass = chunks * (p.seq_kv * per_key + fixed) + 1
        stride = p.head_dim + 2 * chunks
        base = (heads, p.seq_q, p.seq_kv, p.head_dim, p.causal, offset, bq.elem, bk.elem, bv.elem, bo.elem)
        scale = float(np.float32(p.scale))
        if self._loop_budget is None or one_pass <= self._loop_budget:
            params = _pack(*base, scale, 0, p.head_dim, 0, p.seq_kv, 1, 1, stride)
            dummy = self._binding_of(self._dummy, 16, cached=True)
            self._run([_Step("attention", params, (bq, bk, bv, bo, dummy), grid)], copies)
            return
        # llvmpipe: one column chunk and a range of keys per dispatch; the online-softmax
        # state of every row is carried between the dispatches in a scratch buffer, so the
        # result is that of a single pass.
        keys = (self._loop_budget - fixed - 2) // per_key
        self._check_loops(
            f"attention with head_dim {p.head_dim} (one key per shader invocation)", per_key + fixed + 2
        )
        nbytes = 4 * heads * p.seq_q * stride
        if nbytes > self._max_binding:
            raise UnsupportedError(
                f"attention over {heads * p.seq_q} query rows needs a {nbytes}-byte state buffer, above "
                f"this device's maxStorageBufferBindingSize ({self._max_binding} bytes)"
            )
        state = self._binding_of(self._temporary(nbytes, "computehal-attention-state"), nbytes)
        steps = []
        for c in range(chunks):
            d_lo, d_hi = c * _ATTENTION_DC, min(p.head_dim, (c + 1) * _ATTENTION_DC)
            for kv_lo in range(0, p.seq_kv, keys):
                kv_hi = min(p.seq_kv, kv_lo + keys)
                params = _pack(*base, scale, d_lo, d_hi, kv_lo, kv_hi, kv_lo == 0, kv_hi == p.seq_kv, stride)
                steps.append(_Step("attention", params, (bq, bk, bv, bo, state), grid))
        self._run(steps, copies)

    # ------------------------------------------------------------------ reductions

    def _axis_kernel(self, p: v.AxisProblem, name: str, op_code: int) -> None:
        slices = p.outer * p.inner
        passes = 3 if name == "softmax" else 1  # softmax reads each slice three times
        group = p.length >= 256 and (p.inner == 1 or slices < 4096)
        loops = passes * (-(-p.length // 256) + 11) if group else passes * (p.length + 1)
        # Few very long slices, or slices too long for one invocation on llvmpipe: split
        # each slice into chunks reduced by separate workgroups, then combine.
        split = (slices <= _SPLIT_SLICES and p.length >= _SPLIT_LENGTH) or (
            self._loop_budget is not None and loops > self._loop_budget
        )
        src = self._bind("input_ptr", p.input)
        in_place = name == "softmax"
        dst, copies = self._output("output_ptr", p.output, p.input, in_place_ok=in_place)
        if split:
            self._split_axis(p, name, op_code, src, dst, copies)
            return
        params = _pack(p.outer, p.length, p.inner, src.elem, dst.elem, op_code, slices, 0, p.length)
        # Few long slices: a workgroup per slice; otherwise an invocation per slice.
        if group:
            kernel = f"{name}_group"
            gx = min(slices, _MAX_GROUPS)
            grid = (gx, -(-slices // gx), 1)
            if grid[1] > _MAX_GROUPS:
                raise UnsupportedError(f"{slices} slices exceed the device's dispatch grid limits")
        else:
            kernel = f"{name}_thread"
            grid = _grid_1d(slices, 256)
        self._run([_Step(kernel, params, (src, dst), grid)], copies)

    def _split_axis(
        self, p: v.AxisProblem, name: str, op_code: int, src: _Binding, dst: _Binding, copies: list[_Copy]
    ) -> None:
        """Reduce or softmax few very long slices in passes so that many workgroups share each slice.

        Every slice is cut into at most _SPLIT_MAX_CHUNKS chunks of at least
        _SPLIT_CHUNK elements; one workgroup per (chunk, slice) writes partial results
        to a scratch buffer that the next pass combines (see wgpu_reduce.wgsl). No
        invocation loops more than chunk / 256 + chunks / 256 times.
        """
        slices = p.outer * p.inner
        chunk = max(_SPLIT_CHUNK, -(-p.length // _SPLIT_MAX_CHUNKS))
        chunks = -(-p.length // chunk)
        if slices > _MAX_GROUPS:
            raise UnsupportedError(f"{slices} slices exceed the device's dispatch grid limits")
        per_invocation = 2 * (-(-chunk // 256) + -(-chunks // 256)) + 30
        self._check_loops(f"{name} over an axis of {p.length}", per_invocation)
        grid = (chunks, slices, 1)
        if name == "reduce":
            partial_op = 0 if op_code == _REDUCE_CODES[ReduceOp.MEAN] else op_code
            nbytes = 4 * slices * chunks
            temp = self._binding_of(self._temporary(nbytes, "computehal-partials"), nbytes)
            first = _pack(p.outer, p.length, p.inner, src.elem, 0, partial_op, slices, chunk, p.length)
            second = _pack(slices, chunks, 1, 0, dst.elem, op_code, slices, 0, p.length)
            steps = [
                _Step("reduce_partial", first, (src, temp), grid),
                _Step("reduce_group", second, (temp, dst), (slices, 1, 1)),
            ]
        else:
            nbytes = 12 * slices * chunks
            temp = self._binding_of(self._temporary(nbytes, "computehal-partials"), nbytes)
            params = _pack(p.outer, p.length, p.inner, src.elem, dst.elem, 0, slices, chunk, p.length)
            steps = [
                _Step(f"softmax_split_{stage}", params, (src, dst, temp), grid)
                for stage in ("stats", "sums", "write")
            ]
        self._run(steps, copies)

    def _exec_reduce(self, p: v.AxisProblem) -> None:
        if p.outer * p.inner == 0:
            return
        assert p.op is not None
        self._axis_kernel(p, "reduce", _REDUCE_CODES[p.op])

    def _exec_softmax(self, p: v.AxisProblem) -> None:
        refuse_extensions("wgpu", "softmax", p)
        if p.outer * p.length * p.inner == 0:
            return
        self._axis_kernel(p, "softmax", 0)

    # ------------------------------------------------------------------ element-wise

    def _elementwise(self, p: v.ElementwiseProblem, kernel: str, code: int) -> None:
        if p.n == 0:
            return
        ba = self._bind("a_ptr" if p.b is not None else "input_ptr", p.a)
        inputs = [p.a]
        bb = ba
        if p.b is not None:
            bb = self._bind("b_ptr", p.b)
            inputs.append(p.b)
        bo, copies = self._output("output_ptr", p.out, *inputs, in_place_ok=True)
        steps = []
        done = 0
        if p.n >= 4 and ba.elem % 4 == 0 and bb.elem % 4 == 0 and bo.elem % 4 == 0:
            # Four floats per invocation through vec4 views of the same bindings.
            vectors = p.n // 4
            done = 4 * vectors
            views = tuple(
                _Binding(b.buffer, b.offset, b.size - b.size % 16, b.elem, b.cached) for b in (ba, bb, bo)
            )
            params = _pack(vectors, ba.elem // 4, bb.elem // 4, bo.elem // 4, code)
            steps.append(_Step(kernel + "4", params, views, _grid_1d(vectors, 256)))
        if done < p.n:
            rest = p.n - done
            params = _pack(rest, ba.elem + done, bb.elem + done, bo.elem + done, code)
            steps.append(_Step(kernel, params, (ba, bb, bo), _grid_1d(rest, 256)))
        self._run(steps, copies)

    def _exec_unary(self, p: v.ElementwiseProblem) -> None:
        refuse_extensions("wgpu", "unary", p)
        assert isinstance(p.op, UnaryOp)
        self._elementwise(p, "unary", _UNARY_CODES[p.op])

    def _exec_binary(self, p: v.ElementwiseProblem) -> None:
        refuse_extensions("wgpu", "binary", p)
        assert isinstance(p.op, BinaryOp)
        self._elementwise(p, "binary", _BINARY_CODES[p.op])

    # ------------------------------------------------------------------ gather / scatter

    def _indices_binding(self, words: np.ndarray[Any, np.dtype[np.uint32]]) -> _Binding:
        """Upload index words to a device buffer (a host-to-device copy, no compute)."""
        nbytes = words.nbytes
        if nbytes > self._max_binding:
            raise UnsupportedError(
                f"{words.size} index words exceed maxStorageBufferBindingSize ({self._max_binding} bytes)"
            )
        buffer = self._temporary(nbytes, "computehal-indices")
        self._queue.write_buffer(buffer, 0, words)
        return self._binding_of(buffer, nbytes)

    def _rows(
        self, kernel: str, p: v.RowsProblem, words: np.ndarray[Any, np.dtype[np.uint32]], count: int
    ) -> None:
        src = self._bind("input_ptr", p.input)
        dst, copies = self._output("output_ptr", p.output, p.input)
        if copies and kernel == "scatter":
            # Rows not named keep their values: seed the temporary with the output.
            self._pre_copy(_Copy(p.output.payload, p.output.offset, copies[0].src, 0, p.output.nbytes))
        with self._lock:
            idx = self._indices_binding(words)
            params = _pack(count, p.cols, src.elem, dst.elem, 0)
            self._run([_Step(kernel, params, (src, idx, dst), _grid_1d(count * p.cols, 256))], copies)

    def _exec_gather(self, p: v.RowsProblem) -> None:
        refuse_extensions("wgpu", "gather", p)
        assert p.indices is not None
        if p.indices.size == 0 or p.cols == 0:
            return
        self._rows("gather", p, p.indices.astype(np.uint32), int(p.indices.size))

    def _exec_scatter(self, p: v.RowsProblem) -> None:
        refuse_extensions("wgpu", "scatter", p)
        assert p.indices is not None
        if p.indices.size == 0 or p.cols == 0:
            return
        destinations, sources = v.last_occurrences(p.indices)
        pairs = np.empty(2 * destinations.size, dtype=np.uint32)
        pairs[0::2] = destinations
        pairs[1::2] = sources
        self._rows("scatter", p, pairs, int(destinations.size))
