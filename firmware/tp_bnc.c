/* BNC inference: an r-bit linear hash of the int8 input and the nearest of m binary prototypes in Hamming
 * distance (see tinyproto/families/bnc/quantize.py, whose IntBNC.scores() this file matches bit for bit).
 *
 *   p_k     = sum_i W[k, i] * x[i]             int32 running sums, k = 0 .. TP_BNC_BITS-1
 *   code    = bit k set <=> p_k >= 0           TP_BNC_BYTES bytes, LSB first (padding bits 0)
 *   dist_j  = popcount(code XOR b_j)           b_j: TP_BNC_BYTES bytes of tp_bnc_B in flash
 *   score_l = -min over class l's prototypes   classes own consecutive prototypes up to tp_bnc_class_end[l]
 *   return argmax_l score_l, ties to the lowest index
 *
 * W is stored feature by feature (dense int8, or a per-feature bitmap over the r rows plus the nonzeros), so
 * the input can be consumed in arriving order: tp_stream_begin / tp_stream_feed / tp_stream_end (TP_STREAMABLE)
 * keep only the r sums and the stream position, static; tp_predict() is the same three steps over the whole
 * vector. The state is static, so tp_predict() is not reentrant (one inference at a time, as on the device).
 * No popcount table: a byte's bits are counted with three mask-and-add steps, so every byte of flash data this
 * file holds is the model's (the ledger), and the cost is the same for every input.
 */
#define TP_MODEL_DATA
#include "tinyproto.h"
#include "tinyproto_model.h"

#if TP_BNC_BITS < 1 || TP_BNC_BITS > 1024 || TP_BNC_BYTES != (TP_BNC_BITS + 7) / 8
#error "TP_BNC_BITS must be 1..1024 and TP_BNC_BYTES = ceil(TP_BNC_BITS / 8)"
#endif
#if TP_BNC_PROTOS < TP_N_CLASSES || TP_BNC_PROTOS > 65535
#error "every class needs a prototype, and TP_BNC_PROTOS must be <= 65535"
#endif

/* The streaming API (also declared by tinyproto.h once the transport uses it; the declarations agree). */
void tp_stream_begin(void);
void tp_stream_feed(const int8_t *xq, uint16_t first, uint8_t n);
uint8_t tp_stream_end(int32_t *scores);

#if TP_BNC_PROTOS <= 255
#define TP_BNC_END(l) ((uint16_t)tp_read_u8(&tp_bnc_class_end[l]))
#else
#define TP_BNC_END(l) ((uint16_t)tp_read_u16(&tp_bnc_class_end[l]))
#endif

static int32_t tp_bnc_sums[TP_BNC_BITS];
static uint16_t tp_bnc_fed;    /* features consumed so far */
#if !TP_BNC_W_DENSE
static uint16_t tp_bnc_value;  /* offset into tp_bnc_W_values of feature tp_bnc_fed's first nonzero */
#endif

static uint8_t tp_bnc_popcount(uint8_t v)
{
    v = (uint8_t)(v - ((v >> 1) & 0x55u));
    v = (uint8_t)((v & 0x33u) + ((v >> 2) & 0x33u));
    return (uint8_t)((v + (v >> 4)) & 0x0Fu);
}

void tp_stream_begin(void)
{
    for (uint16_t k = 0; k < TP_BNC_BITS; ++k) {
        tp_bnc_sums[k] = 0;
    }
    tp_bnc_fed = 0;
#if !TP_BNC_W_DENSE
    tp_bnc_value = 0;
#endif
}

