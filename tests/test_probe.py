"""Probing this machine, create_backend / auto, fallback, strict mode and COMPUTEHAL_BACKEND.

Machines with other backends are simulated: a missing dependency by making its import
fail (``sys.modules[name] = None`` makes ``import name`` raise ImportError), a present
GPU by fake backend classes (a CPU backend that reports itself as a GPU kind) placed
in the backend table, :data:`computehal.backends.BACKENDS`.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import types

import pytest

import computehal
import computehal.backends as backends_mod
import computehal.probe as probe_mod
import computehal.selection as selection_mod
from computehal import (
    Capabilities,
    CpuBackend,
    DeviceError,
    DeviceInfo,
    ForwardingBackend,
    InvalidArgumentError,
    MemoryKind,
    UnsupportedError,
)
from computehal.backends import BackendSpec
from computehal.probe import probe
from computehal.registry import BackendKind, SelectionRequest
from computehal.selection import create_backend, last_selection, parse_backend_name

GPU_DEPENDENCIES = ("pyopencl", "wgpu", "cupy", "cupy_backends")
GPU_MODULES = (
    "computehal.backends.opencl",
    "computehal.backends.wgpu",
    "computehal.backends.cuda",
)
FAKE_MODULE = "computehal_test_fake_backends"


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test probes afresh and sees no COMPUTEHAL_BACKEND; the real cache is restored after."""
    monkeypatch.setattr(probe_mod, "_cache", None)
    monkeypatch.setattr(selection_mod, "_last", None)
    monkeypatch.delenv(selection_mod.ENV_VAR, raising=False)


def hide_gpu_dependencies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulate a machine where pyopencl, wgpu and CuPy are not installed."""
    for name in list(sys.modules):
        if name.split(".")[0] in GPU_DEPENDENCIES or name.startswith(GPU_MODULES):
            monkeypatch.delitem(sys.modules, name)
    for name in GPU_DEPENDENCIES:
        monkeypatch.setitem(sys.modules, name, None)


# ---------------------------------------------------------------------- fake GPU backends


class FakeGpuBackend(ForwardingBackend):
    """The CPU backend wearing a GPU kind's name, with two fake devices."""

    kind = "opencl"
    fail_init = False
    constructed: list[int] = []

    def __init__(self, device: int = 0) -> None:
        super().__init__(CpuBackend())
        self.device = device
        type(self).constructed.append(device)

    def name(self) -> str:
        return self.kind

    def init(self) -> None:
        if self.fail_init:
            raise DeviceError("simulated driver failure")
        super().init()

    def capabilities(self) -> Capabilities:
        return Capabilities(supports_fp16=True, unified_memory=False, warp_size=32)

    def available_devices(self) -> list[DeviceInfo]:
        caps = self.capabilities()
        return [
            DeviceInfo(i, f"fake {self.kind} device {i}", (8, 0), 1 << 30, MemoryKind.DEVICE, caps)
            for i in range(2)
        ]


class FakeOpenCL(FakeGpuBackend):
    kind = "opencl"
    constructed: list[int] = []


class FakeCuda(FakeGpuBackend):
    kind = "cuda"
    constructed: list[int] = []


class BrokenCuda(FakeCuda):
    fail_init = True


class DevicelessVulkan(FakeGpuBackend):
    kind = "vulkan"

    def available_devices(self) -> list[DeviceInfo]:
        return []


def install_fakes(monkeypatch: pytest.MonkeyPatch, *classes: type[FakeGpuBackend]) -> None:
    """Replace the backend table: the given fakes plus the real CPU backend."""
    module = types.ModuleType(FAKE_MODULE)
    specs = []
    for cls in classes:
        setattr(module, cls.__name__, cls)
        cls.constructed = []
        kind = BackendKind.from_name(cls.kind)
        assert kind is not None
        specs.append(BackendSpec(cls.__name__.lower(), FAKE_MODULE, cls.__name__, (kind,)))
    monkeypatch.setitem(sys.modules, FAKE_MODULE, module)
    specs.append(BackendSpec("cpu", "computehal.backends.cpu", "CpuBackend", (BackendKind.CPU,)))
    monkeypatch.setattr(backends_mod, "BACKENDS", tuple(specs))


