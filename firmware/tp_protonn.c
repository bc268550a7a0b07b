/* ProtoNN inference in integers (see tinyproto/families/protonn/quantize.py: the numpy reference does the same).
 *
 *   p_r = sum_i W[r,i] x_i            int32, W int8 in flash in the smallest exact encoding (TP_PROTONN_W_ENC, see
 *                                     tinyproto/families/protonn/encoding.py): 0 dense, 1 bitmap (row-major),
 *                                     2 one-byte / 3 four-bit row codes (column-major, feature by feature)
 *   z_r = clamp(shift(p_r) + o_r, +-127)  int8, the projection on the prototypes' grid (o_r: TP_PROTONN_OFFSET, the
 *                                     standardisation folded in when the input stage is shared; else 0)
 *   d_j = sum_r |z_r - B[j,r]|^2      uint32; |.| <= 254, so each term is one unsigned 8x8 multiply
 *   k_j = kernel[min(d_j >> TABLE_SHIFT, TABLE_SIZE - 1)]   uint8 ~ 255 exp(-gamma^2 dist)
 *   s_l = sum_j Z[l,j] k_j            int32, accumulated in a register per class; label = first maximum
 *
 * The kernels below are the portable C reference (plain C99); tp_protonn_avr.h holds their AVR twins, which
 * tinyproto.h chooses on an AVR (TP_KERNELS_AVR; -DTP_FORCE_REFERENCE keeps the reference there too).
 */
#define TP_MODEL_DATA
#include "tinyproto.h"
#include "tinyproto_model.h"

#ifndef TP_FAMILY_PROTONN
#error "tp_protonn.c needs a ProtoNN model header (TP_FAMILY_PROTONN)"
#endif
#ifndef TP_PROTONN_W_ENC
#define TP_PROTONN_W_ENC (TP_PROTONN_W_DENSE ? 0 : 1)
#endif
#ifndef TP_PROTONN_OFFSET
#define TP_PROTONN_OFFSET 0
#endif
#ifndef TP_PROTONN_ACC24
#define TP_PROTONN_ACC24 0
#endif
/* Row-major W (dense, bitmap): tp_predict runs the row kernels below (AVR assembly where proven); the streamed
 * path walks the same arrays column by column. Column-major W: both run the streamed path. */
#define TP_PROTONN_ROWMAJOR (TP_PROTONN_W_ENC <= 1)

/* 8-bit loop counters where the model allows them: each step of a 16-bit counter costs extra cycles. */
#if TP_PROTONN_PROTOS < 256
typedef uint8_t tp_protonn_proto_index_t;
#else
typedef uint16_t tp_protonn_proto_index_t;
#endif
/* Stage markers for tools/bench_latency.py (nothing in the normal build; see tinyproto.h). */
#define TP_STAGE_PROTONN_PROJECTION 0x30
#define TP_STAGE_PROTONN_DISTANCES 0x31
#define TP_STAGE_PROTONN_SCORES 0x32
#define TP_PROTONN_SCORE_GROUP 5 /* SCORE_GROUP in tinyproto/families/protonn/quantize.py */

/* z_r from p_r on B's grid (defined below; the AVR twins call it too). */
#if TP_PROTONN_OFFSET
TP_NOINLINE static int8_t tp_protonn_rescale_offset(int32_t p, uint8_t r);
#define TP_PROTONN_RESCALE(p, r) tp_protonn_rescale_offset((p), (r))
#else
static int8_t tp_protonn_rescale(int32_t p);
#define TP_PROTONN_RESCALE(p, r) tp_protonn_rescale(p)
#endif

#if TP_KERNELS_AVR
#include "tp_protonn_avr.h"
#endif

