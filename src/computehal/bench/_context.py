"""What a group's case builder gets: the backend, its sizes, ceilings and targets, and allocation helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from ._ceilings import Ceilings
from ._harness import Case, Limit, Target
from ._sizes import Profile, Sizes
from ._targets import target_for

__all__ = ["BenchContext", "relative_error"]


def relative_error(got: npt.ArrayLike, want: npt.ArrayLike) -> float:
    """``max |got - want| / max |want|`` in float64 (NaN where either has NaN)."""
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    scale = float(np.max(np.abs(w))) if w.size else 0.0
    if g.size == 0:
        return 0.0
    return float(np.max(np.abs(g - w))) / (scale or 1.0)


class BenchContext:
    """The run a case builder contributes to.

    Attributes
    ----------
    backend : ComputeBackend
        The initialised backend under test.
    backend_name : str
        The name it was asked for by (``"cpu"``, ``"opencl"``, ``"vulkan"``, ``"cuda"``).
    profile : {"cpu", "host-device", "gpu", "cuda"}
        Which sizes and targets apply.
    sizes : Sizes
    quick : bool
        A smoke-test run (small sizes; the figures mean little).
    ceilings : Ceilings
        The device's limits and, where it has one, its vendor library.
    rng : numpy.random.Generator
    """

    def __init__(
        self,
        backend: ComputeBackend,
        backend_name: str,
        profile: Profile,
        sizes: Sizes,
        ceilings: Ceilings,
        quick: bool = False,
    ) -> None:
        self.backend = backend
        self.backend_name = backend_name
        self.profile: Profile = profile
        self.sizes = sizes
        self.ceilings = ceilings
        self.quick = quick
        self.rng = np.random.default_rng(0)
        self._ptrs: list[int] = []

    def target(self, key: str) -> Target | None:
        """The target of rows of kind ``key`` on this profile (see :mod:`~computehal.bench._targets`)."""
        return target_for(self.profile, key)

    def bandwidth_case(
        self,
        op: str,
        params: str,
        run: Callable[[], object],
        moved: float,
        flops: float,
        limit: Limit | None = None,
        target: Target | None = None,
    ) -> Case:
        """A row in GB/s moving ``moved`` bytes a call, held against the device's bandwidth unless
        ``limit`` (with its ``target``) is given."""
        if limit is None:
            limit, target = self.ceilings.bandwidth, self.target("bandwidth")
        return Case(op, params, run, "GB/s", moved, limit, target, flops=flops, bytes_moved=moved)

    def synchronize(self) -> None:
        """Wait for the backend's work."""
        self.backend.synchronize()

    def put(self, array: npt.ArrayLike) -> int:
        """A device allocation holding ``array``'s bytes (C order), freed with the group."""
        data = np.ascontiguousarray(array)
        ptr = self.empty(data.nbytes)
        if data.nbytes:
            self.backend.copy_htod(ptr, data)
        return ptr

    def put_colmajor(self, matrix: npt.NDArray[Any]) -> int:
        """A matrix stored column-major (what the GEMMs read)."""
        return self.put(np.asarray(matrix).T.copy())

    def empty(self, nbytes: int) -> int:
        """An uninitialised device allocation of ``nbytes`` (at least 1), freed with the group."""
        ptr = int(self.backend.alloc(max(1, int(nbytes))))
        self._ptrs.append(ptr)
        return ptr

    def read(self, ptr: int, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> npt.NDArray[Any]:
        """Copy a device array back to the host (after synchronising)."""
        self.backend.synchronize()
        out = np.empty(shape, dtype=dtype)
        if out.nbytes:
            self.backend.copy_dtoh(out, ptr)
        return out

    @contextmanager
    def scope(self) -> Iterator[None]:
        """Free the allocations made inside the block when it ends."""
        mark = len(self._ptrs)
        try:
            yield
        finally:
            self.backend.synchronize()
            while len(self._ptrs) > mark:
                self.backend.free(self._ptrs.pop())
