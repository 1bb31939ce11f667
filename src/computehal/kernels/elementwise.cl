/* Element-wise kernels: unary and binary float32 maps, and a fill.
 *
 * Every kernel takes element offsets for its pointers (pointers into the middle of an
 * allocation) and a count. One work-item handles EW consecutive elements (build parameter:
 * 1, the default, for GPUs; 16 on CPU devices, where the fixed-length inner loop becomes
 * vector code, no alignment assumed); the last work-item handles the ragged tail. Input and output may be
 * the same memory (each element is read before it is written, by the same work-item).
 * Comparisons are written out instead of calling fmax / fmin builtins: the semantics are
 * those of fmax / fmin (a NaN operand is ignored) and PoCL vectorises selects, not calls.
 */
#include "dialect.h"

#ifndef EW
#define EW 1
#endif

#define CHAL_UNARY(name, expr)                                                                   \
    KERNEL void name(GLOBAL const float* x, i64 xo, GLOBAL float* y, i64 yo, i64 n) {          \
        i64 base = GID(0) * EW;                                                                  \
        GLOBAL const float* xs = x + xo + base;                                                  \
        GLOBAL float* ys = y + yo + base;                                                        \
        if (base + EW <= n) {                                                                    \
            for (int l = 0; l < EW; ++l) {                                                       \
                float v = xs[l];                                                                 \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        } else {                                                                                 \
            for (i64 l = 0; base + l < n; ++l) {                                                 \
                float v = xs[l];                                                                 \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        }                                                                                        \
    }

/* RELU is max(x, 0) ignoring NaN: NaN > 0 is false, so NaN -> 0. */
CHAL_UNARY(unary_relu, v > 0.0f ? v : 0.0f)
/* exp(-x) overflows to inf for very negative x, giving exactly 0. */
CHAL_UNARY(unary_sigmoid, 1.0f / (1.0f + exp(-v)))
CHAL_UNARY(unary_tanh, tanh(v))
CHAL_UNARY(unary_exp, exp(v))
CHAL_UNARY(unary_log, log(v))
CHAL_UNARY(unary_sqrt, sqrt(v))
CHAL_UNARY(unary_abs, fabs(v))
CHAL_UNARY(unary_neg, -v)

#define CHAL_BINARY(name, expr)                                                                  \
    KERNEL void name(GLOBAL const float* a, i64 ao, GLOBAL const float* b, i64 bo, GLOBAL float* y, \
                     i64 yo, i64 n) {                                                            \
        i64 base = GID(0) * EW;                                                                  \
        GLOBAL const float* as = a + ao + base;                                                  \
        GLOBAL const float* bs = b + bo + base;                                                  \
        GLOBAL float* ys = y + yo + base;                                                        \
        if (base + EW <= n) {                                                                    \
            for (int l = 0; l < EW; ++l) {                                                       \
                float u = as[l];                                                                 \
                float w = bs[l];                                                                 \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        } else {                                                                                 \
            for (i64 l = 0; base + l < n; ++l) {                                                 \
                float u = as[l];                                                                 \
                float w = bs[l];                                                                 \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        }                                                                                        \
    }

CHAL_BINARY(binary_add, u + w)
CHAL_BINARY(binary_sub, u - w)
CHAL_BINARY(binary_mul, u * w)
CHAL_BINARY(binary_div, u / w)
/* fmax / fmin: a NaN operand is ignored (w != w tests for NaN). */
CHAL_BINARY(binary_max, (u >= w || w != w) ? u : w)
CHAL_BINARY(binary_min, (u <= w || w != w) ? u : w)

/* y[yo .. yo + n) = value. */
KERNEL void fill_f32(GLOBAL float* y, i64 yo, float value, i64 n) {
    i64 i = GID(0);
    if (i < n) y[yo + i] = value;
}
