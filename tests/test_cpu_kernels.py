"""Exactness of CpuBackend's compiled float32 kernels (computehal.backends.cpu._kmath).

Every 997th float32 bit pattern (about 4.3 million values, all signs, exponents and
subnormals) plus the special values and range boundaries is pushed through each
kernel and compared with float64 NumPy, in units in the last place of the float32
result. Softmax and column max/min are compared with float64 NumPy definitions,
including their NaN / inf semantics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

# numba is a core dependency: a kernel module that fails to import is a failure, not a skip.
import computehal.backends.cpu._kmath as K  # noqa: E402

F32 = np.float32
F64 = np.float64

_BOUNDARIES = [
    0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 0.5, 2.0,
    88.72283, 88.72284, 88.7229, 89.0, 100.0, -87.33654, -87.3366, -100.0, -103.2789, -103.97,
    -104.0, -110.0, 1e-45, -1e-45, 1.1754942e-38, 1.17549435e-38, -1.17549435e-38,
    3.4028235e38, -3.4028235e38, 1e-7, -1e-7, 0.625, -0.625, 0.6249999, 9.0, 9.5, 9.6, -9.6,
    0.34657359, -0.34657359, 0.70710677, 0.70710678, 1.0000001, 0.99999994,
]  # fmt: skip


def _inputs() -> npt.NDArray[np.float32]:
    patterns = np.arange(0, 2**32, 997, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([patterns.view(F32), np.asarray(_BOUNDARIES, dtype=F32)])


X = _inputs()


def _ulp_error(got: npt.NDArray[np.float32], want: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """|got - want| in float32 ULPs of the exact result (NaN vs NaN and equal infinities are 0)."""
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = want.astype(F32)
    # Exact results beyond FLT_MAX round to inf: compare with the rounded value there.
    want = np.where(np.isinf(rounded) & np.isfinite(want), rounded.astype(F64), want)
    spacing = np.spacing(np.abs(rounded)).astype(F64)
    spacing[spacing == 0] = 2.0**-149
    spacing[~np.isfinite(spacing)] = 2.0**104
    with np.errstate(invalid="ignore"):
        err = np.abs(got.astype(F64) - want) / spacing
        err[(np.isnan(got) & np.isnan(want)) | (got.astype(F64) == want)] = 0.0
    err[np.isnan(got) != np.isnan(want)] = np.inf
    return err


def _sigmoid64(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _log64(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


def _erf64(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    import scipy.special

    return np.asarray(scipy.special.erf(x))


def _kact(name: str) -> Callable[..., None]:
    import computehal.backends.cpu._kact as A

    fn: Callable[..., None] = getattr(A, name)
    return fn


CASES: list[tuple[str, Callable[..., None], Callable[[Any], Any], float]] = [
    # float32 rational evaluation: 5.2 ULP at worst near |x| = 3.4, where erf is 1 - 2e-6
    # (the kit's bound is 8 eps relative, 16 such ULP).
    ("erf", _kact("erf_into"), _erf64, 6.0),
    ("exp", _kact("exp_into"), np.exp, 2.0),
    ("log", _kact("log_into"), _log64, 2.0),
    ("tanh", _kact("tanh_into"), np.tanh, 2.0),
    ("sigmoid", _kact("sigmoid_into"), _sigmoid64, 2.5),
]


@pytest.mark.parametrize(("name", "kernel", "reference", "bound"), CASES, ids=[c[0] for c in CASES])
def test_unary_kernel_ulp(
    name: str, kernel: Callable[..., None], reference: Callable[[Any], Any], bound: float
) -> None:
    out = np.full_like(X, 7.0)
    kernel(X, out)
    with np.errstate(over="ignore", invalid="ignore"):
        want = reference(X.astype(F64))
    err = _ulp_error(out, want)
    worst = int(np.argmax(err))
    print(f"{name}: max {err[worst]:.3f} ULP at x = {X[worst]!r} (got {out[worst]!r}, want {want[worst]!r})")
    assert err[worst] <= bound, (name, X[worst], out[worst], want[worst], err[worst])


def _run(kernel: Callable[..., None], values: list[float]) -> npt.NDArray[np.float32]:
    x = np.asarray(values, dtype=F32)
    out = np.full_like(x, 7.0)
    kernel(x, out)
    return out


def _same(got: npt.NDArray[np.float32], want: list[float]) -> bool:
    w = np.asarray(want, dtype=F32)
    numbers = ~np.isnan(w)  # the sign of a NaN carries no meaning
    return bool(
        np.array_equal(got, w, equal_nan=True)
        and np.array_equal(np.signbit(got[numbers]), np.signbit(w[numbers]))
    )


def test_special_values_exact() -> None:
    inf, nan = np.inf, np.nan
    assert _same(_run(_kact("exp_into"), [-inf, inf, nan, 0.0, -0.0, 89.0, 1000.0, -200.0]),
                 [0.0, inf, nan, 1.0, 1.0, inf, inf, 0.0])  # fmt: skip
    assert _same(_run(_kact("log_into"), [0.0, -0.0, -1.0, -inf, inf, nan, 1.0]),
                 [-inf, -inf, nan, nan, inf, nan, 0.0])  # fmt: skip
    assert _same(_run(_kact("tanh_into"), [inf, -inf, nan, 0.0, -0.0, 50.0, -50.0]),
                 [1.0, -1.0, nan, 0.0, -0.0, 1.0, -1.0])  # fmt: skip
    assert _same(_run(_kact("sigmoid_into"), [inf, -inf, nan, 0.0, 200.0]), [1.0, 0.0, nan, 0.5, 1.0])


def test_exp_subnormal_results() -> None:
    x = np.linspace(-103.9, -87.0, 20001, dtype=F32)
    out = np.empty_like(x)
    _kact("exp_into")(x, out)
    assert np.all(out[x < -87.34] < np.finfo(F32).tiny)  # really subnormal, not flushed
    assert _ulp_error(out, np.exp(x.astype(F64))).max() <= 1.0


def test_log_subnormal_inputs() -> None:
    x = (np.arange(1, 1 << 23, 4099, dtype=np.uint32)).view(F32)  # subnormals
    out = np.empty_like(x)
    _kact("log_into")(x, out)
    assert _ulp_error(out, np.log(x.astype(F64))).max() <= 1.0


def test_in_place_and_unaligned() -> None:
    x = np.random.default_rng(3).uniform(-20, 20, 1001).astype(F32)
    want = np.exp(x.astype(F64))
    buf = x.copy()
    _kact("exp_into")(buf[1:], buf[1:])  # odd start, in place
    assert _ulp_error(buf[1:], want[1:]).max() <= 2.0
    assert buf[0] == x[0]


def _softmax64(x: npt.NDArray[np.float32], axis: int) -> npt.NDArray[np.float64]:
    x64 = x.astype(F64)
    with np.errstate(invalid="ignore"):
        peak = np.fmax.reduce(x64, axis=axis, keepdims=True, initial=-np.inf)
        e = np.exp(x64 - peak)
        return e / np.sum(e, axis=axis, keepdims=True)


def _softmax_input(shape: tuple[int, int], axis: int, seed: int) -> npt.NDArray[np.float32]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 8).astype(F32)
    # One slice each: a NaN, a +inf, all -inf, a -inf among finite values, huge values.
    lines = [x[i] for i in range(5)] if axis == 1 else [x[:, i] for i in range(5)]
    lines[0][3] = np.nan
    lines[1][2] = np.inf
    lines[2][:] = -np.inf
    lines[3][1] = -np.inf
    lines[4][:] = 3e38
    lines[4][0] = -3e38
    return x


def _check_softmax(got: npt.NDArray[np.float32], want: npt.NDArray[np.float64], length: int) -> None:
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    tol = np.finfo(F32).eps * (8 + 2 * length) * np.abs(want[finite]) + 2.0**-126
    assert np.all(np.abs(got[finite] - want[finite]) <= tol)


@pytest.mark.parametrize("shape", [(7, 1), (9, 33), (64, 1000), (5, 4099)])
def test_softmax_rows(shape: tuple[int, int]) -> None:
    x = _softmax_input(shape, 1, shape[1]) if shape[1] > 5 else np.ones(shape, dtype=F32)
    out = np.empty_like(x)
    K.softmax_rows(x, out)
    _check_softmax(out, _softmax64(x, 1), shape[1])
    K.softmax_rows(x, x)  # in place
    assert np.array_equal(x, out, equal_nan=True)


@pytest.mark.parametrize(
    ("shape", "c_lo", "c_hi"), [((9, 33), 0, 33), ((1000, 70), 5, 69), ((4099, 8), 0, 8)]
)
def test_softmax_columns(shape: tuple[int, int], c_lo: int, c_hi: int) -> None:
    x = _softmax_input(shape, 0, shape[0]) if shape[1] > 5 else np.ones(shape, dtype=F32)
    out = np.full_like(x, 7.0)
    K.softmax_columns(x, out, c_lo, c_hi)
    _check_softmax(out[:, c_lo:c_hi], _softmax64(x, 0)[:, c_lo:c_hi], shape[0])
    assert np.all(out[:, :c_lo] == 7.0) and np.all(out[:, c_hi:] == 7.0)


def _aligned(shape: tuple[int, int], shift: int) -> npt.NDArray[np.float32]:
    """A float32 array ``shift`` elements past a 64-byte boundary."""
    size = shape[0] * shape[1]
    raw = np.empty(size + 32, dtype=F32)
    start = (-raw.ctypes.data % 64) // 4 + shift
    return raw[start : start + size].reshape(shape)


@pytest.mark.parametrize(
    ("shape", "c_lo", "c_hi"), [((300, 96), 16, 80), ((64, 48), 0, 48), ((1000, 70), 3, 67)]
)
@pytest.mark.parametrize("log", [False, True])
def test_streamed_column_softmax(shape: tuple[int, int], c_lo: int, c_hi: int, log: bool) -> None:
    """The one-pass panel kernel and the two-pass kernel's streamed output, aligned or not, and in place."""
    import computehal.backends.cpu._ksoftmax as S

    x = _softmax_input(shape, 0, shape[0] + c_lo)
    want64 = _softmax64(x, 0)
    with np.errstate(divide="ignore"):
        want = np.log(want64) if log else want64
    w = c_hi - c_lo
    for shift in (0, 3):
        for stream in (False, True):
            for kernel in ("panel", "columns"):
                out = _aligned(shape, shift)
                out[...] = 7.0
                if kernel == "panel":
                    S.softmax_panel(
                        x, out, c_lo, c_hi, log, np.empty((shape[0], w), F32), np.empty((5, w), F32), stream
                    )
                else:
                    S.softmax_columns(x, out, c_lo, c_hi, log, np.empty((5, w), F32), stream)
                got = out[:, c_lo:c_hi]
                assert np.array_equal(np.isnan(got), np.isnan(want[:, c_lo:c_hi]))
                if not log:
                    _check_softmax(got, want64[:, c_lo:c_hi], shape[0])
                else:
                    ref = want[:, c_lo:c_hi]
                    finite = np.isfinite(ref)
                    assert np.array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
                    assert np.all(np.abs(got[finite] - ref[finite]) <= 1e-5 * (1 + np.abs(ref[finite])))
                assert np.all(out[:, :c_lo] == 7.0) and np.all(out[:, c_hi:] == 7.0)
    same = x.copy()
    S.softmax_panel(same, same, c_lo, c_hi, log, np.empty((shape[0], w), F32), np.empty((5, w), F32), True)
    assert np.array_equal(np.isnan(same[:, c_lo:c_hi]), np.isnan(want[:, c_lo:c_hi]))


