/* computehal kernel dialect: one source, compiled as OpenCL C (PoCL, GPUs) and as CUDA C++.
 *
 * Kernels are written against these macros only:
 *   KERNEL            qualifier of an entry point (extern "C" __global__ in CUDA)
 *   GLOBAL            address space of a kernel pointer argument (empty in CUDA)
 *   LOCAL             address space of a pointer into work-group memory (empty in CUDA)
 *   SHARED            storage class of a work-group array declared in a kernel
 *   BARRIER()         work-group barrier on local memory
 *   GID(d) LID(d) GRP(d) LSIZE(d) NGRP(d)   global / local / group index, sizes (d = 0, 1, 2)
 *   DEVICE            qualifier of a helper function
 *   i64               64-bit signed integer (element offsets and indices)
 *   u16 u32 u64       unsigned integers of 16, 32 and 64 bits (bit copies, 16-bit storage types)
 *   F32_BITS(x) BITS_F32(u)   reinterpret a float as a 32-bit unsigned int and back
 *   ATOMIC_MAX_I32(p, v)      atomic max of an int in global memory
 *   VEC_T, VW         a vector of VW REALs (OpenCL floatN / doubleN; a small struct in CUDA)
 *   VZERO             a zero VEC_T;  VLOAD(p): load a VEC_T from an aligned GLOBAL pointer
 *   vec + vec, vec * scalar, vec - scalar, vec += vec   work in both languages
 *   VEXP(v)           element-wise exp of a VEC_T
 * REAL (float or double) and, for the vector kernels, VW are defined by the host when a family
 * is built. Builtin calls (fma, mad, vload) are avoided in hot loops: PoCL's CPU device does not
 * inline them, and its fma on half vectors aborts.
 */
#ifndef COMPUTEHAL_DIALECT_H
#define COMPUTEHAL_DIALECT_H

#ifndef REAL
#define REAL float
#endif

#if defined(__OPENCL_VERSION__)

#if defined(USE_FP64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#define KERNEL __kernel
#define GLOBAL __global
#define LOCAL __local
#define SHARED __local
#define BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
#define GID(d) ((i64)get_global_id(d))
#define LID(d) ((int)get_local_id(d))
#define GRP(d) ((i64)get_group_id(d))
#define LSIZE(d) ((int)get_local_size(d))
#define NGRP(d) ((i64)get_num_groups(d))
#define DEVICE inline
#define RESTRICT restrict
typedef long i64;
typedef ushort u16;
typedef uint u32;
typedef ulong u64;
#define ATOMIC_MAX_I32(p, v) atomic_max((volatile GLOBAL int*)(p), (v))
#define F32_BITS(x) as_uint(x)
#define BITS_F32(u) as_float(u)
#define CHAL_CAT3(a, b) a##b
#define CHAL_CAT(a, b) CHAL_CAT3(a, b)
#define VEC_T CHAL_CAT(REAL, VW)
#define VZERO ((VEC_T)((REAL)0))
#define VLOAD(p) (*(GLOBAL const VEC_T*)(p))
#define VEXP(x) exp(x)

#elif defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(__HIPCC__) || defined(__HIPCC_RTC__)

#define KERNEL extern "C" __global__
#define GLOBAL
#define LOCAL
#define SHARED __shared__
#define BARRIER() __syncthreads()
typedef long long i64;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
__device__ __forceinline__ unsigned int chal_dim3(const uint3 v, int d) { return d == 0 ? v.x : (d == 1 ? v.y : v.z); }
__device__ __forceinline__ unsigned int chal_dim3(const dim3 v, int d) { return d == 0 ? v.x : (d == 1 ? v.y : v.z); }
#define LID(d) ((int)chal_dim3(threadIdx, d))
#define GRP(d) ((i64)chal_dim3(blockIdx, d))
#define LSIZE(d) ((int)chal_dim3(blockDim, d))
#define NGRP(d) ((i64)chal_dim3(gridDim, d))
#define GID(d) (GRP(d) * (i64)LSIZE(d) + (i64)LID(d))
#define DEVICE __device__ __forceinline__
#define RESTRICT __restrict__
#define ATOMIC_MAX_I32(p, v) atomicMax((int*)(p), (v))
#define F32_BITS(x) __float_as_uint(x)
#define BITS_F32(u) __uint_as_float(u)
#ifndef INFINITY /* NVRTC compiles without math.h */
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fc00000)
#endif
template <typename T, int W>
struct chal_vec {
    T v[W];
};
template <typename T, int W>
__device__ __forceinline__ chal_vec<T, W> operator+(const chal_vec<T, W>& a, const chal_vec<T, W>& b) {
    chal_vec<T, W> r;
#pragma unroll
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] + b.v[i];
    return r;
}
template <typename T, int W>
__device__ __forceinline__ chal_vec<T, W> operator*(const chal_vec<T, W>& a, T s) {
    chal_vec<T, W> r;
#pragma unroll
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] * s;
    return r;
}
template <typename T, int W>
__device__ __forceinline__ chal_vec<T, W> operator-(const chal_vec<T, W>& a, T s) {
    chal_vec<T, W> r;
#pragma unroll
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] - s;
    return r;
}
template <typename T, int W>
__device__ __forceinline__ chal_vec<T, W> chal_vexp(const chal_vec<T, W>& a) {
    chal_vec<T, W> r;
#pragma unroll
    for (int i = 0; i < W; ++i) r.v[i] = exp(a.v[i]);
    return r;
}
template <typename T, int W>
__device__ __forceinline__ chal_vec<T, W>& operator+=(chal_vec<T, W>& a, const chal_vec<T, W>& b) {
#pragma unroll
    for (int i = 0; i < W; ++i) a.v[i] += b.v[i];
    return a;
}
template <typename T, int W>
__device__ __forceinline__ chal_vec<T, W> chal_vec_zero() {
    chal_vec<T, W> r;
#pragma unroll
    for (int i = 0; i < W; ++i) r.v[i] = (T)0;
    return r;
}
#define VEC_T chal_vec<REAL, VW>
#define VZERO (chal_vec_zero<REAL, VW>())
#define VLOAD(p) (*(const VEC_T*)(p))
#define VEXP(x) chal_vexp(x)

#else
#error "computehal kernels compile as OpenCL C or CUDA C++ only"
#endif

#endif /* COMPUTEHAL_DIALECT_H */
