"""Shared test setup: the backend table parametrises the whole suite.

A backend joins every backend-parametrised test through its line in
:data:`computehal.backends.BACKENDS` (the table the probe and the CLI read). A backend
whose factory (or ``init()``) raises ``ImportError``
or ``DeviceError`` is skipped with the reason, unless its name is listed in the
comma-separated environment variable ``COMPUTEHAL_REQUIRE_BACKENDS``, in which case
its tests fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from computehal import ComputeBackend, DeviceError
from computehal.backends import BACKENDS

#: name -> factory of a fresh, uninitialised backend (on its default device), from the table.
BACKEND_FACTORIES: dict[str, Callable[[], ComputeBackend]] = {spec.name: spec.create for spec in BACKENDS}

#: Errors that mean "this backend cannot run on this machine" (skip, unless required).
UNAVAILABLE = (ImportError, DeviceError)


def required_backends() -> set[str]:
    """Backend names listed in ``COMPUTEHAL_REQUIRE_BACKENDS``."""
    raw = os.environ.get("COMPUTEHAL_REQUIRE_BACKENDS", "")
    return {name.strip().lower() for name in raw.split(",") if name.strip()}


def unavailable(name: str, reason: str) -> None:
    """Skip (or, for a required backend, fail) the current test: backend ``name`` is unavailable."""
    message = f"backend {name!r} unavailable: {reason}"
    if name in required_backends():
        pytest.fail(message + " (required by COMPUTEHAL_REQUIRE_BACKENDS)", pytrace=False)
    pytest.skip(message)


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


def live_count(backend: ComputeBackend) -> int | None:
    """``backend.live_allocations()`` where the backend offers it, else None."""
    counter = getattr(backend, "live_allocations", None)
    return counter() if callable(counter) else None


@pytest.fixture(params=sorted(BACKEND_FACTORIES))
def backend(request: pytest.FixtureRequest) -> Iterator[ComputeBackend]:
    """Each available backend (one shared, initialised instance per session).

    After the test, the number of live allocations must be back where it started.
    """
    be = use_shared(request.param)
    before = live_count(be)
    yield be
    after = live_count(be)
    assert after == before, f"{request.param}: live allocations went from {before} to {after} during the test"


@pytest.fixture(params=sorted(BACKEND_FACTORIES))
def backend_factory(request: pytest.FixtureRequest) -> Callable[[], ComputeBackend]:
    """Each available backend's factory (for tests that need fresh, uninitialised instances)."""
    name: str = request.param
    use_shared(name)  # skips / fails when the backend cannot run here
    return BACKEND_FACTORIES[name]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for backend in _SHARED.values():
        if not isinstance(backend, str):
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - best effort at interpreter shutdown
                pass
