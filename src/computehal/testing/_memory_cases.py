"""Memory (alloc / free / copy) and lifecycle cases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..backend import ComputeBackend
from ..errors import InvalidArgumentError, OutOfMemoryError, UnsupportedError
from ..types import Capabilities, DeviceInfo, TileShape
from ._common import Case, assert_bits_equal, frozen, rng_for
from .workspace import Workspace, expect_error

__all__ = ["memory_cases"]


def _pattern(label: str, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return rng_for(label).integers(0, 256, size=nbytes, dtype=np.uint8)


def _read(be: ComputeBackend, ptr: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    out = np.empty(nbytes, dtype=np.uint8)
    be.copy_dtoh(out, ptr)
    return out


class _Allocations:
    """Raw allocations freed on exit (for cases that test alloc / free themselves)."""

    def __init__(self, be: ComputeBackend) -> None:
        self.be = be
        self.live: list[int] = []

    def __enter__(self) -> _Allocations:
        return self

    def __exit__(self, *exc: object) -> None:
        for ptr in self.live:
            self.be.free(ptr)

    def alloc(self, nbytes: Any) -> int:
        ptr = self.be.alloc(nbytes)
        self.live.append(ptr)
        return ptr

    def free(self, ptr: int) -> None:
        self.live.remove(ptr)
        self.be.free(ptr)


# --------------------------------------------------------------------------- alloc


def _alloc_sizes(be: ComputeBackend) -> float:
    sizes = [1, 3, 63, 64, 65, 1000, 4097, 1 << 20]
    with _Allocations(be) as mem:
        ptrs = [mem.alloc(size) for size in sizes]
        for ptr, size in zip(ptrs, sizes, strict=True):
            if not isinstance(ptr, int) or isinstance(ptr, bool):
                raise AssertionError(f"alloc({size}) returned {type(ptr).__name__}, not int")
            if ptr == 0 or ptr % 64:
                raise AssertionError(f"alloc({size}) returned {ptr:#x}, not a non-zero multiple of 64")
        spans = sorted(zip(ptrs, sizes, strict=True))
        for (p0, s0), (p1, _) in zip(spans, spans[1:], strict=False):
            if p0 + s0 > p1:
                raise AssertionError(f"allocations at {p0:#x} ({s0} bytes) and {p1:#x} overlap")
        patterns = [_pattern(f"alloc-{size}", size) for size in sizes]
        for ptr, data in zip(ptrs, patterns, strict=True):
            be.copy_htod(ptr, data)
        for ptr, data in zip(ptrs, patterns, strict=True):
            assert_bits_equal(f"allocation of {data.size} bytes read back", _read(be, ptr, data.size), data)
    return 0.0


def _alloc_integer_types(be: ComputeBackend) -> float:
    with _Allocations(be) as mem:
        for size in (np.int64(96), np.uint32(40), np.int8(5)):
            ptr = mem.alloc(size)
            be.copy_htod(ptr, bytes(range(int(size))))
            assert_bits_equal(
                f"alloc({size!r})", _read(be, ptr, int(size)), np.arange(int(size), dtype=np.uint8)
            )
    return 0.0


def _alloc_many(be: ComputeBackend) -> float:
    with _Allocations(be) as mem:
        ptrs = [mem.alloc(100 + i) for i in range(200)]
        if len(set(ptrs)) != len(ptrs):
            raise AssertionError("alloc returned the same pointer twice for live allocations")
        for i, ptr in enumerate(ptrs[::7]):
            mem.free(ptr)
            again = mem.alloc(50)
            if again in mem.live[:-1]:
                raise AssertionError(f"alloc returned a live pointer {again:#x} (iteration {i})")
    return 0.0


def _alloc_bad(be: ComputeBackend, *, values: list[Any], expected: Any, what: str) -> float:
    for value in values:
        with expect_error(expected, f"alloc({value!r}) [{what}]"):
            ptr = be.alloc(value)
            be.free(ptr)
    return 0.0


# --------------------------------------------------------------------------- free


def _free_twice(be: ComputeBackend) -> float:
    ptr = be.alloc(128)
    be.free(ptr)
    with expect_error(InvalidArgumentError, "free of an already freed pointer (double free)"):
        be.free(ptr)
    return 0.0


def _free_interior(be: ComputeBackend) -> float:
    with _Allocations(be) as mem:
        ptr = mem.alloc(256)
        be.copy_htod(ptr, _pattern("interior", 256))
        for offset in (4, 64, 255, 256):
            with expect_error(InvalidArgumentError, f"free(base + {offset})"):
                be.free(ptr + offset)
        assert_bits_equal(
            "allocation after refused interior free", _read(be, ptr, 256), _pattern("interior", 256)
        )
    return 0.0


def _free_bad_values(be: ComputeBackend) -> float:
    for value in (0, 0x40, -64, 2**64, None, 1.5, "0x1000", b"1"):
        with expect_error(InvalidArgumentError, f"free({value!r})"):
            be.free(value)  # type: ignore[arg-type]
    return 0.0


def _free_keeps_others(be: ComputeBackend) -> float:
    with _Allocations(be) as mem:
        ptrs = [mem.alloc(300) for _ in range(3)]
        data = [_pattern(f"keep-{i}", 300) for i in range(3)]
        for ptr, d in zip(ptrs, data, strict=True):
            be.copy_htod(ptr, d)
        mem.free(ptrs[1])
        for i in (0, 2):
            assert_bits_equal(f"allocation {i} after freeing its neighbour", _read(be, ptrs[i], 300), data[i])
        refused: list[tuple[str, Callable[[], None]]] = [
            ("copy_htod to a freed pointer", lambda: be.copy_htod(ptrs[1], b"\x00" * 4)),
            ("copy_dtoh from a freed pointer", lambda: be.copy_dtoh(bytearray(4), ptrs[1])),
            ("zero-byte copy_htod to a freed pointer", lambda: be.copy_htod(ptrs[1], b"")),
            ("unary on a freed pointer", lambda: be.unary("neg", ptrs[1], ptrs[0], 4)),
        ]
        for what, call in refused:
            with expect_error(InvalidArgumentError, what):
                call()
        for i in (0, 2):
            assert_bits_equal(f"allocation {i} after refused calls", _read(be, ptrs[i], 300), data[i])
    return 0.0


# --------------------------------------------------------------------------- copies


def _copy_roundtrip(be: ComputeBackend) -> float:
    data = _pattern("roundtrip", 4096)
    sources: list[tuple[str, Any]] = [
        ("bytes", data.tobytes()),
        ("bytearray", bytearray(data.tobytes())),
        ("memoryview", memoryview(data.tobytes())),
        ("uint8 array", data.copy()),
        ("float32 2-D array", data.view(np.float32).reshape(32, 32)),
        ("float64 array", data.view(np.float64)),
        ("int16 memoryview", memoryview(data.view(np.int16))),  # type: ignore[arg-type]
    ]
    with _Allocations(be) as mem:
        ptr = mem.alloc(4096)
        for what, src in sources:
            be.copy_htod(ptr, np.zeros(4096, dtype=np.uint8))
            be.copy_htod(ptr, src)
            assert_bits_equal(f"copy_htod from {what}", _read(be, ptr, 4096), data)
        targets: list[tuple[str, Any, Callable[[Any], Any]]] = [
            ("bytearray", bytearray(4096), lambda t: np.frombuffer(t, dtype=np.uint8)),
            (
                "float32 2-D array",
                np.zeros((64, 16), dtype=np.float32),
                lambda t: t.view(np.uint8).reshape(-1),
            ),
            (
                "memoryview of bytearray",
                memoryview(bytearray(4096)),
                lambda t: np.frombuffer(t, dtype=np.uint8),
            ),
            ("float64 array", np.zeros(512), lambda t: t.view(np.uint8)),
        ]
        for what, target, as_bytes in targets:
            be.copy_dtoh(target, ptr)
            assert_bits_equal(f"copy_dtoh into {what}", as_bytes(target), data)
    return 0.0


def _copy_interior(be: ComputeBackend) -> float:
    data = _pattern("interior-copy", 1000)
    with _Allocations(be) as mem:
        ptr = mem.alloc(1000)
        be.copy_htod(ptr, np.zeros(1000, dtype=np.uint8))
        be.copy_htod(ptr + 13, data[13:500])
        be.copy_htod(ptr + 500, data[500:])
        expected = data.copy()
        expected[:13] = 0
        assert_bits_equal("pieces written at interior pointers", _read(be, ptr, 1000), expected)
        assert_bits_equal("read at interior pointer", _read(be, ptr + 999, 1), expected[999:])
        assert_bits_equal("read at interior pointer", _read(be, ptr + 37, 200), expected[37:237])
        part = bytearray(77)
        be.copy_dtoh(memoryview(part)[10:40], ptr + 100)
        if bytes(part[10:40]) != expected[100:130].tobytes() or any(part[:10]) or any(part[40:]):
            raise AssertionError("copy_dtoh into a memoryview slice wrote the wrong bytes")
    return 0.0


def _copy_zero_length(be: ComputeBackend) -> float:
    with _Allocations(be) as mem:
        ptr = mem.alloc(64)
        be.copy_htod(ptr, _pattern("zl", 64))
        be.copy_htod(ptr, b"")
        be.copy_htod(ptr + 32, np.zeros(0, dtype=np.float32))
        be.copy_dtoh(bytearray(), ptr)
        be.copy_dtoh(np.zeros(0), ptr + 8)
        assert_bits_equal("allocation after zero-length copies", _read(be, ptr, 64), _pattern("zl", 64))
    return 0.0


def _copy_large(be: ComputeBackend) -> float:
    data = _pattern("large", 8 << 20)
    with _Allocations(be) as mem:
        ptr = mem.alloc(data.size)
        be.copy_htod(ptr, data)
        assert_bits_equal("8 MiB round trip", _read(be, ptr, data.size), data)
    return 0.0


def _copy_bad(be: ComputeBackend) -> float:
    size = 256
    original = _pattern("copy-bad", size)
    with _Allocations(be) as mem:
        ptr = mem.alloc(size)
        be.copy_htod(ptr, original)
        freed = mem.alloc(size)
        mem.free(freed)
        bad: list[tuple[str, Callable[[], None]]] = [
            ("copy_htod one byte past the end", lambda: be.copy_htod(ptr, bytes(size + 1))),
            ("copy_htod at base+1 running one byte past", lambda: be.copy_htod(ptr + 1, bytes(size))),
            ("copy_htod at the end pointer", lambda: be.copy_htod(ptr + size, b"\x01")),
            ("copy_htod to 0", lambda: be.copy_htod(0, b"\x01")),
            ("copy_htod to an unknown pointer", lambda: be.copy_htod(0x40, b"\x01")),
            ("copy_htod to a freed pointer", lambda: be.copy_htod(freed, b"\x01")),
            ("copy_htod to None", lambda: be.copy_htod(None, b"\x01")),  # type: ignore[arg-type]
            ("copy_htod to a str pointer", lambda: be.copy_htod(str(ptr), b"\x01")),  # type: ignore[arg-type]
            ("copy_htod to a float pointer", lambda: be.copy_htod(float(ptr), b"\x01")),  # type: ignore[arg-type]
            ("copy_htod from a list", lambda: be.copy_htod(ptr, [1, 2, 3])),
            ("copy_htod from a str", lambda: be.copy_htod(ptr, "abc")),
            ("copy_htod from None", lambda: be.copy_htod(ptr, None)),
            ("copy_htod from an int", lambda: be.copy_htod(ptr, 5)),
            (
                "copy_htod from a strided array",
                lambda: be.copy_htod(ptr, np.arange(16, dtype=np.float32)[::2]),
            ),
            ("copy_htod from a Fortran array", lambda: be.copy_htod(ptr, np.ones((3, 4), order="F"))),
            ("copy_dtoh one byte past the end", lambda: be.copy_dtoh(bytearray(size + 1), ptr)),
            ("copy_dtoh at base+5 running past", lambda: be.copy_dtoh(bytearray(size), ptr + 5)),
            ("copy_dtoh from 0", lambda: be.copy_dtoh(bytearray(4), 0)),
            ("copy_dtoh from a freed pointer", lambda: be.copy_dtoh(bytearray(4), freed)),
            ("copy_dtoh from None", lambda: be.copy_dtoh(bytearray(4), None)),  # type: ignore[arg-type]
            ("copy_dtoh into bytes (read-only)", lambda: be.copy_dtoh(bytes(4), ptr)),
            ("copy_dtoh into a read-only array", lambda: be.copy_dtoh(_readonly(4), ptr)),
            (
                "copy_dtoh into a strided array",
                lambda: be.copy_dtoh(np.zeros(16, dtype=np.float32)[::2], ptr),
            ),
            ("copy_dtoh into a list", lambda: be.copy_dtoh([0, 0], ptr)),
            ("copy_dtoh into None", lambda: be.copy_dtoh(None, ptr)),
        ]
        for what, call in bad:
            with expect_error(InvalidArgumentError, what):
                call()
            assert_bits_equal(f"allocation after refused {what}", _read(be, ptr, size), original)
    return 0.0


# --------------------------------------------------------------------------- freeze


def _freeze_refuses_writes(be: ComputeBackend) -> float:
    """A frozen allocation: every write refused before it touches memory, reads as before."""
    size = 256
    original = _pattern("frozen", size)
    with _Allocations(be) as mem:
        ptr, other = mem.alloc(size), mem.alloc(size)
        be.copy_htod(ptr, original)
        be.copy_htod(other, np.zeros(size, dtype=np.uint8))
        if not frozen(be, ptr + 17):  # an interior pointer freezes its whole allocation
            return 0.0
        be.freeze(ptr)  # idempotent
        writes: list[tuple[str, Callable[[], None]]] = [
            ("copy_htod into it", lambda: be.copy_htod(ptr, bytes(size))),
            ("copy_htod at an interior pointer", lambda: be.copy_htod(ptr + 100, b"\x01")),
            ("copy_dtod into it", lambda: be.copy_dtod(ptr + 64, other, 64)),
            ("fill of it", lambda: be.fill(ptr, 8, 1.0)),
            ("an op writing it", lambda: be.unary("relu", other, ptr, 4)),
        ]
        for what, call in writes:
            with expect_error((InvalidArgumentError, UnsupportedError), what):
                call()
            assert_bits_equal(f"frozen allocation after refused {what}", _read(be, ptr, size), original)
        be.copy_dtod(other, ptr, size)  # reading it is unchanged
        assert_bits_equal("copy_dtod out of a frozen allocation", _read(be, other, size), original)
        view = be.host_view(ptr, size)
        if view is not None and not view.readonly:
            raise AssertionError("host_view of a frozen allocation is writable")
    return 0.0


def _freeze_bad(be: ComputeBackend) -> float:
    """Pointers that cannot be frozen: unknown, freed, past the end, of the wrong type, host-viewed."""
    with _Allocations(be) as mem:
        ptr = mem.alloc(64)
        if not frozen(be, ptr):
            return 0.0
        freed = mem.alloc(64)
        mem.free(freed)
        viewed = mem.alloc(64)
        bad: list[tuple[str, Any]] = [
            ("0", 0), ("an unknown pointer", 0x40), ("a freed pointer", freed), ("the end pointer", ptr + 64),
            ("None", None), ("a float", float(ptr)), ("a str", hex(ptr)), ("-1", -1), ("2**64", 2**64),
        ]  # fmt: skip
        if be.host_view(viewed, 64) is not None:
            bad.append(("an allocation of which a writable host view was handed out", viewed))
        for what, value in bad:
            with expect_error(InvalidArgumentError, f"freeze({what})"):
                be.freeze(value)
    return 0.0


def _readonly(n: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    arr = np.zeros(n, dtype=np.uint8)
    arr.setflags(write=False)
    return arr


# --------------------------------------------------------------------------- lifecycle


def _lifecycle_init_idempotent(be: ComputeBackend) -> float:
    with Workspace(be) as ws:
        ptr = ws.put(np.arange(10, dtype=np.float32), label="kept")
        be.init()
        be.init()
        if not be.is_initialized():
            raise AssertionError("is_initialized() is False after init()")
        got = ws.get(ptr, 10)
        assert_bits_equal("allocation across a repeated init()", got, np.arange(10, dtype=np.float32))
    return 0.0


def _lifecycle_introspection(be: ComputeBackend) -> float:
    name = be.name()
    if not isinstance(name, str) or not name:
        raise AssertionError(f"name() returned {name!r}")
    caps = be.capabilities()
    if not isinstance(caps, Capabilities):
        raise AssertionError(f"capabilities() returned {type(caps).__name__}")
    if caps.max_threads_per_block < 1 or caps.warp_size < 1 or caps.max_shared_mem_per_block < 0:
        raise AssertionError(f"implausible capabilities {caps}")
    devices = be.available_devices()
    if not isinstance(devices, list) or not all(isinstance(d, DeviceInfo) for d in devices):
        raise AssertionError(f"available_devices() returned {devices!r}")
    if len({d.ordinal for d in devices}) != len(devices):
        raise AssertionError("available_devices() returned duplicate ordinals")
    if be.synchronize() is not None:
        raise AssertionError("synchronize() returned a value")
    repr(be)
    return 0.0


def _lifecycle_tiles(be: ComputeBackend) -> float:
    for m, n, k in ((1, 1, 1), (64, 64, 64), (100, 200, 300), (4096, 4096, 4096), (0, 5, 5)):
        tile = be.recommended_tile_for(m, n, k)
        if not isinstance(tile, TileShape) or min(tile.tile_m, tile.tile_n, tile.tile_k) < 1:
            raise AssertionError(f"recommended_tile_for({m}, {n}, {k}) returned {tile!r}")
    for bad in ((-1, 4, 4), (4, None, 4), (4, 4, 2.5)):
        with expect_error(InvalidArgumentError, f"recommended_tile_for{bad}"):
            be.recommended_tile_for(*bad)
    for rows, depth, cols in ((1, 1, 1), (128, 768, 3072), (128, 768, 96), (4096, 64, 4096), (0, 0, 0)):
        width = be.gemm_weight_panel(rows, depth, cols)
        if type(width) is not int or width < 0 or (width and (cols % width or width > cols)):
            raise AssertionError(f"gemm_weight_panel({rows}, {depth}, {cols}) returned {width!r}")
    sizes: tuple[Any, Any, Any]
    for sizes, dtype in (((-1, 4, 4), "float32"), ((4, 4.0, 4), "float32"), ((4, 4, 4), "float33")):
        with expect_error(InvalidArgumentError, f"gemm_weight_panel{sizes} dtype={dtype}"):
            be.gemm_weight_panel(*sizes, dtype=dtype)
    return 0.0


def memory_cases() -> list[Case]:
    """Every alloc / free / copy / lifecycle case."""
    from functools import partial

    return [
        Case("alloc", "sizes-aligned-disjoint", _alloc_sizes),
        Case("alloc", "numpy-integer-sizes", _alloc_integer_types),
        Case("alloc", "many", _alloc_many),
        Case(
            "alloc", "bad-zero", partial(_alloc_bad, values=[0], expected=InvalidArgumentError, what="zero")
        ),
        Case(
            "alloc",
            "bad-negative",
            partial(_alloc_bad, values=[-1, -(2**40)], expected=InvalidArgumentError, what="negative"),
        ),
        Case(
            "alloc",
            "bad-types",
            partial(
                _alloc_bad,
                values=[1.5, 8.0, None, "8", [8], b"8"],
                expected=InvalidArgumentError,
                what="type",
            ),
        ),
        Case(
            "alloc",
            "bad-huge-out-of-memory",
            partial(_alloc_bad, values=[2**60], expected=OutOfMemoryError, what="larger than any device"),
        ),
        Case(
            "alloc",
            "bad-beyond-64-bit",
            partial(
                _alloc_bad,
                values=[2**64, 2**100],
                expected=(InvalidArgumentError, OutOfMemoryError),
                what="beyond 64 bits",
            ),
        ),
        Case("free", "bad-double-free", _free_twice),
        Case("free", "bad-interior-pointer", _free_interior),
        Case("free", "bad-values", _free_bad_values),
        Case("free", "keeps-others", _free_keeps_others),
        Case("copy", "roundtrip-buffer-types", _copy_roundtrip),
        Case("copy", "interior-pointers", _copy_interior),
        Case("copy", "zero-length", _copy_zero_length),
        Case("copy", "large-8MiB", _copy_large),
        Case("copy", "bad-ranges-and-buffers", _copy_bad),
        Case("freeze", "refuses-writes-keeps-reads", _freeze_refuses_writes),
        Case("freeze", "bad-pointers", _freeze_bad),
        Case("lifecycle", "init-idempotent", _lifecycle_init_idempotent),
        Case("lifecycle", "introspection", _lifecycle_introspection),
        Case("lifecycle", "recommended-tile", _lifecycle_tiles),
    ]
