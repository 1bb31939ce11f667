"""The CPU backend's process-wide machinery: worker threads, the BLAS thread limit, the
compiled kernels, and what the host tells about itself (CPU name, physical memory).

Everything here is shared by every :class:`~computehal.backends.cpu.CpuBackend` of the
process: one pool of worker threads (NumPy ufuncs, BLAS and the numba kernels release
the GIL, so ranges split over it use every core), one reference-counted BLAS limit, and
each compiled kernel module loaded once.

The pool is a plain :class:`~concurrent.futures.ThreadPoolExecutor`, whose idle threads
sleep. Waking one is slow in this project's 2-vCPU VM (a halted vCPU: a task submitted
after a 1-10 ms pause started 100-200 us later at the median, up to 700 us at the 90th
percentile). A pool whose idle workers poll before sleeping (a compiled spin-wait on a
counter, without the GIL, as OpenMP runtimes and onnxruntime do) was built and measured
(session 8) and not kept: polling for 2 ms after a call took a core from whatever ran
next (a two-thread 128 MB copy right after a column softmax took 10.3-11.9 ms against
7.8-8.2), and polling for 0.2 ms gave no gain that rose above the noise in whole models
(the ONNX runner, runs alternating with this pool in one process, paired medians:
ResNet-50 at batch 1 1.03 of the time, the BERT-base encoder at sequence 128 0.98 and
1.07), since the GIL hand-offs between the caller and a worker sleep on a futex too.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import platform
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "PARALLEL_THRESHOLD",
    "cpu_name",
    "ignore_fp_errors",
    "restore_fp_errors",
    "kernels",
    "memory_available",
    "memory_total",
    "on_every_thread",
    "parallel_pull",
    "parallel_ranges",
    "single_threaded_blas",
    "submit",
    "workers",
]

_log = logging.getLogger("computehal.backends.cpu")

#: Problems below this many elements run on the calling thread.
PARALLEL_THRESHOLD = 1 << 16

# --------------------------------------------------------------------------- threads

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


@functools.cache
def workers() -> int:
    """Threads to split work over: the CPUs this process may run on (read once)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _thread_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=workers(), thread_name_prefix="computehal-cpu")
    return _pool


