// Scaled dot-product attention with an online softmax, one invocation per query row.
//
// Q, O: [batch * heads, seq_q, head_dim]; K, V: [batch * kv_heads, seq_kv, head_dim],
// row-major float32; query head h reads key/value head h / group (grouped-query
// attention). An optional additive mask M is read through element strides over
// [batch, heads, seq_q, seq_kv] (0 along its broadcast dimensions) and added to the
// scaled scores. Keys are streamed one at a time with a running maximum, running
// sum and a private accumulator, so no seq_q x seq_kv score matrix ever exists; memory
// is O(head_dim) per invocation. Head dimensions above DC are processed in chunks of DC
// output columns (the scores are recomputed per chunk). Causal masking is bottom-right
// aligned: query i sees key j iff j <= i + causal_offset. A key is visible when the
// causal rule allows it and its masked score is not -inf; a query that sees no key (its
// running sum stays 0) gets a zero row. A NaN score, or +inf (exp(inf - inf)), makes
// its row NaN.
//
// One dispatch may cover only part of the work: output columns [d_lo, d_hi) (multiples
// of DC) and keys [kv_lo, kv_hi). Unless `first` is set, an invocation resumes the
// online-softmax state of its row (unnormalised accumulator, running maximum, running
// sum per DC-column chunk) from the scratch buffer S; unless `last` is set it stores the
// state back instead of writing O. Consecutive dispatches over consecutive key ranges
// therefore perform exactly the arithmetic of one pass over all keys (used where an
// adapter limits the loop iterations of one invocation, see wgpu.py). Row r's state
// lies at S[r * s_stride ..]: d accumulator columns, then (max, sum) per column chunk.

struct Params {
    rows: u32, // batch * heads
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
    d_lo: u32,
    d_hi: u32,
    kv_lo: u32,
    kv_hi: u32,
    first: u32,
    last: u32,
    s_stride: u32,
    heads: u32, // query heads per batch
    kv_heads: u32,
    group: u32, // heads / kv_heads
    has_mask: u32,
    m_off: u32,
    m_stride: vec4<u32>, // mask element strides over [batch, heads, seq_q, seq_kv]
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> Q: array<f32>;
@group(0) @binding(2) var<storage, read_write> K: array<f32>;
@group(0) @binding(3) var<storage, read_write> V: array<f32>;
@group(0) @binding(4) var<storage, read_write> O: array<f32>;
@group(0) @binding(5) var<storage, read_write> S: array<f32>;
@group(0) @binding(6) var<storage, read_write> M: array<f32>;

const WG: u32 = 64u;
const DC: u32 = 128u;

// Grid: x = blocks of 64 queries, (y, z) = head (batch * heads). Everything a key costs
// to load (K and V rows) is the same for every invocation of a workgroup, and the key
// loop bound is the workgroup's largest, so those loads are uniform; invocations whose
// row may not see key j (causal) or that lie past seq_q give it zero weight.
@compute @workgroup_size(64)
fn attention(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let head = wid.z * nwg.y + wid.y;
    if (head >= P.rows) {
        return;
    }
    let first = wid.x * WG;
    let last = min(first + WG, P.seq_q) - 1u;
    let i_raw = first + lidx;
    let valid = i_raw < P.seq_q;
    let i = min(i_raw, P.seq_q - 1u);
    let row = head * P.seq_q + i;
    let q_base = P.q_off + row * P.d;
    let o_base = P.o_off + row * P.d;
    let b = head / P.heads;
    let h = head % P.heads;
    let kv = b * P.kv_heads + h / P.group;
    let k_head = P.k_off + kv * P.seq_kv * P.d;
    let v_head = P.v_off + kv * P.seq_kv * P.d;
    let m_row = P.m_off + b * P.m_stride.x + h * P.m_stride.y + i * P.m_stride.z;

    var kv_end = P.seq_kv;
    var kv_end_block = P.seq_kv;
    if (P.causal != 0u) {
        kv_end = u32(clamp(i32(i) + P.causal_offset + 1, 0, i32(P.seq_kv)));
        kv_end_block = u32(clamp(i32(last) + P.causal_offset + 1, 0, i32(P.seq_kv)));
    }

    var acc: array<f32, 128>;
    let s_row = row * P.s_stride;
    let j_end = min(P.kv_hi, kv_end_block);
    for (var d0 = P.d_lo; d0 < P.d_hi; d0 += DC) {
        let dn = min(DC, P.d - d0);
        let s_acc = s_row + d0;
        let s_ms = s_row + P.d + 2u * (d0 / DC);
        // Running maximum starts at the most negative finite float so that no
        // inf - inf ever occurs; weights of keys a row may not see are forced to 0.
        var running_max = -3.4028234663852886e38;
        var running_sum = 0.0;
        if (P.first != 0u) {
            for (var d = 0u; d < dn; d++) {
                acc[d] = 0.0;
            }
        } else {
            for (var d = 0u; d < dn; d++) {
                acc[d] = S[s_acc + d];
            }
            running_max = S[s_ms];
            running_sum = S[s_ms + 1u];
        }
        for (var j = P.kv_lo; j < j_end; j++) {
            let k_row = k_head + j * P.d;
            // Four columns per iteration (then the rest): the same sequence of fma as
            // one column per iteration, in a quarter of the loop iterations.
            var score = 0.0;
            var d4 = 0u;
            for (; d4 + 4u <= P.d; d4 += 4u) {
                score = fma(Q[q_base + d4], K[k_row + d4], score);
                score = fma(Q[q_base + d4 + 1u], K[k_row + d4 + 1u], score);
                score = fma(Q[q_base + d4 + 2u], K[k_row + d4 + 2u], score);
                score = fma(Q[q_base + d4 + 3u], K[k_row + d4 + 3u], score);
            }
            for (var d = d4; d < P.d; d++) {
                score = fma(Q[q_base + d], K[k_row + d], score);
            }
            score *= P.scale;
            var visible = j < kv_end;
            if (P.has_mask != 0u) {
                score += M[m_row + j * P.m_stride.w];
                visible = visible && bitcast<u32>(score) != 0xff800000u;
            }
            if (!visible) {
                continue;  // a key this query cannot see is not read at all (no 0 * inf)
            }
            let new_max = select(running_max, max(running_max, score), visible);
            let correction = exp(running_max - new_max);
            let weight = select(0.0, exp(score - new_max), visible);
            running_sum = fma(running_sum, correction, weight);
            let v_row = v_head + j * P.d + d0;
            var a4 = 0u;
            for (; a4 + 4u <= dn; a4 += 4u) {
                acc[a4] = fma(acc[a4], correction, weight * V[v_row + a4]);
                acc[a4 + 1u] = fma(acc[a4 + 1u], correction, weight * V[v_row + a4 + 1u]);
                acc[a4 + 2u] = fma(acc[a4 + 2u], correction, weight * V[v_row + a4 + 2u]);
                acc[a4 + 3u] = fma(acc[a4 + 3u], correction, weight * V[v_row + a4 + 3u]);
            }
            for (var d = a4; d < dn; d++) {
                acc[d] = fma(acc[d], correction, weight * V[v_row + d]);
            }
            running_max = new_max;
        }
        if (valid) {
            if (P.last == 0u) {
                for (var d = 0u; d < dn; d++) {
                    S[s_acc + d] = acc[d];
                }
                S[s_ms] = running_max;
                S[s_ms + 1u] = running_sum;
            } else if (running_sum == 0.0) {
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
}
