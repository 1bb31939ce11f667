/* The GEMM micro-tile shared by gemm.cl and the convolution packers in conv.cl.
 * VW: vector width (8 floats or 4 doubles: one 256-bit register); MR = 2 * VW rows and NR
 * columns of C per work-item. The host passes the same values to both families. */
#ifndef COMPUTEHAL_GEMM_TILE_H
#define COMPUTEHAL_GEMM_TILE_H
#ifndef VW
#define VW 8
#endif
#ifndef NR
#define NR 4
#endif
#define MR (2 * VW)
#endif
