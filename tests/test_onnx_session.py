"""computehal.onnx.InferenceSession: loading, folding, views, memory reuse, partitioning.

Results are compared with NumPy definitions written here; placement and the number of
host round trips are observed through a counting wrapper around the CPU backend.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from computehal import ForwardingBackend, InvalidArgumentError, UnsupportedError  # noqa: E402
from computehal.backends.cpu import CpuBackend  # noqa: E402
from computehal.onnx import FallbackWarning, InferenceSession  # noqa: E402
from computehal.types import Capabilities  # noqa: E402

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: dict[str, np.ndarray] | None = None,
          opset: int = 17) -> onnx.ModelProto:  # fmt: skip
    initializers = [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()]
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def vi(name: str, elem: int, shape: list[Any] | None) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


class Counting(ForwardingBackend):
    """Counts calls per method; optionally claims another name and hides some ops."""

    def __init__(self, inner: Any, label: str = "cpu", hide: frozenset[str] = frozenset()) -> None:
        super().__init__(inner)
        self.calls: dict[str, int] = {}
        self.label = label
        self.hide = hide
        for method in ("synchronize", "copy_dtoh", "copy_htod", "unary", "gemm", "alloc", "borrow", "free"):
            self._count(method)

    def _count(self, method: str) -> None:
        forward = getattr(self.inner, method)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[method] = self.calls.get(method, 0) + 1
            return forward(*args, **kwargs)

        setattr(self, method, counted)

    def name(self) -> str:
        return self.label

    def capabilities(self) -> Capabilities:
        caps = self.inner.capabilities()
        table = tuple((op, frozenset() if op in self.hide else d) for op, d in caps.op_dtypes)
        return Capabilities(op_dtypes=table, native_ops=caps.native_ops)


@pytest.fixture
def cpu() -> Any:
    with CpuBackend() as backend:
        yield backend


def mlp() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((6, 5)).astype(np.float32)
    w2 = rng.standard_normal((5, 3)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Identity", ["r"], ["r2"]),
        helper.make_node("Reshape", ["r2", "shape"], ["flat"]),
        helper.make_node("Reshape", ["flat", "back"], ["r3"]),
        helper.make_node("MatMul", ["r3", "w2"], ["y"]),
    ]
    inits = {"w1": w1, "w2": w2, "shape": np.array([-1], np.int64), "back": np.array([4, 5], np.int64)}
    m = model(nodes, [vi("x", F, [4, 6])], [vi("y", F, [4, 3])], inits)
    return m, w1, w2


def test_mlp_matches_numpy_with_one_synchronize_and_no_round_trip(cpu: Any) -> None:
    m, w1, w2 = mlp()
    backend = Counting(cpu)
    session = InferenceSession(m, backend=backend)
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    backend.calls.clear()
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x @ w1, 0) @ w2, rtol=1e-5, atol=1e-5)
    assert backend.calls["synchronize"] == 1
    # Nothing comes back between nodes, nothing goes up but the input (weights went up when the
    # plan was made), and both the input and the output are used in place (borrowed, then forgotten).
    assert "copy_dtoh" not in backend.calls and "copy_htod" not in backend.calls
    assert backend.calls["borrow"] == backend.calls["free"] == 2
    assert backend.calls["gemm"] == 2 and backend.calls["unary"] == 1
    assert "alloc" not in backend.calls  # memory was placed once, at load


class NoBorrow(Counting):
    """A backend that cannot read host memory in place."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)

        def refuse(address: int, nbytes: int, owner: object) -> int:
            raise UnsupportedError("no borrowing here")

        self.borrow = refuse


