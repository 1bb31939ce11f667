// Reductions and softmax over one axis of a row-major float32 tensor viewed as
// [outer, length, inner]. Output element (o, t) of a reduction reads
// x[(o * length + l) * inner + t] for l in [0, length).
//
// *_thread kernels give each invocation one (o, t) slice (coalesced across t);
// *_group kernels give each workgroup one slice and reduce it with a tree in workgroup
// memory (used when slices are long and few). MAX / MIN fold with fmax / fmin from
// -inf / +inf, ignoring NaN; MEAN divides the sum by length (0 for an empty axis).

struct Params {
    outer: u32,
    length: u32,
    inner: u32,
    in_off: u32,
    out_off: u32,
    op: u32,
    slices: u32,
    chunk: u32,
    divisor: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
// Partial results of the split softmax (softmax_split_*): per (slice, chunk) the chunk's
// maximum and NaN count, then after them the chunk's sum of exp(x - slice peak).
@group(0) @binding(3) var<storage, read_write> T: array<f32>;

const WG: u32 = 256u;

var<workgroup> partial: array<f32, 256>;
var<workgroup> partial2: array<f32, 256>;

fn identity(op: u32) -> f32 {
    if (op == REDUCE_MAX) {
        return f32_neg_inf();
    }
    if (op == REDUCE_MIN) {
        return f32_inf();
    }
    return 0.0;
}

fn combine(op: u32, a: f32, b: f32) -> f32 {
    if (op == REDUCE_MAX) {
        return fmax_nan(a, b);
    }
    if (op == REDUCE_MIN) {
        return fmin_nan(a, b);
    }
    return a + b;
}

// MEAN divides by `divisor` (the axis length; for the second pass of a split reduction
// the original axis length, not the number of partial results).
fn finish(op: u32, value: f32) -> f32 {
    if (op == REDUCE_MEAN && P.divisor > 0u) {
        return value / f32(P.divisor);
    }
    return value;
}

@compute @workgroup_size(256)
fn reduce_thread(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let slice = linear_id(wid, nwg, lidx, WG);
    if (slice >= P.slices) {
        return;
    }
    let o = slice / P.inner;
    let t = slice % P.inner;
    let base = P.in_off + o * P.length * P.inner + t;
    var value = identity(P.op);
    for (var l = 0u; l < P.length; l++) {
        value = combine(P.op, value, X[base + l * P.inner]);
    }
    Y[P.out_off + slice] = finish(P.op, value);
}

fn tree(op: u32, lidx: u32) {
    for (var half = WG / 2u; half > 0u; half /= 2u) {
        workgroupBarrier();
        if (lidx < half) {
            partial[lidx] = combine(op, partial[lidx], partial[lidx + half]);
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn reduce_group(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let slice = wid.y * nwg.x + wid.x;
    if (slice >= P.slices) {
        return;
    }
    let o = slice / P.inner;
    let t = slice % P.inner;
    let base = P.in_off + o * P.length * P.inner + t;
    var value = identity(P.op);
    for (var l = lidx; l < P.length; l += WG) {
        value = combine(P.op, value, X[base + l * P.inner]);
    }
    partial[lidx] = value;
    tree(P.op, lidx);
    if (lidx == 0u) {
        Y[P.out_off + slice] = finish(P.op, partial[0]);
    }
}

// First pass of a reduction split across workgroups (few, very long slices): workgroup
// (c, s) folds elements [c * chunk, (c + 1) * chunk) of slice s into Y[s * chunks + c].
// The second pass is reduce_group over those partial results.
@compute @workgroup_size(256)
fn reduce_partial(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let c = wid.x;
    let slice = wid.y;
    let o = slice / P.inner;
    let t = slice % P.inner;
    let base = P.in_off + o * P.length * P.inner + t;
    let lo = c * P.chunk;
    let hi = min(lo + P.chunk, P.length);
    var value = identity(P.op);
    for (var l = lo + lidx; l < hi; l += WG) {
        value = combine(P.op, value, X[base + l * P.inner]);
    }
    partial[lidx] = value;
    tree(P.op, lidx);
    if (lidx == 0u) {
        Y[P.out_off + slice * nwg.x + c] = partial[0];
    }
}

// (fmax from -inf, NaN count) of X[first + l * inner] for l = start, start + WG, ... < end.
fn local_peak(first: u32, start: u32, end: u32) -> vec2<f32> {
    var peak = f32_neg_inf();
    var nan_count = 0.0;
    for (var l = start; l < end; l += WG) {
        let x = X[first + l * P.inner];
        nan_count += select(0.0, 1.0, is_nan(x));
        peak = fmax_nan(peak, x);
    }
    return vec2<f32>(peak, nan_count);
}

// Every invocation's (peak, NaN count) folded over the workgroup; all get the result.
fn tree_stats(lidx: u32, mine: vec2<f32>) -> vec2<f32> {
    workgroupBarrier();
    partial[lidx] = mine.x;
    partial2[lidx] = mine.y;
    for (var half = WG / 2u; half > 0u; half /= 2u) {
        workgroupBarrier();
        if (lidx < half) {
            partial[lidx] = fmax_nan(partial[lidx], partial[lidx + half]);
            partial2[lidx] += partial2[lidx + half];
        }
    }
    workgroupBarrier();
    let result = vec2<f32>(partial[0], partial2[0]);
    workgroupBarrier();
    return result;
}

// One output of a softmax slice with maximum `peak` and sum of exp(x - peak) `total`:
// exp(x - peak) / total, or with op 1 (log-softmax) x - peak - log(total), so that -inf
// entries stay -inf. A poisoned slice is NaN.
fn softmax_value(x: f32, peak: f32, total: f32, poisoned: bool) -> f32 {
    if (poisoned) {
        return f32_nan();
    }
    if (P.op == 1u) {
        return (x - peak) - log(total);
    }
    return exp(x - peak) / total;
}

// Softmax of one slice. peak = fmax over the slice from -inf; a NaN anywhere, or a
// peak that is not finite (all -inf, or a +inf present), makes the slice NaN exactly
// as IEEE arithmetic of exp(x - peak) / sum would.
@compute @workgroup_size(256)
fn softmax_thread(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let slice = linear_id(wid, nwg, lidx, WG);
    if (slice >= P.slices) {
        return;
    }
    let o = slice / P.inner;
    let t = slice % P.inner;
    let base = o * P.length * P.inner + t;
    var peak = f32_neg_inf();
    var poisoned = false;
    for (var l = 0u; l < P.length; l++) {
        let x = X[P.in_off + base + l * P.inner];
        poisoned = poisoned || is_nan(x);
        peak = fmax_nan(peak, x);
    }
    poisoned = poisoned || !is_finite(peak);
    var total = 0.0;
    for (var l = 0u; l < P.length; l++) {
        total += exp(X[P.in_off + base + l * P.inner] - peak);
    }
    for (var l = 0u; l < P.length; l++) {
        let idx = base + l * P.inner;
        Y[P.out_off + idx] = softmax_value(X[P.in_off + idx], peak, total, poisoned);
    }
}

@compute @workgroup_size(256)
fn softmax_group(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let slice = wid.y * nwg.x + wid.x;
    if (slice >= P.slices) {
        return;
    }
    let o = slice / P.inner;
    let t = slice % P.inner;
    let base = o * P.length * P.inner + t;
    let stats = tree_stats(lidx, local_peak(P.in_off + base, lidx, P.length));
    let slice_peak = stats.x;
    let poisoned = stats.y > 0.0 || !is_finite(slice_peak);
    var total = 0.0;
    for (var l = lidx; l < P.length; l += WG) {
        total += exp(X[P.in_off + base + l * P.inner] - slice_peak);
    }
    partial[lidx] = total;
    tree(REDUCE_SUM, lidx);
    let slice_total = partial[0];
    for (var l = lidx; l < P.length; l += WG) {
        let idx = base + l * P.inner;
        Y[P.out_off + idx] = softmax_value(X[P.in_off + idx], slice_peak, slice_total, poisoned);
    }
}

// Softmax of few very long slices in three passes over a grid of (chunk, slice)
// workgroups, each folding elements [c * chunk, (c + 1) * chunk) of its slice; the
// chunk count is num_workgroups.x. Pass 1 stores each chunk's maximum and NaN count;
// pass 2 folds those into the slice peak and stores each chunk's sum of exp(x - peak);
// pass 3 folds the sums and writes the outputs. The semantics are those of
// softmax_group (NaN anywhere, or a peak that is not finite, makes the slice NaN).
@compute @workgroup_size(256)
fn softmax_split_stats(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let c = wid.x;
    let slice = wid.y;
    let base = P.in_off + (slice / P.inner) * P.length * P.inner + slice % P.inner;
    let lo = c * P.chunk;
    let hi = min(lo + P.chunk, P.length);
    let stats = tree_stats(lidx, local_peak(base, lo + lidx, hi));
    if (lidx == 0u) {
        let at = 2u * (slice * nwg.x + c);
        T[at] = stats.x;
        T[at + 1u] = stats.y;
    }
}

// The peak of `slice` and whether the slice is poisoned, from pass 1's results (every
// invocation of the workgroup gets the same values).
fn split_peak(slice: u32, chunks: u32, lidx: u32) -> vec2<f32> {
    var peak = f32_neg_inf();
    var nan_count = 0.0;
    for (var c = lidx; c < chunks; c += WG) {
        let at = 2u * (slice * chunks + c);
        peak = fmax_nan(peak, T[at]);
        nan_count += T[at + 1u];
    }
    return tree_stats(lidx, vec2<f32>(peak, nan_count));
}

@compute @workgroup_size(256)
fn softmax_split_sums(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let c = wid.x;
    let slice = wid.y;
    let base = P.in_off + (slice / P.inner) * P.length * P.inner + slice % P.inner;
    let lo = c * P.chunk;
    let hi = min(lo + P.chunk, P.length);
    let peak = split_peak(slice, nwg.x, lidx).x;
    var total = 0.0;
    for (var l = lo + lidx; l < hi; l += WG) {
        total += exp(X[base + l * P.inner] - peak);
    }
    partial[lidx] = total;
    tree(REDUCE_SUM, lidx);
    if (lidx == 0u) {
        T[2u * P.slices * nwg.x + slice * nwg.x + c] = partial[0];
    }
}

@compute @workgroup_size(256)
fn softmax_split_write(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let c = wid.x;
    let slice = wid.y;
    let chunks = nwg.x;
    let base = (slice / P.inner) * P.length * P.inner + slice % P.inner;
    let lo = c * P.chunk;
    let hi = min(lo + P.chunk, P.length);
    let stats = split_peak(slice, chunks, lidx);
    let peak = stats.x;
    let poisoned = stats.y > 0.0 || !is_finite(peak);
    var total = 0.0;
    let sums = 2u * P.slices * chunks + slice * chunks;
    for (var k = lidx; k < chunks; k += WG) {
        total += T[sums + k];
    }
    partial[lidx] = total;
    tree(REDUCE_SUM, lidx);
    let slice_total = partial[0];
    for (var l = lo + lidx; l < hi; l += WG) {
        let idx = base + l * P.inner;
        Y[P.out_off + idx] = softmax_value(X[P.in_off + idx], peak, slice_total, poisoned);
    }
}
