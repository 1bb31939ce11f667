"""Shape helpers for the strided kernels: merging dimensions and packing them for a uniform."""

from __future__ import annotations

from collections.abc import Sequence

from .._common import collapse

__all__ = ["collapse", "vec6"]


def vec6(values: Sequence[int]) -> list[int]:
    """``values`` (at most 6) padded with zeros to the 8 words of two uniform vec4s."""
    return [*values, *([0] * (8 - len(values)))]
