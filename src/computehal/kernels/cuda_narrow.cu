/* CUDA-only helpers for cuBLAS GEMMs: round a column-major float32 matrix (with leading
 * dimension) into a compact 16-bit (or rounded float32) copy for gemmEx, and BLAS quick return
 * (C = beta * C) when the product is skipped. Round-to-nearest-even, overflow to +-inf, NaN stays
 * NaN: the conversions of convert.h. Written for CUDA only (grid-stride loops over blockIdx /
 * threadIdx); the CUDA backend launches it. */
#include "dialect.h"
#include "convert.h"

/* dst[i + j * rows] = narrow(src[i + j * ld]) for a rows x cols column-major matrix.
 * mode 1: f16 bits, 2: bf16 bits (dst is u16); 3: f16-rounded float, 4: bf16-rounded
 * float (dst is float). One thread per element, grid-stride loop. */
extern "C" __global__ void narrow_matrix(const float* __restrict__ src, long long ld, long long rows,
                                         long long cols, void* __restrict__ dst, int mode) {
    long long total = rows * cols;
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        long long j = t / rows;
        long long i = t - j * rows;
        float x = src[i + j * ld];
        if (mode == 1) {
            ((u16*)dst)[t] = chal_f16_bits(x);
        } else if (mode == 2) {
            ((u16*)dst)[t] = chal_bf16_bits(x);
        } else if (mode == 3) {
            ((float*)dst)[t] = chal_f16_value(chal_f16_bits(x));
        } else {
            ((float*)dst)[t] = chal_bf16_value(chal_bf16_bits(x));
        }
    }
}

/* C = beta * C for a column-major m x n matrix per batch (BLAS quick return):
 * C is write-only when beta == 0, so NaN already in C does not survive. */
template <typename T>
__device__ __forceinline__ void chal_scale(T* c, long long ldc, long long stride, long long m, long long n,
                                           long long batches, T beta) {
    long long total = m * n * batches;
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        long long b = t / (m * n);
        long long r = t - b * m * n;
        long long j = r / m;
        long long i = r - j * m;
        T* e = c + b * stride + i + j * ldc;
        *e = beta == (T)0 ? (T)0 : beta * *e;
    }
}

extern "C" __global__ void scale_c_f32(float* c, long long ldc, long long stride, long long m, long long n,
                                       long long batches, float beta) {
    chal_scale<float>(c, ldc, stride, m, n, batches, beta);
}

extern "C" __global__ void scale_c_f64(double* c, long long ldc, long long stride, long long m, long long n,
                                       long long batches, double beta) {
    chal_scale<double>(c, ldc, stride, m, n, batches, beta);
}
