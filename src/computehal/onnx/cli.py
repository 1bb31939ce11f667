"""``computehal run model.onnx``: run a model once or several times and report what happened.

Prints each output's shape and a short summary of its values, the time per run, the plan
(how many nodes ran where, the partition borders) and the peak device memory. Inputs come
from ``--input name=file.npy``; inputs without a file are generated (floats: standard
normal; integers: ones), with ``--shape name=d0,d1,...`` for inputs whose shape the model
leaves open.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from ..errors import BackendError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``computehal run``."""
    parser = argparse.ArgumentParser(
        prog="computehal run",
        description="Run an ONNX model on a computehal backend and report outputs, time, plan and memory.",
    )
    parser.add_argument("model", help="path of the .onnx file")
    parser.add_argument(
        "--backend", metavar="NAME", help="cpu, opencl, vulkan, cuda[:n] (default: the best here)"
    )
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="an input from a .npy file (repeat)",
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="shape of a generated input (repeat)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="timed runs after the first (default 1)"
    )
    parser.add_argument(
        "--strict", action="store_true", help="refuse the model instead of using the CPU fallback"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of generated inputs")
    parser.add_argument("--nodes", action="store_true", help="also list where every node runs")
    return parser


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise ValueError(f"{what} must look like NAME=VALUE, got {value!r}")
        out[name] = rest
    return out


def _inputs(session: Any, files: dict[str, str], shapes: dict[str, str], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    known = {i.name: i for i in session.get_inputs()}
    for name in list(files) + list(shapes):
        if name not in known:
            raise ValueError(f"the model has no input {name!r}; its inputs are {sorted(known)}")
    feeds: dict[str, np.ndarray] = {}
    for name, info in known.items():
        if name in files:
            feeds[name] = np.load(files[name], allow_pickle=False)
            continue
        if name in shapes:
            dims = [int(d) for d in shapes[name].split(",")]
        elif all(isinstance(d, int) for d in info.shape):
            dims = list(info.shape)
        else:
            raise ValueError(f"input {name!r} has shape {info.shape}: give --shape {name}=... or --input")
        dtype = np.dtype(_numpy_type(info.type))
        if dtype.kind == "f":
            feeds[name] = rng.standard_normal(dims).astype(dtype)
        else:
            feeds[name] = np.ones(dims, dtype=dtype)
    return feeds


def _numpy_type(type_string: str) -> str:
    inner = type_string.removeprefix("tensor(").removesuffix(")")
    return {"float": "float32", "double": "float64", "float16": "float16"}.get(inner, inner)


def _summary(name: str, value: np.ndarray) -> str:
    head = f"output {name}: {value.dtype.name} {list(value.shape)}"
    if value.size == 0:
        return head + " (empty)"
    wide = value.astype(np.float64)
    first = ", ".join(f"{v:.6g}" for v in wide.reshape(-1)[:4])
    more = ", ..." if value.size > 4 else ""
    return (
        f"{head} min {np.nanmin(wide):.6g} max {np.nanmax(wide):.6g} mean {np.nanmean(wide):.6g}"
        f" nan {int(np.isnan(wide).sum())} [{first}{more}]"
    )


def _run(args: argparse.Namespace, out: TextIO) -> int:
    from ._session import InferenceSession

    if args.repeat < 1:
        raise ValueError("--repeat must be at least 1")
    files, shapes = _pairs(args.input, "--input"), _pairs(args.shape, "--shape")
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = InferenceSession(args.model, backend=args.backend, strict=args.strict)
        loaded = time.perf_counter() - started
        feeds = _inputs(session, files, shapes, args.seed)
        for name, value in feeds.items():
            origin = f"from {files[name]}" if name in files else "generated"
            out.write(f"input {name}: {value.dtype.name} {list(value.shape)} ({origin})\n")
        first = time.perf_counter()
        outputs = session.run(None, feeds)
        first = time.perf_counter() - first
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            outputs = session.run(None, feeds)
            times.append(time.perf_counter() - t)
    for name, value in zip((o.name for o in session.get_outputs()), outputs, strict=True):
        out.write(_summary(name, value) + "\n")
    mean = sum(times) / len(times)
    out.write(
        f"time per run: {mean * 1e3:.3f} ms (mean of {len(times)}, min {min(times) * 1e3:.3f} ms); "
        f"load {loaded:.2f} s, first run {first * 1e3:.1f} ms\n"
    )
    report = session.plan({k: v.shape for k, v in feeds.items()})
    out.write(str(report) if args.nodes else report.summary())
    out.write("\n")
    from ._partition import FallbackWarning

    for warning in caught:
        if not issubclass(warning.category, FallbackWarning):  # the plan lists those nodes
            out.write(f"warning: {warning.message}\n")
    session.close()
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Entry point of ``computehal run``; returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return _run(args, out)
    except (ValueError, OSError) as exc:
        err.write(f"computehal run: {exc}\n")
        return 2
    except BackendError as exc:
        err.write(f"computehal run: {exc}\n")
        return 1
