/* dtype conversion: y[i] = convert(x[i]) for n elements between float16 and bfloat16 (u16 bit
 * patterns), float32 and, with USE_FP64, float64. Round to nearest-even, overflow to infinity,
 * NaN kept. One work-item converts EW consecutive elements (see elementwise.cl). Input and
 * output may be the same memory when their element sizes match. Kernels are named
 * cast_<from>_<to> with f16, bf16, f32, f64. */
#include "dialect.h"
#include "convert.h"

#ifndef EW
#define EW 1
#endif

#define CHAL_CAST(from, to, TIN, TOUT, expr)                                                     \
    KERNEL void cast_##from##_##to(GLOBAL const TIN* x, i64 xo, GLOBAL TOUT* y, i64 yo, i64 n) { \
        i64 base = GID(0) * EW;                                                                  \
        i64 len = n - base;                                                                      \
        if (len <= 0) return;                                                                    \
        GLOBAL const TIN* xs = x + xo + base;                                                    \
        GLOBAL TOUT* ys = y + yo + base;                                                         \
        if (len >= EW) {                                                                         \
            for (int l = 0; l < EW; ++l) {                                                       \
                TIN v = xs[l];                                                                   \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        } else {                                                                                 \
            for (i64 l = 0; l < len; ++l) {                                                      \
                TIN v = xs[l];                                                                   \
                ys[l] = (expr);                                                                  \
            }                                                                                    \
        }                                                                                        \
    }

CHAL_CAST(f16, f16, u16, u16, v)
CHAL_CAST(f16, bf16, u16, u16, chal_bf16_bits(chal_f16_value(v)))
CHAL_CAST(f16, f32, u16, float, chal_f16_value(v))
CHAL_CAST(bf16, f16, u16, u16, chal_f16_bits(chal_bf16_value(v)))
CHAL_CAST(bf16, bf16, u16, u16, v)
CHAL_CAST(bf16, f32, u16, float, chal_bf16_value(v))
CHAL_CAST(f32, f16, float, u16, chal_f16_bits(v))
CHAL_CAST(f32, bf16, float, u16, chal_bf16_bits(v))
CHAL_CAST(f32, f32, float, float, v)

#if defined(USE_FP64)
CHAL_CAST(f16, f64, u16, double, (double)chal_f16_value(v))
CHAL_CAST(bf16, f64, u16, double, (double)chal_bf16_value(v))
CHAL_CAST(f32, f64, float, double, (double)v)
CHAL_CAST(f64, f16, double, u16, chal_f16_bits(chal_f32_odd(v)))
CHAL_CAST(f64, bf16, double, u16, chal_bf16_bits(chal_f32_odd(v)))
CHAL_CAST(f64, f32, double, float, (float)v)
CHAL_CAST(f64, f64, double, double, v)
#endif
