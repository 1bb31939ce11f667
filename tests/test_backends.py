"""The backend table: every line names a real class, and whether each backend runs here.

A backend that cannot start here is reported once, by :func:`test_backend_starts`
(skipped with the reason, or failed when ``COMPUTEHAL_REQUIRE_BACKENDS`` names it),
instead of once per backend-parametrised test.
"""

from __future__ import annotations

import pytest

from computehal import ComputeBackend
from computehal.backends import BACKENDS, spec_for_kind, spec_named
from computehal.backends._base import TableBackend
from computehal.errors import InvalidArgumentError
from computehal.registry import BackendKind
from conftest import required, shared_backend, unavailable


@pytest.mark.parametrize("name", [spec.name for spec in BACKENDS])
def test_backend_starts(name: str) -> None:
    backend = shared_backend(name)
    if isinstance(backend, str):
        unavailable(name, backend)
    assert isinstance(backend, ComputeBackend) and backend.is_initialized()
    spec = spec_named(name)
    assert spec.kind_of(backend) in spec.kinds
    assert backend.device == 0


def test_table_lines_are_unique_and_cover_their_kinds() -> None:
    names = [spec.name for spec in BACKENDS]
    assert len(names) == len(set(names))
    kinds = [kind for spec in BACKENDS for kind in spec.kinds]
    assert len(kinds) == len(set(kinds))
    for spec in BACKENDS:
        assert spec.target == f"{spec.module}.{spec.class_name}"
        for kind in spec.kinds:
            assert spec_for_kind(kind) is spec
    assert spec_for_kind(BackendKind.LEVEL_ZERO) is None
    with pytest.raises(InvalidArgumentError, match="no backend named 'tpu'"):
        spec_named("tpu")


@pytest.mark.parametrize("spec", BACKENDS, ids=[spec.name for spec in BACKENDS])
def test_every_class_takes_a_device_ordinal_and_names_its_kind(spec: object) -> None:
    import inspect

    from computehal.backends import BackendSpec

    assert isinstance(spec, BackendSpec)
    try:
        cls = spec.load()
    except ImportError as error:
        if required(spec.name):
            raise
        pytest.skip(f"{spec.module} cannot be imported here: {error}")
    parameter = inspect.signature(cls).parameters.get("device")
    assert parameter is not None and parameter.default == 0, f"{cls.__name__} must take device: int = 0"
    owner = next((c for c in cls.__mro__ if "kind" in vars(c)), None)
    if owner is TableBackend:
        pytest.skip(f"{cls.__name__} does not name its kind yet (it inherits TableBackend's default)")
    kind = getattr(cls, "kind", None)
    assert owner is not None and kind is not None, f"{cls.__name__} must name its kind"
    if isinstance(kind, str):
        assert BackendKind.from_name(kind) in spec.kinds, (kind, spec.kinds)


def test_required_names_kinds_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPUTEHAL_REQUIRE_BACKENDS", " Vulkan , cpu")
    assert required("wgpu") and required("cpu") and not required("opencl") and not required("cuda")
    monkeypatch.setenv("COMPUTEHAL_REQUIRE_BACKENDS", "")
    assert not required("cpu")
