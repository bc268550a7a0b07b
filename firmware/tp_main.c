/* tinyproto device application: answers HELLO / PREDICT / PREDICT_RAW / STATS frames (docs/design.md), and with
 * TP_FLYNN_LEARN also the learning messages (tp_learn.c). What the app's parts share and its compile-time options:
 * tp_app.h.
 *
 * Vectors arrive in chunks of at most TP_CHUNK_BYTES (int8) or TP_RAW_CHUNK (float32) features, so no frame ever
 * holds a whole wide vector. A streamable family (TP_STREAMABLE 1) gets each chunk as it arrives (tp_stream_feed,
 * timed chunk by chunk); any other family's d int8 features are gathered in tp_x and tp_predict() runs on the
 * last chunk. Raw floats are converted chunk by chunk by the input stage (tp_input_quantize_range).
 */
#include "tp_app.h"

#ifndef F_CPU
#define F_CPU 0UL /* host build: HELLO reports f_cpu = 0 */
#endif

static uint16_t tp_next;    /* first feature the next chunk of the vector under way must carry */
static uint8_t tp_judged[2]; /* the last vector's confidence byte and decided label (tp_judge) */
static uint8_t tp_vec_type; /* message type of the vector under way (0: none) */

#ifdef TP_APP_STREAMS
static uint16_t tp_feed_first; /* tp_feed_step's chunk: tp_time_call passes only x and scores */
static uint8_t tp_feed_n;
static uint32_t tp_vec_cycles; /* cycles of the vector's chunks so far */

/* One chunk (on the first, the begin; on the last, the end) behind the predict signature, so tp_time_call()
 * measures the family's code and nothing of the transport. scores != 0 marks the last chunk. */
static uint8_t tp_feed_step(const int8_t *x, int32_t *scores)
{
    if (tp_feed_first == 0) {
        tp_stream_begin();
    }
    tp_stream_feed(x, tp_feed_first, tp_feed_n);
    if (scores == 0) {
        return 0;
    }
    uint8_t label = tp_stream_end(scores);
    tp_judged[1] = tp_judge(scores, label, &tp_judged[0]);
    return label;
}
#else
static int8_t tp_x[TP_N_FEATURES]; /* the int8 vector being gathered: d bytes, never d floats */

/* tp_predict and tp_judge behind the predict signature: the timed call covers both. The scores are always the
 * frame buffer's tail (tp_take): judged from that fixed address, the wrapper keeps no pointer across the call and
 * adds only its return address and the label to the deepest stack. */
static uint8_t tp_predict_judged(const int8_t *x, int32_t *scores)
{
    uint8_t label = tp_predict(x, scores);
    tp_judged[1] = tp_judge(&tp_buf.i32[TP_SCORES_AT / 4u], label, &tp_judged[0]);
    return label;
}
#endif

static void tp_on_hello(uint8_t seq)
{
    uint8_t *p = tp_buf.b + 2;
    p[0] = 'T'; /* byte by byte: a "TPRO" literal would sit in .data and cost SRAM */
    p[1] = 'P';
    p[2] = 'R';
    p[3] = 'O';
    p[4] = TP_PROTO_VERSION;
    p[5] = TP_RUNTIME_ABI;
    p[6] = TP_FAMILY_ID;
    tp_put_u32(p + 7, (uint32_t)TP_MODEL_HASH);
    tp_put_u16(p + 11, TP_N_FEATURES);
    p[13] = TP_N_CLASSES;
    p[14] = 1; /* input bytes per feature (int8) */
    p[15] = 4; /* score bytes per class (int32) */
    tp_put_u32(p + 16, (uint32_t)F_CPU);
    uint8_t flags = TP_LEARN_FLAGS;
#ifndef TP_NO_RAW_INPUT
    flags |= TP_HELLO_FLAG_RAW;
#endif
#ifdef TP_APP_STREAMS
    flags |= TP_HELLO_FLAG_STREAM;
#endif
#ifdef TP_RX_WINDOWED
    flags |= TP_HELLO_FLAG_WINDOW;
#endif
    p[20] = flags;
    tp_reply(TP_MSG_HELLO | TP_MSG_RESPONSE, seq, TP_HELLO_PAYLOAD);
}