#if !TP_PROTONN_OFFSET && !defined(TP_PROTONN_AVR_RESCALE)
/* Bring one projection sum onto B's grid: a rounding right shift (or a left shift) and a clamp. */
static int8_t tp_protonn_rescale(int32_t p)
{
#if TP_PROTONN_PROJ_RSHIFT > 0
    p = (p + ((int32_t)1 << (TP_PROTONN_PROJ_RSHIFT - 1))) >> TP_PROTONN_PROJ_RSHIFT;
#else
    /* Clamp first so the left shift cannot overflow; the result is the same after the final clamp. */
    if (p > TP_PROTONN_PZ_MAX) {
        p = TP_PROTONN_PZ_MAX;
    } else if (p < -TP_PROTONN_PZ_MAX) {
        p = -TP_PROTONN_PZ_MAX;
    }
    p *= (int32_t)1 << TP_PROTONN_PROJ_LSHIFT;
#endif
    if (p > TP_PROTONN_PZ_MAX) {
        return TP_PROTONN_PZ_MAX;
    }
    if (p < -TP_PROTONN_PZ_MAX) {
        return -TP_PROTONN_PZ_MAX;
    }
    return (int8_t)p;
}
#endif

#if TP_PROTONN_OFFSET
/* z_r = clamp(shift(p) + o_r, +-127) with |o_r| <= 512 (the host clamps it so): a shifted sum beyond +-1024
 * saturates whatever o_r, so the sum is taken in 16 bits after clamping to +-1024. Out of line, reading o_r
 * itself: inlined into the row loop, the extra live values made avr-gcc keep a frame in Y, which the assembly
 * row kernel claims (it reads x through Y). */
TP_NOINLINE static int8_t tp_protonn_rescale_offset(int32_t p, uint8_t r)
{
    int16_t offset = tp_read_i16(&tp_protonn_offset[r]);
    int16_t q;
#if TP_PROTONN_PROJ_RSHIFT > 0
    p = (p + ((int32_t)1 << (TP_PROTONN_PROJ_RSHIFT - 1))) >> TP_PROTONN_PROJ_RSHIFT;
#else
    if (p > 32767) {
        p = 32767;
    } else if (p < -32767) {
        p = -32767;
    }
    p *= (int32_t)1 << TP_PROTONN_PROJ_LSHIFT;
#endif
    if (p > 1024) {
        q = 1024;
    } else if (p < -1024) {
        q = -1024;
    } else {
        q = (int16_t)p;
    }
    q = (int16_t)(q + offset);
    if (q > TP_PROTONN_PZ_MAX) {
        return TP_PROTONN_PZ_MAX;
    }
    if (q < -TP_PROTONN_PZ_MAX) {
        return -TP_PROTONN_PZ_MAX;
    }
    return (int8_t)q;
}
#endif

#if TP_PROTONN_W_DENSE
/* The dense layout (encoding.dense_layout): rows in groups of 4 (the last group the rest), each group stored
 * input by input with its rows' weights together. */
static inline uint8_t tp_protonn_dense_group(uint8_t r)
{
    uint8_t r0 = (uint8_t)(r & ~3u);
    return (uint8_t)(TP_PROTONN_DIM - r0 < 4 ? TP_PROTONN_DIM - r0 : 4);
}
static inline const int8_t *tp_protonn_dense_at(uint8_t r, uint16_t i)
{
    uint8_t r0 = (uint8_t)(r & ~3u);
    return tp_protonn_W + (uint32_t)r0 * TP_N_FEATURES + (uint32_t)i * tp_protonn_dense_group(r) + (r & 3u);
}
#endif

#if TP_PROTONN_ROWMAJOR && !defined(TP_PROTONN_AVR_PROJECT)
#if TP_PROTONN_W_DENSE
/* Row r of the grouped dense layout: its weight of input i at group + i * G + r % 4 (see encoding.dense_layout). */
TP_NOINLINE static int32_t tp_protonn_row_dot(const int8_t *x, uint8_t r)
{
    const int8_t *weight = tp_protonn_dense_at(r, 0);
    uint8_t stride = tp_protonn_dense_group(r);
    int32_t acc = 0;
    for (uint16_t i = 0; i < TP_N_FEATURES; ++i, weight += stride) {
        acc += tp_mul_s8(tp_read_i8(weight), x[i]);
    }
    return acc;
}
#else
/* Walk one row of the bitmap stream (per 8 inputs a bitmap byte, then its nonzeros), row after row. */
TP_NOINLINE static int32_t tp_protonn_row_dot(const int8_t *x, const uint8_t **stream)
{
    const uint8_t *w = *stream; /* a local copy stays in a register; through **stream it is reloaded every step */
    int32_t acc = 0;
    for (uint16_t byte = 0; byte < TP_PROTONN_W_MASK_BYTES; ++byte, x += 8) {
        uint8_t bits = tp_next_u8(&w);
        const int8_t *xi = x;
        while (bits) {
            if (bits & 1u) {
                acc += tp_mul_s8((int8_t)tp_next_u8(&w), *xi);
            }
            bits >>= 1;
            ++xi;
        }
    }
    *stream = w;
    return acc;
}
#endif

