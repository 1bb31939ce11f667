/* Index arithmetic of strided views over up to 6 dimensions, shared by the broadcasting
 * element-wise kernel and the strided copy.
 *
 * The host collapses a view to an inner dimension (walked by each work-item) and up to five
 * outer dimensions e1 (outermost) .. e5 (innermost), padding unused ones with extent 1. For
 * a flat outer index o, chal_outer returns the element offsets of two operands with strides
 * sa1..sa5 and sb1..sb5 (in elements, negative allowed). Needs dialect.h. */
#ifndef COMPUTEHAL_STRIDED_H
#define COMPUTEHAL_STRIDED_H

#define CHAL_OUTER_PARAMS                                                                          \
    i64 e1, i64 e2, i64 e3, i64 e4, i64 e5, i64 sa1, i64 sa2, i64 sa3, i64 sa4, i64 sa5, i64 sb1,  \
        i64 sb2, i64 sb3, i64 sb4, i64 sb5
#define CHAL_OUTER_ARGS e1, e2, e3, e4, e5, sa1, sa2, sa3, sa4, sa5, sb1, sb2, sb3, sb4, sb5

DEVICE void chal_outer(i64 o, CHAL_OUTER_PARAMS, i64* oa, i64* ob) {
    i64 i5 = o % e5;
    o /= e5;
    i64 i4 = o % e4;
    o /= e4;
    i64 i3 = o % e3;
    o /= e3;
    i64 i2 = o % e2;
    i64 i1 = o / e2;
    *oa = i1 * sa1 + i2 * sa2 + i3 * sa3 + i4 * sa4 + i5 * sa5;
    *ob = i1 * sb1 + i2 * sb2 + i3 * sb3 + i4 * sb4 + i5 * sb5;
}

#endif
