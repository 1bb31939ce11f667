"""Guarded device memory for conformance cases.

Every operand a case hands to a backend lives in its own allocation, in the middle:
``guard`` canary bytes, the operand, ``guard`` more canary bytes. The operand
pointer is therefore always an interior pointer (``base + guard``). After an
operation the canaries must be unchanged (nothing was written outside the operand);
after an operation that raised, the whole allocation must be unchanged (arguments
are checked before memory is touched). :class:`Workspace` frees everything it
allocated on exit, even when the case failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from ..errors import BackendError

__all__ = ["Block", "Workspace", "canary_bytes", "expect_error"]

#: Canary bytes on each side of an operand (a multiple of 64 keeps operands aligned).
GUARD = 128


def canary_bytes(nbytes: int, seed: int) -> npt.NDArray[np.uint8]:
    """A deterministic, position-dependent byte pattern (a shifted copy never matches)."""
    rng = np.random.default_rng(0xC0FFEE + seed)
    return rng.integers(0, 256, size=nbytes, dtype=np.uint8)


@dataclass
class Block:
    """One guarded allocation: ``lo`` canary bytes, ``nbytes`` operand bytes, ``hi`` canary bytes."""

    base: int
    lo: int
    nbytes: int
    hi: int
    contents: npt.NDArray[np.uint8]
    label: str
    live: bool = True

    @property
    def ptr(self) -> int:
        """The operand pointer (an interior pointer, ``base + lo``)."""
        return self.base + self.lo

    @property
    def size(self) -> int:
        """Bytes allocated."""
        return self.lo + self.nbytes + self.hi


@dataclass
class Workspace:
    """The allocations of one case; use as a context manager.

    Parameters
    ----------
    backend : ComputeBackend
        An initialised backend.
    guard : int
        Canary bytes before each operand (and after it, unless ``tail`` is given).
    tail : int, optional
        Canary bytes after each operand; 0 makes every operand end exactly at the
        end of its allocation, so any overreach is outside the allocation.
    """

    backend: ComputeBackend
    guard: int = GUARD
    tail: int | None = None
    blocks: list[Block] = field(default_factory=list)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        problems: list[str] = []
        for block in self.blocks:
            if block.live:
                block.live = False
                try:
                    self.backend.free(block.base)
                except BackendError as error:
                    problems.append(f"free({block.label}) raised {type(error).__name__}: {error}")
        if problems and exc_type is None:
            raise AssertionError("; ".join(problems))

    # ------------------------------------------------------------------ allocation

    def put(
        self,
        data: npt.ArrayLike,
        *,
        dtype: Any = None,
        label: str = "operand",
        lo: int | None = None,
        hi: int | None = None,
    ) -> int:
        """Allocate a guarded block holding ``data`` as ``dtype``; return the operand pointer.

        Without ``dtype``, a NumPy array keeps its own dtype and anything else is stored
        as float32.
        """
        if dtype is None:
            dtype = data.dtype if isinstance(data, np.ndarray) else np.float32
        array = np.ascontiguousarray(np.asarray(data, dtype=_storage(dtype)))
        return self.put_bytes(array.view(np.uint8).reshape(-1), label=label, lo=lo, hi=hi).ptr

    def put_bytes(
        self,
        payload: npt.NDArray[np.uint8],
        *,
        label: str = "operand",
        lo: int | None = None,
        hi: int | None = None,
    ) -> Block:
        """Allocate a guarded block holding ``payload`` bytes; return the block."""
        lo = self.guard if lo is None else lo
        hi = (self.guard if self.tail is None else self.tail) if hi is None else hi
        nbytes = int(payload.size)
        total = lo + nbytes + hi
        contents = canary_bytes(total, len(self.blocks))
        contents[lo : lo + nbytes] = payload
        base = self.backend.alloc(total)
        block = Block(base, lo, nbytes, hi, contents, label)
        self.blocks.append(block)
        self.backend.copy_htod(base, contents)
        return block

    def block(self, ptr: int) -> Block:
        """The block whose operand starts at ``ptr`` (live blocks first)."""
        for block in sorted(self.blocks, key=lambda b: not b.live):
            if block.ptr == ptr or block.base == ptr:
                return block
        raise AssertionError(f"no block of this case starts at {ptr:#x}")

    def release(self, ptr: int) -> None:
        """Free the block whose operand is ``ptr`` now (to test freed pointers)."""
        block = self.block(ptr)
        block.live = False
        self.backend.free(block.base)

    # ------------------------------------------------------------------ reading back

    def read_block(self, block: Block) -> npt.NDArray[np.uint8]:
        """All bytes of ``block``'s allocation, canaries included."""
        out = np.empty(block.size, dtype=np.uint8)
        self.backend.copy_dtoh(out, block.base)
        return out

    def get(self, ptr: int, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> npt.NDArray[Any]:
        """Copy an operand back as an array of ``shape`` and ``dtype``, checking its canaries."""
        block = self.block(ptr)
        raw = self.read_block(block)
        self._check_guards(block, raw)
        dt = _storage(dtype)
        count = int(np.prod(shape))
        operand = raw[block.lo : block.lo + count * dt.itemsize]
        result: npt.NDArray[Any] = operand.view(dt).reshape(shape).copy()
        return result

    def _check_guards(self, block: Block, raw: npt.NDArray[np.uint8]) -> None:
        for start, stop, where in (
            (0, block.lo, "before"),
            (block.lo + block.nbytes, block.size, "after"),
        ):
            changed = np.flatnonzero(raw[start:stop] != block.contents[start:stop])
            if changed.size:
                first = int(changed[0]) + start - block.lo
                raise AssertionError(
                    f"{self.backend.name()} wrote {changed.size} canary byte(s) {where} operand "
                    f"{block.label!r} (first at byte offset {first} from the operand)"
                )

    def refresh(self) -> None:
        """Take the current contents of every live block as its expected contents."""
        for block in self.blocks:
            if block.live:
                block.contents = self.read_block(block)

    def check_guards(self) -> None:
        """Assert that no live block's canary bytes changed."""
        for block in self.blocks:
            if block.live:
                self._check_guards(block, self.read_block(block))

    def check_unchanged(self, labels: tuple[str, ...] | None = None) -> None:
        """Assert that live blocks (all, or those labelled ``labels``) are byte-for-byte unchanged."""
        for block in self.blocks:
            if not block.live or (labels is not None and block.label not in labels):
                continue
            raw = self.read_block(block)
            changed = np.flatnonzero(raw != block.contents)
            if changed.size:
                first = int(changed[0]) - block.lo
                raise AssertionError(
                    f"{self.backend.name()} changed {changed.size} byte(s) of {block.label!r} "
                    f"(first at byte offset {first} from the operand) although the call should "
                    f"not have written it"
                )


def _storage(dtype: Any) -> np.dtype[Any]:
    if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16"):
        import ml_dtypes

        dtype = ml_dtypes.bfloat16
    result: np.dtype[Any] = np.dtype(dtype)
    return result


@contextmanager
def expect_error(expected: type[BackendError] | tuple[type[BackendError], ...], what: str) -> Iterator[None]:
    """Assert that the block raises ``expected`` (a :class:`BackendError` subclass).

    Any other exception, or none, fails with a message naming ``what``.
    """
    names = expected.__name__ if isinstance(expected, type) else " or ".join(e.__name__ for e in expected)
    try:
        yield
    except expected:
        return
    except BackendError as error:
        raise AssertionError(f"{what}: expected {names}, got {type(error).__name__}: {error}") from error
    except Exception as error:
        raise AssertionError(
            f"{what}: expected {names}, but a non-BackendError escaped: {type(error).__name__}: {error}"
        ) from error
    raise AssertionError(f"{what}: expected {names}, but the call returned normally")
