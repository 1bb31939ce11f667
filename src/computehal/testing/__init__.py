"""The public conformance kit: certify any :class:`~computehal.ComputeBackend` with one call.

>>> from computehal import CpuBackend
>>> from computehal.testing import run_conformance
>>> with CpuBackend() as backend:  # doctest: +SKIP
...     report = run_conformance(backend)
...     assert report.passed, report.summary()

Every case allocates its operands on the backend (each in the middle of a larger
allocation, between canary bytes), copies inputs in, runs the operation, copies the
result out and compares it with an independent NumPy definition
(:mod:`computehal.testing.reference`: einsum, loops and finite differences, never a
backend), then frees everything. Bad-input cases check that invalid pointers,
ranges, sizes, shapes and types raise the right :class:`~computehal.BackendError`
subclass and leave memory untouched.

Every compute operation runs in float16, bfloat16, float32 and float64. A case expects
a result when ``backend.capabilities().dtypes(op)`` lists its dtype and
:class:`~computehal.UnsupportedError` (with nothing written) otherwise; such a case is
reported as passed and ``unsupported``. NaN and infinity cases hold every backend to
the NaN rules of :class:`~computehal.ComputeBackend`'s docstrings.

Tolerances: every tolerance is an error bound of the operation's arithmetic in float32
(or float64): a multiple of that type's unit roundoff times the magnitudes the result is
built from (a sum of ``k`` terms: about ``2 (k + 2) eps`` times the sum of the terms'
magnitudes), plus the smallest normal number (a device may flush subnormals to zero).
float16 and bfloat16 are storage types, computed in float32 and rounded to nearest even
when stored; inputs are exact 16-bit values. The float32 result lies within the float32
bound ``t`` of the exact value ``v``, storing it moves it by at most half a 16-bit unit
in the last place, and the comparison is with ``v`` rounded to 16 bits (another half
unit): a 16-bit result must lie within ``t + ulp16(|v| + t)`` of ``round16(v)``. Exact
operations (copies, ``fill``, ``cast``, gather / scatter, RELU, ABS, NEG, MAX / MIN, CLIP,
max pooling) are compared bit for bit or with zero tolerance.

For pytest, parametrise over :func:`conformance_cases` (``case.id`` makes a readable
test id) and call ``case.run(backend)`` in the test.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..backend import ComputeBackend
from ..errors import BackendError
from ._common import OPS, Case, recording_refusals
from ._invalid import invalid_cases
from ._memory_cases import memory_cases
from ._values import value_cases

__all__ = [
    "Case",
    "CaseResult",
    "ConformanceReport",
    "OpSummary",
    "OPS",
    "conformance_cases",
    "run_case",
    "run_conformance",
]


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one case.

    Attributes
    ----------
    op, case : str
        The case's group and name.
    passed : bool
        True when the case ran without a mismatch.
    max_error : float
        Largest error seen, absolute for expected values of magnitude <= 1 and relative
        above (0.0 for exact and error-path checks; NaN if the case did not finish).
    seconds : float
        Wall time of the case.
    message : str
        Empty on success, else what went wrong.
    unsupported : bool
        True when the case passed because the backend refused, with
        :class:`~computehal.UnsupportedError`, a dtype or an operation that its
        ``capabilities().dtypes(op)`` does not list (so nothing was computed).
    """

    op: str
    case: str
    passed: bool
    max_error: float
    seconds: float
    message: str = ""
    unsupported: bool = False

    @property
    def id(self) -> str:
        """``"<op>-<case>"``."""
        return f"{self.op}-{self.case}"


@dataclass(frozen=True)
class OpSummary:
    """Aggregate of the cases of one op: counts, worst error, total time."""

    op: str
    cases: int
    failed: int
    max_error: float
    seconds: float
    unsupported: int = 0

    @property
    def passed(self) -> bool:
        """True when no case of this op failed."""
        return self.failed == 0


