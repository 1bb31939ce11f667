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
 *
 * OpenCL builds with EW = 16 evaluate each op on vectors of VL lanes (REAL<VL>, VL = 16 by
 * default; 4 or 8 where the device compiler's vectors are 256 bits wide, see the OpenCL
 * backend's vector_bits probe): PoCL's vector builtins (exp, erfc, pow, ...) are 10-40 times
 * faster than 16 scalar calls. The expressions are written to mean the same for a scalar and a
 * vector v. sin and cos stay scalar: PoCL's vector versions lose tiny arguments (sin(1e-20) =
 * 0.0115 next to a huge lane).
 */
#include "dialect.h"
#include "strided.h"

#ifndef EW
#define EW 1
#endif

#define R(c) ((REAL)(c))

#if defined(__OPENCL_VERSION__) && EW == 16
#ifndef VL
#define VL 16
#endif
#define REALV CHAL_CAT(REAL, VL)
#define CHAL_VLOAD(p) CHAL_CAT(vload, VL)(0, (p))
#define CHAL_VSTORE(v, p) CHAL_CAT(vstore, VL)((v), 0, (p))
/* Evaluate `expr` (of v) on the EW elements as vectors of VL when `vec`, else fall through to
 * the scalar loop. */
#define CHAL_VRUN(vec, expr)                                                                     \
    if (vec) {                                                                                   \
        for (int q = 0; q < EW; q += VL) {                                                       \
            REALV v = CHAL_VLOAD(xs + q);                                                        \
            CHAL_VSTORE((expr), ys + q);                                                         \
        }                                                                                        \
    } else
#define CHAL_VBIN(vec, expr)                                                                     \
    if (vec) {                                                                                   \
        for (int q = 0; q < EW; q += VL) {                                                       \
            REALV u = CHAL_VLOAD(as + q);                                                        \
            REALV w = CHAL_VLOAD(bs + q);                                                        \
            CHAL_VSTORE((expr), ys + q);                                                         \
        }                                                                                        \
    } else
/* Whole vectors of a broadcast run from l on: u and w from `uload` / `wload` at offset l. */
#define CHAL_VSPAN(vec, expr, uload, wload)                                                      \
    for (; vec && l + VL <= len; l += VL) {                                                      \
        REALV u = uload;                                                                         \
        REALV w = wload;                                                                         \
        CHAL_VSTORE((expr), ys + l);                                                             \
    }
#define CHAL_SIGN(v) sign(v)
#else
#define CHAL_VRUN(vec, expr)
#define CHAL_VBIN(vec, expr)
#define CHAL_VSPAN(vec, expr, uload, wload)
#define CHAL_SIGN(v) ((v) > R(0) ? R(1) : R(-1))
#endif

/* min(max(v, lo), hi) with NaN kept. */
#define CHAL_CLIP(v) (((v) < lo ? lo : (v)) > hi ? hi : ((v) < lo ? lo : (v)))

/* tanh, exactly +-1 where it rounds there (PoCL's float tanh stops at 1 - 2^-24). */
#if defined(USE_FP64)
#define CHAL_TANH_ONE 19.5
#else
#define CHAL_TANH_ONE 9.5f
#endif
#define CHAL_TANH(v) (fabs(v) >= CHAL_TANH_ONE ? CHAL_SIGN(v) : tanh(v))

/* The unary functions of v. RELU maps NaN to 0 (NaN > 0 is false); the rest is each formula in
 * IEEE arithmetic. GELU is x * Phi(x) through erfc, accurate where 1 + erf(x / sqrt 2) cancels;
 * GELU_TANH's 0.5 * x * (1 + tanh(z)) is computed as x / (1 + exp(-2z)), the same function
 * without the cancellation (and NaN at -inf, as the formula gives). */
