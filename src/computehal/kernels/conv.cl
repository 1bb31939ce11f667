/* 2-D convolution of REAL tensors: packers that feed the GEMM engine (implicit GEMM, no im2col
 * matrix is materialised), the column-gradient fold of the data gradient, and direct kernels.
 *
 * Shapes: input [N, C, H, W], filter [K, Cg, Fh, Fw] with Cg = C / groups, output
 * [N, K, Oh, Ow]; output channel k of group g = k / Kg reads input channels g * Cg ..
 * (g + 1) * Cg - 1. Taps are dh / dw apart; padding is pt (top) / pl (left) (bottom and right
 * padding only decide Oh / Ow). CRS = Cg * Fh * Fw and S = Oh * Ow. The packers work on one
 * group (first input channel c0, first output channel k0); `n0` is the first image of the
 * chunk being processed.
 *
 * Padding is never multiplied: the packed GEMM multiplies zeros for padding positions, which
 * is exact unless the filter (forward) or the output gradient (filter gradient) holds a NaN or
 * an infinity there (0 * inf = NaN). Outputs whose window touches the padding (the border) are
 * then recomputed by the direct kernels, which skip padding. The data gradient is exact as it
 * is: col2im folds only the (tap, position) pairs that exist.
 */
#include "dialect.h"
#include "fold.h"
#include "gemm_tile.h"

#define CHAL_CONV_PARAMS                                                                         \
    int c0, int Cg, int C, int H, int W, int fh, int fw, int oh, int ow, int sh, int sw, int pt, int pl, \
        int dh, int dw

/* The input value that local filter tap `crs` reads for output position `s` of image `n` (0 in
 * the zero padding). */
DEVICE REAL chal_conv_tap(GLOBAL const REAL* x, i64 xo, i64 n, i64 crs, i64 s, CHAL_CONV_PARAMS) {
    int fs = (int)(crs % fw);
    int fr = (int)((crs / fw) % fh);
    int c = c0 + (int)(crs / ((i64)fw * fh));
    int oy = (int)(s / ow);
    int ox = (int)(s - (i64)oy * ow);
    int yy = oy * sh - pt + fr * dh;
    int xx = ox * sw - pl + fs * dw;
    if (yy < 0 || yy >= H || xx < 0 || xx >= W) return (REAL)0;
    return x[xo + (((n * C + c) * (i64)H + yy) * W + xx)];
}

/* Forward: A(i = s, p = crs) of image n0 + GID(2), packed as gemm.cl's Ap. Grid (CRS, panels, images). */
KERNEL void pack_a_im2col(GLOBAL const REAL* RESTRICT x, i64 xo, i64 n0, CHAL_CONV_PARAMS,
                          GLOBAL REAL* RESTRICT ap, i64 ap_stride) {
    i64 p = GID(0);
    i64 ib = GID(1);
    i64 b = GID(2);
    i64 crs_total = (i64)Cg * fh * fw;
    i64 m = (i64)oh * ow;
    if (p >= crs_total || ib * MR >= m) return;
    GLOBAL REAL* dst = ap + b * ap_stride + ib * crs_total * MR + p * MR;
    for (int r = 0; r < MR; ++r) {
        i64 s = ib * MR + r;
        dst[r] = s < m ? chal_conv_tap(x, xo, n0 + b, p, s, c0, Cg, C, H, W, fh, fw, oh, ow, sh, sw, pt, pl,
                                       dh, dw)
                       : (REAL)0;
    }
}

/* Filter gradient: A(i = crs, p = (image, s)) over `images` images, k = images * S.
 * Grid (k, panels). */
KERNEL void pack_a_cols_t(GLOBAL const REAL* RESTRICT x, i64 xo, i64 n0, int images, CHAL_CONV_PARAMS,
                          GLOBAL REAL* RESTRICT ap) {
    i64 p = GID(0);
    i64 ib = GID(1);
    i64 spatial = (i64)oh * ow;
    i64 k = spatial * images;
    i64 m = (i64)Cg * fh * fw;
    if (p >= k || ib * MR >= m) return;
    i64 b = p / spatial;
    i64 s = p - b * spatial;
    GLOBAL REAL* dst = ap + ib * k * MR + p * MR;
    for (int r = 0; r < MR; ++r) {
        i64 crs = ib * MR + r;
        dst[r] = crs < m ? chal_conv_tap(x, xo, n0 + b, crs, s, c0, Cg, C, H, W, fh, fw, oh, ow, sh, sw, pt, pl,
                                         dh, dw)
                         : (REAL)0;
    }
}