static void tp_on_stats(uint8_t seq)
{
    tp_put_u16(tp_buf.b + 2, tp_stack_peak());
    tp_put_u16(tp_buf.b + 4, tp_static_sram());
    tp_put_u16(tp_buf.b + 6, tp_frames_bad);
    tp_reply(TP_MSG_STATS | TP_MSG_RESPONSE, seq, TP_STATS_PAYLOAD);
}

/* 0 if n features from `first` start (first = 0) or continue the vector under way of this type, else the
 * ERROR code: past the model's features is a length error, out of order an argument error. */
static uint8_t tp_chunk_check(uint8_t type, uint16_t first, uint16_t n)
{
    if (first > TP_N_FEATURES || n > (uint16_t)(TP_N_FEATURES - first)) {
        return TP_ERR_LENGTH;
    }
    if (first != 0 && (first != tp_next || type != tp_vec_type)) {
        return TP_ERR_ARGUMENT;
    }
    return 0;
}

/* Hand one checked chunk of int8 features to the model; returns 1 on the vector's last chunk, whose result is
 * then in *label, *cycles and the scores at the buffer's tail. x must lie clear of that tail. */
static uint8_t tp_take(uint8_t type, const int8_t *x, uint16_t first, uint8_t n, uint8_t *label, uint32_t *cycles)
{
    uint8_t last = (uint16_t)(first + n) == TP_N_FEATURES;
    int32_t *scores = &tp_buf.i32[TP_SCORES_AT / 4u];
    tp_vec_type = last ? 0 : type;
    tp_next = last ? 0 : (uint16_t)(first + n);
#ifdef TP_APP_STREAMS
    if (first == 0) {
        tp_vec_cycles = 0;
    }
    tp_feed_first = first;
    tp_feed_n = n;
    tp_vec_cycles += tp_time_call(tp_feed_step, x, last ? scores : 0, label, TP_MARK_PREDICT);
    *cycles = tp_vec_cycles;
#else
    memcpy(tp_x + first, x, n);
    if (last) {
        *cycles = tp_time_call(tp_predict_judged, tp_x, scores, label, TP_MARK_PREDICT);
    }
#endif
    return last;
}

/* The last chunk's answer: label, cycles, (this chunk's n_x int8 inputs,) scores, laid out from offset 2. */
static void tp_reply_prediction(uint8_t type, uint8_t seq, uint8_t label, uint32_t cycles, const int8_t *x,
                                uint8_t n_x)
{
    const int32_t *scores = &tp_buf.i32[TP_SCORES_AT / 4u];
    uint8_t *out = tp_buf.b + 2u + TP_PRED_HEAD;
    if (n_x != 0) {
        memmove(out, x, n_x);
        out += n_x;
    }
    for (uint8_t c = 0; c < TP_N_CLASSES; ++c) {
        tp_put_u32(out + 4u * c, (uint32_t)scores[c]); /* writes stay below scores[c + 1] */
    }
    tp_buf.b[2] = label;
    tp_put_u32(tp_buf.b + 3, cycles);
    tp_buf.b[7] = tp_judged[0];
    tp_buf.b[8] = tp_judged[1];
    tp_reply(type | TP_MSG_RESPONSE, seq, (uint16_t)(TP_PRED_HEAD + n_x + TP_SCORE_BYTES));
}

