// Index walk of the strided kernels (wgpu_strided.wgsl, wgpu_broadcast.wgsl), joined into
// their modules: each declares a Params with `shape` (extents, innermost last, padded),
// `ndim` and two sets of signed element strides `strides0` / `strides1`.

// The element offsets on both sides of linear index t of P.shape: base + the sum over
// dimensions of index * stride (a zero stride broadcasts).
fn strided_offsets(t: u32, base: vec2<i32>) -> vec2<i32> {
    var rest = t;
    var at = base;
    for (var d = i32(P.ndim) - 1; d >= 0; d--) {
        let extent = P.shape[d / 4][d % 4];
        let i = i32(rest % extent);
        rest /= extent;
        at += i * vec2<i32>(P.strides0[d / 4][d % 4], P.strides1[d / 4][d % 4]);
    }
    return at;
}
