/* Element-wise kernels of one arithmetic type REAL (float, or double with USE_FP64): one unary
 * and one binary map per op (unary_<op>, binary_<op>, broadcast_<op>, named by the ops' values),
 * and bit-pattern fills.
 *
 * Every kernel takes element offsets for its pointers (pointers into the middle of an
 * allocation) and a count. One work-item handles EW consecutive elements (build parameter:
 * 1, the default, for GPUs; 16 on CPU devices, where the fixed-length inner loop becomes
 * vector code, no alignment assumed); the last work-item handles the ragged tail. Input and
 * output may be the same memory (each element is read before it is written, by the same
 * work-item). One small kernel per op (rather than one kernel switching on the op code) keeps
 * each kernel quick to compile: PoCL compiles a kernel on its first launch. Comparisons are
 * written out instead of calling fmax / fmin builtins: the semantics are those of fmax / fmin
 * (a NaN operand is ignored) and PoCL vectorises selects, not calls.
 */
#include "dialect.h"
#include "strided.h"

#ifndef EW
#define EW 1
#endif

#define R(c) ((REAL)(c))

/* min(max(v, lo), hi) with NaN kept. */
DEVICE REAL chal_clip(REAL v, REAL lo, REAL hi) {
    REAL t = v < lo ? lo : v;
    return t > hi ? hi : t;
}

/* tanh, exactly +-1 where it rounds there (PoCL's float tanh stops at 1 - 2^-24). */
#if defined(USE_FP64)
#define CHAL_TANH_ONE 19.5
#else
#define CHAL_TANH_ONE 9.5f
#endif
DEVICE REAL chal_tanh(REAL v) { return fabs(v) >= CHAL_TANH_ONE ? (v > R(0) ? R(1) : R(-1)) : tanh(v); }

/* The unary functions of v. RELU maps NaN to 0 (NaN > 0 is false); the rest is each formula in
 * IEEE arithmetic. GELU is x * Phi(x) through erfc, accurate where 1 + erf(x / sqrt 2) cancels;
 * GELU_TANH's 0.5 * x * (1 + tanh(z)) is computed as x / (1 + exp(-2z)), the same function
 * without the cancellation (and NaN at -inf, as the formula gives). */
#define CHAL_UNARY_OPS(X)                                                                        \
    X(relu, v > R(0) ? v : R(0))                                                                 \
    X(sigmoid, R(1) / (R(1) + exp(-v)))                                                          \
    X(tanh, chal_tanh(v))                                                                        \
    X(exp, exp(v))                                                                               \
    X(log, log(v))                                                                               \
    X(sqrt, sqrt(v))                                                                             \
    X(abs, fabs(v))                                                                              \
    X(neg, -v)                                                                                   \
    X(gelu, v * (R(0.5) * erfc(-v * R(0.70710678118654752440))))                                 \
    X(gelu_tanh, v / (R(1) + exp(R(-1.59576912160573071176) * (v + R(0.044715) * v * v * v))))  \
    X(silu, v / (R(1) + exp(-v)))                                                                \
    X(erf, erf(v))                                                                               \
    X(reciprocal, R(1) / v)                                                                      \
    X(square, v * v)                                                                             \
    X(sin, sin(v))                                                                               \
    X(cos, cos(v))                                                                               \
    X(leaky_relu, v >= R(0) ? v : alpha * v)                                                     \
    X(clip, chal_clip(v, lo, hi))

