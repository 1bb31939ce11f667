"""Plan-time fusion: subgraphs that exporters spell out in small ops, replaced by one node.

Run on a specialised graph (every shape known) before its nodes are placed:

* ``x * 0.5 * (1 + erf(x / sqrt(2)))`` in any grouping of the products (and with
  ``x * (1 / sqrt(2))``) becomes one ``Gelu`` node: one unary call instead of five passes;
* multi-head self-attention written as ``Reshape`` / ``Transpose`` of the heads, ``MatMul``,
  a scale (``Div`` / ``Mul`` by a scalar), an optional additive mask, ``Softmax`` over the
  keys, ``MatMul`` with the values and the heads merged back becomes one ``Attention``
  node (3-D form: the interface's attention, no [heads, seq, seq] score tensor);
* ``MatMul(x, W)`` with a constant matrix, followed by ``Add`` of a bias vector and / or
  of a residual of the output's shape, becomes one :data:`MATMUL_ADD` node, lowered as
  GEMMs that accumulate into an output already holding the residual and the bias;
* the three projections of one input feeding a self-attention become one
  :data:`HEADS_PROJECTION` node, whose weights are laid out once per head so that one
  batched GEMM writes Q, K and V head-major ([3, batch, heads, seq, size]), read in place
  by a :data:`PACKED_ATTENTION` node (no head-split copies);
* ``Conv`` followed by ``Add`` (or a two-input ``Sum``) of a residual of the output's shape and / or ``Relu``
  becomes one :data:`FUSED_CONV` node: the convolution's epilogue (``residual_ptr``,
  ``activation``) instead of one pass over the output per element-wise node.

Only values read by nothing outside the subgraph (and not graph outputs) disappear. A
fused node is kept only when ``accept`` says the chosen backend runs it; otherwise the
original nodes stay. The fused node takes the place of the subgraph's last node, so the
node list stays topologically ordered, and carries that node's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import helper

from ._ir import Graph, Node, is_float
from ._shapes import Specialized

__all__ = ["FUSED_CONV", "HEADS_PROJECTION", "MATMUL_ADD", "PACKED_ATTENTION", "fuse"]

#: The op type of a fused ``MatMul`` + bias / residual ``Add`` (inputs x, W, bias or "", residual or "").
MATMUL_ADD = "computehal.MatMulAdd"
#: ``Attention`` (3-D, self-attention) reading Q, K and V from one input 0 made by a
#: :data:`HEADS_PROJECTION`: [3, batch, heads, seq, size].
PACKED_ATTENTION = "computehal.PackedAttention"
#: ``x @ W + bias`` for the joined Q/K/V projections, written head-major: inputs x [batch,
#: seq, hidden], W [3 * heads, hidden, size] (one [hidden, size] block per output head),
#: bias [3 * heads, size] or ""; output [3, batch, heads, seq, size].
HEADS_PROJECTION = "computehal.HeadsProjection"
#: ``Conv`` with its epilogue: inputs x, W, bias or "", residual or ""; the Conv's attributes
#: and ``activation`` (a ``UnaryOp`` name, "" for none): ``activation(conv + bias + residual)``.
FUSED_CONV = "computehal.FusedConv"


class _View:
    """What the fusion rules read: producers, consumers, constants and shapes of ``spec``."""

    def __init__(self, spec: Specialized) -> None:
        self.spec = spec
        self.g: Graph = spec.graph
        self.refresh()

    def refresh(self) -> None:
        self.producer = {name: node for node in self.g.nodes for name in node.outputs if name}
        self.consumers = self.g.consumers()
        self.outputs = set(self.g.output_values())

    def const(self, name: str) -> np.ndarray | None:
        return self.g.consts.get(name)

    def scalar(self, name: str) -> float | None:
        """The value of a one-element float constant, else None."""
        value = self.const(name)
        if value is None or value.size != 1 or not is_float(value.dtype):
            return None
        return float(np.asarray(value, dtype=np.float64).reshape(-1)[0])

    def shape(self, name: str) -> tuple[int, ...] | None:
        info = self.spec.info(name)
        return None if info is None else info[1]

    def dtype(self, name: str) -> np.dtype[Any] | None:
        info = self.spec.info(name)
        return None if info is None else info[0]

    def private(self, name: str) -> bool:
        """True when ``name`` is read by exactly one node and is not a graph output."""
        return name not in self.outputs and len(self.consumers.get(name, [])) == 1

    def only_consumer(self, name: str, op: str) -> Node | None:
        """The one node reading ``name`` when it is a default-domain ``op``."""
        if not self.private(name):
            return None
        node = self.consumers[name][0]
        return node if node.op == op and node.domain == "" else None

    def made_by(self, name: str, op: str) -> Node | None:
        """The default-domain ``op`` node producing ``name`` (one output), else None."""
        node = self.producer.get(name)
        if node is None or node.op != op or node.domain != "" or len([o for o in node.outputs if o]) != 1:
            return None
        return node


def _close(value: float | None, want: float, rel: float = 1e-5) -> bool:
    return value is not None and abs(value - want) <= rel * abs(want)


def _other(node: Node, name: str) -> str | None:
    """The other input of a two-input node that reads ``name`` (None when it is not binary)."""
    inputs = node.present_inputs()
    if len(inputs) != 2 or name not in inputs:
        return None
    return inputs[1] if inputs[0] == name else inputs[0]


def _residual(v: _View, add: Node | None, value: str, shape: Any, dtype: Any) -> str | None:
    """The tensor ``add`` adds to ``value`` when it is a residual of the same shape and dtype."""
    if add is None:
        return None
    other = _other(add, value)
    if (
        other
        and other != value
        and v.const(other) is None
        and v.shape(other) == shape
        and v.dtype(other) == dtype
        and v.shape(add.outputs[0]) == shape
    ):
        return other
    return None


def _make(op: str, name: str, inputs: list[str], output: str, **attrs: Any) -> Node:
    proto = helper.make_node(op, inputs, [output], name=name, **attrs)
    return Node.from_proto(proto, 0)


# --------------------------------------------------------------------------- GELU


def _gelu(v: _View, erf: Node) -> tuple[Node, list[Node]] | None:
    """``erf`` as the core of an exact GELU: (the Gelu node, the nodes it replaces)."""
    if erf.op != "Erf" or erf.domain != "":
        return None
    scaled = erf.inputs[0]
    pre = v.producer.get(scaled)
    if pre is None or not v.private(scaled):
        return None
    if pre.op == "Div":
        x = pre.inputs[0]
        if not _close(v.scalar(pre.inputs[1]), math.sqrt(2.0)):
            return None
    elif pre.op == "Mul":
        consts = [i for i in pre.inputs if v.scalar(i) is not None]
        if len(consts) != 1 or not _close(v.scalar(consts[0]), 1.0 / math.sqrt(2.0)):
            return None
        x = _other(pre, consts[0]) or ""
    else:
        return None
    add = v.only_consumer(erf.outputs[0], "Add")
    if add is None or not _close(v.scalar(_other(add, erf.outputs[0]) or ""), 1.0):
        return None
    m1 = v.only_consumer(add.outputs[0], "Mul")
    if m1 is None:
        return None
    partner = _other(m1, add.outputs[0])
    if partner is None:
        return None
    nodes = [pre, erf, add, m1]
    if partner == x:  # (x * (1 + erf)) * 0.5
        last = v.only_consumer(m1.outputs[0], "Mul")
        if last is None or not _close(v.scalar(_other(last, m1.outputs[0]) or ""), 0.5):
            return None
        nodes.append(last)
    elif _close(v.scalar(partner), 0.5):  # ((1 + erf) * 0.5) * x
        last = v.only_consumer(m1.outputs[0], "Mul")
        if last is None or _other(last, m1.outputs[0]) != x:
            return None
        nodes.append(last)
    else:  # (x * 0.5) * (1 + erf)
        half = v.made_by(partner, "Mul")
        if half is None or not v.private(partner) or x not in half.inputs:
            return None
        if not _close(v.scalar(_other(half, x) or ""), 0.5):
            return None
        nodes.insert(0, half)
        last = m1
    if v.shape(x) != v.shape(last.outputs[0]) or v.dtype(x) != v.dtype(last.outputs[0]):
        return None
    return _make("Gelu", last.name, [x], last.outputs[0]), nodes


# --------------------------------------------------------------------------- attention


def _heads(v: _View, name: str, perm: tuple[int, ...]) -> tuple[str, int] | None:
    """``name`` = Transpose(Reshape(x [B, S, H*D] -> [B, S, H, D]), perm): (x, H), else None."""
    tr = v.made_by(name, "Transpose")
    if tr is None or tuple(tr.attr("perm", ())) != perm or not v.private(tr.inputs[0]):
        return None
    rs = v.made_by(tr.inputs[0], "Reshape")
    if rs is None or not v.private(name):
        return None
    src, split = v.shape(rs.inputs[0]), v.shape(rs.outputs[0])
    if src is None or split is None or len(src) != 3 or len(split) != 4:
        return None
    if split[:2] != src[:2] or split[2] * split[3] != src[2]:
        return None
    return rs.inputs[0], split[2]


def _scores(v: _View, value: str) -> tuple[Node, float, list[Node]] | None:
    """``value`` = MatMul(q, k), maybe divided or multiplied by a scalar: (MatMul, scale, scaling)."""
    for op in ("Div", "Mul"):
        node = v.made_by(value, op)
        if node is None:
            continue
        c = v.scalar(node.inputs[1])
        if c is None or c == 0.0 or not v.private(node.inputs[0]):
            return None
        qk = v.made_by(node.inputs[0], "MatMul")
        return None if qk is None else (qk, 1.0 / c if op == "Div" else c, [node])
    qk = v.made_by(value, "MatMul")
    return None if qk is None else (qk, 1.0, [])


def _attention(v: _View, softmax: Node) -> tuple[Node, list[Node]] | None:
    """``softmax`` as the core of self-attention over split heads."""
    if softmax.op != "Softmax" or softmax.domain != "":
        return None
    s_shape = v.shape(softmax.inputs[0])
    axis = softmax.attr("axis", -1 if v.g.opset >= 13 else 1)
    if s_shape is None or len(s_shape) != 4 or axis not in (-1, 3):
        return None
    if not v.private(softmax.inputs[0]):
        return None
    found = _scores(v, softmax.inputs[0])
    mask = ""
    nodes: list[Node] = [softmax]
    add = v.made_by(softmax.inputs[0], "Add")
    if found is None and add is not None:
        for i in (0, 1):
            value, mask = add.inputs[i], add.inputs[1 - i]
            found = _scores(v, value) if v.private(value) else None
            if found is not None:
                break
        m_shape, m_dtype = v.shape(mask), v.dtype(mask)
        if found is None or m_shape is None or m_dtype is None or not is_float(m_dtype):
            return None
        # The interface's mask broadcasts; a mask shorter than the keys would mean padding.
        if not 1 <= len(m_shape) <= 4 or m_shape[-1] != s_shape[-1]:
            return None
        if tuple(np.broadcast_shapes(m_shape, s_shape)) != s_shape:
            return None
        nodes.insert(0, add)
    if found is None:
        return None
    qk, scale, scaling = found
    nodes = scaling + nodes
    q = _heads(v, qk.inputs[0], (0, 2, 1, 3))
    k = _heads(v, qk.inputs[1], (0, 2, 3, 1))
    pv = v.only_consumer(softmax.outputs[0], "MatMul")
    if q is None or k is None or pv is None or pv.inputs[0] != softmax.outputs[0]:
        return None
    val = _heads(v, pv.inputs[1], (0, 2, 1, 3))
    back = v.only_consumer(pv.outputs[0], "Transpose")
    if val is None or back is None or tuple(back.attr("perm", ())) != (0, 2, 1, 3):
        return None
    merge = v.only_consumer(back.outputs[0], "Reshape")
    if merge is None:
        return None
    heads = q[1]
    if k[1] != heads or val[1] != heads:
        return None
    q_shape, k_shape, v_shape = v.shape(q[0]), v.shape(k[0]), v.shape(val[0])
    if q_shape is None or k_shape is None or v_shape is None:
        return None
    if not q_shape[0] == k_shape[0] == v_shape[0] or k_shape[:2] != v_shape[:2] or q_shape[2] != k_shape[2]:
        return None
    if v.shape(merge.outputs[0]) != (q_shape[0], q_shape[1], v_shape[2]):
        return None
    views = [v.producer[n] for n in (qk.inputs[0], qk.inputs[1], pv.inputs[1])]
    views += [v.producer[n.inputs[0]] for n in views]
    nodes = views + [qk] + nodes + [pv, back, merge]
    fused = _make(
        "Attention", merge.name, [q[0], k[0], val[0], mask], merge.outputs[0],
        q_num_heads=heads, kv_num_heads=heads, scale=float(scale),
    )  # fmt: skip
    return fused, nodes


# --------------------------------------------------------------------------- MatMul + Add


def _matmul_add(v: _View, mm: Node) -> tuple[Node, list[Node]] | None:
    """``MatMul(x, W)`` with a constant ``W`` and the bias / residual ``Add`` after it."""
    if mm.op != "MatMul" or mm.domain != "":
        return None
    w = v.const(mm.inputs[1])
    out_shape, dtype = v.shape(mm.outputs[0]), v.dtype(mm.outputs[0])
    x_shape = v.shape(mm.inputs[0])
    if w is None or w.ndim != 2 or out_shape is None or x_shape is None or len(x_shape) < 2:
        return None
    if dtype is None or dtype.name not in ("float32", "float64") or w.dtype != dtype:
        return None
    if out_shape[:-1] != x_shape[:-1]:
        return None
    n = w.shape[1]
    nodes = [mm]
    value = mm.outputs[0]
    bias = residual = ""
    add = v.only_consumer(value, "Add")
    if add is not None:
        other = _other(add, value)
        c = v.const(other) if other else None
        if c is not None and c.dtype == dtype and c.size == n and c.shape[-1:] == (n,):
            if v.shape(add.outputs[0]) == out_shape:
                bias, value = other or "", add.outputs[0]
                nodes.append(add)
                add = v.only_consumer(value, "Add")
    other = _residual(v, add, value, out_shape, dtype)
    if add is not None and other is not None:
        residual, value = other, add.outputs[0]
        nodes.append(add)
    if len(nodes) == 1:
        return None
    last = nodes[-1]
    return _make(MATMUL_ADD, last.name, [mm.inputs[0], mm.inputs[1], bias, residual], value), nodes


# --------------------------------------------------------------------------- Conv epilogue


def _conv_epilogue(v: _View, conv: Node) -> tuple[Node, list[Node]] | None:
    """``Conv`` -> ``Add`` (residual) -> ``Relu``, ``Conv`` -> ``Relu`` or ``Conv`` -> ``Add``."""
    if conv.op != "Conv" or conv.domain != "" or len(conv.outputs) != 1:
        return None
    value = conv.outputs[0]
    out_shape, dtype = v.shape(value), v.dtype(value)
    if out_shape is None or dtype is None or not is_float(dtype):
        return None
    nodes = [conv]
    residual = ""
    add = v.only_consumer(value, "Add") or v.only_consumer(value, "Sum")  # Sum: two inputs only
    other = _residual(v, add, value, out_shape, dtype)
    if add is not None and other is not None:
        residual, value = other, add.outputs[0]
        nodes.append(add)
    relu = v.only_consumer(value, "Relu")
    activation = ""
    if relu is not None and v.shape(relu.outputs[0]) == out_shape:
        activation, value = "relu", relu.outputs[0]
        nodes.append(relu)
    if len(nodes) == 1:
        return None
    bias = conv.inputs[2] if len(conv.inputs) > 2 else ""
    inputs = [conv.inputs[0], conv.inputs[1], bias, residual]
    return _make(FUSED_CONV, nodes[-1].name, inputs, value, **conv.attrs, activation=activation), nodes


# --------------------------------------------------------------------------- packed Q/K/V


def _packed_qkv(v: _View, attn: Node) -> tuple[list[Node], list[Node]] | None:
    """A 3-D self-``Attention`` whose Q, K and V are products of one input with constants: one GEMM.

    The three weight matrices (and biases, zeros where one has none) are joined along
    their columns into new constants, cut per output head ([3 * heads, hidden, size]); the
    :data:`HEADS_PROJECTION` [3, batch, heads, seq, size] feeds a :data:`PACKED_ATTENTION`
    node. The attention reads its heads where the product wrote them: on the CPU backend
    this removed three head-split copies per layer of a BERT-base encoder at sequence 128
    (0.2-0.3 ms each in the model), and the per-head batched GEMM with the weight blocks
    contiguous ran 1.1-1.2x faster than the one 2304-column GEMM it replaces.
    """
    if attn.op != "Attention" or attn.domain != "" or len(attn.inputs) > 4 or len(attn.outputs) != 1:
        return None
    heads = attn.attr("q_num_heads")
    if heads is None or attn.attr("kv_num_heads") != heads or attn.attr("is_causal", 0):
        return None
    projections = [_projection(v, name) for name in attn.inputs[:3]]
    if any(p is None for p in projections):
        return None
    found = [p for p in projections if p is not None]
    x = found[0][0].inputs[0]
    weights = [w for _, w, _ in found]
    if any(node.inputs[0] != x or w.shape != weights[0].shape for node, w, _ in found):
        return None
    x_shape, dtype = v.shape(x), v.dtype(attn.inputs[0])
    if x_shape is None or dtype is None or any(w.dtype != dtype for w in weights):
        return None
    packed = f"{attn.name}__qkv"
    depth, n = weights[0].shape
    if len(x_shape) != 3 or n % int(heads):
        return None
    size = n // int(heads)
    has_bias = any(b is not None for _, _, b in found)
    names = [x, f"{packed}_w", f"{packed}_b" if has_bias else ""]
    joined = np.concatenate(weights, axis=1).reshape(depth, 3 * int(heads), size)
    v.g.consts[names[1]] = np.ascontiguousarray(joined.transpose(1, 0, 2))
    if has_bias:
        zero = np.zeros(n, dtype=dtype)
        biases = [zero if b is None else b.reshape(-1) for _, _, b in found]
        v.g.consts[names[2]] = np.concatenate(biases).reshape(3 * int(heads), size)
    v.spec.shapes[packed] = (3, x_shape[0], int(heads), x_shape[1], size)
    v.spec.dtypes[packed] = dtype
    product = _make(HEADS_PROJECTION, f"{attn.name}__qkv_proj", names, packed)
    scale = attn.attr("scale")
    extra = {} if scale is None else {"scale": float(scale)}
    fused = _make(
        PACKED_ATTENTION, attn.name, [packed, "", "", *attn.inputs[3:]], attn.outputs[0],
        q_num_heads=int(heads), kv_num_heads=int(heads), **extra,
    )  # fmt: skip
    return [product, fused], [node for node, _, _ in found] + [attn]


def _projection(v: _View, name: str) -> tuple[Node, np.ndarray, np.ndarray | None] | None:
    """``name`` = x @ W (+ bias) with constants, read only by the attention: (node, W, bias)."""
    node = v.producer.get(name)
    if node is None or not v.private(name) or node.op not in ("MatMul", MATMUL_ADD):
        return None
    w = v.const(node.inputs[1])
    if w is None or w.ndim != 2:
        return None
    if node.op == "MatMul":
        return node, w, None
    if node.inputs[3]:
        return None
    return node, w, v.const(node.inputs[2]) if node.inputs[2] else None


# --------------------------------------------------------------------------- driver

Rule = Callable[[_View, Node], "tuple[Node | list[Node], list[Node]] | None"]
_RULES: tuple[Rule, ...] = (_attention, _gelu, _matmul_add, _packed_qkv, _conv_epilogue)


def fuse(spec: Specialized, accept: Callable[[Node], bool]) -> int:
    """Replace every matching subgraph of ``spec.graph`` by its fused node(s); return how many."""
    count = 0
    for rule in _RULES:
        view = _View(spec)
        removed: set[int] = set()
        at_last: dict[int, list[Node]] = {}
        for node in list(view.g.nodes):
            if id(node) in removed:
                continue
            found = rule(view, node)
            if found is None:
                continue
            made, members = found
            fused = made if isinstance(made, list) else [made]
            if any(id(m) in removed for m in members) or not all(accept(f) for f in fused):
                continue
            removed.update(id(m) for m in members)
            at_last[id(view.producer[fused[-1].outputs[0]])] = fused
            count += 1
        if removed:
            kept = [n for n in view.g.nodes if id(n) not in removed or id(n) in at_last]
            view.g.nodes = [f for n in kept for f in at_last.get(id(n), [n])]
    return count
