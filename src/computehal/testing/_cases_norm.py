"""Normalisation value cases: layer norm, RMS norm, inference batch norm and LRN, in every dtype.

Tolerances follow the arithmetic of the definitions: a row of ``cols`` values is summed
(``~(cols + 4) eps`` relative error in the mean, the variance and so the standard
deviation ``s``), and ``x - mean`` loses ``eps * max|x| / s`` to cancellation; the
squared term allows a one-pass variance (``E[x^2] - mean^2``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from . import reference as ref
from ._common import DTYPES, SHORT, Case, assert_close, call_or_refuse, eps_of, rng_for, storage_tol, tiny_of
from .reference import storage
from .workspace import Workspace

__all__ = ["norm_cases"]

Array = npt.NDArray[np.float64]


def _finite(a: Array) -> Array:
    return np.abs(np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0))


def _rounded(rng: np.random.Generator, shape: Any, dt: str, scale: float = 1.0, shift: float = 0.0) -> Array:
    return ref.round_to(rng.standard_normal(shape) * scale + shift, dt)


# --------------------------------------------------------------------------- layer / RMS norm


@dataclass(frozen=True)
class RowNorm:
    """A layer_norm / rms_norm problem."""

    rows: int
    cols: int
    eps: float = 1e-5
    scale: bool = True
    bias: bool = True
    shift: float = 0.0  # added to the data (a large mean makes x - mean cancel)
    in_place: bool = False
    dtype: str = "float32"


ROW_CONFIGS: dict[str, RowNorm] = {
    "affine": RowNorm(7, 33),
    "plain": RowNorm(5, 17, scale=False, bias=False),
    "scale-only": RowNorm(4, 9, bias=False),
    "bias-only": RowNorm(4, 9, scale=False),
    "eps0": RowNorm(6, 10, eps=0.0),
    "eps-large": RowNorm(3, 8, eps=4.0),
    "one-column": RowNorm(5, 1),
    "long-rows": RowNorm(3, 4099),
    "many-rows": RowNorm(513, 7),
    "offset-mean": RowNorm(6, 64, shift=50.0),
    "in-place": RowNorm(5, 31, in_place=True),
    "rows0": RowNorm(0, 8),
}


def _row_norm_value(be: ComputeBackend, *, op: str, label: str, cfg: RowNorm, nan: bool = False) -> float:
    dt, rng = cfg.dtype, rng_for(label)
    x = _rounded(rng, (cfg.rows, cfg.cols), dt, 2.0, cfg.shift)
    scale = _rounded(rng, cfg.cols, dt) if cfg.scale else None
    bias = _rounded(rng, cfg.cols, dt) if cfg.bias else None
    if nan:
        x[0, 2], x[1, 0], x[2, 3] = np.nan, np.inf, -np.inf
        if scale is not None:
            scale[3] = np.nan
        if bias is not None:
            bias[5] = np.inf
    with Workspace(be) as ws:
        px = ws.put(storage(x, dt), label="input")
        po = px if cfg.in_place else ws.put(storage(np.full(x.shape, np.nan), dt), label="output")
        kw: dict[str, Any] = {"dtype": dt}
        if scale is not None:
            kw["scale_ptr"] = ws.put(storage(scale, dt), label="scale")
        if bias is not None:
            kw["bias_ptr"] = ws.put(storage(bias, dt), label="bias")

        def call() -> None:
            getattr(be, op)(px, po, cfg.rows, cfg.cols, cfg.eps, **kw)

        if not call_or_refuse(be, ws, op, dt, call):
            return 0.0
        got = ws.get(po, x.shape, dt)
        ws.check_unchanged(("scale", "bias") if cfg.in_place else ("input", "scale", "bias"))
    definition = ref.layer_norm if op == "layer_norm" else ref.rms_norm
    want = definition(x, cfg.eps, scale=scale, bias=bias)
    if x.size == 0:
        return 0.0
    eps = eps_of(dt)
    xf = _finite(x)
    with np.errstate(all="ignore"):
        if op == "layer_norm":
            centred = xf - xf.mean(axis=1, keepdims=True)
            sigma = np.sqrt((centred * centred).mean(axis=1, keepdims=True) + cfg.eps)
            ratio = np.nan_to_num(xf.max(axis=1, keepdims=True) / sigma, nan=0.0, posinf=1e30)
            y_hat = np.abs(centred) / np.where(sigma > 0, sigma, 1.0)
            rel = 4.0 * (cfg.cols + 4) * eps * (ratio + ratio * ratio) * (1.0 + y_hat)
        else:
            sigma = np.sqrt((xf * xf).mean(axis=1, keepdims=True) + cfg.eps)
            y_hat = xf / np.where(sigma > 0, sigma, 1.0)
            rel = 4.0 * (cfg.cols + 4) * eps * (1.0 + y_hat)
    s = np.ones(cfg.cols) if scale is None else _finite(scale)
    b = np.zeros(cfg.cols) if bias is None else _finite(bias)
    tol = rel * s[None, :] + 4 * eps * (b[None, :] + _finite(want)) + tiny_of(dt)
    return assert_close(f"{op}: output", got, want, storage_tol(tol, want, dt), dtype=dt)


# --------------------------------------------------------------------------- batch norm


def _batch_norm_value(
    be: ComputeBackend, *, label: str, shape: tuple[int, ...], dtype: str = "float32", nan: bool = False,
    in_place: bool = False,
) -> float:  # fmt: skip
    rng, dt, eps_arg = rng_for(label), dtype, 1e-3
    c = shape[1]
    x = _rounded(rng, shape, dt, 2.0, 0.5)
    scale, bias, mean = (_rounded(rng, c, dt) for _ in range(3))
    var = ref.round_to(rng.uniform(0.25, 3.0, c), dt)
    if nan:
        x.reshape(-1)[[0, 5]] = [np.nan, np.inf]
        mean[1], var[2 % c], scale[-1] = np.nan, -4.0, np.inf
    with Workspace(be) as ws:
        px = ws.put(storage(x, dt), label="input")
        params = [
            ws.put(storage(t, dt), label=n)
            for t, n in ((scale, "scale"), (bias, "bias"), (mean, "mean"), (var, "var"))
        ]
        po = px if in_place else ws.put(storage(np.full(shape, np.nan), dt), label="output")

        def call() -> None:
            be.batch_norm(px, list(shape), params[0], params[1], params[2], params[3], po, eps_arg, dtype=dt)

        if not call_or_refuse(be, ws, "batch_norm", dt, call):
            return 0.0
        got = ws.get(po, shape, dt)
        ws.check_unchanged(("scale", "bias", "mean", "var") + (() if in_place else ("input",)))
    want = ref.batch_norm(x, scale, bias, mean, var, eps_arg)
    eps = eps_of(dt)
    per = [_finite(t).reshape((1, c) + (1,) * (len(shape) - 2)) for t in (scale, bias, mean, var)]
    sigma = np.sqrt(per[3] + eps_arg)
    tol = 8 * eps * ((_finite(x) + per[2]) / sigma * per[0] + per[1] + _finite(want)) + tiny_of(dt)
    return assert_close("batch_norm: output", got, want, storage_tol(tol, want, dt), dtype=dt)


# --------------------------------------------------------------------------- LRN


def _lrn_value(
    be: ComputeBackend, *, label: str, shape: tuple[int, ...], size: int, alpha: float = 0.5,
    beta: float = 0.75, bias: float = 1.0, dtype: str = "float32", nan: bool = False,
) -> float:  # fmt: skip
    dt = dtype
    x = _rounded(rng_for(label), shape, dt, 1.5)
    if nan:
        flat = x.reshape(shape[0], shape[1], -1)
        flat[0, 1, 0], flat[-1, -1, -1], flat[0, 0, -1] = np.nan, np.inf, -np.inf
    with Workspace(be) as ws:
        px = ws.put(storage(x, dt), label="input")
        po = ws.put(storage(np.full(shape, np.nan), dt), label="output")

        def call() -> None:
            be.lrn(px, po, list(shape), size, alpha, beta, bias, dtype=dt)

        if not call_or_refuse(be, ws, "lrn", dt, call):
            return 0.0
        got = ws.get(po, shape, dt)
        ws.check_unchanged(("input",))
    want = ref.lrn(x, size, alpha, beta, bias)
    tol = (32 + 4 * abs(beta) * (size + 4)) * eps_of(dt) * _finite(want) + tiny_of(dt)
    return assert_close("lrn: output", got, want, storage_tol(tol, want, dt), dtype=dt)


LRN_CONFIGS: dict[str, dict[str, Any]] = {
    "size5": dict(shape=(2, 7, 3, 4), size=5),
    "size4-even": dict(shape=(1, 6, 5, 2), size=4),
    "size1": dict(shape=(2, 3, 4, 4), size=1),
    "size-beyond-channels": dict(shape=(1, 3, 4, 3), size=9),
    "onnx-defaults": dict(shape=(2, 5, 6, 6), size=3, alpha=1e-4, beta=0.75, bias=1.0),
    "2d": dict(shape=(3, 6), size=3),
    "5d": dict(shape=(1, 4, 2, 3, 2), size=3, bias=2.0),
    "many-channels": dict(shape=(1, 64, 5, 5), size=5),
}
BATCH_NORM_SHAPES: dict[str, tuple[int, ...]] = {
    "nchw": (2, 3, 5, 4),
    "nc": (4, 6),
    "ncd": (2, 3, 7),
    "ncdhw": (1, 2, 3, 4, 5),
    "wide-spatial": (1, 2, 40, 41),
    "n0": (0, 3, 4),
}


def norm_cases() -> list[Case]:
    """Every layer_norm, rms_norm, batch_norm and lrn value case."""
    cases: list[Case] = []
    for op in ("layer_norm", "rms_norm"):
        for name, cfg in ROW_CONFIGS.items():
            cases.append(
                Case(op, name, functools.partial(_row_norm_value, op=op, label=f"{op}-{name}", cfg=cfg))
            )
        for dt in DTYPES:
            typed = replace(ROW_CONFIGS["affine"], dtype=dt)
            cases.append(Case(op, SHORT[dt], functools.partial(_row_norm_value, op=op, label=op, cfg=typed)))
            cases.append(
                Case(
                    op,
                    f"nan-inf-{SHORT[dt]}",
                    functools.partial(_row_norm_value, op=op, label=op, cfg=typed, nan=True),
                )
            )
    for name, shape in BATCH_NORM_SHAPES.items():
        cases.append(
            Case("batch_norm", name, functools.partial(_batch_norm_value, label=f"bn-{name}", shape=shape))
        )
    cases.append(
        Case(
            "batch_norm",
            "in-place",
            functools.partial(_batch_norm_value, label="bn-ip", shape=(2, 3, 4), in_place=True),
        )
    )
    for dt in DTYPES:
        run = functools.partial(_batch_norm_value, label="bn-dt", shape=(2, 3, 5, 4), dtype=dt)
        cases.append(Case("batch_norm", SHORT[dt], run))
        cases.append(Case("batch_norm", f"nan-inf-{SHORT[dt]}", functools.partial(run, nan=True)))
    for name, kw in LRN_CONFIGS.items():
        cases.append(Case("lrn", name, functools.partial(_lrn_value, label=f"lrn-{name}", **kw)))
    for dt in DTYPES:
        run = functools.partial(_lrn_value, label="lrn-dt", shape=(2, 6, 3, 3), size=3, dtype=dt)
        cases.append(Case("lrn", SHORT[dt], run))
        cases.append(Case("lrn", f"nan-inf-{SHORT[dt]}", functools.partial(run, nan=True)))
    return cases
