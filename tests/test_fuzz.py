"""Property-based fuzz of every operation with random, often invalid, arguments.

For each call on each backend of ``BACKEND_FACTORIES``:

* only :class:`~computehal.BackendError` subclasses may escape;
* when the call raises, every byte of every operand allocation is unchanged;
* when it succeeds, nothing was written outside the output operand's byte range
  (computed from the arguments by the op's definition).

Operands sit in the middle of guarded allocations (canary bytes on both sides), and
pointers are drawn from valid interior pointers, freed, zero, unknown, end-of-
allocation and non-integer values. ``COMPUTEHAL_FUZZ_EXAMPLES`` sets the number of
examples per op (default 60).

A second fuzz makes valid calls hostile: integer arguments whose ``__index__`` frees an
operand or another allocation, closes the backend, raises or lies, and index arrays that
are masked, read-only or strided (``COMPUTEHAL_FUZZ_HOSTILE_EXAMPLES`` examples per
backend, default 120).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from computehal import BackendError, ComputeBackend
from computehal.testing.workspace import Block, Workspace
from conftest import make_backend, runnable_backends

EXAMPLES = int(os.environ.get("COMPUTEHAL_FUZZ_EXAMPLES", "60"))
NBLOCKS = 4
BLOCK_FLOATS = 256

# --------------------------------------------------------------------------- strategies

SMALL = st.integers(0, 6)
BAD_COUNT = st.sampled_from([-1, -(2**40), 2**31, 2**40, 2**64, 2.0, None, "3", True, [2]])
COUNT = st.one_of(SMALL, SMALL, SMALL, SMALL, BAD_COUNT)
SHAPE_ENTRY = st.one_of(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4), BAD_COUNT)
SHAPE = st.one_of(
    st.lists(SHAPE_ENTRY, min_size=0, max_size=5),
    st.lists(st.integers(1, 4), min_size=1, max_size=4),
    st.sampled_from([None, "abc", 3, (2, 3), np.array([2, 3])]),
)
SCALAR = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, -1.0, 0, 2, None, "1.0", 1j]),
)
BAD_ENUM = st.sampled_from(["bogus", None, 3, "", b"N"])
TRANS = st.one_of(st.sampled_from(["N", "T", "C", "n", "t"]), BAD_ENUM)
PREC = st.one_of(st.sampled_from(["f16", "bf16", "BF16"]), BAD_ENUM)
REDUCE_OP = st.one_of(st.sampled_from(["sum", "max", "min", "mean"]), BAD_ENUM)
UNARY_OP = st.one_of(
    st.sampled_from(["relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "neg"]), BAD_ENUM
)
BINARY_OP = st.one_of(st.sampled_from(["add", "sub", "mul", "div", "max", "min"]), BAD_ENUM)
CAUSAL = st.one_of(st.booleans(), st.booleans(), st.sampled_from([None, "yes", 1, np.bool_(True)]))
DTYPE = st.sampled_from(
    ["float32", "float32", "float64", np.float32, np.dtype(np.float64), "int32", None, "bogus"]
)
INDEX_LIST = st.lists(st.integers(-2, 8), max_size=8)
INDICES = st.one_of(
    INDEX_LIST,
    INDEX_LIST,
    INDEX_LIST.map(lambda v: np.asarray(v, dtype=np.int32)),
    INDEX_LIST.map(lambda v: np.asarray(v, dtype=np.int64)),
    st.sampled_from(
        [None, "12", 3, [1.0], [None], np.zeros((2, 2), dtype=np.int64), np.array([0.5]), [2**70]]
    ),
)
PTR = st.one_of(
    st.tuples(
        st.just("block"), st.integers(0, NBLOCKS - 1), st.sampled_from([0, 0, 0, 0, 4, 8, 12, 64, 256])
    ),
    st.tuples(st.just("block"), st.integers(0, NBLOCKS - 1), st.sampled_from([1, 2, 1020, 1024])),
    st.sampled_from(
        [("freed",), ("zero",), ("unknown",), ("end",), ("none",), ("float",), ("neg",), ("huge",)]
    ),
)


@st.composite
def conv_shapes(draw: st.DrawFn, perturb: bool = True) -> tuple[Any, Any, Any, Any, Any]:
    """A consistent (input, filter, output, stride, padding) set; perturbed once in four draws."""
    n, c, k = (draw(st.integers(0, 2)) for _ in range(3))
    h, w = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    ph, pw = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    fh, fw = draw(st.integers(1, min(3, h + 2 * ph))), draw(st.integers(1, min(3, w + 2 * pw)))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    oh = (h + 2 * ph - fh) // sh + 1
    ow = (w + 2 * pw - fw) // sw + 1
    shapes: list[Any] = [[n, c, h, w], [k, c, fh, fw], [n, k, oh, ow], [sh, sw], [ph, pw]]
    if perturb and draw(st.integers(0, 3)) == 0:
        which = draw(st.integers(0, 4))
        shapes[which] = draw(SHAPE)
    return shapes[0], shapes[1], shapes[2], shapes[3], shapes[4]


# Per op: the argument kinds in positional order (and keyword arguments).
SPECS: dict[str, tuple[list[tuple[str, Any]], dict[str, Any]]] = {
    "gemm": (
        [
            ("trans_a", TRANS),
            ("trans_b", TRANS),
            ("m", COUNT),
            ("n", COUNT),
            ("k", COUNT),
            ("alpha", SCALAR),
            ("a_ptr", PTR),
            ("lda", COUNT),
            ("b_ptr", PTR),
            ("ldb", COUNT),
            ("beta", SCALAR),
            ("c_ptr", PTR),
            ("ldc", COUNT),
        ],
        {"dtype": DTYPE},
    ),
    "batched_gemm": (
        [
            ("trans_a", TRANS),
            ("trans_b", TRANS),
            ("m", COUNT),
            ("n", COUNT),
            ("k", COUNT),
            ("alpha", SCALAR),
            ("a_ptr", PTR),
            ("lda", COUNT),
            ("stride_a", COUNT),
            ("b_ptr", PTR),
            ("ldb", COUNT),
            ("stride_b", COUNT),
            ("beta", SCALAR),
            ("c_ptr", PTR),
            ("ldc", COUNT),
            ("stride_c", st.one_of(COUNT, st.integers(0, 40))),
            ("batch_count", COUNT),
        ],
        {"dtype": DTYPE},
    ),
    "gemm_mixed_precision": (
        [
            ("prec", PREC),
            ("trans_a", TRANS),
            ("trans_b", TRANS),
            ("m", COUNT),
            ("n", COUNT),
            ("k", COUNT),
            ("alpha", SCALAR),
            ("a_ptr", PTR),
            ("lda", COUNT),
            ("b_ptr", PTR),
            ("ldb", COUNT),
            ("beta", SCALAR),
            ("c_ptr", PTR),
            ("ldc", COUNT),
        ],
        {},
    ),
    "attention": (
        [
            ("q_ptr", PTR),
            ("k_ptr", PTR),
            ("v_ptr", PTR),
            ("o_ptr", PTR),
            ("batch", COUNT),
            ("heads", COUNT),
            ("seq_q", COUNT),
            ("seq_kv", COUNT),
            ("head_dim", COUNT),
            ("scale", SCALAR),
            ("causal", CAUSAL),
        ],
        {},
    ),
    "reduce": (
        [("op", REDUCE_OP), ("input_ptr", PTR), ("output_ptr", PTR), ("shape", SHAPE), ("axis", COUNT)],
        {},
    ),
    "softmax": ([("input_ptr", PTR), ("output_ptr", PTR), ("shape", SHAPE), ("axis", COUNT)], {}),
    "unary": (
        [
            ("op", UNARY_OP),
            ("input_ptr", PTR),
            ("output_ptr", PTR),
            ("n", st.one_of(COUNT, st.integers(0, 300))),
        ],
        {},
    ),
    "binary": (
        [
            ("op", BINARY_OP),
            ("a_ptr", PTR),
            ("b_ptr", PTR),
            ("output_ptr", PTR),
            ("n", st.one_of(COUNT, st.integers(0, 300))),
        ],
        {},
    ),
    "gather": (
        [("input_ptr", PTR), ("indices", INDICES), ("output_ptr", PTR), ("rows", COUNT), ("cols", COUNT)],
        {},
    ),
    "scatter": (
        [("input_ptr", PTR), ("indices", INDICES), ("output_ptr", PTR), ("rows", COUNT), ("cols", COUNT)],
        {},
    ),
}
CONV = {
    "conv2d_forward": ("input_ptr", "filter_ptr", "output_ptr"),
    "conv2d_backward_data": ("grad_output_ptr", "filter_ptr", "grad_input_ptr"),
    "conv2d_backward_filter": ("input_ptr", "grad_output_ptr", "grad_filter_ptr"),
}
OPS = sorted([*SPECS, *CONV])


# --------------------------------------------------------------------------- running one call


class Arena:
    """Guarded operand blocks plus the special pointers the strategies refer to."""

    def __init__(self, ws: Workspace, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.ws = ws
        self.blocks: list[Block] = []
        for i in range(NBLOCKS):
            data = rng.standard_normal(BLOCK_FLOATS).astype(np.float32)
            self.blocks.append(ws.block(ws.put(data, label=f"block{i}")))
        freed = ws.put(np.zeros(16, dtype=np.float32), label="freed")
        ws.release(freed)
        self.special = {
            "freed": freed,
            "zero": 0,
            "unknown": 0x40,
            "end": self.blocks[0].base + self.blocks[0].size,
            "none": None,
            "float": float(self.blocks[1].ptr),
            "neg": -self.blocks[2].ptr,
            "huge": 2**64 + self.blocks[3].ptr,
        }

    def pointer(self, token: tuple[Any, ...]) -> Any:
        if token[0] == "block":
            return self.blocks[token[1]].ptr + token[2]
        return self.special[token[0]]


def _prod(values: Any) -> int:
    return math.prod(int(v) for v in values)


def _gemm_ranges(
    a: dict[str, Any], itemsize: int, batches: int = 1, stride: int = 0
) -> list[tuple[int, int]]:
    m, n, ldc = int(a["m"]), int(a["n"]), int(a["ldc"])
    ranges = []
    for b in range(batches):
        base = int(a["c_ptr"]) + b * stride * itemsize
        for j in range(n):
            start = base + j * ldc * itemsize
            ranges.append((start, start + m * itemsize))
    return ranges


def written_ranges(op: str, a: dict[str, Any], kwargs: dict[str, Any]) -> list[tuple[int, int]]:
    """Byte ranges a successful call of ``op`` with arguments ``a`` may write (from the op's definition)."""
    if op in ("gemm", "gemm_mixed_precision"):
        size = np.dtype(kwargs.get("dtype", "float64" if op == "gemm" else "float32")).itemsize
        return _gemm_ranges(a, size)
    if op == "batched_gemm":
        size = np.dtype(kwargs.get("dtype", "float32")).itemsize
        return _gemm_ranges(a, size, int(a["batch_count"]), int(a["stride_c"]))
    if op in CONV:
        out_ptr = CONV[op][2]
        shape_name = out_ptr.replace("_ptr", "_shape")
        return [(int(a[out_ptr]), int(a[out_ptr]) + 4 * _prod(a[shape_name]))]
    if op == "attention":
        count = int(a["batch"]) * int(a["heads"]) * int(a["seq_q"]) * int(a["head_dim"])
        return [(int(a["o_ptr"]), int(a["o_ptr"]) + 4 * count)]
    if op in ("reduce", "softmax"):
        shape = [int(v) for v in a["shape"]]
        if op == "reduce":
            del shape[int(a["axis"])]
        return [(int(a["output_ptr"]), int(a["output_ptr"]) + 4 * _prod(shape))]
    if op in ("unary", "binary"):
        return [(int(a["output_ptr"]), int(a["output_ptr"]) + 4 * int(a["n"]))]
    if op == "gather":
        return [(int(a["output_ptr"]), int(a["output_ptr"]) + 4 * len(a["indices"]) * int(a["cols"]))]
    if op == "scatter":
        return [(int(a["output_ptr"]), int(a["output_ptr"]) + 4 * int(a["rows"]) * int(a["cols"]))]
    raise AssertionError(op)


def check_memory(arena: Arena, allowed: list[tuple[int, int]], what: str) -> None:
    """Every byte of every live block outside ``allowed`` must equal its recorded contents."""
    for block in arena.ws.blocks:
        if not block.live:
            continue
        raw = arena.ws.read_block(block)
        may_change = np.zeros(block.size, dtype=bool)
        for start, stop in allowed:
            lo, hi = max(start, block.base) - block.base, min(stop, block.base + block.size) - block.base
            if lo < hi:
                may_change[lo:hi] = True
        changed = np.flatnonzero((raw != block.contents) & ~may_change)
        if changed.size:
            offset = int(changed[0]) - block.lo
            raise AssertionError(
                f"{what}: {changed.size} byte(s) of {block.label} changed outside the operands "
                f"(first at byte offset {offset} from the operand start)"
            )


VALID_PTR = st.tuples(st.just("block"), st.integers(0, NBLOCKS - 1), st.sampled_from([0, 4, 8, 64]))
VALID_SCALAR = st.sampled_from([0.0, 1.0, -0.5, 2.0, 0.25])


@st.composite
def valid_gemm(draw: st.DrawFn, op: str) -> tuple[dict[str, Any], dict[str, Any]]:
    ta, tb = draw(st.sampled_from("NTC")), draw(st.sampled_from("NTC"))
    m, n, k = draw(st.integers(0, 6)), draw(st.integers(0, 6)), draw(st.integers(0, 6))
    a_rows, a_cols = (k, m) if ta != "N" else (m, k)
    b_rows, b_cols = (n, k) if tb != "N" else (k, n)
    a: dict[str, Any] = {}
    if op == "gemm_mixed_precision":
        a["prec"] = draw(st.sampled_from(["f16", "bf16"]))
    a.update(trans_a=ta, trans_b=tb, m=m, n=n, k=k, alpha=draw(VALID_SCALAR))
    lda = max(1, a_rows) + draw(st.integers(0, 2))
    ldb = max(1, b_rows) + draw(st.integers(0, 2))
    ldc = max(1, m) + draw(st.integers(0, 2))
    kwargs: dict[str, Any] = {}
    if op == "gemm":
        kwargs["dtype"] = draw(st.sampled_from(["float32", "float64"]))
    if op == "batched_gemm":
        batch = draw(st.integers(0, 3))
        stride_a = 0 if draw(st.booleans()) else lda * a_cols + draw(st.integers(0, 3))
        a.update(a_ptr=draw(VALID_PTR), lda=lda, stride_a=stride_a)
        a.update(b_ptr=draw(VALID_PTR), ldb=ldb, stride_b=ldb * b_cols + draw(st.integers(0, 3)))
        a.update(beta=draw(VALID_SCALAR), c_ptr=draw(VALID_PTR), ldc=ldc)
        a.update(stride_c=ldc * n + draw(st.integers(0, 3)), batch_count=batch)
        kwargs["dtype"] = "float32"
        return a, kwargs
    a.update(a_ptr=draw(VALID_PTR), lda=lda, b_ptr=draw(VALID_PTR), ldb=ldb, beta=draw(VALID_SCALAR))
    a.update(c_ptr=draw(VALID_PTR), ldc=ldc)
    return a, kwargs


@st.composite
def valid_other(draw: st.DrawFn, op: str) -> tuple[dict[str, Any], dict[str, Any]]:
    if op == "attention":
        dims = [draw(st.integers(1, 3)) for _ in range(2)] + [draw(st.integers(1, 4)) for _ in range(3)]
        a: dict[str, Any] = {name: draw(VALID_PTR) for name in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}
        a.update(zip(("batch", "heads", "seq_q", "seq_kv", "head_dim"), dims, strict=True))
        a.update(scale=draw(st.floats(-2, 2)), causal=draw(st.booleans()))
        return a, {}
    if op in ("reduce", "softmax"):
        shape = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
        a = {
            "op": draw(REDUCE_OP.filter(lambda v: isinstance(v, str) and v in ("sum", "max", "min", "mean")))
        }
        if op == "softmax":
            a = {}
        a.update(input_ptr=draw(VALID_PTR), output_ptr=draw(VALID_PTR), shape=shape)
        a["axis"] = draw(st.integers(0, len(shape) - 1))
        return a, {}
    if op in ("unary", "binary"):
        a = {
            "op": draw(
                st.sampled_from(["relu", "exp", "log", "neg"] if op == "unary" else ["add", "div", "max"])
            )
        }
        names = ("input_ptr", "output_ptr") if op == "unary" else ("a_ptr", "b_ptr", "output_ptr")
        a.update({name: draw(VALID_PTR) for name in names})
        a["n"] = draw(st.integers(0, 200))
        return a, {}
    if op in ("gather", "scatter"):
        rows = draw(st.integers(1, 6))
        indices = draw(st.lists(st.integers(0, rows - 1), max_size=8))
        a = {"input_ptr": draw(VALID_PTR), "indices": indices, "output_ptr": draw(VALID_PTR)}
        a.update(rows=rows, cols=draw(st.integers(0, 5)))
        return a, {}
    x_shape, f_shape, y_shape, stride, padding = draw(conv_shapes(perturb=False))
    p1, p2, p3 = CONV[op]
    shapes = {
        "conv2d_forward": [x_shape, f_shape, y_shape],
        "conv2d_backward_data": [y_shape, f_shape, x_shape],
        "conv2d_backward_filter": [x_shape, y_shape, f_shape],
    }[op]
    a = {}
    for name, shape in zip((p1, p2, p3), shapes, strict=True):
        a[name] = draw(VALID_PTR)
        a[name.replace("_ptr", "_shape")] = shape
    a.update(stride=stride, padding=padding)
    return a, {}


def wild_strategy(op: str, name: str) -> Any:
    """The anything-goes strategy for argument ``name`` of ``op``."""
    if name.endswith("_ptr"):
        return PTR
    if name.endswith("_shape") or name in ("stride", "padding"):
        return SHAPE
    if op in SPECS:
        positional, keywords = SPECS[op]
        return dict(positional).get(name, keywords.get(name))
    raise AssertionError(name)


def draw_call(op: str, data: st.DataObject) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """A valid call (often), a valid call with one argument replaced, or anything."""
    mode = data.draw(st.sampled_from(["valid", "valid", "one-bad", "one-bad", "wild"]), label="mode")
    gemm_like = op in ("gemm", "batched_gemm", "gemm_mixed_precision")
    valid = valid_gemm(op) if gemm_like else valid_other(op)
    args, kwargs = data.draw(valid, label="valid call")
    if mode == "one-bad":
        names = [*args, *kwargs]
        victim = data.draw(st.sampled_from(names), label="replaced argument")
        value = data.draw(wild_strategy(op, victim), label=victim)
        if victim in args:
            args[victim] = value
        else:
            kwargs[victim] = value
    elif mode == "wild":
        args = {name: data.draw(wild_strategy(op, name), label=name) for name in args}
        kwargs = {name: data.draw(wild_strategy(op, name), label=name) for name in kwargs}
    return list(args.items()), kwargs


@pytest.mark.parametrize("op", OPS)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
    derandomize=True,
)
@given(data=st.data())
def test_fuzz(backend: ComputeBackend, op: str, data: st.DataObject) -> None:
    drawn, kwargs = draw_call(op, data)
    with Workspace(backend, guard=64) as ws:
        arena = Arena(ws, seed=len(drawn))
        resolved = {name: arena.pointer(v) if name.endswith("_ptr") else v for name, v in drawn}
        call = f"{op}({', '.join(f'{k}={v!r}' for k, v in resolved.items())}, **{kwargs!r})"
        try:
            getattr(backend, op)(*resolved.values(), **kwargs)
        except BackendError:
            check_memory(arena, [], f"{call} raised but")
            return
        except Exception as error:  # noqa: BLE001 - this is the property under test
            raise AssertionError(
                f"{call} let a non-BackendError escape: {type(error).__name__}: {error}"
            ) from error
        check_memory(arena, written_ranges(op, resolved, kwargs), call)