@pytest.mark.parametrize("largest", [True, False])
def test_extreme_columns(largest: bool) -> None:
    x = np.random.default_rng(5).standard_normal((300, 50)).astype(F32)
    x[::7, 3] = np.nan
    x[:, 4] = np.nan  # all NaN: fmax / fmin give the identity
    x[10, 5] = -np.inf
    x[11, 6] = np.inf
    out = np.empty(40, dtype=F32)
    K.extreme_columns(x, out, 5, 45, largest)
    fn = np.fmax if largest else np.fmin
    want = fn.reduce(x[:, 5:45], axis=0, initial=-np.inf if largest else np.inf)
    assert np.array_equal(out, want)
    empty = np.empty((0, 8), dtype=F32)
    K.extreme_columns(empty, out[:8], 0, 8, largest)
    assert np.all(out[:8] == (-np.inf if largest else np.inf))


def test_sum_rows_and_columns() -> None:
    """Float32 partial sums within a plain sum's bound ``n eps sum|x|``; NaN and inf propagate."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((37, 20_000)).astype(F32)
    x[3, 5] = np.nan
    x[4, 9] = np.inf
    rows = np.empty(37, dtype=F32)
    K.sum_rows(x, rows)
    cols = np.empty(20_000, dtype=F32)
    K.sum_columns(x, cols)
    for got, axis in ((rows, 1), (cols, 0)):
        xd = x.astype(F64)
        want = xd.sum(axis=axis)
        bound = x.shape[axis] * 2.0**-23 * np.abs(xd).sum(axis=axis)
        finite = np.isfinite(want)
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(
            got[np.isinf(want)], want[np.isinf(want)]
        )
        assert (np.abs(got[finite] - want[finite]) <= bound[finite]).all()


def test_exp_shifted_rowsum() -> None:
    rng = np.random.default_rng(9)
    scores = (rng.standard_normal((16, 300)) * 4).astype(F32)
    scores[0, :] = -np.inf
    shift = scores.max(axis=1)
    shift[0] = 0.0
    # The kernel rounds x - shift to float32 first (as the NumPy path does).
    with np.errstate(invalid="ignore"):
        want = np.exp((scores - shift[:, None]).astype(F64))
    sums = np.empty(16, dtype=F32)
    K.exp_shifted_rowsum(scores, shift, sums)
    assert _ulp_error(scores, want).max() <= 2.0
    np.testing.assert_allclose(sums, want.sum(axis=1), rtol=1e-5, atol=0)


@pytest.mark.parametrize("streamed", [False, True])
def test_16bit_conversions_bit_exact(streamed: bool) -> None:
    """float32 <-> float16 / bfloat16 kernels against NumPy and ml_dtypes, every 251st bit pattern.

    ``streamed``: whole destination lines are written by the non-temporal line stores
    (the first and last elements still by plain stores).
    """
    import ml_dtypes

    import computehal.backends.cpu._kcast as C

    bits = np.arange(0, 2**32, 251, dtype=np.uint64).astype(np.uint32)
    values = bits.view(F32)
    nan = np.isnan(values)
    narrow = np.empty(bits.size, dtype=np.uint16)

    def run(kernel: Any, src: Any, dst: Any) -> None:
        dst[:] = 0xAAAA
        kernel(src, dst, 0, 3, -1)
        kernel(src, dst, 3, src.size, C.line_phase(dst) if streamed else -1)

    for kernel, target in ((C.f32_to_f16, np.float16), (C.f32_to_bf16, ml_dtypes.bfloat16)):
        run(kernel, bits, narrow)
        with np.errstate(over="ignore", invalid="ignore"):
            want = values.astype(target).view(np.uint16)
        np.testing.assert_array_equal(narrow[~nan], want[~nan])
        assert np.isnan(narrow[nan].view(target).astype(F32)).all()
    every = np.arange(2**16, dtype=np.uint16)
    wide = np.empty(every.size, dtype=np.uint32)
    for kernel, source in ((C.f16_to_f32, np.float16), (C.bf16_to_f32, ml_dtypes.bfloat16)):
        run(kernel, every, wide)
        want = every.view(source).astype(F32)
        same = (wide.view(F32) == want) | (np.isnan(wide.view(F32)) & np.isnan(want))
        assert same.all()
        np.testing.assert_array_equal(np.signbit(wide.view(F32)), np.signbit(want))


def _bits_equal(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> bool:
    nan = np.isnan(a)
    return bool(
        np.array_equal(nan, np.isnan(b)) and np.array_equal(a.view(np.uint32)[~nan], b.view(np.uint32)[~nan])
    )


@pytest.mark.parametrize("name", ["gelu_into", "gelu_tanh_into", "silu_into", "sigmoid_into", "exp_into"])
def test_streaming_unary_matches_plain(name: str) -> None:
    """The non-temporal path gives the plain loop's bits, at every output alignment and in place."""
    kernel = _kact(name)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(2000) * 6).astype(F32)
    x[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30]
    want = np.empty_like(x)
    kernel(x, want, False)
    for shift in range(16):
        out = np.full(x.size + 16, 7.0, dtype=F32)
        kernel(x, out[shift : shift + x.size], True)
        assert _bits_equal(out[shift : shift + x.size], want)
        assert (out[:shift] == 7.0).all() and (out[shift + x.size :] == 7.0).all()
    same = x.copy()
    kernel(same, same, True)
    assert _bits_equal(same, want)


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_cos_kernels(name: str) -> None:
    """float32 sin / cos: 1.5 ULP below |x| = 1000, within a tenth of the kit's bound
    everywhere, the C library's float64 result (rounded) far out; inf and NaN give NaN."""
    kernel, exact = _kact(f"{name}_into"), getattr(np, name)
    x = np.concatenate(
        [
            X,
            np.linspace(-200, 200, 400_001, dtype=F32),
            (np.arange(-3000, 3000) * (np.pi / 2)).astype(F32),  # near the quadrant edges
            np.asarray([2.0**20, -(2.0**20), 2.0**20 - 0.0625, 1e7, -3e38, 1e-30, -0.0], dtype=F32),
        ]
    )
    out = np.full_like(x, 7.0)
    kernel(x, out, False)
    with np.errstate(invalid="ignore"):
        want = exact(x.astype(F64))
    assert np.array_equal(np.isnan(out), np.isnan(want))
    finite = np.isfinite(x)
    xd = np.abs(x[finite].astype(F64))
    err = np.abs(out[finite] - want[finite])
    assert (err <= 0.1 * (4 * 2.0**-23 * np.abs(want[finite]) + 2 * 2.0**-23 * (1 + xd))).all()
    near = finite & (np.abs(x) < 1000)
    assert _ulp_error(out[near], want[near]).max() <= 1.5
    far = finite & (np.abs(x) >= 2.0**20)
    assert np.array_equal(out[far], want[far].astype(F32))
    for shift in range(16):  # streamed and in place: the same bits
        buf = np.full(x.size + 16, 7.0, dtype=F32)
        kernel(x, buf[shift : shift + x.size], True)
        assert _bits_equal(buf[shift : shift + x.size], out) and (buf[:shift] == 7.0).all()
    same = x.copy()
    kernel(same, same, True)
    assert _bits_equal(same, out)


