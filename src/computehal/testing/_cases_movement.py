"""Data movement value cases: copy_dtod, fill, copy_strided, gather and scatter (host and device indices).

All of them are bit copies (``fill`` rounds its value once): results are compared bit
for bit, with quiet NaNs carrying payloads and signs in the data.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from ..errors import InvalidArgumentError
from . import reference as ref
from ._cases_elementwise import assert_exact
from ._common import DTYPES, SHORT, Case, assert_bits_equal, call_or_refuse, rng_for
from .reference import storage, storage_dtype
from .workspace import Workspace, expect_error

__all__ = ["movement_cases", "with_payloads"]

#: Quiet NaNs with payloads (and a negative one) and an infinity, as raw bits per dtype.
PAYLOADS: dict[str, tuple[int, ...]] = {
    "float16": (0x7E05, 0xFE11, 0x7C00),
    "bfloat16": (0x7FC1, 0xFFC3, 0x7F80),
    "float32": (0x7FC00123, 0xFFC00456, 0x7F800000),
    "float64": (0x7FF8000000000123, 0xFFF8000000000456, 0x7FF0000000000000),
}
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def with_payloads(values: npt.ArrayLike, dtype: str, every: int = 5) -> npt.NDArray[Any]:
    """``values`` stored as ``dtype`` with every ``every``-th element replaced by a NaN payload / inf."""
    data = storage(values, dtype).reshape(-1).copy()
    bits = data.view(_UINT[data.dtype.itemsize])
    patterns = PAYLOADS[dtype]
    for i in range(0, data.size, every):
        bits[i] = patterns[(i // every) % len(patterns)]
    return data.reshape(np.shape(values))


# --------------------------------------------------------------------------- copy_dtod


def _copy_dtod_value(
    be: ComputeBackend, *, nbytes: int, src_off: int, dst_off: int, same: bool = False, payload: bool = False
) -> float:
    rng = rng_for(f"dtod-{nbytes}-{src_off}-{dst_off}-{same}")
    if payload:
        src = with_payloads(rng.standard_normal(nbytes // 4), "float32", every=2).view(np.uint8)
    else:
        src = rng.integers(0, 256, size=max(src_off, dst_off) + nbytes + 5, dtype=np.uint8)
    with Workspace(be) as ws:
        if same:
            block = ws.put_bytes(src, label="memory")
            call_args = (block.ptr + dst_off, block.ptr + src_off, nbytes)
            want = ref.copy_dtod(src, dst_off, src_off, nbytes)
        else:
            dst = rng.integers(0, 256, size=dst_off + nbytes + 7, dtype=np.uint8)
            s_block, d_block = ws.put_bytes(src, label="src"), ws.put_bytes(dst, label="dst")
            call_args = (d_block.ptr + dst_off, s_block.ptr + src_off, nbytes)
            memory = ref.copy_dtod(np.concatenate([src, dst]), src.size + dst_off, src_off, nbytes)
            want = memory[src.size :]
        block = ws.blocks[-1] if not same else ws.blocks[0]
        if not call_or_refuse(be, ws, "copy_dtod", "uint8", lambda: be.copy_dtod(*call_args)):
            return 0.0
        got = ws.get(block.ptr, block.nbytes, np.uint8)
        if not same:
            ws.check_unchanged(("src",))
    assert_bits_equal("copy_dtod: destination allocation", got, want)
    return 0.0


def _copy_dtod_cases() -> list[Case]:
    cases = [
        Case(
            "copy_dtod",
            f"bytes{n}-unaligned",
            functools.partial(_copy_dtod_value, nbytes=n, src_off=3, dst_off=5),
        )
        for n in (1, 3, 4, 63, 64, 65, 1000, 4099)
    ]
    configs: dict[str, dict[str, Any]] = {
        "aligned-256": dict(nbytes=256, src_off=0, dst_off=0),
        "overlap-forward": dict(nbytes=100, src_off=0, dst_off=7, same=True),
        "overlap-backward": dict(nbytes=100, src_off=7, dst_off=0, same=True),
        "overlap-aligned": dict(nbytes=256, src_off=0, dst_off=64, same=True),
        "identical": dict(nbytes=64, src_off=16, dst_off=16, same=True),
        "zero-bytes": dict(nbytes=0, src_off=4, dst_off=8),
        "large": dict(nbytes=(1 << 20) + 3, src_off=1, dst_off=0),
        "nan-payload": dict(nbytes=4 * 61, src_off=0, dst_off=4, payload=True),
    }
    cases += [
        Case("copy_dtod", name, functools.partial(_copy_dtod_value, **kw)) for name, kw in configs.items()
    ]
    return cases


# --------------------------------------------------------------------------- fill

FILL_VALUES = [
    0.0, -0.0, 1.5, -2.75, 1e-3, 1 / 3, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8 + 2.0**-40,
    65519.0, 65520.0, 3.3961e38, 3.5e38, -1e300, 1e-45, 6e-8, 5e-324, np.nan, np.inf, -np.inf,
]  # fmt: skip


def _fill_value(be: ComputeBackend, *, dtype: str, count: int = 37, offset: int = 0) -> float:
    isz = storage_dtype(dtype).itemsize
    with Workspace(be) as ws:
        before = storage(rng_for(f"fill-{dtype}").standard_normal(count + offset + 3), dtype)
        block = ws.put_bytes(before.view(np.uint8), label="memory")
        ptr = block.ptr + offset * isz
        for value in FILL_VALUES if count else [1.0]:
            if not call_or_refuse(
                be, ws, "fill", dtype, functools.partial(be.fill, ptr, count, value, dtype=dtype)
            ):
                return 0.0
            got = ws.get(block.ptr, before.size, dtype)
            want = before.astype(np.float64)
            want[offset : offset + count] = ref.fill(count, value, dtype).astype(np.float64)
            assert_exact(f"fill({value!r}, dtype={dtype})", got, want, dtype)
    return 0.0


def _fill_cases() -> list[Case]:
    cases = [
        Case("fill", f"values-nan-inf-{SHORT[dt]}", functools.partial(_fill_value, dtype=dt)) for dt in DTYPES
    ]
    cases.append(Case("fill", "count0", functools.partial(_fill_value, dtype="float32", count=0)))
    cases.append(
        Case(
            "fill", "interior-large", functools.partial(_fill_value, dtype="float32", count=100_003, offset=5)
        )
    )
    return cases


# --------------------------------------------------------------------------- copy_strided


def _permuted(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of ``shape`` read from a row-major array laid out in axis ``order``."""
    stored = np.empty([shape[a] for a in order], dtype=np.uint8)
    view = stored.transpose(np.argsort(order))
    return tuple(int(s) for s in view.strides)


