"""The CPU backend's decoding attention (a few query rows against many keys) against the definition.

Calls with at most ``DECODE_ROWS`` query rows and at least ``DECODE_KEYS`` keys go to
:mod:`computehal.backends.cpu._kdecode`; these tests make such calls through the
backend (masks broadcast every way, the causal rule with ``seq_q != seq_kv``,
grouped-query heads, several batches, inf and NaN where the definition says what they
do) and compare them with ``computehal.testing.reference.attention`` in float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import computehal.backends.cpu._attention_fast as fast
from computehal.backends.cpu import CpuBackend
from computehal.testing import reference as ref

F32 = np.float32
EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module")
def backend() -> Any:
    be = CpuBackend()
    be.init()
    yield be
    be.close()


@pytest.fixture
def decode_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls that reach the decoding kernel (so a test cannot pass on another path)."""
    calls: list[int] = []
    real = fast._decode

    def counted(p: Any) -> bool:
        done = real(p)
        calls.append(int(done))
        return done

    monkeypatch.setattr(fast, "_decode", counted)
    return calls


def _run(be: Any, q: Any, k: Any, v: Any, scale: float, causal: bool, mask: Any = None) -> Any:
    batch, heads, seq_q, dim = q.shape
    kv_heads, seq_kv = k.shape[1], k.shape[2]
    arrays = [q, k, v] + ([] if mask is None else [mask])
    ptrs = [be.alloc(a.nbytes) for a in arrays]
    out = be.alloc(q.nbytes)
    try:
        for ptr, a in zip(ptrs, arrays, strict=True):
            be.copy_htod(ptr, np.ascontiguousarray(a))
        extra: dict[str, Any] = {} if kv_heads == heads else {"kv_heads": kv_heads}
        if mask is not None:
            extra.update(mask_ptr=ptrs[3], mask_shape=mask.shape)
        be.attention(*ptrs[:3], out, batch, heads, seq_q, seq_kv, dim, scale, causal, **extra)
        got = np.empty_like(q)
        be.copy_dtoh(got, out)
        return got
    finally:
        for ptr in [*ptrs, out]:
            be.free(ptr)


def _masks(rng: Any, batch: int, heads: int, seq_q: int, seq_kv: int) -> dict[str, Any]:
    keys = rng.standard_normal((batch, 1, 1, seq_kv)).astype(F32)
    keys[0, 0, 0, seq_kv // 3] = -np.inf
    full = rng.standard_normal((batch, heads, seq_q, seq_kv)).astype(F32)
    full[0, 0, 0, :] = -np.inf  # a row that sees no key: 0
    return {
        "none": None,
        "keys": keys,
        "queries": rng.standard_normal((1, 1, seq_q, 1)).astype(F32),
        "full": full,
    }


@pytest.mark.parametrize("mask_kind", ["none", "keys", "queries", "full"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "batch, heads, kv_heads, seq_q, seq_kv, dim",
    [
        (1, 12, 12, 1, 513, 64),
        (2, 4, 2, 3, 70, 16),
        (1, 3, 1, 4, 64, 7),
        (2, 2, 2, 2, 131, 33),
        (1, 8, 8, 1, 2048, 64),  # 8 MiB of keys and values: split over the threads
    ],
)
def test_decoding_matches_definition(
    backend: Any, decode_calls: list[int], batch: int, heads: int, kv_heads: int, seq_q: int,
    seq_kv: int, dim: int, causal: bool, mask_kind: str,
) -> None:  # fmt: skip
    rng = np.random.default_rng(seq_kv + dim)
    q = rng.standard_normal((batch, heads, seq_q, dim)).astype(F32)
    k, v = (rng.standard_normal((batch, kv_heads, seq_kv, dim)).astype(F32) for _ in range(2))
    scale = 1 / np.sqrt(dim)
    mask = _masks(rng, batch, heads, seq_q, seq_kv)[mask_kind]
    got = _run(backend, q, k, v, scale, causal, mask)
    want = ref.attention(q, k, v, scale, causal, mask=mask)
    assert decode_calls == [1]
    tol = 8 * (seq_kv + dim + 8) * EPS32 * np.abs(v).max()
    assert np.all(np.abs(got - want) <= tol)
    if mask_kind == "full":
        assert np.all(got[0, 0, 0] == 0)


def test_decoding_inf_and_nan(backend: Any, decode_calls: list[int]) -> None:
    rng = np.random.default_rng(5)
    batch, heads, seq_q, seq_kv, dim = 1, 4, 3, 80, 8
    q = rng.standard_normal((batch, heads, seq_q, dim)).astype(F32)
    k, v = (rng.standard_normal((batch, heads, seq_kv, dim)).astype(F32) for _ in range(2))
    q[0, 0, 1, 2] = np.nan  # a NaN score row
    k[0, 1, 10, 0] = np.inf  # +inf and -inf scores in head 1: NaN rows, or weight 0
    v[0, 2, 79, 3] = np.nan  # the last key: hidden from the first two rows by the causal rule
    v[0, 3, 5, 0] = np.inf  # visible to every row of head 3
    got = _run(backend, q, k, v, 0.5, True)
    want = ref.attention(q, k, v, 0.5, True)
    assert decode_calls == [1]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    assert np.all(np.abs(got[finite] - want[finite]) <= 1e-5 * (1 + np.abs(want[finite])))


def test_long_rows_and_short_caches_take_the_other_kernel(backend: Any, decode_calls: list[int]) -> None:
    rng = np.random.default_rng(9)
    for seq_q, seq_kv in ((fast.DECODE_ROWS + 1, 200), (1, fast.DECODE_KEYS - 1)):
        q = rng.standard_normal((1, 2, seq_q, 8)).astype(F32)
        k, v = (rng.standard_normal((1, 2, seq_kv, 8)).astype(F32) for _ in range(2))
        got = _run(backend, q, k, v, 0.3, False)
        assert np.allclose(got, ref.attention(q, k, v, 0.3, False), rtol=1e-5, atol=1e-6)
    assert decode_calls == []
