/* tinyproto runtime: how sure the model is of its label, and "unknown" (every family; docs/guides/confidence.md).
 *
 * After tp_predict(), tp_judge() reads every score once, as a 16-bit view: the int32 score shifted right by
 * 8 * TP_JUDGE_SCORE_BYTE bits, i.e. two of its bytes (compile picks the byte so that every score the family proves
 * possible fits: core/confidence.judge_score_byte). From the winner's view and the best other class's it takes
 * - the margin, winner minus runner-up the way the scores win: the confidence byte is 255 less a doubt that
 *   starts at TP_JUDGE_DOUBT (a tie) and halves for every whole TP_JUDGE_HALVING of margin,
 *   255 - (TP_JUDGE_DOUBT >> (margin / TP_JUDGE_HALVING)), both fitted on cross-validated rows by the host;
 * - with TP_UNKNOWN_LIMIT (compile --unknown-rate), the winner's view itself: worse than the limit answers
 *   TP_UNKNOWN_LABEL instead of the class; with TP_UNKNOWN_RANGE_LOW also a family's range signal outside its
 *   range, and with TP_UNKNOWN_CLIPS more of the input's int8 values at the clip than that (below).
 * No table, no division, nothing wider than 16 bits: the division is a subtraction per halving, at most 8 of them
 * before the doubt is 0. tinyproto/core/confidence.py (Calibration.judge) is the host reference, bit for bit.
 * The portable C below is the reference; on an AVR tp_judge_avr.h holds the same steps in assembly (a third of
 * the flash avr-gcc -Os gives the C: the stage is meant to cost at most 64 B). A model without calibration
 * (TP_JUDGE_DOUBT undefined) answers confidence 0 and its label.
 */
#include "tinyproto_model.h"

#ifdef TP_JUDGE_DOUBT
#if TP_JUDGE_SCORE_BYTE < 0 || TP_JUDGE_SCORE_BYTE > 2 || TP_JUDGE_DOUBT < 0 || TP_JUDGE_DOUBT > 255 \
    || TP_JUDGE_HALVING < 1 || TP_JUDGE_HALVING > 65535
#error "TP_JUDGE_SCORE_BYTE must be 0 to 2, TP_JUDGE_DOUBT 0 to 255 and TP_JUDGE_HALVING 1 to 65535"
#endif

#ifdef TP_UNKNOWN_RANGE_LOW
/* A family's range check (compile --unknown-rate; Bloom features' feature-map sum S): its runtime keeps the last
 * input's bin, (S - TP_UNKNOWN_RANGE_LOW) >> 8 modulo 2^16, as the first byte of tp_range_signal (a byte, or on an
 * AVR the start of the family's own state: tp_bloom.c), and a bin of TP_UNKNOWN_RANGE_BINS or more (S outside
 * LOW .. LOW + 256 BINS - 1) answers TP_UNKNOWN_LABEL whatever the scores (core/confidence.py, Calibration). */
#if !TP_KERNELS_AVR /* the reference reads the byte; the AVR twin reads the symbol's first byte by name */
extern uint8_t tp_range_signal;
#endif
#if TP_UNKNOWN_RANGE_LOW < 0 || TP_UNKNOWN_RANGE_BINS < 1 || TP_UNKNOWN_RANGE_BINS > 255 \
    || TP_UNKNOWN_RANGE_LOW + 256L * TP_UNKNOWN_RANGE_BINS > 65536L || !defined(TP_UNKNOWN_LIMIT)
#error "TP_UNKNOWN_RANGE_LOW and _BINS must keep the range within 0..65535, beside TP_UNKNOWN_LIMIT"
#endif
#endif

#ifdef TP_UNKNOWN_CLIPS
/* The clip check (compile --unknown-rate --clip-check, when the host finds it pays: core/confidence.fit_clip_check):
 * the family's runtime hands every int8 input to tp_judge_inputs as it consumes it (tp_predict, or each
 * tp_stream_feed chunk; a chunk with first == 0 starts a new input), which counts the values at the clip, those with
 * (uint8_t)(x - TP_UNKNOWN_CLIP_FROM) < TP_UNKNOWN_CLIP_SPAN, x read as a byte (the header's values for the side the
 * host chose, core/confidence.CLIP_SIDES: +127, -127 or -128, or either), stopping at 255; tp_judge declines an
 * input with more than TP_UNKNOWN_CLIPS of them whatever the scores. One byte of static state; nothing of it
 * without the option. */
