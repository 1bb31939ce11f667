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

// Start of `slice` without the buffer offsets: its element l is at base + l * inner.
fn slice_base(slice: u32) -> u32 {
    return (slice / P.inner) * P.length * P.inner + slice % P.inner;
}

// [lo, hi): the elements [c * chunk, (c + 1) * chunk) of a slice that chunk c of a split
// pass folds.
fn chunk_range(c: u32) -> vec2<u32> {
    let lo = c * P.chunk;
    return vec2<u32>(lo, min(lo + P.chunk, P.length));
}

// X[first + l * inner] for l = start, start + step, ... < end, folded with `op` from its
// identity.
fn fold(op: u32, first: u32, start: u32, end: u32, step: u32) -> f32 {
    var value = identity(op);
    for (var l = start; l < end; l += step) {
        value = combine(op, value, X[first + l * P.inner]);
    }
    return value;
}

// `mine` folded with `op` over the workgroup with a tree in workgroup memory; every
// invocation gets the result.
fn tree_fold(op: u32, lidx: u32, mine: f32) -> f32 {
    partial[lidx] = mine;
    for (var half = WG / 2u; half > 0u; half /= 2u) {
        workgroupBarrier();
        if (lidx < half) {
            partial[lidx] = combine(op, partial[lidx], partial[lidx + half]);
        }
    }
    workgroupBarrier();
    let result = partial[0];
    workgroupBarrier();
    return result;
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
    let value = fold(P.op, P.in_off + slice_base(slice), 0u, P.length, 1u);
    Y[P.out_off + slice] = finish(P.op, value);
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
    let mine = fold(P.op, P.in_off + slice_base(slice), lidx, P.length, WG);
    let value = tree_fold(P.op, lidx, mine);
    if (lidx == 0u) {
        Y[P.out_off + slice] = finish(P.op, value);
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
    let range = chunk_range(c);
    let mine = fold(P.op, P.in_off + slice_base(slice), range.x + lidx, range.y, WG);
    let value = tree_fold(P.op, lidx, mine);
    if (lidx == 0u) {
        Y[P.out_off + slice * nwg.x + c] = value;
    }
}

// (fmax from -inf, NaN count) of X[first + l * inner] for l = start, start + step, ... < end.
fn local_peak(first: u32, start: u32, end: u32, step: u32) -> vec2<f32> {
    var peak = f32_neg_inf();
    var nan_count = 0.0;
    for (var l = start; l < end; l += step) {
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

// A slice with (peak, NaN count) `stats` is NaN throughout when it holds a NaN or its
// peak is not finite (all -inf, or a +inf present), exactly as IEEE arithmetic of
// exp(x - peak) / sum would make it.
fn poisoned_by(stats: vec2<f32>) -> bool {
    return stats.y > 0.0 || !is_finite(stats.x);
}

// Sum of exp(X[first + l * inner] - peak) for l = start, start + step, ... < end.
fn exp_sum(first: u32, start: u32, end: u32, step: u32, peak: f32) -> f32 {
    var total = 0.0;
    for (var l = start; l < end; l += step) {
        total += exp(X[first + l * P.inner] - peak);
    }
    return total;
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

// Writes the softmax outputs of elements l = start, start + step, ... < end of the slice
// at `base` (without the buffer offsets).
fn write_softmax(base: u32, start: u32, end: u32, step: u32, peak: f32, total: f32, poisoned: bool) {
    for (var l = start; l < end; l += step) {
        let idx = base + l * P.inner;
        Y[P.out_off + idx] = softmax_value(X[P.in_off + idx], peak, total, poisoned);
    }
}

// Softmax of one slice. peak = fmax over the slice from -inf; see poisoned_by.
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
    let base = slice_base(slice);
    let stats = local_peak(P.in_off + base, 0u, P.length, 1u);
    let total = exp_sum(P.in_off + base, 0u, P.length, 1u, stats.x);
    write_softmax(base, 0u, P.length, 1u, stats.x, total, poisoned_by(stats));
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
    let base = slice_base(slice);
    let stats = tree_stats(lidx, local_peak(P.in_off + base, lidx, P.length, WG));
    let total = tree_fold(REDUCE_SUM, lidx, exp_sum(P.in_off + base, lidx, P.length, WG, stats.x));
    write_softmax(base, lidx, P.length, WG, stats.x, total, poisoned_by(stats));
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
    let range = chunk_range(c);
    let stats = tree_stats(lidx, local_peak(P.in_off + slice_base(slice), range.x + lidx, range.y, WG));
    if (lidx == 0u) {
        let at = 2u * (slice * nwg.x + c);
        T[at] = stats.x;
        T[at + 1u] = stats.y;
    }
}

// The (peak, NaN count) of `slice` from pass 1's results (every invocation of the
// workgroup gets the same values).
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
    let range = chunk_range(c);
    let peak = split_peak(slice, nwg.x, lidx).x;
    let mine = exp_sum(P.in_off + slice_base(slice), range.x + lidx, range.y, WG, peak);
    let total = tree_fold(REDUCE_SUM, lidx, mine);
    if (lidx == 0u) {
        T[2u * P.slices * nwg.x + slice * nwg.x + c] = total;
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
    let range = chunk_range(c);
    let stats = split_peak(slice, chunks, lidx);
    var sum = 0.0;
    let sums = 2u * P.slices * chunks + slice * chunks;
    for (var k = lidx; k < chunks; k += WG) {
        sum += T[sums + k];
    }
    let total = tree_fold(REDUCE_SUM, lidx, sum);
    write_softmax(slice_base(slice), range.x + lidx, range.y, WG, stats.x, total, poisoned_by(stats));
}
