"""The :class:`WgpuBackend` class: adapter selection, lifecycle and memory; ops delegate to families.

Every operation arrives here validated (a problem record from :mod:`computehal.validation`)
through :class:`~computehal.backends._base.TableBackend`, which already handled empty
problems, inputs overlapping outputs, constant results and 16-bit storage types; each
``_exec_<op>`` hook hands the record to its op family's module, which records WGSL
dispatches. Nothing is computed on the host.
"""

from __future__ import annotations

import threading
from typing import Any

from ... import validation as v
from ...backend import COMPUTE_OPS
from ...errors import DeviceError
from ...memory import AddressSpace, Allocation, Region
from ...types import Capabilities, DeviceInfo
from .._base import TableBackend, guarded
from .._common import round_up
from . import _attention, _axis, _conv, _elementwise, _gemm, _movement, _norm, _pool
from ._adapter import adapter_kind, capabilities_of, device_info, ordered_adapters
from ._device import Gpu

__all__ = ["WgpuBackend"]

_F32 = frozenset({"float32"})
_STORAGE = frozenset({"float16", "bfloat16", "float32"})


class _AdapterKind:
    """``WgpuBackend.kind``: ``"vulkan"`` on the class, the adapter's own kind on an instance."""

    def __get__(self, backend: WgpuBackend | None, owner: type) -> str:
        return "vulkan" if backend is None else backend.name()