#if !defined(TP_UNKNOWN_CLIP_FROM) || !defined(TP_UNKNOWN_CLIP_SPAN)
#error "a clip check needs TP_UNKNOWN_CLIP_FROM and _SPAN from the model header (core/confidence.CLIP_SIDES)"
#endif
#if TP_UNKNOWN_CLIP_FROM < 0 || TP_UNKNOWN_CLIP_FROM > 255 || TP_UNKNOWN_CLIP_SPAN < 1 || TP_UNKNOWN_CLIP_SPAN > 255
#error "TP_UNKNOWN_CLIP_FROM must be 0 to 255 and TP_UNKNOWN_CLIP_SPAN 1 to 255"
#endif
#if TP_UNKNOWN_CLIPS < 0 || TP_UNKNOWN_CLIPS > 254 || !defined(TP_UNKNOWN_LIMIT)
#error "TP_UNKNOWN_CLIPS must be 0 to 254, beside TP_UNKNOWN_LIMIT"
#endif
#if TP_KERNELS_AVR /* tp_judge's assembly reads it by name: kept, and global, under -flto (the Arduino IDE's) */
__attribute__((used, externally_visible))
#endif
uint8_t tp_clip_count;

#if !TP_KERNELS_AVR /* the portable reference; tp_judge_avr.h holds its AVR twin */
void tp_judge_inputs(const int8_t *x, uint16_t first, uint16_t n)
{
    uint8_t count = first == 0 ? 0u : tp_clip_count;
    for (; n != 0; --n) {
        if ((uint8_t)((uint8_t)*x++ - (uint8_t)TP_UNKNOWN_CLIP_FROM) < (uint8_t)TP_UNKNOWN_CLIP_SPAN
            && count != 255u) {
            ++count;
        }
    }
    tp_clip_count = count;
}
#endif
#endif

#if TP_KERNELS_AVR
#include "tp_judge_avr.h"

#else /* the portable reference */

/* the score rule: which of two views is the better, and a start no view is worse than */
#if TP_SCORE_LOWEST_WINS
#define TP_JUDGE_BETTER(a, b) ((a) < (b))
#define TP_JUDGE_WORST INT16_MAX
#else
#define TP_JUDGE_BETTER(a, b) ((a) > (b))
#define TP_JUDGE_WORST INT16_MIN
#endif

/* One score's view: bytes TP_JUDGE_SCORE_BYTE and the next of the little-endian int32 (the AVR and the hosts the
 * tests run on), equal to score >> (8 * TP_JUDGE_SCORE_BYTE) as the family proves it within int16. */
static inline int16_t tp_judge_view(const uint8_t *bytes)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "tp_judge.c reads the scores as little-endian"
#endif
    return (int16_t)((uint16_t)bytes[0] | (uint16_t)((uint16_t)bytes[1] << 8));
}

/* One pass over the classes takes the winner's view (at the label) and the best of the others'. */
uint8_t tp_judge(const int32_t *scores, uint8_t label, uint8_t *confidence)
{
    const uint8_t *at = (const uint8_t *)scores + TP_JUDGE_SCORE_BYTE;
    int16_t winner = 0;
    int16_t runner = TP_JUDGE_WORST;
    uint8_t c = 0;
    do {
        int16_t s = tp_judge_view(at);
        at += sizeof(int32_t);
        if (c == label) {
            winner = s;
        } else if (TP_JUDGE_BETTER(s, runner)) {
            runner = s;
        }
    } while (++c != TP_N_CLASSES);
    uint8_t decided = label;
#ifdef TP_UNKNOWN_LIMIT
    if (TP_JUDGE_BETTER(TP_UNKNOWN_LIMIT, winner)) {
        decided = TP_UNKNOWN_LABEL;
    }
#endif
#ifdef TP_UNKNOWN_RANGE_LOW
    if (tp_range_signal >= TP_UNKNOWN_RANGE_BINS) {
        decided = TP_UNKNOWN_LABEL;
    }
#endif
#ifdef TP_UNKNOWN_CLIPS
    if (tp_clip_count > TP_UNKNOWN_CLIPS) {
        decided = TP_UNKNOWN_LABEL;
    }
#endif
#if TP_SCORE_LOWEST_WINS
    uint16_t margin = (uint16_t)((uint16_t)runner - (uint16_t)winner);
#else
    uint16_t margin = (uint16_t)((uint16_t)winner - (uint16_t)runner);
#endif
    uint8_t doubt = TP_JUDGE_DOUBT;
    while (doubt != 0 && margin >= (uint16_t)TP_JUDGE_HALVING) {
        margin = (uint16_t)(margin - (uint16_t)TP_JUDGE_HALVING);
        doubt >>= 1;
    }
    *confidence = (uint8_t)(255u - doubt);
    return decided;
}
#endif

#else /* no calibration: a model written without one */
uint8_t tp_judge(const int32_t *scores, uint8_t label, uint8_t *confidence)
{
    (void)scores;
    *confidence = 0;
    return label;
}
#endif

uint8_t tp_classify(const int8_t *x, int32_t *scores, uint8_t *confidence)
{
    return tp_judge(scores, tp_predict(x, scores), confidence);
}