/* unary_<op>: y = op(x) over n elements (alpha: LEAKY_RELU's slope; lo / hi: CLIP's bounds). */
#define CHAL_UNARY_KERNEL(name, expr)                                                            \
    KERNEL void unary_##name(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, i64 n, REAL alpha, \
                             REAL lo, REAL hi) {                                                 \
        i64 base = GID(0) * EW;                                                                  \
        i64 len = n - base;                                                                      \
        if (len <= 0) return;                                                                    \
        GLOBAL const REAL* xs = x + xo + base;                                                   \
        GLOBAL REAL* ys = y + yo + base;                                                         \
        if (len >= EW) {                                                                         \
            for (int l = 0; l < EW; ++l) {                                                       \
                REAL v = xs[l];                                                                  \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        } else {                                                                                 \
            for (i64 l = 0; l < len; ++l) {                                                      \
                REAL v = xs[l];                                                                  \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        }                                                                                        \
    }
CHAL_UNARY_OPS(CHAL_UNARY_KERNEL)

/* The binary functions of u and w: fmax / fmin ignore a NaN operand (w != w tests for NaN);
 * POW is C's pow. */
#define CHAL_BINARY_OPS(X)                                                                       \
    X(add, u + w)                                                                                \
    X(sub, u - w)                                                                                \
    X(mul, u * w)                                                                                \
    X(div, u / w)                                                                                \
    X(max, (u >= w || w != w) ? u : w)                                                           \
    X(min, (u <= w || w != w) ? u : w)                                                           \
    X(pow, pow(u, w))

/* binary_<op>: y = op(a, b) over n elements. */
#define CHAL_BINARY_KERNEL(name, expr)                                                           \
    KERNEL void binary_##name(GLOBAL const REAL* a, i64 ao, GLOBAL const REAL* b, i64 bo, GLOBAL REAL* y, \
                              i64 yo, i64 n) {                                                   \
        i64 base = GID(0) * EW;                                                                  \
        i64 len = n - base;                                                                      \
        if (len <= 0) return;                                                                    \
        GLOBAL const REAL* as = a + ao + base;                                                   \
        GLOBAL const REAL* bs = b + bo + base;                                                   \
        GLOBAL REAL* ys = y + yo + base;                                                         \
        if (len >= EW) {                                                                         \
            for (int l = 0; l < EW; ++l) {                                                       \
                REAL u = as[l];                                                                  \
                REAL w = bs[l];                                                                  \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        } else {                                                                                 \
            for (i64 l = 0; l < len; ++l) {                                                      \
                REAL u = as[l];                                                                  \
                REAL w = bs[l];                                                                  \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        }                                                                                        \
    }
CHAL_BINARY_OPS(CHAL_BINARY_KERNEL)

/* broadcast_<op>: out = op(a, b) with broadcasting. The output is contiguous, `inner` elements
 * per outer index (grid: (ceil(inner / run), outer count)); a and b have inner strides ia / ib
 * (0 or 1 in the common cases, which get loops of their own) and outer strides sa* / sb* over
 * the outer extents e1..e5 (0 along broadcast dimensions). */
#define CHAL_BROADCAST_KERNEL(name, expr)                                                        \
    KERNEL void broadcast_##name(GLOBAL const REAL* a, i64 ao, GLOBAL const REAL* b, i64 bo,     \
                                 GLOBAL REAL* y, i64 yo, i64 inner, i64 run, i64 ia, i64 ib,     \
                                 CHAL_OUTER_PARAMS) {                                            \
        i64 start = GID(0) * run;                                                                \
        i64 o = GID(1);                                                                          \
        i64 len = inner - start;                                                                 \
        if (len <= 0) return;                                                                    \
        len = len < run ? len : run;                                                             \
        i64 oa, ob;                                                                              \
        chal_outer(o, CHAL_OUTER_ARGS, &oa, &ob);                                                \
        GLOBAL const REAL* as = a + ao + oa + start * ia;                                        \
        GLOBAL const REAL* bs = b + bo + ob + start * ib;                                        \
        GLOBAL REAL* ys = y + yo + o * inner + start;                                            \
        if (ia == 1 && ib == 1) {                                                                \
            for (i64 l = 0; l < len; ++l) {                                                      \
                REAL u = as[l];                                                                  \
                REAL w = bs[l];                                                                  \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        } else if (ia == 1 && ib == 0) {                                                         \
            REAL w = bs[0];                                                                      \
            for (i64 l = 0; l < len; ++l) {                                                      \
                REAL u = as[l];                                                                  \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        } else if (ia == 0 && ib == 1) {                                                         \
            REAL u = as[0];                                                                      \
            for (i64 l = 0; l < len; ++l) {                                                      \
                REAL w = bs[l];                                                                  \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        } else {                                                                                 \
            for (i64 l = 0; l < len; ++l) {                                                      \
                REAL u = as[l * ia];                                                             \
                REAL w = bs[l * ib];                                                             \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        }                                                                                        \
    }
CHAL_BINARY_OPS(CHAL_BROADCAST_KERNEL)

/* y[yo .. yo + n) = value, a bit pattern of 16, 32 or 64 bits. */
#define CHAL_FILL(name, T)                                                                       \
    KERNEL void name(GLOBAL T* y, i64 yo, T value, i64 n) {                                      \
        i64 i = GID(0);                                                                          \
        if (i < n) y[yo + i] = value;                                                            \
    }
CHAL_FILL(fill_u16, u16)
CHAL_FILL(fill_u32, u32)
CHAL_FILL(fill_u64, u64)
