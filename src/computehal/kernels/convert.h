/* Conversions between float32 and the 16-bit storage types (IEEE half and bfloat16, kept as
 * u16 bit patterns), round-to-nearest-even with overflow to infinity and NaN kept quiet; and,
 * with USE_FP64, double to float rounded to odd, the intermediate that makes a later rounding
 * to a 16-bit type exact (no double rounding: float carries more than two extra bits). Needs
 * dialect.h. */
#ifndef COMPUTEHAL_CONVERT_H
#define COMPUTEHAL_CONVERT_H

DEVICE u16 chal_f16_bits(float x) {
    u32 u = F32_BITS(x);
    u32 sign = (u >> 16) & 0x8000u;
    u32 mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u) return (u16)(sign | 0x7e00u | ((mag >> 13) & 0x3ffu)); /* NaN */
    if (mag >= 0x477ff000u) return (u16)(sign | 0x7c00u);                        /* rounds past 65504 */
    if (mag >= 0x38800000u) {                                                    /* normal half */
        u32 r = mag + 0x0fffu + ((mag >> 13) & 1u);
        return (u16)(sign | ((r - 0x38000000u) >> 13));
    }
    /* subnormal half: multiples of 2^-24 (1024 * 2^-24 encodes as the smallest normal) */
    return (u16)(sign | (u32)rint(fabs(x) * 16777216.0f));
}

DEVICE u16 chal_bf16_bits(float x) {
    u32 u = F32_BITS(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x0040u); /* NaN */
    return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

DEVICE float chal_f16_value(u16 h) {
    u32 sign = ((u32)h & 0x8000u) << 16;
    u32 e = ((u32)h >> 10) & 0x1fu;
    u32 f = (u32)h & 0x3ffu;
    if (e == 0u) {
        float mag = (float)f * 5.9604644775390625e-8f;
        return sign ? -mag : mag;
    }
    if (e == 31u) return BITS_F32(sign | 0x7f800000u | (f << 13));
    return BITS_F32(sign | ((e + 112u) << 23) | (f << 13));
}

DEVICE float chal_bf16_value(u16 b) { return BITS_F32(((u32)b) << 16); }

#if defined(USE_FP64)
/* d rounded to float by round-to-odd: truncate toward zero, then set the last bit if inexact. */
DEVICE float chal_f32_odd(double d) {
    float f = (float)d;
    if (d != d || (double)f == d) return f;
    u32 u = F32_BITS(f);
    if (fabs((double)f) > fabs(d)) u -= 1u; /* f was rounded away from zero (inf steps to max) */
    return BITS_F32(u | 1u);
}
#endif

#endif
