"""The kernel sources shared by the OpenCL and CUDA backends.

Each ``.cl`` file holds one family of kernels written in the dialect of ``dialect.h``, so the
same text compiles as OpenCL C (PoCL, OpenCL GPUs) and as CUDA C++ (NVRTC, nvcc). This module
only reads the files; it imports no GPU library.
"""

from __future__ import annotations

import re
from importlib import resources

__all__ = ["kernel_files", "kernel_source"]

_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_.]+)"\s*$', re.MULTILINE)


def kernel_files() -> list[str]:
    """Names of every kernel source file in this package (``.cl`` and ``.h``), sorted."""
    return sorted(p.name for p in resources.files(__name__).iterdir() if p.name.endswith((".cl", ".h")))


def _read(name: str) -> str:
    return (resources.files(__name__) / name).read_text(encoding="utf-8")


def kernel_source(name: str) -> str:
    """The text of kernel file ``name`` with its ``#include "..."`` lines expanded in place.

    Expanding on the host makes a source self-contained, so it builds the same way with
    OpenCL (no ``-I`` path) and with NVRTC. Each header is inserted once.

    Raises
    ------
    FileNotFoundError
        If there is no such kernel file.
    """
    seen: set[str] = set()

    def expand(text: str) -> str:
        def include(match: re.Match[str]) -> str:
            header = match.group(1)
            if header in seen:
                return ""
            seen.add(header)
            return expand(_read(header))

        return _INCLUDE.sub(include, text)

    return expand(_read(name))
