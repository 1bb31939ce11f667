/* Reductions and softmax along one axis of a row-major float32 tensor viewed as
 * [outer, length, inner].
 *
 * *_rows kernels (inner == 1): one work-group per slice, a strided fold per work-item, then a
 * tree reduction in local memory. *_cols kernels (inner > 1): one work-item per (outer, inner)
 * slice, folding along the axis (neighbouring work-items read neighbouring addresses).
 * MAX / MIN fold from -inf / +inf and ignore NaN, like numpy.fmax / fmin reductions.
 * Build parameters: LS, the work-group size of the *_rows kernels (a power of two); CONTIG = 1
 * makes each work-item of a *_rows group fold one contiguous slab with 16 independent lanes
 * (vector code on CPU devices), CONTIG = 0 interleaves work-items (coalesced on GPUs).
 */
#include "dialect.h"

#ifndef LS
#define LS 64
#endif
#ifndef CONTIG
#define CONTIG 0
#endif
#ifndef VW
#define VW 8
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

/* Fold src[start, end) with op `kind` in 16 independent lanes, then combine the lanes. */
DEVICE float chal_fold(GLOBAL const float* src, i64 start, i64 end, int kind) {
    float init = chal_identity(kind);
    float lanes[16];
    for (int l = 0; l < 16; ++l) lanes[l] = init;
    i64 i = start;
    if (kind == OP_MAX) {
        for (; i + 16 <= end; i += 16) {
            for (int l = 0; l < 16; ++l) {
                float v = src[i + l];
                lanes[l] = v > lanes[l] ? v : lanes[l];
            }
        }
    } else if (kind == OP_MIN) {
        for (; i + 16 <= end; i += 16) {
            for (int l = 0; l < 16; ++l) {
                float v = src[i + l];
                lanes[l] = v < lanes[l] ? v : lanes[l];
            }
        }
    } else {
        for (; i + 16 <= end; i += 16) {
            for (int l = 0; l < 16; ++l) lanes[l] += src[i + l];
        }
    }
    float acc = init;
    for (; i < end; ++i) acc = chal_combine(kind, acc, src[i]);
    for (int l = 0; l < 16; ++l) acc = chal_combine(kind, acc, lanes[l]);
    return acc;
}

/* This work-item's fold of src[start, end) within a work-group of LS. */
DEVICE float chal_group_fold(GLOBAL const float* src, i64 start, i64 end, int kind) {
#if CONTIG
    i64 slab = (end - start + LS - 1) / LS;
    i64 lo = start + LID(0) * slab;
    i64 hi = lo + slab < end ? lo + slab : end;
    return chal_fold(src, lo, hi, kind);
#else
    float acc = chal_identity(kind);
    for (i64 i = start + LID(0); i < end; i += LS) acc = chal_combine(kind, acc, src[i]);
    return acc;
#endif
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

/* Group g folds part g % chunks of row g / chunks (rows of `length` contiguous elements) into
 * y[yo + g]; MEAN divides by `mean_len`, leaving 0 for an empty axis. */
DEVICE void chal_reduce_rows(LOCAL float* part, GLOBAL const float* x, i64 xo, GLOBAL float* y, i64 yo,
                             i64 length, int op, i64 chunks, i64 mean_len) {
    i64 g = GRP(0);
    i64 row = g / chunks;
    i64 span = (length + chunks - 1) / chunks;
    i64 start = (g - row * chunks) * span;
    i64 end = start + span < length ? start + span : length;
    GLOBAL const float* src = x + xo + row * length;
    int kind = op == OP_MEAN ? OP_SUM : op;
    float r = chal_group_reduce(part, kind, chal_group_fold(src, start, end, kind));
    if (LID(0) == 0) y[yo + g] = (op == OP_MEAN && mean_len > 0) ? r / (float)mean_len : r;
}

/* One work-group per row of `length` contiguous elements (inner == 1). */
KERNEL void reduce_rows(GLOBAL const float* x, i64 xo, GLOBAL float* y, i64 yo, i64 length, int op) {
    SHARED float part[LS];
    chal_reduce_rows(part, x, xo, y, yo, length, op, 1, length);
}

/* Long rows split across `chunks` work-groups each; a second reduce_rows_split launch over the
 * partials (rows of `chunks` elements; op SUM for MEAN's first pass, mean_len = 0) finishes. */
KERNEL void reduce_rows_split(GLOBAL const float* x, i64 xo, GLOBAL float* y, i64 yo, i64 length, int op,
                              i64 chunks, i64 mean_len) {
    SHARED float part[LS];
    chal_reduce_rows(part, x, xo, y, yo, length, op, chunks, mean_len);
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

/* dst[i] = exp(src[i] - peak) for i in [lo, hi) with the given stride; returns the sum of the
 * values written. src may be dst (each element is read before it is written). With CONTIG and a
 * unit stride, exp runs on VW-wide vectors. */
DEVICE float chal_exp_store(GLOBAL const float* src, GLOBAL float* dst, i64 lo, i64 hi, i64 step, float peak) {
    float total = 0.0f;
    i64 i = lo;
#if CONTIG
    if (step == 1) {
        for (; i + VW <= hi; i += VW) {
            union {
                VEC_T v;
                float s[VW];
            } t;
            for (int l = 0; l < VW; ++l) t.s[l] = src[i + l];
            t.v = VEXP(t.v - peak);
            for (int l = 0; l < VW; ++l) {
                dst[i + l] = t.s[l];
                total += t.s[l];
            }
        }
    }
#endif
    for (; i < hi; i += step) {
        float e = exp(src[i] - peak);
        dst[i] = e;
        total += e;
    }
    return total;
}

/* Softmax of one contiguous slice per work-group: max (NaN ignored); exp(x - max) written to the
 * output while summing; then the output divided by the sum. A slice of all -inf gives NaN
 * (-inf - -inf); a NaN in the slice makes the slice NaN. */
KERNEL void softmax_rows(GLOBAL const float* x, i64 xo, GLOBAL float* y, i64 yo, i64 length) {
    SHARED float part[LS];
    i64 row = GRP(0);
    GLOBAL const float* src = x + xo + row * length;
    GLOBAL float* dst = y + yo + row * length;
    float peak = chal_group_reduce(part, OP_MAX, chal_group_fold(src, 0, length, OP_MAX));
#if CONTIG
    i64 slab = (length + LS - 1) / LS;
    i64 lo = LID(0) * slab;
    i64 hi = lo + slab < length ? lo + slab : length;
    i64 step = 1;
#else
    i64 lo = LID(0);
    i64 hi = length;
    i64 step = LS;
#endif
    float total = chal_group_reduce(part, OP_SUM, chal_exp_store(src, dst, lo, hi, step, peak));
    for (i64 i = lo; i < hi; i += step) dst[i] = dst[i] / total;
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
    float total = chal_exp_store(src, dst, 0, length * inner, inner, peak);
    for (i64 i = 0; i < length; ++i) dst[i * inner] = dst[i * inner] / total;
}
