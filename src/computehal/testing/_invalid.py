"""Bad-input cases: every operation with invalid pointers, ranges, sizes, types and shapes.

Each case builds one valid call of an operation inside a :class:`Workspace`, then
makes a series of deterministic mutations of it. Every mutated call must raise the
stated :class:`~computehal.BackendError` subclass and leave every byte of every
operand allocation (canaries included) unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backend import ComputeBackend
from ..errors import BackendError, InvalidArgumentError
from ._common import Case, rng_for
from .workspace import Workspace, expect_error

__all__ = ["invalid_cases", "CallSpec", "build_call", "OP_BUILDERS"]

F32 = np.dtype(np.float32)
Expected = type[BackendError] | tuple[type[BackendError], ...]


@dataclass
class CallSpec:
    """One valid call of ``method`` and what each of its arguments is.

    ``pointers`` maps a pointer argument to (bytes the call reads or writes there,
    element size); ``counts`` are non-negative integer arguments; ``scalars`` real
    numbers; ``enums`` enum-or-string arguments; ``shapes`` list arguments with
    their required length. ``specific`` lists op-specific invalid variants as
    (label, overrides, expected error).
    """

    method: str
    names: list[str]
    values: dict[str, Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    pointers: dict[str, tuple[int, int]] = field(default_factory=dict)
    counts: tuple[str, ...] = ()
    scalars: tuple[str, ...] = ()
    enums: tuple[str, ...] = ()
    shapes: dict[str, int] = field(default_factory=dict)
    specific: list[tuple[str, dict[str, Any], Expected]] = field(default_factory=list)

    def call(self, be: ComputeBackend, **overrides: Any) -> None:
        """Call the method with the valid arguments, some replaced by ``overrides``."""
        values = dict(self.values)
        kwargs = dict(self.kwargs)
        for key, value in overrides.items():
            if key in values:
                values[key] = value
            else:
                kwargs[key] = value
        getattr(be, self.method)(*(values[name] for name in self.names), **kwargs)


def _f32(ws: Workspace, shape: tuple[int, ...] | int, label: str, seed: int = 0) -> int:
    data = rng_for(f"{label}-{seed}").standard_normal(shape).astype(F32)
    return ws.put(data, label=label)


def _gemm_spec(ws: Workspace, method: str) -> CallSpec:
    # op(A) = A^T with A stored 3 x 5 (lda 4), B stored 3 x 4 (ldb 3), C 5 x 4 (ldc 6).
    m, n, k, lda, ldb, ldc = 5, 4, 3, 4, 3, 6
    a_bytes, b_bytes, c_bytes = (lda * (m - 1) + k) * 4, (ldb * (n - 1) + k) * 4, (ldc * (n - 1) + m) * 4
    values: dict[str, Any] = {}
    names = [
        "trans_a",
        "trans_b",
        "m",
        "n",
        "k",
        "alpha",
        "a_ptr",
        "lda",
        "b_ptr",
        "ldb",
        "beta",
        "c_ptr",
        "ldc",
    ]
    if method == "gemm_mixed_precision":
        names = ["prec", *names]
        values["prec"] = "bf16"
    values.update(
        trans_a="T",
        trans_b="N",
        m=m,
        n=n,
        k=k,
        alpha=1.0,
        lda=lda,
        ldb=ldb,
        beta=0.5,
        ldc=ldc,
        a_ptr=_f32(ws, a_bytes // 4, "A"),
        b_ptr=_f32(ws, b_bytes // 4, "B"),
        c_ptr=_f32(ws, c_bytes // 4, "C"),
    )
    spec = CallSpec(
        method,
        names,
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
        spec.specific += [
            ("dtype-int32", {"dtype": "int32"}, _dtype_errors()),
            # float16 is a storage type a backend may take (through float32); float8 never is.
            ("dtype-float8", {"dtype": "float8_e4m3fn"}, _dtype_errors()),
            ("dtype-garbage", {"dtype": "banana"}, InvalidArgumentError),
            ("dtype-none-like", {"dtype": object()}, _dtype_errors()),
        ]
    else:
        spec.specific += [("prec-fp8", {"prec": "fp8"}, InvalidArgumentError)]
    return spec


def _dtype_errors() -> tuple[type[BackendError], ...]:
    from ..errors import UnsupportedError

    return (UnsupportedError, InvalidArgumentError)


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
    names = [
        "trans_a",
        "trans_b",
        "m",
        "n",
        "k",
        "alpha",
        "a_ptr",
        "lda",
        "stride_a",
        "b_ptr",
        "ldb",
        "stride_b",
        "beta",
        "c_ptr",
        "ldc",
        "stride_c",
        "batch_count",
    ]
    spec = CallSpec(
        method,
        names,
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
        ("dtype-garbage", {"dtype": "banana"}, InvalidArgumentError),
    ]
    return spec


def _conv_spec(ws: Workspace, method: str) -> CallSpec:
    x_shape, f_shape, y_shape = [2, 3, 6, 5], [4, 3, 3, 2], [2, 4, 3, 4]
    stride, padding = [2, 1], [1, 0]
    nbytes = {name: int(np.prod(s)) * 4 for name, s in (("x", x_shape), ("f", f_shape), ("y", y_shape))}
    px, pf, py = (_f32(ws, nbytes[t] // 4, t) for t in ("x", "f", "y"))
    if method == "conv2d_forward":
        names = ["input_ptr", "input_shape", "filter_ptr", "filter_shape", "output_ptr", "output_shape"]
        values = dict(
            input_ptr=px,
            input_shape=x_shape,
            filter_ptr=pf,
            filter_shape=f_shape,
            output_ptr=py,
            output_shape=y_shape,
        )
        xs, fs, ys = "input_shape", "filter_shape", "output_shape"
        pointers = {"input_ptr": nbytes["x"], "filter_ptr": nbytes["f"], "output_ptr": nbytes["y"]}
    elif method == "conv2d_backward_data":
        names = [
            "grad_output_ptr",
            "grad_output_shape",
            "filter_ptr",
            "filter_shape",
            "grad_input_ptr",
            "grad_input_shape",
        ]
        values = dict(
            grad_output_ptr=py,
            grad_output_shape=y_shape,
            filter_ptr=pf,
            filter_shape=f_shape,
            grad_input_ptr=px,
            grad_input_shape=x_shape,
        )
        xs, fs, ys = "grad_input_shape", "filter_shape", "grad_output_shape"
        pointers = {"grad_output_ptr": nbytes["y"], "filter_ptr": nbytes["f"], "grad_input_ptr": nbytes["x"]}
    else:
        names = [
            "input_ptr",
            "input_shape",
            "grad_output_ptr",
            "grad_output_shape",
            "grad_filter_ptr",
            "grad_filter_shape",
        ]
        values = dict(
            input_ptr=px,
            input_shape=x_shape,
            grad_output_ptr=py,
            grad_output_shape=y_shape,
            grad_filter_ptr=pf,
            grad_filter_shape=f_shape,
        )
        xs, fs, ys = "input_shape", "grad_filter_shape", "grad_output_shape"
        pointers = {"input_ptr": nbytes["x"], "grad_output_ptr": nbytes["y"], "grad_filter_ptr": nbytes["f"]}
    values.update(stride=stride, padding=padding)
    spec = CallSpec(
        method,
        [*names, "stride", "padding"],
        values,
        pointers={name: (size, 4) for name, size in pointers.items()},
        shapes={xs: 4, fs: 4, ys: 4, "stride": 2, "padding": 2},
    )
    spec.specific += [
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
    ]
    return spec


def _attention_spec(ws: Workspace, method: str) -> CallSpec:
    b, h, sq, skv, d = 1, 2, 3, 5, 4
    q_bytes, kv_bytes = b * h * sq * d * 4, b * h * skv * d * 4
    values = dict(
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
        [
            "q_ptr",
            "k_ptr",
            "v_ptr",
            "o_ptr",
            "batch",
            "heads",
            "seq_q",
            "seq_kv",
            "head_dim",
            "scale",
            "causal",
        ],
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
    ]
    return spec


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
    if method == "reduce":
        spec.specific += [("op-prod", {"op": "prod"}, InvalidArgumentError)]
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
    ]
    return spec


OP_BUILDERS: dict[str, Callable[[Workspace, str], CallSpec]] = {
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


def build_call(ws: Workspace, method: str) -> CallSpec:
    """A valid call of ``method`` with its operands allocated (guarded) in ``ws``."""
    return OP_BUILDERS[method](ws, method)


# --------------------------------------------------------------------------- mutations

Mutation = tuple[str, dict[str, Any], Expected]


def _pointer_mutations(kind: str, ws: Workspace, spec: CallSpec) -> list[Mutation]:
    out: list[Mutation] = []
    for name, (nbytes, align) in spec.pointers.items():
        ptr = spec.values[name]
        block = ws.block(ptr)
        if kind == "zero-ptr":
            out.append((f"{name}=0", {name: 0}, InvalidArgumentError))
        elif kind == "unknown-ptr":
            out.append((f"{name}=0x40", {name: 0x40}, InvalidArgumentError))
            out.append((f"{name}=2**63-64", {name: 2**63 - 64}, InvalidArgumentError))
        elif kind == "freed-ptr":
            # Allocate every stand-in first and free them all afterwards, so that no
            # later allocation can reuse a freed address.
            data = ws.read_block(block)[block.lo : block.lo + block.nbytes]
            freed = ws.put_bytes(data, label=f"freed {name}")
            out.append((f"{name}=freed", {name: freed.ptr}, InvalidArgumentError))
        elif kind == "end-ptr":
            out.append((f"{name}=end of allocation", {name: block.base + block.size}, InvalidArgumentError))
        elif kind == "short-range":
            data = ws.read_block(block)[block.lo : block.lo + nbytes - 1]
            short = ws.put_bytes(data, label=f"short {name}", hi=0)
            out.append((f"{name} one byte short", {name: short.ptr}, InvalidArgumentError))
        elif kind == "misaligned-ptr" and align > 1:
            out.append((f"{name}+2 bytes", {name: ptr + 2}, InvalidArgumentError))
        elif kind == "ptr-types":
            for label, value in (
                ("None", None),
                ("float", float(ptr)),
                ("str", hex(ptr)),
                ("negative", -ptr),
                ("2**64", 2**64),
                ("bytes", b"\x00"),
            ):
                out.append((f"{name}={label}", {name: value}, InvalidArgumentError))
    if kind == "freed-ptr":
        for _, overrides, _ in out:
            for ptr in overrides.values():
                ws.release(ptr)
    return out


def _count_mutations(kind: str, spec: CallSpec) -> list[Mutation]:
    out: list[Mutation] = []
    for name in spec.counts:
        if kind == "negative-size":
            out.append((f"{name}=-1", {name: -1}, InvalidArgumentError))
        elif kind == "huge-size":
            out.append((f"{name}=2**40", {name: 2**40}, InvalidArgumentError))
            out.append((f"{name}=2**70", {name: 2**70}, InvalidArgumentError))
        elif kind == "wrong-types":
            value = spec.values[name]
            for label, bad in (
                ("float", float(value)),
                ("None", None),
                ("str", str(value)),
                ("list", [value]),
            ):
                out.append((f"{name}={label}", {name: bad}, InvalidArgumentError))
    for name, length in spec.shapes.items():
        value = list(spec.values[name])
        if kind == "wrong-shape-length":
            out.append((f"{name} with {length + 1} entries", {name: [*value, 1]}, InvalidArgumentError))
            out.append((f"{name} with {length - 1} entries", {name: value[:-1]}, InvalidArgumentError))
            out.append((f"{name}=[]", {name: []}, InvalidArgumentError))
        elif kind == "negative-size":
            out.append((f"{name}[0]=-1", {name: [-1, *value[1:]]}, InvalidArgumentError))
        elif kind == "huge-size":
            out.append((f"{name}[0]=2**40", {name: [2**40, *value[1:]]}, InvalidArgumentError))
        elif kind == "wrong-types":
            out.append((f"{name}=None", {name: None}, InvalidArgumentError))
            out.append((f"{name}=str", {name: "1234"[:length]}, InvalidArgumentError))
            out.append((f"{name}[0]=float", {name: [float(value[0]), *value[1:]]}, InvalidArgumentError))
            out.append((f"{name}=int", {name: 3}, InvalidArgumentError))
    if kind == "wrong-types":
        for name in spec.scalars:
            bad_scalars: tuple[tuple[str, object], ...] = (
                ("None", None),
                ("str", "1.0"),
                ("list", [1.0]),
                ("complex", 1j),
            )
            for label, bad_scalar in bad_scalars:
                out.append((f"{name}={label}", {name: bad_scalar}, InvalidArgumentError))
        for name in spec.enums:
            for label, bad in (("unknown", "bogus"), ("None", None), ("int", 3), ("empty", "")):
                out.append((f"{name}={label}", {name: bad}, InvalidArgumentError))
    return out


GENERIC_KINDS = (
    "zero-ptr",
    "unknown-ptr",
    "freed-ptr",
    "end-ptr",
    "short-range",
    "misaligned-ptr",
    "ptr-types",
    "negative-size",
    "huge-size",
    "wrong-types",
    "wrong-shape-length",
)


def _run_mutations(be: ComputeBackend, method: str, kind: str) -> float:
    with Workspace(be, tail=0) as ws:
        spec = build_call(ws, method)
        try:
            spec.call(be)
        except BackendError as error:
            raise AssertionError(
                f"{method}: the valid call that the bad-input variants start from raised "
                f"{type(error).__name__}: {error}"
            ) from error
        ws.refresh()
        if kind in GENERIC_KINDS:
            mutations = _pointer_mutations(kind, ws, spec) + _count_mutations(kind, spec)
        else:
            mutations = [m for m in spec.specific if m[0] == kind]
        if not mutations:
            raise AssertionError(f"no mutations of kind {kind!r} for {method}")
        for label, overrides, expected in mutations:
            with expect_error(expected, f"{method}({label})"):
                spec.call(be, **overrides)
            ws.check_unchanged()
    return 0.0


def _applicable(method: str, kind: str) -> bool:
    with _DryWorkspace() as ws:
        spec = build_call(ws, method)  # type: ignore[arg-type]
        if kind == "wrong-shape-length":
            return bool(spec.shapes)
        if kind == "misaligned-ptr":
            return any(align > 1 for _, align in spec.pointers.values())
        if kind in ("negative-size", "huge-size"):
            return bool(spec.counts or spec.shapes)
        return True


class _DryWorkspace:
    """Stands in for :class:`Workspace` to list a call's arguments without a backend."""

    def __init__(self) -> None:
        self._next = 0x1000

    def __enter__(self) -> _DryWorkspace:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def put(self, data: Any, **kwargs: Any) -> int:
        self._next += 0x10000
        return self._next


def _specific_names(method: str) -> list[str]:
    with _DryWorkspace() as ws:
        return [label for label, _, _ in build_call(ws, method).specific]  # type: ignore[arg-type]


def invalid_cases() -> list[Case]:
    """Bad-input cases for every operation: generic kinds first, then op-specific ones."""
    cases: list[Case] = []
    for method in OP_BUILDERS:
        for kind in GENERIC_KINDS:
            if _applicable(method, kind):
                cases.append(
                    Case(method, f"bad-{kind}", functools.partial(_run_mutations, method=method, kind=kind))
                )
        for label in _specific_names(method):
            cases.append(
                Case(method, f"bad-{label}", functools.partial(_run_mutations, method=method, kind=label))
            )
    return cases
