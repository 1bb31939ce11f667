"""Timing and result records: what one benchmark row is and how it is measured.

A :class:`Case` is one call of a backend operation held against a :class:`Limit` (a
machine ceiling or a reference implementation of the same problem). The harness

1. calls the operation once (an :class:`~computehal.UnsupportedError` makes the row
   ``unsupported``, any other failure an ``error`` row, and the run goes on), then
   checks its result when the case can (``verify``);
2. calibrates how many calls make one timed sample (``min_sample_s``), so that short
   device calls are timed in batches followed by one ``synchronize``;
3. times operation and limit *interleaved* (limit, op, op, limit, ...), after a pause of
   ``Limit.settle`` seconds before every timed call where the limit is a multi-threaded
   BLAS call (OpenBLAS worker threads spin for about 0.1 s after returning and would
   take the cores from whatever runs next; the same holds for onnxruntime's
   intra-op threads, so its model rows pause too);
4. forms the ratio within each round and reports the median over rounds, so that load
   from other processes moves both sides of a ratio alike.
"""

from __future__ import annotations

import math
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ..errors import BackendError, UnsupportedError

__all__ = [
    "BLAS_SETTLE_SECONDS",
    "BenchResult",
    "Case",
    "Compare",
    "Limit",
    "Target",
    "ValueCase",
    "compute_case",
    "interleaved",
    "measure",
]

Compare = Literal["time", "rate", "value_max"]
Status = Literal["measured", "unsupported", "error", "mismatch"]

#: Pause before each timed call next to a multi-threaded BLAS limit (see the module notes).
BLAS_SETTLE_SECONDS = 0.2


@dataclass(frozen=True)
class Limit:
    """What a row is held against: a ceiling of the device or a reference for the same problem.

    Attributes
    ----------
    name : str
        Shown in the table (``"scipy sgemm"``, ``"copy_dtod"``, ``"cuBLAS dgemm"``).
    run : callable
        One call, complete when it returns (device references synchronise themselves).
    work : float
        FLOPs or bytes of one call, in the same measure as the rows held against it
        (0 for a reference compared by time only).
    settle : float
        Seconds of pause before each timed call (:data:`BLAS_SETTLE_SECONDS` for BLAS).
    kind : {"compute", "bandwidth", "reference"}
        Ceilings of the roofline are "compute" and "bandwidth".
    """

    name: str
    run: Callable[[], object]
    work: float
    settle: float = 0.0
    kind: Literal["compute", "bandwidth", "reference"] = "compute"


@dataclass(frozen=True)
class Target:
    """A pass criterion: ``"rate"`` ratio >= value, ``"time"`` ratio <= value, ``"value_max"``."""

    compare: Compare
    value: float

    def met(self, ratio: float | None, achieved: float | None) -> bool:
        """Whether the measured ratio (or, for ``value_max``, the achieved value) meets it."""
        if self.compare == "value_max":
            return achieved is not None and achieved <= self.value
        if ratio is None or math.isnan(ratio):
            return False
        return ratio >= self.value if self.compare == "rate" else ratio <= self.value

    def text(self, unit: str) -> str:
        """As printed in the table (``>= 0.60x rate``, ``<= 1.05x time``, ``<= 10 us/call``)."""
        if self.compare == "time":
            return f"<= {self.value:.2f}x time"
        if self.compare == "rate":
            return f">= {self.value:.2f}x rate"
        return f"<= {self.value:g} {unit}"


@dataclass
class Case:
    """One benchmark row: an operation call measured against a limit.

    Attributes
    ----------
    op : str
        The row's name: the :class:`~computehal.ComputeBackend` method, or a model name
        for groups that time whole models.
    params : str
        The problem, as shown in the table.
    run : callable
        One call of the operation (not synchronised: the harness synchronises).
    unit : str
        ``"GFLOP/s"`` or ``"GB/s"`` (``work`` is FLOPs or bytes per call), or ``"ms"``
        for a row compared by time only (``work`` unused).
    work : float
        FLOPs or bytes of one call.
    limit : Limit or None
        What the row is held against; None reports the achieved rate alone.
    target : Target or None
        None: reported without a verdict.
    flops, bytes_moved : float, optional
        For the roofline plot (arithmetic intensity).
    verify : callable, optional
        Called after the first call; returns the result's error relative to an
        independent reference (NumPy, the vendor library), compared to ``tolerance``.
    synchronize : callable, optional
        Waits for the backend's work; the harness passes its backend's by default.
    """

    op: str
    params: str
    run: Callable[[], object]
    unit: str
    work: float
    limit: Limit | None
    target: Target | None
    flops: float | None = None
    bytes_moved: float | None = None
    verify: Callable[[], float] | None = None
    tolerance: float = 1e-4
    synchronize: Callable[[], object] | None = None


