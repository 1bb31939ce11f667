"""The CPU backend's worker pool (``_workers``) and its compiled spin-wait (``_kspin``)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from computehal.backends.cpu import _runtime
from computehal.backends.cpu._workers import SPIN_SECONDS, WorkerPool

kspin = _runtime.kernels("_kspin")


@pytest.mark.skipif(kspin is None, reason="numba cannot compile here")
def test_spin_wait_sees_a_store_from_another_thread() -> None:
    word = np.zeros(1, dtype=np.int64)
    assert not kspin.wait_changed(word, 0, 1000)  # nothing changed: gives up after the polls
    assert kspin.wait_changed(word, 7, 1)  # already different: returns at once

    def store() -> None:
        time.sleep(0.02)
        word[0] = 3

    thread = threading.Thread(target=store)
    thread.start()
    # About 30 s of polls: only the store ends the wait with True.
    assert kspin.wait_changed(word, 0, int(kspin.polls_per_second() * 30))
    thread.join()


@pytest.mark.skipif(kspin is None, reason="numba cannot compile here")
def test_spin_wait_runs_without_the_gil() -> None:
    """A thread polling for 0.3 s must not stop another thread running Python code."""
    word = np.zeros(1, dtype=np.int64)
    waiter = threading.Thread(target=kspin.wait_changed, args=(word, 0, int(kspin.polls_per_second() * 0.3)))
    waiter.start()
    count, end = 0, time.perf_counter() + 0.1
    while time.perf_counter() < end:
        count += 1
    word[0] = 1
    waiter.join()
    assert count > 1000


def test_results_errors_and_order() -> None:
    pool = WorkerPool(2)
    tasks = [pool.submit(lambda i: i * i, i) for i in range(50)]
    assert [pool.wait(t) for t in tasks] == [i * i for i in range(50)]

    def fail() -> None:
        raise KeyError("from a worker")

    with pytest.raises(KeyError, match="from a worker"):
        pool.wait(pool.submit(fail))
    assert pool.wait(pool.submit(lambda: "still serving")) == "still serving"


def test_untaken_task_runs_on_the_caller() -> None:
    """With its only worker busy, a waited task runs on the waiting thread at once."""
    pool = WorkerPool(1)
    release = threading.Event()
    busy = pool.submit(release.wait, 5.0)
    deadline = time.perf_counter() + 5
    while pool._tasks and time.perf_counter() < deadline:  # the worker takes the first task
        time.sleep(0.001)
    queued = pool.submit(threading.get_ident)
    assert pool.wait(queued) == threading.get_ident()
    release.set()
    assert pool.wait(busy) is True


def test_nested_splits_do_not_deadlock() -> None:
    """A task that splits its own work over the same one-worker pool completes."""
    pool = WorkerPool(1)

    def outer(i: int) -> int:
        inner = [pool.submit(lambda j: i + j, j) for j in range(4)]
        return sum(pool.wait(t) for t in inner)

    tasks = [pool.submit(outer, i) for i in range(4)]
    assert [pool.wait(t) for t in tasks] == [4 * i + 6 for i in range(4)]


def test_sleeping_workers_wake_for_new_tasks() -> None:
    """After the polling window the workers block; a later submit still reaches them."""
    pool = WorkerPool(2)
    assert pool.wait(pool.submit(lambda: 1)) == 1
    deadline = time.perf_counter() + 5
    while pool._sleeping < 2 and time.perf_counter() < deadline:
        time.sleep(SPIN_SECONDS)
    assert pool._sleeping == 2
    seen: set[int] = set()
    gate = threading.Barrier(3, timeout=5)

    def meet() -> None:
        seen.add(threading.get_ident())
        gate.wait()

    tasks = [pool.submit(meet) for _ in range(2)]
    gate.wait()  # both tasks ran at once, so both workers woke
    for task in tasks:
        pool.wait(task)
    assert len(seen) == 2 and threading.get_ident() not in seen


def test_many_callers_at_once() -> None:
    pool = WorkerPool(1)
    results: dict[int, list[int]] = {}

    def caller(c: int) -> None:
        tasks = [pool.submit(lambda i: c * 1000 + i, i) for i in range(200)]
        results[c] = [pool.wait(t) for t in tasks]

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {c: [c * 1000 + i for i in range(200)] for c in range(4)}


def test_parallel_ranges_cover_every_item_once() -> None:
    total = 1 << 18
    marks = np.zeros(total, dtype=np.int64)

    def mark(a: int, b: int) -> None:
        marks[a:b] += 1

    _runtime.parallel_ranges(total, mark, grain=1 << 12)
    assert np.all(marks == 1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_works_in_a_forked_child() -> None:
    _runtime.parallel_ranges(1 << 17, lambda a, b: None, grain=1 << 10)  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            pool = _runtime._thread_pool()
            task = pool.submit(threading.get_ident)
            time.sleep(0.2)  # a live worker takes it meanwhile (the parent's threads are gone)
            os._exit(0 if pool.wait(task) != threading.get_ident() else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
