/* GEMM for computehal: pack op(A) and op(B) into tile panels, multiply panels with a
 * register-blocked micro-kernel, then write C = alpha * acc + beta * C.
 *
 * Build-time parameters (defined by the host): REAL (float / double), VW (vector width, 8 floats
 * or 4 doubles: one 256-bit register), NR (columns of the micro-tile). A work-item holds an
 * MR x NR block of C in registers (MR = 2 * VW), streams k through it one rank-1 update at a
 * time, and walks `nb` such blocks along n so that its A panel stays in cache. It is launched
 * with one work-item per work-group: on CPU devices (PoCL) the vector code is then exactly
 * what is written here. Matrices are column-major with leading dimensions; every pointer
 * comes with an element offset (pointers into the middle of an allocation), every batch with
 * an element stride.
 *
 * Packed layouts, per batch:
 *   Ap[ib][p][r] = op(A)(ib*MR + r, p)   zero for rows >= m      (ceil(m/MR) panels of k*MR)
 *   Bp[jb][p][c] = op(B)(p, jb*NR + c)   zero for columns >= n   (ceil(n/NR) panels of k*NR)
 */
#include "dialect.h"
#include "gemm_tile.h"
#include "gemm_round.h"

/* One packed value per panel row: dst[r] = op(M)(panel * width + r, p) for r < width, zero
 * for rows >= rows. op(M) is rows x k; `along_k`: M holds that element at p + row * ld (else
 * at row + p * ld). mode: 0 copy, 1 round to f16, 2 round to bf16. */
DEVICE void chal_pack_panel(GLOBAL const REAL* src, int ld, int along_k, i64 panel, int width, i64 rows,
                            i64 p, GLOBAL REAL* dst, int mode) {
    for (int r = 0; r < width; ++r) {
        i64 row = panel * width + r;
        REAL v = (REAL)0;
        if (row < rows) v = chal_round(along_k ? src[p + row * (i64)ld] : src[row + p * (i64)ld], mode);
        dst[r] = v;
    }
}

/* Pack op(A) (m x k) into MR-row panels: one work-item writes the MR values of one panel at
 * one p. Grid: (k, A panels, batches). */
KERNEL void pack_a(GLOBAL const REAL* RESTRICT a, i64 a_off, i64 a_stride, int lda, int trans,
                   int m, int k, GLOBAL REAL* RESTRICT ap, i64 ap_stride, int mode) {
    i64 p = GID(0);
    i64 ib = GID(1);
    i64 bat = GID(2);
    if (p >= k || ib * MR >= m) return;
    GLOBAL REAL* dst = ap + bat * ap_stride + ib * (i64)k * MR + p * MR;
    chal_pack_panel(a + a_off + bat * a_stride, lda, trans, ib, MR, m, p, dst, mode);
}

/* Pack op(B) (k x n) into NR-column panels: the rows of op(B)^T, which is B read the other
 * way. Grid: (k, B panels, batches). */
KERNEL void pack_b(GLOBAL const REAL* RESTRICT b, i64 b_off, i64 b_stride, int ldb, int trans,
                   int k, int n, GLOBAL REAL* RESTRICT bp, i64 bp_stride, int mode) {
    i64 p = GID(0);
    i64 jb = GID(1);
    i64 bat = GID(2);
    if (p >= k || jb * NR >= n) return;
    GLOBAL REAL* dst = bp + bat * bp_stride + jb * (i64)k * NR + p * NR;
    chal_pack_panel(b + b_off + bat * b_stride, ldb, !trans, jb, NR, n, p, dst, mode);
}

/* C = alpha * Ap * Bp + beta * C. One work-item owns an MR x (NR * nb) strip of C.
 * Grid: (A panels, ceil(B panels / nb), batches), one work-item per group; beta == 0 never
 * reads C. */
KERNEL void gemm_panels(GLOBAL const REAL* RESTRICT ap, i64 ap_stride, GLOBAL const REAL* RESTRICT bp,
                        i64 bp_stride, GLOBAL REAL* RESTRICT c, i64 c_off, i64 c_stride, int ldc,
                        int m, int n, int k, REAL alpha, REAL beta, int nb) {
    i64 ib = GID(0);
    i64 jg = GID(1);
    i64 bat = GID(2);
    i64 a_panels = (m + MR - 1) / MR;
    i64 b_panels = (n + NR - 1) / NR;
    if (ib >= a_panels) return;
    GLOBAL const REAL* pa = ap + bat * ap_stride + ib * (i64)k * MR;
    GLOBAL REAL* cb = c + c_off + bat * c_stride;
    for (int q = 0; q < nb; ++q) {
        i64 jb = jg * nb + q;
        if (jb >= b_panels) break;
        GLOBAL const REAL* pb = bp + bat * bp_stride + jb * (i64)k * NR;
        VEC_T lo[NR], hi[NR];
#pragma unroll
        for (int cc = 0; cc < NR; ++cc) {
            lo[cc] = VZERO;
            hi[cc] = VZERO;
        }
        for (int p = 0; p < k; ++p) {
            VEC_T a0 = VLOAD(pa + p * MR);
            VEC_T a1 = VLOAD(pa + p * MR + VW);
#pragma unroll
            for (int cc = 0; cc < NR; ++cc) {
                REAL bv = pb[p * NR + cc];
                lo[cc] += a0 * bv;
                hi[cc] += a1 * bv;
            }
        }
        i64 i0 = ib * MR;
        i64 j0 = jb * NR;
#pragma unroll
        for (int cc = 0; cc < NR; ++cc) {
            i64 j = j0 + cc;
            if (j < n) {
                union {
                    VEC_T v[2];
                    REAL s[MR];
                } t;
                t.v[0] = lo[cc];
                t.v[1] = hi[cc];
                GLOBAL REAL* col = cb + j * (i64)ldc + i0;
                int rows = (int)(m - i0 < MR ? m - i0 : MR);
                if (beta == (REAL)0) {
                    for (int r = 0; r < rows; ++r) col[r] = alpha * t.s[r];
                } else {
                    for (int r = 0; r < rows; ++r) col[r] = alpha * t.s[r] + beta * col[r];
                }
            }
        }
    }
}

/* BLAS quick return: C = beta * C (C is write-only when beta == 0). Grid: (m, n, batches). */
KERNEL void scale_c(GLOBAL REAL* c, i64 c_off, i64 c_stride, int ldc, int m, int n, REAL beta) {
    i64 i = GID(0);
    i64 j = GID(1);
    i64 bat = GID(2);
    if (i >= m || j >= n) return;
    GLOBAL REAL* e = c + c_off + bat * c_stride + i + j * (i64)ldc;
    *e = beta == (REAL)0 ? (REAL)0 : beta * *e;
}
