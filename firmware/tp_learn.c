/* tinyproto device application, on-device learning (TP_FLYNN_LEARN, the FlyNN learning firmware): LEARN,
 * READ_COUNTS, CLEAR, EEPROM_SAVE, EEPROM_LOAD. The counts live in SRAM (tp_flynn.c); LEARN's chunks are gathered
 * by tp_main.c, which calls tp_on_learn() with the whole int8 vector.
 *
 * EEPROM record at TP_FLYNN_EEPROM_ADDR, little-endian, offsets TP_EE_*_AT of include/tinyproto_sizes.h:
 *   'T' 'F' | layout key u32 | count bytes u16 | n_samples u32 | crc16 u16 | packed counts (at TP_EE_HEADER)
 * The CRC (tp_crc16) covers n_samples and the counts, so a save cut short by a power loss reads back as "no
 * record" instead of as wrong counts. Saving writes only the bytes that differ (EEPROM cells wear out after
 * ~100 000 writes), and only when the host asks for it. */
#include "tp_app.h"

#ifdef TP_FLYNN_LEARN
#ifndef TP_FLYNN_LAYOUT_KEY /* tinyproto learn passes the host's key; this fallback covers hand builds */
#define TP_FLYNN_LAYOUT_KEY                                                                                       \
    (((uint32_t)TP_FLYNN_SEED << 16) ^ ((uint32_t)TP_FLYNN_M << 3) ^ ((uint32_t)TP_FLYNN_S << 24) ^                   \
     ((uint32_t)TP_N_CLASSES << 8) ^ ((uint32_t)TP_FLYNN_RHO << 12) ^ ((uint32_t)TP_N_FEATURES << 18) ^         \
     ((uint32_t)TP_FLYNN_BITS << 29) ^ ((uint32_t)TP_FLYNN_SPLIT << 31) ^ (uint32_t)TP_FLYNN_SEEDED)
#endif
#define TP_EE_RECORD (TP_EE_HEADER + (uint32_t)TP_FLYNN_COUNT_BYTES)
#define TP_COUNTS_CHUNK (TP_BUF_SIZE - TP_FRAME_OVERHEAD - 2u) /* READ_COUNTS data bytes one answer can carry */

#if defined(__AVR__)
#include <avr/eeprom.h>
#else /* host build: an erased EEPROM that lives as long as the process */
static uint8_t tp_ee_image[TP_EEPROM_BYTES];
#endif

/* Only a firmware with a record has EEPROM accessors: unused static functions would fail its -Werror build. */
#ifdef TP_FLYNN_EEPROM
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
#endif /* TP_FLYNN_EEPROM */

uint32_t tp_learn_samples; /* samples learned since start-up / CLEAR, or as restored by EEPROM_LOAD */

/* The LEARN just learned, until any other request arrives: the host sends a request again, with its seq, when
 * the answer was lost or came after its timeout (a busy host, a noisy line), and learning that sample twice
 * would change the counts. So that LEARN is answered again, with the same figures, and not learned again. */
static uint8_t tp_learned_seq;
static uint8_t tp_learned_live; /* 1 while the last request was that LEARN */
static uint32_t tp_learned_cycles;

void tp_learn_init(void)
{
    tp_flynn_counts_from_flash();
    tp_learn_samples = 0;
    tp_learned_live = 0;
#if !defined(__AVR__)
    memset(tp_ee_image, 0xFF, sizeof tp_ee_image);
#endif
}

/* The learning step behind the predict signature, so tp_time_call() measures it on the same code path. */
static uint8_t tp_learn_label;

static uint8_t tp_learn_step(const int8_t *x, int32_t *scores)
{
    (void)scores;
    tp_flynn_learn(x, tp_learn_label);
    return 0;
}

static void tp_learn_ack(uint8_t seq)
{
    tp_put_u32(tp_buf.b + 2, tp_learn_samples);
    tp_put_u32(tp_buf.b + 6, tp_learned_cycles);
    tp_reply(TP_MSG_LEARN | TP_MSG_RESPONSE, seq, TP_LEARN_ACK);
}

void tp_on_learn(uint8_t seq, const int8_t *x, uint8_t label)
{
    uint8_t unused;
    tp_learn_label = label;
    tp_learned_cycles = tp_time_call(tp_learn_step, x, 0, &unused, TP_MARK_LEARN);
    if (tp_learn_samples != UINT32_MAX) {
        ++tp_learn_samples;
    }
    tp_learned_seq = seq;
    tp_learned_live = 1;
    tp_learn_ack(seq);
}

uint8_t tp_learn_repeat(uint8_t type, uint8_t seq)
{
    if (tp_learned_live && type == TP_MSG_LEARN && seq == tp_learned_seq) {
        tp_learn_ack(seq);
        return 1;
    }
    tp_learned_live = 0;
    return 0;
}

/* READ_COUNTS: offset u16 at 2, length u8 at 4 -> total u16, then as many bytes as asked, left and fit. */
static void tp_on_read_counts(uint8_t seq)
{
    uint16_t offset = tp_get_u16(tp_buf.b + 2);
    uint16_t n = tp_buf.b[4];
    if (offset > TP_FLYNN_COUNT_BYTES) {
        tp_reply_error(seq, TP_ERR_ARGUMENT);
        return;
    }
    if (n > (uint16_t)(TP_FLYNN_COUNT_BYTES - offset)) {
        n = (uint16_t)(TP_FLYNN_COUNT_BYTES - offset);
    }
    if (n > TP_COUNTS_CHUNK) {
        n = TP_COUNTS_CHUNK;
    }
    tp_put_u16(tp_buf.b + 2, TP_FLYNN_COUNT_BYTES);
    memcpy(tp_buf.b + 4, tp_flynn_counts + offset, n);
    tp_reply(TP_MSG_READ_COUNTS | TP_MSG_RESPONSE, seq, (uint16_t)(2u + n));
}

