"""Public value types: error texts, enums, capability records, tiles, 16-bit rounding."""

from __future__ import annotations

import dataclasses
import pickle
import struct

import ml_dtypes
import numpy as np
import pytest

from computehal import (
    BackendError,
    BackendTranspose,
    BinaryOp,
    Capabilities,
    DeviceError,
    DeviceInfo,
    InvalidArgumentError,
    MemoryKind,
    MixedPrecision,
    NotInitializedError,
    OpClass,
    OutOfMemoryError,
    PoolOp,
    ReduceOp,
    TileShape,
    UnaryOp,
    UnsupportedError,
    default_tile_for,
    round_to_bf16,
    round_to_f16,
)
from computehal.types import coerce_enum

# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (UnsupportedError("float64 on WGSL"), "unsupported operation: float64 on WGSL"),
        (DeviceError("queue lost"), "device error: queue lost"),
        (InvalidArgumentError("lda too small"), "invalid argument: lda too small"),
        (OutOfMemoryError(), "out of device memory"),
        (OutOfMemoryError(1024), "out of device memory (requested 1024 bytes)"),
        (OutOfMemoryError(1024, 512), "out of device memory (requested 1024 bytes, 512 bytes free)"),
        (OutOfMemoryError(None, 512), "out of device memory (512 bytes free)"),
        (NotInitializedError(), "backend not initialized"),
    ],
)
def test_error_texts(error: BackendError, text: str) -> None:
    assert str(error) == text
    assert isinstance(error, BackendError)
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is type(error) and str(clone) == text


def test_error_hierarchy() -> None:
    assert issubclass(BackendError, Exception)
    for cls in (UnsupportedError, DeviceError, InvalidArgumentError, OutOfMemoryError, NotInitializedError):
        assert issubclass(cls, BackendError)
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(OutOfMemoryError, MemoryError)
    assert issubclass(NotInitializedError, RuntimeError)
    assert not issubclass(UnsupportedError, (ValueError, RuntimeError))
    assert UnsupportedError("x").msg == "x"
    assert OutOfMemoryError(10, 5).requested == 10 and OutOfMemoryError(10, 5).available == 5


# --------------------------------------------------------------------------- enums

ENUM_VALUES = {
    BackendTranspose: {"NO_TRANS": "N", "TRANS": "T", "CONJ_TRANS": "C"},
    ReduceOp: {"SUM": "sum", "MAX": "max", "MIN": "min", "MEAN": "mean"},
    UnaryOp: {
        "RELU": "relu",
        "SIGMOID": "sigmoid",
        "TANH": "tanh",
        "EXP": "exp",
        "LOG": "log",
        "SQRT": "sqrt",
        "ABS": "abs",
        "NEG": "neg",
        # computehal extensions
        "GELU": "gelu",
        "GELU_TANH": "gelu_tanh",
        "SILU": "silu",
        "ERF": "erf",
        "RECIPROCAL": "reciprocal",
        "SQUARE": "square",
        "SIN": "sin",
        "COS": "cos",
        "LEAKY_RELU": "leaky_relu",
        "CLIP": "clip",
    },
    BinaryOp: {
        "ADD": "add",
        "SUB": "sub",
        "MUL": "mul",
        "DIV": "div",
        "MAX": "max",
        "MIN": "min",
        "POW": "pow",
    },
    PoolOp: {"MAX": "max", "AVG": "avg"},
    MixedPrecision: {"F16": "f16", "BF16": "bf16"},
    MemoryKind: {"DEVICE": "device", "HOST_PINNED": "host-pinned", "UNIFIED": "unified", "HOST": "host"},
    OpClass: {
        "MATMUL": "matmul",
        "CONVOLUTION": "convolution",
        "ATTENTION": "attention",
        "REDUCTION": "reduction",
        "ELEMENTWISE": "elementwise",
        "MEMORY": "memory",
    },
}


@pytest.mark.parametrize("enum_type", list(ENUM_VALUES), ids=lambda e: e.__name__)
def test_enum_members_and_string_values(enum_type: type) -> None:
    expected = ENUM_VALUES[enum_type]
    assert {m.name: m.value for m in enum_type} == expected  # type: ignore[attr-defined]
    for name, value in expected.items():
        member = enum_type[name]  # type: ignore[index]
        assert str(member) == value
        assert coerce_enum(enum_type, value, "x") is member
        assert coerce_enum(enum_type, member, "x") is member
        assert coerce_enum(enum_type, name.lower(), "x") is member
        assert coerce_enum(enum_type, value.upper(), "x") is member


@pytest.mark.parametrize("bad", ["", "bogus", None, 3, 1.0, b"N", ReduceOp.SUM])
def test_enum_rejects_others(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="trans_a must be a BackendTranspose"):
        coerce_enum(BackendTranspose, bad, "trans_a")


def test_transpose_is_transposed() -> None:
    assert not BackendTranspose.NO_TRANS.is_transposed
    assert BackendTranspose.TRANS.is_transposed and BackendTranspose.CONJ_TRANS.is_transposed


# --------------------------------------------------------------------------- records


def test_capabilities_cpu_defaults() -> None:
    caps = Capabilities.cpu()
    assert caps == Capabilities()
    assert (caps.supports_fp16, caps.supports_bf16, caps.supports_fp8) == (False, False, False)
    assert (caps.tensor_cores, caps.peer_access, caps.cluster_launch, caps.async_copy) == (False,) * 4
    assert caps.unified_memory is True
    assert caps.max_threads_per_block == 1024
    assert caps.max_shared_mem_per_block == 49152
    assert caps.warp_size == 1
    assert caps.supports_fp64 is True
    assert caps.native_ops == frozenset()
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.warp_size = 32  # type: ignore[misc]
    assert hash(caps) == hash(Capabilities())


