"""The pipeline cache: WGSL modules, bind-group layouts and compute pipelines, built once each.

Every kernel entry point is listed in :data:`KERNELS` with the WGSL files its module
joins and the number of storage buffers it binds after the uniform at binding 0. A
module's source comes from the one kernel loader of :mod:`computehal.kernels`: the
op-code constants shared with Python, then ``wgpu_common.wgsl``, then its files.
Pipelines are keyed by entry point, so the cache is bounded by this table.
"""

from __future__ import annotations

import threading
from typing import Any

from ...kernels import kernel_source
from ._adapter import check, wgpu_module

__all__ = ["KERNELS", "Programs", "module_source"]

_OPS = "wgpu_math.wgsl+wgpu_elementwise_ops.wgsl"
_ELEMENTWISE = _OPS + "+wgpu_elementwise_params.wgsl+wgpu_elementwise.wgsl"
_ELEMENTWISE4 = _OPS + "+wgpu_elementwise_params.wgsl+wgpu_elementwise4.wgsl"

#: Kernel entry point -> (WGSL files joined by "+", storage buffers bound after the uniform).
KERNELS: dict[str, tuple[str, int]] = {
    "unary": (_ELEMENTWISE, 3),
    "binary": (_ELEMENTWISE, 3),
    "unary4": (_ELEMENTWISE4, 3),
    "binary4": (_ELEMENTWISE4, 3),
    "gemm": ("wgpu_gemm.wgsl", 3),
    "gemm_scale": ("wgpu_gemm.wgsl", 3),
    "gemm_small": ("wgpu_gemm.wgsl", 3),
    "conv_forward": ("wgpu_conv.wgsl", 4),
    "conv_depthwise": ("wgpu_conv.wgsl", 4),
    "conv_backward_data": ("wgpu_conv.wgsl", 4),
    "conv_backward_filter": ("wgpu_conv.wgsl", 4),
    "attention": ("wgpu_attention.wgsl", 6),
    "reduce_thread": ("wgpu_reduce.wgsl", 2),
    "reduce_group": ("wgpu_reduce.wgsl", 2),
    "reduce_partial": ("wgpu_reduce.wgsl", 2),
    "softmax_thread": ("wgpu_reduce.wgsl", 2),
    "softmax_group": ("wgpu_reduce.wgsl", 2),
    "softmax_split_stats": ("wgpu_reduce.wgsl", 3),
    "softmax_split_sums": ("wgpu_reduce.wgsl", 3),
    "softmax_split_write": ("wgpu_reduce.wgsl", 3),
    "gather": ("wgpu_rows.wgsl", 4),
    "scatter": ("wgpu_rows.wgsl", 4),
    "index_check": ("wgpu_rows.wgsl", 4),
    "gather_device": ("wgpu_rows.wgsl", 4),
    "scatter_device": ("wgpu_rows.wgsl", 4),
    "fill_words": ("wgpu_movement.wgsl", 2),
    "copy_bytes": ("wgpu_movement.wgsl", 2),
    "copy_strided": ("wgpu_strided_index.wgsl+wgpu_strided.wgsl", 2),
    "broadcast_binary": (_OPS + "+wgpu_strided_index.wgsl+wgpu_broadcast.wgsl", 3),
    "convert": ("wgpu_cast.wgsl", 2),
    "pool2d": ("wgpu_pool.wgsl", 2),
    "row_norm": ("wgpu_math.wgsl+wgpu_norm.wgsl", 6),
    "batch_norm": ("wgpu_math.wgsl+wgpu_norm.wgsl", 6),
    "lrn": ("wgpu_math.wgsl+wgpu_norm.wgsl", 6),
}


def module_source(files: str) -> str:
    """The WGSL of one shader module: op-code constants, common helpers, then ``files``."""
    return kernel_source("wgpu_common.wgsl+" + files)


class Programs:
    """Shader modules, layouts and pipelines of one wgpu device, each created on first use."""

    def __init__(self, device: Any) -> None:
        self._device = device
        self._lock = threading.Lock()
        self._modules: dict[str, Any] = {}
        self._layouts: dict[int, tuple[Any, Any]] = {}
        self._pipelines: dict[str, Any] = {}

    def compiled(self) -> tuple[frozenset[str], frozenset[str]]:
        """(entry points with a pipeline, module sources compiled) so far."""
        with self._lock:
            return frozenset(self._pipelines), frozenset(self._modules)

    def layout(self, storage: int) -> tuple[Any, Any]:
        """(bind-group layout, pipeline layout): a dynamic-offset uniform, then ``storage`` buffers."""
        with self._lock:
            return self._layout(storage)

    def _layout(self, storage: int) -> tuple[Any, Any]:
        layout = self._layouts.get(storage)
        if layout is None:
            wgpu = wgpu_module()
            compute = wgpu.ShaderStage.COMPUTE
            entries: list[dict[str, Any]] = [
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
            with check("creating a bind group layout"):
                bgl = self._device.create_bind_group_layout(entries=entries)
                pipeline_layout = self._device.create_pipeline_layout(bind_group_layouts=[bgl])
            layout = (bgl, pipeline_layout)
            self._layouts[storage] = layout
        return layout

    def pipeline(self, kernel: str) -> Any:
        """The compute pipeline of entry point ``kernel``."""
        with self._lock:
            pipeline = self._pipelines.get(kernel)
            if pipeline is None:
                files, storage = KERNELS[kernel]
                module = self._modules.get(files)
                if module is None:
                    with check(f"compiling {files}"):
                        module = self._device.create_shader_module(code=module_source(files), label=files)
                    self._modules[files] = module
                _, pipeline_layout = self._layout(storage)
                with check(f"creating the pipeline {kernel}"):
                    pipeline = self._device.create_compute_pipeline(
                        layout=pipeline_layout,
                        compute={"module": module, "entry_point": kernel},
                        label=kernel,
                    )
                self._pipelines[kernel] = pipeline
            return pipeline
