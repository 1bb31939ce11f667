// Helpers shared by every computehal WGSL kernel (prepended to each module).
//
// WGSL implementations may assume that floats are finite: comparisons such as
// `x != x` and builtins such as max() / min() do not reliably see NaN, and
// expressions like `x - x` may be folded to 0. NaN tests are therefore done on
// the bit pattern, and infinities are built with bitcast.

fn f32_inf() -> f32 {
    return bitcast<f32>(0x7f800000u);
}

fn f32_neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

fn f32_nan() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn is_inf(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u;
}

fn is_finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

// fmax / fmin as in C99 and numpy.fmax: a NaN operand is ignored.
fn fmax_nan(a: f32, b: f32) -> f32 {
    if (is_nan(a)) {
        return b;
    }
    if (is_nan(b)) {
        return a;
    }
    return select(b, a, a > b);
}

fn fmin_nan(a: f32, b: f32) -> f32 {
    if (is_nan(a)) {
        return b;
    }
    if (is_nan(b)) {
        return a;
    }
    return select(b, a, a < b);
}

// Linear invocation index of a 1-D problem launched on a 2-D grid of workgroups
// (maxComputeWorkgroupsPerDimension is 65535, so large problems use grid.y too).
fn linear_id(wid: vec3<u32>, nwg: vec3<u32>, lidx: u32, wg_size: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * wg_size + lidx;
}

// The taps [lo, hi) of a (dilated) filter or pooling window dimension whose positions
// start + tap * dil lie in [0, size).
fn tap_range(start: i32, dil: u32, taps: u32, size: u32) -> vec2<u32> {
    let d = i32(dil);
    var lo = 0;
    if (start < 0) {
        lo = (-start + d - 1) / d;
    }
    var hi = 0;
    if (i32(size) > start) {
        hi = min(i32(taps), (i32(size) - start + d - 1) / d);
    }
    return vec2<u32>(u32(lo), u32(max(lo, hi)));
}
