/* libFuzzer harness for the LEARNING firmware: firmware/tp_main.c built with TP_FLYNN_LEARN (LEARN, READ_COUNTS,
 * CLEAR, EEPROM_SAVE, EEPROM_LOAD besides HELLO / PREDICT / STATS), a learnable FlyNN model from
 * tools/fuzz/models/ and the host build's in-memory EEPROM (tp_ee_image), which the input can also tamper with.
 *
 * Input: the first byte picks the mode, as in fuzz_serial.c.
 *   odd  : the rest is a raw byte stream fed to the device as is (COBS, CRC, resync, overlong frames);
 *   even : the rest is records [type][seq][len][len payload bytes]. Most are sent as valid frames (0x00 + COBS +
 *          CRC) so every handler runs on arbitrary payloads; three record types are harness operations instead
 *          (the device treats those types like any other unknown type, which plenty of other values exercise):
 *            HOP_REBOOT  power cycle: SRAM restarts (flash counts, n_samples 0), the EEPROM keeps its bytes;
 *            HOP_TAMPER  payload (addr_lo, addr_hi, xor)*: flip EEPROM bits, e.g. inside a saved record;
 *            HOP_PLANT   payload n_samples u32 + count bytes (zero-padded): write a VALID record of those counts,
 *                        so a LOAD of arbitrary counts (and n_samples up to 0xFFFFFFFF) is one record away.
 *
 * Oracle, beyond ASan + UBSan: a shadow parser reads the same bytes the device does, so the harness knows every
 * frame the device completes. Each completed (non-empty) frame must get exactly one well-formed answer with the
 * request's seq, nothing else may be sent, and the answer plus the device's state afterwards (SRAM counts,
 * n_samples, EEPROM) must match an independent model of the protocol (docs/design.md, tp_main.c's comments):
 * errors change nothing (and STATS counts them), LEARN adds +1 (saturating) to at most rho counts of its class
 * only (a LEARN repeating the seq of the one just learned is answered again and changes nothing), READ_COUNTS
 * returns the SRAM bytes, PREDICT's label is the argmin of scores that a class of equal counts
 * fixes exactly, a saved record loads back, a tampered one does not, EEPROM writes stay inside the record.
 * Any violation aborts (a "crash" for libFuzzer).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define TP_PORT_CUSTOM
#include "tp_main.c"
#include "tp_learn.c"
#include "tp_measure.c"
#include "tp_transport.c"

#ifndef TP_FLYNN_LEARN
#error "fuzz_learn.c is the learning firmware's harness: build it with -DTP_FLYNN_LEARN (tools/fuzz/models/*/cflags)"
#endif

#define HOP_REBOOT 0xEE
#define HOP_TAMPER 0xED
#define HOP_PLANT 0xEC

#define CB TP_FLYNN_COUNT_BYTES
#define FIELD_MAX ((1u << TP_FLYNN_BITS) - 1u)

/* ---- what the device sends ---------------------------------------------------------------------------------- */
#define OUT_CAP 4096u /* one answer at a time: far more than the largest (the frame buffer, COBS-encoded) */
static uint8_t out_bytes[OUT_CAP];
static size_t out_len;

void tp_port_putc(uint8_t c)
{
    if (out_len >= OUT_CAP) {
        abort(); /* an answer larger than any frame the device can build */
    }
    out_bytes[out_len++] = c;
}

void tp_port_flush(void)
{
}

/* ---- the harness's view of the device: shadow parser and state snapshot -------------------------------------- */
static uint8_t shadow_buf[TP_BUF_SIZE]; /* same capacity as the device's parser, so the same verdicts */
static tp_parser_t shadow;

typedef struct {
    uint8_t counts[CB];
    uint32_t samples;
    uint8_t ee[TP_EEPROM_BYTES];
} state_t;

static state_t before;
static uint32_t errors_sent; /* ERROR frames since boot: what STATS must report as frames_bad (saturating) */

static void snapshot(state_t *s)
{
    memcpy(s->counts, tp_flynn_counts, CB);
    s->samples = tp_learn_samples;
    memcpy(s->ee, tp_ee_image, sizeof s->ee);
}

static void expect(int ok)
{
    if (!ok) {
        abort();
    }
}

