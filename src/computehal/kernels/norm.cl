/* Normalisation of REAL tensors: layer / RMS normalisation of rows (one work-group of LS per
 * row, fold.h), inference batch normalisation over channel axis 1, and ONNX's local response
 * normalisation across channels. Every formula is evaluated as written, in IEEE arithmetic: a
 * NaN or infinity in what an output reads makes it NaN (or infinite) as the formula says.
 */
#include "dialect.h"
#include "fold.h"

#define NORM_RMS 1
#define NORM_SCALE 2
#define NORM_BIAS 4

/* This work-item's sum of (src[i] - mean)^2 over its share [lo, hi) (step 1: 16 lanes). */
DEVICE REAL chal_squares(GLOBAL const REAL* src, i64 lo, i64 hi, i64 step, REAL mean) {
    REAL total = (REAL)0;
    i64 i = lo;
    if (step == 1) {
        while (i + 16 <= hi) { /* blocks of CHAL_BLOCK summed in 16 lanes (see fold.h) */
            i64 stop = hi - i > CHAL_BLOCK ? i + CHAL_BLOCK : hi;
            REAL lanes[16];
            for (int l = 0; l < 16; ++l) lanes[l] = (REAL)0;
            for (; i + 16 <= stop; i += 16) {
                for (int l = 0; l < 16; ++l) {
                    REAL d = src[i + l] - mean;
                    lanes[l] += d * d;
                }
            }
            REAL block = (REAL)0;
            for (int l = 0; l < 16; ++l) block += lanes[l];
            total += block;
        }
    }
    for (; i < hi; i += step) {
        REAL d = src[i] - mean;
        total += d * d;
    }
    return total;
}

/* y = (x - mean) / sqrt(var + eps) * scale + bias over each row of `cols` (var biased; with
 * NORM_RMS: mean = 0 and var = mean(x^2)); scale / bias (cols elements) only where flagged. */
KERNEL void norm_rows(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, i64 cols, REAL eps,
                      GLOBAL const REAL* scale, i64 so, GLOBAL const REAL* bias, i64 bo, int flags) {
    SHARED REAL part[LS];
    i64 row = GRP(0);
    GLOBAL const REAL* src = x + xo + row * cols;
    GLOBAL REAL* dst = y + yo + row * cols;
    i64 lo, hi, step;
    chal_share(cols, &lo, &hi, &step);
    REAL mean = (REAL)0;
    if (!(flags & NORM_RMS)) {
        mean = chal_group_reduce(part, REDUCE_SUM, chal_group_fold(src, 0, cols, REDUCE_SUM)) / (REAL)cols;
    }
    REAL squares = chal_group_reduce(part, REDUCE_SUM, chal_squares(src, lo, hi, step, mean));
    REAL den = sqrt(squares / (REAL)cols + eps);
    for (i64 i = lo; i < hi; i += step) {
        REAL v = (src[i] - mean) / den;
        if (flags & NORM_SCALE) v = v * scale[so + i];
        if (flags & NORM_BIAS) v = v + bias[bo + i];
        dst[i] = v;
    }
}

/* y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c] over [N, C, spatial]; grid
 * (ceil(spatial / run), N * C). */
KERNEL void batch_norm(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, GLOBAL const REAL* scale, i64 so,
                       GLOBAL const REAL* bias, i64 bo, GLOBAL const REAL* mean, i64 mo, GLOBAL const REAL* var,
                       i64 vo, i64 channels, i64 spatial, i64 run, REAL eps) {
    i64 start = GID(0) * run;
    i64 nc = GID(1);
    i64 len = spatial - start;
    if (len <= 0) return;
    len = len < run ? len : run;
    i64 c = nc % channels;
    REAL m = mean[mo + c];
    REAL den = sqrt(var[vo + c] + eps);
    REAL s = scale[so + c];
    REAL b = bias[bo + c];
    GLOBAL const REAL* src = x + xo + nc * spatial + start;
    GLOBAL REAL* dst = y + yo + nc * spatial + start;
    for (i64 l = 0; l < len; ++l) dst[l] = (src[l] - m) / den * s + b;
}

/* y = x / (bias + alpha / size * sum) ** beta, the sum of x^2 over channels c - (size - 1) / 2
 * to c + size / 2 (clipped); grid (ceil(spatial / run), N * C). */
KERNEL void lrn(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, i64 channels, i64 spatial, i64 run,
                i64 size, REAL alpha, REAL beta, REAL bias) {
    i64 start = GID(0) * run;
    i64 nc = GID(1);
    i64 len = spatial - start;
    if (len <= 0) return;
    len = len < run ? len : run;
    i64 n = nc / channels;
    i64 c = nc - n * channels;
    i64 c0 = c - (size - 1) / 2;
    i64 c1 = c + size / 2;
    c0 = c0 < 0 ? 0 : c0;
    c1 = c1 > channels - 1 ? channels - 1 : c1;
    REAL k = alpha / (REAL)size;
    GLOBAL const REAL* plane = x + xo + n * channels * spatial + start;
    GLOBAL REAL* dst = y + yo + nc * spatial + start;
    for (i64 l = 0; l < len; ++l) {
        REAL total = (REAL)0;
        for (i64 cc = c0; cc <= c1; ++cc) {
            REAL v = plane[cc * spatial + l];
            total += v * v;
        }
        dst[l] = plane[c * spatial + l] / pow(bias + k * total, beta);
    }
}
