"""LLVM IR plumbing shared by the CPU backend's hand-written float32 tile kernels.

The register-tile products (:mod:`._kgemm`, :mod:`._kdense`) are numba intrinsics whose
bodies are LLVM IR built with llvmlite: numba has no vector type, and LLVM's own
vectorisation of such loops spills or falls back to gathers. :class:`TileIR` carries one
code generation's builder and arguments and the few LLVM intrinsics and idioms those
bodies share (masked 16-lane loads and stores, fused multiply-add, prefetch, splats), so
each kernel module keeps only its own loop structure.
"""

# Function bodies are LLVM IR builders, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils

__all__ = ["LANES", "TileIR", "first_lanes", "masked_load", "splat"]

#: float32 lanes per vector (one AVX-512 register).
LANES = 16


def splat(builder: Any, value: Any, vec: Any) -> Any:
    """A vector of type ``vec`` (16 lanes) with the scalar ``value`` in every lane."""
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.IntType(32)(0))
    return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))


def masked_load(builder: Any) -> Any:
    """``llvm.masked.load`` of 16 float32: lanes whose mask is off are not read."""
    vec, i32 = ir.VectorType(ir.FloatType(), LANES), ir.IntType(32)
    kind = ir.FunctionType(vec, [vec.as_pointer(), i32, ir.VectorType(ir.IntType(1), LANES), vec])
    return cgutils.get_or_insert_function(builder.module, kind, "llvm.masked.load.v16f32.p0")


def first_lanes(builder: Any, count: Any) -> Any:
    """The mask of the first ``count`` (an int64 in 0..16) of 16 lanes."""
    i64 = ir.IntType(64)
    spread = splat(builder, count, ir.VectorType(i64, LANES))
    return builder.icmp_signed("<", ir.Constant(ir.VectorType(i64, LANES), list(range(LANES))), spread)


class TileIR:
    """The builder and arguments of one intrinsic's code generation, with shared idioms.

    Attributes
    ----------
    vec, mask_t, ptr_t, i32, i64 : llvmlite types
        A 16-lane float32 vector, its lane mask, a pointer to it, 32- and 64-bit ints.
    load, store, fma, prefetch : llvmlite functions
        ``llvm.masked.load`` / ``llvm.masked.store`` of 16 float32 (lanes whose mask is
        off are not touched), ``llvm.fma.v16f32`` and ``llvm.prefetch``.
    zero : ir.Constant
        A vector of 16 zeros.
    """

    def __init__(self, context: Any, builder: Any, signature: Any, args: Any) -> None:
        self.context, self.builder, self.signature, self.args = context, builder, signature, args
        self.vec = ir.VectorType(ir.FloatType(), LANES)
        self.i64, self.i32 = ir.IntType(64), ir.IntType(32)
        self.mask_t = ir.VectorType(ir.IntType(1), LANES)
        self.ptr_t = self.vec.as_pointer()
        module, vec, ptr_t, i32, mask_t = builder.module, self.vec, self.ptr_t, self.i32, self.mask_t
        self.load = masked_load(builder)
        self.store = cgutils.get_or_insert_function(
            module, ir.FunctionType(ir.VoidType(), [vec, ptr_t, i32, mask_t]), "llvm.masked.store.v16f32.p0"
        )
        self.fma = cgutils.get_or_insert_function(
            module, ir.FunctionType(vec, [vec, vec, vec]), "llvm.fma.v16f32"
        )
        byte_ptr = ir.IntType(8).as_pointer()
        self.prefetch = cgutils.get_or_insert_function(
            module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]), "llvm.prefetch.p0"
        )
        self.zero = ir.Constant(vec, [0.0] * LANES)

    def data(self, i: int) -> Any:
        """The data pointer of array argument ``i``."""
        sig = self.signature.args[i]
        return self.context.make_array(sig)(self.context, self.builder, self.args[i]).data

    def index(self, i: int) -> Any:
        """Integer argument ``i`` as an ``intp``."""
        return self.context.cast(self.builder, self.args[i], self.signature.args[i], types.intp)

    def at(self, array: int, offset: int) -> Any:
        """A pointer to element ``args[offset]`` of array argument ``array``."""
        return self.builder.gep(self.data(array), [self.index(offset)])

    def splat(self, value: Any, kind: Any) -> Any:
        """A vector of type ``kind`` (16 lanes) with ``value`` in every lane."""
        return splat(self.builder, value, kind)

    def vector_at(self, base: Any, j: int) -> Any:
        """A vector pointer to the ``j``-th run of 16 floats from float pointer ``base``."""
        return self.builder.bitcast(self.builder.gep(base, [self.i64(LANES * j)]), self.ptr_t)
