"""CUDA references through CuPy: cuBLAS GEMMs, ``cudaMemcpy`` and PyTorch's attention.

Each reference works on its own operands of the row's shape and dtype, on the same
device, and synchronises the device before returning, so that the harness times it
like the backend's synchronised calls. Attention is compared with PyTorch's
``scaled_dot_product_attention`` when PyTorch with CUDA is importable, otherwise with
a plain CuPy formulation (cuBLAS GEMMs and a softmax over the full score matrix).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._harness import Limit
from ._sizes import Sizes

__all__ = ["CudaVendor", "torch_cuda"]

#: cudaDataType and cublasComputeType values used by ``cublasGemmEx``.
_CUDA_R_32F, _CUDA_R_16F, _CUDA_R_16BF = 0, 2, 14
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1


def torch_cuda() -> Any | None:
    """PyTorch when it is importable and sees a CUDA device, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


class CudaVendor:
    """cuBLAS (through CuPy) and PyTorch on the current CUDA device."""

    name = "cuBLAS"

    def __init__(self, sizes: Sizes) -> None:
        import cupy

        self.cp = cupy
        self.sizes = sizes
        self._keep: list[Any] = []

    def close(self) -> None:
        """Drop the operands (CuPy's pool keeps the memory for reuse)."""
        self._keep.clear()
        self.cp.get_default_memory_pool().free_all_blocks()

    def _sync(self) -> None:
        self.cp.cuda.runtime.deviceSynchronize()

    def _random(self, shape: tuple[int, ...], dtype: Any) -> Any:
        array = self.cp.random.default_rng(7).standard_normal(shape, dtype=np.float32).astype(dtype)
        self._keep.append(array)
        return array

    def compute(self) -> Limit:
        """cuBLAS sgemm of ``sizes.gemm``^3: the compute ceiling of convolution rows."""
        limit = self.gemm("float32", self.sizes.gemm)
        return Limit("cuBLAS sgemm", limit.run, limit.work)

    def copy(self, nbytes: int) -> Limit:
        """``cudaMemcpy`` device to device of ``nbytes`` (bytes read + written)."""
        rt = self.cp.cuda.runtime
        src = self.cp.ones(nbytes // 4, dtype=np.float32)
        dst = self.cp.empty_like(src)
        self._keep += [src, dst]

        def run() -> None:
            rt.memcpy(dst.data.ptr, src.data.ptr, nbytes, rt.memcpyDeviceToDevice)
            self._sync()

        return Limit("cudaMemcpy DtoD", run, 2.0 * nbytes, kind="bandwidth")

    def gemm(self, dtype: str, n: int) -> Limit:
        """``cupy.matmul`` (cuBLAS) of two ``n`` x ``n`` matrices of ``dtype``."""
        if dtype == "bfloat16":
            return self.gemm_mixed_precision("bf16", n)
        a, b = self._random((n, n), dtype), self._random((n, n), dtype)
        out = self.cp.empty((n, n), dtype)
        self._keep.append(out)

        def run() -> None:
            self.cp.matmul(a, b, out=out)
            self._sync()

        return Limit(f"cuBLAS {dtype}", run, 2.0 * n**3)

    def batched_gemm(self, batch: int, dim: int) -> Limit:
        """``cupy.matmul`` on stacked float32 matrices (cuBLAS strided batched)."""
        a, b = self._random((batch, dim, dim), np.float32), self._random((batch, dim, dim), np.float32)
        out = self.cp.empty_like(a)
        self._keep.append(out)

        def run() -> None:
            self.cp.matmul(a, b, out=out)
            self._sync()

        return Limit("cuBLAS strided batched", run, 2.0 * batch * dim**3)

    def gemm_mixed_precision(self, prec: str, n: int) -> Limit:
        """``cublasGemmEx`` on 16-bit operands with float32 accumulation and output."""
        from cupy_backends.cuda.libs import cublas

        cp = self.cp
        narrow = _CUDA_R_16BF if prec == "bf16" else _CUDA_R_16F
        # Random 16-bit patterns of moderate magnitude: the top half of float32 values
        # (bf16), or float16 values; cuBLAS only reads the bits.
        a32, b32 = self._random((n, n), np.float32), self._random((n, n), np.float32)
        if prec == "bf16":
            a16, b16 = ((x.view(np.uint32) >> 16).astype(np.uint16) for x in (a32, b32))
        else:
            a16, b16 = a32.astype(np.float16), b32.astype(np.float16)
        out = cp.empty((n, n), np.float32)
        self._keep += [a16, b16, out]
        one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        handle = cp.cuda.device.get_cublas_handle()

        def run() -> None:
            mode = cublas.getPointerMode(handle)
            cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
            try:
                cublas.gemmEx(
                    handle,
                    0,
                    0,
                    n,
                    n,
                    n,
                    one.ctypes.data,
                    a16.data.ptr,
                    narrow,
                    n,
                    b16.data.ptr,
                    narrow,
                    n,
                    zero.ctypes.data,
                    out.data.ptr,
                    _CUDA_R_32F,
                    n,
                    _CUBLAS_COMPUTE_32F,
                    _CUBLAS_GEMM_DEFAULT,
                )
            finally:
                cublas.setPointerMode(handle, mode)
            self._sync()

        return Limit(f"cuBLAS GemmEx {prec}", run, 2.0 * n**3)

    def attention(self, shape: tuple[int, int, int, int], causal: bool, mask: bool, kv_heads: int) -> Limit:
        """PyTorch's SDPA on the same problem, or a plain CuPy version without PyTorch."""
        b, h, s, d = shape
        torch = torch_cuda()
        if torch is not None:
            return self._sdpa(torch, shape, causal, mask, kv_heads)
        cp = self.cp
        q = self._random(shape, np.float32)
        k, v = self._random((b, kv_heads, s, d), np.float32), self._random((b, kv_heads, s, d), np.float32)
        if kv_heads != h:
            k, v = cp.repeat(k, h // kv_heads, axis=1), cp.repeat(v, h // kv_heads, axis=1)
        bias = self._random((b, 1, 1, s), np.float32) if mask else None
        upper = cp.triu(cp.full((s, s), -cp.inf, dtype=np.float32), 1) if causal else None
        scale = np.float32(1.0 / math.sqrt(d))

        def run() -> None:
            scores = cp.matmul(q, k.transpose(0, 1, 3, 2)) * scale
            if bias is not None:
                scores += bias
            if upper is not None:
                scores += upper
            scores -= scores.max(axis=-1, keepdims=True)
            cp.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            cp.matmul(scores, v)
            self._sync()

        return Limit("CuPy matmul+softmax", run, 0.0, kind="reference")

    def _sdpa(
        self, torch: Any, shape: tuple[int, int, int, int], causal: bool, mask: bool, kv_heads: int
    ) -> Limit:
        b, h, s, d = shape
        gen = torch.Generator(device="cuda").manual_seed(7)
        q = torch.randn(shape, device="cuda", generator=gen)
        k = torch.randn((b, kv_heads, s, d), device="cuda", generator=gen)
        v = torch.randn((b, kv_heads, s, d), device="cuda", generator=gen)
        if kv_heads != h:
            k, v = k.repeat_interleave(h // kv_heads, dim=1), v.repeat_interleave(h // kv_heads, dim=1)
        bias = torch.randn((b, 1, 1, s), device="cuda", generator=gen) if mask else None
        sdpa = torch.nn.functional.scaled_dot_product_attention
        self._keep += [q, k, v, bias]

        def run() -> None:
            with torch.no_grad():
                sdpa(q, k, v, attn_mask=bias, is_causal=causal)
            torch.cuda.synchronize()

        return Limit("torch SDPA", run, 0.0, kind="reference")
