// Direct 2-D convolution (NCHW input, KCHW filter, cross-correlation, zero padding)
// and its two gradients. One invocation per element of the tensor being written.
//
// A dispatch may cover only part of each element's sum (used where an adapter limits the
// loop iterations of one invocation, see wgpu.py): the range [r_lo, r_hi) of the outer
// summed dimension (input channels for conv_forward, filters for conv_backward_data,
// images for conv_backward_filter, whose output rows are further limited to
// [q_lo, q_hi)). With `accumulate` set the sum continues from the value already in the
// output, so consecutive dispatches over consecutive ranges compute exactly the sum of
// one pass.

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
    x_off: u32,
    f_off: u32,
    y_off: u32,
    total: u32,
    r_lo: u32,
    r_hi: u32,
    q_lo: u32,
    q_hi: u32,
    accumulate: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> F: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;

const WG: u32 = 256u;

// y[n, k, oy, ox] = sum_{c, r, s} x[n, c, oy*sh + r - ph, ox*sw + s - pw] * f[k, c, r, s]
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
    let y0 = i32(oy * P.sh) - i32(P.ph);
    let x0 = i32(ox * P.sw) - i32(P.pw);
    // Filter taps that land inside the input.
    let r_lo = u32(max(0, -y0));
    let r_hi = u32(clamp(i32(P.h) - y0, 0, i32(P.fh)));
    let s_lo = u32(max(0, -x0));
    let s_hi = u32(clamp(i32(P.w) - x0, 0, i32(P.fw)));
    var acc = 0.0;
    if (P.accumulate != 0u) {
        acc = Y[P.y_off + t];
    }
    for (var ch = P.r_lo; ch < P.r_hi; ch++) {
        let x_plane = P.x_off + (nn * P.c + ch) * P.h * P.w;
        let f_plane = P.f_off + (kk * P.c + ch) * P.fh * P.fw;
        for (var r = r_lo; r < r_hi; r++) {
            let x_row = x_plane + u32(y0 + i32(r)) * P.w;
            let f_row = f_plane + r * P.fw;
            for (var s = s_lo; s < s_hi; s++) {
                acc = fma(X[x_row + u32(x0 + i32(s))], F[f_row + s], acc);
            }
        }
    }
    Y[P.y_off + t] = acc;
}

// dx[n, c, iy, ix] = sum over (k, r, s) with iy + ph - r = oy*sh, ix + pw - s = ox*sw
// of dy[n, k, oy, ox] * f[k, c, r, s]; positions no output reads get 0.
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
    let py = iy + P.ph;
    let px = ix + P.pw;
    var acc = 0.0;
    if (P.accumulate != 0u) {
        acc = X[P.x_off + t];
    }
    for (var r = 0u; r < P.fh; r++) {
        if (r > py || (py - r) % P.sh != 0u) {
            continue;
        }
        let oy = (py - r) / P.sh;
        if (oy >= P.oh) {
            continue;
        }
        for (var s = 0u; s < P.fw; s++) {
            if (s > px || (px - s) % P.sw != 0u) {
                continue;
            }
            let ox = (px - s) / P.sw;
            if (ox >= P.ow) {
                continue;
            }
            for (var kk = P.r_lo; kk < P.r_hi; kk++) {
                let dy = Y[P.y_off + ((nn * P.k + kk) * P.oh + oy) * P.ow + ox];
                let f = F[P.f_off + ((kk * P.c + ch) * P.fh + r) * P.fw + s];
                acc = fma(dy, f, acc);
            }
        }
    }
    X[P.x_off + t] = acc;
}

// df[k, c, r, s] = sum_{n, oy, ox} x[n, c, oy*sh + r - ph, ox*sw + s - pw] * dy[n, k, oy, ox]
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
    let ch = (t / (P.fw * P.fh)) % P.c;
    let kk = t / (P.fw * P.fh * P.c);
    // Output positions whose tap (r, s) reads inside the input.
    let oy_lo = (max(P.ph, r) - r + P.sh - 1u) / P.sh;
    let ox_lo = (max(P.pw, s) - s + P.sw - 1u) / P.sw;
    var acc = 0.0;
    if (P.accumulate != 0u) {
        acc = F[P.f_off + t];
    }
    for (var nn = P.r_lo; nn < P.r_hi; nn++) {
        let x_plane = P.x_off + (nn * P.c + ch) * P.h * P.w;
        let y_plane = P.y_off + (nn * P.k + kk) * P.oh * P.ow;
        for (var oy = max(oy_lo, P.q_lo); oy < P.q_hi; oy++) {
            let iy = oy * P.sh + r - P.ph;
            if (iy >= P.h) {
                break;
            }
            for (var ox = ox_lo; ox < P.ow; ox++) {
                let ix = ox * P.sw + s - P.pw;
                if (ix >= P.w) {
                    break;
                }
                acc = fma(X[x_plane + iy * P.w + ix], Y[y_plane + oy * P.ow + ox], acc);
            }
        }
    }
    F[P.f_off + t] = acc;
}
