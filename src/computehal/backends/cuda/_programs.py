"""Kernel units of the CUDA backend and their compilation: NVRTC with a disk cache.

A *unit* (:class:`KernelSource`) is one NVRTC compilation: a kernel file of
:mod:`computehal.kernels` built with fixed defines, as self-contained CUDA C++ text,
and the ``extern "C"`` kernels the backend launches from it. The functions below build
every unit the backend can use, each from one place, and :func:`kernel_sources` lists
them all (so the compile checks cover exactly what runs).

Compiled binaries are cached on disk (:func:`compile_cached`), keyed by a hash of the
source text, the NVRTC options, the target architecture and the NVRTC version, in
``$COMPUTEHAL_CUDA_CACHE`` or else ``$XDG_CACHE_HOME/computehal/cuda`` (by default
``~/.cache/computehal/cuda``). Entries are written atomically and carry a digest of their
contents; an entry that does not match it is compiled again. An unusable cache
directory only means compiling every time. No device is needed to compile.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import DeviceError
from ...kernels import kernel_source
from ...types import BinaryOp, UnaryOp
from .._common import head_bucket
from ._driver import import_cupy

__all__ = [
    "ATTENTION_BQ",
    "CONV_LS",
    "NVRTC_OPTIONS",
    "REDUCE_LS",
    "KernelSource",
    "Ptr",
    "attention_bkv",
    "attention_unit",
    "cache_dir",
    "cast_unit",
    "compile_cached",
    "compile_ptx",
    "conv_unit",
    "elementwise_unit",
    "kernel_sources",
    "movement_unit",
    "narrow_unit",
    "norm_unit",
    "nvrtc_compile",
    "pool_unit",
    "real_of",
    "reduce_unit",
    "target_arch",
]


class Ptr(int):
    """A device address passed to a kernel's pointer parameter (64 bits)."""

    __slots__ = ()


@dataclass(frozen=True)
class KernelSource:
    """One NVRTC compilation unit: exactly the text the CUDA backend compiles.

    Attributes
    ----------
    module : str
        Cache key of the compiled module (the file and its defines).
    code : str
        Self-contained CUDA C++ text: the op codes, build defines, then the kernel file
        with every ``#include "..."`` expanded in place.
    functions : tuple of str
        The ``extern "C"`` kernels the backend may launch from this unit.
    """

    module: str
    code: str
    functions: tuple[str, ...]


#: Prepended to every build: NVRTC (unlike nvcc) includes no C math header, so the C
#: macros the shared sources use are defined here (the dialect header does the same;
#: the CUDA-only ``.cu`` files do not include it).
_PRELUDE = """#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fc00000)
#endif
"""

#: Work-group size of the reduce / softmax row kernels and of the index-range fold (a power of two).
REDUCE_LS = 256
#: Query rows (threads) per attention block.
ATTENTION_BQ = 64
#: Bytes of static shared memory a block may declare (the attention kernel's K and V tiles).
_SHARED_BYTES = 48 * 1024

_REAL = {"float32": "float", "float64": "double"}


def real_of(dtype_name: str) -> str:
    """The C type of the arithmetic of ``dtype_name`` (``"float"`` or ``"double"``)."""
    return _REAL[dtype_name]


def _unit(filename: str, defines: Mapping[str, object], functions: Iterable[str]) -> KernelSource:
    """The build of kernel file ``filename`` with ``defines``."""
    try:
        text = kernel_source(filename, defines)
    except OSError as exc:
        raise DeviceError(f"kernel source {filename} is missing ({exc})") from exc
    variant = ",".join(f"{key}={value}" for key, value in sorted(defines.items()))
    code = f"// computehal CUDA build\n{_PRELUDE}{text}"
    return KernelSource(f"{filename}[{variant}]", code, tuple(functions))


def _real_defines(real: str) -> dict[str, object]:
    return {"REAL": "double", "USE_FP64": 1} if real == "double" else {"REAL": "float"}


@functools.cache
def narrow_unit() -> KernelSource:
    """The CUDA-only GEMM helpers: 16-bit narrowing for cuBLAS gemmEx, BLAS quick return."""
    return _unit("cuda_narrow.cu", {}, ("narrow_matrix", "scale_c_f32", "scale_c_f64"))


@functools.cache
def elementwise_unit(real: str) -> KernelSource:
    """unary / binary / broadcasting maps of every op, and the bit-pattern fills."""
    names = (
        *(f"unary_{op.value}" for op in UnaryOp),
        *(f"binary_{op.value}" for op in BinaryOp),
        *(f"broadcast_{op.value}" for op in BinaryOp),
        "fill_u16",
        "fill_u32",
        "fill_u64",
    )
    return _unit("elementwise.cl", _real_defines(real), names)


