"""Shared pieces of the conformance kit: the case record, seeded data, dtypes, comparisons.

How tolerances are chosen (16-bit storage types included) is described in the package
docstring of :mod:`computehal.testing`; :func:`storage_tol` implements the 16-bit rule.
"""

from __future__ import annotations

import contextvars
import functools
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ALL_OPS, COMPUTE_OPS, ComputeBackend
from ..errors import UnsupportedError
from .reference import dtype_name, round_to, ulp
from .workspace import Workspace, expect_error

__all__ = [
    "Case",
    "DTYPES",
    "EPS32",
    "EPS64",
    "OPS",
    "SHORT",
    "TINY32",
    "TINY64",
    "assert_close",
    "assert_bits_equal",
    "call_or_refuse",
    "colmajor",
    "config_cases",
    "dtype_cases",
    "eps_of",
    "frozen",
    "note_refused",
    "offered",
    "recording_refusals",
    "rng_for",
    "storage_tol",
    "tiny_of",
    "value_case",
]

#: Machine epsilon (2**-23) of float32: the unit in tolerances below.
EPS32 = float(np.finfo(np.float32).eps)
#: Machine epsilon of float64.
EPS64 = float(np.finfo(np.float64).eps)
#: Smallest normal float32 / float64: results below it may be flushed to zero.
TINY32 = 2.0**-126
TINY64 = 2.0**-1022

#: The dtypes every compute op is tried with, narrowest first.
DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64")
#: Short names used in case names.
SHORT: dict[str, str] = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}

#: Case groups, in report order: every compute method of the contract, then memory and lifecycle.
OPS: tuple[str, ...] = (*ALL_OPS, "alloc", "free", "copy", "freeze", "lifecycle")


def eps_of(dtype: Any) -> float:
    """Unit roundoff of the arithmetic type of ``dtype`` (float32 for the 16-bit storage types)."""
    return EPS64 if dtype_name(dtype) == "float64" else EPS32


def tiny_of(dtype: Any) -> float:
    """Smallest normal number of the arithmetic type of ``dtype``."""
    return TINY64 if dtype_name(dtype) == "float64" else TINY32


