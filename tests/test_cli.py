"""The ``computehal`` command, driven through ``main(argv)``."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from typing import Any

import pytest

import computehal.cli as cli
import computehal.probe as probe_mod
import computehal.selection as selection_mod
from computehal import ComputeBackend, CpuBackend
from computehal.backend import ALL_OPS
from computehal.testing import CaseResult, ConformanceReport

GPU_DEPENDENCIES = ("pyopencl", "wgpu", "cupy", "cupy_backends")
GPU_MODULES = (
    "computehal.backends.opencl",
    "computehal.backends.wgpu",
    "computehal.backends.cuda",
)


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_mod, "_cache", None)
    monkeypatch.delenv(selection_mod.ENV_VAR, raising=False)


def hide_gpu_dependencies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulate a machine without pyopencl, wgpu and CuPy: importing them raises ImportError."""
    for name in list(sys.modules):
        if name.split(".")[0] in GPU_DEPENDENCIES or name.startswith(GPU_MODULES):
            monkeypatch.delitem(sys.modules, name)
    for name in GPU_DEPENDENCIES:
        monkeypatch.setitem(sys.modules, name, None)


def rows_of(text: str) -> dict[str, list[str]]:
    """The ``devices`` table as {backend: columns} (columns split on runs of 2+ spaces)."""
    import re

    table: dict[str, list[str]] = {}
    for line in text.splitlines():
        columns = re.split(r"\s{2,}", line.strip())
        if len(columns) >= 4 and columns[2] in ("available", "unavailable"):
            table[columns[0]] = columns
    return table


# ---------------------------------------------------------------------- devices


def test_devices_lists_every_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out
    table = rows_of(out)
    assert set(table) == {"cuda", "rocm", "metal", "level_zero", "opencl", "vulkan", "webgpu", "cpu"}
    assert table["cpu"][2] == "available"
    assert table["level_zero"][2] == "unavailable" and "no level_zero backend" in table["level_zero"][4]
    assert "capabilities: " in out and "fp64" in out
    assert "auto() would choose: " in out
    tried = out.split("it tries, in order: ")[1].splitlines()[0].split(" -> ")
    assert "cpu" in tried and tried[0] == out.split("auto() would choose: ")[1].split(";")[0]


def test_devices_without_gpu_dependencies_shows_import_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hide_gpu_dependencies(monkeypatch)
    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out
    table = rows_of(out)
    for kind in ("cuda", "rocm", "metal", "opencl", "vulkan", "webgpu"):
        assert table[kind][2] == "unavailable", kind
    report = probe_mod.probe()
    for entry in report.entries:
        if not entry.available:
            assert entry.reason in out  # the full reason, e.g. the ImportError text
    assert "auto() would choose: cpu" in out
    assert "it tries, in order: cpu\n" in out


