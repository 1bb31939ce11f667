"""Reduction and softmax value cases (log-softmax included), in every dtype."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from . import reference as ref
from ._common import (
    DTYPES,
    SHORT,
    Case,
    assert_close,
    call_or_refuse,
    eps_of,
    rng_for,
    storage_tol,
    tiny_of,
    value_case,
)
from .reference import storage
from .workspace import Workspace

__all__ = ["axis_cases", "special_tensor"]

F64 = np.dtype(np.float64)


def _dtype_kw(dtype: str | None) -> dict[str, Any]:
    return {} if dtype is None else {"dtype": dtype}


def special_tensor(label: str, shape: tuple[int, ...], axis: int) -> npt.NDArray[np.float64]:
    """Random data with NaN, +-inf, all-NaN and all-(-inf) slices along ``axis``."""
    rng = rng_for(label)
    x = rng.standard_normal(shape)
    flat = x.reshape(-1)
    picks = rng.permutation(flat.size)
    specials = [np.nan, np.inf, -np.inf, np.nan, -np.inf]
    for i, value in enumerate(specials):
        if i < flat.size:
            flat[picks[i]] = value
    moved = np.moveaxis(x, axis, -1)
    if moved.shape[-1] and moved.size // moved.shape[-1] >= 4:
        index = np.unravel_index(0, moved.shape[:-1])
        moved[index] = np.nan
        index = np.unravel_index(1, moved.shape[:-1])
        moved[index] = -np.inf
        index = np.unravel_index(2, moved.shape[:-1])
        moved[index] = np.where(np.arange(moved.shape[-1]) % 2, np.nan, -np.inf)
        index = np.unravel_index(3, moved.shape[:-1])
        moved[index] = np.where(np.arange(moved.shape[-1]) % 2, np.inf, -np.inf)
    return x


def _reduce_value(
    be: ComputeBackend,
    *,
    label: str,
    op: str,
    shape: tuple[int, ...],
    axis: int,
    special: bool = False,
    dtype: str | None = None,
) -> float:
    dt = dtype or "float32"
    x = special_tensor(label, shape, axis) if special else rng_for(label).standard_normal(shape)
    x = ref.round_to(x, dt)
    out_shape = shape[:axis] + shape[axis + 1 :]
    with Workspace(be) as ws:
        px = ws.put(storage(x, dt), label="input")
        po = ws.put(storage(np.full(out_shape, np.nan), dt), label="output")
        if not call_or_refuse(
            be, ws, "reduce", dt, lambda: be.reduce(op, px, po, list(shape), axis, **_dtype_kw(dtype))
        ):
            return 0.0
        got = ws.get(po, out_shape, dt)
        ws.check_unchanged(("input",))
    want = ref.reduce(op.lower(), x, axis)
    length, eps = shape[axis], eps_of(dt)
    if op.lower() in ("sum", "mean"):
        with np.errstate(invalid="ignore"):
            mag = ref.reduce("sum", np.abs(np.nan_to_num(x, posinf=0.0, neginf=0.0)), axis)
        tol = 2.0 * (length + 2) * eps * mag
        if op.lower() == "mean" and length:
            tol = tol / length + 2 * eps * np.abs(np.nan_to_num(want))
        tol = storage_tol(tol + tiny_of(dt), want, dt)
    else:
        tol = np.zeros(out_shape)
    return assert_close(f"reduce({op}, axis={axis}): output", got, want, tol, dtype=dt)


#: The reductions, in case order.
_REDUCE_OPS = ("sum", "max", "min", "mean")


def _reduce_cases() -> list[Case]:
    def case(name: str, label: str, op: str, shape: tuple[int, ...], axis: int, **keywords: Any) -> Case:
        return value_case(
            "reduce", name, _reduce_value, label=label, op=op, shape=shape, axis=axis, **keywords
        )

    cases: list[Case] = []
    for op in _REDUCE_OPS:
        cases += [case(f"{op}-axis{axis}", f"red-{op}-{axis}", op, (4, 5, 6), axis) for axis in range(3)]
        cases += [
            case(f"{op}-nan-inf", f"red-{op}-sp", op, (6, 7, 3), 1, special=True),
            case(f"{op}-empty-axis", f"red-{op}-e", op, (3, 0, 2), 1),
            case(f"{op}-1d-long", f"red-{op}-1d", op, (5003,), 0),
            case(f"{op}-wide", f"red-{op}-w", op, (70, 1031), 0),
        ]
    cases.append(case("sum-empty-output", "red-eo", "sum", (0, 5), 1))
    cases.append(case("MAX-uppercase", "red-up", "MAX", (3, 4), 1))
    for dt in DTYPES:
        cases += [
            case(f"{op}-{SHORT[dt]}", f"red-{op}-dt", op, (5, 37, 3), 1, dtype=dt) for op in _REDUCE_OPS
        ]
        cases.append(case(f"nan-inf-{SHORT[dt]}", "red-sp-dt", "sum", (6, 7, 3), 1, special=True, dtype=dt))
        cases.append(case(f"max-nan-inf-{SHORT[dt]}", "red-spm-dt", "max", (4, 9), 1, special=True, dtype=dt))
    return cases


def _softmax_value(
    be: ComputeBackend,
    *,
    label: str,
    shape: tuple[int, ...],
    axis: int,
    special: bool = False,
    in_place: bool = False,
    magnitude: float = 1.0,
    log: bool = False,
    dtype: str | None = None,
) -> float:
    dt = dtype or "float32"
    if special:
        x = special_tensor(label, shape, axis)
    else:
        x = rng_for(label).standard_normal(shape) * magnitude
    x = ref.round_to(x, dt)
    kw = _dtype_kw(dtype)
    if log:
        kw["log"] = True
    with Workspace(be) as ws:
        px = ws.put(storage(x, dt), label="input")
        po = px if in_place else ws.put(storage(np.full(shape, np.nan), dt), label="output")
        if not call_or_refuse(be, ws, "softmax", dt, lambda: be.softmax(px, po, list(shape), axis, **kw)):
            return 0.0
        got = ws.get(po, shape, dt)
        if not in_place:
            ws.check_unchanged(("input",))
    want = ref.softmax(x, axis, log=log)
    length, eps = shape[axis], eps_of(dt)
    with np.errstate(invalid="ignore"):
        peak = np.nan_to_num(
            np.fmax.reduce(x, axis=axis, keepdims=True, initial=-np.inf), neginf=0.0, posinf=0.0
        )
        spread = np.abs(np.nan_to_num(x, posinf=0.0, neginf=0.0) - peak)
    magnitude_of = np.abs(np.nan_to_num(want, posinf=0.0, neginf=0.0))
    if log:  # absolute error of x - max - log(sum(exp(x - max)))
        tol = eps * (16 + 4 * length + 4 * spread + 4 * magnitude_of) + tiny_of(dt)
    else:
        tol = eps * (16 + 4 * length + 4 * spread) * magnitude_of + tiny_of(dt)
    what = f"{'log_' if log else ''}softmax(axis={axis}): output"
    return assert_close(what, got, want, storage_tol(tol, want, dt), dtype=dt)


def _softmax_cases() -> list[Case]:
    configs: list[tuple[str, dict[str, Any]]] = [
        ("axis0", dict(shape=(4, 5, 6), axis=0)),
        ("axis1", dict(shape=(4, 5, 6), axis=1)),
        ("axis2", dict(shape=(4, 5, 6), axis=2)),
        ("long-rows", dict(shape=(7, 1000), axis=1)),
        ("long-columns", dict(shape=(1000, 7), axis=0)),
        ("large-values", dict(shape=(5, 9), axis=1, magnitude=400.0)),
        ("nan-inf", dict(shape=(6, 7, 3), axis=1, special=True)),
        ("nan-inf-last-axis", dict(shape=(8, 5), axis=1, special=True)),
        ("in-place", dict(shape=(6, 33), axis=1, in_place=True)),
        ("in-place-axis0", dict(shape=(33, 6), axis=0, in_place=True)),
        ("length-1", dict(shape=(5, 1), axis=1)),
        ("empty-axis", dict(shape=(3, 0), axis=1)),
        ("log-axis1", dict(shape=(4, 5, 6), axis=1, log=True)),
        ("log-axis2", dict(shape=(4, 5, 6), axis=2, log=True)),
        ("log-long-rows", dict(shape=(5, 1000), axis=1, log=True)),
        ("log-large-values", dict(shape=(5, 9), axis=1, magnitude=400.0, log=True)),
        ("log-in-place", dict(shape=(6, 33), axis=1, in_place=True, log=True)),
        ("log-length-1", dict(shape=(5, 1), axis=1, log=True)),
    ]
    for dt in DTYPES:
        for log in (False, True):
            prefix = "log-" if log else ""
            configs.append((f"{prefix}{SHORT[dt]}", dict(shape=(6, 19), axis=1, log=log, dtype=dt)))
            configs.append(
                (
                    f"{prefix}nan-inf-{SHORT[dt]}",
                    dict(shape=(6, 7, 3), axis=1, special=True, log=log, dtype=dt),
                )
            )
    return [
        value_case("softmax", name, _softmax_value, label=f"sm-{name}", **kwargs) for name, kwargs in configs
    ]


def axis_cases() -> list[Case]:
    """Every reduce and softmax value case."""
    return _reduce_cases() + _softmax_cases()
