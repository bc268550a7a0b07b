/* tinyproto runtime: how sure the model is of its label, and "unknown" (every family; docs/guides/confidence.md).
 *
 * After tp_predict(), tp_judge() reads two integers from the scores: the margin share
 * |winner - runner-up| / (|winner| + |runner-up| + 1), cut into TP_CONFIDENCE_BINS bins by a four-step restoring
 * division (no library call, no intermediate wider than 32 bits), and the winning score itself. The confidence byte is tp_confidence[bin], a flash table fitted on
 * cross-validated rows; with TP_UNKNOWN_LIMIT (compile --unknown-rate) a winning score worse than the limit
 * answers TP_UNKNOWN_LABEL instead of the class. tinyproto/core/confidence.py is the host reference, bit for bit.
 * A model without a table (TP_CONFIDENCE_BINS undefined) answers confidence 0 and its label.
 */
#include "tinyproto_model.h"

#ifdef TP_CONFIDENCE_BINS
#if TP_CONFIDENCE_BINS != 16
#error "tp_judge.c makes 4 quotient bits: the confidence table must have 16 bins"
#endif

/* The width the margin is computed in, decided by compile (core/confidence.judge_score_bits): 16 bits when the
 * family proves every score within +-32767, so |winner| + |runner-up| + 1 fits a uint16_t and the result is the
 * 32-bit one bit for bit; else 32 bits. */
#if TP_JUDGE_SCORE_BITS == 16
typedef int16_t tp_judge_score_t;
typedef uint16_t tp_judge_wide_t;
#define TP_JUDGE_WORST_HIGH INT16_MIN
#define TP_JUDGE_WORST_LOW INT16_MAX
#elif TP_JUDGE_SCORE_BITS == 32
typedef int32_t tp_judge_score_t;
typedef uint32_t tp_judge_wide_t;
#define TP_JUDGE_WORST_HIGH INT32_MIN
#define TP_JUDGE_WORST_LOW INT32_MAX
#else
#error "TP_JUDGE_SCORE_BITS must be 16 or 32"
#endif

/* the score rule: which of two scores is the better, and a start no score is worse than (the runner-up search
 * takes the first other class's score over it, so the result is that of starting from any other class) */
#if TP_SCORE_LOWEST_WINS
#define TP_JUDGE_BETTER(a, b) ((a) < (b))
#define TP_JUDGE_WORST TP_JUDGE_WORST_LOW
#else
#define TP_JUDGE_BETTER(a, b) ((a) > (b))
#define TP_JUDGE_WORST TP_JUDGE_WORST_HIGH
#endif

/* A score in the judged width. 16 bits: the low half of the int32_t (equal to it, as it is within +-32767), read
 * as two bytes so the high half is never loaded (the AVR and the hosts the tests run on are little-endian). */
static inline tp_judge_score_t tp_judge_read(const int32_t *score)
{
#if TP_JUDGE_SCORE_BITS == 16 && !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
    const uint8_t *bytes = (const uint8_t *)score;
    return (tp_judge_score_t)((uint16_t)bytes[0] | (uint16_t)((uint16_t)bytes[1] << 8));
#else
    return (tp_judge_score_t)*score;
#endif
}

/* Written for avr-gcc -Os's register allocation (each choice measured on the built firmware): the limit is compared
 * as soon as the winner is read, so the winner is not kept live through the division; the division counts its
 * steps by a marker bit in q instead of a counter. */
uint8_t tp_judge(const int32_t *scores, uint8_t label, uint8_t *confidence)
{
    tp_judge_score_t runner = TP_JUDGE_WORST;
    for (uint8_t c = 0; c < TP_N_CLASSES; ++c) {
        tp_judge_score_t s = tp_judge_read(&scores[c]);
        if (c != label && TP_JUDGE_BETTER(s, runner)) {
            runner = s;
        }
    }
    tp_judge_score_t winner = tp_judge_read(&scores[label]);
    uint8_t decided = label;
#ifdef TP_UNKNOWN_LIMIT
#if TP_SCORE_LOWEST_WINS
    if ((int32_t)winner > (int32_t)TP_UNKNOWN_LIMIT) {
#else
    if ((int32_t)winner < (int32_t)TP_UNKNOWN_LIMIT) {
#endif
        decided = TP_UNKNOWN_LABEL;
    }
#endif
#if TP_SCORE_LOWEST_WINS
    tp_judge_wide_t m = (tp_judge_wide_t)runner - (tp_judge_wide_t)winner;
#else
    tp_judge_wide_t m = (tp_judge_wide_t)winner - (tp_judge_wide_t)runner;
#endif
    /* m <= |winner| + |runner| < den: four bits of m / den by restoring division, each step comparing m with
     * den - m rather than 2m with den, so no intermediate needs a 33rd bit (17th in 16 bits) */
    tp_judge_wide_t den = 1u;
    den += winner < 0 ? (tp_judge_wide_t)0 - (tp_judge_wide_t)winner : (tp_judge_wide_t)winner;
    den += runner < 0 ? (tp_judge_wide_t)0 - (tp_judge_wide_t)runner : (tp_judge_wide_t)runner;
    uint8_t q = 1u; /* a marker bit: after four quotient bits are shifted in it is bit 4 */
    do {
        tp_judge_wide_t rest = den - m;
        q = (uint8_t)(q << 1);
        if (m >= rest) {
            m -= rest;
            q |= 1u;
        } else {
            m += m;
        }
    } while (!(q & 16u));
    *confidence = tp_read_u8(&tp_confidence[q & 15u]);
    return decided;
}

#else /* no confidence table: a model written without calibration */
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
