"""``computehal bench``: run the benchmark groups on one backend, print the table, write JSON and a plot."""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import numpy as np

from ..backend import ComputeBackend
from ..errors import BackendError
from ._groups import find_group, registered_groups
from ._harness import BenchResult
from ._output import format_notes, format_table, write_json, write_roofline
from ._run import BenchRun, default_groups, run_benchmarks

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The command-line options of ``computehal bench``."""
    parser = argparse.ArgumentParser(
        prog="computehal bench",
        description="Benchmark one backend's operations against that device's own measured limits.",
    )
    parser.add_argument("--backend", default="cpu", help="cpu, opencl, vulkan, cuda (optionally ':<device>')")
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke run)")
    parser.add_argument(
        "--groups", default=None, help="comma list of groups (default: every built-in group; see --list)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        help="folder for <backend>.json and <backend>-roofline.png (default: bench-results)",
    )
    parser.add_argument("--only", default=None, help="only the rows whose op or size contains this text")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed samples per row (the median is reported)"
    )
    parser.add_argument("--no-plot", action="store_true", help="do not write the roofline plot")
    parser.add_argument(
        "--strict", action="store_true", help="exit with status 1 when a row fails its target"
    )
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it registers groups)",
    )
    parser.add_argument("--list", action="store_true", help="list the registered groups and exit")
    return parser


def _writable(folder: Path, files: list[Path]) -> str | None:
    """Why results cannot be written to ``folder`` (None when they can); creates the folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"cannot write to {folder}: {exc.strerror or exc}"
    for path in files:
        if path.is_dir():
            return f"cannot write {path}: it is a directory"
        if path.exists():
            try:
                with path.open("ab"):
                    pass
            except OSError as exc:
                return f"cannot write {path}: {exc.strerror or exc}"
    return None


def _progress(out: TextIO) -> Callable[[BenchResult], None]:
    def show(r: BenchResult) -> None:
        figure = f"{r.achieved:10.2f} {r.unit:<7}" if r.achieved is not None else f"{'':10} {'':<7}"
        ratio = f"ratio {r.ratio:6.3f}" if r.ratio is not None else " " * 12
        out.write(f"  {r.op:<22} {r.params:<40} {figure} {ratio}  {r.verdict}\n")
        out.flush()

    return show


def _report(run: BenchRun, out: TextIO) -> None:
    out.write("\nceilings (medians of every sample taken during the run):\n")
    for name, value in run.peaks.items():
        unit = "GB/s" if "copy" in name.lower() or "memcpy" in name.lower() else "GFLOP/s"
        out.write(f"  {name:<28} {value:10.2f} {unit}\n")
    out.write("\n" + format_table(run.results) + "\n")
    notes = format_notes(run.results)
    if notes:
        out.write("\nnotes:\n" + notes + "\n")
    judged = [r for r in run.results if r.passed is not None]
    passed = sum(1 for r in judged if r.passed)
    unsupported = sum(1 for r in run.results if r.status == "unsupported")
    errors = sum(1 for r in run.results if r.status == "error")
    out.write(
        f"\n{passed}/{len(judged)} targets passed; {len(run.results)} rows, {unsupported} unsupported, "
        f"{errors} errors; {run.seconds:.1f} s\n"
    )


def _started(run: BenchRun, out: TextIO) -> None:
    out.write(
        f"device: {run.device} ({run.profile} profile, {run.sizes.repeats} repeats); "
        f"host: {run.machine['cpu']}, {run.machine['cores']} cores\n"
    )
    out.flush()


def _header(args: argparse.Namespace, out: TextIO) -> None:
    sizes = "quick" if args.quick else "default"
    out.write(f"computehal bench --backend {args.backend} ({sizes} sizes)\n")
    out.flush()


def _chosen_groups(args: argparse.Namespace, out: TextIO, err: TextIO) -> list[str] | int:
    """Import the plugins and resolve ``--groups``; an exit status after ``--list`` or an error."""
    for module in args.plugin:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            err.write(f"computehal bench: cannot import plugin {module}: {exc}\n")
            return 2
    if args.list:
        for group in registered_groups():
            mark = "" if group.default else " (not run by default)"
            out.write(f"{group.name:<12} {group.description}{mark}\n")
        return 0
    groups = [g.strip() for g in args.groups.split(",") if g.strip()] if args.groups else default_groups()
    try:
        unknown = [g for g in groups if find_group(g) is None]
    except ImportError as exc:
        err.write(f"computehal bench: a requested group cannot load: {exc}\n")
        return 2
    if unknown or not groups:
        known = ", ".join(g.name for g in registered_groups())
        missing = ", ".join(unknown) or "(none given)"
        err.write(f"computehal bench: unknown group(s) {missing}; known: {known}\n")
        return 2
    return groups


def main(
    argv: list[str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    *,
    backend: ComputeBackend | None = None,
) -> int:
    """Run ``computehal bench`` with ``argv``; return the exit status.

    ``backend``, an initialised backend, replaces the one ``--backend`` would start
    (``--backend`` still names it); wrappers use it to pass backend-specific options.

    Returns
    -------
    int
        0 on success (also when targets fail, unless ``--strict``); 1 when ``--strict``
        and a row failed; 2 on bad arguments, an unwritable output folder or a backend
        that cannot start.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if args.repeats is not None and args.repeats < 1:
        err.write("computehal bench: --repeats must be >= 1\n")
        return 2
    groups = _chosen_groups(args, out, err)
    if isinstance(groups, int):
        return groups
    stem = args.backend.replace(":", "-")
    json_path, plot_path = args.out / f"{stem}.json", args.out / f"{stem}-roofline.png"
    problem = _writable(args.out, [json_path] if args.no_plot else [json_path, plot_path])
    if problem is not None:
        err.write(f"computehal bench: {problem}\n")
        return 2
    _header(args, out)
    try:
        with np.errstate(all="ignore"):
            run = run_benchmarks(
                args.backend,
                backend=backend,
                quick=args.quick,
                groups=groups,
                only=args.only,
                repeats=args.repeats,
                progress=_progress(out),
                on_start=lambda r: _started(r, out),
            )
    except BackendError as exc:
        err.write(f"computehal bench: {exc}\n")
        return 2
    _report(run, out)
    return _write(run, args, json_path, plot_path, out, err)


def _write(
    run: BenchRun, args: argparse.Namespace, json_path: Path, plot_path: Path, out: TextIO, err: TextIO
) -> int:
    try:
        write_json(json_path, run)
        out.write(f"results: {json_path}\n")
        if not args.no_plot:
            if write_roofline(plot_path, run):
                out.write(f"roofline: {plot_path}\n")
            else:
                out.write('roofline: skipped (needs matplotlib: pip install "computehal[bench]")\n')
    except OSError as exc:
        err.write(f"computehal bench: cannot write the results: {exc}\n")
        return 2
    failed = any(r.passed is False for r in run.results)
    return 1 if args.strict and failed else 0
