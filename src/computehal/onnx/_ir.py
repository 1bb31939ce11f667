"""The graph the runner works on: ONNX nodes, constants and value types, loaded from a ModelProto.

A :class:`Graph` is a mutable, topologically ordered list of :class:`Node` objects plus
the constants known so far (initializers, folded values) and the declared inputs and
outputs. Removing a node that only forwards its input (Identity, inference-mode
Dropout) records an alias instead of renaming tensors, so graph output names never
change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import InvalidArgumentError, UnsupportedError

__all__ = [
    "FLOAT_NAMES",
    "Graph",
    "Node",
    "ValueInfo",
    "dtype_of_elem",
    "is_float",
    "load_model",
]

#: The float element types computehal operations take (by NumPy dtype name).
FLOAT_NAMES = frozenset({"float16", "bfloat16", "float32", "float64"})


def is_float(dtype: np.dtype[Any]) -> bool:
    """True for the float types computehal computes in (not float8 / float4 formats)."""
    return dtype.name in FLOAT_NAMES


def dtype_of_elem(elem_type: int) -> np.dtype[Any]:
    """The NumPy dtype of an ONNX ``TensorProto`` element type."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception as exc:  # noqa: BLE001 - an unknown or exotic element type
        raise UnsupportedError(f"ONNX element type {elem_type} has no NumPy equivalent: {exc}") from None


@dataclass
class ValueInfo:
    """A declared graph input or output: name, element type and (possibly symbolic) shape."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int | str | None, ...] | None

    @classmethod
    def from_proto(cls, proto: onnx.ValueInfoProto) -> ValueInfo:
        kind = proto.type.WhichOneof("value")
        if kind != "tensor_type":
            raise UnsupportedError(f"value {proto.name!r} is a {kind}; only tensors are supported")
        tensor = proto.type.tensor_type
        shape: tuple[int | str | None, ...] | None = None
        if tensor.HasField("shape"):
            shape = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim
            )
        return cls(proto.name, dtype_of_elem(tensor.elem_type), shape)


@dataclass(eq=False)
class Node:
    """One ONNX node; ``inputs`` may contain ``""`` for omitted optional inputs."""

    op: str
    domain: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attributes: list[onnx.AttributeProto]
    attrs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_proto(cls, proto: onnx.NodeProto, index: int) -> Node:
        attrs: dict[str, Any] = {}
        for attribute in proto.attribute:
            value = helper.get_attribute_value(attribute)
            if isinstance(value, onnx.TensorProto):
                value = numpy_helper.to_array(value)
            elif isinstance(value, bytes):
                value = value.decode()
            attrs[attribute.name] = value
        name = proto.name or f"{proto.op_type}_{index}"
        return cls(
            proto.op_type,
            proto.domain if proto.domain not in ("ai.onnx",) else "",
            name,
            list(proto.input),
            list(proto.output),
            list(proto.attribute),
            attrs,
        )

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute ``name`` (tensors as NumPy arrays, strings decoded) or ``default``."""
        return self.attrs.get(name, default)

    def to_proto(self) -> onnx.NodeProto:
        """A NodeProto with the node's current input and output names."""
        proto = helper.make_node(self.op, self.inputs, self.outputs, name=self.name, domain=self.domain)
        proto.attribute.extend(self.attributes)
        return proto

    def present_inputs(self) -> list[str]:
        """The names of the inputs that are given (not ``""``)."""
        return [name for name in self.inputs if name]

    def __repr__(self) -> str:
        return f"<Node {self.name!r} {self.op}>"


@dataclass
class Graph:
    """A model's main graph in a form the runner can rewrite."""

    nodes: list[Node]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    consts: dict[str, np.ndarray]
    opsets: dict[str, int]
    ir_version: int
    alias: dict[str, str] = field(default_factory=dict)
    hints: dict[str, ValueInfo] = field(default_factory=dict)

    @property
    def opset(self) -> int:
        """The version of the default ONNX domain the model imports."""
        return self.opsets.get("", self.opsets.get("ai.onnx", 1))

    def resolve(self, name: str) -> str:
        """The value a (possibly aliased) name stands for."""
        while name in self.alias:
            name = self.alias[name]
        return name

    def output_values(self) -> list[str]:
        """The value behind each graph output, in order."""
        return [self.resolve(o.name) for o in self.outputs]

    def make_alias(self, name: str, target: str) -> None:
        """Let ``name`` stand for ``target`` from now on (consumers are rewritten)."""
        target = self.resolve(target)
        self.alias[name] = target
        for node in self.nodes:
            node.inputs = [target if i == name else i for i in node.inputs]

    def consumers(self) -> dict[str, list[Node]]:
        """Value name -> the nodes reading it."""
        out: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.present_inputs():
                out.setdefault(name, []).append(node)
        return out

    def copy(self) -> Graph:
        """A copy whose node list, constants and aliases can change independently (arrays shared)."""
        nodes = [
            Node(n.op, n.domain, n.name, list(n.inputs), list(n.outputs), n.attributes, n.attrs)
            for n in self.nodes
        ]
        return Graph(
            nodes,
            list(self.inputs),
            list(self.outputs),
            dict(self.consts),
            dict(self.opsets),
            self.ir_version,
            dict(self.alias),
            dict(self.hints),
        )


def load_model(model: onnx.ModelProto | str | os.PathLike[str] | bytes) -> onnx.ModelProto:
    """A ModelProto from a proto, a file path or serialized bytes."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        try:
            return onnx.load_model_from_string(bytes(model))
        except Exception as exc:  # noqa: BLE001 - a corrupt model
            raise InvalidArgumentError(f"cannot parse the ONNX model bytes: {exc}") from None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise InvalidArgumentError(f"no ONNX model at {path!r}")
        try:
            return onnx.load(path)
        except Exception as exc:  # noqa: BLE001 - a corrupt file
            raise InvalidArgumentError(f"cannot load the ONNX model {path!r}: {exc}") from None
    raise InvalidArgumentError(
        f"model must be an onnx.ModelProto, a path or bytes, got {type(model).__name__}"
    )


def graph_from_model(model: onnx.ModelProto) -> Graph:
    """The :class:`Graph` of ``model`` (local functions inlined, initializers as constants)."""
    if model.functions:
        from onnx import inliner

        model = inliner.inline_local_functions(model)
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in model.opset_import}
    g = model.graph
    consts: dict[str, np.ndarray] = {}
    for init in g.initializer:
        consts[init.name] = numpy_helper.to_array(init)
    for sparse in g.sparse_initializer:
        raise UnsupportedError(f"sparse initializer {sparse.values.name!r} is not supported")
    inputs = [ValueInfo.from_proto(i) for i in g.input if i.name not in consts]
    outputs = [ValueInfo.from_proto(o) for o in g.output]
    hints = {}
    for info in g.value_info:
        try:
            hints[info.name] = ValueInfo.from_proto(info)
        except UnsupportedError:
            continue
    nodes = [Node.from_proto(n, i) for i, n in enumerate(g.node)]
    seen: set[str] = set()
    for node in nodes:
        while node.name in seen:
            node.name += "_"
        seen.add(node.name)
    return Graph(nodes, inputs, outputs, consts, opsets, model.ir_version, hints=hints)
