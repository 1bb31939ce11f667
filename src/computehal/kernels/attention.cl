/* Scaled dot-product attention with an online softmax (flash-attention style), float32.
 *
 * Q, O: [batch * heads, seq_q, HD]; K, V: [batch * heads, seq_kv, HD], row-major.
 * A work-group of BQ work-items owns BQ consecutive query rows of one head (grid:
 * (BQ * ceil(seq_q / BQ), batch * heads)); it walks the keys in tiles of BKV rows staged in
 * local memory. Each work-item keeps its query row, its output accumulator, the running
 * maximum and the running sum in registers, so memory stays O(BKV * HD) per group: no
 * seq_q x seq_kv score matrix exists anywhere.
 * Causal masking is bottom-right aligned: row i sees key j iff j <= i + seq_kv - seq_q; a row
 * that sees no key gets zeros. Build parameters: HD (head_dim), BQ, BKV.
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

KERNEL void attention_fwd(GLOBAL const float* RESTRICT q, i64 qo, GLOBAL const float* RESTRICT k, i64 ko,
                          GLOBAL const float* RESTRICT v, i64 vo, GLOBAL float* RESTRICT o, i64 oo,
                          int seq_q, int seq_kv, float scale, int causal) {
    SHARED float ks[BKV * HD];
    SHARED float vs[BKV * HD];
    i64 bh = GRP(1);
    int t = LID(0);
    i64 row0 = GRP(0) * BQ;
    i64 i = row0 + t;
    int active = i < seq_q;
    i64 offset = (i64)seq_kv - seq_q;
    GLOBAL const float* kh = k + ko + bh * (i64)seq_kv * HD;
    GLOBAL const float* vh = v + vo + bh * (i64)seq_kv * HD;

    float qr[HD];
    float acc[HD];
    for (int d = 0; d < HD; ++d) {
        qr[d] = active ? q[qo + (bh * seq_q + i) * HD + d] * scale : 0.0f;
        acc[d] = 0.0f;
    }
    float run_max = -INFINITY;
    float run_sum = 0.0f;
    /* Keys past the last one any row of this group may see are never loaded. */
    i64 group_end = seq_kv;
    i64 my_end = seq_kv;
    if (causal) {
        i64 last_row = row0 + BQ - 1 < seq_q - 1 ? row0 + BQ - 1 : (i64)seq_q - 1;
        group_end = last_row + offset + 1;
        group_end = group_end < 0 ? 0 : (group_end > seq_kv ? seq_kv : group_end);
        my_end = i + offset + 1;
        my_end = my_end < 0 ? 0 : (my_end > seq_kv ? seq_kv : my_end);
    }
    for (i64 j0 = 0; j0 < group_end; j0 += BKV) {
        int tile = (int)(group_end - j0 < BKV ? group_end - j0 : BKV);
        for (int e = t; e < tile * HD; e += BQ) {
            ks[e] = kh[j0 * HD + e];
            vs[e] = vh[j0 * HD + e];
        }
        BARRIER();
        if (active) {
            float s[BKV];
            float tile_max = -INFINITY;
            for (int jj = 0; jj < tile; ++jj) {
                float dot = 0.0f;
                for (int d = 0; d < HD; ++d) dot += qr[d] * ks[jj * HD + d];
                int visible = j0 + jj < my_end;
                s[jj] = visible ? dot : -INFINITY;
                tile_max = (visible && dot > tile_max) ? dot : tile_max;
            }
            if (tile_max > -INFINITY) {
                float new_max = tile_max > run_max ? tile_max : run_max;
                float corr = exp(run_max - new_max);
                run_sum *= corr;
                for (int d = 0; d < HD; ++d) acc[d] *= corr;
                for (int jj = 0; jj < tile; ++jj) {
                    float p = exp(s[jj] - new_max);
                    run_sum += p;
                    for (int d = 0; d < HD; ++d) acc[d] += p * vs[jj * HD + d];
                }
                run_max = new_max;
            }
        }
        BARRIER();
    }
    if (active) {
        GLOBAL float* out = o + oo + (bh * seq_q + i) * HD;
        float inv = run_sum > 0.0f ? 1.0f / run_sum : 0.0f;
        for (int d = 0; d < HD; ++d) out[d] = run_sum > 0.0f ? acc[d] * inv : 0.0f;
    }
}

/* The same attention for CPU devices: one work-item per group owns BQ query rows of one head and
 * computes with explicit VW-wide vectors (PoCL compiles them to AVX registers as written).
 * Per key tile of BKV rows it stages K transposed and V in private memory, computes the BQ x BKV
 * scores as a register-blocked product, updates the online softmax row by row, and accumulates
 * P·V as a second register-blocked product. Grid: (ceil(seq_q / BQ), batch * heads).
 * Build parameters: HD, BQ (a multiple of RB, the rows of one register block), BKV (a multiple
 * of 2 * VW), VW. */
#ifndef VW
#define VW 8
#endif
#ifndef RB
#define RB 4
#endif
#define HDP (((HD) + 2 * VW - 1) / (2 * VW) * (2 * VW))
#define HDV (HDP / VW)
#define KVV (BKV / VW)