# ---------------------------------------------------------------------- import stays cheap


def test_import_is_cheap_and_touches_no_device() -> None:
    code = (
        "import sys, computehal\n"
        "computehal.auto; computehal.BackendKind; computehal.SelectionRequest\n"
        "heavy = [m for m in ('scipy', 'pyopencl', 'wgpu', 'cupy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert computehal.probe._cache is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_top_level_exports() -> None:
    assert computehal.create_backend is create_backend
    assert computehal.probe_backends is probe
    assert computehal.last_selection is last_selection
    assert computehal.BackendKind is BackendKind


# ---------------------------------------------------------------------- the real probe


def test_probe_reports_every_kind_and_is_cached() -> None:
    report = probe()
    assert {e.kind for e in report.entries} == set(BackendKind)
    priorities = [e.priority for e in report.entries]
    assert priorities == sorted(priorities, reverse=True)
    for entry in report.entries:
        expected = 0 if entry.on_host_cpu else entry.kind.default_priority()
        assert entry.priority == expected
    assert probe() is report
    assert probe(refresh=True) is not report
    cpu = report.entry("cpu")
    assert cpu.available and cpu.reason == "" and len(cpu.devices) >= 1
    assert cpu.target == "computehal.backends.cpu.CpuBackend"
    assert cpu.capabilities is not None and cpu.capabilities.supports_fp64
    level_zero = report.entry(BackendKind.LEVEL_ZERO)
    assert not level_zero.available and "no level_zero backend" in level_zero.reason
    for entry in report.entries:
        assert entry.available == (entry.reason == "")
        assert entry.available == bool(entry.devices)


def test_machine_without_gpu_dependencies(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_gpu_dependencies(monkeypatch)
    report = probe(refresh=True)
    assert report.available_kinds() == [BackendKind.CPU]
    unavailable = report.unavailable()
    assert set(unavailable) == set(BackendKind) - {BackendKind.CPU}
    for kind, reason in unavailable.items():
        assert reason, kind
    # Where the backend module exists, the reason is its dependency's import error.
    dependency = {BackendKind.OPENCL: "pyopencl", BackendKind.VULKAN: "wgpu", BackendKind.CUDA: "cup"}
    for kind, name in dependency.items():
        if "No module named 'computehal.backends" not in unavailable[kind]:
            assert name in unavailable[kind], (kind, unavailable[kind])

    backend = computehal.auto()
    try:
        assert isinstance(backend, CpuBackend) and backend.is_initialized()
    finally:
        backend.close()
    selection = last_selection()
    assert selection is not None and selection.kind is BackendKind.CPU and not selection.fell_back
    skipped = dict(selection.skipped)
    assert skipped[BackendKind.OPENCL] == "unavailable: " + unavailable[BackendKind.OPENCL]

    # Asking for OpenCL by name falls back to the CPU, saying why ...
    backend = create_backend("opencl")
    try:
        assert isinstance(backend, CpuBackend)
    finally:
        backend.close()
    selection = last_selection()
    assert selection is not None and selection.fell_back and selection.requested == "opencl:0"
    assert dict(selection.skipped)[BackendKind.OPENCL].startswith("unavailable: ")
    # ... and with strict=True it raises with the import error instead.
    with pytest.raises(UnsupportedError) as caught:
        create_backend("opencl", strict=True)
    assert unavailable[BackendKind.OPENCL] in str(caught.value)
    with pytest.raises(UnsupportedError, match="not a GPU"):
        computehal.auto(SelectionRequest(require_gpu=True), strict=True)


# ---------------------------------------------------------------------- simulated GPUs


def test_probe_with_fake_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fakes(monkeypatch, FakeOpenCL, DevicelessVulkan)
    report = probe(refresh=True)
    opencl = report.entry("opencl")
    assert opencl.available and len(opencl.devices) == 2
    assert opencl.target == f"{FAKE_MODULE}.FakeOpenCL"
    assert opencl.capabilities is not None and opencl.capabilities.supports_fp16
    assert report.entry("vulkan").reason == "no device"
    assert report.entry("cuda").reason == "computehal has no cuda backend"
    registry = report.registry()
    assert registry.fallback_chain() == [BackendKind.OPENCL, BackendKind.CPU]
    assert registry.select(SelectionRequest(require_fp16=True)) is BackendKind.OPENCL


def test_auto_picks_best_and_explains(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    install_fakes(monkeypatch, FakeOpenCL)
    with caplog.at_level(logging.INFO, logger="computehal"):
        backend = computehal.auto()
    assert isinstance(backend, FakeOpenCL) and backend.is_initialized()
    selection = last_selection()
    assert selection is not None
    assert (selection.kind, selection.device, selection.source) == (BackendKind.OPENCL, 0, "default")
    assert "highest-priority" in selection.reason and not selection.fell_back
    assert "selected opencl:0" in caplog.text


def test_init_failure_walks_the_fallback_chain(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    install_fakes(monkeypatch, BrokenCuda, FakeOpenCL)
    with caplog.at_level(logging.INFO, logger="computehal"):
        backend = create_backend()
    assert isinstance(backend, FakeOpenCL)
    selection = last_selection()
    assert selection is not None and selection.fell_back
    assert (
        dict(selection.skipped)[BackendKind.CUDA] == "failed to start: device error: simulated driver failure"
    )
    assert any(
        r.levelno == logging.WARNING and "simulated driver failure" in r.message for r in caplog.records
    )
    with pytest.raises(UnsupportedError, match="simulated driver failure"):
        create_backend(strict=True)


def test_request_filters_and_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fakes(monkeypatch, FakeCuda, FakeOpenCL)
    assert isinstance(create_backend(SelectionRequest(pin=BackendKind.OPENCL)), FakeOpenCL)
    assert isinstance(create_backend(BackendKind.CPU), CpuBackend)
    assert isinstance(create_backend(SelectionRequest(require_unified_memory=True)), CpuBackend)
    # Nothing has bf16: without strict the best backend runs anyway, and says so.
    backend = create_backend(SelectionRequest(require_bf16=True))
    assert isinstance(backend, FakeCuda)
    selection = last_selection()
    assert selection is not None and selection.fell_back
    assert "no bf16" in dict(selection.skipped)[BackendKind.CUDA]
    with pytest.raises(UnsupportedError, match="bf16"):
        create_backend(SelectionRequest(require_bf16=True), strict=True)


def test_name_with_device_ordinal(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fakes(monkeypatch, FakeCuda)
    backend = create_backend("nvidia:1")
    assert isinstance(backend, FakeCuda) and backend.device == 1
    selection = last_selection()
    assert selection is not None and (selection.kind, selection.device) == (BackendKind.CUDA, 1)
    assert selection.reason == "cuda was asked for by name"
    # A device that does not exist: fallback, or an error under strict.
    backend = create_backend("cuda:7")
    assert isinstance(backend, CpuBackend)
    selection = last_selection()
    assert (
        selection is not None
        and "device 7 not present (2 device(s))" in dict(selection.skipped)[BackendKind.CUDA]
    )
    with pytest.raises(UnsupportedError, match="device 7 not present"):
        create_backend("cuda:7", strict=True)
    with pytest.raises(UnsupportedError, match="device 1 not present"):
        create_backend("cpu:1", strict=True)


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "cuda:-1", ""])
def test_bad_names(bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_backend_name(bad)
    with pytest.raises(InvalidArgumentError):
        create_backend(bad)


def test_bad_request_type() -> None:
    with pytest.raises(InvalidArgumentError):
        create_backend(3.5)  # type: ignore[arg-type]


def test_parse_backend_name() -> None:
    assert parse_backend_name("opencl") == (BackendKind.OPENCL, 0)
    assert parse_backend_name(" CUDA:1 ") == (BackendKind.CUDA, 1)
    assert parse_backend_name("cl: 2") == (BackendKind.OPENCL, 2)


# ---------------------------------------------------------------------- COMPUTEHAL_BACKEND


def test_environment_override(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    install_fakes(monkeypatch, FakeCuda, FakeOpenCL)
    monkeypatch.setenv("COMPUTEHAL_BACKEND", "cpu")
    with caplog.at_level(logging.INFO, logger="computehal"):
        backend = create_backend(SelectionRequest(require_gpu=True))
    assert isinstance(backend, CpuBackend)
    selection = last_selection()
    assert selection is not None and selection.source == "COMPUTEHAL_BACKEND"
    assert selection.reason == "cpu was set by COMPUTEHAL_BACKEND"
    assert "COMPUTEHAL_BACKEND=cpu overrides" in caplog.text

    monkeypatch.setenv("COMPUTEHAL_BACKEND", " OpenCL:1 ")
    backend = computehal.auto()
    assert isinstance(backend, FakeOpenCL) and backend.device == 1

    monkeypatch.setenv("COMPUTEHAL_BACKEND", "auto")
    assert isinstance(computehal.auto(), FakeCuda)

    monkeypatch.setenv("COMPUTEHAL_BACKEND", "vulkan")
    assert isinstance(computehal.auto(), FakeCuda)  # unavailable: falls back along the chain
    with pytest.raises(UnsupportedError, match="vulkan"):
        computehal.auto(strict=True)

    monkeypatch.setenv("COMPUTEHAL_BACKEND", "no-such-backend")
    with pytest.raises(InvalidArgumentError, match="no-such-backend"):
        computehal.auto()


def test_environment_override_with_missing_dependency(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_gpu_dependencies(monkeypatch)
    monkeypatch.setenv("COMPUTEHAL_BACKEND", "opencl")
    backend = computehal.auto()
    try:
        assert isinstance(backend, CpuBackend)
    finally:
        backend.close()
    with pytest.raises(UnsupportedError, match="opencl"):
        computehal.auto(strict=True)


def test_start_backend_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fakes(monkeypatch, FakeOpenCL)
    monkeypatch.setenv("COMPUTEHAL_BACKEND", "cpu")  # start_backend ignores the override
    assert isinstance(selection_mod.start_backend("opencl:1"), FakeOpenCL)
    assert FakeOpenCL.constructed[-1] == 1
    with pytest.raises(UnsupportedError, match="unavailable"):
        selection_mod.start_backend("cuda")
    with pytest.raises(UnsupportedError, match="no device 5"):
        selection_mod.start_backend("opencl:5")


def test_selection_summary_lists_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fakes(monkeypatch, BrokenCuda)
    create_backend()
    selection = last_selection()
    assert selection is not None
    text = selection.summary()
    assert text.splitlines()[0].startswith("selected cpu:0")
    assert "skipped cuda: failed to start" in text


class FakeWgpu(FakeGpuBackend):
    kind = "vulkan"
    constructed: list[int] = []


def test_multi_kind_backend_and_the_generic_wgpu_name(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType(FAKE_MODULE)
    module.FakeWgpu = FakeWgpu  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, FAKE_MODULE, module)
    kinds = (BackendKind.METAL, BackendKind.VULKAN, BackendKind.WEBGPU)
    monkeypatch.setattr(
        backends_mod,
        "BACKENDS",
        (
            BackendSpec("wgpu", FAKE_MODULE, "FakeWgpu", kinds),
            BackendSpec("cpu", "computehal.backends.cpu", "CpuBackend", (BackendKind.CPU,)),
        ),
    )
    report = probe(refresh=True)
    assert report.entry("vulkan").available
    for kind in ("metal", "webgpu"):
        entry = report.entry(kind)
        assert not entry.available and entry.reason == "FakeWgpu runs as vulkan on this machine"
        assert entry.runs_as is BackendKind.VULKAN
    # "wgpu" / "webgpu" name the wgpu backend whatever adapter kind it runs as here ...
    assert isinstance(create_backend("wgpu", strict=True), FakeWgpu)
    selection = last_selection()
    assert selection is not None and selection.kind is BackendKind.VULKAN and not selection.fell_back
    assert isinstance(selection_mod.start_backend("webgpu:1"), FakeWgpu) and FakeWgpu.constructed[-1] == 1
    # ... but "metal" means Metal.
    with pytest.raises(UnsupportedError, match="runs as vulkan"):
        create_backend("metal", strict=True)


def test_backends_whose_only_device_is_the_host_cpu_rank_below_the_cpu_backend() -> None:
    from computehal.probe import ProbeEntry, ProbeReport
    from computehal.types import DeviceInfo, MemoryKind

    host = DeviceInfo(0, "pthread-cpu", memory_kind=MemoryKind.HOST)
    gpu = DeviceInfo(0, "a gpu", memory_kind=MemoryKind.DEVICE)
    software_cl = ProbeEntry(BackendKind.OPENCL, True, devices=(host,))
    real_vk = ProbeEntry(BackendKind.VULKAN, True, devices=(gpu,))
    cpu = ProbeEntry(BackendKind.CPU, True, devices=(host,))
    assert software_cl.on_host_cpu and not real_vk.on_host_cpu and not cpu.on_host_cpu
    assert software_cl.priority < cpu.priority < real_vk.priority
    registry = ProbeReport((software_cl, cpu)).registry()
    assert registry.select_best() is BackendKind.CPU
    assert registry.fallback_chain() == [BackendKind.CPU, BackendKind.OPENCL]
    assert ProbeReport((real_vk, software_cl, cpu)).registry().select_best() is BackendKind.VULKAN


# ---------------------------------------------------------------------- regressions (hostile use)


def _host_cpu_machine() -> probe_mod.ProbeReport:
    """A machine like this one: no CUDA; PoCL and lavapipe, whose only device is the host CPU."""
    host = DeviceInfo(0, "host cpu", memory_kind=MemoryKind.HOST)
    caps = Capabilities()
    return probe_mod.ProbeReport(
        (
            probe_mod.ProbeEntry(BackendKind.CUDA, False, reason="no CUDA driver"),
            probe_mod.ProbeEntry(BackendKind.OPENCL, True, devices=(host,), capabilities=caps),
            probe_mod.ProbeEntry(BackendKind.VULKAN, True, devices=(host,), capabilities=caps),
            probe_mod.ProbeEntry(BackendKind.CPU, True, devices=(host,), capabilities=caps),
        )
    )


@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_unavailable_named_backend_falls_back_to_what_auto_chooses(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    report = _host_cpu_machine()
    assert report.registry().select_best() is BackendKind.CPU  # what auto() chooses here
    with caplog.at_level(logging.INFO, logger="computehal"):
        backend = computehal.create_backend(name, report=report)
    try:
        assert isinstance(backend, CpuBackend), backend  # not PoCL / lavapipe
    finally:
        backend.close()
    assert any(r.levelno == logging.WARNING and "no CUDA driver" in r.message for r in caplog.records)


def test_environment_names_an_unavailable_backend_falls_back_to_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(probe_mod, "_cache", _host_cpu_machine())
    monkeypatch.setenv("COMPUTEHAL_BACKEND", "cuda")
    backend = computehal.auto()
    try:
        assert isinstance(backend, CpuBackend), backend
        a = backend.alloc(8)  # float64 work runs, as it does under auto()
        backend.free(a)
    finally:
        backend.close()


@pytest.mark.parametrize("value", ["cpu:²", "cpu:١", "cpu:0x1", "cpu:+1"])
def test_environment_with_a_non_ascii_ordinal_is_a_clean_error(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("COMPUTEHAL_BACKEND", value)
    with pytest.raises(InvalidArgumentError, match="COMPUTEHAL_BACKEND"):
        computehal.auto()
    with pytest.raises(InvalidArgumentError):
        computehal.create_backend(value)