def test_inputs_are_read_in_place_or_copied_when_the_backend_cannot_borrow(cpu: Any) -> None:
    m, w1, w2 = mlp()
    rng = np.random.default_rng(2)
    for backend in (Counting(cpu), NoBorrow(cpu)):
        session = InferenceSession(m, backend=backend)
        backend.calls.clear()
        live = cpu.live_allocations()
        results = []
        for _ in range(2):  # a new array each run: the borrowed range of the last run is gone
            x = rng.standard_normal((4, 6)).astype(np.float32)
            kept = x.copy()
            (y,) = session.run(None, {"x": x})
            np.testing.assert_allclose(y, np.maximum(x @ w1, 0) @ w2, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(x, kept)
            assert cpu.live_allocations() == live
            results.append((y, y.copy()))
        for y, kept in results:  # each run returned its own array
            np.testing.assert_array_equal(y, kept)
        copied = isinstance(backend, NoBorrow)
        assert backend.calls.get("copy_htod", 0) == (2 if copied else 0)
        assert backend.calls.get("copy_dtoh", 0) == (2 if copied else 0)
        # An array not aligned to its element size is copied, not borrowed.
        raw = np.zeros(4 * 6 * 4 + 1, np.uint8)
        x = np.frombuffer(raw.data, dtype=np.float32, count=24, offset=1).reshape(4, 6)
        backend.calls.clear()
        (y,) = session.run(None, {"x": x})
        np.testing.assert_allclose(y, np.maximum(x @ w1, 0) @ w2, rtol=1e-5, atol=1e-5)
        assert backend.calls.get("copy_htod", 0) == 1
        assert backend.calls.get("borrow", 0) == (0 if copied else 1)  # the output only
        session.close()


def test_plan_reports_views_and_removed_nodes(cpu: Any) -> None:
    m, _, _ = mlp()
    report = InferenceSession(m, backend=cpu).plan()
    where = {n.op: n.where for n in report.nodes}
    assert where["Reshape"] == "view" and where["MatMul"] == "cpu" and where["Relu"] == "cpu"
    assert [n.op for n in report.nodes].count("Identity") == 0 and report.removed_at_load == 1
    assert all(n.calls == () for n in report.nodes if n.where == "view")
    assert "device memory on cpu" in str(report)


def test_intermediate_memory_is_reused_by_lifetime(cpu: Any) -> None:
    nodes = [helper.make_node("Relu" if i == 7 else "Neg", [f"t{i}"], [f"t{i + 1}"]) for i in range(8)]
    m = model(nodes, [vi("t0", F, [64, 64])], [vi("t8", F, [64, 64])])
    session = InferenceSession(m, backend=cpu)
    x = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)
    (y,) = session.run(None, {"t0": x})
    np.testing.assert_array_equal(y, np.maximum(-x, 0))
    (memory,) = session.plan().memory
    assert memory.naive_bytes == 9 * 64 * 64 * 4
    # The input, and one buffer every element-wise node writes over (its input dies with it).
    assert memory.arena_bytes == 2 * 64 * 64 * 4 < memory.naive_bytes


def test_a_few_long_runs_are_copied_run_by_run(cpu: Any) -> None:
    # Concat along the last axis: three rows of 1.2 MB from a, three short rows from b.
    nodes = [helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]
    m = model(nodes, [vi("a", F, [3, 300000]), vi("b", F, [3, 7])], [vi("y", F, [3, 300007])])
    session = InferenceSession(m, backend=cpu)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((3, 300000)).astype(np.float32), rng.standard_normal((3, 7)).astype(np.float32)
    (y,) = session.run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(y, np.concatenate([a, b], axis=1))
    (node,) = session.plan().nodes
    assert node.calls == ("copy_dtod",) * 3 + ("copy_strided",)


def test_key_value_cache_rows_are_one_strided_copy(cpu: Any) -> None:
    # A cache of 12 heads x 128 kB joined with one new position per head: one copy_strided each.
    nodes = [helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]
    m = model(nodes, [vi("a", F, [12, 32768]), vi("b", F, [12, 64])], [vi("y", F, [12, 32832])])
    session = InferenceSession(m, backend=cpu)
    rng = np.random.default_rng(6)
    a = rng.standard_normal((12, 32768)).astype(np.float32)
    b = rng.standard_normal((12, 64)).astype(np.float32)
    (y,) = session.run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(y, np.concatenate([a, b], axis=1))
    (node,) = session.plan().nodes
    assert node.calls == ("copy_strided",) * 2


