/* Scaled dot-product attention with an online softmax (flash-attention style) for REAL
 * (float, or double with USE_FP64).
 *
 * Q, O: [batch, heads, seq_q, hd]; K, V: [batch, heads / group, seq_kv, hd], row-major; query
 * head h reads key / value head h / group. An optional additive mask of REAL is read at
 * b * ms0 + h * ms1 + i * ms2 + j * ms3 (strides 0 along broadcast dimensions). Keys are walked
 * in tiles of BKV rows; each query row keeps its running maximum, running sum and output
 * accumulator, so memory stays O(BKV * HD) per group: no seq_q x seq_kv score matrix exists.
 *
 * Semantics (every step in IEEE arithmetic): the score of key j is (q * scale) . k_j + mask.
 * Key j is visible to query i when the bottom-right causal rule allows it (j <= i + seq_kv -
 * seq_q) and its score is not -inf; invisible keys (and their values) are never read into the
 * sums. A row with no visible key is zero. A NaN or +inf score among the visible keys makes the
 * row NaN (exp(inf - inf)); a NaN or infinity in a visible value reaches the row through p * v.
 *
 * Build parameters: REAL, HD (the head dimension rounded up to a bucket; the true head
 * dimension hd <= HD is an argument, the rest is zero padding), BQ, BKV, and VW for the
 * vector kernel.
 */
#include "dialect.h"

#ifndef HD
#define HD 64
#endif
#ifndef BQ
#define BQ 32
#endif
#ifndef BKV
#define BKV 64
#endif

#define CHAL_ATTN_PARAMS                                                                         \
    GLOBAL const REAL *RESTRICT q, i64 qo, GLOBAL const REAL *RESTRICT k, i64 ko,                \
        GLOBAL const REAL *RESTRICT v, i64 vo, GLOBAL REAL *RESTRICT o, i64 oo,                  \
        GLOBAL const REAL *RESTRICT mask, i64 mo, i64 ms0, i64 ms1, i64 ms2, i64 ms3, int has_mask, \
        int seq_q, int seq_kv, int hd, REAL scale, int causal, int heads, int group

/* Keys [0, end) that query row i may see by the causal rule. */
DEVICE i64 chal_causal_end(i64 i, int seq_q, int seq_kv, int causal) {
    if (!causal) return seq_kv;
    i64 end = i + (i64)seq_kv - seq_q + 1;
    return end < 0 ? 0 : (end > seq_kv ? seq_kv : end);
}

/* One work-group of BQ work-items owns BQ consecutive query rows of one (batch, head); K and V
 * tiles are staged in local memory. Grid (BQ * ceil(seq_q / BQ), batch * heads). */
KERNEL void attention_fwd(CHAL_ATTN_PARAMS) {
    SHARED REAL ks[BKV * HD];
    SHARED REAL vs[BKV * HD];
    i64 bh = GRP(1);
    i64 b = bh / heads;
    i64 h = bh - b * heads;
    i64 kvh = b * (heads / group) + h / group;
    int t = LID(0);
    i64 row0 = GRP(0) * BQ;
    i64 i = row0 + t;
    int active = i < seq_q;
    GLOBAL const REAL* kh = k + ko + kvh * (i64)seq_kv * hd;
    GLOBAL const REAL* vh = v + vo + kvh * (i64)seq_kv * hd;
    GLOBAL const REAL* mrow = mask + mo + b * ms0 + h * ms1 + i * ms2;

    REAL qr[HD];
    REAL acc[HD];
    for (int d = 0; d < HD; ++d) {
        qr[d] = (active && d < hd) ? q[qo + (bh * seq_q + i) * hd + d] * scale : (REAL)0;
        acc[d] = (REAL)0;
    }
    REAL run_max = -INFINITY;
    REAL run_sum = (REAL)0;
    int bad = 0;
    i64 last = row0 + BQ - 1 < seq_q - 1 ? row0 + BQ - 1 : (i64)seq_q - 1;
    i64 group_end = chal_causal_end(last, seq_q, seq_kv, causal); /* keys no row of the group sees are never loaded */
    i64 my_end = chal_causal_end(i, seq_q, seq_kv, causal);
    for (i64 j0 = 0; j0 < group_end; j0 += BKV) {
        int tile = (int)(group_end - j0 < BKV ? group_end - j0 : BKV);
        for (int e = t; e < tile * HD; e += BQ) {
            int jj = e / HD;
            int d = e - jj * HD;
            ks[e] = d < hd ? kh[(j0 + jj) * hd + d] : (REAL)0;
            vs[e] = d < hd ? vh[(j0 + jj) * hd + d] : (REAL)0;
        }
        BARRIER();
        if (active) {
            REAL s[BKV];
            REAL tile_max = -INFINITY;
            for (int jj = 0; jj < tile; ++jj) {
                REAL score = -INFINITY;
                if (j0 + jj < my_end) {
                    REAL dot = (REAL)0;
                    for (int d = 0; d < HD; ++d) dot += qr[d] * ks[jj * HD + d];
                    score = has_mask ? dot + mrow[(j0 + jj) * ms3] : dot;
                }
                if (score != score || score == INFINITY) bad = 1; /* a visible NaN / +inf score */
                s[jj] = score;
                tile_max = score > tile_max ? score : tile_max;
            }
            if (tile_max > -INFINITY && tile_max < INFINITY) {
                REAL new_max = tile_max > run_max ? tile_max : run_max;
                REAL corr = exp(run_max - new_max);
                run_sum *= corr;
                for (int d = 0; d < HD; ++d) acc[d] *= corr;
                for (int jj = 0; jj < tile; ++jj) {
                    if (!(s[jj] > -INFINITY && s[jj] < INFINITY)) continue; /* invisible or bad */
                    REAL p = exp(s[jj] - new_max);
                    run_sum += p;
                    for (int d = 0; d < HD; ++d) acc[d] += p * vs[jj * HD + d];
                }
                run_max = new_max;
            }
        }
        BARRIER();
    }
    if (active) {
        GLOBAL REAL* out = o + oo + (bh * seq_q + i) * hd;
        REAL none = bad ? (REAL)NAN : (REAL)0;
        for (int d = 0; d < hd; ++d) out[d] = (bad || run_sum == (REAL)0) ? none : acc[d] / run_sum;
    }
}

