"""OpenCL plumbing: driver-error translation, buffers, a bounded program cache, launches.

Every call into ``pyopencl`` that can fail goes through :func:`check`, which turns the
driver's error into :class:`~computehal.DeviceError` (or
:class:`~computehal.OutOfMemoryError` for the out-of-memory status codes) keeping the
driver's own text.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import pyopencl as cl

from ...errors import DeviceError, OutOfMemoryError
from ...kernels import kernel_source
from .._common import round_up, strided_outer

__all__ = [
    "Operand",
    "ProgramCache",
    "check",
    "launch",
    "new_buffer",
    "outer_args",
    "real_defines",
    "translate",
    "vector_bits",
]

_OOM_CODES = frozenset(
    {
        cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
        cl.status_code.OUT_OF_RESOURCES,
        cl.status_code.OUT_OF_HOST_MEMORY,
        cl.status_code.INVALID_BUFFER_SIZE,
    }
)


@contextmanager
def check(action: str, nbytes: int | None = None) -> Iterator[None]:
    """Translate ``pyopencl`` errors raised inside the block.

    Parameters
    ----------
    action : str
        What was being done, for the message ("building the gemm kernels").
    nbytes : int, optional
        The size being allocated, reported by :class:`OutOfMemoryError`.
    """
    try:
        yield
    except cl.Error as exc:
        raise translate(exc, action, nbytes) from exc


def translate(exc: Exception, action: str, nbytes: int | None = None) -> Exception:
    """The computehal error for driver error ``exc`` raised while doing ``action``."""
    if isinstance(exc, cl.MemoryError) or getattr(exc, "code", None) in _OOM_CODES:
        return OutOfMemoryError(nbytes, None)
    return DeviceError(f"OpenCL error while {action}: {exc}")


def new_buffer(context: Any, nbytes: int, max_alloc: int) -> Any:
    """A read-write buffer of ``nbytes`` bytes; OutOfMemoryError beyond ``max_alloc``."""
    if nbytes > max_alloc:
        raise OutOfMemoryError(nbytes, max_alloc)
    with check("allocating a buffer", nbytes):
        try:
            return cl.Buffer(context, cl.mem_flags.READ_WRITE, nbytes)
        except MemoryError as exc:
            raise OutOfMemoryError(nbytes, None) from exc


class Operand(NamedTuple):
    """A buffer and the element offset at which an operand starts."""

    buffer: Any
    offset: int


#: One kernel, named for the widest x86 vectors the device compiler targets (clang's macros).
_PROBE_SOURCE = """
#if defined(__AVX512F__)
__kernel void chal_bits_512(__global int* x) { x[0] = 512; }
#elif defined(__AVX__)
__kernel void chal_bits_256(__global int* x) { x[0] = 256; }
#elif defined(__x86_64__) || defined(__i386__)
__kernel void chal_bits_128(__global int* x) { x[0] = 128; }
#else
__kernel void chal_bits_512(__global int* x) { x[0] = 512; }
#endif
"""


def vector_bits(context: Any) -> int:
    """Widest vectors (bits) that kernels may hand to the device's vector builtins: 128 to 512.

    PoCL links each kernel with a builtin library built for the host's instruction set, but
    compiles the kernel for the CPU model its own LLVM knows: on a CPU newer than that LLVM
    (PoCL 3.0 names an AMD Zen 4 "znver3", which has no AVX-512) a 16-wide float vector is
    passed to the library under another calling convention. clang warns that this "changes the
    ABI"; the programs were then built without a single kernel (INVALID_KERNEL_NAME on every op
    using ``float16``), and the process aborted at exit in PoCL's LLVM. So the width comes from
    what the kernel compiler targets: a probe program whose one kernel is named after clang's
    ``__AVX512F__`` / ``__AVX__`` macros (512 bits on devices that are not x86, as before; 128
    when the probe cannot be built).
    """
    try:
        with warnings.catch_warnings():  # pyopencl repeats a non-empty build log as a warning
            warnings.simplefilter("ignore")
            program = cl.Program(context, _PROBE_SOURCE).build()
        names = str(program.get_info(cl.program_info.KERNEL_NAMES))
    except Exception:  # noqa: BLE001 - any failure means: assume the narrowest vectors
        return 128
    for bits in (512, 256):
        if f"chal_bits_{bits}" in names:
            return bits
    return 128


def real_defines(dtype: np.dtype[Any]) -> dict[str, object]:
    """Build defines selecting the arithmetic type of a kernel family (REAL, USE_FP64)."""
    if dtype == np.float64:
        return {"REAL": "double", "USE_FP64": 1}
    return {"REAL": "float"}


class ProgramCache:
    """Builds OpenCL programs from :mod:`computehal.kernels` and keeps the recent ones.

    A program is keyed by its source file and build defines; kernels are fetched by
    name from it. The cache holds at most ``capacity`` programs and drops the least
    recently used one beyond that (its kernels go with it), so memory cannot grow
    with the variety of calls. Callers keep their defines to a fixed, small set per
    family (head dimensions are rounded up to buckets, for example).

    Kernel objects carry their arguments, so a caller must hold the backend's launch
    lock from fetching a kernel until it is enqueued.
    """

    def __init__(self, context: Any, capacity: int = 48) -> None:
        self._context = context
        self.capacity = capacity
        self._programs: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], tuple[Any, dict[str, Any]]]
        self._programs = OrderedDict()
        self._lock = threading.Lock()
        #: How many programs this cache has built (each key once while it stays cached).
        self.builds = 0

    def __len__(self) -> int:
        return len(self._programs)

    def kernel(self, source: str, name: str, defines: Mapping[str, object]) -> Any:
        """The kernel ``name`` of file ``source`` built with ``defines`` (built on first use)."""
        key = (source, tuple(sorted((k, str(v)) for k, v in defines.items())))
        with self._lock:
            entry = self._programs.get(key)
            if entry is None:
                text = kernel_source(source, dict(key[1]))
                with check(f"building the OpenCL kernels of {source} ({dict(key[1])})"):
                    program = cl.Program(self._context, text).build()
                entry = (program, {})
                self._programs[key] = entry
                self.builds += 1
                while len(self._programs) > self.capacity:
                    self._programs.popitem(last=False)
            else:
                self._programs.move_to_end(key)
            program, kernels = entry
            kernel = kernels.get(name)
            if kernel is None:
                with check(f"creating kernel {name} of {source}"):
                    kernel = cl.Kernel(program, name)
                kernels[name] = kernel
            return kernel

    def clear(self) -> None:
        """Drop every program."""
        with self._lock:
            self._programs.clear()


def launch(queue: Any, kernel: Any, global_size: Sequence[int], local_size: Sequence[int] | None,
           *args: Any) -> None:  # fmt: skip
    """Enqueue ``kernel`` over ``global_size`` (rounded up to ``local_size``); nothing when empty."""
    if local_size is not None:
        global_size = [round_up(g, ls) for g, ls in zip(global_size, local_size, strict=True)]
    if any(g == 0 for g in global_size):
        return
    try:
        kernel.set_args(*args)
        cl.enqueue_nd_range_kernel(
            queue, kernel, tuple(global_size), None if local_size is None else tuple(local_size)
        )
    except cl.Error as exc:
        raise translate(exc, f"launching {getattr(kernel, 'function_name', 'a kernel')}") from exc


def outer_args(dims: Sequence[int], sa: Sequence[int], sb: Sequence[int]) -> tuple[Any, ...]:
    """The ``CHAL_OUTER_PARAMS`` of ``kernels/strided.h`` as kernel arguments (see ``strided_outer``)."""
    return tuple(np.int64(x) for x in strided_outer(dims, sa, sb))
