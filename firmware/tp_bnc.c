/* BNC inference: an r-bit linear hash of the int8 input and the nearest of m binary prototypes in Hamming
 * distance (see tinyproto/families/bnc/quantize.py, whose IntBNC.scores() this file matches bit for bit).
 *
 *   p_k     = sum_i W[k, i] * x[i]             exact int32, k = 0 .. TP_BNC_BITS-1
 *   code    = bit k set <=> p_k >= 0           TP_BNC_BYTES bytes, LSB first (padding bits 0)
 *   dist_j  = popcount(code XOR b_j)           b_j: TP_BNC_BYTES bytes of tp_bnc_B in flash
 *   score_l = -min over class l's prototypes   classes own consecutive prototypes up to tp_bnc_class_end[l]
 *   return argmax_l score_l, ties to the lowest index
 *
 * W is stored row by row, dense int8 or a per-row bitmap over the d features plus the nonzeros. tp_predict()
 * projects one row at a time with the sum in registers. The streaming API (TP_STREAMABLE: tp_stream_begin /
 * tp_stream_feed / tp_stream_end) takes the features in arriving order and keeps r running sums (and, for a
 * sparse W, r offsets into the nonzeros) in static SRAM, never the input vector; both paths add the same exact
 * integers, so they give the same code and scores. The stream state is static: one stream at a time.
 * No popcount table: a byte's bits are counted with three mask-and-add steps, so every byte of flash data this
 * file holds is the model's (the ledger), and the cost does not depend on the input.
 *
 * The kernels here are the portable C reference; tp_bnc_avr.h holds the AVR twin of the bitmap-byte kernel, which
 * tinyproto.h chooses on an AVR (TP_KERNELS_AVR; -DTP_FORCE_REFERENCE keeps the reference there too).
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

/* Stage markers for tools/bench_latency.py (nothing in the normal build; see tinyproto.h). */
#define TP_STAGE_BNC_PROJECTION 0x50
#define TP_STAGE_BNC_HAMMING 0x51

#define TP_BNC_MASK_BYTES ((TP_N_FEATURES + 7) / 8) /* bitmap bytes per row of a sparse W */

#if TP_BNC_PROTOS <= 255
#define TP_BNC_END(l) ((uint16_t)tp_read_u8(&tp_bnc_class_end[l]))
#else
#define TP_BNC_END(l) ((uint16_t)tp_read_u16(&tp_bnc_class_end[l]))
#endif

static inline __attribute__((always_inline)) uint8_t tp_bnc_popcount(uint8_t v)
{
    v = (uint8_t)(v - ((v >> 1) & 0x55u));
    v = (uint8_t)((v & 0x33u) + ((v >> 2) & 0x33u));
    return (uint8_t)((v + (v >> 4)) & 0x0Fu);
}

