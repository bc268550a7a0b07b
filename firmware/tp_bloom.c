/* Bloom features inference (see tinyproto/families/bloom/quantize.py, whose IntBloom.scores() this file matches
 * bit for bit).
 *
 *   u_j     = clamp(x_j, -127, 127) + 128                    uint8 in 1..255, never 0
 *   phi_i   = max over (j, l) with h_l(j) = i of u_j          uint8 in static SRAM; 0 = no component hashes here
 *   phi'    = the non-zero phi_i in slot order                exactly TP_BLOOM_USED values (a property of the hash)
 *   s_r     = b_r + sum_p W[r][p] phi'_p                       int32; W int8 and b in flash
 *   scores  = s (L > 2), or (0, s_0) for two classes;  label = first maximum
 *
 * h_l(j) comes from xorshift16 (7, 9, 8) started at TP_BLOOM_SEED, walked feature by feature (see the slot map
 * below and tinyproto.families.bloom.train.seeded_slots): the hash costs no flash byte.
 *
 * Streaming (TP_STREAMABLE 1): tp_stream_begin() clears phi, tp_stream_feed() folds each arriving feature into
 * phi (K draws and K compares per feature) and forgets it, tp_stream_end() does the dot products. So
 * a 784-pixel image is never held: SRAM is M bytes of phi plus 4 of stream state. Features are expected in
 * order; a chunk that starts elsewhere re-walks the generator to its first feature, and since MAX is
 * idempotent a chunk sent twice changes nothing. tp_predict() runs the same three steps over a whole vector.
 * The state is static, so unlike ProtoNN's and FlyNN's tp_predict this one is not reentrant.
 *
 * The kernels here are the portable C reference; tp_bloom_avr.h holds the AVR twins of the generator step and the
 * row dot product, which tinyproto.h chooses on an AVR (TP_KERNELS_AVR; -DTP_FORCE_REFERENCE keeps the reference).
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

/* loop counters over the slots: 8 bits when they fit (a 16-bit count costs a cycle or two per step); the loops
 * are do-while with the count tested after the decrement, so an 8-bit count of 256 starts at 0 */
#if TP_BLOOM_M <= 256
typedef uint8_t tp_bloom_count_t;
#else
typedef uint16_t tp_bloom_count_t;
#endif
#ifdef TP_UNKNOWN_RANGE_LOW
/* The range check's signal (compile --unknown-rate; IntBloom.range_signal, core/confidence.py): S, the sum of phi
 * over the slots, each value shifted right by the header's TP_BLOOM_RANGE_SHIFT so S fits 16 bits.
 * tp_stream_end sums it while it compacts phi, from -TP_UNKNOWN_RANGE_LOW, and keeps one byte, the bin
 * (S - LOW) >> 8 (modulo 2^16), as the first byte of tp_range_signal; tp_judge declines the input when the bin is
 * TP_UNKNOWN_RANGE_BINS or more: S outside LOW .. LOW + 256 BINS - 1. Only such a model defines it, and only it
 * sums (nothing changes without the option). */
#if TP_KERNELS_AVR /* tp_judge's assembly reads it by name: kept, and global, under -flto (the Arduino IDE's) */
#define TP_BLOOM_ASM_READ __attribute__((used, externally_visible))
#else
#define TP_BLOOM_ASM_READ
#endif
#ifndef TP_BLOOM_RANGE_SHIFT
#error "a range check needs TP_BLOOM_RANGE_SHIFT from the model header (IntBloom.range_shift)"
#endif
#if TP_N_FEATURES > 0xFF00
#error "a range check keeps its bin beside a feature index of 0xFF00 or more: at most 65,280 features"
#endif
#endif
#if defined(TP_UNKNOWN_RANGE_LOW) && TP_KERNELS_AVR
/* On an AVR the bin rides in the stream's next-feature index, which tp_stream_end sets anyway to a value no
 * feature has (a feed without tp_stream_begin() then re-walks the generator from the seed): 0xFF00 | bin instead
 * of 0xFFFF, its low byte first, just before phi. tp_bloom_avr.h's compaction runs down phi and stores the two
 * bytes through its own pointer as it leaves (two st -Z: 4 B, where the index's own store and a separate byte's
 * took 16), and tp_judge reads the bin as tp_range_signal's first byte. */
