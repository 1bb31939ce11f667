"""WgpuBackend: Vulkan, Metal and WebGPU devices through wgpu-py, kernels in WGSL.

Layout of this package:

* ``_adapter``: importing wgpu-py, ordering and describing adapters, and :func:`check`,
  which translates wgpu's errors into computehal's;
* ``_device``: one opened device (limits, operand bindings, llvmpipe's loop budget);
* ``_queue``: the uniform ring, command encoder, bind-group cache, submission and the
  retirement of buffers; ``_programs``: the shader-module and pipeline cache;
* one module per op family (``_gemm``, ``_conv``, ``_attention``, ``_axis``,
  ``_elementwise``, ``_movement``), each recording dispatches of the kernels in
  ``computehal/kernels/wgpu_*.wgsl``;
* ``_backend``: the :class:`WgpuBackend` class itself.

Numerics: WGSL implementations may treat NaN and infinity loosely (``x != x`` can be
folded to false, ``max`` / ``min`` need not honour NaN), so the kernels test NaN on the
bit pattern and build infinities with ``bitcast``. WGSL has no float64: such calls raise
:class:`~computehal.UnsupportedError` and ``capabilities().supports_fp64`` is False.
"""

from __future__ import annotations

from ._adapter import adapter_kind
from ._backend import WgpuBackend

__all__ = ["WgpuBackend", "adapter_kind"]
