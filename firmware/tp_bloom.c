/* Bloom features inference (see tinyproto/families/bloom/quantize.py, whose IntBloom.scores() this file matches
 * bit for bit).
 *
 *   u_j     = clamp(x_j, -127, 127) + 128                    uint8 in 1..255, never 0
 *   phi_i   = max over (j, l) with h_l(j) = i of u_j          uint8 in static SRAM; 0 = no component hashes here
 *   phi'    = the non-zero phi_i in slot order                exactly TP_BLOOM_USED values (a property of the hash)
 *   s_r     = b_r + sum_p W[r][p] phi'_p                       int32; W int8 and b in flash
 *   scores  = s (L > 2), or (0, s_0) for two classes;  label = first maximum
 *
 * h_l(j) is step j * K + l of xorshift16 (7, 9, 8) started at TP_BLOOM_SEED, mapped to a slot by
 * (state * M) >> 16 (tinyproto.families.bloom.train.seeded_slots): the hash costs no flash byte.
 *
 * Streaming (TP_STREAMABLE 1): tp_stream_begin() clears phi, tp_stream_feed() folds each arriving feature into
 * phi (K generator steps and K compares per feature) and forgets it, tp_stream_end() does the dot products. So
 * a 784-pixel image is never held: SRAM is M bytes of phi plus 4 of stream state. Features are expected in
 * order; a chunk that starts elsewhere re-walks the generator to its first feature, and since MAX is
 * idempotent a chunk sent twice changes nothing. tp_predict() runs the same three steps over a whole vector.
 * The state is static, so unlike ProtoNN's and FlyNN's tp_predict this one is not reentrant.
 */
#define TP_MODEL_DATA
#include "tinyproto.h"
#include "tinyproto_model.h"

#ifndef TP_FAMILY_BLOOM
#error "tp_bloom.c needs a Bloom-features model header (TP_FAMILY_BLOOM)"
#endif
#if TP_BLOOM_M < 1 || TP_BLOOM_M > 65535 || TP_BLOOM_USED < 1 || TP_BLOOM_USED > TP_BLOOM_M
#error "need 1 <= TP_BLOOM_USED <= TP_BLOOM_M <= 65535"
#endif
#if TP_BLOOM_K < 1 || TP_BLOOM_K > 64
#error "TP_BLOOM_K must be in 1..64"
#endif
#if (TP_N_CLASSES == 2 && TP_BLOOM_ROWS != 1) || (TP_N_CLASSES != 2 && TP_BLOOM_ROWS != TP_N_CLASSES)
#error "TP_BLOOM_ROWS must be 1 for two classes, else TP_N_CLASSES"
#endif

/* The streaming contract (firmware/tinyproto.h declares it once for every streamable family). */
void tp_stream_begin(void);
void tp_stream_feed(const int8_t *xq, uint16_t first, uint8_t n);
uint8_t tp_stream_end(int32_t *scores);

static uint8_t tp_bloom_phi[TP_BLOOM_M];
static uint16_t tp_bloom_state; /* generator state after the last fed feature's K steps */
static uint16_t tp_bloom_next;  /* the feature index the state belongs to */

static inline uint16_t tp_bloom_step(uint16_t s)
{
    s ^= (uint16_t)(s << 7);
    s ^= (uint16_t)(s >> 9);
    s ^= (uint16_t)(s << 8);
    return s;
}

/* (s * M) >> 16. For M < 256 as two 8x8 multiplies: s*M = 256 hi M + lo M, and the carry of lo M into the high
 * byte is exactly floor(lo M / 256), so (hi M + (lo M >> 8)) >> 8 is the same integer (no 32-bit multiply). */
static inline uint16_t tp_bloom_slot(uint16_t s)
{
#if TP_BLOOM_M < 256
    uint16_t t = (uint16_t)(tp_mul_u8((uint8_t)(s >> 8), (uint8_t)TP_BLOOM_M) +
                            (tp_mul_u8((uint8_t)s, (uint8_t)TP_BLOOM_M) >> 8));
    return (uint16_t)(t >> 8);
#else
    return (uint16_t)(((uint32_t)s * (uint32_t)TP_BLOOM_M) >> 16);
#endif
}

