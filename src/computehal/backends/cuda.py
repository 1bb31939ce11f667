"""CudaBackend: NVIDIA GPUs (and AMD GPUs through CuPy's ROCm build) on CuPy.

Pointers are real device addresses handed out by CuPy's memory pool. GEMMs go
straight to cuBLAS through CuPy's pointer-level bindings (``dgemm`` / ``sgemm`` and
their strided-batched forms with the caller's transposes and leading dimensions,
``gemmEx`` with 16-bit inputs and float32 compute for mixed precision). Every other
operation runs the kernels in :mod:`computehal.kernels` — the same sources the OpenCL
backend runs — compiled with NVRTC through :class:`cupy.RawModule`, once per device.

Importing this module imports neither CuPy nor a GPU runtime; :meth:`CudaBackend.init`,
:meth:`~CudaBackend.capabilities` and :meth:`~CudaBackend.available_devices` raise
:class:`~computehal.DeviceError` carrying CuPy's own text when CuPy or a device is
missing (see :func:`unavailable_reason`).

All work is issued on the device's legacy default stream (kernels, cuBLAS and the
synchronous ``cudaMemcpy`` copies), so operations are ordered as they were called
and ``copy_dtoh`` sees every earlier result.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import validation as v
from ..backend import COMPUTE_OPS
from ..errors import DeviceError, InvalidArgumentError, OutOfMemoryError, UnsupportedError
from ..kernels import kernel_source
from ..memory import ALIGNMENT, Allocation, Region, as_count
from ..types import (
    BinaryOp,
    Capabilities,
    DeviceInfo,
    MemoryKind,
    MixedPrecision,
    UnaryOp,
)
from ._base import TableBackend, guarded
from ._common import REDUCE_CODES, refuse_extensions

__all__ = [
    "CudaBackend",
    "KernelSource",
    "kernel_sources",
    "compile_ptx",
    "nvrtc_compile",
    "NVRTC_OPTIONS",
    "unavailable_reason",
]

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)

# cuBLAS / CUDA library enums (stable across CUDA 11-13; CuPy exposes the same values).
_OP_N, _OP_T = 0, 1
_POINTER_MODE_HOST = 0
_DEFAULT_MATH = 0
_CUDA_R_32F, _CUDA_R_16F, _CUDA_R_16BF = 0, 2, 14
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1

#: CUDA limits on the y and z grid dimensions.
_GRID_YZ_MAX = 65535
_GRID_X_MAX = 2**31 - 1


# --------------------------------------------------------------------------- CuPy access


def _import_cupy() -> Any:
    """Import CuPy, turning any failure into :class:`DeviceError` with the original text."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - a broken install raises anything
        raise DeviceError(f"CuPy is not importable ({type(exc).__name__}: {exc})") from exc
    return cupy


def _device_count() -> int:
    """Number of visible devices; :class:`DeviceError` with CuPy's text when there are none."""
    cupy = _import_cupy()
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError, or a loader error
        raise DeviceError(f"no usable {_runtime_name(cupy)} device ({exc})") from exc
    if count < 1:
        raise DeviceError(f"no {_runtime_name(cupy)} device is visible")
    return count


def _runtime_name(cupy: Any) -> str:
    return "ROCm" if bool(getattr(cupy.cuda.runtime, "is_hip", False)) else "CUDA"


def unavailable_reason() -> str | None:
    """Why :class:`CudaBackend` cannot run here, or ``None`` when a device is usable.

    Touches the driver (device count) but allocates nothing.
    """
    try:
        _device_count()
    except DeviceError as exc:
        return exc.msg
    return None


# --------------------------------------------------------------------------- kernel sources


@dataclass(frozen=True)
class KernelSource:
    """One NVRTC compilation unit: exactly the text :class:`CudaBackend` compiles.

    Attributes
    ----------
    module : str
        Cache key of the compiled module (one per source file and build variant).
    code : str
        Self-contained CUDA C++ text: build defines, then the shared dialect header
        and the kernel file with every ``#include "..."`` expanded in place.
    functions : tuple of str
        The ``extern "C"`` kernels the backend launches from this module.
    """

    module: str
    code: str
    functions: tuple[str, ...]


#: Prepended to every shared kernel build: NVRTC (unlike nvcc) includes no C math header,
#: so the C macros the OpenCL-C sources use must be defined here.
_PRELUDE = """#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
"""


def _unit(filename: str, defines: Mapping[str, object], functions: tuple[str, ...]) -> KernelSource:
    """The build of shared kernel file ``filename`` with ``defines`` (a module per variant)."""
    try:
        text = kernel_source(filename, defines)
    except OSError as exc:
        raise DeviceError(f"kernel source {filename} is missing ({exc})") from exc
    variant = ",".join(f"{key}={value}" for key, value in defines.items())
    return KernelSource(f"{filename}[{variant}]", f"// computehal CUDA build\n{_PRELUDE}{text}", functions)


#: The CUDA-only GEMM helper unit: float32 -> f16 / bf16 narrowing for cuBLAS gemmEx and
#: BLAS quick return (``kernels/cuda_narrow.cu``).
NARROW = KernelSource(
    "narrow", _PRELUDE + kernel_source("cuda_narrow.cu"), ("narrow_matrix", "scale_c_f32", "scale_c_f64")
)


#: Work-group size of the reduce / softmax row kernels (a power of two).
_REDUCE_LS = 256
#: Query rows (threads) per attention block.
_ATTN_BQ = 64
#: Largest head_dim the attention kernel's static shared-memory tiles allow (2 * BKV * HD floats <= 48 KiB).
_ATTN_MAX_DIM = 6144


