/* tinyproto device application: answers HELLO / PREDICT / PREDICT_RAW / STATS frames (docs/design.md), and with
 * TP_FLY_LEARN also LEARN / READ_COUNTS / CLEAR / EEPROM_SAVE / EEPROM_LOAD.
 *
 * One static buffer serves as receive buffer, work area and transmit buffer: the device is strictly
 * request/response, so a request is fully consumed before its response is built in the same bytes.
 *
 * Compile-time options:
 *   TP_NO_RAW_INPUT  - no PREDICT_RAW (answered ERROR unknown type): the buffer shrinks from 5 * n_features
 *                      to n_features bytes + scores, and tp_input_quantize() (soft float) is never called.
 *   TP_HOST          - informational; any non-AVR build talks over stdin/stdout and reports cycles = 0.
 *   TP_PORT_CUSTOM   - host only: no main(), no stdio; the including file defines tp_port_putc() and
 *                      tp_port_flush() and feeds bytes to tp_app_byte() itself (the fuzz harness).
 *   TP_MAX_BUF       - AVR only: refuse to build if the frame buffer exceeds this many bytes (default 1024).
 *   TP_BAUD          - UART baud rate (default 115200, double speed: UBRR0 = 16 at 16 MHz; the board file's
 *                      serial_baud, e.g. 57600 at 8 MHz). USART0, or USART1 on the ATmega32U4.
 *   TP_FLY_LEARN     - FlyNN only: the learning firmware. The counts live in SRAM (tp_flynn.c), LEARN updates
 *                      them, inference uses them; EEPROM_SAVE / EEPROM_LOAD persist them when the record fits.
 *   TP_FLY_LAYOUT_KEY - with TP_FLY_LEARN: 32-bit identity of the model without its counts (M, sizes, input
 *                      stage), stored with the EEPROM record so counts of another model are never loaded.
 *   TP_FLY_EEPROM_ADDR - with TP_FLY_LEARN: EEPROM address of the record (default 0).
 */
#include <stdint.h>
#include <string.h>

#include "tinyproto.h"
#include "tinyproto_model.h"
#include "tp_serial.h"

#ifndef TP_FAMILY_ID
#error "tinyproto_model.h must define TP_FAMILY_ID (1 = protonn, 2 = flynn)"
#endif
#if TP_N_CLASSES < 1 || TP_N_CLASSES > 255 || TP_N_FEATURES < 1 || TP_N_FEATURES > 65535
#error "TP_N_CLASSES must be 1..255 and TP_N_FEATURES 1..65535 (the HELLO fields are u8 and u16)"
#endif

#ifdef TP_FLY_LEARN
#ifndef TP_FAMILY_FLYNN
#error "TP_FLY_LEARN is the FlyNN learning firmware: the model must be a FlyNN"
#endif
/* Defined in tp_flynn.c (same TP_FLY_LEARN switch): the packed SRAM counts and the learning step. */
#define TP_FLY_COUNT_BYTES ((uint16_t)(((uint32_t)TP_FLY_M * TP_N_CLASSES * TP_FLY_BITS + 7u) / 8u))
extern uint8_t tp_fly_counts[TP_FLY_COUNT_BYTES];
void tp_fly_counts_from_flash(void);
void tp_fly_learn(const int8_t *x, uint8_t label);
#endif

/* ---- buffer layout ---------------------------------------------------------------------------------------
 * F = TP_N_FEATURES, C = TP_N_CLASSES. Offsets into tp_buf.b:
 *   request       [type seq payload crc]               PREDICT: x at 2; PREDICT_RAW: float32 at 2
 *   PREDICT_RAW   raw floats moved down to 0 (aligned), x quantized at 4F
 *   scores        int32[C] always in the LAST 4C bytes (aligned: the buffer size is a multiple of 4)
 *   response      [type seq label cycles (x) scores crc] built from offset 0; scores are copied DOWN from the
 *                 tail, which is safe element by element because the tail starts past the response's scores.
 */
#define TP_MAX2(a, b) ((a) > (b) ? (a) : (b))
#define TP_SCORE_BYTES (4u * TP_N_CLASSES)
#define TP_PRED_HEAD 7u /* type seq label cycles */