struct tp_bloom_ranged {
    uint16_t next;              /* the feature index the generator state belongs to; after tp_stream_end 0xFF00 | bin */
    uint8_t phi[TP_BLOOM_M];    /* phi, compacted to its last TP_BLOOM_USED slots */
};
TP_BLOOM_ASM_READ struct tp_bloom_ranged tp_range_signal;
#define tp_bloom_phi (tp_range_signal.phi)
#define tp_bloom_next (tp_range_signal.next)
static uint16_t tp_bloom_state; /* generator state after the last fed feature's steps */
#else
static uint8_t tp_bloom_phi[TP_BLOOM_M];
#ifdef TP_UNKNOWN_RANGE_LOW
TP_BLOOM_ASM_READ uint8_t tp_range_signal;
#endif
static uint16_t tp_bloom_state; /* generator state after the last fed feature's steps */
static uint16_t tp_bloom_next;  /* the feature index the state belongs to */
#endif

#if TP_KERNELS_AVR
#include "tp_bloom_avr.h"
#endif

#ifndef TP_BLOOM_PHI_USED
#define TP_BLOOM_PHI_USED tp_bloom_phi /* the compacted phi' */
#endif

#ifndef TP_BLOOM_AVR_STEP
/* One xorshift16 (7, 9, 8) step. */
static inline __attribute__((always_inline)) uint16_t tp_bloom_step(uint16_t s)
{
    s ^= (uint16_t)(s << 7);
    s ^= (uint16_t)(s >> 9);
    s ^= (uint16_t)(s << 8);
    return s;
}
#endif

/* Draw -> slot, (v * M) >> bits (tinyproto.families.bloom.train.seeded_slots). M <= 256: every generator step
 * gives two byte draws, high byte first, and a byte maps with one 8x8 multiply (its high byte); a feature starts
 * on a fresh step, so an odd K leaves the last low byte unused and no half-used step is carried between
 * features. M > 256: one 16-bit draw per step. */
#if TP_BLOOM_M <= 256
#define TP_BLOOM_STEPS_PER_FEATURE ((TP_BLOOM_K + 1) / 2)
#if TP_BLOOM_M == 256
#define TP_BLOOM_SLOT(v) ((uint8_t)(v))
#else
#define TP_BLOOM_SLOT(v) ((uint8_t)(tp_mul_u8((uint8_t)(v), (uint8_t)TP_BLOOM_M) >> 8))
#endif
#else
#define TP_BLOOM_STEPS_PER_FEATURE TP_BLOOM_K
#define TP_BLOOM_SLOT(v) ((uint16_t)(((uint32_t)(v) * (uint32_t)TP_BLOOM_M) >> 16))
#endif
/* phi_slot = max(phi_slot, u) */
#define TP_BLOOM_MAX(v)                                                                                        \
    do {                                                                                                       \
        uint8_t *slot_ = &tp_bloom_phi[TP_BLOOM_SLOT(v)];                                                      \
        if (u > *slot_) {                                                                                      \
            *slot_ = u;                                                                                        \
        }                                                                                                      \
    } while (0)

void tp_stream_begin(void)
{
    /* four stores per loop step (st Z+ is 2 cycles, the loop 3) */
    uint8_t *p = tp_bloom_phi;
#if TP_BLOOM_M >= 4
    tp_bloom_count_t n = (tp_bloom_count_t)(TP_BLOOM_M / 4);
    do {
        p[0] = 0;
        p[1] = 0;
        p[2] = 0;
        p[3] = 0;
        p += 4;
    } while (--n != 0);
#endif
#if TP_BLOOM_M % 4 != 0
    for (uint8_t r = 0; r < TP_BLOOM_M % 4; ++r) {
        *p++ = 0;
    }
#endif
    tp_bloom_state = TP_BLOOM_SEED;
    tp_bloom_next = 0;
}

