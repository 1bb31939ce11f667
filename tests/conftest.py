"""Shared test setup: which backends run, one rule for required ones, and the helpers every file uses.

Backends
    The backend table, :data:`computehal.backends.BACKENDS`, is the list (the one the
    probe and the CLI read): a backend joins every backend-parametrised test through its
    line there. Tests take the ``backend`` fixture (one shared, initialised instance per
    backend and session) or ``backend_factory`` (fresh, uninitialised instances).

Required backends (the one rule)
    ``COMPUTEHAL_REQUIRE_BACKENDS`` is a comma-separated list of table names or kinds
    (``cpu,opencl,wgpu``; ``vulkan`` names the wgpu line). It is read here and nowhere
    else: :func:`required`. A backend that cannot start here (its factory or ``init()``
    raises ``ImportError`` or ``DeviceError``) is left out of the parametrisation, and
    ``tests/test_backends.py`` reports it as one skip with the reason; a *required*
    backend that cannot start is kept, and each of its tests fails with the reason.
    Per-backend files get the same behaviour from :func:`make_backend` /
    :func:`use_shared`.

Helpers
    :func:`put` / :func:`get` move host arrays in and out of device memory,
    :func:`claims` tells whether a backend says it takes an op with a dtype,
    :func:`live_count` counts live allocations.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from computehal import ComputeBackend, DeviceError
from computehal.backends import BACKENDS, BackendSpec

#: name -> factory of a fresh, uninitialised backend (on its default device), from the table.
BACKEND_FACTORIES: dict[str, Callable[[], ComputeBackend]] = {spec.name: spec.create for spec in BACKENDS}

#: Errors that mean "this backend cannot run on this machine" (skip, unless required).
UNAVAILABLE = (ImportError, DeviceError)

ENV_REQUIRED = "COMPUTEHAL_REQUIRE_BACKENDS"


# --------------------------------------------------------------------------- required backends


def required_backends() -> set[str]:
    """The names and kinds listed in ``COMPUTEHAL_REQUIRE_BACKENDS`` (lower case)."""
    raw = os.environ.get(ENV_REQUIRED, "")
    return {name.strip().lower() for name in raw.split(",") if name.strip()}


def _spec(name: str) -> BackendSpec | None:
    return next((spec for spec in BACKENDS if spec.name == name), None)


def required(name: str) -> bool:
    """True when ``COMPUTEHAL_REQUIRE_BACKENDS`` names the table line ``name`` or one of its kinds."""
    wanted = required_backends()
    spec = _spec(name)
    kinds = {kind.value for kind in spec.kinds} if spec is not None else set()
    return name in wanted or bool(wanted & kinds)


def unavailable(name: str, reason: str) -> None:
    """Skip (or, for a required backend, fail) the current test: backend ``name`` is unavailable."""
    message = f"backend {name!r} unavailable: {reason}"
    if required(name):
        pytest.fail(f"{message} (required by {ENV_REQUIRED})", pytrace=False)
    pytest.skip(message)


# --------------------------------------------------------------------------- instances


def make_backend(name: str, *, initialise: bool = True) -> ComputeBackend:
    """A fresh backend ``name`` (initialised unless told otherwise); skips / fails if unavailable."""
    try:
        backend = BACKEND_FACTORIES[name]()
        if initialise:
            backend.init()
    except UNAVAILABLE as error:
        unavailable(name, f"{type(error).__name__}: {error}")
    return backend


_SHARED: dict[str, ComputeBackend | str] = {}


def shared_backend(name: str) -> ComputeBackend | str:
    """The session's initialised instance of backend ``name``, or the reason it is unavailable."""
    if name not in _SHARED:
        try:
            backend = BACKEND_FACTORIES[name]()
            backend.init()
            _SHARED[name] = backend
        except UNAVAILABLE as error:
            _SHARED[name] = f"{type(error).__name__}: {error}"
    return _SHARED[name]


