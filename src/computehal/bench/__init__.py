"""One benchmark harness for every backend: each operation against its own device's limits.

``computehal bench --backend cpu|opencl|vulkan|cuda [--quick] [--groups a,b] [--out DIR]``
measures, in one run, the device's ceilings and every operation of the interface, and
prints one table (op, size, time, achieved rate, ceiling, ratio, target, PASS/FAIL); it
writes ``DIR/<backend>.json`` and, with matplotlib, ``DIR/<backend>-roofline.png``.

What each row is held against
-----------------------------
* The device's copy bandwidth (memory-bound rows): a parallel host copy for the CPU
  backend, ``copy_dtod`` through the public interface for OpenCL / Vulkan devices,
  ``cudaMemcpy`` for CUDA. Host <-> device copies are reported beside it.
* A vendor library on the same problem, where the device has one: SciPy BLAS
  ``dgemm`` / ``sgemm`` and ``numpy.matmul`` for the CPU; cuBLAS through CuPy and
  PyTorch's ``scaled_dot_product_attention`` for CUDA. OpenCL / Vulkan devices have
  none: their GEMM, convolution and attention rows report GFLOP/s and the ratio to the
  host's sgemm, measured in the same run, without a verdict.

Operation and limit are timed interleaved round by round and the ratio is taken within
each round (see :mod:`computehal.bench._harness`); an operation the backend does not
implement shows as ``unsupported`` and the run goes on. Targets are in
:mod:`computehal.bench._targets`, sizes per device profile in :mod:`computehal.bench._sizes`.

Adding a group of rows from another module
------------------------------------------
A group is a name and a builder that yields :class:`Case` objects for a
:class:`BenchContext`. Register it with :func:`register_group`; a group that is asked
for (``--groups onnx``) and not registered yet is imported from the module
``computehal.<name>.bench`` by convention, and ``--plugin MODULE`` imports any other
module first. For example, in ``computehal/onnx/bench.py``::

    from computehal.bench import BenchContext, Case, Limit, Target, register_group

    def onnx_cases(ctx: BenchContext):
        for batch in (1, 8):
            session = ...  # a computehal session on ctx.backend
            reference = ...  # onnxruntime's CPU session on the same model and feed
            yield Case(
                op="onnx resnet50",
                params=f"batch {batch}",
                run=lambda: session.run(None, feed),  # the harness synchronises ctx.backend
                unit="ms",  # compared by time
                work=0.0,
                limit=Limit("onnxruntime CPU", lambda: reference.run(None, feed), 0.0, kind="reference"),
                target=Target("time", 1.5) if ctx.profile == "cpu" else None,
            )

    register_group("onnx", onnx_cases, description="ResNet-50, encoder, decoder vs onnxruntime")

Allocations made through ``ctx.put`` / ``ctx.empty`` are freed when the group ends;
``with ctx.scope():`` frees them earlier. ``ctx.quick`` asks for a short smoke run;
``ctx.target(key)`` gives the profile's target for the shared kinds of rows
(``"bandwidth"``, ``"gemm"``, ...).
"""

from __future__ import annotations

# The built-in groups register themselves on import, in this order (the order of a run).
# isort: off
from . import _cases_gemm, _cases_conv, _cases_attention, _cases_elementwise  # noqa: F401
from . import _cases_axis, _cases_movement, _cases_overhead  # noqa: F401

# isort: on
from ._cli import build_parser, main
from ._context import BenchContext, relative_error
from ._groups import Group, find_group, register_group, registered_groups
from ._harness import BLAS_SETTLE_SECONDS, BenchResult, Case, Limit, Target, ValueCase
from ._output import format_table, run_document, write_json, write_roofline
from ._run import BenchRun, default_groups, run_benchmarks
from ._sizes import Sizes, sizes_for

__all__ = [
    "BLAS_SETTLE_SECONDS",
    "BenchContext",
    "BenchResult",
    "BenchRun",
    "Case",
    "Group",
    "Limit",
    "Sizes",
    "Target",
    "ValueCase",
    "build_parser",
    "default_groups",
    "find_group",
    "format_table",
    "main",
    "register_group",
    "registered_groups",
    "relative_error",
    "run_benchmarks",
    "run_document",
    "sizes_for",
    "write_json",
    "write_roofline",
]
