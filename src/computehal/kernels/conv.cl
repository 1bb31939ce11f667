/* Convolution as implicit GEMM: these kernels pack convolution operands straight into the
 * panel layouts of gemm.cl (no im2col matrix is materialised), and fold column gradients back
 * onto the input for the data gradient. Shapes: input [N, C, H, W], filter [K, C, Fh, Fw],
 * output [N, K, Oh, Ow]; CRS = C * Fh * Fw, S = Oh * Ow. `n0` is the first image of the chunk
 * being processed.
 */
#include "dialect.h"
#include "gemm_tile.h"


/* The input value that filter tap `crs` reads for output position `s` of image `n` (0 in the
 * zero padding). */
DEVICE float chal_conv_tap(GLOBAL const float* x, i64 xo, i64 n, i64 crs, i64 s, int C, int H, int W,
                           int fh, int fw, int ow, int sh, int sw, int ph, int pw) {
    int fs = (int)(crs % fw);
    int fr = (int)((crs / fw) % fh);
    int c = (int)(crs / ((i64)fw * fh));
    int oy = (int)(s / ow);
    int ox = (int)(s - (i64)oy * ow);
    int yy = oy * sh - ph + fr;
    int xx = ox * sw - pw + fs;
    if (yy < 0 || yy >= H || xx < 0 || xx >= W) return 0.0f;
    return x[xo + (((n * C + c) * (i64)H + yy) * W + xx)];
}

/* Forward: A(i = s, p = crs) of image n0 + GID(2), packed as gemm.cl's Ap. Grid (CRS, panels, images). */
KERNEL void pack_a_im2col(GLOBAL const float* RESTRICT x, i64 xo, i64 n0, int C, int H, int W, int fh, int fw,
                          int oh, int ow, int sh, int sw, int ph, int pw, GLOBAL float* RESTRICT ap,
                          i64 ap_stride) {
    i64 p = GID(0);
    i64 ib = GID(1);
    i64 b = GID(2);
    i64 crs_total = (i64)C * fh * fw;
    i64 m = (i64)oh * ow;
    if (p >= crs_total || ib * MR >= m) return;
    GLOBAL float* dst = ap + b * ap_stride + ib * crs_total * MR + p * MR;
    for (int r = 0; r < MR; ++r) {
        i64 s = ib * MR + r;
        dst[r] = s < m ? chal_conv_tap(x, xo, n0 + b, p, s, C, H, W, fh, fw, ow, sh, sw, ph, pw) : 0.0f;
    }
}

/* Filter gradient: A(i = crs, p = (image, s)) over `images` images, k = images * S.
 * Grid (k, panels). */
KERNEL void pack_a_cols_t(GLOBAL const float* RESTRICT x, i64 xo, i64 n0, int images, int C, int H, int W,
                          int fh, int fw, int oh, int ow, int sh, int sw, int ph, int pw,
                          GLOBAL float* RESTRICT ap) {
    i64 p = GID(0);
    i64 ib = GID(1);
    i64 spatial = (i64)oh * ow;
    i64 k = spatial * images;
    i64 m = (i64)C * fh * fw;
    if (p >= k || ib * MR >= m) return;
    i64 b = p / spatial;
    i64 s = p - b * spatial;
    GLOBAL float* dst = ap + ib * k * MR + p * MR;
    for (int r = 0; r < MR; ++r) {
        i64 crs = ib * MR + r;
        dst[r] = crs < m ? chal_conv_tap(x, xo, n0 + b, crs, s, C, H, W, fh, fw, ow, sh, sw, ph, pw) : 0.0f;
    }
}

/* Filter gradient: B(p = (image, s), j = output channel) = grad_output[n0 + image, j, s].
 * Grid (k, panels). */
KERNEL void pack_b_grad_out(GLOBAL const float* RESTRICT gy, i64 gyo, i64 n0, int images, int K, int oh,
                            int ow, GLOBAL float* RESTRICT bp) {
    i64 p = GID(0);
    i64 jb = GID(1);
    i64 spatial = (i64)oh * ow;
    i64 k = spatial * images;
    if (p >= k || jb * NR >= K) return;
    i64 b = p / spatial;
    i64 s = p - b * spatial;
    GLOBAL float* dst = bp + jb * k * NR + p * NR;
    for (int cc = 0; cc < NR; ++cc) {
        i64 j = jb * NR + cc;
        dst[cc] = j < K ? gy[gyo + ((n0 + b) * K + j) * spatial + s] : 0.0f;
    }
}

/* Data gradient: gx[n0 + b, c, y, x] = sum of the column gradients of every (tap, output
 * position) that reads input (y, x); gcols[b] is S x CRS column-major. Positions the forward
 * pass never reads get 0. Grid (H * W, C, images). */
KERNEL void col2im(GLOBAL const float* RESTRICT gcols, GLOBAL float* RESTRICT gx, i64 gxo, i64 n0, int C,
                   int H, int W, int fh, int fw, int oh, int ow, int sh, int sw, int ph, int pw) {
    i64 pos = GID(0);
    int c = (int)GID(1);
    i64 b = GID(2);
    if (pos >= (i64)H * W) return;
    int yy = (int)(pos / W);
    int xx = (int)(pos - (i64)yy * W);
    i64 spatial = (i64)oh * ow;
    i64 crs_total = (i64)C * fh * fw;
    GLOBAL const float* g = gcols + b * crs_total * spatial;
    float acc = 0.0f;
    for (int fr = 0; fr < fh; ++fr) {
        int ty = yy + ph - fr;
        if (ty < 0 || ty % sh != 0 || ty / sh >= oh) continue;
        int oy = ty / sh;
        for (int fs = 0; fs < fw; ++fs) {
            int tx = xx + pw - fs;
            if (tx < 0 || tx % sw != 0 || tx / sw >= ow) continue;
            int ox = tx / sw;
            i64 crs = ((i64)c * fh + fr) * fw + fs;
            acc += g[crs * spatial + (i64)oy * ow + ox];
        }
    }
    gx[gxo + (((n0 + b) * C + c) * (i64)H + yy) * W + xx] = acc;
}
