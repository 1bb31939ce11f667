// Byte-exact data movement over 32-bit words: fills and copies of any byte range.
//
// Storage buffers are arrays of u32, so a range whose ends are not word-aligned shares
// its first and last words with neighbouring data. Each invocation owns one whole
// destination word: it merges the bytes of [dst_byte, dst_byte + nbytes) that fall in
// its word with the bytes it keeps, so no two invocations ever write the same word.

struct Params {
    words: u32,    // destination words touched (the grid covers these)
    dst_byte: u32, // byte offset of the range inside D
    src_byte: u32, // byte offset of the source inside S (copy_bytes)
    nbytes: u32,
    pattern: u32,  // the word written by fill_words (its bytes repeat with period 4)
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> S: array<u32>;
@group(0) @binding(2) var<storage, read_write> D: array<u32>;

const WG: u32 = 256u;

// Bytes [lo, hi) of word w (absolute byte positions) are the ones this call writes.
fn word_span(w: u32) -> vec2<u32> {
    let lo = max(w * 4u, P.dst_byte);
    let hi = min(w * 4u + 4u, P.dst_byte + P.nbytes);
    return vec2<u32>(lo, hi);
}

// `old` with bytes [lo, hi) (absolute positions inside word w) taken from `new_bytes`.
fn merge(w: u32, old: u32, new_bytes: u32, span: vec2<u32>) -> u32 {
    var keep = 0xffffffffu;
    for (var b = span.x; b < span.y; b++) {
        keep &= ~(0xffu << ((b - w * 4u) * 8u));
    }
    return (old & keep) | (new_bytes & ~keep);
}

// Word w takes the bytes of `bytes` that fall in this call's range and keeps the others.
fn store_word(w: u32, bytes: u32) {
    let span = word_span(w);
    if (span.y - span.x == 4u) {
        D[w] = bytes;
    } else {
        D[w] = merge(w, D[w], bytes, span);
    }
}

@compute @workgroup_size(256)
fn fill_words(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, WG);
    if (t >= P.words) {
        return;
    }
    store_word(P.dst_byte / 4u + t, P.pattern);
}

// The 4 source bytes that land in destination word w, starting at absolute source byte s0
// (s0 may lie before the source's first byte for a head word: those bytes are not used).
fn source_word(s0: i32) -> u32 {
    if (s0 < 0) {
        // Head word before the source start: only its bytes from -s0 on are used.
        let shift = u32(-s0) * 8u;
        return S[0] << shift;
    }
    let s = u32(s0);
    let sh = (s & 3u) * 8u;
    let lo = S[s >> 2u];
    if (sh == 0u) {
        return lo;
    }
    // The next word is read only when one of its bytes is needed.
    let last = P.src_byte + P.nbytes - 1u;
    var hi = 0u;
    if ((s >> 2u) + 1u <= (last >> 2u)) {
        hi = S[(s >> 2u) + 1u];
    }
    return (lo >> sh) | (hi << (32u - sh));
}

@compute @workgroup_size(256)
fn copy_bytes(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, WG);
    if (t >= P.words) {
        return;
    }
    let w = P.dst_byte / 4u + t;
    // Source byte that lands on the first byte of word w.
    let s0 = i32(P.src_byte) + i32(w * 4u) - i32(P.dst_byte);
    store_word(w, source_word(s0));
}