def test_gelu_float32_erf_within_kit_bound() -> None:
    """GELU's float32 erf: |error| below the kit's 8 eps (|y| + |x|) on a dense grid and at the specials."""
    import scipy.special

    x = np.concatenate(
        [np.linspace(-12, 12, 200_001, dtype=F32), np.asarray([0.0, -0.0, 1e-20, 1e30], dtype=F32)]
    )
    out = np.empty_like(x)
    _kact("gelu_into")(x, out, False)
    xd = x.astype(F64)
    want = xd * 0.5 * scipy.special.erfc(-xd / np.sqrt(2.0))
    bound = 8 * 2.0**-23 * (np.abs(want) + np.abs(xd)) + 2.0**-126
    assert (np.abs(out - want) <= 0.5 * bound).all()
    specials = np.asarray([np.nan, np.inf, -np.inf], dtype=F32)
    _kact("gelu_into")(specials, out[:3], True)
    assert np.isnan(out[0]) and out[1] == np.inf and np.isnan(out[2])


def test_layer_norm_float32_kernel() -> None:
    """Float32 partial sums against float64 NumPy; overflowing, tiny, constant and NaN rows fall back."""
    import computehal.backends.cpu._knorm as N

    rng = np.random.default_rng(6)
    x = rng.standard_normal((12, 1000)).astype(F32)
    x[1] *= np.float32(1e25)
    x[2] *= np.float32(1e-25)
    x[3] = 5.0
    x[4, 7] = np.nan
    scale = rng.uniform(0.5, 1.5, 1000).astype(F32)
    bias = rng.standard_normal(1000).astype(F32)
    for rms in (False, True):
        xd = x.astype(F64)
        centred = xd if rms else xd - xd.mean(axis=1, keepdims=True)
        want = centred / np.sqrt((centred * centred).mean(axis=1, keepdims=True) + 1e-5) * scale + bias
        for stream in (False, True):
            out = np.empty_like(x)
            N.norm_rows_f32(x, out, scale, bias, 1e-5, rms, stream)
            assert np.isnan(out[4]).all() and not np.isnan(np.delete(out, 4, axis=0)).any()
            np.testing.assert_allclose(
                np.delete(out, 4, axis=0), np.delete(want, 4, axis=0), rtol=2e-5, atol=2e-5
            )


