"""Valid calls of computehal's extension operations for the bad-input cases, with the
invalid variants specific to each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError
from ._spec import DTYPE_ERRORS, CallSpec, dtype_mutations, f32_block
from .workspace import Workspace

__all__ = ["EXTENSION_BUILDERS"]

Invalid = InvalidArgumentError


def _copy_dtod_spec(ws: Workspace, method: str) -> CallSpec:
    nbytes = 40
    values = {"dst_ptr": f32_block(ws, 10, "dst"), "src_ptr": f32_block(ws, 10, "src"), "nbytes": nbytes}
    spec = CallSpec(
        method,
        ["dst_ptr", "src_ptr", "nbytes"],
        values,
        pointers={"dst_ptr": (nbytes, 1), "src_ptr": (nbytes, 1)},
        counts=("nbytes",),
        dtype="uint8",
    )
    spec.specific += [("nbytes-one-past-end", {"nbytes": nbytes + 1}, Invalid)]
    return spec


def _fill_spec(ws: Workspace, method: str) -> CallSpec:
    count = 10
    spec = CallSpec(
        method,
        ["ptr", "count", "value"],
        {"ptr": f32_block(ws, count, "region"), "count": count, "value": 2.5},
        kwargs={"dtype": "float32"},
        pointers={"ptr": (4 * count, 4)},
        counts=("count",),
        scalars=("value",),
    )
    spec.specific += [
        ("count-one-past-end", {"count": count + 1}, Invalid),
        ("float64-past-end", {"dtype": "float64"}, Invalid),
        *dtype_mutations(),
    ]
    return spec


def _copy_strided_spec(ws: Workspace, method: str) -> CallSpec:
    # A 3 x 4 transpose: src row-major, dst column-major.
    values: dict[str, Any] = {
        "dst_ptr": f32_block(ws, 12, "dst"),
        "src_ptr": f32_block(ws, 12, "src"),
        "shape": [3, 4],
        "src_strides": [4, 1],
        "dst_strides": [1, 3],
    }
    spec = CallSpec(
        method,
        ["dst_ptr", "src_ptr", "shape", "src_strides", "dst_strides"],
        values,
        kwargs={"dtype": "float32"},
        pointers={"dst_ptr": (48, 4), "src_ptr": (48, 4)},
        shapes={"shape": 2},
    )
    spec.specific += [
        ("src-strides-too-long", {"src_strides": [4, 1, 1]}, Invalid),
        ("dst-strides-too-short", {"dst_strides": [1]}, Invalid),
        ("dst-strides-alias", {"dst_strides": [1, 1]}, Invalid),
        ("dst-stride-zero", {"dst_strides": [0, 3]}, Invalid),
        ("src-stride-past-end", {"src_strides": [5, 1]}, Invalid),
        ("src-negative-stride-below-allocation", {"src_strides": [-40, 1]}, Invalid),
        ("dst-negative-stride-below-allocation", {"dst_strides": [1, -40]}, Invalid),
        ("stride-huge", {"src_strides": [2**62, 1]}, Invalid),
        ("stride-beyond-int64", {"src_strides": [2**70, 1]}, Invalid),
        ("stride-float", {"src_strides": [4.0, 1]}, Invalid),
        ("stride-none", {"dst_strides": None}, Invalid),
        (
            "seven-dimensions",
            {"shape": [1] * 5 + [3, 4], "src_strides": [0] * 5 + [4, 1], "dst_strides": [0] * 5 + [1, 3]},
            Invalid,
        ),
        *dtype_mutations(),
    ]
    return spec


def _cast_spec(ws: Workspace, method: str) -> CallSpec:
    n = 10
    spec = CallSpec(
        method,
        ["input_ptr", "output_ptr", "n"],
        {"input_ptr": f32_block(ws, n, "input"), "output_ptr": f32_block(ws, n, "output"), "n": n},
        kwargs={"dtype": "float32", "out_dtype": "float32"},
        pointers={"input_ptr": (4 * n, 4), "output_ptr": (4 * n, 4)},
        counts=("n",),
    )
    spec.specific += [
        ("n-one-past-end", {"n": n + 1}, Invalid),
        ("out-dtype-float64-past-end", {"out_dtype": "float64"}, Invalid),
        ("out-dtype-int32", {"out_dtype": "int32"}, DTYPE_ERRORS),
        ("out-dtype-garbage", {"out_dtype": "banana"}, Invalid),
        ("out-dtype-none", {"out_dtype": None}, DTYPE_ERRORS),
        *dtype_mutations(),
    ]
    return spec


def _broadcast_spec(ws: Workspace, method: str) -> CallSpec:
    values: dict[str, Any] = {
        "op": "add",
        "a_ptr": f32_block(ws, 12, "a"),
        "a_shape": [3, 1, 4],
        "b_ptr": f32_block(ws, 5, "b"),
        "b_shape": [5, 1],
        "out_ptr": f32_block(ws, 60, "out"),
        "out_shape": [3, 5, 4],
    }
    spec = CallSpec(
        method,
        ["op", "a_ptr", "a_shape", "b_ptr", "b_shape", "out_ptr", "out_shape"],
        values,
        kwargs={"dtype": "float32"},
        pointers={"a_ptr": (48, 4), "b_ptr": (20, 4), "out_ptr": (240, 4)},
        enums=("op",),
        shapes={"a_shape": 3, "b_shape": 2, "out_shape": 3},
    )
    spec.specific += [
        ("not-broadcastable", {"b_shape": [4, 2]}, Invalid),
        ("out-not-the-broadcast", {"out_shape": [3, 5, 1]}, Invalid),
        ("out-larger-than-broadcast", {"out_shape": [2, 3, 5, 4]}, Invalid),
        ("seven-dimensions", {"a_shape": [1] * 4 + [3, 1, 4], "out_shape": [1] * 4 + [3, 5, 4]}, Invalid),
        ("op-unknown", {"op": "atan2"}, Invalid),
        ("b-too-big", {"b_shape": [5, 4]}, Invalid),
        *dtype_mutations(),
    ]
    return spec


def _pool_spec(ws: Workspace, method: str) -> CallSpec:
    x_shape, y_shape = [2, 3, 6, 5], [2, 3, 3, 4]
    values: dict[str, Any] = {
        "op": "max",
        "input_ptr": f32_block(ws, 180, "input"),
        "input_shape": x_shape,
        "output_ptr": f32_block(ws, 72, "output"),
        "output_shape": y_shape,
        "kernel": [3, 2],
        "stride": [2, 1],
        "padding": [1, 0],
    }
    spec = CallSpec(
        method,
        ["op", "input_ptr", "input_shape", "output_ptr", "output_shape", "kernel", "stride", "padding"],
        values,
        kwargs={"dtype": "float32"},
        pointers={"input_ptr": (720, 4), "output_ptr": (288, 4)},
        enums=("op",),
        shapes={"input_shape": 4, "output_shape": 4, "kernel": 2, "stride": 2, "padding": 2},
    )
    spec.specific += [
        ("kernel-zero", {"kernel": [0, 2]}, Invalid),
        ("stride-zero", {"stride": [2, 0]}, Invalid),
        ("dilation-zero", {"dilation": [0, 1]}, Invalid),
        ("dilation-changes-output", {"dilation": [2, 1]}, Invalid),
        ("padding-three-entries", {"padding": [1, 0, 1]}, Invalid),
        ("padding4-changes-output", {"padding": [1, 0, 2, 0]}, Invalid),
        ("output-height-off-by-one", {"output_shape": [2, 3, 4, 4]}, Invalid),
        ("channels-mismatch", {"output_shape": [2, 2, 3, 4]}, Invalid),
        ("batch-mismatch", {"output_shape": [1, 3, 3, 4]}, Invalid),
        ("no-window-fits", {"kernel": [9, 9], "output_shape": [2, 3, 0, 0]}, Invalid),
        (
            "ceil-mode-changes-output",
            {"ceil_mode": True, "stride": [3, 1], "output_shape": [2, 3, 2, 4]},
            Invalid,
        ),
        ("ceil-mode-string", {"ceil_mode": "yes"}, Invalid),
        ("count-include-pad-none", {"count_include_pad": None}, Invalid),
        ("op-sum", {"op": "sum"}, Invalid),
        *dtype_mutations(),
    ]
    return spec


def _batch_norm_spec(ws: Workspace, method: str) -> CallSpec:
    shape = [2, 3, 4]
    names = ["input_ptr", "shape", "scale_ptr", "bias_ptr", "mean_ptr", "var_ptr", "output_ptr", "eps"]
    values: dict[str, Any] = {
        "input_ptr": f32_block(ws, 24, "input"),
        "shape": shape,
        "scale_ptr": f32_block(ws, 3, "scale"),
        "bias_ptr": f32_block(ws, 3, "bias"),
        "mean_ptr": f32_block(ws, 3, "mean"),
        "var_ptr": f32_block(ws, 3, "var"),
        "output_ptr": f32_block(ws, 24, "output"),
        "eps": 1e-5,
    }
    per_channel = {name: (12, 4) for name in ("scale_ptr", "bias_ptr", "mean_ptr", "var_ptr")}
    spec = CallSpec(
        method,
        names,
        values,
        kwargs={"dtype": "float32"},
        pointers={"input_ptr": (96, 4), "output_ptr": (96, 4), **per_channel},
        scalars=("eps",),
    )
    spec.specific += [
        ("shape-one-dimension", {"shape": [24]}, Invalid),
        ("shape-empty", {"shape": []}, Invalid),
        ("shape-too-big", {"shape": [2, 3, 5]}, Invalid),
        ("more-channels-than-parameters", {"shape": [2, 4, 3]}, Invalid),
        ("shape-negative", {"shape": [2, -3, 4]}, Invalid),
        ("shape-none", {"shape": None}, Invalid),
        ("eps-negative", {"eps": -1e-5}, Invalid),
        ("eps-nan", {"eps": float("nan")}, Invalid),
        ("eps-inf", {"eps": float("inf")}, Invalid),
        *dtype_mutations(),
    ]
    return spec


def _row_norm_spec(ws: Workspace, method: str) -> CallSpec:
    rows, cols = 4, 6
    spec = CallSpec(
        method,
        ["input_ptr", "output_ptr", "rows", "cols", "eps"],
        {
            "input_ptr": f32_block(ws, rows * cols, "input"),
            "output_ptr": f32_block(ws, rows * cols, "output"),
            "rows": rows,
            "cols": cols,
            "eps": 1e-5,
        },
        kwargs={
            "dtype": "float32",
            "scale_ptr": f32_block(ws, cols, "scale"),
            "bias_ptr": f32_block(ws, cols, "bias"),
        },
        pointers={"input_ptr": (96, 4), "output_ptr": (96, 4), "scale_ptr": (24, 4), "bias_ptr": (24, 4)},
        counts=("rows", "cols"),
        scalars=("eps",),
    )
    spec.specific += [
        ("cols-one-past-end", {"cols": cols + 1}, Invalid),
        ("rows-one-past-end", {"rows": rows + 1}, Invalid),
        ("eps-negative", {"eps": -1.0}, Invalid),
        ("eps-nan", {"eps": float("nan")}, Invalid),
        ("eps-inf", {"eps": float("inf")}, Invalid),
        *dtype_mutations(),
    ]
    return spec


def _lrn_spec(ws: Workspace, method: str) -> CallSpec:
    shape = [2, 5, 3]
    spec = CallSpec(
        method,
        ["input_ptr", "output_ptr", "shape", "size", "alpha", "beta", "bias"],
        {
            "input_ptr": f32_block(ws, 30, "input"),
            "output_ptr": f32_block(ws, 30, "output"),
            "shape": shape,
            "size": 3,
            "alpha": 1e-4,
            "beta": 0.75,
            "bias": 1.0,
        },
        kwargs={"dtype": "float32"},
        pointers={"input_ptr": (120, 4), "output_ptr": (120, 4)},
        scalars=("alpha", "beta", "bias"),
    )
    spec.specific += [
        ("size-zero", {"size": 0}, Invalid),
        ("size-negative", {"size": -3}, Invalid),
        ("size-float", {"size": 3.0}, Invalid),
        ("size-none", {"size": None}, Invalid),
        ("shape-one-dimension", {"shape": [30]}, Invalid),
        ("shape-too-big", {"shape": [2, 5, 4]}, Invalid),
        ("alpha-nan", {"alpha": float("nan")}, Invalid),
        ("beta-inf", {"beta": float("inf")}, Invalid),
        ("bias-nan", {"bias": float("nan")}, Invalid),
        *dtype_mutations(),
    ]
    return spec


EXTENSION_BUILDERS: dict[str, Callable[[Workspace, str], CallSpec]] = {
    "copy_dtod": _copy_dtod_spec,
    "fill": _fill_spec,
    "copy_strided": _copy_strided_spec,
    "cast": _cast_spec,
    "broadcast_binary": _broadcast_spec,
    "pool2d": _pool_spec,
    "batch_norm": _batch_norm_spec,
    "layer_norm": _row_norm_spec,
    "rms_norm": _row_norm_spec,
    "lrn": _lrn_spec,
}
