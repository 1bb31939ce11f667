"""Models for tests, examples and benchmarks, built locally (no downloads).

* :func:`light_model` loads one of the nine "light" image classifiers shipped inside the
  ``onnx`` package (their weights are constants made by ``ConstantOfShape``);
  :func:`with_random_weights` replaces those constants with random initializers of the
  same shapes, so results can be compared with another runtime on non-trivial numbers.
* :func:`bert_encoder` builds a BERT-style encoder (token and position embeddings, a stack
  of post-LayerNorm layers with multi-head self-attention written as MatMul / Softmax and an
  erf-GELU feed-forward) from random weights with ``onnx.helper``.
* :func:`gpt_decoder_step` builds one GPT-style decoding step with a key/value cache (pre-
  LayerNorm layers using ONNX's ``Attention`` operator with ``past_key`` / ``past_value``,
  grouped-query heads optional) from random weights.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "LIGHT_MODELS",
    "batch_free",
    "bert_encoder",
    "bert_inputs",
    "gpt_decoder_step",
    "gpt_inputs",
    "light_model",
    "light_model_path",
    "with_random_weights",
]

#: The light models of ONNX's backend test data, by the name the runner's tests use.
LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)

_F = TensorProto.FLOAT
_I64 = TensorProto.INT64


def light_model_path(name: str) -> str:
    """Path of ``light_<name>.onnx`` inside the installed ``onnx`` package."""
    import onnx.backend.test

    if name not in LIGHT_MODELS:
        raise ValueError(f"unknown light model {name!r}; one of {', '.join(LIGHT_MODELS)}")
    root = os.path.dirname(onnx.backend.test.__file__)
    return os.path.join(root, "data", "light", f"light_{name}.onnx")


def light_model(name: str) -> onnx.ModelProto:
    """One of :data:`LIGHT_MODELS`, as shipped (constant weights)."""
    return onnx.load(light_model_path(name))


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[str, int]]]:
    used: dict[str, list[tuple[str, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            used.setdefault(name, []).append((node.op_type, index))
    return used


def _random_weight(
    shape: tuple[int, ...], uses: list[tuple[str, int]], rng: np.random.Generator
) -> np.ndarray:
    if any(op == "BatchNormalization" and index in (1, 4) for op, index in uses):
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)  # scale, variance: positive
    if any(op == "Unsqueeze" for op, _ in uses) or len(shape) < 2:
        return rng.uniform(-0.1, 0.1, shape).astype(np.float32)
    fan_in = math.prod(shape[1:])
    bound = math.sqrt(6.0 / fan_in)  # He-uniform: activations keep their scale through ReLU layers
    return rng.uniform(-bound, bound, shape).astype(np.float32)


def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of a light model whose ``ConstantOfShape`` weights are random initializers."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    uses = _consumers(graph)
    rng = np.random.default_rng(seed)
    kept, replaced = [], []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in inits[node.input[0]])
            weight = _random_weight(shape, uses.get(node.output[0], []), rng)
            replaced.append(numpy_helper.from_array(weight, node.output[0]))
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(replaced)  # the shape tensors stay: old models also list them as inputs
    return out


def batch_free(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a light model that takes any batch size.

    The first input and the outputs get a symbolic batch dimension, and ``Reshape`` targets
    that pin the batch to 1 (``[1, features]``) copy it from the input instead (``0``).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for value in list(graph.input[:1]) + list(graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_param = "batch"
    targets = {node.input[1] for node in graph.node if node.op_type == "Reshape" and len(node.input) > 1}
    for i, init in enumerate(graph.initializer):
        if init.name in targets:
            shape = numpy_helper.to_array(init).copy()
            if shape.size and shape[0] == 1:
                shape[0] = 0
                graph.initializer[i].CopyFrom(numpy_helper.from_array(shape, init.name))
    return out


# --------------------------------------------------------------------------- transformer builders


class _Builder:
    """Collects nodes and random initializers."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def weight(self, hint: str, shape: tuple[int, ...], scale: float | None = None) -> str:
        std = scale if scale is not None else 1.0 / math.sqrt(shape[0])
        return self.const(hint, self.rng.normal(0.0, std, shape).astype(np.float32))

    def const(self, hint: str, value: np.ndarray) -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(
        self, op_type: str, inputs: list[str], hint: str | None = None, outputs: int = 1, **attrs: Any
    ) -> list[str]:
        names = [self.name(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.name(op_type), **attrs))
        return names

    def one(self, op_type: str, inputs: list[str], hint: str | None = None, **attrs: Any) -> str:
        return self.op(op_type, inputs, hint, 1, **attrs)[0]

    def linear(self, x: str, d_in: int, d_out: int, hint: str) -> str:
        y = self.one("MatMul", [x, self.weight(f"{hint}_w", (d_in, d_out))])
        return self.one(
            "Add", [y, self.const(f"{hint}_b", self.rng.normal(0, 0.02, d_out).astype(np.float32))]
        )

    def layer_norm(self, x: str, width: int, hint: str) -> str:
        scale = self.const(f"{hint}_g", (1.0 + self.rng.normal(0, 0.05, width)).astype(np.float32))
        bias = self.const(f"{hint}_b", self.rng.normal(0, 0.05, width).astype(np.float32))
        return self.one("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-5)

    def gelu(self, x: str) -> str:
        """GELU as exporters write it: ``x * 0.5 * (1 + erf(x / sqrt(2)))``."""
        scaled = self.one("Div", [x, self.const("sqrt2", np.array(math.sqrt(2.0), np.float32))])
        erf = self.one("Erf", [scaled])
        one_plus = self.one("Add", [erf, self.const("one", np.array(1.0, np.float32))])
        half = self.one("Mul", [x, self.const("half", np.array(0.5, np.float32))])
        return self.one("Mul", [half, one_plus])

    def ints(self, hint: str, values: list[int]) -> str:
        return self.const(hint, np.array(values, dtype=np.int64))


def _bert_attention(b: _Builder, x: str, mask: str, hidden: int, heads: int, hint: str) -> str:
    d = hidden // heads
    split = b.ints("heads_shape", [0, 0, heads, d])
    q, k, v = (b.one("Reshape", [b.linear(x, hidden, hidden, f"{hint}_{t}"), split]) for t in "qkv")
    q = b.one("Transpose", [q], perm=[0, 2, 1, 3])
    k = b.one("Transpose", [k], perm=[0, 2, 3, 1])
    v = b.one("Transpose", [v], perm=[0, 2, 1, 3])
    scores = b.one("MatMul", [q, k])
    scores = b.one("Div", [scores, b.const("sqrt_d", np.array(math.sqrt(d), np.float32))])
    scores = b.one("Add", [scores, mask])
    probs = b.one("Softmax", [scores], axis=-1)
    context = b.one("Transpose", [b.one("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    context = b.one("Reshape", [context, b.ints("merge_shape", [0, 0, hidden])])
    return b.linear(context, hidden, hidden, f"{hint}_o")


def bert_encoder(
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    intermediate: int | None = None,
    vocab: int = 1000,
    max_positions: int = 512,
    seed: int = 0,
) -> onnx.ModelProto:
    """A BERT-style encoder with random weights (inputs ``input_ids``, ``attention_mask``; int64 [B, S]).

    Output ``last_hidden_state`` [B, S, hidden]. BERT-base is ``layers=12, hidden=768,
    heads=12, intermediate=3072``.
    """
    inner = intermediate or 4 * hidden
    b = _Builder(seed)
    words = b.one("Gather", [b.weight("word_emb", (vocab, hidden), 0.5), "input_ids"])
    seq = b.one("Gather", [b.one("Shape", ["input_ids"]), b.const("one_i", np.array(1, np.int64))])
    positions = b.one(
        "Range", [b.const("zero_i", np.array(0, np.int64)), seq, b.const("step", np.array(1, np.int64))]
    )
    pos = b.one("Gather", [b.weight("pos_emb", (max_positions, hidden), 0.5), positions])
    x = b.layer_norm(b.one("Add", [words, pos]), hidden, "emb_ln")
    # [B, S] int mask -> additive float mask [B, 1, 1, S]: 0 where attended, -10000 elsewhere.
    mask = b.one("Unsqueeze", ["attention_mask", b.ints("mask_axes", [1, 2])])
    mask = b.one("Cast", [mask], to=_F)
    mask = b.one("Sub", [b.const("one_f", np.array(1.0, np.float32)), mask])
    mask = b.one("Mul", [mask, b.const("neg", np.array(-10000.0, np.float32))])
    for i in range(layers):
        attn = _bert_attention(b, x, mask, hidden, heads, f"l{i}_attn")
        x = b.layer_norm(b.one("Add", [x, attn]), hidden, f"l{i}_ln1")
        ff = b.linear(b.gelu(b.linear(x, hidden, inner, f"l{i}_ff1")), inner, hidden, f"l{i}_ff2")
        x = b.layer_norm(b.one("Add", [x, ff]), hidden, f"l{i}_ln2")
    b.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    inputs = [
        helper.make_tensor_value_info("input_ids", _I64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", _I64, ["batch", "sequence"]),
    ]
    outputs = [helper.make_tensor_value_info("last_hidden_state", _F, ["batch", "sequence", hidden])]
    graph = helper.make_graph(b.nodes, "bert_encoder", inputs, outputs, initializer=b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def bert_inputs(batch: int, sequence: int, *, vocab: int = 1000, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids and a mask with the last quarter of the second half of the batch padded."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (batch, sequence), dtype=np.int64)
    mask = np.ones((batch, sequence), dtype=np.int64)
    mask[batch // 2 :, sequence - sequence // 4 :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def gpt_decoder_step(
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int | None = None,
    vocab: int = 1000,
    max_positions: int = 2048,
    seed: int = 0,
) -> onnx.ModelProto:
    """One GPT-style decoding step with a key/value cache, random weights.

    Inputs: ``input_ids`` int64 [B, S] (S new tokens, 1 when decoding) and, per layer ``i``,
    ``past_key_i`` / ``past_value_i`` float32 [B, kv_heads, P, head_size]. Outputs:
    ``logits`` [B, S, vocab] and ``present_key_i`` / ``present_value_i`` [B, kv_heads, P + S,
    head_size]. Positions continue from P; attention is causal over cache and new tokens.
    """
    kvh = kv_heads or heads
    d = hidden // heads
    b = _Builder(seed)
    x = b.one("Gather", [b.weight("word_emb", (vocab, hidden), 0.5), "input_ids"])
    past_len = b.one("Gather", [b.one("Shape", ["past_key_0"]), b.const("two", np.array(2, np.int64))])
    seq = b.one("Gather", [b.one("Shape", ["input_ids"]), b.const("one_i", np.array(1, np.int64))])
    end = b.one("Add", [past_len, seq])
    positions = b.one("Range", [past_len, end, b.const("step", np.array(1, np.int64))])
    x = b.one("Add", [x, b.one("Gather", [b.weight("pos_emb", (max_positions, hidden), 0.5), positions])])
    outputs = []
    for i in range(layers):
        h = b.layer_norm(x, hidden, f"l{i}_ln1")
        qkv = b.linear(h, hidden, (heads + 2 * kvh) * d, f"l{i}_qkv")
        sizes = b.ints("qkv_split", [heads * d, kvh * d, kvh * d])
        q, k, v = b.op("Split", [qkv, sizes], "qkv", 3, axis=-1)
        y, pk, pv = (f"attn_{i}", f"present_key_{i}", f"present_value_{i}")
        b.nodes.append(
            helper.make_node(
                "Attention", [q, k, v, "", f"past_key_{i}", f"past_value_{i}"], [y, pk, pv],
                name=f"attention_{i}", q_num_heads=heads, kv_num_heads=kvh, is_causal=1,
            )
        )  # fmt: skip
        outputs += [pk, pv]
        x = b.one("Add", [x, b.linear(y, hidden, hidden, f"l{i}_o")])
        h = b.layer_norm(x, hidden, f"l{i}_ln2")
        x = b.one(
            "Add",
            [
                x,
                b.linear(
                    b.gelu(b.linear(h, hidden, 4 * hidden, f"l{i}_ff1")), 4 * hidden, hidden, f"l{i}_ff2"
                ),
            ],
        )
    x = b.layer_norm(x, hidden, "final_ln")
    b.nodes.append(
        helper.make_node("MatMul", [x, b.weight("lm_head", (hidden, vocab))], ["logits"], name="lm_head")
    )
    inputs = [helper.make_tensor_value_info("input_ids", _I64, ["batch", "sequence"])]
    for i in range(layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_{kind}_{i}", _F, ["batch", kvh, "past", d]))
    outs = [helper.make_tensor_value_info("logits", _F, ["batch", "sequence", vocab])]
    outs += [helper.make_tensor_value_info(name, _F, ["batch", kvh, "total", d]) for name in outputs]
    graph = helper.make_graph(b.nodes, "gpt_decoder_step", inputs, outs, initializer=b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def gpt_inputs(
    model: onnx.ModelProto, batch: int, past: int, *, new_tokens: int = 1, vocab: int = 1000, seed: int = 0
) -> dict[str, np.ndarray]:
    """Token ids and a random cache of ``past`` positions for :func:`gpt_decoder_step`."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {"input_ids": rng.integers(0, vocab, (batch, new_tokens), dtype=np.int64)}
    for info in _cache_inputs(model):
        dims = info.type.tensor_type.shape.dim
        kvh, d = dims[1].dim_value, dims[3].dim_value
        feeds[info.name] = rng.normal(0, 1, (batch, kvh, past, d)).astype(np.float32)
    return feeds


def _cache_inputs(model: onnx.ModelProto) -> Iterator[onnx.ValueInfoProto]:
    return (i for i in model.graph.input if i.name.startswith("past_"))
