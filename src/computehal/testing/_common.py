"""Shared pieces of the conformance kit: the case record, seeded data, comparisons."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import COMPUTE_OPS, ComputeBackend

__all__ = [
    "Case",
    "EPS32",
    "EPS64",
    "OPS",
    "assert_close",
    "assert_bits_equal",
    "rng_for",
    "colmajor",
]

#: Machine epsilon (2**-23) of float32: the unit in tolerances below.
EPS32 = float(np.finfo(np.float32).eps)
#: Machine epsilon of float64.
EPS64 = float(np.finfo(np.float64).eps)

#: Case groups, in report order: the compute methods of the trait, then memory and lifecycle.
OPS: tuple[str, ...] = (*COMPUTE_OPS, "alloc", "free", "copy", "lifecycle")


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

    ``want`` is first rounded to ``dtype`` (so a float64 value beyond the float32
    range is compared as the infinity float32 must produce). NaN must appear exactly
    where ``want`` has NaN, infinities must match exactly, and every finite entry
    must satisfy ``|got - want| <= tol`` (``tol`` broadcasts).

    Raises
    ------
    AssertionError
        Naming ``what``, the first bad index, both values and the tolerance.
    """
    g = np.asarray(got, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.asarray(np.asarray(want, dtype=np.float64).astype(dtype), dtype=np.float64)
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
