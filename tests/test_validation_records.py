"""Problem records: ``@record`` keeps every dataclass behaviour with its faster ``__init__``,
and the class-level facts the dispatcher reads (operand pairs, constant outputs)."""

from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np
import pytest

from computehal import validation as v
from computehal.memory import Allocation, Region
from computehal.types import UnaryOp
from computehal.validation._core import record

PROBLEMS = sorted(
    {cls for cls in vars(v).values() if isinstance(cls, type) and issubclass(cls, v.Problem)},
    key=lambda cls: cls.__name__,
)


@pytest.mark.parametrize("cls", PROBLEMS, ids=lambda cls: cls.__name__)
def test_record_init_has_the_dataclass_signature(cls: type[v.Problem]) -> None:
    fields = dataclasses.fields(cls)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        want = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        assert p.default is want or p.default == want, (cls.__name__, f.name)
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD


def _regions() -> tuple[Region, Region]:
    alloc = Allocation(0x1000, 64, None)
    return Region(alloc, 0, 16), Region(alloc, 16, 16)


def test_record_is_a_frozen_dataclass_with_defaults() -> None:
    a, out = _regions()
    p = v.ElementwiseProblem(UnaryOp.RELU, 4, a, None, out, np.dtype(np.float32))
    assert (p.alpha, p.lo, p.hi) == (0.01, -math.inf, math.inf)
    assert p == v.ElementwiseProblem(op=UnaryOp.RELU, n=4, a=a, b=None, out=out, dtype=np.dtype(np.float32))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.n = 5  # type: ignore[misc]
    q = dataclasses.replace(p, n=2, hi=6.0)
    assert (q.n, q.hi, q.a, p.n, p.hi) == (2, 6.0, a, 4, math.inf)
    assert "ElementwiseProblem(op=<UnaryOp.RELU" in repr(p)
    with pytest.raises(TypeError):
        v.ElementwiseProblem(UnaryOp.RELU, 4, a)  # type: ignore[call-arg]


def test_record_refuses_what_it_cannot_build() -> None:
    with pytest.raises(TypeError, match="plain positional"):

        @record
        class _Factory(v.Problem):
            shape: list[int] = dataclasses.field(default_factory=list)


def test_problem_classes_know_their_overlap_pairs_and_constant_outputs() -> None:
    assert v.ElementwiseProblem.PAIRS == (("a", "out"), ("b", "out"))
    assert v.ConvForwardProblem.CONSTANT_OUTPUT and v.ConvDataProblem.CONSTANT_OUTPUT
    assert not v.ElementwiseProblem.CONSTANT_OUTPUT and not v.GemmProblem.CONSTANT_OUTPUT
    for cls in PROBLEMS:
        overrides = cls.constant_output is not v.Problem.constant_output
        assert cls.CONSTANT_OUTPUT == overrides, cls.__name__


def test_overlapping_finds_shared_bytes_only() -> None:
    alloc = Allocation(0x1000, 64, None)
    f32 = np.dtype(np.float32)

    def unary(a: Region, out: Region) -> v.ElementwiseProblem:
        return v.ElementwiseProblem(UnaryOp.NEG, a.nbytes // 4, a, None, out, f32)

    assert not unary(Region(alloc, 0, 16), Region(alloc, 16, 16)).overlapping()  # adjacent
    assert unary(Region(alloc, 0, 16), Region(alloc, 4, 16)).overlapping()  # shifted
    assert not unary(Region(alloc, 0, 16), Region(alloc, 0, 16)).overlapping()  # identical: in place
    other = Allocation(0x2000, 64, None)
    assert not unary(Region(alloc, 0, 16), Region(other, 0, 16)).overlapping()


@pytest.mark.parametrize("cls", PROBLEMS, ids=lambda cls: cls.__name__)
def test_operands_are_fields(cls: type[v.Problem]) -> None:
    """The dispatcher reads operands from the record's fields (its ``__dict__``)."""
    names = {f.name for f in dataclasses.fields(cls)}
    assert {o.field for o in cls.OPERANDS} <= names


class _CountingTuple(tuple):  # type: ignore[type-arg]
    """A tuple subclass whose iteration is caller code: the fast path must not trust it."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("hostile iteration")


@pytest.mark.parametrize(
    ("value", "length", "message"),
    [
        ((2, True), 2, "bool"),
        ([2, -1], 2, ">= 0"),
        ((2, 2**62 + 1), 2, "too large"),
        ((2, 3, 4), 2, "2 entries"),
        ([1, 2], (3, 4), "3 or 4 entries"),
        (_CountingTuple((1, 2)), 2, "could not be read"),
        ((1, 2.0), 2, "float"),
    ],
)
def test_shape_fast_path_keeps_every_refusal(value: object, length: object, message: str) -> None:
    from computehal.errors import InvalidArgumentError
    from computehal.validation._core import as_shape

    with pytest.raises(InvalidArgumentError, match=message):
        as_shape("shape", value, length)  # type: ignore[arg-type]


def test_shape_and_ints_accept_plain_and_numpy_integers_alike() -> None:
    from computehal.validation._core import as_ints, as_shape

    for value in ((3, 0, 5), [3, 0, 5], np.array([3, 0, 5]), (np.int64(3), 0, np.uint8(5)), range(3, 6, 2)):
        got = as_shape("shape", value)
        assert type(got) is tuple and all(type(x) is int for x in got)
    assert as_shape("shape", [3, 0, 5], 3) == (3, 0, 5)
    assert as_ints("strides", [-4, 0, 2**62], 3) == (-4, 0, 2**62)
    assert as_ints("strides", (np.int32(-1), 2), 2) == (-1, 2)
    with pytest.raises(Exception, match="too large"):
        as_ints("strides", [2**62 + 1, 0], 2)
