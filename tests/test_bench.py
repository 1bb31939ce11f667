"""Smoke test of the CPU benchmark suite: structure of the table and JSON, never timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from computehal import bench

EXPECTED_OPS = {
    "gemm",
    "batched_gemm",
    "gemm_mixed_precision",
    "conv2d_forward",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "attention",
    "unary",
    "binary",
    "softmax",
    "reduce",
    "gather",
    "scatter",
    "overhead",
    "attention_memory",
}


def _tiny(repeats: int = 1) -> bench.Sizes:
    return bench.Sizes(
        gemm=32,
        batch=3,
        batch_dim=8,
        conv=(2, 3, 4, 6, 5),
        attention=(1, 2, 16, 8),
        attention_memory_seq=64,
        elementwise=1 << 10,
        matrix=16,
        rows=4,
        row_len=8,
        table_rows=16,
        copy_elements=1 << 10,
        repeats=repeats,
        overhead_calls=5,
    )


def test_quick_run_writes_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cpu.json"
    status = bench.main(["--quick", "--repeats", "1", "--json", str(out), "--no-plot"])
    assert status == 0
    text = capsys.readouterr().out
    assert "machine peaks" in text
    header = next(line for line in text.splitlines() if line.startswith("op "))
    for column in ("achieved", "limit", "ratio", "target", "result"):
        assert column in header
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["suite"] == "computehal-cpu"
    assert set(doc["peaks"]) == {"dgemm_gflops", "sgemm_gflops", "copy_gbps"}
    assert all(value is None or value > 0 for value in doc["peaks"].values())
    names = {row["name"] for row in doc["results"]}
    assert names == EXPECTED_OPS
    for row in doc["results"]:
        assert row["compare"] in ("time", "rate", "value_max")
        assert isinstance(row["passed"], bool)
        assert row["achieved"] > 0
        if row["compare"] == "value_max":
            assert row["ratio"] is None and row["limit"] is None
        else:
            assert row["ratio"] > 0 and row["limit"] > 0
        # Every row's verdict appears in the printed table.
        assert ("PASS" if row["passed"] else "FAIL") in text
    assert doc["passed"] == all(row["passed"] for row in doc["results"])


def test_run_suite_with_tiny_sizes_covers_every_op() -> None:
    results, peaks = bench.run_suite(_tiny())
    assert {r.name for r in results} == EXPECTED_OPS
    assert set(peaks) == {"scipy dgemm", "scipy sgemm", "parallel copy"}
    table = bench.format_table(results)
    assert len(table.splitlines()) == len(results) + 2
    for r in results:
        if r.compare == "time":
            assert r.passed == (r.ratio is not None and r.ratio <= r.target)
        elif r.compare == "rate":
            assert r.passed == (r.ratio is not None and r.ratio >= r.target)
        else:
            assert r.passed == (r.achieved <= r.target)


def test_only_and_groups_select_cases(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert bench.main(["--quick", "--repeats", "1", "--groups", "memory", "--only", "softmax",
                       "--json", str(out), "--no-plot"]) == 0  # fmt: skip
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert {row["name"] for row in doc["results"]} == {"softmax"}


def test_bad_arguments_return_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--groups", "nonsense"]) == 2
    assert bench.main(["--repeats", "0"]) == 2
    assert bench.main(["--no-such-flag"]) == 2


def test_plot_is_optional(tmp_path: Path) -> None:
    results, peaks = bench.run_suite(_tiny(), groups=("memory",), only="relu")
    written = bench.write_roofline(tmp_path / "roof.png", results, peaks)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert written is False
    else:
        assert written is True and (tmp_path / "roof.png").stat().st_size > 0
