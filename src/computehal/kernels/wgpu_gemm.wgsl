// Column-major GEMM, C = alpha * op(A) @ op(B) + beta * C, float32, batched over grid z.
//
// A workgroup of 16 x 16 invocations computes a 64 x 64 tile of C; each invocation
// owns 4 x 4 elements (rows tx + 16 r, columns ty + 16 s) so neighbouring invocations
// touch neighbouring rows of the column-major C. K advances in steps of 16 through
// workgroup memory. round_mode 1 / 2 rounds every element of A and B to f16 / bf16
// (round-to-nearest-even, by bit manipulation of the f32, so no shader-f16 feature is
// needed) before use; accumulation is float32.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    lda: u32,
    ldb: u32,
    ldc: u32,
    a_off: u32,
    b_off: u32,
    c_off: u32,
    stride_a: u32,
    stride_b: u32,
    stride_c: u32,
    batch_base: u32,
    trans_a: u32,
    trans_b: u32,
    beta_zero: u32,
    round_mode: u32,
    alpha: f32,
    beta: f32,
    batch_count: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> C: array<f32>;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

var<workgroup> As: array<f32, 1024>; // [TK][TM]
var<workgroup> Bs: array<f32, 1024>; // [TK][TN]

fn round_bf16(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return x;
    }
    let rounded = bits + 0x7fffu + ((bits >> 16u) & 1u);
    return bitcast<f32>(rounded & 0xffff0000u);
}

fn round_f16(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    let sign = bits & 0x80000000u;
    let mag = bits & 0x7fffffffu;
    if (mag >= 0x7f800000u) {
        return x; // inf and NaN stay
    }
    if (mag >= 0x477ff000u) {
        return bitcast<f32>(sign | 0x7f800000u); // beyond 65504 + half an ulp: inf
    }
    if (mag >= 0x38800000u) {
        // Normal f16: keep 10 mantissa bits, round the 13 dropped bits to nearest even.
        let rounded = mag + 0x0fffu + ((mag >> 13u) & 1u);
        return bitcast<f32>(sign | (rounded & 0xffffe000u));
    }
    // Subnormal f16: a multiple of 2^-24. Scaling by 2^24 is exact, and round() is
    // round-half-to-even.
    let scaled = round(bitcast<f32>(mag) * 16777216.0) * 5.9604644775390625e-8;
    return bitcast<f32>(sign | bitcast<u32>(scaled));
}

fn narrow(x: f32) -> f32 {
    if (P.round_mode == 1u) {
        return round_f16(x);
    }
    if (P.round_mode == 2u) {
        return round_bf16(x);
    }
    return x;
}

// Slot e of a 64 x TK operand tile as (row of op(M), k): walking down a column of the
// stored matrix when it is not `along_k` (contiguous in memory), else along k.
fn tile_slot(e: u32, along_k: bool) -> vec2<u32> {
    if (along_k) {
        return vec2<u32>(e / TK, e % TK);
    }
    return vec2<u32>(e % TM, e / TM);
}

// Element (row, p) of op(A) (operand 0: row i of m) or op(B) (operand 1: column j of n)
// at `base`, narrowed; 0 outside the matrix. `along_k`: the stored matrix holds that
// element at p + row * ld (else row + p * ld).
fn operand_at(operand: u32, row: u32, p: u32, base: u32, along_k: bool) -> f32 {
    let rows = select(P.m, P.n, operand == 1u);
    let ld = select(P.lda, P.ldb, operand == 1u);
    if (row >= rows || p >= P.k) {
        return 0.0;
    }
    let idx = base + select(row + p * ld, p + row * ld, along_k);
    if (operand == 0u) {
        return narrow(A[idx]);
    }
    return narrow(B[idx]);
}

