/* Reductions and softmax along one axis of a row-major float32 tensor viewed as
 * [outer, length, inner].
 *
 * *_rows kernels (inner == 1): one work-group per slice, a strided fold per work-item, then a
 * tree reduction in local memory. *_cols kernels (inner > 1): one work-item per (outer, inner)
 * slice, folding along the axis (neighbouring work-items read neighbouring addresses).
 * MAX / MIN fold from -inf / +inf and ignore NaN, like numpy.fmax / fmin reductions.
 * Build parameter: LS, the work-group size of the *_rows kernels (a power of two).
 */
#include "dialect.h"

#ifndef LS
#define LS 64
#endif

#define OP_SUM 0
#define OP_MAX 1
#define OP_MIN 2
#define OP_MEAN 3

DEVICE float chal_identity(int op) {
    return op == OP_MAX ? -INFINITY : (op == OP_MIN ? INFINITY : 0.0f);
}

/* Combine two partial results; NaN in v is ignored for MAX / MIN (acc never holds NaN). */
DEVICE float chal_combine(int op, float acc, float v) {
    if (op == OP_MAX) return v > acc ? v : acc;
    if (op == OP_MIN) return v < acc ? v : acc;
    return acc + v;
}

/* Tree-reduce LS partials in `part`; every work-item returns the result. */
DEVICE float chal_group_reduce(LOCAL float* part, int op, float mine) {
    int t = LID(0);
    part[t] = mine;
    BARRIER();
    for (int span = LS / 2; span > 0; span >>= 1) {
        if (t < span) part[t] = chal_combine(op, part[t], part[t + span]);
        BARRIER();
    }
    float r = part[0];
    BARRIER();
    return r;
}

KERNEL void reduce_rows(GLOBAL const float* x, i64 xo, GLOBAL float* y, i64 yo, i64 length, int op) {
    SHARED float part[LS];
    i64 row = GRP(0);
    GLOBAL const float* src = x + xo + row * length;
    int kind = op == OP_MEAN ? OP_SUM : op;
    float acc = chal_identity(kind);
    for (i64 i = LID(0); i < length; i += LS) acc = chal_combine(kind, acc, src[i]);
    float r = chal_group_reduce(part, kind, acc);
    if (LID(0) == 0) y[yo + row] = (op == OP_MEAN && length > 0) ? r / (float)length : r;
}

KERNEL void reduce_cols(GLOBAL const float* x, i64 xo, GLOBAL float* y, i64 yo, i64 outer, i64 length,
                        i64 inner, int op) {
    i64 g = GID(0);
    if (g >= outer * inner) return;
    i64 o = g / inner;
    i64 in = g - o * inner;
    GLOBAL const float* src = x + xo + o * length * inner + in;
    int kind = op == OP_MEAN ? OP_SUM : op;
    float acc = chal_identity(kind);
    for (i64 i = 0; i < length; ++i) acc = chal_combine(kind, acc, src[i * inner]);
    y[yo + g] = (op == OP_MEAN && length > 0) ? acc / (float)length : acc;
}

/* Softmax of one contiguous slice per work-group: max (NaN ignored), sum of exp, normalise.
 * A slice of all -inf gives NaN (-inf - -inf); a NaN in the slice makes the slice NaN. */
KERNEL void softmax_rows(GLOBAL const float* x, i64 xo, GLOBAL float* y, i64 yo, i64 length) {
    SHARED float part[LS];
    i64 row = GRP(0);
    GLOBAL const float* src = x + xo + row * length;
    GLOBAL float* dst = y + yo + row * length;
    float peak = -INFINITY;
    for (i64 i = LID(0); i < length; i += LS) peak = chal_combine(OP_MAX, peak, src[i]);
    peak = chal_group_reduce(part, OP_MAX, peak);
    float total = 0.0f;
    for (i64 i = LID(0); i < length; i += LS) total += exp(src[i] - peak);
    total = chal_group_reduce(part, OP_SUM, total);
    for (i64 i = LID(0); i < length; i += LS) dst[i] = exp(src[i] - peak) / total;
}

KERNEL void softmax_cols(GLOBAL const float* x, i64 xo, GLOBAL float* y, i64 yo, i64 outer, i64 length,
                         i64 inner) {
    i64 g = GID(0);
    if (g >= outer * inner) return;
    i64 o = g / inner;
    i64 in = g - o * inner;
    GLOBAL const float* src = x + xo + o * length * inner + in;
    GLOBAL float* dst = y + yo + o * length * inner + in;
    float peak = -INFINITY;
    for (i64 i = 0; i < length; ++i) peak = chal_combine(OP_MAX, peak, src[i * inner]);
    float total = 0.0f;
    for (i64 i = 0; i < length; ++i) total += exp(src[i * inner] - peak);
    for (i64 i = 0; i < length; ++i) dst[i * inner] = exp(src[i * inner] - peak) / total;
}
