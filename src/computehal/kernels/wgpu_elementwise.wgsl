// Element-wise kernels: unary and binary ops over n float32 values.
// The functions applied are in wgpu_elementwise_ops.wgsl, Params in wgpu_elementwise_params.wgsl.

@group(0) @binding(1) var<storage, read_write> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn unary(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = linear_id(wid, nwg, lidx, WG);
    if (i >= P.n) {
        return;
    }
    O[P.o_off + i] = apply_unary(P.op, A[P.a_off + i], P.alpha, P.lo, P.hi);
}

@compute @workgroup_size(256)
fn binary(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = linear_id(wid, nwg, lidx, WG);
    if (i >= P.n) {
        return;
    }
    O[P.o_off + i] = apply_binary(P.op, A[P.a_off + i], B[P.b_off + i]);
}