def use_shared(name: str) -> ComputeBackend:
    """The shared instance of ``name`` for the current test, skipping / failing if unavailable."""
    backend = shared_backend(name)
    if isinstance(backend, str):
        unavailable(name, backend)
        raise AssertionError("unreachable")  # pragma: no cover
    return backend


def runnable_backends() -> list[str]:
    """The table names that parametrise tests: those that start here, and every required one."""
    return [
        spec.name
        for spec in BACKENDS
        if required(spec.name) or not isinstance(shared_backend(spec.name), str)
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise ``backend`` / ``backend_factory`` by the runnable backends (ids are table names).

    A backend that cannot start is not parametrised at all, so its absence is one skip
    (in ``tests/test_backends.py``), not one per test.
    """
    for fixture in ("backend", "backend_factory"):
        if fixture in metafunc.fixturenames:
            metafunc.parametrize(fixture, sorted(runnable_backends()), indirect=True)


# --------------------------------------------------------------------------- fixtures


def live_count(backend: ComputeBackend) -> int | None:
    """``backend.live_allocations()`` where the backend offers it, else None."""
    counter = getattr(backend, "live_allocations", None)
    return counter() if callable(counter) else None


_OUTCOME = pytest.StashKey[str]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Remember each test's outcome, for fixtures that check what a passing test left behind."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.stash[_OUTCOME] = report.outcome


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Iterator[ComputeBackend]:
    """Each runnable backend (one shared, initialised instance per session).

    After a test that passed, the number of live allocations must be back where it
    started (a failed or skipped test's traceback still holds its arrays).
    """
    be = use_shared(request.param)
    gc.collect()  # arrays an earlier failed or skipped test left in its traceback
    before = live_count(be)
    yield be
    if request.node.stash.get(_OUTCOME, "") != "passed":
        return
    after = live_count(be)
    assert after == before, f"{request.param}: live allocations went from {before} to {after} during the test"


@pytest.fixture
def backend_factory(request: pytest.FixtureRequest) -> Callable[[], ComputeBackend]:
    """Each runnable backend's factory (for tests that need fresh, uninitialised instances)."""
    name: str = request.param
    use_shared(name)  # fails when a required backend cannot run here
    return BACKEND_FACTORIES[name]


@pytest.fixture(scope="module")
def cpu_backend() -> Iterator[Any]:
    """A fresh, initialised CPU backend for one test module (the CPU-specific tests)."""
    from computehal.backends.cpu import CpuBackend

    be = CpuBackend()
    be.init()
    yield be
    be.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for backend in _SHARED.values():
        if not isinstance(backend, str):
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - best effort at interpreter shutdown
                pass


# --------------------------------------------------------------------------- helpers


def put(backend: ComputeBackend, array: npt.ArrayLike, dtype: Any = None, *, pad: int = 0) -> int:
    """Allocate ``pad`` bytes plus the array's, copy the array in after the pad; return its pointer.

    ``dtype`` converts the data first (default: its own). The allocation's base is
    ``ptr - pad``; free that.
    """
    data = np.ascontiguousarray(array, dtype=dtype)
    base = backend.alloc(max(1, data.nbytes + pad))
    if data.nbytes:
        backend.copy_htod(base + pad, data.reshape(-1).view(np.uint8))
    return base + pad


def get(backend: ComputeBackend, ptr: int, shape: Any, dtype: Any = np.float32) -> npt.NDArray[Any]:
    """A host copy of the ``shape`` array of ``dtype`` at ``ptr``."""
    out = np.empty(shape, dtype=dtype)
    if out.nbytes:
        backend.copy_dtoh(out.reshape(-1).view(np.uint8), ptr)
    return out


def claims(backend: ComputeBackend, op: str, dtype: Any = "float32") -> bool:
    """True when ``backend.capabilities()`` says ``op`` takes ``dtype`` on this device."""
    return backend.capabilities().supports(op, dtype)
