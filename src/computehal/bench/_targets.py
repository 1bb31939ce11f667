"""The pass criteria of every row, per profile, in one table.

CPU: GEMMs within 5% of a direct SciPy BLAS call (batched: 15% of ``numpy.matmul``),
bf16 mixed precision at 0.75 of sgemm; convolutions at 0.8 (forward) and 0.7
(gradients) of sgemm counting the direct convolution's FLOPs; attention at 0.7 (full,
masked, grouped-query) and 0.6 (causal, counting the FLOPs the mask keeps) of sgemm;
every memory-bound row (element-wise, broadcasting, casts, reductions, softmax,
normalisation, data movement) at 0.6 of the copy bandwidth, pooling at 0.5; a
one-element call under 10 µs of CPU time; attention's peak extra memory under 256 MiB.

CUDA: GEMMs at 0.9 of cuBLAS on the same problem, attention within 2x the time of
PyTorch's ``scaled_dot_product_attention``, memory-bound rows at 0.6 of the
device-to-device copy bandwidth.

OpenCL / Vulkan devices have no vendor BLAS to compare with: their GEMM, convolution
and attention rows report GFLOP/s and the ratio to the host's sgemm without a verdict;
their memory-bound rows are held to 0.6 (pooling 0.5) of their own ``copy_dtod``.
Depthwise convolution, 16-bit GEMM against a float32 ceiling and host <-> device copies
are reported without a target everywhere.
"""

from __future__ import annotations

from ._harness import Target
from ._sizes import Profile

__all__ = ["target_for"]

_BANDWIDTH = {"bandwidth": Target("rate", 0.6), "pool": Target("rate", 0.5)}

_TARGETS: dict[Profile, dict[str, Target]] = {
    "cpu": {
        "gemm": Target("time", 1.05),
        "batched_gemm": Target("time", 1.15),
        "gemm_mixed_precision": Target("rate", 0.75),
        "conv_forward": Target("rate", 0.8),
        "conv_backward": Target("rate", 0.7),
        "attention": Target("rate", 0.7),
        "attention_causal": Target("rate", 0.6),
        "overhead": Target("value_max", 10.0),
        "attention_memory": Target("value_max", 256.0),
        **_BANDWIDTH,
    },
    "cuda": {
        "gemm": Target("rate", 0.9),
        "batched_gemm": Target("rate", 0.9),
        "gemm_mixed_precision": Target("rate", 0.9),
        "attention": Target("time", 2.0),
        "attention_causal": Target("time", 2.0),
        "bandwidth": Target("rate", 0.6),
        "pool": Target("rate", 0.6),
    },
    "host-device": dict(_BANDWIDTH),
    "gpu": dict(_BANDWIDTH),
}


def target_for(profile: Profile, key: str) -> Target | None:
    """The target of rows of kind ``key`` on ``profile``, or None (reported without a verdict)."""
    return _TARGETS[profile].get(key)