# --------------------------------------------------------------------------- hostile objects

HOSTILE_EXAMPLES = int(os.environ.get("COMPUTEHAL_FUZZ_HOSTILE_EXAMPLES", "120"))
#: What a hostile integer does when its ``__index__`` runs.
EFFECTS = ("count", "free", "close", "raise", "huge", "negative")


class HostileIndex:
    """An integer argument whose ``__index__`` has a side effect (and counts its calls)."""

    def __init__(self, value: int, effect: str, arena: Arena, backend: ComputeBackend, victim: int) -> None:
        self.value, self.effect, self.arena, self.backend, self.victim = value, effect, arena, backend, victim
        self.calls = 0

    def __index__(self) -> int:
        self.calls += 1
        if self.effect == "free" and self.calls == 1:
            block = self.arena.blocks[self.victim]
            if block.live:
                self.arena.ws.release(block.ptr)
        elif self.effect == "close":
            self.backend.close()
        elif self.effect == "raise":
            raise RuntimeError("hostile __index__")
        elif self.effect == "huge":
            return 2**80
        elif self.effect == "negative":
            return -self.value - 1
        return self.value

    def __repr__(self) -> str:
        return f"HostileIndex({self.value}, {self.effect!r}, victim={self.victim})"


def _hostile_indices(kind: str, valid: list[int], rows: int) -> Any:
    """Index containers that look valid to a careless check but are not what they seem."""
    if kind == "masked-out-of-range":  # min() / max() of the masked array look fine
        data = np.asarray([*valid, rows + 5], dtype=np.int64)
        return np.ma.array(data, mask=[False] * len(valid) + [True])
    if kind == "masked-valid":
        return np.ma.array(np.asarray(valid, dtype=np.int64), mask=[i % 2 == 0 for i in range(len(valid))])
    if kind == "read-only":
        arr = np.asarray(valid, dtype=np.int32)
        arr.setflags(write=False)
        return arr
    if kind == "strided":
        return np.repeat(np.asarray(valid, dtype=np.int64), 2)[::2]
    return np.asarray(valid, dtype=np.uint8)  # "uint8"