STRIDED: dict[str, dict[str, Any]] = {
    "transpose": dict(shape=(5, 7), ss=(7, 1), ds=(1, 5), src_len=35, dst_len=35),
    "permute-3d": dict(shape=(2, 3, 4), ss=(3, 1, 6), ds=(12, 4, 1), src_len=24, dst_len=24),
    "slice": dict(shape=(3, 4), ss=(10, 1), ds=(4, 1), src_len=60, dst_len=12, so=23),
    "concat-second-half": dict(shape=(3, 4), ss=(4, 1), ds=(8, 1), src_len=12, dst_len=24, do=4),
    "expand": dict(shape=(4, 5), ss=(0, 1), ds=(5, 1), src_len=5, dst_len=20),
    "flip": dict(shape=(9,), ss=(-1,), ds=(1,), src_len=9, dst_len=9, so=8),
    "negative-dst": dict(shape=(3, 4), ss=(4, 1), ds=(-4, -1), src_len=12, dst_len=12, do=11),
    "channel-shuffle": dict(shape=(3, 2, 4), ss=(4, 12, 1), ds=(8, 4, 1), src_len=24, dst_len=24),
    "rank6": dict(
        shape=(2, 1, 3, 2, 2, 3), ss=_permuted((2, 1, 3, 2, 2, 3), (5, 2, 0, 4, 1, 3)),
        ds=(36, 36, 12, 6, 3, 1), src_len=72, dst_len=72,
    ),
    "scalar-0d": dict(shape=(), ss=(), ds=(), src_len=5, dst_len=4, so=3, do=2),
    "empty": dict(shape=(3, 0, 2), ss=(2, 2, 1), ds=(2, 2, 1), src_len=6, dst_len=6),
    "strided-dst-gaps": dict(shape=(4, 5), ss=(5, 1), ds=(12, 2), src_len=20, dst_len=48),
    "overlap-shifted": dict(shape=(5, 6), ss=(6, 1), ds=(6, 1), src_len=40, dst_len=0, do=3),
    "overlap-transpose-in-place": dict(shape=(6, 6), ss=(6, 1), ds=(1, 6), src_len=36, dst_len=0),
    "large-transpose": dict(shape=(64, 129), ss=(129, 1), ds=(1, 64), src_len=64 * 129, dst_len=64 * 129),
}  # fmt: skip