/* ---- the nearest prototype of each class, from the r sums' signs ------------------------------------------ */
static uint8_t tp_bnc_classify(const uint8_t *code, int32_t *scores)
{
    TP_STAGE(TP_STAGE_BNC_HAMMING);
    const uint8_t *proto = tp_bnc_B;
    uint16_t j = 0;
    uint8_t best = 0;
    for (uint8_t l = 0; l < TP_N_CLASSES; ++l) {
        uint16_t end = TP_BNC_END(l);
        uint16_t nearest = 0xFFFFu;
        for (; j < end; ++j) {
            uint16_t dist = 0;
            const uint8_t *c = code;
            for (uint8_t b = 0; b < TP_BNC_BYTES; ++b) { /* at most 128 bytes */
                dist = (uint16_t)(dist + tp_bnc_popcount((uint8_t)(*c++ ^ tp_next_u8(&proto))));
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

#if !TP_BNC_W_SEEDED
/* ---- tp_predict: one row of W at a time ------------------------------------------------------------------- */
#if TP_BNC_W_DENSE
static TP_NOINLINE int32_t tp_bnc_row(const int8_t *x, const int8_t **w)
{
    const int8_t *p = *w;
    int32_t sum = 0;
    for (uint16_t i = 0; i < TP_N_FEATURES; ++i) {
        sum += tp_mul_s8(tp_next_i8(&p), x[i]);
    }
    *w = p;
    return sum;
}
#else
/* The row's bitmap picks the inputs; an all-zero bitmap byte skips its 8 inputs at once. */
#if TP_KERNELS_AVR
#include "tp_bnc_avr.h"
#endif
#ifndef TP_BNC_AVR_BYTE
/* One bitmap byte: for each set bit t, sum += W * x[t] (W: the row's next nonzero in flash). */
static inline void tp_bnc_byte(uint8_t bits, const int8_t *x, const int8_t **p, int32_t *sum)
{
    for (uint8_t t = 0; t < 8; ++t) {
        if (bits & (1u << t)) {
            *sum += tp_mul_s8(tp_next_i8(p), x[t]);
        }
    }
}
#endif

static inline __attribute__((always_inline)) int32_t tp_bnc_row(const int8_t *x, const uint8_t **mask, const int8_t **w)
{
    const uint8_t *m = *mask;
    const int8_t *p = *w;
    int32_t sum = 0;
    /* The last byte of a row may be partial: its padding bits are clear, so no input past d is read. */
    for (uint16_t b = 0; b < TP_BNC_MASK_BYTES; ++b, x += 8) {
        uint8_t bits = tp_next_u8(&m);
        if (bits != 0) {
            tp_bnc_byte(bits, x, &p, &sum);
        }
    }
    *mask = m;
    *w = p;
    return sum;
}
#endif

/* All r rows into the packed code, in one call: the row loop is inlined so registers are saved once, and the
 * function has no frame of its own, which leaves the Y pointer to the bitmap kernel. */
static TP_NOINLINE void tp_bnc_project(const int8_t *x, uint8_t *code)
{
#if TP_BNC_W_DENSE
    const int8_t *w = tp_bnc_W;
#else
    const uint8_t *mask = tp_bnc_W_mask;
    const int8_t *w = tp_bnc_W_values;
#endif
    uint16_t k = 0;
    for (uint8_t b = 0; b < TP_BNC_BYTES; ++b) {
        uint8_t byte = 0;
        for (uint8_t bit = 1; bit != 0 && k < TP_BNC_BITS; bit = (uint8_t)(bit << 1), ++k) {
#if TP_BNC_W_DENSE
            int32_t sum = tp_bnc_row(x, &w);
#else
            int32_t sum = tp_bnc_row(x, &mask, &w);
#endif
            if (sum >= 0) {
                byte |= bit;
            }
        }
        code[b] = byte;
    }
}

#else /* TP_BNC_W_SEEDED: W's positions regenerated from TP_BNC_SEED (tinyproto/families/bnc/pattern.py) */

#if TP_BNC_K < 1 || TP_BNC_K > 255 || TP_BNC_K > TP_N_FEATURES
#error "TP_BNC_K must be 1..min(255, TP_N_FEATURES)"
#endif
#define TP_BNC_SEG_Q ((uint16_t)(TP_N_FEATURES / TP_BNC_K))
#define TP_BNC_SEG_R ((uint16_t)(TP_N_FEATURES % TP_BNC_K))
#if (TP_N_FEATURES + TP_BNC_K - 1) / TP_BNC_K > 255
#error "a seeded W needs segments of at most 255 features: TP_BNC_K >= TP_N_FEATURES / 255"
#endif

/* (s * len) >> 16 for len <= 255 from two 8 x 8 multiplies: floor((hi * len + floor(lo * len / 256)) / 256).
 * (avr-gcc turns the plain 32-bit expression into a 14-step shift loop when len's range is a power of two.) */
static inline __attribute__((always_inline)) uint16_t tp_bnc_scale(uint16_t s, uint8_t len)
{
    uint16_t high = tp_mul_u8((uint8_t)(s >> 8), len);
    uint16_t low = tp_mul_u8((uint8_t)s, len);
    return (uint16_t)((uint16_t)(high + (low >> 8)) >> 8);
}

/* Where a row's next weight sits: the next xorshift16 state picks an offset in the next segment of the d
 * features; segment lengths are d / K or d / K + 1, stepped without a division (acc carries d % K). */
typedef struct {
    uint16_t state; /* xorshift16 state before this weight */
    uint16_t start; /* first feature of this weight's segment */
    uint16_t acc;   /* (t * (d % K)) mod K */
    uint8_t t;      /* weights of the row consumed (the stream) */
} tp_bnc_cursor_t;

static inline __attribute__((always_inline)) uint16_t tp_bnc_xorshift(uint16_t s)
{
    s ^= (uint16_t)(s << 7);
    s ^= (uint16_t)(s >> 9);
    s ^= (uint16_t)(s << 8);
    return s;
}

/* The feature index of the cursor's next weight; *len, *acc and *state get what advancing to it sets. */
static inline __attribute__((always_inline)) uint16_t tp_bnc_peek(const tp_bnc_cursor_t *c, uint16_t *len, uint16_t *acc,
                                                                  uint16_t *state)
{
    uint16_t a = (uint16_t)(c->acc + TP_BNC_SEG_R);
    uint16_t l = TP_BNC_SEG_Q;
    if (a >= TP_BNC_K) {
        a = (uint16_t)(a - TP_BNC_K);
        ++l;
    }
    uint16_t s = tp_bnc_xorshift(c->state);
    *len = l;
    *acc = a;
    *state = s;
    return (uint16_t)(c->start + tp_bnc_scale(s, (uint8_t)l));
}

static TP_NOINLINE void tp_bnc_project(const int8_t *x, uint8_t *code)
{
    const int8_t *w = tp_bnc_W_values;
    tp_bnc_cursor_t c;
    c.state = TP_BNC_SEED;
    c.t = 0;
    uint16_t k = 0;
    for (uint8_t b = 0; b < TP_BNC_BYTES; ++b) {
        uint8_t byte = 0;
        for (uint8_t bit = 1; bit != 0 && k < TP_BNC_BITS; bit = (uint8_t)(bit << 1), ++k) {
            int32_t sum = 0;
            c.start = 0;
            c.acc = 0;
            for (uint8_t t = 0; t < TP_BNC_K; ++t) {
                uint16_t len, acc, state;
                uint16_t i = tp_bnc_peek(&c, &len, &acc, &state);
                sum += tp_mul_s8(tp_next_i8(&w), x[i]);
                c.start = (uint16_t)(c.start + len);
                c.acc = acc;
                c.state = state;
            }
            if (sum >= 0) {
                byte |= bit;
            }
        }
        code[b] = byte;
    }
}
#endif /* TP_BNC_W_SEEDED */

uint8_t tp_predict(const int8_t *x, int32_t *scores)
{
#ifdef TP_UNKNOWN_CLIPS
    tp_judge_inputs(x, 0, TP_N_FEATURES); /* the clip check's count (tp_judge.c) */
#endif
    uint8_t code[TP_BNC_BYTES];
    TP_STAGE(TP_STAGE_BNC_PROJECTION);
    tp_bnc_project(x, code);
    return tp_bnc_classify(code, scores);
}

/* ---- the stream: r running sums, features in arriving order ---------------------------------------------- */
static int32_t tp_bnc_sums[TP_BNC_BITS];
/* A vector that arrives as one chunk (d <= the transport's chunk) goes through tp_bnc_project() itself, as fast
 * as tp_predict(); its code waits here for tp_stream_end(). */
static uint8_t tp_bnc_code[TP_BNC_BYTES];
static uint8_t tp_bnc_whole;

/* The whole vector at once: 1 if it took it. */
static uint8_t tp_bnc_feed_whole(const int8_t *xq, uint16_t first, uint8_t n)
{
    uint16_t count = n; /* 16 bits: d may exceed any uint8 n */
    tp_bnc_whole = (uint8_t)(first == 0 && count == TP_N_FEATURES);
    if (tp_bnc_whole) {
        tp_bnc_project(xq, tp_bnc_code);
    }
    return tp_bnc_whole;
}
#if !TP_BNC_W_SEEDED
#if !TP_BNC_W_DENSE
static uint16_t tp_bnc_next[TP_BNC_BITS]; /* per row: offset of its next nonzero in tp_bnc_W_values */
static uint16_t tp_bnc_fed;               /* features consumed so far (a chunk must start there) */
#endif

/* Nothing to precompute: the first chunk starts every sum at 0 and (sparse W) finds each row's nonzeros with
 * one running pointer through tp_bnc_W_values, so a vector that arrives as one chunk costs about what
 * tp_predict() costs. */
void tp_stream_begin(void)
{
    tp_bnc_whole = 0;
#if !TP_BNC_W_DENSE
    tp_bnc_fed = 0;
#else
    for (uint16_t k = 0; k < TP_BNC_BITS; ++k) {
        tp_bnc_sums[k] = 0;
    }
#endif
}

#if !TP_BNC_W_DENSE
/* Nonzeros of a row from feature `from` to its end (the first chunk skips them to reach the next row). */
static TP_NOINLINE uint16_t tp_bnc_rest_of_row(const uint8_t *row_mask, uint16_t from)
{
    uint16_t count = 0;
    if (from & 7u) {
        count = tp_bnc_popcount((uint8_t)(tp_read_u8(&row_mask[from >> 3]) >> (from & 7u)));
        from = (uint16_t)((from | 7u) + 1u);
    }
    for (uint16_t b = (uint16_t)(from >> 3); b < TP_BNC_MASK_BYTES; ++b) {
        count = (uint16_t)(count + tp_bnc_popcount(tp_read_u8(&row_mask[b])));
    }
    return count;
}

/* One row's part of a byte-aligned chunk through tp_predict()'s bitmap kernel (out of line: a small frame-free
 * function keeps the Y pointer for the kernel whatever the caller's register pressure). */
static TP_NOINLINE int32_t tp_bnc_part(const int8_t *x, const uint8_t *m, uint8_t bytes, const int8_t **p,
                                       int32_t sum)
{
    const int8_t *q = *p;
    for (uint8_t b = 0; b < bytes; ++b, x += 8) {
        uint8_t bits = tp_next_u8(&m);
        if (bits != 0) {
            tp_bnc_byte(bits, x, &q, &sum);
        }
    }
    *p = q;
    return sum;
}

/* Every row's part of a byte-aligned chunk. The first chunk starts the sums at 0 and walks the nonzeros with
 * one pointer (skipping each row's rest), later chunks resume from each row's offset. */
static TP_NOINLINE void tp_bnc_feed_aligned(const int8_t *xq, uint16_t first, uint8_t bytes)
{
    const uint8_t *row_mask = &tp_bnc_W_mask[first >> 3];
    const int8_t *p = tp_bnc_W_values;
    for (uint16_t k = 0; k < TP_BNC_BITS; ++k, row_mask += TP_BNC_MASK_BYTES) {
        int32_t sum = 0;
        if (first != 0) {
            sum = tp_bnc_sums[k];
            p = &tp_bnc_W_values[tp_bnc_next[k]];
        }
        tp_bnc_sums[k] = tp_bnc_part(xq, row_mask, bytes, &p, sum);
        tp_bnc_next[k] = (uint16_t)(p - tp_bnc_W_values);
        if (first == 0 && (uint16_t)(8u * bytes) < TP_N_FEATURES) {
            p += tp_bnc_rest_of_row(row_mask, (uint16_t)(8u * bytes));
        }
    }
}

/* Any other cut of the features (the contract allows any chunking): bit by bit. */
static TP_NOINLINE void tp_bnc_feed_bits(const int8_t *xq, uint16_t first, uint8_t n)
{
    const uint8_t *row_mask = tp_bnc_W_mask;
    const int8_t *p = tp_bnc_W_values;
    for (uint16_t k = 0; k < TP_BNC_BITS; ++k, row_mask += TP_BNC_MASK_BYTES) {
        int32_t sum = 0;
        if (first != 0) {
            sum = tp_bnc_sums[k];
            p = &tp_bnc_W_values[tp_bnc_next[k]];
        }
        for (uint8_t j = 0; j < n; ++j) {
            uint16_t i = (uint16_t)(first + j);
            if ((tp_read_u8(&row_mask[i >> 3]) >> (i & 7u)) & 1u) {
                sum += tp_mul_s8(tp_next_i8(&p), xq[j]);
            }
        }
        tp_bnc_sums[k] = sum;
        tp_bnc_next[k] = (uint16_t)(p - tp_bnc_W_values);
        uint16_t fed = n;
        if (first == 0 && fed < TP_N_FEATURES) {
            p += tp_bnc_rest_of_row(row_mask, fed);
        }
    }
}
#endif

void tp_stream_feed(const int8_t *xq, uint16_t first, uint8_t n)
{
#ifdef TP_UNKNOWN_CLIPS
    tp_judge_inputs(xq, first, n); /* the clip check's count (tp_judge.c) */
#endif
    if (first >= TP_N_FEATURES) {
        return;
    }
    if ((uint32_t)first + n > TP_N_FEATURES) {
        n = (uint8_t)(TP_N_FEATURES - first);
    }
    if (tp_bnc_feed_whole(xq, first, n)) {
#if !TP_BNC_W_DENSE
        tp_bnc_fed = n;
#endif
        return;
    }
#if TP_BNC_W_DENSE
    const int8_t *row = &tp_bnc_W[first];
    for (uint16_t k = 0; k < TP_BNC_BITS; ++k, row += TP_N_FEATURES) {
        const int8_t *p = row;
        int32_t sum = tp_bnc_sums[k];
        for (uint8_t j = 0; j < n; ++j) {
            sum += tp_mul_s8(tp_next_i8(&p), xq[j]);
        }
        tp_bnc_sums[k] = sum;
    }
#else
    if (first != tp_bnc_fed) {
        return; /* out of order: the contract is features in order; the scores then show a broken stream */
    }
    if ((first & 7u) == 0 && ((n & 7u) == 0 || first + n == TP_N_FEATURES)) {
        tp_bnc_feed_aligned(xq, first, (uint8_t)((n + 7u) >> 3)); /* a partial last byte: its padding is clear */
    } else {
        tp_bnc_feed_bits(xq, first, n);
    }
    tp_bnc_fed = (uint16_t)(first + n);
#endif
}
#else /* TP_BNC_W_SEEDED: a cursor per row; positions are increasing, so a chunk consumes a prefix of each */
static tp_bnc_cursor_t tp_bnc_cursors[TP_BNC_BITS];
static uint16_t tp_bnc_fed;

/* Each row's first PRNG state: the first chunk of a vector that comes in several sets them (r x K steps), so a
 * one-chunk vector never pays for them. */
static void tp_bnc_cursors_start(void)
{
    uint16_t state = TP_BNC_SEED;
    for (uint16_t k = 0; k < TP_BNC_BITS; ++k) {
        tp_bnc_sums[k] = 0;
        tp_bnc_cursors[k].state = state;
        tp_bnc_cursors[k].start = 0;
        tp_bnc_cursors[k].acc = 0;
        tp_bnc_cursors[k].t = 0;
        for (uint8_t t = 0; t < TP_BNC_K; ++t) {
            state = tp_bnc_xorshift(state);
        }
    }
}

void tp_stream_begin(void)
{
    tp_bnc_whole = 0;
    tp_bnc_fed = 0;
}

void tp_stream_feed(const int8_t *xq, uint16_t first, uint8_t n)
{
#ifdef TP_UNKNOWN_CLIPS
    tp_judge_inputs(xq, first, n); /* the clip check's count (tp_judge.c) */
#endif
    if (first >= TP_N_FEATURES || first != tp_bnc_fed) {
        return; /* past the end, or out of order (the contract is features in order) */
    }
    if ((uint32_t)first + n > TP_N_FEATURES) {
        n = (uint8_t)(TP_N_FEATURES - first);
    }
    if (tp_bnc_feed_whole(xq, first, n)) {
        tp_bnc_fed = n;
        return;
    }
    if (first == 0) {
        tp_bnc_cursors_start();
    }
    uint16_t end = (uint16_t)(first + n);
    for (uint16_t k = 0; k < TP_BNC_BITS; ++k) {
        tp_bnc_cursor_t *c = &tp_bnc_cursors[k];
        int32_t sum = tp_bnc_sums[k];
        while (c->t < TP_BNC_K) {
            uint16_t len, acc, state;
            uint16_t i = tp_bnc_peek(c, &len, &acc, &state);
            if (i >= end) {
                break;
            }
            sum += tp_mul_s8(tp_read_i8(&tp_bnc_W_values[(uint32_t)k * TP_BNC_K + c->t]), xq[i - first]);
            c->start = (uint16_t)(c->start + len);
            c->acc = acc;
            c->state = state;
            ++c->t;
        }
        tp_bnc_sums[k] = sum;
    }
    tp_bnc_fed = end;
}
#endif /* TP_BNC_W_SEEDED */

uint8_t tp_stream_end(int32_t *scores)
{
    if (tp_bnc_whole) {
        return tp_bnc_classify(tp_bnc_code, scores);
    }
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
    return tp_bnc_classify(code, scores);
}
