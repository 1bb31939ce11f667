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
