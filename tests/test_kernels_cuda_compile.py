"""Every shared kernel source must compile as CUDA C++ to PTX for sm_80 and sm_90.

The OpenCL backend runs these files on PoCL; the CUDA backend compiles the same files with
NVRTC. This test keeps them honest on machines without a GPU: it compiles each ``.cl`` file
in every build configuration the backends use, with ``nvcc -x cu -ptx`` (the preinstalled
``nvcc``) or, where there is no nvcc, with NVRTC through ``cuda.bindings`` / ``cupy``. It is
skipped, saying so, only when neither compiler is present.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from computehal.kernels import kernel_files, kernel_source

ARCHES = ("sm_80", "sm_90")

#: Build configurations per kernel file: the defines the backends pass (empty = defaults).
CONFIGS: dict[str, list[dict[str, str]]] = {
    "gemm.cl": [
        {"REAL": "float", "VW": "8", "NR": "4"},
        {"REAL": "double", "VW": "4", "NR": "4", "USE_FP64": "1"},
    ],
    "conv.cl": [{"REAL": "float", "VW": "8", "NR": "4"}],
    "attention.cl": [
        {"HD": "64", "BQ": "32", "BKV": "64", "VW": "8"},
        {"HD": "24", "BQ": "4", "BKV": "64", "VW": "8"},
        {"HD": "128", "BQ": "4", "BKV": "32", "VW": "8"},
    ],
    "reduce.cl": [{"LS": "64"}],
}


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for candidate in ("/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _nvrtc() -> Any:
    """A callable (source, options) -> None that compiles with NVRTC, or None."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        nvrtc = None
    if nvrtc is not None:

        def compile_with_bindings(source: str, options: list[str]) -> None:
            err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], [])
            assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
            (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
            if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                _, size = nvrtc.nvrtcGetProgramLogSize(prog)
                log = b" " * size
                nvrtc.nvrtcGetProgramLog(prog, log)
                raise AssertionError(log.decode(errors="replace"))

        return compile_with_bindings
    try:
        import cupy
        from cupy.cuda import compiler
    except Exception:  # noqa: BLE001 - any failure means "no NVRTC here"
        return None
    del cupy

    def compile_with_cupy(source: str, options: list[str]) -> None:
        compiler.compile_using_nvrtc(source, options=tuple(options))

    return compile_with_cupy


NVCC = _nvcc()
NVRTC = None if NVCC else _nvrtc()


def _cases() -> list[Any]:
    params = []
    for name in kernel_files():
        if not name.endswith(".cl"):
            continue
        for i, defines in enumerate(CONFIGS.get(name, [{}])):
            for arch in ARCHES:
                params.append(pytest.param(name, defines, arch, id=f"{name}-cfg{i}-{arch}"))
    return params


@pytest.mark.skipif(NVCC is None and NVRTC is None, reason="neither nvcc nor NVRTC is installed")
@pytest.mark.parametrize(("name", "defines", "arch"), _cases())
def test_kernel_compiles_as_cuda(name: str, defines: dict[str, str], arch: str) -> None:
    source = kernel_source(name)
    flags = [f"-D{key}={value}" for key, value in defines.items()]
    if NVCC is not None:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / (Path(name).stem + ".cu")
            src.write_text(source, encoding="utf-8")
            out = Path(tmp) / "out.ptx"
            result = subprocess.run(
                [NVCC, "-x", "cu", f"-arch={arch}", "-ptx", *flags, str(src), "-o", str(out)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert result.returncode == 0, f"nvcc failed for {name} {defines} {arch}:\n{result.stderr}"
            ptx = out.read_text(encoding="utf-8")
    else:
        assert NVRTC is not None
        NVRTC(source, [f"--gpu-architecture=compute_{arch[3:]}", *flags])
        return
    assert ".entry" in ptx, f"{name}: no kernel entry point in the PTX"


def test_every_kernel_file_is_covered() -> None:
    names = [n for n in kernel_files() if n.endswith(".cl")]
    assert {"gemm.cl", "conv.cl", "attention.cl", "reduce.cl", "elementwise.cl", "gather.cl"} <= set(names)
