"""Shape specialisation: concrete shapes for every value, given the input shapes.

ONNX's own shape inference (with data propagation) gives the shapes; between rounds of
inference, everything that became constant (``Shape`` of a tensor of known shape and the
integer arithmetic built on it, ``ConstantOfShape`` of a known shape, ...) is folded, until
nothing changes. Large float constants travel to the inference as typed inputs without
their data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import UnsupportedError
from ._ir import Graph, dtype_of_elem, is_float
from ._simplify import fold_constants, prune

__all__ = ["Specialized", "specialize"]

#: Float constants up to this many elements are given to shape inference with their data.
_SMALL = 64


@dataclass
class Specialized:
    """A graph whose every value has a known dtype and shape, for one set of input shapes."""

    graph: Graph
    dtypes: dict[str, np.dtype[Any]]
    shapes: dict[str, tuple[int, ...]]

    def info(self, name: str) -> tuple[np.dtype[Any], tuple[int, ...]] | None:
        """(dtype, shape) of a value, or None where inference could not tell."""
        if name in self.graph.consts:
            value = self.graph.consts[name]
            return value.dtype, tuple(value.shape)
        if name in self.dtypes and name in self.shapes:
            return self.dtypes[name], self.shapes[name]
        return None


def specialize(
    graph: Graph,
    input_shapes: dict[str, tuple[int, ...]],
    frozen: dict[str, np.ndarray] | None = None,
    *,
    rounds: int = 8,
) -> Specialized:
    """Shapes for every value of ``graph`` when its inputs have ``input_shapes``.

    ``frozen`` inputs are treated as constants with the given values (for models whose
    shapes depend on the values of small integer inputs).
    """
    g = graph.copy()
    for name, value in (frozen or {}).items():
        g.consts[name] = value
    g.inputs = [i for i in g.inputs if i.name not in g.consts]
    dtypes: dict[str, np.dtype[Any]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for _ in range(rounds):
        dtypes, shapes = _infer(g, input_shapes)
        if not fold_constants(g, shapes, dtypes):
            break
    prune(g)
    return Specialized(g, dtypes, shapes)


def _value_info(name: str, dtype: np.dtype[Any], shape: tuple[int, ...] | None) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def _constant_tensor(name: str, value: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.ascontiguousarray(value), name)


def _infer(
    g: Graph, input_shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, np.dtype[Any]], dict[str, tuple[int, ...]]]:
    inputs: list[onnx.ValueInfoProto] = []
    initializers: list[TensorProto] = []
    for info in g.inputs:
        inputs.append(_value_info(info.name, info.dtype, input_shapes.get(info.name)))
    used = {name for node in g.nodes for name in node.present_inputs()}
    for name, value in g.consts.items():
        if name not in used:
            continue
        if is_float(value.dtype) and value.size > _SMALL:
            inputs.append(_value_info(name, value.dtype, tuple(value.shape)))
        else:
            initializers.append(_constant_tensor(name, value))
    outputs = [
        helper.make_tensor_value_info(o.name, helper.np_dtype_to_tensor_dtype(o.dtype), None)
        for o in g.outputs
        if g.resolve(o.name) == o.name and o.name not in g.consts and o.name not in input_shapes
    ]
    graph = helper.make_graph(
        [n.to_proto() for n in g.nodes], "specialize", inputs, outputs, initializer=initializers
    )
    opsets = [helper.make_opsetid(domain, version) for domain, version in g.opsets.items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = max(g.ir_version, 4)  # initializers need not be graph inputs from IR 4 on
    try:
        inferred = onnx.shape_inference.infer_shapes(
            model, check_type=False, strict_mode=False, data_prop=True
        )
    except Exception as exc:  # noqa: BLE001 - inference refused the graph (bad shapes, ...)
        raise UnsupportedError(f"ONNX shape inference failed: {exc}") from None
    dtypes: dict[str, np.dtype[Any]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for info in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        if info.type.WhichOneof("value") != "tensor_type":
            continue
        tensor = info.type.tensor_type
        if tensor.elem_type:
            try:
                dtypes[info.name] = dtype_of_elem(tensor.elem_type)
            except UnsupportedError:
                pass
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[info.name] = tuple(int(d.dim_value) for d in tensor.shape.dim)
    for name, value in g.consts.items():
        dtypes[name], shapes[name] = value.dtype, tuple(value.shape)
    _hint_missing(g, dtypes, shapes)
    return dtypes, shapes


def _hint_missing(g: Graph, dtypes: dict[str, np.dtype[Any]], shapes: dict[str, tuple[int, ...]]) -> None:
    """Fill values inference left open from the model's own annotations where they are concrete."""
    declared = {o.name: o for o in g.outputs}
    declared.update(g.hints)
    for node in g.nodes:
        for name in node.outputs:
            info = declared.get(name)
            if not name or info is None:
                continue
            dtypes.setdefault(name, info.dtype)
            if name not in shapes and info.shape is not None and all(isinstance(d, int) for d in info.shape):
                shapes[name] = tuple(int(d) for d in info.shape)  # type: ignore[arg-type]
