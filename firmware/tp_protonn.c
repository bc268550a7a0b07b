/* ProtoNN inference in integers (see tinyproto/protonn/quantize.py: the numpy reference does the same steps).
 *
 *   p_r = sum_i W[r,i] x_i            int32, W int8 in flash (dense, or nonzero bitmap + packed values)
 *   z_r = clamp(shift(p_r), +-127)    int8, the projection on the prototypes' grid
 *   d_j = sum_r |z_r - B[j,r]|^2      uint32; |.| <= 254, so each term is one unsigned 8x8 multiply
 *   k_j = kernel[min(d_j >> TABLE_SHIFT, TABLE_SIZE - 1)]   uint8 ~ 255 exp(-gamma^2 dist)
 *   s_l = sum_j Z[l,j] k_j            int32, accumulated in a register per class; label = first maximum
 */
#define TP_MODEL_DATA
#include "tinyproto.h"
#include "tinyproto_model.h"

#ifndef TP_FAMILY_PROTONN
#error "tp_protonn.c needs a ProtoNN model header (TP_FAMILY_PROTONN)"
#endif

/* 8-bit loop counters where the model allows them: each step of a 16-bit counter costs extra cycles. */
#if TP_PN_PROTOS < 256
typedef uint8_t tp_pn_proto_index_t;
#else
typedef uint16_t tp_pn_proto_index_t;
#endif

/* Bring one projection sum onto B's grid: a rounding right shift (or a left shift) and a clamp. */
static int8_t tp_pn_rescale(int32_t p)
{
#if TP_PN_PROJ_RSHIFT > 0
    p = (p + ((int32_t)1 << (TP_PN_PROJ_RSHIFT - 1))) >> TP_PN_PROJ_RSHIFT;
#else
    /* Clamp first so the left shift cannot overflow; the result is the same after the final clamp. */
    if (p > TP_PN_PZ_MAX) {
        p = TP_PN_PZ_MAX;
    } else if (p < -TP_PN_PZ_MAX) {
        p = -TP_PN_PZ_MAX;
    }
    p *= (int32_t)1 << TP_PN_PROJ_LSHIFT;
#endif
    if (p > TP_PN_PZ_MAX) {
        return TP_PN_PZ_MAX;
    }
    if (p < -TP_PN_PZ_MAX) {
        return -TP_PN_PZ_MAX;
    }
    return (int8_t)p;
}

#if TP_PN_W_DENSE
TP_NOINLINE static int32_t tp_pn_row_dot(const int8_t *x, const int8_t **w)
{
    const int8_t *weight = *w; /* a local copy stays in a register; through **w it is reloaded every step */
    int32_t acc = 0;
    for (uint16_t i = 0; i < TP_N_FEATURES; ++i) {
        acc += tp_mul_s8(tp_next_i8(&weight), x[i]);
    }
    *w = weight;
    return acc;
}
#else
/* Walk one row's nonzero bitmap; `mask` and `value` advance through the flash arrays, row after row. */
TP_NOINLINE static int32_t tp_pn_row_dot(const int8_t *x, const uint8_t **mask, const int8_t **value)
{
    const uint8_t *m = *mask; /* local copies stay in registers; through **mask they are reloaded every step */
    const int8_t *v = *value;
    int32_t acc = 0;
    for (uint16_t byte = 0; byte < TP_PN_W_MASK_BYTES; ++byte, x += 8) {
        uint8_t bits = tp_next_u8(&m);
        const int8_t *xi = x;
        while (bits) {
            if (bits & 1u) {
                acc += tp_mul_s8(tp_next_i8(&v), *xi);
            }
            bits >>= 1;
            ++xi;
        }
    }
    *mask = m;
    *value = v;
    return acc;
}
#endif

static void tp_pn_project(const int8_t *x, int8_t *z)
{
#if TP_PN_W_DENSE
    const int8_t *w = tp_pn_W;
    for (uint8_t r = 0; r < TP_PN_DIM; ++r) {
        z[r] = tp_pn_rescale(tp_pn_row_dot(x, &w));
    }
#else
    const uint8_t *mask = tp_pn_W_mask;
    const int8_t *value = tp_pn_W_values;
    for (uint8_t r = 0; r < TP_PN_DIM; ++r) {
        z[r] = tp_pn_rescale(tp_pn_row_dot(x, &mask, &value));
    }
#endif
}

/* Table index of a squared distance: min(dist >> TABLE_SHIFT, TABLE_SIZE - 1). Comparing against the table's
 * reach first avoids a 32-bit shift for the (many) far prototypes. */
static uint8_t tp_pn_table_index(uint32_t dist)
{
    if (dist >= ((uint32_t)(TP_PN_TABLE_SIZE - 1) << TP_PN_TABLE_SHIFT)) {
        return TP_PN_TABLE_SIZE - 1;
    }
    return (uint8_t)(dist >> TP_PN_TABLE_SHIFT);
}

/* kernel[j] = table[index(sum_r |z_r - B[j,r]|^2)] for every prototype, in one loop nest (no call per prototype). */
TP_NOINLINE static void tp_pn_kernels(const int8_t *z, uint8_t *kernel)
{
    const int8_t *proto = tp_pn_B;
    for (tp_pn_proto_index_t j = 0; j < TP_PN_PROTOS; ++j) {
        uint32_t dist = 0;
        for (uint8_t r = 0; r < TP_PN_DIM; ++r) {
            int8_t zr = z[r];
            int8_t br = tp_next_i8(&proto);
            uint8_t magnitude = zr > br ? (uint8_t)(zr - br) : (uint8_t)(br - zr); /* <= 254 */
            dist += tp_mul_u8(magnitude, magnitude);
        }
        kernel[j] = tp_read_u8(&tp_pn_kernel[tp_pn_table_index(dist)]);
    }
}

uint8_t tp_predict(const int8_t *x, int32_t *scores)
{
    int8_t z[TP_PN_DIM];
    uint8_t kernel[TP_PN_PROTOS];
    TP_STAGE(TP_STAGE_PN_PROJECTION);
    tp_pn_project(x, z);
    TP_STAGE(TP_STAGE_PN_DISTANCES);
    tp_pn_kernels(z, kernel);
    TP_STAGE(TP_STAGE_PN_SCORES);
    const int8_t *zrow = tp_pn_Z;
    uint8_t label = 0;
    for (uint8_t l = 0; l < TP_N_CLASSES; ++l) {
        int32_t sum = 0;
        const uint8_t *k = kernel;
        for (tp_pn_proto_index_t j = 0; j < TP_PN_PROTOS; ++j) {
            sum += tp_mul_s8u8(tp_next_i8(&zrow), *k++);
        }
        scores[l] = sum;
        if (sum > scores[label]) {
            label = l;
        }
    }
    return label;
}
