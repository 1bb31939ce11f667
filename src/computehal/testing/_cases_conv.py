"""Convolution value cases: forward and both gradients, groups, dilation, bias, 4-sided padding.

Every gradient is checked three ways: against the definition, against central finite
differences of ``<conv(x, f), g>`` (exact for a linear map, float64), and through the
adjoint identity with the backend's own forward pass. NaN cases check that padding is
never multiplied (a NaN filter tap reaches only the outputs whose tap lands inside the
input).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from . import reference as ref
from ._common import (
    DTYPES,
    EPS32,
    SHORT,
    Case,
    assert_close,
    call_or_refuse,
    dtype_cases,
    eps_of,
    rng_for,
    storage_tol,
    tiny_of,
)
from .reference import storage
from .workspace import Workspace

__all__ = ["conv_cases", "ConvConfig", "CONV_CONFIGS"]

F64 = np.dtype(np.float64)
Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ConvConfig:
    """One convolution problem: shapes, stride, padding (2 or 4 entries) and the extensions."""

    n: int
    c: int
    h: int
    w: int
    k: int
    fh: int
    fw: int
    stride: tuple[int, int]
    padding: tuple[int, ...]
    groups: int = 1
    dilation: tuple[int, int] = (1, 1)
    bias: bool = False
    dtype: str | None = None  # None: the call passes no dtype (the float32 default)

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.h, self.w)

    @property
    def f_shape(self) -> tuple[int, int, int, int]:
        return (self.k, self.c // self.groups, self.fh, self.fw)

    @property
    def y_shape(self) -> tuple[int, int, int, int]:
        return ref.conv2d_output_shape(self.x_shape, self.f_shape, self.stride, self.padding, self.dilation)

    @property
    def storage_dtype(self) -> str:
        return self.dtype or "float32"

    def keywords(self) -> dict[str, Any]:
        """The keyword arguments of the call: only those that differ from the seed's defaults."""
        kw: dict[str, Any] = {}
        if self.dtype is not None:
            kw["dtype"] = self.dtype
        if self.groups != 1:
            kw["groups"] = self.groups
        if self.dilation != (1, 1):
            kw["dilation"] = list(self.dilation)
        return kw

    def geometry(self) -> dict[str, Any]:
        """Keywords for the reference definitions."""
        return {"groups": self.groups, "dilation": self.dilation}

    @property
    def forward_reach(self) -> int:
        return (self.c // self.groups) * self.fh * self.fw + (1 if self.bias else 0)

    @property
    def data_reach(self) -> int:
        return (self.k // self.groups) * self.fh * self.fw

    @property
    def filter_reach(self) -> int:
        return self.n * self.y_shape[2] * self.y_shape[3]


CONV_CONFIGS: dict[str, ConvConfig] = {
    "3x3-s1-p1": ConvConfig(2, 3, 7, 9, 4, 3, 3, (1, 1), (1, 1)),
    "3x3-s2-p0": ConvConfig(1, 2, 8, 8, 3, 3, 3, (2, 2), (0, 0)),
    "rect-s2x1-p1x2": ConvConfig(2, 3, 9, 7, 2, 2, 3, (2, 1), (1, 2)),
    "1x1": ConvConfig(2, 4, 5, 6, 3, 1, 1, (1, 1), (0, 0)),
    "filter-covers-input": ConvConfig(1, 2, 3, 4, 2, 5, 4, (1, 1), (1, 0)),
    "stride-gt-filter": ConvConfig(1, 2, 10, 11, 2, 2, 2, (3, 4), (0, 1)),
    "5x5-s2-p2": ConvConfig(2, 3, 11, 10, 5, 5, 5, (2, 2), (2, 2)),
    "wide": ConvConfig(1, 8, 16, 20, 16, 3, 3, (1, 1), (1, 1)),
    # computehal extensions
    "groups2": ConvConfig(2, 4, 7, 6, 6, 3, 3, (1, 1), (1, 1), groups=2),
    "depthwise": ConvConfig(2, 5, 8, 7, 5, 3, 3, (1, 1), (1, 1), groups=5),
    "depthwise-x2-s2": ConvConfig(1, 3, 9, 8, 6, 3, 3, (2, 2), (1, 1), groups=3),
    "dilation2": ConvConfig(1, 3, 9, 10, 4, 3, 3, (1, 1), (2, 2), dilation=(2, 2)),
    "dilation3x2-rect": ConvConfig(2, 2, 11, 8, 3, 3, 2, (2, 1), (1, 0), dilation=(3, 2)),
    "pad4-asymmetric": ConvConfig(2, 3, 6, 7, 2, 3, 3, (1, 1), (0, 2, 1, 0)),
    "pad4-s2": ConvConfig(1, 2, 7, 9, 3, 3, 2, (2, 2), (2, 1, 0, 3)),
    "pad-beyond-filter": ConvConfig(1, 2, 4, 3, 2, 2, 2, (1, 2), (3, 1, 2, 3)),
    "bias": ConvConfig(2, 3, 6, 5, 4, 3, 3, (1, 1), (1, 1), bias=True),
    "all-extensions": ConvConfig(
        2, 4, 8, 9, 6, 3, 2, (1, 2), (1, 0, 2, 1), groups=2, dilation=(2, 1), bias=True
    ),
}
#: Configurations run in every dtype.
DTYPE_CONFIGS = ("3x3-s1-p1", "all-extensions")


def _data(label: str, cfg: ConvConfig) -> tuple[Array, Array, Array, Array]:
    """x, f, gy and bias, random and already rounded to the config's dtype."""
    rng = rng_for(label)
    shapes = (cfg.x_shape, cfg.f_shape, cfg.y_shape, (cfg.k,))
    x, f, gy, bias = (ref.round_to(rng.standard_normal(s), cfg.storage_dtype) for s in shapes)
    return x, f, gy, bias


def _finite_abs(a: Array) -> Array:
    """``|a|`` with NaN and infinities replaced by 0 (the magnitude of the finite terms)."""
    return np.abs(np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0))


def _tol(reach: int, magnitude: Array, want: Array, dtype: str) -> Array:
    return storage_tol(2.0 * (reach + 2) * eps_of(dtype) * magnitude + tiny_of(dtype), want, dtype)


def _forward_call(
    be: ComputeBackend, ws: Workspace, cfg: ConvConfig, x: Array, f: Array, bias: Array | None
) -> tuple[Callable[[], None], int]:
    dt = cfg.storage_dtype
    px, pf = ws.put(storage(x, dt), label="x"), ws.put(storage(f, dt), label="filter")
    py = ws.put(storage(np.full(cfg.y_shape, np.nan), dt), label="y")
    kw = cfg.keywords()
    if bias is not None:
        kw["bias_ptr"] = ws.put(storage(bias, dt), label="bias")

    def call() -> None:
        be.conv2d_forward(
            px, list(cfg.x_shape), pf, list(cfg.f_shape), py, list(cfg.y_shape), list(cfg.stride),
            list(cfg.padding), **kw,
        )  # fmt: skip

    return call, py


def _forward_run(be: ComputeBackend, ws: Workspace, cfg: ConvConfig, x: Array, f: Array) -> Array:
    """The backend's forward pass (no bias) of float32 data, for the adjoint identity."""
    plain = replace(cfg, bias=False)
    call, py = _forward_call(be, ws, plain, x, f, None)
    call()
    return ws.get(py, cfg.y_shape, plain.storage_dtype).astype(F64)


def _forward_value(be: ComputeBackend, *, name: str, cfg: ConvConfig, nan: bool = False) -> float:
    x, f, _, bias = _data(f"conv-{name}", cfg)
    if nan:
        x[0, 0, 1, 2], x[-1, -1, -1, -1], x[0, -1, 0, 0] = np.nan, np.inf, -np.inf
        f[0, 0, 0, 0], f[-1, -1, -1, -1] = np.nan, -np.inf
    with Workspace(be) as ws:
        call, py = _forward_call(be, ws, cfg, x, f, bias if cfg.bias else None)
        if not call_or_refuse(be, ws, "conv2d_forward", cfg.storage_dtype, call):
            return 0.0
        got = ws.get(py, cfg.y_shape, cfg.storage_dtype)
        ws.check_unchanged(("x", "filter", "bias"))
    b = bias if cfg.bias else None
    want = ref.conv2d_forward(x, f, cfg.stride, cfg.padding, bias=b, **cfg.geometry())
    with np.errstate(invalid="ignore"):
        mag = ref.conv2d_forward(
            _finite_abs(x), _finite_abs(f), cfg.stride, cfg.padding,
            bias=None if b is None else np.abs(b), **cfg.geometry(),
        )  # fmt: skip
    tol = _tol(cfg.forward_reach, mag, want, cfg.storage_dtype)
    return assert_close("conv2d_forward: y", got, want, tol, dtype=cfg.storage_dtype)


def _finite_difference(
    loss: Callable[[Array], float], at: Array, picks: npt.NDArray[np.intp], h: float = 0.5
) -> Array:
    """Central differences of ``loss`` at the flat positions ``picks`` (float64)."""
    grads = np.empty(picks.size)
    for i, flat in enumerate(picks):
        plus, minus = at.copy(), at.copy()
        plus.reshape(-1)[flat] += h
        minus.reshape(-1)[flat] -= h
        grads[i] = (loss(plus) - loss(minus)) / (2 * h)
    return grads


def _check_finite_differences(
    op: str, grad: Array, loss: Callable[[Array], float], at: Array, picks: Any, tol: Array
) -> float:
    """Compare the backend's gradient at ``picks`` with central differences of ``loss``."""
    fd = _finite_difference(loss, at, picks)
    return assert_close(
        f"{op} vs finite differences", grad.reshape(-1)[picks], fd, tol.reshape(-1)[picks] + 1e-9
    )


def _check_adjoint(rhs_text: str, y: Array, gy: Array, primal: Array, gradient: Array, bound: float) -> None:
    """Assert ``<conv(...), gy> == <primal, gradient>`` (both sides computed by the backend)."""
    lhs = float(np.sum(y * gy))
    rhs = float(np.sum(primal * gradient))
    if not abs(lhs - rhs) <= bound:
        raise AssertionError(
            f"adjoint identity: <conv, g> = {lhs!r} but {rhs_text} = {rhs!r} "
            f"(difference {abs(lhs - rhs):.3g} > {bound:.3g})"
        )


def _adjoint_bound(cfg: ConvConfig, x: Array, f: Array, gy: Array, reach: int) -> float:
    mag = ref.conv2d_forward(np.abs(x), np.abs(f), cfg.stride, cfg.padding, **cfg.geometry())
    return 4.0 * (cfg.forward_reach + reach + 4) * EPS32 * float(np.sum(mag * np.abs(gy)))


@dataclass(frozen=True)
class _Gradient:
    """One backward direction: the method, the tensor it differentiates by, and its names."""

    op: str
    wrt: str  # "x" (backward data) or "f" (backward filter)
    inputs: tuple[str, str]  # labels of the two inputs, in call order
    result: str
    fd_label: str  # prefix of the seed of the finite-difference picks
    adjoint: str  # the right-hand side of the adjoint identity, for messages


_DATA = _Gradient(
    "conv2d_backward_data", "x", ("grad_output", "filter"), "grad_input", "fd", "<x, backward_data(g)>"
)
_FILTER = _Gradient(
    "conv2d_backward_filter", "f", ("x", "grad_output"), "grad_filter", "fdf", "<f, backward_filter(x, g)>"
)


def _backward_value(
    be: ComputeBackend, d: _Gradient, name: str, cfg: ConvConfig, x: Array, f: Array, gy: Array, nan: bool
) -> float:
    """Run ``d.op`` on (x, f, gy) and check it against the reference, finite differences and the adjoint."""
    by_data = d.wrt == "x"
    primal = x if by_data else f
    a, b = (gy, f) if by_data else (x, gy)
    a_shape, b_shape = (cfg.y_shape, cfg.f_shape) if by_data else (cfg.x_shape, cfg.y_shape)
    out_shape = cfg.x_shape if by_data else cfg.f_shape
    reference = ref.conv2d_backward_data if by_data else ref.conv2d_backward_filter
    reach = cfg.data_reach if by_data else cfg.filter_reach
    dt = cfg.storage_dtype
    with Workspace(be) as ws:
        pa, pb = ws.put(storage(a, dt), label=d.inputs[0]), ws.put(storage(b, dt), label=d.inputs[1])
        pout = ws.put(storage(np.full(out_shape, np.nan), dt), label=d.result)

        def call() -> None:
            getattr(be, d.op)(
                pa, list(a_shape), pb, list(b_shape), pout, list(out_shape), list(cfg.stride),
                list(cfg.padding), **cfg.keywords(),
            )  # fmt: skip

        if not call_or_refuse(be, ws, d.op, dt, call):
            return 0.0
        grad = ws.get(pout, out_shape, dt).astype(F64)
        ws.check_unchanged(d.inputs)
        y = _forward_run(be, ws, cfg, x, f) if not nan and dt == "float32" else None
    want = reference(a, b, out_shape, cfg.stride, cfg.padding, **cfg.geometry())
    with np.errstate(invalid="ignore"):
        mag = reference(_finite_abs(a), _finite_abs(b), out_shape, cfg.stride, cfg.padding, **cfg.geometry())
    tol = _tol(reach, mag, want, dt)
    worst = assert_close(f"{d.op}: {d.result}", grad, want, tol, dtype=dt)
    if y is not None:
        picks = rng_for(f"{d.fd_label}-{name}").permutation(primal.size)[:96]

        def loss(p: Array) -> float:
            xx, ff = (p, f) if by_data else (x, p)
            return float(np.sum(ref.conv2d_forward(xx, ff, cfg.stride, cfg.padding, **cfg.geometry()) * gy))

        worst = max(worst, _check_finite_differences(d.op, grad, loss, primal, picks, tol))
        _check_adjoint(d.adjoint, y, gy, primal, grad, _adjoint_bound(cfg, x, f, gy, reach))
    return worst


def _data_value(be: ComputeBackend, *, name: str, cfg: ConvConfig, nan: bool = False) -> float:
    x, f, gy, _ = _data(f"convbd-{name}", cfg)
    if nan:
        f[0, 0, 0, 0] = np.nan
        if not name.startswith("nan-tap"):  # that case has exactly one NaN, in the filter
            gy[0, 0, 0, -1], gy[-1, -1, -1, 0] = np.inf, np.nan
    return _backward_value(be, _DATA, name, cfg, x, f, gy, nan)


def _filter_value(be: ComputeBackend, *, name: str, cfg: ConvConfig, nan: bool = False) -> float:
    x, f, gy, _ = _data(f"convbf-{name}", cfg)
    if nan:
        x[0, 0, 0, 0], x[-1, -1, 2, 1], gy[0, -1, -1, -1] = np.nan, -np.inf, np.inf
    return _backward_value(be, _FILTER, name, cfg, x, f, gy, nan)


_RUNNERS: dict[str, Callable[..., float]] = {
    "conv2d_forward": _forward_value,
    "conv2d_backward_data": _data_value,
    "conv2d_backward_filter": _filter_value,
}
#: The NaN cases: one NaN filter tap at the corner, next to the padding (so padding
#: positions must not be multiplied), and NaN / infinities in the data.
NAN_CONFIGS: dict[str, ConvConfig] = {
    "nan-inf": ConvConfig(2, 3, 6, 7, 4, 3, 3, (1, 1), (1, 1)),
    "nan-inf-extensions": ConvConfig(1, 4, 7, 6, 4, 2, 3, (2, 1), (1, 2, 0, 1), groups=2, dilation=(2, 1)),
    # The report that one NaN tap spread over the whole gradient: 1x1x2x2 filter, 3x3 input.
    "nan-tap-2x2": ConvConfig(1, 1, 3, 3, 1, 2, 2, (1, 1), (0, 0)),
}


def conv_cases() -> list[Case]:
    """Every convolution value case, grouped by direction."""
    cases: list[Case] = []
    for op, runner in _RUNNERS.items():
        for name, cfg in CONV_CONFIGS.items():
            cases.append(Case(op, name, functools.partial(runner, name=name, cfg=cfg)))
        for name in DTYPE_CONFIGS:
            cases += dtype_cases(op, name, runner, CONV_CONFIGS[name], name=name)
        for name, cfg in NAN_CONFIGS.items():
            for dt in DTYPES:
                typed = replace(cfg, dtype=dt)
                label = f"{name}-{SHORT[dt]}"
                cases.append(Case(op, label, functools.partial(runner, name=label, cfg=typed, nan=True)))
    return cases