static void expect_counts_unchanged(void)
{
    expect(memcmp(before.counts, tp_flynn_counts, CB) == 0 && before.samples == tp_learn_samples);
}

static void expect_eeprom_unchanged(void)
{
    expect(memcmp(before.ee, tp_ee_image, sizeof before.ee) == 0);
}

static void expect_unchanged(void)
{
    expect_counts_unchanged();
    expect_eeprom_unchanged();
}

/* The b-bit count of (row j, class l): bit (j * L + l) * b, LSB first -- read bit by bit, deliberately unlike the
 * firmware's windowed access, so a packing bug does not cancel out. */
static uint8_t field(const uint8_t *counts, uint32_t j, uint32_t l)
{
    uint32_t bit = (j * TP_N_CLASSES + l) * TP_FLYNN_BITS;
    uint8_t v = 0;
    for (uint8_t k = 0; k < TP_FLYNN_BITS; ++k, ++bit) {
        v = (uint8_t)(v | (((counts[bit >> 3] >> (bit & 7u)) & 1u) << k));
    }
    return v;
}

/* ---- the answer to one completed frame ----------------------------------------------------------------------- */
typedef struct {
    uint8_t type;
    uint8_t seq;
    const uint8_t *p; /* payload */
    uint16_t n;       /* payload bytes */
} msg_t;

/* The device's output since the frame completed must be exactly one valid frame. */
static msg_t parse_answer(void)
{
    static uint8_t body[OUT_CAP];
    tp_parser_t p;
    tp_parser_init(&p, body, sizeof body);
    expect(out_len >= 1 && out_bytes[out_len - 1] == 0);
    for (size_t i = 0; i + 1 < out_len; ++i) {
        expect(out_bytes[i] != 0); /* one frame only: no delimiter before the last byte */
        expect(tp_parser_feed(&p, out_bytes[i]) == TP_RX_NONE);
    }
    expect(tp_parser_feed(&p, 0) == TP_RX_FRAME);
    msg_t m = {body[0], body[1], body + 2, (uint16_t)(p.len - TP_FRAME_OVERHEAD)};
    return m;
}

static void expect_error(msg_t a, uint8_t code)
{
    expect(a.type == TP_MSG_ERROR && a.n == 1 && a.p[0] == code);
    expect_unchanged();
}

static void check_stats(msg_t a)
{
    expect(a.type == (TP_MSG_STATS | TP_MSG_RESPONSE) && a.n == 6);
    expect(tp_get_u16(a.p + 4) == (errors_sent > UINT16_MAX ? UINT16_MAX : errors_sent));
    expect_unchanged();
}

/* Payload length of a request type, from the protocol description; -1: this firmware must not know the type. */
static long request_payload(uint8_t type)
{
    switch (type) {
    case TP_MSG_HELLO:
    case TP_MSG_STATS:
    case TP_MSG_CLEAR:
        return 0;
    case TP_MSG_PREDICT:
    case TP_MSG_LEARN:
        return TP_CHUNK_BYTES; /* chunked: any length up to a chunk, see check_chunk() */
    case TP_MSG_READ_COUNTS:
        return 3;
#ifdef TP_FLYNN_EEPROM
    case TP_MSG_EEPROM_SAVE:
    case TP_MSG_EEPROM_LOAD:
        return 0;
#endif
    default:
        return -1; /* PREDICT_RAW included: the learning firmware is built with TP_NO_RAW_INPUT */
    }
}

static void check_hello(msg_t a)
{
    expect(a.type == (TP_MSG_HELLO | TP_MSG_RESPONSE) && a.n == TP_HELLO_PAYLOAD);
    expect(memcmp(a.p, "TPRO", 4) == 0 && a.p[6] == TP_FAMILY_ID && tp_get_u16(a.p + 11) == TP_N_FEATURES);
#ifdef TP_FLYNN_EEPROM
    expect(a.p[20] == (TP_HELLO_FLAG_LEARN | TP_HELLO_FLAG_EEPROM));
#else
    expect(a.p[20] == TP_HELLO_FLAG_LEARN);
#endif
    expect_unchanged();
}