def parallel_ranges(total: int, fn: Callable[[int, int], None], grain: int = PARALLEL_THRESHOLD) -> None:
    """Run ``fn(start, stop)`` over ``[0, total)`` split across the worker threads.

    Each part holds at least ``grain`` items; the calling thread runs the first part.
    """
    parts = min(workers(), max(1, total // max(1, grain)))
    if parts <= 1:
        if total > 0:
            fn(0, total)
        return
    bounds = [total * i // parts for i in range(parts + 1)]
    futures = [_thread_pool().submit(fn, bounds[i], bounds[i + 1]) for i in range(1, parts)]
    try:
        fn(bounds[0], bounds[1])
    finally:
        for future in futures:
            future.result()


def on_every_thread(call: Callable[..., object], *args: object, threads: int | None = None) -> None:
    """Run ``call(*args)`` on the calling thread and, at the same time, on pool threads.

    ``threads`` in all (every worker by default). The calls share their work through
    their arguments (compiled code pulling blocks from one atomic counter).
    """
    count = workers() if threads is None else max(1, min(threads, workers()))
    futures = [_thread_pool().submit(call, *args) for _ in range(count - 1)]
    try:
        call(*args)
    finally:
        for future in futures:
            future.result()


def submit(call: Callable[..., object], *args: object) -> Future[object]:
    """Start ``call(*args)`` on a pool thread; the caller decides whether to wait for it."""
    return _thread_pool().submit(call, *args)


def parallel_pull(count: int, worker: Callable[[Iterator[int]], None]) -> None:
    """Run ``worker(items)`` on every worker thread; all share one iterator over ``range(count)``.

    Each thread pulls the next index when it is free (``next`` on a range iterator is
    atomic under the GIL), so a thread slowed by other processes simply takes fewer
    items. ``worker`` sets up its per-thread scratch once and then iterates ``items``.
    """
    on_every_thread(worker, iter(range(count)), threads=count)


# --------------------------------------------------------------------------- floating-point errors


def _errstate_enter() -> Any:
    state = np.errstate(all="ignore")
    state.__enter__()
    return state


def _errstate_exit(state: Any) -> None:
    state.__exit__(None, None, None)


#: ``token = ignore_fp_errors()`` ... ``restore_fp_errors(token)`` (in a ``finally``): what
#: ``with np.errstate(all="ignore")`` does, for this thread, at a tenth of its cost (it
#: was 1-2 us of a small call). NumPy 2 keeps the error state in a context variable; the
#: "ignore everything" state is built once and set directly. Where those internals are
#: missing, ``np.errstate`` itself is used.
ignore_fp_errors: Callable[[], Any]
restore_fp_errors: Callable[[Any], None]
try:
    from numpy._core._ufunc_config import _extobj_contextvar  # type: ignore[attr-defined]
    from numpy._core.umath import _make_extobj

    ignore_fp_errors = functools.partial(_extobj_contextvar.set, _make_extobj(all="ignore"))
    restore_fp_errors = _extobj_contextvar.reset
except (ImportError, AttributeError, TypeError):  # pragma: no cover - other NumPy versions
    ignore_fp_errors, restore_fp_errors = _errstate_enter, _errstate_exit


# --------------------------------------------------------------------------- BLAS threads


class _BlasLimit:
    """A reference-counted "BLAS runs single-threaded" state for the whole process.

    The first holder takes the limit and the last one to leave restores the thread
    counts BLAS had before, whichever threads they run in: overlapping holders from
    several caller threads never leave BLAS single-threaded (nested save / restore pairs
    would: the inner one saves the outer one's limit). The threadpoolctl controller is
    built once, since building one rescans every loaded library, and the limit is set
    on its BLAS libraries directly (threadpoolctl's ``limit`` re-reads every library's
    description each time: tens of microseconds, paid by every convolution call).

    The counts are set through the library's own setter (threadpoolctl's
    ``_real_set_num_threads`` where it has one): from threadpoolctl 3.8 on, the public
    ``set_num_threads`` of a pthreads OpenBLAS does nothing unless called from the one
    Python thread that first set a limit, so a limit taken or released in any other
    caller thread was silently dropped (BLAS then spun its own threads beside the
    workers, or stayed single-threaded after the last holder left). This class's lock
    already serialises every change.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._libraries: list[Any] | None = None
        self._saved: list[tuple[Any, int]] = []
        self._holders = 0

    def _blas_libraries(self) -> list[Any]:
        if self._libraries is None:
            try:
                import scipy.linalg.cython_blas  # noqa: F401  (load SciPy's BLAS before the scan)
                from threadpoolctl import ThreadpoolController
            except ImportError:
                self._libraries = []
            else:
                controller = ThreadpoolController()
                self._libraries = [lib for lib in controller.lib_controllers if lib.user_api == "blas"]
        return self._libraries

    def enter(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._saved = [(lib, lib.get_num_threads()) for lib in self._blas_libraries()]
                for lib, count in self._saved:
                    if count != 1:
                        _set_threads(lib, 1)
            self._holders += 1

    def leave(self) -> None:
        with self._lock:
            if self._holders == 0:
                return
            self._holders -= 1
            if self._holders == 0:
                saved, self._saved = self._saved, []
                for lib, count in saved:
                    if count != 1:
                        _set_threads(lib, count)


def _set_threads(lib: Any, count: int) -> None:
    """Set a threadpoolctl BLAS controller's thread count from whichever thread calls."""
    setter = getattr(lib, "_real_set_num_threads", None) or lib.set_num_threads
    setter(count)


_BLAS_LIMIT = _BlasLimit()


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Run BLAS single-threaded inside the block (the worker threads split the work)."""
    _BLAS_LIMIT.enter()
    try:
        yield
    finally:
        _BLAS_LIMIT.leave()


# --------------------------------------------------------------------------- compiled kernels

_kernel_lock = threading.Lock()
_kernel_modules: dict[str, ModuleType | None] = {}


def kernels(name: str) -> Any:
    """The compiled kernel module ``computehal.backends.cpu.<name>``, or None where numba fails.

    Loaded once, on the first call that can use it; its ``warm_up()`` compiles (or reads
    from numba's cache) every kernel right then, so a numba that cannot compile is found
    here and the caller keeps its NumPy path. ``COMPUTEHAL_CPU_KERNELS=0`` turns every
    kernel module off.
    """
    module = _kernel_modules.get(name, False)
    if module is not False:
        return module
    with _kernel_lock:
        if name not in _kernel_modules:
            _kernel_modules[name] = _load(name)
        return _kernel_modules[name]


def kernels_enabled() -> bool:
    """False when ``COMPUTEHAL_CPU_KERNELS`` turns the compiled kernels off."""
    flag = os.environ.get("COMPUTEHAL_CPU_KERNELS", "1").strip().lower()
    return flag not in ("0", "false", "no", "off")


def _load(name: str) -> ModuleType | None:
    if not kernels_enabled():
        return None
    try:
        module = importlib.import_module(f"{__package__}.{name}")
        module.warm_up()
    except Exception as exc:  # numba missing, or unable to compile here: NumPy paths stay
        _log.debug("computehal: compiled CPU kernels %s unavailable, using NumPy (%r)", name, exc)
        return None
    return module


# --------------------------------------------------------------------------- the host


@functools.cache
def cpu_name() -> str:
    """The CPU's model name (from ``/proc/cpuinfo`` where there is one)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "host CPU"


@functools.cache
def memory_total() -> int:
    """Physical memory in bytes (0 where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def memory_available() -> int | None:
    """Memory the OS can hand out now (``MemAvailable``), in bytes, or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None