@dataclass
class ConformanceReport:
    """All case results of one :func:`run_conformance` call."""

    backend: str
    results: list[CaseResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when at least one case ran and none failed."""
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def failures(self) -> list[CaseResult]:
        """The failed cases."""
        return [r for r in self.results if not r.passed]

    def by_op(self) -> list[OpSummary]:
        """One :class:`OpSummary` per op, in :data:`OPS` order (unknown ops last)."""
        groups: dict[str, list[CaseResult]] = {}
        for result in self.results:
            groups.setdefault(result.op, []).append(result)
        order = sorted(groups, key=lambda op: (OPS.index(op) if op in OPS else len(OPS), op))
        summaries = []
        for op in order:
            rs = groups[op]
            errors = [r.max_error for r in rs if r.max_error == r.max_error]
            summaries.append(
                OpSummary(
                    op,
                    len(rs),
                    sum(not r.passed for r in rs),
                    max(errors, default=0.0),
                    sum(r.seconds for r in rs),
                    sum(r.unsupported for r in rs),
                )
            )
        return summaries

    def summary(self) -> str:
        """A plain-text table: one line per op, then every failure with its message."""
        lines = [f"conformance of backend {self.backend!r}: {'PASS' if self.passed else 'FAIL'}"]
        for s in self.by_op():
            status = "pass" if s.passed else f"FAIL ({s.failed}/{s.cases})"
            refused = f" ({s.unsupported} unsupported)" if s.unsupported else ""
            lines.append(
                f"  {s.op:<24} {status:<14} {s.cases:>4} cases{refused}  "
                f"max error {s.max_error:.3g}  {s.seconds:.2f} s"
            )
        for r in self.failures:
            lines.append(f"  FAILED {r.id}: {r.message}")
        return "\n".join(lines)


def conformance_cases(backend: ComputeBackend | None = None) -> list[Case]:
    """Every conformance case, grouped by op in :data:`OPS` order.

    Parameters
    ----------
    backend : ComputeBackend, optional
        The backend the cases are meant for. The list is the same for every
        backend; what depends on the backend (a float64 case expects
        :class:`~computehal.UnsupportedError` when ``capabilities().dtypes(op)``
        does not list float64) is decided when the case runs. Accepted so that callers can
        write ``conformance_cases(backend)`` and future kits may specialise.

    Returns
    -------
    list of Case
        Each with a unique ``id`` (``"gemm-NT-ld"``).
    """
    del backend
    cases = value_cases() + invalid_cases() + memory_cases()
    rank = {op: i for i, op in enumerate(OPS)}
    cases.sort(key=lambda c: rank.get(c.op, len(OPS)))  # stable: keeps value cases before bad-input ones
    return cases


def run_case(backend: ComputeBackend, case: Case) -> CaseResult:
    """Run one case, turning its outcome (and any allocation it leaked) into a :class:`CaseResult`."""
    counter = getattr(backend, "live_allocations", None)
    before = counter() if callable(counter) else None
    start = time.perf_counter()
    refused: list[str] = []
    try:
        with recording_refusals() as refused:
            error = case.run(backend)
        result = CaseResult(case.op, case.name, True, float(error), 0.0)
    except AssertionError as failure:
        result = CaseResult(case.op, case.name, False, float("nan"), 0.0, str(failure) or "assertion failed")
    except BackendError as failure:
        result = CaseResult(
            case.op, case.name, False, float("nan"), 0.0, f"unexpected {type(failure).__name__}: {failure}"
        )
    except Exception as failure:  # noqa: BLE001 - a non-BackendError escaping is itself the finding
        result = CaseResult(
            case.op,
            case.name,
            False,
            float("nan"),
            0.0,
            f"non-BackendError escaped: {type(failure).__name__}: {failure}",
        )
    seconds = time.perf_counter() - start
    if before is not None and callable(counter):
        after = counter()
        if after != before and result.passed:
            result = CaseResult(
                case.op,
                case.name,
                False,
                result.max_error,
                0.0,
                f"live allocations went from {before} to {after} (leak or lost allocation)",
            )
    unsupported = result.passed and bool(refused)
    return CaseResult(
        result.op, result.case, result.passed, result.max_error, seconds, result.message, unsupported
    )


def run_conformance(
    backend: ComputeBackend,
    ops: Iterable[str] | None = None,
    progress: Callable[[CaseResult], object] | None = None,
) -> ConformanceReport:
    """Run the conformance kit on a backend (initialising it first if needed).

    Parameters
    ----------
    backend : ComputeBackend
        The backend under test; :meth:`~ComputeBackend.init` is called when
        :meth:`~ComputeBackend.is_initialized` is False.
    ops : iterable of str, optional
        Only run the cases of these ops (names from :data:`OPS`); all by default.
    progress : callable, optional
        Called with each :class:`CaseResult` as soon as its case has run.

    Returns
    -------
    ConformanceReport
        ``report.passed`` is True when every selected case passed.

    Raises
    ------
    ValueError
        If ``ops`` names an op the kit does not know.
    """
    if not backend.is_initialized():
        backend.init()
    cases = conformance_cases(backend)
    if ops is not None:
        wanted = set(ops)
        unknown = wanted - set(OPS)
        if unknown:
            raise ValueError(f"unknown op(s) {sorted(unknown)}; known: {', '.join(OPS)}")
        cases = [c for c in cases if c.op in wanted]
    report = ConformanceReport(backend.name())
    for case in cases:
        result = run_case(backend, case)
        report.results.append(result)
        if progress is not None:
            progress(result)
    return report