/* Novelty of one count: 1 for a zero bit with 1-bit counts, else the decay table's entry. */
static uint32_t novelty(uint8_t t)
{
#if TP_FLYNN_BITS == 1
    return t == 0;
#else
    return tp_read_u8(&tp_flynn_lut[t]);
#endif
}

/* If every count of class l holds the same value, its score is rho times that value's novelty whatever the
 * winners are (CLEAR and saturated records make this common); UINT32_MAX if the counts differ. */
static uint32_t uniform_score(uint8_t l)
{
    uint8_t t = field(tp_flynn_counts, 0, l);
    for (uint32_t j = 1; j < TP_FLYNN_M; ++j) {
        if (field(tp_flynn_counts, j, l) != t) {
            return UINT32_MAX;
        }
    }
    return TP_FLYNN_RHO * novelty(t);
}

/* Scores are novelty sums of rho look-ups of at most 255 each; the label is their argmin, ties to the lowest. */
static void check_predict(msg_t a)
{
    expect(a.type == (TP_MSG_PREDICT | TP_MSG_RESPONSE) && a.n == (uint32_t)TP_PRED_HEAD + 4u * TP_N_CLASSES);
    uint8_t best = 0;
    for (uint8_t l = 0; l < TP_N_CLASSES; ++l) {
        uint32_t s = tp_get_u32(a.p + (uint32_t)TP_PRED_HEAD + 4u * l);
        uint32_t uniform = uniform_score(l);
        expect(s <= 255u * TP_FLYNN_RHO && (uniform == UINT32_MAX || s == uniform));
        if (s < tp_get_u32(a.p + (uint32_t)TP_PRED_HEAD + 4u * best)) {
            best = l;
        }
    }
    expect(a.p[0] == best);
    expect_unchanged();
}

/* The LEARN just learned, until the next well-formed request: a LEARN with its seq gets its answer again. */
static int h_learned_live;
static uint8_t h_learned_seq;
static uint8_t h_learned_answer[8];
static uint8_t h_seq; /* the seq of the request being checked */

/* LEARN: one +1 per winner (rho rows) on the sample's class, saturating; nothing else moves. */
static void check_learn(msg_t a, const uint8_t *req)
{
    uint8_t label = req[0];
    if (label >= TP_N_CLASSES) {
        expect_error(a, TP_ERR_ARGUMENT);
        return;
    }
    expect(a.type == (TP_MSG_LEARN | TP_MSG_RESPONSE) && a.n == 8);
    uint32_t samples = before.samples == UINT32_MAX ? UINT32_MAX : before.samples + 1u;
    expect(tp_learn_samples == samples && tp_get_u32(a.p) == samples);
    uint32_t raised = 0;
    int any_saturated = 0;
    for (uint32_t j = 0; j < TP_FLYNN_M; ++j) {
        for (uint32_t l = 0; l < TP_N_CLASSES; ++l) {
            uint8_t old = field(before.counts, j, l);
            uint8_t now = field(tp_flynn_counts, j, l);
            if (l != label) {
                expect(now == old);
                continue;
            }
            any_saturated |= old == FIELD_MAX;
            expect(now == old || now == old + 1u);
            raised += now != old;
        }
    }
    /* every winner is a distinct row: exactly rho counts rise unless some were already at the ceiling */
    expect(any_saturated ? raised <= TP_FLYNN_RHO : raised == TP_FLYNN_RHO);
    h_learned_live = 1;
    h_learned_seq = h_seq;
    memcpy(h_learned_answer, a.p, sizeof h_learned_answer);
    /* padding bits after the last field belong to no count */
    uint32_t used = (uint32_t)TP_FLYNN_M * TP_N_CLASSES * TP_FLYNN_BITS;
    if (used & 7u) {
        uint8_t pad = (uint8_t)(0xFFu << (used & 7u));
        expect(((before.counts[CB - 1] ^ tp_flynn_counts[CB - 1]) & pad) == 0);
    }
    expect_eeprom_unchanged();
}