void tp_stream_feed(const int8_t *xq, uint16_t first, uint8_t n)
{
#ifdef TP_UNKNOWN_CLIPS
    tp_judge_inputs(xq, first, n); /* the clip check's count (tp_judge.c) */
#endif
    if (first != tp_bloom_next) { /* out of order: walk the generator from the seed to feature `first` */
        uint16_t s = TP_BLOOM_SEED;
        for (uint32_t t = (uint32_t)first * TP_BLOOM_STEPS_PER_FEATURE; t != 0; --t) {
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
#if TP_BLOOM_M <= 256
#if TP_BLOOM_K >= 2
        for (uint8_t l = 0; l < TP_BLOOM_K / 2; ++l) {
            s = tp_bloom_step(s);
            TP_BLOOM_MAX(s >> 8);
            TP_BLOOM_MAX(s);
        }
#endif
#if TP_BLOOM_K % 2 != 0
        s = tp_bloom_step(s);
        TP_BLOOM_MAX(s >> 8);
#endif
#else
        for (uint8_t l = 0; l < TP_BLOOM_K; ++l) {
            s = tp_bloom_step(s);
            TP_BLOOM_MAX(s);
        }
#endif
    }
    tp_bloom_state = s;
    tp_bloom_next = (uint16_t)(first + n);
}

#ifndef TP_BLOOM_AVR_ROW
/* sum_p W[p] phi'[p] for one row: W in flash, phi' in SRAM. */
TP_NOINLINE static int32_t tp_bloom_row(const int8_t *w, const uint8_t *phi)
{
    int32_t acc = 0;
    for (uint16_t p = 0; p < TP_BLOOM_USED; ++p) {
        acc += tp_mul_s8u8(tp_next_i8(&w), phi[p]);
    }
    return acc;
}
#endif

uint8_t tp_stream_end(int32_t *scores)
{
    /* Compact phi to the used slots in place (p <= i): a slot reads 0 exactly when nothing hashes to it. */
#ifdef TP_BLOOM_AVR_COMPACT
    /* to phi's last TP_BLOOM_USED slots (TP_BLOOM_PHI_USED), and tp_bloom_next = 0xFF00 | the bin */
    tp_bloom_compact((uint16_t)(0u - (uint16_t)TP_UNKNOWN_RANGE_LOW));
#else
    const uint8_t *src = tp_bloom_phi;
    uint8_t *dst = tp_bloom_phi;
    tp_bloom_count_t i = (tp_bloom_count_t)TP_BLOOM_M;
#ifdef TP_UNKNOWN_RANGE_LOW
    uint16_t range_sum = (uint16_t)(0u - (uint16_t)TP_UNKNOWN_RANGE_LOW); /* an unused slot is 0: adds nothing */
#endif
    do {
        uint8_t v = *src++;
#ifdef TP_UNKNOWN_RANGE_LOW
        range_sum = (uint16_t)(range_sum + (uint8_t)(v >> TP_BLOOM_RANGE_SHIFT));
#endif
        if (v != 0) {
            *dst++ = v;
        }
    } while (--i != 0);
#ifdef TP_UNKNOWN_RANGE_LOW
    tp_range_signal = (uint8_t)(range_sum >> 8);
#endif
#endif
    const int8_t *w = tp_bloom_W;
    uint8_t label = 0;
    int32_t best = 0;
    for (uint8_t r = 0; r < TP_BLOOM_ROWS; ++r) {
#if TP_BLOOM_BIAS_BITS == 16
        int32_t bias = tp_read_i16(&tp_bloom_b[r]);
#else
        int32_t bias = tp_read_i32(&tp_bloom_b[r]);
#endif
        int32_t sum = bias + tp_bloom_row(w, TP_BLOOM_PHI_USED);
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
#ifndef TP_BLOOM_AVR_COMPACT /* (its compaction stored 0xFF00 | the bin) */
    tp_bloom_next = 0xFFFFu; /* phi is compacted: a feed without tp_stream_begin() re-walks from the seed */
#endif
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
