"""Value cases of the convolution epilogue: ``activation(conv(x, f) + bias + residual)``.

The residual is either a separate tensor or the output itself (accumulate in place);
every parameter-free activation runs once, with and without a bias and a residual, and
the epilogue runs in every dtype. The tolerance carries the convolution's error bound
through the activation: the largest change of the activation (in float64) over the
interval of values the bound allows, plus the activation's own error as :meth:`unary`
allows it.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from . import reference as ref
from ._cases_conv import CONV_CONFIGS, ConvConfig, _data, _finite_abs, _tol
from ._cases_elementwise import _unary_tol
from ._common import DTYPES, SHORT, Case, assert_close, call_or_refuse, rng_for, storage_tol
from .reference import storage
from .workspace import Workspace

__all__ = ["conv_epilogue_cases", "EPILOGUE_ACTIVATIONS"]

Array = npt.NDArray[np.float64]

#: Every parameter-free unary op (LEAKY_RELU and CLIP are refused by the epilogue).
EPILOGUE_ACTIVATIONS = (
    "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "neg", "gelu", "gelu_tanh", "silu", "erf",
    "reciprocal", "square", "sin", "cos",
)  # fmt: skip


def _through(activation: str | None, z: Array, tol_z: Array, dtype: str) -> tuple[Array, Array]:
    """(activation(z), the tolerance of the backend's result) given ``z``'s bound ``tol_z``."""
    if activation is None:
        return z, tol_z
    want = ref.unary(activation, z)
    with np.errstate(invalid="ignore"):
        spread = np.maximum(
            np.abs(ref.unary(activation, z + tol_z) - want), np.abs(ref.unary(activation, z - tol_z) - want)
        )
    spread = np.nan_to_num(spread, nan=0.0, posinf=0.0, neginf=0.0)
    return want, spread + _unary_tol(activation, z, want, dtype)


def _epilogue_value(
    be: ComputeBackend,
    *,
    name: str,
    cfg: ConvConfig,
    residual: str | None,
    activation: str | None,
    nan: bool = False,
) -> float:
    """Run the fused convolution; ``residual`` is None, "disjoint" or "output" (y itself)."""
    dt = cfg.storage_dtype
    x, f, _, bias = _data(f"conv-epilogue-{name}", cfg)
    r = ref.round_to(rng_for(f"conv-residual-{name}").standard_normal(cfg.y_shape), dt)
    if nan:
        x[0, 0, 1, 2], r[0, 0, 0, 0], r[-1, -1, -1, -1] = np.nan, np.inf, np.nan
    with Workspace(be) as ws:
        px, pf = ws.put(storage(x, dt), label="x"), ws.put(storage(f, dt), label="filter")
        start = r if residual == "output" else np.full(cfg.y_shape, np.nan)
        py = ws.put(storage(start, dt), label="y")
        kw = cfg.keywords()
        if cfg.bias:
            kw["bias_ptr"] = ws.put(storage(bias, dt), label="bias")
        if residual is not None:
            kw["residual_ptr"] = py if residual == "output" else ws.put(storage(r, dt), label="residual")
        if activation is not None:
            kw["activation"] = activation

        def call() -> None:
            be.conv2d_forward(
                px, list(cfg.x_shape), pf, list(cfg.f_shape), py, list(cfg.y_shape), list(cfg.stride),
                list(cfg.padding), **kw,
            )  # fmt: skip

        if not call_or_refuse(be, ws, "conv2d_forward", dt, call):
            return 0.0
        got = ws.get(py, cfg.y_shape, dt)
        ws.check_unchanged(("x", "filter", "bias", "residual"))
    b = bias if cfg.bias else None
    res = r if residual is not None else None
    z = ref.conv2d_forward(x, f, cfg.stride, cfg.padding, bias=b, residual=res, **cfg.geometry())
    with np.errstate(invalid="ignore"):
        mag = ref.conv2d_forward(
            _finite_abs(x), _finite_abs(f), cfg.stride, cfg.padding, bias=None if b is None else np.abs(b),
            residual=None if res is None else _finite_abs(res), **cfg.geometry(),
        )  # fmt: skip
    want, tol = _through(activation, z, _tol(cfg.forward_reach + 1, mag, z, dt), dt)
    return assert_close(
        f"conv2d_forward epilogue ({residual}, {activation})", got, want, storage_tol(tol, want, dt), dtype=dt
    )


def conv_epilogue_cases() -> list[Case]:
    """The epilogue's cases, in the ``conv2d_forward`` group."""
    plain, biased = CONV_CONFIGS["3x3-s1-p1"], CONV_CONFIGS["bias"]
    cases: list[Case] = []

    def add(label: str, cfg: ConvConfig, residual: str | None, activation: str | None, **kw: Any) -> None:
        run = functools.partial(
            _epilogue_value, name=label, cfg=cfg, residual=residual, activation=activation, **kw
        )
        cases.append(Case("conv2d_forward", label, run))

    for residual in ("disjoint", "output"):
        for cfg, tag in ((plain, ""), (biased, "-bias")):
            add(f"epilogue-residual-{residual}{tag}", cfg, residual, None)
    for act in EPILOGUE_ACTIVATIONS:
        add(f"epilogue-{act}", plain, None, act)
    for residual in ("disjoint", "output"):
        for cfg, tag in ((CONV_CONFIGS["all-extensions"], "-extensions"), (biased, "")):
            add(f"epilogue-{residual}-relu{tag}", cfg, residual, "relu")
    for dt in DTYPES:
        typed = replace(biased, dtype=dt)
        for residual in ("disjoint", "output"):
            add(f"epilogue-{residual}-silu-{SHORT[dt]}", typed, residual, "silu")
        add(f"epilogue-nan-relu-{SHORT[dt]}", typed, "output", "relu", nan=True)
    return cases
