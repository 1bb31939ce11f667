"""Problem sizes of a run, per kind of device, full and quick.

Four profiles: ``cpu`` (the CPU backend, at the sizes of the CPU performance targets),
``host-device`` (an OpenCL or Vulkan driver that runs on this host's processor, such as
PoCL or lavapipe: small problems, so that a run takes minutes), ``gpu`` (an OpenCL or
Vulkan GPU) and ``cuda``. ``--quick`` picks each profile's smoke-test sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["Profile", "Sizes", "sizes_for"]

Profile = Literal["cpu", "host-device", "gpu", "cuda"]
Shape4 = tuple[int, int, int, int]


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one run (the defaults: the CPU backend's full run).

    Attributes
    ----------
    gemm : int
        Square GEMM size (n^3).
    host_gemm : int
        Size of the host's SciPy sgemm / dgemm ceiling.
    batch, batch_dim : int
        Strided batched GEMM: ``batch`` products of ``batch_dim``^3.
    conv : (N, C, K, H, W)
        The 3x3 stride-1 convolution of the forward and gradient rows.
    conv_stages : bool
        Also time ResNet-50's convolutions (3x3 at 64/128/256/512 channels on 56/28/14/7,
        the 7x7 stride-2 stem, 1x1 projections) at batch ``conv[0]``.
    depthwise, pool : (N, C, H, W)
        Input of the depthwise 3x3 convolution; of pooling and batch normalisation.
    attention : (B, H, S, D)
        Attention rows (full, causal, masked, grouped-query).
    kv_heads : int
        Key/value heads of the grouped-query row.
    attention_memory_seq : int
        Sequence of the peak-memory row (CPU only; 0 skips it).
    elementwise : int
        Elements of unary / binary / cast rows.
    matrix : int
        Square matrix of reduce / softmax / transpose rows.
    rows, row_len, table_rows : int
        Gather / scatter move ``rows`` rows of ``row_len`` floats to or from a table of
        ``table_rows`` rows.
    norm : (rows, cols)
        Layer / RMS normalisation.
    lrn : (N, C, H, W)
        Local response normalisation (size 5).
    copy_elements : int
        Floats copied by the bandwidth ceiling.
    repeats : int
        Timed samples per side of each row (the median is reported).
    overhead_calls : int
        Calls per sample of the per-call overhead row.
    min_sample_s : float
        Shortest timed sample: faster calls are batched (then one synchronize).
    """

    gemm: int = 2048
    host_gemm: int = 2048
    batch: int = 64
    batch_dim: int = 256
    conv: tuple[int, int, int, int, int] = (8, 64, 64, 56, 56)
    conv_stages: bool = True
    depthwise: Shape4 = (8, 128, 56, 56)
    pool: Shape4 = (8, 64, 112, 112)
    attention: Shape4 = (4, 8, 2048, 64)
    kv_heads: int = 2
    attention_memory_seq: int = 16384
    elementwise: int = 1 << 24
    matrix: int = 4096
    rows: int = 4096
    row_len: int = 4096
    table_rows: int = 16384
    norm: tuple[int, int] = (16384, 1024)
    lrn: Shape4 = (8, 64, 56, 56)
    copy_elements: int = 1 << 24
    repeats: int = 9
    overhead_calls: int = 2000
    min_sample_s: float = 0.0


_CPU_QUICK = Sizes(
    gemm=256,
    host_gemm=256,
    batch=8,
    batch_dim=64,
    conv=(2, 8, 8, 12, 12),
    conv_stages=False,
    depthwise=(2, 16, 16, 16),
    pool=(2, 8, 32, 32),
    attention=(1, 2, 256, 32),
    kv_heads=1,
    attention_memory_seq=2048,
    elementwise=1 << 16,
    matrix=256,
    rows=64,
    row_len=256,
    table_rows=256,
    norm=(256, 256),
    lrn=(2, 8, 16, 16),
    copy_elements=1 << 16,
    repeats=3,
    overhead_calls=200,
    min_sample_s=0.002,
)

_HOST_DEVICE = Sizes(
    gemm=512,
    host_gemm=1024,
    batch=16,
    batch_dim=128,
    conv=(2, 32, 32, 28, 28),
    conv_stages=False,
    depthwise=(2, 64, 28, 28),
    pool=(2, 32, 56, 56),
    attention=(1, 4, 512, 64),
    kv_heads=1,
    attention_memory_seq=0,
    elementwise=1 << 22,
    matrix=1024,
    rows=1024,
    row_len=1024,
    table_rows=4096,
    norm=(4096, 1024),
    lrn=(2, 32, 28, 28),
    copy_elements=1 << 22,
    repeats=5,
    overhead_calls=500,
    min_sample_s=0.01,
)

_HOST_DEVICE_QUICK = replace(
    _CPU_QUICK,
    gemm=128,
    host_gemm=256,
    batch=4,
    batch_dim=32,
    conv=(1, 8, 8, 12, 12),
    depthwise=(1, 16, 16, 16),
    pool=(1, 8, 32, 32),
    attention=(1, 2, 64, 32),
    attention_memory_seq=0,
    elementwise=1 << 14,
    matrix=128,
    norm=(128, 256),
    lrn=(1, 8, 16, 16),
    copy_elements=1 << 14,
    overhead_calls=50,
    min_sample_s=0.002,
)

_GPU = Sizes(
    gemm=4096,
    host_gemm=1024,
    batch=64,
    batch_dim=512,
    conv=(32, 64, 64, 56, 56),
    conv_stages=True,
    depthwise=(32, 256, 56, 56),
    pool=(32, 64, 112, 112),
    attention=(4, 16, 2048, 64),
    kv_heads=4,
    attention_memory_seq=0,
    elementwise=1 << 26,
    matrix=8192,
    rows=16384,
    row_len=1024,
    table_rows=65536,
    norm=(65536, 1024),
    lrn=(32, 64, 56, 56),
    copy_elements=1 << 26,
    repeats=9,
    overhead_calls=2000,
    min_sample_s=0.005,
)

_GPU_QUICK = replace(
    _GPU,
    gemm=1024,
    batch=16,
    batch_dim=256,
    conv=(8, 64, 64, 56, 56),
    conv_stages=False,
    depthwise=(8, 64, 56, 56),
    pool=(8, 64, 56, 56),
    attention=(1, 8, 1024, 64),
    elementwise=1 << 22,
    matrix=2048,
    rows=4096,
    table_rows=8192,
    norm=(4096, 1024),
    lrn=(8, 64, 28, 28),
    copy_elements=1 << 22,
    repeats=3,
    overhead_calls=200,
)

_TABLE: dict[tuple[Profile, bool], Sizes] = {
    ("cpu", False): Sizes(),
    ("cpu", True): _CPU_QUICK,
    ("host-device", False): _HOST_DEVICE,
    ("host-device", True): _HOST_DEVICE_QUICK,
    ("gpu", False): _GPU,
    ("gpu", True): _GPU_QUICK,
    ("cuda", False): _GPU,
    ("cuda", True): _GPU_QUICK,
}


def sizes_for(profile: Profile, quick: bool = False) -> Sizes:
    """The default sizes of a profile (``quick``: the smoke-test sizes)."""
    return _TABLE[(profile, quick)]