#ifdef TP_NO_RAW_INPUT
#define TP_REQ_MAX (TP_FRAME_OVERHEAD + TP_N_FEATURES)
#define TP_WORK_MAX (2u + TP_N_FEATURES + TP_SCORE_BYTES)
#define TP_RESP_MAX (TP_PRED_HEAD + TP_SCORE_BYTES + 2u)
#else
#define TP_REQ_MAX (TP_FRAME_OVERHEAD + 4u * TP_N_FEATURES)
#define TP_WORK_MAX (5u * TP_N_FEATURES + TP_SCORE_BYTES)
#define TP_RESP_MAX (TP_PRED_HEAD + TP_N_FEATURES + TP_SCORE_BYTES + 2u)
#endif
#define TP_HELLO_MAX (TP_FRAME_OVERHEAD + TP_HELLO_PAYLOAD)
#ifdef TP_FLY_LEARN
#define TP_LEARN_REQ_MAX (TP_FRAME_OVERHEAD + 1u + TP_N_FEATURES) /* label + x; every other learning frame is
                                                                      smaller than HELLO's answer */
#else
#define TP_LEARN_REQ_MAX 0u
#endif
#define TP_BUF_NEED \
    TP_MAX2(TP_MAX2(TP_MAX2(TP_REQ_MAX, TP_WORK_MAX), TP_MAX2(TP_RESP_MAX, TP_HELLO_MAX)), TP_LEARN_REQ_MAX)
#define TP_BUF_SIZE ((TP_BUF_NEED + 3u) & ~3u)
#define TP_SCORES_AT (TP_BUF_SIZE - TP_SCORE_BYTES)

#if TP_BUF_SIZE > 65535
#error "frames this large do not fit the parser's 16-bit lengths"
#endif
#ifndef TP_MAX_BUF
#define TP_MAX_BUF 1024
#endif
#if defined(__AVR__) && TP_BUF_SIZE > TP_MAX_BUF
#ifdef TP_NO_RAW_INPUT
#error "the frame buffer (n_features + 4 * n_classes bytes) exceeds TP_MAX_BUF: too large for the 2 KB SRAM"
#else
#error "the frame buffer exceeds TP_MAX_BUF (2 KB SRAM): build with -DTP_NO_RAW_INPUT (raw input: 5 B/feature)"
#endif
#endif

typedef union {
    uint8_t b[TP_BUF_SIZE];
    int32_t i32[TP_BUF_SIZE / 4u];
    float f32[TP_BUF_SIZE / 4u];
} tp_buf_t;

static tp_buf_t tp_buf;
static tp_parser_t tp_rx;
static uint16_t tp_frames_bad;

/* ---- transport: the only machine-specific part besides timing and SRAM figures ---------------------------- */
#if defined(__AVR__)
#include <avr/interrupt.h>
#include <avr/io.h>

#ifndef F_CPU
#define F_CPU 16000000UL
#endif
#ifndef TP_BAUD
#define TP_BAUD 115200UL
#endif
/* U2X: UBRR 16 at 16 MHz and 115200, or at 8 MHz and 57600 (both +2.1 %; 115200 at 8 MHz would be -3.5 %). */
#define TP_UBRR ((F_CPU + 4UL * TP_BAUD) / (8UL * TP_BAUD) - 1UL)

/* The protocol's USART: USART0 (ATmega328P; the ATmega2560's USART0 has the same registers), or USART1 on a
 * chip without USART0 (ATmega32U4: the Leonardo's Serial1 on pins 0/1; its USB port is not used). */
#if defined(UDR0)
#define TP_UBRRH UBRR0H
#define TP_UBRRL UBRR0L
#define TP_UCSRA UCSR0A
#define TP_UCSRB UCSR0B
#define TP_UCSRC UCSR0C
#define TP_UDR UDR0
#define TP_U2X U2X0
#define TP_RXEN RXEN0
#define TP_TXEN TXEN0
#define TP_UCSZ1 UCSZ01
#define TP_UCSZ0 UCSZ00
#define TP_RXC RXC0
#define TP_UDRE UDRE0
#elif defined(UDR1)
#define TP_UBRRH UBRR1H
#define TP_UBRRL UBRR1L
#define TP_UCSRA UCSR1A
#define TP_UCSRB UCSR1B
#define TP_UCSRC UCSR1C
#define TP_UDR UDR1
#define TP_U2X U2X1
#define TP_RXEN RXEN1
#define TP_TXEN TXEN1
#define TP_UCSZ1 UCSZ11
#define TP_UCSZ0 UCSZ10
#define TP_RXC RXC1
#define TP_UDRE UDRE1
#else
#error "this MCU has neither USART0 nor USART1"
#endif