@pytest.fixture(scope="module", params=sorted(runnable_backends()))
def private_backend(request: pytest.FixtureRequest) -> Iterator[ComputeBackend]:
    """A backend of its own for the hostile fuzz (its arguments may close it)."""
    be = make_backend(request.param)
    yield be
    be.close()


@settings(
    max_examples=HOSTILE_EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
    derandomize=True,
)
@given(data=st.data())
def test_fuzz_hostile_arguments(private_backend: ComputeBackend, data: st.DataObject) -> None:
    """Valid calls with one or two integers whose ``__index__`` frees an operand, frees
    another allocation, closes the backend, raises or lies, and index arrays that are
    masked, read-only or strided.

    Only ``BackendError`` may escape; each ``__index__`` runs at most once; no call
    hangs; when the backend is still open, nothing outside the call's outputs changed
    in any allocation still live.
    """
    be = private_backend
    if not be.is_initialized():
        be.init()
    op = data.draw(st.sampled_from(OPS), label="op")
    gemm_like = op in ("gemm", "batched_gemm", "gemm_mixed_precision")
    args, kwargs = data.draw(valid_gemm(op) if gemm_like else valid_other(op), label="valid call")
    with Workspace(be, guard=64) as ws:
        arena = Arena(ws, seed=len(args))
        plain = {name: arena.pointer(v) if name.endswith("_ptr") else v for name, v in args.items()}
        hostile: list[HostileIndex] = []
        resolved = dict(plain)
        ints = [name for name, v in plain.items() if isinstance(v, int) and not isinstance(v, bool)]
        for name in data.draw(
            st.lists(st.sampled_from(ints), min_size=1, max_size=2, unique=True), label="hostile"
        ):
            effect = data.draw(st.sampled_from(EFFECTS), label=f"{name} effect")
            victim = data.draw(st.integers(0, NBLOCKS - 1), label="victim block")
            hostile.append(HostileIndex(plain[name], effect, arena, be, victim))
            resolved[name] = hostile[-1]
        if op in ("gather", "scatter"):
            kind = data.draw(
                st.sampled_from(
                    ["plain", "masked-out-of-range", "masked-valid", "read-only", "strided", "uint8"]
                ),
                label="indices",
            )
            if kind != "plain":
                resolved["indices"] = plain["indices"] = _hostile_indices(
                    kind, list(plain["indices"]), plain["rows"]
                )
        outcome: list[BaseException] = []

        def call() -> None:
            try:
                getattr(be, op)(*resolved.values(), **kwargs)
            except BaseException as exc:  # noqa: BLE001 - judged below
                outcome.append(exc)

        worker = threading.Thread(target=call, daemon=True)
        worker.start()
        worker.join(120)
        text = f"{op}({', '.join(f'{k}={v!r}' for k, v in resolved.items())}, **{kwargs!r})"
        assert not worker.is_alive(), f"{text} hung"
        for h in hostile:
            assert h.calls <= 1, f"{text}: __index__ of {h!r} ran {h.calls} times"
        if outcome and not isinstance(outcome[0], BackendError):
            raise AssertionError(f"{text} let {type(outcome[0]).__name__} escape: {outcome[0]}") from outcome[
                0
            ]
        if not be.is_initialized():  # closed by an argument: its memory is gone
            for block in ws.blocks:
                block.live = False
            return
        allowed = [] if outcome else written_ranges(op, plain, kwargs)
        check_memory(arena, allowed, text + (" raised but" if outcome else ""))
