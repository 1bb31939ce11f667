"""Every C-family kernel source must compile as CUDA C++ to PTX for sm_80 and sm_90.

The OpenCL backend runs the ``.cl`` files on PoCL; the CUDA backend compiles the same files
(and the CUDA-only ``.cu`` helpers) with NVRTC. This test keeps them honest on machines
without a GPU: it compiles each ``.cl`` / ``.cu`` file, as the kernel loader builds it, in
every build configuration the backends use, with ``nvcc -x cu -ptx`` (the preinstalled
``nvcc``) and with NVRTC (``libnvrtc`` through ctypes: the pip wheel ``nvidia-cuda-nvrtc-*``
or a CUDA toolkit; no GPU or driver needed), each that is present. It is skipped, saying so,
only when neither compiler is present.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from computehal.kernels import kernel_files, kernel_source

ARCHES = ("sm_80", "sm_90")

#: Build configurations per kernel file: the defines the backends pass (empty = defaults).
CONFIGS: dict[str, list[dict[str, str]]] = {
    "gemm.cl": [
        {"REAL": "float", "VW": "8", "NR": "6"},
        {"REAL": "double", "VW": "4", "NR": "6", "USE_FP64": "1"},
    ],
    "conv.cl": [
        {"REAL": "float", "VW": "8", "NR": "6", "LS": "64"},
        {"REAL": "double", "VW": "4", "NR": "6", "LS": "64", "USE_FP64": "1"},
        {"REAL": "float", "VW": "8", "NR": "4"},
    ],
    "attention.cl": [
        {"HD": "64", "BQ": "32", "BKV": "64", "VW": "8"},
        {"HD": "32", "BQ": "16", "BKV": "64", "VW": "8"},
        {"HD": "128", "BQ": "16", "BKV": "16", "VW": "4", "REAL": "double", "USE_FP64": "1"},
    ],
    "elementwise.cl": [{"EW": "1"}, {"EW": "16", "REAL": "double", "USE_FP64": "1"}],
    "cast.cl": [{"EW": "16", "USE_FP64": "1"}],
    "movement.cl": [{"LS": "64"}],
    "pool.cl": [{"REAL": "float"}, {"REAL": "double", "USE_FP64": "1"}],
    "reduce.cl": [
        {"LS": "64", "CONTIG": "0"},
        {"LS": "64", "CONTIG": "1", "REAL": "double", "USE_FP64": "1"},
    ],
    "norm.cl": [{"LS": "64", "CONTIG": "0"}, {"LS": "256", "CONTIG": "1", "REAL": "double", "USE_FP64": "1"}],
}


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for candidate in ("/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _nvrtc_library() -> Any:
    """libnvrtc through ctypes: from the pip wheel ``nvidia-cuda-nvrtc-*`` or the system, else None."""
    candidates: list[str] = []
    try:
        import nvidia.cuda_nvrtc as wheel

        for root in wheel.__path__:
            candidates += sorted(glob.glob(os.path.join(root, "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    system = ctypes.util.find_library("nvrtc")
    if system:
        candidates.append(system)
    candidates += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    for path in candidates:
        if "builtins" in os.path.basename(path) or ".alt." in os.path.basename(path):
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _nvrtc() -> Callable[[str, list[str]], None] | None:
    """A callable (source, options) that compiles with NVRTC and raises on errors, or None."""
    lib = _nvrtc_library()
    if lib is None:
        return None

    def compile_with_nvrtc(source: str, options: list[str]) -> None:
        prog = ctypes.c_void_p()
        status = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None)
        assert status == 0, f"nvrtcCreateProgram failed with status {status}"
        try:
            flags = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            status = lib.nvrtcCompileProgram(prog, len(options), flags)
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(max(1, size.value))
            lib.nvrtcGetProgramLog(prog, log)
            assert status == 0, f"NVRTC failed (status {status}):\n{log.value.decode(errors='replace')}"
            ptx_size = ctypes.c_size_t()
            assert lib.nvrtcGetPTXSize(prog, ctypes.byref(ptx_size)) == 0
            ptx = ctypes.create_string_buffer(ptx_size.value)
            assert lib.nvrtcGetPTX(prog, ptx) == 0
            assert b".entry" in ptx.value, "no kernel entry point in the PTX"
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))

    return compile_with_nvrtc


NVCC = _nvcc()
NVRTC = _nvrtc()
COMPILERS = [name for name, tool in (("nvcc", NVCC), ("nvrtc", NVRTC)) if tool is not None]


def _cases() -> list[Any]:
    params = []
    for name in kernel_files():
        if not name.endswith((".cl", ".cu")):
            continue
        for i, defines in enumerate(CONFIGS.get(name, [{}])):
            for arch in ARCHES:
                for tool in COMPILERS:
                    params.append(pytest.param(name, defines, arch, tool, id=f"{tool}-{name}-cfg{i}-{arch}"))
    return params


def test_ci_has_a_cuda_compiler() -> None:
    """In CI the compile check must run: a missing toolchain fails instead of skipping."""
    if os.environ.get("CI") and not COMPILERS:
        pytest.fail("CI has neither nvcc nor NVRTC: install the cuda-compile extra (.ci/run does)")


@pytest.mark.skipif(not COMPILERS, reason="neither nvcc nor NVRTC is installed: CUDA compile check not run")
@pytest.mark.parametrize(("name", "defines", "arch", "tool"), _cases())
def test_kernel_compiles_as_cuda(name: str, defines: dict[str, str], arch: str, tool: str) -> None:
    source = kernel_source(name, defines)
    if tool == "nvrtc":
        assert NVRTC is not None
        NVRTC(source, [f"--gpu-architecture=compute_{arch[3:]}"])
        return
    assert NVCC is not None
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / (Path(name).stem + ".cu")
        src.write_text(source, encoding="utf-8")
        out = Path(tmp) / "out.ptx"
        result = subprocess.run(
            [NVCC, "-x", "cu", f"-arch={arch}", "-ptx", str(src), "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, f"nvcc failed for {name} {defines} {arch}:\n{result.stderr}"
        ptx = out.read_text(encoding="utf-8")
    assert ".entry" in ptx, f"{name}: no kernel entry point in the PTX"


def test_every_kernel_file_is_covered() -> None:
    names = [n for n in kernel_files() if n.endswith(".cl")]
    wanted = {"gemm.cl", "conv.cl", "attention.cl", "reduce.cl", "elementwise.cl", "movement.cl", "cast.cl"}
    assert wanted <= set(names)
