/* tinyproto serial framing: COBS decoder state machine, streaming COBS encoder, CRC-16/CCITT-FALSE. */
#include "tp_serial.h"

#define TP_PARSER_DONE 0x01     /* the last byte ended a frame: reset before the next one */
#define TP_PARSER_OVERFLOW 0x02 /* the body outgrew the buffer: skip to the delimiter */

#define TP_COBS_MAX_RUN 254u /* a COBS block holds at most 254 data bytes (code 0xFF) */

#if defined(__AVR__)
#include <util/crc16.h>

uint16_t tp_crc16(uint16_t crc, const uint8_t *data, uint16_t n)
{
    /* avr-libc's XMODEM step is the same MSB-first 0x1021 register (CCITT-FALSE differs only in the 0xFFFF start
     * the caller passes), in hand-written assembly: about half the instructions of the C form below, and every
     * byte of every frame goes through it. */
    for (uint16_t i = 0; i < n; ++i) {
        crc = _crc_xmodem_update(crc, data[i]);
    }
    return crc;
}
#else
uint16_t tp_crc16(uint16_t crc, const uint8_t *data, uint16_t n)
{
    /* Byte-wise form of the MSB-first 0x1021 shift register: the 8 feedback bits fold into three shifted
     * copies of one byte, so no table (512 B of flash) and no bit loop are needed. */
    for (uint16_t i = 0; i < n; ++i) {
        uint8_t x = (uint8_t)((crc >> 8) ^ data[i]);
        x ^= (uint8_t)(x >> 4);
        crc = (uint16_t)((crc << 8) ^ ((uint16_t)x << 12) ^ ((uint16_t)x << 5) ^ x);
    }
    return crc;
}
#endif

void tp_parser_init(tp_parser_t *p, uint8_t *buf, uint16_t cap)
{
    p->buf = buf;
    p->cap = cap;
    p->len = 0;
    p->code = 0;
    p->left = 0;
    p->flags = 0;
}

static void tp_parser_put(tp_parser_t *p, uint8_t c)
{
    if (p->len >= p->cap) {
        p->flags |= TP_PARSER_OVERFLOW;
        return;
    }
    p->buf[p->len++] = c;
}

static tp_rx_t tp_parser_end(tp_parser_t *p)
{
    p->flags |= TP_PARSER_DONE; /* keep buf/len readable until the next byte */
    if (p->flags & TP_PARSER_OVERFLOW) {
        return TP_RX_TOO_LONG;
    }
    if (p->code == 0) {
        return TP_RX_NONE; /* 0x00 0x00: an empty frame, e.g. the host's resync preamble */
    }
    if (p->left != 0) {
        return TP_RX_BAD_COBS;
    }
    if (p->len < TP_FRAME_OVERHEAD) {
        return TP_RX_SHORT;
    }
    uint16_t n = (uint16_t)(p->len - 2u);
    if (tp_crc16(0xFFFF, p->buf, n) != tp_get_u16(p->buf + n)) {
        return TP_RX_BAD_CRC;
    }
    return TP_RX_FRAME;
}

tp_rx_t tp_parser_feed_any(tp_parser_t *p, uint8_t c)
{
    if (p->flags & TP_PARSER_DONE) {
        tp_parser_init(p, p->buf, p->cap);
    }
    if (c == 0) {
        return tp_parser_end(p);
    }
    if (p->flags & TP_PARSER_OVERFLOW) {
        return TP_RX_NONE;
    }
    if (p->left == 0) {
        /* A code byte. The block before it ended in an implicit zero unless it was a full 254-byte run. */
        if (p->code != 0 && p->code != 0xFF) {
            tp_parser_put(p, 0);
        }
        p->code = c;
        p->left = (uint8_t)(c - 1u);
    } else {
        --p->left;
        tp_parser_put(p, c);
    }
    return TP_RX_NONE;
}

/* Length of the zero-free run starting at body[i] (at most 254 bytes). */
static uint16_t tp_cobs_run(const uint8_t *body, uint16_t i, uint16_t n)
{
    uint16_t j = i;
    while (j < n && body[j] != 0 && (uint16_t)(j - i) < TP_COBS_MAX_RUN) {
        ++j;
    }
    return (uint16_t)(j - i);
}

static void tp_cobs_send(const uint8_t *body, uint16_t n, tp_putc_fn put)
{
    uint16_t i = 0;
    for (;;) {
        uint16_t run = tp_cobs_run(body, i, n);
        put((uint8_t)(run + 1u));
        for (uint16_t k = 0; k < run; ++k) {
            put(body[i + k]);
        }
        i = (uint16_t)(i + run);
        if (i >= n) {
            break;
        }
        if (run < TP_COBS_MAX_RUN) {
            ++i; /* the zero that ended the run is implied by the code byte */
        }
    }
    put(0);
}

void tp_frame_send(uint8_t *body, uint16_t n_payload, tp_putc_fn put)
{
    uint16_t n = (uint16_t)(n_payload + 2u);
    tp_put_u16(body + n, tp_crc16(0xFFFF, body, n));
    tp_cobs_send(body, (uint16_t)(n + 2u), put);
}
