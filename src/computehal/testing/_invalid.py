"""Bad-input cases: every operation with invalid pointers, ranges, sizes, types and shapes.

Each case builds one valid call of an operation inside a :class:`Workspace`
(:mod:`._specs_seed`, :mod:`._specs_ext`), then makes a series of deterministic
mutations of it. Every mutated call must raise the stated
:class:`~computehal.BackendError` subclass and leave every byte of every operand
allocation (canaries included) unchanged. On a backend that does not offer the operation
in float32 at all (``capabilities().dtypes(op)``), the valid call must raise
:class:`~computehal.UnsupportedError` and each mutation may raise that instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backend import ComputeBackend
from ..errors import BackendError, InvalidArgumentError, UnsupportedError
from ._common import Case, frozen, note_refused, offered
from ._spec import CallSpec, Expected
from ._specs_ext import EXTENSION_BUILDERS
from ._specs_seed import SEED_BUILDERS
from .workspace import Workspace, expect_error

__all__ = ["invalid_cases", "CallSpec", "build_call", "OP_BUILDERS"]

#: Operation name -> builder of its valid call.
OP_BUILDERS: dict[str, Callable[[Workspace, str], CallSpec]] = {**SEED_BUILDERS, **EXTENSION_BUILDERS}


def build_call(ws: Workspace, method: str) -> CallSpec:
    """A valid call of ``method`` with its operands allocated (guarded) in ``ws``."""
    return OP_BUILDERS[method](ws, method)


# --------------------------------------------------------------------------- mutations

Mutation = tuple[str, dict[str, Any], Expected]


def _pointer_mutations(kind: str, ws: Workspace, spec: CallSpec) -> list[Mutation]:
    out: list[Mutation] = []
    for name, (nbytes, align) in spec.pointers.items():
        ptr = spec.get(name)
        block = ws.block(ptr)
        if kind == "zero-ptr":
            out.append((f"{name}=0", {name: 0}, InvalidArgumentError))
        elif kind == "unknown-ptr":
            out.append((f"{name}=0x40", {name: 0x40}, InvalidArgumentError))
            out.append((f"{name}=2**63-64", {name: 2**63 - 64}, InvalidArgumentError))
        elif kind == "freed-ptr":
            # Allocate every stand-in first and free them all afterwards, so that no
            # later allocation can reuse a freed address.
            data = ws.read_block(block)[block.lo : block.lo + block.nbytes]
            freed = ws.put_bytes(data, label=f"freed {name}")
            out.append((f"{name}=freed", {name: freed.ptr}, InvalidArgumentError))
        elif kind == "end-ptr":
            out.append((f"{name}=end of allocation", {name: block.base + block.size}, InvalidArgumentError))
        elif kind == "short-range":
            data = ws.read_block(block)[block.lo : block.lo + nbytes - 1]
            short = ws.put_bytes(data, label=f"short {name}", hi=0)
            out.append((f"{name} one byte short", {name: short.ptr}, InvalidArgumentError))
        elif kind == "misaligned-ptr" and align > 1:
            out.append((f"{name}+2 bytes", {name: ptr + 2}, InvalidArgumentError))
        elif kind == "ptr-types":
            for label, value in (
                ("None", None),
                ("float", float(ptr)),
                ("str", hex(ptr)),
                ("negative", -ptr),
                ("2**64", 2**64),
                ("bytes", b"\x00"),
            ):
                if value is None and name in spec.kwargs:
                    continue  # an optional keyword pointer: None means "not given"
                out.append((f"{name}={label}", {name: value}, InvalidArgumentError))
    if kind == "freed-ptr":
        for _, overrides, _ in out:
            for ptr in overrides.values():
                ws.release(ptr)
    return out


def _count_mutations(kind: str, spec: CallSpec) -> list[Mutation]:
    out: list[Mutation] = []
    for name in spec.counts:
        if kind == "negative-size":
            out.append((f"{name}=-1", {name: -1}, InvalidArgumentError))
        elif kind == "huge-size":
            out.append((f"{name}=2**40", {name: 2**40}, InvalidArgumentError))
            out.append((f"{name}=2**70", {name: 2**70}, InvalidArgumentError))
        elif kind == "wrong-types":
            value = spec.get(name)
            for label, bad in (
                ("float", float(value)),
                ("None", None),
                ("str", str(value)),
                ("list", [value]),
            ):
                out.append((f"{name}={label}", {name: bad}, InvalidArgumentError))
    for name, length in spec.shapes.items():
        value = list(spec.get(name))
        if kind == "wrong-shape-length":
            out.append((f"{name} with {length + 1} entries", {name: [*value, 1]}, InvalidArgumentError))
            out.append((f"{name} with {length - 1} entries", {name: value[:-1]}, InvalidArgumentError))
            out.append((f"{name}=[]", {name: []}, InvalidArgumentError))
        elif kind == "negative-size":
            out.append((f"{name}[0]=-1", {name: [-1, *value[1:]]}, InvalidArgumentError))
        elif kind == "huge-size":
            out.append((f"{name}[0]=2**40", {name: [2**40, *value[1:]]}, InvalidArgumentError))
        elif kind == "wrong-types":
            out.append((f"{name}=None", {name: None}, InvalidArgumentError))
            out.append((f"{name}=str", {name: "1234"[:length]}, InvalidArgumentError))
            out.append((f"{name}[0]=float", {name: [float(value[0]), *value[1:]]}, InvalidArgumentError))
            out.append((f"{name}=int", {name: 3}, InvalidArgumentError))
    if kind == "wrong-types":
        for name in spec.scalars:
            bad_scalars: tuple[tuple[str, object], ...] = (
                ("None", None),
                ("str", "1.0"),
                ("list", [1.0]),
                ("complex", 1j),
            )
            for label, bad_scalar in bad_scalars:
                out.append((f"{name}={label}", {name: bad_scalar}, InvalidArgumentError))
        for name in spec.enums:
            for label, bad in (("unknown", "bogus"), ("None", None), ("int", 3), ("empty", "")):
                out.append((f"{name}={label}", {name: bad}, InvalidArgumentError))
    return out


GENERIC_KINDS = (
    "zero-ptr",
    "unknown-ptr",
    "freed-ptr",
    "end-ptr",
    "short-range",
    "misaligned-ptr",
    "ptr-types",
    "negative-size",
    "huge-size",
    "wrong-types",
    "wrong-shape-length",
)


def _run_mutations(be: ComputeBackend, method: str, kind: str) -> float:
    with Workspace(be, tail=0) as ws:
        spec = build_call(ws, method)
        available = offered(be, method, spec.dtype)
        if available:
            try:
                spec.call(be)
            except BackendError as error:
                raise AssertionError(
                    f"{method}: the valid call that the bad-input variants start from raised "
                    f"{type(error).__name__}: {error}"
                ) from error
        else:
            with expect_error(UnsupportedError, f"{method}, which capabilities().dtypes() does not list"):
                spec.call(be)
            note_refused(method)
        ws.refresh()
        if kind in GENERIC_KINDS:
            mutations = _pointer_mutations(kind, ws, spec) + _count_mutations(kind, spec)
        else:
            mutations = [m for m in spec.specific if m[0] == kind]
        if not mutations:
            raise AssertionError(f"no mutations of kind {kind!r} for {method}")
        for label, overrides, expected in mutations:
            allowed = expected if available else _with_unsupported(expected)
            with expect_error(allowed, f"{method}({label})"):
                spec.call(be, **overrides)
            ws.check_unchanged()
    return 0.0


def _frozen_operands(be: ComputeBackend, method: str) -> float:
    """Each pointer operand in turn in a frozen allocation: the call writes nothing frozen.

    Either it raises InvalidArgumentError having written nothing at all (the operand is
    an output), or it runs and leaves the frozen operand's bytes as they were (an input);
    at least one operand (the output) must be refused.
    """
    with _DryWorkspace() as dry:
        names = list(build_call(dry, method).pointers)  # type: ignore[arg-type]
    refused = []
    for name in names:
        with Workspace(be, tail=0) as ws:
            spec = build_call(ws, method)
            if not offered(be, method, spec.dtype):
                return 0.0
            block = ws.block(spec.get(name))
            if not frozen(be, block.base):
                return 0.0  # a backend that cannot freeze says so
            try:
                spec.call(be)
            except InvalidArgumentError:
                refused.append(name)
                ws.check_unchanged()
                continue
            after = ws.read_block(block)
            if not np.array_equal(after, block.contents):
                raise AssertionError(f"{method} wrote into the frozen allocation of {name}")
    if not refused:
        raise AssertionError(f"{method} wrote its output into a frozen allocation")
    return 0.0


def _with_unsupported(expected: Expected) -> tuple[type[BackendError], ...]:
    as_tuple = expected if isinstance(expected, tuple) else (expected,)
    return (*as_tuple, UnsupportedError)


def _applicable(method: str, kind: str) -> bool:
    with _DryWorkspace() as ws:
        spec = build_call(ws, method)  # type: ignore[arg-type]
        if kind == "wrong-shape-length":
            return bool(spec.shapes)
        if kind == "misaligned-ptr":
            return any(align > 1 for _, align in spec.pointers.values())
        if kind in ("negative-size", "huge-size"):
            return bool(spec.counts or spec.shapes)
        return True


class _DryWorkspace:
    """Stands in for :class:`Workspace` to list a call's arguments without a backend."""

    def __init__(self) -> None:
        self._next = 0x1000

    def __enter__(self) -> _DryWorkspace:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def put(self, data: Any, **kwargs: Any) -> int:
        self._next += 0x10000
        return self._next

    def put_bytes(self, data: Any, **kwargs: Any) -> Any:
        return _DryBlock(self.put(data))

    def release(self, ptr: int) -> None:
        return None


class _DryBlock:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


def _specific_names(method: str) -> list[str]:
    with _DryWorkspace() as ws:
        return [label for label, _, _ in build_call(ws, method).specific]  # type: ignore[arg-type]


def invalid_cases() -> list[Case]:
    """Bad-input cases for every operation: generic kinds first, then op-specific ones."""
    cases: list[Case] = []
    for method in OP_BUILDERS:
        for kind in GENERIC_KINDS:
            if _applicable(method, kind):
                cases.append(
                    Case(method, f"bad-{kind}", functools.partial(_run_mutations, method=method, kind=kind))
                )
        for label in _specific_names(method):
            cases.append(
                Case(method, f"bad-{label}", functools.partial(_run_mutations, method=method, kind=label))
            )
        cases.append(Case(method, "bad-frozen-output", functools.partial(_frozen_operands, method=method)))
    return cases
