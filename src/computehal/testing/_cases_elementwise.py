"""Element-wise value cases: every unary and binary op, broadcasting, and dtype conversion.

Every op runs on random data from its domain with the IEEE specials (NaN, infinities,
signed zeros, tiny and huge values) in front, in every dtype.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from ..errors import UnsupportedError
from ..types import BinaryOp, UnaryOp
from . import reference as ref
from ._common import (
    DTYPES,
    SHORT,
    Case,
    assert_bits_equal,
    assert_close,
    call_or_refuse,
    eps_of,
    note_refused,
    offered,
    rng_for,
    storage_tol,
    tiny_of,
)
from .reference import storage, storage_dtype
from .workspace import Workspace, expect_error

__all__ = ["elementwise_cases", "assert_exact"]

Array = npt.NDArray[np.float64]

UNARY_DOMAIN: dict[str, tuple[float, float]] = {
    "relu": (-10, 10),
    "sigmoid": (-30, 30),
    "tanh": (-8, 8),
    "exp": (-20, 20),
    "log": (1e-3, 1e3),
    "sqrt": (0, 1e4),
    "abs": (-100, 100),
    "neg": (-100, 100),
    "gelu": (-8, 8),
    "gelu_tanh": (-8, 8),
    "silu": (-30, 30),
    "erf": (-5, 5),
    "reciprocal": (-100, 100),
    "square": (-1e4, 1e4),
    "sin": (-100, 100),
    "cos": (-100, 100),
    "leaky_relu": (-10, 10),
    "clip": (-10, 10),
}
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-20, 3e38, -3e38]
#: sin / cos promise accuracy for moderate arguments only (argument reduction).
TRIG_SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-20, 1000.25, -1234.5]
#: GELU / SILU near the float32 limit would depend on the order of the formula's products
#: (``0.5 * x * 2`` overflows one way, not the other); 1e30 still overflows x**3.
LARGE_SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-20, 1e30, -1e30]
_SPECIALS_OF = {
    "sin": TRIG_SPECIALS,
    "cos": TRIG_SPECIALS,
    "gelu": LARGE_SPECIALS,
    "gelu_tanh": LARGE_SPECIALS,
}
#: (name, keyword parameters) run for the parametrised ops.
PARAMETERS: dict[str, list[tuple[str, dict[str, float]]]] = {
    "leaky_relu": [("alpha0.2", {"alpha": 0.2}), ("alpha-negative", {"alpha": -1.5})],
    "clip": [
        ("lo-hi", {"lo": -1.5, "hi": 2.25}),
        ("lo-only", {"lo": 0.5}),
        ("hi-only", {"hi": -0.75}),
        ("lo-above-hi", {"lo": 3.0, "hi": -3.0}),
        ("infinite-bounds", {"lo": -np.inf, "hi": np.inf}),
    ],
}


def _unary_tol(op: str, x: Array, want: Array, dtype: str) -> Array:
    """The float32 (or float64) error bound of ``op`` at ``x``, see the module notes of the kit."""
    eps, tiny = eps_of(dtype), tiny_of(dtype)
    mag = np.abs(np.nan_to_num(want, posinf=0.0, neginf=0.0))
    ax = np.abs(np.nan_to_num(x, posinf=0.0, neginf=0.0))
    if op in ("relu", "abs", "neg", "clip"):
        return np.zeros_like(mag)
    if op in ("exp",):
        return 2 * (3 + 2 * ax) * eps * mag + tiny
    if op in ("sigmoid", "silu"):
        return 2 * (8 + 2 * np.minimum(ax, 100)) * eps * mag + tiny
    if op == "tanh":
        return 8 * eps * mag + 4 * eps * np.minimum(ax, 1) + tiny
    if op == "log":
        return 4 * eps * mag + (2.0**-21 if eps > 1e-10 else 2.0**-50) + tiny
    if op in ("gelu", "gelu_tanh"):  # x * Phi(x): Phi to a few units of 1, times |x|
        return 8 * eps * mag + 8 * eps * np.minimum(ax, 1e30) + tiny
    if op in ("sin", "cos"):  # absolute: argument reduction loses about eps * |x|
        return 4 * eps * mag + 2 * eps * (1 + ax) + tiny
    if op in ("leaky_relu", "square"):
        return 2 * eps * mag + tiny
    return 8 * eps * mag + tiny  # sqrt, erf, reciprocal


def _unary_value(
    be: ComputeBackend,
    *,
    op: str,
    n: int = 1003,
    in_place: bool = False,
    dtype: str | None = None,
    params: dict[str, float] | None = None,
) -> float:
    dt = dtype or "float32"
    rng = rng_for(f"unary-{op}-{n}")
    lo, hi = UNARY_DOMAIN[op.lower()]
    x = rng.uniform(lo, hi, size=n)
    specials = _SPECIALS_OF.get(op.lower(), SPECIALS)
    x[: len(specials)] = specials[:n]
    x = ref.round_to(x, dt)
    kw: dict[str, Any] = dict(params or {})
    if dtype is not None:
        kw["dtype"] = dtype
    with Workspace(be) as ws:
        px = ws.put(storage(x, dt), label="input")
        po = px if in_place else ws.put(storage(np.full(n, 123.0), dt), label="output")
        if not call_or_refuse(be, ws, "unary", dt, lambda: be.unary(op, px, po, n, **kw)):
            return 0.0
        got = ws.get(po, (n,), dt)
        if not in_place:
            ws.check_unchanged(("input",))
    want = ref.unary(op.lower(), x, **(params or {}))
    tol = storage_tol(_unary_tol(op.lower(), x, want, dt), want, dt)
    return assert_close(f"unary({op}, {params or {}})", got, want, tol, dtype=dt)


def _unary_n0(be: ComputeBackend) -> float:
    with Workspace(be) as ws:
        px = ws.put(np.ones(4, dtype=np.float32), label="input")
        po = ws.put(np.full(4, 5.0, dtype=np.float32), label="output")
        be.unary("exp", px, po, 0)
        ws.check_unchanged()
    return 0.0


def _unary_cases() -> list[Case]:
    cases: list[Case] = []
    for op in UNARY_DOMAIN:
        cases.append(Case("unary", op, functools.partial(_unary_value, op=op)))
        cases.append(Case("unary", f"{op}-in-place", functools.partial(_unary_value, op=op, in_place=True)))
        for name, params in PARAMETERS.get(op, []):
            cases.append(Case("unary", f"{op}-{name}", functools.partial(_unary_value, op=op, params=params)))
        for dt in DTYPES:
            cases.append(
                Case(
                    "unary",
                    f"{op}-nan-inf-{SHORT[dt]}",
                    functools.partial(_unary_value, op=op, n=257, dtype=dt),
                )
            )
    cases.append(Case("unary", "RELU-uppercase-small", functools.partial(_unary_value, op="RELU", n=5)))
    cases.append(Case("unary", "gelu-enum", functools.partial(_unary_value, op=UnaryOp.GELU.value, n=7)))
    cases.append(Case("unary", "exp-n1", functools.partial(_unary_value, op="exp", n=1)))
    cases.append(Case("unary", "tanh-large", functools.partial(_unary_value, op="tanh", n=300_007)))
    cases.append(Case("unary", "silu-large", functools.partial(_unary_value, op="silu", n=100_003)))
    cases.append(Case("unary", "n0", _unary_n0))
    return cases


# --------------------------------------------------------------------------- binary


def _binary_inputs(op: str, n: int, dtype: str) -> tuple[Array, Array]:
    rng = rng_for(f"binary-{op}-{n}")
    if op == "pow":
        a = rng.uniform(0.1, 10.0, n)
        b = rng.uniform(-3.0, 3.0, n)
        special_a = [
            np.nan,
            1.0,
            np.nan,
            -2.0,
            -2.0,
            -8.0,
            0.0,
            -0.0,
            0.0,
            np.inf,
            -np.inf,
            -np.inf,
            -1.0,
            -1.0,
        ]
        special_b = [0.0, np.nan, 1.0, 3.0, 2.0, 1 / 3, -1.0, -1.0, 2.0, -2.0, 3.0, 2.0, np.inf, -np.inf]
        special_a += [2.0, 0.5, 4.0, -3.0, 1e30, 0.0, -0.0, np.inf]
        special_b += [0.5, -np.inf, 0.5, -2.0, 3.0, 0.0, 3.0, 0.0]
    else:
        a = rng.standard_normal(n) * 10
        b = rng.standard_normal(n) * 10
        if op == "div":
            b[np.abs(b) < 1e-3] = 1.0
        special_a = [np.nan, 1.0, np.nan, np.inf, -np.inf, np.inf, 0.0, 1.0, -1.0, 0.0, -0.0, 5.0, -np.inf]
        special_b = [1.0, np.nan, np.nan, np.inf, np.inf, -np.inf, 0.0, 0.0, 0.0, -1.0, 0.0, np.inf, 2.0]
    count = min(n, len(special_a))
    a[:count] = special_a[:count]
    b[:count] = special_b[:count]
    return ref.round_to(a, dtype), ref.round_to(b, dtype)


def _binary_tol(op: str, a: Array, b: Array, want: Array, dtype: str) -> Array:
    eps, tiny = eps_of(dtype), tiny_of(dtype)
    mag = np.abs(np.nan_to_num(want, posinf=0.0, neginf=0.0))
    if op in ("max", "min"):
        return np.zeros_like(mag)
    if op == "pow":
        with np.errstate(all="ignore"):
            spread = np.nan_to_num(np.abs(b * np.log(np.abs(a))), nan=0.0, posinf=0.0)
        return (16 + 4 * spread) * eps * mag + tiny
    return 3 * eps * mag + tiny  # add, sub, mul, div: one rounding (two for a fused path)


def _binary_value(
    be: ComputeBackend, *, op: str, n: int = 1003, alias: str = "", dtype: str | None = None
) -> float:
    dt = dtype or "float32"
    a, b = _binary_inputs(op.lower(), n, dt)
    if alias == "a=b=out":
        b = a.copy()
    kw = {} if dtype is None else {"dtype": dtype}
    with Workspace(be) as ws:
        pa = ws.put(storage(a, dt), label="a")
        pb = pa if alias == "a=b=out" else ws.put(storage(b, dt), label="b")
        if alias in ("out=a", "a=b=out"):
            po = pa
        elif alias == "out=b":
            po = pb
        else:
            po = ws.put(storage(np.full(n, 123.0), dt), label="output")
        if not call_or_refuse(be, ws, "binary", dt, lambda: be.binary(op, pa, pb, po, n, **kw)):
            return 0.0
        got = ws.get(po, (n,), dt)
        untouched = tuple(label for label, ptr in (("a", pa), ("b", pb)) if ptr != po)
        ws.check_unchanged(untouched)
    want = ref.binary(op.lower(), a, b)
    tol = storage_tol(_binary_tol(op.lower(), a, b, want, dt), want, dt)
    return assert_close(f"binary({op})", got, want, tol, dtype=dt)


def _binary_n0(be: ComputeBackend) -> float:
    with Workspace(be) as ws:
        pa = ws.put(np.ones(4, dtype=np.float32), label="a")
        pb = ws.put(np.ones(4, dtype=np.float32), label="b")
        po = ws.put(np.full(4, 5.0, dtype=np.float32), label="output")
        be.binary("add", pa, pb, po, 0)
        ws.check_unchanged()
    return 0.0


def _binary_cases() -> list[Case]:
    cases: list[Case] = []
    for op in (member.value for member in BinaryOp):
        cases.append(Case("binary", op, functools.partial(_binary_value, op=op)))
        cases.append(Case("binary", f"{op}-out-is-a", functools.partial(_binary_value, op=op, alias="out=a")))
        cases.append(Case("binary", f"{op}-out-is-b", functools.partial(_binary_value, op=op, alias="out=b")))
        for dt in DTYPES:
            cases.append(
                Case(
                    "binary",
                    f"{op}-nan-inf-{SHORT[dt]}",
                    functools.partial(_binary_value, op=op, n=257, dtype=dt),
                )
            )
    cases.append(
        Case("binary", "mul-a-b-out-same", functools.partial(_binary_value, op="mul", alias="a=b=out"))
    )
    cases.append(Case("binary", "add-large", functools.partial(_binary_value, op="add", n=300_007)))
    cases.append(Case("binary", "n0", _binary_n0))
    return cases


# --------------------------------------------------------------------------- broadcasting

BROADCAST_SHAPES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "row-vector": ((5, 7), (7,)),
    "column": ((5, 7), (5, 1)),
    "outer": ((4, 1, 3), (1, 5, 1)),
    "scalar-0d": ((3, 4), ()),
    "scalar-first": ((1,), (6, 5, 4)),
    "same-shape": ((3, 4, 5), (3, 4, 5)),
    "rank6": ((2, 1, 3, 1, 2, 1), (1, 2, 1, 2, 1, 3)),
    "empty-dim": ((0, 4), (1, 4)),
    "larger": ((64, 1, 33), (1, 65, 33)),
}


def _broadcast_value(
    be: ComputeBackend,
    *,
    op: str,
    shapes: tuple[tuple[int, ...], tuple[int, ...]],
    dtype: str = "float32",
    alias: str = "",
    specials: bool = False,
) -> float:
    sa, sb = shapes
    so = np.broadcast_shapes(sa, sb)
    rng = rng_for(f"bcast-{op}-{sa}-{sb}")
    a = rng.standard_normal(sa) * 3 + (4.0 if op == "pow" else 0.0)
    b = rng.standard_normal(sb) * (1.0 if op == "pow" else 3.0)
    if specials:
        a.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, 0.0][: a.size]
        b.reshape(-1)[-3:] = [np.nan, 0.0, -np.inf][-b.size :]
    a, b = ref.round_to(a, dtype), ref.round_to(b, dtype)
    size = int(np.prod(so))
    with Workspace(be) as ws:
        if alias == "out=a":  # a has the output's shape here
            pa = po = ws.put(storage(a, dtype), label="a")
            pb = ws.put(storage(b, dtype), label="b")
        elif alias == "shifted":  # out starts 3 elements into a's range (same allocation)
            block = ws.put_bytes(
                storage(np.concatenate([a.reshape(-1), np.zeros(3)]), dtype).view(np.uint8), label="a"
            )
            pa, po = block.ptr, block.ptr + 3 * storage_dtype(dtype).itemsize
            pb = ws.put(storage(b, dtype), label="b")
        else:
            pa, pb = ws.put(storage(a, dtype), label="a"), ws.put(storage(b, dtype), label="b")
            po = ws.put(storage(np.full(so, 99.0), dtype), label="out")

        def call() -> None:
            be.broadcast_binary(op, pa, list(sa), pb, list(sb), po, list(so), dtype=dtype)

        if not call_or_refuse(be, ws, "broadcast_binary", dtype, call):
            return 0.0
        got = ws.get(po, so, dtype) if alias != "shifted" else ws.get(pa, size + 3, dtype)[3:].reshape(so)
        ws.check_unchanged(("b",) if alias else ("a", "b"))
    want = ref.broadcast_binary(op, a, b)
    ab = np.broadcast_arrays(a, b)
    tol = storage_tol(_binary_tol(op, ab[0], ab[1], want, dtype), want, dtype)
    return assert_close(f"broadcast_binary({op}, {list(sa)}, {list(sb)})", got, want, tol, dtype=dtype)


def _broadcast_cases() -> list[Case]:
    cases: list[Case] = []
    ops = [member.value for member in BinaryOp]
    for i, (name, shapes) in enumerate(BROADCAST_SHAPES.items()):
        op = ops[i % len(ops)]
        cases.append(
            Case(
                "broadcast_binary", f"{name}-{op}", functools.partial(_broadcast_value, op=op, shapes=shapes)
            )
        )
    for op in ops:
        cases.append(
            Case(
                "broadcast_binary",
                f"outer-2d-{op}",
                functools.partial(_broadcast_value, op=op, shapes=((4, 1, 3), (5, 1))),
            )
        )
    cases.append(
        Case(
            "broadcast_binary",
            "out-is-a",
            functools.partial(_broadcast_value, op="sub", shapes=((4, 6), (6,)), alias="out=a"),
        )
    )
    cases.append(
        Case(
            "broadcast_binary",
            "out-overlaps-a",
            functools.partial(_broadcast_value, op="mul", shapes=((5, 6), (5, 1)), alias="shifted"),
        )
    )
    for dt in DTYPES:
        run = functools.partial(_broadcast_value, shapes=((3, 1, 5), (4, 1)), dtype=dt)
        cases.append(Case("broadcast_binary", f"add-{SHORT[dt]}", functools.partial(run, op="add")))
        for op in ("max", "pow", "div"):
            cases.append(
                Case(
                    "broadcast_binary",
                    f"{op}-nan-inf-{SHORT[dt]}",
                    functools.partial(run, op=op, specials=True),
                )
            )
    return cases


# --------------------------------------------------------------------------- cast


def assert_exact(what: str, got: npt.NDArray[Any], want: Array, dtype: str) -> None:
    """``got`` (stored as ``dtype``) must be ``want`` rounded to ``dtype``, bit for bit (NaN: any NaN)."""
    expected = storage(want, dtype)
    nan = np.isnan(want)
    got64 = np.asarray(got, dtype=np.float64)
    if not np.array_equal(np.isnan(got64), nan):
        i = int(np.flatnonzero(np.isnan(got64) != nan)[0])
        raise AssertionError(f"{what}[{i}]: got {got64[i]!r}, expected {expected[i]!r} (NaN mismatch)")
    assert_bits_equal(what, np.asarray(got)[~nan], expected[~nan])


def _cast_values(src: str, dst: str) -> Array:
    """Specials, ties and range edges of ``dst``, as values of ``src``."""
    values = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -2.5, 0.1, 1 / 3, 1e-3]
    values += [1 + 2.0**-11, 1 + 3 * 2.0**-11, 2049.0, 2051.0, 65504.0, 65519.0, 65520.0, 70000.0, -1e5]
    values += [1 + 2.0**-8, 1 + 3 * 2.0**-8, 257.0, 259.0, 3.3895e38, 3.3961e38, 3.4e38, -3.5e38, 1e39]
    values += [1 + 2.0**-8 + 2.0**-40, 1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-24, 1 + 2.0**-24 + 2.0**-60]
    values += [6e-8, 3e-8, 2.0**-25, 2.0**-24 * 1.5, 1e-40, 2.0**-149, 2.0**-150, 1e-310, -1e-45, 5e-324]
    rng = rng_for(f"cast-{src}-{dst}")
    values += list(rng.standard_normal(64) * 10.0 ** rng.integers(-8, 8, 64))
    return ref.round_to(np.array(values, dtype=np.float64), src)


def _cast_value(be: ComputeBackend, *, src: str, dst: str, in_place: bool = False) -> float:
    x = _cast_values(src, dst)
    n = x.size
    src_item, dst_item = storage_dtype(src).itemsize, storage_dtype(dst).itemsize
    with Workspace(be) as ws:
        if in_place:  # one allocation big enough for either side
            payload = np.zeros(n * max(src_item, dst_item), dtype=np.uint8)
            payload[: n * src_item] = storage(x, src).view(np.uint8)
            px = po = ws.put_bytes(payload, label="data").ptr
        else:
            px = ws.put(storage(x, src), label="input")
            po = ws.put(storage(np.full(n, 7.0), dst), label="output")

        def call() -> None:
            be.cast(px, po, n, dtype=src, out_dtype=dst)

        if not (offered(be, "cast", src) and offered(be, "cast", dst)):
            with expect_error(
                UnsupportedError, f"cast from {src} to {dst}, not both in capabilities().dtypes('cast')"
            ):
                call()
            ws.check_unchanged()
            note_refused(f"cast:{src}->{dst}")
            return 0.0
        call()
        got = ws.get(po, (n,), dst)
        if not in_place:
            ws.check_unchanged(("input",))
    assert_exact(f"cast({src} -> {dst})", got, ref.cast(x, dst), dst)
    return 0.0


def _cast_cases() -> list[Case]:
    cases = [
        Case("cast", f"{SHORT[s]}-to-{SHORT[d]}", functools.partial(_cast_value, src=s, dst=d))
        for s in DTYPES
        for d in DTYPES
    ]
    cases.append(
        Case(
            "cast",
            "f32-to-f16-in-place",
            functools.partial(_cast_value, src="float32", dst="float16", in_place=True),
        )
    )
    cases.append(
        Case(
            "cast",
            "bf16-to-f32-in-place",
            functools.partial(_cast_value, src="bfloat16", dst="float32", in_place=True),
        )
    )
    cases.append(
        Case(
            "cast", "f64-to-bf16-nan-inf-ties", functools.partial(_cast_value, src="float64", dst="bfloat16")
        )
    )
    return cases


def elementwise_cases() -> list[Case]:
    """Every unary, binary, broadcast_binary and cast value case."""
    return _unary_cases() + _binary_cases() + _broadcast_cases() + _cast_cases()