_SHORT = ("f16", "bf16", "f32", "f64")


@functools.cache
def cast_unit() -> KernelSource:
    """Conversions between every pair of float16, bfloat16, float32 and float64."""
    names = [f"cast_{a}_{b}" for a in _SHORT for b in _SHORT]
    return _unit("cast.cl", {"USE_FP64": 1}, names)


@functools.cache
def movement_unit() -> KernelSource:
    """Strided copies, row gather / scatter and the device-side index checks."""
    names = [f"copy_strided_{bits}" for bits in (16, 32, 64)]
    for index in ("i32", "i64"):
        names += [f"gather_{bits}_{index}" for bits in (16, 32, 64)]
        names += [f"scatter_won_{bits}_{index}" for bits in (16, 32, 64)]
        names += [f"index_range_{index}", f"scatter_claim_{index}"]
    names += [f"scatter_pairs_{bits}" for bits in (16, 32, 64)]
    return _unit("movement.cl", {"LS": REDUCE_LS}, names)


@functools.cache
def reduce_unit(real: str) -> KernelSource:
    """Reductions and (log-)softmax along an axis (``inner == 1``: a block per row)."""
    functions = ("reduce_rows", "reduce_rows_split", "reduce_cols", "softmax_rows", "softmax_cols")
    return _unit("reduce.cl", {**_real_defines(real), "LS": REDUCE_LS, "CONTIG": 0}, functions)


@functools.cache
def norm_unit(real: str) -> KernelSource:
    """Layer / RMS normalisation of rows (a block per row), batch normalisation and LRN."""
    functions = ("norm_rows", "batch_norm", "lrn")
    return _unit("norm.cl", {**_real_defines(real), "LS": REDUCE_LS, "CONTIG": 0}, functions)


@functools.cache
def pool_unit(real: str) -> KernelSource:
    """Max and average pooling, a thread per output pixel."""
    return _unit("pool.cl", _real_defines(real), ("pool2d",))


#: Threads per block of the convolution kernels that fold in shared memory.
CONV_LS = 64


@functools.cache
def conv_unit(real: str, vw: int) -> KernelSource:
    """Convolution operand packing for cuBLAS (panels of ``MR = 2 * vw`` rows), col2im, and
    the direct kernels (depthwise convolutions, border recomputation, bias)."""
    functions = (
        "pack_a_im2col", "pack_a_cols_t", "col2im", "conv_fwd_direct", "conv_bwd_data_direct",
        "conv_bwd_filter_direct", "nonfinite_rows", "nonfinite_border", "conv_bias",
    )  # fmt: skip
    return _unit("conv.cl", {**_real_defines(real), "VW": vw, "NR": 4, "LS": CONV_LS}, functions)


def attention_bkv(real: str, bucket: int) -> int:
    """Key rows per shared-memory tile of the attention kernel (K and V tiles within 48 KiB); 0 if
    not even one row fits."""
    size = 8 if real == "double" else 4
    return min(64, _SHARED_BYTES // (2 * size * bucket))


@functools.cache
def attention_unit(real: str, bucket: int) -> KernelSource:
    """Flash attention for head dimensions up to ``bucket`` (HD, a compile-time constant; the true
    head dimension is an argument), without the CPU-only vector kernel."""
    defines = {
        **_real_defines(real), "HD": bucket, "BQ": ATTENTION_BQ, "BKV": attention_bkv(real, bucket),
        "ATTENTION_NO_VEC": 1,
    }  # fmt: skip
    return _unit("attention.cl", defines, ("attention_fwd",))


#: Panel widths of the convolution packing (``VW``; MR = 2 * VW rows per panel).
CONV_WIDTHS = (8, 64)


def kernel_sources(head_dims: Iterable[int] = (64, 128)) -> list[KernelSource]:
    """Every compilation unit the CUDA backend builds, exactly as it builds them.

    Parameters
    ----------
    head_dims : iterable of int
        Attention is specialised per bucket of head dimensions (``head_bucket``); one unit per
        bucket the entries fall in, in float and double.

    Returns
    -------
    list of KernelSource
        The CUDA-only GEMM helpers, then every shared family in every build the backend
        uses (float32 and float64 where it has both).
    """
    units = [narrow_unit(), cast_unit(), movement_unit()]
    units += [elementwise_unit(real) for real in ("float", "double")]
    for real in ("float", "double"):
        units += [reduce_unit(real), norm_unit(real), pool_unit(real)]
        units += [conv_unit(real, vw) for vw in CONV_WIDTHS]
    buckets = sorted({head_bucket(int(hd)) for hd in head_dims})
    units += [attention_unit(real, hd) for real in ("float", "double") for hd in buckets]
    return units


# --------------------------------------------------------------------------- compilation

#: NVRTC options for every unit, at run time and in the compile checks alike. IEEE
#: semantics are spelled out: no flush-to-zero of denormals (CuPy's RawModule would add
#: ``-ftz=true``, which is why the backend drives NVRTC itself), exact division and sqrt.
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true")


def _nvrtc() -> Any:
    import_cupy()
    try:
        from cupy.cuda import nvrtc
    except Exception as exc:  # noqa: BLE001
        raise DeviceError(f"NVRTC is not loadable ({type(exc).__name__}: {exc})") from exc
    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor); :class:`DeviceError` when NVRTC is not usable."""
    nvrtc = _nvrtc()
    try:
        major, minor = nvrtc.getVersion()
    except Exception as exc:  # noqa: BLE001 - a missing libnvrtc surfaces here
        raise DeviceError(f"NVRTC is not usable ({type(exc).__name__}: {exc})") from exc
    return int(major), int(minor)


def nvrtc_compile(source: KernelSource, arch: str) -> bytes:
    """Compile ``source`` with NVRTC for ``arch`` (no cache; no device needed).

    Parameters
    ----------
    source : KernelSource
        One unit from :func:`kernel_sources`.
    arch : str
        ``"sm_XY"`` for a cubin or ``"compute_XY"`` for PTX.

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