#if TP_BNC_W_DENSE
/* sums += x * W[., i]: the r weights of feature i are adjacent in flash. */
static TP_NOINLINE void tp_bnc_feature(int8_t x, uint16_t i)
{
    const int8_t *w = &tp_bnc_W[(uint32_t)i * TP_BNC_BITS];
    int32_t *sum = tp_bnc_sums;
    for (uint16_t k = 0; k < TP_BNC_BITS; ++k) {
        *sum++ += tp_mul_s8(tp_next_i8(&w), x);
    }
}
#else
/* sums += x * W[., i] over feature i's nonzeros, found by its bitmap; returns the nonzeros consumed. */
static TP_NOINLINE uint16_t tp_bnc_feature(int8_t x, uint16_t i, uint16_t value)
{
    const uint8_t *mask = &tp_bnc_W_mask[(uint32_t)i * TP_BNC_BYTES];
    const int8_t *w = &tp_bnc_W_values[value];
    const int8_t *start = w;
    int32_t *sum = tp_bnc_sums;
    for (uint8_t b = 0; b < TP_BNC_BYTES; ++b, sum += 8) {
        uint8_t bits = tp_next_u8(&mask);
        if (x == 0) { /* nothing to add: only count the nonzeros to skip */
            w += tp_bnc_popcount(bits);
            continue;
        }
        int32_t *s = sum;
        while (bits) {
            if (bits & 1u) {
                *s += tp_mul_s8(tp_next_i8(&w), x);
            }
            bits >>= 1;
            ++s;
        }
    }
    return (uint16_t)(w - start);
}

/* The value offset of feature `first`: the nonzeros of every feature before it (for a stream that skips). */
static uint16_t tp_bnc_value_at(uint16_t first)
{
    uint16_t value = 0;
    const uint8_t *mask = tp_bnc_W_mask;
    for (uint32_t b = 0; b < (uint32_t)first * TP_BNC_BYTES; ++b) {
        value = (uint16_t)(value + tp_bnc_popcount(tp_next_u8(&mask)));
    }
    return value;
}
#endif

static void tp_bnc_feed(const int8_t *xq, uint16_t first, uint16_t n)
{
    if (first >= TP_N_FEATURES) {
        return;
    }
    if ((uint32_t)first + n > TP_N_FEATURES) {
        n = (uint16_t)(TP_N_FEATURES - first);
    }
#if !TP_BNC_W_DENSE
    uint16_t value = (first == tp_bnc_fed) ? tp_bnc_value : tp_bnc_value_at(first);
#endif
    for (uint16_t j = 0; j < n; ++j) {
#if TP_BNC_W_DENSE
        if (xq[j] != 0) {
            tp_bnc_feature(xq[j], (uint16_t)(first + j));
        }
#else
        value = (uint16_t)(value + tp_bnc_feature(xq[j], (uint16_t)(first + j), value));
#endif
    }
    tp_bnc_fed = (uint16_t)(first + n);
#if !TP_BNC_W_DENSE
    tp_bnc_value = value;
#endif
}

void tp_stream_feed(const int8_t *xq, uint16_t first, uint8_t n)
{
    tp_bnc_feed(xq, first, n);
}

/* The code's bits from the sums' signs, then the nearest prototype of each class. */
uint8_t tp_stream_end(int32_t *scores)
{
    uint8_t code[TP_BNC_BYTES];
    for (uint16_t b = 0; b < TP_BNC_BYTES; ++b) {
        uint8_t byte = 0;
        for (uint8_t t = 0; t < 8; ++t) {
            uint16_t k = (uint16_t)(8u * b + t);
            if (k < TP_BNC_BITS && tp_bnc_sums[k] >= 0) {
                byte |= (uint8_t)(1u << t);
            }
        }
        code[b] = byte;
    }
    const uint8_t *proto = tp_bnc_B;
    uint16_t j = 0;
    uint8_t best = 0;
    for (uint8_t l = 0; l < TP_N_CLASSES; ++l) {
        uint16_t end = TP_BNC_END(l);
        uint16_t nearest = 0xFFFFu;
        for (; j < end; ++j) {
            uint16_t dist = 0;
            for (uint16_t b = 0; b < TP_BNC_BYTES; ++b) {
                dist = (uint16_t)(dist + tp_bnc_popcount((uint8_t)(code[b] ^ tp_next_u8(&proto))));
            }
            if (dist < nearest) {
                nearest = dist;
            }
        }
        scores[l] = -(int32_t)nearest;
        if (scores[l] > scores[best]) {
            best = l;
        }
    }
    return best;
}

uint8_t tp_predict(const int8_t *x, int32_t *scores)
{
    tp_stream_begin();
    tp_bnc_feed(x, 0, TP_N_FEATURES);
    return tp_stream_end(scores);
}