def storage_tol(tol: npt.ArrayLike, want: npt.ArrayLike, dtype: Any) -> npt.NDArray[np.float64]:
    """The tolerance of a result stored as ``dtype``, given the float32 (or float64) bound ``tol``.

    For float16 / bfloat16: ``tol + ulp16(|want| + tol)``, see the module notes.
    """
    t = np.asarray(tol, dtype=np.float64)
    if dtype_name(dtype) not in ("float16", "bfloat16"):
        return np.broadcast_to(t, np.shape(want)).astype(np.float64)
    mag = np.abs(np.nan_to_num(np.asarray(want, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0))
    return np.asarray(t + ulp(mag + t, dtype), dtype=np.float64)


# --------------------------------------------------------------------------- dtypes offered

_REFUSALS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("refusals", default=None)


@contextmanager
def recording_refusals() -> Iterator[list[str]]:
    """Collect, for the block, what the backend refused and the kit accepted (see :func:`note_refused`)."""
    seen: list[str] = []
    token = _REFUSALS.set(seen)
    try:
        yield seen
    finally:
        _REFUSALS.reset(token)


def note_refused(what: str) -> None:
    """Record that the case accepted an UnsupportedError for ``what`` (a dtype or op not offered)."""
    seen = _REFUSALS.get()
    if seen is not None:
        seen.append(what)


def frozen(be: ComputeBackend, ptr: int) -> bool:
    """Freeze the allocation holding ``ptr``; False when the backend says it cannot (the ABC's default)."""
    try:
        be.freeze(ptr)
    except UnsupportedError:
        return False
    return True


def offered(be: ComputeBackend, op: str, dtype: Any = "float32") -> bool:
    """True when ``be`` says that ``op`` takes ``dtype`` (``capabilities().dtypes(op)``).

    A backend that publishes no table at all (``op_dtypes`` empty, as the seed's
    default capabilities) is held to the seed's profile: float32 for the seed's compute
    operations, and float64 for ``gemm`` / ``batched_gemm`` when ``supports_fp64``.
    """
    caps = be.capabilities()
    name = dtype if dtype == "uint8" else dtype_name(dtype)
    if caps.op_dtypes:
        return name in caps.dtypes(op)
    if op not in COMPUTE_OPS:
        return False
    return name == "float32" or (name == "float64" and op in ("gemm", "batched_gemm") and caps.supports_fp64)


def call_or_refuse(
    be: ComputeBackend, ws: Workspace, op: str, dtype: Any, call: Callable[[], object]
) -> bool:
    """Run ``call`` when ``op`` takes ``dtype`` on ``be`` and return True.

    Otherwise the call must raise :class:`~computehal.UnsupportedError` and leave every
    allocation of ``ws`` unchanged; returns False (the case then has nothing to compare).
    """
    name = dtype if dtype == "uint8" else dtype_name(dtype)
    if offered(be, op, name):
        call()
        return True
    with expect_error(
        UnsupportedError, f"{op} with dtype {name}, which capabilities().dtypes({op!r}) does not list"
    ):
        call()
    ws.check_unchanged()
    note_refused(f"{op}:{name}")
    return False


@dataclass(frozen=True)
class Case:
    """One conformance check.

    Attributes
    ----------
    op : str
        The group it belongs to (a method name such as ``"gemm"``, or ``"alloc"``,
        ``"free"``, ``"copy"``, ``"lifecycle"``).
    name : str
        Short name, unique within ``op`` (``"NT-ld"``, ``"bad-freed-ptr"``).
    run : callable
        ``run(backend) -> float``: runs the check on an initialised backend and
        returns the largest error seen (0.0 for exact or error-path checks). Raises
        ``AssertionError`` with an explanation on any mismatch.
    """

    op: str
    name: str
    run: Callable[[ComputeBackend], float]

    @property
    def id(self) -> str:
        """``"<op>-<name>"``, e.g. ``"gemm-NT-ld"``."""
        return f"{self.op}-{self.name}"


def value_case(op: str, name: str, run: Callable[..., float], /, **keywords: Any) -> Case:
    """The case ``op``-``name`` that calls ``run(backend, **keywords)``."""
    return Case(op, name, functools.partial(run, **keywords))


def dtype_cases(op: str, stem: str, run: Callable[..., float], cfg: Any, /, **keywords: Any) -> list[Case]:
    """The cases ``op``-``stem``-``<dtype>``: ``run`` once per storage dtype.

    Each calls ``run(backend, cfg=..., **keywords)`` with ``cfg`` (a dataclass with a
    ``dtype`` field) retyped to that dtype.
    """
    return [
        value_case(op, f"{stem}-{SHORT[dt]}", run, cfg=replace(cfg, dtype=dt), **keywords) for dt in DTYPES
    ]


def config_cases(
    op: str, run: Callable[..., float], configs: dict[str, Any], typed: Sequence[str], prefix: str
) -> list[Case]:
    """One case per named config (label ``<prefix>-<name>``), then the configs named in
    ``typed`` once per storage dtype (:func:`dtype_cases`, label ``<name>``)."""
    cases = [value_case(op, name, run, label=f"{prefix}-{name}", cfg=cfg) for name, cfg in configs.items()]
    for name in typed:
        cases += dtype_cases(op, name, run, configs[name], label=name)
    return cases


def rng_for(label: str) -> np.random.Generator:
    """A generator seeded from ``label``: every case draws the same data every run."""
    return np.random.default_rng(zlib.crc32(label.encode()))


def colmajor(matrix: npt.ArrayLike, ld: int, fill: float) -> npt.NDArray[np.float64]:
    """Store ``matrix`` column-major with leading dimension ``ld``; padding rows get ``fill``."""
    mat = np.asarray(matrix, dtype=np.float64)
    rows, cols = mat.shape
    flat = np.full(ld * cols, fill, dtype=np.float64)
    for j in range(cols):
        flat[j * ld : j * ld + rows] = mat[:, j]
    return flat


def _where(shape: tuple[int, ...], flat_index: int) -> str:
    if not shape:
        return ""
    return "[" + ", ".join(str(int(i)) for i in np.unravel_index(flat_index, shape)) + "]"


def assert_close(
    what: str,
    got: npt.ArrayLike,
    want: npt.ArrayLike,
    tol: npt.ArrayLike,
    *,
    dtype: Any = np.float32,
) -> float:
    """Compare ``got`` with the exact ``want``; return the largest (mixed) error.

    The returned figure is ``max(|got - want| / max(1, |want|))``: the absolute error
    for entries of magnitude up to 1 and the relative error above, so a large ``exp``
    result does not dominate the report. Tolerances are checked on the absolute error.

    ``want`` is first rounded to ``dtype`` (nearest even, :func:`~.reference.round_to`;
    so a float64 value beyond the float32 range is compared as the infinity float32
    must produce). NaN must appear exactly
    where ``want`` has NaN, infinities must match exactly, and every finite entry
    must satisfy ``|got - want| <= tol`` (``tol`` broadcasts).

    Raises
    ------
    AssertionError
        Naming ``what``, the first bad index, both values and the tolerance.
    """
    g = np.asarray(got, dtype=np.float64)
    w = round_to(want, dtype)
    if g.shape != w.shape:
        raise AssertionError(f"{what}: result shape {g.shape} != expected {w.shape}")
    t = np.broadcast_to(np.asarray(tol, dtype=np.float64), w.shape)
    if g.size == 0:
        return 0.0
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    bad = np.flatnonzero((nan_g != nan_w).reshape(-1))
    if bad.size:
        i = int(bad[0])
        raise AssertionError(
            f"{what}{_where(w.shape, i)}: got {g.reshape(-1)[i]!r}, expected {w.reshape(-1)[i]!r} "
            f"({bad.size} NaN mismatch(es))"
        )
    special = (np.isinf(g) | np.isinf(w)) & ~nan_w
    bad = np.flatnonzero((special & (g != w)).reshape(-1))
    if bad.size:
        i = int(bad[0])
        raise AssertionError(
            f"{what}{_where(w.shape, i)}: got {g.reshape(-1)[i]!r}, expected {w.reshape(-1)[i]!r} "
            f"({bad.size} infinity mismatch(es))"
        )
    finite = ~(nan_w | special)
    with np.errstate(invalid="ignore"):
        err = np.where(finite, np.abs(g - w), 0.0)
    bad = np.flatnonzero((err > t).reshape(-1))
    if bad.size:
        i = int(bad[0])
        raise AssertionError(
            f"{what}{_where(w.shape, i)}: got {g.reshape(-1)[i]!r}, expected {w.reshape(-1)[i]!r}, "
            f"|error| {err.reshape(-1)[i]:.3g} > tolerance {t.reshape(-1)[i]:.3g} "
            f"({bad.size} of {w.size} entries out of tolerance, max error {err.max():.3g})"
        )
    scaled = err / np.maximum(1.0, np.where(finite, np.abs(w), 1.0))
    return float(scaled.max())


def assert_bits_equal(what: str, got: npt.ArrayLike, want: npt.ArrayLike) -> None:
    """Assert two arrays are identical bit for bit (NaN payloads included)."""
    g = np.ascontiguousarray(got)
    w = np.ascontiguousarray(want, dtype=g.dtype)
    if g.shape != w.shape:
        raise AssertionError(f"{what}: shape {g.shape} != expected {w.shape}")
    gb = g.view(np.uint8).reshape(g.size, -1) if g.size else g.view(np.uint8)
    wb = w.view(np.uint8).reshape(w.size, -1) if w.size else w.view(np.uint8)
    differs = np.flatnonzero((gb != wb).any(axis=-1)) if g.size else np.zeros(0, dtype=np.intp)
    if differs.size:
        i = int(differs[0])
        raise AssertionError(
            f"{what}{_where(w.shape, i)}: got {g.reshape(-1)[i]!r}, expected it unchanged at "
            f"{w.reshape(-1)[i]!r} ({differs.size} element(s) changed)"
        )
