"""Results out: the text table, the JSON document and the roofline plot."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ._harness import BenchResult
from ._run import BenchRun

__all__ = ["format_notes", "format_table", "run_document", "write_json", "write_roofline"]

SUITE = "computehal-bench"


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.{digits}f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def _row(r: BenchResult) -> tuple[str, ...]:
    measured = r.status == "measured"
    achieved = f"{_fmt(r.achieved)} {r.unit}" if measured and r.achieved is not None else "-"
    ceiling = "-"
    if measured and r.limit is not None:
        ceiling = f"{_fmt(r.limit)} {r.unit} {r.limit_name}"
    elif r.limit_name != "-":
        ceiling = r.limit_name
    return (
        r.op,
        r.params,
        _duration(r.op_seconds) if measured else "-",
        achieved,
        ceiling,
        _fmt(r.ratio, 3) if measured else "-",
        r.target_text(),
        r.verdict,
    )


def format_table(results: Sequence[BenchResult]) -> str:
    """The rows as a fixed-width table: op, size, time, achieved, ceiling, ratio, target, result."""
    header = ("op", "size", "time", "achieved", "ceiling", "ratio", "target", "result")
    rows = [header, *(_row(r) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_notes(results: Sequence[BenchResult]) -> str:
    """Why rows were not measured or failed their check, one line per distinct reason."""
    seen: dict[str, list[str]] = {}
    for r in results:
        if r.note:
            seen.setdefault(f"{r.status}: {r.note}", []).append(f"{r.op} {r.params}")
    lines = []
    for reason, rows in seen.items():
        where = rows[0] if len(rows) == 1 else f"{rows[0]} (+{len(rows) - 1} more)"
        lines.append(f"  {where}: {reason}")
    return "\n".join(lines)


def run_document(run: BenchRun) -> dict[str, Any]:
    """The run as a JSON-ready dict (every row with its samples)."""
    return {
        "suite": SUITE,
        "backend": run.backend,
        "device": run.device,
        "profile": run.profile,
        "quick": run.quick,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": run.seconds,
        "machine": run.machine,
        "peaks": run.peaks,
        "roof": run.roof,
        "sizes": asdict(run.sizes),
        "groups": run.groups,
        "passed": run.passed,
        "results": [asdict(r) for r in run.results],
    }


def write_json(path: Path, run: BenchRun) -> None:
    """Write :func:`run_document` to ``path``."""
    text = json.dumps(_plain(run_document(run)), indent=2, allow_nan=False) + "\n"
    path.write_text(text, encoding="utf-8")


def _plain(value: Any) -> Any:
    """``value`` with NumPy scalars made plain and non-finite floats made None (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_roofline(path: Path, run: BenchRun) -> bool:
    """Plot each row at (FLOP/byte, GFLOP/s) under the measured ceilings; False without matplotlib.

    Memory-bound rows count about one FLOP per element, so they sit at their achieved
    bandwidth times their intensity.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    compute = run.peaks.get(run.roof.get("compute", ""))
    bandwidth = run.peaks.get(run.roof.get("bandwidth", ""))
    points = [r for r in run.results if r.status == "measured" and r.flops and r.bytes_moved and r.op_seconds]
    if not compute or not bandwidth or not points:
        return False
    fig, ax = plt.subplots(figsize=(11, 7))
    xs = np.logspace(-3, 4, 400)
    label = f"roofline ({run.roof['compute']}, {run.roof['bandwidth']})"
    ax.plot(xs, np.minimum(compute, bandwidth * xs), color="black", lw=2, label=label)
    markers = "o^sDvP*Xh<>"
    names = sorted({r.op for r in points})
    for r in points:
        assert r.flops is not None and r.bytes_moved is not None and r.op_seconds is not None
        intensity, gflops = r.flops / r.bytes_moved, r.flops / r.op_seconds / 1e9
        color = {True: "tab:green", False: "tab:red", None: "tab:blue"}[r.passed]
        ax.loglog(intensity, gflops, marker=markers[names.index(r.op) % len(markers)], ls="none", color=color)
        ax.annotate(
            f"{r.op} {r.params}", (intensity, gflops), fontsize=5, xytext=(3, 3), textcoords="offset points"
        )
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(
        f"computehal {run.backend} on {run.device}: {run.roof['compute']} {compute:.0f} GFLOP/s, "
        f"{run.roof['bandwidth']} {bandwidth:.1f} GB/s",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True