def test_device_info_and_tile_shape() -> None:
    info = DeviceInfo(0, "cpu")
    assert info.compute_capability == (0, 0)
    assert info.total_memory_bytes == 0
    assert info.memory_kind is MemoryKind.HOST
    assert info.capabilities == Capabilities.cpu()
    tile = TileShape(64, 32, 16)
    assert (tile.tile_m, tile.tile_n, tile.tile_k) == (64, 32, 16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tile.tile_m = 1  # type: ignore[misc]


TC = Capabilities(tensor_cores=True)
PLAIN = Capabilities.cpu()


@pytest.mark.parametrize(
    ("m", "n", "k", "caps", "tile"),
    [
        # tensor cores, all multiples of 16
        (512, 512, 512, TC, (128, 128, 32)),
        (1024, 2048, 512, TC, (128, 128, 32)),
        (512, 512, 496, TC, (64, 64, 16)),
        (16, 16, 16, TC, (64, 64, 16)),
        # tensor cores but not multiples of 16: the plain heuristic
        (512, 512, 513, TC, (64, 64, 16)),
        (513, 520, 600, TC, (128, 128, 8)),
        (30, 64, 64, TC, (16, 16, 16)),
        # plain
        (64, 1000, 1000, PLAIN, (16, 16, 16)),
        (1, 1, 1, PLAIN, (16, 16, 16)),
        (0, 5, 5, PLAIN, (16, 16, 16)),
        (65, 1000, 1000, PLAIN, (64, 64, 16)),
        (512, 512, 512, PLAIN, (64, 64, 16)),
        (513, 600, 700, PLAIN, (128, 128, 8)),
    ],
)
def test_default_tile_for(m: int, n: int, k: int, caps: Capabilities, tile: tuple[int, int, int]) -> None:
    assert default_tile_for(m, n, k, caps) == TileShape(*tile)


# --------------------------------------------------------------------------- 16-bit rounding


def f32(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def bits(value: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", value))[0])


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (0x3F800000, 0x3F800000),  # 1.0 exact
        (0x3F808000, 0x3F800000),  # 1 + 2^-8: tie, mantissa even -> down
        (0x3F818000, 0x3F820000),  # 1 + 3*2^-8: tie, odd -> up to even
        (0x3F808001, 0x3F810000),  # just above the tie -> up
        (0x3F807FFF, 0x3F800000),  # just below the tie -> down
        (0xBF808000, 0xBF800000),  # negative tie
        (0x7F7F7FFF, 0x7F7F0000),  # below half an ulp at the top of the range
        (0x7F7FFFFF, 0x7F800000),  # float32 max overflows to +inf
        (0xFF7FFFFF, 0xFF800000),  # -max to -inf
        (0x7F800000, 0x7F800000),  # inf stays
        (0x80000000, 0x80000000),  # -0 keeps its sign
        (0x00008000, 0x00000000),  # subnormal tie to even (zero)
        (0x00018000, 0x00020000),  # subnormal tie, odd -> up
    ],
)
def test_round_to_bf16_bits(src: int, dst: int) -> None:
    assert bits(round_to_bf16(f32(src))) == dst


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, 1.0),
        (1 + 2.0**-11, 1.0),  # tie -> even
        (1 + 3 * 2.0**-11, 1 + 2.0**-9),  # tie -> even (up)
        (1 + 2.0**-11 + 2.0**-20, 1 + 2.0**-10),  # above the tie
        (2049.0, 2048.0),  # tie at spacing 2
        (2051.0, 2052.0),
        (65504.0, 65504.0),  # f16 max
        (65519.0, 65504.0),  # below the overflow threshold
        (65520.0, float("inf")),  # tie between max and 2^16 -> overflow
        (-70000.0, float("-inf")),
        (2.0**-24, 2.0**-24),  # smallest subnormal
        (2.0**-25, 0.0),  # tie -> even (zero)
        (3 * 2.0**-26, 2.0**-24),  # above the tie
        (1e-8, 0.0),
        (-0.0, -0.0),
    ],
)
def test_round_to_f16_values(value: float, expected: float) -> None:
    got = round_to_f16(value)
    assert isinstance(got, float)
    assert got == expected
    assert np.signbit(got) == np.signbit(expected)


@pytest.mark.parametrize("fn", [round_to_f16, round_to_bf16])
def test_rounding_nan_and_scalars(fn: object) -> None:
    assert np.isnan(fn(float("nan")))  # type: ignore[operator]
    assert fn(3) == 3.0 and isinstance(fn(3), float)  # type: ignore[operator]
    assert fn(float("inf")) == float("inf")  # type: ignore[operator]
    assert fn(float("-inf")) == float("-inf")  # type: ignore[operator]


@pytest.mark.parametrize(("fn", "narrow"), [(round_to_f16, np.float16), (round_to_bf16, ml_dtypes.bfloat16)])
def test_rounding_vectorised_matches_ml_dtypes(fn: object, narrow: object) -> None:
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32)
    x = raw.view(np.float32)
    scaled = (rng.standard_normal(20000) * 1e3).astype(np.float32)
    for data in (x, scaled, x.reshape(100, 200)):
        got = fn(data)  # type: ignore[operator]
        assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == data.shape
        with np.errstate(over="ignore", invalid="ignore"):
            want = data.astype(narrow).astype(np.float32)  # type: ignore[call-overload]
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_rounding_accepts_lists() -> None:
    got = round_to_bf16([1.0, 1 + 2.0**-8, float("nan")])
    assert got.dtype == np.float32
    assert got[0] == 1.0 and got[1] == 1.0 and np.isnan(got[2])
