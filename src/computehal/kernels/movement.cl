/* Data movement as bit copies of 16-, 32- or 64-bit elements (so NaN payloads survive):
 * strided copies, row gather and row scatter, with int32 or int64 row indices.
 *
 * copy_strided_<bits>: dst[view] = src[view] for a view collapsed by the host to an inner
 *   dimension and up to five outer ones (strided.h); grid (ceil(inner / run), outer count).
 * gather_<bits>_<index>: y[i, :] = x[idx[i], :]; grid (cols, rows moved).
 * scatter_pairs_<bits>: y[dst[i], :] = x[src[i], :] for host-deduplicated pairs (each
 *   destination once, with the last source naming it); grid (cols, pairs).
 * index_range_<index>: one work-group of LS folds the smallest and largest index into
 *   out[0], out[1] (device-side indices are checked before anything is written).
 * scatter_claim_<index> / scatter_won_<bits>_<index>: device-side scatter with "last index
 *   wins": every index claims its destination row with an atomic max of its position, then
 *   only the winner copies its row.
 */
#include "dialect.h"
#include "strided.h"

#ifndef LS
#define LS 64
#endif

#define CHAL_STRIDED(name, T)                                                                    \
    KERNEL void name(GLOBAL const T* src, i64 so, GLOBAL T* dst, i64 dof, i64 inner, i64 run,   \
                     i64 is, i64 id, CHAL_OUTER_PARAMS) {                                        \
        i64 start = GID(0) * run;                                                                \
        i64 len = inner - start;                                                                 \
        if (len <= 0) return;                                                                    \
        len = len < run ? len : run;                                                             \
        i64 os, od;                                                                              \
        chal_outer(GID(1), CHAL_OUTER_ARGS, &os, &od);                                           \
        GLOBAL const T* s = src + so + os + start * is;                                          \
        GLOBAL T* d = dst + dof + od + start * id;                                               \
        if (is == 1 && id == 1) {                                                                \
            for (i64 l = 0; l < len; ++l) d[l] = s[l];                                           \
        } else {                                                                                 \
            for (i64 l = 0; l < len; ++l) d[l * id] = s[l * is];                                 \
        }                                                                                        \
    }
CHAL_STRIDED(copy_strided_16, u16)
CHAL_STRIDED(copy_strided_32, u32)
CHAL_STRIDED(copy_strided_64, u64)

#define CHAL_GATHER(name, T, TI)                                                                 \
    KERNEL void name(GLOBAL const T* x, i64 xo, GLOBAL const TI* idx, i64 io, GLOBAL T* y, i64 yo, \
                     i64 cols, i64 count) {                                                      \
        i64 c = GID(0);                                                                          \
        i64 i = GID(1);                                                                          \
        if (c >= cols || i >= count) return;                                                     \
        y[yo + i * cols + c] = x[xo + (i64)idx[io + i] * cols + c];                              \
    }
CHAL_GATHER(gather_16_i32, u16, int)
CHAL_GATHER(gather_32_i32, u32, int)
CHAL_GATHER(gather_64_i32, u64, int)
CHAL_GATHER(gather_16_i64, u16, i64)
CHAL_GATHER(gather_32_i64, u32, i64)
CHAL_GATHER(gather_64_i64, u64, i64)

#define CHAL_SCATTER_PAIRS(name, T)                                                              \
    KERNEL void name(GLOBAL const T* x, i64 xo, GLOBAL const i64* src, GLOBAL const i64* dst,    \
                     i64 po, GLOBAL T* y, i64 yo, i64 cols, i64 count) {                         \
        i64 c = GID(0);                                                                          \
        i64 i = GID(1);                                                                          \
        if (c >= cols || i >= count) return;                                                     \
        y[yo + dst[po + i] * cols + c] = x[xo + src[po + i] * cols + c];                         \
    }
CHAL_SCATTER_PAIRS(scatter_pairs_16, u16)
CHAL_SCATTER_PAIRS(scatter_pairs_32, u32)
CHAL_SCATTER_PAIRS(scatter_pairs_64, u64)

#define CHAL_I64_MAX ((i64)(~(u64)0 >> 1))

#define CHAL_RANGE(name, TI)                                                                     \
    KERNEL void name(GLOBAL const TI* idx, i64 io, i64 count, GLOBAL i64* out) {                 \
        SHARED i64 lo[LS];                                                                       \
        SHARED i64 hi[LS];                                                                       \
        int t = LID(0);                                                                          \
        i64 mn = CHAL_I64_MAX;                                                                   \
        i64 mx = -CHAL_I64_MAX - 1;                                                              \
        for (i64 i = t; i < count; i += LS) {                                                    \
            i64 v = (i64)idx[io + i];                                                            \
            mn = v < mn ? v : mn;                                                                \
            mx = v > mx ? v : mx;                                                                \
        }                                                                                        \
        lo[t] = mn;                                                                              \
        hi[t] = mx;                                                                              \
        BARRIER();                                                                               \
        for (int span = LS / 2; span > 0; span >>= 1) {                                          \
            if (t < span) {                                                                      \
                lo[t] = lo[t + span] < lo[t] ? lo[t + span] : lo[t];                             \
                hi[t] = hi[t + span] > hi[t] ? hi[t + span] : hi[t];                             \
            }                                                                                    \
            BARRIER();                                                                           \
        }                                                                                        \
        if (t == 0) {                                                                            \
            out[0] = lo[0];                                                                      \
            out[1] = hi[0];                                                                      \
        }                                                                                        \
    }
CHAL_RANGE(index_range_i32, int)
CHAL_RANGE(index_range_i64, i64)

/* winner[r] = the largest position i with idx[i] == r (winner starts at -1). */
#define CHAL_CLAIM(name, TI)                                                                     \
    KERNEL void name(GLOBAL const TI* idx, i64 io, i64 count, GLOBAL int* winner) {             \
        i64 i = GID(0);                                                                          \
        if (i < count) ATOMIC_MAX_I32(winner + (i64)idx[io + i], (int)i);                        \
    }
CHAL_CLAIM(scatter_claim_i32, int)
CHAL_CLAIM(scatter_claim_i64, i64)

#define CHAL_WON(name, T, TI)                                                                    \
    KERNEL void name(GLOBAL const T* x, i64 xo, GLOBAL const TI* idx, i64 io,                   \
                     GLOBAL const int* winner, GLOBAL T* y, i64 yo, i64 cols, i64 count) {       \
        i64 c = GID(0);                                                                          \
        i64 i = GID(1);                                                                          \
        if (c >= cols || i >= count) return;                                                     \
        i64 r = (i64)idx[io + i];                                                                \
        if (winner[r] != (int)i) return;                                                         \
        y[yo + r * cols + c] = x[xo + i * cols + c];                                             \
    }
CHAL_WON(scatter_won_16_i32, u16, int)
CHAL_WON(scatter_won_32_i32, u32, int)
CHAL_WON(scatter_won_64_i32, u64, int)
CHAL_WON(scatter_won_16_i64, u16, i64)
CHAL_WON(scatter_won_32_i64, u32, i64)
CHAL_WON(scatter_won_64_i64, u64, i64)