@functools.cache
def _elementwise_unit() -> KernelSource:
    names = (
        *(f"unary_{op.value}" for op in UnaryOp),
        *(f"binary_{op.value}" for op in BinaryOp),
        *(f"broadcast_{op.value}" for op in BinaryOp),
    )
    return _unit("elementwise.cl", {}, (*names, "fill_u16", "fill_u32", "fill_u64"))


@functools.cache
def _gather_unit() -> KernelSource:
    return _unit("movement.cl", {}, ("gather_32_i64", "scatter_pairs_32"))


@functools.cache
def _reduce_unit() -> KernelSource:
    return _unit(
        "reduce.cl", {"LS": _REDUCE_LS}, ("reduce_rows", "reduce_cols", "softmax_rows", "softmax_cols")
    )


@functools.cache
def _conv_unit(vw: int) -> KernelSource:
    # MR = 2 * VW rows per packed panel; the panels feed cuBLAS, so any VW works.
    return _unit(
        "conv.cl", {"REAL": "float", "VW": vw, "NR": 4}, ("pack_a_im2col", "pack_a_cols_t", "col2im")
    )


def _attention_bkv(head_dim: int) -> int:
    return max(1, min(64, 6144 // head_dim))


@functools.cache
def _attention_unit(head_dim: int) -> KernelSource:
    defines = {"HD": head_dim, "BQ": _ATTN_BQ, "BKV": _attention_bkv(head_dim), "VW": 8}
    return _unit("attention.cl", defines, ("attention_fwd",))


def kernel_sources(head_dims: Sequence[int] = (64, 128)) -> list[KernelSource]:
    """Every compilation unit :class:`CudaBackend` builds, exactly as it builds them.

    Parameters
    ----------
    head_dims : sequence of int
        Attention is specialised per head dimension; one unit per entry.

    Returns
    -------
    list of KernelSource
        The CUDA-only GEMM helpers, then the shared element-wise, gather / scatter,
        reduce / softmax, convolution (both panel heights) and attention builds.
    """
    units = [NARROW, _elementwise_unit(), _gather_unit(), _reduce_unit(), _conv_unit(8), _conv_unit(64)]
    units.extend(_attention_unit(int(hd)) for hd in head_dims)
    return units


# --------------------------------------------------------------------------- compilation


#: NVRTC options for every unit, at run time and in the compile checks alike. IEEE
#: semantics are spelled out: no flush-to-zero of denormals (CuPy's RawModule would add
#: ``-ftz=true``, which is why the backend drives NVRTC itself), exact division and sqrt.
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true")

_MODULES: dict[tuple[int, str], Any] = {}
_MODULES_LOCK = threading.Lock()


def _nvrtc() -> Any:
    _import_cupy()
    try:
        from cupy.cuda import nvrtc
    except Exception as exc:  # noqa: BLE001
        raise DeviceError(f"NVRTC is not loadable ({type(exc).__name__}: {exc})") from exc
    return nvrtc


def nvrtc_compile(source: KernelSource, arch: str) -> bytes:
    """Compile ``source`` with NVRTC for ``arch``; no device is needed.

    Parameters
    ----------
    source : KernelSource
        One unit from :func:`kernel_sources`.
    arch : str
        ``"sm_XY"`` for a cubin (what :class:`CudaBackend` loads when NVRTC knows the
        device's architecture) or ``"compute_XY"`` for PTX.

    Returns
    -------
    bytes
        The cubin or PTX.

    Raises
    ------
    DeviceError
        If NVRTC is missing or the source does not compile (with NVRTC's log).
    """
    nvrtc = _nvrtc()
    try:
        program = nvrtc.createProgram(source.code, f"{source.module}.cu", [], [])
    except Exception as exc:  # noqa: BLE001 - a missing libnvrtc surfaces here
        raise DeviceError(f"NVRTC is not usable ({type(exc).__name__}: {exc})") from exc
    try:
        try:
            nvrtc.compileProgram(program, [f"-arch={arch}", *NVRTC_OPTIONS])
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(program)
            raise DeviceError(f"kernel module {source.module!r} does not compile for {arch}:\n{log}") from exc
        binary = nvrtc.getCUBIN(program) if arch.startswith("sm_") else nvrtc.getPTX(program)
    finally:
        nvrtc.destroyProgram(program)
    return bytes(binary)


def compile_ptx(source: KernelSource, arch: str = "compute_80") -> str:
    """The PTX NVRTC makes of ``source`` for virtual architecture ``arch`` (no device needed).

    Raises
    ------
    DeviceError
        If NVRTC is missing or the source does not compile (with NVRTC's log).
    """
    return nvrtc_compile(source, arch).rstrip(b"\0").decode("utf-8", "replace")


def _target_arch(compute_capability: tuple[int, int]) -> str:
    """``sm_XY`` (cubin) when NVRTC supports the device's architecture, else the newest PTX below it."""
    cc = compute_capability[0] * 10 + compute_capability[1]
    try:
        supported = {int(a) for a in _nvrtc().getSupportedArchs()}
    except Exception:  # noqa: BLE001 - old NVRTC without the query
        supported = set()
    if cc in supported:
        return f"sm_{cc}"
    lower = [a for a in supported if a <= cc]
    return f"compute_{max(lower) if lower else cc}"


# --------------------------------------------------------------------------- capabilities


def _is_hip() -> bool:
    try:
        import cupy
    except Exception:  # noqa: BLE001
        return False
    return bool(getattr(cupy.cuda.runtime, "is_hip", False))


_NATIVE_OPS = frozenset(COMPUTE_OPS)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)


def _device_info(cupy: Any, ordinal: int, count: int) -> DeviceInfo:
    """A :class:`DeviceInfo` from the runtime's device properties."""
    runtime = cupy.cuda.runtime
    props = runtime.getDeviceProperties(ordinal)
    major, minor = int(props.get("major", 0)), int(props.get("minor", 0))
    peer = False
    for other in range(count):
        if other != ordinal:
            try:
                peer = peer or bool(runtime.deviceCanAccessPeer(ordinal, other))
            except Exception:  # noqa: BLE001 - a query failure means "no"
                pass
    if bool(getattr(runtime, "is_hip", False)):
        arch = _text(props.get("gcnArchName", "")).split(":", 1)[0]
        matrix_cores = arch.startswith(("gfx908", "gfx90a", "gfx94", "gfx95"))
        bf16 = matrix_cores or arch.startswith(("gfx11", "gfx12"))
        fp8 = arch.startswith(("gfx94", "gfx95", "gfx12"))
        tensor_cores, cluster, async_copy = matrix_cores, False, False
        fp16 = True
    else:
        cc = major * 10 + minor
        fp16, bf16, fp8 = cc >= 53, cc >= 80, cc >= 89
        tensor_cores, cluster, async_copy = cc >= 70, cc >= 90, cc >= 80
    caps = Capabilities(
        supports_fp16=fp16,
        supports_bf16=bf16,
        supports_fp8=fp8,
        tensor_cores=tensor_cores,
        peer_access=peer,
        unified_memory=bool(props.get("integrated", 0)),
        cluster_launch=cluster,
        async_copy=async_copy,
        max_threads_per_block=int(props.get("maxThreadsPerBlock", 1024)),
        max_shared_mem_per_block=int(props.get("sharedMemPerBlock", 49152)),
        warp_size=int(props.get("warpSize", 32)),
        supports_fp64=True,
        native_ops=_NATIVE_OPS,
    )
    return DeviceInfo(
        ordinal=ordinal,
        name=_text(props.get("name", f"device {ordinal}")),
        compute_capability=(major, minor),
        total_memory_bytes=int(props.get("totalGlobalMem", 0)),
        memory_kind=MemoryKind.UNIFIED if caps.unified_memory else MemoryKind.DEVICE,
        capabilities=caps,
    )


def _all_devices() -> list[DeviceInfo]:
    cupy = _import_cupy()
    count = _device_count()
    try:
        return [_device_info(cupy, i, count) for i in range(count)]
    except DeviceError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise DeviceError(f"querying {_runtime_name(cupy)} devices failed ({exc})") from exc


# --------------------------------------------------------------------------- launch arguments


def _p(ptr: int) -> np.uint64:
    return np.uint64(ptr)


def _i64(value: int) -> np.int64:
    return np.int64(value)


def _i32(value: int) -> np.int32:
    return np.int32(value)


def _linear_grid(total: int, block: int = 256, cap: int = 1 << 16) -> tuple[tuple[int], tuple[int]]:
    """Grid and block for a grid-stride loop over ``total`` items."""
    return (max(1, min(cap, -(-total // block))),), (block,)


class CudaBackend(TableBackend):
    """An NVIDIA (or, with CuPy's ROCm build, AMD) GPU through CuPy.

    Parameters
    ----------
    device : int, optional
        Device ordinal (default 0).

    Notes
    -----
    Constructing the backend touches nothing; :meth:`init` opens the device, creates
    a cuBLAS handle (host pointer mode, default math: no TF32) and raises
    :class:`~computehal.DeviceError` with CuPy's text when CuPy, the driver or the
    device is missing. Kernels are compiled with NVRTC on first use and cached per
    device for the life of the process (and on disk by CuPy).
    """

    def __init__(self, device: int = 0) -> None:
        super().__init__(device)
        self._ordinal = as_count("device", device)
        self._cupy: Any = None
        self._cublas: Any = None
        self._pool: Any = None
        self._handle = 0
        self._info: DeviceInfo | None = None
        self._blas_lock = threading.Lock()

    # ------------------------------------------------------------------ identity

    def name(self) -> str:
        return "rocm" if _is_hip() else "cuda"

    @property
    def device(self) -> int:
        """The device ordinal this backend runs on."""
        return self._ordinal

    def _device_record(self) -> DeviceInfo:
        if self._info is None:
            devices = _all_devices()
            if self._ordinal >= len(devices):
                raise DeviceError(
                    f"{self.name()} device {self._ordinal} does not exist ({len(devices)} visible)"
                )
            self._info = devices[self._ordinal]
        return self._info

    @guarded
    def capabilities(self) -> Capabilities:
        return self._with_dtypes(self._device_record().capabilities)

    def _native_dtypes(self) -> dict[str, frozenset[str]]:
        table = {op: frozenset({"float32"}) for op in COMPUTE_OPS}
        both = frozenset({"float32", "float64"})
        table.update(
            gemm=both, batched_gemm=both, copy_dtod=frozenset({"uint8"}), fill=frozenset({"float32"})
        )
        return table

    def _exec_copy_dtod(self, p: v.CopyProblem) -> None:
        self._copy_d2d(p.dst.ptr, p.src.ptr, p.nbytes)

    def _exec_fill(self, p: v.FillProblem) -> None:
        self._fill(p.region.ptr, p.count, p.value)

    @guarded
    def available_devices(self) -> list[DeviceInfo]:
        return _all_devices()

    @guarded
    def synchronize(self) -> None:
        self._memory()
        with self._on_device():
            self._cupy.cuda.runtime.deviceSynchronize()

    # ------------------------------------------------------------------ lifecycle

    def _open(self) -> None:
        cupy = _import_cupy()
        self._device_record()
        try:
            from cupy_backends.cuda.libs import cublas
        except Exception as exc:  # noqa: BLE001 - CuPy loads libcublas lazily
            raise DeviceError(f"cuBLAS is not loadable ({type(exc).__name__}: {exc})") from exc
        with cupy.cuda.Device(self._ordinal):
            handle = cublas.create()
            cublas.setPointerMode(handle, _POINTER_MODE_HOST)
            cublas.setMathMode(handle, _DEFAULT_MATH)
            cublas.setStream(handle, 0)
            pool = cupy.get_default_memory_pool()
        self._cupy, self._cublas, self._pool, self._handle = cupy, cublas, pool, handle

    @contextmanager
    def _on_device(self) -> Iterator[None]:
        with self._cupy.cuda.Device(self._ordinal):
            yield

    # ------------------------------------------------------------------ memory hooks

    def _free_bytes(self) -> int | None:
        try:
            with self._on_device():
                free = int(self._cupy.cuda.runtime.memGetInfo()[0])
            return free + int(self._pool.free_bytes())
        except Exception:  # noqa: BLE001 - only used for the error message
            return None

    def _malloc(self, nbytes: int) -> Any:
        """A pool allocation of ``nbytes`` (one retry after releasing cached blocks)."""
        with self._on_device():
            try:
                return self._pool.malloc(nbytes)
            except MemoryError:
                self._pool.free_all_blocks()
            try:
                return self._pool.malloc(nbytes)
            except MemoryError:
                raise OutOfMemoryError(nbytes, self._free_bytes()) from None

    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        memory = self._malloc(nbytes)
        base = int(memory.ptr)
        if base % ALIGNMENT == 0:
            return base, memory
        # CuPy's pool hands out 256-byte aligned blocks; keep the contract regardless.
        padded = self._malloc(nbytes + ALIGNMENT)
        base = int(padded.ptr)
        return base + (-base) % ALIGNMENT, padded

    def _release(self, allocation: Allocation) -> None:
        allocation.payload = None  # the MemoryPointer returns its block to the pool

    def _write(self, region: Region, data: memoryview) -> None:
        host = np.frombuffer(data, dtype=np.uint8)
        runtime = self._cupy.cuda.runtime
        with self._on_device():
            runtime.memcpy(region.ptr, host.ctypes.data, region.nbytes, runtime.memcpyHostToDevice)

    def _read(self, region: Region, out: memoryview) -> None:
        host = np.frombuffer(out, dtype=np.uint8)
        runtime = self._cupy.cuda.runtime
        with self._on_device():
            runtime.memcpy(host.ctypes.data, region.ptr, region.nbytes, runtime.memcpyDeviceToHost)

    def _copy_d2d(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            runtime = self._cupy.cuda.runtime
            with self._on_device():
                runtime.memcpy(dst, src, nbytes, runtime.memcpyDeviceToDevice)

    # ------------------------------------------------------------------ kernels

    def _kernel(self, source: KernelSource, function: str) -> Any:
        """The compiled ``function`` of ``source`` on this device (compiled once per device)."""
        key = (self._ordinal, source.module)
        with _MODULES_LOCK:
            module = _MODULES.get(key)
            if module is None:
                with self._on_device():
                    if _is_hip():
                        module = self._cupy.RawModule(code=source.code, options=("--std=c++17",))
                    else:
                        binary = nvrtc_compile(source, _target_arch(self._device_record().compute_capability))
                        module = self._cupy.cuda.function.Module()
                        module.load(binary)
                    for name in source.functions:
                        module.get_function(name)  # compile and load now, not mid-operation
                _MODULES[key] = module
        return module.get_function(function)

    def _launch(
        self,
        source: KernelSource,
        function: str,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[Any],
    ) -> None:
        """Launch ``function`` on the legacy default stream (ordered with cuBLAS and copies)."""
        dims = list(grid) + [1] * (3 - len(grid))
        if dims[0] > _GRID_X_MAX or dims[1] > _GRID_YZ_MAX or dims[2] > _GRID_YZ_MAX:
            raise UnsupportedError(
                f"{function}: launch grid {tuple(dims)} exceeds the CUDA limits "
                f"({_GRID_X_MAX}, {_GRID_YZ_MAX}, {_GRID_YZ_MAX})"
            )
        kernel = self._kernel(source, function)
        with self._on_device():
            kernel(tuple(dims), tuple(block), tuple(args), stream=self._cupy.cuda.Stream.null)

    # ------------------------------------------------------------------ GEMM

    def _scale_c(self, p: v.GemmProblem, c_ptr: int, stride_c: int = 0, batches: int = 1) -> None:
        """BLAS quick return ``C = beta * C`` (write-only when ``beta == 0``) for every batch."""
        f64 = p.dtype == F64
        beta = np.float64(p.beta) if f64 else _to_f32(p.beta)
        grid, block = _linear_grid(p.m * p.n * batches)
        args = (_p(c_ptr), _i64(p.ldc), _i64(stride_c), _i64(p.m), _i64(p.n), _i64(batches), beta)
        self._launch(NARROW, "scale_c_f64" if f64 else "scale_c_f32", grid, block, args)

    def _scalars(self, p: v.GemmProblem) -> tuple[Any, Any]:
        if p.dtype == F64:
            return np.array([p.alpha], dtype=F64), np.array([p.beta], dtype=F64)
        return np.array([_to_f32(p.alpha)], dtype=F32), np.array([_to_f32(p.beta)], dtype=F32)

    def _cublas_gemm(self, p: v.GemmProblem) -> None:
        alpha, beta = self._scalars(p)
        routine = self._cublas.dgemm if p.dtype == F64 else self._cublas.sgemm
        # cuBLAS leaves C overlapping A or B undefined: such an operand is read from a copy.
        keep: list[Any] = []
        a, b = self._operand(p.a, [p.c], keep), self._operand(p.b, [p.c], keep)
        with self._on_device(), self._blas_lock:
            routine(
                self._handle, _OP_T if p.trans_a else _OP_N, _OP_T if p.trans_b else _OP_N,
                p.m, p.n, p.k, alpha.ctypes.data, a, p.lda, b, p.ldb,
                beta.ctypes.data, p.c.ptr, p.ldc,
            )  # fmt: skip

    def _exec_gemm(self, p: v.GemmProblem) -> None:
        if p.empty:
            return
        if p.product_skipped:
            self._scale_c(p, p.c.ptr)
            return
        self._cublas_gemm(p)

    def _exec_batched_gemm(self, p: v.BatchedGemmProblem) -> None:
        if p.empty:
            return
        g = p.gemm
        if g.product_skipped:
            self._scale_c(g, p.c.ptr, p.stride_c, p.batch_count)
            return
        alpha_h, beta_h = self._scalars(g)
        routine = self._cublas.dgemmStridedBatched if g.dtype == F64 else self._cublas.sgemmStridedBatched
        size = g.dtype.itemsize
        keep: list[Any] = []
        a0, b0 = self._operand(p.a, [p.c], keep), self._operand(p.b, [p.c], keep)
        # cuBLAS takes the batch count as a 32-bit int: split larger batches.
        chunk = v.BLAS_INT_MAX
        with self._on_device(), self._blas_lock:
            for first in range(0, p.batch_count, chunk):
                count = min(chunk, p.batch_count - first)
                routine(
                    self._handle, _OP_T if g.trans_a else _OP_N, _OP_T if g.trans_b else _OP_N,
                    g.m, g.n, g.k, alpha_h.ctypes.data,
                    a0 + first * p.stride_a * size, g.lda, p.stride_a,
                    b0 + first * p.stride_b * size, g.ldb, p.stride_b,
                    beta_h.ctypes.data,
                    p.c.ptr + first * p.stride_c * size, g.ldc, p.stride_c,
                    count,
                )  # fmt: skip

    def _exec_gemm_mixed_precision(self, p: v.GemmProblem) -> None:
        fmt = p.prec
        assert fmt is not None
        if p.empty:
            return
        if p.product_skipped:
            self._scale_c(p, p.c.ptr)
            return
        caps = self._device_record().capabilities
        native = caps.supports_bf16 if fmt is MixedPrecision.BF16 else caps.supports_fp16
        # Native: 16-bit operands for gemmEx (products of two f16 / bf16 values are exact in
        # float32, accumulation is float32). Otherwise: operands rounded but kept in float32
        # for sgemm, which is the same arithmetic.
        mode = (1 if fmt is MixedPrecision.F16 else 2) + (0 if native else 2)
        a16 = self._narrowed(p.a, *p.a_shape, p.lda, mode)
        b16 = self._narrowed(p.b, *p.b_shape, p.ldb, mode)
        alpha_h = np.array([_to_f32(p.alpha)], dtype=F32)
        beta_h = np.array([_to_f32(p.beta)], dtype=F32)
        ta, tb = _OP_T if p.trans_a else _OP_N, _OP_T if p.trans_b else _OP_N
        lda16, ldb16 = p.a_shape[0], p.b_shape[0]
        with self._on_device(), self._blas_lock:
            if native:
                kind = _CUDA_R_16F if fmt is MixedPrecision.F16 else _CUDA_R_16BF
                self._cublas.gemmEx(
                    self._handle, ta, tb, p.m, p.n, p.k, alpha_h.ctypes.data,
                    int(a16.ptr), kind, lda16, int(b16.ptr), kind, ldb16,
                    beta_h.ctypes.data, p.c.ptr, _CUDA_R_32F, p.ldc, _COMPUTE_32F, _GEMM_DEFAULT,
                )  # fmt: skip
            else:
                self._cublas.sgemm(
                    self._handle, ta, tb, p.m, p.n, p.k, alpha_h.ctypes.data,
                    int(a16.ptr), lda16, int(b16.ptr), ldb16, beta_h.ctypes.data, p.c.ptr, p.ldc,
                )  # fmt: skip

    def _narrowed(self, region: Region, rows: int, cols: int, ld: int, mode: int) -> Any:
        """A compact column-major copy of a stored float32 matrix, rounded per ``mode``."""
        size = 2 if mode <= 2 else 4
        scratch = self._malloc(max(1, rows * cols) * size)
        grid, block = _linear_grid(rows * cols)
        args = (_p(region.ptr), _i64(ld), _i64(rows), _i64(cols), _p(int(scratch.ptr)), _i32(mode))
        self._launch(NARROW, "narrow_matrix", grid, block, args)
        return scratch

    # ------------------------------------------------------------------ helpers for kernel ops

    def _operand(
        self, region: Region, outputs: Sequence[Region], keep: list[Any], same_ok: bool = False
    ) -> int:
        """The address of an input, or of a device copy of it when it overlaps an output.

        ``same_ok`` accepts an output starting exactly at the input (element-wise kernels
        read each element before writing it). Copies are appended to ``keep``.
        """
        for out in outputs:
            if region.overlaps(out) and not (same_ok and out.offset == region.offset):
                copy = self._malloc(region.nbytes)
                keep.append(copy)
                self._copy_d2d(int(copy.ptr), region.ptr, region.nbytes)
                return int(copy.ptr)
        return region.ptr

    def _upload(self, values: Any, keep: list[Any]) -> int:
        """Copy an int64 index array to a device scratch buffer; returns its address."""
        data = np.ascontiguousarray(values, dtype=np.int64)
        memory = self._malloc(max(8, data.nbytes))
        keep.append(memory)
        runtime = self._cupy.cuda.runtime
        with self._on_device():
            runtime.memcpy(int(memory.ptr), data.ctypes.data, data.nbytes, runtime.memcpyHostToDevice)
        return int(memory.ptr)

    def _fill(self, ptr: int, count: int, value: float = 0.0) -> None:
        if count:
            grid = (-(-count // 256),)
            args = (_p(ptr), _i64(0), np.float32(value).view(np.uint32), _i64(count))
            self._launch(_elementwise_unit(), "fill_u32", grid, (256,), args)

    def _sgemm(
        self,
        ta: bool,
        tb: bool,
        m: int,
        n: int,
        k: int,
        a: int,
        lda: int,
        b: int,
        ldb: int,
        beta: float,
        c: int,
        ldc: int,
        batch: tuple[int, int, int, int] | None = None,
    ) -> None:
        """Float32 cuBLAS GEMM with alpha = 1 (``batch`` = strides a, b, c and count)."""
        one = np.array([1.0], dtype=F32)
        scale = np.array([beta], dtype=F32)
        oa, ob = _OP_T if ta else _OP_N, _OP_T if tb else _OP_N
        with self._on_device(), self._blas_lock:
            if batch is None:
                self._cublas.sgemm(
                    self._handle, oa, ob, m, n, k, one.ctypes.data, a, lda, b, ldb, scale.ctypes.data, c, ldc
                )
            else:
                sa, sb, sc, count = batch
                self._cublas.sgemmStridedBatched(
                    self._handle, oa, ob, m, n, k, one.ctypes.data, a, lda, sa, b, ldb, sb,
                    scale.ctypes.data, c, ldc, sc, count,
                )  # fmt: skip

    def _panel_gemm(
        self,
        mr: int,
        rows: int,
        n: int,
        k: int,
        ap: int,
        b: int,
        ldb: int,
        tb: bool,
        beta: float,
        c: int,
        ldc: int,
    ) -> None:
        """C (rows x n, ldc) = Ap @ op(B) where Ap holds ceil(rows / mr) packed mr x k panels.

        Full panels run as one strided-batched GEMM writing straight into C; a partial
        last panel runs as one more GEMM with only its valid rows.
        """
        full, rest = divmod(rows, mr)
        if full:
            self._sgemm(False, tb, mr, n, k, ap, mr, b, ldb, beta, c, ldc, (k * mr, 0, mr, full))
        if rest:
            self._sgemm(
                False, tb, rest, n, k, ap + full * k * mr * 4, mr, b, ldb, beta, c + full * mr * 4, ldc
            )

    @staticmethod
    def _chunks(total: int, per_item_bytes: int, most: int = _GRID_YZ_MAX) -> Iterator[tuple[int, int]]:
        """Split ``total`` items so one chunk's scratch stays under 256 MiB (at least one item)."""
        step = max(1, min(total, most, (256 << 20) // max(1, per_item_bytes)))
        for start in range(0, total, step):
            yield start, min(total, start + step)

    def _conv_dims(self, p: v.ConvProblem) -> tuple[np.int32, ...]:
        """conv.cl's CHAL_CONV_PARAMS for one group of all channels, no dilation."""
        dims = (0, p.c, p.c, p.h, p.w, p.fh, p.fw, p.oh, p.ow, p.sh, p.sw, p.ph, p.pw, 1, 1)
        return tuple(_i32(x) for x in dims)

    # ------------------------------------------------------------------ convolution

    def _exec_conv2d_forward(self, p: v.ConvProblem) -> None:
        refuse_extensions("cuda", "conv2d_forward", p)
        if p.empty_output:
            return
        crs, spatial = p.c * p.fh * p.fw, p.oh * p.ow
        if crs == 0:
            self._fill(p.y.ptr, p.n * p.k * spatial)
            return
        _check_int32("C * Fh * Fw", crs)
        keep: list[Any] = []
        x = self._operand(p.x, [p.y], keep)
        f = self._operand(p.f, [p.y], keep)
        vw = 64 if spatial >= 128 else 8
        mr = 2 * vw
        panels = -(-spatial // mr)
        ap_stride = panels * mr * crs
        unit = _conv_unit(vw)
        # Per image: out (S x K, column-major, ld S) = im2col^T (S x CRS) @ filter^T (CRS x K);
        # the filter stored K x CRS row-major is exactly filter^T column-major with ld CRS.
        for n0, n1 in self._chunks(p.n, ap_stride * 4):
            images = n1 - n0
            ap = self._malloc(ap_stride * images * 4)
            grid = (-(-crs // 64), panels, images)
            args = (_p(x), _i64(0), _i64(n0), *self._conv_dims(p), _p(int(ap.ptr)), _i64(ap_stride))
            self._launch(unit, "pack_a_im2col", grid, (64,), args)
            for b in range(images):
                out = p.y.ptr + (n0 + b) * p.k * spatial * 4
                self._panel_gemm(
                    mr, spatial, p.k, crs, int(ap.ptr) + b * ap_stride * 4, f, crs, False, 0.0, out, spatial
                )

    def _exec_conv2d_backward_data(self, p: v.ConvProblem) -> None:
        refuse_extensions("cuda", "conv2d_backward_data", p)
        total = p.n * p.c * p.h * p.w
        if total == 0:
            return
        if p.empty_output:
            self._fill(p.x.ptr, total)
            return
        crs, spatial = p.c * p.fh * p.fw, p.oh * p.ow
        _check_int32("C * Fh * Fw", crs)
        keep: list[Any] = []
        gy = self._operand(p.y, [p.x], keep)
        f = self._operand(p.f, [p.x], keep)
        unit = _conv_unit(8)
        # Column gradients per image: gcols (S x CRS, ld S) = grad_out (S x K, ld S) @ filter (K x CRS),
        # one strided-batched GEMM per chunk of images; col2im then folds them onto the input.
        for n0, n1 in self._chunks(p.n, crs * spatial * 4):
            images = n1 - n0
            gcols = self._malloc(crs * spatial * images * 4)
            self._sgemm(
                False, True, spatial, crs, p.k, gy + n0 * p.k * spatial * 4, spatial, f, crs, 0.0,
                int(gcols.ptr), spatial, (p.k * spatial, 0, crs * spatial, images),
            )  # fmt: skip
            grid = (-(-(p.h * p.w) // 64), p.c, images)
            args = (_p(int(gcols.ptr)), _p(p.x.ptr), _i64(0), _i64(n0), *self._conv_dims(p))
            self._launch(unit, "col2im", grid, (64,), args)

    def _exec_conv2d_backward_filter(self, p: v.ConvProblem) -> None:
        refuse_extensions("cuda", "conv2d_backward_filter", p)
        crs, spatial = p.c * p.fh * p.fw, p.oh * p.ow
        total = p.k * crs
        if total == 0:
            return
        if p.empty_output:
            self._fill(p.f.ptr, total)
            return
        _check_int32("Oh * Ow", spatial)
        keep: list[Any] = []
        x = self._operand(p.x, [p.f], keep)
        gy = self._operand(p.y, [p.f], keep)
        vw = 64 if crs >= 128 else 8
        mr = 2 * vw
        panels = -(-crs // mr)
        unit = _conv_unit(vw)
        ap = self._malloc(panels * mr * spatial * 4)
        # grad_filter^T (CRS x K, ld CRS) = sum over images of im2col (CRS x S) @ grad_out^T (S x K),
        # accumulated by cuBLAS with beta = 1 after the first image.
        for b in range(p.n):
            grid = (-(-spatial // 64), panels)
            args = (_p(x), _i64(0), _i64(b), _i32(1), *self._conv_dims(p), _p(int(ap.ptr)))
            self._launch(unit, "pack_a_cols_t", grid, (64,), args)
            out_b = gy + b * p.k * spatial * 4
            beta = 0.0 if b == 0 else 1.0
            self._panel_gemm(mr, crs, p.k, spatial, int(ap.ptr), out_b, spatial, False, beta, p.f.ptr, crs)

    # ------------------------------------------------------------------ attention

    def _exec_attention(self, p: v.AttentionProblem) -> None:
        refuse_extensions("cuda", "attention", p)
        _check_int32("seq_q", p.seq_q)
        _check_int32("seq_kv", p.seq_kv)
        if p.head_dim > _ATTN_MAX_DIM:
            raise UnsupportedError(f"attention with head_dim {p.head_dim} > {_ATTN_MAX_DIM} on {self.name()}")
        keep: list[Any] = []
        q = self._operand(p.q, [p.o], keep)
        k = self._operand(p.k, [p.o], keep)
        val = self._operand(p.v, [p.o], keep)
        unit = _attention_unit(p.head_dim)
        bh = p.batch * p.heads
        q_step, kv_step = p.seq_q * p.head_dim * 4, p.seq_kv * p.head_dim * 4
        blocks = -(-p.seq_q // _ATTN_BQ)
        # Heads go in grid y (at most 65535 per launch): launch per chunk of heads.
        for h0, h1 in self._chunks(bh, 0):
            # attention.cl's parameters: no mask; heads = group = 1 makes every (batch, head) of the
            # chunk its own key / value head.
            args = (
                _p(q + h0 * q_step), _i64(0), _p(k + h0 * kv_step), _i64(0), _p(val + h0 * kv_step), _i64(0),
                _p(p.o.ptr + h0 * q_step), _i64(0), _p(0), _i64(0), _i64(0), _i64(0), _i64(0), _i64(0),
                _i32(0), _i32(p.seq_q), _i32(p.seq_kv), _i32(p.head_dim), _to_f32(p.scale),
                _i32(int(p.causal)), _i32(1), _i32(1),
            )  # fmt: skip
            self._launch(unit, "attention_fwd", (blocks, h1 - h0), (_ATTN_BQ,), args)

    # ------------------------------------------------------------------ reductions

    def _exec_reduce(self, p: v.AxisProblem) -> None:
        count = p.outer * p.inner
        if count == 0:
            return
        assert p.op is not None
        keep: list[Any] = []
        x = self._operand(p.input, [p.output], keep)
        code = _i32(REDUCE_CODES[p.op])
        if p.inner == 1:
            args: tuple[Any, ...] = (_p(x), _i64(0), _p(p.output.ptr), _i64(0), _i64(p.length), code)
            self._launch(_reduce_unit(), "reduce_rows", (p.outer,), (_REDUCE_LS,), args)
        else:
            args = (
                _p(x),
                _i64(0),
                _p(p.output.ptr),
                _i64(0),
                _i64(p.outer),
                _i64(p.length),
                _i64(p.inner),
                code,
            )
            self._launch(_reduce_unit(), "reduce_cols", (-(-count // 128),), (128,), args)

    def _exec_softmax(self, p: v.AxisProblem) -> None:
        if p.outer * p.length * p.inner == 0:
            return
        keep: list[Any] = []
        x = self._operand(p.input, [p.output], keep, same_ok=True)
        if p.inner == 1:
            log = np.int32(int(p.log))
            args: tuple[Any, ...] = (_p(x), _i64(0), _p(p.output.ptr), _i64(0), _i64(p.length), log)
            self._launch(_reduce_unit(), "softmax_rows", (p.outer,), (_REDUCE_LS,), args)
        else:
            count = p.outer * p.inner
            args = (
                _p(x), _i64(0), _p(p.output.ptr), _i64(0), _i64(p.outer), _i64(p.length), _i64(p.inner),
                np.int32(int(p.log)),
            )  # fmt: skip
            self._launch(_reduce_unit(), "softmax_cols", (-(-count // 128),), (128,), args)

    # ------------------------------------------------------------------ element-wise

    def _exec_unary(self, p: v.ElementwiseProblem) -> None:
        if p.n == 0:
            return
        assert isinstance(p.op, UnaryOp)
        keep: list[Any] = []
        x = self._operand(p.a, [p.out], keep, same_ok=True)
        real = np.float32
        args = (_p(x), _i64(0), _p(p.out.ptr), _i64(0), _i64(p.n), real(p.alpha), real(p.lo), real(p.hi))
        self._launch(_elementwise_unit(), f"unary_{p.op.value}", (-(-p.n // 256),), (256,), args)

    def _exec_binary(self, p: v.ElementwiseProblem) -> None:
        if p.n == 0:
            return
        assert isinstance(p.op, BinaryOp) and p.b is not None
        keep: list[Any] = []
        a = self._operand(p.a, [p.out], keep, same_ok=True)
        b = self._operand(p.b, [p.out], keep, same_ok=True)
        args = (_p(a), _i64(0), _p(b), _i64(0), _p(p.out.ptr), _i64(0), _i64(p.n))
        self._launch(_elementwise_unit(), f"binary_{p.op.value}", (-(-p.n // 256),), (256,), args)

    # ------------------------------------------------------------------ gather / scatter

    def _exec_gather(self, p: v.RowsProblem) -> None:
        refuse_extensions("cuda", "gather", p)
        assert p.indices is not None
        count = int(p.indices.size)
        if count == 0 or p.cols == 0:
            return
        keep: list[Any] = []
        x = self._operand(p.input, [p.output], keep)
        idx = self._upload(p.indices, keep)
        block = min(256, -(-p.cols // 32) * 32)
        # Rows go in grid y (at most 65535 per launch).
        for r0, r1 in self._chunks(count, 0):
            args = (
                _p(x), _i64(0), _p(idx), _i64(r0), _p(p.output.ptr), _i64(r0 * p.cols), _i64(p.cols),
                _i64(r1 - r0),
            )  # fmt: skip
            self._launch(_gather_unit(), "gather_32_i64", (-(-p.cols // block), r1 - r0), (block,), args)

    def _exec_scatter(self, p: v.RowsProblem) -> None:
        refuse_extensions("cuda", "scatter", p)
        assert p.indices is not None
        if p.indices.size == 0 or p.cols == 0:
            return
        # Index bookkeeping on the host: each destination row once, with the last source naming it.
        destinations, sources = v.last_occurrences(p.indices)
        count = int(destinations.size)
        keep: list[Any] = []
        x = self._operand(p.input, [p.output], keep)
        src = self._upload(sources, keep)
        dst = self._upload(destinations, keep)
        block = min(256, -(-p.cols // 32) * 32)
        for r0, r1 in self._chunks(count, 0):
            args = (
                _p(x), _i64(0), _p(src), _p(dst), _i64(r0), _p(p.output.ptr), _i64(0),
                _i64(p.cols), _i64(r1 - r0),
            )  # fmt: skip
            self._launch(_gather_unit(), "scatter_pairs_32", (-(-p.cols // block), r1 - r0), (block,), args)


def _check_int32(name: str, value: int) -> None:
    if value > v.BLAS_INT_MAX:
        raise InvalidArgumentError(
            f"{name} = {value} exceeds the 32-bit limit of the CUDA kernels and cuBLAS"
        )


def _to_f32(value: float) -> np.float32:
    """``value`` as float32 (overflow to inf, as a C cast does)."""
    with np.errstate(over="ignore"):
        return np.float32(value)