/* Filter gradient: B(p = (image, s), j) = grad_output[n0 + image, k0 + j, s] for j < Kg.
 * Grid (k, panels). */
KERNEL void pack_b_grad_out(GLOBAL const REAL* RESTRICT gy, i64 gyo, i64 n0, int images, int k0, int Kg, int K,
                            int oh, int ow, GLOBAL REAL* RESTRICT bp) {
    i64 p = GID(0);
    i64 jb = GID(1);
    i64 spatial = (i64)oh * ow;
    i64 k = spatial * images;
    if (p >= k || jb * NR >= Kg) return;
    i64 b = p / spatial;
    i64 s = p - b * spatial;
    GLOBAL REAL* dst = bp + jb * k * NR + p * NR;
    for (int cc = 0; cc < NR; ++cc) {
        i64 j = jb * NR + cc;
        dst[cc] = j < Kg ? gy[gyo + ((n0 + b) * K + k0 + j) * spatial + s] : (REAL)0;
    }
}

/* The output index along one axis whose tap `f` reads input index `at`, or -1 when there is none
 * (the tap would sit between two strides or outside the output). */
DEVICE int chal_tap_out(int at, int pad, int f, int dil, int stride, int out) {
    int t = at + pad - f * dil;
    if (t < 0 || t % stride != 0 || t / stride >= out) return -1;
    return t / stride;
}

/* Data gradient: gx[n0 + b, c, y, x] = the sum of the column gradients of every (tap, output
 * position) that reads input (y, x); gcols[b] is S x (C * Fh * Fw) column-major (every group's
 * columns side by side, channel-major like the filter). Positions the forward pass never
 * reads get 0. c0 / Cg are unused (pass 0 / C). Grid (H * W, C, images). */
KERNEL void col2im(GLOBAL const REAL* RESTRICT gcols, GLOBAL REAL* RESTRICT gx, i64 gxo, i64 n0,
                   CHAL_CONV_PARAMS) {
    i64 pos = GID(0);
    int c = (int)GID(1);
    i64 b = GID(2);
    if (pos >= (i64)H * W) return;
    int yy = (int)(pos / W);
    int xx = (int)(pos - (i64)yy * W);
    i64 spatial = (i64)oh * ow;
    GLOBAL const REAL* g = gcols + b * (i64)C * fh * fw * spatial;
    REAL acc = (REAL)0;
    for (int fr = 0; fr < fh; ++fr) {
        int oy = chal_tap_out(yy, pt, fr, dh, sh, oh);
        if (oy < 0) continue;
        for (int fs = 0; fs < fw; ++fs) {
            int ox = chal_tap_out(xx, pl, fs, dw, sw, ow);
            if (ox < 0) continue;
            i64 crs = ((i64)c * fh + fr) * fw + fs;
            acc += g[crs * spatial + (i64)oy * ow + ox];
        }
    }
    gx[gxo + (((n0 + b) * C + c) * (i64)H + yy) * W + xx] = acc;
}

/* ------------------------------------------------------------------ direct kernels */

/* Output position (i, j) of border index t: rows [0, r0) and [r1, Oh) whole, then the columns
 * [0, q0) and [q1, Ow) of rows [r0, r1). */
DEVICE void chal_border_pos(i64 t, int oh, int ow, int r0, int r1, int q0, int q1, int* i, int* j) {
    i64 top = (i64)r0 * ow;
    if (t < top) {
        *i = (int)(t / ow);
        *j = (int)(t - (i64)(*i) * ow);
        return;
    }
    t -= top;
    i64 bottom = (i64)(oh - r1) * ow;
    if (t < bottom) {
        *i = r1 + (int)(t / ow);
        *j = (int)(t - (i64)(*i - r1) * ow);
        return;
    }
    t -= bottom;
    int side = ow - (q1 - q0);
    *i = r0 + (int)(t / side);
    int jj = (int)(t - (i64)(*i - r0) * side);
    *j = jj < q0 ? jj : q1 + (jj - q0);
}

