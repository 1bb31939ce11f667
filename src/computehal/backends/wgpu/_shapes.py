"""Shape helpers for the strided kernels: merging dimensions and packing them for a uniform."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["collapse", "vec6"]


def collapse(shape: Sequence[int], *strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Drop extent-1 dimensions and merge neighbours that every stride list walks as one.

    Dimensions ``d`` and ``d + 1`` merge when, for each stride list,
    ``stride[d] == stride[d + 1] * shape[d + 1]`` (zero strides merge with zero
    strides). Returns the new shape (at least one dimension) and stride lists.
    """
    dims = [(e, [s[d] for s in strides]) for d, e in enumerate(shape) if e != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = []
    for extent, ss in dims:
        if out_shape and all(prev == cur * extent for prev, cur in zip(out_strides[-1], ss, strict=True)):
            out_shape[-1] *= extent
            out_strides[-1] = ss
            continue
        out_shape.append(extent)
        out_strides.append(ss)
    if not out_shape:
        return [1], [[0] for _ in strides]
    return out_shape, [[ss[i] for ss in out_strides] for i in range(len(strides))]


def vec6(values: Sequence[int]) -> list[int]:
    """``values`` (at most 6) padded with zeros to the 8 words of two uniform vec4s."""
    return [*values, *([0] * (8 - len(values)))]
