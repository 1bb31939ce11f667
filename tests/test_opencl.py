"""OpenCL-specific tests: device listing, capabilities, interior pointers, driver errors, the
bounded program cache, both attention kernels, both kernel profiles (the conformance kit in
the profile tests/test_conformance.py does not use), and regressions from hostile use.

The op-by-op comparisons run through ``tests/test_conformance.py`` (``opencl`` is in
``BACKEND_FACTORIES``); this file checks what only an OpenCL backend has. References are
independent NumPy definitions (einsum, explicit loops), never the backend under test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from computehal import (
    DeviceError,
    InvalidArgumentError,
    MemoryKind,
    NotInitializedError,
    OutOfMemoryError,
    TileShape,
    UnsupportedError,
)
from conftest import unavailable

try:
    import pyopencl

    from computehal.backends.opencl import OpenCLBackend, kernel_files, kernel_source, list_devices
except ImportError as error:  # pragma: no cover - exercised only without pyopencl
    IMPORT_ERROR: str | None = f"{type(error).__name__}: {error}"
else:
    IMPORT_ERROR = None


def _require_device() -> None:
    if IMPORT_ERROR is not None:
        unavailable("opencl", IMPORT_ERROR)
    if not list_devices():
        unavailable("opencl", "no OpenCL platform with a device (install pocl-binary-distribution)")


@pytest.fixture(scope="module")
def be() -> Iterator[Any]:
    """One initialised OpenCL backend for this module."""
    _require_device()
    backend = OpenCLBackend()
    backend.init()
    yield backend
    backend.close()


def put(backend: Any, array: np.ndarray[Any, Any], *, pad: int = 0) -> tuple[int, int]:
    """Allocate ``pad`` bytes + the array, copy it in after the pad; return (base, data pointer)."""
    base = backend.alloc(array.nbytes + pad)
    backend.copy_htod(base + pad, np.ascontiguousarray(array))
    return base, base + pad


def get(backend: Any, ptr: int, shape: Any, dtype: Any = np.float32) -> np.ndarray[Any, Any]:
    out = np.empty(shape, dtype=dtype)
    backend.copy_dtoh(out, ptr)
    return out


# --------------------------------------------------------------------------- devices


def test_every_platform_device_listed_with_real_properties() -> None:
    _require_device()
    expected = [d for p in pyopencl.get_platforms() for d in p.get_devices()]
    infos = OpenCLBackend().available_devices()
    assert len(infos) == len(expected)
    for ordinal, (info, dev) in enumerate(zip(infos, expected, strict=True)):
        assert info.ordinal == ordinal
        assert dev.name.strip() in info.name
        assert info.total_memory_bytes == dev.global_mem_size > 0
        caps = info.capabilities
        assert caps.max_threads_per_block == dev.max_work_group_size
        assert caps.max_shared_mem_per_block == dev.local_mem_size
        assert caps.supports_fp16 == ("cl_khr_fp16" in dev.extensions.split())
        assert caps.warp_size >= 1
        if dev.type & pyopencl.device_type.CPU:
            assert info.memory_kind is MemoryKind.HOST


def test_fp64_reported_from_the_extension() -> None:
    _require_device()
    for info, dev in zip(OpenCLBackend().available_devices(), list_devices(), strict=True):
        has_fp64 = "cl_khr_fp64" in dev.extensions.split() or bool(dev.double_fp_config)
        assert info.capabilities.supports_fp64 == has_fp64


def test_capabilities_before_init_and_not_initialized_errors() -> None:
    _require_device()
    backend = OpenCLBackend()
    assert backend.name() == "opencl"
    assert not backend.is_initialized()
    assert backend.capabilities().max_threads_per_block >= 1
    with pytest.raises(NotInitializedError):
        backend.alloc(64)
    with pytest.raises(NotInitializedError):
        backend.synchronize()


def test_filters_and_bad_ordinal() -> None:
    _require_device()
    dev = list_devices()[0]
    assert OpenCLBackend(device_filter=dev.name.strip()[:5]).available_devices()
    assert OpenCLBackend(platform=dev.platform.name[:6]).available_devices()
    assert OpenCLBackend(device_filter=lambda d: False).available_devices() == []
    missing = OpenCLBackend(device=len(list_devices()) + 3)
    with pytest.raises(DeviceError):
        missing.init()
    with pytest.raises(InvalidArgumentError):
        OpenCLBackend(device=-1)


def test_filters_of_the_wrong_type_or_that_raise_are_backend_errors() -> None:
    """Regression: ``OpenCLBackend(device_filter=5).capabilities()`` let AttributeError escape."""
    _require_device()
    with pytest.raises(InvalidArgumentError, match="device_filter"):
        OpenCLBackend(device_filter=5).capabilities()  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="platform"):
        OpenCLBackend(platform=3)  # type: ignore[arg-type]

    def broken(dev: Any) -> bool:
        raise KeyError("filter bug")

    backend = OpenCLBackend(device_filter=broken)
    assert backend.capabilities().max_threads_per_block >= 1  # the conservative profile
    with pytest.raises(DeviceError, match="filter bug"):
        backend.available_devices()
    with pytest.raises(DeviceError, match="filter bug"):
        backend.init()


def test_driver_errors_become_device_errors_with_the_driver_text(be: Any) -> None:
    from computehal.backends.opencl._runtime import ProgramCache, check

    cache = ProgramCache(be._context)
    with pytest.raises(DeviceError, match="while creating kernel no_such_kernel .*INVALID_KERNEL_NAME"):
        cache.kernel("movement.cl", "no_such_kernel", {})
    with pytest.raises(DeviceError, match="while testing: .*BUILD_PROGRAM_FAILURE"), check("testing"):
        pyopencl.Program(be._context, "__kernel void f(").build()
    with pytest.raises(DeviceError, match="movement.cl"):
        cache.kernel("movement.cl", "gather_32_i64", {"i64": "not a type ("})
    kernel = be._kernel("movement.cl", "gather_32_i64")
    too_big = be._max_wg * 2
    with pytest.raises(DeviceError, match="gather_32_i64"):
        be._launch(kernel, (too_big, 1), (too_big, 1), *([None] * 8))


def test_float64_unsupported_where_the_device_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _require_device()
    import computehal.backends.opencl._core as core

    monkeypatch.setattr(core, "has_fp64", lambda dev: False)
    with OpenCLBackend() as backend:
        assert "float64" not in backend.capabilities().dtypes("gemm")
        assert "float64" not in backend.capabilities().dtypes("softmax")
        base, _ = put(backend, np.eye(4))
        with pytest.raises(UnsupportedError, match="cl_khr_fp64"):
            backend.gemm("N", "N", 4, 4, 4, 1.0, base, 4, base, 4, 0.0, base, 4)


# --------------------------------------------------------------------------- memory


def test_interior_pointers_resolve_to_buffer_offsets(be: Any) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(300).astype(np.float32)
    y = rng.standard_normal(300).astype(np.float32)
    base = be.alloc(8192)
    try:
        be.copy_htod(base, np.zeros(8192, dtype=np.uint8))
        be.copy_htod(base + 64, x)
        be.copy_htod(base + 2048, y)
        be.binary("mul", base + 64 + 8, base + 2048 + 4, base + 4096, 290)
        np.testing.assert_array_equal(get(be, base + 4096, 290), x[2:292] * y[1:291])
        # Bytes around the written range are untouched.
        raw = get(be, base, 8192, np.uint8)
        assert raw[64 : 64 + 1200].tobytes() == x.tobytes()
        assert not raw[4096 - 64 : 4096].any() and not raw[4096 + 1160 :].any()
    finally:
        be.free(base)


def test_copies_are_exact_bytes_and_allocations_are_aligned(be: Any) -> None:
    data = bytes(range(256)) * 3 + b"\x7f"
    ptrs = [be.alloc(len(data)) for _ in range(4)]
    try:
        for ptr in ptrs:
            assert ptr % 64 == 0
        be.copy_htod(ptrs[1] + 0, data)
        out = bytearray(len(data))
        be.copy_dtoh(out, ptrs[1])
        assert bytes(out) == data
        with pytest.raises(InvalidArgumentError):
            be.copy_htod(ptrs[2] + 1, data)
    finally:
        for ptr in ptrs:
            be.free(ptr)


def test_allocation_failure_is_out_of_memory(be: Any) -> None:
    with pytest.raises(OutOfMemoryError):
        be.alloc(be._max_alloc + 1)


def test_free_and_double_free(be: Any) -> None:
    ptr = be.alloc(128)
    be.free(ptr)
    with pytest.raises(InvalidArgumentError):
        be.free(ptr)
    with pytest.raises(InvalidArgumentError):
        be.unary("relu", ptr, ptr, 4)


# --------------------------------------------------------------------------- programs


def test_programs_built_once_per_family_and_configuration() -> None:
    _require_device()
    backend = OpenCLBackend()
    backend.init()
    with backend:
        x = np.arange(16, dtype=np.float32)
        base, _ = put(backend, x)
        try:
            assert backend.program_builds == 0  # nothing is compiled before it is needed
            backend.unary("relu", base, base, 16)
            backend.binary("add", base, base, base, 16)
            backend.unary("exp", base, base, 16)
            assert backend.program_builds == 1  # one elementwise program serves every op
            backend.reduce("sum", base, base, [4, 4], 1)
            backend.reduce("max", base, base, [16], 0)
            assert backend.program_builds == 2
            backend.synchronize()
        finally:
            backend.free(base)


def test_kernel_sources_are_package_files_in_the_dialect() -> None:
    if IMPORT_ERROR is not None:
        unavailable("opencl", IMPORT_ERROR)
    from computehal.backends._common import UNARY_CODES
    from computehal.types import UnaryOp

    files = kernel_files()
    for name in (
        "dialect.h",
        "gemm.cl",
        "conv.cl",
        "attention.cl",
        "reduce.cl",
        "elementwise.cl",
        "movement.cl",
    ):
        assert name in files
    source = kernel_source("gemm.cl", {"VW": 8})
    assert "#include" not in source and "KERNEL void gemm_panels" in source
    # The op codes come first, numbered by the Python tables; then the build's defines.
    assert f"#define UNARY_GELU {UNARY_CODES[UnaryOp.GELU]}\n" in source
    assert source.index("#define UNARY_GELU") < source.index("#define VW 8") < source.index("gemm_panels")
    assert "__kernel" not in kernel_source("elementwise.cl").rsplit("COMPUTEHAL_DIALECT_H", 1)[1]
    with pytest.raises(FileNotFoundError):
        kernel_source("../backend.py")


def test_recommended_tile_is_the_kernel_tile(be: Any) -> None:
    import computehal.backends.opencl._gemm as module

    vw, nr = module.GEMM_TILE[np.dtype(np.float32)]
    tile = be.recommended_tile_for(1024, 1024, 1024)
    assert isinstance(tile, TileShape)
    assert tile.tile_m == 2 * vw and tile.tile_n % nr == 0 and tile.tile_k == 1
    assert tile.tile_n // nr == be._walk(-(-1024 // (2 * vw)), -(-1024 // nr), 1)
    small = be.recommended_tile_for(5, 3, 7)
    assert (small.tile_m, small.tile_n) == (2 * vw, nr)


# --------------------------------------------------------------------------- kernels


def _attention_reference(q: Any, k: Any, v: Any, scale: float, causal: bool) -> Any:
    scores = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) * scale
    sq, sk = q.shape[2], k.shape[2]
    visible = np.ones((sq, sk), dtype=bool)
    if causal:
        visible = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
    out = np.zeros(q.shape, dtype=np.float64)
    for i in range(sq):
        cols = np.flatnonzero(visible[i])
        if cols.size == 0:
            continue
        s = scores[:, :, i, cols]
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        out[:, :, i] = np.einsum("bhj,bhjd->bhd", w, v[:, :, cols].astype(np.float64))
    return out


@pytest.mark.parametrize("vector", [True, False], ids=["vector-kernel", "workgroup-kernel"])
@pytest.mark.parametrize(
    ("sq", "sk", "dim", "causal"),
    [(70, 33, 16, True), (33, 150, 24, True), (65, 65, 64, False), (5, 9, 3, False), (3, 40, 300, True)],
)
def test_attention_both_kernels(be: Any, vector: bool, sq: int, sk: int, dim: int, causal: bool) -> None:
    rng = np.random.default_rng(sq * 7 + sk)
    q = rng.standard_normal((2, 2, sq, dim)).astype(np.float32)
    k = rng.standard_normal((2, 2, sk, dim)).astype(np.float32)
    v = rng.standard_normal((2, 2, sk, dim)).astype(np.float32)
    saved = be.vector_attention
    ptrs = [put(be, a, pad=256)[0] for a in (q, k, v)]
    out = be.alloc(q.nbytes + 256)
    try:
        be.vector_attention = vector
        scale = 0.7 / np.sqrt(dim)
        be.attention(ptrs[0] + 256, ptrs[1] + 256, ptrs[2] + 256, out + 256, 2, 2, sq, sk, dim, scale, causal)
        got = get(be, out + 256, q.shape)
        np.testing.assert_allclose(got, _attention_reference(q, k, v, scale, causal), atol=2e-5, rtol=1e-4)
    finally:
        be.vector_attention = saved
        for ptr in [*ptrs, out]:
            be.free(ptr)


def test_gemm_beyond_one_register_tile_with_transposes_and_offsets(be: Any) -> None:
    rng = np.random.default_rng(5)
    m, n, k = 45, 70, 33
    a = rng.standard_normal((m + 3, k)).astype(np.float32)  # stored rows x cols, column-major below
    b = rng.standard_normal((n, k + 2)).astype(np.float32)
    c = rng.standard_normal((m + 1, n)).astype(np.float32)
    a_base, a_ptr = put(be, np.asfortranarray(a).T.copy(), pad=128)
    b_base, b_ptr = put(be, np.asfortranarray(b).T.copy(), pad=64)
    c_base, c_ptr = put(be, np.asfortranarray(c).T.copy(), pad=192)
    try:
        be.gemm("N", "T", m, n, k, 0.5, a_ptr, m + 3, b_ptr, n, 2.0, c_ptr, m + 1, dtype="float32")
        got = get(be, c_ptr, (n, m + 1)).T
        want = c.astype(np.float64).copy()
        want[:m] = 0.5 * np.einsum("ip,jp->ij", a[:m, :k], b[:, :k]) + 2.0 * c[:m]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(got[m], c[m])  # rows between m and ldc untouched
    finally:
        for ptr in (a_base, b_base, c_base):
            be.free(ptr)


def test_batched_gemm_is_one_launch(be: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    launches: list[str] = []
    original = be._launch

    def counting(kernel: Any, *args: Any) -> None:
        launches.append(kernel.function_name)
        original(kernel, *args)

    monkeypatch.setattr(be, "_launch", counting)
    rng = np.random.default_rng(9)
    batches, m, n, k = 5, 9, 7, 6
    a = rng.standard_normal((batches, k, m)).astype(np.float32)  # batch i: column-major m x k
    b = rng.standard_normal((batches, n, k)).astype(np.float32)
    a_base, _ = put(be, a)
    b_base, _ = put(be, b)
    c_base = be.alloc(batches * m * n * 4)
    try:
        be.batched_gemm(
            "N", "N", m, n, k, 1.0, a_base, m, m * k, b_base, k, k * n, 0.0, c_base, m, m * n, batches
        )
        assert launches.count("gemm_panels") == 1
        got = get(be, c_base, (batches, n, m))
        np.testing.assert_allclose(got, np.einsum("bpi,bjp->bji", a, b), rtol=1e-5, atol=1e-5)
    finally:
        for ptr in (a_base, b_base, c_base):
            be.free(ptr)


@pytest.mark.parametrize(("ta", "tb"), [("N", "N"), ("N", "T"), ("T", "N"), ("T", "T")])
def test_gemm_in_chunks_when_panels_exceed_scratch(
    be: Any, monkeypatch: pytest.MonkeyPatch, ta: str, tb: str
) -> None:
    import computehal.backends.opencl._gemm as module

    monkeypatch.setattr(module, "GEMM_SCRATCH", 4000)  # forces chunks of batches, rows and columns
    rng = np.random.default_rng(11)
    m, n, k, batches = 50, 45, 60, 3
    lda, ldb, ldc = (k if ta == "T" else m) + 1, (n if tb == "T" else k) + 2, m + 3
    a_cols, b_cols = (m if ta == "T" else k), (k if tb == "T" else n)
    sa, sb, sc = lda * a_cols + 5, ldb * b_cols + 7, ldc * n + 1
    a = rng.standard_normal(sa * batches).astype(np.float32)
    b = rng.standard_normal(sb * batches).astype(np.float32)
    c = rng.standard_normal(sc * batches).astype(np.float32)
    pa, pb, pc = (put(be, x)[0] for x in (a, b, c))
    try:
        be.batched_gemm(ta, tb, m, n, k, 0.7, pa, lda, sa, pb, ldb, sb, 0.3, pc, ldc, sc, batches)
        got = get(be, pc, c.shape)
        want = c.astype(np.float64)
        for i in range(batches):
            am = a[i * sa : i * sa + lda * a_cols].reshape(a_cols, lda).T
            bm = b[i * sb : i * sb + ldb * b_cols].reshape(b_cols, ldb).T
            op_a = am[:k, :m].T if ta == "T" else am[:m, :k]
            op_b = bm[:n, :k].T if tb == "T" else bm[:k, :n]
            cm = want[i * sc : i * sc + ldc * n].reshape(n, ldc).T
            cm[:m] = 0.7 * np.einsum("ip,pj->ij", op_a, op_b) + 0.3 * cm[:m]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    finally:
        for ptr in (pa, pb, pc):
            be.free(ptr)


def test_convolutions_in_chunks_of_images(be: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import computehal.backends.opencl._conv as module

    monkeypatch.setattr(module, "CONV_SCRATCH", 1)  # one image per chunk
    rng = np.random.default_rng(4)
    n, c, h, w, k, fh, fw = 3, 2, 6, 5, 3, 3, 2
    stride, pad = (2, 1), (1, 1)
    oh, ow = (h + 2 * pad[0] - fh) // stride[0] + 1, (w + 2 * pad[1] - fw) // stride[1] + 1
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    f = rng.standard_normal((k, c, fh, fw)).astype(np.float32)
    gy = rng.standard_normal((n, k, oh, ow)).astype(np.float32)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    want_y = np.zeros((n, k, oh, ow))
    want_gf = np.zeros(f.shape)
    want_gx = np.zeros(xp.shape)
    for i in range(oh):
        for j in range(ow):
            window = xp[:, :, i * stride[0] : i * stride[0] + fh, j * stride[1] : j * stride[1] + fw]
            want_y[:, :, i, j] = np.einsum("ncrs,kcrs->nk", window, f)
            want_gf += np.einsum("ncrs,nk->kcrs", window, gy[:, :, i, j])
            want_gx[:, :, i * stride[0] : i * stride[0] + fh, j * stride[1] : j * stride[1] + fw] += (
                np.einsum("nk,kcrs->ncrs", gy[:, :, i, j], f)
            )
    want_gx = want_gx[:, :, pad[0] : pad[0] + h, pad[1] : pad[1] + w]
    px, pf, pgy = (put(be, a)[0] for a in (x, f, gy))
    py, pgx, pgf = be.alloc(gy.nbytes), be.alloc(x.nbytes), be.alloc(f.nbytes)
    shapes = ([n, c, h, w], [k, c, fh, fw], [n, k, oh, ow])
    try:
        be.conv2d_forward(px, shapes[0], pf, shapes[1], py, shapes[2], list(stride), list(pad))
        be.conv2d_backward_data(pgy, shapes[2], pf, shapes[1], pgx, shapes[0], list(stride), list(pad))
        be.conv2d_backward_filter(px, shapes[0], pgy, shapes[2], pgf, shapes[1], list(stride), list(pad))
        np.testing.assert_allclose(get(be, py, gy.shape), want_y, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(get(be, pgx, x.shape), want_gx, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(get(be, pgf, f.shape), want_gf, rtol=1e-4, atol=1e-4)
    finally:
        for ptr in (px, pf, pgy, py, pgx, pgf):
            be.free(ptr)


def _fold_reference(op: str, x: Any, axis: int) -> Any:
    """Reductions written as explicit Python folds over the axis (fmax / fmin semantics)."""
    moved = np.moveaxis(x.astype(np.float64), axis, -1)
    out = np.empty(moved.shape[:-1])
    for index in np.ndindex(*out.shape):
        values = moved[index]
        if op in ("sum", "mean"):
            total = 0.0
            for value in values:
                total += value
            out[index] = total / len(values) if op == "mean" and len(values) else total
        else:
            acc = -np.inf if op == "max" else np.inf
            for value in values:
                if not np.isnan(value) and ((value > acc) if op == "max" else (value < acc)):
                    acc = value
            out[index] = acc
    return out


@pytest.mark.parametrize("contig", [1, 0], ids=["cpu-fold", "gpu-fold"])
@pytest.mark.parametrize(
    ("shape", "axis"), [((100003,), 0), ((3, 5000), 1), ((4, 37, 3), 1), ((2, 0), 1), ((6, 50), 0)]
)
def test_reduce_fold_variants(be: Any, contig: int, shape: tuple[int, ...], axis: int) -> None:
    rng = np.random.default_rng(len(shape) * 31 + shape[0])
    x = rng.standard_normal(shape).astype(np.float32)
    if x.size > 40:
        x.flat[[3, 39]] = np.nan
    saved = be._contig
    base, ptr = put(be, x, pad=128) if x.size else (be.alloc(64), 0)
    ptr = ptr or base
    out_shape = shape[:axis] + shape[axis + 1 :]
    out = be.alloc(max(4, int(np.prod(out_shape)) * 4))
    try:
        be._contig = contig
        for op in ("sum", "mean", "max", "min"):
            be.reduce(op, ptr, out, list(shape), axis)
            got = get(be, out, out_shape)
            np.testing.assert_allclose(got, _fold_reference(op, x, axis), rtol=2e-4, atol=2e-3, err_msg=op)
        if x.size:
            y = be.alloc(x.nbytes)
            try:
                be.softmax(ptr, y, list(shape), axis)
                moved = np.moveaxis(x.astype(np.float64), axis, -1)
                peak = _fold_reference("max", x, axis)[..., None]
                e = np.exp(moved - peak)
                want = np.moveaxis(e / e.sum(axis=-1, keepdims=True), -1, axis)
                np.testing.assert_allclose(get(be, y, shape), want, rtol=1e-4, atol=1e-6)
            finally:
                be.free(y)
    finally:
        be._contig = saved
        be.free(base)
        be.free(out)


@pytest.mark.parametrize("scratch", [1 << 28, 2000], ids=["one-chunk", "chunked"])
def test_batched_gemm_with_c_aliasing_a_reads_operands_first(
    be: Any, monkeypatch: pytest.MonkeyPatch, scratch: int
) -> None:
    import computehal.backends.opencl._gemm as module

    monkeypatch.setattr(module, "GEMM_SCRATCH", scratch)
    rng = np.random.default_rng(21)
    batches, m = 3, 20  # square: A_i and C_i are the same m x m matrix
    a = rng.standard_normal((batches, m, m)).astype(np.float32)
    b = rng.standard_normal((batches, m, m)).astype(np.float32)
    pa, _ = put(be, a)
    pb, _ = put(be, b)
    try:
        be.batched_gemm("N", "N", m, m, m, 1.0, pa, m, m * m, pb, m, m * m, 0.5, pa, m, m * m, batches)
        # Column-major batch i is a[i].T; the result, stored column-major, read back row-major:
        want = np.einsum("bpi,bjp->bji", a.astype(np.float64), b) + 0.5 * a
        np.testing.assert_allclose(get(be, pa, a.shape), want, rtol=1e-4, atol=1e-4)
    finally:
        be.free(pa)
        be.free(pb)


@pytest.mark.parametrize("ew", [16, 1], ids=["cpu-run", "gpu-one"])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 70001])
def test_elementwise_variants(be: Any, ew: int, n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    x[:: max(1, n // 7)] = np.nan if n > 1 else x[0]
    saved = be._ew
    base_x, px = put(be, x, pad=4)  # element-aligned, not vector-aligned
    base_y, py = put(be, y, pad=12)
    out = be.alloc(n * 4 + 8)
    try:
        be._ew = ew
        be.unary("relu", px, out + 8, n)
        relu = np.array([v if v > 0 else 0.0 for v in x], dtype=np.float32)  # NaN -> 0
        np.testing.assert_array_equal(get(be, out + 8, n), relu)
        be.binary("max", px, py, out + 8, n)
        fmax = np.array(
            [b if np.isnan(a) else (a if np.isnan(b) or a >= b else b) for a, b in zip(x, y, strict=True)]
        )
        np.testing.assert_array_equal(get(be, out + 8, n), fmax.astype(np.float32))
        be.binary("sub", px, py, px, n)  # output aliases the first input exactly
        np.testing.assert_array_equal(get(be, px, n), x - y)
    finally:
        be._ew = saved
        for ptr in (base_x, base_y, out):
            be.free(ptr)


# --------------------------------------------------------------------------- kernel profiles


@pytest.fixture(scope="module")
def gpu_be() -> Iterator[Any]:
    """One OpenCL backend with the GPU kernel profile forced (work-group tiled GEMM)."""
    _require_device()
    backend = OpenCLBackend(kernel_profile="gpu")
    backend.init()
    yield backend
    backend.close()


@pytest.fixture(params=["cpu", "gpu"])
def profiled(request: pytest.FixtureRequest, be: Any, gpu_be: Any) -> Any:
    """The module backend of each kernel profile (``be`` is the CPU profile on PoCL's CPU device)."""
    if request.param == "gpu":
        return gpu_be
    if be.kernel_profile != "cpu":
        pytest.skip("device 0 is a GPU: the CPU profile is covered only when forced")
    return be


def test_kernel_profile_chosen_by_device_type_or_forced(gpu_be: Any) -> None:
    dev = list_devices()[0]
    gpu_like = bool(dev.type & (pyopencl.device_type.GPU | pyopencl.device_type.ACCELERATOR))
    with OpenCLBackend() as backend:
        assert backend.kernel_profile == ("gpu" if gpu_like else "cpu")
    with OpenCLBackend(kernel_profile="cpu") as backend:
        assert backend.kernel_profile == "cpu" and backend.vector_attention and backend._ew > 1
    assert gpu_be.kernel_profile == "gpu"
    assert not gpu_be.vector_attention and gpu_be._ew == 1 and gpu_be._contig == 0
    for bad in ("GPU", "fast", 1):
        with pytest.raises(InvalidArgumentError):
            OpenCLBackend(kernel_profile=bad)


def test_gpu_profile_recommended_tile_is_the_work_group_tile(gpu_be: Any) -> None:
    tsx, tsy, wm, wn, tk = gpu_be._wg_tile
    assert tsx * tsy <= gpu_be.capabilities().max_threads_per_block
    for shape in ((1024, 1024, 1024), (5, 3, 7)):
        assert gpu_be.recommended_tile_for(*shape) == TileShape(tsx * wm, tsy * wn, tk)


def test_conformance_kit_in_the_other_kernel_profile() -> None:
    """tests/test_conformance.py runs the kit on device 0 in its default kernel profile; this
    runs it in the other profile, so both profiles' kernels meet every case."""
    _require_device()
    from computehal.backends.opencl._device import profile_of
    from computehal.testing import run_conformance

    other = "gpu" if profile_of(list_devices()[0]) == "cpu" else "cpu"
    with OpenCLBackend(kernel_profile=other) as backend:
        report = run_conformance(backend)
    assert report.passed, report.summary()


def _op(stored: np.ndarray[Any, Any], trans: str, rows: int, cols: int) -> np.ndarray[Any, Any]:
    """op(X) (rows x cols) of a column-major matrix given as its row-major transpose ``stored``."""
    x = stored.T  # column-major ld x columns, as a NumPy (ld, columns) view
    return x[:cols, :rows].T if trans in "TC" else x[:rows, :cols]


ODD = (1, 15, 17, 33, 127)
PAIRS = [(ta, tb) for ta in "NTC" for tb in "NTC"]


@pytest.mark.parametrize(("ta", "tb"), PAIRS, ids=[f"{ta}{tb}" for ta, tb in PAIRS])
def test_gemm_odd_sizes_every_transpose_pair(profiled: Any, ta: str, tb: str) -> None:
    """Every (m, n, k) in ODD^3 with leading dimensions above the stored rows, float32."""
    be = profiled
    rng = np.random.default_rng(ord(ta) * 3 + ord(tb))
    top = max(ODD) + 3
    a_store, b_store, c_store = (be.alloc(top * top * 4 + 64) for _ in range(3))
    try:
        for m in ODD:
            for n in ODD:
                for k in ODD:
                    a_rows, a_cols = (k, m) if ta in "TC" else (m, k)
                    b_rows, b_cols = (n, k) if tb in "TC" else (k, n)
                    lda, ldb, ldc = a_rows + 1, b_rows + 3, m + 2
                    a = rng.standard_normal((a_cols, lda)).astype(np.float32)
                    b = rng.standard_normal((b_cols, ldb)).astype(np.float32)
                    c = rng.standard_normal((n, ldc)).astype(np.float32)
                    for ptr, x in ((a_store, a), (b_store, b), (c_store, c)):
                        be.copy_htod(ptr + 64 if ptr == a_store else ptr, x)
                    alpha, beta = 0.75, (0.0 if (m + n + k) % 2 else -1.5)
                    be.gemm(
                        ta,
                        tb,
                        m,
                        n,
                        k,
                        alpha,
                        a_store + 64,
                        lda,
                        b_store,
                        ldb,
                        beta,
                        c_store,
                        ldc,
                        dtype="float32",
                    )
                    got = get(be, c_store, c.shape)
                    want = c.astype(np.float64).T.copy()
                    prod = np.einsum(
                        "ip,pj->ij", _op(a, ta, m, k).astype(np.float64), _op(b, tb, k, n).astype(np.float64)
                    )
                    want[:m] = alpha * prod + beta * want[:m]
                    np.testing.assert_allclose(got.T, want, rtol=1e-4, atol=2e-4, err_msg=f"{m}x{n}x{k}")
    finally:
        for ptr in (a_store, b_store, c_store):
            be.free(ptr)


@pytest.mark.parametrize(("ta", "tb"), [("N", "N"), ("T", "N"), ("N", "T"), ("T", "T")])
@pytest.mark.parametrize("shape", [(1, 1, 1), (17, 33, 15), (127, 65, 70), (64, 64, 64)])
def test_gpu_profile_float64_gemm(gpu_be: Any, ta: str, tb: str, shape: tuple[int, int, int]) -> None:
    if not gpu_be.capabilities().supports_fp64:
        pytest.skip("the device has no double precision")
    m, n, k = shape
    rng = np.random.default_rng(m * n + k)
    a_rows, a_cols = (k, m) if ta == "T" else (m, k)
    b_rows, b_cols = (n, k) if tb == "T" else (k, n)
    a = rng.standard_normal((a_cols, a_rows + 2))
    b = rng.standard_normal((b_cols, b_rows + 1))
    c = rng.standard_normal((n, m + 4))
    pa, pb, pc = (put(gpu_be, x)[0] for x in (a, b, c))
    try:
        gpu_be.gemm(ta, tb, m, n, k, -1.25, pa, a_rows + 2, pb, b_rows + 1, 0.5, pc, m + 4, dtype="float64")
        want = c.T.copy()
        want[:m] = -1.25 * np.einsum("ip,pj->ij", _op(a, ta, m, k), _op(b, tb, k, n)) + 0.5 * want[:m]
        np.testing.assert_allclose(get(gpu_be, pc, c.shape, np.float64).T, want, rtol=1e-12, atol=1e-12)
    finally:
        for ptr in (pa, pb, pc):
            gpu_be.free(ptr)


def test_gpu_profile_beta_zero_never_reads_c(gpu_be: Any) -> None:
    rng = np.random.default_rng(3)
    m, n, k = 70, 19, 40
    a = rng.standard_normal((k, m)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)
    c = np.full((n, m), np.nan, dtype=np.float32)
    pa, pb, pc = (put(gpu_be, x)[0] for x in (a, b, c))
    try:
        gpu_be.gemm("N", "N", m, n, k, 2.0, pa, m, pb, k, 0.0, pc, m, dtype="float32")
        want = 2.0 * np.einsum("pi,jp->ji", a.astype(np.float64), b)
        np.testing.assert_allclose(get(gpu_be, pc, c.shape), want, rtol=1e-4, atol=1e-4)
    finally:
        for ptr in (pa, pb, pc):
            gpu_be.free(ptr)


def test_gpu_profile_batched_gemm_is_one_launch(gpu_be: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    launches: list[str] = []
    original = gpu_be._launch

    def counting(kernel: Any, *args: Any) -> None:
        launches.append(kernel.function_name)
        original(kernel, *args)

    monkeypatch.setattr(gpu_be, "_launch", counting)
    rng = np.random.default_rng(19)
    batches, m, n, k = 6, 67, 18, 33
    a = rng.standard_normal((batches, m, k)).astype(np.float32)  # batch i: op(A) = a[i] ("T")
    b = rng.standard_normal((batches, n, k)).astype(np.float32)  # batch i: column-major k x n
    pa, pb = put(gpu_be, a)[0], put(gpu_be, b)[0]
    pc = gpu_be.alloc(batches * m * n * 4)
    try:
        gpu_be.batched_gemm(
            "T", "N", m, n, k, 1.0, pa, k, m * k, pb, k, k * n, 0.0, pc, m, m * n, batches, dtype="float32"
        )
        assert launches == ["gemm_wg"]
        got = get(gpu_be, pc, (batches, n, m))
        np.testing.assert_allclose(got, np.einsum("bip,bjp->bji", a, b), rtol=1e-4, atol=1e-4)
    finally:
        for ptr in (pa, pb, pc):
            gpu_be.free(ptr)


def test_gpu_profile_batched_gemm_with_c_aliasing_a(gpu_be: Any) -> None:
    rng = np.random.default_rng(23)
    batches, m = 3, 70
    a = rng.standard_normal((batches, m, m)).astype(np.float32)
    b = rng.standard_normal((batches, m, m)).astype(np.float32)
    pa, pb = put(gpu_be, a)[0], put(gpu_be, b)[0]
    try:
        gpu_be.batched_gemm(
            "N", "N", m, m, m, 1.0, pa, m, m * m, pb, m, m * m, 0.5, pa, m, m * m, batches, dtype="float32"
        )
        want = np.einsum("bpi,bjp->bji", a.astype(np.float64), b) + 0.5 * a
        np.testing.assert_allclose(get(gpu_be, pa, a.shape), want, rtol=1e-4, atol=1e-4)
    finally:
        gpu_be.free(pa)
        gpu_be.free(pb)


@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_gpu_profile_mixed_precision_rounds_operands(gpu_be: Any, fmt: str) -> None:
    import ml_dtypes

    narrow = np.float16 if fmt == "f16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(29)
    m, n, k = 33, 70, 17
    a = (rng.standard_normal((k, m)) * 3).astype(np.float32)
    b = (rng.standard_normal((n, k)) * 3).astype(np.float32)
    c = rng.standard_normal((n, m)).astype(np.float32)
    pa, pb, pc = (put(gpu_be, x)[0] for x in (a, b, c))
    try:
        gpu_be.gemm_mixed_precision(fmt, "N", "N", m, n, k, 1.0, pa, m, pb, k, 0.25, pc, m)
        ra = a.astype(narrow).astype(np.float64)
        rb = b.astype(narrow).astype(np.float64)
        want = np.einsum("pi,jp->ji", ra, rb) + 0.25 * c
        np.testing.assert_allclose(get(gpu_be, pc, c.shape), want, rtol=1e-5, atol=1e-4)
    finally:
        for ptr in (pa, pb, pc):
            gpu_be.free(ptr)


@pytest.mark.parametrize("shape", [(3, 4095), (2, 4096), (5, 9000), (300001,)])
def test_gpu_profile_wide_row_reductions_and_softmax(gpu_be: Any, shape: tuple[int, ...]) -> None:
    """Rows of >= 4096 elements use the wider work-group of the GPU profile."""
    rng = np.random.default_rng(shape[-1])
    x = rng.standard_normal(shape).astype(np.float32)
    x.flat[[7, x.size - 2]] = np.nan
    axis = len(shape) - 1
    out_shape = shape[:-1]
    base, ptr = put(gpu_be, x, pad=64)
    out = gpu_be.alloc(max(4, int(np.prod(out_shape)) * 4))
    y = gpu_be.alloc(x.nbytes)
    try:
        for op in ("sum", "mean", "max", "min"):
            gpu_be.reduce(op, ptr, out, list(shape), axis)
            want = _fold_reference(op, x, axis)
            np.testing.assert_allclose(get(gpu_be, out, out_shape), want, rtol=2e-4, atol=2e-3, err_msg=op)
        clean = np.nan_to_num(x)
        gpu_be.copy_htod(ptr, clean)
        gpu_be.softmax(ptr, y, list(shape), axis)
        e = np.exp(clean.astype(np.float64) - clean.max(axis=-1, keepdims=True))
        np.testing.assert_allclose(
            get(gpu_be, y, shape), e / e.sum(axis=-1, keepdims=True), rtol=1e-4, atol=1e-7
        )
    finally:
        for p in (base, out, y):
            gpu_be.free(p)


# --------------------------------------------------------------------------- regressions (hostile use)


@pytest.mark.parametrize("vector", [True, False], ids=["vector-kernel", "workgroup-kernel"])
def test_attention_nan_rules(be: Any, vector: bool) -> None:
    """Regression: a NaN query row and a +inf score gave zero rows; they give NaN, as the reference."""
    rng = np.random.default_rng(12)
    b, h, sq, skv, d = 1, 2, 6, 6, 8
    q = rng.standard_normal((b, h, sq, d)).astype(np.float32)
    k = rng.standard_normal((b, h, skv, d)).astype(np.float32)
    val = rng.standard_normal((b, h, skv, d)).astype(np.float32)
    q[0, 0, 1, :] = np.nan  # a NaN query row
    q[0, 0, 3, 0], k[0, 0, 0, 0] = np.inf, 1.0  # a +inf score (key 0 is visible to row 3)
    val[0, 1, 5, 2] = np.nan  # a NaN value that causal rows 0..4 of head 1 never see
    mask = np.zeros((sq, skv), dtype=np.float32)
    mask[2, :] = -np.inf  # row 2 sees no key: zeros
    mask[4, 1] = np.nan  # a NaN mask entry that row 4 reads
    saved = be.vector_attention
    ptrs = [put(be, a)[0] for a in (q, k, val, mask)]
    out = be.alloc(q.nbytes)
    try:
        be.vector_attention = vector
        be.attention(*ptrs[:3], out, b, h, sq, skv, d, 0.5, True, mask_ptr=ptrs[3], mask_shape=[sq, skv])
        got = get(be, out, q.shape)
    finally:
        be.vector_attention = saved
        for ptr in (*ptrs, out):
            be.free(ptr)
    assert np.isnan(got[0, 0, [1, 3, 4]]).all() and np.isnan(got[0, 1, 4]).all()  # NaN row, +inf, NaN mask
    assert (got[0, :, 2] == 0).all()  # no visible key
    assert np.isfinite(got[0, 0, [0, 5]]).all() and np.isfinite(got[0, 1, [0, 1, 3]]).all()
    assert np.isnan(got[0, 1, 5, 2]) and np.isfinite(np.delete(got[0, 1, 5], 2)).all()  # the NaN value, read
    np.testing.assert_allclose(got[0, 0, 0], val[0, 0, 0], rtol=1e-6)  # causal row 0 sees key 0 only


def test_attention_programs_do_not_grow_with_head_dim() -> None:
    """Regression: one program was built and kept per distinct head_dim (80 values: 81 builds)."""
    _require_device()
    from computehal.backends.opencl._attention import head_bucket

    with OpenCLBackend() as backend:
        q = np.ones(2 * 80, dtype=np.float32)
        ptr = put(backend, q)[0]
        out = backend.alloc(q.nbytes)
        for dim in range(1, 81):
            backend.attention(ptr, ptr, ptr, out, 1, 1, 2, 2, dim, 0.1, False)
        np.testing.assert_allclose(get(backend, out, 160), 1.0)
        assert backend.program_builds == len({head_bucket(dim) for dim in range(1, 81)}) == 5
        assert backend.programs_cached <= 5


def test_program_cache_is_least_recently_used_and_bounded(be: Any) -> None:
    from computehal.backends.opencl._runtime import ProgramCache

    cache = ProgramCache(be._context, capacity=3)
    for ew in (1, 2, 3, 4, 5):
        cache.kernel("elementwise.cl", "unary_neg", {"EW": ew})
    assert len(cache) == 3 and cache.builds == 5
    cache.kernel("elementwise.cl", "unary_neg", {"EW": 5})  # cached: no build
    cache.kernel("elementwise.cl", "unary_neg", {"EW": 3})  # the least recently used kept: no build
    assert cache.builds == 5
    cache.kernel("elementwise.cl", "unary_neg", {"EW": 1})  # evicted earlier: built again
    assert cache.builds == 6 and len(cache) == 3


def test_reduce_with_op_none_is_an_invalid_argument(be: Any) -> None:
    """Regression: reduce(None, ...) raised DeviceError("AssertionError:")."""
    base, _ = put(be, np.ones(4, dtype=np.float32))
    try:
        for shape in ([4], [1, 4], [4, 1]):
            with pytest.raises(InvalidArgumentError, match="op"):
                be.reduce(None, base, base, shape, 0)
    finally:
        be.free(base)


def test_allocations_beyond_the_device_memory_fail_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    """What this backend holds counts against the device's memory: the request that would
    exceed it raises OutOfMemoryError at alloc, not later when a kernel touches it."""
    _require_device()
    with OpenCLBackend() as backend:
        monkeypatch.setattr(backend, "_total", 3 << 20)
        first = backend.alloc(2 << 20)
        with pytest.raises(OutOfMemoryError):
            backend.alloc(2 << 20)
        second = backend.alloc(1 << 20)  # what is left still fits
        backend.free(first)
        third = backend.alloc(2 << 20)  # freed memory counts again
        for ptr in (second, third):
            backend.free(ptr)
        assert backend._in_use == 0


def _program_build(be: Any, source: str, defines: dict[str, object]) -> tuple[str, str]:
    """Kernel names and build log of ``source`` built on ``be``'s device with ``defines``."""
    import warnings

    text = kernel_source(source, {key: str(value) for key, value in defines.items()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = pyopencl.Program(be._context, text).build()
    names = str(program.get_info(pyopencl.program_info.KERNEL_NAMES))
    log = str(program.get_build_info(be._device, pyopencl.program_build_info.LOG))
    return names, log


@pytest.fixture(scope="module")
def vector_profile() -> Iterator[Any]:
    """A backend on device 0 in the CPU kernel profile (vector kernels), whatever the device."""
    _require_device()
    backend = OpenCLBackend(kernel_profile="cpu")
    backend.init()
    yield backend
    backend.close()


def test_vector_width_is_one_the_kernel_compiler_targets(vector_profile: Any) -> None:
    """The vector programs get every kernel and no "changes the ABI" warning from the compiler.

    PoCL 3.0 on an AMD Zen 4 compiles for "znver3" (no AVX-512): programs handing 16-wide
    float vectors to its builtins came out with no kernel at all, and the process aborted at
    exit. The width is now read from the kernel compiler (``vector_bits``).
    """
    be = vector_profile
    assert be._vector_bits in (128, 256, 512)
    dtypes = [np.dtype(np.float32)] + ([np.dtype(np.float64)] if be._fp64() else [])
    for dt in dtypes:
        real = {"REAL": "double", "USE_FP64": 1} if dt == np.float64 else {"REAL": "float"}
        lanes, vw = be._lanes(dt), be._attention_vw(dt)
        assert lanes * 8 * dt.itemsize <= max(be._vector_bits, 16 * dt.itemsize)
        builds = {
            "elementwise.cl": {**be._ew_defines(dt), **real},
            "reduce.cl": {"LS": 1, "CONTIG": 1, "CW": lanes, "VW": min(8, lanes), **real},
            "attention.cl": {"HD": 16, "BQ": 8, "BKV": 8 * vw, "VW": vw, **real},
        }
        for source, defines in builds.items():
            names, log = _program_build(be, source, defines)
            assert names.strip(), f"{source} {defines}: no kernel built"
            assert "changes the ABI" not in log, f"{source} {defines}: {log[:300]}"


@pytest.mark.parametrize("bits", [128, 256])
def test_narrower_vectors_compute_the_same(
    vector_profile: Any, bits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Element-wise maps, column reductions and column softmax with 4- or 8-lane vectors."""
    be = vector_profile
    monkeypatch.setattr(be, "_vector_bits", bits)
    rng = np.random.default_rng(bits)
    x = rng.standard_normal((37, 45)).astype(np.float32)
    w = rng.standard_normal(45).astype(np.float32)
    px, _ = put(be, x)
    pw, _ = put(be, w)
    out = be.alloc(x.nbytes)
    try:
        wide = x.astype(np.float64)
        be.unary("exp", px, out, x.size)
        np.testing.assert_allclose(get(be, out, x.shape), np.exp(wide), rtol=1e-5)
        be.binary("mul", px, px, out, x.size)
        np.testing.assert_allclose(get(be, out, x.shape), wide * wide, rtol=1e-6)
        be.broadcast_binary("add", px, [37, 45], pw, [45], out, [37, 45])
        np.testing.assert_allclose(get(be, out, x.shape), wide + w, rtol=1e-6, atol=1e-6)
        be.reduce("sum", px, out, [37, 45], 0)
        np.testing.assert_allclose(get(be, out, (45,)), wide.sum(axis=0), rtol=1e-5, atol=1e-5)
        be.softmax(px, out, [37, 45], 0)
        e = np.exp(wide - wide.max(axis=0))
        np.testing.assert_allclose(get(be, out, x.shape), e / e.sum(axis=0), rtol=1e-5, atol=1e-7)
    finally:
        for ptr in (px, pw, out):
            be.free(ptr)
