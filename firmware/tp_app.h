/* tinyproto device application: what its four parts share (not part of the C API a sketch uses).
 *
 *   tp_main.c       dispatch of HELLO / PREDICT / PREDICT_RAW / STATS, the streamed vectors, main()
 *   tp_transport.c  the serial port, the one frame buffer, replies (frames and CRC are tp_serial.c's)
 *   tp_measure.c    Timer1 cycles around the model's code, painted stack high-water mark, static SRAM
 *   tp_learn.c      TP_FLYNN_LEARN: LEARN / READ_COUNTS / CLEAR / EEPROM_SAVE / EEPROM_LOAD and the EEPROM record
 *
 * Every size shared with the host (frame layout, chunk payload, frame buffer, EEPROM header) comes from the
 * generated include/tinyproto_sizes.h (tinyproto/core/wire.py); the guards below only check that the layout this
 * code relies on fits in what Python decided, so a size changed on one side alone fails the build.
 *
 * Compile-time options:
 *   TP_NO_RAW_INPUT  - no PREDICT_RAW (answered ERROR unknown type); tp_input_quantize_range() is never called.
 *   TP_HOST          - informational; any non-AVR build talks over stdin/stdout and reports cycles = 0.
 *   TP_PORT_CUSTOM   - host only: no main(), no stdio; the including file defines tp_port_putc() and
 *                      tp_port_flush() and feeds bytes to tp_app_byte() itself (the fuzz harnesses).
 *   TP_MAX_BUF       - AVR only: refuse to build if the frame buffer exceeds this many bytes (default 1024).
 *   TP_BAUD          - UART baud rate (the board's serial_baud; default 115200), double speed; USART0, or USART1
 *                      on the ATmega32U4.
 *   TP_FLYNN_LEARN     - FlyNN only: the learning firmware (tp_learn.c).
 *   TP_FLYNN_LAYOUT_KEY, TP_FLYNN_EEPROM_ADDR - with TP_FLYNN_LEARN, see tp_learn.c.
 */
#ifndef TP_APP_H
#define TP_APP_H

#include <stdint.h>
#include <string.h>

#include "tinyproto.h"
#include "tinyproto_model.h"
#include "tinyproto_sizes.h"
#include "tp_serial.h"

#ifndef TP_FAMILY_ID
#error "tinyproto_model.h must define TP_FAMILY_ID (1 = protonn, 2 = flynn)"
#endif
#if TP_N_CLASSES < 1 || TP_N_CLASSES > 255 || TP_N_FEATURES < 1 || TP_N_FEATURES > 65535
#error "TP_N_CLASSES must be 1..255 and TP_N_FEATURES 1..65535 (the HELLO fields are u8 and u16)"
#endif

/* A family that consumes its input chunk by chunk (tp_stream_*); otherwise the app buffers d int8 features. */
#if defined(TP_STREAMABLE) && TP_STREAMABLE
#define TP_APP_STREAMS 1
#endif

#if defined(TP_FLYNN_LEARN) && !defined(TP_FAMILY_FLYNN)
#error "TP_FLYNN_LEARN is the FlyNN learning firmware: the model must be a FlyNN"
#endif
#if defined(TP_FLYNN_LEARN) && defined(TP_APP_STREAMS)
#error "the learning firmware needs the whole int8 vector: a streamable family cannot be built with TP_FLYNN_LEARN"
#endif

/* The AVR app buffers received bytes in a ring of TP_RX_RING bytes (tp_transport.c), so the host may keep frames
 * in flight (HELLO flag bit4). Python sizes the ring to the SRAM the model leaves free and writes 0 when too
 * little is (tinyproto/core/wire.py, rx_ring_bytes): that firmware, like the learning firmware (whose SRAM goes
 * to its counts), reads the USART one request at a time. */
#if defined(__AVR__) && !defined(TP_FLYNN_LEARN) && defined(TP_RX_RING) && TP_RX_RING > 0
#define TP_RX_WINDOWED 1
#endif

