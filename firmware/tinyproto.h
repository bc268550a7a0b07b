/* tinyproto runtime: the common header shared by every model family.
 *
 * The generated include/tinyproto_model.h holds the model's data and constants; the runtime files
 * (tp_<family>.c, tp_input.c) hold the code. No malloc, fixed-width types, no float in tp_predict().
 *
 * Compile-time options:
 *   TP_HOST  - build for the host (gcc/clang): PROGMEM becomes a plain const array.
 */
#ifndef TINYPROTO_H
#define TINYPROTO_H

#include <stdint.h>

#define TP_RUNTIME_ABI 1

#if defined(__AVR__)
#include <avr/pgmspace.h>
#define tp_read_u8(p) pgm_read_byte(p)
#define tp_read_i8(p) ((int8_t)pgm_read_byte(p))
#define tp_read_u16(p) pgm_read_word(p)
#define tp_read_i16(p) ((int16_t)pgm_read_word(p))
#else
#define PROGMEM
#define tp_read_u8(p) (*(const uint8_t *)(p))
#define tp_read_i8(p) (*(const int8_t *)(p))
#define tp_read_u16(p) (*(const uint16_t *)(p))
#define tp_read_i16(p) (*(const int16_t *)(p))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Classify one int8 input vector of TP_N_FEATURES values. Writes TP_N_CLASSES int32 scores and returns the
 * class index (ProtoNN: highest score, FlyNN: lowest novelty; ties go to the lowest index). */
uint8_t tp_predict(const int8_t *x, int32_t *scores);

/* Raw float features -> standardised int8 input, exactly as the host's InputStage.quantize(). */
void tp_input_quantize(const float *raw, int8_t *x);

#ifdef __cplusplus
}
#endif

#endif /* TINYPROTO_H */