void tp_stream_begin(void)
{
    for (uint16_t i = 0; i < TP_BLOOM_M; ++i) {
        tp_bloom_phi[i] = 0;
    }
    tp_bloom_state = TP_BLOOM_SEED;
    tp_bloom_next = 0;
}

void tp_stream_feed(const int8_t *xq, uint16_t first, uint8_t n)
{
    if (first != tp_bloom_next) { /* out of order: walk the generator from the seed to feature `first` */
        uint16_t s = TP_BLOOM_SEED;
        for (uint32_t t = (uint32_t)first * TP_BLOOM_K; t != 0; --t) {
            s = tp_bloom_step(s);
        }
        tp_bloom_state = s;
    }
    if (first >= TP_N_FEATURES) {
        tp_bloom_next = first;
        return;
    }
    if (n > TP_N_FEATURES - first) { /* never read beyond the model's features */
        n = (uint8_t)(TP_N_FEATURES - first);
    }
    uint16_t s = tp_bloom_state;
    for (uint8_t i = 0; i < n; ++i) {
        uint8_t u = (uint8_t)((uint8_t)xq[i] ^ 0x80u); /* x + 128 */
        if (u == 0) {
            u = 1; /* x = -128 reads as -127: phi stays 0 only where nothing hashes */
        }
        for (uint8_t l = 0; l < TP_BLOOM_K; ++l) {
            s = tp_bloom_step(s);
            uint8_t *slot = &tp_bloom_phi[tp_bloom_slot(s)];
            if (u > *slot) {
                *slot = u;
            }
        }
    }
    tp_bloom_state = s;
    tp_bloom_next = (uint16_t)(first + n);
}

/* Accumulator: |sum_p W phi'| <= 128 * 255 * USED, which fits 24 signed bits for USED <= 257; avr-gcc adds a
 * 16-bit product into __int24 with one instruction fewer than into int32. */
#if defined(__AVR__) && TP_BLOOM_USED <= 256
typedef __int24 tp_bloom_acc_t;
#else
typedef int32_t tp_bloom_acc_t;
#endif

TP_NOINLINE static int32_t tp_bloom_row(const int8_t *w, const uint8_t *phi)
{
    tp_bloom_acc_t acc = 0;
    for (uint16_t p = 0; p < TP_BLOOM_USED; ++p) {
        acc += tp_mul_s8u8(tp_next_i8(&w), phi[p]);
    }
    return (int32_t)acc;
}

uint8_t tp_stream_end(int32_t *scores)
{
    /* Compact phi to the used slots in place (p <= i): a slot reads 0 exactly when nothing hashes to it. */
    uint16_t p = 0;
    for (uint16_t i = 0; i < TP_BLOOM_M; ++i) {
        uint8_t v = tp_bloom_phi[i];
        if (v != 0) {
            tp_bloom_phi[p++] = v;
        }
    }
    const int8_t *w = tp_bloom_W;
    uint8_t label = 0;
    int32_t best = 0;
    for (uint8_t r = 0; r < TP_BLOOM_ROWS; ++r) {
#if TP_BLOOM_BIAS_BITS == 16
        int32_t bias = tp_read_i16(&tp_bloom_b[r]);
#else
#if defined(__AVR__)
        int32_t bias = (int32_t)pgm_read_dword(&tp_bloom_b[r]);
#else
        int32_t bias = tp_bloom_b[r];
#endif
#endif
        int32_t sum = bias + tp_bloom_row(w, tp_bloom_phi);
        w += TP_BLOOM_USED;
#if TP_N_CLASSES == 2
        scores[0] = 0;
        scores[1] = sum;
        label = (uint8_t)(sum > 0);
#else
        scores[r] = sum;
        if (r == 0 || sum > best) {
            best = sum;
            label = r;
        }
#endif
    }
    (void)best;
    tp_bloom_next = 0xFFFFu; /* phi is compacted: a feed without tp_stream_begin() re-walks from the seed */
    return label;
}

uint8_t tp_predict(const int8_t *x, int32_t *scores)
{
    tp_stream_begin();
    for (uint16_t first = 0; first < TP_N_FEATURES; first = (uint16_t)(first + 255u)) {
        uint16_t left = (uint16_t)(TP_N_FEATURES - first);
        tp_stream_feed(x + first, first, (uint8_t)(left > 255u ? 255u : left));
    }
    return tp_stream_end(scores);
}