static void tp_port_init(void)
{
    TP_UBRRH = (uint8_t)(TP_UBRR >> 8);
    TP_UBRRL = (uint8_t)TP_UBRR;
    TP_UCSRA = _BV(TP_U2X);
    TP_UCSRB = _BV(TP_RXEN) | _BV(TP_TXEN);
    TP_UCSRC = _BV(TP_UCSZ1) | _BV(TP_UCSZ0); /* 8N1 */
}

static int16_t tp_port_getc(void)
{
    while (!(TP_UCSRA & _BV(TP_RXC))) {
    }
    return TP_UDR;
}

static void tp_port_putc(uint8_t c)
{
    while (!(TP_UCSRA & _BV(TP_UDRE))) {
    }
    TP_UDR = c;
}

static void tp_port_flush(void)
{
}

#elif defined(TP_PORT_CUSTOM)
static void tp_port_putc(uint8_t c); /* defined by the including file */
static void tp_port_flush(void);

#else
#include <stdio.h>

static void tp_port_init(void)
{
}

static int16_t tp_port_getc(void)
{
    int c = getchar();
    return c == EOF ? -1 : (int16_t)c;
}

static void tp_port_putc(uint8_t c)
{
    (void)putchar(c);
}

static void tp_port_flush(void)
{
    (void)fflush(stdout); /* a response must leave now: the host waits for it */
}
#endif

/* ---- cycles: Timer1 at clk/1 around tp_predict only ------------------------------------------------------ */
typedef uint8_t (*tp_predict_fn)(const int8_t *x, int32_t *scores);

#if defined(__AVR__)
#define TP_MARK_PREDICT 1    /* GPIOR0 = 1 before, 2 after tp_predict() */
#define TP_MARK_CALIBRATE 17 /* GPIOR0 = 17 / 18 around the start-up calibration (same code path) */

static volatile uint16_t tp_t1_overflows;
static uint16_t tp_overhead; /* cycles an empty call measures; subtracted from every figure */

ISR(TIMER1_OVF_vect)
{
    ++tp_t1_overflows;
}

static uint8_t tp_empty_predict(const int8_t *x, int32_t *scores)
{
    (void)x;
    (void)scores;
    return 0;
}

/* One code path for the calibration and the real call (the target comes in as a pointer, noclone keeps gcc
 * from specialising it), so their overheads are identical and cancel. */
__attribute__((noinline, noclone)) static uint32_t tp_timed(tp_predict_fn fn, const int8_t *x, int32_t *scores,
                                                            uint8_t *label, uint8_t mark)
{
    tp_t1_overflows = 0;
    TCNT1 = 0;
    TIFR1 = _BV(TOV1);
    TCCR1B = _BV(CS10);
    GPIOR0 = mark;
    uint8_t result = fn(x, scores);
    GPIOR0 = (uint8_t)(mark + 1u);
    /* Read the counter while it runs (simavr reads a stopped Timer1 as 0). An overflow whose interrupt has not
     * run yet shows as TOV1 set with a small count; a late TOV1 after reading a large count is not ours. */
    cli();
    uint16_t count = TCNT1;
    uint16_t overflows = tp_t1_overflows;
    if ((TIFR1 & _BV(TOV1)) && count < 0x8000u) {
        ++overflows;
    }
    TCCR1B = 0;
    TIFR1 = _BV(TOV1);
    sei();
    *label = result;
    return ((uint32_t)overflows << 16) | count;
}

static void tp_timer_init(void)
{
    TCCR1A = 0;
    TCCR1B = 0;
    TIMSK1 = _BV(TOIE1);
    sei();
    uint8_t unused;
    tp_overhead = (uint16_t)tp_timed(tp_empty_predict, 0, 0, &unused, TP_MARK_CALIBRATE);
}

static uint32_t tp_predict_timed(const int8_t *x, int32_t *scores, uint8_t *label)
{
    uint32_t cycles = tp_timed(tp_predict, x, scores, label, TP_MARK_PREDICT);
    return cycles > tp_overhead ? cycles - tp_overhead : 0;
}