#define CHAL_UNARY_OPS(X)                                                                        \
    X(relu, 1, v > R(0) ? v : R(0))                                                              \
    X(sigmoid, 1, R(1) / (R(1) + exp(-v)))                                                       \
    X(tanh, 1, CHAL_TANH(v))                                                                     \
    X(exp, 1, exp(v))                                                                            \
    X(log, 1, log(v))                                                                            \
    X(sqrt, 1, sqrt(v))                                                                          \
    X(abs, 1, fabs(v))                                                                           \
    X(neg, 1, -v)                                                                                \
    X(gelu, 1, v * (R(0.5) * erfc(-v * R(0.70710678118654752440))))                              \
    X(gelu_tanh, 1, v / (R(1) + exp(R(-1.59576912160573071176) * (v + R(0.044715) * v * v * v)))) \
    X(silu, 1, v / (R(1) + exp(-v)))                                                             \
    X(erf, 1, erf(v))                                                                            \
    X(reciprocal, 1, R(1) / v)                                                                   \
    X(square, 1, v * v)                                                                          \
    X(sin, 0, sin(v))                                                                            \
    X(cos, 0, cos(v))                                                                            \
    X(leaky_relu, 1, v >= R(0) ? v : alpha * v)                                                  \
    X(clip, 1, CHAL_CLIP(v))

/* unary_<op>: y = op(x) over n elements (alpha: LEAKY_RELU's slope; lo / hi: CLIP's bounds). */
#define CHAL_UNARY_KERNEL(name, vec, expr)                                                       \
    KERNEL void unary_##name(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, i64 n, REAL alpha, \
                             REAL lo, REAL hi) {                                                 \
        i64 base = GID(0) * EW;                                                                  \
        i64 len = n - base;                                                                      \
        if (len <= 0) return;                                                                    \
        GLOBAL const REAL* xs = x + xo + base;                                                   \
        GLOBAL REAL* ys = y + yo + base;                                                         \
        if (len >= EW) {                                                                         \
            CHAL_VRUN(vec, expr)                                                                 \
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
    X(add, 1, u + w)                                                                             \
    X(sub, 1, u - w)                                                                             \
    X(mul, 1, u * w)                                                                             \
    X(div, 1, u / w)                                                                             \
    X(max, 1, (u >= w || w != w) ? u : w)                                                        \
    X(min, 1, (u <= w || w != w) ? u : w)                                                        \
    X(pow, CHAL_VECTOR_POW, pow(u, w))

/* PoCL's double16 pow is wrong for negative bases (pow(-2, 3) = -0.125): double pow stays scalar. */
#if defined(USE_FP64)
#define CHAL_VECTOR_POW 0
#else
#define CHAL_VECTOR_POW 1
#endif

/* binary_<op>: y = op(a, b) over n elements. */
#define CHAL_BINARY_KERNEL(name, vec, expr)                                                           \
    KERNEL void binary_##name(GLOBAL const REAL* a, i64 ao, GLOBAL const REAL* b, i64 bo, GLOBAL REAL* y, \
                              i64 yo, i64 n) {                                                   \
        i64 base = GID(0) * EW;                                                                  \
        i64 len = n - base;                                                                      \
        if (len <= 0) return;                                                                    \
        GLOBAL const REAL* as = a + ao + base;                                                   \
        GLOBAL const REAL* bs = b + bo + base;                                                   \
        GLOBAL REAL* ys = y + yo + base;                                                         \
        if (len >= EW) {                                                                         \
            CHAL_VBIN(vec, expr)                                                                 \
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
#define CHAL_BROADCAST_KERNEL(name, vec, expr)                                                        \
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
        i64 l = 0;                                                                               \
        if (ia == 1 && ib == 1) {                                                                \
            CHAL_VSPAN(vec, expr, CHAL_VLOAD(as + l), CHAL_VLOAD(bs + l))                        \
            for (; l < len; ++l) {                                                               \
                REAL u = as[l];                                                                  \
                REAL w = bs[l];                                                                  \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        } else if (ia == 1 && ib == 0) {                                                         \
            CHAL_VSPAN(vec, expr, CHAL_VLOAD(as + l), (REALV)(bs[0]))                            \
            REAL w = bs[0];                                                                      \
            for (; l < len; ++l) {                                                               \
                REAL u = as[l];                                                                  \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        } else if (ia == 0 && ib == 1) {                                                         \
            CHAL_VSPAN(vec, expr, (REALV)(as[0]), CHAL_VLOAD(bs + l))                            \
            REAL u = as[0];                                                                      \
            for (; l < len; ++l) {                                                               \
                REAL w = bs[l];                                                                  \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        } else {                                                                                 \
            for (; l < len; ++l) {                                                               \
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