def test_lrn_float32_kernel() -> None:
    """Division-free ``t ** -0.75`` against float64 NumPy; t out of range (0, inf, NaN): the exact path."""
    import computehal.backends.cpu._knorm as N
    from computehal.testing.reference import lrn

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((13, 200)) * 3).astype(F32)
    x[:, 7] = 0.0
    x[4, 9] = np.nan
    x[3, 11] = np.inf
    for alpha, bias, size in ((1e-4, 2.0, 5), (1.0, 1e-3, 3), (1e-4, 0.0, 4)):
        with np.errstate(invalid="ignore", divide="ignore"):
            want = lrn(x[None].astype(F64), size, alpha, 0.75, bias)[0]
        for stream in (False, True):
            out = np.full_like(x, 7.0)
            N.lrn_planes_f32(x, out, 0, 120, size, alpha, bias, stream, np.empty(120, dtype=F32))
            N.lrn_planes_f32(x, out, 120, 200, size, alpha, bias, stream, np.empty(120, dtype=F32))
            np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
            np.testing.assert_allclose(out, want, rtol=16 * 2.0**-23, atol=0)


@pytest.mark.parametrize("width", [200, 80, 24, 16])
def test_lrn_vector_kernel(width: int) -> None:
    """The 16-pixel x 8-channel vector LRN: full and partial channel groups, pixel tails, pieces;
    t out of range (0, inf, NaN) and the running sum's cancellation go to the exact path."""
    import computehal.backends.cpu._klrn as L
    from computehal.testing.reference import lrn

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2, 13, 200)) * 3).astype(F32)
    x[0, :, 7] = 0.0
    x[0, 4, 9] = np.nan
    x[1, 3, 11] = np.inf
    x[1, 5, 40:60] = 3e3  # a huge channel leaving the running sums of the small ones after it
    x[1, 6:, 40:60] *= 1e-3
    pieces = 2 * -(-200 // width)
    configs = ((1e-4, 2.0, 5), (1.0, 1e-3, 3), (1e-4, 0.0, 4), (2.0, 1e-8, 9), (-1e-3, 1e3, 5), (0.5, 1.0, 1))
    for alpha, bias, size in configs:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            want = lrn(x.astype(F64), size, alpha, 0.75, bias)
        out = np.full_like(x, 7.0)
        L.lrn_pieces(x, out, 0, pieces, width, size, alpha, bias)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
        np.testing.assert_allclose(out, want, rtol=16 * 2.0**-23, atol=0)


def test_lrn_float32_running_sum_cancellation() -> None:
    """Large squares leaving the running channel-window sum: small windows after them keep full accuracy."""
    import computehal.backends.cpu._knorm as N
    from computehal.testing.reference import lrn

    rng = np.random.default_rng(11)
    x = (rng.standard_normal((40, 96)) * 1e-2).astype(F32)
    x[5] = 3e3  # one huge channel among small ones
    x[20:36, :48] = (2.0 ** -np.arange(16.0))[:, None] * 1e2  # window sums falling geometrically
    x[20:36, 48:] *= (10.0 ** -np.arange(16.0))[:, None]
    configs = ((1.0, 1e-6, 5), (1e-4, 2.0, 5), (0.5, 1e-3, 4), (2.0, 1e-8, 9), (-1e-3, 1e3, 5))
    for alpha, bias, size in configs:
        want = lrn(x[None].astype(F64), size, alpha, 0.75, bias)[0]
        out = np.full_like(x, 7.0)
        N.lrn_planes_f32(x, out, 0, 96, size, alpha, bias, False, np.empty(96, dtype=F32))
        np.testing.assert_allclose(out, want, rtol=16 * 2.0**-23, atol=0)


@pytest.mark.parametrize("cols", [1, 7, 15, 16, 17, 33, 49, 100])
def test_global_means_f32(cols: int) -> None:
    """Row means through 16 partial sums (16 rows at a time, then one by one): within
    (cols / 16 + 4) roundoffs, NaN / inf carried."""
    from computehal.backends.cpu import _kpool

    rng = np.random.default_rng(cols)
    rows = 37
    # Rows follow each other in one buffer: a tail that read past its row would add the
    # next row's values.
    x = (rng.standard_normal((rows, cols)) * 10.0 ** rng.integers(-3, 4, (rows, 1))).astype(np.float32)
    x[3, cols // 2] = np.nan
    x[5, 0] = np.inf
    if cols > 1:
        x[6, :2] = (np.inf, -np.inf)
    x[31, cols - 1] = np.nan  # the last row of the second block of 16
    x[35, cols - 1] = -np.inf  # a row after the last whole block
    out = np.full(rows, -7.0, dtype=np.float32)
    _kpool.global_means_f32(x, out)
    want = x.astype(np.float64).sum(axis=1) / cols
    finite = np.isfinite(want)
    eps = float(np.finfo(np.float32).eps)
    tol = (cols / 16 + 4) * eps * np.abs(x[finite]).astype(np.float64).sum(axis=1) / cols * 1.01
    assert np.all(np.abs(out[finite] - want[finite]) <= tol + 1e-38)
    np.testing.assert_array_equal(out[~finite], want[~finite].astype(np.float32))


@pytest.mark.parametrize("blocks", [1, 3, 7])
def test_lrn_pulled_blocks_cover_every_piece_once(blocks: int) -> None:
    """The vector LRN's pulled loop (one caller, one worker) over pieces in uneven blocks."""
    import computehal.backends.cpu._klrn as L
    from computehal.testing.reference import lrn

    rng = np.random.default_rng(blocks)
    x = rng.standard_normal((5, 11, 96)).astype(F32)
    width = 32
    count = 5 * 3  # three pieces of 32 pixels per image
    out = np.full_like(x, np.nan)
    taken, done = L.run_pulled(L.lrn_pulled, (count, x, out, width, 5, 1e-2, 1.5), blocks, 2)
    assert int(done[0]) == blocks
    want = lrn(x.astype(F64), 5, 1e-2, 0.75, 1.5)
    np.testing.assert_allclose(out, want, rtol=16 * 2.0**-23, atol=0)


def test_lrn_through_the_backend_in_several_blocks() -> None:
    """A float32 LRN large enough to be pulled in several blocks, against the float64 definition."""
    from computehal.backends.cpu import CpuBackend
    from computehal.testing.reference import lrn

    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 16, 64, 64)).astype(F32)
    be = CpuBackend()
    be.init()
    with be:
        xp, yp = be.alloc(x.nbytes), be.alloc(x.nbytes)
        be.copy_htod(xp, x)
        be.lrn(xp, yp, x.shape, 5, 1e-3, 0.75, 2.0)
        got = np.empty_like(x)
        be.copy_dtoh(got, yp)
    want = lrn(x.reshape(4, 16, -1).astype(F64), 5, 1e-3, 0.75, 2.0).reshape(x.shape)
    np.testing.assert_allclose(got, want, rtol=16 * 2.0**-23, atol=0)