def cache_dir() -> Path:
    """Where compiled units are cached (see the module docstring)."""
    override = os.environ.get("COMPUTEHAL_CUDA_CACHE")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "computehal" / "cuda"


_MAGIC = b"computehal-cuda-1\n"


def _cache_key(source: KernelSource, arch: str, version: tuple[int, int]) -> str:
    digest = hashlib.sha256()
    for part in (source.code, "\0".join(NVRTC_OPTIONS), arch, f"nvrtc {version[0]}.{version[1]}"):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0\1\0")
    return digest.hexdigest()


def _read_entry(path: Path) -> bytes | None:
    """The binary stored at ``path``, or None if it is missing or does not match its digest."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(_MAGIC) + 32
    if len(data) <= head or not data.startswith(_MAGIC):
        return None
    payload = data[head:]
    return payload if hashlib.sha256(payload).digest() == data[len(_MAGIC) : head] else None


def _write_entry(path: Path, binary: bytes) -> None:
    """Store ``binary`` at ``path`` atomically (a failure only means no cache entry)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(_MAGIC + hashlib.sha256(binary).digest() + binary)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


def compile_cached(source: KernelSource, arch: str) -> bytes:
    """:func:`nvrtc_compile` through the disk cache (a corrupt entry is compiled again)."""
    version = nvrtc_version()
    path = cache_dir() / f"{_cache_key(source, arch, version)}.{'cubin' if arch.startswith('sm_') else 'ptx'}"
    binary = _read_entry(path)
    if binary is None:
        binary = nvrtc_compile(source, arch)
        _write_entry(path, binary)
    return binary


def forget_cached(source: KernelSource, arch: str) -> None:
    """Remove the cache entry of ``source`` for ``arch`` (a binary the driver rejected)."""
    path = cache_dir() / f"{_cache_key(source, arch, nvrtc_version())}"
    for suffix in (".cubin", ".ptx"):
        try:
            path.with_suffix(suffix).unlink()
        except OSError:
            pass


def compile_ptx(source: KernelSource, arch: str = "compute_80") -> str:
    """The PTX NVRTC makes of ``source`` for virtual architecture ``arch`` (cached; no device).

    Raises
    ------
    DeviceError
        If NVRTC is missing or the source does not compile (with NVRTC's log).
    """
    return compile_cached(source, arch).rstrip(b"\0").decode("utf-8", "replace")


def target_arch(compute_capability: tuple[int, int]) -> str:
    """``sm_XY`` (a cubin) when NVRTC supports the device's architecture, else the newest PTX below it."""
    cc = compute_capability[0] * 10 + compute_capability[1]
    try:
        supported = {int(a) for a in _nvrtc().getSupportedArchs()}
    except Exception:  # noqa: BLE001 - old NVRTC without the query
        supported = set()
    if cc in supported:
        return f"sm_{cc}"
    lower = [a for a in supported if a <= cc]
    return f"compute_{max(lower) if lower else cc}"