def test_shape_arithmetic_is_folded_into_views(cpu: Any) -> None:
    """Shape -> Gather -> Concat -> Reshape: folded once the input shape is known; no host node."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    inits = {
        "zero": np.array(0, np.int64),
        "axes": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64),
    }
    m = model(nodes, [vi("x", F, ["batch", 3, 4])], [vi("y", F, None)], inits)
    session = InferenceSession(m, backend=cpu)
    for batch in (2, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 4)).astype(np.float32)
        (y,) = session.run(None, {"x": x})
        np.testing.assert_array_equal(y, np.maximum(x.reshape(batch, -1), 0))
        ops = {n.op: n.where for n in session.plan({"x": (batch, 3, 4)}).nodes}
        assert ops == {"Reshape": "view", "Relu": "cpu"}


def test_integer_inputs_are_computed_on_the_host(cpu: Any) -> None:
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    nodes = [
        helper.make_node("Add", ["ids", "one"], ["shifted"]),
        helper.make_node("Gather", ["table", "shifted"], ["rows"], axis=0),
        helper.make_node("Relu", ["rows"], ["y"]),
    ]
    m = model(
        nodes,
        [vi("ids", I64, [2, 3])],
        [vi("y", F, [2, 3, 4])],
        {"table": table, "one": np.array(1, np.int64)},
    )
    session = InferenceSession(m, backend=cpu)
    ids = np.array([[0, 1, 2], [8, 7, -3]], np.int64)
    (y,) = session.run(None, {"ids": ids})
    np.testing.assert_array_equal(y, table[ids + 1])
    where = {n.op: n.where for n in session.plan().nodes}
    assert where == {"Add": "host", "Gather": "cpu", "Relu": "cpu"}
    with pytest.raises(InvalidArgumentError):
        session.run(None, {"ids": np.full((2, 3), 9, np.int64)})  # 10 is out of range


def test_fallback_to_cpu_with_warning_and_strict_refusal(cpu: Any) -> None:
    m, w1, w2 = mlp()
    restricted = Counting(CpuBackend(), label="restricted", hide=frozenset({"unary"}))
    with pytest.warns(FallbackWarning, match="Relu"):
        session = InferenceSession(m, backend=restricted)
    report = session.plan()
    assert {n.op: n.where for n in report.nodes}["Relu"] == "cpu"
    assert report.fallback_nodes[0].reason is not None and "unary" in report.fallback_nodes[0].reason
    assert [(b.source, b.target) for b in report.borders] == [("restricted", "cpu"), ("cpu", "restricted")]
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x @ w1, 0) @ w2, rtol=1e-5, atol=1e-5)
    with pytest.raises(UnsupportedError, match="Relu"):
        InferenceSession(m, backend=restricted, strict=True)
    session.close()
    restricted.close()


def test_feeds_are_checked(cpu: Any) -> None:
    m, _, _ = mlp()
    session = InferenceSession(m, backend=cpu)
    x = np.zeros((4, 6), np.float32)
    with pytest.raises(InvalidArgumentError, match="missing"):
        session.run(None, {})
    with pytest.raises(InvalidArgumentError, match="float32"):
        session.run(None, {"x": x.astype(np.float64)})
    with pytest.raises(InvalidArgumentError, match="axis 1"):
        session.run(None, {"x": np.zeros((4, 5), np.float32)})
    with pytest.raises(InvalidArgumentError, match="unknown output"):
        session.run(["nope"], {"x": x})
    assert [i.name for i in session.get_inputs()] == ["x"]
    assert session.get_inputs()[0].type == "tensor(float)" and session.get_outputs()[0].shape == [4, 3]


def test_unmappable_node_is_refused_with_its_reason(cpu: Any) -> None:
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2, 2])]
    m = model(nodes, [vi("x", F, [1, 1, 4, 4, 4])], [vi("y", F, [1, 1, 3, 3, 3])])
    with pytest.raises(UnsupportedError, match="3-D MaxPool"):
        InferenceSession(m, backend=cpu)


def test_plans_for_new_shapes_share_the_weights(cpu: Any) -> None:
    w = np.random.default_rng(4).standard_normal((6, 5)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    m = model(nodes, [vi("x", F, ["batch", 6])], [vi("y", F, ["batch", 5])], {"w": w})
    backend = Counting(cpu)
    session = InferenceSession(m, backend=backend)
    for batch in (2, 3, 7):
        backend.calls.clear()
        x = np.ones((batch, 6), np.float32)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], x @ w, rtol=1e-5)
        uploads = backend.calls.get("copy_htod", 0)
        assert uploads == (1 if batch == 2 else 0)  # the weight once (the input is read in place)
        assert backend.calls["borrow"] == 2  # the input and the output
    session.close()


class Limited(Counting):
    """Refuses unary calls over more than ``most`` elements when they run (no probe shows it)."""

    def __init__(self, inner: Any, most: int) -> None:
        super().__init__(inner, label="limited")
        self.most = most
        forward = self.unary

        def unary(op: Any, x: int, y: int, n: int, **kwargs: Any) -> None:
            if n > self.most:
                raise UnsupportedError(f"unary over {n} elements exceeds {self.most}")
            forward(op, x, y, n, **kwargs)

        self.unary = unary  # type: ignore[method-assign]


def test_a_call_refused_at_run_time_moves_its_node_to_the_cpu(cpu: Any) -> None:
    m, w1, w2 = mlp()
    x = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
    limited = Limited(cpu, most=8)
    session = InferenceSession(m, backend=limited)
    with pytest.warns(FallbackWarning, match="refused when it ran|exceeds"):
        (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x @ w1, 0) @ w2, rtol=1e-5, atol=1e-5)
    relu = next(n for n in session.plan().nodes if n.op == "Relu")
    assert relu.where == "cpu" and relu.reason is not None and "exceeds 8" in relu.reason
    strict = InferenceSession(m, backend=limited, strict=True)
    with pytest.raises(UnsupportedError, match="Relu"):
        strict.run(None, {"x": x})


def test_onnx_backend_interface() -> None:
    from computehal.onnx import backend

    assert backend.supports_device("CPU") and not backend.supports_device("TPU")
    assert not backend.for_backend("cpu").supports_device("CUDA")
    x = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
    (y,) = backend.run_node(helper.make_node("Relu", ["x"], ["y"]), [x])
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    (s,) = backend.run_node(helper.make_node("Softmax", ["x"], ["s"], axis=0), [x], opset_version=11)
    e = np.exp(x.reshape(1, 4) - x.max())
    np.testing.assert_allclose(s, (e / e.sum()).reshape(2, 2), rtol=1e-6)  # opset 11: flattened at axis 0
    m, w1, w2 = mlp()
    rep = backend.prepare(m, "CPU")
    (out,) = rep.run([np.ones((4, 6), np.float32)])
    np.testing.assert_allclose(out, np.maximum(np.ones((4, 6)) @ w1, 0) @ w2, rtol=1e-5)
    (again,) = backend.run_model(m, {"x": np.ones((4, 6), np.float32)})
    np.testing.assert_array_equal(again, out)
