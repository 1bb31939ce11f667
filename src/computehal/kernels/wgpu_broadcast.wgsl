// broadcast_binary: out = op(a, b) with NumPy broadcasting over up to 6 dimensions. The
// output is contiguous; a and b are read through element strides that are 0 along
// their broadcast dimensions. The functions are in wgpu_elementwise_ops.wgsl, the index
// walk in wgpu_strided_index.wgsl.

struct Params {
    shape: array<vec4<u32>, 2>, // output extents, innermost last
    strides0: array<vec4<i32>, 2>, // a's element strides (0 along broadcast dimensions)
    strides1: array<vec4<i32>, 2>, // b's
    total: u32,
    a_off: u32,
    b_off: u32,
    o_off: u32,
    op: u32,
    ndim: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn broadcast_binary(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, WG);
    if (t >= P.total) {
        return;
    }
    let at = strided_offsets(t, vec2<i32>(i32(P.a_off), i32(P.b_off)));
    O[P.o_off + t] = apply_binary(P.op, A[u32(at.x)], B[u32(at.y)]);
}
