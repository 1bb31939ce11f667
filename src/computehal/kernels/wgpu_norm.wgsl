// Normalisation: layer / RMS normalisation over rows (one workgroup per row, trees in
// workgroup memory), inference batch normalisation and LRN (one invocation per element).
// IEEE throughout: a NaN in a row (or in the values an element reads) makes it NaN.

struct Params {
    rows: u32,     // layer_norm / rms_norm: rows; batch_norm / lrn: elements
    cols: u32,     // layer_norm / rms_norm: row length; batch_norm / lrn: channels C
    spatial: u32,  // batch_norm / lrn: elements per channel plane
    x_off: u32,
    y_off: u32,
    s_off: u32,    // scale
    b_off: u32,    // bias
    m_off: u32,    // mean (batch_norm)
    v_off: u32,    // variance (batch_norm)
    has_scale: u32,
    has_bias: u32,
    rms: u32,
    eps: f32,      // lrn: alpha / size
    beta: f32,     // lrn
    bias: f32,     // lrn
    size: u32,     // lrn window
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read_write> Scale: array<f32>;
@group(0) @binding(4) var<storage, read_write> Shift: array<f32>;
@group(0) @binding(5) var<storage, read_write> Mean: array<f32>;
@group(0) @binding(6) var<storage, read_write> Var: array<f32>;

const WG: u32 = 256u;

var<workgroup> partial: array<f32, 256>;

fn row_sum(lidx: u32) -> f32 {
    for (var half = WG / 2u; half > 0u; half /= 2u) {
        workgroupBarrier();
        if (lidx < half) {
            partial[lidx] += partial[lidx + half];
        }
    }
    workgroupBarrier();
    let total = partial[0];
    workgroupBarrier();
    return total;
}

// layer_norm: y = (x - mean) / sqrt(var + eps) * scale + bias, var the biased variance
// (two passes: the mean, then the squared deviations); rms_norm: y = x / sqrt(mean(x^2)
// + eps) * scale + bias. A workgroup per row (grid.x * grid.y rows).
@compute @workgroup_size(256)
fn row_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= P.rows) {
        return;
    }
    let x0 = P.x_off + row * P.cols;
    let y0 = P.y_off + row * P.cols;
    let n = f32(P.cols);
    var mean = 0.0;
    if (P.rms == 0u) {
        var s = 0.0;
        for (var j = lidx; j < P.cols; j += WG) {
            s += X[x0 + j];
        }
        partial[lidx] = s;
        mean = row_sum(lidx) / n;
    }
    var q = 0.0;
    for (var j = lidx; j < P.cols; j += WG) {
        let d = X[x0 + j] - mean;
        q += d * d;
    }
    partial[lidx] = q;
    let inv = 1.0 / sqrt(row_sum(lidx) / n + P.eps);
    for (var j = lidx; j < P.cols; j += WG) {
        var y = (X[x0 + j] - mean) * inv;
        if (P.has_scale != 0u) {
            y *= Scale[P.s_off + j];
        }
        if (P.has_bias != 0u) {
            y += Shift[P.b_off + j];
        }
        Y[y0 + j] = y;
    }
}

// batch_norm (inference, channel axis 1): y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c].
@compute @workgroup_size(256)
fn batch_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = linear_id(wid, nwg, lidx, WG);
    if (i >= P.rows) {
        return;
    }
    let c = (i / P.spatial) % P.cols;
    let x = X[P.x_off + i];
    let y = (x - Mean[P.m_off + c]) / sqrt(Var[P.v_off + c] + P.eps);
    Y[P.y_off + i] = y * Scale[P.s_off + c] + Shift[P.b_off + c];
}

// lrn (ONNX): y = x / (bias + alpha / size * s) ^ beta, s the sum of x^2 over channels
// c - (size - 1) / 2 ..= c + size / 2 that exist. P.eps carries alpha / size.
@compute @workgroup_size(256)
fn lrn(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = linear_id(wid, nwg, lidx, WG);
    if (i >= P.rows) {
        return;
    }
    let c = i32((i / P.spatial) % P.cols);
    let plane0 = i - u32(c) * P.spatial; // element i at channel 0
    let lo = max(0, c - i32((P.size - 1u) / 2u));
    let hi = min(i32(P.cols) - 1, c + i32(P.size / 2u));
    var s = 0.0;
    for (var cc = lo; cc <= hi; cc++) {
        let v = X[P.x_off + plane0 + u32(cc) * P.spatial];
        s += v * v;
    }
    let x = X[P.x_off + i];
    Y[P.y_off + i] = x / pow_ieee(P.bias + P.eps * s, P.beta);
}
