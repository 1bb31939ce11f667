"""CpuBackend: the exact reference backend on the host, built on NumPy, SciPy's BLAS and numba.

Pointers are real host addresses of 64-byte-aligned blocks (:mod:`._memory`: freed
blocks wait in a quarantine, so a stale pointer is reported as freed). The backend is
assembled from one plumbing base (:mod:`._plumbing`: identity, memory hooks, typed views)
and one mixin per op family:

* :mod:`._gemm`: BLAS called in place with the caller's leading dimensions;
* :mod:`._conv`, :mod:`._conv_algorithms`: per-filter-tap GEMMs on the padded image
  (stride 1) or im2col + GEMM;
* :mod:`._attention`: tiles with an online softmax, parallel over (head, query block);
* :mod:`._axis`: reductions and softmax on cache-sized blocks;
* :mod:`._elementwise`: NumPy ufuncs with ``out=`` and compiled float32 transcendentals;
* :mod:`._movement`: copies, fills, gather and scatter.

Memory-bound work splits across a small pool of worker threads (:mod:`._runtime`;
NumPy ufuncs, BLAS and the compiled kernels release the GIL), so it uses every core.
``computehal bench`` holds every operation against this machine's limits.
"""

from __future__ import annotations

from ...backend import ALL_OPS
from ...errors import InvalidArgumentError
from ...memory import as_count
from ._attention import AttentionOps
from ._axis import AxisOps
from ._cast import CastOps
from ._conv import ConvOps
from ._elementwise import ElementwiseOps
from ._gemm import GemmOps
from ._movement import MovementOps
from ._norm import NormOps
from ._pool import PoolOps

__all__ = ["CpuBackend"]

_F32 = frozenset({"float32"})
_F32_F64 = frozenset({"float32", "float64"})
_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
_BYTES = frozenset({"uint8"})

#: Largest attention tile edge the constructor accepts, and largest tile (elements).
_MAX_BLOCK = 1 << 16
_MAX_TILE = 1 << 24


def _block(name: str, value: object) -> int:
    block = as_count(name, value)
    if not 1 <= block <= _MAX_BLOCK:
        raise InvalidArgumentError(f"{name} must be between 1 and {_MAX_BLOCK}, got {block}")
    return block


class CpuBackend(
    GemmOps, ConvOps, PoolOps, AttentionOps, AxisOps, NormOps, ElementwiseOps, CastOps, MovementOps
):
    """The host CPU: exact reference semantics at BLAS speed.

    Parameters
    ----------
    device : int
        Always 0 (the host); another value makes :meth:`init` raise DeviceError.
    attention_block_q : int, optional
        Query rows per attention tile (default 512; 1 to 65536).
    attention_block_kv : int, optional
        Keys per attention tile (default 512; 1 to 65536; the last chunk of a row may
        take up to half as many again). Extra memory stays O(block_q * (block_kv +
        head_dim)) per thread, whatever the sequence length; ``block_q * block_kv`` must
        not exceed 2**24.

    Raises
    ------
    InvalidArgumentError
        For a negative device or an attention block outside those bounds.
    """

    kind = "cpu"

    def __init__(
        self, device: int = 0, *, attention_block_q: int = 512, attention_block_kv: int = 512
    ) -> None:
        block_q = _block("attention_block_q", attention_block_q)
        block_kv = _block("attention_block_kv", attention_block_kv)
        if block_q * block_kv > _MAX_TILE:
            raise InvalidArgumentError(
                f"attention_block_q * attention_block_kv = {block_q * block_kv} exceeds {_MAX_TILE}"
            )
        super().__init__(device)
        self._block_q = block_q
        self._block_kv = block_kv

    def _native_dtypes(self) -> dict[str, frozenset[str]]:
        table = {op: _F32_F64 for op in ALL_OPS}
        table.update(gemm_mixed_precision=_F32, copy_dtod=_BYTES, fill=_FLOATS, cast=_FLOATS)
        return table
