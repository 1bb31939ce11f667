"""OpenCLBackend: every operation as an OpenCL kernel, on any OpenCL device (PoCL included).

Memory is one ``pyopencl.Buffer`` per allocation behind synthetic 64-byte-aligned addresses
(:class:`~computehal.memory.AddressSpace`); an interior pointer resolves to (buffer, byte
offset) through the shared pointer table, and kernels receive the element offset as an
argument (no sub-buffers, which carry device alignment rules).

Launch shapes follow a kernel profile (``kernel_profile``; by default the device type decides):
the CPU profile runs GEMM and convolution one work-item per work-group over packed panels with
a vector register tile (what PoCL's CPU device turns into fast vector code); the GPU profile runs
them as work-group tiles staged in local memory (``kernels/gemm_wg.cl``), with interleaved
reduction folds, one element per element-wise work-item and the work-group attention kernel.

Kernels live in ``computehal/kernels/*.cl``, written in the small dialect of
``kernels/dialect.h`` so that the same files compile as CUDA C. Programs are built lazily,
once per backend instance, per kernel family and build configuration. This module only
validates arguments (through :mod:`computehal.validation`), sizes launches and enqueues
kernels; operand data never goes through the host.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl

from .. import validation as v
from ..backend import COMPUTE_OPS
from ..errors import DeviceError, InvalidArgumentError, OutOfMemoryError, UnsupportedError
from ..kernels import kernel_files, kernel_source
from ..memory import AddressSpace, Allocation, Region, as_count
from ..types import (
    BinaryOp,
    Capabilities,
    DeviceInfo,
    MemoryKind,
    MixedPrecision,
    ReduceOp,
    TileShape,
    UnaryOp,
)
from ._base import TableBackend, guarded
from ._common import refuse_extensions

__all__ = ["KERNEL_PROFILES", "OpenCLBackend", "kernel_source", "kernel_files", "list_devices"]

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I32 = np.int32
I64 = np.int64

#: Kernel families: one source file each.
FAMILIES = {
    "elementwise": "elementwise.cl",
    "reduce": "reduce.cl",
    "gather": "gather.cl",
    "gemm": "gemm.cl",
    "gemm_wg": "gemm_wg.cl",
    "conv": "conv.cl",
    "attention": "attention.cl",
}

_OPS = frozenset(COMPUTE_OPS)
_F32 = frozenset({"float32"})

#: GEMM micro-tile (see kernels/gemm_tile.h): VW-wide vectors, MR = 2 * VW rows, NR columns.
_GEMM_TILE = {F32: (8, 6), F64: (4, 6)}
#: Work-group tiled GEMM of the GPU profile (kernels/gemm_wg.cl): work-group TSX x TSY, a WM x WN
#: register block per work-item (a TM = TSX * WM by TN = TSY * WN tile of C per group), k staged
#: through local memory TK at a time. The first shape the device accepts is used.
_WG_TILES = ((16, 16, 4, 4, 16), (8, 8, 4, 4, 16), (4, 4, 4, 4, 8), (1, 1, 4, 4, 4))
#: Kernel profiles: "cpu" (one work-item per group, vector register tiles, contiguous folds) and
#: "gpu" (work-group tiles staged in local memory, interleaved folds, one element per work-item).
KERNEL_PROFILES = ("cpu", "gpu")
#: Largest walk of NR-blocks one GEMM work-item makes along n.
_MAX_NB = 24
#: Upper bound for the packed A and B panels of one GEMM chunk, in bytes.
_GEMM_SCRATCH = 256 << 20
#: Upper bound for the packed-operand scratch of one convolution chunk, in bytes.
_CONV_SCRATCH = 64 << 20
#: Work-group size of the row reductions (must match a power of two).
_REDUCE_LS = 64
#: Work-group size of the row reductions of the GPU profile for rows of at least _WIDE_ROW elements
#: (more loads in flight per row; short rows keep _REDUCE_LS).
_REDUCE_LS_WIDE = 256
_WIDE_ROW = 4096
#: Query rows per attention work-group (work-group kernel, GPUs).
_ATTN_BQ = 32
#: Bytes of private row state (query and accumulator, 8 * head_dim bytes per query row) that
#: one attention work-group may hold: PoCL keeps the private arrays of every work-item of a
#: group on one thread's stack, which overflowed (a segfault) at head_dim 32768 with 32 rows.
_ATTN_PRIVATE = 1 << 20
#: Query rows per work-item of the vector attention kernel (CPU devices), and its largest head_dim.
_VEC_ATTN_BQ = 16
_VEC_ATTN_MAX_DIM = 256

#: Elements per work-item of the element-wise kernels on CPU devices (EW in elementwise.cl).
_EW_CPU = 16

_REDUCE_CODES = {ReduceOp.SUM: 0, ReduceOp.MAX: 1, ReduceOp.MIN: 2, ReduceOp.MEAN: 3}
_ROUND_MODES = {MixedPrecision.F16: 1, MixedPrecision.BF16: 2}


# --------------------------------------------------------------------------- devices


def _platforms() -> list[Any]:
    try:
        return list(cl.get_platforms())
    except cl.Error:
        return []  # no ICD loader or no platform installed


def list_devices(
    platform: str | None = None, device_filter: str | Callable[[Any], bool] | None = None
) -> list[Any]:
    """Every OpenCL device of every platform, in platform order, optionally filtered.

    Parameters
    ----------
    platform : str, optional
        Keep platforms whose name or vendor contains this text (case-insensitive).
    device_filter : str or callable, optional
        Keep devices whose name contains this text (case-insensitive), or for which the
        callable returns True.
    """
    devices: list[Any] = []
    for plat in _platforms():
        if platform is not None and platform.lower() not in f"{plat.name} {plat.vendor}".lower():
            continue
        try:
            found = plat.get_devices()
        except cl.Error:
            continue
        for dev in found:
            if device_filter is None:
                devices.append(dev)
            elif callable(device_filter):
                if device_filter(dev):
                    devices.append(dev)
            elif device_filter.lower() in dev.name.lower():
                devices.append(dev)
    return devices


def _device_attr(dev: Any, name: str) -> Any:
    try:
        return getattr(dev, name)
    except (cl.Error, AttributeError):
        return None


def _warp_width(dev: Any) -> int:
    """Warp / wavefront / sub-group width where the device reports one, else 1."""
    for attr in ("warp_size_nv", "wavefront_width_amd"):
        value = _device_attr(dev, attr)
        if value:
            return int(value)
    sizes = _device_attr(dev, "sub_group_sizes_intel")
    if sizes:
        return int(max(sizes))
    return 1


def _capabilities(dev: Any) -> Capabilities:
    extensions = set(str(dev.extensions).split())
    fp64 = "cl_khr_fp64" in extensions or bool(_device_attr(dev, "double_fp_config"))
    unified = bool(dev.type & cl.device_type.CPU) or bool(_device_attr(dev, "host_unified_memory"))
    return Capabilities(
        supports_fp16="cl_khr_fp16" in extensions,
        supports_bf16=False,
        supports_fp8=False,
        tensor_cores=False,
        peer_access=False,
        unified_memory=unified,
        cluster_launch=False,
        async_copy=False,
        max_threads_per_block=int(dev.max_work_group_size),
        max_shared_mem_per_block=int(dev.local_mem_size),
        warp_size=_warp_width(dev),
        supports_fp64=fp64,
        native_ops=_OPS,
    )


def _device_info(ordinal: int, dev: Any) -> DeviceInfo:
    caps = _capabilities(dev)
    major = _device_attr(dev, "compute_capability_major_nv")
    minor = _device_attr(dev, "compute_capability_minor_nv")
    cc = (int(major), int(minor or 0)) if major is not None else (0, 0)
    if dev.type & cl.device_type.CPU:
        kind = MemoryKind.HOST
    elif caps.unified_memory:
        kind = MemoryKind.UNIFIED
    else:
        kind = MemoryKind.DEVICE
    name = f"{dev.name.strip()} ({dev.platform.name.strip()})"
    return DeviceInfo(
        ordinal=ordinal,
        name=name,
        compute_capability=cc,
        total_memory_bytes=int(dev.global_mem_size),
        memory_kind=kind,
        capabilities=caps,
    )


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class _Operand:
    """A buffer and the element offset at which an operand starts."""

    buffer: Any
    offset: int


# --------------------------------------------------------------------------- backend


class OpenCLBackend(TableBackend):
    """Compute on one OpenCL device (a GPU, or a CPU through PoCL) with real kernels.

    Parameters
    ----------
    device : int
        Ordinal among the devices that pass ``platform`` and ``device_filter`` (in
        platform order; see :meth:`available_devices`).
    platform : str, optional
        Only use platforms whose name or vendor contains this text (case-insensitive).
    device_filter : str or callable, optional
        Only use devices whose name contains this text, or for which the callable returns
        True when given the ``pyopencl.Device``.
    kernel_profile : {"gpu", "cpu"}, optional
        Launch shapes to use. ``"cpu"``: GEMM and convolution by one work-item per work-group
        with a vector register tile over packed panels, contiguous folds in reductions, several
        elements per element-wise work-item and the single-work-item attention kernel (fast on
        CPU devices such as PoCL). ``"gpu"``: GEMM and convolution by work-group tiles staged
        in local memory (``kernels/gemm_wg.cl``), interleaved (coalesced) reduction folds, one
        element per work-item and the work-group attention kernel. By default the device type
        decides: GPU and accelerator devices get ``"gpu"``, every other device ``"cpu"``.
        Forcing ``"gpu"`` on a CPU device runs (and tests) the GPU kernels there.
    """

    def __init__(
        self,
        device: int = 0,
        *,
        platform: str | None = None,
        device_filter: str | Callable[[Any], bool] | None = None,
        kernel_profile: str | None = None,
    ) -> None:
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise InvalidArgumentError(f"device must be a non-negative integer ordinal, got {device!r}")
        super().__init__(device)
        if kernel_profile is not None and kernel_profile not in KERNEL_PROFILES:
            raise InvalidArgumentError(
                f"kernel_profile must be one of {KERNEL_PROFILES} or None, got {kernel_profile!r}"
            )
        self._requested_profile = kernel_profile
        self._profile = kernel_profile or "cpu"
        self._wg_tile = _WG_TILES[0]
        self._ordinal = device
        self._platform_filter = platform
        self._device_filter = device_filter
        self._device: Any = None
        self._context: Any = None
        self._queue: Any = None
        self._addresses = AddressSpace()
        self._programs: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self._kernels: dict[tuple[Any, str], Any] = {}
        self._scratch: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._caps: Capabilities | None = None
        self.vector_attention = False
        #: How many OpenCL programs this instance has built (each family and configuration once).
        self.program_builds = 0

    # ------------------------------------------------------------------ identity

    def name(self) -> str:
        return "opencl"

    def _devices(self) -> list[Any]:
        return list_devices(self._platform_filter, self._device_filter)

    def _selected(self) -> Any:
        if self._device is not None:
            return self._device
        devices = self._devices()
        if self._ordinal >= len(devices):
            raise DeviceError(
                f"OpenCL device {self._ordinal} does not exist ({len(devices)} device(s) match"
                + (f" platform={self._platform_filter!r}" if self._platform_filter else "")
                + (f" device_filter={self._device_filter!r}" if self._device_filter else "")
                + ")"
            )
        return devices[self._ordinal]

    def capabilities(self) -> Capabilities:
        if self._caps is None:
            try:
                self._caps = self._with_dtypes(_capabilities(self._selected()))
            except (DeviceError, cl.Error):
                return Capabilities(supports_fp64=False, native_ops=_OPS)
        return self._caps

    def _native_dtypes(self) -> dict[str, frozenset[str]]:
        try:
            fp64 = _capabilities(self._selected()).supports_fp64
        except (DeviceError, cl.Error):
            fp64 = False
        table = {op: _F32 for op in _OPS}
        gemm = _F32 | {"float64"} if fp64 else _F32
        table.update(gemm=gemm, batched_gemm=gemm, copy_dtod=frozenset({"uint8"}), fill=_F32)
        return table

    def available_devices(self) -> list[DeviceInfo]:
        infos = []
        for ordinal, dev in enumerate(self._devices()):
            try:
                infos.append(_device_info(ordinal, dev))
            except cl.Error:
                continue
        return infos

    def device_name(self) -> str:
        """Name of the device this backend uses (or will use after ``init``)."""
        return str(self._selected().name).strip()

    @property
    def kernel_profile(self) -> str:
        """The kernel profile in use, ``"gpu"`` or ``"cpu"`` (decided by the device at ``init``
        unless the constructor forced one)."""
        return self._profile

    def recommended_tile_for(self, m: int, n: int, k: int) -> TileShape:
        """The float32 tile the GEMM kernel uses for this problem.

        CPU profile: ``tile_m`` rows and ``tile_n`` columns of C belong to one work-item, an
        MR x NR register block walked ``tile_n / NR`` times along n; ``tile_k`` is 1 (k streams
        through the registers one rank-1 update at a time from packed panels).

        GPU profile: ``tile_m`` x ``tile_n`` is the tile of C of one work-group (TSX * WM by
        TSY * WN) and ``tile_k`` the depth staged in local memory per step.
        """
        self._memory()
        mm, nn = as_count("m", m), as_count("n", n)
        as_count("k", k)
        if self._profile == "gpu":
            tsx, tsy, wm, wn, tk = self._wg_tile
            return TileShape(tsx * wm, tsy * wn, tk)
        vw, nr = _GEMM_TILE[F32]
        mr = 2 * vw
        nb = self._walk(_ceil_div(max(mm, 1), mr), _ceil_div(max(nn, 1), nr), 1)
        return TileShape(mr, nr * nb, 1)

    # ------------------------------------------------------------------ lifecycle and memory

    def _open(self) -> None:
        dev = self._selected()
        try:
            self._context = cl.Context([dev])
            self._queue = cl.CommandQueue(self._context, dev)
        except cl.Error as exc:
            raise DeviceError(f"cannot open OpenCL device {dev.name.strip()!r}: {exc}") from exc
        self._device = dev
        self._caps = self._with_dtypes(_capabilities(dev))
        self._compute_units = max(1, int(dev.max_compute_units))
        self._max_alloc = int(dev.max_mem_alloc_size)
        self._total = int(dev.global_mem_size)
        self._max_wg = int(dev.max_work_group_size)
        self._local_mem = int(dev.local_mem_size)
        #: Work-group size of the row reductions: a power of two the device accepts.
        self._reduce_ls = 1 << (min(_REDUCE_LS, self._max_wg).bit_length() - 1)
        gpu_like = bool(dev.type & (cl.device_type.GPU | cl.device_type.ACCELERATOR))
        self._profile = self._requested_profile or ("gpu" if gpu_like else "cpu")
        cpu = self._profile == "cpu"
        #: The CPU profile folds contiguous slabs per work-item (vector code); the GPU one interleaves.
        self._contig = int(cpu)
        #: Elements per element-wise work-item: a vectorisable run on CPUs, one on GPUs.
        self._ew = _EW_CPU if cpu else 1
        #: The CPU profile runs attention with the single-work-item vector kernel; the GPU one
        #: with the work-group kernel (both are exercised by the tests on PoCL).
        self.vector_attention = cpu
        self._wg_tile = self._pick_wg_tile(dev)
        #: Row-reduction work-group for long rows: wider on the GPU profile.
        wide = _REDUCE_LS_WIDE if self._profile == "gpu" else _REDUCE_LS
        self._reduce_ls_wide = 1 << (min(wide, self._max_wg).bit_length() - 1)

    def _pick_wg_tile(self, dev: Any) -> tuple[int, int, int, int, int]:
        """The largest work-group GEMM tile whose group size and float64 local tiles fit ``dev``."""
        sizes = list(_device_attr(dev, "max_work_item_sizes") or [self._max_wg] * 3)
        for tile in _WG_TILES:
            tsx, tsy, wm, wn, tk = tile
            local = (tk * (tsx * wm + 1) + tk * (tsy * wn + 1)) * 8
            if tsx * tsy <= self._max_wg and tsx <= sizes[0] and tsy <= sizes[1] and local <= self._local_mem:
                return tile
        return _WG_TILES[-1]

    def _new_buffer(self, nbytes: int) -> Any:
        if nbytes > self._max_alloc:
            raise OutOfMemoryError(nbytes, self._max_alloc)
        try:
            return cl.Buffer(self._context, cl.mem_flags.READ_WRITE, nbytes)
        except (cl.MemoryError, MemoryError) as exc:
            raise OutOfMemoryError(nbytes, None) from exc
        except cl.Error as exc:
            code = getattr(exc, "code", None)
            oom_codes = {
                cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
                cl.status_code.OUT_OF_RESOURCES,
                cl.status_code.OUT_OF_HOST_MEMORY,
                cl.status_code.INVALID_BUFFER_SIZE,
            }
            if code in oom_codes:
                raise OutOfMemoryError(nbytes, None) from exc
            raise

    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        with self._lock:
            buffer = self._new_buffer(nbytes)
        return self._addresses.reserve(nbytes), buffer

    def _release(self, allocation: Allocation) -> None:
        buffer = allocation.payload
        allocation.payload = None
        if buffer is not None:
            buffer.release()

    def _write(self, region: Region, data: memoryview) -> None:
        with self._lock:
            cl.enqueue_copy(self._queue, region.payload, data, dst_offset=region.offset, is_blocking=True)

    def _read(self, region: Region, out: memoryview) -> None:
        host = np.frombuffer(out, dtype=np.uint8)
        with self._lock:
            cl.enqueue_copy(self._queue, host, region.payload, src_offset=region.offset, is_blocking=True)

    def _shutdown(self) -> None:
        with self._lock:
            if self._queue is not None:
                self._queue.finish()
            self._scratch.clear()

    def _exec_copy_dtod(self, p: v.CopyProblem) -> None:
        with self._lock:
            cl.enqueue_copy(
                self._queue, p.dst.payload, p.src.payload, byte_count=p.nbytes,
                src_offset=p.src.offset, dst_offset=p.dst.offset,
            )  # fmt: skip

    def _exec_fill(self, p: v.FillProblem) -> None:
        with self._lock:
            self._fill(p.region, p.count, p.value)

    @guarded
    def synchronize(self) -> None:
        self._memory()
        with self._lock:
            self._queue.finish()

    # ------------------------------------------------------------------ programs

    def _kernel(self, family: str, name: str, **defines: Any) -> Any:
        """The kernel ``name`` of ``family`` built with ``defines``; built once, then cached."""
        key = (family, tuple(sorted((k, str(val)) for k, val in defines.items())))
        program = self._programs.get(key)
        if program is None:
            source = kernel_source(FAMILIES[family])
            options = [f"-D{k}={val}" for k, val in key[1]]
            try:
                program = cl.Program(self._context, source).build(options=options)
            except cl.Error as exc:
                raise DeviceError(f"building the OpenCL {family} kernels failed: {exc}") from exc
            self._programs[key] = program
            self.program_builds += 1
        kernel = self._kernels.get((program, name))
        if kernel is None:
            kernel = cl.Kernel(program, name)
            self._kernels[(program, name)] = kernel
        return kernel

    def _launch(
        self, kernel: Any, global_size: Sequence[int], local_size: Sequence[int] | None, *args: Any
    ) -> None:
        if local_size is not None:
            global_size = [_round_up(g, ls) for g, ls in zip(global_size, local_size, strict=True)]
        if any(g == 0 for g in global_size):
            return
        kernel.set_args(*args)
        cl.enqueue_nd_range_kernel(
            self._queue, kernel, tuple(global_size), None if local_size is None else tuple(local_size)
        )

    def _scratch_buffer(self, slot: str, nbytes: int) -> Any:
        """A device scratch buffer of at least ``nbytes`` bytes, reused across calls.

        The queue is in order, so a later operation reusing the buffer runs after every
        kernel of an earlier one that read or wrote it.
        """
        nbytes = max(nbytes, 64)
        buffer = self._scratch.get(slot)
        if buffer is None or buffer.size < nbytes:
            self._scratch.pop(slot, None)
            buffer = self._new_buffer(_round_up(nbytes, 1 << 16))
            self._scratch[slot] = buffer
        return buffer

    def _upload_indices(self, values: np.ndarray[Any, Any]) -> Any:
        data = np.ascontiguousarray(values, dtype=np.int64)
        return cl.Buffer(self._context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)

    @staticmethod
    def _at(region: Region, itemsize: int = 4) -> _Operand:
        return _Operand(region.payload, region.offset // itemsize)

    def _input(
        self, region: Region, against: Iterable[Region], itemsize: int = 4, same_ok: bool = False
    ) -> _Operand:
        """The operand at ``region``, or a device-side snapshot of it when it overlaps an output.

        ``same_ok`` accepts an output that starts exactly where the input starts (element-wise
        kernels read each element before writing it).
        """
        for out in against:
            if region.overlaps(out) and not (same_ok and out.offset == region.offset):
                copy = self._new_buffer(region.nbytes)
                cl.enqueue_copy(
                    self._queue,
                    copy,
                    region.payload,
                    byte_count=region.nbytes,
                    src_offset=region.offset,
                    dst_offset=0,
                )
                return _Operand(copy, 0)
        return self._at(region, itemsize)

    def _fill(self, region: Region, count: int, value: float = 0.0) -> None:
        if count == 0:
            return
        kernel = self._kernel("elementwise", "fill_f32", EW=self._ew)
        self._launch(
            kernel,
            (count,),
            (min(256, self._max_wg),),
            region.payload,
            I64(region.offset // 4),
            np.float32(value),
            I64(count),
        )

    # ------------------------------------------------------------------ GEMM engine

    def _walk(self, a_panels: int, b_panels: int, batches: int) -> int:
        """NR-blocks one work-item walks along n: long walks keep the A panel in cache, while
        enough work-groups remain to keep every compute unit busy."""
        units = getattr(self, "_compute_units", 1)
        nb = (a_panels * b_panels * batches) // (64 * units)
        return max(1, min(_MAX_NB, nb, b_panels))

    def _gemm_kernels(self, dtype: np.dtype[Any], family: str = "gemm") -> dict[str, Any]:
        vw, nr = _GEMM_TILE[dtype]
        defines: dict[str, Any] = {"VW": vw, "NR": nr, "REAL": "double" if dtype == F64 else "float"}
        if dtype == F64:
            defines["USE_FP64"] = 1
        return {
            name: self._kernel(family, name, **defines)
            for name in ("pack_a", "pack_b", "gemm_panels", "scale_c")
        }

    def _panels(
        self,
        dtype: np.dtype[Any],
        m: int,
        n: int,
        k: int,
        alpha: float,
        beta: float,
        batches: int,
        ap: Any,
        ap_stride: int,
        bp: Any,
        bp_stride: int,
        c: _Operand,
        c_stride: int,
        ldc: int,
    ) -> None:
        """Run the micro-kernel over packed panels: C = alpha * Ap * Bp + beta * C per batch."""
        if self._profile == "gpu":
            self._wg_launch(
                dtype, m, n, k, alpha, beta, batches,
                _Operand(ap, 0), ap_stride, (0, 0, 1),
                _Operand(bp, 0), bp_stride, (0, 0, 1),
                c, c_stride, ldc,
            )  # fmt: skip
            return
        vw, nr = _GEMM_TILE[dtype]
        mr = 2 * vw
        a_panels, b_panels = _ceil_div(m, mr), _ceil_div(n, nr)
        nb = self._walk(a_panels, b_panels, batches)
        real = dtype.type
        kernel = self._gemm_kernels(dtype)["gemm_panels"]
        self._launch(
            kernel,
            (a_panels, _ceil_div(b_panels, nb), batches),
            (1, 1, 1),
            ap, I64(ap_stride), bp, I64(bp_stride), c.buffer, I64(c.offset), I64(c_stride), I32(ldc),
            I32(m), I32(n), I32(k), real(alpha), real(beta), I32(nb),
        )  # fmt: skip

    def _wg_kernel(self, dtype: np.dtype[Any]) -> Any:
        """The work-group tiled GEMM kernel (GPU profile) for ``dtype``."""
        vw, nr = _GEMM_TILE[dtype]
        tsx, tsy, wm, wn, tk = self._wg_tile
        defines: dict[str, Any] = {
            "REAL": "double" if dtype == F64 else "float",
            "VW": vw,
            "NR": nr,
            "TSX": tsx,
            "TSY": tsy,
            "WM": wm,
            "WN": wn,
            "TK": tk,
        }
        if dtype == F64:
            defines["USE_FP64"] = 1
        return self._kernel("gemm_wg", "gemm_wg", **defines)

    def _wg_launch(
        self,
        dtype: np.dtype[Any],
        m: int,
        n: int,
        k: int,
        alpha: float,
        beta: float,
        batches: int,
        a: _Operand,
        a_stride: int,
        a_layout: tuple[int, int, int],
        b: _Operand,
        b_stride: int,
        b_layout: tuple[int, int, int],
        c: _Operand,
        c_stride: int,
        ldc: int,
        mode: int = 0,
    ) -> None:
        """One launch of the work-group tiled kernel over every batch.

        ``a_layout`` / ``b_layout`` are (row stride, column stride, layout code) of op(A) and
        op(B) as ``kernels/gemm_wg.cl`` describes them (code 1: gemm.cl's packed panels).
        """
        tsx, tsy, wm, wn, _ = self._wg_tile
        real = dtype.type
        self._launch(
            self._wg_kernel(dtype),
            (_ceil_div(m, tsx * wm) * tsx, _ceil_div(n, tsy * wn) * tsy, batches),
            (tsx, tsy, 1),
            a.buffer, I64(a.offset), I64(a_stride), I64(a_layout[0]), I64(a_layout[1]), I32(a_layout[2]),
            b.buffer, I64(b.offset), I64(b_stride), I64(b_layout[0]), I64(b_layout[1]), I32(b_layout[2]),
            c.buffer, I64(c.offset), I64(c_stride), I32(ldc), I32(m), I32(n), I32(k),
            real(alpha), real(beta), I32(mode),
        )  # fmt: skip

    def _gemm(
        self,
        p: v.GemmProblem,
        batches: int = 1,
        strides: tuple[int, int, int] = (0, 0, 0),
        mode: int = 0,
        spans: tuple[Region, Region, Region] | None = None,
    ) -> None:
        """Pack op(A), op(B) (rounding them when ``mode`` is 1 / 2) and multiply, per batch.

        ``spans`` are the regions of A, B and C over all batches (a batched call); ``p``
        describes batch 0.
        """
        dtype = p.dtype
        size = dtype.itemsize
        if p.empty or batches == 0:
            return
        kernels = self._gemm_kernels(dtype)
        real = dtype.type
        c = self._at(p.c, size)
        if p.product_skipped:
            self._launch(
                kernels["scale_c"], (p.m, p.n, batches), None,
                c.buffer, I64(c.offset), I64(strides[2]), I32(p.ldc), I32(p.m), I32(p.n), real(p.beta),
            )  # fmt: skip
            return
        span_a, span_b, span_c = spans if spans is not None else (p.a, p.b, p.c)
        sa, sb, sc = strides
        if self._profile == "gpu":
            # One launch reads op(A) and op(B) in place while it writes C: snapshot operands
            # that overlap C first.
            a = self._input(span_a, [span_c], size)
            b = self._input(span_b, [span_c], size)
            a_strides = (p.lda, 1) if p.trans_a else (1, p.lda)
            b_strides = (p.ldb, 1) if p.trans_b else (1, p.ldb)
            self._wg_launch(
                dtype, p.m, p.n, p.k, p.alpha, p.beta, batches,
                a, sa, (*a_strides, 0), b, sb, (*b_strides, 0), c, sc, p.ldc, mode,
            )  # fmt: skip
            return
        vw, nr = _GEMM_TILE[dtype]
        mr = 2 * vw
        # Packed panels live in scratch; problems whose panels exceed _GEMM_SCRATCH are done in
        # chunks of batches, then of rows (m) and columns (n) of C.
        limit = max(1, _GEMM_SCRATCH // size)
        per_batch = (_round_up(p.m, mr) + _round_up(p.n, nr)) * p.k
        batch_step = max(1, min(batches, limit // max(1, per_batch)))
        rows_step = _round_up(p.m, mr) if per_batch <= limit else max(mr, (limit // 2 // p.k) // mr * mr)
        cols_step = _round_up(p.n, nr) if per_batch <= limit else max(nr, (limit // 2 // p.k) // nr * nr)
        chunked = batch_step < batches or rows_step < p.m or cols_step < p.n
        # Chunks pack operands after earlier chunks wrote C: snapshot operands that overlap C.
        a = self._input(span_a, [span_c] if chunked else [], size)
        b = self._input(span_b, [span_c] if chunked else [], size)
        for b0 in range(0, batches, batch_step):
            nb = min(batch_step, batches - b0)
            for i0 in range(0, p.m, rows_step):
                for j0 in range(0, p.n, cols_step):
                    m, n = min(rows_step, p.m - i0), min(cols_step, p.n - j0)
                    a_off = a.offset + b0 * sa + (i0 * p.lda if p.trans_a else i0)
                    b_off = b.offset + b0 * sb + (j0 if p.trans_b else j0 * p.ldb)
                    c_blk = _Operand(c.buffer, c.offset + b0 * sc + i0 + j0 * p.ldc)
                    a_panels, b_panels = _ceil_div(m, mr), _ceil_div(n, nr)
                    ap_stride, bp_stride = a_panels * mr * p.k, b_panels * nr * p.k
                    ap = self._scratch_buffer("ap", ap_stride * nb * size)
                    bp = self._scratch_buffer("bp", bp_stride * nb * size)
                    self._launch(
                        kernels["pack_a"], (p.k, a_panels, nb), None,
                        a.buffer, I64(a_off), I64(sa), I32(p.lda), I32(int(p.trans_a)), I32(m), I32(p.k),
                        ap, I64(ap_stride), I32(mode),
                    )  # fmt: skip
                    self._launch(
                        kernels["pack_b"], (p.k, b_panels, nb), None,
                        b.buffer, I64(b_off), I64(sb), I32(p.ldb), I32(int(p.trans_b)), I32(p.k), I32(n),
                        bp, I64(bp_stride), I32(mode),
                    )  # fmt: skip
                    self._panels(
                        dtype, m, n, p.k, p.alpha, p.beta, nb, ap, ap_stride, bp, bp_stride, c_blk, sc, p.ldc
                    )

    def _check_dtype(self, dtype: np.dtype[Any]) -> None:
        if dtype == F64 and not self.capabilities().supports_fp64:
            raise UnsupportedError(
                f"float64 gemm: OpenCL device {self.device_name()!r} has no double precision (cl_khr_fp64)"
            )

    def _exec_gemm(self, p: v.GemmProblem) -> None:
        self._check_dtype(p.dtype)
        with self._lock:
            self._gemm(p)

    def _exec_batched_gemm(self, p: v.BatchedGemmProblem) -> None:
        self._check_dtype(p.gemm.dtype)
        if p.empty:
            return
        with self._lock:
            self._gemm(p.gemm, p.batch_count, (p.stride_a, p.stride_b, p.stride_c), spans=(p.a, p.b, p.c))

    def _exec_gemm_mixed_precision(self, p: v.GemmProblem) -> None:
        assert p.prec is not None
        with self._lock:
            self._gemm(p, mode=_ROUND_MODES[p.prec])

    # ------------------------------------------------------------------ convolution

    def _conv_kernel(self, name: str) -> Any:
        vw, nr = _GEMM_TILE[F32]
        return self._kernel("conv", name, VW=vw, NR=nr, REAL="float")

    def _conv_dims(self, p: v.ConvProblem) -> tuple[Any, ...]:
        return (I32(p.c), I32(p.h), I32(p.w), I32(p.fh), I32(p.fw), I32(p.oh), I32(p.ow),
                I32(p.sh), I32(p.sw), I32(p.ph), I32(p.pw))  # fmt: skip

    @staticmethod
    def _chunks(total: int, per_item_bytes: int) -> Iterable[tuple[int, int]]:
        step = max(1, min(total, _CONV_SCRATCH // max(1, per_item_bytes)))
        for start in range(0, total, step):
            yield start, min(total, start + step)

    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        refuse_extensions("opencl", "conv2d_forward", p)
        if p.empty_output:
            return
        with self._lock:
            if p.c == 0:
                self._fill(p.y, p.n * p.k * p.oh * p.ow)
                return
            vw, nr = _GEMM_TILE[F32]
            mr = 2 * vw
            crs, spatial = p.c * p.fh * p.fw, p.oh * p.ow
            x = self._input(p.x, [p.y])
            f = self._input(p.f, [p.y])
            y = self._at(p.y)
            # Column-major view per image: out^T (S x K) = cols^T (S x CRS) @ filter^T (CRS x K).
            a_panels, b_panels = _ceil_div(spatial, mr), _ceil_div(p.k, nr)
            ap_stride, bp_stride = a_panels * mr * crs, b_panels * nr * crs
            bp = self._scratch_buffer("bp", bp_stride * 4)
            gk = self._gemm_kernels(F32)
            self._launch(
                gk["pack_b"], (crs, b_panels, 1), None,
                f.buffer, I64(f.offset), I64(0), I32(crs), I32(0), I32(crs), I32(p.k), bp, I64(0), I32(0),
            )  # fmt: skip
            pack = self._conv_kernel("pack_a_im2col")
            for n0, n1 in self._chunks(p.n, ap_stride * 4):
                images = n1 - n0
                ap = self._scratch_buffer("ap", ap_stride * images * 4)
                self._launch(
                    pack, (crs, a_panels, images), None,
                    x.buffer, I64(x.offset), I64(n0), *self._conv_dims(p), ap, I64(ap_stride),
                )  # fmt: skip
                out = _Operand(y.buffer, y.offset + n0 * p.k * spatial)
                self._panels(
                    F32,
                    spatial,
                    p.k,
                    crs,
                    1.0,
                    0.0,
                    images,
                    ap,
                    ap_stride,
                    bp,
                    0,
                    out,
                    p.k * spatial,
                    spatial,
                )

    def _exec_conv2d_backward_data(self, p: v.ConvProblem) -> None:
        refuse_extensions("opencl", "conv2d_backward_data", p)
        total = p.n * p.c * p.h * p.w
        if total == 0:
            return
        with self._lock:
            if p.empty_output:
                self._fill(p.x, total)
                return
            vw, nr = _GEMM_TILE[F32]
            mr = 2 * vw
            crs, spatial = p.c * p.fh * p.fw, p.oh * p.ow
            gy = self._input(p.y, [p.x])
            f = self._input(p.f, [p.x])
            gx = self._at(p.x)
            # Column gradients per image: gcols^T (S x CRS) = grad_out^T (S x K) @ filter (K x CRS).
            a_panels, b_panels = _ceil_div(spatial, mr), _ceil_div(crs, nr)
            ap_stride, bp_stride = a_panels * mr * p.k, b_panels * nr * p.k
            gk = self._gemm_kernels(F32)
            bp = self._scratch_buffer("bp", bp_stride * 4)
            self._launch(
                gk["pack_b"], (p.k, b_panels, 1), None,
                f.buffer, I64(f.offset), I64(0), I32(crs), I32(1), I32(p.k), I32(crs), bp, I64(0), I32(0),
            )  # fmt: skip
            fold = self._conv_kernel("col2im")
            per_image = (ap_stride + crs * spatial) * 4
            for n0, n1 in self._chunks(p.n, per_image):
                images = n1 - n0
                ap = self._scratch_buffer("ap", ap_stride * images * 4)
                gcols = self._scratch_buffer("cols", crs * spatial * images * 4)
                self._launch(
                    gk["pack_a"], (p.k, a_panels, images), None,
                    gy.buffer, I64(gy.offset + n0 * p.k * spatial), I64(p.k * spatial), I32(spatial), I32(0),
                    I32(spatial), I32(p.k), ap, I64(ap_stride), I32(0),
                )  # fmt: skip
                cols = _Operand(gcols, 0)
                self._panels(
                    F32,
                    spatial,
                    crs,
                    p.k,
                    1.0,
                    0.0,
                    images,
                    ap,
                    ap_stride,
                    bp,
                    0,
                    cols,
                    crs * spatial,
                    spatial,
                )
                self._launch(
                    fold, (p.h * p.w, p.c, images), None,
                    gcols, gx.buffer, I64(gx.offset), I64(n0), *self._conv_dims(p),
                )  # fmt: skip

    def _exec_conv2d_backward_filter(self, p: v.ConvProblem) -> None:
        refuse_extensions("opencl", "conv2d_backward_filter", p)
        crs, spatial = p.c * p.fh * p.fw, p.oh * p.ow
        total = p.k * crs
        if total == 0:
            return
        with self._lock:
            if p.empty_output:
                self._fill(p.f, total)
                return
            vw, nr = _GEMM_TILE[F32]
            mr = 2 * vw
            x = self._input(p.x, [p.f])
            gy = self._input(p.y, [p.f])
            gf = self._at(p.f)
            # grad_filter^T (CRS x K) = sum over images of cols (CRS x S) @ grad_out^T (S x K):
            # one GEMM with k = images * S per chunk, accumulated with beta = 1 across chunks.
            a_panels, b_panels = _ceil_div(crs, mr), _ceil_div(p.k, nr)
            pack_a = self._conv_kernel("pack_a_cols_t")
            pack_b = self._conv_kernel("pack_b_grad_out")
            per_image = (a_panels * mr + b_panels * nr) * spatial * 4
            for n0, n1 in self._chunks(p.n, per_image):
                images = n1 - n0
                kk = images * spatial
                ap = self._scratch_buffer("ap", a_panels * mr * kk * 4)
                bp = self._scratch_buffer("bp", b_panels * nr * kk * 4)
                self._launch(
                    pack_a, (kk, a_panels), None,
                    x.buffer, I64(x.offset), I64(n0), I32(images), *self._conv_dims(p), ap,
                )  # fmt: skip
                self._launch(
                    pack_b, (kk, b_panels), None,
                    gy.buffer, I64(gy.offset), I64(n0), I32(images), I32(p.k), I32(p.oh), I32(p.ow), bp,
                )  # fmt: skip
                beta = 0.0 if n0 == 0 else 1.0
                self._panels(F32, crs, p.k, kk, 1.0, beta, 1, ap, 0, bp, 0, gf, 0, crs)

    # ------------------------------------------------------------------ attention

    def _exec_attention(self, p: v.AttentionProblem) -> None:
        refuse_extensions("opencl", "attention", p)
        if p.seq_q > np.iinfo(np.int32).max or p.seq_kv > np.iinfo(np.int32).max:
            raise InvalidArgumentError("seq_q and seq_kv must fit in 32 bits")
        with self._lock:
            q = self._input(p.q, [p.o])
            k = self._input(p.k, [p.o])
            val = self._input(p.v, [p.o])
            o = self._at(p.o)
            args = (
                q.buffer, I64(q.offset), k.buffer, I64(k.offset), val.buffer, I64(val.offset),
                o.buffer, I64(o.offset), I32(p.seq_q), I32(p.seq_kv), np.float32(p.scale), I32(int(p.causal)),
            )  # fmt: skip
            if self.vector_attention and p.head_dim <= _VEC_ATTN_MAX_DIM:
                bkv = 64 if p.head_dim <= 128 else 32
                kernel = self._kernel(
                    "attention", "attention_fwd_vec", HD=p.head_dim, BQ=_VEC_ATTN_BQ, BKV=bkv, VW=8
                )
                self._launch(kernel, (_ceil_div(p.seq_q, _VEC_ATTN_BQ), p.batch * p.heads), (1, 1), *args)
                return
            # K and V tiles of bkv rows must fit the device's local memory.
            bkv = min(64, self._local_mem // (8 * p.head_dim) - 1)
            if bkv < 1:
                raise UnsupportedError(
                    f"attention with head_dim {p.head_dim}: the device's {self._local_mem} bytes of local "
                    "memory cannot hold one key and value row"
                )
            bq = max(1, min(_ATTN_BQ, self._max_wg, _ATTN_PRIVATE // (8 * p.head_dim)))
            kernel = self._kernel("attention", "attention_fwd", HD=p.head_dim, BQ=bq, BKV=bkv)
            self._launch(
                kernel, (_round_up(p.seq_q, bq), p.batch * p.heads), (bq, 1),
                *args,
            )  # fmt: skip

    # ------------------------------------------------------------------ reductions

    def _rows_ls(self, length: int) -> int:
        """Work-group size of a row reduction / softmax over rows of ``length`` elements."""
        return self._reduce_ls_wide if length >= _WIDE_ROW else self._reduce_ls

    def _exec_reduce(self, p: v.AxisProblem) -> None:
        count = p.outer * p.inner
        if count == 0:
            return
        assert p.op is not None
        with self._lock:
            x = self._input(p.input, [p.output])
            y = self._at(p.output)
            code = I32(_REDUCE_CODES[p.op])
            if p.inner == 1:
                ls = self._rows_ls(p.length)
                kernel = self._kernel("reduce", "reduce_rows_split", LS=ls, CONTIG=self._contig)
                # Few long rows: split each across work-groups, then reduce the partials.
                chunks = 1
                if p.outer < 4 * self._compute_units and p.length >= 64 * ls:
                    chunks = min(p.length // (16 * ls), _ceil_div(16 * self._compute_units, p.outer))
                if chunks > 1:
                    partial = self._scratch_buffer("partials", p.outer * chunks * 4)
                    first = I32(_REDUCE_CODES[ReduceOp.SUM if p.op is ReduceOp.MEAN else p.op])
                    self._launch(
                        kernel, (p.outer * chunks * ls,), (ls,),
                        x.buffer, I64(x.offset), partial, I64(0), I64(p.length), first, I64(chunks), I64(0),
                    )  # fmt: skip
                    x, length = _Operand(partial, 0), chunks
                else:
                    length = p.length
                self._launch(
                    kernel, (p.outer * ls,), (ls,),
                    x.buffer, I64(x.offset), y.buffer, I64(y.offset),
                    I64(length), code, I64(1), I64(p.length),
                )  # fmt: skip
            else:
                kernel = self._kernel("reduce", "reduce_cols", LS=self._reduce_ls, CONTIG=self._contig)
                self._launch(
                    kernel, (count,), (min(64, self._max_wg),),
                    x.buffer, I64(x.offset), y.buffer, I64(y.offset),
                    I64(p.outer), I64(p.length), I64(p.inner), code,
                )  # fmt: skip

    def _exec_softmax(self, p: v.AxisProblem) -> None:
        refuse_extensions("opencl", "softmax", p)
        if p.outer * p.length * p.inner == 0:
            return
        with self._lock:
            x = self._input(p.input, [p.output], same_ok=True)
            y = self._at(p.output)
            if p.inner == 1:
                ls = self._rows_ls(p.length)
                kernel = self._kernel("reduce", "softmax_rows", LS=ls, CONTIG=self._contig)
                self._launch(
                    kernel, (p.outer * ls,), (ls,),
                    x.buffer, I64(x.offset), y.buffer, I64(y.offset), I64(p.length),
                )  # fmt: skip
            else:
                kernel = self._kernel("reduce", "softmax_cols", LS=self._reduce_ls, CONTIG=self._contig)
                self._launch(
                    kernel, (p.outer * p.inner,), (min(64, self._max_wg),),
                    x.buffer, I64(x.offset), y.buffer, I64(y.offset),
                    I64(p.outer), I64(p.length), I64(p.inner),
                )  # fmt: skip

    # ------------------------------------------------------------------ element-wise

    def _elementwise_local(self, n: int) -> int:
        return min(1024 if n >= (1 << 18) else 16, self._max_wg)

    def _exec_unary(self, p: v.ElementwiseProblem) -> None:
        refuse_extensions("opencl", "unary", p)
        if p.n == 0:
            return
        assert isinstance(p.op, UnaryOp)
        with self._lock:
            x = self._input(p.a, [p.out], same_ok=True)
            y = self._at(p.out)
            kernel = self._kernel("elementwise", f"unary_{p.op.value}", EW=self._ew)
            self._launch(
                kernel, (_ceil_div(p.n, self._ew),), (self._elementwise_local(p.n),),
                x.buffer, I64(x.offset), y.buffer, I64(y.offset), I64(p.n),
            )  # fmt: skip

    def _exec_binary(self, p: v.ElementwiseProblem) -> None:
        refuse_extensions("opencl", "binary", p)
        if p.n == 0:
            return
        assert isinstance(p.op, BinaryOp) and p.b is not None
        with self._lock:
            a = self._input(p.a, [p.out], same_ok=True)
            b = self._input(p.b, [p.out], same_ok=True)
            y = self._at(p.out)
            kernel = self._kernel("elementwise", f"binary_{p.op.value}", EW=self._ew)
            self._launch(
                kernel, (_ceil_div(p.n, self._ew),), (self._elementwise_local(p.n),),
                a.buffer, I64(a.offset), b.buffer, I64(b.offset), y.buffer, I64(y.offset), I64(p.n),
            )  # fmt: skip

    # ------------------------------------------------------------------ gather / scatter

    def _rows_local(self, cols: int) -> tuple[int, int]:
        lx = min(64, _round_up(cols, 8), self._max_wg)
        return lx, 1

    def _exec_gather(self, p: v.RowsProblem) -> None:
        refuse_extensions("opencl", "gather", p)
        assert p.indices is not None
        count = int(p.indices.size)
        if count == 0 or p.cols == 0:
            return
        with self._lock:
            x = self._input(p.input, [p.output])
            y = self._at(p.output)
            idx = self._upload_indices(p.indices)
            kernel = self._kernel("gather", "gather_rows")
            self._launch(
                kernel, (p.cols, count), self._rows_local(p.cols),
                x.buffer, I64(x.offset), idx, y.buffer, I64(y.offset), I64(p.cols), I64(count),
            )  # fmt: skip

    def _exec_scatter(self, p: v.RowsProblem) -> None:
        refuse_extensions("opencl", "scatter", p)
        assert p.indices is not None
        if p.indices.size == 0 or p.cols == 0:
            return
        # Index bookkeeping on the host: each destination row once, with the last source naming it.
        destinations, sources = v.last_occurrences(p.indices)
        count = int(destinations.size)
        with self._lock:
            x = self._input(p.input, [p.output])
            y = self._at(p.output)
            src = self._upload_indices(sources)
            dst = self._upload_indices(destinations)
            kernel = self._kernel("gather", "scatter_rows")
            self._launch(
                kernel, (p.cols, count), self._rows_local(p.cols),
                x.buffer, I64(x.offset), src, dst, y.buffer, I64(y.offset), I64(p.cols), I64(count),
            )  # fmt: skip