static void check_read_counts(msg_t a, const uint8_t *req)
{
    uint16_t offset = tp_get_u16(req);
    if (offset > CB) {
        expect_error(a, TP_ERR_ARGUMENT);
        return;
    }
    uint32_t n = req[2];
    if (n > CB - offset) {
        n = CB - offset;
    }
    if (n > TP_BUF_SIZE - TP_FRAME_OVERHEAD - 2u) { /* what one answer frame can carry */
        n = TP_BUF_SIZE - TP_FRAME_OVERHEAD - 2u;
    }
    expect(a.type == (TP_MSG_READ_COUNTS | TP_MSG_RESPONSE) && a.n == 2u + n && tp_get_u16(a.p) == CB);
    expect(memcmp(a.p + 2, tp_flynn_counts + offset, n) == 0);
    expect_unchanged();
}

static void check_clear(msg_t a)
{
    expect(a.type == (TP_MSG_CLEAR | TP_MSG_RESPONSE) && a.n == 0 && tp_learn_samples == 0);
    for (uint16_t i = 0; i < CB; ++i) {
        expect(tp_flynn_counts[i] == 0);
    }
    expect_eeprom_unchanged();
}

#ifdef TP_FLYNN_EEPROM
#define REC_AT TP_FLYNN_EEPROM_ADDR
#define REC_BYTES (TP_EE_HEADER + CB)

/* The record of (counts, samples), laid out from the format comment in tp_main.c. */
static void make_record(uint8_t *rec, const uint8_t *counts, uint32_t samples)
{
    rec[0] = 'T';
    rec[1] = 'F';
    tp_put_u32(rec + 2, (uint32_t)TP_FLYNN_LAYOUT_KEY);
    tp_put_u16(rec + 6, CB);
    tp_put_u32(rec + 8, samples);
    memcpy(rec + TP_EE_HEADER, counts, CB);
    tp_put_u16(rec + 12, tp_crc16(tp_crc16(0xFFFFu, rec + 8, 4), rec + TP_EE_HEADER, CB));
}

/* What EEPROM_LOAD must answer for this EEPROM image. */
static uint8_t record_status(const uint8_t *ee)
{
    const uint8_t *r = ee + REC_AT;
    if (r[0] != 'T' || r[1] != 'F') {
        return TP_EEPROM_EMPTY;
    }
    if (tp_get_u32(r + 2) != (uint32_t)TP_FLYNN_LAYOUT_KEY || tp_get_u16(r + 6) != CB) {
        return TP_EEPROM_OTHER;
    }
    uint16_t crc = tp_crc16(tp_crc16(0xFFFFu, r + 8, 4), r + TP_EE_HEADER, CB);
    return crc == tp_get_u16(r + 12) ? TP_EEPROM_LOADED : TP_EEPROM_EMPTY;
}

/* SAVE: the image afterwards is the old one with the record of the current counts in place; `written` counts
 * the bytes that differed (only those are written: EEPROM wear). */
static void check_save(msg_t a)
{
    static uint8_t rec[REC_BYTES];
    expect(a.type == (TP_MSG_EEPROM_SAVE | TP_MSG_RESPONSE) && a.n == 4 && tp_get_u16(a.p + 2) == REC_BYTES);
    make_record(rec, before.counts, before.samples);
    uint16_t differ = 0;
    for (uint16_t i = 0; i < REC_BYTES; ++i) {
        differ = (uint16_t)(differ + (before.ee[REC_AT + i] != rec[i]));
    }
    expect(tp_get_u16(a.p) == differ);
    expect(memcmp(tp_ee_image + REC_AT, rec, REC_BYTES) == 0);
    expect(memcmp(tp_ee_image, before.ee, REC_AT) == 0);
    expect(memcmp(tp_ee_image + REC_AT + REC_BYTES, before.ee + REC_AT + REC_BYTES,
                  TP_EEPROM_BYTES - REC_AT - REC_BYTES) == 0);
    expect_counts_unchanged();
}

static void check_load(msg_t a)
{
    uint8_t status = record_status(before.ee);
    expect(a.type == (TP_MSG_EEPROM_LOAD | TP_MSG_RESPONSE) && a.n == 5 && a.p[0] == status);
    if (status == TP_EEPROM_LOADED) {
        expect(memcmp(tp_flynn_counts, before.ee + REC_AT + TP_EE_HEADER, CB) == 0);
        expect(tp_learn_samples == tp_get_u32(before.ee + REC_AT + 8));
    } else {
        expect_counts_unchanged();
    }
    expect(tp_get_u32(a.p + 1) == tp_learn_samples);
    expect_eeprom_unchanged();
}
#endif /* TP_FLYNN_EEPROM */