/* y[n, k, i, j] = bias[k] + the sum over taps inside the input of x * f. Grid (positions,
 * K, N): every output position (border == 0), or the border positions (border == 1, see
 * chal_border_pos), then only when flag[0] is set (the filter holds a NaN or an infinity). */
KERNEL void conv_fwd_direct(GLOBAL const REAL* RESTRICT x, i64 xo, GLOBAL const REAL* RESTRICT f, i64 fo,
                            GLOBAL const REAL* RESTRICT bias, i64 bo, int has_bias, GLOBAL REAL* RESTRICT y,
                            i64 yo, int K, CHAL_CONV_PARAMS, int border, int r0, int r1, int q0, int q1,
                            GLOBAL const int* flag) {
    i64 t = GID(0);
    int k = (int)GID(1);
    i64 n = GID(2);
    int i, j;
    if (border) {
        if (flag[0] == 0 || t >= (i64)oh * ow - (i64)(r1 - r0) * (q1 - q0)) return;
        chal_border_pos(t, oh, ow, r0, r1, q0, q1, &i, &j);
    } else {
        if (t >= (i64)oh * ow) return;
        i = (int)(t / ow);
        j = (int)(t - (i64)i * ow);
    }
    int kg = K / (C / Cg);
    int cbase = (k / kg) * Cg;
    REAL acc = (REAL)0;
    for (int cl = 0; cl < Cg; ++cl) {
        GLOBAL const REAL* plane = x + xo + (n * C + cbase + cl) * (i64)H * W;
        GLOBAL const REAL* taps = f + fo + ((i64)k * Cg + cl) * fh * fw;
        for (int fr = 0; fr < fh; ++fr) {
            int yy = i * sh - pt + fr * dh;
            if (yy < 0 || yy >= H) continue;
            for (int fs = 0; fs < fw; ++fs) {
                int xx = j * sw - pl + fs * dw;
                if (xx < 0 || xx >= W) continue;
                acc += plane[(i64)yy * W + xx] * taps[fr * fw + fs];
            }
        }
    }
    if (has_bias) acc += bias[bo + k];
    y[yo + (n * K + k) * (i64)oh * ow + (i64)i * ow + j] = acc;
}

/* gx[n, c, y, x] = the sum over the output channels of c's group and the taps that read (y, x)
 * of grad_output * f. Grid (H * W, C, N). */
KERNEL void conv_bwd_data_direct(GLOBAL const REAL* RESTRICT gy, i64 gyo, GLOBAL const REAL* RESTRICT f, i64 fo,
                                 GLOBAL REAL* RESTRICT gx, i64 gxo, int K, CHAL_CONV_PARAMS) {
    i64 pos = GID(0);
    int c = (int)GID(1);
    i64 n = GID(2);
    if (pos >= (i64)H * W) return;
    int yy = (int)(pos / W);
    int xx = (int)(pos - (i64)yy * W);
    int groups = C / Cg;
    int kg = K / groups;
    int g = c / Cg;
    int cl = c - g * Cg;
    REAL acc = (REAL)0;
    for (int fr = 0; fr < fh; ++fr) {
        int oy = chal_tap_out(yy, pt, fr, dh, sh, oh);
        if (oy < 0) continue;
        for (int fs = 0; fs < fw; ++fs) {
            int ox = chal_tap_out(xx, pl, fs, dw, sw, ow);
            if (ox < 0) continue;
            for (int kl = 0; kl < kg; ++kl) {
                int k = g * kg + kl;
                acc += gy[gyo + (n * K + k) * (i64)oh * ow + (i64)oy * ow + ox] *
                       f[fo + (((i64)k * Cg + cl) * fh + fr) * fw + fs];
            }
        }
    }
    gx[gxo + (n * C + c) * (i64)H * W + pos] = acc;
}

