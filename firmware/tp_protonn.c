/* ProtoNN inference in integers (see tinyproto/protonn/quantize.py: the numpy reference does the same steps).
 *
 *   p_r = sum_i W[r,i] x_i            int32, W int8 in flash (dense, or nonzero bitmap + packed values)
 *   z_r = clamp(shift(p_r), +-PZ_MAX) int16, the projection on the prototypes' grid
 *   d_j = sum_r (z_r - B[j,r])^2      int32
 *   k_j = kernel[min(d_j >> TABLE_SHIFT, TABLE_SIZE - 1)]   uint8 ~ 255 exp(-gamma^2 dist)
 *   s_l = sum_j Z[j,l] k_j            int32; the label is the first maximum
 */
#define TP_MODEL_DATA
#include "tinyproto.h"
#include "tinyproto_model.h"

#ifndef TP_FAMILY_PROTONN
#error "tp_protonn.c needs a ProtoNN model header (TP_FAMILY_PROTONN)"
#endif

/* Bring one projection sum onto B's grid: a rounding right shift (or a left shift) and a clamp. */
static int16_t tp_pn_rescale(int32_t p)
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
    return (int16_t)p;
}

#if TP_PN_W_DENSE
static int32_t tp_pn_row_dot(uint8_t row, const int8_t *x)
{
    const int8_t *w = &tp_pn_W[(uint16_t)row * TP_N_FEATURES];
    int32_t acc = 0;
    for (uint16_t i = 0; i < TP_N_FEATURES; ++i) {
        acc += (int16_t)tp_read_i8(w + i) * x[i];
    }
    return acc;
}
#else
/* Walk the row's nonzero bitmap; `*value` advances through the packed nonzeros, row after row. */
static int32_t tp_pn_row_dot(uint8_t row, const int8_t *x, const int8_t **value)
{
    const uint8_t *mask = &tp_pn_W_mask[(uint16_t)row * TP_PN_W_MASK_BYTES];
    const int8_t *v = *value;
    int32_t acc = 0;
    for (uint16_t byte = 0; byte < TP_PN_W_MASK_BYTES; ++byte) {
        uint8_t bits = tp_read_u8(mask + byte);
        const int8_t *xi = x + 8u * byte;
        while (bits) {
            if (bits & 1u) {
                acc += (int16_t)tp_read_i8(v) * *xi;
                ++v;
            }
            bits >>= 1;
            ++xi;
        }
    }
    *value = v;
    return acc;
}
#endif

static void tp_pn_project(const int8_t *x, int16_t *z)
{
#if TP_PN_W_DENSE
    for (uint8_t r = 0; r < TP_PN_DIM; ++r) {
        z[r] = tp_pn_rescale(tp_pn_row_dot(r, x));
    }
#else
    const int8_t *value = tp_pn_W_values;
    for (uint8_t r = 0; r < TP_PN_DIM; ++r) {
        z[r] = tp_pn_rescale(tp_pn_row_dot(r, x, &value));
    }
#endif
}

static uint8_t tp_pn_kernel_of(const int16_t *z, const int8_t *b)
{
    uint32_t dist = 0;
    for (uint8_t r = 0; r < TP_PN_DIM; ++r) {
        int16_t diff = (int16_t)(z[r] - tp_read_i8(b + r));
        dist += (uint32_t)((int32_t)diff * diff);
    }
    uint32_t index = dist >> TP_PN_TABLE_SHIFT;
    if (index >= TP_PN_TABLE_SIZE) {
        index = TP_PN_TABLE_SIZE - 1;
    }
    return tp_read_u8(&tp_pn_kernel[index]);
}

uint8_t tp_predict(const int8_t *x, int32_t *scores)
{
    int16_t z[TP_PN_DIM];
    tp_pn_project(x, z);
    for (uint8_t l = 0; l < TP_N_CLASSES; ++l) {
        scores[l] = 0;
    }
    const int8_t *b = tp_pn_B;
    const int8_t *zrow = tp_pn_Z;
    for (uint16_t j = 0; j < TP_PN_PROTOS; ++j, b += TP_PN_DIM, zrow += TP_N_CLASSES) {
        uint8_t k = tp_pn_kernel_of(z, b);
        if (k == 0) {
            continue; /* contributes nothing: skipping it changes no score */
        }
        for (uint8_t l = 0; l < TP_N_CLASSES; ++l) {
            scores[l] += (int16_t)(tp_read_i8(zrow + l) * (int16_t)k);
        }
    }
    uint8_t label = 0;
    for (uint8_t l = 1; l < TP_N_CLASSES; ++l) {
        if (scores[l] > scores[label]) {
            label = l;
        }
    }
    return label;
}
