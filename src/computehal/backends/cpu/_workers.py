"""The CPU backend's worker threads: a small pool whose idle threads poll before they sleep.

A task handed to a thread that is asleep waits for the operating system to wake it;
in a virtual machine that means waking a halted vCPU, which on this project's 2-vCPU
host took 100-200 us at the median and up to 700 us (a task submitted after a 1-10 ms
pause, :class:`concurrent.futures.ThreadPoolExecutor`). A ResNet-50 layer at batch 1
lasts 0.5-2 ms and splits its work over the threads in one to three phases, so that
wait was a large part of it. OpenMP runtimes, OpenBLAS and onnxruntime all keep their
threads polling for a while after their work ends for the same reason; so does this
pool, for :data:`SPIN_SECONDS`:

* an idle worker polls a counter that :meth:`WorkerPool.submit` increments (in compiled
  code, without the GIL, :func:`._kspin.wait_changed`), then sleeps on a condition;
* the caller waiting for a task's result polls the task's done flag the same way
  before it blocks.

Without numba (or with ``COMPUTEHAL_CPU_KERNELS=0``) both only block, as a plain pool.
The polling costs a CPU for at most :data:`SPIN_SECONDS` after the last task.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["SPIN_SECONDS", "Task", "WorkerPool"]

#: How long an idle worker, or a caller waiting for a result, polls before it sleeps.
SPIN_SECONDS = 0.002


def _spinner() -> tuple[Callable[[np.ndarray, int, int], bool], int] | None:
    """The compiled wait and the polls making up :data:`SPIN_SECONDS`, or None without it."""
    from ._runtime import kernels

    module = kernels("_kspin")
    if module is None:
        return None
    return module.wait_changed, max(1, int(module.polls_per_second() * SPIN_SECONDS))


class Task:
    """One submitted call; :meth:`result` waits for it and re-raises what it raised."""

    __slots__ = ("_call", "_args", "_flag", "_event", "_value", "_error")

    def __init__(self, call: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._call, self._args = call, args
        self._flag = np.zeros(1, dtype=np.int64)
        self._event = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def run(self) -> None:
        """Run the call on this thread and publish the outcome."""
        try:
            self._value = self._call(*self._args)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            self._error = exc
        self._call = self._args = None  # type: ignore[assignment]
        self._flag[0] = 1
        self._event.set()

    def result(self, spin: tuple[Callable[[np.ndarray, int, int], bool], int] | None = None) -> Any:
        """The call's return value (its exception is raised here), after polling with ``spin``."""
        if not self._flag[0] and spin is not None:
            spin[0](self._flag, 0, spin[1])
        self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


class WorkerPool:
    """``count`` daemon threads running submitted calls in order (see the module notes).

    The caller of :func:`._runtime.parallel_ranges` runs a part itself, so a machine with
    ``n`` CPUs needs ``n - 1`` workers: one more would poll on a CPU the others compute on.
    """

    def __init__(self, count: int) -> None:
        self._tasks: deque[Task] = deque()
        self._submitted = np.zeros(1, dtype=np.int64)
        self._wake = threading.Condition(threading.Lock())
        self._sleeping = 0
        self._spin = _spinner()
        self._threads = [
            threading.Thread(target=self._serve, name=f"computehal-cpu_{i}", daemon=True)
            for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, call: Callable[..., Any], *args: Any) -> Task:
        """Queue ``call(*args)`` for the next free worker; the returned task gives its result."""
        task = Task(call, args)
        self._tasks.append(task)
        self._submitted[0] += 1
        if self._sleeping:
            with self._wake:
                self._wake.notify()
        return task

    def wait(self, task: Task) -> Any:
        """``task.result()``; a task no worker has taken yet is run here, on the caller's thread.

        So a caller never waits for a busy or sleeping worker to start its task, and a
        task that itself splits work over the pool (or more tasks than workers) cannot
        deadlock.
        """
        try:
            self._tasks.remove(task)
        except ValueError:  # a worker has it
            return task.result(self._spin)
        task.run()
        return task.result()

    def _next(self) -> Task:
        while True:
            try:
                return self._tasks.popleft()
            except IndexError:
                pass
            seen = int(self._submitted[0])
            if self._tasks:
                continue
            if self._spin is not None and self._spin[0](self._submitted, seen, self._spin[1]):
                continue
            with self._wake:
                self._sleeping += 1
                try:
                    while not self._tasks:
                        self._wake.wait()
                finally:
                    self._sleeping -= 1

    def _serve(self) -> None:
        while True:
            self._next().run()