/* ---- the one frame buffer ----------------------------------------------------------------------------------
 * Receive buffer, work area and transmit buffer at once (the device is strictly request/response).
 *   request       [type seq payload crc]        chunk: first u16 at 2, data at 4 (LEARN: label at 2, first at 3)
 *   PREDICT_RAW   the chunk's floats moved down to 0 (aligned), their int8 at 4 * TP_RAW_CHUNK
 *   scores        int32[C] in the LAST 4C bytes (aligned: the buffer size is a multiple of 4)
 *   response      [type seq label cycles (x) scores crc] from offset 0; scores are copied DOWN from the tail */
#ifdef TP_NO_RAW_INPUT
#define TP_BUF_SIZE TP_FRAME_BUF_NO_RAW
#else
#define TP_BUF_SIZE TP_FRAME_BUF_RAW
#endif
#define TP_SCORE_BYTES (4u * TP_N_CLASSES)
#define TP_SCORES_AT (TP_BUF_SIZE - TP_SCORE_BYTES)
#define TP_RAW_X_AT (4u * TP_RAW_CHUNK)

#if TP_BUF_SIZE % 4u != 0 || TP_BUF_SIZE < TP_FRAME_OVERHEAD + TP_LEARN_LABEL + TP_CHUNK_FIRST + TP_CHUNK_BYTES
#error "tinyproto_sizes.h: the frame buffer does not hold a whole chunk request (regenerate the project)"
#endif
#if TP_BUF_SIZE < TP_FRAME_OVERHEAD + TP_PRED_HEAD + TP_SCORE_BYTES || TP_BUF_SIZE < TP_FRAME_OVERHEAD + TP_HELLO_PAYLOAD
#error "tinyproto_sizes.h: the frame buffer does not hold the answers (regenerate the project)"
#endif
#if !defined(TP_NO_RAW_INPUT) && (TP_RAW_X_AT + TP_RAW_CHUNK > TP_SCORES_AT || \
                                  TP_FRAME_OVERHEAD + TP_PRED_HEAD + TP_RAW_CHUNK + TP_SCORE_BYTES > TP_BUF_SIZE)
#error "tinyproto_sizes.h: the frame buffer does not hold the PREDICT_RAW work area (regenerate the project)"
#endif
#if TP_CHUNK_BYTES > 255u || TP_RAW_CHUNK * 4u > TP_CHUNK_BYTES
#error "tinyproto_sizes.h: a chunk holds at most 255 int8 features (uint8_t counts)"
#endif
#ifndef TP_MAX_BUF
#define TP_MAX_BUF 1024
#endif
#if defined(__AVR__) && TP_BUF_SIZE > TP_MAX_BUF
#error "the frame buffer (about 80 + 4 * n_classes bytes) exceeds TP_MAX_BUF: too many classes for the SRAM"
#endif

typedef union {
    uint8_t b[TP_BUF_SIZE];
    int32_t i32[TP_BUF_SIZE / 4u];
    float f32[TP_BUF_SIZE / 4u];
} tp_buf_t;

/* ---- tp_transport.c ---------------------------------------------------------------------------------------- */
extern tp_buf_t tp_buf;
extern tp_parser_t tp_rx;
extern uint16_t tp_frames_bad;
void tp_port_init(void);
#ifdef TP_RX_WINDOWED
/* Feed the parser the received bytes, waiting asleep for each, until one completes something (what
 * tp_parser_feed says); the AVR app's loop with a receive ring. */
tp_rx_t tp_port_receive(tp_parser_t *p);
#else
int16_t tp_port_getc(void); /* the next byte, or -1 at the end of the input (host) */
#endif
void tp_port_putc(uint8_t c); /* TP_PORT_CUSTOM: defined by the including harness */
void tp_port_flush(void);
void tp_transport_init(void);
/* body type/seq at 0/1, n_payload bytes of payload at 2: send it and flush. */
void tp_reply(uint8_t type, uint8_t seq, uint16_t n_payload);
void tp_reply_error(uint8_t seq, uint8_t code);