TP_NOINLINE static void tp_protonn_project(const int8_t *x, int8_t *z)
{
#if TP_PROTONN_W_DENSE
    for (uint8_t r = 0; r < TP_PROTONN_DIM; ++r) {
        z[r] = TP_PROTONN_RESCALE(tp_protonn_row_dot(x, r), r);
    }
#else
    const uint8_t *stream = tp_protonn_W_bitmap;
    for (uint8_t r = 0; r < TP_PROTONN_DIM; ++r) {
        z[r] = TP_PROTONN_RESCALE(tp_protonn_row_dot(x, &stream), r);
    }
#endif
}
#endif

#ifndef TP_PROTONN_AVR_KERNELS
/* Table index of a squared distance: min(dist >> TABLE_SHIFT, TABLE_SIZE - 1). Comparing against the table's
 * reach first avoids a 32-bit shift for the (many) far prototypes. */
static inline uint8_t tp_protonn_table_index(uint32_t dist)
{
    if (dist >= ((uint32_t)(TP_PROTONN_TABLE_SIZE - 1) << TP_PROTONN_TABLE_SHIFT)) {
        return TP_PROTONN_TABLE_SIZE - 1;
    }
    return (uint8_t)(dist >> TP_PROTONN_TABLE_SHIFT);
}

/* kernel[j] = table[index(sum_r |z_r - B[j,r]|^2)] for every prototype, in one loop nest (no call per prototype). */
TP_NOINLINE static uint16_t tp_protonn_kernels(const int8_t *z, uint8_t *kernel)
{
    const int8_t *proto = tp_protonn_B;
    for (tp_protonn_proto_index_t j = 0; j < TP_PROTONN_PROTOS; ++j) {
        uint32_t dist = 0;
        for (uint8_t r = 0; r < TP_PROTONN_DIM; ++r) {
            int8_t zr = z[r];
            int8_t br = tp_next_i8(&proto);
            uint8_t magnitude = zr > br ? (uint8_t)(zr - br) : (uint8_t)(br - zr); /* <= 254 */
            dist += tp_mul_u8(magnitude, magnitude);
        }
        kernel[j] = tp_read_u8(&tp_protonn_kernel[tp_protonn_table_index(dist)]);
    }
    return 0; /* the portable scores need no kernel sum */
}

/* Every class's score in portable C, reading tp_protonn_Z's layout (groups of up to 5 classes, prototype-major,
 * Z + 128). */
static void tp_protonn_all_scores(const uint8_t *kernel, uint16_t kernel_sum, int32_t *scores)
{
    const uint8_t *group = tp_protonn_Z;
    (void)kernel_sum;
    for (uint8_t l0 = 0; l0 < TP_N_CLASSES; l0 = (uint8_t)(l0 + TP_PROTONN_SCORE_GROUP)) {
        uint8_t g = (uint8_t)(TP_N_CLASSES - l0 < TP_PROTONN_SCORE_GROUP ? TP_N_CLASSES - l0 : TP_PROTONN_SCORE_GROUP);
        for (uint8_t c = 0; c < g; ++c) {
            const uint8_t *zp = group + c;
            int32_t sum = 0;
            for (tp_protonn_proto_index_t j = 0; j < TP_PROTONN_PROTOS; ++j, zp += g) {
                sum += tp_mul_s8u8((int8_t)(tp_read_u8(zp) ^ 0x80u), kernel[j]);
            }
            scores[l0 + c] = sum;
        }
        group += (uint16_t)g * TP_PROTONN_PROTOS;
    }
}
#endif

