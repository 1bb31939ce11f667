// Direct 2-D convolution (NCHW input, KCHW filter, cross-correlation) and its two
// gradients, with groups, dilation, padding (top / left here; bottom / right are implied
// by the output size) and an optional bias. One invocation per element written.
//
// Filter k belongs to group g = k / kg and sees input channels g * cg .. g * cg + cg - 1
// (cg = C / groups, kg = K / groups); tap (r, s) reads input row oy * sh - ph + r * dh
// and column ox * sw - pw + s * dw. Taps that fall into the padding are skipped rather
// than multiplied by zero, so a NaN or infinity reaches exactly the outputs that read it.
//
// A dispatch may cover only part of each element's sum (where an adapter limits the loop
// iterations of one invocation): the range [r_lo, r_hi) of the outer summed dimension
// (the group's input channels for conv_forward, its filters for conv_backward_data,
// the images for conv_backward_filter, whose output rows are further limited to
// [q_lo, q_hi)). With `accumulate` set the sum continues from the value already in the
// output, so consecutive dispatches over consecutive ranges compute the sum of one pass.

struct Params {
    n: u32,
    c: u32,
    h: u32,
    w: u32,
    k: u32,
    fh: u32,
    fw: u32,
    oh: u32,
    ow: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    dh: u32,
    dw: u32,
    cg: u32,
    kg: u32,
    x_off: u32,
    f_off: u32,
    y_off: u32,
    b_off: u32,
    has_bias: u32,
    total: u32,
    r_lo: u32,
    r_hi: u32,
    q_lo: u32,
    q_hi: u32,
    accumulate: u32,
    patch_w: u32, // conv_depthwise: the input patch a workgroup's tile reads
    patch_h: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> F: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
@group(0) @binding(4) var<storage, read_write> Bias: array<f32>;

const WG: u32 = 256u;

fn initial(t: u32, kk: u32, current: f32) -> f32 {
    if (P.accumulate != 0u) {
        return current;
    }
    if (P.has_bias != 0u) {
        return Bias[P.b_off + kk];
    }
    return 0.0;
}

// y[n, k, oy, ox] = bias[k] + sum over the group's channels and the taps inside the input.
@compute @workgroup_size(256)
fn conv_forward(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, WG);
    if (t >= P.total) {
        return;
    }
    let ox = t % P.ow;
    let oy = (t / P.ow) % P.oh;
    let kk = (t / (P.ow * P.oh)) % P.k;
    let nn = t / (P.ow * P.oh * P.k);
    let c0 = (kk / P.kg) * P.cg;
    let y0 = i32(oy * P.sh) - i32(P.ph);
    let x0 = i32(ox * P.sw) - i32(P.pw);
    let rr = tap_range(y0, P.dh, P.fh, P.h);
    let ss = tap_range(x0, P.dw, P.fw, P.w);
    var acc = initial(t, kk, Y[P.y_off + t]);
    for (var cc = P.r_lo; cc < P.r_hi; cc++) {
        let x_plane = P.x_off + (nn * P.c + c0 + cc) * P.h * P.w;
        let f_plane = P.f_off + (kk * P.cg + cc) * P.fh * P.fw;
        for (var r = rr.x; r < rr.y; r++) {
            let x_row = x_plane + u32(y0 + i32(r * P.dh)) * P.w;
            let f_row = f_plane + r * P.fw;
            for (var s = ss.x; s < ss.y; s++) {
                acc = fma(X[x_row + u32(x0 + i32(s * P.dw))], F[f_row + s], acc);
            }
        }
    }
    Y[P.y_off + t] = acc;
}

// Depthwise forward (cg == 1): a workgroup computes a 16 x 16 tile of one output plane
// from the input patch it reads, staged once in workgroup memory.
var<workgroup> tile_in: array<f32, 2304>;

@compute @workgroup_size(16, 16)
fn conv_depthwise(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let plane = wid.z; // n * K + k
    let kk = plane % P.k;
    let nn = plane / P.k;
    let ch = kk / P.kg;
    let py0 = i32(wid.y * 16u * P.sh) - i32(P.ph);
    let px0 = i32(wid.x * 16u * P.sw) - i32(P.pw);
    let x_plane = P.x_off + (nn * P.c + ch) * P.h * P.w;
    for (var i = lidx; i < P.patch_w * P.patch_h; i += 256u) {
        let iy = py0 + i32(i / P.patch_w);
        let ix = px0 + i32(i % P.patch_w);
        var value = 0.0;
        if (iy >= 0 && iy < i32(P.h) && ix >= 0 && ix < i32(P.w)) {
            value = X[x_plane + u32(iy) * P.w + u32(ix)];
        }
        tile_in[i] = value;
    }
    workgroupBarrier();
    let ox = wid.x * 16u + lid.x;
    let oy = wid.y * 16u + lid.y;
    if (ox >= P.ow || oy >= P.oh) {
        return;
    }
    let t = (plane * P.oh + oy) * P.ow + ox;
    let y0 = i32(oy * P.sh) - i32(P.ph);
    let x0 = i32(ox * P.sw) - i32(P.pw);
    let rr = tap_range(y0, P.dh, P.fh, P.h);
    let ss = tap_range(x0, P.dw, P.fw, P.w);
    let f_plane = P.f_off + kk * P.fh * P.fw;
    var acc = initial(t, kk, 0.0);
    for (var r = rr.x; r < rr.y; r++) {
        let row = u32(y0 + i32(r * P.dh) - py0) * P.patch_w;
        for (var s = ss.x; s < ss.y; s++) {
            acc = fma(tile_in[row + u32(x0 + i32(s * P.dw) - px0)], F[f_plane + r * P.fw + s], acc);
        }
    }
    Y[P.y_off + t] = acc;
}