/* The harness's own model of the vector under way (the protocol description, not the firmware's variables). */
static uint16_t h_next;
static uint8_t h_type;

/* PREDICT (first u16 | int8[k]) and LEARN (label u8 | first u16 | int8[k]): a chunk that starts (first 0) or
 * continues the vector under way is acknowledged with an empty answer, the last one gets the full answer; a
 * chunk past the features is a length error, one out of order an argument error, and neither changes anything. */
static void check_chunk(uint8_t type, const uint8_t *req, uint16_t n, msg_t a)
{
    uint16_t head = type == TP_MSG_LEARN ? 3u : 2u;
    if (n <= head || n > head + TP_CHUNK_BYTES) {
        expect_error(a, TP_ERR_LENGTH);
        return;
    }
    uint16_t first = tp_get_u16(req + head - 2u);
    uint16_t k = (uint16_t)(n - head);
    if (first > TP_N_FEATURES || k > TP_N_FEATURES - first) {
        expect_error(a, TP_ERR_LENGTH);
        return;
    }
    if (first != 0 && (first != h_next || type != h_type)) {
        expect_error(a, TP_ERR_ARGUMENT);
        return;
    }
    if (type == TP_MSG_LEARN && req[0] >= TP_N_CLASSES) {
        expect_error(a, TP_ERR_ARGUMENT);
        return;
    }
    int last = first + k == TP_N_FEATURES;
    h_next = last ? 0 : (uint16_t)(first + k);
    h_type = last ? 0 : type;
    if (!last) {
        expect(a.type == (type | TP_MSG_RESPONSE) && a.n == 0);
        expect_unchanged();
    } else if (type == TP_MSG_PREDICT) {
        check_predict(a);
    } else {
        check_learn(a, req);
    }
}

/* A frame with a valid CRC: the answer and the state must follow the protocol. */
static void check_request(const uint8_t *body, uint16_t n, msg_t a)
{
    uint8_t type = body[0];
    const uint8_t *req = body + 2;
    long want = request_payload(type);
    int well_formed = type == TP_MSG_PREDICT ? n > 2u && n <= 2u + TP_CHUNK_BYTES
                      : type == TP_MSG_LEARN ? n > 3u && n <= 3u + TP_CHUNK_BYTES
                                             : want >= 0 && n == want;
    if (well_formed && h_learned_live && type == TP_MSG_LEARN && body[1] == h_learned_seq) {
        expect(a.type == (TP_MSG_LEARN | TP_MSG_RESPONSE) && a.n == 8 && memcmp(a.p, h_learned_answer, 8) == 0);
        expect_unchanged();
        return;
    }
    if (well_formed) {
        h_learned_live = 0;
    }
    h_seq = body[1];
    if (type == TP_MSG_PREDICT || type == TP_MSG_LEARN) {
        check_chunk(type, req, n, a);
    } else if (want < 0) {
        expect_error(a, TP_ERR_UNKNOWN_TYPE);
    } else if (n != want) {
        expect_error(a, TP_ERR_LENGTH);
    } else if (type == TP_MSG_HELLO) {
        check_hello(a);
    } else if (type == TP_MSG_STATS) {
        check_stats(a);
    } else if (type == TP_MSG_READ_COUNTS) {
        check_read_counts(a, req);
    } else if (type == TP_MSG_CLEAR) {
        check_clear(a);
#ifdef TP_FLYNN_EEPROM
    } else if (type == TP_MSG_EEPROM_SAVE) {
        check_save(a);
    } else {
        check_load(a);
#endif
    }
}

/* A broken frame: an ERROR with the matching code and the seq byte it claims, and no state change. */
static void check_broken(tp_rx_t status, msg_t a)
{
    uint8_t code = TP_ERR_CRC;
    if (status == TP_RX_SHORT) {
        code = TP_ERR_LENGTH;
    } else if (status == TP_RX_TOO_LONG) {
        code = request_payload(shadow_buf[0]) < 0 ? TP_ERR_UNKNOWN_TYPE : TP_ERR_TOO_LONG;
    }
    expect(a.seq == (shadow.len >= 2 ? shadow_buf[1] : 0));
    expect_error(a, code);
}