/* ---- tp_measure.c ------------------------------------------------------------------------------------------ */
typedef uint8_t (*tp_predict_fn)(const int8_t *x, int32_t *scores);
#define TP_MARK_PREDICT 1    /* GPIOR0 = 1 before, 2 after each timed call of the model's code */
#define TP_MARK_LEARN 3      /* GPIOR0 = 3 before, 4 after tp_flynn_learn() */
#define TP_MARK_CALIBRATE 17 /* GPIOR0 = 17 / 18 around the start-up calibration (same code path) */
void tp_timer_init(void);
/* fn(x, scores) between GPIOR0 markers, its label in *label; cycles minus the calibrated call overhead
 * (0 on the host). */
uint32_t tp_time_call(tp_predict_fn fn, const int8_t *x, int32_t *scores, uint8_t *label, uint8_t mark);
uint16_t tp_stack_peak(void);
uint16_t tp_static_sram(void);

/* ---- tp_learn.c -------------------------------------------------------------------------------------------- */
#ifdef TP_FLYNN_LEARN
/* Defined in tp_flynn.c (same TP_FLYNN_LEARN switch): the packed SRAM counts and the learning step. */
#define TP_FLYNN_COUNT_BYTES ((uint16_t)(((uint32_t)TP_FLYNN_M * TP_N_CLASSES * TP_FLYNN_BITS + 7u) / 8u))
extern uint8_t tp_flynn_counts[TP_FLYNN_COUNT_BYTES];
void tp_flynn_counts_from_flash(void);
void tp_flynn_learn(const int8_t *x, uint8_t label);

#ifndef TP_FLYNN_EEPROM_ADDR
#define TP_FLYNN_EEPROM_ADDR 0u
#endif
#if defined(__AVR__)
#include <avr/io.h>
#define TP_EEPROM_BYTES (E2END + 1UL)
#elif !defined(TP_EEPROM_BYTES)
#define TP_EEPROM_BYTES 1024UL /* host build: an erased EEPROM that lives as long as the process */
#endif
/* Plain integers: the preprocessor cannot evaluate the casts of TP_FLYNN_COUNT_BYTES. */
#if TP_FLYNN_EEPROM_ADDR + TP_EE_HEADER + (TP_FLYNN_M * TP_N_CLASSES * TP_FLYNN_BITS + 7) / 8 <= TP_EEPROM_BYTES
#define TP_FLYNN_EEPROM 1
#define TP_LEARN_FLAGS (TP_HELLO_FLAG_LEARN | TP_HELLO_FLAG_EEPROM)
#else /* the counts do not fit the EEPROM: no EEPROM messages (the host checks this before building) */
#define TP_LEARN_FLAGS TP_HELLO_FLAG_LEARN
#endif

extern uint32_t tp_learn_samples;
void tp_learn_init(void);
/* LEARN's last chunk arrived: learn x (the whole vector) with `label`, answer n_samples and cycles. */
void tp_on_learn(uint8_t seq, const int8_t *x, uint8_t label);
/* Every well-formed request, before it is handled: 1 if it was the LEARN just learned, sent again with its seq,
 * and is now answered again (not learned twice); any other request ends that. */
uint8_t tp_learn_repeat(uint8_t type, uint8_t seq);
/* Exact payload length of READ_COUNTS / CLEAR / EEPROM_*, or TP_NO_SUCH_TYPE if this build lacks the type. */
uint16_t tp_learn_payload(uint8_t type);
void tp_on_learning_request(uint8_t type, uint8_t seq);
#else
#define TP_LEARN_FLAGS 0
#endif

#define TP_NO_SUCH_TYPE 0xFFFFu

/* ---- tp_main.c ---------------------------------------------------------------------------------------------- */
void tp_app_init(void);
#ifndef TP_RX_WINDOWED
void tp_app_byte(uint8_t c); /* one received byte (with a receive ring, tp_port_receive feeds whole frames) */
#endif

#endif /* TP_APP_H */