#else /* host: no cycle counter */
static void tp_timer_init(void)
{
}

static uint32_t tp_predict_timed(const int8_t *x, int32_t *scores, uint8_t *label)
{
    *label = tp_predict(x, scores);
    return 0;
}
#endif

#ifdef TP_FLY_LEARN
/* The learning step behind the predict signature, so tp_timed() measures it on the same code path. */
static uint8_t tp_learn_label;

static uint8_t tp_learn_step(const int8_t *x, int32_t *scores)
{
    (void)scores;
    tp_fly_learn(x, tp_learn_label);
    return 0;
}

#if defined(__AVR__)
#define TP_MARK_LEARN 3 /* GPIOR0 = 3 before, 4 after tp_fly_learn() */

static uint32_t tp_learn_timed(const int8_t *x, uint8_t label)
{
    uint8_t unused;
    tp_learn_label = label;
    uint32_t cycles = tp_timed(tp_learn_step, x, 0, &unused, TP_MARK_LEARN);
    return cycles > tp_overhead ? cycles - tp_overhead : 0;
}
#else
static uint32_t tp_learn_timed(const int8_t *x, uint8_t label)
{
    tp_learn_label = label;
    (void)tp_learn_step(x, 0);
    return 0;
}
#endif
#endif /* TP_FLY_LEARN */

/* ---- SRAM figures: painted stack high-water mark and .data + .bss ---------------------------------------- */
#if defined(__AVR__)
#define TP_STACK_PAINT 0xC5

extern uint8_t __heap_start; /* first byte after .data, .bss and .noinit: free RAM up to the stack */
extern uint8_t __data_start;
extern uint8_t __bss_end;

/* Runs in .init3: the stack pointer is set, .data/.bss are not yet initialised and nothing lives above
 * __heap_start, so every byte from there to RAMEND is painted. Plain asm: a naked function must not rely on
 * the compiler keeping its locals out of a (non-existent) stack frame. */
void tp_stack_paint(void) __attribute__((naked, used, section(".init3")));
void tp_stack_paint(void)
{
    __asm__ volatile("    ldi r30, lo8(__heap_start)\n"
                     "    ldi r31, hi8(__heap_start)\n"
                     "    ldi r24, %0\n"
                     "    ldi r25, hi8(%1)\n"
                     "1:  st Z+, r24\n"
                     "    cpi r30, lo8(%1)\n"
                     "    cpc r31, r25\n"
                     "    brne 1b\n"
                     :
                     : "M"(TP_STACK_PAINT), "i"(RAMEND + 1)
                     : "r24", "r25", "r30", "r31", "memory");
}

/* Bytes of stack ever used: from RAMEND down to the lowest byte that lost its paint. */
static uint16_t tp_stack_peak(void)
{
    const volatile uint8_t *p = (const volatile uint8_t *)&__heap_start;
    while (p <= (const volatile uint8_t *)RAMEND && *p == TP_STACK_PAINT) {
        ++p;
    }
    return (uint16_t)(RAMEND + 1u - (uint16_t)(uintptr_t)p);
}

static uint16_t tp_static_sram(void)
{
    return (uint16_t)((uintptr_t)&__bss_end - (uintptr_t)&__data_start);
}
#else
static uint16_t tp_stack_peak(void)
{
    return 0;
}

static uint16_t tp_static_sram(void)
{
    return 0;
}
#endif

#ifndef F_CPU
#define F_CPU 0UL /* host build: HELLO reports f_cpu = 0 */
#endif

/* ---- responses --------------------------------------------------------------------------------------------- */
static void tp_reply(uint8_t type, uint8_t seq, uint16_t n_payload)
{
    tp_buf.b[0] = type;
    tp_buf.b[1] = seq;
    tp_frame_send(tp_buf.b, n_payload, tp_port_putc);
    tp_port_flush();
}

static void tp_reply_error(uint8_t seq, uint8_t code)
{
    if (tp_frames_bad != UINT16_MAX) {
        ++tp_frames_bad;
    }
    tp_buf.b[2] = code;
    tp_reply(TP_MSG_ERROR, seq, 1);
}

