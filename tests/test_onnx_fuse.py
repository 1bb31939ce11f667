"""Plan-time fusion of exported subgraphs: GELU, self-attention, MatMul with bias / residual Add.

Each case checks both what the plan holds (the fused node, or the original nodes where
fusing would be wrong) and the numbers, against NumPy definitions written here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from computehal.onnx import InferenceSession  # noqa: E402
from computehal.onnx._fuse import FUSED_CONV, HEADS_PROJECTION, MATMUL_ADD, PACKED_ATTENTION  # noqa: E402
from computehal.testing import reference  # noqa: E402

F = TensorProto.FLOAT
RNG = np.random.default_rng(7)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[str], inits: dict[str, np.ndarray]) -> Any:
    graph = helper.make_graph(
        nodes,
        "fuse",
        inputs,
        [helper.make_tensor_value_info(o, F, None) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(model: Any, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[str]]:
    session = InferenceSession(model, backend="cpu")
    out = session.run(None, feeds)
    ops = [n.op for n in session.plan({k: v.shape for k, v in feeds.items()}).nodes]
    session.close()
    return out, ops


def _gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)(x.astype(np.float64) / math.sqrt(2.0))
    return (0.5 * x * (1.0 + erf)).astype(np.float32)


def _n(op: str, inputs: list[str], output: str, **attrs: Any) -> Any:
    return helper.make_node(op, inputs, [output], **attrs)


_SCALE_IN = {
    "div": [_n("Div", ["x", "sqrt2"], "s")],
    "mul": [_n("Mul", ["inv_sqrt2", "x"], "s")],
}
_PRODUCTS = {
    "half_first": [_n("Mul", ["x", "half"], "h"), _n("Mul", ["h", "p"], "y")],
    "x_first": [_n("Mul", ["p", "x"], "h"), _n("Mul", ["h", "half"], "y")],
    "half_of_sum": [_n("Mul", ["half", "p"], "h"), _n("Mul", ["x", "h"], "y")],
}
_GELU_CONSTS = {
    "sqrt2": np.array(math.sqrt(2.0), np.float32),
    "inv_sqrt2": np.array(1.0 / math.sqrt(2.0), np.float32),
    "one": np.array(1.0, np.float32),
    "half": np.array(0.5, np.float32),
}


@pytest.mark.parametrize("scale", sorted(_SCALE_IN))
@pytest.mark.parametrize("products", sorted(_PRODUCTS))
def test_erf_gelu_subgraph_becomes_one_gelu(scale: str, products: str) -> None:
    nodes = _SCALE_IN[scale] + [_n("Erf", ["s"], "e"), _n("Add", ["one", "e"], "p")] + _PRODUCTS[products]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [3, 40])], ["y"], _GELU_CONSTS)
    x = (RNG.standard_normal((3, 40)) * 3).astype(np.float32)
    (y,), ops = _run(model, {"x": x})
    assert ops == ["Gelu"]
    np.testing.assert_allclose(y, _gelu(x), rtol=1e-5, atol=1e-6)


def test_gelu_subgraph_with_a_shared_intermediate_is_left_alone() -> None:
    nodes = _SCALE_IN["div"] + [_n("Erf", ["s"], "e"), _n("Add", ["e", "one"], "p")] + _PRODUCTS["half_first"]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 8])], ["y", "e"], _GELU_CONSTS)
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    (y, e), ops = _run(model, {"x": x})
    assert "Gelu" not in ops and "Erf" in ops
    np.testing.assert_allclose(y, _gelu(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e, np.vectorize(math.erf)(x / math.sqrt(2.0)), rtol=1e-5, atol=1e-6)


def test_wrong_constant_keeps_the_gelu_subgraph() -> None:
    consts = dict(_GELU_CONSTS, half=np.array(0.25, np.float32))
    nodes = _SCALE_IN["div"] + [_n("Erf", ["s"], "e"), _n("Add", ["e", "one"], "p")] + _PRODUCTS["half_first"]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 8])], ["y"], consts)
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    (y,), ops = _run(model, {"x": x})
    assert "Gelu" not in ops
    np.testing.assert_allclose(y, _gelu(x) / 2, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- attention

B, S, HEADS, D = 2, 5, 3, 4
HIDDEN = HEADS * D


def _attention_model(scale_op: str | None, mask: str | None, mask_shape: list[int]) -> Any:
    """Self-attention over split heads as exporters write it (inputs q, k, v [B, S, HIDDEN])."""
    nodes = []
    for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [_n("Reshape", [t, "split"], f"{t}4"), _n("Transpose", [f"{t}4"], f"{t}h", perm=perm)]
    nodes.append(_n("MatMul", ["qh", "kh"], "scores"))
    scores = "scores"
    if scale_op == "Div":
        nodes.append(_n("Div", ["scores", "c"], "scaled"))
        scores = "scaled"
    elif scale_op == "Mul":
        nodes.append(_n("Mul", ["scores", "c"], "scaled"))
        scores = "scaled"
    if mask == "after":
        nodes.append(_n("Add", [scores, "mask"], "masked"))
        scores = "masked"
    elif mask == "before":
        nodes.append(_n("Add", ["mask", scores], "masked"))
        scores = "masked"
    nodes += [
        _n("Softmax", [scores], "probs", axis=-1),
        _n("MatMul", ["probs", "vh"], "ctx"),
        _n("Transpose", ["ctx"], "ctx_t", perm=[0, 2, 1, 3]),
        _n("Reshape", ["ctx_t", "merge"], "y"),
    ]
    inputs = [helper.make_tensor_value_info(t, F, [B, S, HIDDEN]) for t in "qkv"]
    if mask is not None:
        inputs.append(helper.make_tensor_value_info("mask", F, mask_shape))
    c = np.array(math.sqrt(D) if scale_op == "Div" else 1.0 / math.sqrt(D), np.float32)
    split, merge = np.array([0, 0, HEADS, D], np.int64), np.array([0, 0, HIDDEN], np.int64)
    inits = {"split": split, "merge": merge, "c": c}
    return _model(nodes, inputs, ["y"], inits)


def _attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Any, scale: float) -> np.ndarray:
    batch = q.shape[0]

    def heads(t: np.ndarray) -> np.ndarray:
        return t.astype(np.float64).reshape(batch, S, HEADS, D).transpose(0, 2, 1, 3)

    scores = heads(q) @ heads(k).transpose(0, 1, 3, 2) * scale + (0.0 if mask is None else mask)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return (probs @ heads(v)).transpose(0, 2, 1, 3).reshape(batch, S, HIDDEN).astype(np.float32)


@pytest.mark.parametrize(
    ("scale_op", "mask", "mask_shape"),
    [
        ("Div", "after", [B, 1, 1, S]),
        ("Mul", "before", [1, HEADS, S, S]),
        ("Div", None, []),
        (None, "after", [S]),
    ],
)
def test_split_head_attention_becomes_one_attention(scale_op: Any, mask: Any, mask_shape: list[int]) -> None:
    model = _attention_model(scale_op, mask, mask_shape)
    feeds = {t: RNG.standard_normal((B, S, HIDDEN)).astype(np.float32) for t in "qkv"}
    m = None
    if mask is not None:
        m = np.where(RNG.random(mask_shape) < 0.3, -1e4, 0.0).astype(np.float32)
        feeds["mask"] = m
    (y,), ops = _run(model, feeds)
    assert ops == ["Attention"]
    scale = 1.0 if scale_op is None else 1.0 / math.sqrt(D)
    np.testing.assert_allclose(y, _attention_reference(feeds["q"], feeds["k"], feeds["v"], m, scale),
                               rtol=1e-4, atol=1e-5)  # fmt: skip


def test_mask_that_broadcasts_over_the_keys_is_not_fused() -> None:
    # The interface pads a mask shorter than the keys with -inf: a [.., 1] mask must stay an Add.
    model = _attention_model("Div", "after", [B, 1, S, 1])
    feeds = {t: RNG.standard_normal((B, S, HIDDEN)).astype(np.float32) for t in "qkv"}
    feeds["mask"] = RNG.standard_normal((B, 1, S, 1)).astype(np.float32)
    (y,), ops = _run(model, feeds)
    assert "Attention" not in ops and "Softmax" in ops
    want = _attention_reference(feeds["q"], feeds["k"], feeds["v"], feeds["mask"], 1.0 / math.sqrt(D))
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("bias", "batch"), [(True, B), (False, B), (True, 1)])
def test_projections_of_one_input_are_one_gemm_read_by_packed_attention(bias: bool, batch: int) -> None:
    # Batch 1: one batched GEMM over all 3 * HEADS heads; batch 2: one per batch entry and Q / K / V.
    base = _attention_model("Div", "after", [B, 1, 1, S])
    nodes, inits = [], {}
    for t in "qkv":
        inits[f"w{t}"] = RNG.standard_normal((HIDDEN, HIDDEN)).astype(np.float32)
        nodes.append(_n("MatMul", ["x", f"w{t}"], f"{t}_mm" if bias else t))
        if bias:
            inits[f"b{t}"] = RNG.standard_normal(HIDDEN).astype(np.float32)
            nodes.append(_n("Add", [f"{t}_mm", f"b{t}"], t))
    inits.update({i.name: numpy_helper.to_array(i) for i in base.graph.initializer})
    shapes = (("x", [batch, S, HIDDEN]), ("mask", [batch, 1, 1, S]))
    inputs = [helper.make_tensor_value_info(n, F, s) for n, s in shapes]
    model = _model(nodes + list(base.graph.node), inputs, ["y"], inits)
    x = RNG.standard_normal((batch, S, HIDDEN)).astype(np.float32)
    mask = np.where(RNG.random((batch, 1, 1, S)) < 0.3, -1e4, 0.0).astype(np.float32)
    (y,), ops = _run(model, {"x": x, "mask": mask})
    assert ops == [HEADS_PROJECTION, PACKED_ATTENTION]
    qkv = [x.astype(np.float64) @ inits[f"w{t}"] + (inits[f"b{t}"] if bias else 0.0) for t in "qkv"]
    want = _attention_reference(*qkv, mask, 1.0 / math.sqrt(D))
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- MatMul + Add


@pytest.mark.parametrize(
    ("bias_shape", "residual", "rows", "depth", "cols"),
    [
        ((6,), "left", (2, 3), 5, 6),
        ((1, 6), None, (4,), 5, 6),
        (None, "right", (1, 1), 5, 6),
        ((6,), "right", (1,), 5, 6),
        # Shapes the CPU backend takes as a batched GEMM over weight panels (64 columns each).
        ((192,), "left", (3, 7), 20, 192),
        (None, "right", (16,), 40, 128),
        ((128,), None, (2, 9), 33, 128),
    ],
)
def test_matmul_with_bias_and_residual_becomes_one_node(
    bias_shape: Any, residual: Any, rows: tuple[int, ...], depth: int, cols: int
) -> None:
    w = RNG.standard_normal((depth, cols)).astype(np.float32)
    inits: dict[str, np.ndarray] = {"w": w}
    nodes = [_n("MatMul", ["x", "w"], "mm")]
    value = "mm"
    if bias_shape is not None:
        inits["b"] = RNG.standard_normal(bias_shape).astype(np.float32)
        nodes.append(_n("Add", ["mm", "b"], "biased"))
        value = "biased"
    if residual is not None:
        nodes.append(_n("Add", ["r", value] if residual == "left" else [value, "r"], "y"))
        value = "y"
    inputs = [helper.make_tensor_value_info(t, F, [*rows, c]) for t, c in (("x", depth), ("r", cols))]
    model = _model(nodes, inputs if residual else inputs[:1], [value], inits)
    feeds = {"x": RNG.standard_normal((*rows, depth)).astype(np.float32)}
    want = feeds["x"].astype(np.float64) @ w
    if bias_shape is not None:
        want = want + inits["b"]
    if residual is not None:
        feeds["r"] = RNG.standard_normal((*rows, cols)).astype(np.float32)
        want = want + feeds["r"]
    (y,), ops = _run(model, feeds)
    assert ops == [MATMUL_ADD]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * math.sqrt(depth))


def test_matmul_read_twice_keeps_its_add() -> None:
    w = RNG.standard_normal((5, 6)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    nodes = [_n("MatMul", ["x", "w"], "mm"), _n("Add", ["mm", "b"], "y"), _n("Relu", ["mm"], "z")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [3, 5])], ["y", "z"], {"w": w, "b": b})
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    (y, z), ops = _run(model, {"x": x})
    assert MATMUL_ADD not in ops
    np.testing.assert_allclose(y, x @ w + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)


def test_bias_that_broadcasts_over_rows_is_not_fused() -> None:
    # A [rows, 1] "bias" is not a bias over the output features.
    w = RNG.standard_normal((5, 6)).astype(np.float32)
    c = RNG.standard_normal((3, 1)).astype(np.float32)
    model = _model([_n("MatMul", ["x", "w"], "mm"), _n("Add", ["mm", "c"], "y")],
                   [helper.make_tensor_value_info("x", F, [3, 5])], ["y"], {"w": w, "c": c})  # fmt: skip
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    (y,), ops = _run(model, {"x": x})
    assert MATMUL_ADD not in ops
    np.testing.assert_allclose(y, x @ w + c, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- Conv epilogue

_CONV_TAILS: dict[str, tuple[list[Any], list[str]]] = {
    "relu": ([_n("Relu", ["c"], "y")], ["FUSED"]),
    "add-relu": ([_n("Add", ["c", "r"], "a"), _n("Relu", ["a"], "y")], ["FUSED"]),
    "residual-first-sum-relu": ([_n("Sum", ["r", "c"], "a"), _n("Relu", ["a"], "y")], ["FUSED"]),
    "add": ([_n("Add", ["r", "c"], "y")], ["FUSED"]),
    # The conv output is also read by the Mul: nothing may disappear.
    "shared": (
        [_n("Add", ["c", "r"], "a"), _n("Mul", ["c", "a"], "m"), _n("Relu", ["m"], "y")],
        ["Conv", "Add", "Mul", "Relu"],
    ),
    # A broadcast Add (a bias-like [K, 1, 1] constant) is no residual: only the Relu after it.
    "broadcast-add": ([_n("Add", ["c", "k"], "a"), _n("Relu", ["a"], "y")], ["Conv", "Add", "Relu"]),
}


@pytest.mark.parametrize("tail", sorted(_CONV_TAILS))
@pytest.mark.parametrize("bias", [False, True])
def test_conv_epilogue_fuses_add_and_relu(tail: str, bias: bool) -> None:
    nodes, want_ops = _CONV_TAILS[tail]
    conv = _n("Conv", ["x", "w", "b"] if bias else ["x", "w"], "c", pads=[1, 1, 1, 1])
    x = RNG.standard_normal((2, 3, 6, 5)).astype(np.float32)
    r = RNG.standard_normal((2, 4, 6, 5)).astype(np.float32)
    inits = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)}
    inits["k"] = RNG.standard_normal((4, 1, 1)).astype(np.float32)
    if bias:
        inits["b"] = RNG.standard_normal(4).astype(np.float32)
    inputs = [helper.make_tensor_value_info(n, F, list(a.shape)) for n, a in (("x", x), ("r", r))]
    (y,), ops = _run(_model([conv, *nodes], inputs, ["y"], inits), {"x": x, "r": r})
    assert ops == [FUSED_CONV if op == "FUSED" else op for op in want_ops]
    c = reference.conv2d_forward(x, inits["w"], (1, 1), (1, 1), bias=inits.get("b"))
    want = {
        "relu": np.maximum(c, 0),
        "add-relu": np.maximum(c + r, 0),
        "residual-first-sum-relu": np.maximum(c + r, 0),
        "add": c + r,
        "shared": np.maximum(c * (c + r), 0),
        "broadcast-add": np.maximum(c + inits["k"], 0),
    }[tail]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