/* s_l for every class and the first maximum; out of line so that its pointers stay in registers (tp_predict's
 * frame holds z and the kernels). */
TP_NOINLINE static uint8_t tp_protonn_scores(const uint8_t *kernel, uint16_t kernel_sum, int32_t *scores)
{
    tp_protonn_all_scores(kernel, kernel_sum, scores);
    uint8_t label = 0;
    int32_t best = scores[0];
    for (uint8_t l = 1; l < TP_N_CLASSES; ++l) {
        if (scores[l] > best) {
            best = scores[l];
            label = l;
        }
    }
    return label;
}

/* ---- streamed projection: p_r accumulates feature by feature as chunks arrive --------------------------------
 * Static state only: the D projection sums (24 bits where every row's nonzeros keep |p_r| < 2^23: TP_PROTONN_ACC24)
 * and the read positions in W; never the input vector. */
#ifndef TP_PROTONN_AVR_ACC
typedef int32_t tp_protonn_acc_t;
#endif
static tp_protonn_acc_t tp_protonn_acc[TP_PROTONN_DIM];
#if TP_PROTONN_W_ENC >= 2
static const uint8_t *tp_protonn_code;
static const int8_t *tp_protonn_value;
#if TP_PROTONN_W_ENC == 3
static uint8_t tp_protonn_high; /* 1: the next code is the current byte's high nibble */
#endif
#elif TP_PROTONN_W_ENC == 1
/* each row's current bitmap byte in the bitmap stream (that byte, then its nonzeros) */
static const uint8_t *tp_protonn_cursor[TP_PROTONN_DIM];
#endif

#if TP_PROTONN_W_ENC == 1
static uint8_t tp_protonn_popcount(uint8_t bits)
{
    uint8_t n = 0;
    while (bits) {
        n += bits & 1u;
        bits >>= 1;
    }
    return n;
}
#endif

void tp_stream_begin(void)
{
    for (uint8_t r = 0; r < TP_PROTONN_DIM; ++r) {
        tp_protonn_acc[r] = 0;
    }
#if TP_PROTONN_W_ENC >= 2
    tp_protonn_code = tp_protonn_W_codes;
    tp_protonn_value = tp_protonn_W_values;
#if TP_PROTONN_W_ENC == 3
    tp_protonn_high = 0;
#endif
#elif TP_PROTONN_W_ENC == 1
    const uint8_t *w = tp_protonn_W_bitmap;
    for (uint8_t r = 0; r < TP_PROTONN_DIM; ++r) {
        tp_protonn_cursor[r] = w;
        for (uint16_t b = 0; b < TP_PROTONN_W_MASK_BYTES; ++b) {
            w += 1u + tp_protonn_popcount(tp_read_u8(w));
        }
    }
#endif
}

void tp_stream_feed(const int8_t *xq, uint16_t first, uint8_t n)
{
#ifdef TP_UNKNOWN_CLIPS
    tp_judge_inputs(xq, first, n); /* the clip check's count (tp_judge.c) */
#endif
    TP_STAGE(TP_STAGE_PROTONN_PROJECTION);
#if TP_PROTONN_W_ENC >= 2
    /* Column-major codes: each feature's nonzeros follow the previous feature's; the last one is flagged. */
    const uint8_t *code = tp_protonn_code;
    const int8_t *value = tp_protonn_value;
    (void)first;
#if TP_PROTONN_W_ENC == 3
    uint8_t high = tp_protonn_high;
#endif
    for (uint8_t k = 0; k < n; ++k) {
        int8_t x = xq[k];
        uint8_t c;
        do {
#if TP_PROTONN_W_ENC == 2
            c = tp_next_u8(&code);
            tp_protonn_acc[c & 0x7Fu] += tp_mul_s8(tp_next_i8(&value), x);
        } while (!(c & 0x80u));
#else
            if (high) {
                c = (uint8_t)(tp_next_u8(&code) >> 4);
            } else {
                c = (uint8_t)(tp_read_u8(code) & 0x0Fu);
            }
            high ^= 1u;
            tp_protonn_acc[c & 0x07u] += tp_mul_s8(tp_next_i8(&value), x);
        } while (!(c & 0x08u));
#endif
    }
    tp_protonn_code = code;
    tp_protonn_value = value;