/* ---- on-device learning (TP_FLY_LEARN) ------------------------------------------------------------------
 * EEPROM record at TP_FLY_EEPROM_ADDR, little-endian:
 *   0 'T' 'F' | 2 layout key u32 | 6 count bytes u16 | 8 n_samples u32 | 12 crc16 u16 | 14 packed counts
 * The CRC (tp_crc16) covers n_samples and the counts, so a save cut short by a power loss reads back as "no
 * record" instead of as wrong counts. Saving writes only the bytes that differ (EEPROM cells wear out after
 * ~100 000 writes), and only when the host asks for it. */
#ifdef TP_FLY_LEARN
#ifndef TP_FLY_LAYOUT_KEY /* tinyproto learn passes the host's key; this fallback covers hand builds */
#define TP_FLY_LAYOUT_KEY                                                                                       \
    (((uint32_t)TP_FLY_SEED << 16) ^ ((uint32_t)TP_FLY_M << 3) ^ ((uint32_t)TP_FLY_S << 24) ^                   \
     ((uint32_t)TP_N_CLASSES << 8) ^ ((uint32_t)TP_FLY_RHO << 12) ^ ((uint32_t)TP_N_FEATURES << 18) ^         \
     ((uint32_t)TP_FLY_BITS << 29) ^ ((uint32_t)TP_FLY_SPLIT << 31) ^ (uint32_t)TP_FLY_SEEDED)
#endif
#ifndef TP_FLY_EEPROM_ADDR
#define TP_FLY_EEPROM_ADDR 0u
#endif
#define TP_EE_HEADER 14u
#define TP_EE_RECORD (TP_EE_HEADER + (uint32_t)TP_FLY_COUNT_BYTES)
#define TP_COUNTS_CHUNK (TP_BUF_SIZE - TP_FRAME_OVERHEAD - 2u) /* READ_COUNTS data bytes one answer can carry */

#if defined(__AVR__)
#include <avr/eeprom.h>
#define TP_EEPROM_BYTES (E2END + 1UL)
#else /* host build: an erased EEPROM that lives as long as the process */
#ifndef TP_EEPROM_BYTES
#define TP_EEPROM_BYTES 1024UL
#endif
static uint8_t tp_ee_image[TP_EEPROM_BYTES];
#endif

/* The same sizes as plain integers: the preprocessor cannot evaluate the casts above. */
#if TP_FLY_EEPROM_ADDR + TP_EE_HEADER + (TP_FLY_M * TP_N_CLASSES * TP_FLY_BITS + 7) / 8 <= TP_EEPROM_BYTES
#define TP_FLY_EEPROM 1
#define TP_LEARN_FLAGS (TP_HELLO_FLAG_LEARN | TP_HELLO_FLAG_EEPROM)
#else /* the counts do not fit the EEPROM: no EEPROM messages (the host checks this before building) */
#define TP_LEARN_FLAGS TP_HELLO_FLAG_LEARN
#endif

/* Only a firmware with a record has EEPROM accessors: unused static functions would fail its -Werror build. */
#ifdef TP_FLY_EEPROM
#if defined(__AVR__)
static uint8_t tp_ee_read(uint16_t addr)
{
    return eeprom_read_byte((const uint8_t *)(uintptr_t)addr);
}

static void tp_ee_update(uint16_t addr, uint8_t value)
{
    eeprom_update_byte((uint8_t *)(uintptr_t)addr, value); /* avr-libc skips the write if the byte is equal */
}
#else
static uint8_t tp_ee_read(uint16_t addr)
{
    return tp_ee_image[addr];
}

static void tp_ee_update(uint16_t addr, uint8_t value)
{
    tp_ee_image[addr] = value;
}
#endif
#endif /* TP_FLY_EEPROM */

static uint32_t tp_learn_samples; /* samples learned since start-up / CLEAR, or as restored by EEPROM_LOAD */

static void tp_learn_init(void)
{
    tp_fly_counts_from_flash();
    tp_learn_samples = 0;
#if !defined(__AVR__)
    memset(tp_ee_image, 0xFF, sizeof tp_ee_image);
#endif
}

