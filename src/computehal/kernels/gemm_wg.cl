/* Work-group tiled GEMM for GPUs: C = alpha * op(A) * op(B) + beta * C, every batch in one launch.
 *
 * A work-group of TSX x TSY work-items owns a TM x TN tile of C (TM = TSX * WM, TN = TSY * WN).
 * For each step of TK along k, the group stages the TM x TK slice of op(A) and the TK x TN slice
 * of op(B) in local memory (every work-item loads a few elements, coalesced along the operand's
 * contiguous dimension), waits at a barrier, and every work-item then accumulates its WM x WN
 * register block from local memory. Work-item (tx, ty) owns rows i0 + tx + r * TSX and columns
 * j0 + ty + c * TSY, so neighbouring work-items read neighbouring local words and write
 * neighbouring rows of column-major C.
 *
 * Build-time parameters (host defines, defaults below): REAL (float / double, with USE_FP64),
 * TSX, TSY, WM, WN, TK, and VW / NR of gemm_tile.h (the panel heights of the packed layouts
 * that the convolution packers write). Grid: (ceil(m / TM) * TSX, ceil(n / TN) * TSY, batches),
 * work-group (TSX, TSY, 1).
 *
 * Operand layouts (a_layout / b_layout):
 *   0  strided:  op(A)(i, p) = a[i * a_rs + p * a_cs],  op(B)(p, j) = b[p * b_rs + j * b_cs]
 *      (a transpose swaps the two strides; the leading dimension is the other one)
 *   1  packed panels of gemm.cl: op(A)(i, p) = Ap[i / MR][p][i % MR], op(B)(p, j) = Bp[j / NR][p][j % NR]
 * mode rounds every operand value to f16 (1) or bf16 (2) before use, as gemm.cl's packers do.
 * beta == 0 never reads C (BLAS semantics: NaN / Inf in C do not propagate).
 */
#include "dialect.h"
#include "gemm_tile.h"
#include "gemm_round.h"

#ifndef TSX
#define TSX 16
#endif
#ifndef TSY
#define TSY 16
#endif
#ifndef WM
#define WM 4
#endif
#ifndef WN
#define WN 4
#endif
#ifndef TK
#define TK 16
#endif
#define TM (TSX * WM)
#define TN (TSY * WN)
#define NT (TSX * TSY)

/* Stage the tile x TK slice of an operand seen as rows x k (op(A), or op(B) transposed) into
 * local memory: tile[q * pitch + r] = M(row0 + r, p0 + q), zero outside the matrix. Element
 * (row, p) is at row * rs + p * ks (layout 0) or in packed panels of height `panel` (layout
 * 1); `rows_fast`: neighbouring work-items take neighbouring rows (else neighbouring p). */
DEVICE void chal_stage(LOCAL REAL* tile, int pitch, int tile_rows, GLOBAL const REAL* src, i64 rs, i64 ks,
                       int layout, int panel, int rows_fast, i64 row0, int rows, int p0, int k, int t,
                       int mode) {
#pragma unroll
    for (int s = 0; s < (tile_rows * TK + NT - 1) / NT; ++s) {
        const int e = t + s * NT;
        if ((tile_rows * TK) % NT != 0 && e >= tile_rows * TK) break;
        int r = rows_fast ? e % tile_rows : e / TK;
        int q = rows_fast ? e / tile_rows : e % TK;
        i64 row = row0 + r;
        i64 p = p0 + q;
        REAL val = (REAL)0;
        if (row < rows && p < k) {
            i64 at = layout == 0 ? row * rs + p * ks : (row / panel) * (i64)k * panel + p * panel + (row % panel);
            val = chal_round(src[at], mode);
        }
        tile[q * pitch + r] = val;
    }
}

KERNEL void gemm_wg(GLOBAL const REAL* RESTRICT a, i64 a_off, i64 a_stride, i64 a_rs, i64 a_cs, int a_layout,
                    GLOBAL const REAL* RESTRICT b, i64 b_off, i64 b_stride, i64 b_rs, i64 b_cs, int b_layout,
                    GLOBAL REAL* c, i64 c_off, i64 c_stride, int ldc, int m, int n, int k, REAL alpha,
                    REAL beta, int mode) {
    SHARED REAL As[TK][TM + 1];
    SHARED REAL Bs[TK][TN + 1];
    const int tx = LID(0);
    const int ty = LID(1);
    const int t = tx + ty * TSX;
    const i64 i0 = GRP(0) * TM;
    const i64 j0 = GRP(1) * TN;
    const i64 bat = GRP(2);
    GLOBAL const REAL* ab = a + a_off + bat * a_stride;
    GLOBAL const REAL* bb = b + b_off + bat * b_stride;
    /* Which index varies fastest across neighbouring work-items when loading: the operand's
     * contiguous one (rows of A unless A is read transposed; k of B unless B is transposed). */
    const int a_rows_fast = a_layout != 0 || a_rs == 1;
    const int b_cols_fast = b_layout != 0 || b_rs != 1;
    REAL acc[WM][WN];
#pragma unroll
    for (int r = 0; r < WM; ++r) {
#pragma unroll
        for (int cc = 0; cc < WN; ++cc) acc[r][cc] = (REAL)0;
    }
    for (int p0 = 0; p0 < k; p0 += TK) {
        chal_stage(&As[0][0], TM + 1, TM, ab, a_rs, a_cs, a_layout, MR, a_rows_fast, i0, m, p0, k, t, mode);
        chal_stage(&Bs[0][0], TN + 1, TN, bb, b_cs, b_rs, b_layout, NR, b_cols_fast, j0, n, p0, k, t, mode);
        BARRIER();
#pragma unroll
        for (int q = 0; q < TK; ++q) {
            REAL av[WM];
            REAL bv[WN];
#pragma unroll
            for (int r = 0; r < WM; ++r) av[r] = As[q][tx + r * TSX];
#pragma unroll
            for (int cc = 0; cc < WN; ++cc) bv[cc] = Bs[q][ty + cc * TSY];
#pragma unroll
            for (int r = 0; r < WM; ++r) {
#pragma unroll
                for (int cc = 0; cc < WN; ++cc) acc[r][cc] += av[r] * bv[cc];
            }
        }
        BARRIER();
    }
    GLOBAL REAL* cb = c + c_off + bat * c_stride;
#pragma unroll
    for (int cc = 0; cc < WN; ++cc) {
        i64 j = j0 + ty + cc * TSY;
        if (j >= n) continue;
#pragma unroll
        for (int r = 0; r < WM; ++r) {
            i64 i = i0 + tx + r * TSX;
            if (i >= m) continue;
            GLOBAL REAL* e = cb + i + j * (i64)ldc;
            *e = beta == (REAL)0 ? alpha * acc[r][cc] : alpha * acc[r][cc] + beta * *e;
        }
    }
}