class WgpuBackend(TableBackend):
    """Compute on a wgpu adapter (Vulkan, Metal, D3D12 / WebGPU) with WGSL kernels.

    Parameters
    ----------
    device : int, optional
        Index of the adapter (see :meth:`available_devices`): 0 is the adapter wgpu
        prefers for high-performance work, the others follow in wgpu's order.
    """

    kind = _AdapterKind()

    def __init__(self, device: int = 0) -> None:
        super().__init__(device)
        self._adapter: Any = None
        self._adapter_lock = threading.Lock()
        self._gpu: Gpu | None = None
        self._addresses = AddressSpace()

    # ------------------------------------------------------------------ identity

    def _pick_adapter(self) -> Any:
        with self._adapter_lock:
            if self._adapter is None:
                adapters = ordered_adapters()
                if self._device_ordinal >= len(adapters):
                    raise DeviceError(
                        f"device = {self._device_ordinal} but wgpu lists {len(adapters)} adapters"
                    )
                self._adapter = adapters[self._device_ordinal]
            return self._adapter

    def name(self) -> str:
        try:
            return adapter_kind(self._pick_adapter().info)
        except Exception:  # noqa: BLE001 - name() never fails; an unusable adapter is "webgpu"
            return "webgpu"

    @guarded
    def capabilities(self) -> Capabilities:
        return self._with_dtypes(capabilities_of(self._pick_adapter()))

    @guarded
    def available_devices(self) -> list[DeviceInfo]:
        return [
            device_info(i, adapter, self._with_dtypes(capabilities_of(adapter)))
            for i, adapter in enumerate(ordered_adapters())
        ]

    def _native_dtypes(self) -> dict[str, frozenset[str]]:
        table = {op: _F32 for op in COMPUTE_OPS}
        table.update(
            copy_dtod=frozenset({"uint8"}),
            fill=_STORAGE,
            cast=_STORAGE,
            copy_strided=_F32,
            broadcast_binary=_F32,
            pool2d=_F32,
            layer_norm=_F32,
            rms_norm=_F32,
            batch_norm=_F32,
            lrn=_F32,
        )
        return table

    def _dtype_note(self, dtype: str) -> str:
        return ": WGSL has no float64 (use dtype='float32' or another backend)" if dtype == "float64" else ""

    # ------------------------------------------------------------------ lifecycle

    def _open(self) -> None:
        self._gpu = Gpu(self._pick_adapter())

    def _shutdown(self) -> None:
        """Finish pending work and release the device's own buffers (allocations are freed)."""
        gpu, self._gpu = self._gpu, None
        if gpu is not None:
            gpu.close()

    def _g(self) -> Gpu:
        gpu = self._gpu
        assert gpu is not None, "the backend is initialised before any operation runs"
        return gpu

    @guarded
    def synchronize(self) -> None:
        self._memory()
        self._g().queue.wait()

    # ------------------------------------------------------------------ memory hooks

    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        buffer = self._g().create_buffer(nbytes)
        return self._addresses.reserve(nbytes), buffer

    def _release(self, allocation: Allocation) -> None:
        """Destroy the buffer once no recorded work can use it (scratch ranges too)."""
        buffer, allocation.payload = allocation.payload, None
        if buffer is not None and self._gpu is not None:
            self._gpu.queue.retire(buffer)

    def _write(self, region: Region, data: memoryview) -> None:
        queue = self._g().queue
        buffer = region.payload
        start, stop = region.offset, region.offset + region.nbytes
        lo, hi = start & ~3, round_up(stop, 4)
        if lo == start and hi == stop:
            queue.write(buffer, start, data)
            return
        # Bytes outside [start, stop) in the covering words keep their values: read the
        # partial head and tail words, merge, write whole words.
        block = bytearray(hi - lo)
        if start != lo:
            block[0:4] = queue.read(buffer, lo, 4)
        if stop != hi:
            block[-4:] = queue.read(buffer, hi - 4, 4)
        block[start - lo : stop - lo] = data
        queue.write(buffer, lo, block)

    def _read(self, region: Region, out: memoryview) -> None:
        start, stop = region.offset, region.offset + region.nbytes
        lo, hi = start & ~3, round_up(stop, 4)
        words = self._g().queue.read(region.payload, lo, hi - lo)
        out[:] = words[start - lo : stop - lo]

    # ------------------------------------------------------------------ operations

    def _exec_copy_dtod(self, p: v.CopyProblem) -> None:
        _movement.copy_dtod(self._g(), p)

    def _exec_fill(self, p: v.FillProblem) -> None:
        _movement.fill(self._g(), p)

    def _exec_gemm(self, p: v.GemmProblem) -> None:
        _gemm.gemm(self._g(), p)

    def _exec_batched_gemm(self, p: v.BatchedGemmProblem) -> None:
        _gemm.batched_gemm(self._g(), p)

    def _exec_gemm_mixed_precision(self, p: v.GemmProblem) -> None:
        _gemm.gemm_mixed_precision(self._g(), p)

    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        _conv.conv2d_forward(self._g(), p)

    def _exec_conv2d_backward_data(self, p: v.ConvProblem) -> None:
        _conv.conv2d_backward_data(self._g(), p)

    def _exec_conv2d_backward_filter(self, p: v.ConvProblem) -> None:
        _conv.conv2d_backward_filter(self._g(), p)

    def _exec_pool2d(self, p: v.PoolProblem) -> None:
        _pool.pool2d(self._g(), p)

    def _exec_attention(self, p: v.AttentionProblem) -> None:
        _attention.attention(self._g(), p)

    def _exec_reduce(self, p: v.AxisProblem) -> None:
        _axis.reduce(self._g(), p)

    def _exec_softmax(self, p: v.AxisProblem) -> None:
        _axis.softmax(self._g(), p)

    def _exec_layer_norm(self, p: v.NormProblem) -> None:
        _norm.row_norm(self._g(), p)

    def _exec_rms_norm(self, p: v.NormProblem) -> None:
        _norm.row_norm(self._g(), p)

    def _exec_batch_norm(self, p: v.BatchNormProblem) -> None:
        _norm.batch_norm(self._g(), p)

    def _exec_lrn(self, p: v.LrnProblem) -> None:
        _norm.lrn(self._g(), p)

    def _exec_unary(self, p: v.ElementwiseProblem) -> None:
        _elementwise.unary(self._g(), p)

    def _exec_binary(self, p: v.ElementwiseProblem) -> None:
        _elementwise.binary(self._g(), p)

    def _exec_copy_strided(self, p: v.StridedProblem) -> None:
        _movement.copy_strided(self._g(), p)

    def _exec_cast(self, p: v.CastProblem) -> None:
        _elementwise.cast(self._g(), p)

    def _exec_broadcast_binary(self, p: v.BroadcastProblem) -> None:
        _elementwise.broadcast_binary(self._g(), p)

    def _exec_gather(self, p: v.RowsProblem) -> None:
        _movement.gather(self._g(), p)

    def _exec_scatter(self, p: v.RowsProblem) -> None:
        _movement.scatter(self._g(), p)
