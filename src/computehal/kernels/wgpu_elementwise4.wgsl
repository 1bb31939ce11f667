// Element-wise kernels over vec4 views: each invocation handles four consecutive floats.
// Used when every operand's element offset is a multiple of 4 (the host runs the tail
// of n % 4 elements with the scalar kernels). The functions are in
// wgpu_elementwise_ops.wgsl, Params in wgpu_elementwise_params.wgsl; offsets and n here
// count vec4 elements.

@group(0) @binding(1) var<storage, read_write> A: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> B: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<vec4<f32>>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn unary4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = linear_id(wid, nwg, lidx, WG);
    if (i >= P.n) {
        return;
    }
    let x = A[P.a_off + i];
    let op = P.op;
    O[P.o_off + i] = vec4<f32>(
        apply_unary(op, x.x, P.alpha, P.lo, P.hi),
        apply_unary(op, x.y, P.alpha, P.lo, P.hi),
        apply_unary(op, x.z, P.alpha, P.lo, P.hi),
        apply_unary(op, x.w, P.alpha, P.lo, P.hi),
    );
}

@compute @workgroup_size(256)
fn binary4(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = linear_id(wid, nwg, lidx, WG);
    if (i >= P.n) {
        return;
    }
    let a = A[P.a_off + i];
    let b = B[P.b_off + i];
    let op = P.op;
    O[P.o_off + i] = vec4<f32>(
        apply_binary(op, a.x, b.x),
        apply_binary(op, a.y, b.y),
        apply_binary(op, a.z, b.z),
        apply_binary(op, a.w, b.w),
    );
}
