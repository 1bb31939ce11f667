"""Every kernel source of every backend, behind one loader.

The sources live next to this module:

* ``*.cl``: kernel families written in the dialect of ``dialect.h``, so the same text
  compiles as OpenCL C (PoCL, OpenCL GPUs) and as CUDA C++ (NVRTC, nvcc);
* ``*.cu``: CUDA-only helpers (the 16-bit narrowing of cuBLAS operands);
* ``*.h``: headers the ``.cl`` / ``.cu`` files include;
* ``*.wgsl``: the wgpu backend's shaders.

:func:`kernel_source` returns a self-contained build text: the op codes numbered once
in :mod:`computehal.backends._common` (``#define UNARY_RELU 0`` ... for C sources,
``const UNARY_RELU: u32 = 0u;`` ... for WGSL), then the build's defines, then the file
with every ``#include "..."`` expanded in place (each header once). Kernels and the
Python that launches them therefore share one numbering, and a source builds the same
way with OpenCL (no ``-I`` path), NVRTC and nvcc. This module imports no GPU library.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources

from ..backends._common import c_defines, wgsl_consts

__all__ = ["C_SUFFIXES", "WGSL_SUFFIX", "kernel_files", "kernel_source", "raw_source"]

#: Suffixes of C-family sources (OpenCL C / CUDA C++ and their headers).
C_SUFFIXES = (".cl", ".cu", ".h")
#: Suffix of WGSL sources.
WGSL_SUFFIX = ".wgsl"

_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_.]+)"\s*$', re.MULTILINE)
_DEFINE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def kernel_files() -> list[str]:
    """Names of every kernel source file in this package (C family and WGSL), sorted."""
    suffixes = (*C_SUFFIXES, WGSL_SUFFIX)
    return sorted(p.name for p in resources.files(__name__).iterdir() if p.name.endswith(suffixes))


@functools.cache
def raw_source(name: str) -> str:
    """The text of kernel file ``name`` exactly as stored.

    Raises
    ------
    FileNotFoundError
        If there is no such kernel file.
    """
    if "/" in name or "\\" in name or not name.endswith((*C_SUFFIXES, WGSL_SUFFIX)):
        raise FileNotFoundError(f"no kernel source named {name!r}")
    return (resources.files(__name__) / name).read_text(encoding="utf-8")


def _expand(name: str) -> str:
    seen: set[str] = set()

    def expand(text: str) -> str:
        def include(match: re.Match[str]) -> str:
            header = match.group(1)
            if header in seen:
                return ""
            seen.add(header)
            return expand(raw_source(header))

        return _INCLUDE.sub(include, text)

    return expand(raw_source(name))


def _define_lines(defines: Mapping[str, object]) -> str:
    lines = []
    for key, value in defines.items():
        if not _DEFINE_NAME.match(key) or "\n" in str(value):
            raise ValueError(f"bad kernel define {key}={value!r}")
        lines.append(f"#define {key} {value}\n")
    return "".join(lines)


def kernel_source(name: str, defines: Mapping[str, object] | None = None) -> str:
    """The self-contained build text of kernel file ``name``.

    Parameters
    ----------
    name : str
        A C-family file (``"gemm.cl"``, ``"cuda_narrow.cu"``), or one or more WGSL files
        joined by ``+`` (``"wgpu_common.wgsl+wgpu_gemm.wgsl"``), concatenated in order.
    defines : mapping, optional
        Build parameters (C sources only): ``#define KEY VALUE`` lines placed before the
        file, so they are seen by its ``#ifndef`` defaults. Sorted text is deterministic:
        the same defines in any order give the same source.

    Raises
    ------
    FileNotFoundError
        If a named file does not exist.
    ValueError
        If defines are given for WGSL, or a define name is not an identifier.
    """
    parts = name.split("+")
    if all(p.endswith(WGSL_SUFFIX) for p in parts):
        if defines:
            raise ValueError("WGSL sources take no defines")
        return f"// computehal kernel {name}\n" + wgsl_consts() + "".join(raw_source(p) for p in parts)
    if len(parts) != 1:
        raise FileNotFoundError(f"only WGSL sources can be joined with '+': {name!r}")
    ordered = dict(sorted((defines or {}).items()))
    return f"// computehal kernel {name}\n" + c_defines() + _define_lines(ordered) + _expand(name)