/* Builds that launch only attention_fwd (CUDA) define ATTENTION_NO_VEC to leave out the vector
 * kernel below, which takes most of the compile time. */
#ifndef ATTENTION_NO_VEC
/* The same attention for CPU devices: one work-item per group owns BQ query rows of one
 * (batch, head) and computes with explicit VW-wide vectors (PoCL compiles them to AVX registers
 * as written). Per key tile of BKV (<= 64) rows it stages K transposed and V in private memory,
 * computes the BQ x BKV scores as a register-blocked product, updates the online softmax row by
 * row (keys a row does not read get p = 0 and a clear bit in its read mask), and accumulates P.V
 * as a second register-blocked product. When the V tile holds a NaN or an infinity, P.V skips
 * the keys a row does not read (0 * inf would be NaN). Grid (ceil(seq_q / BQ), batch * heads).
 * BQ must be a multiple of RB, BKV of 2 * VW. */
#ifndef VW
#define VW 8
#endif
#ifndef RB
#define RB 4
#endif
#define HDP (((HD) + 2 * VW - 1) / (2 * VW) * (2 * VW))
#define HDV (HDP / VW)
#define KVV (BKV / VW)

KERNEL void attention_fwd_vec(CHAL_ATTN_PARAMS) {
    VEC_T kt[HD][KVV];  /* kt[d][j / VW], lane j % VW: K tile transposed */
    VEC_T vt[BKV][HDV]; /* V tile, rows padded to HDP */
    VEC_T acc[BQ][HDV];
    VEC_T sv[BQ][KVV];  /* scores, then probabilities, of the current tile */
    REAL qs[BQ][HD];
    REAL run_max[BQ];
    REAL run_sum[BQ];
    u64 reads[BQ]; /* bit jj: the row reads key j0 + jj of the current tile */
    int bad[BQ];
    i64 bh = GID(1);
    i64 b = bh / heads;
    i64 h = bh - b * heads;
    i64 kvh = b * (heads / group) + h / group;
    i64 row0 = GID(0) * BQ;
    if (row0 >= seq_q) return;
    int rows = (int)(seq_q - row0 < BQ ? seq_q - row0 : BQ);
    GLOBAL const REAL* kh = k + ko + kvh * (i64)seq_kv * hd;
    GLOBAL const REAL* vh = v + vo + kvh * (i64)seq_kv * hd;
    GLOBAL const REAL* mbase = mask + mo + b * ms0 + h * ms1;
    REAL* ktf = (REAL*)kt;
    REAL* vtf = (REAL*)vt;
    for (int r = 0; r < BQ; ++r) {
        for (int d = 0; d < HD; ++d) {
            qs[r][d] = (r < rows && d < hd) ? q[qo + (bh * seq_q + row0 + r) * hd + d] * scale : (REAL)0;
        }
        for (int dv = 0; dv < HDV; ++dv) acc[r][dv] = VZERO;
        run_max[r] = -INFINITY;
        run_sum[r] = (REAL)0;
        bad[r] = 0;
    }
    for (int e = 0; e < BKV * HDP; ++e) vtf[e] = (REAL)0;
    i64 group_end = chal_causal_end(row0 + rows - 1, seq_q, seq_kv, causal);
    for (i64 j0 = 0; j0 < group_end; j0 += BKV) {
        int tile = (int)(group_end - j0 < BKV ? group_end - j0 : BKV);
        int v_finite = 1;
        for (int jj = 0; jj < BKV; ++jj) {
            GLOBAL const REAL* krow = kh + (j0 + jj) * hd;
            GLOBAL const REAL* vrow = vh + (j0 + jj) * hd;
            if (jj < tile) {
                for (int d = 0; d < hd; ++d) {
                    ktf[d * BKV + jj] = krow[d];
                    REAL value = vrow[d];
                    vtf[jj * HDP + d] = value;
                    v_finite &= (value - value) == (REAL)0;
                }
                for (int d = hd; d < HD; ++d) ktf[d * BKV + jj] = (REAL)0;
            } else {
                for (int d = 0; d < HD; ++d) ktf[d * BKV + jj] = (REAL)0;
            }
        }
        /* scores: sv[r][jv] = sum_d qs[r][d] * kt[d][jv], in blocks of RB rows x 2 vectors */
        for (int r0 = 0; r0 < BQ; r0 += RB) {
            for (int jv = 0; jv < KVV; jv += 2) {
                VEC_T c0[RB], c1[RB];
#pragma unroll
                for (int r = 0; r < RB; ++r) {
                    c0[r] = VZERO;
                    c1[r] = VZERO;
                }
                for (int d = 0; d < HD; ++d) {
                    VEC_T k0 = kt[d][jv];
                    VEC_T k1 = kt[d][jv + 1];
#pragma unroll
                    for (int r = 0; r < RB; ++r) {
                        REAL qv = qs[r0 + r][d];
                        c0[r] += k0 * qv;
                        c1[r] += k1 * qv;
                    }
                }
#pragma unroll
                for (int r = 0; r < RB; ++r) {
                    sv[r0 + r][jv] = c0[r];
                    sv[r0 + r][jv + 1] = c1[r];
                }
            }
        }
        /* online softmax, row by row: a NaN / +inf score marks the row bad and is not read */
        for (int r = 0; r < BQ; ++r) {
            REAL* sr = (REAL*)sv[r];
            i64 end = r < rows ? chal_causal_end(row0 + r, seq_q, seq_kv, causal) : 0;
            end = end < j0 + tile ? end : j0 + tile;
            GLOBAL const REAL* mrow = mbase + (row0 + r) * ms2;
            REAL tile_max = -INFINITY;
            u64 read = 0;
            for (int jj = 0; jj < BKV; ++jj) {
                REAL score = -INFINITY;
                if (j0 + jj < end) score = has_mask ? sr[jj] + mrow[(j0 + jj) * ms3] : sr[jj];
                if (score != score || score == INFINITY) {
                    bad[r] = 1;
                    score = -INFINITY;
                }
                if (score > -INFINITY) read |= (u64)1 << jj;
                sr[jj] = score;
                tile_max = score > tile_max ? score : tile_max;
            }
            reads[r] = read;
            if (!(tile_max > -INFINITY)) {
                for (int jv = 0; jv < KVV; ++jv) sv[r][jv] = VZERO;
                continue;
            }
            REAL new_max = tile_max > run_max[r] ? tile_max : run_max[r];
            REAL corr = exp(run_max[r] - new_max);
            REAL total = run_sum[r] * corr;
            for (int dv = 0; dv < HDV; ++dv) acc[r][dv] = acc[r][dv] * corr;
            for (int jv = 0; jv < KVV; ++jv) sv[r][jv] = VEXP(sv[r][jv] - new_max);
            for (int jj = 0; jj < BKV; ++jj) total += sr[jj];
            run_sum[r] = total;
            run_max[r] = new_max;
        }
        /* acc[r][dv] += sum_j p[r][j] * vt[j][dv], in blocks of RB rows x 2 vectors */
        for (int r0 = 0; r0 < rows; r0 += RB) {
            for (int dv = 0; dv < HDV; dv += 2) {
                VEC_T c0[RB], c1[RB];
#pragma unroll
                for (int r = 0; r < RB; ++r) {
                    c0[r] = acc[r0 + r][dv];
                    c1[r] = acc[r0 + r][dv + 1];
                }
                if (v_finite) {
                    for (int jj = 0; jj < tile; ++jj) {
                        VEC_T v0 = vt[jj][dv];
                        VEC_T v1 = vt[jj][dv + 1];
#pragma unroll
                        for (int r = 0; r < RB; ++r) {
                            REAL pj = ((REAL*)sv[r0 + r])[jj];
                            c0[r] += v0 * pj;
                            c1[r] += v1 * pj;
                        }
                    }
                } else {
                    for (int jj = 0; jj < tile; ++jj) {
                        VEC_T v0 = vt[jj][dv];
                        VEC_T v1 = vt[jj][dv + 1];
                        for (int r = 0; r < RB; ++r) {
                            if ((reads[r0 + r] >> jj) & 1) {
                                REAL pj = ((REAL*)sv[r0 + r])[jj];
                                c0[r] += v0 * pj;
                                c1[r] += v1 * pj;
                            }
                        }
                    }
                }
#pragma unroll
                for (int r = 0; r < RB; ++r) {
                    acc[r0 + r][dv] = c0[r];
                    acc[r0 + r][dv + 1] = c1[r];
                }
            }
        }
    }
    for (int r = 0; r < rows; ++r) {
        GLOBAL REAL* out = o + oo + (bh * seq_q + row0 + r) * hd;
        REAL* ar = (REAL*)acc[r];
        REAL none = bad[r] ? (REAL)NAN : (REAL)0;
        for (int d = 0; d < hd; ++d) out[d] = (bad[r] || run_sum[r] == (REAL)0) ? none : ar[d] / run_sum[r];
    }
}
#endif /* ATTENTION_NO_VEC */