/* One byte to the device. The shadow parser sees it first: if it completes a frame, the state before it is kept
 * and the answer it triggers is checked; any other byte must leave the device silent. */
static void feed_byte(uint8_t c)
{
    tp_rx_t status = tp_parser_feed(&shadow, c);
    if (status != TP_RX_NONE) {
        snapshot(&before);
    }
    out_len = 0;
    tp_app_byte(c);
    if (status == TP_RX_NONE) {
        expect(out_len == 0);
        return;
    }
    msg_t a = parse_answer();
    errors_sent += a.type == TP_MSG_ERROR;
    if (status == TP_RX_FRAME) {
        expect(a.seq == shadow_buf[1]);
        check_request(shadow_buf, (uint16_t)(shadow.len - TP_FRAME_OVERHEAD), a);
    } else {
        check_broken(status, a);
    }
}

static void feed(const uint8_t *data, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        feed_byte(data[i]);
    }
}

/* ---- harness operations --------------------------------------------------------------------------------------- */
static void boot(void)
{
    errors_sent = 0;
    h_next = 0;
    h_type = 0;
    h_learned_live = 0;
    tp_app_init();
    tp_parser_init(&shadow, shadow_buf, sizeof shadow_buf);
}

static void op_reboot(void)
{
    static uint8_t keep[TP_EEPROM_BYTES];
    memcpy(keep, tp_ee_image, sizeof keep);
    boot(); /* the host build's start-up erases its EEPROM emulation: put the "persistent" bytes back */
    memcpy(tp_ee_image, keep, sizeof keep);
    expect(memcmp(tp_flynn_counts, tp_flynn_filters, CB) == 0 && tp_learn_samples == 0);
}

static void op_tamper(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i + 3 <= n; i += 3) {
        tp_ee_image[tp_get_u16(p + i) % TP_EEPROM_BYTES] ^= p[i + 2];
    }
}

static void op_plant(const uint8_t *p, size_t n)
{
#ifdef TP_FLYNN_EEPROM
    static uint8_t counts[CB];
    uint8_t head[4] = {0, 0, 0, 0};
    memcpy(head, p, n < 4 ? n : 4);
    memset(counts, 0, CB);
    if (n > 4) {
        memcpy(counts, p + 4, n - 4 < CB ? n - 4 : CB);
    }
    make_record(tp_ee_image + REC_AT, counts, tp_get_u32(head));
#else
    (void)p;
    (void)n; /* no EEPROM record in this build */
#endif
}

/* A request frame, encoded by the firmware's own encoder. */
static uint8_t req_bytes[2u * 300u];
static size_t req_len;

static void req_putc(uint8_t c)
{
    if (req_len < sizeof req_bytes) {
        req_bytes[req_len++] = c;
    }
}

static void send_frame(uint8_t type, uint8_t seq, const uint8_t *payload, uint16_t n)
{
    static uint8_t body[256 + TP_FRAME_OVERHEAD];
    body[0] = type;
    body[1] = seq;
    memcpy(body + 2, payload, n);
    req_len = 0;
    req_putc(0); /* resync preamble, as the host client sends it */
    tp_frame_send(body, n, req_putc);
    feed(req_bytes, req_len);
}

static void run_records(const uint8_t *data, size_t size)
{
    size_t i = 0;
    while (i + 3 <= size) {
        uint8_t type = data[i];
        uint16_t n = data[i + 2];
        if (n > size - i - 3) {
            n = (uint16_t)(size - i - 3);
        }
        const uint8_t *payload = data + i + 3;
        if (type == HOP_REBOOT) {
            op_reboot();
        } else if (type == HOP_TAMPER) {
            op_tamper(payload, n);
        } else if (type == HOP_PLANT) {
            op_plant(payload, n);
        } else {
            send_frame(type, data[i + 1], payload, n);
        }
        i += 3u + n;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    boot();
    if (size == 0) {
        return 0;
    }
    if (data[0] & 1u) {
        feed(data + 1, size - 1);
        feed_byte(0); /* end a trailing partial frame so it is answered (and checked) too */
    } else {
        run_records(data + 1, size - 1);
    }
    return 0;
}
