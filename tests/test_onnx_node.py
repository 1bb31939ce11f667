"""ONNX's own backend node tests, on every backend, driven by ONNX's backend test runner.

The test cases are generated from the case definitions shipped inside the ``onnx`` package
(``onnx.backend.test.case.node``): the installed ``onnx`` builds them in memory once per
test session, when this module is collected. Selected are the tests of every operator the
runner promises (the operator list below); ``onnx_backend_filter.txt`` beside this file lists
each excluded test with its reason. On opencl and vulkan, a node the backend cannot run yet
goes to the CPU backend (the plan's fallback), so these tests check results, not placement;
placement is checked by ``test_onnx_models.py``.
"""

from __future__ import annotations

import functools
import os
import re
import unittest
import warnings
from collections.abc import Callable

import pytest

pytest.importorskip("onnx")

import onnx.backend.test  # noqa: E402
from onnx.backend.test.loader import load_model_tests  # noqa: E402

from computehal.onnx import BackendLacksError, FallbackWarning  # noqa: E402
from computehal.onnx import backend as computehal_backend  # noqa: E402

#: The operators whose ONNX node tests must pass.
OPERATORS = frozenset(
    """
    Conv BatchNormalization Gemm MatMul Add Sub Mul Div Pow Sum Max Min Relu LeakyRelu Sigmoid
    Tanh Exp Log Sqrt Abs Neg Erf Gelu Clip Softmax LogSoftmax ReduceSum ReduceMean ReduceMax
    ReduceMin MaxPool AveragePool GlobalAveragePool GlobalMaxPool LRN LayerNormalization Concat
    Split Slice Transpose Reshape Flatten Squeeze Unsqueeze Expand Gather GatherElements
    ScatterElements Attention Cast Identity Dropout Constant ConstantOfShape Shape
    """.split()
)

#: The computehal backends the node tests run on (the name ONNX's "CPU" device maps to).
BACKENDS = ("cpu", "opencl", "vulkan")

FILTER_FILE = os.path.join(os.path.dirname(__file__), "onnx_backend_filter.txt")


@functools.cache
def selected_node_tests() -> frozenset[str]:
    """Names of the node tests of :data:`OPERATORS` (their ``_expanded`` variants included)."""
    cases = {case.name: case for case in load_model_tests(kind="node")}
    chosen = set()
    for name, case in cases.items():
        base = re.sub(r"_expanded(_ver\d+)?$", "", name)
        model = cases[base].model if base in cases else case.model
        ops = {node.op_type for node in model.graph.node}
        if len(ops) == 1 and ops <= OPERATORS:
            chosen.add(name)
    return frozenset(chosen)


def read_filter(path: str = FILTER_FILE) -> list[tuple[frozenset[str], str, str]]:
    """The exclusions: (backends, test-name regex, reason) per line ``backends regex # reason``."""
    entries = []
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            rule, _, reason = line.partition("#")
            parts = rule.split()
            if len(parts) != 2 or not reason.strip():
                raise ValueError(f"{path}:{number}: expected 'backends regex # reason', got {line!r}")
            backends = frozenset(BACKENDS) if parts[0] == "*" else frozenset(parts[0].split(","))
            entries.append((backends, parts[1], reason.strip()))
    return entries


def _xfail_while_backends_lack_ops(test: Callable[..., None]) -> Callable[..., None]:
    """Report a test as xfail (with the reason) while no backend implements what it needs yet.

    Only :class:`BackendLacksError` qualifies: the model maps onto the interface, but neither
    the chosen backend nor the CPU fallback has the op / dtype / feature yet. Wrong results,
    and anything the interface cannot express, still fail.
    """

    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        try:
            test(*args, **kwargs)
        except BackendLacksError as exc:
            pytest.xfail(f"backend op missing: {exc}")

    return run


def _suite(name: str) -> type:
    runner = onnx.backend.test.BackendTest(computehal_backend.for_backend(name), __name__)
    for backends, pattern, _reason in read_filter():
        if name in backends:
            runner.exclude(pattern)
    case = runner.test_cases["OnnxBackendNodeModelTest"]
    wanted = {f"{n}_cpu" for n in selected_node_tests()}
    methods = {
        attr: _xfail_while_backends_lack_ops(getattr(case, attr)) for attr in dir(case) if attr in wanted
    }
    return type(f"TestOnnxNode_{name}", (unittest.TestCase,), {"__module__": __name__, **methods})


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for _name in BACKENDS:
        globals()[f"TestOnnxNode_{_name}"] = _suite(_name)


@pytest.fixture(autouse=True)
def _quiet_fallbacks() -> None:
    warnings.simplefilter("ignore", FallbackWarning)


def test_filter_file_names_real_tests() -> None:
    """Every exclusion matches at least one selected test, and says why."""
    names = selected_node_tests()
    for _backends, pattern, reason in read_filter():
        assert reason
        assert any(re.search(pattern, f"{n}_cpu") for n in names), f"{pattern!r} matches no selected test"


def test_every_operator_has_node_tests() -> None:
    cases = {case.name: case for case in load_model_tests(kind="node")}
    covered = {node.op_type for name in selected_node_tests() for node in cases[name].model.graph.node}
    assert OPERATORS <= covered | {"GlobalMaxPool", "Constant"} and {"Conv", "Attention"} <= covered
