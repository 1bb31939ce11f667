"""``onnx.backend.base.Backend`` for computehal, so ONNX's backend test runner can drive it.

The module itself is a backend (``prepare``, ``run_model``, ``run_node``,
``supports_device``), as ``onnxruntime.backend`` is: ONNX's device ``"CPU"`` runs on the
computehal CPU backend and ``"CUDA[:n]"`` on the CUDA backend. :func:`for_backend` makes a
backend class whose ``"CPU"`` device is any other computehal backend (``"opencl"``,
``"vulkan"``, ...), which is how the test suite runs ONNX's node tests on every backend::

    import onnx.backend.test
    from computehal.onnx import backend
    tests = onnx.backend.test.BackendTest(backend.for_backend("opencl"), __name__)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from ..backend import ComputeBackend
from ..errors import BackendError, InvalidArgumentError
from ._session import InferenceSession, shared_backend

__all__ = [
    "ComputehalBackend",
    "ComputehalRep",
    "for_backend",
    "prepare",
    "run_model",
    "run_node",
    "supports_device",
]


class ComputehalRep(BackendRep):
    """A prepared model: :meth:`run` takes the inputs in graph order (or a name -> array dict)."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self._inputs = [i.name for i in session.get_inputs()]
        self._outputs = [o.name for o in session.get_outputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            feed = dict(inputs)
        elif isinstance(inputs, (list, tuple)):
            if len(inputs) != len(self._inputs):
                raise InvalidArgumentError(f"{len(inputs)} inputs given, the model takes {len(self._inputs)}")
            feed = dict(zip(self._inputs, inputs, strict=True))
        else:
            feed = {self._inputs[0]: inputs}
        results = self.session.run(None, feed)
        return namedtupledict("Outputs", self._outputs)(*results)


class ComputehalBackend(Backend):
    """The ONNX backend interface on computehal; ``computehal_backend`` names the "CPU" device's backend."""

    computehal_backend: str | None = None

    @classmethod
    def _device_backend(cls, device: str) -> ComputeBackend:
        parsed = Device(device)
        if parsed.type == DeviceType.CUDA:
            if cls.computehal_backend is not None:
                raise InvalidArgumentError(
                    f"this backend class runs on {cls.computehal_backend}, not {device}"
                )
            return shared_backend(f"cuda:{parsed.device_id}")
        return shared_backend(cls.computehal_backend or "cpu")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """True when ``device`` can run here (``"CUDA"`` only with a working CUDA backend)."""
        try:
            parsed = Device(device)
        except (AttributeError, ValueError):
            return False
        if parsed.type == DeviceType.CUDA and cls.computehal_backend is not None:
            return False
        try:
            cls._device_backend(device)
        except BackendError:
            return False
        return True

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> ComputehalRep:
        """Load and plan ``model`` on ``device``; ``strict=True`` refuses CPU fallbacks."""
        session = InferenceSession(
            model, backend=cls._device_backend(device), strict=bool(kwargs.get("strict"))
        )
        return ComputehalRep(session)

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[Any, ...]:
        """Prepare ``model`` and run it once."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype[Any], tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node on ``inputs`` (arrays in the order of the node's inputs)."""
        arrays = [np.asarray(a) for a in (inputs.values() if isinstance(inputs, dict) else inputs)]
        names = [n for n in node.input if n]
        if len(arrays) != len(names):
            raise InvalidArgumentError(f"{len(arrays)} inputs given, the node takes {len(names)}")
        graph_inputs = [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
            for n, a in zip(names, arrays, strict=True)
        ]
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        domain = node.domain if node.domain not in ("", "ai.onnx") else ""
        opsets = [helper.make_opsetid(domain, opset)]
        graph = helper.make_graph([node], "run_node", graph_inputs, [])
        model = helper.make_model(graph, opset_imports=opsets)
        inferred = onnx.shape_inference.infer_shapes(model)
        known = {v.name: v for v in inferred.graph.value_info}
        outputs = []
        for i, name in enumerate(o for o in node.output if o):
            if outputs_info is not None and i < len(outputs_info):
                dtype, shape = outputs_info[i]
                outputs.append(
                    helper.make_tensor_value_info(
                        name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape
                    )
                )
            elif name in known:
                outputs.append(known[name])
            else:
                raise InvalidArgumentError(f"the type of output {name!r} cannot be inferred")
        graph = helper.make_graph([node], "run_node", graph_inputs, outputs)
        model = helper.make_model(graph, opset_imports=opsets)
        rep = cls.prepare(model, device, **kwargs)
        return tuple(rep.run(arrays))


def for_backend(name: str) -> type[ComputehalBackend]:
    """A backend class whose ONNX device ``"CPU"`` is the computehal backend ``name``."""
    return type(f"ComputehalBackend_{name}", (ComputehalBackend,), {"computehal_backend": name})


prepare = ComputehalBackend.prepare
run_model = ComputehalBackend.run_model
run_node = ComputehalBackend.run_node
supports_device = ComputehalBackend.supports_device
is_compatible = ComputehalBackend.is_compatible
