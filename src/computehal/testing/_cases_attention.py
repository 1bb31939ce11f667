"""Attention value cases: causal, seq_q != seq_kv, additive masks, grouped-query heads, NaN rules."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from . import reference as ref
from ._common import (
    Case,
    assert_close,
    call_or_refuse,
    config_cases,
    dtype_cases,
    eps_of,
    rng_for,
    storage_tol,
    tiny_of,
)
from .reference import storage
from .workspace import Workspace

__all__ = ["attention_cases", "AttentionConfig"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class AttentionConfig:
    """One attention problem; ``mask`` is the mask's shape (None: no mask)."""

    batch: int
    heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool
    scale: float | None = None
    magnitude: float = 1.0
    kv_heads: int | None = None
    mask: tuple[int, ...] | None = None
    key_padding: bool = False  # -inf in the mask for the last two keys of the last batch
    dtype: str | None = None  # None: no dtype keyword (the float32 default)

    @property
    def kvh(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    def keywords(self, mask_ptr: int | None) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self.dtype is not None:
            kw["dtype"] = self.dtype
        if self.kv_heads is not None:
            kw["kv_heads"] = self.kv_heads
        if mask_ptr is not None and self.mask is not None:
            kw.update(mask_ptr=mask_ptr, mask_shape=list(self.mask))
        return kw


CONFIGS: dict[str, AttentionConfig] = {
    "square": AttentionConfig(2, 2, 8, 8, 16, False),
    "square-causal": AttentionConfig(2, 2, 8, 8, 16, True),
    "q-lt-kv": AttentionConfig(1, 2, 5, 12, 8, False),
    "q-lt-kv-causal": AttentionConfig(1, 2, 5, 12, 8, True),
    "q-gt-kv": AttentionConfig(1, 2, 12, 5, 8, False),
    "q-gt-kv-causal": AttentionConfig(1, 2, 12, 5, 8, True),
    "single": AttentionConfig(1, 1, 1, 1, 1, True),
    "odd-dims": AttentionConfig(2, 3, 33, 47, 72, False),
    "odd-dims-causal": AttentionConfig(2, 3, 47, 33, 24, True),
    "large-scores": AttentionConfig(1, 2, 16, 20, 16, False, scale=1.0, magnitude=4.0),
    "negative-scale": AttentionConfig(1, 1, 9, 9, 8, True, scale=-0.7),
    "long-600": AttentionConfig(1, 1, 600, 600, 32, False),
    "long-600-causal": AttentionConfig(1, 2, 600, 600, 32, True),
    "long-kv-1100": AttentionConfig(1, 1, 40, 1100, 16, True),
    "long-q-1100": AttentionConfig(1, 1, 1100, 70, 16, True),
    # computehal extensions
    "decode-1-query": AttentionConfig(2, 2, 1, 37, 8, True),
    "mask-full": AttentionConfig(2, 2, 5, 7, 8, False, mask=(2, 2, 5, 7)),
    "mask-2d-broadcast": AttentionConfig(2, 3, 5, 7, 4, False, mask=(5, 7)),
    "mask-key-padding": AttentionConfig(2, 2, 6, 7, 8, False, mask=(2, 1, 1, 7), key_padding=True),
    "mask-and-causal": AttentionConfig(1, 2, 7, 7, 8, True, mask=(1, 2, 1, 7)),
    "mask-long-kv": AttentionConfig(1, 2, 3, 300, 16, False, mask=(1, 1, 3, 300)),
    "gqa-4-2": AttentionConfig(2, 4, 6, 6, 8, False, kv_heads=2),
    "gqa-4-1-decode": AttentionConfig(1, 4, 3, 10, 8, True, kv_heads=1),
    "gqa-6-3-mask-decode": AttentionConfig(2, 6, 2, 17, 8, True, kv_heads=3, mask=(2, 1, 2, 17)),
}
DTYPE_CONFIGS = ("square-causal", "gqa-6-3-mask-decode")


def _operands(label: str, cfg: AttentionConfig) -> tuple[Array, Array, Array, Array | None]:
    dt = cfg.dtype or "float32"
    rng = rng_for(label)
    q = rng.standard_normal((cfg.batch, cfg.heads, cfg.seq_q, cfg.head_dim)) * cfg.magnitude
    k = rng.standard_normal((cfg.batch, cfg.kvh, cfg.seq_kv, cfg.head_dim)) * cfg.magnitude
    v = rng.standard_normal((cfg.batch, cfg.kvh, cfg.seq_kv, cfg.head_dim))
    mask = None if cfg.mask is None else rng.standard_normal(cfg.mask) * 2.0
    if mask is not None and cfg.key_padding:
        mask[-1, ..., -2:] = -np.inf
    rounded = [None if t is None else ref.round_to(t, dt) for t in (q, k, v, mask)]
    return rounded[0], rounded[1], rounded[2], rounded[3]  # type: ignore[return-value]


def _plain_specials(q: Array, k: Array, v: Array) -> None:
    """Specials of a [1, 2, 5, 5] problem without mask."""
    q[0, 0, 1, 2] = np.nan  # a NaN query row
    q[0, 1, 2, 0] = np.inf  # scores of +-inf in row 2 of head 1
    k[0, 1, 3, 1] = -np.inf  # key 3 of head 1: +inf or -inf (invisible) scores
    v[0, 0, 4, 3] = np.nan  # column 3 of every row of head 0


def _mask_specials(q: Array, k: Array, v: Array, mask: Array | None) -> None:
    """Specials on separate rows of a [1, 2, 6, 9] causal problem with one key/value head and a full mask."""
    assert mask is not None
    mask[0, 0, 0, :] = -np.inf  # row 0 of head 0 sees no key: zeros
    mask[0, 0, 1, 2] = np.inf  # a +inf score: row NaN
    mask[0, 0, 2, 0] = np.nan  # a NaN in the mask: row NaN
    q[0, 1, 3, 1] = np.nan  # a NaN query row
    k[0, 0, 7, 1] = np.nan  # key 7 is visible to rows 4 and 5 only (causal offset 3)
    v[0, 0, 6, 2] = np.nan  # value 6: column 2 of rows 3, 4, 5
    v[0, 0, 8, 3] = np.inf  # value 8: column 3 of row 5
    mask[0, 1, 4, 8] = -np.inf  # ... but row 4 of head 1 cannot see key 8 anyway


def _tol(cfg: AttentionConfig, q: Array, k: Array, v: Array, mask: Array | None, want: Array) -> Array:
    dt = cfg.dtype or "float32"
    eps = eps_of(dt)
    sc = 1.0 / math.sqrt(cfg.head_dim) if cfg.scale is None else cfg.scale
    finite = [np.abs(np.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0)) for t in (q, k, v)]
    keys = np.repeat(finite[1], cfg.heads // cfg.kvh, axis=1)
    score_mag = np.einsum("bhid,bhjd->bhij", finite[0], keys) * abs(sc)
    score_err = (cfg.head_dim + 2) * eps * score_mag.max(axis=-1) + 8 * eps  # per query row
    if mask is not None:
        score_err = score_err + 2 * eps * float(np.abs(np.nan_to_num(mask, posinf=0.0, neginf=0.0)).max())
    vmax = float(finite[2].max()) if finite[2].size else 0.0
    tol = (4.0 * score_err + 4.0 * (cfg.seq_kv + cfg.head_dim + 8) * eps)[..., None] * vmax + tiny_of(dt)
    return storage_tol(np.broadcast_to(tol, want.shape), want, dt)


def _attention_value(be: ComputeBackend, *, label: str, cfg: AttentionConfig, specials: str = "") -> float:
    dt = cfg.dtype or "float32"
    q, k, v, mask = _operands(label, cfg)
    if specials == "mask":
        _mask_specials(q, k, v, mask)
    elif specials == "plain":
        _plain_specials(q, k, v)
    sc = 1.0 / math.sqrt(cfg.head_dim) if cfg.scale is None else cfg.scale
    with Workspace(be) as ws:
        pq, pk, pv = (ws.put(storage(t, dt), label=name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
        pm = None if mask is None else ws.put(storage(mask, dt), label="mask")
        po = ws.put(storage(np.full(q.shape, np.nan), dt), label="o")
        dims = (cfg.batch, cfg.heads, cfg.seq_q, cfg.seq_kv, cfg.head_dim)

        def call() -> None:
            be.attention(pq, pk, pv, po, *dims, sc, cfg.causal, **cfg.keywords(pm))

        if not call_or_refuse(be, ws, "attention", dt, call):
            return 0.0
        got = ws.get(po, q.shape, dt)
        ws.check_unchanged(("q", "k", "v", "mask"))
    want = ref.attention(q, k, v, sc, cfg.causal, mask=mask)
    worst = assert_close("attention: o", got, want, _tol(cfg, q, k, v, mask, want), dtype=dt)
    if cfg.causal and cfg.seq_q > cfg.seq_kv:
        blind = got[:, :, : cfg.seq_q - cfg.seq_kv, :]
        if np.any(blind != 0):
            raise AssertionError(
                f"attention: the first {cfg.seq_q - cfg.seq_kv} query rows see no key and must be "
                "exactly zero"
            )
    return worst


def attention_cases() -> list[Case]:
    """Every attention value case."""
    cases = config_cases("attention", _attention_value, CONFIGS, DTYPE_CONFIGS, "attn")
    nan_cfg = AttentionConfig(1, 2, 6, 9, 5, True, kv_heads=1, mask=(1, 2, 6, 9))
    cases += dtype_cases(
        "attention", "nan-inf-mask", _attention_value, nan_cfg, label="attn-nan", specials="mask"
    )
    plain_nan = AttentionConfig(1, 2, 5, 5, 4, False)
    cases += dtype_cases(
        "attention", "nan-inf", _attention_value, plain_nan, label="attn-nan-plain", specials="plain"
    )
    return cases