def _strided_value(
    be: ComputeBackend,
    *,
    label: str,
    shape: tuple[int, ...],
    ss: tuple[int, ...],
    ds: tuple[int, ...],
    src_len: int,
    dst_len: int,
    so: int = 0,
    do: int = 0,
    dtype: str = "float32",
    payload: bool = False,
) -> float:
    """``dst_len == 0`` means: destination in the source's own allocation."""
    rng = rng_for(f"strided-{label}")
    values = rng.standard_normal(src_len) * 4
    src = with_payloads(values, dtype) if payload else storage(values, dtype)
    isz = src.dtype.itemsize
    with Workspace(be) as ws:
        ps = ws.put(src, label="src")
        if dst_len:
            dst = storage(rng.standard_normal(dst_len), dtype)
            pd = ws.put(dst, label="dst")
            want = ref.copy_strided(dst, do, src, so, shape, ss, ds)
        else:
            pd, dst = ps, src
            want = ref.copy_strided(src, do, src, so, shape, ss, ds)

        def call() -> None:
            be.copy_strided(pd + do * isz, ps + so * isz, list(shape), list(ss), list(ds), dtype=dtype)

        if not call_or_refuse(be, ws, "copy_strided", dtype, call):
            return 0.0
        got = ws.get(pd, dst.size, dtype)
        if dst_len:
            ws.check_unchanged(("src",))
    assert_bits_equal(f"copy_strided({label}, dtype={dtype}): destination", got, want)
    return 0.0


def _strided_cases() -> list[Case]:
    cases = [
        Case("copy_strided", name, functools.partial(_strided_value, label=name, **kw))
        for name, kw in STRIDED.items()
    ]
    for dt in DTYPES:
        for name in ("transpose", "overlap-transpose-in-place"):
            run = functools.partial(_strided_value, label=name, dtype=dt, payload=True, **STRIDED[name])
            cases.append(Case("copy_strided", f"{name}-nan-payload-{SHORT[dt]}", run))
    return cases


# --------------------------------------------------------------------------- gather / scatter


def _as_indices(kind: str, values: Sequence[int]) -> Any:
    if kind == "list":
        return list(values)
    if kind == "tuple":
        return tuple(values)
    if kind == "int32":
        return np.asarray(values, dtype=np.int32)
    if kind == "uint16":
        return np.asarray(values, dtype=np.uint16)
    if kind == "numpy-ints":
        return [np.int64(v) for v in values]
    return np.asarray(values, dtype=np.int64)


def _rows_value(
    be: ComputeBackend,
    *,
    op: str,
    rows: int,
    cols: int,
    indices: Sequence[int],
    kind: str = "int64",
    dtype: str | None = None,
    device: str | None = None,
) -> float:
    """Gather / scatter; ``device`` is the index dtype of device-side indices (None: host indices)."""
    dt = dtype or "float32"
    rng = rng_for(f"{op}-{rows}-{cols}-{len(indices)}")
    count = len(indices)
    in_rows, out_rows = (count, rows) if op == "scatter" else (rows, count)
    make = with_payloads if dtype is not None else storage
    source = make(rng.standard_normal((in_rows, cols)), dt)
    before = make(rng.standard_normal((out_rows, cols)), dt)
    kw: dict[str, Any] = {} if dtype is None else {"dtype": dtype}
    with Workspace(be) as ws:
        ps, po = ws.put(source, label="input"), ws.put(before, label="output")
        if device is not None:
            kw.update(
                indices_ptr=ws.put(np.asarray(indices, dtype=device), label="indices"), index_dtype=device
            )
            arg: Any = count
        else:
            arg = _as_indices(kind, indices)
        if not call_or_refuse(be, ws, op, dt, lambda: getattr(be, op)(ps, arg, po, rows, cols, **kw)):
            return 0.0
        got = ws.get(po, before.shape, dt)
        ws.check_unchanged(("input", "indices"))
    want = ref.scatter(source, indices, before) if op == "scatter" else ref.gather(source, indices)
    assert_bits_equal(f"{op}: output", got, want)
    return 0.0


