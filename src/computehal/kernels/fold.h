/* Folds of REAL values along a row, shared by reduce.cl and norm.cl.
 *
 * Ops are the shared REDUCE_* codes; MAX / MIN fold from -inf / +inf and ignore NaN, like
 * numpy.fmax / fmin reductions. A work-group of LS work-items (a power of two) folds a row:
 * with CONTIG = 1 each work-item folds one contiguous slab with 16 independent lanes (vector
 * code on CPU devices), with CONTIG = 0 the work-items interleave (coalesced on GPUs); the
 * partials are then tree-reduced in local memory. Needs dialect.h; LS and CONTIG defaulted
 * below. */
#ifndef COMPUTEHAL_FOLD_H
#define COMPUTEHAL_FOLD_H

#ifndef LS
#define LS 64
#endif
#ifndef CONTIG
#define CONTIG 0
#endif
/* Elements summed in lanes before the lanes are folded into a running total. */
#define CHAL_BLOCK 4096

DEVICE REAL chal_identity(int op) {
    return op == REDUCE_MAX ? (REAL)(-INFINITY) : (op == REDUCE_MIN ? (REAL)INFINITY : (REAL)0);
}

/* Combine two partial results; NaN in v is ignored for MAX / MIN (acc never holds NaN). */
DEVICE REAL chal_combine(int op, REAL acc, REAL v) {
    if (op == REDUCE_MAX) return v > acc ? v : acc;
    if (op == REDUCE_MIN) return v < acc ? v : acc;
    return acc + v;
}

/* Fold src[start, end) with op `kind` in 16 independent lanes, then combine the lanes. */
DEVICE REAL chal_fold(GLOBAL const REAL* src, i64 start, i64 end, int kind) {
    REAL init = chal_identity(kind);
    REAL lanes[16];
    for (int l = 0; l < 16; ++l) lanes[l] = init;
    i64 i = start;
    if (kind == REDUCE_MAX) {
        for (; i + 16 <= end; i += 16) {
            for (int l = 0; l < 16; ++l) {
                REAL v = src[i + l];
                lanes[l] = v > lanes[l] ? v : lanes[l];
            }
        }
    } else if (kind == REDUCE_MIN) {
        for (; i + 16 <= end; i += 16) {
            for (int l = 0; l < 16; ++l) {
                REAL v = src[i + l];
                lanes[l] = v < lanes[l] ? v : lanes[l];
            }
        }
    } else {
        /* Sums in blocks of CHAL_BLOCK: the lanes restart per block, so rounding errors grow
         * with the block length plus the number of blocks, not with the row length. */
        REAL total = (REAL)0;
        while (i + 16 <= end) {
            i64 stop = end - i > CHAL_BLOCK ? i + CHAL_BLOCK : end;
            for (; i + 16 <= stop; i += 16) {
                for (int l = 0; l < 16; ++l) lanes[l] += src[i + l];
            }
            REAL block = (REAL)0;
            for (int l = 0; l < 16; ++l) {
                block += lanes[l];
                lanes[l] = (REAL)0;
            }
            total += block;
        }
        lanes[0] = total;
    }
    REAL acc = init;
    for (; i < end; ++i) acc = chal_combine(kind, acc, src[i]);
    for (int l = 0; l < 16; ++l) acc = chal_combine(kind, acc, lanes[l]);
    return acc;
}

/* This work-item's share [lo, hi) with step of a row [0, length) in a work-group of LS. */
DEVICE void chal_share(i64 length, i64* lo, i64* hi, i64* step) {
#if CONTIG
    i64 slab = (length + LS - 1) / LS;
    *lo = LID(0) * slab;
    *hi = *lo + slab < length ? *lo + slab : length;
    *step = 1;
#else
    *lo = LID(0);
    *hi = length;
    *step = LS;
#endif
}

/* This work-item's fold of src[start, end) within a work-group of LS. */
DEVICE REAL chal_group_fold(GLOBAL const REAL* src, i64 start, i64 end, int kind) {
#if CONTIG
    i64 slab = (end - start + LS - 1) / LS;
    i64 lo = start + LID(0) * slab;
    i64 hi = lo + slab < end ? lo + slab : end;
    return chal_fold(src, lo, hi, kind);
#else
    REAL acc = chal_identity(kind);
    for (i64 i = start + LID(0); i < end; i += LS) acc = chal_combine(kind, acc, src[i]);
    return acc;
#endif
}

/* Tree-reduce LS partials in `part`; every work-item returns the result. */
DEVICE REAL chal_group_reduce(LOCAL REAL* part, int op, REAL mine) {
    int t = LID(0);
    part[t] = mine;
    BARRIER();
    for (int span = LS / 2; span > 0; span >>= 1) {
        if (t < span) part[t] = chal_combine(op, part[t], part[t + span]);
        BARRIER();
    }
    REAL r = part[0];
    BARRIER();
    return r;
}

#endif
