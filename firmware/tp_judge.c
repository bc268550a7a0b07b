/* tinyproto runtime: how sure the model is of its label, and "unknown" (every family; docs/guides/confidence.md).
 *
 * After tp_predict(), tp_judge() reads every score once, as a 16-bit view: the int32 score shifted right by
 * 8 * TP_JUDGE_SCORE_BYTE bits, i.e. two of its bytes (compile picks the byte so that every score the family proves
 * possible fits: core/confidence.judge_score_byte). From the winner's view and the best other class's it takes
 * - the margin, winner minus runner-up the way the scores win, shifted right by TP_JUDGE_MARGIN_SHIFT (chosen on
 *   the host for this model) and capped at 15: the index of tp_confidence[], a flash table fitted on
 *   cross-validated rows, which gives the confidence byte;
 * - with TP_UNKNOWN_LIMIT (compile --unknown-rate), the winner's view itself: worse than the limit answers
 *   TP_UNKNOWN_LABEL instead of the class.
 * Nothing is divided and nothing is wider than 16 bits: the host decides the view and the shift, the device applies
 * them. tinyproto/core/confidence.py (Calibration.judge) is the host reference, bit for bit.
 * A model without a table (TP_CONFIDENCE_BINS undefined) answers confidence 0 and its label.
 */
#include "tinyproto_model.h"

#ifdef TP_CONFIDENCE_BINS
#if TP_CONFIDENCE_BINS != 16
#error "tp_judge.c caps the margin's bin at 15: the confidence table must have 16 bins"
#endif
#if TP_JUDGE_SCORE_BYTE < 0 || TP_JUDGE_SCORE_BYTE > 2 || TP_JUDGE_MARGIN_SHIFT < 0 || TP_JUDGE_MARGIN_SHIFT > 15
#error "TP_JUDGE_SCORE_BYTE must be 0 to 2 and TP_JUDGE_MARGIN_SHIFT 0 to 15"
#endif

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
#if TP_SCORE_LOWEST_WINS
    uint16_t margin = (uint16_t)((uint16_t)runner - (uint16_t)winner);
#else
    uint16_t margin = (uint16_t)((uint16_t)winner - (uint16_t)runner);
#endif
    margin >>= TP_JUDGE_MARGIN_SHIFT;
    *confidence = tp_read_u8(&tp_confidence[margin > 15u ? 15u : margin]);
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
