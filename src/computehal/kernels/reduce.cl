/* Reductions and (log-)softmax along one axis of a row-major REAL tensor viewed as
 * [outer, length, inner].
 *
 * *_rows kernels (inner == 1): one work-group per slice folds it (fold.h). *_cols kernels
 * (inner > 1): one work-item per (outer, inner) slice, folding along the axis (neighbouring
 * work-items read neighbouring addresses). MAX / MIN ignore NaN; SUM / MEAN are IEEE.
 * Build parameters: REAL, LS, CONTIG (fold.h), VW (vector width of the CONTIG exp).
 */
#include "dialect.h"
#include "fold.h"

#ifndef VW
#define VW 8
#endif

/* Group g folds part g % chunks of row g / chunks (rows of `length` contiguous elements) into
 * y[yo + g]; MEAN divides by `mean_len`, leaving 0 for an empty axis. */
DEVICE void chal_reduce_rows(LOCAL REAL* part, GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo,
                             i64 length, int op, i64 chunks, i64 mean_len) {
    i64 g = GRP(0);
    i64 row = g / chunks;
    i64 span = (length + chunks - 1) / chunks;
    i64 start = (g - row * chunks) * span;
    i64 end = start + span < length ? start + span : length;
    GLOBAL const REAL* src = x + xo + row * length;
    int kind = op == REDUCE_MEAN ? REDUCE_SUM : op;
    REAL r = chal_group_reduce(part, kind, chal_group_fold(src, start, end, kind));
    if (LID(0) == 0) y[yo + g] = (op == REDUCE_MEAN && mean_len > 0) ? r / (REAL)mean_len : r;
}

/* One work-group per row of `length` contiguous elements (inner == 1). */
KERNEL void reduce_rows(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, i64 length, int op) {
    SHARED REAL part[LS];
    chal_reduce_rows(part, x, xo, y, yo, length, op, 1, length);
}

/* Long rows split across `chunks` work-groups each; a second reduce_rows_split launch over the
 * partials (rows of `chunks` elements; op SUM for MEAN's first pass, mean_len = 0) finishes. */
KERNEL void reduce_rows_split(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, i64 length, int op,
                              i64 chunks, i64 mean_len) {
    SHARED REAL part[LS];
    chal_reduce_rows(part, x, xo, y, yo, length, op, chunks, mean_len);
}

/* The column value of a reduction: MEAN divides by the length (0 for an empty axis). */
DEVICE REAL chal_reduce_col(GLOBAL const REAL* src, i64 length, i64 inner, int op) {
    int kind = op == REDUCE_MEAN ? REDUCE_SUM : op;
    REAL acc = chal_identity(kind);
    for (i64 i = 0; i < length; ++i) acc = chal_combine(kind, acc, src[i * inner]);
    return (op == REDUCE_MEAN && length > 0) ? acc / (REAL)length : acc;
}

KERNEL void reduce_cols(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, i64 outer, i64 length,
                        i64 inner, int op) {
    i64 g = GID(0);
    if (g >= outer * inner) return;
    i64 o = g / inner;
    i64 in = g - o * inner;
    y[yo + g] = chal_reduce_col(x + xo + o * length * inner + in, length, inner, op);
}

/* Sum of exp(src[i] - peak) for i in [lo, hi) with the given stride, also stored to dst[i]
 * when `store` (src may be dst: each element is read before it is written). With CONTIG and a
 * unit stride, exp runs on VW-wide vectors. */
DEVICE REAL chal_exp_sum(GLOBAL const REAL* src, GLOBAL REAL* dst, i64 lo, i64 hi, i64 step, REAL peak,
                         int store) {
    REAL total = (REAL)0;
    i64 i = lo;
#if CONTIG
    if (step == 1) {
        while (i + VW <= hi) { /* blocks of CHAL_BLOCK summed in VW lanes (see fold.h) */
            i64 stop = hi - i > CHAL_BLOCK ? i + CHAL_BLOCK : hi;
            union {
                VEC_T v;
                REAL s[VW];
            } lanes, t;
            lanes.v = VZERO;
            for (; i + VW <= stop; i += VW) {
                for (int l = 0; l < VW; ++l) t.s[l] = src[i + l];
                t.v = VEXP(t.v - peak);
                lanes.v += t.v;
                if (store) {
                    for (int l = 0; l < VW; ++l) dst[i + l] = t.s[l];
                }
            }
            REAL block = (REAL)0;
            for (int l = 0; l < VW; ++l) block += lanes.s[l];
            total += block;
        }
    }
#endif
    for (; i < hi; i += step) {
        REAL e = exp(src[i] - peak);
        if (store) dst[i] = e;
        total += e;
    }
    return total;
}

/* Softmax of one contiguous slice per work-group: max (NaN ignored); exp(x - max) written to the
 * output while summing; then the output divided by the sum. With `log`: x - max - log(sum), so
 * -inf entries stay -inf. A slice of all -inf gives NaN (-inf - -inf); +inf or NaN in the slice
 * makes the slice NaN. */
