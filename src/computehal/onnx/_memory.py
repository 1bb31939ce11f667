"""Placing intermediate tensors in one arena by lifetime.

Each block lives from the step that first touches it to the step that last does; two
blocks whose lifetimes overlap never share bytes. Blocks are placed largest first, each
at the lowest aligned offset free for its whole lifetime (the greedy-by-size strategy of
TFLite's and ONNX Runtime's arena planners).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ALIGN", "Block", "place"]

#: Alignment of every block (bytes): enough for any dtype and for wide vector loads.
ALIGN = 256


@dataclass
class Block:
    """A region to place: ``nbytes`` live over steps ``first`` .. ``last`` (inclusive)."""

    key: object
    nbytes: int
    first: int
    last: int
    offset: int = -1


def _round(n: int) -> int:
    return -(-max(n, 1) // ALIGN) * ALIGN


def place(blocks: list[Block]) -> int:
    """Set every block's ``offset``; return the arena size (bytes)."""
    placed: list[Block] = []
    total = 0
    for block in sorted(blocks, key=lambda b: (-b.nbytes, b.first)):
        size = _round(block.nbytes)
        busy = sorted(
            (p.offset, p.offset + _round(p.nbytes))
            for p in placed
            if p.first <= block.last and block.first <= p.last
        )
        offset = 0
        for start, end in busy:
            if offset + size <= start:
                break
            offset = max(offset, end)
        block.offset = offset
        placed.append(block)
        total = max(total, offset + size)
    return total


def naive_size(blocks: list[Block]) -> int:
    """Bytes the blocks would take without reuse."""
    return sum(_round(b.nbytes) for b in blocks)