def compute_case(
    op: str,
    params: str,
    run: Callable[[], object],
    flops: float,
    moved: float,
    limit: Limit | None,
    target: Target | None,
    verify: Callable[[], float] | None = None,
    tolerance: float = 1e-4,
) -> Case:
    """A row in GFLOP/s doing ``flops`` a call (``moved`` bytes a call places it on the roofline)."""
    return Case(
        op, params, run, "GFLOP/s", flops, limit, target, flops=flops, bytes_moved=moved, verify=verify,
        tolerance=tolerance,
    )  # fmt: skip


@dataclass
class ValueCase:
    """A row whose figure is a value measured by the case itself (µs per call, MiB).

    ``measure(repeats)`` returns the samples; the row reports their median, checked
    against ``target`` (a ``value_max`` target, or None).
    """

    op: str
    params: str
    unit: str
    measure: Callable[[int], list[float]]
    target: Target | None


@dataclass
class BenchResult:
    """One row of the results.

    ``ratio`` is the median over rounds of the ratio within each round (op and limit ran
    back to back): achieved rate over the limit's rate for ``"rate"`` rows, op time over
    limit time for ``"time"`` rows. ``achieved`` and ``limit`` are the medians of each
    side; ``ratio_of_best`` is the ratio of each side's fastest sample (less sensitive to
    other processes' load). ``passed`` is None when the row has no target or was not
    measured (``status`` ``"unsupported"`` or ``"error"``, with the reason in ``note``).
    """

    op: str
    params: str
    unit: str
    status: Status = "measured"
    achieved: float | None = None
    limit: float | None = None
    limit_name: str = "-"
    compare: Compare | None = None
    ratio: float | None = None
    target: float | None = None
    passed: bool | None = None
    op_seconds: float | None = None
    limit_seconds: float | None = None
    ratio_of_best: float | None = None
    calls_per_sample: int = 1
    error: float | None = None
    note: str = ""
    work: float | None = None
    bytes_moved: float | None = None
    flops: float | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """PASS / FAIL, ``-`` without a target, or the status when the row was not measured."""
        if self.status != "measured":
            return self.status
        if self.passed is None:
            return "-"
        return "PASS" if self.passed else "FAIL"

    def target_text(self) -> str:
        """The target as printed in the table."""
        if self.target is None or self.compare is None:
            return "-"
        return Target(self.compare, self.target).text(self.unit)


# --------------------------------------------------------------------------- timing