/* PREDICT (first u16 | int8[n]) and LEARN (label u8 | first u16 | int8[n]); lengths already checked. */
static void tp_on_int8_chunk(uint8_t type, uint8_t seq, uint16_t n_payload)
{
    uint16_t at = type == TP_MSG_PREDICT ? 2u : 2u + TP_LEARN_LABEL;
    uint16_t first = tp_get_u16(tp_buf.b + at);
    uint8_t n = (uint8_t)(n_payload - (at - 2u) - TP_CHUNK_FIRST);
    const int8_t *x = (const int8_t *)(tp_buf.b + at + TP_CHUNK_FIRST);
    uint8_t code = tp_chunk_check(type, first, n);
#ifdef TP_FLYNN_LEARN
    uint8_t learn_label = tp_buf.b[2];
    if (code == 0 && type == TP_MSG_LEARN && learn_label >= TP_N_CLASSES) {
        code = TP_ERR_ARGUMENT;
    }
    if (code == 0 && type == TP_MSG_LEARN) {
        /* the learning firmware is never streamable (tp_app.h): gather, learn on the last chunk */
        memcpy(tp_x + first, x, n);
        uint8_t last = (uint16_t)(first + n) == TP_N_FEATURES;
        tp_vec_type = last ? 0 : type;
        tp_next = last ? 0 : (uint16_t)(first + n);
        if (last) {
            tp_on_learn(seq, tp_x, learn_label);
        } else {
            tp_reply(type | TP_MSG_RESPONSE, seq, 0);
        }
        return;
    }
#endif
    if (code != 0) {
        tp_reply_error(seq, code);
        return;
    }
    uint8_t label = 0;
    uint32_t cycles = 0;
    if (tp_take(type, x, first, n, &label, &cycles)) {
        tp_reply_prediction(type, seq, label, cycles, x, 0);
    } else {
        tp_reply(type | TP_MSG_RESPONSE, seq, 0);
    }
}

#ifndef TP_NO_RAW_INPUT
/* PREDICT_RAW: first u16 | float32[n]. Each chunk goes through the on-device input stage; the answer carries
 * its int8 inputs (the host compares them with its own input stage). */
static void tp_on_raw_chunk(uint8_t seq, uint16_t n_payload)
{
    uint16_t first = tp_get_u16(tp_buf.b + 2);
    uint8_t n = (uint8_t)((n_payload - TP_CHUNK_FIRST) / 4u);
    uint8_t code = tp_chunk_check(TP_MSG_PREDICT_RAW, first, n);
    if (code != 0) {
        tp_reply_error(seq, code);
        return;
    }
    /* float32 LE at offset 4 -> aligned float[] at offset 0, in place, front to back (each element's source is
     * read whole before its destination, four bytes lower, is written). */
    for (uint8_t i = 0; i < n; ++i) {
        union {
            uint32_t u;
            float f;
        } v;
        v.u = tp_get_u32(tp_buf.b + 4u + 4u * i);
        tp_buf.f32[i] = v.f;
    }
    int8_t *x = (int8_t *)(tp_buf.b + TP_RAW_X_AT);
    tp_input_quantize_range(tp_buf.f32, first, n, x);
    uint8_t label = 0;
    uint32_t cycles = 0;
    if (tp_take(TP_MSG_PREDICT_RAW, x, first, n, &label, &cycles)) {
        tp_reply_prediction(TP_MSG_PREDICT_RAW, seq, label, cycles, x, n);
    } else {
        memmove(tp_buf.b + 2, x, n);
        tp_reply(TP_MSG_PREDICT_RAW | TP_MSG_RESPONSE, seq, n);
    }
}
#endif

/* 0 if this firmware answers `type` and n_payload is a valid length for it, else the ERROR code.
 * An if chain, not a switch: avr-gcc turns such a switch into a lookup table in .data, i.e. SRAM. */
static uint8_t tp_request_check(uint8_t type, uint16_t n_payload)
{
    uint8_t length = TP_ERR_LENGTH;
    if (type == TP_MSG_HELLO || type == TP_MSG_STATS) {
        return n_payload == 0 ? 0 : length;
    }
    if (type == TP_MSG_PREDICT) {
        return n_payload > TP_CHUNK_FIRST && n_payload <= TP_CHUNK_FIRST + TP_CHUNK_BYTES ? 0 : length;
    }
#ifndef TP_NO_RAW_INPUT
    if (type == TP_MSG_PREDICT_RAW) {
        return n_payload > TP_CHUNK_FIRST && n_payload <= TP_CHUNK_FIRST + 4u * TP_RAW_CHUNK &&
                       (n_payload - TP_CHUNK_FIRST) % 4u == 0
                   ? 0
                   : length;
    }
#endif
#ifdef TP_FLYNN_LEARN
    if (type == TP_MSG_LEARN) {
        uint16_t head = TP_LEARN_LABEL + TP_CHUNK_FIRST;
        return n_payload > head && n_payload <= head + TP_CHUNK_BYTES ? 0 : length;
    }
    uint16_t want = tp_learn_payload(type);
    if (want != TP_NO_SUCH_TYPE) {
        return n_payload == want ? 0 : length;
    }
#endif
    return TP_ERR_UNKNOWN_TYPE;
}

