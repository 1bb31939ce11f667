/* Row gather and scatter of float32 matrices with `cols` columns. Grid: (cols, rows moved).
 *
 * gather:  y[i, :] = x[idx[i], :]
 * scatter: y[dst[i], :] = x[src[i], :] where the host passes distinct destination rows, each
 *          with the last source row naming it, so no two work-items write the same element
 *          and the last duplicate wins deterministically.
 */
#include "dialect.h"

KERNEL void gather_rows(GLOBAL const float* x, i64 xo, GLOBAL const i64* idx, GLOBAL float* y, i64 yo,
                        i64 cols, i64 count) {
    i64 c = GID(0);
    i64 i = GID(1);
    if (c >= cols || i >= count) return;
    y[yo + i * cols + c] = x[xo + idx[i] * cols + c];
}

KERNEL void scatter_rows(GLOBAL const float* x, i64 xo, GLOBAL const i64* src, GLOBAL const i64* dst,
                         GLOBAL float* y, i64 yo, i64 cols, i64 count) {
    i64 c = GID(0);
    i64 i = GID(1);
    if (c >= cols || i >= count) return;
    y[yo + dst[i] * cols + c] = x[xo + src[i] * cols + c];
}
