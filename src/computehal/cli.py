"""The ``computehal`` command: list backends, certify them, benchmark them.

Subcommands
-----------
``computehal devices [--json]``
    Every backend computehal knows, whether it can run here and, if not, why; its
    devices and capabilities; and which backend :func:`computehal.auto` would choose.
``computehal check [--backend NAME] [--op OP]``
    Runs the conformance kit (:func:`computehal.testing.run_conformance`) on every
    available backend, or only the named one, with a progress line per case on
    stderr; prints a table per backend with one row per operation (pass / fail,
    largest error, time) and the failing cases; exits 1 on any failure.
``computehal bench [...]``
    The benchmark harness, :func:`computehal.bench.main` (its own ``--help``). Such
    delegated subcommands are listed in :data:`DELEGATED`.

Exit status: 0 success, 1 a check failed or a named backend cannot run, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from . import __version__
from .backend import ALL_OPS, ComputeBackend
from .backends import BACKENDS
from .errors import BackendError
from .probe import ProbeEntry, ProbeReport, probe
from .registry import BackendKind
from .selection import ENV_VAR, parse_backend_name, start_backend
from .types import Capabilities, DeviceInfo

__all__ = ["main", "build_parser", "format_table"]


# ---------------------------------------------------------------------- formatting


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, indent: str = "") -> str:
    """Render ``rows`` as a plain left-aligned text table with a header rule.

    Parameters
    ----------
    headers : sequence of str
        Column titles.
    rows : sequence of sequences
        Cell values (converted with ``str``).
    indent : str
        Prefix of every line.
    """
    cells = [[str(value) for value in row] for row in rows]
    widths = [len(title) for title in headers]
    for row in cells:
        for index, value in enumerate(row):
            widths[index] = max(widths[index], len(value))

    def line(values: Sequence[str]) -> str:
        return (indent + "  ".join(value.ljust(widths[i]) for i, value in enumerate(values))).rstrip()

    rule = ["-" * width for width in widths]
    if rule:
        rule[-1] = rule[-1][: max(len(headers[-1]), 40)]  # a long free-text last column wraps anyway
    out = [line(list(headers)), line(rule)]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


def _bytes(count: int) -> str:
    if count <= 0:
        return "unknown"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def describe_capabilities(caps: Capabilities) -> str:
    """One line listing what ``caps`` supports, e.g. ``"fp16, fp64, unified memory; ..."``."""
    flags = [
        ("fp16", caps.supports_fp16),
        ("bf16", caps.supports_bf16),
        ("fp8", caps.supports_fp8),
        ("fp64", caps.supports_fp64),
        ("tensor cores", caps.tensor_cores),
        ("peer access", caps.peer_access),
        ("unified memory", caps.unified_memory),
        ("cluster launch", caps.cluster_launch),
        ("async copy", caps.async_copy),
    ]
    has = ", ".join(name for name, on in flags if on) or "no optional features"
    limits = (
        f"max threads/block {caps.max_threads_per_block}, "
        f"shared mem/block {_bytes(caps.max_shared_mem_per_block)}, warp {caps.warp_size}"
    )
    native = f"; native ops: {len(caps.native_ops)}" if caps.native_ops else ""
    return f"{has}; {limits}{native}"


def _device_line(device: DeviceInfo) -> str:
    major, minor = device.compute_capability
    parts = [f"device {device.ordinal}: {device.name}", f"memory {_bytes(device.total_memory_bytes)}"]
    parts.append(f"{device.memory_kind.value} memory")
    if (major, minor) != (0, 0):
        parts.append(f"compute capability {major}.{minor}")
    return " | ".join(parts)


# ---------------------------------------------------------------------- devices


_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64", "uint8": "bytes"}


def _ops_matrix(report: ProbeReport, markdown: bool) -> str:
    """Every operation against every available backend: the dtypes it takes there."""
    entries = [e for e in report.entries if e.available and e.capabilities is not None]
    headers = ("operation", *(e.kind.value for e in entries))
    rows = []
    for op in ALL_OPS:
        cells = []
        for entry in entries:
            assert entry.capabilities is not None
            names = entry.capabilities.dtypes(op)
            cells.append(" ".join(_SHORT[n] for n in _SHORT if n in names) or "-")
        rows.append((op, *cells))
    if not markdown:
        return format_table(headers, rows)
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += [
        "| " + " | ".join(f"`{r[0]}`" if i == 0 else str(r[i]) for i in range(len(r))) + " |" for r in rows
    ]
    return "\n".join(lines)


def _devices(args: argparse.Namespace, out: TextIO) -> int:
    report = probe(refresh=args.refresh)
    if args.ops or args.markdown:
        out.write(_ops_matrix(report, args.markdown) + "\n")
        return 0
    if args.json:
        json.dump(_report_json(report), out, indent=2)
        out.write("\n")
        return 0
    rows = []
    for entry in report.entries:
        status = "available" if entry.available else "unavailable"
        detail = entry.target if entry.available else entry.reason
        if entry.on_host_cpu:
            detail += " (its only device is this host's CPU: ranked below cpu)"
        rows.append((entry.kind.value, entry.priority, status, len(entry.devices), detail))
    out.write(format_table(("BACKEND", "PRIORITY", "STATUS", "DEVICES", "DETAIL"), rows) + "\n")
    for entry in report.entries:
        if not entry.devices and entry.capabilities is None:
            continue
        out.write(f"\n{entry.kind.value} ({entry.target}){'' if entry.available else ' - unavailable'}\n")
        for device in entry.devices:
            out.write(f"  {_device_line(device)}\n")
            if device.capabilities != entry.capabilities:
                out.write(f"    capabilities: {describe_capabilities(device.capabilities)}\n")
        if entry.capabilities is not None:
            out.write(f"  capabilities: {describe_capabilities(entry.capabilities)}\n")
    order = report.registry().fallback_chain()
    out.write(f"\nauto() would choose: {order[0].value}; it tries, in order: ")
    out.write(" -> ".join(kind.value for kind in order) + "\n")
    override = os.environ.get(ENV_VAR, "").strip()
    if override and override.lower() != "auto":
        out.write(f"{ENV_VAR}={override} overrides that choice\n")
    return 0


def _report_json(report: ProbeReport) -> dict[str, Any]:
    def caps(c: Capabilities | None) -> dict[str, Any] | None:
        if c is None:
            return None
        fields = {name: getattr(c, name) for name in c.__dataclass_fields__}
        fields["native_ops"] = sorted(c.native_ops)
        fields["op_dtypes"] = {op: sorted(names) for op, names in c.op_dtypes}
        return fields

    def device(d: DeviceInfo) -> dict[str, Any]:
        return {
            "ordinal": d.ordinal,
            "name": d.name,
            "compute_capability": list(d.compute_capability),
            "total_memory_bytes": d.total_memory_bytes,
            "memory_kind": d.memory_kind.value,
            "capabilities": caps(d.capabilities),
        }

    def entry(e: ProbeEntry) -> dict[str, Any]:
        return {
            "kind": e.kind.value,
            "priority": e.priority,
            "available": e.available,
            "reason": e.reason,
            "target": e.target,
            "devices": [device(d) for d in e.devices],
            "capabilities": caps(e.capabilities),
        }

    chain = [kind.value for kind in report.registry().fallback_chain()]
    return {
        "backends": [entry(e) for e in report.entries],
        "auto": chain[0],
        "fallback_chain": chain,
        "auto_order": chain,
    }


# ---------------------------------------------------------------------- check


class _Progress:
    """Progress display for one backend on ``stream``.

    On a terminal a single counter line is rewritten in place (failures stay on
    screen); otherwise one line per finished case.
    """

    def __init__(self, label: str, total: int, stream: TextIO) -> None:
        self.label = label
        self.total = total
        self.stream = stream
        self.count = 0
        self.failed = 0
        self.live = bool(getattr(stream, "isatty", lambda: False)())

    def __call__(self, result: Any) -> None:
        self.count += 1
        passed = bool(getattr(result, "passed", False))
        self.failed += not passed
        where = f"{self.count}/{self.total}" if self.total else str(self.count)
        text = f"[{self.label}] {where} {'ok  ' if passed else 'FAIL'} {result.op}: {result.case}"
        if self.live:
            self.stream.write("\r\033[K" + text + ("\n" if not passed else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.live and self.count:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _load_kit() -> Any:
    return importlib.import_module("computehal.testing")


def _check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    targets: list[tuple[BackendKind, str]] = []
    if args.backend:
        try:
            kind, _ = parse_backend_name(args.backend)
        except BackendError as exc:
            err.write(f"computehal check: {exc}\n")
            return 2
        targets.append((kind, args.backend.strip()))
    try:
        kit = _load_kit()
        kit.run_conformance  # noqa: B018 - fail early when the kit is incomplete
    except (ImportError, AttributeError) as exc:
        err.write(f"computehal check: the conformance kit is not available: {exc}\n")
        return 2
    ops = _split(args.op)
    known = tuple(getattr(kit, "OPS", ()))
    unknown = [op for op in ops or () if known and op not in known]
    if unknown:
        err.write(f"computehal check: unknown op {', '.join(unknown)}; known: {', '.join(known)}\n")
        return 2
    report = probe(refresh=args.refresh)
    if not args.backend:
        targets = [(kind, kind.value) for kind in report.available_kinds()]
    status = 0
    for kind, name in targets:
        try:
            backend = start_backend(name, report=report)
        except BackendError as exc:
            out.write(f"\n== {name}: cannot run: {exc}\n")
            status = 1
            continue
        kind = BackendKind.from_name(backend.name()) or kind  # "wgpu" may run as vulkan
        entry = report.entry(kind)
        out.write(f"\n== {name}{'' if name == kind.value else f' ({kind.value})'}: {entry.target}\n")
        for device in entry.devices[:1]:
            out.write(f"   {_device_line(device)}\n")
        out.flush()
        try:
            passed = _check_one(backend, kind.value, ops, kit, args, out, err)
        finally:
            _close(backend)
        if not passed:
            status = 1
    if not targets:
        out.write("no backend is available\n")
        status = 1
    out.write("\n" + ("all checks passed" if status == 0 else "FAILED") + "\n")
    return status


def _check_one(
    backend: ComputeBackend,
    label: str,
    ops: list[str] | None,
    kit: Any,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
) -> bool:
    total = 0
    cases = getattr(kit, "conformance_cases", None)
    if callable(cases):
        total = sum(1 for case in cases(backend) if ops is None or case.op in ops)
    progress = _Progress(label, total, err)
    started = time.perf_counter()
    try:
        result = kit.run_conformance(backend, ops=ops, progress=None if args.quiet else progress)
    except (KeyError, ValueError) as exc:
        out.write(f"   error: {exc}\n")
        return False
    finally:
        progress.finish()
    elapsed = time.perf_counter() - started
    summaries = result.by_op()
    rows = [
        (
            s.op,
            s.cases,
            "PASS" if s.passed else f"FAIL ({s.failed})",
            f"{s.max_error:.3g}",
            f"{s.seconds:.2f}",
        )
        for s in summaries
    ]
    out.write(format_table(("OP", "CASES", "RESULT", "MAX ERROR", "TIME (s)"), rows, indent="   ") + "\n")
    if args.verbose_cases:
        for s in summaries:
            case_rows = [
                (c.case, "pass" if c.passed else "FAIL", f"{c.max_error:.3g}", f"{c.seconds * 1e3:.2f}")
                for c in result.results
                if c.op == s.op
            ]
            out.write(f"\n   {s.op}\n")
            headers = ("CASE", "RESULT", "MAX ERROR", "TIME (ms)")
            out.write(format_table(headers, case_rows, indent="   ") + "\n")
    for case in result.failures:
        out.write(f"   FAIL {case.op} / {case.case}: {case.message}\n")
    count = len(result.results)
    passed = bool(result.passed)
    verdict = "passed" if passed else "FAILED"
    out.write(
        f"   {label}: {count - len(result.failures)}/{count} cases passed in {elapsed:.1f} s - {verdict}\n"
    )
    out.flush()
    return passed


def _close(backend: ComputeBackend) -> None:
    try:
        backend.close()
    except Exception as exc:  # noqa: BLE001 - closing must not hide the check's result
        logging.getLogger("computehal").warning("closing %s failed: %s", backend.name(), exc)


def _split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    names = [part.strip() for value in values for part in value.split(",") if part.strip()]
    return names or None


# ---------------------------------------------------------------------- delegated subcommands

#: Subcommands that belong to another package: name -> (module with ``main(argv) -> int``,
#: help line). Everything after the name goes to that module's own parser. Adding one
#: is one line here.
DELEGATED: dict[str, tuple[str, str]] = {
    "bench": ("computehal.bench", "benchmark a backend (computehal bench --help)"),
    "run": ("computehal.onnx.cli", "run an ONNX model (computehal run --help)"),
}


def _delegate(command: str, argv: list[str], err: TextIO) -> int:
    module_name, _ = DELEGATED[command]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        err.write(f"computehal {command}: {module_name} is not installed ({exc})\n")
        return 2
    runner = getattr(module, "main", None)
    if not callable(runner):
        err.write(f"computehal {command}: {module_name} has no main(argv)\n")
        return 2
    return int(runner(argv) or 0)


# ---------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``computehal`` command."""
    parser = argparse.ArgumentParser(
        prog="computehal",
        description="One low-level compute interface over CPU, OpenCL, wgpu and CUDA.",
    )
    parser.add_argument("--version", action="version", version=f"computehal {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log backend selection and probing")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    devices = commands.add_parser("devices", help="list every backend, its devices and why it is unavailable")
    devices.add_argument("--json", action="store_true", help="print the probe report as JSON")
    devices.add_argument(
        "--ops", action="store_true", help="print the dtypes every operation takes on each available backend"
    )
    devices.add_argument("--markdown", action="store_true", help="with --ops: as a Markdown table")
    devices.add_argument("--refresh", action="store_true", help=argparse.SUPPRESS)

    check = commands.add_parser("check", help="run the conformance kit on the available backends")
    names = ", ".join(spec.name for spec in BACKENDS)
    check.add_argument(
        "--backend", metavar="NAME", help=f"only this backend: {names} or a kind, optionally :DEVICE (cuda:1)"
    )
    check.add_argument(
        "--op", action="append", metavar="OP", help="only this operation (repeat or comma-separate)"
    )
    check.add_argument("--cases", dest="verbose_cases", action="store_true", help="also list every case")
    check.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    check.add_argument("--refresh", action="store_true", help=argparse.SUPPRESS)

    for command, (_, text) in DELEGATED.items():
        commands.add_parser(command, help=text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``computehal`` command with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    out, err = sys.stdout, sys.stderr
    index = _command_index(args_list)
    if index < len(args_list) and args_list[index] in DELEGATED:
        # Everything after the subcommand belongs to its own parser.
        _configure_logging(any(flag in ("-v", "--verbose") for flag in args_list[:index]))
        return _delegate(args_list[index], args_list[index + 1 :], err)
    parser = build_parser()
    args = parser.parse_args(args_list)
    _configure_logging(args.verbose)
    try:
        if args.command == "devices":
            return _devices(args, out)
        if args.command == "check":
            return _check(args, out, err)
    except BrokenPipeError:
        # The reader went away (``computehal devices | head``): stop quietly.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces the closed pipe for the exit flush
        except OSError:
            pass
        return 1
    parser.print_help(out)
    return 2


def _command_index(args: list[str]) -> int:
    """Index of the first argument that is not a global option."""
    for index, value in enumerate(args):
        if not value.startswith("-"):
            return index
    return len(args)


def _configure_logging(verbose: bool) -> None:
    if verbose:
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")
        logging.getLogger("computehal").setLevel(logging.DEBUG)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
