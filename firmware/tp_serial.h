/* tinyproto serial framing: COBS + CRC-16/CCITT-FALSE frames and the protocol's constants (docs/design.md).
 *
 * A frame on the wire is COBS(body) 0x00 with body = type u8 | seq u8 | payload | crc16 u16 LE; the CRC covers
 * type, seq and payload. The parser decodes COBS byte by byte straight into a caller-supplied buffer, so the
 * buffer holds the decoded body only (no COBS overhead), and a 0x00 always ends a frame (resync). The encoder
 * streams COBS out of the body buffer, so sending needs no second buffer. No malloc, C99, fixed-width types.
 */
#ifndef TP_SERIAL_H
#define TP_SERIAL_H

#include <stdint.h>

/* TP_PROTO_VERSION, TP_FRAME_OVERHEAD, chunk and buffer sizes: generated per project from tinyproto/core/wire.py. */
#include "tinyproto_sizes.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TP_CHECK_RESULT __attribute__((warn_unused_result))
#else
#define TP_CHECK_RESULT
#endif

/* Message types: a response is the request type | TP_MSG_RESPONSE, or TP_MSG_ERROR. */
#define TP_MSG_HELLO 0x01
/* Vectors travel in chunks: PREDICT first u16 | n int8 (n <= TP_CHUNK_BYTES), PREDICT_RAW first u16 | n float32
 * (n <= TP_RAW_CHUNK), LEARN label u8 | first u16 | n int8. A chunk with first = 0 starts a vector, each next one
 * must continue it (else ERROR argument). Every chunk but the last is acknowledged (PREDICT, LEARN: empty;
 * PREDICT_RAW: the chunk's n int8 inputs); the last one's answer is the message's full answer. */
#define TP_MSG_PREDICT 0x02     /* last chunk -> label u8, cycles u32, int32[n_classes] */
#define TP_MSG_PREDICT_RAW 0x03 /* last chunk -> label u8, cycles u32, int8[n] of this chunk, int32[n_classes] */
#define TP_MSG_STATS 0x04
/* On-device learning (FlyNN firmware built with TP_FLYNN_LEARN; any other firmware answers ERROR unknown type). */
#define TP_MSG_LEARN 0x05        /* last chunk -> n_samples u32, cycles u32 */
#define TP_MSG_READ_COUNTS 0x06  /* offset u16, length u8 -> total u16, up to `length` bytes of packed counts */
#define TP_MSG_CLEAR 0x07        /* -> (empty): every count and n_samples to 0 */
#define TP_MSG_EEPROM_SAVE 0x08  /* -> written u16 (bytes that changed), record u16 (bytes of the record) */
#define TP_MSG_EEPROM_LOAD 0x09  /* -> status u8 (TP_EEPROM_*), n_samples u32 */
#define TP_MSG_RESPONSE 0x80
#define TP_MSG_ERROR 0x7F

/* Payload of an ERROR frame. */
#define TP_ERR_CRC 1          /* CRC mismatch or broken COBS: the frame was corrupted */
#define TP_ERR_LENGTH 2       /* payload length wrong for the type, or a body too short to hold a CRC */
#define TP_ERR_UNKNOWN_TYPE 3 /* type not implemented (PREDICT_RAW when built with TP_NO_RAW_INPUT) */
#define TP_ERR_TOO_LONG 4     /* frame longer than the receive buffer */
#define TP_ERR_ARGUMENT 5     /* a field out of range: LEARN label >= n_classes, READ_COUNTS offset past the end,
                                 a chunk that does not continue the vector under way */

/* EEPROM_LOAD status. */
#define TP_EEPROM_LOADED 0    /* the counts and n_samples now come from the EEPROM record */
#define TP_EEPROM_EMPTY 1     /* no valid record (blank, or the CRC does not match): nothing changed */
#define TP_EEPROM_OTHER 2     /* a valid record of another model layout: nothing changed */

#define TP_HELLO_FLAG_RAW 0x01    /* answers PREDICT_RAW */
#define TP_HELLO_FLAG_LEARN 0x02  /* answers LEARN, READ_COUNTS, CLEAR; inference uses the SRAM counts */
#define TP_HELLO_FLAG_EEPROM 0x04 /* answers EEPROM_SAVE / EEPROM_LOAD (the counts fit the EEPROM) */
#define TP_HELLO_FLAG_STREAM 0x08 /* the family streams: each chunk is fed (and timed) as it arrives */
#define TP_HELLO_FLAG_WINDOW 0x10 /* received bytes wait in a TP_RX_RING ring: frames may be sent ahead */