@compute @workgroup_size(16, 16, 1)
fn gemm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let batch = wid.z + P.batch_base;
    let a_base = P.a_off + batch * P.stride_a;
    let b_base = P.b_off + batch * P.stride_b;
    let c_base = P.c_off + batch * P.stride_c;
    let row0 = wid.x * TM;
    let col0 = wid.y * TN;
    let tx = lid.x;
    let ty = lid.y;

    var acc: array<f32, 16>;
    for (var t = 0u; t < 16u; t++) {
        acc[t] = 0.0;
    }

    for (var p0 = 0u; p0 < P.k; p0 += TK) {
        for (var t = 0u; t < 4u; t++) {
            let e = lidx + t * 256u;
            let ca = tile_slot(e, P.trans_a != 0u);
            As[ca.y * TM + ca.x] = operand_at(0u, row0 + ca.x, p0 + ca.y, a_base, P.trans_a != 0u);
            let cb = tile_slot(e, P.trans_b == 0u);
            Bs[cb.y * TN + cb.x] = operand_at(1u, col0 + cb.x, p0 + cb.y, b_base, P.trans_b == 0u);
        }
        workgroupBarrier();
        for (var pp = 0u; pp < TK; pp++) {
            let a0 = As[pp * TM + tx];
            let a1 = As[pp * TM + tx + 16u];
            let a2 = As[pp * TM + tx + 32u];
            let a3 = As[pp * TM + tx + 48u];
            for (var s = 0u; s < 4u; s++) {
                let bv = Bs[pp * TN + ty + 16u * s];
                acc[s * 4u] = fma(a0, bv, acc[s * 4u]);
                acc[s * 4u + 1u] = fma(a1, bv, acc[s * 4u + 1u]);
                acc[s * 4u + 2u] = fma(a2, bv, acc[s * 4u + 2u]);
                acc[s * 4u + 3u] = fma(a3, bv, acc[s * 4u + 3u]);
            }
        }
        workgroupBarrier();
    }

    for (var s = 0u; s < 4u; s++) {
        let j = col0 + ty + 16u * s;
        if (j >= P.n) {
            continue;
        }
        for (var r = 0u; r < 4u; r++) {
            let i = row0 + tx + 16u * r;
            if (i >= P.m) {
                continue;
            }
            let idx = c_base + i + j * P.ldc;
            var value = P.alpha * acc[s * 4u + r];
            if (P.beta_zero == 0u) {
                value = fma(P.beta, C[idx], value);
            }
            C[idx] = value;
        }
    }
}

// BLAS quick return (k == 0 or alpha == 0): C = beta * C, write-only when beta == 0.
@compute @workgroup_size(16, 16, 1)
fn gemm_scale(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let j = gid.y;
    if (i >= P.m || j >= P.n) {
        return;
    }
    let idx = P.c_off + (gid.z + P.batch_base) * P.stride_c + i + j * P.ldc;
    if (P.beta_zero != 0u) {
        C[idx] = 0.0;
    } else {
        C[idx] = P.beta * C[idx];
    }
}

// Small matrices (and many of them): one invocation per element of C over all batches,
// a plain dot product along k. The tiled kernel would leave most of a 64 x 64 tile idle.
@compute @workgroup_size(256)
fn gemm_small(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, 256u);
    let per_batch = P.m * P.n;
    if (t >= per_batch * P.batch_count) {
        return;
    }
    let i = t % P.m;
    let j = (t / P.m) % P.n;
    let batch = t / per_batch + P.batch_base;
    let a_base = P.a_off + batch * P.stride_a;
    let b_base = P.b_off + batch * P.stride_b;
    var a_idx = a_base + i;
    var a_step = P.lda;
    if (P.trans_a != 0u) {
        a_idx = a_base + i * P.lda;
        a_step = 1u;
    }
    var b_idx = b_base + j * P.ldb;
    var b_step = 1u;
    if (P.trans_b != 0u) {
        b_idx = b_base + j;
        b_step = P.ldb;
    }
    var acc = 0.0;
    for (var p = 0u; p < P.k; p++) {
        acc = fma(narrow(A[a_idx]), narrow(B[b_idx]), acc);
        a_idx += a_step;
        b_idx += b_step;
    }
    let idx = P.c_off + batch * P.stride_c + i + j * P.ldc;
    var value = P.alpha * acc;
    if (P.beta_zero == 0u) {
        value = fma(P.beta, C[idx], value);
    }
    C[idx] = value;
}