static void tp_dispatch(uint16_t len)
{
    uint8_t type = tp_buf.b[0];
    uint8_t seq = tp_buf.b[1];
    uint16_t n_payload = (uint16_t)(len - TP_FRAME_OVERHEAD);
    uint8_t code = tp_request_check(type, n_payload);
    if (code != 0) {
        tp_reply_error(seq, code);
#ifdef TP_FLYNN_LEARN
    } else if (tp_learn_repeat(type, seq)) {
        return; /* answered again */
#endif
    } else if (type == TP_MSG_HELLO) {
        tp_on_hello(seq);
    } else if (type == TP_MSG_STATS) {
        tp_on_stats(seq);
    } else if (type == TP_MSG_PREDICT) {
        tp_on_int8_chunk(type, seq, n_payload);
#ifndef TP_NO_RAW_INPUT
    } else if (type == TP_MSG_PREDICT_RAW) {
        tp_on_raw_chunk(seq, n_payload);
#endif
#ifdef TP_FLYNN_LEARN
    } else if (type == TP_MSG_LEARN) {
        tp_on_int8_chunk(type, seq, n_payload);
    } else {
        tp_on_learning_request(type, seq);
#endif
    }
}

/* ---- the application: init once (timer calibration included), then one call per received byte ------------ */
void tp_app_init(void)
{
    tp_timer_init();
    tp_transport_init();
    tp_next = 0;
    tp_vec_type = 0;
#ifdef TP_FLYNN_LEARN
    tp_learn_init();
#endif
}

/* What a byte that ended a frame leads to: the request's answer, or an ERROR. Not inlined into tp_app_byte: the
 * dispatch needs a dozen saved registers, which every byte (a wide vector is thousands) would otherwise push and
 * pop, although only the frame's last one gets here. */
static void __attribute__((noinline)) tp_app_frame_end(tp_rx_t status)
{
    if (status == TP_RX_FRAME) {
        tp_dispatch(tp_rx.len);
        return;
    }
    /* A broken frame: answer with the seq byte it claims (the host drops it if that is garbage). */
    uint8_t seq = tp_rx.len >= 2 ? tp_buf.b[1] : 0;
    uint8_t code = TP_ERR_CRC;
    if (status == TP_RX_SHORT) {
        code = TP_ERR_LENGTH;
    } else if (status == TP_RX_TOO_LONG) {
        /* The type byte arrived: a PREDICT_RAW without raw support is "unknown type", not "too long". */
        code = tp_request_check(tp_buf.b[0], 0) == TP_ERR_UNKNOWN_TYPE ? TP_ERR_UNKNOWN_TYPE : TP_ERR_TOO_LONG;
    }
    tp_reply_error(seq, code);
}

#ifdef TP_RX_WINDOWED
int main(void)
{
    tp_port_init();
    tp_app_init();
    for (;;) {
        tp_app_frame_end(tp_port_receive(&tp_rx));
    }
}
#else
void tp_app_byte(uint8_t c)
{
    tp_rx_t status = tp_parser_feed(&tp_rx, c);
    if (status != TP_RX_NONE) {
        tp_app_frame_end(status);
    }
}

#if !defined(TP_PORT_CUSTOM) || defined(__AVR__)
int main(void)
{
    tp_port_init();
    tp_app_init();
    for (;;) {
        int16_t c = tp_port_getc();
        if (c < 0) {
            break; /* host: end of input */
        }
        tp_app_byte((uint8_t)c);
    }
    return 0;
}
#endif
#endif
