"""Conformance tests not passing yet, per backend: the transition list of the op-set work.

Backends are being extended while the conformance kit already checks the whole
interface. Each backend's set names the kit tests (case ids ``<op>-<case>`` and
``offers-<op>-<dtype>``, fnmatch patterns allowed) that fail on it today because the
feature is not written yet. ``tests/test_conformance.py`` marks exactly these as strict
expected failures: when a backend starts passing one, the test XPASSes and fails, and
the entry must be deleted here. Never add an entry to hide a regression; ``computehal
check`` ignores this file and reports what it finds.
"""

from __future__ import annotations

import fnmatch
from typing import Any


def is_pending(backend: str, test_id: str) -> bool:
    """True when ``test_id`` (``<op>-<case>`` or ``offers-<op>-<dtype>``) is pending on ``backend``."""
    return any(fnmatch.fnmatchcase(test_id, pattern) for pattern in PENDING.get(backend, ()))


def unexpected_failures(backend: str, report: Any) -> list[str]:
    """Ids of the failed cases of a ``ConformanceReport`` that are not pending on ``backend``."""
    return [r.id for r in report.failures if not is_pending(backend, r.id)]


PENDING: dict[str, frozenset[str]] = {
    "cpu": frozenset(),
    "opencl": frozenset(),
    "wgpu": frozenset(),
}