/* What one received byte completed. */
typedef enum {
    TP_RX_NONE = 0,    /* mid-frame, or an empty frame (0x00 0x00): nothing to do */
    TP_RX_FRAME,       /* a valid body of p->len bytes (CRC included) is in the buffer */
    TP_RX_BAD_CRC,     /* CRC mismatch */
    TP_RX_BAD_COBS,    /* a COBS block was cut short by the delimiter */
    TP_RX_SHORT,       /* body shorter than type + seq + crc */
    TP_RX_TOO_LONG     /* the body did not fit the buffer; the rest of the frame was skipped */
} tp_rx_t;

/* Byte-at-a-time frame parser. The buffer and the frame length stay valid until the next tp_parser_feed(). */
typedef struct {
    uint8_t *buf;
    uint16_t cap;  /* buffer size in bytes */
    uint16_t len;  /* decoded body bytes so far */
    uint8_t code;  /* current COBS code byte; 0 before the first one */
    uint8_t left;  /* data bytes still to come in the current COBS block */
    uint8_t flags; /* TP_PARSER_* */
} tp_parser_t;

/* Where the encoder sends bytes (the UART on the device, stdout or a capture buffer on the host). */
typedef void (*tp_putc_fn)(uint8_t c);

void tp_parser_init(tp_parser_t *p, uint8_t *buf, uint16_t cap);

/* Every case of tp_parser_feed(): code bytes, the delimiter, overflow, the reset after a frame. */
TP_CHECK_RESULT tp_rx_t tp_parser_feed_any(tp_parser_t *p, uint8_t c);

/* Feed one received byte; returns what it completed (TP_RX_NONE most of the time). Inline for the bytes almost every
 * byte is, a COBS code byte or the data of its block, with room left in the buffer (raw float features hold many
 * zero bytes, so code bytes are common); tp_parser_feed_any does the rest the same way. */
static inline TP_CHECK_RESULT tp_rx_t tp_parser_feed(tp_parser_t *p, uint8_t c)
{
    uint16_t len = p->len;
    if (c == 0 || p->flags != 0 || len >= p->cap) {
        return tp_parser_feed_any(p, c);
    }
    uint8_t left = p->left;
    if (left == 0) {
        /* A code byte. The block before it ended in an implicit zero unless it was a full 254-byte run. */
        uint8_t code = p->code;
        p->code = c;
        p->left = (uint8_t)(c - 1u);
        if (code == 0 || code == 0xFF) {
            return TP_RX_NONE;
        }
        c = 0;
    } else {
        p->left = (uint8_t)(left - 1u);
    }
    p->buf[len] = c;
    p->len = (uint16_t)(len + 1u);
    return TP_RX_NONE;
}

/* CRC-16/CCITT-FALSE: poly 0x1021, no reflection, no xorout; start with crc = 0xFFFF. */
TP_CHECK_RESULT uint16_t tp_crc16(uint16_t crc, const uint8_t *data, uint16_t n);

/* body[0] = type, body[1] = seq and n_payload bytes of payload are in place: append the CRC at body[2 + n_payload]
 * (the caller's buffer must hold n_payload + TP_FRAME_OVERHEAD bytes) and send COBS(body) 0x00. */
void tp_frame_send(uint8_t *body, uint16_t n_payload, tp_putc_fn put);

/* Little-endian field access (the wire order, independent of the machine's). */
static inline void tp_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void tp_put_u32(uint8_t *p, uint32_t v)
{
    tp_put_u16(p, (uint16_t)v);
    tp_put_u16(p + 2, (uint16_t)(v >> 16));
}

static inline uint16_t tp_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | ((uint16_t)p[1] << 8));
}

static inline uint32_t tp_get_u32(const uint8_t *p)
{
    return (uint32_t)tp_get_u16(p) | ((uint32_t)tp_get_u16(p + 2) << 16);
}

#ifdef __cplusplus
}
#endif

#endif /* TP_SERIAL_H */
