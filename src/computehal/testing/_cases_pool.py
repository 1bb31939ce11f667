"""Pooling value cases: max and average, ceil mode, padding counted or not, dilation, empty windows."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import ComputeBackend
from . import reference as ref
from ._common import (
    DTYPES,
    SHORT,
    Case,
    assert_close,
    call_or_refuse,
    config_cases,
    eps_of,
    rng_for,
    storage_tol,
    tiny_of,
)
from .reference import storage
from .workspace import Workspace

__all__ = ["pool_cases", "PoolConfig", "POOL_CONFIGS"]


@dataclass(frozen=True)
class PoolConfig:
    """One pooling problem."""

    op: str
    shape: tuple[int, int, int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, ...]
    dilation: tuple[int, int] = (1, 1)
    ceil_mode: bool = False
    count_include_pad: bool = False
    dtype: str = "float32"

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        n, c, h, w = self.shape
        top, left, bottom, right = ref.pads4(self.padding)
        oh = ref.pool_output_size(
            h, self.kernel[0], self.stride[0], top, bottom, self.dilation[0], self.ceil_mode
        )
        ow = ref.pool_output_size(
            w, self.kernel[1], self.stride[1], left, right, self.dilation[1], self.ceil_mode
        )
        return (n, c, oh, ow)


def _both(name: str, **kw: Any) -> dict[str, PoolConfig]:
    return {f"{op}-{name}": PoolConfig(op, **kw) for op in ("max", "avg")}


POOL_CONFIGS: dict[str, PoolConfig] = {
    **_both("2x2-s2", shape=(2, 3, 8, 9), kernel=(2, 2), stride=(2, 2), padding=(0, 0)),
    **_both("3x3-s1-p1", shape=(1, 2, 7, 6), kernel=(3, 3), stride=(1, 1), padding=(1, 1)),
    **_both("3x3-s2-p1", shape=(2, 2, 9, 8), kernel=(3, 3), stride=(2, 2), padding=(1, 1)),
    "avg-3x3-s2-p1-count-pad": PoolConfig(
        "avg", (2, 2, 9, 8), (3, 3), (2, 2), (1, 1), count_include_pad=True
    ),
    **_both(
        "ceil-overhang", shape=(1, 2, 8, 8), kernel=(3, 3), stride=(2, 2), padding=(0, 0), ceil_mode=True
    ),
    "avg-ceil-overhang-count-pad": PoolConfig(
        "avg", (1, 2, 8, 7), (3, 3), (2, 2), (1, 1), ceil_mode=True, count_include_pad=True
    ),
    # (3 - 1) * 3 >= 5 + 1: the last ceil-mode window would start in the trailing padding.
    **_both(
        "ceil-drops-last", shape=(1, 1, 5, 5), kernel=(2, 2), stride=(3, 3), padding=(1, 1), ceil_mode=True
    ),
    **_both("dilation", shape=(1, 2, 9, 10), kernel=(3, 2), stride=(1, 2), padding=(2, 1), dilation=(2, 3)),
    **_both("pad4", shape=(2, 1, 6, 7), kernel=(3, 2), stride=(2, 1), padding=(1, 0, 2, 1)),
    "avg-pad4-count-pad": PoolConfig(
        "avg", (2, 1, 6, 7), (3, 2), (2, 1), (1, 0, 2, 1), count_include_pad=True
    ),
    **_both("global", shape=(2, 3, 5, 7), kernel=(5, 7), stride=(1, 1), padding=(0, 0)),
    **_both("1x1-s2", shape=(1, 2, 5, 6), kernel=(1, 1), stride=(2, 2), padding=(0, 0)),
    # Windows entirely in the padding: MAX -inf, AVG 0 / 0 = NaN, or 0 when padding counts.
    **_both("windows-without-input", shape=(1, 2, 3, 3), kernel=(2, 2), stride=(1, 1), padding=(2, 2)),
    "avg-windows-without-input-count-pad": PoolConfig(
        "avg", (1, 2, 3, 3), (2, 2), (1, 1), (2, 2), count_include_pad=True
    ),
    **_both("larger", shape=(2, 8, 33, 31), kernel=(3, 3), stride=(2, 2), padding=(1, 1)),
}
DTYPE_CONFIGS = ("max-3x3-s2-p1", "avg-3x3-s2-p1-count-pad")


def _pool_value(be: ComputeBackend, *, label: str, cfg: PoolConfig, nan: bool = False) -> float:
    dt = cfg.dtype
    x = ref.round_to(rng_for(label).standard_normal(cfg.shape) * 3, dt)
    if nan:
        flat = x.reshape(-1)
        flat[[1, 7, 12]] = [np.nan, np.inf, -np.inf]
        x[0, 0, :2, :2] = np.nan  # a window of NaN only: MAX gives -inf there
        x[-1, -1, -1, -1] = np.nan
    with Workspace(be) as ws:
        px = ws.put(storage(x, dt), label="input")
        py = ws.put(storage(np.full(cfg.out_shape, 1234.5), dt), label="output")

        def call() -> None:
            be.pool2d(
                cfg.op, px, list(cfg.shape), py, list(cfg.out_shape), list(cfg.kernel), list(cfg.stride),
                list(cfg.padding), dilation=list(cfg.dilation), ceil_mode=cfg.ceil_mode,
                count_include_pad=cfg.count_include_pad, dtype=dt,
            )  # fmt: skip

        if not call_or_refuse(be, ws, "pool2d", dt, call):
            return 0.0
        got = ws.get(py, cfg.out_shape, dt)
        ws.check_unchanged(("input",))
    geometry: dict[str, Any] = dict(
        dilation=cfg.dilation, ceil_mode=cfg.ceil_mode, count_include_pad=cfg.count_include_pad
    )
    want = ref.pool2d(cfg.op, x, cfg.kernel, cfg.stride, cfg.padding, **geometry)
    if cfg.op == "max":
        tol = np.zeros(cfg.out_shape)
    else:
        taps = cfg.kernel[0] * cfg.kernel[1]
        finite = np.abs(np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0))
        with np.errstate(invalid="ignore"):
            mean_mag = np.nan_to_num(
                ref.pool2d("avg", finite, cfg.kernel, cfg.stride, cfg.padding, **geometry)
            )
        tol = storage_tol(2.0 * (taps + 2) * eps_of(dt) * mean_mag + tiny_of(dt), want, dt)
    return assert_close(f"pool2d({cfg.op})", got, want, tol, dtype=dt)


def pool_cases() -> list[Case]:
    """Every pooling value case."""
    cases = config_cases("pool2d", _pool_value, POOL_CONFIGS, DTYPE_CONFIGS, "pool")
    for op in ("max", "avg"):
        for dt in DTYPES:
            cfg = PoolConfig(op, (2, 2, 6, 7), (2, 3), (2, 2), (1, 1, 0, 1), dtype=dt)
            name = f"{op}-nan-inf-{SHORT[dt]}"
            cases.append(Case("pool2d", name, functools.partial(_pool_value, label=name, cfg=cfg, nan=True)))
    return cases
