#!/usr/bin/env python
"""Verify CudaBackend on a real NVIDIA GPU: conformance kit, CUDA tests, DLPack, benchmark rows.

Run from the repository root on a machine with an NVIDIA GPU and CuPy (and, optionally,
PyTorch) already installed; the script installs nothing::

    python scripts/gpu_check.py --out gpu-check            # everything (a few minutes on an H200)
    python scripts/gpu_check.py --out gpu-check --quick    # benchmark at small sizes

Phases, each timed and recorded whatever happens in the others:

1. ``conformance``: the conformance kit on ``CudaBackend`` (every dtype it claims);
2. ``tests``: ``pytest`` on the CUDA tests (the backend on the device, its kernels compiled
   by the device's own NVRTC, the DLPack tests), when ``tests/`` is beside the script;
3. ``dlpack``: zero-copy round trips with CuPy and PyTorch (checked by writing through
   one side and reading through the other);
4. ``bench``: the benchmark harness (:mod:`computehal.bench`) on the CUDA profile: d/s/h
   GEMM, strided batched and bf16 mixed precision against cuBLAS on the same problem,
   attention against PyTorch's ``scaled_dot_product_attention`` (a plain CuPy version
   without PyTorch), memory-bound rows against ``cudaMemcpy`` device-to-device
   bandwidth, and every other op of the interface.

Everything printed also goes to ``OUT/gpu_check.log``; ``OUT/gpu_check.json`` holds each
phase's outcome and the benchmark rows, ``OUT/<backend>.json`` and
``OUT/<backend>-roofline.png`` are the harness's own outputs. ``--backend cpu`` runs the
same script on another backend (a dry run of the script itself on a machine without a
GPU).

Exit status: 0 when every phase passed; 1 otherwise; 2 when the backend cannot start or
the output folder cannot be written.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import numpy as np

#: The test files run by the ``tests`` phase: the CUDA backend's own tests (which also compile
#: every unit it builds with this machine's NVRTC) and the DLPack tests (CUDA cases included).
#: The OpenCL-configuration compile check (tests/test_kernels_cuda_compile.py) runs in CI.
CUDA_TESTS = ("tests/test_cuda.py", "tests/test_dlpack.py")


class Tee:
    """A text stream writing to the console and the log file."""

    def __init__(self, console: TextIO, log: TextIO) -> None:
        self.console, self.log = console, log

    def write(self, text: str) -> int:
        self.console.write(text)
        self.log.write(text)
        return len(text)

    def flush(self) -> None:
        self.console.flush()
        self.log.flush()


class Phases:
    """Runs each phase, catching what it raises, and keeps the outcomes."""

    def __init__(self) -> None:
        self.outcomes: dict[str, dict[str, Any]] = {}

    def run(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        print(f"\n=== {name} ===", flush=True)
        started = time.perf_counter()
        try:
            outcome = fn()
        except Exception as exc:  # noqa: BLE001 - a failing phase must not stop the others
            traceback.print_exc(file=sys.stdout)
            outcome = {"passed": False, "error": f"{type(exc).__name__}: {exc}"}
        outcome["seconds"] = round(time.perf_counter() - started, 2)
        self.outcomes[name] = outcome
        print(
            f"--- {name}: {'PASS' if outcome.get('passed') else 'FAIL'} in {outcome['seconds']:.1f} s",
            flush=True,
        )

    @property
    def passed(self) -> bool:
        return all(outcome.get("passed") for outcome in self.outcomes.values())


def conformance(backend: Any) -> dict[str, Any]:
    """The conformance kit on ``backend``; per-op summary and the failures."""
    from computehal.testing import run_conformance

    report = run_conformance(backend)
    print(report.summary())
    failures = [
        {"op": r.op, "case": r.case, "message": r.message[:500]} for r in report.results if not r.passed
    ]
    return {"passed": report.passed, "cases": len(report.results), "failures": failures}


def cuda_tests(backend_name: str) -> dict[str, Any]:
    """``pytest`` on the CUDA test files (with the CUDA backend required)."""
    files = [name for name in CUDA_TESTS if Path(name).exists()]
    if not files:
        print("no tests/ folder here; skipped")
        return {"passed": True, "skipped": "no tests/ folder"}
    env = dict(os.environ, COMPUTEHAL_REQUIRE_BACKENDS=backend_name.split(":")[0])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    print(done.stdout[-20000:] + done.stderr[-5000:])
    tail = [line for line in done.stdout.splitlines() if line.strip()][-1:] or [""]
    return {"passed": done.returncode == 0, "returncode": done.returncode, "summary": tail[0]}


def _cupy_round_trip(backend: Any) -> dict[str, Any]:
    import cupy

    import computehal as ch

    array = ch.asarray(np.arange(1024, dtype=np.float32), backend)
    view = cupy.from_dlpack(array)
    zero_copy = int(view.data.ptr) == array.ptr
    view[:] = 7.0
    cupy.cuda.runtime.deviceSynchronize()
    seen = bool((array.to_host() == 7.0).all())
    source = cupy.arange(1024, dtype=cupy.float32)
    borrowed = ch.from_dlpack(source, backend)
    backend.unary("neg", borrowed.ptr, borrowed.ptr, 1024)
    backend.synchronize()
    back = bool((cupy.asnumpy(source) == -np.arange(1024, dtype=np.float32)).all())
    return {
        "export_zero_copy": zero_copy,
        "write_through_export": seen,
        "import_zero_copy": borrowed.ptr == int(source.data.ptr),
        "write_through_import": back,
    }


def _torch_round_trip(backend: Any) -> dict[str, Any]:
    import torch

    import computehal as ch

    array = ch.asarray(np.arange(1024, dtype=np.float32), backend)
    tensor = torch.from_dlpack(array)
    zero_copy = tensor.data_ptr() == array.ptr
    tensor.fill_(3.0)
    torch.cuda.synchronize()
    seen = bool((array.to_host() == 3.0).all())
    source = torch.arange(1024, dtype=torch.float32, device="cuda")
    borrowed = ch.from_dlpack(source, backend)
    backend.unary("neg", borrowed.ptr, borrowed.ptr, 1024)
    backend.synchronize()
    back = bool((source.cpu().numpy() == -np.arange(1024, dtype=np.float32)).all())
    return {
        "export_zero_copy": zero_copy,
        "write_through_export": seen,
        "import_zero_copy": borrowed.ptr == source.data_ptr(),
        "write_through_import": back,
    }


def _numpy_round_trip(backend: Any) -> dict[str, Any]:
    import computehal as ch

    array = ch.asarray(np.arange(1024, dtype=np.float32), backend)
    view = np.from_dlpack(array)
    zero_copy = view.ctypes.data == array.ptr
    view[:] = 5.0
    seen = bool((array.to_host() == 5.0).all())
    source = np.arange(1024, dtype=np.float32)
    borrowed = ch.from_dlpack(source, backend)
    backend.unary("neg", borrowed.ptr, borrowed.ptr, 1024)
    backend.synchronize()
    back = bool((source == -np.arange(1024, dtype=np.float32)).all())
    return {
        "export_zero_copy": zero_copy,
        "write_through_export": seen,
        "import_zero_copy": borrowed.ptr == source.ctypes.data,
        "write_through_import": back,
    }


#: DLPack's device type of CUDA memory.
KDL_CUDA = 2


def dlpack(backend: Any) -> dict[str, Any]:
    """Zero-copy DLPack exchange with CuPy and (when importable) PyTorch; NumPy for host backends."""
    device = backend.dlpack_device()
    if device is None or device[0] != KDL_CUDA:
        results: dict[str, Any] = {"numpy": _numpy_round_trip(backend)}
    else:
        results = {"cupy": _cupy_round_trip(backend)}
        try:
            import torch

            if torch.cuda.is_available():
                results["torch"] = _torch_round_trip(backend)
            else:
                results["torch"] = "PyTorch sees no CUDA device"
        except ImportError:
            results["torch"] = "PyTorch is not installed"
    print(json.dumps(results, indent=2))
    checks = [value for side in results.values() if isinstance(side, dict) for value in side.values()]
    return {"passed": all(checks), **results}


def bench(backend: Any, name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark harness on ``backend``; prints the table, writes its JSON and plot."""
    from computehal.bench import format_table, run_benchmarks, write_json, write_roofline

    groups = [g for g in args.groups.split(",") if g] if args.groups else None
    run = run_benchmarks(name, backend=backend, quick=args.quick, groups=groups)
    print(format_table(run.results))
    stem = name.replace(":", "-")
    json_path = args.out / f"{stem}.json"
    write_json(json_path, run)
    write_roofline(args.out / f"{stem}-roofline.png", run)
    bad = [
        f"{r.op} {r.params}: {r.status} {r.note}" for r in run.results if r.status in ("error", "mismatch")
    ]
    failed = [f"{r.op} {r.params}" for r in run.results if r.passed is False and r.status == "measured"]
    print(f"{len(failed)} rows below target; {len(bad)} rows failed to run or gave wrong results")
    for line in bad:
        print("  " + line)
    document = json.loads(json_path.read_text(encoding="utf-8"))
    return {"passed": not bad, "below_target": failed, "failed_rows": bad, "run": document}


