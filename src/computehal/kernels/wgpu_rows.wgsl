// Row gather and scatter of float32 rows of `cols` elements.
//
// gather:  out[i, :] = in[idx[i], :] for i in [0, count).
// scatter: out[idx[2t], :] = in[idx[2t + 1], :] for the (destination, source) pairs the
//          host computed from the index list (the last occurrence of each destination
//          row), so every destination is written exactly once and the result is
//          deterministic.

struct Params {
    count: u32,
    cols: u32,
    in_off: u32,
    out_off: u32,
    idx_off: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> In: array<f32>;
@group(0) @binding(2) var<storage, read_write> Idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> Out: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn gather(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, WG);
    if (t >= P.count * P.cols) {
        return;
    }
    let i = t / P.cols;
    let c = t % P.cols;
    let src = Idx[P.idx_off + i];
    Out[P.out_off + t] = In[P.in_off + src * P.cols + c];
}

@compute @workgroup_size(256)
fn scatter(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, WG);
    if (t >= P.count * P.cols) {
        return;
    }
    let pair = t / P.cols;
    let c = t % P.cols;
    let dst = Idx[P.idx_off + 2u * pair];
    let src = Idx[P.idx_off + 2u * pair + 1u];
    Out[P.out_off + dst * P.cols + c] = In[P.in_off + src * P.cols + c];
}