KERNEL void attention_fwd_vec(GLOBAL const float* RESTRICT q, i64 qo, GLOBAL const float* RESTRICT k, i64 ko,
                              GLOBAL const float* RESTRICT v, i64 vo, GLOBAL float* RESTRICT o, i64 oo,
                              int seq_q, int seq_kv, float scale, int causal) {
    VEC_T kt[HD][KVV];  /* kt[d][j / VW], lane j % VW: K tile transposed */
    VEC_T vt[BKV][HDV]; /* V tile, rows padded to HDP */
    VEC_T acc[BQ][HDV];
    VEC_T sv[BQ][KVV];  /* scores, then probabilities, of the current tile */
    float qs[BQ][HD];
    float run_max[BQ];
    float run_sum[BQ];
    i64 bh = GID(1);
    i64 row0 = GID(0) * BQ;
    if (row0 >= seq_q) return;
    int rows = (int)(seq_q - row0 < BQ ? seq_q - row0 : BQ);
    i64 offset = (i64)seq_kv - seq_q;
    GLOBAL const float* kh = k + ko + bh * (i64)seq_kv * HD;
    GLOBAL const float* vh = v + vo + bh * (i64)seq_kv * HD;
    float* ktf = (float*)kt;
    float* vtf = (float*)vt;
    for (int r = 0; r < BQ; ++r) {
        for (int d = 0; d < HD; ++d) qs[r][d] = r < rows ? q[qo + (bh * seq_q + row0 + r) * HD + d] * scale : 0.0f;
        for (int dv = 0; dv < HDV; ++dv) acc[r][dv] = VZERO;
        run_max[r] = -INFINITY;
        run_sum[r] = 0.0f;
    }
    for (int e = 0; e < BKV * HDP; ++e) vtf[e] = 0.0f;
    i64 group_end = seq_kv;
    if (causal) {
        group_end = row0 + rows - 1 + offset + 1;
        group_end = group_end < 0 ? 0 : (group_end > seq_kv ? seq_kv : group_end);
    }
    for (i64 j0 = 0; j0 < group_end; j0 += BKV) {
        int tile = (int)(group_end - j0 < BKV ? group_end - j0 : BKV);
        for (int jj = 0; jj < BKV; ++jj) {
            GLOBAL const float* krow = kh + (j0 + jj) * HD;
            GLOBAL const float* vrow = vh + (j0 + jj) * HD;
            if (jj < tile) {
                for (int d = 0; d < HD; ++d) {
                    ktf[d * BKV + jj] = krow[d];
                    vtf[jj * HDP + d] = vrow[d];
                }
            } else {
                for (int d = 0; d < HD; ++d) ktf[d * BKV + jj] = 0.0f;
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
                        float qv = qs[r0 + r][d];
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
        /* online softmax, row by row */
        for (int r = 0; r < BQ; ++r) {
            float* sr = (float*)sv[r];
            i64 end = j0 + tile;
            if (causal) {
                i64 mine = row0 + r + offset + 1;
                end = mine < end ? mine : end;
            }
            float tile_max = -INFINITY;
            for (int jj = 0; jj < BKV; ++jj) {
                int visible = r < rows && j0 + jj < end;
                float s = visible ? sr[jj] : -INFINITY;
                sr[jj] = s;
                tile_max = s > tile_max ? s : tile_max;
            }
            if (!(tile_max > -INFINITY)) {
                for (int jj = 0; jj < BKV; ++jj) sr[jj] = 0.0f;
                continue;
            }
            float new_max = tile_max > run_max[r] ? tile_max : run_max[r];
            float corr = exp(run_max[r] - new_max);
            float total = run_sum[r] * corr;
            for (int dv = 0; dv < HDV; ++dv) acc[r][dv] = acc[r][dv] * corr;
            for (int jv = 0; jv < KVV; ++jv) sv[r][jv] = VEXP(sv[r][jv] - new_max);
            for (int jj = 0; jj < BKV; ++jj) total += sr[jj];
            run_sum[r] = total;
            run_max[r] = new_max;
        }
        /* acc[r][dv] += sum_j p[r][j] * vt[j][dv], in blocks of RB rows x 2 vectors */
        for (int r0 = 0; r0 < BQ; r0 += RB) {
            if (r0 >= rows) break;
            for (int dv = 0; dv < HDV; dv += 2) {
                VEC_T c0[RB], c1[RB];
#pragma unroll
                for (int r = 0; r < RB; ++r) {
                    c0[r] = acc[r0 + r][dv];
                    c1[r] = acc[r0 + r][dv + 1];
                }
                for (int jj = 0; jj < tile; ++jj) {
                    VEC_T v0 = vt[jj][dv];
                    VEC_T v1 = vt[jj][dv + 1];
#pragma unroll
                    for (int r = 0; r < RB; ++r) {
                        float pj = ((float*)sv[r0 + r])[jj];
                        c0[r] += v0 * pj;
                        c1[r] += v1 * pj;
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
        GLOBAL float* out = o + oo + (bh * seq_q + row0 + r) * HD;
        float* ar = (float*)acc[r];
        float inv = run_sum[r] > 0.0f ? 1.0f / run_sum[r] : 0.0f;
        for (int d = 0; d < HD; ++d) out[d] = run_sum[r] > 0.0f ? ar[d] * inv : 0.0f;
    }
}