#if TP_PROTONN_W_ENC == 3
    tp_protonn_high = high;
#endif
#elif TP_PROTONN_W_ENC == 1
    for (uint8_t k = 0; k < n; ++k) {
        uint16_t i = (uint16_t)(first + k);
        int8_t x = xq[k];
        uint8_t bit = (uint8_t)(i & 7u);
        for (uint8_t r = 0; r < TP_PROTONN_DIM; ++r) {
            const uint8_t *at = tp_protonn_cursor[r];
            uint8_t bits = tp_read_u8(at);
            if (bits & (uint8_t)(1u << bit)) { /* its value follows the byte and the lower bits' values */
                int8_t w = (int8_t)tp_read_u8(at + 1 + tp_protonn_popcount((uint8_t)(bits & ((1u << bit) - 1u))));
                tp_protonn_acc[r] += tp_mul_s8(w, x);
            }
            if (bit == 7u) { /* the next input starts the next bitmap byte */
                tp_protonn_cursor[r] = at + 1 + tp_protonn_popcount(bits);
            }
        }
    }
#else
    for (uint8_t k = 0; k < n; ++k) {
        int8_t x = xq[k];
        for (uint8_t r = 0; r < TP_PROTONN_DIM; ++r) {
            tp_protonn_acc[r] += tp_mul_s8(tp_read_i8(tp_protonn_dense_at(r, (uint16_t)(first + k))), x);
        }
    }
#endif
    TP_STAGE(TP_STAGE_APP);
}

uint8_t tp_stream_end(int32_t *scores)
{
    int8_t z[TP_PROTONN_DIM];
    uint8_t kernel[TP_PROTONN_PROTOS];
    TP_STAGE(TP_STAGE_PROTONN_PROJECTION);
    for (uint8_t r = 0; r < TP_PROTONN_DIM; ++r) {
        z[r] = TP_PROTONN_RESCALE((int32_t)tp_protonn_acc[r], r);
    }
    TP_STAGE(TP_STAGE_PROTONN_DISTANCES);
    uint16_t kernel_sum = tp_protonn_kernels(z, kernel);
    TP_STAGE(TP_STAGE_PROTONN_SCORES);
    return tp_protonn_scores(kernel, kernel_sum, scores);
}

uint8_t tp_predict(const int8_t *x, int32_t *scores)
{
#if TP_PROTONN_ROWMAJOR
#ifdef TP_UNKNOWN_CLIPS /* (a column-coded W goes through tp_stream_feed, which counts) */
    tp_judge_inputs(x, 0, TP_N_FEATURES); /* the clip check's count (tp_judge.c) */
#endif
    int8_t z[TP_PROTONN_DIM];
    uint8_t kernel[TP_PROTONN_PROTOS];
    TP_STAGE(TP_STAGE_PROTONN_PROJECTION);
    tp_protonn_project(x, z);
    TP_STAGE(TP_STAGE_PROTONN_DISTANCES);
    uint16_t kernel_sum = tp_protonn_kernels(z, kernel);
    TP_STAGE(TP_STAGE_PROTONN_SCORES);
    return tp_protonn_scores(kernel, kernel_sum, scores);
#else
    tp_stream_begin();
    for (uint16_t first = 0; first < TP_N_FEATURES; first = (uint16_t)(first + 255u)) {
        uint16_t left = (uint16_t)(TP_N_FEATURES - first);
        tp_stream_feed(x + first, first, (uint8_t)(left < 255u ? left : 255u));
    }
    return tp_stream_end(scores);
#endif
}
