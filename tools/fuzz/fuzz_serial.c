/* libFuzzer harness: the device's frame parser and message dispatcher (firmware/tp_main.c and the app parts it uses + tp_serial.c),
 * compiled for the host with a model (the fake one from tests/fixtures/protocol by default).
 *
 * Two input modes, chosen by the first byte, so the fuzzer reaches the dispatcher without guessing CRCs:
 *   odd  : the rest is a raw byte stream fed to the device as is (COBS, CRC, resync, overlong frames);
 *   even : the rest is records [type][seq][len][len payload bytes], each sent as a valid frame (0x00 + COBS +
 *          CRC), so every message handler runs on arbitrary payloads; every record must get exactly one answer.
 * Beyond the sanitizers, every byte the device sends must parse as well-formed frames of a known type whose
 * payload length matches the type; any violation aborts (a "crash" for libFuzzer).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define TP_PORT_CUSTOM
#include "tp_main.c"
#include "tp_learn.c"
#include "tp_measure.c"
#include "tp_transport.c"

#define OUT_CAP (1u << 17)
static uint8_t out_bytes[OUT_CAP];
static size_t out_len;
static int out_overflow;

void tp_port_putc(uint8_t c)
{
    if (out_len < OUT_CAP) {
        out_bytes[out_len++] = c;
    } else {
        out_overflow = 1;
    }
}

void tp_port_flush(void)
{
}

/* A request frame for the device, encoded with the firmware's own encoder into a scratch buffer. */
static uint8_t req_bytes[600];
static size_t req_len;

static void req_putc(uint8_t c)
{
    if (req_len < sizeof req_bytes) {
        req_bytes[req_len++] = c;
    }
}

static void feed(const uint8_t *data, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        tp_app_byte(data[i]);
    }
}

static size_t feed_records(const uint8_t *data, size_t size)
{
    static uint8_t body[260 + TP_FRAME_OVERHEAD];
    size_t records = 0;
    size_t i = 0;
    while (i + 3 <= size) {
        uint16_t n = data[i + 2];
        if (n > size - i - 3) {
            n = (uint16_t)(size - i - 3);
        }
        body[0] = data[i];
        body[1] = data[i + 1];
        memcpy(body + 2, data + i + 3, n);
        i += 3u + n;
        req_len = 0;
        req_putc(0); /* resync preamble, as the host client sends it */
        tp_frame_send(body, n, req_putc);
        feed(req_bytes, req_len);
        ++records;
    }
    return records;
}


/* Whether a device frame of this type may carry n payload bytes (chunk acknowledgements included). */
static int answer_ok(uint8_t type, long n)
{
    switch (type) {
    case TP_MSG_HELLO | TP_MSG_RESPONSE:
        return n == TP_HELLO_PAYLOAD;
    case TP_MSG_PREDICT | TP_MSG_RESPONSE:
        return n == 0 || n == (long)TP_PRED_HEAD + 4L * TP_N_CLASSES; /* a chunk's acknowledgement, or the answer */
    case TP_MSG_PREDICT_RAW | TP_MSG_RESPONSE:
        return (n >= 1 && n <= TP_RAW_CHUNK) || (n >= (long)TP_PRED_HEAD + 1L + 4L * TP_N_CLASSES &&
                                                 n <= (long)TP_PRED_HEAD + TP_RAW_CHUNK + 4L * TP_N_CLASSES);
    case TP_MSG_STATS | TP_MSG_RESPONSE:
        return n == 6;
    case TP_MSG_ERROR:
        return n == 1;
    default:
        return 0;
    }
}

/* Parse everything the device sent; abort on anything malformed. Returns the number of frames. */
static size_t check_answers(void)
{
    static uint8_t body[1024];
    tp_parser_t p;
    tp_parser_init(&p, body, sizeof body);
    size_t frames = 0;
    if (out_overflow || (out_len > 0 && out_bytes[out_len - 1] != 0)) {
        abort(); /* every answer ends with its delimiter */
    }
    for (size_t i = 0; i < out_len; ++i) {
        tp_rx_t r = tp_parser_feed(&p, out_bytes[i]);
        if (out_bytes[i] != 0) {
            continue;
        }
        if (r != TP_RX_FRAME) {
            abort(); /* includes empty frames: the device never sends 0x00 0x00 */
        }
        if (!answer_ok(body[0], (long)p.len - (long)TP_FRAME_OVERHEAD)) {
            abort();
        }
        if (body[0] == TP_MSG_ERROR && (body[2] < TP_ERR_CRC || body[2] > TP_ERR_ARGUMENT)) {
            abort();
        }
        ++frames;
    }
    return frames;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    out_len = 0;
    out_overflow = 0;
    tp_app_init();
    if (size == 0) {
        return 0;
    }
    if (data[0] & 1u) {
        static const uint8_t delimiter = 0;
        feed(data + 1, size - 1);
        feed(&delimiter, 1); /* end a trailing partial frame so it is answered too */
        (void)check_answers();
    } else {
        size_t records = feed_records(data + 1, size - 1);
        if (check_answers() != records) {
            abort(); /* a valid frame went unanswered, or one frame got two answers */
        }
    }
    return 0;
}
