"""One benchmark run: open the backend, build its ceilings, run the groups, collect the rows."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..backend import ComputeBackend
from ..errors import BackendError
from ..probe import probe
from ..registry import BackendKind
from ..selection import parse_backend_name, start_backend
from ..types import MemoryKind
from ._ceilings import Ceilings, build_ceilings, host_workers
from ._context import BenchContext
from ._groups import find_group, registered_groups
from ._harness import BenchResult, measure
from ._sizes import Profile, Sizes, sizes_for

__all__ = ["BenchRun", "default_groups", "profile_of", "run_benchmarks"]


@dataclass
class BenchRun:
    """The outcome of :func:`run_benchmarks`.

    Attributes
    ----------
    backend : str
        The backend's name as asked for (``"vulkan"``, ``"cuda:1"``).
    device : str
        The device's name.
    profile : {"cpu", "host-device", "gpu", "cuda"}
    quick : bool
    sizes : Sizes
    groups : list of str
    results : list of BenchResult
    peaks : dict
        For every limit sampled during the run, the median of its rates (GFLOP/s or
        GB/s) over every sample.
    roof : dict
        ``{"compute": name, "bandwidth": name}``: which limits are the roofline's.
    seconds : float
    machine : dict
        Host CPU, cores, Python / NumPy versions and BLAS libraries.
    """

    backend: str
    device: str
    profile: Profile
    quick: bool
    sizes: Sizes
    groups: list[str]
    results: list[BenchResult] = field(default_factory=list)
    peaks: dict[str, float] = field(default_factory=dict)
    roof: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """No row failed its target (rows without a target, or unsupported, do not count)."""
        return all(r.passed is not False and r.status != "error" for r in self.results)


def default_groups() -> list[str]:
    """The groups a run without ``--groups`` measures, in order."""
    return [g.name for g in registered_groups() if g.default]


def profile_of(name: str, backend: ComputeBackend) -> Profile:
    """The sizes / targets profile of ``backend`` (asked for as ``name``)."""
    kind, ordinal = parse_backend_name(name)
    if kind is BackendKind.CPU:
        return "cpu"
    if kind in (BackendKind.CUDA, BackendKind.ROCM):
        return "cuda"
    devices = backend.available_devices()
    device = devices[ordinal] if ordinal < len(devices) else None
    return "host-device" if device is not None and device.memory_kind is MemoryKind.HOST else "gpu"


def _machine(backend: ComputeBackend, name: str) -> dict[str, Any]:
    try:
        from threadpoolctl import threadpool_info

        blas = [
            {k: info.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
            for info in threadpool_info()
            if info.get("user_api") == "blas"
        ]
    except ImportError:
        blas = []
    cpu = probe().entry(BackendKind.CPU)
    devices = backend.available_devices()
    ordinal = parse_backend_name(name)[1]
    return {
        "cpu": cpu.devices[0].name if cpu.devices else platform.processor(),
        "cores": host_workers(),
        "device": devices[ordinal].name if ordinal < len(devices) else backend.name(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas,
    }


def _sample_ceilings(ceilings: Ceilings, run: BenchRun, repeats: int) -> None:
    """Time the roofline's ceilings alone when no row held itself against them."""
    for limit in (ceilings.compute, ceilings.bandwidth):
        if limit.name in run.peaks:
            continue
        limit.run()
        rates = []
        for _ in range(max(1, repeats // 2)):
            if limit.settle:
                time.sleep(limit.settle)
            start = time.perf_counter()
            limit.run()
            rates.append(limit.work / (time.perf_counter() - start) / 1e9)
        run.peaks[limit.name] = statistics.median(rates)


def _peaks(results: Sequence[BenchResult]) -> dict[str, float]:
    rates: dict[str, list[float]] = {}
    for r in results:
        if r.limit is not None and r.unit in ("GFLOP/s", "GB/s") and r.limit_name != "-":
            rates.setdefault(r.limit_name, []).append(r.limit)
    return {name: statistics.median(values) for name, values in rates.items()}


def run_benchmarks(
    backend_name: str,
    *,
    backend: ComputeBackend | None = None,
    quick: bool = False,
    sizes: Sizes | None = None,
    groups: Sequence[str] | None = None,
    only: str | None = None,
    repeats: int | None = None,
    progress: Callable[[BenchResult], object] | None = None,
    on_start: Callable[[BenchRun], object] | None = None,
) -> BenchRun:
    """Benchmark one backend; return every row.

    Parameters
    ----------
    backend_name : str
        ``"cpu"``, ``"opencl"``, ``"vulkan"``, ``"cuda"`` (optionally ``":<device>"``).
    backend : ComputeBackend, optional
        An initialised backend to use (it stays open); by default the named backend is
        started, exactly that one (no fallback), and closed at the end.
    quick : bool
        The profile's smoke-test sizes.
    sizes : Sizes, optional
        Replaces the profile's sizes.
    groups : sequence of str, optional
        Group names (default: every default group); see :func:`register_group`.
    only : str, optional
        Keep the rows whose op or parameters contain this text.
    repeats : int, optional
        Timed samples per side of each row.
    progress : callable, optional
        Called with each row as soon as it is measured.
    on_start : callable, optional
        Called with the (still empty) run once the backend has started.

    Raises
    ------
    UnsupportedError
        The backend is not available here.
    ValueError
        An unknown group.
    """
    names = list(groups) if groups is not None else default_groups()
    found = [(name, find_group(name)) for name in names]
    unknown = [name for name, group in found if group is None]
    if unknown:
        known = ", ".join(g.name for g in registered_groups())
        raise ValueError(f"unknown benchmark group(s) {', '.join(unknown)}; known: {known}")
    owned = backend is None
    be = start_backend(backend_name) if backend is None else backend
    try:
        profile = profile_of(backend_name, be)
        chosen = sizes if sizes is not None else sizes_for(profile, quick)
        if repeats is not None:
            chosen = replace(chosen, repeats=repeats)
        run = BenchRun(backend_name, "", profile, quick, chosen, names, machine=_machine(be, backend_name))
        run.device = run.machine["device"]
        if on_start is not None:
            on_start(run)
        started = time.perf_counter()
        ceilings = build_ceilings(be, profile, chosen)
        try:
            ctx = BenchContext(be, backend_name, profile, chosen, ceilings, quick)
            for name, group in found:
                assert group is not None
                _run_group(ctx, name, group.build, only, run.results, progress)
            run.peaks = _peaks(run.results)
            _sample_ceilings(ceilings, run, chosen.repeats)
            run.roof = {"compute": ceilings.compute.name, "bandwidth": ceilings.bandwidth.name}
        finally:
            ceilings.close()
        run.seconds = time.perf_counter() - started
        return run
    finally:
        if owned:
            be.close()


def _run_group(
    ctx: BenchContext,
    name: str,
    build: Callable[[BenchContext], Any],
    only: str | None,
    results: list[BenchResult],
    progress: Callable[[BenchResult], object] | None,
) -> None:
    def emit(row: BenchResult) -> None:
        results.append(row)
        if progress is not None:
            progress(row)

    with ctx.scope():
        try:
            for case in build(ctx):
                if only is not None and only not in case.op and only not in case.params:
                    continue
                emit(measure(case, ctx.sizes.repeats, ctx.sizes.min_sample_s, ctx.synchronize))
        except BackendError as exc:
            # Setting a case up failed (an allocation, an upload): the group's remaining
            # rows are lost, the run goes on.
            emit(
                BenchResult(
                    f"[{name}]",
                    "setting up the group",
                    "-",
                    status="error",
                    note=f"{type(exc).__name__}: {exc}",
                )
            )