def _open(name: str) -> Any:
    from computehal.selection import start_backend

    return start_backend(name)


def _describe(backend: Any, name: str) -> dict[str, Any]:
    ordinal = int(name.split(":")[1]) if ":" in name else 0
    device = backend.available_devices()[ordinal]
    info = {
        "name": device.name,
        "compute_capability": list(device.compute_capability),
        "memory_gib": round(device.total_memory_bytes / 2**30, 1),
        "backend": backend.name(),
    }
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except ImportError:
        pass
    return info


def main(argv: list[str] | None = None) -> int:
    """Run every phase; return the exit status."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="folder for the log and JSON")
    parser.add_argument(
        "--backend", default="cuda", help="backend to check (default cuda; cuda:N for device N)"
    )
    parser.add_argument("--quick", action="store_true", help="benchmark at the profile's quick sizes")
    parser.add_argument(
        "--groups", default=None, help="benchmark groups (comma list; default: all default ones)"
    )
    parser.add_argument(
        "--skip", default="", help="phases to skip (comma list: conformance,tests,dlpack,bench)"
    )
    args = parser.parse_args(argv)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        log = (args.out / "gpu_check.log").open("w", encoding="utf-8")
    except OSError as exc:
        print(f"gpu_check: cannot write to {args.out}: {exc}", file=sys.stderr)
        return 2
    console = sys.stdout
    sys.stdout = Tee(console, log)
    try:
        return _check(args)
    finally:
        sys.stdout = console
        log.close()


def _check(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    print(f"gpu_check {time.strftime('%Y-%m-%d %H:%M:%S')} backend {args.backend}", flush=True)
    try:
        backend = _open(args.backend)
    except Exception as exc:  # noqa: BLE001 - reported, exit 2
        print(f"gpu_check: {args.backend} cannot start: {exc}")
        _write(args.out, {"backend": args.backend, "started": False, "error": str(exc)})
        return 2
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    phases = Phases()
    summary: dict[str, Any] = {"backend": args.backend, "device": _describe(backend, args.backend)}
    print(f"device: {summary['device']}")
    try:
        plan: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("conformance", lambda: conformance(backend)),
            ("tests", lambda: cuda_tests(args.backend)),
            ("dlpack", lambda: dlpack(backend)),
            ("bench", lambda: bench(backend, args.backend, args)),
        ]
        for name, fn in plan:
            if name not in skip:
                phases.run(name, fn)
    finally:
        backend.close()
    summary.update(
        phases=phases.outcomes, passed=phases.passed, seconds=round(time.perf_counter() - started, 1)
    )
    _write(args.out, summary)
    print(f"\ngpu_check: {'PASS' if phases.passed else 'FAIL'} in {summary['seconds']:.1f} s")
    for name, outcome in phases.outcomes.items():
        print(f"  {name:<12} {'PASS' if outcome.get('passed') else 'FAIL'}  {outcome['seconds']:.1f} s")
    return 0 if phases.passed else 1


def _write(folder: Path, summary: dict[str, Any]) -> None:
    text = json.dumps(summary, indent=2, default=str) + "\n"
    (folder / "gpu_check.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
