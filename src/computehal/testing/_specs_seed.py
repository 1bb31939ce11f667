"""Valid calls of the seed's 13 compute operations for the bad-input cases, with the
invalid variants specific to each (extension keywords included: conv ``groups`` /
``dilation`` / ``bias_ptr`` / 4-entry padding, attention masks and ``kv_heads``,
``softmax(log=)``, unary parameters, device-side indices)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ._spec import DTYPE_ERRORS, CallSpec, Expected, dtype_mutations, f32_block, freed_block, short_block
from .workspace import Workspace

__all__ = ["SEED_BUILDERS"]

_f32 = f32_block


def _gemm_spec(ws: Workspace, method: str) -> CallSpec:
    # op(A) = A^T with A stored 3 x 5 (lda 4), B stored 3 x 4 (ldb 3), C 5 x 4 (ldc 6).
    m, n, k, lda, ldb, ldc = 5, 4, 3, 4, 3, 6
    a_bytes, b_bytes, c_bytes = (lda * (m - 1) + k) * 4, (ldb * (n - 1) + k) * 4, (ldc * (n - 1) + m) * 4
    values: dict[str, Any] = {"prec": "bf16"} if method == "gemm_mixed_precision" else {}
    values.update(
        trans_a="T",
        trans_b="N",
        m=m,
        n=n,
        k=k,
        alpha=1.0,
        a_ptr=_f32(ws, a_bytes // 4, "A"),
        lda=lda,
        b_ptr=_f32(ws, b_bytes // 4, "B"),
        ldb=ldb,
        beta=0.5,
        c_ptr=_f32(ws, c_bytes // 4, "C"),
        ldc=ldc,
    )
    spec = CallSpec(
        method,
        list(values),
        values,
        kwargs={"dtype": "float32"} if method == "gemm" else {},
        pointers={"a_ptr": (a_bytes, 4), "b_ptr": (b_bytes, 4), "c_ptr": (c_bytes, 4)},
        counts=("m", "n", "k", "lda", "ldb", "ldc"),
        scalars=("alpha", "beta"),
        enums=("trans_a", "trans_b", "prec") if method == "gemm_mixed_precision" else ("trans_a", "trans_b"),
    )
    spec.specific += [
        ("lda-below-rows", {"lda": k - 1}, InvalidArgumentError),
        ("lda-zero", {"lda": 0}, InvalidArgumentError),
        ("ldb-below-rows", {"ldb": k - 1}, InvalidArgumentError),
        ("ldc-below-m", {"ldc": m - 1}, InvalidArgumentError),
        ("ld-checked-before-m0", {"m": 0, "ldc": 0}, InvalidArgumentError),
        ("ld-checked-before-n0", {"n": 0, "lda": 0}, InvalidArgumentError),
        ("m-too-big-for-C", {"m": ldc + 1, "ldc": ldc + 1}, InvalidArgumentError),
        ("k-too-big-for-A", {"k": lda + 1, "lda": lda + 1}, InvalidArgumentError),
        ("m-above-int32", {"m": 2**31}, InvalidArgumentError),
    ]
    if method == "gemm":
        spec.specific += dtype_mutations()
    else:
        spec.specific += [("prec-fp8", {"prec": "fp8"}, InvalidArgumentError)]
    return spec


def _batched_spec(ws: Workspace, method: str) -> CallSpec:
    m, n, k, lda, ldb, ldc, batch = 4, 3, 2, 5, 2, 4, 3
    sa, sb, sc = lda * k + 1, ldb * n + 2, ldc * n + 3
    a_bytes = (sa * (batch - 1) + lda * (k - 1) + m) * 4
    b_bytes = (sb * (batch - 1) + ldb * (n - 1) + k) * 4
    c_bytes = (sc * (batch - 1) + ldc * (n - 1) + m) * 4
    values: dict[str, Any] = dict(
        trans_a="N",
        trans_b="N",
        m=m,
        n=n,
        k=k,
        alpha=1.0,
        a_ptr=_f32(ws, a_bytes // 4, "A"),
        lda=lda,
        stride_a=sa,
        b_ptr=_f32(ws, b_bytes // 4, "B"),
        ldb=ldb,
        stride_b=sb,
        beta=0.0,
        c_ptr=_f32(ws, c_bytes // 4, "C"),
        ldc=ldc,
        stride_c=sc,
        batch_count=batch,
    )
    spec = CallSpec(
        method,
        list(values),
        values,
        kwargs={"dtype": "float32"},
        pointers={"a_ptr": (a_bytes, 4), "b_ptr": (b_bytes, 4), "c_ptr": (c_bytes, 4)},
        counts=("m", "n", "k", "lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c", "batch_count"),
        scalars=("alpha", "beta"),
        enums=("trans_a", "trans_b"),
    )
    spec.specific += [
        ("stride-c-overlaps", {"stride_c": ldc * (n - 1) + m - 1}, InvalidArgumentError),
        ("stride-c-zero", {"stride_c": 0}, InvalidArgumentError),
        ("lda-below-rows", {"lda": m - 1}, InvalidArgumentError),
        ("last-batch-past-end", {"batch_count": batch + 1}, InvalidArgumentError),
        ("stride-a-past-end", {"stride_a": sa + 1}, InvalidArgumentError),
        *dtype_mutations(),
    ]
    return spec


#: Each convolution's positional operands in order: (argument name stem, tensor: x, f or y).
_CONV_OPERANDS: dict[str, tuple[tuple[str, str], ...]] = {
    "conv2d_forward": (("input", "x"), ("filter", "f"), ("output", "y")),
    "conv2d_backward_data": (("grad_output", "y"), ("filter", "f"), ("grad_input", "x")),
    "conv2d_backward_filter": (("input", "x"), ("grad_output", "y"), ("grad_filter", "f")),
}


def _conv_spec(ws: Workspace, method: str) -> CallSpec:
    shapes = {"x": [2, 3, 6, 5], "f": [4, 3, 3, 2], "y": [2, 4, 3, 4]}
    nbytes = {t: int(np.prod(shape)) * 4 for t, shape in shapes.items()}
    ptrs = {t: _f32(ws, nbytes[t] // 4, t) for t in ("x", "f", "y")}
    operands = _CONV_OPERANDS[method]
    values: dict[str, Any] = {}
    for stem, t in operands:
        values.update({f"{stem}_ptr": ptrs[t], f"{stem}_shape": shapes[t]})
    shape_of = {t: f"{stem}_shape" for stem, t in operands}
    values.update(stride=[2, 1], padding=[1, 0])
    spec = CallSpec(
        method,
        list(values),
        values,
        pointers={f"{stem}_ptr": (nbytes[t], 4) for stem, t in operands},
        shapes={**{shape_of[t]: 4 for t in ("x", "f", "y")}, "stride": 2, "padding": 2},
    )
    spec.specific += _conv_mutations(shape_of["x"], shape_of["f"], shape_of["y"])
    if method == "conv2d_forward":
        spec.specific += [
            ("bias-short", {"bias_ptr": short_block(ws, 4 * 3, "short bias")}, InvalidArgumentError),
            ("bias-freed", {"bias_ptr": freed_block(ws, 16, "freed bias")}, InvalidArgumentError),
            ("bias-misaligned", {"bias_ptr": short_block(ws, 20, "bias+2") + 2}, InvalidArgumentError),
            ("bias-zero", {"bias_ptr": 0}, InvalidArgumentError),
            ("bias-str", {"bias_ptr": "0x1000"}, InvalidArgumentError),
            # the fused epilogue: the residual has the output's size (96 floats, 384 bytes)
            (
                "residual-short",
                {"residual_ptr": short_block(ws, 380, "short residual")},
                InvalidArgumentError,
            ),
            (
                "residual-freed",
                {"residual_ptr": freed_block(ws, 384, "freed residual")},
                InvalidArgumentError,
            ),
            (
                "residual-misaligned",
                {"residual_ptr": short_block(ws, 386, "residual+2") + 2},
                InvalidArgumentError,
            ),
            ("residual-zero", {"residual_ptr": 0}, InvalidArgumentError),
            ("activation-leaky-relu", {"activation": "leaky_relu"}, InvalidArgumentError),
            ("activation-clip", {"activation": "clip"}, InvalidArgumentError),
            ("activation-unknown", {"activation": "swish"}, InvalidArgumentError),
            ("activation-int", {"activation": 3}, InvalidArgumentError),
        ]
    return spec


def _conv_mutations(xs: str, fs: str, ys: str) -> list[tuple[str, dict[str, Any], Expected]]:
    """Invalid variants of the valid convolution whose shape arguments are named ``xs``, ``fs``, ``ys``."""
    return [
        ("channel-mismatch", {fs: [4, 2, 3, 2]}, InvalidArgumentError),
        ("batch-mismatch", {ys: [1, 4, 3, 4]}, InvalidArgumentError),
        ("k-mismatch", {ys: [2, 3, 3, 4]}, InvalidArgumentError),
        ("output-height-off-by-one", {ys: [2, 4, 2, 4]}, InvalidArgumentError),
        ("output-width-off-by-one", {ys: [2, 4, 3, 5]}, InvalidArgumentError),
        ("stride-zero", {"stride": [0, 1]}, InvalidArgumentError),
        ("padding-negative", {"padding": [-1, 0]}, InvalidArgumentError),
        (
            "padded-input-smaller-than-filter",
            {xs: [2, 3, 1, 1], ys: [2, 4, 1, 1], "padding": [0, 0]},
            InvalidArgumentError,
        ),
        ("filter-zero-height", {fs: [4, 3, 0, 2], ys: [2, 4, 4, 4]}, InvalidArgumentError),
        ("shape-as-dict", {xs: {"n": 2}}, InvalidArgumentError),
        *dtype_mutations(),
        # extension keywords, from the same valid call (C = 3, K = 4)
        ("groups-not-dividing-channels", {"groups": 2}, InvalidArgumentError),
        ("groups-zero", {"groups": 0}, InvalidArgumentError),
        ("groups-negative", {"groups": -1}, InvalidArgumentError),
        ("groups-float", {"groups": 1.0}, InvalidArgumentError),
        ("groups-none", {"groups": None}, InvalidArgumentError),
        ("dilation-zero", {"dilation": [0, 1]}, InvalidArgumentError),
        ("dilation-three-entries", {"dilation": [1, 1, 1]}, InvalidArgumentError),
        ("dilation-changes-output", {"dilation": [2, 1]}, InvalidArgumentError),
        ("dilation-too-large", {"dilation": [1, 2**40]}, InvalidArgumentError),
        ("padding-three-entries", {"padding": [1, 0, 1]}, InvalidArgumentError),
        ("padding4-changes-output", {"padding": [1, 0, 1, 2]}, InvalidArgumentError),
        ("padding4-negative", {"padding": [1, 0, -1, 0]}, InvalidArgumentError),
    ]


def _attention_spec(ws: Workspace, method: str) -> CallSpec:
    b, h, sq, skv, d = 1, 2, 3, 5, 4
    q_bytes, kv_bytes = b * h * sq * d * 4, b * h * skv * d * 4
    values: dict[str, Any] = dict(
        q_ptr=_f32(ws, q_bytes // 4, "q"),
        k_ptr=_f32(ws, kv_bytes // 4, "k"),
        v_ptr=_f32(ws, kv_bytes // 4, "v"),
        o_ptr=_f32(ws, q_bytes // 4, "o"),
        batch=b,
        heads=h,
        seq_q=sq,
        seq_kv=skv,
        head_dim=d,
        scale=0.5,
        causal=True,
    )
    spec = CallSpec(
        method,
        list(values),
        values,
        pointers={
            "q_ptr": (q_bytes, 4),
            "k_ptr": (kv_bytes, 4),
            "v_ptr": (kv_bytes, 4),
            "o_ptr": (q_bytes, 4),
        },
        counts=("batch", "heads", "seq_q", "seq_kv", "head_dim"),
        scalars=("scale",),
    )
    spec.specific += [
        ("batch-zero", {"batch": 0}, InvalidArgumentError),
        ("heads-zero", {"heads": 0}, InvalidArgumentError),
        ("seq-q-zero", {"seq_q": 0}, InvalidArgumentError),
        ("seq-kv-zero", {"seq_kv": 0}, InvalidArgumentError),
        ("head-dim-zero", {"head_dim": 0}, InvalidArgumentError),
        ("scale-nan", {"scale": float("nan")}, InvalidArgumentError),
        ("scale-inf", {"scale": float("inf")}, InvalidArgumentError),
        ("causal-string", {"causal": "yes"}, InvalidArgumentError),
        ("causal-none", {"causal": None}, InvalidArgumentError),
        ("seq-kv-past-end", {"seq_kv": skv + 1}, InvalidArgumentError),
        *dtype_mutations(),
        # extension keywords
        ("kv-heads-not-dividing", {"kv_heads": 3}, InvalidArgumentError),
        ("kv-heads-above-heads", {"kv_heads": 4}, InvalidArgumentError),
        ("kv-heads-zero", {"kv_heads": 0}, InvalidArgumentError),
        ("kv-heads-float", {"kv_heads": 1.0}, InvalidArgumentError),
    ]
    spec.specific += _mask_mutations(ws, sq, skv)
    return spec


def _mask_mutations(ws: Workspace, sq: int, skv: int) -> list[tuple[str, dict[str, Any], Expected]]:
    """Invalid attention masks for a valid call with ``seq_q = sq`` and ``seq_kv = skv``."""
    mask = _f32(ws, sq * skv, "mask")
    return [
        ("mask-ptr-without-shape", {"mask_ptr": mask}, InvalidArgumentError),
        ("mask-shape-without-ptr", {"mask_shape": [sq, skv]}, InvalidArgumentError),
        ("mask-not-broadcasting", {"mask_ptr": mask, "mask_shape": [sq + 1, skv]}, InvalidArgumentError),
        ("mask-five-dims", {"mask_ptr": mask, "mask_shape": [1, 1, 1, sq, skv]}, InvalidArgumentError),
        ("mask-shape-empty", {"mask_ptr": mask, "mask_shape": []}, InvalidArgumentError),
        ("mask-shape-str", {"mask_ptr": mask, "mask_shape": "35"}, InvalidArgumentError),
        (
            "mask-short",
            {"mask_ptr": short_block(ws, 4 * (sq * skv - 1), "short mask"), "mask_shape": [sq, skv]},
            InvalidArgumentError,
        ),
        (
            "mask-freed",
            {"mask_ptr": freed_block(ws, 4 * sq * skv, "freed mask"), "mask_shape": [sq, skv]},
            InvalidArgumentError,
        ),
        (
            "mask-misaligned",
            {"mask_ptr": short_block(ws, 4 * (sq * skv + 1), "mask+2") + 2, "mask_shape": [sq, skv]},
            InvalidArgumentError,
        ),
    ]


def _axis_spec(ws: Workspace, method: str) -> CallSpec:
    shape = [3, 4, 5]
    in_bytes = 60 * 4
    out_bytes = (15 if method == "reduce" else 60) * 4
    names = ["input_ptr", "output_ptr", "shape", "axis"]
    values: dict[str, Any] = dict(
        input_ptr=_f32(ws, in_bytes // 4, "input"),
        output_ptr=_f32(ws, out_bytes // 4, "output"),
        shape=shape,
        axis=1,
    )
    if method == "reduce":
        names = ["op", *names]
        values["op"] = "max"
    spec = CallSpec(
        method,
        names,
        values,
        pointers={"input_ptr": (in_bytes, 4), "output_ptr": (out_bytes, 4)},
        counts=("axis",),
        enums=("op",) if method == "reduce" else (),
    )
    spec.specific += [
        ("axis-equal-ndim", {"axis": 3}, InvalidArgumentError),
        ("axis-negative", {"axis": -1}, InvalidArgumentError),
        ("axis-huge", {"axis": 2**70}, InvalidArgumentError),
        ("shape-empty", {"shape": []}, InvalidArgumentError),
        ("shape-none", {"shape": None}, InvalidArgumentError),
        ("shape-string", {"shape": "345"}, InvalidArgumentError),
        ("shape-negative-entry", {"shape": [3, -4, 5]}, InvalidArgumentError),
        ("shape-float-entry", {"shape": [3, 4.0, 5]}, InvalidArgumentError),
        ("shape-none-entry", {"shape": [3, None, 5]}, InvalidArgumentError),
        ("shape-too-big", {"shape": [3, 4, 6]}, InvalidArgumentError),
        ("shape-huge-entry", {"shape": [3, 2**40, 5]}, InvalidArgumentError),
    ]
    spec.specific += dtype_mutations()
    if method == "reduce":
        spec.specific += [("op-prod", {"op": "prod"}, InvalidArgumentError)]
    else:
        spec.specific += [
            ("log-string", {"log": "yes"}, InvalidArgumentError),
            ("log-none", {"log": None}, InvalidArgumentError),
            ("log-int", {"log": 1}, InvalidArgumentError),
        ]
    return spec


def _elementwise_spec(ws: Workspace, method: str) -> CallSpec:
    n = 10
    if method == "unary":
        names = ["op", "input_ptr", "output_ptr", "n"]
        values: dict[str, Any] = dict(
            op="exp", input_ptr=_f32(ws, n, "input"), output_ptr=_f32(ws, n, "output"), n=n
        )
        pointers = {"input_ptr": (n * 4, 4), "output_ptr": (n * 4, 4)}
        bad_op = "softplus"
    else:
        names = ["op", "a_ptr", "b_ptr", "output_ptr", "n"]
        values = dict(
            op="add", a_ptr=_f32(ws, n, "a"), b_ptr=_f32(ws, n, "b"), output_ptr=_f32(ws, n, "output"), n=n
        )
        pointers = {"a_ptr": (n * 4, 4), "b_ptr": (n * 4, 4), "output_ptr": (n * 4, 4)}
        bad_op = "atan2"
    spec = CallSpec(method, names, values, pointers=pointers, counts=("n",), enums=("op",))
    spec.specific += [
        ("op-unknown", {"op": bad_op}, InvalidArgumentError),
        ("n-one-past-end", {"n": n + 1}, InvalidArgumentError),
        *dtype_mutations(),
    ]
    if method == "unary":
        spec.specific += [
            ("alpha-for-exp", {"alpha": 0.5}, InvalidArgumentError),
            ("lo-for-exp", {"lo": 0.0}, InvalidArgumentError),
            ("hi-for-leaky-relu", {"op": "leaky_relu", "hi": 1.0}, InvalidArgumentError),
            ("alpha-nan", {"op": "leaky_relu", "alpha": float("nan")}, InvalidArgumentError),
            ("alpha-str", {"op": "leaky_relu", "alpha": "0.1"}, InvalidArgumentError),
            ("lo-nan", {"op": "clip", "lo": float("nan")}, InvalidArgumentError),
            ("hi-list", {"op": "clip", "hi": [1.0]}, InvalidArgumentError),
            ("lo-complex", {"op": "clip", "lo": 1j}, InvalidArgumentError),
        ]
    return spec


def _rows_spec(ws: Workspace, method: str) -> CallSpec:
    rows, cols = 6, 5
    indices = [1, 5, 0, 5]
    table_bytes, picked_bytes = rows * cols * 4, len(indices) * cols * 4
    if method == "gather":
        in_bytes, out_bytes = table_bytes, picked_bytes
    else:
        in_bytes, out_bytes = picked_bytes, table_bytes
    values = dict(
        input_ptr=_f32(ws, in_bytes // 4, "input"),
        indices=indices,
        output_ptr=_f32(ws, out_bytes // 4, "output"),
        rows=rows,
        cols=cols,
    )
    spec = CallSpec(
        method,
        ["input_ptr", "indices", "output_ptr", "rows", "cols"],
        values,
        pointers={"input_ptr": (in_bytes, 4), "output_ptr": (out_bytes, 4)},
        counts=("rows", "cols"),
    )
    spec.specific += [
        ("index-equal-rows-last", {"indices": [1, 2, 3, rows]}, InvalidArgumentError),
        ("index-huge", {"indices": [0, 2**40, 1, 1]}, InvalidArgumentError),
        ("index-beyond-int64", {"indices": [0, 2**70, 1, 1]}, InvalidArgumentError),
        ("index-negative", {"indices": [0, 1, -1, 2]}, InvalidArgumentError),
        (
            "index-array-out-of-range",
            {"indices": np.array([0, 1, 2, rows], dtype=np.int32)},
            InvalidArgumentError,
        ),
        ("index-float", {"indices": [0, 1.0, 2, 3]}, InvalidArgumentError),
        ("index-none", {"indices": [0, None, 2, 3]}, InvalidArgumentError),
        ("index-bool", {"indices": [True, 0, 1, 2]}, InvalidArgumentError),
        ("indices-none", {"indices": None}, InvalidArgumentError),
        ("indices-string", {"indices": "0123"}, InvalidArgumentError),
        ("indices-int", {"indices": 3}, InvalidArgumentError),
        ("indices-float-array", {"indices": np.array([0.0, 1.0, 2.0, 3.0])}, InvalidArgumentError),
        ("indices-2d-array", {"indices": np.array([[0, 1], [2, 3]])}, InvalidArgumentError),
        ("rows-too-big-for-table", {"rows": rows + 1, "indices": [rows]}, InvalidArgumentError),
        ("cols-too-big", {"cols": cols + 1}, InvalidArgumentError),
        (
            "indices-masked-array",
            {"indices": np.ma.array([0, 9, 1, 2], mask=[False, True, False, False])},
            InvalidArgumentError,
        ),
        *dtype_mutations(),
    ]
    index = ws.put(np.asarray(indices, dtype=np.int64), label="device indices")
    n = len(indices)
    spec.specific += [
        ("device-indices-list-count", {"indices_ptr": index, "indices": list(indices)}, InvalidArgumentError),
        ("device-count-past-end", {"indices_ptr": index, "indices": n + 1}, InvalidArgumentError),
        ("device-count-negative", {"indices_ptr": index, "indices": -1}, InvalidArgumentError),
        (
            "device-index-dtype-float32",
            {"indices_ptr": index, "indices": n, "index_dtype": "float32"},
            DTYPE_ERRORS,
        ),
        (
            "device-index-dtype-garbage",
            {"indices_ptr": index, "indices": n, "index_dtype": "banana"},
            InvalidArgumentError,
        ),
        ("device-index-dtype-none", {"indices_ptr": index, "indices": n, "index_dtype": None}, DTYPE_ERRORS),
        ("device-indices-ptr-misaligned", {"indices_ptr": index + 4, "indices": n - 1}, InvalidArgumentError),
        ("device-indices-ptr-zero", {"indices_ptr": 0, "indices": n}, InvalidArgumentError),
        (
            "device-indices-freed",
            {"indices_ptr": freed_block(ws, 8 * n, "freed indices"), "indices": n},
            InvalidArgumentError,
        ),
        ("device-indices-ptr-float", {"indices_ptr": float(index), "indices": n}, InvalidArgumentError),
    ]
    return spec


SEED_BUILDERS: dict[str, Callable[[Workspace, str], CallSpec]] = {
    "gemm": _gemm_spec,
    "gemm_mixed_precision": _gemm_spec,
    "batched_gemm": _batched_spec,
    "conv2d_forward": _conv_spec,
    "conv2d_backward_data": _conv_spec,
    "conv2d_backward_filter": _conv_spec,
    "attention": _attention_spec,
    "reduce": _axis_spec,
    "softmax": _axis_spec,
    "unary": _elementwise_spec,
    "binary": _elementwise_spec,
    "gather": _rows_spec,
    "scatter": _rows_spec,
}