def _sample(fn: Callable[[], object], sync: Callable[[], object] | None, calls: int) -> float:
    """Seconds per call of ``calls`` calls of ``fn`` followed by one ``sync``."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if sync is not None:
        sync()
    return (time.perf_counter() - start) / calls


def calls_per_sample(seconds: float, min_sample_s: float, most: int = 1000) -> int:
    """How many calls of ``seconds`` each make a sample of at least ``min_sample_s``."""
    if min_sample_s <= 0 or seconds >= min_sample_s:
        return 1
    return max(1, min(most, math.ceil(min_sample_s / max(seconds, 1e-7))))


@dataclass
class _Side:
    fn: Callable[[], object]
    sync: Callable[[], object] | None
    calls: int = 1


def interleaved(
    op: _Side, limit: _Side, repeats: int, settle: float = 0.0
) -> tuple[list[float], list[float]]:
    """Time ``op`` and ``limit`` alternately ``repeats`` times each; return their seconds per call.

    The order within a round alternates, so that neither side always runs first (warm
    caches, clock boost); ``settle`` seconds of sleep precede every timed sample.
    """

    def timed(side: _Side) -> float:
        if settle:
            time.sleep(settle)
        return _sample(side.fn, side.sync, side.calls)

    op_times: list[float] = []
    limit_times: list[float] = []
    for i in range(repeats):
        if i % 2 == 0:
            limit_times.append(timed(limit))
            op_times.append(timed(op))
        else:
            op_times.append(timed(op))
            limit_times.append(timed(limit))
    return op_times, limit_times


def _rate(work: float, seconds: float) -> float:
    return work / seconds / 1e9 if seconds > 0 else math.inf


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


# --------------------------------------------------------------------------- measuring


def measure(
    case: Case | ValueCase, repeats: int, min_sample_s: float, sync: Callable[[], object] | None
) -> BenchResult:
    """Measure one row; never raises for a failing operation (the row says what happened)."""
    if isinstance(case, ValueCase):
        return _measure_value(case, repeats)
    base = BenchResult(
        case.op, case.params, case.unit, work=case.work, bytes_moved=case.bytes_moved, flops=case.flops
    )
    if case.limit is not None:
        base.limit_name = case.limit.name
    if case.target is not None:
        base.compare, base.target = case.target.compare, case.target.value
    op_side = _Side(case.run, case.synchronize or sync)
    try:
        first = _sample(op_side.fn, op_side.sync, 1)
    except UnsupportedError as exc:
        base.status, base.note = "unsupported", str(exc)
        return base
    except Exception as exc:  # noqa: BLE001 - one failing op must not end the run
        base.status, base.note = "error", _describe(exc)
        if not isinstance(exc, BackendError):
            traceback.print_exc()  # outside the contract: show where it came from
        return base
    if case.verify is not None:
        try:
            base.error = float(case.verify())
        except Exception as exc:  # noqa: BLE001 - reported in the row
            base.status, base.note = "error", f"verification failed: {_describe(exc)}"
            return base
        if not base.error <= case.tolerance:
            base.status = "mismatch"
            base.passed = False
            base.note = (
                f"result differs from the reference by {base.error:.3g} (tolerance {case.tolerance:g})"
            )
            return base
    op_side.calls = calls_per_sample(min(first, _sample(op_side.fn, op_side.sync, 1)), min_sample_s)
    if case.limit is None:
        times = [_sample(op_side.fn, op_side.sync, op_side.calls) for _ in range(repeats)]
        return _finish(base, case, times, None, op_side.calls)
    limit_side = _Side(case.limit.run, None)
    try:
        limit_side.calls = calls_per_sample(_sample(limit_side.fn, None, 1), min_sample_s)
        op_times, limit_times = interleaved(op_side, limit_side, repeats, settle=case.limit.settle)
    except Exception as exc:  # noqa: BLE001 - reported in the row
        base.status, base.note = "error", _describe(exc)
        return base
    return _finish(base, case, op_times, limit_times, op_side.calls)


def _finish(
    row: BenchResult, case: Case, op_times: list[float], limit_times: list[float] | None, calls: int
) -> BenchResult:
    row.calls_per_sample = calls
    row.op_seconds = statistics.median(op_times)
    row.samples = {"op": op_times}
    timed_only = case.unit == "ms"
    row.achieved = row.op_seconds * 1e3 if timed_only else _rate(case.work, row.op_seconds)
    if limit_times is not None and case.limit is not None:
        row.samples["limit"] = limit_times
        row.limit_seconds = statistics.median(limit_times)
        pairs = list(zip(op_times, limit_times, strict=True))
        by_time = case.target is not None and case.target.compare == "time" or timed_only
        if by_time:
            row.limit = row.limit_seconds * 1e3 if timed_only else _rate(case.limit.work, row.limit_seconds)
            row.ratio = statistics.median(o / lim for o, lim in pairs)
            row.ratio_of_best = min(op_times) / min(limit_times)
        else:
            row.limit = _rate(case.limit.work, row.limit_seconds)
            row.ratio = statistics.median(
                _rate(case.work, o) / _rate(case.limit.work, lim) for o, lim in pairs
            )
            row.ratio_of_best = _rate(case.work, min(op_times)) / _rate(case.limit.work, min(limit_times))
        if row.compare is None:
            row.compare = "time" if by_time else "rate"
    if case.target is not None:
        row.passed = case.target.met(row.ratio, row.achieved)
    return row


def _measure_value(case: ValueCase, repeats: int) -> BenchResult:
    row = BenchResult(case.op, case.params, case.unit)
    if case.target is not None:
        row.compare, row.target = case.target.compare, case.target.value
    try:
        values = case.measure(repeats)
    except UnsupportedError as exc:
        row.status, row.note = "unsupported", str(exc)
        return row
    except Exception as exc:  # noqa: BLE001 - one failing row must not end the run
        row.status, row.note = "error", _describe(exc)
        return row
    row.achieved = statistics.median(values)
    row.samples = {"op": values}
    if case.target is not None:
        row.passed = case.target.met(None, row.achieved)
    return row
