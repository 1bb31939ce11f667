/* CUDA-only helpers for cuBLAS mixed-precision GEMM: round a column-major float32 matrix (with
 * leading dimension) into a compact 16-bit (or rounded float32) copy. Round-to-nearest-even,
 * overflow to +-inf, NaN stays NaN: the rounding of computehal.round_to_f16 / round_to_bf16.
 * Plain CUDA C++ (not the shared dialect); the CUDA backend launches it. */
// computehal CUDA-only: float32 -> f16 / bf16 (RNE) for cuBLAS gemmEx.
typedef unsigned int u32;
typedef unsigned short u16;

__device__ __forceinline__ u16 chal_f16_bits(float x) {
    u32 u = __float_as_uint(x);
    u32 sign = (u >> 16) & 0x8000u;
    u32 mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u) return (u16)(sign | 0x7e00u | ((mag >> 13) & 0x3ffu));  /* NaN */
    if (mag >= 0x477ff000u) return (u16)(sign | 0x7c00u);      /* rounds past 65504: inf */
    if (mag >= 0x38800000u) {                                   /* normal half */
        u32 r = mag + 0x0fffu + ((mag >> 13) & 1u);
        return (u16)(sign | ((r - 0x38000000u) >> 13));
    }
    /* subnormal half: multiples of 2^-24 (1024 * 2^-24 encodes as the smallest normal) */
    return (u16)(sign | (u32)rintf(fabsf(x) * 16777216.0f));
}

__device__ __forceinline__ u16 chal_bf16_bits(float x) {
    u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x0040u);  /* NaN */
    return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float chal_f16_value(u16 h) {
    u32 sign = ((u32)h & 0x8000u) << 16;
    u32 e = ((u32)h >> 10) & 0x1fu;
    u32 f = (u32)h & 0x3ffu;
    if (e == 0u) {
        float mag = (float)f * 5.9604644775390625e-8f;
        return sign ? -mag : mag;
    }
    if (e == 31u) return __uint_as_float(sign | 0x7f800000u | (f << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (f << 13));
}

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
            ((float*)dst)[t] = __uint_as_float(((u32)chal_bf16_bits(x)) << 16);
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