/* LEARN: label at 2, x at 3. */
static void tp_on_learn(uint8_t seq)
{
    uint8_t label = tp_buf.b[2];
    if (label >= TP_N_CLASSES) {
        tp_reply_error(seq, TP_ERR_ARGUMENT);
        return;
    }
    uint32_t cycles = tp_learn_timed((const int8_t *)(tp_buf.b + 3), label);
    if (tp_learn_samples != UINT32_MAX) {
        ++tp_learn_samples;
    }
    tp_put_u32(tp_buf.b + 2, tp_learn_samples);
    tp_put_u32(tp_buf.b + 6, cycles);
    tp_reply(TP_MSG_LEARN | TP_MSG_RESPONSE, seq, 8);
}

/* READ_COUNTS: offset u16 at 2, length u8 at 4 -> total u16, then as many bytes as asked, left and fit. */
static void tp_on_read_counts(uint8_t seq)
{
    uint16_t offset = tp_get_u16(tp_buf.b + 2);
    uint16_t n = tp_buf.b[4];
    if (offset > TP_FLY_COUNT_BYTES) {
        tp_reply_error(seq, TP_ERR_ARGUMENT);
        return;
    }
    if (n > (uint16_t)(TP_FLY_COUNT_BYTES - offset)) {
        n = (uint16_t)(TP_FLY_COUNT_BYTES - offset);
    }
    if (n > TP_COUNTS_CHUNK) {
        n = TP_COUNTS_CHUNK;
    }
    tp_put_u16(tp_buf.b + 2, TP_FLY_COUNT_BYTES);
    memcpy(tp_buf.b + 4, tp_fly_counts + offset, n);
    tp_reply(TP_MSG_READ_COUNTS | TP_MSG_RESPONSE, seq, (uint16_t)(2u + n));
}

static void tp_on_clear(uint8_t seq)
{
    memset(tp_fly_counts, 0, TP_FLY_COUNT_BYTES);
    tp_learn_samples = 0;
    tp_reply(TP_MSG_CLEAR | TP_MSG_RESPONSE, seq, 0);
}

#ifdef TP_FLY_EEPROM
/* The record's header as it is (to be) stored; the CRC covers n_samples (bytes 8..11) and then the counts. */
static void tp_ee_header(uint8_t *h)
{
    h[0] = 'T';
    h[1] = 'F';
    tp_put_u32(h + 2, (uint32_t)TP_FLY_LAYOUT_KEY);
    tp_put_u16(h + 6, TP_FLY_COUNT_BYTES);
    tp_put_u32(h + 8, tp_learn_samples);
    uint16_t crc = tp_crc16(0xFFFFu, h + 8, 4);
    tp_put_u16(h + 12, tp_crc16(crc, tp_fly_counts, TP_FLY_COUNT_BYTES));
}

/* Write `value` only if the cell holds something else; returns 1 when it did. */
static uint8_t tp_ee_put(uint16_t addr, uint8_t value)
{
    if (tp_ee_read(addr) == value) {
        return 0;
    }
    tp_ee_update(addr, value);
    return 1;
}

/* Counts first, header last: an interrupted save leaves a CRC that does not match, i.e. no record. */
static void tp_on_eeprom_save(uint8_t seq)
{
    uint8_t *h = tp_buf.b + 8; /* the request is consumed; the answer needs bytes 0..7 only */
    uint16_t written = 0;
    tp_ee_header(h);
    for (uint16_t i = 0; i < TP_FLY_COUNT_BYTES; ++i) {
        written = (uint16_t)(written + tp_ee_put((uint16_t)(TP_FLY_EEPROM_ADDR + TP_EE_HEADER + i), tp_fly_counts[i]));
    }
    for (uint8_t i = 0; i < TP_EE_HEADER; ++i) {
        written = (uint16_t)(written + tp_ee_put((uint16_t)(TP_FLY_EEPROM_ADDR + i), h[i]));
    }
    tp_put_u16(tp_buf.b + 2, written);
    tp_put_u16(tp_buf.b + 4, (uint16_t)TP_EE_RECORD);
    tp_reply(TP_MSG_EEPROM_SAVE | TP_MSG_RESPONSE, seq, 4);
}

