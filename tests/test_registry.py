"""Registry semantics of SPEC section 5: kinds, requests, entries, selection, routing."""

from __future__ import annotations

import dataclasses

import pytest

from computehal import Capabilities, InvalidArgumentError, OpClass, UnsupportedError
from computehal.registry import BackendEntry, BackendKind, BackendRegistry, SelectionRequest

GPU_CAPS = Capabilities(supports_fp16=True, unified_memory=False, warp_size=32)
TENSOR_CAPS = Capabilities(
    supports_fp16=True, supports_bf16=True, tensor_cores=True, unified_memory=False, peer_access=True
)


def registry_of(*entries: BackendEntry) -> BackendRegistry:
    registry = BackendRegistry()
    for entry in entries:
        registry.register(entry)
    return registry


# ---------------------------------------------------------------------- BackendKind


def test_kind_values_and_priorities() -> None:
    expected = {
        "cuda": 100,
        "rocm": 90,
        "metal": 85,
        "level_zero": 80,
        "opencl": 70,
        "vulkan": 60,
        "webgpu": 50,
        "cpu": 1,
    }
    assert {kind.value: kind.default_priority() for kind in BackendKind} == expected


def test_is_gpu() -> None:
    assert not BackendKind.CPU.is_gpu()
    assert all(kind.is_gpu() for kind in BackendKind if kind is not BackendKind.CPU)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("cuda", BackendKind.CUDA),
        ("  CUDA \n", BackendKind.CUDA),
        ("nvidia", BackendKind.CUDA),
        ("NVIDIA", BackendKind.CUDA),
        ("rocm", BackendKind.ROCM),
        ("hip", BackendKind.ROCM),
        ("amd", BackendKind.ROCM),
        ("metal", BackendKind.METAL),
        ("mtl", BackendKind.METAL),
        ("Apple", BackendKind.METAL),
        ("level_zero", BackendKind.LEVEL_ZERO),
        ("levelzero", BackendKind.LEVEL_ZERO),
        ("level-zero", BackendKind.LEVEL_ZERO),
        ("l0", BackendKind.LEVEL_ZERO),
        ("intel", BackendKind.LEVEL_ZERO),
        ("opencl", BackendKind.OPENCL),
        ("cl", BackendKind.OPENCL),
        ("OpenCL", BackendKind.OPENCL),
        ("vulkan", BackendKind.VULKAN),
        ("vk", BackendKind.VULKAN),
        ("webgpu", BackendKind.WEBGPU),
        ("wgpu", BackendKind.WEBGPU),
        ("cpu", BackendKind.CPU),
        ("host", BackendKind.CPU),
        ("reference", BackendKind.CPU),
    ],
)
def test_from_name_accepts_values_and_aliases(name: str, kind: BackendKind) -> None:
    assert BackendKind.from_name(name) is kind


@pytest.mark.parametrize("name", ["", "   ", "tpu", "cuda:0", "gpu", "c u d a"])
def test_from_name_unknown_is_none(name: str) -> None:
    assert BackendKind.from_name(name) is None


def test_from_name_non_string_is_none() -> None:
    assert BackendKind.from_name(3) is None  # type: ignore[arg-type]


# ---------------------------------------------------------------------- request and entry


