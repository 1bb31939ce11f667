"""Load-time rewrites that do not depend on the input shapes.

* ``Constant`` nodes and every node whose inputs are all constants are evaluated once
  (weights built by ``ConstantOfShape``, reshaped or transposed weights, shape arithmetic).
* ``Identity`` and inference-mode ``Dropout`` are removed (their output becomes an
  alias of their input).
* ``BatchNormalization`` right after a ``Conv`` with constant weights is folded into the
  convolution's filter and bias.
* Nodes nothing reads are dropped.

:func:`fold_constants` is also what the shape specialisation calls after it learns the
shapes (``Shape`` of an input becomes a constant, and everything built from it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._host import NOT_FOLDABLE, HostNode
from ._ir import Graph, Node

__all__ = ["fold_constants", "simplify"]

#: Ops that only forward their first input in inference.
_FORWARDING = frozenset({"Identity"})


def simplify(graph: Graph) -> Graph:
    """Apply every load-time rewrite to a copy of ``graph`` and return it."""
    g = graph.copy()
    fold_constants(g)
    _remove_forwarding(g)
    fold_constants(g)
    _fold_batch_norm(g)
    prune(g)
    return g


def _dropout_is_identity(g: Graph, node: Node) -> bool:
    """True for a Dropout that passes its input through (inference mode, or ratio 0)."""
    if node.attr("is_test", 0):
        return True
    training = node.inputs[2] if len(node.inputs) > 2 else ""
    if not training:
        return True
    if training in g.consts and not bool(np.asarray(g.consts[training]).reshape(-1)[0]):
        return True
    ratio = node.inputs[1] if len(node.inputs) > 1 else ""
    if ratio in g.consts and float(np.asarray(g.consts[ratio]).reshape(-1)[0]) == 0.0:
        return True
    return False


def _remove_forwarding(g: Graph) -> None:
    kept: list[Node] = []
    for node in g.nodes:
        forwards = node.op in _FORWARDING or (node.op == "Dropout" and _dropout_is_identity(g, node))
        if forwards and node.domain == "" and node.inputs and node.inputs[0]:
            g.make_alias(node.outputs[0], node.inputs[0])
            if node.op == "Dropout" and len(node.outputs) > 1 and node.outputs[1]:
                # The mask output (all True) is made once the input's shape is known.
                kept.append(
                    Node(
                        "Dropout",
                        "",
                        node.name,
                        [node.inputs[0]],
                        [node.outputs[1] + "__data", node.outputs[1]],
                        [],
                        {"_mask": 1},
                    )
                )
            continue
        kept.append(node)
    g.nodes = kept


def fold_constants(
    g: Graph,
    shapes: dict[str, tuple[int, ...]] | None = None,
    dtypes: dict[str, np.dtype[Any]] | None = None,
) -> bool:
    """Evaluate every node whose inputs are all known constants; True if any was folded.

    With ``shapes`` (value name -> concrete shape) ``Shape`` / ``Size`` of any value of
    known shape and the all-True mask of an inference Dropout fold too; with ``dtypes``,
    ``CastLike`` of a constant.
    """
    changed = False
    kept: list[Node] = []
    for node in g.nodes:
        values = _fold_one(g, node, shapes, dtypes)
        if values is None:
            kept.append(node)
            continue
        for name, value in zip(node.outputs, values, strict=False):
            if name:
                g.consts[name] = value
        changed = True
    g.nodes = kept
    return changed


def _fold_one(
    g: Graph,
    node: Node,
    shapes: dict[str, tuple[int, ...]] | None,
    dtypes: dict[str, np.dtype[Any]] | None,
) -> list[np.ndarray] | None:
    if node.domain not in ("", "ai.onnx"):
        return None
    if (
        node.op == "CastLike"
        and dtypes is not None
        and node.inputs[0] in g.consts
        and node.inputs[1] in dtypes
    ):
        with np.errstate(all="ignore"):
            return [np.asarray(g.consts[node.inputs[0]]).astype(dtypes[node.inputs[1]])]
    if shapes is not None:
        special = _fold_from_shape(node, shapes)
        if special is not None:
            return special
    if node.op in NOT_FOLDABLE or node.attr("_mask"):
        return None
    if any(name not in g.consts for name in node.present_inputs()):
        return None
    if any(_has_subgraph(a) for a in node.attrs.values()):
        return None
    try:
        host = HostNode(node, g.opsets)
        return host(*[g.consts.get(name) if name else None for name in node.inputs])
    except Exception:  # noqa: BLE001 - not foldable here; the node stays and is planned
        return None


def _has_subgraph(value: Any) -> bool:
    import onnx

    return isinstance(value, onnx.GraphProto) or (
        isinstance(value, list) and any(isinstance(v, onnx.GraphProto) for v in value)
    )


def _fold_from_shape(node: Node, shapes: dict[str, tuple[int, ...]]) -> list[np.ndarray] | None:
    source = node.inputs[0] if node.inputs else ""
    if source not in shapes:
        return None
    shape = shapes[source]
    if node.op == "Shape":
        rank = len(shape)
        start = node.attr("start", 0)
        end = node.attr("end", rank)
        start = min(max(start + rank if start < 0 else start, 0), rank)
        end = min(max(end + rank if end < 0 else end, 0), rank)
        return [np.asarray(shape[start:end], dtype=np.int64)]
    if node.op == "Size":
        return [np.asarray(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)]
    if node.op == "Dropout" and node.attr("_mask"):
        return [np.ones(shape, dtype=np.bool_), np.ones(shape, dtype=np.bool_)][:2]
    return None


def _fold_batch_norm(g: Graph) -> None:
    """Fold ``BatchNormalization(Conv(x, W, B))`` into ``Conv(x, W', B')`` where the numbers allow."""
    consumers = g.consumers()
    outputs = set(g.output_values())
    producer = {name: node for node in g.nodes for name in node.outputs if name}
    removed: set[int] = set()
    for bn in g.nodes:
        if bn.op != "BatchNormalization" or bn.domain != "" or len(bn.present_inputs()) != 5:
            continue
        if bn.attr("training_mode", 0) or len([o for o in bn.outputs if o]) != 1:
            continue
        conv = producer.get(bn.inputs[0])
        if conv is None or conv.op != "Conv" or id(conv) in removed:
            continue
        if len(consumers.get(bn.inputs[0], [])) != 1 or bn.inputs[0] in outputs:
            continue
        params = [g.consts.get(name) for name in bn.inputs[1:]]
        weight = g.consts.get(conv.inputs[1])
        bias_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
        bias = g.consts.get(bias_name) if bias_name else None
        if weight is None or any(p is None for p in params) or (bias_name and bias is None):
            continue
        scale, shift, mean, var = (np.asarray(p, dtype=np.float64).reshape(-1) for p in params)
        k = weight.shape[0]
        if any(p.size != k for p in (scale, shift, mean, var)):
            continue
        factor = scale / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
        new_w = (weight.astype(np.float64) * factor.reshape((k,) + (1,) * (weight.ndim - 1))).astype(
            weight.dtype
        )
        old_b = np.zeros(k) if bias is None else bias.astype(np.float64).reshape(-1)
        new_b = ((old_b - mean) * factor + shift).astype(weight.dtype)
        w_name, b_name = f"{conv.name}__bn_w", f"{conv.name}__bn_b"
        g.consts[w_name], g.consts[b_name] = new_w, new_b
        conv.inputs = [conv.inputs[0], w_name, b_name]
        conv.outputs = [bn.outputs[0]]
        removed.add(id(bn))
    g.nodes = [n for n in g.nodes if id(n) not in removed]


def prune(g: Graph) -> None:
    """Drop nodes whose outputs nothing reads (graph outputs count as read)."""
    needed = set(g.output_values())
    kept: list[Node] = []
    for node in reversed(g.nodes):
        if any(o in needed for o in node.outputs if o):
            kept.append(node)
            needed.update(node.present_inputs())
    kept.reverse()
    g.nodes = kept
    g.consts = {name: value for name, value in g.consts.items() if name in needed}
