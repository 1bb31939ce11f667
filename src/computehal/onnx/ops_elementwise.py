"""Lowerings of element-wise nodes: arithmetic with broadcasting, activations, Clip, Cast."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._ir import is_float
from ._lowering import MAX_DIMS, Lowerer, Unmappable, lowers
from ._tensors import DeviceTensor

__all__ = ["emit_binary", "operand"]

_BINARY = {
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Div": "div",
    "Pow": "pow",
    "Max": "max",
    "Min": "min",
    "Sum": "add",
}

_UNARY = {
    "Relu": "relu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Abs": "abs",
    "Neg": "neg",
    "Erf": "erf",
    "Reciprocal": "reciprocal",
    "Sin": "sin",
    "Cos": "cos",
}


def broadcast_call_shapes(
    a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The shortest shapes with the same broadcast: unit dimensions dropped, alike neighbours merged."""
    rank = len(out)
    pa = (1,) * (rank - len(a)) + a
    pb = (1,) * (rank - len(b)) + b
    groups: list[list[int]] = []  # [extent, a_full, b_full]
    for ea, eb, eo in zip(pa, pb, out, strict=True):
        if eo == 1:
            continue
        flags = [eo, int(ea == eo), int(eb == eo)]
        if groups and groups[-1][1:] == flags[1:]:
            groups[-1][0] *= eo
        else:
            groups.append(flags)
    if not groups:
        return (1,), (1,), (1,)
    so = tuple(g[0] for g in groups)
    sa = tuple(g[0] if g[1] else 1 for g in groups)
    sb = tuple(g[0] if g[2] else 1 for g in groups)
    return sa, sb, so


def emit_binary(lw: Lowerer, op: str, a: DeviceTensor, b: DeviceTensor, out: DeviceTensor) -> None:
    """``out = op(a, b)`` with broadcasting: ``binary`` when the shapes agree, else ``broadcast_binary``."""
    if out.size == 0:
        return
    sa, sb, so = broadcast_call_shapes(a.shape, b.shape, out.shape)
    if sa == so and sb == so:
        lw.call("binary", op, a, b, out, out.size, dtype=out.dt)
        return
    if len(so) > MAX_DIMS:
        raise Unmappable(f"broadcasting over {len(so)} independent dimensions (at most {MAX_DIMS})")
    lw.call("broadcast_binary", op, a.view(sa), sa, b.view(sb), sb, out.view(so), so, dtype=out.dt)


def operand(lw: Lowerer, i: int, dtype: np.dtype[Any]) -> DeviceTensor:
    """Input ``i`` as a device tensor of ``dtype`` (constants converted on the host, others cast)."""
    value = lw.const(i)
    if value is not None:
        if value.dtype == dtype:
            return lw.tensor(i)
        return lw.weight(value.astype(dtype), f"input{i}", key=f"{lw.node.inputs[i]}:{dtype.name}")
    src_dtype = lw.dtype(i)
    if is_float(src_dtype):
        src = lw.tensor(i)
        if src_dtype == dtype:
            return src
        tmp = lw.scratch(src.shape, dtype, f"cast{i}")
        lw.call("cast", src, tmp, src.size, dtype=src.dt, out_dtype=dtype.name)
        return tmp
    # An integer tensor known on the host at run time: converted as it is uploaded.
    tmp = lw.scratch(lw.shape(i), dtype, f"upload{i}")
    lw.upload(
        tmp, lw.host_arg(lambda v: np.asarray(v, dtype=dtype), i, label=f"{src_dtype.name}->{dtype.name}")
    )
    return tmp


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*shapes))


@lowers(*_BINARY)
def binary(lw: Lowerer) -> None:
    op = _BINARY[lw.node.op]
    inputs = [i for i in range(len(lw.node.inputs)) if lw.has(i)]
    dtype = lw.out_dtype()
    if len(inputs) == 1:
        lw.alias(0, operand(lw, inputs[0], dtype))
        return
    operands = [operand(lw, i, dtype) for i in inputs]
    y = lw.output(0)
    acc = operands[0]
    shape = acc.shape
    for k, b in enumerate(operands[1:], start=1):
        shape = _broadcast(shape, b.shape)
        last = k == len(operands) - 1
        target = y if last or shape == y.shape else lw.scratch(shape, dtype, f"partial{k}")
        emit_binary(lw, op, acc, b, target)
        acc = target


@lowers(*_UNARY, "LeakyRelu", "Gelu")
def unary(lw: Lowerer) -> None:
    node = lw.node
    kwargs: dict[str, Any] = {}
    if node.op == "LeakyRelu":
        op = "leaky_relu"
        kwargs["alpha"] = float(lw.attr("alpha", 0.01))
    elif node.op == "Gelu":
        approximate = lw.attr("approximate", "none")
        if approximate not in ("none", "tanh"):
            raise Unmappable(f"Gelu approximate={approximate!r}")
        op = "gelu_tanh" if approximate == "tanh" else "gelu"
    else:
        op = _UNARY[node.op]
    x = lw.tensor(0)
    y = lw.output(0)
    if y.size:
        lw.call("unary", op, x, y, y.size, dtype=y.dt, **kwargs)


def _scalar(value: Any) -> float:
    array = np.asarray(value)
    if array.size != 1:
        raise Unmappable("Clip bounds must be scalars")
    return float(array.reshape(-1)[0])


@lowers("Clip")
def clip(lw: Lowerer) -> None:
    kwargs: dict[str, Any] = {}
    if lw.opset < 11:
        if "min" in lw.node.attrs:
            kwargs["lo"] = float(lw.attr("min"))
        if "max" in lw.node.attrs:
            kwargs["hi"] = float(lw.attr("max"))
    else:
        for i, key in ((1, "lo"), (2, "hi")):
            if lw.has(i):
                value = lw.host_arg(_scalar, i, label=f"Clip {key}")
                kwargs[key] = value
    x = lw.tensor(0)
    y = lw.output(0)
    if y.size:
        lw.call("unary", "clip", x, y, y.size, dtype=y.dt, **kwargs)


@lowers("Cast", "CastLike")
def cast(lw: Lowerer) -> None:
    target = lw.out_dtype()
    source = lw.dtype(0)
    if not is_float(target):
        raise Unmappable(f"Cast to {target.name} on the device")
    if is_float(source):
        x = lw.tensor(0)
        if source == target:
            lw.alias(0, x)
            return
        y = lw.output(0)
        if y.size:
            lw.call("cast", x, y, y.size, dtype=x.dt, out_dtype=target.name)
        return
    # An integer (or bool) tensor known on the host: converted as it is uploaded (a border).
    y = lw.output(0)
    if y.size:
        lw.upload(
            y,
            lw.host_arg(lambda v: np.asarray(v, dtype=target), 0, label=f"{source.name}->{target.name}"),
        )