/* Check the record (magic, layout, size, CRC) before touching the SRAM counts; load them only if it is valid. */
static uint8_t tp_ee_load(void)
{
    uint8_t h[TP_EE_HEADER];
    for (uint8_t i = 0; i < TP_EE_HEADER; ++i) {
        h[i] = tp_ee_read((uint16_t)(TP_FLY_EEPROM_ADDR + i));
    }
    if (h[0] != 'T' || h[1] != 'F') {
        return TP_EEPROM_EMPTY;
    }
    if (tp_get_u32(h + 2) != (uint32_t)TP_FLY_LAYOUT_KEY || tp_get_u16(h + 6) != TP_FLY_COUNT_BYTES) {
        return TP_EEPROM_OTHER;
    }
    uint16_t crc = tp_crc16(0xFFFFu, h + 8, 4);
    for (uint16_t i = 0; i < TP_FLY_COUNT_BYTES; ++i) {
        uint8_t byte = tp_ee_read((uint16_t)(TP_FLY_EEPROM_ADDR + TP_EE_HEADER + i));
        crc = tp_crc16(crc, &byte, 1);
    }
    if (crc != tp_get_u16(h + 12)) {
        return TP_EEPROM_EMPTY;
    }
    for (uint16_t i = 0; i < TP_FLY_COUNT_BYTES; ++i) {
        tp_fly_counts[i] = tp_ee_read((uint16_t)(TP_FLY_EEPROM_ADDR + TP_EE_HEADER + i));
    }
    tp_learn_samples = tp_get_u32(h + 8);
    return TP_EEPROM_LOADED;
}

static void tp_on_eeprom_load(uint8_t seq)
{
    tp_buf.b[2] = tp_ee_load();
    tp_put_u32(tp_buf.b + 3, tp_learn_samples);
    tp_reply(TP_MSG_EEPROM_LOAD | TP_MSG_RESPONSE, seq, 5);
}
#endif /* TP_FLY_EEPROM */

/* Payload length of a learning request, or 0xFFFF (TP_NO_SUCH_TYPE) if this build does not answer it. */
static uint16_t tp_learn_payload(uint8_t type)
{
    if (type == TP_MSG_LEARN) {
        return 1u + TP_N_FEATURES;
    }
    if (type == TP_MSG_READ_COUNTS) {
        return 3;
    }
    if (type == TP_MSG_CLEAR) {
        return 0;
    }
#ifdef TP_FLY_EEPROM
    if (type == TP_MSG_EEPROM_SAVE || type == TP_MSG_EEPROM_LOAD) {
        return 0;
    }
#endif
    return 0xFFFFu;
}

static void tp_on_learning_request(uint8_t type, uint8_t seq)
{
    if (type == TP_MSG_LEARN) {
        tp_on_learn(seq);
    } else if (type == TP_MSG_READ_COUNTS) {
        tp_on_read_counts(seq);
    } else if (type == TP_MSG_CLEAR) {
        tp_on_clear(seq);
#ifdef TP_FLY_EEPROM
    } else if (type == TP_MSG_EEPROM_SAVE) {
        tp_on_eeprom_save(seq);
    } else {
        tp_on_eeprom_load(seq);
#endif
    }
}
#else
#define TP_LEARN_FLAGS 0
#endif /* TP_FLY_LEARN */

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
#ifdef TP_NO_RAW_INPUT
    p[20] = TP_LEARN_FLAGS;
#else
    p[20] = TP_HELLO_FLAG_RAW | TP_LEARN_FLAGS;
#endif
    tp_reply(TP_MSG_HELLO | TP_MSG_RESPONSE, seq, TP_HELLO_PAYLOAD);
}

static void tp_on_stats(uint8_t seq)
{
    tp_put_u16(tp_buf.b + 2, tp_stack_peak());
    tp_put_u16(tp_buf.b + 4, tp_static_sram());
    tp_put_u16(tp_buf.b + 6, tp_frames_bad);
    tp_reply(TP_MSG_STATS | TP_MSG_RESPONSE, seq, 6);
}

/* Run the model on x, then lay out label, cycles, (x,) scores from offset 2 and send. x must not overlap the
 * response header or the scores tail; the callers place it at 2 (PREDICT) or 4F (PREDICT_RAW). */
