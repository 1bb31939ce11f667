"""``computehal run``: the ONNX runner's command line."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from computehal.cli import main as computehal_main  # noqa: E402
from computehal.onnx.cli import main  # noqa: E402


def _model(path: Path) -> np.ndarray:
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "cli",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return w


def test_run_reports_outputs_time_plan_and_memory(tmp_path: Path) -> None:
    w = _model(tmp_path / "m.onnx")
    x = -np.ones((2, 3), np.float32)
    x[0] = [1, 2, 3]
    np.save(tmp_path / "x.npy", x)
    out = io.StringIO()
    status = main(
        [str(tmp_path / "m.onnx"), "--backend", "cpu", "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "2"],
        out,
    )
    text = out.getvalue()
    assert status == 0, text
    want = np.maximum(x @ w, 0)
    assert "output y: float32 [2, 4]" in text
    assert f"max {want.max():.6g}" in text and f"min {want.min():.6g}" in text
    assert "time per run:" in text and "mean of 2" in text
    assert "backend cpu: 2 on cpu" in text and "partition borders: none" in text
    assert "device memory on cpu: peak" in text


def test_run_needs_a_shape_for_open_dimensions(tmp_path: Path) -> None:
    _model(tmp_path / "m.onnx")
    err = io.StringIO()
    assert main([str(tmp_path / "m.onnx"), "--backend", "cpu"], io.StringIO(), err) == 2
    assert "--shape x=" in err.getvalue()
    out = io.StringIO()
    assert main([str(tmp_path / "m.onnx"), "--backend", "cpu", "--shape", "x=5,3", "--nodes"], out) == 0
    assert "output y: float32 [5, 4]" in out.getvalue() and "MatMul" in out.getvalue()


def test_run_is_a_computehal_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _model(tmp_path / "m.onnx")
    assert computehal_main(["run", str(tmp_path / "m.onnx"), "--backend", "cpu", "--shape", "x=1,3"]) == 0
    assert "output y: float32 [1, 4]" in capsys.readouterr().out
    assert computehal_main(["run", str(tmp_path / "missing.onnx")]) == 2


def test_benchmark_group_is_found_by_the_harness() -> None:
    from computehal.bench import find_group

    group = find_group("onnx")
    assert group is not None and "onnxruntime" in group.description and not group.default