KERNEL void softmax_rows(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, i64 length, int log_) {
    SHARED REAL part[LS];
    i64 row = GRP(0);
    GLOBAL const REAL* src = x + xo + row * length;
    GLOBAL REAL* dst = y + yo + row * length;
    REAL peak = chal_group_reduce(part, REDUCE_MAX, chal_group_fold(src, 0, length, REDUCE_MAX));
    i64 lo, hi, step;
    chal_share(length, &lo, &hi, &step);
    REAL total = chal_group_reduce(part, REDUCE_SUM, chal_exp_sum(src, dst, lo, hi, step, peak, !log_));
    if (log_) {
        REAL lse = log(total);
        for (i64 i = lo; i < hi; i += step) dst[i] = (src[i] - peak) - lse;
    } else {
        for (i64 i = lo; i < hi; i += step) dst[i] = dst[i] / total;
    }
}

/* Softmax of the column starting at src (stride inner, `length` elements) into dst. */
DEVICE void chal_softmax_col(GLOBAL const REAL* src, GLOBAL REAL* dst, i64 length, i64 inner, int log_) {
    REAL peak = -INFINITY;
    for (i64 i = 0; i < length; ++i) peak = chal_combine(REDUCE_MAX, peak, src[i * inner]);
    REAL total = chal_exp_sum(src, dst, 0, length * inner, inner, peak, !log_);
    if (log_) {
        REAL lse = log(total);
        for (i64 i = 0; i < length; ++i) dst[i * inner] = (src[i * inner] - peak) - lse;
    } else {
        for (i64 i = 0; i < length; ++i) dst[i * inner] = dst[i * inner] / total;
    }
}

KERNEL void softmax_cols(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, i64 outer, i64 length,
                         i64 inner, int log_) {
    i64 g = GID(0);
    if (g >= outer * inner) return;
    i64 o = g / inner;
    i64 in = g - o * inner;
    chal_softmax_col(x + xo + o * length * inner + in, y + yo + o * length * inner + in, length, inner, log_);
}

#if defined(__OPENCL_VERSION__) && CONTIG
/* CPU devices: one work-item per CW neighbouring columns, on REAL<CW> vectors (PoCL's vector exp
 * is many times faster than CW scalar calls; CW = 16 by default, 4 or 8 where the device
 * compiler's vectors are 256 bits wide); a partial last block runs column by column. Grid:
 * outer * ceil(inner / CW). */
#ifndef CW
#define CW 16
#endif
#define REALV CHAL_CAT(REAL, CW)
#define CHAL_VLOAD(p) CHAL_CAT(vload, CW)(0, (p))
#define CHAL_VSTORE(v, p) CHAL_CAT(vstore, CW)((v), 0, (p))

/* The block of work-item g: slice o and first column c0; 0 when g is past the last block. */
DEVICE int chal_blockv(i64 g, i64 outer, i64 inner, i64* o, i64* c0) {
    i64 blocks = (inner + CW - 1) / CW;
    if (g >= outer * blocks) return 0;
    *o = g / blocks;
    *c0 = (g - *o * blocks) * CW;
    return 1;
}

KERNEL void reduce_colsv(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, i64 outer, i64 length,
                          i64 inner, int op) {
    i64 o, c0;
    if (!chal_blockv(GID(0), outer, inner, &o, &c0)) return;
    GLOBAL const REAL* src = x + xo + o * length * inner + c0;
    GLOBAL REAL* dst = y + yo + o * inner + c0;
    if (c0 + CW > inner) {
        for (i64 c = 0; c0 + c < inner; ++c) dst[c] = chal_reduce_col(src + c, length, inner, op);
        return;
    }
    int kind = op == REDUCE_MEAN ? REDUCE_SUM : op;
    REALV acc = (REALV)(chal_identity(kind));
    for (i64 i = 0; i < length; ++i) {
        REALV v = CHAL_VLOAD(src + i * inner);
        if (kind == REDUCE_MAX) {
            acc = v > acc ? v : acc;
        } else if (kind == REDUCE_MIN) {
            acc = v < acc ? v : acc;
        } else {
            acc += v;
        }
    }
    if (op == REDUCE_MEAN && length > 0) acc = acc / (REAL)length;
    CHAL_VSTORE(acc, dst);
}

KERNEL void softmax_colsv(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, i64 outer, i64 length,
                           i64 inner, int log_) {
    i64 o, c0;
    if (!chal_blockv(GID(0), outer, inner, &o, &c0)) return;
    GLOBAL const REAL* src = x + xo + o * length * inner + c0;
    GLOBAL REAL* dst = y + yo + o * length * inner + c0;
    if (c0 + CW > inner) {
        for (i64 c = 0; c0 + c < inner; ++c) chal_softmax_col(src + c, dst + c, length, inner, log_);
        return;
    }
    REALV peak = (REALV)(-INFINITY);
    for (i64 i = 0; i < length; ++i) {
        REALV v = CHAL_VLOAD(src + i * inner);
        peak = v > peak ? v : peak;
    }
    REALV total = (REALV)0;
    for (i64 i = 0; i < length; ++i) {
        REALV e = exp(CHAL_VLOAD(src + i * inner) - peak);
        if (!log_) CHAL_VSTORE(e, dst + i * inner);
        total += e;
    }
    if (log_) {
        REALV lse = log(total);
        for (i64 i = 0; i < length; ++i) CHAL_VSTORE((CHAL_VLOAD(src + i * inner) - peak) - lse, dst + i * inner);
    } else {
        for (i64 i = 0; i < length; ++i) CHAL_VSTORE(CHAL_VLOAD(dst + i * inner) / total, dst + i * inner);
    }
}
#endif
