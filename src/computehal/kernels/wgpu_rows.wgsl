// Row gather and scatter of float32 rows of `cols` elements.
//
// With host indices (validated on the host):
//   gather:  out[i, :] = in[idx[i], :] for i in [0, count);
//   scatter: out[idx[2t], :] = in[idx[2t + 1], :] for the (destination, source) pairs the
//            host computed (the last occurrence of each destination row), so every
//            destination is written exactly once and the result is deterministic.
//
// With device indices (int32, or int64 read as low / high words), index_check runs first:
// it raises Status[0] when any index lies outside [0, rows) and, for scatter, records in
// Status[1 + row] the last source naming each row (atomicMax of i + 1). gather_device /
// scatter_device then write nothing at all when Status[0] is set, so a bad index is
// reported with the output untouched; scatter_device writes row i only where it won.

struct Params {
    count: u32,
    cols: u32,
    in_off: u32,
    out_off: u32,
    idx_off: u32, // in 32-bit words
    rows: u32,
    wide: u32, // 1: int64 indices
    scatter: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> In: array<f32>;
@group(0) @binding(2) var<storage, read_write> Idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> Out: array<f32>;
@group(0) @binding(4) var<storage, read_write> Status: array<atomic<u32>>;

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

// Device index i as (row, 1) when it lies in [0, rows), else (0, 0).
fn device_index(i: u32) -> vec2<u32> {
    if (P.wide != 0u) {
        let lo = Idx[P.idx_off + 2u * i];
        let hi = Idx[P.idx_off + 2u * i + 1u];
        return select(vec2<u32>(0u, 0u), vec2<u32>(lo, 1u), hi == 0u && lo < P.rows);
    }
    let v = i32(Idx[P.idx_off + i]);
    return select(vec2<u32>(0u, 0u), vec2<u32>(u32(v), 1u), v >= 0 && u32(v) < P.rows);
}

@compute @workgroup_size(256)
fn index_check(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let i = linear_id(wid, nwg, lidx, WG);
    if (i >= P.count) {
        return;
    }
    let found = device_index(i);
    if (found.y == 0u) {
        atomicMax(&Status[0], 1u);
    } else if (P.scatter != 0u) {
        atomicMax(&Status[1u + found.x], i + 1u);
    }
}

@compute @workgroup_size(256)
fn gather_device(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, WG);
    if (t >= P.count * P.cols || atomicLoad(&Status[0]) != 0u) {
        return;
    }
    let i = t / P.cols;
    let c = t % P.cols;
    let row = device_index(i).x;
    Out[P.out_off + t] = In[P.in_off + row * P.cols + c];
}

@compute @workgroup_size(256)
fn scatter_device(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lidx: u32,
) {
    let t = linear_id(wid, nwg, lidx, WG);
    if (t >= P.count * P.cols || atomicLoad(&Status[0]) != 0u) {
        return;
    }
    let i = t / P.cols;
    let c = t % P.cols;
    let row = device_index(i).x;
    if (atomicLoad(&Status[1u + row]) != i + 1u) {
        return; // a later source names this row
    }
    Out[P.out_off + row * P.cols + c] = In[P.in_off + i * P.cols + c];
}