/* gf[k, cl, r, s] = the sum over images and output positions whose tap (r, s) lands inside the
 * input of x * grad_output. One work-group of LS per filter element e (grid LS * count, elements
 * e0 .. e0 + count); with `flags`, only the elements of output channels k whose flag is set. */
KERNEL void conv_bwd_filter_direct(GLOBAL const REAL* RESTRICT x, i64 xo, GLOBAL const REAL* RESTRICT gy, i64 gyo,
                                   GLOBAL REAL* RESTRICT gf, i64 gfo, int N, int K, CHAL_CONV_PARAMS,
                                   GLOBAL const int* flags, int use_flags) {
    SHARED REAL part[LS];
    i64 e = GRP(0);
    int per_k = Cg * fh * fw;
    int k = (int)(e / per_k);
    if (use_flags && flags[k] == 0) return;
    int rest = (int)(e - (i64)k * per_k);
    int cl = rest / (fh * fw);
    int fr = (rest / fw) % fh;
    int fs = rest % fw;
    int kg = K / (C / Cg);
    int c = (k / kg) * Cg + cl;
    i64 spatial = (i64)oh * ow;
    REAL acc = (REAL)0;
    for (i64 t = LID(0); t < (i64)N * spatial; t += LS) {
        i64 n = t / spatial;
        i64 s = t - n * spatial;
        int i = (int)(s / ow);
        int j = (int)(s - (i64)i * ow);
        int yy = i * sh - pt + fr * dh;
        int xx = j * sw - pl + fs * dw;
        if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
        acc += x[xo + ((n * C + c) * (i64)H + yy) * W + xx] * gy[gyo + (n * K + k) * spatial + s];
    }
    acc = chal_group_reduce(part, REDUCE_SUM, acc);
    if (LID(0) == 0) gf[gfo + e] = acc;
}

/* flags[row] = 1 if src[row * len .. (row + 1) * len) holds a NaN or an infinity, else 0.
 * One work-group of LS per row. */
KERNEL void nonfinite_rows(GLOBAL const REAL* src, i64 so, i64 len, GLOBAL int* flags) {
    SHARED REAL part[LS];
    i64 row = GRP(0);
    int found = 0;
    for (i64 i = LID(0); i < len; i += LS) {
        REAL v = src[so + row * len + i];
        found |= (v - v) != (REAL)0; /* NaN or +-inf */
    }
    found = chal_group_reduce(part, REDUCE_MAX, (REAL)found) > (REAL)0;
    if (LID(0) == 0) flags[row] = found;
}

/* flags[k] = 1 if grad_output channel k holds a NaN or an infinity at a border position of any
 * image (see chal_border_pos), else 0. One work-group of LS per output channel. */
KERNEL void nonfinite_border(GLOBAL const REAL* gy, i64 gyo, int N, int K, int oh, int ow, int r0, int r1, int q0,
                             int q1, GLOBAL int* flags) {
    SHARED REAL part[LS];
    int k = (int)GRP(0);
    i64 count = (i64)oh * ow - (i64)(r1 - r0) * (q1 - q0);
    int found = 0;
    for (i64 t = LID(0); t < (i64)N * count; t += LS) {
        i64 n = t / count;
        int i, j;
        chal_border_pos(t - n * count, oh, ow, r0, r1, q0, q1, &i, &j);
        REAL v = gy[gyo + (n * K + k) * (i64)oh * ow + (i64)i * ow + j];
        found |= (v - v) != (REAL)0;
    }
    found = chal_group_reduce(part, REDUCE_MAX, (REAL)found) > (REAL)0;
    if (LID(0) == 0) flags[k] = found;
}

/* y[n, k, s] += bias[k]. Grid (S, K, N). */
KERNEL void conv_bias(GLOBAL REAL* y, i64 yo, GLOBAL const REAL* bias, i64 bo, int K, i64 spatial) {
    i64 s = GID(0);
    int k = (int)GID(1);
    i64 n = GID(2);
    if (s >= spatial) return;
    y[yo + (n * K + k) * spatial + s] += bias[bo + k];
}