static void tp_on_clear(uint8_t seq)
{
    memset(tp_flynn_counts, 0, TP_FLYNN_COUNT_BYTES);
    tp_learn_samples = 0;
    tp_reply(TP_MSG_CLEAR | TP_MSG_RESPONSE, seq, 0);
}

#ifdef TP_FLYNN_EEPROM
/* The record's header as it is (to be) stored; the CRC covers n_samples (bytes 8..11) and then the counts. */
static void tp_ee_header(uint8_t *h)
{
    h[TP_EE_MAGIC_AT] = 'T';
    h[TP_EE_MAGIC_AT + 1u] = 'F';
    tp_put_u32(h + TP_EE_KEY_AT, (uint32_t)TP_FLYNN_LAYOUT_KEY);
    tp_put_u16(h + TP_EE_COUNT_BYTES_AT, TP_FLYNN_COUNT_BYTES);
    tp_put_u32(h + TP_EE_SAMPLES_AT, tp_learn_samples);
    uint16_t crc = tp_crc16(0xFFFFu, h + TP_EE_SAMPLES_AT, 4);
    tp_put_u16(h + TP_EE_CRC_AT, tp_crc16(crc, tp_flynn_counts, TP_FLYNN_COUNT_BYTES));
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
    for (uint16_t i = 0; i < TP_FLYNN_COUNT_BYTES; ++i) {
        written = (uint16_t)(written + tp_ee_put((uint16_t)(TP_FLYNN_EEPROM_ADDR + TP_EE_HEADER + i), tp_flynn_counts[i]));
    }
    for (uint8_t i = 0; i < TP_EE_HEADER; ++i) {
        written = (uint16_t)(written + tp_ee_put((uint16_t)(TP_FLYNN_EEPROM_ADDR + i), h[i]));
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
        h[i] = tp_ee_read((uint16_t)(TP_FLYNN_EEPROM_ADDR + i));
    }
    if (h[TP_EE_MAGIC_AT] != 'T' || h[TP_EE_MAGIC_AT + 1u] != 'F') {
        return TP_EEPROM_EMPTY;
    }
    if (tp_get_u32(h + TP_EE_KEY_AT) != (uint32_t)TP_FLYNN_LAYOUT_KEY ||
        tp_get_u16(h + TP_EE_COUNT_BYTES_AT) != TP_FLYNN_COUNT_BYTES) {
        return TP_EEPROM_OTHER;
    }
    uint16_t crc = tp_crc16(0xFFFFu, h + TP_EE_SAMPLES_AT, 4);
    for (uint16_t i = 0; i < TP_FLYNN_COUNT_BYTES; ++i) {
        uint8_t byte = tp_ee_read((uint16_t)(TP_FLYNN_EEPROM_ADDR + TP_EE_HEADER + i));
        crc = tp_crc16(crc, &byte, 1);
    }
    if (crc != tp_get_u16(h + TP_EE_CRC_AT)) {
        return TP_EEPROM_EMPTY;
    }
    for (uint16_t i = 0; i < TP_FLYNN_COUNT_BYTES; ++i) {
        tp_flynn_counts[i] = tp_ee_read((uint16_t)(TP_FLYNN_EEPROM_ADDR + TP_EE_HEADER + i));
    }
    tp_learn_samples = tp_get_u32(h + TP_EE_SAMPLES_AT);
    return TP_EEPROM_LOADED;
}

static void tp_on_eeprom_load(uint8_t seq)
{
    tp_buf.b[2] = tp_ee_load();
    tp_put_u32(tp_buf.b + 3, tp_learn_samples);
    tp_reply(TP_MSG_EEPROM_LOAD | TP_MSG_RESPONSE, seq, 5);
}
#endif /* TP_FLYNN_EEPROM */

uint16_t tp_learn_payload(uint8_t type)
{
    if (type == TP_MSG_READ_COUNTS) {
        return 3;
    }
    if (type == TP_MSG_CLEAR) {
        return 0;
    }
#ifdef TP_FLYNN_EEPROM
    if (type == TP_MSG_EEPROM_SAVE || type == TP_MSG_EEPROM_LOAD) {
        return 0;
    }
#endif
    return TP_NO_SUCH_TYPE;
}

void tp_on_learning_request(uint8_t type, uint8_t seq)
{
    if (type == TP_MSG_READ_COUNTS) {
        tp_on_read_counts(seq);
    } else if (type == TP_MSG_CLEAR) {
        tp_on_clear(seq);
#ifdef TP_FLYNN_EEPROM
    } else if (type == TP_MSG_EEPROM_SAVE) {
        tp_on_eeprom_save(seq);
    } else {
        tp_on_eeprom_load(seq);
#endif
    }
}
#else
typedef int tp_learn_unused_t; /* ISO C: a translation unit must declare something */
#endif /* TP_FLYNN_LEARN */
