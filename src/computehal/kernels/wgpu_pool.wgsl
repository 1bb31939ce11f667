// 2-D max / average pooling over NCHW, one invocation per output element.
//
// Output (i, j) covers input rows i * sh - pt + r * dh (r < kh) and likewise columns;
// only positions inside the input are read. MAX folds with fmax from -inf (padding and
// NaN ignored; a window with no input gives -inf). AVG sums (NaN propagates) and divides
// by the positions inside the input, or with count_include_pad inside the padded input
// [-pt, h + pb) x [-pl, w + pr) (ceil-mode overhang never counts).
//
// A dispatch may cover only the window rows [r_lo, r_hi) (where an adapter limits the
// loop iterations of one invocation): with `accumulate` it continues from the partial
// result in the output (the running maximum, or the running sum), and only the dispatch
// with `finish` divides an average.

struct Params {
    n: u32,
    c: u32,
    h: u32,
    w: u32,
    oh: u32,
    ow: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    pt: u32,
    pl: u32,
    pb: u32,
    pr: u32,
    dh: u32,
    dw: u32,
    op: u32,
    include_pad: u32,
    x_off: u32,
    y_off: u32,
    total: u32,
    r_lo: u32,
    r_hi: u32,
    accumulate: u32,
    finish: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn pool2d(
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
    let plane = t / (P.ow * P.oh);
    let y0 = i32(oy * P.sh) - i32(P.pt);
    let x0 = i32(ox * P.sw) - i32(P.pl);
    let rows = tap_range(y0, P.dh, P.kh, P.h);
    let cols = tap_range(x0, P.dw, P.kw, P.w);
    let is_max = P.op == POOL_MAX;
    var acc = select(0.0, f32_neg_inf(), is_max);
    if (P.accumulate != 0u) {
        acc = Y[P.y_off + t];
    }
    let x_plane = P.x_off + plane * P.h * P.w;
    for (var r = max(rows.x, P.r_lo); r < min(rows.y, P.r_hi); r++) {
        let x_row = x_plane + u32(y0 + i32(r * P.dh)) * P.w;
        for (var s = cols.x; s < cols.y; s++) {
            let value = X[x_row + u32(x0 + i32(s * P.dw))];
            if (is_max) {
                acc = fmax_nan(acc, value);
            } else {
                acc += value;
            }
        }
    }
    if (!is_max && P.finish != 0u) {
        var count: u32;
        if (P.include_pad != 0u) {
            let pr = tap_range(y0 + i32(P.pt), P.dh, P.kh, P.h + P.pt + P.pb);
            let pc = tap_range(x0 + i32(P.pl), P.dw, P.kw, P.w + P.pl + P.pr);
            count = (pr.y - pr.x) * (pc.y - pc.x);
        } else {
            count = (rows.y - rows.x) * (cols.y - cols.x);
        }
        if (count == 0u) {
            acc = f32_nan(); // 0 / 0: no position counts
        } else {
            acc = acc / f32(count);
        }
    }
    Y[P.y_off + t] = acc;
}
