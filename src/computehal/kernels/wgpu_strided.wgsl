// copy_strided: dst[idx] = src[idx] for every index of a shape of up to 6 dimensions,
// with signed element strides on both sides (a zero source stride broadcasts). A bit
// copy of 32-bit elements: NaN payloads survive. One invocation per element; the
// destination strides map distinct indices to distinct elements (validated), so no two
// invocations write the same word. The index walk is in wgpu_strided_index.wgsl.

struct Params {
    shape: array<vec4<u32>, 2>,       // extents, innermost last, padded with 1
    strides0: array<vec4<i32>, 2>, // source element strides (0 for extent-1 dimensions)
    strides1: array<vec4<i32>, 2>, // destination element strides
    total: u32,
    src_off: u32, // element offset of index [0, ..., 0] inside S
    dst_off: u32,
    ndim: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> S: array<u32>;
@group(0) @binding(2) var<storage, read_write> D: array<u32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn copy_strided(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, WG);
    if (t >= P.total) {
        return;
    }
    let at = strided_offsets(t, vec2<i32>(i32(P.src_off), i32(P.dst_off)));
    D[u32(at.y)] = S[u32(at.x)];
}