// dx[n, c, iy, ix] = sum over the group's filters k and the taps (r, s) with
// iy + ph - r * dh = oy * sh and ix + pw - s * dw = ox * sw of dy[n, k, oy, ox] * f[k, c', r, s].
@compute @workgroup_size(256)
fn conv_backward_data(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, WG);
    if (t >= P.total) {
        return;
    }
    let ix = t % P.w;
    let iy = (t / P.w) % P.h;
    let ch = (t / (P.w * P.h)) % P.c;
    let nn = t / (P.w * P.h * P.c);
    let g = ch / P.cg;
    let cc = ch - g * P.cg;
    let k0 = g * P.kg;
    let py = iy + P.ph;
    let px = ix + P.pw;
    var acc = 0.0;
    if (P.accumulate != 0u) {
        acc = X[P.x_off + t];
    }
    for (var r = 0u; r < P.fh; r++) {
        if (r * P.dh > py) {
            break;
        }
        let ty = py - r * P.dh;
        if (ty % P.sh != 0u || ty / P.sh >= P.oh) {
            continue;
        }
        let oy = ty / P.sh;
        for (var s = 0u; s < P.fw; s++) {
            if (s * P.dw > px) {
                break;
            }
            let tx = px - s * P.dw;
            if (tx % P.sw != 0u || tx / P.sw >= P.ow) {
                continue;
            }
            let ox = tx / P.sw;
            for (var j = P.r_lo; j < P.r_hi; j++) {
                let kk = k0 + j;
                let dy = Y[P.y_off + ((nn * P.k + kk) * P.oh + oy) * P.ow + ox];
                let f = F[P.f_off + ((kk * P.cg + cc) * P.fh + r) * P.fw + s];
                acc = fma(dy, f, acc);
            }
        }
    }
    X[P.x_off + t] = acc;
}

// The output positions [lo, hi) whose tap at offset `base` (input = o * stride + base)
// lies inside an input of `size`, clipped to [0, limit).
fn out_range(base: i32, stride: u32, size: u32, limit: u32) -> vec2<u32> {
    let st = i32(stride);
    var lo = 0;
    if (base < 0) {
        lo = (-base + st - 1) / st;
    }
    var hi = 0;
    if (i32(size) - 1 - base >= 0) {
        hi = min(i32(limit), (i32(size) - 1 - base) / st + 1);
    }
    return vec2<u32>(u32(lo), u32(max(lo, hi)));
}

// df[k, c', r, s] = sum over n, oy, ox of x[n, g * cg + c', oy*sh - ph + r*dh, ox*sw - pw + s*dw] * dy[n, k, oy, ox].
@compute @workgroup_size(256)
fn conv_backward_filter(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, WG);
    if (t >= P.total) {
        return;
    }
    let s = t % P.fw;
    let r = (t / P.fw) % P.fh;
    let cc = (t / (P.fw * P.fh)) % P.cg;
    let kk = t / (P.fw * P.fh * P.cg);
    let ch = (kk / P.kg) * P.cg + cc;
    let base_y = i32(r * P.dh) - i32(P.ph);
    let base_x = i32(s * P.dw) - i32(P.pw);
    let oys = out_range(base_y, P.sh, P.h, P.oh);
    let oxs = out_range(base_x, P.sw, P.w, P.ow);
    let oy_lo = max(oys.x, P.q_lo);
    let oy_hi = min(oys.y, P.q_hi);
    var acc = 0.0;
    if (P.accumulate != 0u) {
        acc = F[P.f_off + t];
    }
    for (var nn = P.r_lo; nn < P.r_hi; nn++) {
        let x_plane = P.x_off + (nn * P.c + ch) * P.h * P.w;
        let y_plane = P.y_off + (nn * P.k + kk) * P.oh * P.ow;
        for (var oy = oy_lo; oy < oy_hi; oy++) {
            let x_row = x_plane + u32(i32(oy * P.sh) + base_y) * P.w;
            let y_row = y_plane + oy * P.ow;
            for (var ox = oxs.x; ox < oxs.y; ox++) {
                acc = fma(X[x_row + u32(i32(ox * P.sw) + base_x)], Y[y_row + ox], acc);
            }
        }
    }
    F[P.f_off + t] = acc;
}