static void tp_predict_and_reply(uint8_t type, uint8_t seq, const int8_t *x, uint16_t n_x)
{
    int32_t *scores = &tp_buf.i32[TP_SCORES_AT / 4u];
    uint8_t label;
    uint32_t cycles = tp_predict_timed(x, scores, &label);
    uint8_t *out = tp_buf.b + TP_PRED_HEAD;
    if (n_x != 0) {
        memmove(out, x, n_x);
        out += n_x;
    }
    for (uint8_t c = 0; c < TP_N_CLASSES; ++c) {
        tp_put_u32(out + 4u * c, (uint32_t)scores[c]); /* writes stay below scores[c + 1] */
    }
    tp_buf.b[2] = label;
    tp_put_u32(tp_buf.b + 3, cycles);
    tp_reply(type | TP_MSG_RESPONSE, seq, (uint16_t)(TP_PRED_HEAD - 2u + n_x + TP_SCORE_BYTES));
}

#ifndef TP_NO_RAW_INPUT
static void tp_on_predict_raw(uint8_t seq)
{
    /* float32 LE at offset 2 -> aligned float[] at offset 0, in place, front to back (each element's source
     * is read whole before its destination, two bytes lower, is written). */
    for (uint16_t i = 0; i < TP_N_FEATURES; ++i) {
        union {
            uint32_t u;
            float f;
        } v;
        v.u = tp_get_u32(tp_buf.b + 2u + 4u * i);
        tp_buf.f32[i] = v.f;
    }
    int8_t *x = (int8_t *)(tp_buf.b + 4u * TP_N_FEATURES);
    tp_input_quantize(tp_buf.f32, x);
    tp_predict_and_reply(TP_MSG_PREDICT_RAW, seq, x, TP_N_FEATURES);
}
#endif

#define TP_NO_SUCH_TYPE 0xFFFFu

/* Payload length a request type must have, or TP_NO_SUCH_TYPE if this firmware does not implement it.
 * An if chain, not a switch: avr-gcc turns such a switch into a lookup table in .data, i.e. SRAM. */
static uint16_t tp_request_payload(uint8_t type)
{
    if (type == TP_MSG_HELLO || type == TP_MSG_STATS) {
        return 0;
    }
    if (type == TP_MSG_PREDICT) {
        return TP_N_FEATURES;
    }
#ifndef TP_NO_RAW_INPUT
    if (type == TP_MSG_PREDICT_RAW) {
        return 4u * TP_N_FEATURES;
    }
#endif
#ifdef TP_FLY_LEARN
    return tp_learn_payload(type);
#else
    return TP_NO_SUCH_TYPE;
#endif
}

static void tp_dispatch(uint16_t len)
{
    uint8_t type = tp_buf.b[0];
    uint8_t seq = tp_buf.b[1];
    uint16_t want = tp_request_payload(type);
    if (want == TP_NO_SUCH_TYPE) {
        tp_reply_error(seq, TP_ERR_UNKNOWN_TYPE);
    } else if ((uint16_t)(len - TP_FRAME_OVERHEAD) != want) {
        tp_reply_error(seq, TP_ERR_LENGTH);
    } else if (type == TP_MSG_HELLO) {
        tp_on_hello(seq);
    } else if (type == TP_MSG_STATS) {
        tp_on_stats(seq);
    } else if (type == TP_MSG_PREDICT) {
        tp_predict_and_reply(TP_MSG_PREDICT, seq, (const int8_t *)(tp_buf.b + 2), 0); /* x stays in place */
#ifdef TP_FLY_LEARN
    } else if (type >= TP_MSG_LEARN) {
        tp_on_learning_request(type, seq);
#endif
    } else {
#ifndef TP_NO_RAW_INPUT
        tp_on_predict_raw(seq);
#endif
    }
}

/* ---- the application: init once (timer calibration included), then one call per received byte ------------ */
static void tp_app_init(void)
{
    tp_timer_init();
    tp_parser_init(&tp_rx, tp_buf.b, TP_BUF_SIZE);
    tp_frames_bad = 0;
#ifdef TP_FLY_LEARN
    tp_learn_init();
#endif
}

static void tp_app_byte(uint8_t c)
{
    tp_rx_t status = tp_parser_feed(&tp_rx, c);
    if (status == TP_RX_NONE) {
        return;
    }
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
        code = tp_request_payload(tp_buf.b[0]) == TP_NO_SUCH_TYPE ? TP_ERR_UNKNOWN_TYPE : TP_ERR_TOO_LONG;
    }
    tp_reply_error(seq, code);
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