def test_devices_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    hide_gpu_dependencies(monkeypatch)
    assert cli.main(["devices", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    kinds = {b["kind"]: b for b in data["backends"]}
    assert kinds["cpu"]["available"] and kinds["cpu"]["devices"][0]["ordinal"] == 0
    assert not kinds["opencl"]["available"] and kinds["opencl"]["reason"]
    assert data["auto"] == "cpu" and data["fallback_chain"] == ["cpu"] and data["auto_order"] == ["cpu"]


def test_devices_ops_matrix(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    hide_gpu_dependencies(monkeypatch)
    assert cli.main(["devices", "--ops", "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| operation | cpu |"
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip() for line in lines[2:]}
    assert set(rows) == set(ALL_OPS)
    caps = CpuBackend().capabilities()
    assert rows["gemm"] == "f16 bf16 f32 f64" and caps.supports("gemm", "bfloat16")
    assert rows["copy_dtod"] == "bytes" and rows["gemm_mixed_precision"] == "f32"


# ---------------------------------------------------------------------- check (with a stand-in kit)


def FakeCaseResult(  # noqa: N802 - reads like the class it builds
    op: str, case: str, passed: bool, max_error: float, seconds: float, message: str = ""
) -> CaseResult:
    return CaseResult(op, case, passed, max_error, seconds, message)


def fake_kit(results: list[FakeCaseResult], calls: list[tuple[str, Any]]) -> types.SimpleNamespace:
    """A stand-in for computehal.testing with the kit's API, returning canned results."""

    def run_conformance(
        backend: ComputeBackend, ops: list[str] | None = None, progress: Any = None
    ) -> ConformanceReport:
        assert backend.is_initialized()
        calls.append((backend.name(), ops))
        chosen = [r for r in results if ops is None or r.op in ops]
        for result in chosen:
            if progress is not None:
                progress(result)
        return ConformanceReport(backend.name(), chosen)

    return types.SimpleNamespace(run_conformance=run_conformance, OPS=("gemm", "softmax"))


def test_check_tables_and_exit_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    results = [
        FakeCaseResult("gemm", "nn", True, 1e-12, 0.002),
        FakeCaseResult("gemm", "tt", True, 3e-12, 0.003),
        FakeCaseResult("softmax", "rows", True, 2e-7, 0.001),
    ]
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(cli, "_load_kit", lambda: fake_kit(results, calls))
    assert cli.main(["check", "--backend", "cpu", "--op", "gemm", "--cases"]) == 0
    captured = capsys.readouterr()
    assert calls == [("cpu", ["gemm"])]
    assert "gemm" in captured.out and "softmax" not in captured.out
    gemm_row = next(line for line in captured.out.splitlines() if line.strip().startswith("gemm "))
    assert gemm_row.split()[:4] == ["gemm", "2", "PASS", "3e-12"]
    assert "2/2 cases passed" in captured.out and "all checks passed" in captured.out
    # Progress: one line per case on stderr.
    assert captured.err.count("[cpu]") == 2 and "ok" in captured.err

    results.append(FakeCaseResult("softmax", "nan", False, float("nan"), 0.001, "NaN where 0 expected"))
    assert cli.main(["check", "--backend", "host", "--op", "gemm,softmax"]) == 1
    out = capsys.readouterr().out
    assert calls[-1] == ("cpu", ["gemm", "softmax"])
    softmax_row = next(line for line in out.splitlines() if line.strip().startswith("softmax "))
    assert "FAIL (1)" in softmax_row
    assert "FAIL softmax / nan: NaN where 0 expected" in out
    assert out.rstrip().endswith("FAILED")


def test_check_every_available_backend_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hide_gpu_dependencies(monkeypatch)
    calls: list[tuple[str, Any]] = []
    one = [FakeCaseResult("gemm", "nn", True, 0.0, 0.001)]
    monkeypatch.setattr(cli, "_load_kit", lambda: fake_kit(one, calls))
    assert cli.main(["check", "-q"]) == 0
    assert calls == [("cpu", None)]
    assert capsys.readouterr().err == ""


def test_check_named_backend_that_cannot_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hide_gpu_dependencies(monkeypatch)
    monkeypatch.setattr(cli, "_load_kit", lambda: fake_kit([], []))
    assert cli.main(["check", "--backend", "opencl"]) == 1
    out = capsys.readouterr().out
    assert "opencl: cannot run: unsupported operation: opencl is unavailable" in out


def test_check_unknown_backend_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--backend", "tpu"]) == 2
    assert "unknown backend 'tpu'" in capsys.readouterr().err


def test_check_unknown_op_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--backend", "cpu", "--op", "gemm,teleport"]) == 2
    err = capsys.readouterr().err
    assert "unknown op teleport" in err and "softmax" in err


# ---------------------------------------------------------------------- check with the real kit


def test_check_cpu_with_the_conformance_kit(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--backend", "cpu", "--op", "unary", "--op", "gather"]) == 0
    captured = capsys.readouterr()
    assert "all checks passed" in captured.out
    ops = {line.split()[0] for line in captured.out.splitlines() if "PASS" in line}
    assert ops == {"unary", "gather"}
    assert "[cpu]" in captured.err
    # One progress line per case, counting up to the total.
    lines = [line for line in captured.err.splitlines() if line.startswith("[cpu]")]
    total = lines[0].split()[1].split("/")[1]
    assert lines[-1].split()[1] == f"{total}/{total}" and len(lines) == int(total)


# ---------------------------------------------------------------------- bench and entry points


def test_bench_delegates_to_the_suite(monkeypatch: pytest.MonkeyPatch) -> None:
    import computehal.bench as bench

    seen: list[list[str]] = []

    def fake_main(argv: list[str] | None = None) -> int:
        seen.append(list(argv or []))
        return 0

    monkeypatch.setattr(bench, "main", fake_main)
    assert cli.main(["bench", "--quick", "--help-like-arg"]) == 0
    assert seen == [["--quick", "--help-like-arg"]]


def test_bench_missing_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "computehal.bench", None)
    assert cli.main(["bench"]) == 2
    assert "computehal bench: computehal.bench is not installed" in capsys.readouterr().err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "devices" in capsys.readouterr().out


def test_python_dash_m() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "computehal", "--version"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.startswith("computehal ")


def test_format_table() -> None:
    text = cli.format_table(("A", "LONGER"), [("x", 1), ("yyyy", 22)])
    assert text.splitlines() == ["A     LONGER", "----  ------", "x     1", "yyyy  22"]


# ---------------------------------------------------------------------- the transformer example


def _numpy_block(w: dict[str, Any], heads: int) -> tuple[Any, Any]:
    """The example's block written directly in NumPy (float64), independent of computehal."""
    import numpy as np

    x = w["x"].astype(np.float64)
    s, d = x.shape
    hd = d // heads

    def split(m: Any) -> Any:
        return (x @ m.astype(np.float64)).reshape(s, heads, hd).transpose(1, 0, 2)

    q, k, v = split(w["wq"]), split(w["wk"]), split(w["wv"])
    scores = np.einsum("hqd,hkd->hqk", q, k) / np.sqrt(hd)
    scores = np.where(np.tril(np.ones((s, s), dtype=bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    attn = np.einsum("hqk,hkd->hqd", weights, v).transpose(1, 0, 2).reshape(s, d)
    h1 = x + attn @ w["wo"]
    u = h1 @ w["w1"]
    y = h1 + (u / (1.0 + np.exp(-u))) @ w["w2"]
    logits = y.mean(axis=0) @ w["wcls"]
    probs = np.exp(logits - logits.max())
    return y, probs / probs.sum()


def test_transformer_example_matches_numpy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pathlib
    import runpy

    import numpy as np

    from computehal import CpuBackend

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "transformer_block.py"
    example = runpy.run_path(str(path))
    cfg = example["Config"](seq=24, d_model=32, heads=4, d_ff=48, classes=5)
    weights = example["make_weights"](cfg, seed=3)
    with CpuBackend() as cpu:
        got = example["forward"](cpu, cfg, weights)
    hidden, probs = _numpy_block(weights, cfg.heads)
    np.testing.assert_allclose(got["hidden"], hidden, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["probabilities"], probs, rtol=1e-4, atol=1e-6)
    # The script itself, pinned to the CPU backend through COMPUTEHAL_BACKEND.
    monkeypatch.setenv(selection_mod.ENV_VAR, "cpu")
    assert example["main"]([]) == 0
    out = capsys.readouterr().out
    assert (
        "backend: cpu" in out and "cpu was set by COMPUTEHAL_BACKEND" in out and out.rstrip().endswith("OK")
    )


def test_check_with_a_non_ascii_ordinal_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--backend", "cpu:²"]) == 2
    captured = capsys.readouterr()
    assert "computehal check: invalid argument: device ordinal in 'cpu:²'" in captured.err
    assert "Traceback" not in captured.err + captured.out
