// Conversions between float16, bfloat16 and float32, entirely on bit patterns
// (round-to-nearest-even, overflow to infinity, NaN kept NaN with its leading payload
// bits, subnormals exact), so no shader-f16 feature and no float arithmetic whose
// rounding or flushing the driver decides.
//
// 16-bit values live two per u32 word. Each invocation owns one whole output word and
// writes both of its halves (keeping a half that lies outside the output), so no two
// invocations ever touch the same word.

struct Params {
    words: u32,    // output words touched (the grid covers these)
    n: u32,        // elements converted
    in_byte: u32,  // byte offset of the input inside S
    out_byte: u32, // byte offset of the output inside D
    src: u32,      // KIND_* of the input
    dst: u32,      // KIND_* of the output
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> S: array<u32>;
@group(0) @binding(2) var<storage, read_write> D: array<u32>;

const WG: u32 = 256u;
const KIND_F16: u32 = 0u;
const KIND_BF16: u32 = 1u;
const KIND_F32: u32 = 2u;

fn f16_to_f32_bits(h: u32) -> u32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0x1fu) {
        return sign | 0x7f800000u | (m << 13u); // inf, NaN (payload kept)
    }
    if (e == 0u) {
        if (m == 0u) {
            return sign;
        }
        // Subnormal m * 2^-24 = 1.f * 2^(p - 24), p the leading bit of m.
        let p = firstLeadingBit(m);
        return sign | ((p + 103u) << 23u) | ((m << (23u - p)) & 0x7fffffu);
    }
    return sign | ((e + 112u) << 23u) | (m << 13u);
}

fn f32_bits_to_f16(x: u32) -> u32 {
    let sign = (x >> 16u) & 0x8000u;
    let mag = x & 0x7fffffffu;
    if (mag > 0x7f800000u) {
        let payload = (mag >> 13u) & 0x3ffu;
        return sign | 0x7c00u | select(payload, 0x200u, payload == 0u);
    }
    if (mag >= 0x477ff000u) {
        return sign | 0x7c00u; // beyond 65504 + half an ulp (and inf): inf
    }
    if (mag >= 0x38800000u) {
        // Normal: drop 13 mantissa bits, rounding to nearest even (a carry may bump the exponent).
        let r = mag + 0x0fffu + ((mag >> 13u) & 1u);
        return sign | ((r >> 13u) - (112u << 10u));
    }
    // Subnormal (or zero): the value in units of 2^-24, rounded to nearest even.
    let e = i32(mag >> 23u) - 127;
    if (e < -25) {
        return sign;
    }
    let m = (mag & 0x7fffffu) | 0x800000u;
    let s = u32(-(e + 1)); // 14 ..= 24
    var q = m >> s;
    let rem = m & ((1u << s) - 1u);
    let half = 1u << (s - 1u);
    if (rem > half || (rem == half && (q & 1u) == 1u)) {
        q += 1u;
    }
    return sign | q;
}

fn f32_bits_to_bf16(x: u32) -> u32 {
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        let h = x >> 16u;
        return select(h, h | 0x40u, (h & 0x7fu) == 0u); // stays a NaN
    }
    return (x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u;
}

// Element e of the input as float32 bits.
fn load_bits(e: u32) -> u32 {
    if (P.src == KIND_F32) {
        return S[P.in_byte / 4u + e];
    }
    let b = P.in_byte + 2u * e;
    let h = (S[b >> 2u] >> ((b & 2u) * 8u)) & 0xffffu;
    if (P.src == KIND_BF16) {
        return h << 16u;
    }
    return f16_to_f32_bits(h);
}

fn narrow_bits(x: u32) -> u32 {
    if (P.dst == KIND_BF16) {
        return f32_bits_to_bf16(x);
    }
    return f32_bits_to_f16(x);
}

// Half h (0: low, 1: high) of output word w: its new bits, or None (0x10000) when the
// half lies outside the output.
fn half_of(w: u32, h: u32) -> u32 {
    let b = w * 4u + 2u * h;
    if (b < P.out_byte) {
        return 0x10000u;
    }
    let e = (b - P.out_byte) / 2u;
    if (e >= P.n) {
        return 0x10000u;
    }
    return narrow_bits(load_bits(e));
}

@compute @workgroup_size(256)
fn convert(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, WG);
    if (t >= P.words) {
        return;
    }
    if (P.dst == KIND_F32) {
        D[P.out_byte / 4u + t] = load_bits(t);
        return;
    }
    let w = P.out_byte / 4u + t;
    let lo = half_of(w, 0u);
    let hi = half_of(w, 1u);
    var word = 0u;
    if (lo == 0x10000u || hi == 0x10000u) {
        word = D[w];
    }
    if (lo != 0x10000u) {
        word = (word & 0xffff0000u) | lo;
    }
    if (hi != 0x10000u) {
        word = (word & 0x0000ffffu) | (hi << 16u);
    }
    D[w] = word;
}