def _bad_device_index(
    be: ComputeBackend, *, op: str, values: Sequence[int], index_dtype: str, rows: int = 6
) -> float:
    cols, count = 3, len(values)
    in_rows, out_rows = (count, rows) if op == "scatter" else (rows, count)
    rng = rng_for(f"bad-device-{op}")
    with Workspace(be) as ws:
        ps = ws.put(storage(rng.standard_normal((in_rows, cols)), "float32"), label="input")
        po = ws.put(storage(rng.standard_normal((out_rows, cols)), "float32"), label="output")
        pi = ws.put(np.array(values, dtype=np.int64).astype(index_dtype), label="indices")
        with expect_error(
            InvalidArgumentError, f"{op} with device indices {list(values)[-3:]} ({index_dtype})"
        ):
            getattr(be, op)(ps, count, po, rows, cols, indices_ptr=pi, index_dtype=index_dtype)
        ws.check_unchanged()
    return 0.0


def _rows_cases() -> list[Case]:
    rng = rng_for("rows-indices")
    many = [int(i) for i in rng.integers(0, 300, size=2000)]
    dup = [3, 1, 3, 0, 7, 1, 3, 9, 9, 2]
    configs: list[tuple[str, dict[str, Any]]] = [
        ("duplicates-list", dict(rows=10, cols=7, indices=dup, kind="list")),
        ("duplicates-int32", dict(rows=10, cols=7, indices=dup, kind="int32")),
        ("tuple", dict(rows=10, cols=3, indices=(9, 0, 4), kind="tuple")),
        ("uint16", dict(rows=12, cols=5, indices=[11, 0, 5, 5], kind="uint16")),
        ("numpy-int-items", dict(rows=12, cols=5, indices=[2, 11, 2], kind="numpy-ints")),
        ("single-column", dict(rows=40, cols=1, indices=[39, 0, 20, 20, 1], kind="int64")),
        ("many-rows", dict(rows=300, cols=33, indices=many, kind="int64")),
        ("empty-indices", dict(rows=5, cols=4, indices=[], kind="list")),
        ("empty-array", dict(rows=5, cols=4, indices=[], kind="int64")),
        ("zero-columns", dict(rows=5, cols=0, indices=[1, 2], kind="list")),
        ("device-int32", dict(rows=10, cols=7, indices=dup, device="int32")),
        ("device-int64", dict(rows=10, cols=7, indices=dup, device="int64")),
        ("device-many", dict(rows=300, cols=33, indices=many, device="int64")),
        ("device-empty", dict(rows=5, cols=4, indices=[], device="int32")),
    ]
    for dt in DTYPES:
        configs.append((f"nan-payload-{SHORT[dt]}", dict(rows=10, cols=7, indices=dup, dtype=dt)))
        configs.append(
            (
                f"device-nan-payload-{SHORT[dt]}",
                dict(rows=9, cols=5, indices=dup[:6], dtype=dt, device="int32"),
            )
        )
    bad = {
        "index-equal-rows": ([0, 2, 6], "int64"),
        "index-negative-int32": ([1, -1, 2], "int32"),
        "index-negative-int64": ([1, 2, -1], "int64"),
        "index-2**32-plus-1": ([0, 2**32 + 1], "int64"),
        "index-min-int64": ([-(2**63)], "int64"),
        "index-last-of-many": ([i % 6 for i in range(999)] + [7], "int32"),
    }
    cases: list[Case] = []
    for op in ("gather", "scatter"):
        cases += [Case(op, name, functools.partial(_rows_value, op=op, **kw)) for name, kw in configs]
        for name, (values, idt) in bad.items():
            cases.append(
                Case(
                    op,
                    f"bad-device-{name}",
                    functools.partial(_bad_device_index, op=op, values=values, index_dtype=idt),
                )
            )
    return cases


def movement_cases() -> list[Case]:
    """Every copy_dtod, fill, copy_strided, gather and scatter value case."""
    return _copy_dtod_cases() + _fill_cases() + _strided_cases() + _rows_cases()
