/* 2-D max and average pooling over NCHW REAL tensors, one work-item per output pixel
 * (grid: (Oh * Ow, N * C)).
 *
 * Output pixel (i, j) covers input rows i * sh - pt + r * dh for r < kh (likewise columns);
 * positions outside the input are padding. MAX ignores padding and NaN (fmax; a window with
 * no input gives -inf). AVG sums the input positions (IEEE: NaN propagates) and divides by
 * their number, or with include_pad by the number of positions inside the padded input
 * [-pt, H + pb) x [-pl, W + pr), so ceil-mode overhang never counts (0 / 0 gives NaN).
 */
#include "dialect.h"

KERNEL void pool2d(GLOBAL const REAL* x, i64 xo, GLOBAL REAL* y, i64 yo, int op, int h, int w, int oh,
                   int ow, int kh, int kw, int sh, int sw, int pt, int pl, int pb, int pr, int dh, int dw,
                   int include_pad) {
    i64 s = GID(0);
    i64 nc = GID(1);
    if (s >= (i64)oh * ow) return;
    int i = (int)(s / ow);
    int j = (int)(s - (i64)i * ow);
    int y0 = i * sh - pt;
    int x0 = j * sw - pl;
    GLOBAL const REAL* plane = x + xo + nc * (i64)h * w;
    REAL acc = op == POOL_MAX ? (REAL)(-INFINITY) : (REAL)0;
    int inside = 0;
    int padded = 0;
    for (int r = 0; r < kh; ++r) {
        int yy = y0 + r * dh;
        int row_in = yy >= 0 && yy < h;
        int row_pad = yy >= -pt && yy < h + pb;
        for (int q = 0; q < kw; ++q) {
            int xx = x0 + q * dw;
            if (row_in && xx >= 0 && xx < w) {
                REAL v = plane[(i64)yy * w + xx];
                if (op == POOL_MAX) {
                    acc = v > acc ? v : acc;
                } else {
                    acc += v;
                }
                inside += 1;
            }
            padded += row_pad && xx >= -pl && xx < w + pr;
        }
    }
    if (op == POOL_AVG) acc = acc / (REAL)(include_pad ? padded : inside);
    y[yo + nc * (i64)oh * ow + s] = acc;
}