def test_selection_request_is_frozen_with_spec_fields() -> None:
    names = [f.name for f in dataclasses.fields(SelectionRequest)]
    assert names == [
        "require_gpu",
        "require_fp16",
        "require_bf16",
        "require_fp8",
        "require_tensor_cores",
        "require_unified_memory",
        "require_peer_access",
        "pin",
    ]
    request = SelectionRequest()
    assert request.pin is None and not any(getattr(request, n) for n in names[:-1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.require_gpu = True  # type: ignore[misc]


def test_selection_request_pin_accepts_a_name() -> None:
    assert SelectionRequest(pin="cl").pin is BackendKind.OPENCL  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        SelectionRequest(pin="tpu")  # type: ignore[arg-type]


def test_entry_defaults_and_builders() -> None:
    entry = BackendEntry(BackendKind.VULKAN, True)
    assert entry.priority == 60
    assert entry.capabilities == Capabilities.cpu()
    raised = entry.with_priority(500)
    assert raised.priority == 500 and raised.kind is BackendKind.VULKAN and raised.available
    assert entry.priority == 60  # builders return copies
    rich = entry.with_capabilities(TENSOR_CAPS)
    assert rich.capabilities is TENSOR_CAPS and rich.priority == 60
    assert entry.with_priority(7).with_capabilities(GPU_CAPS) == BackendEntry(
        BackendKind.VULKAN, True, 7, GPU_CAPS
    )


# ---------------------------------------------------------------------- registry contents


def test_register_same_kind_replaces_in_place() -> None:
    registry = registry_of(
        BackendEntry(BackendKind.CPU, True),
        BackendEntry(BackendKind.OPENCL, False),
        BackendEntry(BackendKind.VULKAN, True),
    )
    registry.register(BackendEntry(BackendKind.OPENCL, True).with_capabilities(GPU_CAPS))
    entries = registry.entries()
    assert [e.kind for e in entries] == [BackendKind.CPU, BackendKind.OPENCL, BackendKind.VULKAN]
    assert len(registry) == 3
    opencl = registry.get(BackendKind.OPENCL)
    assert opencl is not None and opencl.available and opencl.capabilities == GPU_CAPS


def test_get_and_contains() -> None:
    registry = registry_of(BackendEntry(BackendKind.CUDA, True))
    assert registry.get("nvidia") == BackendEntry(BackendKind.CUDA, True)
    assert registry.get(BackendKind.CPU) is None
    assert BackendKind.CUDA in registry and "cuda" in registry and "cpu" not in registry


def test_set_available_and_set_capabilities() -> None:
    registry = registry_of(BackendEntry(BackendKind.OPENCL, False))
    assert registry.available_kinds() == []
    registry.set_available(BackendKind.OPENCL, True)
    assert registry.available_kinds() == [BackendKind.OPENCL]
    registry.set_capabilities("opencl", GPU_CAPS)
    entry = registry.get(BackendKind.OPENCL)
    assert entry is not None and entry.capabilities == GPU_CAPS and entry.available
    registry.set_available("opencl", False)
    entry = registry.get(BackendKind.OPENCL)
    assert entry is not None and not entry.available and entry.capabilities == GPU_CAPS
    # A missing kind is registered on first mention.
    registry.set_available(BackendKind.CPU, True)
    assert registry.available_kinds() == [BackendKind.CPU]


def test_available_kinds_in_priority_order() -> None:
    registry = registry_of(
        BackendEntry(BackendKind.CPU, True),
        BackendEntry(BackendKind.WEBGPU, True),
        BackendEntry(BackendKind.CUDA, False),
        BackendEntry(BackendKind.OPENCL, True),
        BackendEntry(BackendKind.METAL, True),
    )
    assert registry.available_kinds() == [
        BackendKind.METAL,
        BackendKind.OPENCL,
        BackendKind.WEBGPU,
        BackendKind.CPU,
    ]


# ---------------------------------------------------------------------- selection


def test_select_highest_priority_available() -> None:
    registry = registry_of(
        BackendEntry(BackendKind.CPU, True),
        BackendEntry(BackendKind.OPENCL, True),
        BackendEntry(BackendKind.CUDA, False),
        BackendEntry(BackendKind.VULKAN, True),
    )
    assert registry.select(SelectionRequest()) is BackendKind.OPENCL
    assert registry.select() is BackendKind.OPENCL
    assert registry.select_best() is BackendKind.OPENCL


def test_custom_priority_wins() -> None:
    registry = registry_of(
        BackendEntry(BackendKind.OPENCL, True),
        BackendEntry(BackendKind.CPU, True).with_priority(1000),
    )
    assert registry.select() is BackendKind.CPU


def test_select_filters_on_every_requirement() -> None:
    registry = registry_of(
        BackendEntry(BackendKind.CPU, True),
        BackendEntry(BackendKind.OPENCL, True).with_capabilities(GPU_CAPS),
        BackendEntry(BackendKind.ROCM, True).with_capabilities(
            Capabilities(supports_fp16=True, supports_bf16=True, unified_memory=False)
        ),
        BackendEntry(BackendKind.CUDA, True).with_capabilities(TENSOR_CAPS),
    )
    assert registry.select(SelectionRequest(require_fp16=True)) is BackendKind.CUDA
    registry.set_available(BackendKind.CUDA, False)
    assert registry.select(SelectionRequest(require_gpu=True)) is BackendKind.ROCM
    assert registry.select(SelectionRequest(require_bf16=True)) is BackendKind.ROCM
    assert registry.select(SelectionRequest(require_unified_memory=True)) is BackendKind.CPU
    registry.set_available(BackendKind.ROCM, False)
    assert registry.select(SelectionRequest(require_fp16=True)) is BackendKind.OPENCL
    with pytest.raises(UnsupportedError):
        registry.select(SelectionRequest(require_tensor_cores=True))
    with pytest.raises(UnsupportedError):
        registry.select(SelectionRequest(require_fp8=True))
    with pytest.raises(UnsupportedError):
        registry.select(SelectionRequest(require_peer_access=True))
    registry.set_available(BackendKind.CUDA, True)
    assert registry.select(SelectionRequest(require_peer_access=True, require_tensor_cores=True)) is (
        BackendKind.CUDA
    )


def test_pin_restricts_to_one_kind() -> None:
    registry = registry_of(
        BackendEntry(BackendKind.CPU, True),
        BackendEntry(BackendKind.OPENCL, True).with_capabilities(GPU_CAPS),
        BackendEntry(BackendKind.CUDA, True).with_capabilities(TENSOR_CAPS),
    )
    assert registry.select(SelectionRequest(pin=BackendKind.CPU)) is BackendKind.CPU
    assert registry.select(SelectionRequest(pin=BackendKind.OPENCL)) is BackendKind.OPENCL
    # The pin still has to meet the other requirements and be available.
    with pytest.raises(UnsupportedError, match="pin=cpu"):
        registry.select(SelectionRequest(pin=BackendKind.CPU, require_gpu=True))
    registry.set_available(BackendKind.OPENCL, False)
    with pytest.raises(UnsupportedError, match="opencl: unavailable"):
        registry.select(SelectionRequest(pin=BackendKind.OPENCL))
    with pytest.raises(UnsupportedError, match="metal"):
        registry.select(SelectionRequest(pin=BackendKind.METAL))  # not registered at all


def test_nothing_qualifies_error_names_the_request_and_the_reasons() -> None:
    registry = registry_of(
        BackendEntry(BackendKind.CPU, True),
        BackendEntry(BackendKind.OPENCL, False).with_capabilities(GPU_CAPS),
    )
    with pytest.raises(UnsupportedError) as caught:
        registry.select(SelectionRequest(require_gpu=True, require_bf16=True))
    text = str(caught.value)
    assert text.startswith("unsupported operation: ")
    assert "gpu" in text and "bf16" in text  # what was asked
    assert "cpu: not a GPU, no bf16" in text  # why the CPU did not qualify
    assert "opencl: unavailable, no bf16" in text


def test_empty_registry_select_raises_and_chain_is_cpu() -> None:
    registry = BackendRegistry()
    with pytest.raises(UnsupportedError, match="no backend is registered"):
        registry.select()
    assert registry.fallback_chain() == [BackendKind.CPU]
    assert registry.select_best() is BackendKind.CPU
    assert registry.route(OpClass.MATMUL) is BackendKind.CPU


def test_fallback_chain_is_the_priority_order_with_the_cpu_as_last_resort() -> None:
    registry = registry_of(
        BackendEntry(BackendKind.CPU, True).with_priority(65),
        BackendEntry(BackendKind.VULKAN, True),
        BackendEntry(BackendKind.CUDA, True),
        BackendEntry(BackendKind.OPENCL, False),
        BackendEntry(BackendKind.METAL, True),
    )
    # auto()'s order: the CPU at its own priority.
    assert registry.fallback_chain() == [
        BackendKind.CUDA,
        BackendKind.METAL,
        BackendKind.CPU,
        BackendKind.VULKAN,
    ]
    assert registry.select_best() is BackendKind.CUDA
    # An unavailable or unregistered CPU ends the chain: it is the last resort.
    registry.set_available(BackendKind.CPU, False)
    assert registry.fallback_chain() == [
        BackendKind.CUDA,
        BackendKind.METAL,
        BackendKind.VULKAN,
        BackendKind.CPU,
    ]
    assert registry.fallback_chain().count(BackendKind.CPU) == 1


def test_backends_ranked_below_the_cpu_come_after_it_in_the_chain() -> None:
    # PoCL / lavapipe on the host are ranked below the CPU backend (priority 0): a fallback
    # must land where auto() would, on the CPU, not on them.
    registry = registry_of(
        BackendEntry(BackendKind.OPENCL, True, priority=0),
        BackendEntry(BackendKind.VULKAN, True, priority=0),
        BackendEntry(BackendKind.CUDA, False),
        BackendEntry(BackendKind.CPU, True),
    )
    assert registry.fallback_chain() == [BackendKind.CPU, BackendKind.OPENCL, BackendKind.VULKAN]
    assert registry.select_best() is BackendKind.CPU is registry.fallback_chain()[0]
    assert registry.route(OpClass.ELEMENTWISE) is BackendKind.CPU


def test_candidates_split_qualifying_and_rejected_with_reasons() -> None:
    registry = registry_of(
        BackendEntry(BackendKind.CPU, True),
        BackendEntry(BackendKind.OPENCL, True).with_capabilities(GPU_CAPS),
        BackendEntry(BackendKind.CUDA, False).with_capabilities(TENSOR_CAPS),
    )
    qualifying, rejected = registry.candidates(SelectionRequest(require_fp16=True))
    assert qualifying == [BackendKind.OPENCL]
    assert dict(rejected) == {BackendKind.CUDA: ["unavailable"], BackendKind.CPU: ["no fp16"]}
    qualifying, rejected = registry.candidates()
    assert qualifying == [BackendKind.OPENCL, BackendKind.CPU] and [k for k, _ in rejected] == [
        BackendKind.CUDA
    ]


# ---------------------------------------------------------------------- routing


def test_route_prefers_tensor_cores_for_matmul_conv_attention() -> None:
    registry = registry_of(
        BackendEntry(BackendKind.CPU, True),
        BackendEntry(BackendKind.CUDA, True).with_capabilities(GPU_CAPS),  # best, no tensor cores
        BackendEntry(BackendKind.VULKAN, True).with_capabilities(TENSOR_CAPS),
    )
    for family in (OpClass.MATMUL, OpClass.CONVOLUTION, OpClass.ATTENTION, "matmul"):
        assert registry.route(family) is BackendKind.VULKAN
    for family in (OpClass.REDUCTION, OpClass.ELEMENTWISE, OpClass.MEMORY):
        assert registry.route(family) is BackendKind.CUDA


def test_route_without_tensor_cores_is_the_best() -> None:
    registry = registry_of(
        BackendEntry(BackendKind.CPU, True),
        BackendEntry(BackendKind.OPENCL, True).with_capabilities(GPU_CAPS),
        BackendEntry(BackendKind.CUDA, False).with_capabilities(TENSOR_CAPS),  # unavailable
    )
    assert registry.route(OpClass.MATMUL) is BackendKind.OPENCL
    assert registry.route(OpClass.ELEMENTWISE) is BackendKind.OPENCL


def test_route_float64_matmul_avoids_backends_without_fp64() -> None:
    no_fp64 = Capabilities(supports_fp64=False, unified_memory=False)
    registry = registry_of(
        BackendEntry(BackendKind.CPU, True),
        BackendEntry(BackendKind.VULKAN, True).with_capabilities(no_fp64),
    )
    assert registry.route(OpClass.MATMUL) is BackendKind.VULKAN
    assert registry.route(OpClass.MATMUL, dtype="float32") is BackendKind.VULKAN
    assert registry.route(OpClass.MATMUL, dtype="float64") is BackendKind.CPU


def test_route_rejects_unknown_op_class() -> None:
    with pytest.raises(InvalidArgumentError):
        BackendRegistry().route("teleport")


def test_negative_priority_is_kept() -> None:
    entry = BackendEntry(BackendKind.CUDA, True, priority=-1)
    assert entry.priority == -1
    registry = registry_of(entry, BackendEntry(BackendKind.CPU, True))
    assert registry.select() is BackendKind.CPU
