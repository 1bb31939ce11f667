// The parameters of the element-wise kernels (wgpu_elementwise.wgsl, and
// wgpu_elementwise4.wgsl, where offsets and n count vec4 elements): one layout, packed
// once by the host.

struct Params {
    n: u32,
    a_off: u32,
    b_off: u32,
    o_off: u32,
    op: u32,
    alpha: f32,
    lo: f32,
    hi: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
