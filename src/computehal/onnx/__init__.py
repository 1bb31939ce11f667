"""Run ONNX models on any computehal backend.

``computehal.onnx.InferenceSession`` has onnxruntime's calling convention::

    from computehal.onnx import InferenceSession
    session = InferenceSession("model.onnx", backend="opencl")
    (logits,) = session.run(None, {"input": x})
    print(session.plan())

Nodes the chosen backend cannot run go to the CPU backend (with a warning, explicit
copies at the border, and the placement in :meth:`InferenceSession.plan`), unless
``strict=True``. :mod:`computehal.onnx.backend` implements ``onnx.backend.base.Backend``
so ONNX's own backend test runner can drive it. Needs the ``onnx`` package
(``pip install computehal[onnx]``).
"""

from __future__ import annotations

from ._partition import BackendLacksError, FallbackWarning
from ._plan import Border, MemoryReport
from ._session import InferenceSession, NodeArg, NodePlacement, PlanReport, shared_backend

__all__ = [
    "BackendLacksError",
    "Border",
    "FallbackWarning",
    "InferenceSession",
    "MemoryReport",
    "NodeArg",
    "NodePlacement",
    "PlanReport",
    "shared_backend",
]
