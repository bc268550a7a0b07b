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
#define tp_read_i32(p) ((int32_t)pgm_read_dword(p))
#else
#define PROGMEM
#define tp_read_u8(p) (*(const uint8_t *)(p))
#define tp_read_i8(p) (*(const int8_t *)(p))
#define tp_read_u16(p) (*(const uint16_t *)(p))
#define tp_read_i16(p) (*(const int16_t *)(p))
#define tp_read_i32(p) (*(const int32_t *)(p))
#endif

/* ---- Kernels: a portable C reference and its AVR-optimised twin ---------------------------------------------
 * Every inner loop of the runtime exists as a portable C99 reference (in tp_<family>.c, and the primitives
 * below) and, where assembly pays, as an AVR twin that computes the same integers faster (tp_avr.h, the
 * primitives; tp_<family>_avr.h, a family's kernels). This is the one place that chooses between them: the twins
 * on an AVR, the reference on any other target, and everywhere with -DTP_FORCE_REFERENCE (the tests build both
 * on the simulated board and compare each with the host reference). A twin may decline a model whose shape
 * is outside the bounds its accumulators are proven for: the reference kernel then runs. */
#if defined(__AVR__) && !defined(TP_FORCE_REFERENCE)
#define TP_KERNELS_AVR 1
#else
#define TP_KERNELS_AVR 0
#endif

#if TP_KERNELS_AVR
#include "tp_avr.h"
#else
/* The reference primitives: an 8x8 -> 16-bit product, and the next flash byte with the pointer advanced. The
 * unsigned product is taken in unsigned arithmetic: 255 * 255 overflows a 16-bit int (the AVR's). */
static inline int16_t tp_mul_s8(int8_t a, int8_t b) { return (int16_t)(a * b); }
static inline uint16_t tp_mul_u8(uint8_t a, uint8_t b) { return (uint16_t)((uint16_t)a * (uint16_t)b); }
static inline int16_t tp_mul_s8u8(int8_t a, uint8_t b) { return (int16_t)(a * b); }
/* a 16-bit unsigned variable shifted right in place by a constant number of bits */
#define TP_SHR16_BY(value, bits) ((value) >>= (bits))
static inline int8_t tp_next_i8(const int8_t **p)
{
    int8_t value = tp_read_i8(*p);
    ++*p;
    return value;
}
static inline uint8_t tp_next_u8(const uint8_t **p)
{
    uint8_t value = tp_read_u8(*p);
    ++*p;
    return value;
}
#endif

/* Keep an inner loop in its own function: inlined into a large frame, avr-gcc spills loop variables to
 * far stack slots (Y+63 and beyond need extra instructions on every access). */
#define TP_NOINLINE __attribute__((noinline))

/* Per-stage cycle markers for the latency benchmark (tools/bench_latency.py builds with -DTP_STAGE_MARKERS):
 * TP_STAGE(id) writes id to GPIOR0, which the simulator logs with its cycle; the span until the next marker is
 * charged to stage id. The normal firmware compiles them to nothing (its code and cycles do not change).
 * Ids: 0x20 input stage, 0x2F back to the device app; each family's own in tp_<family>.c (ProtoNN 0x30-0x32,
 * FlyNN 0x40-0x43, BNC 0x50-0x51). */
#if defined(TP_STAGE_MARKERS) && defined(__AVR__)
#include <avr/io.h>
#define TP_STAGE(id) (GPIOR0 = (uint8_t)(id))
#else
#define TP_STAGE(id) ((void)0)
#endif
#define TP_STAGE_INPUT 0x20
#define TP_STAGE_APP 0x2F

#ifdef __cplusplus
extern "C" {
#endif

/* ---- The C API (what a sketch or your own firmware calls; see docs/tutorials/arduino-sketch.md) --------------
 *
 *   float raw[TP_N_FEATURES]; int8_t x[TP_N_FEATURES]; int32_t scores[TP_N_CLASSES];
 *   tp_input_quantize(raw, x);                 // from raw floats (your sensor's units)
 *   uint8_t label = tp_predict(x, scores);     // from int8; scores[] is the score vector
 *
 * Both are plain C (callable from C++: the prototypes sit in extern "C"), allocate nothing and keep the model in
 * flash. The streaming functions below keep their running state in static SRAM (one stream at a time); a
 * tp_predict that runs through that stream (Bloom features; ProtoNN with a column-coded W) is therefore not
 * reentrant: do not call it from an interrupt while the main loop is in it. Each family declares this per model
 * (tinyproto.families.StaticState); `tinyproto export DIR --arduino` writes <Name>.h with this model's exact
 * figures, its static bytes and whether its tp_predict is reentrant. */

/* Classify one int8 input vector of TP_N_FEATURES values. Writes TP_N_CLASSES int32 scores and returns the
 * class index (FlyNN: the lowest novelty score; every other family: the highest score; ties go to the lowest index).
 * Integer only. SRAM: the caller's x and scores, plus its working buffers on the stack (report.json
 * "working_sram") and 24-38 B of frames. Cost: report.json "predicted_cycles" (1.5 ms for a 2 kB digits
 * ProtoNN at 16 MHz); `tinyproto validate --sim` measures it. */
uint8_t tp_predict(const int8_t *x, int32_t *scores);

/* How sure the model is, and "unknown" (tp_judge.c; docs/guides/confidence.md). tp_judge() reads the scores
 * tp_predict() wrote and its label; it writes the confidence byte (0-255: among inputs given confidence c, about
 * c/255 are classified correctly, as measured on cross-validated training rows) and returns the label, or
 * TP_UNKNOWN_LABEL (255) when the model was compiled with --unknown-rate and the input is unlike its training
 * rows. tp_classify() is tp_predict() followed by tp_judge(). Integer only, a few hundred cycles. */
uint8_t tp_judge(const int32_t *scores, uint8_t label, uint8_t *confidence);
uint8_t tp_classify(const int8_t *x, int32_t *scores, uint8_t *confidence);

/* Raw float features -> standardised int8 input, exactly as the host's InputStage.quantize().
 * Soft float: about 1,020 cycles (64 us at 16 MHz) per feature on an ATmega328P; 27 B of stack beyond the
 * caller's raw (4 B per feature) and x (1 B per feature). */
void tp_input_quantize(const float *raw, int8_t *x);

/* The same conversion for features first .. first+n-1 only (raw[0..n-1] -> out[0..n-1]): the device app converts
 * each streamed chunk of raw floats as it arrives, so no buffer ever holds the whole float vector. */
void tp_input_quantize_range(const float *raw, uint16_t first, uint8_t n, int8_t *out);

/* ---- Streaming (families whose model header defines TP_STREAMABLE 1) ---------------------------------------
 * Features arrive in order, in chunks of at most TP_CHUNK_BYTES (include/tinyproto_sizes.h). The family keeps
 * static running state only, never the whole input vector; the result equals tp_predict() on the same x.
 * A family with TP_STREAMABLE 0 does not implement these: the device app then buffers the d int8 features and
 * calls tp_predict(). */
void tp_stream_begin(void);                                       /* reset the family's running state     */
void tp_stream_feed(const int8_t *xq, uint16_t first, uint8_t n); /* int8 features first .. first+n-1     */
uint8_t tp_stream_end(int32_t *scores);                           /* finish: TP_N_CLASSES scores, label    */

#ifdef __cplusplus
}
#endif

#endif /* TINYPROTO_H */
