"""The benchmark harness: structure of the rows, table and JSON on every backend, never timings."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from computehal import ComputeBackend, ForwardingBackend, UnsupportedError, bench
from computehal.backend import ALL_OPS
from computehal.bench import _groups
from conftest import live_count, use_shared

#: conftest's backend names -> the names ``computehal bench --backend`` takes.
BENCH_NAMES = {"cpu": "cpu", "opencl": "opencl", "wgpu": "vulkan"}


def tiny(repeats: int = 1) -> bench.Sizes:
    """Sizes small enough for a test (the figures mean nothing)."""
    return bench.Sizes(
        gemm=32,
        host_gemm=32,
        batch=2,
        batch_dim=8,
        conv=(1, 3, 4, 6, 6),
        conv_stages=False,
        depthwise=(1, 4, 6, 6),
        pool=(1, 2, 8, 8),
        attention=(1, 2, 16, 8),
        kv_heads=1,
        attention_memory_seq=64,
        elementwise=1 << 10,
        matrix=16,
        rows=4,
        row_len=8,
        table_rows=16,
        norm=(4, 8),
        lrn=(1, 4, 4, 4),
        copy_elements=1 << 10,
        repeats=repeats,
        overhead_calls=5,
    )


def check_row(row: bench.BenchResult) -> None:
    """Invariants of one row, whatever its status."""
    assert row.status in ("measured", "unsupported", "error", "mismatch")
    if row.status == "measured":
        assert row.achieved is not None and row.achieved > 0
        if row.compare in ("time", "rate"):
            assert row.ratio is not None and row.ratio > 0 and row.limit is not None and row.limit > 0
        if row.target is None:
            assert row.passed is None
        else:
            assert row.compare is not None
            expected = bench.Target(row.compare, row.target).met(row.ratio, row.achieved)
            assert row.passed is expected
    else:
        assert row.passed in (None, False) and row.note
    if row.status == "unsupported":
        assert row.achieved is None and row.ratio is None


@pytest.mark.parametrize("name", sorted(BENCH_NAMES))
def test_every_op_has_a_row_on_every_backend(name: str) -> None:
    be = use_shared(name)
    before = live_count(be)
    run = bench.run_benchmarks(BENCH_NAMES[name], backend=be, sizes=tiny())
    assert live_count(be) == before  # every allocation of the run was freed
    ops = {r.op for r in run.results}
    assert set(ALL_OPS) <= ops, f"no row for {sorted(set(ALL_OPS) - ops)}"
    for row in run.results:
        check_row(row)
    # Rows of operations a backend gets wrong are reported (error / mismatch), not raised:
    # which ones is the backend's business, checked by the conformance kit.
    assert any(r.status == "measured" for r in run.results), format_rows(run)
    table = bench.format_table(run.results)
    assert len(table.splitlines()) == len(run.results) + 2
    header = ["op", "size", "time", "achieved", "ceiling", "ratio", "target", "result"]
    assert table.splitlines()[0].split() == header
    assert run.profile == ("cpu" if name == "cpu" else "host-device")
    assert run.roof["compute"] in run.peaks and run.roof["bandwidth"] in run.peaks


def format_rows(run: bench.BenchRun) -> str:
    return "\n".join(f"{r.op} {r.params}: {r.status} {r.note}" for r in run.results)


def test_cli_writes_table_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--backend",
        "cpu",
        "--quick",
        "--repeats",
        "1",
        "--groups",
        "gemm,movement",
        "--out",
        str(tmp_path),
    ]
    status = bench.main(argv)
    assert status == 0
    text = capsys.readouterr().out
    assert "ceilings" in text
    doc = json.loads((tmp_path / "cpu.json").read_text(encoding="utf-8"))
    assert doc["suite"] == "computehal-bench" and doc["backend"] == "cpu" and doc["profile"] == "cpu"
    assert doc["groups"] == ["gemm", "movement"]
    assert {"scipy sgemm", "host copy"} <= set(doc["peaks"])
    assert {row["op"] for row in doc["results"]} >= {"gemm", "batched_gemm", "copy_dtod", "gather"}
    for row in doc["results"]:
        assert row["status"] in ("measured", "unsupported")
        verdict = {True: "PASS", False: "FAIL", None: "-"}[row["passed"]]
        line = next(ln for ln in text.splitlines() if ln.startswith(row["op"]) and row["params"] in ln)
        assert line.rstrip().endswith(verdict if row["status"] == "measured" else row["status"])
    assert doc["passed"] == all(row["passed"] is not False for row in doc["results"])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not (tmp_path / "cpu-roofline.png").exists()
    else:
        assert (tmp_path / "cpu-roofline.png").stat().st_size > 0


def test_unwritable_output_fails_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the benchmarks ran although the results cannot be written")

    monkeypatch.setattr(bench._cli, "run_benchmarks", must_not_run)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert bench.main(["--quick", "--out", str(blocker / "sub")]) == 2  # a file where a folder must be
    (tmp_path / "out" / "cpu.json").mkdir(parents=True)
    assert bench.main(["--quick", "--out", str(tmp_path / "out")]) == 2  # the JSON path is a folder
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert bench.main(["--quick", "--out", str(locked)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    assert captured.err.count("computehal bench: cannot write") >= 2


def test_bad_arguments_return_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--groups", "nonsense"]) == 2
    assert "unknown group" in capsys.readouterr().err
    assert bench.main(["--repeats", "0"]) == 2
    assert bench.main(["--no-such-flag"]) == 2
    assert bench.main(["--plugin", "computehal.no_such_module"]) == 2
    assert bench.main(["--backend", "no-such-backend", "--out", "/tmp"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_list_names_the_groups(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed[: len(bench.default_groups())] == bench.default_groups()
    builtin = ("gemm", "conv", "pool", "attention", "elementwise", "reduce", "norm", "movement", "overhead")
    assert set(builtin) <= set(listed)


class Partial(ForwardingBackend):
    """A CPU backend that lacks pool2d and whose layer_norm crashes (a broken backend under test)."""

    def pool2d(self, *args: Any, **kwargs: Any) -> None:
        raise UnsupportedError("pool2d is not implemented by this backend")

    def layer_norm(self, *args: Any, **kwargs: Any) -> None:
        raise ZeroDivisionError("bug")


def test_unsupported_and_failing_ops_do_not_end_the_run() -> None:
    inner = use_shared("cpu")
    run = bench.run_benchmarks("cpu", backend=Partial(inner), sizes=tiny(), groups=["pool", "norm"])
    by_op = {r.op: r for r in run.results}
    assert by_op["pool2d"].status == "unsupported" and "pool2d" in by_op["pool2d"].note
    assert by_op["layer_norm"].status == "error" and "ZeroDivisionError" in by_op["layer_norm"].note
    assert by_op["pool2d"].verdict == "unsupported"
    # The rows after the failing one were still measured (or are unsupported by the CPU backend).
    assert {"rms_norm", "batch_norm", "lrn"} <= set(by_op)
    assert not run.passed


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    saved = dict(_groups._GROUPS)
    try:
        yield
    finally:
        _groups._GROUPS.clear()
        _groups._GROUPS.update(saved)


def test_a_group_registered_elsewhere_runs_through_the_cli(
    scratch_registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[int] = []

    def build(ctx: bench.BenchContext) -> Iterator[bench.Case]:
        data = np.arange(64, dtype=np.float32)
        src, dst = ctx.put(data), ctx.empty(data.nbytes)

        def verify() -> float:
            return bench.relative_error(ctx.read(dst, 64), data)

        def run() -> None:
            ctx.backend.copy_dtod(dst, src, data.nbytes)
            calls.append(1)

        nothing = bench.Limit("nothing", lambda: None, 0.0, kind="reference")
        yield bench.Case(
            "model", "copy 64 floats", run, "ms", 0.0, nothing, bench.Target("time", 1e9), verify=verify
        )
        yield bench.Case("model", "wrong", lambda: None, "ms", 0.0, None, None, verify=lambda: 1.0)

    bench.register_group("extra", build, description="a test group")
    with pytest.raises(ValueError):
        bench.register_group("extra", lambda ctx: [], description="same name")
    assert "extra" not in bench.default_groups()
    assert bench.main(["--groups", "extra", "--out", str(tmp_path), "--no-plot", "--repeats", "2"]) == 0
    assert calls
    doc = json.loads((tmp_path / "cpu.json").read_text(encoding="utf-8"))
    rows = {row["params"]: row for row in doc["results"]}
    assert rows["copy 64 floats"]["status"] == "measured" and rows["copy 64 floats"]["passed"] is True
    assert rows["copy 64 floats"]["compare"] == "time" and rows["copy 64 floats"]["error"] == 0.0
    assert rows["wrong"]["status"] == "mismatch" and rows["wrong"]["passed"] is False
    assert "mismatch" in capsys.readouterr().out


def test_groups_are_found_by_convention(scratch_registry: None) -> None:
    assert bench.find_group("gemm") is not None
    assert bench.find_group("no_such_package") is None
    assert bench.find_group("bench") is None
    assert bench.find_group("../x") is None
    with pytest.raises(ValueError):
        bench.register_group("bad name", lambda ctx: [])


def test_value_rows_and_targets() -> None:
    assert bench.Target("rate", 0.6).met(0.7, None) and not bench.Target("rate", 0.6).met(0.5, None)
    assert bench.Target("time", 1.05).met(1.0, None) and not bench.Target("time", 1.05).met(1.1, None)
    assert bench.Target("value_max", 10).met(None, 9.0) and not bench.Target("value_max", 10).met(None, 11.0)
    assert not bench.Target("rate", 0.6).met(None, None)
    assert not bench.Target("rate", 0.6).met(float("nan"), 1)
    be: ComputeBackend = use_shared("cpu")
    run = bench.run_benchmarks("cpu", backend=be, sizes=tiny(repeats=2), groups=["overhead"])
    (row,) = run.results
    assert row.op == "overhead" and row.unit == "us/call" and row.compare == "value_max"
    assert len(row.samples["op"]) == 2
    assert row.passed is (row.achieved is not None and row.achieved <= 10.0)


def test_gpu_check_script_runs_its_phases_on_any_backend(tmp_path: Path) -> None:
    """The GPU script's own code paths, on the CPU backend (the CUDA references need a GPU)."""
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--backend", "cpu", "--out", str(tmp_path), "--quick", "--groups", "overhead,movement",
            "--skip", "tests,conformance"]  # fmt: skip
    assert module.main(argv) == 0
    summary = json.loads((tmp_path / "gpu_check.json").read_text(encoding="utf-8"))
    assert summary["passed"] is True and set(summary["phases"]) == {"dlpack", "bench"}
    assert summary["phases"]["dlpack"]["numpy"]["export_zero_copy"] is True
    rows = summary["phases"]["bench"]["run"]["results"]
    assert {"overhead", "copy_dtod", "gather"} <= {row["op"] for row in rows}
    log = (tmp_path / "gpu_check.log").read_text(encoding="utf-8")
    assert "=== bench ===" in log and "gpu_check: PASS" in log
    assert (tmp_path / "cpu.json").exists()
    assert module.main(["--backend", "no-such-backend", "--out", str(tmp_path)]) == 2
