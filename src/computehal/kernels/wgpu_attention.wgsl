// Scaled dot-product attention with an online softmax, one invocation per query row.
//
// Q, O: [batch * heads, seq_q, head_dim]; K, V: [batch * heads, seq_kv, head_dim],
// row-major float32. Keys are streamed one at a time with a running maximum, running
// sum and a private accumulator, so no seq_q x seq_kv score matrix ever exists; memory
// is O(head_dim) per invocation. Head dimensions above DC are processed in chunks of DC
// output columns (the scores are recomputed per chunk). Causal masking is bottom-right
// aligned: query i sees key j iff j <= i + causal_offset. A query that sees no key gets
// a zero row.

struct Params {
    rows: u32,
    seq_q: u32,
    seq_kv: u32,
    d: u32,
    causal: u32,
    causal_offset: i32,
    q_off: u32,
    k_off: u32,
    v_off: u32,
    o_off: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> Q: array<f32>;
@group(0) @binding(2) var<storage, read_write> K: array<f32>;
@group(0) @binding(3) var<storage, read_write> V: array<f32>;
@group(0) @binding(4) var<storage, read_write> O: array<f32>;

const WG: u32 = 64u;
const DC: u32 = 128u;

@compute @workgroup_size(64)
fn attention(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let row = linear_id(wid, nwg, lidx, WG);
    if (row >= P.rows) {
        return;
    }
    let head = row / P.seq_q;
    let i = row % P.seq_q;
    let q_base = P.q_off + row * P.d;
    let o_base = P.o_off + row * P.d;
    let k_head = P.k_off + head * P.seq_kv * P.d;
    let v_head = P.v_off + head * P.seq_kv * P.d;

    var kv_end = P.seq_kv;
    if (P.causal != 0u) {
        kv_end = u32(clamp(i32(i) + P.causal_offset + 1, 0, i32(P.seq_kv)));
    }

    var acc: array<f32, 128>;
    for (var d0 = 0u; d0 < P.d; d0 += DC) {
        let dn = min(DC, P.d - d0);
        for (var d = 0u; d < dn; d++) {
            acc[d] = 0.0;
        }
        var running_max = 0.0;
        var running_sum = 0.0;
        for (var j = 0u; j < kv_end; j++) {
            let k_row = k_head + j * P.d;
            var score = 0.0;
            for (var d = 0u; d < P.d; d++) {
                score = fma(Q[q_base + d], K[k_row + d], score);
            }
            score *= P.scale;
            let v_row = v_head + j * P.d + d0;
            if (j == 0u) {
                running_max = score;
                running_sum = 1.0;
                for (var d = 0u; d < dn; d++) {
                    acc[d] = V[v_row + d];
                }
            } else if (score > running_max) {
                // New maximum: rescale what was accumulated so far.
                let correction = exp(running_max - score);
                running_sum = fma(running_sum, correction, 1.0);
                for (var d = 0u; d < dn; d++) {
                    acc[d] = fma(acc[d], correction, V[v_row + d]);
                }
                running_max = score;
            } else {
                let weight = exp(score - running_max);
                running_sum += weight;
                for (var d = 0u; d < dn; d++) {
                    acc[d] = fma(weight, V[v_row + d], acc[d]);
                }
            }
        }
        if (kv_end == 0u) {
            for (var d = 0u; d < dn; d++) {
                O[o_base + d0 + d] = 0.0;
            }
        } else {
            let inv = 1.0 / running_sum;
            for (var d = 0u; d < dn; d++) {
                O[o_base + d0 + d] = acc[d] * inv;
            }
        }
    }
}
