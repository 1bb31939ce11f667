/* Rounding of GEMM operands for mixed precision, shared by gemm.cl and gemm_wg.cl: both paths
 * round op(A) and op(B) the same way (round-to-nearest-even to f16 or bf16 and back to float)
 * before any product uses them. mode: 0 none, 1 f16, 2 bf16. Needs dialect.h. */
#ifndef COMPUTEHAL_GEMM_ROUND_H
#define COMPUTEHAL_GEMM_ROUND_H

/* Round a float to the nearest IEEE half (round-to-nearest-even, overflow to inf) and back. */
DEVICE float chal_round_f16(float x) {
    u32 u = F32_BITS(x);
    u32 mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u) return x;                  /* NaN stays NaN */
    if (mag < 0x38800000u) {                          /* below 2^-14: half subnormal grid 2^-24 */
        return rint(x * 16777216.0f) * 5.9604644775390625e-8f;
    }
    u32 r = (u + 0x0fffu + ((u >> 13) & 1u)) & 0xffffe000u;
    if ((r & 0x7fffffffu) > 0x477fe000u) r = (u & 0x80000000u) | 0x7f800000u;  /* > 65504: inf */
    return BITS_F32(r);
}

/* Round a float to the nearest bfloat16 (round-to-nearest-even) and back. */
DEVICE float chal_round_bf16(float x) {
    u32 u = F32_BITS(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;
    return BITS_F32((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

DEVICE REAL chal_round(REAL x, int mode) {
#if defined(USE_FP64)
    return x;
#else
    return mode == 1 ? chal_round_f16(x) : (mode == 2 ? chal_round_bf16(x) : x);
#endif
}

#endif
